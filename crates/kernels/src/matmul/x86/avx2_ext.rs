//! AVX2 dot products for the weight types the golden models do not use but Hub files do:
//! Q4_0, Q5_1, IQ4_NL, MXFP4 (32-blocks against Q8_0/Q8_1), Q2_K, Q3_K, Q5_K, IQ4_XS (super-blocks
//! against Q8_K) and BF16. Same integer sums as the portable twins (`matmul::portable`); only the
//! float summation order differs.
#![allow(clippy::missing_safety_doc)]

use super::common::*;
use crate::matmul::portable::bf16_tail;
use crate::quant::blocks::*;
use crate::quant::portable::{iq4_xs_scales, q3_k_scales};
use crate::simd::x86::{h2f, hsum_f32x8, hsum_i32x8};
use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = _mm256_setzero_ps();
    for (a, b) in x.iter().zip(y) {
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let qx = _mm256_sub_epi8(nibbles_32(&a.qs), _mm256_set1_epi8(8));
        acc = _mm256_fmadd_ps(d, mul_sum_i8(qx, load32(&b.qs)), acc);
    }
    hsum_f32x8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q5_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_1>(x), as_blocks::<BlockQ8_1>(y));
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for (a, b) in x.iter().zip(y) {
        summs += h2f(a.m) * h2f(b.s);
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let hi = _mm256_and_si256(bits_32(a.qh), _mm256_set1_epi8(0x10));
        let qx = _mm256_or_si256(nibbles_32(&a.qs), hi);
        acc = _mm256_fmadd_ps(d, mul_sum_us8(qx, load32(&b.qs)), acc);
    }
    hsum_f32x8(acc) + summs
}

/// The IQ4 grid in both 128-bit lanes, for `shuffle_epi8` lookups.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_iq4_nl_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockIQ4NL>(x), as_blocks::<BlockQ8_0>(y));
    // SAFETY: AVX2 enabled on this function.
    let table = unsafe { iq4_grid() };
    let mut acc = _mm256_setzero_ps();
    for (a, b) in x.iter().zip(y) {
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let qx = _mm256_shuffle_epi8(table, nibbles_32(&a.qs));
        acc = _mm256_fmadd_ps(d, mul_sum_i8(qx, load32(&b.qs)), acc);
    }
    hsum_f32x8(acc)
}

/// ggml's AVX2 `ggml_vec_dot_mxfp4_q8_0`: blocks in pairs into two accumulators, an odd last
/// block as one float (`lanes::dot_mxfp4_q8_0` writes the order out).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_mxfp4_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockMXFP4>(x), as_blocks::<BlockQ8_0>(y));
    // SAFETY: AVX2 enabled on this function.
    let table = unsafe { mxfp4_grid() };
    let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let pairs = x.len().min(y.len()) / 2;
    for i in 0..pairs {
        let (a1, b1, a2, b2) = (&x[2 * i], &y[2 * i], &x[2 * i + 1], &y[2 * i + 1]);
        let p1 = mul_sum_i8(_mm256_shuffle_epi8(table, nibbles_32(&a1.qs)), load32(&b1.qs));
        let p2 = mul_sum_i8(_mm256_shuffle_epi8(table, nibbles_32(&a2.qs)), load32(&b2.qs));
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b1.d) * e8m0_half(a1.e)), p1, acc1);
        acc2 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b2.d) * e8m0_half(a2.e)), p2, acc2);
    }
    mxfp4_tail(hsum_f32x8(_mm256_add_ps(acc1, acc2)), x.get(2 * pairs), y.get(2 * pairs))
}

/// `s` plus the MXFP4 dots' scalar tail, as ggml's AVX2 `vec_dot` adds an odd last block: the
/// block's `d_y · d_w · Σ v·y` as one float (`s` as it is where there is none).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4_tail(s: f32, a: Option<&BlockMXFP4>, b: Option<&BlockQ8_0>) -> f32 {
    let (Some(a), Some(b)) = (a, b) else { return s };
    let v = crate::quant::portable::mxfp4_values(&a.qs);
    let sumi: i32 = v.iter().zip(&b.qs).map(|(&w, &q)| w as i32 * q as i32).sum();
    s + h2f(b.d) * e8m0_half(a.e) * sumi as f32
}

/// Four-row twin of [`dot_mxfp4_q8_0`] (prefill): each block's values looked up once for the
/// four activation rows, each row's sums in its own pair of accumulators, so each row gets
/// the bits of the one-row dot.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_mxfp4_q8_0(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    let a = as_blocks::<BlockMXFP4>(x);
    let b: [&[BlockQ8_0]; 4] = y.map(as_blocks::<BlockQ8_0>);
    // SAFETY: AVX2 enabled on this function.
    let table = unsafe { mxfp4_grid() };
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let pairs = a.len() / 2;
    for (i, blk) in a[..2 * pairs].iter().enumerate() {
        let qx = _mm256_shuffle_epi8(table, nibbles_32(&blk.qs));
        let ax = _mm256_sign_epi8(qx, qx);
        let dw = e8m0_half(blk.e);
        for (row, acc) in b.iter().zip(acc.iter_mut()) {
            let sy = _mm256_sign_epi8(load32(&row[i].qs), qx);
            acc[i & 1] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(row[i].d) * dw), mul_sum_us8(ax, sy), acc[i & 1]);
        }
    }
    for ((o, row), acc) in out.iter_mut().zip(&b).zip(&acc) {
        *o = mxfp4_tail(hsum_f32x8(_mm256_add_ps(acc[0], acc[1])), a.get(2 * pairs), row.get(2 * pairs));
    }
}

/// Decode's GEMV of MXFP4 rows (`vec_dot_rows`): `out[c]` is [`dot_mxfp4_q8_0`] of row `c`
/// of `x` (rows of `xrb` bytes) against `y`, bit for bit — four rows a pass sharing each
/// activation block's loads, each row's two accumulators as alone —, the rows
/// [`STREAM_AHEAD`](crate::simd::STREAM_AHEAD) bytes on asked for into L1 as it goes.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn rows_mxfp4_q8_0(x: &[u8], xrb: usize, y: &[u8], out: &mut [f32]) {
    use crate::simd::{prefetch_lines, CacheLevel, STREAM_AHEAD};
    let bs = std::mem::size_of::<BlockMXFP4>();
    let nb = xrb / bs;
    let b = &as_blocks::<BlockQ8_0>(y)[..nb];
    // SAFETY: AVX2 enabled on this function.
    let table = unsafe { mxfp4_grid() };
    let pairs = nb / 2;
    let full = out.len() / 4 * 4;
    for (c, o) in out[..full].chunks_exact_mut(4).enumerate() {
        let w = &x[4 * c * xrb..4 * (c + 1) * xrb];
        let a: [&[BlockMXFP4]; 4] = std::array::from_fn(|r| &as_blocks::<BlockMXFP4>(&w[r * xrb..(r + 1) * xrb])[..nb]);
        prefetch_lines(w.as_ptr().wrapping_add(STREAM_AHEAD), 4 * xrb, CacheLevel::L1);
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        for (i, blk) in b[..2 * pairs].iter().enumerate() {
            let qy = load32(&blk.qs);
            let dy = h2f(blk.d);
            for (row, acc) in a.iter().zip(acc.iter_mut()) {
                let qx = _mm256_shuffle_epi8(table, nibbles_32(&row[i].qs));
                let p = mul_sum_i8(qx, qy);
                acc[i & 1] = _mm256_fmadd_ps(_mm256_set1_ps(dy * e8m0_half(row[i].e)), p, acc[i & 1]);
            }
        }
        for ((v, row), acc) in o.iter_mut().zip(&a).zip(&acc) {
            *v = mxfp4_tail(hsum_f32x8(_mm256_add_ps(acc[0], acc[1])), row.get(2 * pairs), b.get(2 * pairs));
        }
    }
    for (c, v) in out.iter_mut().enumerate().skip(full) {
        *v = dot_mxfp4_q8_0(&x[c * xrb..(c + 1) * xrb], y);
    }
}

/// i8×i8 products summed in pairs to 16 i16 lanes (no overflow: |x|, |y| ≤ 127).
#[inline]
#[target_feature(enable = "avx2")]
fn madd_i8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Two i16 scales, the first for the low 128-bit lane (elements 0..16), the second for the high.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pair(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_iq4_xs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockIQ4XS>(x), as_blocks::<BlockQ8K>(y));
    // SAFETY: AVX2 enabled on this function.
    let table = unsafe { iq4_grid() };
    let mut acc = _mm256_setzero_ps();
    for (a, b) in x.iter().zip(y) {
        let sc = iq4_xs_scales(a);
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..QK_K / 32 {
            let qs: &[u8; 16] = a.qs[ib * 16..ib * 16 + 16].try_into().unwrap();
            let qx = _mm256_shuffle_epi8(table, nibbles_32(qs));
            let q8 = load32u(bytes_of_i8(&b.qs[ib * 32..]));
            let p = _mm256_madd_epi16(_mm256_set1_epi16(sc[ib] as i16), madd_i8(qx, q8));
            sumi = _mm256_add_epi32(sumi, p);
        }
        let d = _mm256_set1_ps(h2f(a.d) * b.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_f32x8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q5_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5K>(x), as_blocks::<BlockQ8K>(y));
    let m4 = _mm256_set1_epi8(0xF);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = 0f32;
    for (a, b) in x.iter().zip(y) {
        let qh = load32u(&a.qh);
        let mut summ = 0i32;
        let mut sumi = _mm256_setzero_si256();
        for j in 0..QK_K / 64 {
            let (s0, m0) = scale_min_k4(2 * j, &a.scales);
            let (s1, m1) = scale_min_k4(2 * j + 1, &a.scales);
            let bs = &b.bsums[4 * j..4 * j + 4];
            summ += m0 as i32 * (bs[0] as i32 + bs[1] as i32) + m1 as i32 * (bs[2] as i32 + bs[3] as i32);
            let q = load32u(&a.qs[j * 32..]);
            // Bit 2j of qh is the fifth bit of the low nibbles, bit 2j+1 of the high ones.
            let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32));
            let hl = _mm256_slli_epi16(_mm256_and_si256(h, one), 4);
            let hh = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 1), one), 4);
            let ql = _mm256_or_si256(_mm256_and_si256(q, m4), hl);
            let qhi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hh);
            let q8l = load32u(bytes_of_i8(&b.qs[j * 64..]));
            let q8h = load32u(bytes_of_i8(&b.qs[j * 64 + 32..]));
            let pl = _mm256_madd_epi16(_mm256_set1_epi16(s0 as i16), _mm256_maddubs_epi16(ql, q8l));
            let ph = _mm256_madd_epi16(_mm256_set1_epi16(s1 as i16), _mm256_maddubs_epi16(qhi, q8h));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(a.d) * b.d), _mm256_cvtepi32_ps(sumi), acc);
        acc_m += h2f(a.dmin) * b.d * summ as f32;
    }
    hsum_f32x8(acc) - acc_m
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q2_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ2K>(x), as_blocks::<BlockQ8K>(y));
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = 0f32;
    for (a, b) in x.iter().zip(y) {
        // Min terms: (scale >> 4) · bsums over the 16 groups.
        // SAFETY: scales is 16 bytes, bsums 16 i16 (32 bytes); loadu is unaligned.
        let (sc, bsums) = unsafe {
            (
                _mm_loadu_si128(a.scales.as_ptr() as *const __m128i),
                _mm256_loadu_si256(b.bsums.as_ptr() as *const __m256i),
            )
        };
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0xF)));
        let summ = hsum_i32x8(_mm256_madd_epi16(mins, bsums));
        let mut sumi = _mm256_setzero_si256();
        for n in 0..QK_K / 128 {
            let q2 = load32u(&a.qs[n * 32..]);
            for k in 0..4 {
                let qk = _mm256_and_si256(_mm256_srl_epi16(q2, _mm_cvtsi32_si128(2 * k as i32)), m3);
                let q8 = load32u(bytes_of_i8(&b.qs[n * 128 + k * 32..]));
                let g = n * 8 + 2 * k;
                let s = scale_pair((a.scales[g] & 0xF) as i16, (a.scales[g + 1] & 0xF) as i16);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, _mm256_maddubs_epi16(qk, q8)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(a.d) * b.d), _mm256_cvtepi32_ps(sumi), acc);
        acc_m += h2f(a.dmin) * b.d * summ as f32;
    }
    hsum_f32x8(acc) - acc_m
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q3_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ3K>(x), as_blocks::<BlockQ8K>(y));
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let mut acc = _mm256_setzero_ps();
    for (a, b) in x.iter().zip(y) {
        let sc = q3_k_scales(&a.scales);
        let hm = load32u(&a.hmask);
        let mut sumi = _mm256_setzero_si256();
        for n in 0..QK_K / 128 {
            let q2 = load32u(&a.qs[n * 32..]);
            for k in 0..4 {
                let ql = _mm256_and_si256(_mm256_srl_epi16(q2, _mm_cvtsi32_si128(2 * k as i32)), m3);
                // 4 where the high bit (4n + k) is clear: the value is ql - 4 there.
                let bit = _mm256_set1_epi8((1u8 << (4 * n + k)) as i8);
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                let qhs = _mm256_and_si256(clear, four);
                let q8 = load32u(bytes_of_i8(&b.qs[n * 128 + k * 32..]));
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(ql, q8), _mm256_maddubs_epi16(qhs, q8));
                let g = n * 8 + 2 * k;
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale_pair(sc[g] as i16, sc[g + 1] as i16), p));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(a.d) * b.d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_f32x8(acc)
}

/// BF16·BF16 in ggml's AVX2 order (`matmul::portable::dot_bf16_avx2_order`, bit for bit): per
/// 32 values four 8-lane accumulators `c = c + x·y` (multiply, then add: no FMA), combined
/// `(c1 + c3) + (c2 + c4)` and summed as `hsum_f32x8`, then the tail in f64.
#[target_feature(enable = "avx2,fma")]
pub fn dot_bf16(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<u16>(x), as_blocks::<u16>(y));
    let n = x.len().min(y.len());
    #[inline(always)]
    unsafe fn widen(p: *const u16) -> __m256 {
        // SAFETY: callers pass a pointer with 8 readable u16 (checked by the loop bound).
        let v = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
    }
    let mut c = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, c) in c.iter_mut().enumerate() {
            // SAFETY: i + 32 <= n for both slices.
            let (a, b) = unsafe { (widen(x.as_ptr().add(i + 8 * k)), widen(y.as_ptr().add(i + 8 * k))) };
            *c = _mm256_add_ps(_mm256_mul_ps(a, b), *c);
        }
        i += 32;
    }
    let v = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
    bf16_tail(hsum_f32x8(v) as f64, &x[i..n], &y[i..n])
}
