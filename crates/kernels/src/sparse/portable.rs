//! Portable twins of the sparse feed-forward kernels (`sparse::x86` gives the same bits).

/// `y[j] = fma(h, w[j], y[j])`.
pub fn axpy_f32(h: f32, w: &[f32], y: &mut [f32]) {
    for (y, &w) in y.iter_mut().zip(w) {
        *y = h.mul_add(w, *y);
    }
}

/// [`super::down_block`]'s twin: per token, the firing neurons in order, one `fma` per column.
pub fn down_block(h: &[&[f32]], w: &[f32], y: &mut [[f32; super::DOWN_COLS]]) {
    for (hr, yr) in h.iter().zip(y.iter_mut()) {
        for (&hv, wr) in hr.iter().zip(w.chunks_exact(super::DOWN_COLS)) {
            if hv != 0.0 {
                for (y, &w) in yr.iter_mut().zip(wr) {
                    *y = hv.mul_add(w, *y);
                }
            }
        }
    }
}
