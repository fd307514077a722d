//! AVX-512 GEMV and tiles on interleaved Q4_K weights (`matmul::layout`): decode's
//! matrix-vector product for four rows at a time, bit-identical to the plain row's `vec_dot`
//! (`avx2::dot_q4_k_q8_k`). Q6_K and IQ4_XS, further down, keep the plain kernels' eight lanes
//! per row instead (see `rows_q6_k`, `rows_iq4_xs`). The Q4_K and Q6_K tiles take eight
//! activation rows in one pass (one unpacking of each group-block's nibbles and scales), and
//! Q6_K's, for a batch, read its values decoded once per column block (`decode_q6_k`, one byte
//! per value) instead of unpacking `ql`/`qh` in every call.
//!
//! That kernel's float order is simple: per super-block, the exact integer sums
//! `sumi = Σ_s sc_s · Σ q·y` and `summ = Σ_s m_s · (bsums[2s] + bsums[2s+1])`, then
//! `acc = fma(sumi, d·d_y, acc)` and `acc_min = fma(summ, dmin·d_y, acc_min)`, and the result
//! `acc − acc_min`. Any exact way of computing the integers gives the same bits, so here:
//!
//! - the four rows' scale words are unpacked together (one 256-bit operation per step of
//!   ggml's `utmp` shuffle), then transposed so 128-bit lane r holds row r's eight scales and
//!   eight mins;
//! - one 64-byte load holds 16 `qs` bytes of each row; its low nibbles meet one 16-byte piece of
//!   the activation broadcast to all four lanes, its high nibbles the piece 32 values on, one
//!   `vpdpbusd` each; two loads complete a sub-block pair (64 values) per row;
//! - the pair's two i32 vectors are narrowed to i16 (each lane sums 8 products, |·| ≤ 15 360)
//!   and multiplied by the sub-blocks' scales with one `vpmaddwd`;
//! - the mins meet the activation's pair sums (prepared once per call) with one `vpmaddwd`;
//! - both sums are reduced per lane together and converted, and one 256-bit FMA updates the
//!   four rows' `acc` (low half) and `acc_min` (high half) with `[d_r·d_y, dmin_r·d_y]`.
#![allow(clippy::missing_safety_doc)]

use super::common::{hsum_rows, iq4_grid512, prefetch_ahead, prepare_q4_k, Q4K_PREP as PREP};
use crate::matmul::layout::ROWS;
use crate::quant::blocks::BlockQ8K;
use std::arch::x86_64::*;

/// Plain Q4_K block bytes.
const BS: usize = 144;
/// Plain Q6_K block bytes.
const BS6: usize = 210;
/// Where a Q8_K block's quants and block sums start.
const QS: usize = 4;
const BSUMS: usize = 4 + 256;

/// The four rows' scales and mins of the group-block at `gb`: 128-bit lane r holds row r's
/// `sc0‥sc7, m0‥m7` (bytes), as ggml's `utmp` shuffle gives them for one row.
#[inline(always)]
unsafe fn scales(gb: *const u8) -> __m512i {
    // SAFETY: the scale words of rows 0‥3 are at 16‥64 of the group-block.
    let (p, q) = unsafe { (_mm256_loadu_si256(gb.add(16) as *const __m256i), _mm256_broadcastsi128_si256(_mm_loadu_si128(gb.add(48) as *const __m128i))) };
    // p = [word 0 | word 1] of rows 0‥3, q = [word 2 | word 2].
    let (k1, k2, k3) = (_mm256_set1_epi32(0x3F3F_3F3F), _mm256_set1_epi32(0x0F0F_0F0F), _mm256_set1_epi32(0x0303_0303));
    // [scales 0‥3 | mins 0‥3] = word & kmask1.
    let lo = _mm256_and_si256(p, k1);
    // [scales 4‥7 | mins 4‥7] = ((word2 >> (0 | 4)) & kmask2) | (((word >> 6) & kmask3) << 4).
    let q = _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), k2);
    let hi = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(p, 6), k3), 4));
    let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    // z's words: sc0‥3 of rows 0‥3, m0‥3, sc4‥7, m4‥7; lane r gets words r, 8 + r, 4 + r, 12 + r.
    _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 8, 4, 12, 1, 9, 5, 13, 2, 10, 6, 14, 3, 11, 7, 15), z)
}

/// `vpshufb` control giving, per lane, the i16 words `[b0 ×4, b1 ×4]` from bytes `b0`, `b1`.
///
/// # Safety
/// AVX-512 F present (inlined into the kernel).
#[inline(always)]
unsafe fn pair_control(b0: i8, b1: i8) -> __m512i {
    let z = -128i8;
    _mm512_broadcast_i32x4(_mm_setr_epi8(b0, z, b0, z, b0, z, b0, z, b1, z, b1, z, b1, z, b1, z))
}

/// 16 activation quants at `q` in all four lanes.
///
/// # Safety
/// 16 readable bytes at `q`; AVX-512 F present.
#[inline(always)]
unsafe fn bcast(q: *const i8) -> __m512i {
    // SAFETY: the caller's contract; unaligned load.
    unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(q as *const __m128i)) }
}

/// Decode's GEMV on interleaved Q4_K rows: `out[c]` = `dot_q4_k_q8_k(row c, y)`, bit for bit
/// (`g`: the groups of `out.len()` rows, a multiple of four, plain rows `xrb` bytes). `prep`:
/// scratch of at least `xrb / 144 · 8` i32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn rows_q4_k(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    let nb = xrb / BS;
    let abs = std::mem::size_of::<BlockQ8K>();
    let gbs = ROWS * BS;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && y.len() >= nb * abs);
    let m4 = _mm512_set1_epi8(0x0F);
    let ctl_min = _mm512_broadcast_i32x4(_mm_setr_epi8(8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15, -128));
    let gather = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    // SAFETY (this block and the loop): features enabled above; `prep` is checked by
    // `prepare`, the group-blocks and activation blocks are inside `g` and `y` (asserted).
    unsafe {
        let ctl = [pair_control(0, 1), pair_control(2, 3), pair_control(4, 5), pair_control(6, 7)];
        prepare_q4_k(y, nb, prep);
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let base = g.as_ptr().add(c * ROWS * xrb);
            // Low half: the four rows' acc; high half: their acc_min.
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let gb = base.add(i * gbs);
                // Decode's GEMV reads each weight once: ask for it ahead (`common::prefetch_ahead`).
                prefetch_ahead(gb, gbs);
                let yq = y.as_ptr().add(i * abs + QS) as *const i8;
                let p = prep.as_ptr().add(PREP * i);
                let sm = scales(gb);
                let mut sumi = _mm512_setzero_si512();
                for (j, ctl) in ctl.iter().enumerate() {
                    let q0 = _mm512_loadu_si512(gb.add(64 + 128 * j) as *const _);
                    let q1 = _mm512_loadu_si512(gb.add(128 + 128 * j) as *const _);
                    let (l0, l1) = (_mm512_and_si512(q0, m4), _mm512_and_si512(q1, m4));
                    let (h0, h1) = (_mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4));
                    let da = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), l0, bcast(yq.add(64 * j))), l1, bcast(yq.add(64 * j + 16)));
                    let db = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), h0, bcast(yq.add(64 * j + 32))), h1, bcast(yq.add(64 * j + 48)));
                    let w = _mm512_packs_epi32(da, db);
                    sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(w, _mm512_shuffle_epi8(sm, *ctl)));
                }
                let pairs = _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i));
                let summ = _mm512_madd_epi16(_mm512_shuffle_epi8(sm, ctl_min), pairs);
                // Per lane [si0 + si2, si1 + si3, sm0 + sm2, sm1 + sm3], then pair sums.
                let x = _mm512_add_epi32(_mm512_unpacklo_epi64(sumi, summ), _mm512_unpackhi_epi64(sumi, summ));
                let x = _mm512_add_epi32(x, _mm512_shuffle_epi32::<0xB1>(x));
                let sums = _mm512_castsi512_si256(_mm512_permutexvar_epi32(gather, x));
                let dy = _mm256_set1_ps(*(p.add(4) as *const f32));
                let dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i)), dy);
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), dd, acc);
            }
            let v = _mm_sub_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
            _mm_storeu_ps(o.as_mut_ptr(), v);
        }
    }
}

/// `vpshufb` control picking i16 words `a` and `b` of each lane into every i32 (`a` low).
///
/// # Safety
/// AVX-512 F present (inlined into the kernel).
#[inline(always)]
unsafe fn pick(a: i8, b: i8) -> __m512i {
    let (a0, a1, b0, b1) = (2 * a, 2 * a + 1, 2 * b, 2 * b + 1);
    _mm512_broadcast_i32x4(_mm_setr_epi8(a0, a1, b0, b1, a0, a1, b0, b1, a0, a1, b0, b1, a0, a1, b0, b1))
}

/// Decode's GEMV on interleaved Q6_K rows: `out[c]` = `avx2::dot_q6_k_q8_k(row c, y)`, bit for
/// bit (`g`: the groups of `out.len()` rows, a multiple of four, plain rows `xrb` bytes).
///
/// That kernel keeps eight i32 lanes per row and super-block: lane L sums, over the eight
/// 32-value groups, the group's bytes `4L‥4L+4` times the sub-block's scale, less
/// `32·(bsums[2L]·sc[2L] + bsums[2L+1]·sc[2L+1])`; then `acc_L = fma(d·d_y, lane L, acc_L)`
/// and `hsum_f32x8(acc)`. Here lanes 0‥3 of row r are 128-bit lane r of one vector and lanes
/// 4‥7 of another: one `vpdpbusd` on a 16-byte piece of each row gives exactly its four lanes'
/// products of one group (|·| ≤ 4·63·128 fits i16), so two groups' results are merged into the
/// i16 halves of each i32 and scaled by one `vpmaddwd` with both groups' scales.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn rows_q6_k(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], _prep: &mut [i32]) {
    // SAFETY: `[f32; 1]` has the layout of `f32`; the slice covers the same elements.
    let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut [f32; 1], out.len()) };
    // SAFETY: features enabled above.
    unsafe { q6_k_groups::<1, false>(g, g, xrb, [y], out) }
}

/// Prefill's tiles on interleaved Q6_K rows: `out[c][j]` = `dot_q6_k_q8_k(row c, y[j])`, bit
/// for bit, each group-block's values decoded once for the four activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_q6_k(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], _prep: &mut [i32]) {
    // SAFETY: features enabled above.
    unsafe { q6_k_groups::<4, false>(g, g, xrb, y, out) }
}

/// [`tiles_q6_k`] for `J` (2 or 3) activation rows: a short batch's rows past its groups of four.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_few_q6_k<const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], _prep: &mut [i32]) {
    // SAFETY: features enabled above.
    unsafe { q6_k_groups::<J, false>(g, g, xrb, y, out) }
}

/// [`tiles_q6_k`] for eight activation rows in one pass: each group-block's values unpacked once
/// for all eight (LLVM keeps part of the accumulators in memory; still 2.5 % faster than two
/// passes of four on Qwen2.5's Q6_K).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles8_q6_k(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], _prep: &mut [i32]) {
    // SAFETY: features enabled above.
    unsafe { q6_k_groups::<8, false>(g, g, xrb, y, out) }
}

/// [`tiles8_q6_k`] on groups whose values [`decode_q6_k`] wrote to `dec` (the same bytes, so
/// the same bits): the 6-bit values are read instead of being unpacked from `ql`/`qh` in every
/// eight-row call of the batch.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles8_q6_k_decoded(g: &[u8], dec: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], _prep: &mut [i32]) {
    // SAFETY: features enabled above.
    unsafe { q6_k_groups::<8, true>(g, dec, xrb, y, out) }
}

/// The values of the Q6_K groups in `g` (rows of `xrb` plain bytes, a multiple of four) as the
/// tiles multiply them, one byte per value, into `dec` (`rows · xrb / 210 · 256` bytes), for
/// [`tiles8_q6_k_decoded`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn decode_q6_k(g: &[u8], xrb: usize, dec: &mut [u8]) {
    let nb = xrb / BS6;
    let groups = g.len() / (ROWS * xrb);
    assert!(dec.len() >= groups * ROWS * nb * 256);
    for c in 0..groups {
        for i in 0..nb {
            prefetch_ahead(g.as_ptr().wrapping_add((c * nb + i) * ROWS * BS6), ROWS * BS6);
            for (n, h, k) in (0..16).map(|x| (x / 8, x / 4 % 2, x % 4)) {
                // SAFETY: group-block i of group c is inside `g` (groups counted from its
                // length); the 64 decoded bytes inside `dec` (asserted).
                unsafe {
                    let v = q6_k_values(g.as_ptr().add((c * nb + i) * ROWS * BS6), n, h, k);
                    _mm512_storeu_si512(dec.as_mut_ptr().add(c * ROWS * nb * 256 + q6_k_at(i, n, h, k)) as *mut _, v);
                }
            }
        }
    }
}

/// Where [`decode_q6_k`] puts the four rows' values (n, h, k) of group-block i in its group's
/// decoded bytes (1024 per group-block: 16 vectors).
#[inline(always)]
fn q6_k_at(i: usize, n: usize, h: usize, k: usize) -> usize {
    64 * (16 * i + 8 * n + 4 * h + k)
}

/// The four rows' values 16h‥16h+16 of 32-value group (n, k) of the Q6_K group-block at `gb`
/// as unsigned 6-bit bytes (`ql` nibble | `qh` bits · 16; 128-bit lane r: row r).
#[inline(always)]
unsafe fn q6_k_values(gb: *const u8, n: usize, h: usize, k: usize) -> __m512i {
    // SAFETY: `ql` at 72‥584 and `qh` at 584‥840 of the group-block (64 bytes per piece);
    // AVX-512 F/BW present in every kernel this is inlined into.
    unsafe {
        let (m0f, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let qh = _mm512_loadu_si512(gb.add(584 + 64 * (2 * n + h)) as *const _);
        let ql = _mm512_loadu_si512(gb.add(72 + 64 * (4 * n + 2 * (k % 2) + h)) as *const _);
        let lo = if k < 2 { ql } else { _mm512_srli_epi16(ql, 4) };
        let hi = match k {
            0 => _mm512_slli_epi16(qh, 4),
            1 => _mm512_slli_epi16(qh, 2),
            2 => qh,
            _ => _mm512_srli_epi16(qh, 2),
        };
        _mm512_ternarylogic_epi32::<0xEA>(lo, m0f, _mm512_and_si512(hi, m30))
    }
}

/// One super-block's integer sums into the accumulators of the Q6_K and IQ4_XS kernels:
/// `acc[j][h] = fma(d_r · d_y, sumi[j][h], acc[j][h])`, the four rows' F16 scales `d_r` (at the
/// group-block's start) spread to their 128-bit lanes, `d_y` the activation block's.
///
/// # Safety
/// AVX-512 F/VL, F16C present; 8 bytes readable at `gb`, an f32 at each `yb[j]`.
#[inline(always)]
unsafe fn scale_block<const J: usize>(gb: *const u8, yb: &[*const u8; J], sumi: &[[__m512i; 2]; J], acc: &mut [[__m512; 2]; J]) {
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    // SAFETY (caller): the features and the reads above.
    unsafe {
        let dw = _mm256_cvtph_ps(_mm_loadl_epi64(gb as *const __m128i));
        let dr = _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(dw));
        for j in 0..J {
            let dd = _mm512_mul_ps(dr, _mm512_set1_ps(*(yb[j] as *const f32)));
            for h in 0..2 {
                acc[j][h] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sumi[j][h]), acc[j][h]);
            }
        }
    }
}

/// The four rows' results for each activation row: `o[r][j]` from `acc[j]` (`hsum_rows`).
///
/// # Safety
/// AVX-512 F present.
#[inline(always)]
unsafe fn store_rows<const J: usize>(acc: &[[__m512; 2]; J], o: &mut [[f32; J]]) {
    for j in 0..J {
        let mut v = [0f32; 4];
        // SAFETY (caller): the feature; 4 f32 writable.
        unsafe { _mm_storeu_ps(v.as_mut_ptr(), hsum_rows(&acc[j])) };
        for r in 0..ROWS {
            o[r][j] = v[r];
        }
    }
}

/// The Q6_K kernels for `J` activation rows (1: the GEMV).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present.
#[inline(always)]
unsafe fn q6_k_groups<const J: usize, const D: bool>(g: &[u8], dec: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]]) {
    let nb = xrb / BS6;
    let abs = std::mem::size_of::<BlockQ8K>();
    let gbs = ROWS * BS6;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && y.iter().all(|y| y.len() >= nb * abs));
    assert!(!D || dec.len() >= out.len() * nb * 256);
    // SAFETY (this block and the loop): the caller's features; the group-blocks and
    // activation blocks are inside `g` and `y` (asserted).
    unsafe {
        // [half][pair of groups]: groups (0, 1) and (2, 3) of the half's 16-byte pieces.
        let picks = [[pick(0, 2), pick(4, 6)], [pick(1, 3), pick(5, 7)]];
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let base = g.as_ptr().add(c * ROWS * xrb);
            let dbase = dec.as_ptr().wrapping_add(c * ROWS * nb * 256);
            let mut acc = [[_mm512_setzero_ps(); 2]; J];
            for i in 0..nb {
                let gb = base.add(i * gbs);
                if !D {
                    // Weights ahead: every read of a GEMV, and a short batch's first of each
                    // column block (`avx512_il::tiles_impl`); decoded, `decode_q6_k` asked.
                    prefetch_ahead(gb, gbs);
                }
                let yb: [*const u8; J] = std::array::from_fn(|j| y[j].as_ptr().add(i * abs));
                // Row r's scales 0‥8 (then 8‥16) as i16 in lane r.
                let sw = [_mm512_cvtepi8_epi16(_mm256_loadu_si256(gb.add(8) as *const __m256i)), _mm512_cvtepi8_epi16(_mm256_loadu_si256(gb.add(40) as *const __m256i))];
                let mut sumi = [[_mm512_setzero_si512(); 2]; J];
                for (j, s) in sumi.iter_mut().enumerate() {
                    for (h, s) in s.iter_mut().enumerate() {
                        let bsums = bcast(yb[j].add(BSUMS + 16 * h) as *const i8);
                        *s = _mm512_sub_epi32(*s, _mm512_slli_epi32(_mm512_madd_epi16(sw[h], bsums), 5));
                    }
                }
                for n in 0..2 {
                    for h in 0..2 {
                        for p in 0..2 {
                            // The values of groups 2p and 2p + 1 (this half of them), decoded
                            // once for the activation rows (with `D`: read as `decode_q6_k`
                            // wrote them).
                            let mut v = [_mm512_setzero_si512(); 2];
                            for (e, v) in v.iter_mut().enumerate() {
                                *v = if D { _mm512_loadu_si512(dbase.add(q6_k_at(i, n, h, 2 * p + e)) as *const _) } else { q6_k_values(gb, n, h, 2 * p + e) };
                            }
                            let sc = _mm512_shuffle_epi8(sw[n], picks[h][p]);
                            for j in 0..J {
                                let yq = yb[j].add(QS) as *const i8;
                                let da = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[0], bcast(yq.add(128 * n + 64 * p + 16 * h)));
                                let db = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[1], bcast(yq.add(128 * n + 64 * p + 32 + 16 * h)));
                                // Group 2p's value in the low i16 of each i32, group 2p + 1's in the high.
                                let w = _mm512_mask_blend_epi16(0xAAAA_AAAA, da, _mm512_slli_epi32(db, 16));
                                sumi[j][h] = _mm512_add_epi32(sumi[j][h], _mm512_madd_epi16(w, sc));
                            }
                        }
                    }
                }
                scale_block(gb, &yb, &sumi, &mut acc);
            }
            store_rows(&acc, o);
        }
    }
}

/// Prefill's tiles on interleaved Q4_K rows, in the tile order (`dot_q4_k_q8_k_tile`, ggml's
/// repacked `q4_K_8x8`): `out[c][a]` bit for bit for four activation rows. That order keeps per
/// 64 values `acc = fma(sumi_j, d·d_y, acc)` and `acc_min = fma(summ_j, dmin·d_y, acc_min)`, so
/// the integer sums are reduced per 64 values: the four activation rows' lane sums are reduced
/// together (128-bit lane r of the result holds row r's sums for the four activation rows), and
/// one FMA per 64 values updates all sixteen (row, activation row) pairs. `prep`: scratch of at
/// least `4 · xrb / 144 · 8` i32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_q4_k(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], prep: &mut [i32]) {
    // SAFETY: features enabled above.
    unsafe { q4_k_tiles::<4>(g, xrb, y, out, prep) }
}

/// [`tiles_q4_k`] for `J` activation rows (4 or 8), each quad of them reduced and accumulated as
/// there: eight rows in one pass unpack each group-block's nibbles and scales once for all.
#[inline(always)]
unsafe fn q4_k_tiles<const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], prep: &mut [i32]) {
    const QUADS: usize = 2;
    let quads = J / 4;
    assert!(J.is_multiple_of(4) && quads <= QUADS);
    let nb = xrb / BS;
    let abs = std::mem::size_of::<BlockQ8K>();
    let gbs = ROWS * BS;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && prep.len() >= J * nb * PREP);
    // SAFETY (this block and the loop): the caller's features; `prep` is checked by `prepare`
    // (and above), the group-blocks and activation blocks are inside `g` and `y` (asserted
    // here and by `prepare`).
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let ctl = [pair_control(0, 1), pair_control(2, 3), pair_control(4, 5), pair_control(6, 7)];
        // Per 64 values j, the words (m_2j, m_2j+1) in every i32 of a lane.
        let ctl_min = [min_control(0), min_control(1), min_control(2), min_control(3)];
        for (a, y) in y.iter().enumerate() {
            prepare_q4_k(y, nb, &mut prep[a * nb * PREP..(a + 1) * nb * PREP]);
        }
        let spread_d = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let spread_m = _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let base = g.as_ptr().add(c * ROWS * xrb);
            // Quad u, lane r, element a: row r against activation row 4u + a.
            let (mut acc, mut acc_min) = ([_mm512_setzero_ps(); QUADS], [_mm512_setzero_ps(); QUADS]);
            for i in 0..nb {
                let gb = base.add(i * gbs);
                // Weights ahead (`avx512_il::tiles_impl`).
                prefetch_ahead(gb, gbs);
                let yq: [*const i8; J] = std::array::from_fn(|a| y[a].as_ptr().add(i * abs + QS) as *const i8);
                let hd = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i)));
                let (dw, mw) = (_mm512_permutexvar_ps(spread_d, hd), _mm512_permutexvar_ps(spread_m, hd));
                // Per quad: the activation rows' pair sums, transposed (ps[u][j] element a =
                // act 4u + a's (pair 2j, pair 2j + 1) as two i16), and `d·d_y`, `dmin·d_y`.
                let mut ps = [[_mm_setzero_si128(); 4]; QUADS];
                let (mut d, mut dmin) = ([_mm512_setzero_ps(); QUADS], [_mm512_setzero_ps(); QUADS]);
                for u in 0..quads {
                    let p: [*const i32; 4] = [0, 1, 2, 3].map(|a| prep.as_ptr().add(((4 * u + a) * nb + i) * PREP));
                    let x = [_mm_loadu_si128(p[0] as *const __m128i), _mm_loadu_si128(p[1] as *const __m128i), _mm_loadu_si128(p[2] as *const __m128i), _mm_loadu_si128(p[3] as *const __m128i)];
                    let (l01, h01) = (_mm_unpacklo_epi32(x[0], x[1]), _mm_unpackhi_epi32(x[0], x[1]));
                    let (l23, h23) = (_mm_unpacklo_epi32(x[2], x[3]), _mm_unpackhi_epi32(x[2], x[3]));
                    ps[u] = [_mm_unpacklo_epi64(l01, l23), _mm_unpackhi_epi64(l01, l23), _mm_unpacklo_epi64(h01, h23), _mm_unpackhi_epi64(h01, h23)];
                    let dy = _mm512_broadcast_f32x4(_mm_setr_ps(*(p[0].add(4) as *const f32), *(p[1].add(4) as *const f32), *(p[2].add(4) as *const f32), *(p[3].add(4) as *const f32)));
                    (d[u], dmin[u]) = (_mm512_mul_ps(dw, dy), _mm512_mul_ps(mw, dy));
                }
                let sm = scales(gb);
                for j in 0..4 {
                    let q0 = _mm512_loadu_si512(gb.add(64 + 128 * j) as *const _);
                    let q1 = _mm512_loadu_si512(gb.add(128 + 128 * j) as *const _);
                    let (l0, l1) = (_mm512_and_si512(q0, m4), _mm512_and_si512(q1, m4));
                    let (h0, h1) = (_mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4));
                    let sc = _mm512_shuffle_epi8(sm, ctl[j]);
                    let scm = _mm512_shuffle_epi8(sm, ctl_min[j]);
                    for u in 0..quads {
                        let mut part = [_mm512_setzero_si512(); 4];
                        for (a, part) in part.iter_mut().enumerate() {
                            let q = yq[4 * u + a].add(64 * j);
                            let da = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), l0, bcast(q)), l1, bcast(q.add(16)));
                            let db = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), h0, bcast(q.add(32))), h1, bcast(q.add(48)));
                            *part = _mm512_madd_epi16(_mm512_packs_epi32(da, db), sc);
                        }
                        // Lane r: [Σ part0, Σ part1, Σ part2, Σ part3] of row r's four i32.
                        let t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(part[0], part[1]), _mm512_unpackhi_epi32(part[0], part[1]));
                        let t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(part[2], part[3]), _mm512_unpackhi_epi32(part[2], part[3]));
                        let sumi = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
                        let summ = _mm512_madd_epi16(scm, _mm512_broadcast_i32x4(ps[u][j]));
                        acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), d[u], acc[u]);
                        acc_min[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(summ), dmin[u], acc_min[u]);
                    }
                }
            }
            for u in 0..quads {
                let mut v = [0f32; 16];
                _mm512_storeu_ps(v.as_mut_ptr(), _mm512_sub_ps(acc[u], acc_min[u]));
                for (r, o) in o.iter_mut().enumerate() {
                    o[4 * u..4 * u + 4].copy_from_slice(&v[4 * r..4 * r + 4]);
                }
            }
        }
    }
}

/// `vpshufb` control putting the min words `(m_2j, m_2j+1)` (bytes `8 + 2j`, `9 + 2j` of a
/// lane of [`scales`]) into every i32 of the lane.
///
/// # Safety
/// AVX-512 F present (inlined into the kernel).
#[inline(always)]
unsafe fn min_control(j: i8) -> __m512i {
    let (a, b, z) = (8 + 2 * j, 9 + 2 * j, -128i8);
    _mm512_broadcast_i32x4(_mm_setr_epi8(a, z, b, z, a, z, b, z, a, z, b, z, a, z, b, z))
}

/// [`tiles_q4_k`] for eight activation rows, in one pass. `prep`: scratch of at least
/// `8 · xrb / 144 · 8` i32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles8_q4_k(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: features enabled above.
    unsafe { q4_k_tiles::<8>(g, xrb, y, out, prep) }
}

/// Decode's GEMV on interleaved IQ4_XS rows: `out[c]` = `avx2_ext::dot_iq4_xs_q8_k(row c, y)`,
/// bit for bit. That kernel keeps eight i32 lanes per row and super-block like Q6_K's (lanes
/// 0‥3: values 4L‥4L+4 of each sub-block's first 16 times its scale, lanes 4‥7 the same of its
/// last 16), then `acc = fma(d·d_y, lanes, acc)` and `hsum_f32x8(acc)`. Here one 64-byte load
/// holds a sub-block's nibbles of the four rows (lane r: row r): the low nibbles give the rows'
/// lanes 0‥3, the high ones lanes 4‥7, looked up in the grid with `vpshufb` and multiplied as
/// `maddubs(|x|, ±y)` (the sign of x applied to y by a masked subtraction; pair sums fit i16),
/// then scaled and added by one `vpdpwssd` with the rows' scales.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn rows_iq4_xs(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], _prep: &mut [i32]) {
    // SAFETY: `[f32; 1]` has the layout of `f32`; the slice covers the same elements.
    let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut [f32; 1], out.len()) };
    // SAFETY: features enabled above.
    unsafe { iq4_xs_groups::<1>(g, xrb, [y], out) }
}

/// Prefill's tiles on interleaved IQ4_XS rows: `out[c][j]` = `dot_iq4_xs_q8_k(row c, y[j])`,
/// bit for bit, each sub-block's values decoded once for the four activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_iq4_xs(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], _prep: &mut [i32]) {
    // SAFETY: features enabled above.
    unsafe { iq4_xs_groups::<4>(g, xrb, y, out) }
}

/// [`tiles_iq4_xs`] for `J` (2 or 3) activation rows: a short batch's rows past its groups of
/// four.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_few_iq4_xs<const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], _prep: &mut [i32]) {
    // SAFETY: features enabled above.
    unsafe { iq4_xs_groups::<J>(g, xrb, y, out) }
}

/// [`tiles_iq4_xs`] for eight activation rows in one pass: each group-block's nibbles looked up
/// once for all eight (Qwen2.5 re-quantized to IQ4_XS, pp512: 857–864 → 815–817 ms per pass).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles8_iq4_xs(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], _prep: &mut [i32]) {
    // SAFETY: features enabled above.
    unsafe { iq4_xs_groups::<8>(g, xrb, y, out) }
}

/// The IQ4_XS kernels for `J` activation rows (1: the GEMV).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present.
#[inline(always)]
unsafe fn iq4_xs_groups<const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]]) {
    const BSX: usize = 136;
    let nb = xrb / BSX;
    let abs = std::mem::size_of::<BlockQ8K>();
    let gbs = ROWS * BSX;
    assert!(out.len().is_multiple_of(ROWS) && g.len() >= out.len() * xrb && y.iter().all(|y| y.len() >= nb * abs));
    let m4 = _mm512_set1_epi8(0x0F);
    // SAFETY (this block and the loop): the caller's features; the group-blocks and
    // activation blocks are inside `g` and `y` (asserted).
    unsafe {
        let table = iq4_grid512();
        // Scales: vector k's 128-bit lane e holds sub-block 4k + e's scales of rows 0‥3 (i32);
        // `pick[e]` spreads that lane's row r into every i16 of lane r.
        let (shift_l, shift_h) = (_mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12), _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6));
        let mut pick = [_mm512_setzero_si512(); 4];
        for (e, pick) in pick.iter_mut().enumerate() {
            let idx: [i16; 32] = std::array::from_fn(|w| (8 * e + 2 * (w / 8)) as i16);
            *pick = _mm512_loadu_si512(idx.as_ptr() as *const _);
        }
        let (m_lo, m_hi, k32) = (_mm512_set1_epi32(0x0F), _mm512_set1_epi32(0x30), _mm512_set1_epi32(32));
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            let base = g.as_ptr().add(c * ROWS * xrb);
            let mut acc = [[_mm512_setzero_ps(); 2]; J];
            for i in 0..nb {
                let gb = base.add(i * gbs);
                // Weights ahead: every read of a GEMV, and a short batch's first of each column
                // block (`avx512_il::tiles_impl`).
                prefetch_ahead(gb, gbs);
                let yb: [*const u8; J] = std::array::from_fn(|j| y[j].as_ptr().add(i * abs));
                let sl = _mm512_broadcast_i32x4(_mm_loadu_si128(gb.add(16) as *const __m128i));
                let sh = _mm512_broadcast_i32x4(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64(gb.add(8) as *const __m128i)), 4));
                let mut sv = [_mm512_setzero_si512(); 2];
                for (k, sv) in sv.iter_mut().enumerate() {
                    // Sub-block b = 4k + e: its low bits at 4b of `scales_l`, its high bits at 2b
                    // (+ 4) of `sh`.
                    let lo = _mm512_srlv_epi32(sl, _mm512_add_epi32(shift_l, _mm512_set1_epi32(16 * k as i32)));
                    let hi = _mm512_and_si512(_mm512_srlv_epi32(sh, _mm512_add_epi32(shift_h, _mm512_set1_epi32(8 * k as i32))), m_hi);
                    *sv = _mm512_sub_epi32(_mm512_ternarylogic_epi32::<0xEA>(lo, m_lo, hi), k32);
                }
                let mut sumi = [[_mm512_setzero_si512(); 2]; J];
                for s in 0..8 {
                    let q = _mm512_loadu_si512(gb.add(32 + 64 * s) as *const _);
                    let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(q, m4));
                    let hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
                    let (nl, nh) = (_mm512_movepi8_mask(lo), _mm512_movepi8_mask(hi));
                    let (alo, ahi) = (_mm512_abs_epi8(lo), _mm512_abs_epi8(hi));
                    let sc = _mm512_permutexvar_epi16(pick[s % 4], sv[s / 4]);
                    let zero = _mm512_setzero_si512();
                    for j in 0..J {
                        let yq = yb[j].add(QS + 32 * s) as *const i8;
                        let (yl, yh) = (bcast(yq), bcast(yq.add(16)));
                        let pl = _mm512_maddubs_epi16(alo, _mm512_mask_sub_epi8(yl, nl, zero, yl));
                        let ph = _mm512_maddubs_epi16(ahi, _mm512_mask_sub_epi8(yh, nh, zero, yh));
                        sumi[j][0] = _mm512_dpwssd_epi32(sumi[j][0], pl, sc);
                        sumi[j][1] = _mm512_dpwssd_epi32(sumi[j][1], ph, sc);
                    }
                }
                scale_block(gb, &yb, &sumi, &mut acc);
            }
            store_rows(&acc, o);
        }
    }
}
