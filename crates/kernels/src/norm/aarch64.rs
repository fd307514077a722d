//! RMSNorm's sum of squares for many groups at once with NEON, as `norm::x86`: the chains of
//! eight groups advance together (lane = group, four 2-lane double vectors), each lane adding
//! the same values in the same order as the scalar loop, so the sums are bit-identical.

use crate::simd::aarch64::transpose4;
use std::arch::aarch64::*;

/// `sums[g] = Σ_i (x[g·n + i]²) as f64`, in order, for `g < sums.len()`; `n % 4 == 0`.
pub fn sum_squares(x: &[f32], n: usize, sums: &mut [f64]) {
    let groups = sums.len();
    assert!(n.is_multiple_of(4) && x.len() >= groups * n);
    let mut g = 0;
    while g + 8 <= groups {
        let rows = &x[g * n..(g + 8) * n];
        // SAFETY (block): every load reads 4 f32 at (4h + k)·n + i with i + 4 <= n, inside
        // rows (8n values); the stores write sums[g..g + 8]; register arithmetic otherwise.
        unsafe {
            // acc[h][0]: groups 4h, 4h + 1; acc[h][1]: groups 4h + 2, 4h + 3.
            let mut acc = [[vdupq_n_f64(0.0); 2]; 2];
            for i in (0..n).step_by(4) {
                for (h, a) in acc.iter_mut().enumerate() {
                    let r: [float32x4_t; 4] = std::array::from_fn(|k| {
                        let v = vld1q_f32(rows.as_ptr().add((4 * h + k) * n + i));
                        vmulq_f32(v, v)
                    });
                    // Column j holds element i + j of the four groups.
                    for c in transpose4(r) {
                        a[0] = vaddq_f64(a[0], vcvt_f64_f32(vget_low_f32(c)));
                        a[1] = vaddq_f64(a[1], vcvt_high_f64_f32(c));
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                vst1q_f64(sums.as_mut_ptr().add(g + 4 * h), a[0]);
                vst1q_f64(sums.as_mut_ptr().add(g + 4 * h + 2), a[1]);
            }
        }
        g += 8;
    }
    for (s, row) in sums[g..].iter_mut().zip(x[g * n..].chunks_exact(n)) {
        *s = row.iter().fold(0f64, |a, &v| a + (v * v) as f64);
    }
}
