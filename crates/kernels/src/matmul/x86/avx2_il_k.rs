//! AVX2 kernels on interleaved Q4_K, Q6_K and IQ4_XS weights (`matmul::layout`): decode's GEMV
//! and prefill's tiles, bit-identical to the plain AVX2 kernels (`avx2::dot_q4_k_q8_k`,
//! `dot_q4_k_q8_k_tile`, `dot_q6_k_q8_k`, `avx2_ext::dot_iq4_xs_q8_k`), for CPUs without
//! AVX-512 (`avx512_il_k` is the AVX-512 twin, and documents the float orders).
//!
//! As in `avx2_il`, a 256-bit load of a group-block's 16-byte pieces holds a row pair (rows
//! `2p`, `2p + 1` in 128-bit lanes 0, 1) and the activation's 16-byte pieces are broadcast to
//! both lanes.
//!
//! - **Q4_K**: the plain kernel's float steps take exact integers only (per super-block, or per
//!   64 values in the tile order), so any exact integer scheme gives its bits: two `maddubs` of
//!   nibbles (a sub-block's two 16-value pieces) are added as i16 (|·| ≤ 2·2·15·128) and scaled
//!   by one `madd` with the sub-block's scale; the four rows' scales and mins are unpacked
//!   together. The GEMV reduces each row's sums with `hadd`s into one vector
//!   `[si, sm]` per row and updates `acc` and `acc_min` of the four rows with one FMA.
//! - **Q6_K**: the plain kernel's eight i32 lanes per row are kept as such (lanes 0‥3 from the
//!   first 16 values of each 32-value group, 4‥7 from the last), each `maddubs` + `madd` with
//!   the sub-block's scale giving exactly its lanes' terms. The table packs Q6_K in the
//!   `Folded` form (`matmul::layout::Q6Form`): three of every four 32-value vectors are one
//!   mask, the fourth three shifts, three masks and two ors.
//! - **IQ4_XS**: the same eight lanes; the nibbles are looked up in the grid with `vpshufb`,
//!   multiplied as `maddubs(|y|, sign(x, y))` (ggml's `maddubs(|x|, sign(y, x))` products, with
//!   |y| taken once per call; |x|, |y| ≤ 127: the pair sums fit i16), and scaled by one `madd`
//!   with the row pair's 6-bit scales, unpacked once per group-block for all four rows and
//!   eight sub-blocks.
//!
//! Q6_K's prefill also has a decoded form, as the Q5 types in `avx2_il`: [`decode_q6_k`] writes a
//! column block's 6-bit values once (one byte per value) and [`tiles8_q6_k_decoded`] reads them
//! for every eight-row call of the batch, instead of decoding each group-block's `ql`/`qh` in
//! every call (twice per eight-row call); the same bytes, so the same bits. It runs a group's
//! super-blocks in ranges of four (`Q6K_CHUNK`) through all four (half, pair) passes, the
//! accumulators carried from range to range, so long rows' activations stay in L1.
#![allow(clippy::missing_safety_doc)]

use super::common::{iq4_grid, prefetch_ahead, prepare_q4_k, two_passes, Q4K_PREP as PREP};
use crate::matmul::layout::ROWS;
use crate::quant::blocks::BlockQ8K;
use std::arch::x86_64::*;

/// Plain block bytes.
const BS4: usize = 144;
const BS6: usize = 210;
/// Where a Q8_K block's quants and block sums start.
const QS: usize = 4;
const BSUMS: usize = 4 + 256;
const ABS: usize = std::mem::size_of::<BlockQ8K>();

/// 16 bytes at `p` in both 128-bit lanes.
#[inline(always)]
unsafe fn bcast(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 16 readable bytes; unaligned load.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i)) }
}

/// A `vpshufb` control putting byte `b` of each lane, zero-extended, into every i16.
#[inline(always)]
fn byte_words(b: i8) -> __m256i {
    // SAFETY: AVX2 is present in every kernel this is inlined into.
    unsafe { _mm256_broadcastsi128_si256(_mm_setr_epi8(b, -128, b, -128, b, -128, b, -128, b, -128, b, -128, b, -128, b, -128)) }
}

/// The scales and mins of the Q4_K group-block at `gb`, per row pair: lane e of element p
/// holds row `2p + e`'s bytes `sc0‥sc7, m0‥m7` (ggml's `utmp` shuffle, four rows at once).
#[inline(always)]
unsafe fn scales_q4_k(gb: *const u8) -> [__m256i; 2] {
    // SAFETY: the scale words of rows 0‥3 are at 16‥64 of the group-block.
    let (p, q) = unsafe { (_mm256_loadu_si256(gb.add(16) as *const __m256i), bcast(gb.add(48))) };
    // p = [word 0 | word 1] of rows 0‥3, q = [word 2 | word 2].
    let (k1, k2, k3) = (_mm256_set1_epi32(0x3F3F_3F3F), _mm256_set1_epi32(0x0F0F_0F0F), _mm256_set1_epi32(0x0303_0303));
    // lo = [sc0‥3 of rows 0‥3 | m0‥3 of rows 0‥3], hi = the same for sc4‥7 and m4‥7.
    let lo = _mm256_and_si256(p, k1);
    let q = _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), k2);
    let hi = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(p, 6), k3), 4));
    // unpacklo: [sc0‥3 r0, sc4‥7 r0, sc0‥3 r1, sc4‥7 r1 | m… r0, m… r1]; qwords (0, 2, 1, 3).
    [_mm256_permute4x64_epi64::<0xD8>(_mm256_unpacklo_epi32(lo, hi)), _mm256_permute4x64_epi64::<0xD8>(_mm256_unpackhi_epi32(lo, hi))]
}

/// Sub-block pair j (values 64j‥64j+64) of row pair `p` against one activation row's 64
/// values at `yq`: four i32 per row of `sc_2j·Σ q·y + sc_2j+1·Σ q·y` (`sm`: the pair's scales).
#[inline(always)]
unsafe fn q4_k_pair(q: [__m256i; 2], yq: *const u8, sm: __m256i, j: usize) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0F);
    // SAFETY: 64 activation bytes at `yq` (the caller's); AVX2 present.
    unsafe {
        let (l0, l1) = (_mm256_and_si256(q[0], m4), _mm256_and_si256(q[1], m4));
        let (h0, h1) = (_mm256_and_si256(_mm256_srli_epi16(q[0], 4), m4), _mm256_and_si256(_mm256_srli_epi16(q[1], 4), m4));
        let a = _mm256_add_epi16(_mm256_maddubs_epi16(l0, bcast(yq)), _mm256_maddubs_epi16(l1, bcast(yq.add(16))));
        let b = _mm256_add_epi16(_mm256_maddubs_epi16(h0, bcast(yq.add(32))), _mm256_maddubs_epi16(h1, bcast(yq.add(48))));
        let sa = _mm256_shuffle_epi8(sm, byte_words(2 * j as i8));
        let sb = _mm256_shuffle_epi8(sm, byte_words(2 * j as i8 + 1));
        _mm256_add_epi32(_mm256_madd_epi16(a, sa), _mm256_madd_epi16(b, sb))
    }
}

/// Row pair p's two 16-byte `qs` pieces of sub-block pair j (pieces 2j and 2j + 1).
#[inline(always)]
unsafe fn q4_k_bytes(gb: *const u8, p: usize, j: usize) -> [__m256i; 2] {
    // SAFETY: pieces 2j, 2j + 1 of the eight at 64 + 64·piece are inside the group-block.
    unsafe { [_mm256_loadu_si256(gb.add(64 + 128 * j + 32 * p) as *const __m256i), _mm256_loadu_si256(gb.add(128 + 128 * j + 32 * p) as *const __m256i)] }
}

/// The mins as i16 words `m0‥m7` of each lane (bytes 8‥16 of [`scales_q4_k`]'s lanes).
#[inline(always)]
fn min_words() -> __m256i {
    // SAFETY: AVX2 is present in every kernel this is inlined into.
    unsafe { _mm256_broadcastsi128_si256(_mm_setr_epi8(8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15, -128)) }
}

/// Decode's GEMV on interleaved Q4_K rows: `out[c]` = `dot_q4_k_q8_k(row c, y)`, bit for bit
/// (`g`: the groups of `out.len()` rows, a multiple of four, plain rows `xrb` bytes). `prep`:
/// scratch of at least `xrb / 144 · 8` i32.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn rows_q4_k(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    let nb = xrb / BS4;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb);
    // [d_r·d_y, dmin_r·d_y] of rows 0, 2 (lane 0) and 1, 3 (lane 1), as the `hadd`s order the sums.
    let order = _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7);
    // SAFETY: features enabled above; `prepare` checks `y` and `prep`, the group-blocks are
    // inside `g` (asserted).
    unsafe {
        prepare_q4_k(y, nb, prep);
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let base = g.as_ptr().add(c * ROWS * xrb);
            // [acc_0, acc_min_0, acc_2, acc_min_2 | acc_1, acc_min_1, acc_3, acc_min_3].
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let gb = base.add(i * ROWS * BS4);
                prefetch_ahead(gb, ROWS * BS4);
                let yq = y.as_ptr().add(i * ABS + QS);
                let pp = prep.as_ptr().add(PREP * i);
                let sm = scales_q4_k(gb);
                let pairs = bcast(pp as *const u8);
                let mut x = [_mm256_setzero_si256(); 2];
                for (p, x) in x.iter_mut().enumerate() {
                    let mut sumi = _mm256_setzero_si256();
                    for j in 0..4 {
                        sumi = _mm256_add_epi32(sumi, q4_k_pair(q4_k_bytes(gb, p, j), yq.add(64 * j), sm[p], j));
                    }
                    let summ = _mm256_madd_epi16(_mm256_shuffle_epi8(sm[p], min_words()), pairs);
                    // Per lane [si0 + si1, si2 + si3, sm0 + sm1, sm2 + sm3].
                    *x = _mm256_hadd_epi32(sumi, summ);
                }
                // Lane 0: [si_0, sm_0, si_2, sm_2]; lane 1: rows 1 and 3.
                let sums = _mm256_hadd_epi32(x[0], x[1]);
                let dy = _mm256_set1_ps(*(pp.add(4) as *const f32));
                let dd = _mm256_permutevar8x32_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i)), dy), order);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), dd, acc);
            }
            let mut v = [0f32; 8];
            _mm256_storeu_ps(v.as_mut_ptr(), acc);
            o.copy_from_slice(&[v[0] - v[1], v[4] - v[5], v[2] - v[3], v[6] - v[7]]);
        }
    }
}

/// Prefill's tiles on interleaved Q4_K rows in the tile order (`dot_q4_k_q8_k_tile`):
/// `out[c][a]` bit for bit for four activation rows. Per 64 values the four activation rows'
/// sums of a row pair are reduced together (lane e of the result: row `2p + e` against
/// activation rows 0‥3) and one FMA updates the eight (row, activation row) pairs. `prep`:
/// scratch of at least `4 · xrb / 144 · 8` i32.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles_q4_k(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], prep: &mut [i32]) {
    let nb = xrb / BS4;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && prep.len() >= 4 * nb * PREP);
    // SAFETY: features enabled above; `prepare` checks each row and its `prep` range, the
    // group-blocks are inside `g` (asserted).
    unsafe {
        for (a, y) in y.iter().enumerate() {
            prepare_q4_k(y, nb, &mut prep[a * nb * PREP..(a + 1) * nb * PREP]);
        }
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let base = g.as_ptr().add(c * ROWS * xrb);
            for p in 0..2 {
                // Lane e, element a: row 2p + e against activation row a.
                let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for i in 0..nb {
                    let gb = base.add(i * ROWS * BS4);
                    if p == 0 {
                        // Weights ahead (`avx512_il::tiles_impl`).
                        prefetch_ahead(gb, ROWS * BS4);
                    }
                    let yq: [*const u8; 4] = std::array::from_fn(|a| y[a].as_ptr().add(i * ABS + QS));
                    let pp: [*const i32; 4] = std::array::from_fn(|a| prep.as_ptr().add((a * nb + i) * PREP));
                    // ps[j] element a: activation row a's (pair 2j, pair 2j + 1) as two i16.
                    let x = pp.map(|p| _mm_loadu_si128(p as *const __m128i));
                    let (l01, h01) = (_mm_unpacklo_epi32(x[0], x[1]), _mm_unpackhi_epi32(x[0], x[1]));
                    let (l23, h23) = (_mm_unpacklo_epi32(x[2], x[3]), _mm_unpackhi_epi32(x[2], x[3]));
                    let ps = [_mm_unpacklo_epi64(l01, l23), _mm_unpackhi_epi64(l01, l23), _mm_unpacklo_epi64(h01, h23), _mm_unpackhi_epi64(h01, h23)];
                    let dy = _mm256_broadcast_ps(&_mm_setr_ps(*(pp[0].add(4) as *const f32), *(pp[1].add(4) as *const f32), *(pp[2].add(4) as *const f32), *(pp[3].add(4) as *const f32)));
                    let hd = _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i));
                    let (r0, r1) = (2 * p as i32, 2 * p as i32 + 1);
                    let d = _mm256_mul_ps(_mm256_permutevar8x32_ps(hd, _mm256_setr_epi32(r0, r0, r0, r0, r1, r1, r1, r1)), dy);
                    let dmin = _mm256_mul_ps(_mm256_permutevar8x32_ps(hd, _mm256_setr_epi32(r0 + 4, r0 + 4, r0 + 4, r0 + 4, r1 + 4, r1 + 4, r1 + 4, r1 + 4)), dy);
                    let sm = scales_q4_k(gb)[p];
                    // Sub-block pairs j = 0‥4, each with `j` a constant (as a loop LLVM kept
                    // it a variable and built the shuffle controls at run time).
                    q4_k_tile_step::<0>(gb, p, yq, sm, ps[0], d, dmin, &mut acc, &mut acc_min);
                    q4_k_tile_step::<1>(gb, p, yq, sm, ps[1], d, dmin, &mut acc, &mut acc_min);
                    q4_k_tile_step::<2>(gb, p, yq, sm, ps[2], d, dmin, &mut acc, &mut acc_min);
                    q4_k_tile_step::<3>(gb, p, yq, sm, ps[3], d, dmin, &mut acc, &mut acc_min);
                }
                let mut v = [0f32; 8];
                _mm256_storeu_ps(v.as_mut_ptr(), _mm256_sub_ps(acc, acc_min));
                o[2 * p].copy_from_slice(&v[..4]);
                o[2 * p + 1].copy_from_slice(&v[4..]);
            }
        }
    }
}

/// Sub-block pair `J` (values 64J‥64J+64) of row pair `p` of the group-block at `gb` against
/// four activation rows (`yq`: their quants of this block; `ps`: element a holds row a's bsum
/// pair of the sub-blocks) into [`tiles_q4_k`]'s accumulators: lane e, element a of `acc` and
/// `acc_min` is row 2p + e against activation row a.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q4_k_tile_step<const J: usize>(gb: *const u8, p: usize, yq: [*const u8; 4], sm: __m256i, ps: __m128i, d: __m256, dmin: __m256, acc: &mut __m256, acc_min: &mut __m256) {
    // SAFETY: the caller's (`tiles_q4_k`): a whole group-block at `gb`, 256 quants at each `yq`.
    unsafe {
        let q = q4_k_bytes(gb, p, J);
        // A loop, not `array::from_fn`: LLVM left that closure out of line (Q4_K tiles 2x
        // slower, seen once).
        let mut part = [_mm256_setzero_si256(); 4];
        for (a, part) in part.iter_mut().enumerate() {
            *part = q4_k_pair(q, yq[a].add(64 * J), sm, J);
        }
        // Lane e: [Σ part0, Σ part1, Σ part2, Σ part3] of row 2p + e's four i32.
        let t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(part[0], part[1]), _mm256_unpackhi_epi32(part[0], part[1]));
        let t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(part[2], part[3]), _mm256_unpackhi_epi32(part[2], part[3]));
        let sumi = _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
        // (m_2J, m_2J+1) in every i32 of a lane, against the activations' pairs.
        let (a, b) = (8 + 2 * J as i8, 9 + 2 * J as i8);
        let ctl = _mm256_broadcastsi128_si256(_mm_setr_epi8(a, -128, b, -128, a, -128, b, -128, a, -128, b, -128, a, -128, b, -128));
        let summ = _mm256_madd_epi16(_mm256_shuffle_epi8(sm, ctl), _mm256_broadcastsi128_si256(ps));
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, *acc);
        *acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(summ), dmin, *acc_min);
    }
}

/// [`tiles_q4_k`] for eight activation rows: two passes of four.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles8_q4_k(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: `tiles_q4_k` needs the features enabled here.
    unsafe { two_passes(g, xrb, y, out, prep, tiles_q4_k) }
}

/// Row pair `p` of the Q6_K group at `g` (`nb` group-blocks) against `J` activation rows:
/// `[row 2p, row 2p + 1][j]`, each `dot_q6_k_q8_k`'s value bit for bit, the 6-bit values
/// decoded from `g` (the decoded tiles run [`q6_k_pair_blocks`] themselves, range by range, and
/// the GEMV block by block for both pairs).
#[inline(always)]
unsafe fn q6_k_pair<const J: usize>(g: *const u8, nb: usize, y: [*const u8; J], p: usize) -> [[f32; J]; 2] {
    let mut acc = [[_mm256_setzero_ps(); 2]; J];
    // SAFETY: the caller's contract; without `D` no decoded bytes are read.
    unsafe {
        q6_k_pair_blocks::<J, false>(g, g, 0..nb, y, p, &mut acc);
        reduce_pairs(acc)
    }
}

/// [`q6_k_pair`]'s accumulation over the group-blocks `blocks` into `acc` (lane e of
/// `acc[j][h]`: row 2p + e's lanes 4h‥4h+4 against activation row j): the blocks in order, so
/// consecutive ranges give the whole row's float steps in the same order. With `D` the 6-bit
/// values are read from `dec` (the group decoded by [`decode_q6_k`]) instead of being decoded
/// from `g`.
///
/// Each half `h` runs in [`q6_k_half`] with `h` a constant, so its `J` i32 sums stay in
/// registers: with `h` a loop variable LLVM kept the sums in memory and built the scale
/// shuffle's control byte by byte (`vpinsrb`) at every step.
#[inline(always)]
unsafe fn q6_k_pair_blocks<const J: usize, const D: bool>(g: *const u8, dec: *const u8, blocks: std::ops::Range<usize>, y: [*const u8; J], p: usize, acc: &mut [[__m256; 2]; J]) {
    // SAFETY: the caller passes a whole group at `g` (and its decoded bytes at `dec`) and J
    // activation rows of at least `blocks.end` blocks.
    unsafe {
        for i in blocks {
            let gb = g.add(i * ROWS * BS6);
            if p == 0 && !D {
                // Weights ahead (`avx512_il::tiles_impl`); decoded, `decode_q6_k` asked.
                prefetch_ahead(gb, ROWS * BS6);
            }
            let yb: [*const u8; J] = std::array::from_fn(|j| y[j].add(i * ABS));
            // Lane e: row 2p + e's scales 8n‥8n+8 as i16 (n = 0, 1).
            let sw = [_mm256_cvtepi8_epi16(_mm_loadu_si128(gb.add(8 + 16 * p) as *const __m128i)), _mm256_cvtepi8_epi16(_mm_loadu_si128(gb.add(40 + 16 * p) as *const __m128i))];
            let dw = _mm256_cvtph_ps(_mm_loadl_epi64(gb as *const __m128i));
            let (r0, r1) = (2 * p as i32, 2 * p as i32 + 1);
            let dr = _mm256_permutevar8x32_ps(dw, _mm256_setr_epi32(r0, r0, r0, r0, r1, r1, r1, r1));
            let s0 = q6_k_half::<J, D, 0>(gb, dec, i, p, yb, sw);
            fold_half(s0, dr, yb, acc, 0);
            let s1 = q6_k_half::<J, D, 1>(gb, dec, i, p, yb, sw);
            fold_half(s1, dr, yb, acc, 1);
        }
    }
}

/// `acc[j][h] += (d_r·d_y)·sumi[j]`: the plain kernel's float step of one half of a
/// super-block (the two halves are separate lanes, so either may go first).
#[inline(always)]
unsafe fn fold_half<const J: usize>(sumi: [__m256i; J], dr: __m256, yb: [*const u8; J], acc: &mut [[__m256; 2]; J], h: usize) {
    // SAFETY: each `yb[j]` points to a Q8_K block, whose first field is `d`.
    unsafe {
        for j in 0..J {
            let d = _mm256_mul_ps(_mm256_set1_ps(*(yb[j] as *const f32)), dr);
            acc[j][h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[j]), acc[j][h]);
        }
    }
}

/// `vpshufb` controls putting sub-block s's i16 scale (bytes 2s, 2s + 1 of a lane's eight) into
/// every i16 of the lane.
const Q6K_SC: [[i8; 32]; 8] = {
    let mut t = [[0i8; 32]; 8];
    let mut s = 0;
    while s < 8 {
        let mut b = 0;
        while b < 32 {
            t[s][b] = (2 * s + b % 2) as i8;
            b += 1;
        }
        s += 1;
    }
    t
};

/// Half `H` of row pair p's super-block i (`gb`) against `J` activation rows (`yb`: their
/// blocks i): lane e of element j holds row 2p + e's i32 lanes 4H‥4H+4, exactly — the
/// `−32·Σ bsums·sc` correction, then `maddubs` + `madd` with the sub-block's scale per
/// 16 values (sub-blocks 8n + 2k + H).
#[inline(always)]
unsafe fn q6_k_half<const J: usize, const D: bool, const H: usize>(gb: *const u8, dec: *const u8, i: usize, p: usize, yb: [*const u8; J], sw: [__m256i; 2]) -> [__m256i; J] {
    let m3f = _mm256_set1_epi8(0x3F);
    let mut sumi = [_mm256_setzero_si256(); J];
    // SAFETY: the caller's contract (`q6_k_pair_blocks`).
    unsafe {
        // −32·(bsums[2L]·sc[2L] + bsums[2L+1]·sc[2L+1]) in lane L of the half. (Loops, not
        // `array::from_fn`, whose closure may be left out of line without AVX2.)
        for (j, s) in sumi.iter_mut().enumerate() {
            *s = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sw[H], bcast(yb[j].add(BSUMS + 16 * H))), 5));
        }
        for (n, &swn) in sw.iter().enumerate() {
            for k in 0..4 {
                // Values 16H‥16H+16 of group (n, k), decoded once for the J rows.
                let v = if D { _mm256_loadu_si256(dec.add(q6_k_at(i, p, n, H, k)) as *const __m256i) } else { q6_k_values(gb, p, n, H, k, m3f) };
                let sc = _mm256_shuffle_epi8(swn, _mm256_loadu_si256(Q6K_SC[2 * k + H].as_ptr() as *const __m256i));
                for j in 0..J {
                    let q8 = bcast(yb[j].add(QS + 128 * n + 32 * k + 16 * H));
                    sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(_mm256_maddubs_epi16(v, q8), sc));
                }
            }
        }
    }
    sumi
}

/// Row pair p's values 16h‥16h+16 of each 32-value group (n, k) of the group-block at `gb`, as
/// unsigned 6-bit bytes, from the `Folded` form (`matmul::layout`): values k = 0, 1, 2 are run
/// k's bits 0‥5; value k = 3 gathers bits 6, 7 of the three runs (word shifts by 6, 4, 2 put
/// them at bits 0‥1, 2‥3, 4‥5 of their byte; the masks drop what the neighbour byte shifted in).
#[inline(always)]
unsafe fn q6_k_values(gb: *const u8, p: usize, n: usize, h: usize, k: usize, m3f: __m256i) -> __m256i {
    // SAFETY: the runs lie at 72‥840 of the group-block, 32 bytes per row pair; AVX2 present in
    // every kernel this is inlined into.
    unsafe {
        // (Pointers, not a closure: a closure would not inherit the caller's target features.)
        let run = gb.add(72 + 192 * (2 * n + h) + 32 * p);
        if k < 3 {
            return _mm256_and_si256(_mm256_loadu_si256(run.add(64 * k) as *const __m256i), m3f);
        }
        let (r0, r1, r2) = (_mm256_loadu_si256(run as *const __m256i), _mm256_loadu_si256(run.add(64) as *const __m256i), _mm256_loadu_si256(run.add(128) as *const __m256i));
        let b01 = _mm256_and_si256(_mm256_srli_epi16(r0, 6), _mm256_set1_epi8(0x03));
        let b23 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), _mm256_set1_epi8(0x0C));
        let b45 = _mm256_and_si256(_mm256_srli_epi16(r2, 2), _mm256_set1_epi8(0x30));
        _mm256_or_si256(_mm256_or_si256(b01, b23), b45)
    }
}

/// Where [`decode_q6_k`] puts row pair p's values (n, h, k) of group-block i in its group's
/// decoded bytes (1024 per group-block: two pairs × 16 vectors).
#[inline(always)]
fn q6_k_at(i: usize, p: usize, n: usize, h: usize, k: usize) -> usize {
    32 * (16 * (2 * i + p) + 8 * n + 4 * h + k)
}

/// The values of the Q6_K groups in `g` (rows of `xrb` plain bytes, a multiple of four) as the
/// tiles multiply them, one byte per value, into `dec` (`rows · xrb / 210 · 256` bytes): read
/// by [`tiles8_q6_k_decoded`] for every eight-row call of a batch instead of decoding each
/// group-block again (twice per eight-row call).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn decode_q6_k(g: &[u8], xrb: usize, dec: &mut [u8]) {
    let nb = xrb / BS6;
    let groups = g.len() / (ROWS * xrb);
    assert!(dec.len() >= groups * ROWS * nb * 256);
    let m3f = _mm256_set1_epi8(0x3F);
    for c in 0..groups {
        for i in 0..nb {
            prefetch_ahead(g.as_ptr().wrapping_add((c * ROWS * nb + ROWS * i) * BS6), ROWS * BS6);
            for (p, n, h, k) in (0..32).map(|x| (x / 16, x / 8 % 2, x / 4 % 2, x % 4)) {
                // SAFETY: group-block i of group c is inside `g` (groups counted from its
                // length); the 32 decoded bytes inside `dec` (asserted).
                unsafe {
                    let v = q6_k_values(g.as_ptr().add((c * ROWS * nb + ROWS * i) * BS6), p, n, h, k, m3f);
                    _mm256_storeu_si256(dec.as_mut_ptr().add(c * ROWS * nb * 256 + q6_k_at(i, p, n, h, k)) as *mut __m256i, v);
                }
            }
        }
    }
}

/// [`tiles8_q6_k`] on groups whose values [`decode_q6_k`] wrote to `dec` (the same bits): per
/// group the two passes of four activation rows, the group's decoded bytes in L1 for the second.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles8_q6_k_decoded(g: &[u8], dec: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], _prep: &mut [i32]) {
    let nb = xrb / BS6;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && dec.len() >= out.len() * nb * 256 && y.iter().all(|y| y.len() >= nb * ABS));
    let yp: [[*const u8; 4]; 2] = std::array::from_fn(|half| std::array::from_fn(|j| y[4 * half + j].as_ptr()));
    for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
        // [half][pair]: the accumulators carried from one range of blocks to the next.
        let mut acc = [[[[_mm256_setzero_ps(); 2]; 4]; 2]; 2];
        for i0 in (0..nb).step_by(Q6K_CHUNK) {
            let blocks = i0..(i0 + Q6K_CHUNK).min(nb);
            for (half, acc) in acc.iter_mut().enumerate() {
                for (p, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: features enabled above; the group, its decoded bytes and the rows
                    // are whole (asserted).
                    unsafe { q6_k_pair_blocks::<4, true>(g.as_ptr().add(c * ROWS * xrb), dec.as_ptr().add(c * ROWS * nb * 256), blocks.clone(), yp[half], p, acc) };
                }
            }
        }
        for (half, acc) in acc.iter().enumerate() {
            for (p, acc) in acc.iter().enumerate() {
                // SAFETY: register arithmetic, features enabled above.
                let v = unsafe { reduce_pairs(*acc) };
                for e in 0..2 {
                    o[2 * p + e][4 * half..4 * half + 4].copy_from_slice(&v[e]);
                }
            }
        }
    }
}

/// Super-blocks per range in [`tiles8_q6_k_decoded`]: the eight activation rows' 9 KB of them
/// and the group's 4 KB of values stay in L1 while all four (half, pair) passes read them; a
/// whole row (ffn_down's 4864 values: 44 KB of activations) did not fit.
const Q6K_CHUNK: usize = 4;

/// Each row pair's eight lanes per activation row (lane e of `acc[j][h]`: row 2p + e's lanes
/// 4h‥4h+4) summed as `hsum_f32x8`: (hi + lo), then + movehl, then + movehdup.
#[inline(always)]
unsafe fn reduce_pairs<const J: usize>(acc: [[__m256; 2]; J]) -> [[f32; J]; 2] {
    let mut out = [[0f32; J]; 2];
    // SAFETY: register arithmetic; AVX present in every kernel this is inlined into.
    unsafe {
        for j in 0..J {
            let s = _mm256_add_ps(acc[j][1], acc[j][0]);
            let s = _mm256_add_ps(s, _mm256_permute_ps::<0xEE>(s));
            let s = _mm256_add_ps(s, _mm256_permute_ps::<0x55>(s));
            out[0][j] = _mm256_cvtss_f32(s);
            out[1][j] = _mm_cvtss_f32(_mm256_extractf128_ps(s, 1));
        }
    }
    out
}

/// Decode's GEMV on interleaved Q6_K rows: `out[c]` = `dot_q6_k_q8_k(row c, y)`, bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn rows_q6_k(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], _prep: &mut [i32]) {
    let nb = xrb / BS6;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && y.len() >= nb * ABS);
    for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
        // Both row pairs block by block, so the group streams through once.
        let mut acc = [[[_mm256_setzero_ps(); 2]; 1]; 2];
        let gc = g.as_ptr().wrapping_add(c * ROWS * xrb);
        for i in 0..nb {
            // (Pair 0's pass asks for the group-block's weights ahead.)
            for (p, acc) in acc.iter_mut().enumerate() {
                // SAFETY: features enabled above; the group and `y` are whole (asserted).
                unsafe { q6_k_pair_blocks::<1, false>(gc, gc, i..i + 1, [y.as_ptr()], p, acc) };
            }
        }
        for (p, acc) in acc.iter().enumerate() {
            // SAFETY: register arithmetic, features enabled above.
            let v = unsafe { reduce_pairs(*acc) };
            (o[2 * p], o[2 * p + 1]) = (v[0][0], v[1][0]);
        }
    }
}

/// Prefill's tiles on interleaved Q6_K rows: `out[c][j]` = `dot_q6_k_q8_k(row c, y[j])`, bit
/// for bit, each group-block's values decoded once for the four activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles_q6_k(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], prep: &mut [i32]) {
    tiles_few_q6_k::<4>(g, xrb, y, out, prep)
}

/// [`tiles_q6_k`] for `J` activation rows (2 or 3: a short batch's rows).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles_few_q6_k<const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], _prep: &mut [i32]) {
    let nb = xrb / BS6;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && y.iter().all(|y| y.len() >= nb * ABS));
    let yp = y.map(|y| y.as_ptr());
    for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
        for p in 0..2 {
            // SAFETY: features enabled above; the group and the rows are whole (asserted).
            let v = unsafe { q6_k_pair::<J>(g.as_ptr().add(c * ROWS * xrb), nb, yp, p) };
            (o[2 * p], o[2 * p + 1]) = (v[0], v[1]);
        }
    }
}

/// [`tiles_q6_k`] for eight activation rows: two passes of four.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles8_q6_k(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: `tiles_q6_k` needs the features enabled here.
    unsafe { two_passes(g, xrb, y, out, prep, tiles_q6_k) }
}

/// Plain IQ4_XS block bytes.
const BSX: usize = 136;

/// The 6-bit sub-block scales of the IQ4_XS group-block at `gb`, less 32, as i16 in both
/// halves of an i32: element `4·(b % 2) + r` of vector `b / 2` is row r's scale of sub-block b.
#[inline(always)]
unsafe fn scales_iq4_xs(gb: *const u8) -> [__m256i; 4] {
    // SAFETY: bytes 8‥32 of the group-block hold rows 0‥3's `scales_h` (u16) and `scales_l`
    // (4 bytes); AVX2 present.
    unsafe {
        // Lane r (both halves): row r's `scales_l` as a u32 (sub-block b in bits 4b‥4b+4) and
        // its `scales_h` shifted left by 4 (sub-block b's two bits at 4 + 2b).
        let sl = _mm256_broadcastsi128_si256(_mm_loadu_si128(gb.add(16) as *const __m128i));
        let sh = _mm256_broadcastsi128_si256(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64(gb.add(8) as *const __m128i)), 4));
        let (m_lo, m_hi, k32) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(0x30), _mm256_set1_epi16(32));
        let mut v = [_mm256_setzero_si256(); 4];
        for (k, v) in v.iter_mut().enumerate() {
            let (a, b) = (2 * k as i32, 2 * k as i32 + 1);
            let lo = _mm256_and_si256(_mm256_srlv_epi32(sl, _mm256_setr_epi32(4 * a, 4 * a, 4 * a, 4 * a, 4 * b, 4 * b, 4 * b, 4 * b)), m_lo);
            let hi = _mm256_and_si256(_mm256_srlv_epi32(sh, _mm256_setr_epi32(2 * a, 2 * a, 2 * a, 2 * a, 2 * b, 2 * b, 2 * b, 2 * b)), m_hi);
            let u = _mm256_or_si256(lo, hi);
            *v = _mm256_sub_epi16(_mm256_or_si256(u, _mm256_slli_epi32(u, 16)), k32);
        }
        v
    }
}

/// Row pairs `p0 .. p0 + P` of the IQ4_XS group at `g` (`nb` group-blocks) against `J`
/// activation rows (`y`, and `ay`: their quants' magnitudes, [`magnitudes`]):
/// `[pair][row 2p + e][j]`, each `avx2_ext::dot_iq4_xs_q8_k`'s value bit for bit. That kernel
/// keeps eight i32 lanes per row and super-block (lanes 0‥3: values 4L‥4L+4 of each
/// sub-block's first 16, times its scale; lanes 4‥7 the same of its last 16), then
/// `acc = fma(d·d_y, lanes, acc)` and `hsum_f32x8(acc)`; here a 32-byte load of one
/// sub-block's nibbles holds a row pair, so its low nibbles give both rows' lanes 0‥3 and its
/// high nibbles their lanes 4‥7. The products are `maddubs(|y|, sign(x, y))`: the same
/// integers as ggml's `maddubs(|x|, sign(y, x))`, with the magnitudes taken once per
/// activation instead of once per weight vector.
#[inline(always)]
unsafe fn iq4_xs_pairs<const P: usize, const J: usize>(g: *const u8, nb: usize, y: [*const u8; J], ay: [*const u8; J], p0: usize) -> [[[f32; J]; 2]; P] {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [[[_mm256_setzero_ps(); 2]; J]; P];
    // SAFETY: the caller passes a whole group at `g`, J activation rows of `nb` blocks and
    // their magnitudes (256 bytes per block); AVX2, FMA and F16C present.
    unsafe {
        let table = iq4_grid();
        // Per pair: row 2p's scale in the low lane's i32s, row 2p + 1's in the high lane's, for
        // an even and an odd sub-block.
        // `pick[k][0]` also spreads the pair's `d` from the group-block's four.
        let mut pick = [[_mm256_setzero_si256(); 2]; P];
        for (k, pick) in pick.iter_mut().enumerate() {
            let (a, b) = (2 * (p0 + k) as i32, 2 * (p0 + k) as i32 + 1);
            *pick = [_mm256_setr_epi32(a, a, a, a, b, b, b, b), _mm256_setr_epi32(a + 4, a + 4, a + 4, a + 4, b + 4, b + 4, b + 4, b + 4)];
        }
        for i in 0..nb {
            let gb = g.add(i * ROWS * BSX);
            if p0 == 0 {
                // Weights ahead: the GEMV reads each once, a short batch's tiles each column
                // block for few rows (`avx512_il::tiles_impl`).
                prefetch_ahead(gb, ROWS * BSX);
            }
            let sv = scales_iq4_xs(gb);
            let mut sumi = [[[_mm256_setzero_si256(); 2]; J]; P];
            for s in 0..8 {
                for k in 0..P {
                    let q = _mm256_loadu_si256(gb.add(32 + 64 * s + 32 * (p0 + k)) as *const __m256i);
                    let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
                    let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
                    let sc = _mm256_permutevar8x32_epi32(sv[s / 2], pick[k][s % 2]);
                    for j in 0..J {
                        let (yq, aq) = (y[j].add(i * ABS + QS + 32 * s), ay[j].add(256 * i + 32 * s));
                        let pl = _mm256_maddubs_epi16(bcast(aq), _mm256_sign_epi8(lo, bcast(yq)));
                        let ph = _mm256_maddubs_epi16(bcast(aq.add(16)), _mm256_sign_epi8(hi, bcast(yq.add(16))));
                        sumi[k][j][0] = _mm256_add_epi32(sumi[k][j][0], _mm256_madd_epi16(pl, sc));
                        sumi[k][j][1] = _mm256_add_epi32(sumi[k][j][1], _mm256_madd_epi16(ph, sc));
                    }
                }
            }
            let dw = _mm256_cvtph_ps(_mm_loadl_epi64(gb as *const __m128i));
            for k in 0..P {
                let dr = _mm256_permutevar8x32_ps(dw, pick[k][0]);
                for j in 0..J {
                    let d = _mm256_mul_ps(_mm256_set1_ps(*(y[j].add(i * ABS) as *const f32)), dr);
                    for h in 0..2 {
                        acc[k][j][h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[k][j][h]), acc[k][j][h]);
                    }
                }
            }
        }
        let mut out = [[[0f32; J]; 2]; P];
        for k in 0..P {
            out[k] = reduce_pairs(acc[k]);
        }
        out
    }
}

/// The magnitudes of an activation row's Q8_K quants (256 bytes per block) into `out`.
///
/// # Safety
/// AVX2 present.
#[inline(always)]
unsafe fn magnitudes(y: &[u8], nb: usize, out: &mut [u8]) {
    assert!(y.len() >= nb * ABS && out.len() >= 256 * nb);
    for i in 0..nb {
        for c in 0..8 {
            // SAFETY: 32 quants of block i at QS + 32c, 32 bytes of `out` (both asserted).
            unsafe {
                let q = _mm256_loadu_si256(y.as_ptr().add(i * ABS + QS + 32 * c) as *const __m256i);
                _mm256_storeu_si256(out.as_mut_ptr().add(256 * i + 32 * c) as *mut __m256i, _mm256_abs_epi8(q));
            }
        }
    }
}

/// `prep` (i32 scratch) as bytes.
fn prep_bytes(prep: &mut [i32]) -> &mut [u8] {
    // SAFETY: any bytes are valid u8; the length covers the same memory.
    unsafe { std::slice::from_raw_parts_mut(prep.as_mut_ptr() as *mut u8, 4 * prep.len()) }
}

/// Decode's GEMV on interleaved IQ4_XS rows: `out[c]` = `dot_iq4_xs_q8_k(row c, y)`, bit for
/// bit. `prep`: scratch of at least `xrb / 136 · 64` i32.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn rows_iq4_xs(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    let nb = xrb / BSX;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && y.len() >= nb * ABS);
    let ay = prep_bytes(prep);
    // SAFETY: features enabled above; `magnitudes` checks `ay`'s length.
    unsafe { magnitudes(y, nb, ay) };
    for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
        // SAFETY: features enabled above; the group, `y` and its magnitudes are whole.
        let v = unsafe { iq4_xs_pairs::<2, 1>(g.as_ptr().add(c * ROWS * xrb), nb, [y.as_ptr()], [ay.as_ptr()], 0) };
        for (p, v) in v.iter().enumerate() {
            (o[2 * p], o[2 * p + 1]) = (v[0][0], v[1][0]);
        }
    }
}

/// Prefill's tiles on interleaved IQ4_XS rows: `out[c][j]` = `dot_iq4_xs_q8_k(row c, y[j])`, bit
/// for bit, each sub-block's values decoded once for the four activation rows. `prep`: scratch
/// of at least `4 · xrb / 136 · 64` i32.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles_iq4_xs(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], prep: &mut [i32]) {
    tiles_few_iq4_xs::<4>(g, xrb, y, out, prep)
}

/// [`tiles_iq4_xs`] for `J` activation rows (2 or 3: a short batch's rows).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles_few_iq4_xs<const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], prep: &mut [i32]) {
    let nb = xrb / BSX;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && y.iter().all(|y| y.len() >= nb * ABS));
    let ay = prep_bytes(prep);
    assert!(ay.len() >= J * 256 * nb);
    for (a, y) in y.iter().enumerate() {
        // SAFETY: features enabled above; lengths checked by `magnitudes`.
        unsafe { magnitudes(y, nb, &mut ay[a * 256 * nb..]) };
    }
    let yp = y.map(|y| y.as_ptr());
    let ap: [*const u8; J] = std::array::from_fn(|a| ay[a * 256 * nb..].as_ptr());
    for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
        for p in 0..2 {
            // SAFETY: features enabled above; the group, the rows and their magnitudes are whole.
            let v = unsafe { iq4_xs_pairs::<1, J>(g.as_ptr().add(c * ROWS * xrb), nb, yp, ap, p) };
            (o[2 * p], o[2 * p + 1]) = (v[0][0], v[0][1]);
        }
    }
}

/// [`tiles_iq4_xs`] for eight activation rows: two passes of four.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tiles8_iq4_xs(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: `tiles_iq4_xs` needs the features enabled here.
    unsafe { two_passes(g, xrb, y, out, prep, tiles_iq4_xs) }
}
