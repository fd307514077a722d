//! aarch64 twins of `gemm::panel_portable` (the panel GEMM of `--fast-prefill` on the NEON
//! tables), bit-identical to it: exact integer sums per block and half, then the same float
//! operations per lane in the same order. Lanes are the panel's 8 columns (two vectors of 4).
//!
//! - [`panel_i8mm`] (CPUs with the 8-bit matrix multiply extension, e.g. Neoverse V1/N2,
//!   Apple M2 and later): `usmmla` multiplies a 2×8 block of unsigned codes (two columns, eight
//!   values: two 4-value groups of the panel zipped together, one `zip1`/`zip2` per column pair,
//!   shared by every row) by an 8×2 block of signed activations (two rows, the same eight
//!   values) into a 2×2 tile of i32, 32 products per instruction; `uzp1`/`uzp2` turn the tiles
//!   back into rows × columns at the end of each block. Every type, Q8_0's codes up to 255
//!   included. A single leftover row is paired with itself.
//! - [`panel_dotprod`] (`sdot`): each row's four activations of a group replicated (`ld1r`)
//!   against the group's 32 code bytes, 4 products per lane. `sdot` is signed × signed: codes
//!   up to 127 as they are; Q8_0's (up to 255, its signed values plus 128) turned back into
//!   the signed values (`u ^ 0x80` = `u − 128`, one `eor` per 16 codes shared by every row)
//!   and multiplied without the offset, so the integer sums are the same exact numbers.
#![allow(clippy::missing_safety_doc)]

use super::panel::{act_block_with, Act, PanelJob, PACKED_BLOCK, PANEL};
use crate::simd::aarch64::from_f16_bits4;
use std::arch::aarch64::*;

/// F16 → f32 with `fcvtl` (exact, as `f16::to_f32`).
#[inline(always)]
fn h2f(h: half::f16) -> f32 {
    // SAFETY: NEON is a baseline feature of aarch64.
    unsafe { vgetq_lane_f32::<0>(from_f16_bits4(vdup_n_u16(h.to_bits()))) }
}

/// The panel kernel with `usmmla` (every supported type).
#[target_feature(enable = "dotprod,i8mm")]
pub fn panel_i8mm(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], store: impl FnMut(usize, &[f32; PANEL])) {
    // SAFETY: the features `panel_impl::<true>` uses are enabled here.
    unsafe { panel_impl::<true>(job, acc0, store) }
}

/// The panel kernel with `sdot` (every supported type; Q8_0 on its signed values).
#[target_feature(enable = "dotprod")]
pub fn panel_dotprod(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], store: impl FnMut(usize, &[f32; PANEL])) {
    // Codes above 127 (Q8_0's, offset 128) go through `sdot` as `code − 128`: then no offset.
    let job = if job.umax > 127 {
        assert!(job.o == 128 && !job.split, "codes above 127 are Q8_0's, offset 128");
        PanelJob { o: 0, ..job }
    } else {
        job
    };
    // SAFETY: the features `panel_impl::<false>` uses are enabled here.
    unsafe { panel_impl::<false>(job, acc0, store) }
}

/// # Safety
/// `dotprod` present, and with `MMLA` `i8mm`.
#[inline(always)]
unsafe fn panel_impl<const MMLA: bool>(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], mut store: impl FnMut(usize, &[f32; PANEL])) {
    let PanelJob { panel, nb, b1, x, xrb, split, rows, mr, .. } = job;
    assert!(panel.len() >= nb * PACKED_BLOCK && b1 <= nb && x.len() >= rows * xrb);
    // One instance per register tile height of `schedule::PANEL_MR` (split and unsplit apart,
    // as on x86); the rows left over go one at a time (`usmmla`: as a pair of the row with
    // itself, its copy not stored). A plain loop, not a closure: a closure would not inherit
    // this function's target features.
    let (acc0, store) = (&acc0, &mut store);
    let mut r = 0;
    // Heights 8, 6, 4, 2 (`PANEL_MR`'s even ones; another `mr` rounds down to one), else 1.
    let mr = match mr {
        8.. => 8,
        6 | 7 => 6,
        4 | 5 => 4,
        2 | 3 => 2,
        _ => 1,
    };
    while r < rows {
        let h = if r + mr <= rows { mr } else { 1 };
        // SAFETY (every arm): the caller's features.
        unsafe {
            match (h, split) {
                (8, false) => rows_block::<8, false, MMLA>(job, r, h, acc0, store),
                (8, true) => rows_block::<8, true, MMLA>(job, r, h, acc0, store),
                (6, false) => rows_block::<6, false, MMLA>(job, r, h, acc0, store),
                (6, true) => rows_block::<6, true, MMLA>(job, r, h, acc0, store),
                (4, false) => rows_block::<4, false, MMLA>(job, r, h, acc0, store),
                (4, true) => rows_block::<4, true, MMLA>(job, r, h, acc0, store),
                (_, false) => rows_block::<2, false, MMLA>(job, r, h, acc0, store),
                (_, true) => rows_block::<2, true, MMLA>(job, r, h, acc0, store),
            }
        }
        r += h;
    }
}

/// Rows `r0 .. r0 + n` (n ≤ R; R even; the rows past `n` repeat the last one and are not
/// stored) against the panel.
///
/// # Safety
/// As [`panel_impl`].
#[inline(always)]
unsafe fn rows_block<const R: usize, const SPLIT: bool, const MMLA: bool>(
    job: PanelJob,
    r0: usize,
    n: usize,
    acc0: &impl Fn(usize) -> [f32; PANEL],
    store: &mut impl FnMut(usize, &[f32; PANEL]),
) {
    let PanelJob { panel, nb, b0, b1, o, act, x, xrb, ysum, umax, .. } = job;
    // `sdot`'s codes: Q8_0's turned signed (`panel_dotprod`), the others as they are.
    let flip = vdupq_n_u8(if !MMLA && umax > 127 { 0x80 } else { 0 });
    let row_of = |j: usize| r0 + j.min(n - 1);
    let rows: [&[u8]; R] = std::array::from_fn(|j| &x[row_of(j) * xrb..(row_of(j) + 1) * xrb]);
    // SAFETY: the caller's features (NEON, `dotprod`, with `MMLA` `i8mm`); every load is inside
    // a packed block (PACKED_BLOCK bytes) or an activation block (32 values).
    unsafe {
        let mut accf = [[vdupq_n_f32(0.0); 2]; R];
        for (j, a) in accf.iter_mut().enumerate() {
            let v = acc0(row_of(j));
            *a = [vld1q_f32(v.as_ptr()), vld1q_f32(v.as_ptr().add(4))];
        }
        for b in b0..b1 {
            let blk = panel.as_ptr().add(b * PACKED_BLOCK);
            let mut acts: [(f32, f32, &[i8; 32]); R] = [(0.0, 0.0, &[0; 32]); R];
            for (a, row) in acts.iter_mut().zip(rows) {
                *a = act_block_with(row, b, act, h2f);
            }
            // Integer sums of the two 16-value halves (groups 0..4, 4..8) kept apart; lanes:
            // columns 0..4, 4..8.
            let mut acci = [[[vdupq_n_s32(0); 2]; R]; 2];
            if MMLA {
                mmla_block::<R, SPLIT>(blk, &acts, &mut acci);
            } else {
                for g in 0..8 {
                    let ld = |at: usize| vreinterpretq_s8_u8(veorq_u8(vld1q_u8(blk.add(at)), flip));
                    let w = (ld(32 * g), ld(32 * g + 16));
                    let h = if SPLIT { g / 4 } else { 0 };
                    for j in 0..R {
                        let y = vreinterpretq_s8_s32(vdupq_n_s32((acts[j].2.as_ptr().add(4 * g) as *const i32).read_unaligned()));
                        acci[h][j] = [sdot(acci[h][j][0], w.0, y), sdot(acci[h][j][1], w.1, y)];
                    }
                }
            }
            let (dw, mw) = ([vld1q_f32(blk.add(256) as *const f32), vld1q_f32(blk.add(272) as *const f32)], [vld1q_f32(blk.add(288) as *const f32), vld1q_f32(blk.add(304) as *const f32)]);
            for j in 0..R {
                let ys = &ysum[(row_of(j) * nb + b) * 2..(row_of(j) * nb + b) * 2 + 2];
                let (dx, sx, _) = acts[j];
                for c in 0..2 {
                    if SPLIT {
                        let lo = vsubq_s32(acci[0][j][c], vdupq_n_s32(o * ys[0]));
                        let hi = vsubq_s32(acci[1][j][c], vdupq_n_s32(o * ys[1]));
                        accf[j][c] = vfmaq_f32(accf[j][c], vcvtq_f32_s32(lo), vmulq_n_f32(dw[c], dx));
                        accf[j][c] = vfmaq_f32(accf[j][c], vcvtq_f32_s32(hi), vmulq_n_f32(mw[c], dx));
                        continue;
                    }
                    let s = vsubq_s32(vaddq_s32(acci[0][j][c], acci[1][j][c]), vdupq_n_s32(o * (ys[0] + ys[1])));
                    accf[j][c] = vfmaq_f32(accf[j][c], vcvtq_f32_s32(s), vmulq_n_f32(dw[c], dx));
                    if act != Act::Q8_0 {
                        accf[j][c] = vfmaq_f32(accf[j][c], mw[c], vdupq_n_f32(sx));
                    }
                }
            }
        }
        for (j, a) in accf.iter().enumerate().take(n) {
            let mut out = [0f32; PANEL];
            vst1q_f32(out.as_mut_ptr(), a[0]);
            vst1q_f32(out.as_mut_ptr().add(4), a[1]);
            store(r0 + j, &out);
        }
    }
}

/// `acc + Σ_{k<4} w[4i+k]·y[4i+k]` per lane i (signed bytes).
///
/// # Safety
/// `dotprod` present.
#[inline(always)]
unsafe fn sdot(acc: int32x4_t, w: int8x16_t, y: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only; the enclosing function enables `dotprod` (the caller's contract).
    unsafe { std::arch::asm!("sdot {acc:v}.4s, {w:v}.16b, {y:v}.16b", acc = inout(vreg) acc, w = in(vreg) w, y = in(vreg) y, options(pure, nomem, nostack)) };
    acc
}

/// `acc + A·Bᵀ` for the 2×8 unsigned `a` (row i: bytes 8i‥8i+8) and the 2×8 signed `b`:
/// lanes `[a0·b0, a0·b1, a1·b0, a1·b1]`.
///
/// # Safety
/// `i8mm` present.
#[inline(always)]
unsafe fn usmmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only; the enclosing function enables `i8mm` (the caller's contract).
    unsafe { std::arch::asm!("usmmla {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b, options(pure, nomem, nostack)) };
    acc
}

/// One packed block's integer sums for R rows with `usmmla`: per pair of groups (eight
/// values), the four column pairs' codes zipped once, each row pair's activations combined
/// once; the 2×2 tiles back to rows × columns at the end.
///
/// # Safety
/// `i8mm` present; a whole packed block at `blk`.
#[inline(always)]
unsafe fn mmla_block<const R: usize, const SPLIT: bool>(blk: *const u8, acts: &[(f32, f32, &[i8; 32]); R], acci: &mut [[[int32x4_t; 2]; R]; 2]) {
    // SAFETY: the caller's contract; loads inside the block and the activation blocks.
    unsafe {
        // tiles[h][pair][cp]: rows (2·pair, 2·pair + 1) × columns (2·cp, 2·cp + 1).
        let mut tiles = [[[vdupq_n_s32(0); 4]; R]; 2];
        for gp in 0..4 {
            let ld = |g: usize, half: usize| vreinterpretq_s32_u8(vld1q_u8(blk.add(32 * g + 16 * half)));
            let (lo0, lo1, hi0, hi1) = (ld(2 * gp, 0), ld(2 * gp + 1, 0), ld(2 * gp, 1), ld(2 * gp + 1, 1));
            // Column pair cp's eight codes each: [c 4g‥4g+4, c 4g+4‥4g+8] for both columns.
            let w = [vzip1q_s32(lo0, lo1), vzip2q_s32(lo0, lo1), vzip1q_s32(hi0, hi1), vzip2q_s32(hi0, hi1)].map(|v| vreinterpretq_s8_s32(v));
            let h = if SPLIT { gp / 2 } else { 0 };
            for pair in 0..R / 2 {
                // Rows 2·pair, 2·pair + 1: their values 8gp‥8gp+8, one row per 64-bit half.
                let (ya, yb) = (vld1_s8(acts[2 * pair].2.as_ptr().add(8 * gp)), vld1_s8(acts[2 * pair + 1].2.as_ptr().add(8 * gp)));
                let y = vcombine_s8(ya, yb);
                for cp in 0..4 {
                    tiles[h][pair][cp] = usmmla(tiles[h][pair][cp], w[cp], y);
                }
            }
        }
        // A tile's lanes: [c0·r0, c0·r1, c1·r0, c1·r1] → row r0's columns from the even lanes
        // of two tiles, r1's from the odd ones.
        for h in 0..if SPLIT { 2 } else { 1 } {
            for pair in 0..R / 2 {
                let t = &tiles[h][pair];
                acci[h][2 * pair] = [vuzp1q_s32(t[0], t[1]), vuzp1q_s32(t[2], t[3])];
                acci[h][2 * pair + 1] = [vuzp2q_s32(t[0], t[1]), vuzp2q_s32(t[2], t[3])];
            }
        }
    }
}
