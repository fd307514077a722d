//! NEON dot products of MXFP4 (gpt-oss) against Q8_0 in ggml's AVX2 order
//! (`matmul::lanes::dot_mxfp4_q8_0`), bit for bit: one weight row against one activation row
//! (`vec_dot`), against four (`vec_dot4`, prefill), and many weight rows against one (decode's
//! GEMV, `vec_dot_rows`).
//!
//! Per 32-value block the nibbles are looked up in the doubled E2M1 grid (`tbl`), lanes 0‥3
//! from values 0‥16 and 4‥7 from 16‥32 through [`Dot4`] (`sdot`, or widening multiplies: the
//! same exact integers), times `d_y · e8m0_half(e)` by one fused multiply-add per lane. Blocks
//! go in pairs, the first of each pair into one set of eight lanes and the second into
//! another; the two sets are added lane by lane and summed in `hsum_f32x8`'s order, and an odd
//! last block is added as one float — the x86 kernels' order, so an ARM machine gives their
//! values.
#![allow(clippy::missing_safety_doc)]

use super::neon::{block_loaded, hsum8, nibbles, Dot4, Sdot, Widen};
use crate::quant::blocks::*;
use crate::simd::{prefetch_lines, CacheLevel, STREAM_AHEAD};
use std::arch::aarch64::*;

/// Eight lanes as two `float32x4_t` (lanes 0‥3, 4‥7).
type Lanes = [float32x4_t; 2];

/// One block's doubled values as two `int8x16_t` (values 0‥16, 16‥32).
#[inline(always)]
unsafe fn values(table: int8x16_t, a: &BlockMXFP4) -> (int8x16_t, int8x16_t) {
    // SAFETY: NEON present (the caller's contract); `qs` is 16 bytes.
    unsafe {
        let (lo, hi) = nibbles(&a.qs);
        (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi))
    }
}

/// The two halves of an activation block.
#[inline(always)]
unsafe fn halves(b: &BlockQ8_0) -> (int8x16_t, int8x16_t) {
    // SAFETY: NEON present (the caller's contract); `qs` is 32 bytes.
    unsafe { (vld1q_s8(b.qs.as_ptr()), vld1q_s8(b.qs.as_ptr().add(16))) }
}

/// The dot from a row's two sets of lanes and its odd last block, if any (as one float).
#[inline(always)]
unsafe fn finish(acc: &[Lanes; 2], last: Option<(&BlockMXFP4, &BlockQ8_0)>) -> f32 {
    // SAFETY: NEON present (the caller's contract).
    let s = unsafe { hsum8([vaddq_f32(acc[0][0], acc[1][0]), vaddq_f32(acc[0][1], acc[1][1])]) };
    last.map_or(s, |(a, b)| s + crate::matmul::lanes::mxfp4_odd_block(a, b))
}

/// One weight row against `R` activation rows, each as alone.
#[inline(always)]
unsafe fn rows<D: Dot4, const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    let a = as_blocks::<BlockMXFP4>(x);
    let ys: [&[BlockQ8_0]; R] = ys.map(as_blocks::<BlockQ8_0>);
    let pairs = a.len() / 2;
    // SAFETY: NEON present (the caller's contract); the grid is 16 bytes.
    unsafe {
        let table = vld1q_s8(KVALUES_MXFP4.as_ptr());
        let mut acc = [[[vdupq_n_f32(0.0); 2]; 2]; R];
        for (i, blk) in a[..2 * pairs].iter().enumerate() {
            let w = values(table, blk);
            let dw = e8m0_half(blk.e);
            for (y, acc) in ys.iter().zip(acc.iter_mut()) {
                block_loaded::<D>(&mut acc[i & 1], y[i].d.to_f32() * dw, w, halves(&y[i]));
            }
        }
        for ((o, y), acc) in out.iter_mut().zip(&ys).zip(&acc) {
            *o = finish(acc, a.get(2 * pairs).zip(y.get(2 * pairs)));
        }
    }
}

/// Decode's GEMV: `out[c]` is row `c`'s dot (rows of `xrb` bytes) against `y`, bit for bit —
/// four rows a pass sharing each activation block's loads, each row's lanes as alone —, the
/// rows [`STREAM_AHEAD`] bytes on asked for into L1 as it goes.
#[inline(always)]
unsafe fn many<D: Dot4>(x: &[u8], xrb: usize, y: &[u8], out: &mut [f32]) {
    let nb = xrb / std::mem::size_of::<BlockMXFP4>();
    let b = &as_blocks::<BlockQ8_0>(y)[..nb];
    let pairs = nb / 2;
    let full = out.len() / 4 * 4;
    // SAFETY: NEON present (the caller's contract); the grid is 16 bytes.
    unsafe {
        let table = vld1q_s8(KVALUES_MXFP4.as_ptr());
        for (c, o) in out[..full].chunks_exact_mut(4).enumerate() {
            let w = &x[4 * c * xrb..4 * (c + 1) * xrb];
            let a: [&[BlockMXFP4]; 4] = std::array::from_fn(|r| &as_blocks::<BlockMXFP4>(&w[r * xrb..(r + 1) * xrb])[..nb]);
            prefetch_lines(w.as_ptr().wrapping_add(STREAM_AHEAD), 4 * xrb, CacheLevel::L1);
            let mut acc = [[[vdupq_n_f32(0.0); 2]; 2]; 4];
            for (i, blk) in b[..2 * pairs].iter().enumerate() {
                let qy = halves(blk);
                let dy = blk.d.to_f32();
                for (row, acc) in a.iter().zip(acc.iter_mut()) {
                    block_loaded::<D>(&mut acc[i & 1], dy * e8m0_half(row[i].e), values(table, &row[i]), qy);
                }
            }
            for ((v, row), acc) in o.iter_mut().zip(&a).zip(&acc) {
                *v = finish(acc, row.get(2 * pairs).zip(b.get(2 * pairs)));
            }
        }
        for (c, v) in out.iter_mut().enumerate().skip(full) {
            let mut one = [0f32];
            rows::<D, 1>(&x[c * xrb..(c + 1) * xrb], [y], &mut one);
            *v = one[0];
        }
    }
}

/// The `Isa::Neon` table's MXFP4 dot.
pub fn neon(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    // SAFETY: NEON is a baseline feature of aarch64.
    unsafe { rows::<Widen, 1>(x, [y], &mut out) };
    out[0]
}

/// [`neon`] against four activation rows, each as alone.
pub fn neon4(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    // SAFETY: as [`neon`].
    unsafe { rows::<Widen, 4>(x, y, out) }
}

/// [`neon`] of many weight rows against one activation row.
pub fn neon_rows(x: &[u8], xrb: usize, y: &[u8], out: &mut [f32]) {
    // SAFETY: as [`neon`].
    unsafe { many::<Widen>(x, xrb, y, out) }
}

/// The `Isa::Dotprod` table's MXFP4 dot.
#[target_feature(enable = "dotprod")]
pub fn dotprod(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    // SAFETY: NEON is baseline; `dotprod` enabled above.
    unsafe { rows::<Sdot, 1>(x, [y], &mut out) };
    out[0]
}

/// [`dotprod`] against four activation rows, each as alone.
#[target_feature(enable = "dotprod")]
pub fn dotprod4(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    // SAFETY: as [`dotprod`].
    unsafe { rows::<Sdot, 4>(x, y, out) }
}

/// [`dotprod`] of many weight rows against one activation row.
#[target_feature(enable = "dotprod")]
pub fn dotprod_rows(x: &[u8], xrb: usize, y: &[u8], out: &mut [f32]) {
    // SAFETY: as [`dotprod`].
    unsafe { many::<Sdot>(x, xrb, y, out) }
}
