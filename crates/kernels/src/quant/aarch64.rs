//! NEON activation quantizers (f32 rows to Q8_0, Q8_1, Q8_K blocks, as ggml's NEON
//! `quantize_row_*`: `127/amax`, round half to even with `fcvtns`) and the f32 → F16 row
//! converter of F16 KV stores (`fcvtn`): the same bytes as the portable twins in
//! `quant::portable`. NEON is part of every aarch64 target, so these are safe functions.

use crate::quant::blocks::*;
use crate::simd::aarch64::to_f16_bits4;
use std::arch::aarch64::*;

/// Codes of four vectors of i32 (each within ±127) narrowed to 16 bytes.
#[inline(always)]
fn narrow(q: &[int32x4_t]) -> int8x16_t {
    // SAFETY: NEON is baseline; register-only operations.
    unsafe {
        let lo = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
        let hi = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
        vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
    }
}

/// One 32-value block as `quant::portable`'s Q8_0/Q8_1: `amax` (NaN ignored, from 0),
/// `d = amax/127`, `q = round_half_even(x · 127/amax)`. Returns (d, Σq) and writes the codes.
#[inline(always)]
fn q8_block(xs: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    assert!(xs.len() >= 32);
    // SAFETY: NEON is baseline; 32 readable f32 (asserted) and 32 writable bytes.
    unsafe {
        let v: [float32x4_t; 8] = std::array::from_fn(|i| vld1q_f32(xs.as_ptr().add(4 * i)));
        // `maxnm` ignores NaN, as `f32::max` in the portable fold.
        let amax = vmaxnmvq_f32(v.iter().fold(vdupq_n_f32(0.0), |m, &x| vmaxnmq_f32(m, vabsq_f32(x))));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let q: [int32x4_t; 8] = std::array::from_fn(|i| vcvtnq_s32_f32(vmulq_n_f32(v[i], id)));
        let sum = vaddvq_s32(q.iter().fold(vdupq_n_s32(0), |s, &x| vaddq_s32(s, x)));
        vst1q_s8(qs.as_mut_ptr(), narrow(&q[..4]));
        vst1q_s8(qs.as_mut_ptr().add(16), narrow(&q[4..]));
        (d, sum)
    }
}

/// NEON twin of `quant::portable::quant_q8_0` (same bytes).
pub fn quant_q8_0(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8_0>(y).iter_mut().zip(x.chunks_exact(QK8_0)) {
        let (d, _) = q8_block(xs, &mut b.qs);
        b.d = half::f16::from_f32(d);
    }
}

/// NEON twin of `quant::portable::quant_q8_1` (same bytes).
pub fn quant_q8_1(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8_1>(y).iter_mut().zip(x.chunks_exact(QK8_1)) {
        let (d, sum) = q8_block(xs, &mut b.qs);
        b.d = half::f16::from_f32(d);
        b.s = half::f16::from_f32(sum as f32 * d);
    }
}

/// NEON twin of `quant::portable::quant_q8_k` (same bytes): the scale from the first element
/// of largest magnitude (NaN never wins), codes `min(round_half_even(x · -127/max), 127)`,
/// `bsums` the sums of each 16 codes.
pub fn quant_q8_k(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8K>(y).iter_mut().zip(x.chunks_exact(QK_K)) {
        // SAFETY: NEON is baseline; every access is inside the 256 values of `xs` or `b`.
        unsafe {
            let m = (0..QK_K / 4).fold(vdupq_n_f32(0.0), |m, i| vmaxnmq_f32(m, vabsq_f32(vld1q_f32(xs.as_ptr().add(4 * i)))));
            let amax = vmaxnmvq_f32(m);
            if amax == 0.0 {
                b.d = 0.0;
                b.qs = [0; QK_K];
                b.bsums = [0; QK_K / 16];
                continue;
            }
            let max = *xs.iter().find(|v| v.abs() == amax).expect("amax is some element's magnitude");
            let iscale = -127.0 / max;
            let cap = vdupq_n_s32(127);
            for s in 0..QK_K / 16 {
                let q: [int32x4_t; 4] = std::array::from_fn(|k| vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xs.as_ptr().add(16 * s + 4 * k)), iscale)), cap));
                b.bsums[s] = vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3]))) as i16;
                vst1q_s8(b.qs.as_mut_ptr().add(16 * s), narrow(&q));
            }
            b.d = 1.0 / iscale;
        }
    }
}

/// f32 rows to F16 with `fcvtn` (round to nearest even, as `quant::portable::quant_f16`): what
/// every F16 KV-cache store runs.
pub fn quant_f16(x: &[f32], y: &mut [u8]) {
    let out = as_blocks_mut::<half::f16>(y);
    let n = x.len().min(out.len());
    let body = n & !3;
    for i in (0..body).step_by(4) {
        // SAFETY: NEON is baseline; i + 4 <= n <= both lengths.
        unsafe { vst1_u16(out.as_mut_ptr().add(i) as *mut u16, to_f16_bits4(vld1q_f32(x.as_ptr().add(i)))) };
    }
    for i in body..n {
        out[i] = half::f16::from_f32(x[i]);
    }
}
