//! SwiGLU on 8 (AVX2) and 16 (AVX-512) lanes and GeGLU on 8, bit-identical to the portable
//! twins (`act::portable`): every lane performs the scalar function's operations, the
//! exponentials are ggml's `expf` lane for lane (`exp::x86`), GELU is gathered from the same
//! F16 table.
#![allow(clippy::missing_safety_doc)]

use super::portable::{geglu_scalar_table, swiglu_scalar};
use crate::exp::x86::{expf_ggml16, expf_ggml8};
use std::arch::x86_64::*;

/// `y = silu(g) · u` on eight lanes: `g / (1 + expf_ggml(0 - g)) · u`, every operation the
/// scalar `swiglu_scalar`'s (the exponential is `expf_ggml8`, lane-exact; division and
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
            let e = expf_ggml8(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i))));
        }
        i += 8;
    }
    swiglu_scalar(&g[body..n], &u[body..n], &mut y[body..n]);
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
/// `g`, as in `act::geglu`. `table` holds one padding entry past the 65536 (the gather reads
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
    geglu_scalar_table(&g[body..n], &u[body..n], &mut y[body..n]);
}
