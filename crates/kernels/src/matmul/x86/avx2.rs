//! AVX2 + FMA + F16C dot products, following ggml's integer scheme: `maddubs` (u8×i8 → i16 pairs)
//! then `madd` with ones or scales (→ i32), one float FMA per block.
#![allow(clippy::missing_safety_doc)]

use super::common::*;
use crate::quant::blocks::*;
use crate::simd::x86::{fold_ggml, h2f, hsum_f32x8, hsum_i32x8, load_ph};
use half::f16;
use std::arch::x86_64::*;

/// `d_x · d_y` of four activation blocks (Q8_0 rows), each in all eight lanes of its vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales4(dx: f32, y: [&BlockQ8_0; 4]) -> [__m256; 4] {
    // Lane 2j: d_x·d_y of row j (the odd lanes are unused).
    let d = _mm256_mul_ps(_mm256_set1_ps(dx), heads4(y));
    [lane::<0>(d), lane::<2>(d), lane::<4>(d), lane::<6>(d)]
}

/// Lane `L` of `v` in all eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane<const L: i32>(v: __m256) -> __m256 {
    _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(L))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q4_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4_1>(x), as_blocks::<BlockQ8_1>(y));
    let mut acc = _mm256_setzero_ps();
    // Lane 1 is ggml's `summs` (Σ m·s), accumulated in the same order; lane 0 is unused.
    let mut summs = _mm_setzero_ps();
    for (a, b) in x.iter().zip(y) {
        // [d_x·d_y, m·s]: both products in one multiply.
        let p = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(head(a))), _mm_cvtph_ps(_mm_cvtsi32_si128(head(b))));
        summs = _mm_add_ps(summs, p);
        let d = _mm256_broadcastss_ps(p);
        let qx = nibbles_32(&a.qs);
        let qy = load32(&b.qs);
        acc = _mm256_fmadd_ps(d, mul_sum_us8(qx, qy), acc);
    }
    hsum_f32x8(acc) + _mm_cvtss_f32(_mm_movehdup_ps(summs))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = _mm256_setzero_ps();
    for (a, b) in x.iter().zip(y) {
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let qx = nibbles_32(&a.qs);
        // Where the fifth bit is clear, set the top nibble: byte becomes q - 16 as i8.
        let hi = _mm256_andnot_si256(bits_32(a.qh), _mm256_set1_epi8(0xF0u8 as i8));
        let qx = _mm256_or_si256(qx, hi);
        acc = _mm256_fmadd_ps(d, mul_sum_i8(qx, load32(&b.qs)), acc);
    }
    hsum_f32x8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ8_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = _mm256_setzero_ps();
    for (a, b) in x.iter().zip(y) {
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        acc = _mm256_fmadd_ps(d, mul_sum_i8(load32(&a.qs), load32(&b.qs)), acc);
    }
    hsum_f32x8(acc)
}

/// Integer sums with AVX2, float order of ggml's repacked `q4_K_8x8` kernels (see the portable
/// twin): the two are bit-identical.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q4_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4K>(x), as_blocks::<BlockQ8K>(y));
    let m4 = _mm256_set1_epi8(0xF);
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (a, b) in x.iter().zip(y) {
        let mut sc = [0i16; 8];
        let mut summ = 0i32;
        for (j, s) in sc.iter_mut().enumerate() {
            let (scale, m) = scale_min_k4(j, &a.scales);
            *s = scale as i16;
            summ += m as i32 * (b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32);
        }
        let mut sumi = _mm256_setzero_si256();
        for j in 0..QK_K / 64 {
            let q4 = load32u(&a.qs[j * 32..]);
            let q4l = _mm256_and_si256(q4, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            let q8l = load32u(bytes_of_i8(&b.qs[j * 64..]));
            let q8h = load32u(bytes_of_i8(&b.qs[j * 64 + 32..]));
            let pl = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j]), _mm256_maddubs_epi16(q4l, q8l));
            let ph =
                _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j + 1]), _mm256_maddubs_epi16(q4h, q8h));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = (hsum_i32x8(sumi) as f32).mul_add(h2f(a.d) * b.d, acc);
        acc_min = (summ as f32).mul_add(h2f(a.dmin) * b.d, acc_min);
    }
    acc - acc_min
}

/// AVX2 twin of `matmul::portable::dot_q4_k_q8_k_tile` (bit-identical).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q4_k_q8_k_tile(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4K>(x), as_blocks::<BlockQ8K>(y));
    let m4 = _mm256_set1_epi8(0xF);
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (a, b) in x.iter().zip(y) {
        let (d, dmin) = (h2f(a.d) * b.d, h2f(a.dmin) * b.d);
        for j in 0..QK_K / 64 {
            let (s0, m0) = scale_min_k4(2 * j, &a.scales);
            let (s1, m1) = scale_min_k4(2 * j + 1, &a.scales);
            let q4 = load32u(&a.qs[j * 32..]);
            let q4l = _mm256_and_si256(q4, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            let q8l = load32u(bytes_of_i8(&b.qs[j * 64..]));
            let q8h = load32u(bytes_of_i8(&b.qs[j * 64 + 32..]));
            let pl = _mm256_madd_epi16(_mm256_set1_epi16(s0 as i16), _mm256_maddubs_epi16(q4l, q8l));
            let ph = _mm256_madd_epi16(_mm256_set1_epi16(s1 as i16), _mm256_maddubs_epi16(q4h, q8h));
            let sumi = hsum_i32x8(_mm256_add_epi32(pl, ph));
            let bs = &b.bsums[4 * j..4 * j + 4];
            let summ = m0 as i32 * (bs[0] as i32 + bs[1] as i32) + m1 as i32 * (bs[2] as i32 + bs[3] as i32);
            acc = (sumi as f32).mul_add(d, acc);
            acc_min = (summ as f32).mul_add(dmin, acc_min);
        }
    }
    acc - acc_min
}

/// ggml's AVX2 layout: unsigned 6-bit values times activations, scaled per 16, and the −32
/// offset subtracted at the end per lane pair from the activation block sums (`bsums`), so the
/// eight float lanes hold exactly what ggml's hold.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_q6_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ6K>(x), as_blocks::<BlockQ8K>(y));
    let mut acc = _mm256_setzero_ps();
    for (a, b) in x.iter().zip(y) {
        // SAFETY: bsums is 16 i16 (32 bytes), scales 16 i8 (16 bytes); loadu is unaligned.
        let (q8sums, scales) = unsafe {
            (
                _mm256_loadu_si256(b.bsums.as_ptr() as *const __m256i),
                _mm_loadu_si128(a.scales.as_ptr() as *const __m128i),
            )
        };
        let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, _mm256_cvtepi8_epi16(scales)), 5);
        let mut sumi = _mm256_setzero_si256();
        for n in 0..QK_K / 128 {
            let mut p = [_mm256_setzero_si256(); 4];
            for (k, p) in p.iter_mut().enumerate() {
                let q8 = load32u(bytes_of_i8(&b.qs[n * 128 + k * 32..]));
                *p = _mm256_madd_epi16(q6_scales(scales, n * 8 + k * 2), _mm256_maddubs_epi16(q6_group(a, n, k), q8));
            }
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
        }
        let sumi = _mm256_sub_epi32(sumi, q8sclsub);
        let d = _mm256_set1_ps(b.d * h2f(a.d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_f32x8(acc)
}

/// F16·F16 with F16C conversion, f32 accumulation (KV cache and F16 weights).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_f16(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<half::f16>(x), as_blocks::<half::f16>(y));
    let n = x.len().min(y.len());
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, both slices have at least n elements of 2 bytes.
        let (a, b) = unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(y.as_ptr().add(i) as *const __m128i)),
            )
        };
        acc = _mm256_fmadd_ps(a, b, acc);
        i += 8;
    }
    let mut s = hsum_f32x8(acc);
    for j in i..n {
        s += h2f(x[j]) * h2f(y[j]);
    }
    s
}

#[target_feature(enable = "avx2,fma")]
pub fn dot_f32(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<f32>(x), as_blocks::<f32>(y));
    let n = x.len().min(y.len());
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n for both slices.
        let (a, b) = unsafe { (_mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(y.as_ptr().add(i))) };
        acc = _mm256_fmadd_ps(a, b, acc);
        i += 8;
    }
    let mut s = hsum_f32x8(acc);
    for j in i..n {
        s += x[j] * y[j];
    }
    s
}

/// One weight row against four activation rows, decoding each weight block once. Every row's
/// accumulator sees exactly the operations of the single-row kernel, so
/// `out[j] == dot(x, y[j])` bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_q8_0_q8_0(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    let a = as_blocks::<BlockQ8_0>(x);
    let b: [&[BlockQ8_0]; 4] = y.map(as_blocks::<BlockQ8_0>);
    let mut acc = [_mm256_setzero_ps(); 4];
    for (i, blk) in a.iter().enumerate() {
        let qx = load32(&blk.qs);
        let ax = _mm256_sign_epi8(qx, qx);
        let ds = scales4(h2f(blk.d), [&b[0][i], &b[1][i], &b[2][i], &b[3][i]]);
        for j in 0..4 {
            let sy = _mm256_sign_epi8(load32(&b[j][i].qs), qx);
            acc[j] = _mm256_fmadd_ps(ds[j], mul_sum_us8(ax, sy), acc[j]);
        }
    }
    for j in 0..4 {
        out[j] = hsum_f32x8(acc[j]);
    }
}

/// Four-row twin of [`dot_q5_0_q8_0`].
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_q5_0_q8_0(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    let a = as_blocks::<BlockQ5_0>(x);
    let b: [&[BlockQ8_0]; 4] = y.map(as_blocks::<BlockQ8_0>);
    let mut acc = [_mm256_setzero_ps(); 4];
    for (i, blk) in a.iter().enumerate() {
        let hi = _mm256_andnot_si256(bits_32(blk.qh), _mm256_set1_epi8(0xF0u8 as i8));
        let qx = _mm256_or_si256(nibbles_32(&blk.qs), hi);
        let ax = _mm256_sign_epi8(qx, qx);
        let ds = scales4(h2f(blk.d), [&b[0][i], &b[1][i], &b[2][i], &b[3][i]]);
        for j in 0..4 {
            let sy = _mm256_sign_epi8(load32(&b[j][i].qs), qx);
            acc[j] = _mm256_fmadd_ps(ds[j], mul_sum_us8(ax, sy), acc[j]);
        }
    }
    for j in 0..4 {
        out[j] = hsum_f32x8(acc[j]);
    }
}

/// Four-row twin of [`dot_q4_1_q8_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_q4_1_q8_1(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    let a = as_blocks::<BlockQ4_1>(x);
    let b: [&[BlockQ8_1]; 4] = y.map(as_blocks::<BlockQ8_1>);
    let mut acc = [_mm256_setzero_ps(); 4];
    // Lane 2j+1: `summs` of row j, in the single-row kernel's order.
    let mut summs = _mm256_setzero_ps();
    for (i, blk) in a.iter().enumerate() {
        let qx = nibbles_32(&blk.qs);
        // [d_x, m_x] in every lane pair times [d_y, s_y] of row j in lanes 2j, 2j+1.
        let xdm = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(_mm_cvtph_ps(_mm_cvtsi32_si128(head(blk))))));
        let p = _mm256_mul_ps(xdm, heads4([&b[0][i], &b[1][i], &b[2][i], &b[3][i]]));
        summs = _mm256_add_ps(summs, p);
        let ds = [lane::<0>(p), lane::<2>(p), lane::<4>(p), lane::<6>(p)];
        for j in 0..4 {
            acc[j] = _mm256_fmadd_ps(ds[j], mul_sum_us8(qx, load32(&b[j][i].qs)), acc[j]);
        }
    }
    let mut sm = [0f32; 8];
    // SAFETY: 8 f32 of stack memory.
    unsafe { _mm256_storeu_ps(sm.as_mut_ptr(), summs) };
    for j in 0..4 {
        out[j] = hsum_f32x8(acc[j]) + sm[2 * j + 1];
    }
}

/// `matmul::portable::dot_f16_ggml`, vectorised.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_f16_ggml(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [_mm256_setzero_ps(); 8]; // accumulator j = (acc[2j], acc[2j+1])
    let mut i = 0;
    while i < np {
        for (h, a) in acc.iter_mut().enumerate() {
            let o = i + h * 8;
            *a = _mm256_fmadd_ps(load_ph(&x[o..]), load_ph(&y[o..]), *a);
        }
        i += 64;
    }
    let mut sum = fold_ggml(&acc);
    for k in np..n {
        sum += (h2f(x[k]) * h2f(y[k])) as f64;
    }
    sum as f32
}
