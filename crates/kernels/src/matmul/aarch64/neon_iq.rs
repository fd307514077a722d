//! NEON dot products of the 1- to 3-bit i-quants against Q8_K in ggml's AVX2 order
//! (`matmul::lanes::dot_iq_q8_k`), bit for bit, for one activation row and for four.
//!
//! Per 32 values ([`IqType::sub_block`], decoded once for all rows) the grid entries as two
//! `int8x16_t`, their signs applied by multiplying with ±1 bytes (|grid| ≤ 62); lanes 0‥3 from
//! values 0‥16 and 4‥7 from 16‥32 through [`Dot4`] (`sdot`, or widening multiplies), each
//! times its half's scale (`mla` by scalar) — the x86 kernels' eight lanes, the same exact
//! integers — and one FMA per super-block. IQ1 as on x86: its ternary grid unsigned by the
//! grid itself, IQ1_M's shifts as lanes of their own, IQ1_S's from `bsums`.
#![allow(clippy::missing_safety_doc)]

use super::neon::{hsum8, lanes_fma, Dot4, Sdot, Widen};
use crate::quant::blocks::*;
use crate::quant::iq::{each4, IqType, SIGN_MASKS};
use std::arch::aarch64::*;

/// Two 8-byte entries as one vector, the first in the low half.
#[inline(always)]
unsafe fn pair(a: u64, b: u64) -> int8x16_t {
    // SAFETY: NEON present (the caller's contract).
    unsafe { vcombine_s8(vcreate_s8(a), vcreate_s8(b)) }
}

/// `IqType::ALL[K]`'s dots of one weight row against `R` activation rows.
#[inline(always)]
unsafe fn rows<D: Dot4, const K: usize, const R: usize>(x: &[u8], ys: [&[u8]; R], out: &mut [f32; R]) {
    let t = IqType::ALL[K];
    let ys: [&[BlockQ8K]; R] = ys.map(as_blocks::<BlockQ8K>);
    // SAFETY: NEON present (the caller's contract); every load reads 16 bytes inside a Q8_K
    // block's `qs`.
    unsafe {
        let zero = vdupq_n_s32(0);
        let (mut acc, mut acc2, mut shifts) = ([[vdupq_n_f32(0.0); 2]; R], [[vdupq_n_f32(0.0); 2]; R], [0f32; R]);
        for (i, a) in x.chunks_exact(t.block_bytes()).enumerate() {
            let (mut sumi, mut sumi2, mut sumi1) = ([[zero; 2]; R], [[zero; 2]; R], [0i32; R]);
            for ib in 0..QK_K / 32 {
                let s = t.sub_block(a, ib);
                let (mut v0, mut v1) = (pair(s.grid[0], s.grid[1]), pair(s.grid[2], s.grid[3]));
                if !t.shifted() {
                    let m = each4(|l| SIGN_MASKS[s.signs[l] as usize]);
                    (v0, v1) = (vmulq_s8(v0, pair(m[0], m[1])), vmulq_s8(v1, pair(m[2], m[3])));
                }
                let m = each4(|l| SIGN_MASKS[if s.shift[l] < 0 { 255 } else { 0 }]);
                let (h0, h1) = (pair(m[0], m[1]), pair(m[2], m[3])); // IQ1_M's only
                let (l0, l1) = (s.ls[0] as i32, s.ls[1] as i32);
                for (r, y) in ys.iter().enumerate() {
                    let b = &y[i];
                    let yq = b.qs.as_ptr().add(32 * ib);
                    let (y0, y1) = (vld1q_s8(yq), vld1q_s8(yq.add(16)));
                    sumi[r][0] = vmlaq_n_s32(sumi[r][0], D::dot4(v0, y0), l0);
                    sumi[r][1] = vmlaq_n_s32(sumi[r][1], D::dot4(v1, y1), l1);
                    match t {
                        IqType::IQ1S => sumi1[r] += (b.bsums[2 * ib] as i32 + b.bsums[2 * ib + 1] as i32) * s.shift[0] as i32 * l0,
                        IqType::IQ1M => {
                            sumi2[r][0] = vmlaq_n_s32(sumi2[r][0], D::dot4(h0, y0), l0);
                            sumi2[r][1] = vmlaq_n_s32(sumi2[r][1], D::dot4(h1, y1), l1);
                        }
                        _ => {}
                    }
                }
            }
            let da = t.d(a);
            for (r, y) in ys.iter().enumerate() {
                let d = da * y[i].d;
                lanes_fma(&mut acc[r], sumi[r], d);
                match t {
                    // ggml's build contracts `accum1 += d * sumi1` into an FMA.
                    IqType::IQ1S => shifts[r] = d.mul_add(sumi1[r] as f32, shifts[r]),
                    IqType::IQ1M => lanes_fma(&mut acc2[r], sumi2[r], d),
                    _ => {}
                }
            }
        }
        for r in 0..R {
            out[r] = match t {
                IqType::IQ1S => hsum8(acc[r]) + 0.125 * shifts[r],
                IqType::IQ1M => hsum8(acc[r]) + 0.125 * hsum8(acc2[r]),
                _ => t.c() * hsum8(acc[r]),
            };
        }
    }
}

/// The `Isa::Neon` table's dot of `IqType::ALL[K]`.
pub fn neon<const K: usize>(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    // SAFETY: NEON is a baseline feature of aarch64.
    unsafe { rows::<Widen, K, 1>(x, [y], &mut out) };
    out[0]
}

/// [`neon`] against four activation rows, each as alone.
pub fn neon4<const K: usize>(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    // SAFETY: as [`neon`].
    unsafe { rows::<Widen, K, 4>(x, y, out) }
}

/// The `Isa::Dotprod` table's dot of `IqType::ALL[K]`.
#[target_feature(enable = "dotprod")]
pub fn dotprod<const K: usize>(x: &[u8], y: &[u8]) -> f32 {
    let mut out = [0f32];
    // SAFETY: NEON is baseline; `dotprod` enabled above.
    unsafe { rows::<Sdot, K, 1>(x, [y], &mut out) };
    out[0]
}

/// [`dotprod`] against four activation rows, each as alone.
#[target_feature(enable = "dotprod")]
pub fn dotprod4<const K: usize>(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]) {
    // SAFETY: as [`dotprod`].
    unsafe { rows::<Sdot, K, 4>(x, y, out) }
}
