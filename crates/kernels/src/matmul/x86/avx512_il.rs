//! AVX-512 kernels on interleaved weights (`matmul::layout`): decode's GEMV ([`rows`]) and
//! prefill's tiles ([`tiles`], four weight rows × four or eight activation rows) for Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL.
//!
//! One group-block gives two 512-bit vectors of unsigned weight bytes, `lo` and `hi`: 128-bit
//! lane `r` of `lo` holds row r's values 0‥16 and of `hi` its values 16‥32. The activation
//! block's two halves are broadcast to all four lanes, so one `vpdpbusd` per half gives every
//! row's four i32 pair sums of that half — lanes 0‥3 and 4‥7 of the AVX2 kernels' per-block
//! vector (`mul_sum_us8_pairs_float`: lane i sums values 4i‥4i+4). The float steps per logical
//! lane are the AVX2 kernels' (`acc = fma(d_w·d_y, (float) sum, acc)`), and the final sum
//! follows `hsum_f32x8` (`(hi + lo)`, then `+ movehl`, then `+ movehdup`), so every result is
//! bit-identical to the plain row's `vec_dot`.
//!
//! Weight types stored with an offset (`u = q + o`: Q4_0 8, Q5_0 16, Q8_0 and IQ4_NL 128) use,
//! in the GEMV, `Σ q·y = Σ u·y − o·Σ y`, exact in integers; the eight `−o·Σ y` lane sums of each
//! activation block, and its scale as f32, are computed once per call into the caller's scratch
//! (`prep`), not once per group. The tiles turn it round (`Σ q·y = Σ (y + 128)·q − 128·Σ q`): the
//! activation blocks are stored once as unsigned bytes in `prep`, each group-block's values are
//! decoded signed and its `−128·Σ q` lane sums made once for the `J` activation rows. Zen 4 loads
//! one 512-bit vector per cycle, broadcasts included, so the tiles' step then loads three vectors
//! (two halves and `d_y`) instead of five. For a batch, [`decode`] writes a column block's signed
//! values, lane sums and spread scales once ([`tiles_decoded`] reads them for every eight rows).
//! Measured on Zen 4, Qwen2.5 pp512 at 1 thread: Q5_0 tiles 2245 → 2030 ms (three loads) →
//! 1716 ms (decoded once).
//! Each group-block's four scales are spread over their rows' lanes once, then multiplied by each
//! activation's `d_y` (the same f32 product as the AVX2 kernels').
#![allow(clippy::missing_safety_doc)]

use super::common::{act_block, heads, hsum_rows, iq4_grid512, prefetch_ahead, IlBlock, IlValues};
use crate::matmul::layout::ROWS;
use std::arch::x86_64::*;

/// The four rows' unsigned values `(lo, hi)` of the group-block at `g`: 128-bit lane r of
/// `lo` holds row r's values 0‥16, of `hi` its values 16‥32 (`u = q + OFFSET`).
///
/// # Safety
/// `g` points to a whole group-block of `T`; AVX-512 F/BW present.
#[inline(always)]
unsafe fn values<T: IlBlock>(g: *const u8) -> (__m512i, __m512i) {
    // SAFETY (all arms): the offsets of `T::VALUES` are inside its group-block (the layout).
    unsafe {
        match T::VALUES {
            IlValues::Nibbles(at) => nibbles(g.add(at)),
            IlValues::Table(at) => {
                let (lo, hi) = nibbles(g.add(at));
                let t = iq4_grid512();
                let flip = _mm512_set1_epi8(-128);
                (_mm512_xor_si512(_mm512_shuffle_epi8(t, lo), flip), _mm512_xor_si512(_mm512_shuffle_epi8(t, hi), flip))
            }
            IlValues::FifthBits(masks) => fifth_bits(g, masks),
            IlValues::Bytes => {
                let flip = _mm512_set1_epi8(-128);
                (
                    _mm512_xor_si512(_mm512_loadu_si512(g.add(8) as *const _), flip),
                    _mm512_xor_si512(_mm512_loadu_si512(g.add(72) as *const _), flip),
                )
            }
        }
    }
}

/// The four rows' signed values `q = u − OFFSET` (`lo`, `hi` as [`values`]), for types with an
/// offset: Q4_0 subtracts 8, Q5_0 sets the high nibble where the fifth bit is clear
/// (`(v & 0x0F) | 0xF0` is `v − 16`), Q8_0's bytes and IQ4_NL's grid are signed already.
///
/// # Safety
/// As [`values`].
#[inline(always)]
unsafe fn signed_values<T: IlBlock>(g: *const u8) -> (__m512i, __m512i) {
    // SAFETY (all arms): the offsets of `T::VALUES` are inside its group-block (the layout).
    unsafe {
        match T::VALUES {
            IlValues::Nibbles(at) => {
                let (lo, hi) = nibbles(g.add(at));
                let o = _mm512_set1_epi8(T::OFFSET as i8);
                (_mm512_sub_epi8(lo, o), _mm512_sub_epi8(hi, o))
            }
            IlValues::Table(at) => {
                let (lo, hi) = nibbles(g.add(at));
                let t = iq4_grid512();
                (_mm512_shuffle_epi8(t, lo), _mm512_shuffle_epi8(t, hi))
            }
            IlValues::FifthBits(masks) => {
                let v = _mm512_loadu_si512(g.add(masks + 16) as *const _);
                let hl = !(g.add(masks) as *const u64).read_unaligned();
                let hh = !(g.add(masks + 8) as *const u64).read_unaligned();
                let (m, high) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0xF0u8 as i8));
                let lo = _mm512_ternarylogic_epi32::<0xEA>(v, m, _mm512_maskz_mov_epi8(hl, high));
                let hi = _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi16(v, 4), m, _mm512_maskz_mov_epi8(hh, high));
                (lo, hi)
            }
            IlValues::Bytes => (_mm512_loadu_si512(g.add(8) as *const _), _mm512_loadu_si512(g.add(72) as *const _)),
        }
    }
}

/// `−128·Σ q` of each logical lane (four values) of both halves: the start of every activation
/// row's sums against `(y + 128)`.
#[inline(always)]
unsafe fn offset_lanes(q: (__m512i, __m512i)) -> (__m512i, __m512i) {
    let (z, c) = (_mm512_setzero_si512(), _mm512_set1_epi8(-128));
    (_mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, c, q.0)), _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, c, q.1)))
}

/// Fill `prep[PREP·i ..]` for each block i of activation row `y` for the signed-weight tiles:
/// its 32 quants plus 128 as unsigned bytes (eight i32), then `d_y` as f32.
#[inline(always)]
unsafe fn prepare_unsigned<T: IlBlock>(y: &[u8], nb: usize, prep: &mut [i32]) {
    let (abs, q) = act_block::<T>();
    assert!(!T::MIN && y.len() >= nb * abs && prep.len() >= nb * PREP);
    let flip = _mm256_set1_epi8(-128);
    for i in 0..nb {
        // SAFETY: block i of y and PREP i32 of prep, both checked above.
        unsafe {
            let blk = y.as_ptr().add(i * abs);
            let p = prep.as_mut_ptr().add(PREP * i);
            let qy = _mm256_loadu_si256(blk.add(q) as *const __m256i);
            _mm256_storeu_si256(p as *mut __m256i, _mm256_xor_si256(qy, flip));
            let d = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const u16).read_unaligned() as i32));
            _mm_store_ss(p.add(8) as *mut f32, d);
        }
    }
}

/// One signed group-block `q` (its `−128·Σ q` lanes `corr`) against one unsigned activation block
/// (`PREP` i32 at `prep`) into the row accumulators, with `wz`: the rows' scales spread. The same
/// integer sums, products and FMAs as [`step`].
#[inline(always)]
unsafe fn step_unsigned(q: (__m512i, __m512i), corr: (__m512i, __m512i), wz: __m512, prep: *const i32, acc: &mut [__m512; 2]) {
    // SAFETY: PREP readable i32 at `prep` (the caller's scratch).
    unsafe {
        let lo = _mm512_broadcast_i32x4(_mm_loadu_si128(prep as *const __m128i));
        let hi = _mm512_broadcast_i32x4(_mm_loadu_si128(prep.add(4) as *const __m128i));
        let d = _mm512_mul_ps(wz, _mm512_set1_ps(*(prep.add(8) as *const f32)));
        let slo = _mm512_dpbusd_epi32(corr.0, lo, q.0);
        let shi = _mm512_dpbusd_epi32(corr.1, hi, q.1);
        acc[0] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(slo), acc[0]);
        acc[1] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(shi), acc[1]);
    }
}

/// The nibbles of four rows' `qs` (64 bytes at `qs`): `(v & 0x0F, (v >> 4) & 0x0F)`.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller passes 64 readable bytes.
    let v = unsafe { _mm512_loadu_si512(qs as *const _) };
    let m = _mm512_set1_epi8(0x0F);
    (_mm512_and_si512(v, m), _mm512_and_si512(_mm512_srli_epi16(v, 4), m))
}

/// Five-bit values: the nibbles at `g + 16 + masks` with 16 added where the masks at `g + masks`
/// (`hl`, then `hh`) have their bit set, one `vpternlogd` per half: `(v & 0x0F) | bit·16`.
#[inline(always)]
unsafe fn fifth_bits(g: *const u8, masks: usize) -> (__m512i, __m512i) {
    // SAFETY: the masks at `masks`, `masks + 8` and 64 bytes at `masks + 16` are inside the
    // group-block (the caller's layout).
    let (v, hl, hh) = unsafe {
        (
            _mm512_loadu_si512(g.add(masks + 16) as *const _),
            (g.add(masks) as *const u64).read_unaligned(),
            (g.add(masks + 8) as *const u64).read_unaligned(),
        )
    };
    let (m, sixteen) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(16));
    let lo = _mm512_ternarylogic_epi32::<0xEA>(v, m, _mm512_maskz_mov_epi8(hl, sixteen));
    let hi = _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi16(v, 4), m, _mm512_maskz_mov_epi8(hh, sixteen));
    (lo, hi)
}

/// i32 per activation block in the scratch [`prepare`] fills: the eight `−o·Σy` lane sums,
/// `d_y` and (Q8_1) `s_y` as f32 bits, padding to a cache line.
const PREP: usize = 16;

/// Per-block state of one activation row: quants broadcast per half, the `−o·Σy` lanes, `d_y`
/// in every lane, and `ds`: `d_y` in every lane or, with a min (Q8_1), `[d_y, s_y]` repeated (the
/// multiplier of [`heads`]).
struct Act {
    lo: __m512i,
    hi: __m512i,
    neg_lo: __m512i,
    neg_hi: __m512i,
    dy: __m512,
    ds: __m256,
}

#[inline(always)]
unsafe fn act<T: IlBlock>(y: *const u8, prep: *const i32) -> Act {
    let (_, q) = act_block::<T>();
    // SAFETY: a whole activation block at `y`; its PREP i32 at `prep`.
    unsafe {
        let lo = _mm512_broadcast_i32x4(_mm_loadu_si128(y.add(q) as *const __m128i));
        let hi = _mm512_broadcast_i32x4(_mm_loadu_si128(y.add(q + 16) as *const __m128i));
        let (neg_lo, neg_hi) = if T::OFFSET != 0 {
            (_mm512_broadcast_i32x4(_mm_loadu_si128(prep as *const __m128i)), _mm512_broadcast_i32x4(_mm_loadu_si128(prep.add(4) as *const __m128i)))
        } else {
            (_mm512_setzero_si512(), _mm512_setzero_si512())
        };
        let dy = _mm512_set1_ps(*(prep.add(8) as *const f32));
        let ds = if T::MIN {
            _mm256_castpd_ps(_mm256_broadcast_sd(&*(prep.add(8) as *const f64)))
        } else {
            _mm256_set1_ps(*(prep.add(8) as *const f32))
        };
        Act { lo, hi, neg_lo, neg_hi, dy, ds }
    }
}

/// Row r's scale `d_r` (from [`heads`]) in all of 128-bit lane r.
#[inline(always)]
unsafe fn spread<T: IlBlock>(h: __m256) -> __m512 {
    let s = if T::MIN { 2 } else { 1 };
    let idx = _mm512_setr_epi32(0, 0, 0, 0, s, s, s, s, 2 * s, 2 * s, 2 * s, 2 * s, 3 * s, 3 * s, 3 * s, 3 * s);
    _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(h))
}

/// One group-block (values `u`) against one activation block into the row accumulators, with
/// `d` = `d_r·d_y` in 128-bit lane r: `acc = fma(d, (float) sum, acc)` per lane, the AVX2
/// kernels' FMA.
#[inline(always)]
unsafe fn step(u: (__m512i, __m512i), d: __m512, a: &Act, acc: &mut [__m512; 2]) {
    let slo = _mm512_dpbusd_epi32(a.neg_lo, u.0, a.lo);
    let shi = _mm512_dpbusd_epi32(a.neg_hi, u.1, a.hi);
    acc[0] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(slo), acc[0]);
    acc[1] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(shi), acc[1]);
}

/// `hsum_f32x8` of each row's eight logical lanes (128-bit lane r of `acc[1]`, then of
/// `acc[0]`), plus with a min its `Σ m·s` (odd lanes of `summs`).
#[inline(always)]
unsafe fn finish<T: IlBlock>(acc: &[__m512; 2], summs: __m256, out: &mut [f32]) {
    // SAFETY: the caller's features.
    let mut v = unsafe { hsum_rows(acc) };
    if T::MIN {
        // Σ m_r·s_y of row r is lane 2r + 1.
        let m = _mm256_permutevar8x32_ps(summs, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7));
        v = _mm_add_ps(v, _mm256_castps256_ps128(m));
    }
    // SAFETY: `out` has four elements (callers pass one group's outputs).
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), v) };
}

/// Fill `prep[PREP·i ..]` for each block i of activation row `y`: the `−o·Σy` lane sums (types
/// with an offset), `d_y` and `s_y` as f32.
#[inline(always)]
unsafe fn prepare<T: IlBlock>(y: &[u8], nb: usize, prep: &mut [i32]) {
    let (abs, q) = act_block::<T>();
    assert!(y.len() >= nb * abs && prep.len() >= nb * PREP);
    let off = _mm256_set1_epi8(T::OFFSET as i8);
    for i in 0..nb {
        // SAFETY: block i of y and PREP i32 of prep, both checked above.
        unsafe {
            let blk = y.as_ptr().add(i * abs);
            let p = prep.as_mut_ptr().add(PREP * i);
            if T::OFFSET != 0 {
                let qy = _mm256_loadu_si256(blk.add(q) as *const __m256i);
                let n = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), off, qy));
                _mm256_storeu_si256(p as *mut __m256i, n);
            }
            // d (and s) as f32, the conversion the AVX2 kernels make.
            let ds = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()));
            _mm_storel_epi64(p.add(8) as *mut __m128i, _mm_castps_si128(ds));
        }
    }
}

/// Decode's GEMV on interleaved rows: `out[c]` = the plain `vec_dot` of weight row c (`g`: the
/// groups of `out.len()` rows, a multiple of four, plain rows `xrb` bytes) with activation row
/// `y`, bit for bit. `prep`: scratch of at least `xrb / BS · 16` i32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn rows<T: IlBlock>(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    let nb = xrb / T::BS;
    let (abs, _) = act_block::<T>();
    let gbs = ROWS * T::BS;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && y.len() >= nb * abs);
    // SAFETY (this block and the loop): features enabled above; `prep` is checked by
    // `prepare`, the group-blocks and activation blocks are inside `g` and `y` (asserted).
    unsafe {
        prepare::<T>(y, nb, prep);
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let base = g.as_ptr().add(c * ROWS * xrb);
            let mut acc = [_mm512_setzero_ps(); 2];
            let mut summs = _mm256_setzero_ps();
            for i in 0..nb {
                let gb = base.add(i * gbs);
                // Decode's GEMV reads each weight once: ask for it ahead (`common::prefetch_ahead`).
                prefetch_ahead(gb, gbs);
                let a = act::<T>(y.as_ptr().add(i * abs), prep.as_ptr().add(PREP * i));
                // One ymm product for the four rows' `d_r·d_y` (and with a min `m_r·s_y`), then
                // spread: fewer operations than spreading first when each block is used once.
                let p = _mm256_mul_ps(heads::<T>(gb), a.ds);
                if T::MIN {
                    summs = _mm256_add_ps(summs, p);
                }
                step(values::<T>(gb), spread::<T>(p), &a, &mut acc);
            }
            finish::<T>(&acc, summs, o);
        }
    }
}

/// Prefill's tiles on interleaved rows: `out[c][j]` = the plain `vec_dot` of weight row c
/// (`g`: groups of `out.len()` rows) with activation row `y[j]`, bit for bit, for `J` (4 or 8)
/// activation rows. Each group-block is decoded once for the `J` rows. `prep`: scratch of at
/// least `J · xrb / BS · 16` i32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles<T: IlBlock, const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], prep: &mut [i32]) {
    // SAFETY: the features `tiles_impl` needs are enabled; without `DEC` it reads no `dec`.
    unsafe { tiles_impl::<T, J, false>(g, &[], xrb, y, out, prep) }
}

/// Bytes [`decode`] writes per group-block: the signed values `(lo, hi)`, their `−128·Σ q` lanes
/// and the rows' scales spread over their lanes, 64 bytes each.
pub const DECODED_PER_BLOCK: usize = 320;
// A group-block is four rows × 32 values; the callers' scratch is sized for the largest form.
const _: () = assert!(DECODED_PER_BLOCK / 4 <= crate::matmul::DECODED_MAX_PER_32);

/// The groups in `g` (rows of `xrb` plain bytes, a multiple of four; types with an offset) as
/// the tiles use them, into `dec` (`rows · xrb / BS · 80` bytes): per group and block the
/// `(lo, hi)` of `signed_values`, their `offset_lanes` and the `spread` scales. Read by
/// [`tiles_decoded`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn decode<T: IlBlock>(g: &[u8], xrb: usize, dec: &mut [u8]) {
    let (nb, gbs) = (xrb / T::BS, ROWS * T::BS);
    let groups = g.len() / (ROWS * xrb);
    assert!(T::OFFSET != 0 && dec.len() >= groups * nb * DECODED_PER_BLOCK);
    for c in 0..groups {
        for i in 0..nb {
            // SAFETY: group-block i of group c is inside `g` (groups counted from its length);
            // its decoded bytes inside `dec` (asserted).
            unsafe {
                let gb = g.as_ptr().add(c * ROWS * xrb + i * gbs);
                prefetch_ahead(gb, gbs);
                let q = signed_values::<T>(gb);
                let corr = offset_lanes(q);
                let at = dec.as_mut_ptr().add((c * nb + i) * DECODED_PER_BLOCK);
                _mm512_storeu_si512(at as *mut _, q.0);
                _mm512_storeu_si512(at.add(64) as *mut _, q.1);
                _mm512_storeu_si512(at.add(128) as *mut _, corr.0);
                _mm512_storeu_si512(at.add(192) as *mut _, corr.1);
                _mm512_storeu_ps(at.add(256) as *mut f32, spread::<T>(heads::<T>(gb)));
            }
        }
    }
}

/// [`tiles`] of eight activation rows on groups whose values [`decode`] wrote to `dec` (the same
/// bits): the values are decoded once per column block for all of a batch's rows instead of once
/// per call.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_decoded<T: IlBlock>(g: &[u8], dec: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: the features `tiles_impl` needs are enabled; it checks `dec`'s length.
    unsafe { tiles_impl::<T, 8, true>(g, dec, xrb, y, out, prep) }
}

/// The tiles, their values decoded from the group-blocks or (`DEC`) read from `dec`.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL/VNNI present.
#[inline(always)]
unsafe fn tiles_impl<T: IlBlock, const J: usize, const DEC: bool>(g: &[u8], dec: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], prep: &mut [i32]) {
    let nb = xrb / T::BS;
    let (abs, _) = act_block::<T>();
    let gbs = ROWS * T::BS;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && prep.len() >= J * nb * PREP);
    assert!(!DEC || (T::OFFSET != 0 && dec.len() >= out.len() / ROWS * nb * DECODED_PER_BLOCK));
    // SAFETY: as in `rows`, for J activation rows and J `prep` ranges; with `DEC` the decoded
    // group-blocks are inside `dec` (asserted).
    unsafe {
        for (j, y) in y.iter().enumerate() {
            let p = &mut prep[j * nb * PREP..(j + 1) * nb * PREP];
            if T::OFFSET != 0 {
                prepare_unsigned::<T>(y, nb, p);
            } else {
                prepare::<T>(y, nb, p);
            }
        }
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let base = g.as_ptr().add(c * ROWS * xrb);
            let mut acc = [[_mm512_setzero_ps(); 2]; J];
            let mut summs = [_mm256_setzero_ps(); J];
            for i in 0..nb {
                let gb = base.add(i * gbs);
                if !DEC {
                    // Weights ahead, as in the GEMV (`common::prefetch_ahead`): a short batch
                    // reads each column block from memory for few rows; a long one re-asks
                    // for cached lines, a hint that costs no result.
                    prefetch_ahead(gb, gbs);
                }
                if T::OFFSET != 0 {
                    // Signed values, their lane sums once, then three loads per activation row.
                    let (q, corr, wz) = if DEC {
                        let at = dec.as_ptr().add((c * nb + i) * DECODED_PER_BLOCK);
                        let ld = |o: usize| _mm512_loadu_si512(at.add(o) as *const _);
                        ((ld(0), ld(64)), (ld(128), ld(192)), _mm512_loadu_ps(at.add(256) as *const f32))
                    } else {
                        let q = signed_values::<T>(gb);
                        (q, offset_lanes(q), spread::<T>(heads::<T>(gb)))
                    };
                    for (j, acc) in acc.iter_mut().enumerate() {
                        step_unsigned(q, corr, wz, prep.as_ptr().add((j * nb + i) * PREP), acc);
                    }
                    continue;
                }
                let (u, h) = (values::<T>(gb), heads::<T>(gb));
                // Spread once for the activation rows, then one product per row.
                let wz = spread::<T>(h);
                for j in 0..J {
                    let a = act::<T>(y[j].as_ptr().add(i * abs), prep.as_ptr().add((j * nb + i) * PREP));
                    if T::MIN {
                        summs[j] = _mm256_add_ps(summs[j], _mm256_mul_ps(h, a.ds));
                    }
                    step(u, _mm512_mul_ps(wz, a.dy), &a, &mut acc[j]);
                }
            }
            for j in 0..J {
                let mut v = [0f32; 4];
                finish::<T>(&acc[j], summs[j], &mut v);
                for r in 0..4 {
                    o[r][j] = v[r];
                }
            }
        }
    }
}
