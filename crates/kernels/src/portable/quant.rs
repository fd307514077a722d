//! Dequantize weights and quantize activations, per block format.

use crate::blocks::*;
use half::f16;

pub fn dequant_f32(x: &[u8], y: &mut [f32]) {
    y.copy_from_slice(as_blocks::<f32>(x));
}

pub fn dequant_f16(x: &[u8], y: &mut [f32]) {
    for (o, v) in y.iter_mut().zip(as_blocks::<f16>(x)) {
        *o = v.to_f32();
    }
}

pub fn dequant_q4_1(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ4_1>(x).iter().zip(y.chunks_exact_mut(QK4_1)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for j in 0..QK4_1 / 2 {
            out[j] = (b.qs[j] & 0xF) as f32 * d + m;
            out[j + QK4_1 / 2] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// Signed 5-bit values (-16..16) of one Q5_0 block, in element order.
#[inline]
pub fn q5_0_values(b: &BlockQ5_0) -> [i8; QK5_0] {
    let qh = u32::from_le_bytes(b.qh);
    let mut v = [0i8; QK5_0];
    for j in 0..QK5_0 / 2 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        v[j] = ((b.qs[j] & 0x0F) | h0) as i8 - 16;
        v[j + QK5_0 / 2] = ((b.qs[j] >> 4) | h1) as i8 - 16;
    }
    v
}

pub fn dequant_q5_0(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ5_0>(x).iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = b.d.to_f32();
        for (o, q) in out.iter_mut().zip(q5_0_values(b)) {
            *o = q as f32 * d;
        }
    }
}

pub fn dequant_q8_0(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ8_0>(x).iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = b.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Unsigned 4-bit values of one Q4_K super-block, in element order.
#[inline]
pub fn q4_k_values(b: &BlockQ4K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for (c, q) in b.qs.chunks_exact(32).enumerate() {
        for l in 0..32 {
            v[c * 64 + l] = q[l] & 0xF;
            v[c * 64 + 32 + l] = q[l] >> 4;
        }
    }
    v
}

pub fn dequant_q4_k(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ4K>(x).iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        let q = q4_k_values(b);
        for j in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(j, &b.scales);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            for l in 0..32 {
                out[j * 32 + l] = d1 * q[j * 32 + l] as f32 - m1;
            }
        }
    }
}

/// Signed 6-bit values (-32..32) of one Q6_K super-block, in element order.
#[inline]
pub fn q6_k_values(b: &BlockQ6K) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for n in 0..QK_K / 128 {
        let (ql, qh) = (&b.ql[n * 64..], &b.qh[n * 32..]);
        let o = &mut v[n * 128..];
        for l in 0..32 {
            o[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            o[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            o[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            o[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    v
}

pub fn dequant_q6_k(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ6K>(x).iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let q = q6_k_values(b);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * b.scales[i / 16] as f32 * q[i] as f32;
        }
    }
}

pub fn dequant_q8_k(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ8K>(x).iter().zip(y.chunks_exact_mut(QK_K)) {
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * b.d;
        }
    }
}

pub fn quant_f32(x: &[f32], y: &mut [u8]) {
    as_blocks_mut::<f32>(y).copy_from_slice(x);
}

pub fn quant_f16(x: &[f32], y: &mut [u8]) {
    for (o, &v) in as_blocks_mut::<f16>(y).iter_mut().zip(x) {
        *o = f16::from_f32(v);
    }
}

/// Activation quantizers follow what ggml runs on x86 and ARM (`quantize_row_q8_0` with AVX2 or
/// NEON), not its scalar `_ref`: the inverse scale is `127 / amax` and rounding is half to even.
/// On rows with massive activations the two differ visibly in the logits.
#[inline]
fn round(v: f32) -> i32 {
    v.round_ties_even() as i32
}

#[inline]
fn q8_scale(xs: &[f32]) -> (f32, f32) {
    let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
    (amax / 127.0, if amax != 0.0 { 127.0 / amax } else { 0.0 })
}

pub fn quant_q8_0(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8_0>(y).iter_mut().zip(x.chunks_exact(QK8_0)) {
        let (d, id) = q8_scale(xs);
        b.d = f16::from_f32(d);
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = round(v * id) as i8;
        }
    }
}

pub fn quant_q8_1(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8_1>(y).iter_mut().zip(x.chunks_exact(QK8_1)) {
        let (d, id) = q8_scale(xs);
        b.d = f16::from_f32(d);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = round(v * id) as i8;
            sum += *q as i32;
        }
        b.s = f16::from_f32(sum as f32 * d);
    }
}

/// ggml's `nearest_int`: round half to even via the float magic-number trick.
#[inline]
fn nearest_int(f: f32) -> i32 {
    let val = f + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

pub fn quant_q8_k(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8K>(y).iter_mut().zip(x.chunks_exact(QK_K)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.d = 0.0;
            b.qs = [0; QK_K];
            b.bsums = [0; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}
