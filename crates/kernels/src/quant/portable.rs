//! Dequantize weights and quantize activations, per block format.

use super::blocks::*;
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

/// `out = d · sc · q - dmin · m` per sub-block of 32 (the Q4_K/Q5_K formula).
#[inline]
fn dequant_k_min(d: f16, dmin: f16, scales: &[u8; K_SCALE_SIZE], q: &[u8; QK_K], out: &mut [f32]) {
    let (d, dmin) = (d.to_f32(), dmin.to_f32());
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, scales);
        let (d1, m1) = (d * sc as f32, dmin * m as f32);
        for l in 0..32 {
            out[j * 32 + l] = d1 * q[j * 32 + l] as f32 - m1;
        }
    }
}

pub fn dequant_q4_k(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ4K>(x).iter().zip(y.chunks_exact_mut(QK_K)) {
        dequant_k_min(b.d, b.dmin, &b.scales, &q4_k_values(b), out);
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

/// Signed values (-8..8) of one Q4_0 block, in element order.
#[inline]
pub fn q4_0_values(b: &BlockQ4_0) -> [i8; QK4_0] {
    let mut v = [0i8; QK4_0];
    for j in 0..QK4_0 / 2 {
        v[j] = (b.qs[j] & 0xF) as i8 - 8;
        v[j + QK4_0 / 2] = (b.qs[j] >> 4) as i8 - 8;
    }
    v
}

pub fn dequant_q4_0(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ4_0>(x).iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = b.d.to_f32();
        for (o, q) in out.iter_mut().zip(q4_0_values(b)) {
            *o = q as f32 * d;
        }
    }
}

/// Unsigned 5-bit values (0..32) of one Q5_1 block, in element order.
#[inline]
pub fn q5_1_values(b: &BlockQ5_1) -> [u8; QK5_1] {
    let qh = u32::from_le_bytes(b.qh);
    let mut v = [0u8; QK5_1];
    for j in 0..QK5_1 / 2 {
        v[j] = (b.qs[j] & 0x0F) | ((((qh >> j) << 4) & 0x10) as u8);
        v[j + QK5_1 / 2] = (b.qs[j] >> 4) | (((qh >> (j + 12)) & 0x10) as u8);
    }
    v
}

pub fn dequant_q5_1(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ5_1>(x).iter().zip(y.chunks_exact_mut(QK5_1)) {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (o, q) in out.iter_mut().zip(q5_1_values(b)) {
            *o = q as f32 * d + m;
        }
    }
}

/// Grid values of one IQ4_NL block, in element order.
#[inline]
pub fn iq4_nl_values(qs: &[u8; 16]) -> [i8; 32] {
    grid_values(&KVALUES_IQ4NL, qs)
}

/// The doubled E2M1 values of one MXFP4 block, in element order.
#[inline]
pub fn mxfp4_values(qs: &[u8; 16]) -> [i8; 32] {
    grid_values(&KVALUES_MXFP4, qs)
}

/// 32 nibbles (low halves first, as [`BlockQ4_1`]) looked up in a 16-entry grid.
#[inline]
fn grid_values(grid: &[i8; 16], qs: &[u8; 16]) -> [i8; 32] {
    let mut v = [0i8; 32];
    for j in 0..16 {
        v[j] = grid[(qs[j] & 0xF) as usize];
        v[j + 16] = grid[(qs[j] >> 4) as usize];
    }
    v
}

/// ggml's `dequantize_row_mxfp4`: each doubled value times half the block's scale.
pub fn dequant_mxfp4(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockMXFP4>(x).iter().zip(y.chunks_exact_mut(32)) {
        let d = e8m0_half(b.e);
        for (o, q) in out.iter_mut().zip(mxfp4_values(&b.qs)) {
            *o = q as f32 * d;
        }
    }
}

pub fn dequant_iq4_nl(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockIQ4NL>(x).iter().zip(y.chunks_exact_mut(QK4_NL)) {
        let d = b.d.to_f32();
        for (o, q) in out.iter_mut().zip(iq4_nl_values(&b.qs)) {
            *o = q as f32 * d;
        }
    }
}

/// 2-bit values (0..4) of a Q2_K/Q3_K `qs` array, in element order: within each 128-element
/// half, byte `l` (of 32) holds elements `l`, `l+32`, `l+64`, `l+96` in bits 0-1, 2-3, 4-5, 6-7.
#[inline]
pub fn q2_bits(qs: &[u8; QK_K / 4]) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for n in 0..QK_K / 128 {
        for k in 0..4 {
            for l in 0..32 {
                v[n * 128 + k * 32 + l] = (qs[n * 32 + l] >> (2 * k)) & 3;
            }
        }
    }
    v
}

pub fn dequant_q2_k(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ2K>(x).iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        let q = q2_bits(&b.qs);
        for (g, sc) in b.scales.iter().enumerate() {
            let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
            for l in 0..16 {
                out[g * 16 + l] = dl * q[g * 16 + l] as f32 - ml;
            }
        }
    }
}

/// The 16 signed 6-bit scales (-32..32) of a Q3_K super-block.
#[inline]
pub fn q3_k_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for j in 0..16 {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Signed 3-bit values (-4..4) of one Q3_K super-block: the 2-bit part minus 4 where the high
/// bit (bit `k + 4n` of `hmask[l]` for element `128n + 32k + l`) is clear.
#[inline]
pub fn q3_k_values(b: &BlockQ3K) -> [i8; QK_K] {
    let low = q2_bits(&b.qs);
    let mut v = [0i8; QK_K];
    for (i, o) in v.iter_mut().enumerate() {
        let bit = i / 32;
        let h = (b.hmask[i % 32] >> bit) & 1;
        *o = low[i] as i8 - if h == 0 { 4 } else { 0 };
    }
    v
}

pub fn dequant_q3_k(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ3K>(x).iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let (q, sc) = (q3_k_values(b), q3_k_scales(&b.scales));
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * sc[i / 16] as f32 * q[i] as f32;
        }
    }
}

/// Unsigned 5-bit values (0..32) of one Q5_K super-block, in element order.
#[inline]
pub fn q5_k_values(b: &BlockQ5K) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for (c, q) in b.qs.chunks_exact(32).enumerate() {
        for l in 0..32 {
            let (h0, h1) = ((b.qh[l] >> (2 * c)) & 1, (b.qh[l] >> (2 * c + 1)) & 1);
            v[c * 64 + l] = (q[l] & 0xF) | (h0 << 4);
            v[c * 64 + 32 + l] = (q[l] >> 4) | (h1 << 4);
        }
    }
    v
}

pub fn dequant_q5_k(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockQ5K>(x).iter().zip(y.chunks_exact_mut(QK_K)) {
        dequant_k_min(b.d, b.dmin, &b.scales, &q5_k_values(b), out);
    }
}

/// The 8 signed 6-bit sub-block scales (-32..32) of an IQ4_XS super-block.
#[inline]
pub fn iq4_xs_scales(b: &BlockIQ4XS) -> [i8; 8] {
    iq4_xs_scales_of(b.scales_h, &b.scales_l)
}

/// [`iq4_xs_scales`] from the two scale fields (where they do not sit in a plain block: the
/// interleaved layout).
#[inline]
pub fn iq4_xs_scales_of(scales_h: u16, scales_l: &[u8; QK_K / 64]) -> [i8; 8] {
    let mut out = [0i8; 8];
    for (ib, o) in out.iter_mut().enumerate() {
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | ((((scales_h >> (2 * ib)) & 3) as u8) << 4);
        *o = ls as i8 - 32;
    }
    out
}

pub fn dequant_iq4_xs(x: &[u8], y: &mut [f32]) {
    for (b, out) in as_blocks::<BlockIQ4XS>(x).iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let sc = iq4_xs_scales(b);
        for (ib, o) in out.chunks_exact_mut(32).enumerate() {
            let qs: &[u8; 16] = b.qs[ib * 16..ib * 16 + 16].try_into().unwrap();
            let dl = d * sc[ib] as f32;
            for (o, q) in o.iter_mut().zip(iq4_nl_values(qs)) {
                *o = dl * q as f32;
            }
        }
    }
}

pub fn dequant_bf16(x: &[u8], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(as_blocks::<u16>(x)) {
        *o = bf16_to_f32(v);
    }
}

/// BF16 bits widened to f32 (exact: the top half of the f32's bits).
#[inline]
pub fn bf16_to_f32(v: u16) -> f32 {
    f32::from_bits((v as u32) << 16)
}

/// ggml's `ggml_compute_fp32_to_bf16`: round to nearest even; NaN stays a (quiet) NaN.
#[inline]
pub fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

pub fn quant_bf16(x: &[f32], y: &mut [u8]) {
    for (o, &v) in as_blocks_mut::<u16>(y).iter_mut().zip(x) {
        *o = f32_to_bf16(v);
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
pub(crate) fn nearest_int(f: f32) -> i32 {
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
