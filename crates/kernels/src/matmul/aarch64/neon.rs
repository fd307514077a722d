//! NEON dot products of the golden models' weight types, Q5_K and IQ4_NL/IQ4_XS, in the x86 SIMD kernels' float order
//! (`matmul::lanes`): bit for bit the AVX2 table's values, so an ARM machine reproduces the
//! golden logits exactly where the portable order drifts.
//!
//! The eight lanes of a 32-value block are two `float32x4_t`: lanes 0‥3 from values 0‥16,
//! 4‥7 from values 16‥32. Each lane's integer is the exact sum of four products, from one
//! `sdot` per 16 values with the dot-product extension ([`Sdot`]), else from widening
//! multiplies and two pairwise adds ([`Widen`]; i8·i8 fits i16) — the same integers either way.
//! Then `vfmaq` (fused, as `_mm256_fmadd_ps`) and `hsum_f32x8`'s order at the end.
#![allow(clippy::missing_safety_doc)]

use crate::quant::blocks::*;
use crate::quant::portable::q3_k_scales;
use std::arch::aarch64::*;

/// How four-product lane sums are formed.
pub trait Dot4 {
    /// Lane i: `Σ_{k<4} a[4i+k]·b[4i+k]`, exact.
    ///
    /// # Safety
    /// NEON present (and what the implementation names).
    unsafe fn dot4(a: int8x16_t, b: int8x16_t) -> int32x4_t;

    /// `acc + dot4(a, b)`, exact (`sdot` accumulates in place).
    ///
    /// # Safety
    /// As [`Dot4::dot4`].
    #[inline(always)]
    unsafe fn dot4_add(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: the caller's contract.
        unsafe { vaddq_s32(acc, Self::dot4(a, b)) }
    }
}

/// With the dot-product extension: one `sdot` (through `asm!`: its intrinsic is not stable).
pub struct Sdot;
/// Plain NEON: `smull`/`smull2`, then `saddlp` and `addp`.
pub struct Widen;

impl Dot4 for Sdot {
    #[inline(always)]
    unsafe fn dot4(a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: NEON present, and `dotprod` (the caller's contract).
        unsafe { Self::dot4_add(vdupq_n_s32(0), a, b) }
    }

    #[inline(always)]
    unsafe fn dot4_add(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: `sdot` reads and writes registers only; the enclosing function enables
        // `dotprod`, which the dispatcher detected.
        unsafe {
            std::arch::asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b, options(pure, nomem, nostack));
        }
        acc
    }
}

impl Dot4 for Widen {
    #[inline(always)]
    unsafe fn dot4(a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: NEON present (the caller's contract).
        unsafe {
            let lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
            let hi = vpaddlq_s16(vmull_high_s8(a, b));
            vpaddq_s32(lo, hi)
        }
    }
}

/// `hsum_f32x8` of lanes `acc[0]` (0‥3) and `acc[1]` (4‥7): `(hi + lo)`, then
/// `(r0 + r2) + (r1 + r3)`.
#[inline(always)]
pub(super) unsafe fn hsum8(acc: [float32x4_t; 2]) -> f32 {
    // SAFETY: NEON present (the caller's contract).
    unsafe {
        let r = vaddq_f32(acc[1], acc[0]);
        vaddv_f32(vadd_f32(vget_low_f32(r), vget_high_f32(r)))
    }
}

/// `acc + s·v[lane]` (`mla` by element; `lane` < 4 is a constant once the caller's loops are
/// unrolled, which folds the match).
#[inline(always)]
pub(super) unsafe fn mla_lane(acc: int32x4_t, s: int32x4_t, v: int32x4_t, lane: usize) -> int32x4_t {
    // SAFETY: NEON present (the caller's contract).
    unsafe {
        match lane {
            0 => vmlaq_laneq_s32::<0>(acc, s, v),
            1 => vmlaq_laneq_s32::<1>(acc, s, v),
            2 => vmlaq_laneq_s32::<2>(acc, s, v),
            _ => vmlaq_laneq_s32::<3>(acc, s, v),
        }
    }
}

/// One 32-value block: the two halves' lane sums into the accumulators with `d`.
#[inline(always)]
unsafe fn block<D: Dot4>(acc: &mut [float32x4_t; 2], d: f32, w: (int8x16_t, int8x16_t), y: &[i8; 32]) {
    // SAFETY: NEON present; `y` is 32 readable bytes.
    unsafe { block_loaded::<D>(acc, d, w, (vld1q_s8(y.as_ptr()), vld1q_s8(y.as_ptr().add(16)))) }
}

/// [`block`] with the activation block's halves loaded.
#[inline(always)]
pub(super) unsafe fn block_loaded<D: Dot4>(acc: &mut [float32x4_t; 2], d: f32, w: (int8x16_t, int8x16_t), y: (int8x16_t, int8x16_t)) {
    // SAFETY: NEON present (the caller's contract).
    unsafe {
        acc[0] = vfmaq_n_f32(acc[0], vcvtq_f32_s32(D::dot4(w.0, y.0)), d);
        acc[1] = vfmaq_n_f32(acc[1], vcvtq_f32_s32(D::dot4(w.1, y.1)), d);
    }
}

/// The nibbles of 16 bytes: (low nibbles: values 0‥16, high nibbles: values 16‥32).
#[inline(always)]
pub(super) unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: NEON present; 16 readable bytes.
    unsafe {
        let v = vld1q_u8(qs.as_ptr());
        (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
    }
}

/// Bits 0‥16 and 16‥32 of `qh` as bytes 0x10 (set) or 0.
#[inline(always)]
pub(super) unsafe fn fifth_bits(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: NEON present.
    unsafe {
        let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
        let spread = |b0: u8, b1: u8| vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
        let lo = vtstq_u8(spread(qh[0], qh[1]), bit);
        let hi = vtstq_u8(spread(qh[2], qh[3]), bit);
        let sixteen = vdupq_n_u8(0x10);
        (vandq_u8(lo, sixteen), vandq_u8(hi, sixteen))
    }
}

#[inline(always)]
pub(super) unsafe fn signed(v: (uint8x16_t, uint8x16_t), off: u8) -> (int8x16_t, int8x16_t) {
    // SAFETY: NEON present.
    unsafe {
        let o = vdupq_n_u8(off);
        (vreinterpretq_s8_u8(vsubq_u8(v.0, o)), vreinterpretq_s8_u8(vsubq_u8(v.1, o)))
    }
}

#[inline(always)]
unsafe fn q4_0<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4_0>(x), as_blocks::<BlockQ8_0>(y));
    // SAFETY: NEON present (the caller's contract).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (a, b) in x.iter().zip(y) {
            block::<D>(&mut acc, a.d.to_f32() * b.d.to_f32(), signed(nibbles(&a.qs), 8), &b.qs);
        }
        hsum8(acc)
    }
}

#[inline(always)]
unsafe fn q4_1<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4_1>(x), as_blocks::<BlockQ8_1>(y));
    // SAFETY: NEON present (the caller's contract).
    unsafe {
        let (mut acc, mut summs) = ([vdupq_n_f32(0.0); 2], 0f32);
        for (a, b) in x.iter().zip(y) {
            summs += a.m.to_f32() * b.s.to_f32();
            block::<D>(&mut acc, a.d.to_f32() * b.d.to_f32(), signed(nibbles(&a.qs), 0), &b.qs);
        }
        hsum8(acc) + summs
    }
}

#[inline(always)]
unsafe fn q5_0<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_0>(x), as_blocks::<BlockQ8_0>(y));
    // SAFETY: NEON present (the caller's contract).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (a, b) in x.iter().zip(y) {
            let (n, h) = (nibbles(&a.qs), fifth_bits(a.qh));
            let u = (vorrq_u8(n.0, h.0), vorrq_u8(n.1, h.1));
            block::<D>(&mut acc, a.d.to_f32() * b.d.to_f32(), signed(u, 16), &b.qs);
        }
        hsum8(acc)
    }
}

#[inline(always)]
unsafe fn q5_1<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_1>(x), as_blocks::<BlockQ8_1>(y));
    // SAFETY: NEON present (the caller's contract).
    unsafe {
        let (mut acc, mut summs) = ([vdupq_n_f32(0.0); 2], 0f32);
        for (a, b) in x.iter().zip(y) {
            summs += a.m.to_f32() * b.s.to_f32();
            let (n, h) = (nibbles(&a.qs), fifth_bits(a.qh));
            let u = (vorrq_u8(n.0, h.0), vorrq_u8(n.1, h.1));
            block::<D>(&mut acc, a.d.to_f32() * b.d.to_f32(), signed(u, 0), &b.qs);
        }
        hsum8(acc) + summs
    }
}

#[inline(always)]
unsafe fn q8_0<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ8_0>(x), as_blocks::<BlockQ8_0>(y));
    // SAFETY: NEON present (the caller's contract); each `qs` is 32 readable bytes.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (a, b) in x.iter().zip(y) {
            let w = (vld1q_s8(a.qs.as_ptr()), vld1q_s8(a.qs.as_ptr().add(16)));
            block::<D>(&mut acc, a.d.to_f32() * b.d.to_f32(), w, &b.qs);
        }
        hsum8(acc)
    }
}

/// Exact `Σ q·y` of 32 unsigned 4-bit values (`v`: 16 bytes per half) with 32 activations.
#[inline(always)]
unsafe fn sum32<D: Dot4>(lo: uint8x16_t, hi: uint8x16_t, y: *const i8) -> i32 {
    // SAFETY: NEON present; 32 readable bytes at `y`.
    unsafe {
        let s = vaddq_s32(D::dot4(vreinterpretq_s8_u8(lo), vld1q_s8(y)), D::dot4(vreinterpretq_s8_u8(hi), vld1q_s8(y.add(16))));
        vaddvq_s32(s)
    }
}

/// The super-block kernels below read a weight super-block's quants through `piece(p)`: the
/// address of its 16-byte piece `p` (bytes `16p‥16p+16` of the plain field), so that the plain
/// rows (`field + 16p`) and the interleaved layout (`matmul::layout`, where each piece of four
/// rows sits side by side) share one body, and so their values.
///
/// One Q4_K super-block (quants through `qs`, see above; `d`, `dmin`: the weight's scales times
/// `d_y`) into `acc`, `acc_min` in `portable::dot_q4_k_q8_k`'s order (exact integers per
/// super-block, then one FMA each); `TILE`: `dot_q4_k_q8_k_tile`'s (one FMA per 64 values).
///
/// # Safety
/// NEON present; every piece `qs(p)`, p < 8, 16 readable bytes.
#[inline(always)]
pub(super) unsafe fn q4_k_block<D: Dot4, const TILE: bool>(qs: impl Fn(usize) -> *const u8, scales: &[u8; K_SCALE_SIZE], (d, dmin): (f32, f32), b: &BlockQ8K, acc: &mut f32, acc_min: &mut f32) {
    // SAFETY: NEON present (the caller's contract).
    let m4 = unsafe { vdupq_n_u8(0x0F) };
    let (mut sumi, mut summ) = (0i32, 0i32);
    for p in 0..QK_K / 64 {
        // SAFETY: NEON present; pieces 2p, 2p + 1 (the caller's contract) and the activation's
        // 64 values at 64p.
        let (s0, s1) = unsafe {
            let (q0, q1) = (vld1q_u8(qs(2 * p)), vld1q_u8(qs(2 * p + 1)));
            let yq = b.qs.as_ptr().add(64 * p);
            (sum32::<D>(vandq_u8(q0, m4), vandq_u8(q1, m4), yq), sum32::<D>(vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1), yq.add(32)))
        };
        for (j, s) in [(2 * p, s0), (2 * p + 1, s1)] {
            let (sc, m) = scale_min_k4(j, scales);
            sumi += sc as i32 * s;
            summ += m as i32 * (b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32);
        }
        if TILE {
            *acc = (sumi as f32).mul_add(d, *acc);
            *acc_min = (summ as f32).mul_add(dmin, *acc_min);
            (sumi, summ) = (0, 0);
        }
    }
    if !TILE {
        *acc = (sumi as f32).mul_add(d, *acc);
        *acc_min = (summ as f32).mul_add(dmin, *acc_min);
    }
}

/// Q4_K in `portable::dot_q4_k_q8_k`'s order; `TILE`: `dot_q4_k_q8_k_tile`'s.
#[inline(always)]
unsafe fn q4_k<D: Dot4, const TILE: bool>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4K>(x), as_blocks::<BlockQ8K>(y));
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (a, b) in x.iter().zip(y) {
        let ds = (a.d.to_f32() * b.d, a.dmin.to_f32() * b.d);
        // SAFETY: NEON present (the caller's contract); pieces 0‥8 of the 128-byte `qs`.
        unsafe { q4_k_block::<D, TILE>(|p| a.qs.as_ptr().add(16 * p), &a.scales, ds, b, &mut acc, &mut acc_min) };
    }
    acc - acc_min
}

/// One Q6_K super-block's eight lane sums (exact, with the `−32·Σ sc·bsums` correction) in
/// ggml's AVX2 order (`matmul::lanes::dot_q6_k_q8_k`); `ql(p)` (p < 8) and `qh(p)` (p < 4):
/// the pieces of the two quant fields; `scales`: its sixteen scales.
///
/// The 6-bit values take two or three operations each: the fifth and sixth bits are masked in
/// place (`qh & 3`, `(qh >> 2) & 3`, `qh & 0x30`, `(qh >> 2) & 0x30`) and the nibble shifted
/// in beside them (`sli`/`sri`). Each 16-value sum meets its scale as a lane of the widened
/// scales (`mla` by element), not as a scalar moved into a vector.
///
/// # Safety
/// NEON present; each piece 16 readable bytes.
#[inline(always)]
pub(super) unsafe fn q6_k_block<D: Dot4>(ql: impl Fn(usize) -> *const u8, qh: impl Fn(usize) -> *const u8, scales: int8x16_t, b: &BlockQ8K) -> [int32x4_t; 2] {
    // SAFETY: NEON present; the pieces are the caller's contract, every other load is inside
    // `b`.
    unsafe {
        let (m3, m30) = (vdupq_n_u8(0x03), vdupq_n_u8(0x30));
        // Scales 0‥8 and 8‥16 as i16.
        let sc16 = [vmovl_s8(vget_low_s8(scales)), vmovl_high_s8(scales)];
        // −32·(bsums[2L]·sc[2L] + bsums[2L+1]·sc[2L+1]) for lanes 0‥3 and 4‥7.
        let bs = (vld1q_s16(b.bsums.as_ptr()), vld1q_s16(b.bsums.as_ptr().add(8)));
        let corr = |s: int16x8_t, t: int16x8_t| {
            let p = vpaddq_s32(vmull_s16(vget_low_s16(s), vget_low_s16(t)), vmull_high_s16(s, t));
            vmulq_n_s32(p, -32)
        };
        let mut sumi = [corr(sc16[0], bs.0), corr(sc16[1], bs.1)];
        for n in 0..QK_K / 128 {
            // Scales 8n + 2k (h = 0) and 8n + 2k + 1 (h = 1) in lane k: the i16 pairs of this
            // half's eight, sign-extended from their low and high halves.
            let pairs = vreinterpretq_s32_s16(sc16[n]);
            let lane_sc = [vshrq_n_s32::<16>(vshlq_n_s32::<16>(pairs)), vshrq_n_s32::<16>(pairs)];
            for h in 0..2 {
                // Bytes 16h‥16h+16 of this half's ql (both 32-byte rows) and qh.
                let ql0 = vld1q_u8(ql(4 * n + h));
                let ql1 = vld1q_u8(ql(4 * n + 2 + h));
                let qh = vld1q_u8(qh(2 * n + h));
                let qh2 = vshrq_n_u8::<2>(qh);
                // Value k: nibble | bits (2k, 2k + 1) of qh at bits 4, 5.
                let u = [
                    vsliq_n_u8::<4>(ql0, vandq_u8(qh, m3)),
                    vsliq_n_u8::<4>(ql1, vandq_u8(qh2, m3)),
                    vsriq_n_u8::<4>(vandq_u8(qh, m30), ql0),
                    vsriq_n_u8::<4>(vandq_u8(qh2, m30), ql1),
                ];
                for (k, u) in u.into_iter().enumerate() {
                    let yq = vld1q_s8(b.qs.as_ptr().add(128 * n + 32 * k + 16 * h));
                    sumi[h] = mla_lane(sumi[h], D::dot4(vreinterpretq_s8_u8(u), yq), lane_sc[h], k);
                }
            }
        }
        sumi
    }
}

/// A super-block's eight lane sums into the accumulators with `d` (one FMA per lane).
#[inline(always)]
pub(super) unsafe fn lanes_fma(acc: &mut [float32x4_t; 2], sumi: [int32x4_t; 2], d: f32) {
    // SAFETY: NEON present (the caller's contract).
    unsafe {
        acc[0] = vfmaq_n_f32(acc[0], vcvtq_f32_s32(sumi[0]), d);
        acc[1] = vfmaq_n_f32(acc[1], vcvtq_f32_s32(sumi[1]), d);
    }
}

/// Q6_K in ggml's AVX2 order (`matmul::lanes::dot_q6_k_q8_k`).
#[inline(always)]
unsafe fn q6_k<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ6K>(x), as_blocks::<BlockQ8K>(y));
    // SAFETY: NEON present (the caller's contract); the pieces lie inside `ql` and `qh`.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (a, b) in x.iter().zip(y) {
            let sumi = q6_k_block::<D>(|p| a.ql.as_ptr().add(16 * p), |p| a.qh.as_ptr().add(16 * p), vld1q_s8(a.scales.as_ptr()), b);
            lanes_fma(&mut acc, sumi, b.d * a.d.to_f32());
        }
        hsum8(acc)
    }
}

/// Q5_K in ggml's AVX2 order (`matmul::lanes::dot_q5_k_q8_k`): eight exact lane sums per
/// super-block (each 32-value group's four-product sums times its scale), one FMA per lane;
/// the mins in a float of their own, subtracted at the end.
#[inline(always)]
unsafe fn q5_k<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5K>(x), as_blocks::<BlockQ8K>(y));
    // SAFETY: NEON present (the caller's contract); every load is 16 bytes inside `qs` (128),
    // `qh` (32) or the activation's 256 values.
    unsafe {
        let (m4, one, two) = (vdupq_n_u8(0x0F), vdupq_n_u8(1), vdupq_n_u8(2));
        let (mut acc, mut acc_m) = ([vdupq_n_f32(0.0); 2], 0f32);
        for (a, b) in x.iter().zip(y) {
            let qh = [vld1q_u8(a.qh.as_ptr()), vld1q_u8(a.qh.as_ptr().add(16))];
            let (mut sumi, mut summ) = ([vdupq_n_s32(0); 2], 0i32);
            for j in 0..QK_K / 64 {
                // Groups 2j (low nibbles, fifth bit 2j of qh) and 2j + 1 (high, bit 2j + 1).
                let (s0, m0) = scale_min_k4(2 * j, &a.scales);
                let (s1, m1) = scale_min_k4(2 * j + 1, &a.scales);
                let bs = &b.bsums[4 * j..4 * j + 4];
                summ += m0 as i32 * (bs[0] as i32 + bs[1] as i32) + m1 as i32 * (bs[2] as i32 + bs[3] as i32);
                let shift = vdupq_n_s8(-2 * j as i8);
                for (h, sumi) in sumi.iter_mut().enumerate() {
                    let q = vld1q_u8(a.qs.as_ptr().add(32 * j + 16 * h));
                    let hb = vshlq_u8(qh[h], shift);
                    let lo = vorrq_u8(vandq_u8(q, m4), vshlq_n_u8::<4>(vandq_u8(hb, one)));
                    let hi = vorrq_u8(vshrq_n_u8::<4>(q), vshlq_n_u8::<3>(vandq_u8(hb, two)));
                    let yq = b.qs.as_ptr().add(64 * j + 16 * h);
                    let pl = D::dot4(vreinterpretq_s8_u8(lo), vld1q_s8(yq));
                    let ph = D::dot4(vreinterpretq_s8_u8(hi), vld1q_s8(yq.add(32)));
                    *sumi = vmlaq_n_s32(vmlaq_n_s32(*sumi, pl, s0 as i32), ph, s1 as i32);
                }
            }
            lanes_fma(&mut acc, sumi, a.d.to_f32() * b.d);
            acc_m += a.dmin.to_f32() * b.d * summ as f32;
        }
        hsum8(acc) - acc_m
    }
}

/// Q2_K in ggml's AVX2 order (`matmul::lanes::dot_q2_k_q8_k`): eight exact lane sums per
/// super-block (each 16 values' four-product sums times its scale's low nibble), one FMA per
/// lane; the mins `Σ (sc >> 4)·bsums` in a float of their own, subtracted at the end.
#[inline(always)]
unsafe fn q2_k<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ2K>(x), as_blocks::<BlockQ8K>(y));
    // SAFETY: NEON present (the caller's contract); every load is 16 bytes inside `qs` (64),
    // `scales` (16), `bsums` (16 i16) or the activation's 256 values.
    unsafe {
        let m3 = vdupq_n_u8(3);
        let (mut acc, mut acc_m) = ([vdupq_n_f32(0.0); 2], 0f32);
        for (a, b) in x.iter().zip(y) {
            let sc = vld1q_u8(a.scales.as_ptr());
            // Σ (sc >> 4)·bsums, exact.
            let m = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vshrq_n_u8::<4>(sc))));
            let m_hi = vreinterpretq_s16_u16(vmovl_high_u8(vshrq_n_u8::<4>(sc)));
            let bs = (vld1q_s16(b.bsums.as_ptr()), vld1q_s16(b.bsums.as_ptr().add(8)));
            let mm = vaddq_s32(vaddq_s32(vmull_s16(vget_low_s16(m), vget_low_s16(bs.0)), vmull_high_s16(m, bs.0)), vaddq_s32(vmull_s16(vget_low_s16(m_hi), vget_low_s16(bs.1)), vmull_high_s16(m_hi, bs.1)));
            let summ = vaddvq_s32(mm);
            let mut sumi = [vdupq_n_s32(0); 2];
            for n in 0..QK_K / 128 {
                let q = [vld1q_u8(a.qs.as_ptr().add(32 * n)), vld1q_u8(a.qs.as_ptr().add(32 * n + 16))];
                for k in 0..4 {
                    let shift = vdupq_n_s8(-2 * k as i8);
                    for (h, sumi) in sumi.iter_mut().enumerate() {
                        let v = vandq_u8(vshlq_u8(q[h], shift), m3);
                        let s = D::dot4(vreinterpretq_s8_u8(v), vld1q_s8(b.qs.as_ptr().add(128 * n + 32 * k + 16 * h)));
                        *sumi = vmlaq_n_s32(*sumi, s, (a.scales[8 * n + 2 * k + h] & 0xF) as i32);
                    }
                }
            }
            lanes_fma(&mut acc, sumi, a.d.to_f32() * b.d);
            acc_m += a.dmin.to_f32() * b.d * summ as f32;
        }
        hsum8(acc) - acc_m
    }
}

/// Q3_K in ggml's AVX2 order (`matmul::lanes::dot_q3_k_q8_k`): eight exact lane sums per
/// super-block of the signed 3-bit values (the 2-bit part, less 4 where the `hmask` bit is
/// clear) times the signed 6-bit scales, one FMA per lane.
#[inline(always)]
unsafe fn q3_k<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ3K>(x), as_blocks::<BlockQ8K>(y));
    // SAFETY: NEON present (the caller's contract); every load is 16 bytes inside `qs` (64),
    // `hmask` (32) or the activation's 256 values.
    unsafe {
        let (m3, four) = (vdupq_n_u8(3), vdupq_n_u8(4));
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (a, b) in x.iter().zip(y) {
            let sc = q3_k_scales(&a.scales);
            let hm = [vld1q_u8(a.hmask.as_ptr()), vld1q_u8(a.hmask.as_ptr().add(16))];
            let mut sumi = [vdupq_n_s32(0); 2];
            for n in 0..QK_K / 128 {
                let q = [vld1q_u8(a.qs.as_ptr().add(32 * n)), vld1q_u8(a.qs.as_ptr().add(32 * n + 16))];
                for k in 0..4 {
                    let shift = vdupq_n_s8(-2 * k as i8);
                    let bit = vdupq_n_u8(1 << (4 * n + k));
                    for (h, sumi) in sumi.iter_mut().enumerate() {
                        let low = vandq_u8(vshlq_u8(q[h], shift), m3);
                        // 4 where the high bit is clear: the value is low − 4 there.
                        let clear = vceqq_u8(vandq_u8(hm[h], bit), vdupq_n_u8(0));
                        let v = vsubq_s8(vreinterpretq_s8_u8(low), vreinterpretq_s8_u8(vandq_u8(clear, four)));
                        let s = D::dot4(v, vld1q_s8(b.qs.as_ptr().add(128 * n + 32 * k + 16 * h)));
                        *sumi = vmlaq_n_s32(*sumi, s, sc[8 * n + 2 * k + h] as i32);
                    }
                }
            }
            lanes_fma(&mut acc, sumi, a.d.to_f32() * b.d);
        }
        hsum8(acc)
    }
}

/// One IQ4_XS super-block's eight lane sums in ggml's AVX2 order
/// (`matmul::lanes::dot_iq4_xs_q8_k`): each sub-block's lane sums times its scale, lane s of
/// `sc[s / 4]` (`mla` by element); `qs(p)`: the quants' pieces (p < 8, one per sub-block);
/// `table`: the IQ4_NL grid.
///
/// # Safety
/// NEON present; each piece 16 readable bytes.
#[inline(always)]
pub(super) unsafe fn iq4_xs_block<D: Dot4>(qs: impl Fn(usize) -> *const u8, sc: [int32x4_t; 2], table: int8x16_t, b: &BlockQ8K) -> [int32x4_t; 2] {
    // SAFETY: NEON present; the pieces are the caller's contract, the activations inside `b`.
    unsafe {
        let mut sumi = [vdupq_n_s32(0); 2];
        for s in 0..QK_K / 32 {
            let (lo, hi) = nibbles(&*(qs(s) as *const [u8; 16]));
            let yq = b.qs.as_ptr().add(32 * s);
            sumi[0] = mla_lane(sumi[0], D::dot4(vqtbl1q_s8(table, lo), vld1q_s8(yq)), sc[s / 4], s % 4);
            sumi[1] = mla_lane(sumi[1], D::dot4(vqtbl1q_s8(table, hi), vld1q_s8(yq.add(16))), sc[s / 4], s % 4);
        }
        sumi
    }
}

/// Eight i8 scales as the two i32 vectors [`iq4_xs_block`] reads.
#[inline(always)]
pub(super) unsafe fn widen_scales(sc: int8x8_t) -> [int32x4_t; 2] {
    // SAFETY: NEON present (the caller's contract).
    unsafe {
        let w = vmovl_s8(sc);
        [vmovl_s16(vget_low_s16(w)), vmovl_high_s16(w)]
    }
}

/// IQ4_NL: Q4_0's lanes with the nibbles looked up in the grid (`tbl`).
#[inline(always)]
unsafe fn iq4_nl<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockIQ4NL>(x), as_blocks::<BlockQ8_0>(y));
    // SAFETY: NEON present (the caller's contract); the grid is 16 bytes.
    unsafe {
        let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (a, b) in x.iter().zip(y) {
            let (lo, hi) = nibbles(&a.qs);
            block::<D>(&mut acc, a.d.to_f32() * b.d.to_f32(), (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi)), &b.qs);
        }
        hsum8(acc)
    }
}

/// IQ4_XS in ggml's AVX2 order (`matmul::lanes::dot_iq4_xs_q8_k`): eight lanes per
/// super-block, each sub-block's lane sums times its scale, one FMA per lane.
#[inline(always)]
unsafe fn iq4_xs<D: Dot4>(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockIQ4XS>(x), as_blocks::<BlockQ8K>(y));
    // SAFETY: NEON present (the caller's contract); the pieces lie inside `qs`.
    unsafe {
        let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (a, b) in x.iter().zip(y) {
            let sc = crate::quant::portable::iq4_xs_scales(a);
            let sumi = iq4_xs_block::<D>(|p| a.qs.as_ptr().add(16 * p), widen_scales(vld1_s8(sc.as_ptr())), table, b);
            lanes_fma(&mut acc, sumi, a.d.to_f32() * b.d);
        }
        hsum8(acc)
    }
}

/// Which dot an entry point computes (its `K` parameter).
pub mod kind {
    pub const Q4_0: u8 = 0;
    pub const Q4_1: u8 = 1;
    pub const Q5_0: u8 = 2;
    pub const Q5_1: u8 = 3;
    pub const Q8_0: u8 = 4;
    pub const Q4_K: u8 = 5;
    /// Q4_K in the tile order (`vec_dot_tile`).
    pub const Q4_K_TILE: u8 = 6;
    pub const Q6_K: u8 = 7;
    pub const IQ4_NL: u8 = 8;
    pub const IQ4_XS: u8 = 9;
    pub const Q5_K: u8 = 10;
    pub const Q2_K: u8 = 11;
    pub const Q3_K: u8 = 12;
}

/// The dot of kind `K` through `D`.
///
/// # Safety
/// NEON present, and `dotprod` where `D` is [`Sdot`].
#[inline(always)]
unsafe fn dispatch<D: Dot4, const K: u8>(x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        match K {
            kind::Q4_0 => q4_0::<D>(x, y),
            kind::Q4_1 => q4_1::<D>(x, y),
            kind::Q5_0 => q5_0::<D>(x, y),
            kind::Q5_1 => q5_1::<D>(x, y),
            kind::Q8_0 => q8_0::<D>(x, y),
            kind::Q4_K => q4_k::<D, false>(x, y),
            kind::Q4_K_TILE => q4_k::<D, true>(x, y),
            kind::IQ4_NL => iq4_nl::<D>(x, y),
            kind::IQ4_XS => iq4_xs::<D>(x, y),
            kind::Q5_K => q5_k::<D>(x, y),
            kind::Q2_K => q2_k::<D>(x, y),
            kind::Q3_K => q3_k::<D>(x, y),
            _ => q6_k::<D>(x, y),
        }
    }
}

/// The `Isa::Neon` table's dots (NEON is part of every aarch64 target).
pub fn neon<const K: u8>(x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: NEON is a baseline feature of aarch64.
    unsafe { dispatch::<Widen, K>(x, y) }
}

/// The `Isa::Dotprod` table's dots.
#[target_feature(enable = "dotprod")]
pub fn dotprod<const K: u8>(x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: NEON is baseline; `dotprod` enabled above.
    unsafe { dispatch::<Sdot, K>(x, y) }
}
