//! NEON super-block kernels on interleaved weights (`matmul::layout`): one group (four rows) of
//! Q4_K, Q6_K or IQ4_XS against one Q8_K activation row, for `neon_il`'s GEMV and tiles.
//!
//! Every row's value is the plain NEON dot's (`neon::q4_k`, `q6_k`, `iq4_xs`) bit for bit: the
//! integer sums are exact, so only their float steps have to match, and those are the plain
//! dot's, lane by lane.
//!
//! - **Q4_K** runs the four rows side by side: the scales and mins of the four rows are decoded
//!   together (byte `4r + t` of a decoded vector is row r's sub-block t), each 32-value sum of
//!   a row stays an `int32x4_t` until the four rows' sums fold into one vector (lane r: row r,
//!   two `addp`), and `Σ sc·s`, `Σ m·bsums` and the FMAs of `portable::dot_q4_k_q8_k` (tile
//!   order: `dot_q4_k_q8_k_tile`) run on that vector — one operation for four rows where the
//!   plain body spends a reduction, a scalar multiply-add and a scalar scale decode per row.
//! - **Q6_K and IQ4_XS** keep eight float lanes per row (ggml's AVX2 order), so each row runs
//!   the plain body (`neon::q6_k_block`, `iq4_xs_block`) on its pieces; what the four rows
//!   share is done once: `d_r·d_y` for the four rows in one product, and IQ4_XS's 6-bit scales
//!   of all four rows decoded in a dozen vector operations.
#![allow(clippy::missing_safety_doc)]

use super::neon::{iq4_xs_block, kind, lanes_fma, q6_k_block, widen_scales, Dot4};
use crate::matmul::layout::ROWS;
use crate::quant::blocks::*;
use crate::simd::aarch64::load_f16x4;
use std::arch::aarch64::*;
use std::mem::size_of;

/// `tbl` indices (into two registers) taking byte `16·(j / 4) + 4r + j % 4` into lane r,
/// zero-extended: entry j of each row in a decoded scale pair ([`q4_k_scales4`]).
const COLUMN: [[u8; 16]; 8] = {
    let mut idx = [[0xFF; 16]; 8];
    let mut j = 0;
    while j < 8 {
        let mut r = 0;
        while r < 4 {
            idx[j][4 * r] = (16 * (j / 4) + 4 * r + j % 4) as u8;
            r += 1;
        }
        j += 1;
    }
    idx
};

/// Lane r: row r's entry j (< 8) of a decoded scale pair, as an i32.
#[inline(always)]
unsafe fn column(v: uint8x16x2_t, j: usize) -> int32x4_t {
    // SAFETY: NEON present (the caller's contract); `COLUMN[j]` is 16 bytes.
    unsafe { vreinterpretq_s32_u8(vqtbl2q_u8(v, vld1q_u8(COLUMN[j].as_ptr()))) }
}

/// The four rows' Q4_K scales and mins (`scale_min_k4`, four rows at once) from the group-block's
/// three scale runs (run w: word w of each row's 12 scale bytes, row r at `4r`): `(sc, m)`,
/// where byte `4r + t` of `.0` is row r's sub-block t and of `.1` its sub-block 4 + t.
///
/// # Safety
/// NEON present; a whole Q4_K group-block at `gb`.
#[inline(always)]
unsafe fn q4_k_scales4(gb: *const u8) -> (uint8x16x2_t, uint8x16x2_t) {
    // SAFETY: the runs are bytes 16‥64 of the group-block (`matmul::layout`).
    unsafe {
        let (r0, r1, r2) = (vld1q_u8(gb.add(16)), vld1q_u8(gb.add(32)), vld1q_u8(gb.add(48)));
        let (m6, m4) = (vdupq_n_u8(63), vdupq_n_u8(0x0F));
        // Sub-blocks 0‥4: the low six bits of runs 0 (scales) and 1 (mins); 4‥8: a nibble of
        // run 2 with the top two bits of run 0 (scales) or run 1 (mins) above it.
        let sc = uint8x16x2_t(vandq_u8(r0, m6), vorrq_u8(vandq_u8(r2, m4), vshlq_n_u8::<4>(vshrq_n_u8::<6>(r0))));
        let m = uint8x16x2_t(vandq_u8(r1, m6), vorrq_u8(vshrq_n_u8::<4>(r2), vshlq_n_u8::<4>(vshrq_n_u8::<6>(r1))));
        (sc, m)
    }
}

/// The four rows of a Q4_K group (`nb` group-blocks at `g`) against `y`, side by side: lane r
/// is row r's `portable::dot_q4_k_q8_k` (`TILE`: `dot_q4_k_q8_k_tile`).
///
/// # Safety
/// NEON (and what `D` names) present; a whole group at `g`; `y` has `nb` blocks.
#[inline(always)]
unsafe fn q4_k_rows4<D: Dot4, const TILE: bool>(g: *const u8, nb: usize, y: &[BlockQ8K]) -> [f32; ROWS] {
    let gbs = ROWS * size_of::<BlockQ4K>();
    // SAFETY: the caller's contract; the offsets are the layout's (`matmul::layout`): F16 d and
    // dmin of the four rows at 0 and 8, the scale runs at 16‥64, then piece p of the quants
    // (16 bytes of each row, row r at 16r) at 64 + 64p.
    unsafe {
        let m4 = vdupq_n_u8(0x0F);
        let (mut acc, mut acc_min) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        for (i, b) in y[..nb].iter().enumerate() {
            let gb = g.add(i * gbs);
            let d = vmulq_n_f32(load_f16x4(gb as *const half::f16), b.d);
            let dmin = vmulq_n_f32(load_f16x4(gb.add(8) as *const half::f16), b.d);
            let (sc, mn) = q4_k_scales4(gb);
            // `bs[j]`: sub-block j's `bsums[2j] + bsums[2j + 1]` (|·| ≤ 2·16·128: exact in i16).
            let bs16 = vpaddq_s16(vld1q_s16(b.bsums.as_ptr()), vld1q_s16(b.bsums.as_ptr().add(8)));
            let mut bs = [0i32; 8];
            vst1q_s32(bs.as_mut_ptr(), vmovl_s16(vget_low_s16(bs16)));
            vst1q_s32(bs.as_mut_ptr().add(4), vmovl_high_s16(bs16));
            let (mut sumi, mut summ) = (vdupq_n_s32(0), vdupq_n_s32(0));
            for p in 0..QK_K / 64 {
                let yq = b.qs.as_ptr().add(64 * p);
                let yv = [vld1q_s8(yq), vld1q_s8(yq.add(16)), vld1q_s8(yq.add(32)), vld1q_s8(yq.add(48))];
                // s[h][r]: row r's lane sums of sub-block 2p + h (low nibbles of pieces 2p and
                // 2p + 1 for h = 0, high nibbles for h = 1).
                let mut s = [[vdupq_n_s32(0); ROWS]; 2];
                for r in 0..ROWS {
                    let q0 = vld1q_u8(gb.add(64 + 128 * p + 16 * r));
                    let q1 = vld1q_u8(gb.add(128 + 128 * p + 16 * r));
                    let lo = |q: uint8x16_t| vreinterpretq_s8_u8(vandq_u8(q, m4));
                    let hi = |q: uint8x16_t| vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
                    s[0][r] = D::dot4_add(D::dot4(lo(q0), yv[0]), lo(q1), yv[1]);
                    s[1][r] = D::dot4_add(D::dot4(hi(q0), yv[2]), hi(q1), yv[3]);
                }
                for (h, s) in s.iter().enumerate() {
                    let j = 2 * p + h;
                    // Lane r: row r's 32-value sum.
                    let rows = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
                    sumi = vmlaq_s32(sumi, rows, column(sc, j));
                    summ = vmlaq_s32(summ, column(mn, j), vld1q_dup_s32(&bs[j]));
                }
                if TILE {
                    acc = vfmaq_f32(acc, vcvtq_f32_s32(sumi), d);
                    acc_min = vfmaq_f32(acc_min, vcvtq_f32_s32(summ), dmin);
                    (sumi, summ) = (vdupq_n_s32(0), vdupq_n_s32(0));
                }
            }
            if !TILE {
                acc = vfmaq_f32(acc, vcvtq_f32_s32(sumi), d);
                acc_min = vfmaq_f32(acc_min, vcvtq_f32_s32(summ), dmin);
            }
        }
        let mut out = [0f32; ROWS];
        vst1q_f32(out.as_mut_ptr(), vsubq_f32(acc, acc_min));
        out
    }
}

/// The four rows' IQ4_XS scales of one group-block (`iq4_xs_scales_of`, four rows at once):
/// `[rows 0, 1; rows 2, 3]`, row `2q + e`'s eight scales at bytes `8e‥8e + 8` of `[q]`.
///
/// # Safety
/// NEON present; a whole IQ4_XS group-block at `gb`.
#[inline(always)]
unsafe fn iq4_xs_scales4(gb: *const u8) -> [int8x16_t; 2] {
    // SAFETY: the layout's offsets: each row's `scales_h` (u16) at 8 + 2r, its four
    // `scales_l` bytes at 16 + 4r.
    unsafe {
        // Low nibbles: byte i of `scales_l` holds sub-blocks 2i (low) and 2i + 1 (high).
        let l = vld1q_u8(gb.add(16));
        let (lo, hi) = (vandq_u8(l, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(l));
        let nib = [vzip1q_u8(lo, hi), vzip2q_u8(lo, hi)];
        // High bits: sub-block ib's pair at bits 2ib of `scales_h`, i.e. bits 2(ib % 4) of its
        // byte ib / 4; each byte is spread over four bytes and shifted to bits 4, 5.
        let h = vcombine_u8(vld1_u8(gb.add(8)), vdup_n_u8(0));
        let spread: [[u8; 16]; 2] = [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3], [4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7]];
        let shift = vld1q_s8([4, 2, 0, -2, 4, 2, 0, -2, 4, 2, 0, -2, 4, 2, 0, -2].as_ptr());
        let m30 = vdupq_n_u8(0x30);
        let mut out = [vdupq_n_s8(0); 2];
        for (q, o) in out.iter_mut().enumerate() {
            let hb = vandq_u8(vshlq_u8(vqtbl1q_u8(h, vld1q_u8(spread[q].as_ptr())), shift), m30);
            *o = vreinterpretq_s8_u8(vsubq_u8(vorrq_u8(nib[q], hb), vdupq_n_u8(32)));
        }
        out
    }
}

/// The four rows' `d_r·d_y` (the group-block's F16 `d` at its start), one product.
#[inline(always)]
unsafe fn row_scales(gb: *const u8, dy: f32) -> [f32; ROWS] {
    let mut d = [0f32; ROWS];
    // SAFETY: NEON present (the caller's contract); four F16 values at `gb`.
    unsafe { vst1q_f32(d.as_mut_ptr(), vmulq_n_f32(load_f16x4(gb as *const half::f16), dy)) };
    d
}

/// The super-block group at `g` (`nb` group-blocks, its four rows) against one Q8_K activation
/// row: the plain dot of each row.
///
/// # Safety
/// NEON (and what `D` names) present; a whole group of kind `K` at `g`; `y` has `nb` blocks.
#[inline(always)]
pub(super) unsafe fn group_k<D: Dot4, const K: u8>(g: *const u8, nb: usize, y: &[BlockQ8K]) -> [f32; ROWS] {
    // SAFETY: the caller's contract; the offsets are the layout's (`matmul::layout`).
    unsafe {
        match K {
            kind::Q4_K => q4_k_rows4::<D, false>(g, nb, y),
            kind::Q4_K_TILE => q4_k_rows4::<D, true>(g, nb, y),
            kind::Q6_K => {
                let gbs = ROWS * size_of::<BlockQ6K>();
                let mut acc = [[vdupq_n_f32(0.0); 2]; ROWS];
                for (i, b) in y[..nb].iter().enumerate() {
                    let gb = g.add(i * gbs);
                    let d = row_scales(gb, b.d);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        // Row r's scales: 8 bytes at 8 + 8r, 8 more at 40 + 8r.
                        let sc = vcombine_s8(vld1_s8(gb.add(8 + 8 * r) as *const i8), vld1_s8(gb.add(40 + 8 * r) as *const i8));
                        let sumi = q6_k_block::<D>(|p| gb.add(72 + 64 * p + 16 * r), |p| gb.add(584 + 64 * p + 16 * r), sc, b);
                        lanes_fma(acc, sumi, d[r]);
                    }
                }
                acc.map(|a| super::neon::hsum8(a))
            }
            _ => {
                let gbs = ROWS * size_of::<BlockIQ4XS>();
                let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
                let mut acc = [[vdupq_n_f32(0.0); 2]; ROWS];
                for (i, b) in y[..nb].iter().enumerate() {
                    let gb = g.add(i * gbs);
                    let d = row_scales(gb, b.d);
                    // Row r's eight scales at bytes 8r‥8r + 8.
                    let mut sc = [0i8; 32];
                    let sc4 = iq4_xs_scales4(gb);
                    vst1q_s8(sc.as_mut_ptr(), sc4[0]);
                    vst1q_s8(sc.as_mut_ptr().add(16), sc4[1]);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let w = widen_scales(vld1_s8(sc.as_ptr().add(8 * r)));
                        lanes_fma(acc, iq4_xs_block::<D>(|p| gb.add(32 + 64 * p + 16 * r), w, table, b), d[r]);
                    }
                }
                acc.map(|a| super::neon::hsum8(a))
            }
        }
    }
}
