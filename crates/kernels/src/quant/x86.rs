//! AVX2 activation quantizers (f32 rows to Q8_0, Q8_1, Q8_K blocks, as ggml's SIMD
//! `quantize_row_*`: `127/amax`, round half to even) and row converters (f32 → F16 for KV
//! stores, Q8_0 → f32 for quantized KV values): the same bytes and values as the portable
//! twins in `quant::portable`.
#![allow(clippy::missing_safety_doc)]

use crate::quant::blocks::*;
use crate::simd::x86::{f2h, h2f, hmax_f32x8, hsum_i32x8, widen};
use std::arch::x86_64::*;

/// One 32-value block quantized as ggml's SIMD `quantize_row_q8_0/1`: `amax`, `d = amax/127`,
/// `q = round_half_even(x · 127/amax)`. Returns (d, Σq) and writes the codes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_block(xs: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    assert!(xs.len() >= 32);
    // Loops, not `array::from_fn`/`map`: a closure LLVM leaves out of line has no AVX2 and
    // would call every intrinsic in it (seen in the matmul kernels).
    let mut v = [_mm256_setzero_ps(); 4];
    for (i, v) in v.iter_mut().enumerate() {
        // SAFETY: 32 readable f32 (asserted).
        *v = unsafe { _mm256_loadu_ps(xs.as_ptr().add(8 * i)) };
    }
    let sign = _mm256_set1_ps(-0.0);
    let mut a = v;
    for a in a.iter_mut() {
        *a = _mm256_andnot_ps(sign, *a);
    }
    let amax = hmax_f32x8(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let mut q = [_mm256_setzero_si256(); 4];
    for (q, x) in q.iter_mut().zip(v) {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, id));
        *q = _mm256_cvtps_epi32(r);
    }
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let p16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    let p8 = _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: qs is 32 writable bytes.
    unsafe { _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, p8) };
    (d, hsum_i32x8(sum))
}

/// AVX2 twin of `quant::portable::quant_q8_0` (same bytes).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn quant_q8_0(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8_0>(y).iter_mut().zip(x.chunks_exact(QK8_0)) {
        let (d, _) = q8_block(xs, &mut b.qs);
        b.d = f2h(d);
    }
}

/// AVX2 twin of `quant::portable::quant_q8_1` (same bytes).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn quant_q8_1(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8_1>(y).iter_mut().zip(x.chunks_exact(QK8_1)) {
        let (d, sum) = q8_block(xs, &mut b.qs);
        b.d = f2h(d);
        b.s = f2h(sum as f32 * d);
    }
}

/// AVX2 twin of `quant::portable::quant_q8_k` (same bytes): the scale comes from the first
/// element of largest magnitude (ties keep the earliest, NaN never wins, as the scalar scan),
/// codes are `min(round_half_even(x · -127/max), 127)`, `bsums` the sums of each 16 codes.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn quant_q8_k(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8K>(y).iter_mut().zip(x.chunks_exact(QK_K)) {
        let xs: &[f32; QK_K] = xs.try_into().expect("chunks of QK_K");
        let mut v = [_mm256_setzero_ps(); QK_K / 8];
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for (i, vi) in v.iter_mut().enumerate() {
            // SAFETY: 8 f32 at 8i < QK_K; unaligned load.
            *vi = unsafe { _mm256_loadu_ps(xs.as_ptr().add(8 * i)) };
            // maxps returns its second operand when either is NaN: NaN never replaces m.
            m = _mm256_max_ps(_mm256_andnot_ps(sign, *vi), m);
        }
        let amax = hmax_f32x8(m);
        if amax == 0.0 {
            b.d = 0.0;
            b.qs = [0; QK_K];
            b.bsums = [0; QK_K / 16];
            continue;
        }
        // The first element whose magnitude is amax gives the sign.
        let am = _mm256_set1_ps(amax);
        let mut max = amax;
        for (i, vi) in v.iter().enumerate() {
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, *vi), am));
            if hit != 0 {
                max = xs[8 * i + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let is = _mm256_set1_ps(iscale);
        let cap = _mm256_set1_epi32(127);
        for g in 0..QK_K / 32 {
            let mut q = [_mm256_setzero_si256(); 4];
            for (k, qk) in q.iter_mut().enumerate() {
                *qk = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(is, v[4 * g + k])), cap);
            }
            // Σ of each 16 codes: two vectors of eight.
            for h in 0..2 {
                b.bsums[2 * g + h] = hsum_i32x8(_mm256_add_epi32(q[2 * h], q[2 * h + 1])) as i16;
            }
            let p16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            let p8 = _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            // SAFETY: 32 writable bytes at 32g < QK_K; unaligned store.
            unsafe { _mm256_storeu_si256(b.qs.as_mut_ptr().add(32 * g) as *mut __m256i, p8) };
        }
        b.d = 1.0 / iscale;
    }
}

/// Q8_0 rows to f32 (`quant::portable::dequant_q8_0`, the same products `q · d`): eight codes
/// widened and converted per step. Reads quantized KV-cache value rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dequant_q8_0(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ8_0>(x).iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = _mm256_set1_ps(h2f(b.d));
        for j in 0..QK8_0 / 8 {
            // SAFETY: 8 codes at qs[8j..] and 8 floats at out[8j..] (32 of each per block);
            // unaligned accesses.
            unsafe {
                let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.qs.as_ptr().add(8 * j) as *const __m128i));
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * j), _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
            }
        }
    }
}

/// F16 rows to f32 with `vcvtph2ps` (exact, as `quant::portable::dequant_f16`): F16 KV-cache
/// value rows read by the quantized-key kernels.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dequant_f16(x: &[u8], y: &mut [f32]) {
    let h = as_blocks::<half::f16>(x);
    let n = h.len().min(y.len());
    let body = n & !7;
    widen(&h[..body], &mut y[..body]);
    for i in body..n {
        y[i] = h[i].to_f32();
    }
}

/// f32 rows to F16 with `vcvtps2ph` (round to nearest even, as `quant::portable::quant_f16`):
/// what every F16 KV-cache store runs.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn quant_f16(x: &[f32], y: &mut [u8]) {
    let out = as_blocks_mut::<half::f16>(y);
    let n = x.len().min(out.len());
    let body = n & !7;
    for i in (0..body).step_by(8) {
        // SAFETY: i + 8 <= n <= both lengths; unaligned load and store.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.as_ptr().add(i)));
            _mm_storeu_si128(out.as_mut_ptr().add(i) as *mut __m128i, h);
        }
    }
    for i in body..n {
        out[i] = f2h(x[i]);
    }
}
