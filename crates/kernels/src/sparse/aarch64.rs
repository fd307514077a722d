//! The sparse down projection on NEON (four lanes), bit-identical to the portable twins: every
//! lane computes `fma(h, w, y)` (`vfmaq_f32`) — decode's panels on quantized pieces, where
//! `w = q · d` (a Q8_0, Q5_0 or Q4_0 value times its block's scale) is exact in f32, as
//! `to_float` computes it; prefill's blocks on values already dequantized.
#![allow(clippy::missing_safety_doc)]

use crate::quant::blocks::{as_blocks, BlockQ4_0, BlockQ5_0, BlockQ8_0};
use crate::DType;
use std::arch::aarch64::*;

/// Sixteen signed bytes widened to four vectors of four i32.
#[inline(always)]
unsafe fn widen(b: int8x16_t) -> [int32x4_t; 4] {
    // SAFETY: register-only NEON operations (NEON is baseline on aarch64).
    unsafe {
        let (lo, hi) = (vmovl_s8(vget_low_s8(b)), vmovl_s8(vget_high_s8(b)));
        [vmovl_s16(vget_low_s16(lo)), vmovl_s16(vget_high_s16(lo)), vmovl_s16(vget_low_s16(hi)), vmovl_s16(vget_high_s16(hi))]
    }
}

/// The 32 signed values of one block as eight vectors of four i32 (Q8_0's bytes, Q4_0's
/// nibbles less 8, Q5_0's nibbles with their fifth bits less 16) and the block's scale.
#[inline(always)]
unsafe fn values(t: DType, b: &[u8]) -> ([int32x4_t; 8], f32) {
    // SAFETY (whole function): `b` is one block of `t` (the caller's contract); the loads stay
    // inside it.
    unsafe {
        let (lo, hi, d) = match t {
            DType::Q8_0 => {
                let blk = &as_blocks::<BlockQ8_0>(b)[0];
                let p = blk.qs.as_ptr();
                (vld1q_s8(p), vld1q_s8(p.add(16)), blk.d.to_f32())
            }
            DType::Q4_0 => {
                let blk = &as_blocks::<BlockQ4_0>(b)[0];
                let q = vld1q_u8(blk.qs.as_ptr());
                let e = vdupq_n_s8(8);
                let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0xF))), e);
                let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)), e);
                (lo, hi, blk.d.to_f32())
            }
            _ => {
                let blk = &as_blocks::<BlockQ5_0>(b)[0];
                let q = vld1q_u8(blk.qs.as_ptr());
                // Value j's fifth bit is bit j of `qh`: each byte of `qh` spread over eight
                // lanes, tested against that lane's bit.
                let spread = |b0: u8, b1: u8| vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
                const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
                let bits = vld1q_u8(BITS.as_ptr());
                let fifth = |v: uint8x16_t| vandq_u8(vtstq_u8(v, bits), vdupq_n_u8(0x10));
                let [h0, h1, h2, h3] = blk.qh;
                let e = vdupq_n_s8(16);
                let lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0xF)), fifth(spread(h0, h1)));
                let hi = vorrq_u8(vshrq_n_u8::<4>(q), fifth(spread(h2, h3)));
                (vsubq_s8(vreinterpretq_s8_u8(lo), e), vsubq_s8(vreinterpretq_s8_u8(hi), e), blk.d.to_f32())
            }
        };
        let ([a0, a1, a2, a3], [b0, b1, b2, b3]) = (widen(lo), widen(hi));
        ([a0, a1, a2, a3, b0, b1, b2, b3], d)
    }
}

/// [`super::axpy_panel`] on four lanes: `NB` blocks of each firing neuron's piece, the
/// `8 · NB` output registers live across the neurons.
///
/// # Safety
/// `t` is Q8_0, Q5_0 or Q4_0; `y.len() == 32 · NB`; every firing neuron's `NB` blocks at
/// `i · stride` lie in `panel` and `i < h.len()`.
#[target_feature(enable = "neon")]
pub unsafe fn axpy_panel_neon<const NB: usize>(t: DType, panel: &[u8], stride: usize, firing: &[u32], h: &[f32], y: &mut [f32]) {
    // One copy of the loop per type, so the block decoding is straight-line code.
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match t {
            DType::Q8_0 => panel4::<NB>(DType::Q8_0, panel, stride, firing, h, y),
            DType::Q5_0 => panel4::<NB>(DType::Q5_0, panel, stride, firing, h, y),
            _ => panel4::<NB>(DType::Q4_0, panel, stride, firing, h, y),
        }
    }
}

#[inline(always)]
unsafe fn panel4<const NB: usize>(t: DType, panel: &[u8], stride: usize, firing: &[u32], h: &[f32], y: &mut [f32]) {
    let ts = t.type_size();
    // SAFETY (loads, stores): `y` holds 32 · NB values; the pieces and `h` values read are
    // inside their slices (the caller's contract).
    unsafe {
        let mut acc: [[float32x4_t; 8]; NB] = std::array::from_fn(|b| std::array::from_fn(|g| vld1q_f32(y.as_ptr().add(32 * b + 4 * g))));
        for &i in firing {
            let piece = panel.as_ptr().add(i as usize * stride);
            let hv = vdupq_n_f32(*h.get_unchecked(i as usize));
            for (b, a) in acc.iter_mut().enumerate() {
                let (v, d) = values(t, std::slice::from_raw_parts(piece.add(b * ts), ts));
                let dv = vdupq_n_f32(d);
                for g in 0..8 {
                    a[g] = vfmaq_f32(a[g], vmulq_f32(vcvtq_f32_s32(v[g]), dv), hv);
                }
            }
        }
        for (b, a) in acc.iter().enumerate() {
            for (g, v) in a.iter().enumerate() {
                vst1q_f32(y.as_mut_ptr().add(32 * b + 4 * g), *v);
            }
        }
    }
}

/// [`super::down_block`] on NEON for 1 to 8 token rows, two at a time: each token's 32
/// outputs in eight registers, the FMA's result selected where the neuron fires (`h ≠ 0`, as
/// the portable twin tests it).
///
/// # Safety
/// `h.len() == y.len() <= 8`; every `h` row holds `w.len() / 32` values.
pub unsafe fn down_block(h: &[&[f32]], w: &[f32], y: &mut [[f32; super::DOWN_COLS]]) {
    // SAFETY (both arms): the caller's contract.
    unsafe {
        match h.len() {
            0 => {}
            1 => down_tile::<1>(h, w, y),
            _ => {
                down_tile::<2>(&h[..2], w, &mut y[..2]);
                down_block(&h[2..], w, &mut y[2..])
            }
        }
    }
}

#[target_feature(enable = "neon")]
unsafe fn down_tile<const T: usize>(h: &[&[f32]], w: &[f32], y: &mut [[f32; super::DOWN_COLS]]) {
    let n_ff = w.len() / super::DOWN_COLS;
    // SAFETY (loads and stores): `y` rows hold 32 f32; `w` holds n_ff rows of 32; `h` rows
    // hold n_ff values (the caller's contract).
    unsafe {
        let zero = vdupq_n_f32(0.0);
        let mut acc: [[float32x4_t; 8]; T] = std::array::from_fn(|t| std::array::from_fn(|v| vld1q_f32(y[t].as_ptr().add(4 * v))));
        let hp: [*const f32; T] = std::array::from_fn(|t| h[t].as_ptr());
        for i in 0..n_ff {
            let wp = w.as_ptr().add(i * super::DOWN_COLS);
            let wv: [float32x4_t; 8] = std::array::from_fn(|v| vld1q_f32(wp.add(4 * v)));
            for t in 0..T {
                let hv = vdupq_n_f32(*hp[t].add(i));
                // Not equal to zero (a NaN fires, as `h != 0.0` says).
                let fires = vmvnq_u32(vceqq_f32(hv, zero));
                for v in 0..8 {
                    acc[t][v] = vbslq_f32(fires, vfmaq_f32(acc[t][v], wv[v], hv), acc[t][v]);
                }
            }
        }
        for (yt, at) in y.iter_mut().zip(&acc) {
            for (v, a) in at.iter().enumerate() {
                vst1q_f32(yt.as_mut_ptr().add(4 * v), *a);
            }
        }
    }
}
