//! AVX2 dot products of the 1- to 3-bit i-quants against Q8_K, in ggml's AVX2 order
//! (`matmul::lanes::dot_iq_q8_k`, equal bit for bit; ggml-cpu's own results in
//! `tests/ggml_fixture.rs`).
//!
//! Per 32 values: the four (IQ3: eight) grid entries gathered into one vector of magnitudes,
//! the activations given the values' signs (`vpsignb`), `maddubs` to i16 pairs, `madd` with
//! the scale of each 16 values to eight i32 lanes — lane `L` holds values `4L‥4L+4` — summed
//! over the super-block; one FMA per super-block into eight float lanes. IQ1's ternary grid
//! takes its signs from the grid itself and its ±1/8 shifts as a second set of lanes (IQ1_M)
//! or one scalar from the activations' `bsums` (IQ1_S), as ggml sums them.
#![allow(clippy::missing_safety_doc)]

use super::common::{bytes_of_i8, load32u};
use crate::quant::blocks::*;
use crate::quant::iq::{iq1_m_scale, ksigns, IqType};
use crate::quant::iq_grids::*;
use crate::simd::x86::{h2f, hsum_f32x8};
use std::arch::x86_64::*;

/// For each sign byte, eight bytes of 1 or −1 (bit j set: byte j is −1), `vpsignb`'s operand.
static SIGN_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            t[s] |= (if s >> j & 1 != 0 { 0xff } else { 0x01 }) << (8 * j);
            j += 1;
        }
        s += 1;
    }
    t
};

/// Four 8-byte entries, the first in the low lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn four(a: u64, b: u64, c: u64, d: u64) -> __m256i {
    _mm256_set_epi64x(d as i64, c as i64, b as i64, a as i64)
}

/// One sub-block of 32: `madd(maddubs(grid, sign(y, signs)), scales)`, eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn sub_block(grid: __m256i, y: __m256i, signs: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(grid, _mm256_sign_epi8(y, signs)), scales)
}

/// The i16 scale of each pair: `lo` for the first 16 values, `hi` for the next.
#[inline]
#[target_feature(enable = "avx2")]
fn scales(lo: u8, hi: u8) -> __m256i {
    _mm256_setr_m128i(_mm_set1_epi16(lo as i16), _mm_set1_epi16(hi as i16))
}

/// The activations of sub-block `ib`.
#[inline]
#[target_feature(enable = "avx2")]
fn act(b: &BlockQ8K, ib: usize) -> __m256i {
    load32u(bytes_of_i8(&b.qs[32 * ib..32 * ib + 32]))
}

/// Sign masks of four sign bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn signs4(s: [u8; 4]) -> __m256i {
    four(SIGN_MASKS[s[0] as usize], SIGN_MASKS[s[1] as usize], SIGN_MASKS[s[2] as usize], SIGN_MASKS[s[3] as usize])
}

/// The sign bytes of four 7-bit sign sets packed in `sg` (IQ2_XXS, IQ3_XXS).
#[inline]
#[target_feature(enable = "avx2")]
fn packed_signs(sg: u32) -> [u8; 4] {
    [ksigns(sg), ksigns(sg >> 7), ksigns(sg >> 14), ksigns(sg >> 21)]
}

/// The grid types' common frame, over `R` activation rows (1: the dot; 4: a 4-row dot, each
/// row's bits as alone): for each super-block, `sub(ib)` gives sub-block `ib`'s grid, sign
/// bytes and two scales, decoded once for all rows; the type's constant times the lanes' sum
/// at the end.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn grid_dot<B: Block, const R: usize>(t: IqType, x: &[u8], ys: [&[u8]; R], out: &mut [f32; R], d: impl Fn(&B) -> f32, sub: impl Fn(&B, usize) -> (__m256i, [u8; 4], u8, u8)) {
    let x = as_blocks::<B>(x);
    let ys: [&[BlockQ8K]; R] = ys.map(as_blocks::<BlockQ8K>);
    let mut acc = [_mm256_setzero_ps(); R];
    for (i, a) in x.iter().enumerate() {
        let mut sumi = [_mm256_setzero_si256(); R];
        for ib in 0..QK_K / 32 {
            let (grid, s, lo, hi) = sub(a, ib);
            let (sv, sc) = (signs4(s), scales(lo, hi));
            for (r, y) in ys.iter().enumerate() {
                sumi[r] = _mm256_add_epi32(sumi[r], sub_block(grid, act(&y[i], ib), sv, sc));
            }
        }
        let da = d(a);
        for (r, y) in ys.iter().enumerate() {
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(da * y[i].d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = t.c() * hsum_f32x8(a);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_iq2_xxs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    rows_iq2_xxs(x, [y], &mut out);
    out[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_iq2_xxs_q8_k(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    rows_iq2_xxs(x, y, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_iq2_xxs<const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    grid_dot(IqType::IQ2XXS, x, ys, out, |a: &BlockIQ2XXS| h2f(a.d), |a, ib| {
        let q = &a.qs[4 * ib..4 * ib + 4];
        let (idx, sg) = (q[0] as usize | (q[1] as usize) << 16, q[2] as u32 | (q[3] as u32) << 16);
        let g = |l: usize| IQ2XXS_GRID[idx >> (8 * l) & 255];
        let ls = (2 * (sg >> 28) + 1) as u8;
        (four(g(0), g(1), g(2), g(3)), packed_signs(sg), ls, ls)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_iq2_xs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    rows_iq2_xs(x, [y], &mut out);
    out[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_iq2_xs_q8_k(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    rows_iq2_xs(x, y, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_iq2_xs<const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    grid_dot(IqType::IQ2XS, x, ys, out, |a: &BlockIQ2XS| h2f(a.d), |a, ib| {
        let q = &a.qs[4 * ib..4 * ib + 4];
        let g = |l: usize| IQ2XS_GRID[(q[l] & 511) as usize];
        let s = [0, 1, 2, 3].map(|l| ksigns((q[l] >> 9) as u32));
        (four(g(0), g(1), g(2), g(3)), s, 2 * (a.scales[ib] & 15) + 1, 2 * (a.scales[ib] >> 4) + 1)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_iq2_s_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    rows_iq2_s(x, [y], &mut out);
    out[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_iq2_s_q8_k(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    rows_iq2_s(x, y, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_iq2_s<const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    grid_dot(IqType::IQ2S, x, ys, out, |a: &BlockIQ2S| h2f(a.d), |a, ib| {
        let qh = a.qh[ib] as usize;
        let g = |l: usize| IQ2S_GRID[a.qs[4 * ib + l] as usize | (qh << (8 - 2 * l) & 0x300)];
        let s: [u8; 4] = a.qs[QK_K / 8 + 4 * ib..QK_K / 8 + 4 * ib + 4].try_into().unwrap();
        (four(g(0), g(1), g(2), g(3)), s, 2 * (a.scales[ib] & 15) + 1, 2 * (a.scales[ib] >> 4) + 1)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_iq3_xxs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    rows_iq3_xxs(x, [y], &mut out);
    out[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_iq3_xxs_q8_k(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    rows_iq3_xxs(x, y, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_iq3_xxs<const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    grid_dot(IqType::IQ3XXS, x, ys, out, |a: &BlockIQ3XXS| h2f(a.d), |a, ib| {
        let q = &a.qs[8 * ib..8 * ib + 8];
        let g = |l: usize| IQ3XXS_GRID[q[2 * l] as usize] as u64 | (IQ3XXS_GRID[q[2 * l + 1] as usize] as u64) << 32;
        let sg = u32::from_le_bytes(a.qs[QK_K / 4 + 4 * ib..QK_K / 4 + 4 * ib + 4].try_into().unwrap());
        let ls = (2 * (sg >> 28) + 1) as u8;
        (four(g(0), g(1), g(2), g(3)), packed_signs(sg), ls, ls)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_iq3_s_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    rows_iq3_s(x, [y], &mut out);
    out[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_iq3_s_q8_k(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    rows_iq3_s(x, y, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_iq3_s<const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    grid_dot(IqType::IQ3S, x, ys, out, |a: &BlockIQ3S| h2f(a.d), |a, ib| {
        let (q, qh) = (&a.qs[8 * ib..8 * ib + 8], a.qh[ib] as usize);
        let g = |l: usize| {
            let (i1, i2) = (q[2 * l] as usize | (qh << (8 - 2 * l) & 256), q[2 * l + 1] as usize | (qh << (7 - 2 * l) & 256));
            IQ3S_GRID[i1] as u64 | (IQ3S_GRID[i2] as u64) << 32
        };
        let s: [u8; 4] = a.signs[4 * ib..4 * ib + 4].try_into().unwrap();
        let ls = 2 * (a.scales[ib / 2] >> (4 * (ib % 2)) & 15) + 1;
        (four(g(0), g(1), g(2), g(3)), s, ls, ls)
    })
}

/// `madd(maddubs(|g|, sign(y, g)), scales)`: a ternary grid against the activations.
#[inline]
#[target_feature(enable = "avx2")]
fn ternary(g: __m256i, y: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(g), _mm256_sign_epi8(y, g)), scales)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_iq1_s_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    rows_iq1_s(x, [y], &mut out);
    out[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_iq1_s_q8_k(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    rows_iq1_s(x, y, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_iq1_s<const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    let x = as_blocks::<BlockIQ1S>(x);
    let ys: [&[BlockQ8K]; R] = ys.map(as_blocks::<BlockQ8K>);
    let (mut acc, mut shifts) = ([_mm256_setzero_ps(); R], [0f32; R]);
    for (i, a) in x.iter().enumerate() {
        let (mut sumi, mut sumi1) = ([_mm256_setzero_si256(); R], [0i32; R]);
        for ib in 0..QK_K / 32 {
            let qh = a.qh[ib] as usize;
            let g = |l: usize| IQ1S_GRID[a.qs[4 * ib + l] as usize | ((qh >> (3 * l)) & 7) << 8];
            let ls = (2 * ((qh >> 12) & 7) + 1) as u8;
            let (grid, sv) = (four(g(0), g(1), g(2), g(3)), scales(ls, ls));
            let sign = if qh & 0x8000 != 0 { -1 } else { 1 };
            for (r, y) in ys.iter().enumerate() {
                let b = &y[i];
                sumi[r] = _mm256_add_epi32(sumi[r], ternary(grid, act(b, ib), sv));
                sumi1[r] += (b.bsums[2 * ib] as i32 + b.bsums[2 * ib + 1] as i32) * sign * ls as i32;
            }
        }
        for (r, y) in ys.iter().enumerate() {
            let d = h2f(a.d) * y[i].d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            shifts[r] += d * sumi1[r] as f32;
        }
    }
    for r in 0..R {
        out[r] = hsum_f32x8(acc[r]) + 0.125 * shifts[r];
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_iq1_m_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    rows_iq1_m(x, [y], &mut out);
    out[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4_iq1_m_q8_k(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    rows_iq1_m(x, y, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_iq1_m<const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    let x = as_blocks::<BlockIQ1M>(x);
    let ys: [&[BlockQ8K]; R] = ys.map(as_blocks::<BlockQ8K>);
    let (mut acc, mut acc2) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    let ones = _mm256_set1_epi8(1);
    for (i, a) in x.iter().enumerate() {
        let (mut sumi, mut sumi2) = ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R]);
        let sc = |i: usize| u16::from_le_bytes([a.scales[2 * i], a.scales[2 * i + 1]]);
        for ib in 0..QK_K / 32 {
            let s = sc(ib / 2) >> (6 * (ib % 2));
            let sv = scales((2 * (s & 7) + 1) as u8, (2 * ((s >> 3) & 7) + 1) as u8);
            let qh = |l: usize| a.qh[2 * ib + l / 2] as usize >> (4 * (l % 2));
            let g = |l: usize| IQ1S_GRID[a.qs[4 * ib + l] as usize | (qh(l) & 7) << 8];
            let shift = |l: usize| SIGN_MASKS[if qh(l) & 8 != 0 { 255 } else { 0 }];
            let (grid, shifts) = (four(g(0), g(1), g(2), g(3)), four(shift(0), shift(1), shift(2), shift(3)));
            for (r, y) in ys.iter().enumerate() {
                let yv = act(&y[i], ib);
                sumi[r] = _mm256_add_epi32(sumi[r], ternary(grid, yv, sv));
                sumi2[r] = _mm256_add_epi32(sumi2[r], sub_block(ones, yv, shifts, sv));
            }
        }
        let da = h2f(iq1_m_scale(&a.scales));
        for (r, y) in ys.iter().enumerate() {
            let d = _mm256_set1_ps(da * y[i].d);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            acc2[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2[r]), acc2[r]);
        }
    }
    for r in 0..R {
        out[r] = hsum_f32x8(acc[r]) + 0.125 * hsum_f32x8(acc2[r]);
    }
}
