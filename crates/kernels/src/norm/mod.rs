//! RMS norm in ggml-cpu's order: the squares summed one by one in double, then one scale per
//! group. With AVX2 or NEON the sums of eight groups advance together ([`x86`], [`aarch64`]),
//! the same bits.

use crate::{Isa, Kernels};

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// `y = x / sqrt(mean(x²) + eps) * w` over one group (`x.len() == w.len()`): ggml's order, the
/// squares summed one by one in double.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let sum = x.iter().fold(0f64, |a, &v| a + (v * v) as f64);
    rms_scale(sum, x, w, eps, y);
}

fn rms_scale(sum: f64, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in y.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// [`rms_norm`] over every group of `w.len()` values of `x` (rows, or heads of rows), with the
/// same bits. With a SIMD table (AVX2, NEON) and groups of a multiple of four values, the sums
/// of eight groups run together: one group alone is a chain of dependent double additions.
pub fn rms_norm_groups(k: &Kernels, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    if n.is_multiple_of(4) && k.isa() != Isa::Portable && cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        const CHUNK: usize = 64;
        let mut sums = [0f64; CHUNK];
        for (xc, yc) in x.chunks(CHUNK * n).zip(y.chunks_mut(CHUNK * n)) {
            let groups = xc.len() / n;
            #[cfg(target_arch = "x86_64")]
            // SAFETY: an x86 SIMD table (Avx2 and above) is only built after detecting AVX2 and
            // FMA.
            unsafe {
                x86::sum_squares(xc, n, &mut sums[..groups])
            };
            #[cfg(target_arch = "aarch64")]
            aarch64::sum_squares(xc, n, &mut sums[..groups]);
            for ((xg, yg), &s) in xc.chunks_exact(n).zip(yc.chunks_exact_mut(n)).zip(&sums) {
                rms_scale(s, xg, w, eps, yg);
            }
        }
        return;
    }
    for (xg, yg) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        rms_norm(xg, w, eps, yg);
    }
}

