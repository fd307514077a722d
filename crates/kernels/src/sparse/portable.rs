//! Portable twins of the sparse feed-forward kernels (`sparse::x86` gives the same bits).

/// `y[j] = fma(h, w[j], y[j])`.
pub fn axpy_f32(h: f32, w: &[f32], y: &mut [f32]) {
    for (y, &w) in y.iter_mut().zip(w) {
        *y = h.mul_add(w, *y);
    }
}
