//! Row-wise SIMD kernels: RMSNorm's sum of squares for many groups at once, and SwiGLU.
//!
//! RMSNorm: ggml sums `(double)(x·x)` one element at a
//! time, so one group is a chain of dependent double additions; here the chains of eight groups
//! advance together (lane = group, two 4-lane double vectors), each lane adding the same values
//! in the same order as the scalar loop, so the sums are bit-identical.

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

/// `y = silu(g) · u` on eight lanes: `g / (1 + expf_ggml(0 - g)) · u`, every operation the
/// scalar `ops::swiglu`'s (the exponential is `attn::expf_ggml8`, lane-exact; division and
/// multiplication are correctly rounded), so the bits are equal.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn swiglu(g: &[f32], u: &[f32], y: &mut [f32]) {
    let n = y.len().min(g.len()).min(u.len());
    let body = n & !7;
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= n ≤ every slice's length; unaligned loads and store.
        unsafe {
            let x = _mm256_loadu_ps(g.as_ptr().add(i));
            let e = super::attn::expf_ggml8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i))));
        }
        i += 8;
    }
    crate::ops::swiglu_scalar(&g[body..n], &u[body..n], &mut y[body..n]);
}

/// ggml's AVX-512 `ggml_v_expf` on 16 lanes — the function `ops::expf_ggml` reproduces lane
/// for lane (its `scalef` is `vscalefps`: `j · 2^n` rounded once).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub fn expf_ggml16(x: __m512) -> __m512 {
    let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
    let r = c(0x4B40_0000);
    let z = _mm512_fmadd_ps(x, c(0x3FB8_AA3B), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(n, c(0x35BF_BE8E), _mm512_fnmadd_ps(n, c(0x3F31_7200), x));
    let out_of_range = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(c(0x3C07_2010), b, c(0x3D2B_9F17)),
            u,
            _mm512_fmadd_ps(c(0x3E2A_AF33), b, c(0x3EFF_FEDB)),
        ),
        u,
        _mm512_fmadd_ps(c(0x3F7F_FFF6), b, _mm512_set1_ps(1.0)),
    );
    let res = _mm512_scalef_ps(j, n);
    if out_of_range == 0 {
        return res;
    }
    let below = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
    let sat = _mm512_mask_blend_ps(below, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
    _mm512_mask_blend_ps(out_of_range, res, sat)
}

/// [`swiglu`] on sixteen lanes with ggml's AVX-512 exponential ([`expf_ggml16`]); same bits.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub fn swiglu_avx512(g: &[f32], u: &[f32], y: &mut [f32]) {
    let n = y.len().min(g.len()).min(u.len());
    let body = n & !15;
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 16 <= n ≤ every slice's length; unaligned loads and store.
        unsafe {
            let x = _mm512_loadu_ps(g.as_ptr().add(i));
            let e = expf_ggml16(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(y.as_mut_ptr().add(i), _mm512_mul_ps(s, _mm512_loadu_ps(u.as_ptr().add(i))));
        }
        i += 16;
    }
    swiglu(&g[body..n], &u[body..n], &mut y[body..n]);
}

/// `y = gelu(g) · u` through ggml's F16 table on eight lanes: inputs rounded to F16 (nearest
/// even, as the scalar `f2h`), entries gathered, widened; `g ≤ -10` gives 0 and `g ≥ 10` gives
/// `g`, as in `ops::geglu`. `table` holds one padding entry past the 65536 (the gather reads
/// four bytes per two-byte entry).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn geglu(g: &[f32], u: &[f32], y: &mut [f32], table: &[u16]) {
    assert!(table.len() > 1 << 16);
    let n = y.len().min(g.len()).min(u.len());
    let body = n & !7;
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= n ≤ every slice's length; every index is < 2^16, so the 4-byte
        // gather reads stay inside the padded table.
        unsafe {
            let a = _mm256_loadu_ps(g.as_ptr().add(i));
            let idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(a));
            let raw = _mm256_i32gather_epi32::<2>(table.as_ptr() as *const i32, idx);
            let h = _mm256_and_si256(raw, _mm256_set1_epi32(0xFFFF));
            let p = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(h, h));
            let act = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
            let act = _mm256_blendv_ps(act, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LE_OQ>(a, lo));
            let act = _mm256_blendv_ps(act, a, _mm256_cmp_ps::<_CMP_GE_OQ>(a, hi));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_mul_ps(act, _mm256_loadu_ps(u.as_ptr().add(i))));
        }
        i += 8;
    }
    crate::ops::geglu_scalar_table(&g[body..n], &u[body..n], &mut y[body..n]);
}
