//! glibc's `expf` on 16 lanes with AVX-512, bit for bit. ggml's one-chunk attention (decode)
//! calls libm's `expf` once per cell and head; the portable kernel does the same through
//! `f32::exp`, so the bits the golden data pins down are glibc's. On CPUs with FMA, glibc
//! selects `__expf_fma` (the Arm optimized-routines algorithm: `x·32/ln2 = k + r` in double,
//! `2^(k/32)` from a 32-entry table, a cubic in `r`, one rounding to float at the end); this is
//! that function with the same fused operations in the same order, read off glibc 2.36's
//! machine code. Lanes outside its fast path (|x| ≥ 88, ±∞, NaN) are recomputed by the scalar
//! libm call, so errno-style edge cases keep libm's values. The test compares every negative
//! float above -104 (the arguments attention passes) with `f32::exp`. An 8-lane AVX2 twin
//! (`expf8`, the table read with a gather) serves the AVX2 decode kernel.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

/// `32 / ln 2`, `1.5 · 2^52` (rounds to an integer in the low bits), the cubic's coefficients
/// (scaled by powers of 1/32): glibc's `__exp2f_data.invln2_scaled`, `shift`, `poly_scaled`.
const INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652b_82fe);
const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
const C0: f64 = f64::from_bits(0x3ebc_6af8_4b91_2394);
const C1: f64 = f64::from_bits(0x3f2e_bfce_50fa_c4f3);
const C2: f64 = f64::from_bits(0x3f96_2e42_ff0c_52d6);

/// `bits(2^(i/32)) - (i << 47)`: glibc's `__exp2f_data.tab`.
static TAB: [u64; 32] = [
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
];

/// Largest `(bits >> 20) & 0x7ff` of the fast path (|x| < 88).
const FAST_TOP: i32 = 0x42a;

/// `expf` on 8 lanes widened to double.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
fn exp8(xd: __m512d) -> __m256 {
    let tab = |i: usize| {
        // SAFETY: TAB holds 32 u64; i·8 + 8 <= 32.
        unsafe { _mm512_loadu_si512(TAB.as_ptr().add(8 * i) as *const _) }
    };
    let (inv, shift) = (_mm512_set1_pd(INV_LN2_N), _mm512_set1_pd(SHIFT));
    let kd = _mm512_fmadd_pd(inv, xd, shift);
    let ki = _mm512_castpd_si512(kd);
    let kd = _mm512_sub_pd(kd, shift);
    let r = _mm512_fmsub_pd(inv, xd, kd);
    // tab[ki % 32]: two 16-entry lookups, chosen by bit 4 of the index.
    let lo = _mm512_permutex2var_epi64(tab(0), ki, tab(1));
    let hi = _mm512_permutex2var_epi64(tab(2), ki, tab(3));
    let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    let t = _mm512_add_epi64(_mm512_mask_blend_epi64(upper, lo, hi), _mm512_slli_epi64::<47>(ki));
    let s = _mm512_castsi512_pd(t);
    let z = _mm512_fmadd_pd(r, _mm512_set1_pd(C0), _mm512_set1_pd(C1));
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(r, _mm512_set1_pd(C2), _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(z, r2, y);
    _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
}

/// `x[i].exp()` for every lane, as glibc computes it.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub fn expf16(x: __m512) -> __m512 {
    let lo = exp8(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    let hi = exp8(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)))));
    let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi)));
    let top = _mm512_and_si512(_mm512_srli_epi32::<20>(_mm512_castps_si512(x)), _mm512_set1_epi32(0x7ff));
    let slow = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(FAST_TOP));
    if slow == 0 {
        return y;
    }
    let mut xs = [0f32; 16];
    let mut ys = [0f32; 16];
    // SAFETY: 16 f32 each, unaligned.
    unsafe {
        _mm512_storeu_ps(xs.as_mut_ptr(), x);
        _mm512_storeu_ps(ys.as_mut_ptr(), y);
    }
    libm_lanes(&xs, &mut ys, slow as u32);
    // SAFETY: 16 f32, unaligned.
    unsafe { _mm512_loadu_ps(ys.as_ptr()) }
}

/// `ys[i] = xs[i].exp()` (libm) for the lanes set in `slow`.
#[inline]
fn libm_lanes(xs: &[f32], ys: &mut [f32], slow: u32) {
    for (i, (x, y)) in xs.iter().zip(ys.iter_mut()).enumerate() {
        if slow & (1 << i) != 0 {
            *y = x.exp();
        }
    }
}

/// `f` over `x` in place, `L` values at a time; a shorter tail goes through the same lanes.
#[inline(always)]
fn map_lanes<const L: usize>(x: &mut [f32], f: impl Fn(&mut [f32; L])) {
    let mut chunks = x.chunks_exact_mut(L);
    for c in &mut chunks {
        f(c.try_into().expect("chunk of L values"));
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut lanes = [0f32; L];
        lanes[..rest.len()].copy_from_slice(rest);
        f(&mut lanes);
        rest.copy_from_slice(&lanes[..rest.len()]);
    }
}

/// [`expf16`] over a slice in place.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub fn expf_slice(x: &mut [f32]) {
    // SAFETY: 16 f32 per call, unaligned.
    map_lanes::<16>(x, |l| unsafe { _mm512_storeu_ps(l.as_mut_ptr(), expf16(_mm512_loadu_ps(l.as_ptr()))) });
}

/// [`exp8`] on 4 lanes with AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp4(xd: __m256d) -> __m128 {
    let (inv, shift) = (_mm256_set1_pd(INV_LN2_N), _mm256_set1_pd(SHIFT));
    let kd = _mm256_fmadd_pd(inv, xd, shift);
    let ki = _mm256_castpd_si256(kd);
    let kd = _mm256_sub_pd(kd, shift);
    let r = _mm256_fmsub_pd(inv, xd, kd);
    let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    // SAFETY: every index is below 32 = TAB.len().
    let tab = unsafe { _mm256_i64gather_epi64::<8>(TAB.as_ptr() as *const i64, idx) };
    let s = _mm256_castsi256_pd(_mm256_add_epi64(tab, _mm256_slli_epi64::<47>(ki)));
    let z = _mm256_fmadd_pd(r, _mm256_set1_pd(C0), _mm256_set1_pd(C1));
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(r, _mm256_set1_pd(C2), _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(z, r2, y);
    _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
}

/// [`expf16`] on 8 lanes with AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn expf8(x: __m256) -> __m256 {
    let lo = exp4(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    let hi = exp4(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)));
    let y = _mm256_insertf128_ps::<1>(_mm256_castps128_ps256(lo), hi);
    let top = _mm256_and_si256(_mm256_srli_epi32::<20>(_mm256_castps_si256(x)), _mm256_set1_epi32(0x7ff));
    let slow = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(FAST_TOP))));
    if slow == 0 {
        return y;
    }
    let mut xs = [0f32; 8];
    let mut ys = [0f32; 8];
    // SAFETY: 8 f32 each, unaligned.
    unsafe {
        _mm256_storeu_ps(xs.as_mut_ptr(), x);
        _mm256_storeu_ps(ys.as_mut_ptr(), y);
    }
    libm_lanes(&xs, &mut ys, slow as u32);
    // SAFETY: 8 f32, unaligned.
    unsafe { _mm256_loadu_ps(ys.as_ptr()) }
}

/// [`expf8`] over a slice in place.
#[target_feature(enable = "avx2,fma")]
pub fn expf_slice_avx2(x: &mut [f32]) {
    // SAFETY: 8 f32 per call, unaligned.
    map_lanes::<8>(x, |l| unsafe { _mm256_storeu_ps(l.as_mut_ptr(), expf8(_mm256_loadu_ps(l.as_ptr()))) });
}

/// `exp::expf_ggml` on 8 lanes: the same operations in the same order (FMA for every
/// `mul_add`, the three `scalef` ranges selected per lane), so every lane is bit-identical to
/// the scalar function.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn expf_ggml8(x: __m256) -> __m256 {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let r = c(0x4B40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3FB8_AA3B), r);
    let n = _mm256_sub_ps(z, r);
    // fma(-n, c, x) == fnmadd(n, c, x): negation is exact.
    let b = _mm256_fnmadd_ps(n, c(0x35BF_BE8E), _mm256_fnmadd_ps(n, c(0x3F31_7200), x));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3C07_2010), b, c(0x3D2B_9F17)),
            u,
            _mm256_fmadd_ps(c(0x3E2A_AF33), b, c(0x3EFF_FEDB)),
        ),
        u,
        _mm256_fmadd_ps(c(0x3F7F_FFF6), b, _mm256_set1_ps(1.0)),
    );
    // scalef(j, n): n is integral here (|n| ≤ 192 on the lanes that use it).
    let ni = _mm256_cvttps_epi32(n);
    let pow2 = |e: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(e, _mm256_set1_epi32(127))));
    let k = |v: i32| _mm256_set1_epi32(v);
    let normal = _mm256_mul_ps(j, pow2(ni));
    let low = _mm256_mul_ps(_mm256_mul_ps(j, pow2(_mm256_add_epi32(ni, k(100)))), pow2(k(-100)));
    let high = _mm256_mul_ps(_mm256_mul_ps(j, pow2(k(127))), pow2(_mm256_sub_epi32(ni, k(127))));
    let is_low = _mm256_castsi256_ps(_mm256_cmpgt_epi32(k(-126), ni));
    let is_high = _mm256_castsi256_ps(_mm256_cmpgt_epi32(ni, k(127)));
    let v = _mm256_blendv_ps(_mm256_blendv_ps(normal, low, is_low), high, is_high);
    // |n| > 192: 0 below, infinity above.
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let out_of_range = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    let sat = _mm256_blendv_ps(
        _mm256_set1_ps(f32::INFINITY),
        _mm256_setzero_ps(),
        _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps()),
    );
    _mm256_blendv_ps(v, sat, out_of_range)
}

/// ggml's AVX-512 `ggml_v_expf` on 16 lanes — the function `exp::expf_ggml` reproduces lane
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
