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
//! Weight types stored with an offset (`u = q + o`: Q4_0 8, Q5_0 16, Q8_0 and IQ4_NL 128) use
//! `Σ q·y = Σ u·y − o·Σ y`, exact in integers; the eight `−o·Σ y` lane sums of each activation
//! block, and its scale as f32, are computed once per call into the caller's scratch (`prep`),
//! not once per group. Each group-block's four scales are spread over their rows' lanes once,
//! then multiplied by each activation's `d_y` (the same f32 product as the AVX2 kernels').
#![allow(clippy::missing_safety_doc)]

use super::common::{act_block, heads, hsum_rows, iq4_grid512, IlBlock, IlValues};
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
    assert!(out.len() % ROWS == 0 && g.len() >= out.len() * xrb && y.len() >= nb * abs);
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
    let nb = xrb / T::BS;
    let (abs, _) = act_block::<T>();
    let gbs = ROWS * T::BS;
    assert!(out.len() % ROWS == 0 && g.len() >= out.len() * xrb && prep.len() >= J * nb * PREP);
    // SAFETY: as in `rows`, for J activation rows and J `prep` ranges.
    unsafe {
        for (j, y) in y.iter().enumerate() {
            prepare::<T>(y, nb, &mut prep[j * nb * PREP..(j + 1) * nb * PREP]);
        }
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let base = g.as_ptr().add(c * ROWS * xrb);
            let mut acc = [[_mm512_setzero_ps(); 2]; J];
            let mut summs = [_mm256_setzero_ps(); J];
            for i in 0..nb {
                let gb = base.add(i * gbs);
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
