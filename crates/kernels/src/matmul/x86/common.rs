//! Block decoders and integer sums shared by the AVX2 and AVX-512 dot products (ggml's
//! scheme: `maddubs` u8×i8 → i16 pairs, then `madd` → i32): scale heads of blocks, nibbles and
//! fifth bits to bytes, the Q6_K group and scale decoders.
#![allow(clippy::missing_safety_doc)]

use crate::quant::blocks::*;
use crate::simd::{prefetch_lines, CacheLevel};
use std::arch::x86_64::*;

/// A 32-value block type with an interleaved layout (`matmul::layout`), as its x86 kernels
/// (`avx2_il`, `avx512_il`) decode it.
pub trait IlBlock {
    /// Plain block bytes (a group-block is four of them).
    const BS: usize;
    /// `u = q + OFFSET` (0: the values are unsigned already; the type has a min instead).
    const OFFSET: u8;
    /// Q8_1 activations and a `Σ m·s` term (Q4_1, Q5_1); otherwise Q8_0 activations.
    const MIN: bool;
    /// Where and how the values sit in the group-block.
    const VALUES: IlValues;
}

/// How a group-block holds its values.
pub enum IlValues {
    /// Four rows' 16 bytes of nibbles at this offset (row r at `16r`): low nibbles are values
    /// 0‥16, high nibbles values 16‥32.
    Nibbles(usize),
    /// Q5: the two 64-bit fifth-bit masks at this offset, the nibbles 16 bytes on.
    FifthBits(usize),
    /// Q8_0: signed bytes, values 0‥16 of the four rows at 8, values 16‥32 at 72.
    Bytes,
    /// IQ4_NL: nibbles as [`IlValues::Nibbles`] at this offset, each an index into
    /// `KVALUES_IQ4NL` (signed values, |v| ≤ 127).
    Table(usize),
}

pub struct Q4_0;
pub struct Q4_1;
pub struct Q5_0;
pub struct Q5_1;
pub struct Q8_0;
pub struct IQ4NL;

impl IlBlock for Q4_0 {
    const BS: usize = 18;
    const OFFSET: u8 = 8;
    const MIN: bool = false;
    const VALUES: IlValues = IlValues::Nibbles(8);
}

impl IlBlock for Q4_1 {
    const BS: usize = 20;
    const OFFSET: u8 = 0;
    const MIN: bool = true;
    const VALUES: IlValues = IlValues::Nibbles(16);
}

impl IlBlock for Q5_0 {
    const BS: usize = 22;
    const OFFSET: u8 = 16;
    const MIN: bool = false;
    const VALUES: IlValues = IlValues::FifthBits(8);
}

impl IlBlock for Q5_1 {
    const BS: usize = 24;
    const OFFSET: u8 = 0;
    const MIN: bool = true;
    const VALUES: IlValues = IlValues::FifthBits(16);
}

impl IlBlock for IQ4NL {
    const BS: usize = 18;
    // The AVX-512 kernels multiply `v + 128` (unsigned); AVX2 multiplies signed values.
    const OFFSET: u8 = 128;
    const MIN: bool = false;
    const VALUES: IlValues = IlValues::Table(8);
}

impl IlBlock for Q8_0 {
    const BS: usize = 34;
    const OFFSET: u8 = 128;
    const MIN: bool = false;
    const VALUES: IlValues = IlValues::Bytes;
}

/// Bytes of an activation block, and where its 32 quants start.
pub(crate) const fn act_block<T: IlBlock>() -> (usize, usize) {
    if T::MIN {
        (std::mem::size_of::<BlockQ8_1>(), 4)
    } else {
        (std::mem::size_of::<BlockQ8_0>(), 2)
    }
}

/// The group-block's scales: `[d0‥d3, 0…]` (with a min: `[d0, m0, …, d3, m3]`), as f32.
///
/// # Safety
/// A whole group-block at `g`; F16C present.
#[inline(always)]
pub(crate) unsafe fn heads<T: IlBlock>(g: *const u8) -> __m256 {
    // SAFETY: the group-block starts with 8 (with a min: 16) bytes of f16 scales.
    unsafe {
        if T::MIN {
            _mm256_cvtph_ps(_mm_loadu_si128(g as *const __m128i))
        } else {
            _mm256_cvtph_ps(_mm_loadl_epi64(g as *const __m128i))
        }
    }
}

/// i32 of `prep` per Q8_K super-block for the interleaved Q4_K kernels: its eight pair sums as
/// i16 (four i32), `d_y`.
pub(crate) const Q4K_PREP: usize = 8;

/// Fill `prep[Q4K_PREP·i ..]` for each Q8_K super-block i of activation row `y`, as the
/// interleaved Q4_K kernels read it: the eight sums
/// `bsums[2s] + bsums[2s+1]` as i16 (≤ 32·127, exact), then `d_y`.
#[inline(always)]
pub(crate) unsafe fn prepare_q4_k(y: &[u8], nb: usize, prep: &mut [i32]) {
    let abs = std::mem::size_of::<BlockQ8K>();
    // Where a Q8_K block's sums start (after `d` and 256 quants).
    const BSUMS: usize = 4 + 256;
    assert!(y.len() >= nb * abs && prep.len() >= nb * Q4K_PREP);
    for i in 0..nb {
        // SAFETY: block i of y and Q4K_PREP i32 of prep, both checked above; unaligned accesses.
        unsafe {
            let blk = y.as_ptr().add(i * abs);
            let p = prep.as_mut_ptr().add(Q4K_PREP * i);
            let pairs = _mm256_madd_epi16(_mm256_loadu_si256(blk.add(BSUMS) as *const __m256i), _mm256_set1_epi16(1));
            let w = _mm_packs_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
            _mm_storeu_si128(p as *mut __m128i, w);
            *p.add(4) = (blk as *const i32).read_unaligned();
        }
    }
}

/// The first four bytes of a block (its f16 scale, and the f16 after it or the first two
/// quant bytes) as a u32: every block type here is at least 18 bytes long.
#[inline(always)]
pub(crate) fn head<B: Block>(b: &B) -> i32 {
    // SAFETY: B is plain old data of more than 4 bytes (Block's contract; see the size asserts
    // in blocks.rs); unaligned read.
    unsafe { (b as *const B as *const i32).read_unaligned() }
}

/// The f16 pairs at the start of four blocks, converted: lanes 2j and 2j+1 hold block j's
/// first and second f16 (the scales `d`, and `m` or `s` where the block has one).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn heads4<B: Block>(b: [&B; 4]) -> __m256 {
    _mm256_cvtph_ps(_mm_setr_epi32(head(b[0]), head(b[1]), head(b[2]), head(b[3])))
}

/// The IQ4_NL/IQ4_XS grid (`KVALUES_IQ4NL`) in both 128-bit lanes, for `vpshufb` lookups.
///
/// # Safety
/// AVX2 present (inlined into the kernel, also through `#[inline(always)]` helpers).
#[inline(always)]
pub(crate) unsafe fn iq4_grid() -> __m256i {
    // SAFETY: KVALUES_IQ4NL is 16 readable bytes; unaligned load; the caller's AVX2.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i)) }
}

/// The MXFP4 grid (doubled E2M1 values) in both 128-bit lanes, for `shuffle_epi8` lookups.
///
/// # Safety
/// AVX2 present (inlined into the kernel).
#[inline(always)]
pub(crate) unsafe fn mxfp4_grid() -> __m256i {
    // SAFETY: KVALUES_MXFP4 is 16 readable bytes; unaligned load; the caller's AVX2.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i)) }
}

/// The IQ4_NL/IQ4_XS grid in all four 128-bit lanes.
///
/// # Safety
/// AVX-512 F present (inlined into the kernel).
#[inline(always)]
pub(crate) unsafe fn iq4_grid512() -> __m512i {
    // SAFETY: KVALUES_IQ4NL is 16 readable bytes; unaligned load; the caller's AVX-512 F.
    unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i)) }
}

/// 32 nibbles → 32 bytes: low nibbles of the 16 bytes first, then the high nibbles.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn nibbles_32(p: &[u8; 16]) -> __m256i {
    // SAFETY: p is 16 readable bytes; loadu has no alignment requirement.
    let tmp = unsafe { _mm_loadu_si128(p.as_ptr() as *const __m128i) };
    let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(bytes, _mm256_set1_epi8(0xF))
}

/// Bit j of the u32 → byte j set to 0xFF.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn bits_32(qh: [u8; 4]) -> __m256i {
    let x = u32::from_le_bytes(qh) as i32;
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Sum of u8×i8 products, as 8 float lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn mul_sum_us8(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
}

/// Sum of i8×i8 products, as 8 float lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_us8(ax, sy)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load32(p: &[i8; 32]) -> __m256i {
    // SAFETY: p is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load32u(p: &[u8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: at least 32 readable bytes (asserted).
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// Values `32k .. 32k + 32` of the 128-value half `n` of a Q6_K block, unsigned (0..=63).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q6_group(a: &BlockQ6K, n: usize, k: usize) -> __m256i {
    // SAFETY: n < 2, so ql[64n + 32(k % 2) ..][..32] and qh[32n ..][..32] are in bounds.
    let (ql, qh) = unsafe {
        (
            _mm256_loadu_si256(a.ql.as_ptr().add(64 * n + 32 * (k % 2)) as *const __m256i),
            _mm256_loadu_si256(a.qh.as_ptr().add(32 * n) as *const __m256i),
        )
    };
    let lo = if k < 2 { ql } else { _mm256_srli_epi16(ql, 4) };
    let hi = match k {
        0 => qh,
        1 => _mm256_srli_epi16(qh, 2),
        2 => _mm256_srli_epi16(qh, 4),
        _ => _mm256_srli_epi16(qh, 6),
    };
    _mm256_or_si256(
        _mm256_and_si256(lo, _mm256_set1_epi8(0xF)),
        _mm256_slli_epi16(_mm256_and_si256(hi, _mm256_set1_epi8(3)), 4),
    )
}

/// The scales of sub-blocks g (low eight i16 lanes) and g + 1 (high eight): one byte shuffle
/// of the block's 16 scales and a sign extension.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q6_scales(scales: __m128i, g: usize) -> __m256i {
    let g = g as i8;
    let pick = _mm_set_epi8(g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g, g, g, g, g, g, g, g);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick))
}

#[inline]
pub(crate) fn bytes_of_i8(s: &[i8]) -> &[u8] {
    // SAFETY: i8 and u8 have identical size and alignment; every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, s.len()) }
}

/// `hsum_f32x8` of each row's eight logical lanes: lanes 0‥3 of row r in 128-bit lane r of
/// `acc[0]`, lanes 4‥7 in that of `acc[1]`; element r of the result is row r's sum.
///
/// # Safety
/// AVX-512 F present.
#[inline(always)]
pub(crate) unsafe fn hsum_rows(acc: &[__m512; 2]) -> __m128 {
    let s = _mm512_add_ps(acc[1], acc[0]);
    let s = _mm512_add_ps(s, _mm512_permute_ps::<0xEE>(s));
    let s = _mm512_add_ps(s, _mm512_permute_ps::<0x55>(s));
    _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s))
}

/// A four-activation-row tile kernel on interleaved K-quants (`tiles_q4_k`, `tiles_q6_k`).
pub(crate) type Tile4 = unsafe fn(&[u8], usize, [&[u8]; 4], &mut [[f32; 4]], &mut [i32]);

/// Eight activation rows as two passes of four through `tile4`, 64 weight rows at a time.
///
/// # Safety
/// The CPU has the features `tile4` is compiled for.
pub(crate) unsafe fn two_passes(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32], tile4: Tile4) {
    let mut half = [[0f32; 4]; 64];
    for (hi, ys) in [[y[0], y[1], y[2], y[3]], [y[4], y[5], y[6], y[7]]].into_iter().enumerate() {
        for (chunk, o) in out.chunks_mut(64).enumerate() {
            let rows = o.len();
            // SAFETY: the caller's contract.
            unsafe { tile4(&g[chunk * 64 * xrb..], xrb, ys, &mut half[..rows], prep) };
            for (o, h) in o.iter_mut().zip(&half[..rows]) {
                o[4 * hi..4 * hi + 4].copy_from_slice(h);
            }
        }
    }
}

/// How far ahead of the group-block a GEMV is reading it prefetches the interleaved weights.
pub(crate) const GEMV_AHEAD: usize = crate::simd::STREAM_AHEAD;

/// The cache lines of the `bytes` bytes at `p + GEMV_AHEAD` into L1: a GEMV's weights, read
/// once, [`GEMV_AHEAD`] bytes before it reaches them (past the end of the matrix, harmless:
/// `simd::prefetch_lines`). The tiles ask too: a short batch (a batched decode step, a short
/// prompt) reads each column block from memory for one or two eight-row calls, and without it
/// Qwen2.5's 16-row steps ran 19–24 % slower on Zen 5 (AVX-512); a long batch's later calls
/// ask for lines already cached, at no measured cost (pp512 within noise).
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, bytes: usize) {
    prefetch_lines(p.wrapping_add(GEMV_AHEAD), bytes, CacheLevel::L1);
}
