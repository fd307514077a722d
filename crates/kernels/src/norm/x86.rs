//! RMSNorm's sum of squares for many groups at once. ggml sums `(double)(x·x)` one element at
//! a time, so one group is a chain of dependent double additions; here the chains of eight
//! groups advance together (lane = group, two 4-lane double vectors), each lane adding the same
//! values in the same order as the scalar loop, so the sums are bit-identical.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

/// `sums[g] = Σ_i (x[g·n + i]²) as f64`, in order, for `g < sums.len()`; `n % 4 == 0`.
#[target_feature(enable = "avx2,fma")]
pub fn sum_squares(x: &[f32], n: usize, sums: &mut [f64]) {
    let groups = sums.len();
    assert!(n.is_multiple_of(4) && x.len() >= groups * n);
    let mut g = 0;
    while g + 8 <= groups {
        let mut acc = [_mm256_setzero_pd(); 2];
        let rows = &x[g * n..(g + 8) * n];
        let mut i = 0;
        while i < n {
            for (h, a) in acc.iter_mut().enumerate() {
                let mut r = [_mm_setzero_ps(); 4];
                for (k, rk) in r.iter_mut().enumerate() {
                    let o = (4 * h + k) * n + i;
                    // SAFETY: o + 4 <= 8n = rows.len() (i + 4 <= n); unaligned load.
                    let v = unsafe { _mm_loadu_ps(rows.as_ptr().add(o)) };
                    *rk = _mm_mul_ps(v, v);
                }
                // 4×4 transpose: column j holds element i + j of the four groups.
                let (t0, t1) = (_mm_unpacklo_ps(r[0], r[1]), _mm_unpacklo_ps(r[2], r[3]));
                let (t2, t3) = (_mm_unpackhi_ps(r[0], r[1]), _mm_unpackhi_ps(r[2], r[3]));
                for c in [_mm_movelh_ps(t0, t1), _mm_movehl_ps(t1, t0), _mm_movelh_ps(t2, t3), _mm_movehl_ps(t3, t2)] {
                    *a = _mm256_add_pd(*a, _mm256_cvtps_pd(c));
                }
            }
            i += 4;
        }
        // SAFETY: g + 8 <= sums.len(); unaligned stores.
        unsafe {
            _mm256_storeu_pd(sums.as_mut_ptr().add(g), acc[0]);
            _mm256_storeu_pd(sums.as_mut_ptr().add(g + 4), acc[1]);
        }
        g += 8;
    }
    for (s, row) in sums[g..].iter_mut().zip(x[g * n..].chunks_exact(n)) {
        *s = row.iter().fold(0f64, |a, &v| a + (v * v) as f64);
    }
}
