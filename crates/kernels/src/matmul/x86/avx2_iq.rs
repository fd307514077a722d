//! AVX2 dot products of the 1- to 3-bit i-quants against Q8_K, in ggml's AVX2 order
//! (`matmul::lanes::dot_iq_q8_k`, equal bit for bit; ggml-cpu's own results in
//! `tests/ggml_fixture.rs`), for one activation row and for four (each row's bits as alone).
//!
//! Per 32 values ([`IqType::sub_block`], decoded once for all rows): the four grid entries
//! gathered into one vector of magnitudes, the activations given the values' signs
//! (`vpsignb`), `maddubs` to i16 pairs, `madd` with the scale of each 16 values to eight i32
//! lanes — lane `L` holds values `4L‥4L+4` — summed over the super-block; one FMA per
//! super-block into eight float lanes. IQ1's ternary grid takes its signs from the grid itself
//! and its ±1/8 shifts as a second set of lanes (IQ1_M) or one scalar from the activations'
//! `bsums` (IQ1_S), as ggml sums them. The type is a constant index (`IqType::ALL[K]`), so
//! each instance's decoding folds to its type's.
#![allow(clippy::missing_safety_doc)]

use super::common::{bytes_of_i8, load32u};
use crate::quant::blocks::*;
use crate::quant::iq::{each4, IqType, Sub};
use crate::simd::x86::hsum_f32x8;
use std::arch::x86_64::*;

/// Four 8-byte entries, the first in the low lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn four(e: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(e[3] as i64, e[2] as i64, e[1] as i64, e[0] as i64)
}

/// Four sign bytes as `vpsignb`'s operand: byte `8e + j` is −1 where bit j of byte e is set,
/// else 1 (each byte broadcast to its 8 lanes, its bits tested in place).
#[inline]
#[target_feature(enable = "avx2")]
fn sign_mask(s: [u8; 4]) -> __m256i {
    let spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(u32::from_le_bytes(s) as i32), spread), bits);
    _mm256_or_si256(_mm256_cmpeq_epi8(b, bits), _mm256_set1_epi8(1))
}

/// `madd(maddubs(grid, sign(y, signs)), scales)`: eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn signed(grid: __m256i, y: __m256i, signs: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(grid, _mm256_sign_epi8(y, signs)), scales)
}

/// `madd(maddubs(|g|, sign(y, g)), scales)`: a ternary grid against the activations.
#[inline]
#[target_feature(enable = "avx2")]
fn ternary(g: __m256i, y: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(g), _mm256_sign_epi8(y, g)), scales)
}

/// The i16 scale of each pair: the first scale for the first 16 values, the second after.
#[inline]
#[target_feature(enable = "avx2")]
fn scales(ls: [u8; 2]) -> __m256i {
    _mm256_setr_m128i(_mm_set1_epi16(ls[0] as i16), _mm_set1_epi16(ls[1] as i16))
}

/// `IqType::ALL[K]`'s dots of one weight row against `R` activation rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows<const K: usize, const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    let t = IqType::ALL[K];
    let ys: [&[BlockQ8K]; R] = ys.map(as_blocks::<BlockQ8K>);
    let ones = _mm256_set1_epi8(1);
    // Per row: the grid lanes, IQ1_M's shift lanes, IQ1_S's shift sum.
    let (mut acc, mut acc2, mut shifts) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R], [0f32; R]);
    for (i, a) in x.chunks_exact(t.block_bytes()).enumerate() {
        let (mut sumi, mut sumi2, mut sumi1) = ([_mm256_setzero_si256(); R], [_mm256_setzero_si256(); R], [0i32; R]);
        for ib in 0..QK_K / 32 {
            let s: Sub = t.sub_block(a, ib);
            let (grid, sc) = (four(s.grid), scales(s.ls));
            let sv = if t.shifted() { grid } else { sign_mask(s.signs) };
            let shift = if t == IqType::IQ1M { sign_mask(each4(|l| if s.shift[l] < 0 { 255 } else { 0 })) } else { grid };
            for (r, y) in ys.iter().enumerate() {
                let b = &y[i];
                let yv = load32u(bytes_of_i8(&b.qs[32 * ib..32 * ib + 32]));
                match t {
                    IqType::IQ1S => {
                        sumi[r] = _mm256_add_epi32(sumi[r], ternary(grid, yv, sc));
                        sumi1[r] += (b.bsums[2 * ib] as i32 + b.bsums[2 * ib + 1] as i32) * s.shift[0] as i32 * s.ls[0] as i32;
                    }
                    IqType::IQ1M => {
                        sumi[r] = _mm256_add_epi32(sumi[r], ternary(grid, yv, sc));
                        sumi2[r] = _mm256_add_epi32(sumi2[r], signed(ones, yv, shift, sc));
                    }
                    _ => sumi[r] = _mm256_add_epi32(sumi[r], signed(grid, yv, sv, sc)),
                }
            }
        }
        let da = t.d(a);
        for (r, y) in ys.iter().enumerate() {
            let d = da * y[i].d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            match t {
                // ggml's build contracts `accum1 += d * sumi1` into an FMA.
                IqType::IQ1S => shifts[r] = d.mul_add(sumi1[r] as f32, shifts[r]),
                IqType::IQ1M => acc2[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi2[r]), acc2[r]),
                _ => {}
            }
        }
    }
    for r in 0..R {
        out[r] = match t {
            IqType::IQ1S => hsum_f32x8(acc[r]) + 0.125 * shifts[r],
            IqType::IQ1M => hsum_f32x8(acc[r]) + 0.125 * hsum_f32x8(acc2[r]),
            _ => t.c() * hsum_f32x8(acc[r]),
        };
    }
}

/// `IqType::ALL[K]`'s dot.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot<const K: usize>(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    rows::<K, 1>(x, [y], &mut out);
    out[0]
}

/// `IqType::ALL[K]`'s dot against four activation rows, each as [`dot`] gives it.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot4<const K: usize>(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    rows::<K, 4>(x, y, out)
}
