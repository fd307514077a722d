//! AVX2 kernels on interleaved weights (`matmul::layout`): decode's GEMV ([`rows`]) and
//! prefill's tiles ([`tiles`], [`tiles8`]) for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL, for CPUs with
//! AVX2 but no AVX-512 (the AVX-512 table has its own, `avx512_il`).
//!
//! A 256-bit vector holds a *row pair*: 32 bytes of a group-block are 16 bytes of rows `2p` and
//! `2p + 1`, so 128-bit lane e holds row `2p + e`. Its low nibbles (or first 16 bytes) are the
//! two rows' values 0‥16 and meet the activation block's first half broadcast to both lanes;
//! the high nibbles meet the second half. One `maddubs` + `madd` per half gives each row's four
//! i32 lane sums — lanes 0‥3 and 4‥7 of the plain AVX2 kernel's per-block vector
//! (`mul_sum_us8`/`mul_sum_i8`: lane i sums values 4i‥4i+4) — as exact integers, so the float
//! steps per logical lane are the plain kernel's (`acc = fma(d_w·d_y, (float) sum, acc)`) and
//! the final sum follows `hsum_f32x8`: every result equals the plain row's `vec_dot` bit for
//! bit.
//!
//! Integer sums: Q8_0 and IQ4_NL (its nibbles looked up in `KVALUES_IQ4NL`) multiply signed
//! bytes by `maddubs(|x|, sign(y, x))` as the plain kernels do; the other types multiply unsigned values `u = q + o` (Q4_0: o = 8, Q5_0: 16; |u·y| pairs
//! ≤ 31·128·2, no i16 saturation) and add `−o·Σy` per lane, computed once per call for each
//! activation block (`prep`), not once per group.
//!
//! On CPUs with AVX-VNNI (Intel since Alder Lake and Sapphire Rapids, AMD since Zen 5; unless
//! `CORELM_AVX_VNNI=0`: `simd::x86::avx_vnni`) the `*_vnni` entry points
//! replace `maddubs` + `madd` (+ the offset add) by one `vpdpbusd` for every type but Q8_0: the
//! same i32 lane sums, so the same bits (`tests::vnni_kernels_equal_the_avx2_ones`).
//!
//! Register budget (16 ymm): the GEMV keeps both row pairs (four accumulators); the tiles keep
//! one row pair against four activation rows (eight accumulators), and eight activation rows
//! are two such passes over a group-block still in L1.
//!
//! Q5 values: the table packs Q5_0/Q5_1 in the `Folded` form (`matmul::layout`), where a
//! row pair's 64 values take six operations (value j one mask; value 16 + j a word shift, a
//! per-lane shift of the shared bits, two masks and an or) instead of the transposed form's nine.
//! The GEMV, compute-bound at ~15 cycles per group-block, takes 7–10 % less time on it.
//!
//! Decoded column blocks (Q5_0, Q5_1): decoding still costs about a tenth of the vector
//! operations per row pair, block and four activation rows, paid again by every call
//! (eight-row calls decode each group twice). [`decode`] writes a column block's `(lo, hi)`
//! vectors once, one byte per value (`rows · k` bytes, in L2 for a default block of 64 rows),
//! and [`tiles8_decoded`] reads them there for every eight-row call of the batch; the same
//! vectors, so the same bits. The scheduler uses it for blocks met by two calls or more
//! (`IlTiles::decoded`). For the nibble types the decode is three operations and the form
//! gained 1.6 % (Q4_1), so they keep theirs.
#![allow(clippy::missing_safety_doc)]

use super::common::{act_block, heads, iq4_grid, prefetch_ahead, IlBlock, IlValues};
use crate::matmul::layout::ROWS;
use std::arch::x86_64::*;

/// The unsigned (Q8_0: signed) values `(lo, hi)` of row pair `p` of the group-block at `g`.
///
/// # Safety
/// `g` points to a whole group-block of `T`; AVX2 present.
#[inline(always)]
unsafe fn values<T: IlBlock>(g: *const u8, p: usize) -> (__m256i, __m256i) {
    let m = _mm256_set1_epi8(0x0F);
    // SAFETY (all arms): the offsets below are inside the group-block (`matmul::layout`).
    unsafe {
        match T::VALUES {
            IlValues::Nibbles(at) => {
                let v = _mm256_loadu_si256(g.add(at + 32 * p) as *const __m256i);
                (_mm256_and_si256(v, m), _mm256_and_si256(_mm256_srli_epi16(v, 4), m))
            }
            IlValues::FifthBits(bits) => {
                // The `Folded` form (`matmul::layout`): byte j of lane e (row r = 2p + e) holds
                // value j whole and value 16 + j's bits 0‥2 at 5‥7; the 16 shared bytes, in both
                // lanes, its bits 3 and 4 at 2r and 2r + 1, moved to 3 and 4 by a per-lane shift.
                let v = _mm256_loadu_si256(g.add(bits + 16 + 32 * p) as *const __m256i);
                let w = _mm256_broadcastsi128_si256(_mm_loadu_si128(g.add(bits) as *const __m128i));
                let top = if p == 0 { _mm256_sllv_epi32(w, _mm256_setr_epi32(3, 3, 3, 3, 1, 1, 1, 1)) } else { _mm256_srlv_epi32(w, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3)) };
                let low3 = _mm256_and_si256(_mm256_srli_epi16(v, 5), _mm256_set1_epi8(7));
                (_mm256_and_si256(v, _mm256_set1_epi8(0x1F)), _mm256_or_si256(low3, _mm256_and_si256(top, _mm256_set1_epi8(0x18))))
            }
            IlValues::Bytes => (_mm256_loadu_si256(g.add(8 + 32 * p) as *const __m256i), _mm256_loadu_si256(g.add(72 + 32 * p) as *const __m256i)),
            IlValues::Table(at) => {
                let v = _mm256_loadu_si256(g.add(at + 32 * p) as *const __m256i);
                let t = iq4_grid();
                (_mm256_shuffle_epi8(t, _mm256_and_si256(v, m)), _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16(v, 4), m)))
            }
        }
    }
}

/// Whether the values are signed bytes (Q8_0, IQ4_NL), multiplied as the plain kernels do:
/// `maddubs(|x|, sign(y, x))`.
const fn signed<T: IlBlock>() -> bool {
    matches!(T::VALUES, IlValues::Bytes | IlValues::Table(_))
}

/// Whether the integer sums take the `−o·Σy` lanes (types stored with an offset; the signed
/// ones are multiplied as they are).
const fn offset<T: IlBlock>() -> bool {
    T::OFFSET != 0 && !signed::<T>()
}

/// i32 per activation block in `prep`: the eight `−o·Σy` lane sums, `d_y` and (Q8_1) `s_y` as
/// f32 bits, padding to a cache line; the tiles keep four rows' `d_y` side by side at [`d4`]
/// and (Q8_1) their `s_y` at [`S4`] of the first row's block.
const PREP: usize = 16;
const S4: usize = 12;
/// Where four rows' `d_y` sit side by side: in the `−o·Σy` slots with a min (those types have
/// no offset), else at [`S4`].
const fn d4<T: IlBlock>() -> usize {
    if T::MIN {
        0
    } else {
        S4
    }
}

/// `d_y` (and with a min `s_y`) of activation rows `first .. first + 4` (of `nb` blocks each in
/// `prep`) side by side at [`d4`] (and [`S4`]) of row `first`'s blocks, for [`pair_tile`].
fn gather_scales<T: IlBlock>(prep: &mut [i32], nb: usize, first: usize) {
    for i in 0..nb {
        for j in 0..4 {
            let at = ((first + j) * nb + i) * PREP;
            prep[(first * nb + i) * PREP + d4::<T>() + j] = prep[at + 8];
            if T::MIN {
                prep[(first * nb + i) * PREP + S4 + j] = prep[at + 9];
            }
        }
    }
}

/// Fill `prep[PREP·i ..]` for each block i of activation row `y`.
#[inline(always)]
unsafe fn prepare<T: IlBlock>(y: &[u8], nb: usize, prep: &mut [i32]) {
    let (abs, q) = act_block::<T>();
    assert!(y.len() >= nb * abs && prep.len() >= nb * PREP);
    let (off, ones) = (_mm256_set1_epi8(T::OFFSET as i8), _mm256_set1_epi16(1));
    for i in 0..nb {
        // SAFETY: block i of y and PREP i32 of prep, both checked above; unaligned accesses.
        unsafe {
            let blk = y.as_ptr().add(i * abs);
            let p = prep.as_mut_ptr().add(PREP * i);
            if offset::<T>() {
                // o·(y0 + y1) ≤ 16·255: exact in the i16 pairs.
                let qy = _mm256_loadu_si256(blk.add(q) as *const __m256i);
                let s = _mm256_madd_epi16(_mm256_maddubs_epi16(off, qy), ones);
                _mm256_storeu_si256(p as *mut __m256i, _mm256_sub_epi32(_mm256_setzero_si256(), s));
            }
            // d (and s) as f32, the conversion the plain kernels make.
            let ds = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()));
            _mm_storel_epi64(p.add(8) as *mut __m128i, _mm_castps_si128(ds));
        }
    }
}

/// One activation block as the row-pair kernels read it: its halves broadcast to both lanes,
/// the `−o·Σy` lanes of each half, and `[d_y, s_y]` (Q8_1) or `d_y` repeated.
struct Act {
    lo: __m256i,
    hi: __m256i,
    neg_lo: __m256i,
    neg_hi: __m256i,
    ds: __m256,
}

#[inline(always)]
unsafe fn act<T: IlBlock>(y: *const u8, prep: *const i32) -> Act {
    let (_, q) = act_block::<T>();
    // SAFETY: a whole activation block at `y`; its PREP i32 at `prep`.
    unsafe {
        let b = |p: *const u8| _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
        let (neg_lo, neg_hi) = if offset::<T>() { (b(prep as *const u8), b(prep.add(4) as *const u8)) } else { (_mm256_setzero_si256(), _mm256_setzero_si256()) };
        let ds = if T::MIN { _mm256_castpd_ps(_mm256_broadcast_sd(&*(prep.add(8) as *const f64))) } else { _mm256_set1_ps(*(prep.add(8) as *const f32)) };
        Act { lo: b(y.add(q)), hi: b(y.add(q + 16)), neg_lo, neg_hi, ds }
    }
}

/// Row pair p's `d` (from [`heads`], or a product of it): row 2p's in lane 0, 2p + 1's in lane 1.
#[inline(always)]
fn spread<T: IlBlock>(h: __m256, p: usize) -> __m256 {
    let (a, b) = if T::MIN { (4 * p as i32, 4 * p as i32 + 2) } else { (2 * p as i32, 2 * p as i32 + 1) };
    // SAFETY: AVX2 is present in every kernel this is inlined into.
    unsafe { _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(a, a, a, a, b, b, b, b)) }
}

/// The exact i32 lane sums of one half (`u` against the broadcast activation half `y`). With
/// `V` (AVX-VNNI) one `vpdpbusd` replaces `maddubs` + `madd` (+ the offset add): the same
/// integers, since no i16 pair sum of `maddubs` saturates here. Unsigned codes are at most 31;
/// the signed ones (Q8_0's bytes, IQ4_NL's values) enter as `|u|` ≤ 128 against
/// `sign(y, u)` in −128..=127 (−128 where `y` is −128: `sign` wraps it, in both forms), so a
/// pair lies in −32768..=32512.
#[inline(always)]
unsafe fn half_sum<T: IlBlock, const V: bool>(u: __m256i, y: __m256i, neg: __m256i) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    if V {
        // SAFETY: `V` is set only in the kernels compiled with AVX-VNNI.
        unsafe {
            if signed::<T>() {
                _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(u, u), _mm256_sign_epi8(y, u))
            } else {
                _mm256_dpbusd_avx_epi32(if offset::<T>() { neg } else { _mm256_setzero_si256() }, u, y)
            }
        }
    } else if signed::<T>() {
        _mm256_madd_epi16(ones, _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(y, u)))
    } else if offset::<T>() {
        _mm256_add_epi32(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(u, y)), neg)
    } else {
        _mm256_madd_epi16(ones, _mm256_maddubs_epi16(u, y))
    }
}

/// One row pair's values against one activation block into its accumulators (`d`: the pair's
/// `d_r·d_y`): the plain kernel's FMA per lane.
#[inline(always)]
unsafe fn step<T: IlBlock, const V: bool>(u: (__m256i, __m256i), d: __m256, a: &Act, acc: &mut [__m256; 2]) {
    // SAFETY: the caller's features.
    unsafe {
        acc[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(half_sum::<T, V>(u.0, a.lo, a.neg_lo)), acc[0]);
        acc[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(half_sum::<T, V>(u.1, a.hi, a.neg_hi)), acc[1]);
    }
}

/// `hsum_f32x8` of the pair's two rows (lanes 0‥3 in `acc[0]`, 4‥7 in `acc[1]`, per 128-bit
/// lane), plus with a min each row's `Σ m·s` (lanes `4p + 1`, `4p + 3` of `summs`).
#[inline(always)]
fn finish<T: IlBlock>(acc: &[__m256; 2], summs: __m256, p: usize) -> [f32; 2] {
    // SAFETY: AVX2 is present in every kernel this is inlined into.
    unsafe {
        let mut v = hsum_pair(acc);
        if T::MIN {
            let mut m = [0f32; 8];
            _mm256_storeu_ps(m.as_mut_ptr(), summs);
            v[0] += m[4 * p + 1];
            v[1] += m[4 * p + 3];
        }
        v
    }
}

/// `hsum_f32x8` of the pair's two rows (lanes 0‥3 in `acc[0]`, 4‥7 in `acc[1]`, per 128-bit
/// lane): `(hi + lo)`, then `+ movehl`, then `+ movehdup`.
#[inline(always)]
fn hsum_pair(acc: &[__m256; 2]) -> [f32; 2] {
    // SAFETY: AVX2 is present in every kernel this is inlined into.
    unsafe {
        let s = _mm256_add_ps(acc[1], acc[0]);
        let s = _mm256_add_ps(s, _mm256_permute_ps::<0xEE>(s));
        let s = _mm256_add_ps(s, _mm256_permute_ps::<0x55>(s));
        [_mm256_cvtss_f32(s), _mm_cvtss_f32(_mm256_extractf128_ps(s, 1))]
    }
}

/// Row pair `p` of the group at `g` (`nb` group-blocks) against four activation rows, the
/// tiles' inner kernel: per block the pair's `d_r·d_y` for the four rows come from one product
/// (`d_y` side by side in `prep[0]`, [`gather_scales`]) and an in-lane shuffle per row, and with a
/// min the pair's `m_r·s_y` of the four rows from another (`s_y` side by side). `out[2p + e][j]`.
///
/// With `D` the pair's values are read from `dec` (the group decoded by [`decode`]) instead of
/// being decoded from `g`.
#[inline(always)]
unsafe fn pair_tile<T: IlBlock, const V: bool, const D: bool>(g: *const u8, dec: *const u8, nb: usize, y: [*const u8; 4], prep: [*const i32; 4], p: usize, out: &mut [[f32; 4]; 4]) {
    let (abs, _) = act_block::<T>();
    let gbs = ROWS * T::BS;
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    // Lane e, element j: row 2p + e's Σ m·s against activation row j.
    let mut summs = _mm256_setzero_ps();
    let m = if T::MIN { (4 * p as i32 + 1, 4 * p as i32 + 3) } else { (0, 0) };
    // SAFETY: the caller passes a whole group at `g` and four prepared rows of `nb` blocks.
    unsafe {
        for i in 0..nb {
            let gb = g.add(i * gbs);
            if p == 0 && !D {
                // Weights ahead, as the GEMV: a short batch reads each column block from
                // memory for few rows (`avx512_il::tiles_impl`).
                prefetch_ahead(gb, gbs);
            }
            let h = heads::<T>(gb);
            let wz = spread::<T>(h, p);
            // Lane e, element j: `d_r·d_y` of row 2p + e and activation row j, one product for
            // the four rows; `vpermilps` then gives each row's (the same f32 products as one
            // `mul` per row).
            let dd = _mm256_mul_ps(wz, _mm256_broadcast_ps(&*(prep[0].add(PREP * i + d4::<T>()) as *const __m128)));
            let u = if D { decoded(dec, i, p) } else { values::<T>(gb, p) };
            if T::MIN {
                let wm = _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(m.0, m.0, m.0, m.0, m.1, m.1, m.1, m.1));
                let sy = _mm256_broadcast_ps(&*(prep[0].add(PREP * i + S4) as *const __m128));
                summs = _mm256_add_ps(summs, _mm256_mul_ps(wm, sy));
            }
            let d = [_mm256_permute_ps::<0x00>(dd), _mm256_permute_ps::<0x55>(dd), _mm256_permute_ps::<0xAA>(dd), _mm256_permute_ps::<0xFF>(dd)];
            for j in 0..4 {
                let a = act::<T>(y[j].add(i * abs), prep[j].add(PREP * i));
                step::<T, V>(u, d[j], &a, &mut acc[j]);
            }
        }
        let mut ms = [0f32; 8];
        _mm256_storeu_ps(ms.as_mut_ptr(), summs);
        for (j, acc) in acc.iter().enumerate() {
            let v = hsum_pair(acc);
            for e in 0..2 {
                out[2 * p + e][j] = if T::MIN { v[e] + ms[4 * e + j] } else { v[e] };
            }
        }
    }
}

/// Row pairs `p0 .. p0 + P` of the group at `g` (`nb` group-blocks) against `J` activation rows
/// (`prep`: their prepared blocks): `out[2p + e][j]` for row `2p + e`.
#[inline(always)]
unsafe fn pairs<T: IlBlock, const V: bool, const J: usize, const P: usize>(g: *const u8, nb: usize, y: [*const u8; J], prep: [*const i32; J], p0: usize, out: &mut [[f32; J]; 4]) {
    let (abs, _) = act_block::<T>();
    let gbs = ROWS * T::BS;
    let mut acc = [[[_mm256_setzero_ps(); 2]; P]; J];
    let mut summs = [_mm256_setzero_ps(); J];
    // SAFETY: the caller passes a whole group at `g` and J prepared rows of `nb` blocks.
    unsafe {
        for i in 0..nb {
            let gb = g.add(i * gbs);
            if p0 == 0 {
                // Weights ahead: decode's GEMV reads each once, a short batch's tiles each
                // column block for few rows (`avx512_il::tiles_impl`).
                prefetch_ahead(gb, gbs);
            }
            let h = heads::<T>(gb);
            // A loop, not `array::from_fn`: its closure, when LLVM leaves it out of line, has
            // no AVX2 and calls every intrinsic (a 30x slower GEMV, seen once).
            let mut u = [(_mm256_setzero_si256(), _mm256_setzero_si256()); P];
            for (q, u) in u.iter_mut().enumerate() {
                *u = values::<T>(gb, p0 + q);
            }
            for j in 0..J {
                let a = act::<T>(y[j].add(i * abs), prep[j].add(PREP * i));
                // `d_r·d_y` (and with a min `m_r·s_y`) of the four rows in one product.
                let d = _mm256_mul_ps(h, a.ds);
                if T::MIN {
                    summs[j] = _mm256_add_ps(summs[j], d);
                }
                for q in 0..P {
                    step::<T, V>(u[q], spread::<T>(d, p0 + q), &a, &mut acc[j][q]);
                }
            }
        }
    }
    for j in 0..J {
        for q in 0..P {
            let v = finish::<T>(&acc[j][q], summs[j], p0 + q);
            out[2 * (p0 + q)][j] = v[0];
            out[2 * (p0 + q) + 1][j] = v[1];
        }
    }
}

/// Decode's GEMV on interleaved rows: `out[c]` = the plain `vec_dot` of weight row c (`g`: the
/// groups of `out.len()` rows, a multiple of four, plain rows `xrb` bytes) with activation row
/// `y`, bit for bit. `prep`: scratch of at least `xrb / BS · 16` i32.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn rows<T: IlBlock>(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    // SAFETY: the features `rows_impl` needs are enabled.
    unsafe { rows_impl::<T, false>(g, xrb, y, out, prep) }
}

/// [`rows`] with AVX-VNNI's `vpdpbusd` (the same bits).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn rows_vnni<T: IlBlock>(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    // SAFETY: as in `rows`, and AVX-VNNI for `V`.
    unsafe { rows_impl::<T, true>(g, xrb, y, out, prep) }
}

/// # Safety
/// AVX2, FMA, F16C (and with `V` AVX-VNNI) present.
#[inline(always)]
unsafe fn rows_impl<T: IlBlock, const V: bool>(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    let nb = xrb / T::BS;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb);
    // SAFETY: features enabled above; `prepare` checks `y` and `prep`, the groups are inside
    // `g` (asserted).
    unsafe {
        prepare::<T>(y, nb, prep);
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let mut v = [[0f32; 1]; 4];
            pairs::<T, V, 1, 2>(g.as_ptr().add(c * ROWS * xrb), nb, [y.as_ptr()], [prep.as_ptr()], 0, &mut v);
            for r in 0..ROWS {
                o[r] = v[r][0];
            }
        }
    }
}

/// Prefill's tiles on interleaved rows: `out[c][j]` = the plain `vec_dot` of weight row c with
/// activation row `y[j]`, bit for bit, for four activation rows. `prep`: scratch of at least
/// `4 · xrb / BS · 16` i32.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles<T: IlBlock>(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], prep: &mut [i32]) {
    // SAFETY: the features `tiles_impl` needs are enabled.
    unsafe { tiles_impl::<T, false>(g, xrb, y, out, prep) }
}

/// [`tiles`] with AVX-VNNI's `vpdpbusd` (the same bits).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn tiles_vnni<T: IlBlock>(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], prep: &mut [i32]) {
    // SAFETY: as in `tiles`, and AVX-VNNI for `V`.
    unsafe { tiles_impl::<T, true>(g, xrb, y, out, prep) }
}

/// # Safety
/// AVX2, FMA, F16C (and with `V` AVX-VNNI) present.
#[inline(always)]
unsafe fn tiles_impl<T: IlBlock, const V: bool>(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], prep: &mut [i32]) {
    let nb = xrb / T::BS;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && prep.len() >= 4 * nb * PREP);
    // SAFETY: features enabled above; `prepare` checks each row and its `prep` range, the
    // groups are inside `g` (asserted).
    unsafe {
        for (j, y) in y.iter().enumerate() {
            prepare::<T>(y, nb, &mut prep[j * nb * PREP..(j + 1) * nb * PREP]);
        }
        gather_scales::<T>(prep, nb, 0);
        let yp = y.map(|y| y.as_ptr());
        let pp: [*const i32; 4] = std::array::from_fn(|j| prep.as_ptr().add(j * nb * PREP));
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let o: &mut [[f32; 4]; 4] = o.try_into().expect("a group of four rows");
            let gp = g.as_ptr().add(c * ROWS * xrb);
            // One row pair at a time: eight accumulators for the four activation rows.
            pair_tile::<T, V, false>(gp, gp, nb, yp, pp, 0, o);
            pair_tile::<T, V, false>(gp, gp, nb, yp, pp, 1, o);
        }
    }
}

/// [`tiles`] for `J` (2 or 3) activation rows: a short batch's rows, each group-block's values
/// decoded once for them. `prep`: scratch of at least `J · xrb / BS · 16` i32.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles_few<T: IlBlock, const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], prep: &mut [i32]) {
    // SAFETY: the features `tiles_few_impl` needs are enabled.
    unsafe { tiles_few_impl::<T, false, J>(g, xrb, y, out, prep) }
}

/// [`tiles_few`] with AVX-VNNI's `vpdpbusd` (the same bits).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn tiles_few_vnni<T: IlBlock, const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], prep: &mut [i32]) {
    // SAFETY: as in `tiles_few`, and AVX-VNNI for `V`.
    unsafe { tiles_few_impl::<T, true, J>(g, xrb, y, out, prep) }
}

/// The GEMV's row pairs ([`pairs`]) for `J` activation rows: both pairs at once for two rows
/// (eight accumulators), one pair at a time for three (six); per row the GEMV's operations.
///
/// # Safety
/// AVX2, FMA, F16C (and with `V` AVX-VNNI) present.
#[inline(always)]
unsafe fn tiles_few_impl<T: IlBlock, const V: bool, const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], prep: &mut [i32]) {
    let nb = xrb / T::BS;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && prep.len() >= J * nb * PREP);
    // SAFETY: features enabled by the callers; `prepare` checks each row and its `prep` range,
    // the groups are inside `g` (asserted).
    unsafe {
        for (j, y) in y.iter().enumerate() {
            prepare::<T>(y, nb, &mut prep[j * nb * PREP..(j + 1) * nb * PREP]);
        }
        let yp = y.map(|y| y.as_ptr());
        let mut pp = [prep.as_ptr(); J];
        for (j, p) in pp.iter_mut().enumerate() {
            *p = prep.as_ptr().add(j * nb * PREP);
        }
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let o: &mut [[f32; J]; 4] = o.try_into().expect("a group of four rows");
            let gp = g.as_ptr().add(c * ROWS * xrb);
            if J <= 2 {
                pairs::<T, V, J, 2>(gp, nb, yp, pp, 0, o);
            } else {
                pairs::<T, V, J, 1>(gp, nb, yp, pp, 0, o);
                pairs::<T, V, J, 1>(gp, nb, yp, pp, 1, o);
            }
        }
    }
}

/// [`tiles`] for eight activation rows: two passes of four per group (the group's bytes are
/// in L1 for the second).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles8<T: IlBlock>(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: the features `tiles8_impl` needs are enabled.
    unsafe { tiles8_impl::<T, false, false>(g, &[], xrb, y, out, prep) }
}

/// [`tiles8`] with AVX-VNNI's `vpdpbusd` (the same bits).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn tiles8_vnni<T: IlBlock>(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: as in `tiles8`, and AVX-VNNI for `V`.
    unsafe { tiles8_impl::<T, true, false>(g, &[], xrb, y, out, prep) }
}

/// # Safety
/// AVX2, FMA, F16C (and with `V` AVX-VNNI) present; with `D`, `dec` holds the groups of `g`
/// as [`decode`] writes them.
#[inline(always)]
unsafe fn tiles8_impl<T: IlBlock, const V: bool, const D: bool>(g: &[u8], dec: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    let nb = xrb / T::BS;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && prep.len() >= 8 * nb * PREP);
    assert!(!D || dec.len() >= out.len() * nb * 32);
    // SAFETY: as in `tiles`, for eight rows and eight `prep` ranges.
    unsafe {
        for (j, y) in y.iter().enumerate() {
            prepare::<T>(y, nb, &mut prep[j * nb * PREP..(j + 1) * nb * PREP]);
        }
        gather_scales::<T>(prep, nb, 0);
        gather_scales::<T>(prep, nb, 4);
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let gp = g.as_ptr().add(c * ROWS * xrb);
            let dp = if D { dec.as_ptr().add(c * ROWS * nb * 32) } else { gp };
            for half in 0..2 {
                let yp: [*const u8; 4] = std::array::from_fn(|j| y[4 * half + j].as_ptr());
                let pp: [*const i32; 4] = std::array::from_fn(|j| prep.as_ptr().add((4 * half + j) * nb * PREP));
                let mut v = [[0f32; 4]; 4];
                pair_tile::<T, V, D>(gp, dp, nb, yp, pp, 0, &mut v);
                pair_tile::<T, V, D>(gp, dp, nb, yp, pp, 1, &mut v);
                for r in 0..ROWS {
                    o[r][4 * half..4 * half + 4].copy_from_slice(&v[r]);
                }
            }
        }
    }
}

/// Whether the prefill tiles of `T` gain from a column block decoded once for all of a batch's
/// rows ([`decode`], [`tiles8_decoded`]): the Q5 types (Q5_0 prefill 8–11 % faster on
/// Qwen2.5-0.5B and Gemma 3, 1 thread: docs/benchmarks.md); Q4_1 gained 1.6 %.
pub const fn gains_from_decoding<T: IlBlock>() -> bool {
    matches!(T::VALUES, IlValues::FifthBits(_))
}

/// Row pair p's `(lo, hi)` of block i of a group decoded at `dec`.
///
/// # Safety
/// `dec` holds a group decoded by [`decode`] with more than `i` blocks.
#[inline(always)]
unsafe fn decoded(dec: *const u8, i: usize, p: usize) -> (__m256i, __m256i) {
    // SAFETY: 64 bytes per (block, pair) inside the caller's decoded group.
    unsafe {
        let at = dec.add((2 * i + p) * 64);
        (_mm256_loadu_si256(at as *const __m256i), _mm256_loadu_si256(at.add(32) as *const __m256i))
    }
}

/// The values of the groups in `g` (rows of `xrb` plain bytes, a multiple of four) as the tile
/// kernels multiply them, one byte per value, into `dec` (`rows · xrb / BS · 32` bytes): per
/// group, block and row pair the `(lo, hi)` vectors of [`values`]. Read by [`tiles8_decoded`].
#[target_feature(enable = "avx2,fma,f16c")]
pub fn decode<T: IlBlock>(g: &[u8], xrb: usize, dec: &mut [u8]) {
    let (nb, gbs) = (xrb / T::BS, ROWS * T::BS);
    let groups = g.len() / (ROWS * xrb);
    assert!(dec.len() >= groups * ROWS * nb * 32);
    for c in 0..groups {
        for i in 0..nb {
            prefetch_ahead(g.as_ptr().wrapping_add(c * ROWS * xrb + i * gbs), gbs);
            for p in 0..2 {
                // SAFETY: group-block i of group c is inside `g` (groups counted from its
                // length); its 64 decoded bytes inside `dec` (asserted).
                unsafe {
                    let (lo, hi) = values::<T>(g.as_ptr().add(c * ROWS * xrb + i * gbs), p);
                    let at = dec.as_mut_ptr().add(((c * nb + i) * 2 + p) * 64);
                    _mm256_storeu_si256(at as *mut __m256i, lo);
                    _mm256_storeu_si256(at.add(32) as *mut __m256i, hi);
                }
            }
        }
    }
}

/// [`tiles8`] on groups whose values [`decode`] wrote to `dec` (the same bits): the values are
/// decoded once per column block for all of a batch's rows instead of once per call.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles8_decoded<T: IlBlock>(g: &[u8], dec: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: the features `tiles8_impl` needs are enabled; it checks `dec`'s length.
    unsafe { tiles8_impl::<T, false, true>(g, dec, xrb, y, out, prep) }
}

/// [`tiles8_decoded`] with AVX-VNNI's `vpdpbusd` (the same bits).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn tiles8_decoded_vnni<T: IlBlock>(g: &[u8], dec: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: as in `tiles8_decoded`, and AVX-VNNI for `V`.
    unsafe { tiles8_impl::<T, true, true>(g, dec, xrb, y, out, prep) }
}

#[cfg(test)]
mod tests {
    use super::super::common;
    use super::*;
    use crate::matmul::layout::{scratch_len, Layout, Q5Bits, Q6Form};
    use crate::quant::reference::quantizer;
    use crate::DType;

    /// `n` rows of `k` pseudo-random values quantized to `t`.
    fn rows_of(t: DType, k: usize, n: usize, seed: &mut u64) -> Vec<u8> {
        let q = if t == DType::Q8_1 { crate::quant::portable::quant_q8_1 } else { quantizer(t).expect("a quantizer") };
        let mut out = vec![0u8; crate::row_bytes(t, k) * n];
        for row in out.chunks_exact_mut(crate::row_bytes(t, k)) {
            let x: Vec<f32> = (0..k)
                .map(|_| {
                    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
                })
                .collect();
            q(&x, row);
        }
        out
    }

    fn same<T: IlBlock>(t: DType, seed: &mut u64) {
        let (k, n) = (256, 8);
        let act = if T::MIN { DType::Q8_1 } else { DType::Q8_0 };
        let (w, xrb) = (rows_of(t, k, n, seed), crate::row_bytes(t, k));
        let mut g = vec![0u8; w.len()];
        Layout { q5: Q5Bits::Folded, q6: Q6Form::Folded }.pack(t, &w, xrb, &mut g);
        let y = rows_of(act, k, 8, seed);
        let yr: [&[u8]; 8] = std::array::from_fn(|j| &y[j * crate::row_bytes(act, k)..(j + 1) * crate::row_bytes(act, k)]);
        let mut prep = vec![0i32; scratch_len(k)];
        let same_bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        // SAFETY: the caller checked AVX2, FMA, F16C and AVX-VNNI.
        unsafe {
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            rows::<T>(&g, xrb, yr[0], &mut a, &mut prep);
            rows_vnni::<T>(&g, xrb, yr[0], &mut b, &mut prep);
            assert!(same_bits(&a, &b), "{t} GEMV");
            let (mut a, mut b) = (vec![[0f32; 4]; n], vec![[0f32; 4]; n]);
            tiles::<T>(&g, xrb, [yr[0], yr[1], yr[2], yr[3]], &mut a, &mut prep);
            tiles_vnni::<T>(&g, xrb, [yr[0], yr[1], yr[2], yr[3]], &mut b, &mut prep);
            assert!(same_bits(a.as_flattened(), b.as_flattened()), "{t} tiles");
            let (mut a, mut b) = (vec![[0f32; 8]; n], vec![[0f32; 8]; n]);
            tiles8::<T>(&g, xrb, yr, &mut a, &mut prep);
            tiles8_vnni::<T>(&g, xrb, yr, &mut b, &mut prep);
            assert!(same_bits(a.as_flattened(), b.as_flattened()), "{t} tiles8");
            assert!(a.as_flattened().iter().any(|v| *v != 0.0), "{t}: all zero");
        }
    }

    /// The AVX-VNNI kernels give the plain AVX2 kernels' bits (where the CPU has AVX-VNNI).
    #[test]
    fn vnni_kernels_equal_the_avx2_ones() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c") && std::is_x86_feature_detected!("avxvnni")) {
            eprintln!("no AVX-VNNI here: skipped");
            return;
        }
        let mut seed = 0x5EED_0A11;
        same::<common::Q4_0>(DType::Q4_0, &mut seed);
        same::<common::Q4_1>(DType::Q4_1, &mut seed);
        same::<common::Q5_0>(DType::Q5_0, &mut seed);
        same::<common::Q5_1>(DType::Q5_1, &mut seed);
        same::<common::Q8_0>(DType::Q8_0, &mut seed);
        same::<common::IQ4NL>(DType::IQ4NL, &mut seed);
    }
}
