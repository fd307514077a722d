//! Weight quantizers with ggml's reference semantics (`quantize_row_*_ref` in ggml-quants.c,
//! what `ggml_quantize_chunk` and llama.cpp's `llama-quantize` run without an importance
//! matrix), bit for bit: same operation order, same rounding (`nearest_int`, truncating
//! casts), same search over scales for the K-quants. `corelm quantize` uses them; the KV cache
//! uses `quant_q4_0` (ggml's CPU `from_float` for Q4_0 is this reference too).
//!
//! These differ on purpose from the activation quantizers in `quant` (Q8_0 there follows
//! ggml's SIMD `quantize_row_q8_0`: `127/amax` and half-to-even, here `1/d` and `roundf`).

use super::blocks::*;
use super::portable::nearest_int;
use half::f16;

/// Index and value of the element of largest magnitude (first on ties), as ggml scans.
#[inline]
fn abs_max(xs: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xs {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

#[inline]
fn min_max(xs: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in xs {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// ggml's `quantize_row_q4_0_ref` (what its CPU backend also runs): the scale is the value of
/// largest magnitude over -8, codes `min(15, trunc(x/d + 8.5))`.
pub fn quant_q4_0(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ4_0>(y).iter_mut().zip(x.chunks_exact(QK4_0)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xs {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        for j in 0..QK4_0 / 2 {
            let q0 = ((xs[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((xs[j + QK4_0 / 2] * id + 8.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

pub fn quant_q4_1(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ4_1>(y).iter_mut().zip(x.chunks_exact(QK4_1)) {
        let (min, max) = min_max(xs);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        b.m = f16::from_f32(min);
        for j in 0..QK4_1 / 2 {
            let q0 = (((xs[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((xs[j + QK4_1 / 2] - min) * id + 0.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

pub fn quant_q5_0(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ5_0>(y).iter_mut().zip(x.chunks_exact(QK5_0)) {
        let (_, max) = abs_max(xs);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        let q: [u8; QK5_0] = std::array::from_fn(|j| ((xs[j] * id + 16.5) as i8).min(31) as u8);
        b.qh = pack_5bit(&q, &mut b.qs);
    }
}

/// 32 five-bit codes in Q5_0/Q5_1's layout: the low nibbles of elements j and j + 16 share
/// byte j of `qs`, and bit j of the returned `qh` is element j's fifth bit.
fn pack_5bit(q: &[u8; 32], qs: &mut [u8; 16]) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= (((q[j] & 0x10) >> 4) as u32) << j;
        qh |= (((q[j + 16] & 0x10) >> 4) as u32) << (j + 16);
    }
    qh.to_le_bytes()
}

pub fn quant_q5_1(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ5_1>(y).iter_mut().zip(x.chunks_exact(QK5_1)) {
        let (min, max) = min_max(xs);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        b.m = f16::from_f32(min);
        let q: [u8; QK5_1] = std::array::from_fn(|j| ((xs[j] - min) * id + 0.5) as u8);
        b.qh = pack_5bit(&q, &mut b.qs);
    }
}

pub fn quant_q8_0(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockQ8_0>(y).iter_mut().zip(x.chunks_exact(QK8_0)) {
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
        }
    }
}

/// ggml's `make_qkx2_quants`: an asymmetric `n`-element quantization to `0..=nmax` with a
/// weighted least-squares search over `nstep + 1` scales. Returns (scale, -min).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    x: &[f32],
    nmax: i32,
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.clamp(0, nmax) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

pub fn quant_q4_k(x: &[f32], y: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut l_aux = [0u8; 32];
    let mut weights = [0f32; 32];
    for (b, xs) in as_blocks_mut::<BlockQ4K>(y).iter_mut().zip(x.chunks_exact(QK_K)) {
        let (mut scales, mut mins) = ([0f32; QK_K / 32], [0f32; QK_K / 32]);
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..QK_K / 32 {
            let xj = &xs[32 * j..32 * j + 32];
            let mut sum_x2 = 0f32;
            for &v in xj {
                sum_x2 += v * v;
            }
            let av_x = (sum_x2 / 32.0).sqrt();
            for (w, &v) in weights.iter_mut().zip(xj) {
                *w = av_x + v.abs();
            }
            let (s, m) = make_qkx2_quants(xj, 15, &weights, &mut l[32 * j..32 * j + 32], &mut l_aux, -1.0, 0.1, 20);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        b.scales = [0; K_SCALE_SIZE];
        for j in 0..QK_K / 32 {
            let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
            if j < 4 {
                b.scales[j] = ls;
                b.scales[j + 4] = lm;
            } else {
                b.scales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                b.scales[j - 4] |= (ls >> 4) << 6;
                b.scales[j] |= (lm >> 4) << 6;
            }
        }
        b.d = f16::from_f32(max_scale / 63.0);
        b.dmin = f16::from_f32(max_min / 63.0);
        for j in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(j, &b.scales);
            let d = b.d.to_f32() * sc as f32;
            if d == 0.0 {
                continue;
            }
            let dm = b.dmin.to_f32() * m as f32;
            for ii in 0..32 {
                l[32 * j + ii] = nearest_int((xs[32 * j + ii] + dm) / d).clamp(0, 15) as u8;
            }
        }
        for (c, q) in b.qs.chunks_exact_mut(32).enumerate() {
            for i in 0..32 {
                q[i] = l[64 * c + i] | (l[64 * c + i + 32] << 4);
            }
        }
    }
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no importance weights: a symmetric
/// quantization to `-nmax..nmax-1` (stored `+ nmax`) with a search over 18 scales.
fn make_qx_quants(x: &[f32], nmax: i32, l_out: &mut [i8]) -> f32 {
    let (amax, max) = abs_max(x);
    if amax < 1e-15 {
        l_out.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = -nmaxf / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (i, &v) in x.iter().enumerate() {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                l_out[i] = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

pub fn quant_q6_k(x: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    for (b, xs) in as_blocks_mut::<BlockQ6K>(y).iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut scales = [0f32; QK_K / 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for ib in 0..QK_K / 16 {
            let s = make_qx_quants(&xs[16 * ib..16 * ib + 16], 32, &mut l[16 * ib..16 * ib + 16]);
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < 1e-15 {
            b.ql = [0; QK_K / 2];
            b.qh = [0; QK_K / 4];
            b.scales = [0; QK_K / 16];
            b.d = f16::ZERO;
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = f16::from_f32(1.0 / iscale);
        for ib in 0..QK_K / 16 {
            b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = b.d.to_f32() * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(xs[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for (n, (ql, qh)) in b.ql.chunks_exact_mut(64).zip(b.qh.chunks_exact_mut(32)).enumerate() {
            let lj = &l[128 * n..128 * n + 128];
            for i in 0..32 {
                let q = |k: usize| lj[i + 32 * k] as u8;
                ql[i] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
                ql[i + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
                qh[i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
    }
}

/// ggml's `best_index_int8`: the index of the grid value nearest `x` (the lower on ties),
/// by bisection over the sorted grid.
fn best_index_int8(val: &[i8; 16], x: f32) -> usize {
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0, 15);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < val[mu] as f32 - x {
        mu - 1
    } else {
        mu
    }
}

/// ggml's `quantize_row_iq4_nl_impl` without an importance matrix and with `ntry` = 7 (what
/// `ggml_quantize_chunk` runs for IQ4_NL and IQ4_XS): per 32-value block a scale fitted by
/// weighted least squares (weights `x²`) over 15 trial grid scalings, then, for a super-block
/// of several blocks (IQ4_XS), the block scales quantized to 6 bits against one f16 scale and
/// the codes chosen again. Returns the super-block scale, the 6-bit block scales (offset by
/// 32) and the codes (`l.len()` = the super-block's values).
fn iq4_impl(x: &[f32], l: &mut [u8], ls: &mut [u8; 8]) -> f16 {
    const NTRY: i32 = 7;
    let values = &KVALUES_IQ4NL;
    let nblocks = x.len() / 32;
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..nblocks {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut l[32 * ib..32 * ib + 32];
        let weight: [f32; 32] = std::array::from_fn(|j| xb[j] * xb[j]);
        let (amax, max) = abs_max(xb);
        if amax < 1e-15 {
            scales[ib] = 0.0;
            continue;
        }
        let d = -max / values[0] as f32;
        let id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for j in 0..32 {
            let k = best_index_int8(values, id * xb[j]);
            lb[j] = k as u8;
            let q = values[k] as f32;
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -NTRY..=NTRY {
            let id = (itry + values[0] as i32) as f32 / max;
            let (mut sumqx, mut sumq2) = (0f32, 0f32);
            for j in 0..32 {
                let q = values[best_index_int8(values, id * xb[j])] as f32;
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    if nblocks == 1 {
        let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
        for (lj, &xj) in l.iter_mut().zip(x) {
            *lj = best_index_int8(values, id * xj) as u8;
        }
        return f16::from_f32(scales[0]);
    }
    let d = -max_scale / 32.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for ib in 0..nblocks {
        let s = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * s as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for (lj, &xj) in l[32 * ib..32 * ib + 32].iter_mut().zip(&x[32 * ib..32 * ib + 32]) {
            *lj = best_index_int8(values, idl * xj) as u8;
        }
        ls[ib] = (s + 32) as u8;
    }
    f16::from_f32(d)
}

/// The codes of 32 values as 16 bytes: value `j` in the low nibble of byte `j`, value `16 + j`
/// in its high nibble.
fn iq4_nibbles(l: &[u8], qs: &mut [u8]) {
    for (j, q) in qs.iter_mut().enumerate() {
        *q = l[j] | (l[16 + j] << 4);
    }
}

/// ggml's `quantize_iq4_nl` (no importance matrix): one scale per 32 values, codes on the
/// non-linear grid.
pub fn quant_iq4_nl(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockIQ4NL>(y).iter_mut().zip(x.chunks_exact(QK4_NL)) {
        let mut l = [0u8; 32];
        b.d = iq4_impl(xs, &mut l, &mut [0; 8]);
        iq4_nibbles(&l, &mut b.qs);
    }
}

/// ggml's `quantize_iq4_xs` (no importance matrix): per 256 values one f16 scale and eight
/// 6-bit block scales, codes on the non-linear grid.
pub fn quant_iq4_xs(x: &[f32], y: &mut [u8]) {
    for (b, xs) in as_blocks_mut::<BlockIQ4XS>(y).iter_mut().zip(x.chunks_exact(QK_K)) {
        let (mut l, mut ls) = ([0u8; QK_K], [0u8; 8]);
        b.d = iq4_impl(xs, &mut l, &mut ls);
        b.scales_h = 0;
        b.scales_l = [0; 4];
        for (ib, &s) in ls.iter().enumerate() {
            b.scales_l[ib / 2] |= (s & 0xF) << (4 * (ib % 2));
            b.scales_h |= ((s >> 4) as u16) << (2 * ib);
        }
        for i in 0..QK_K / 32 {
            iq4_nibbles(&l[32 * i..32 * i + 32], &mut b.qs[16 * i..16 * i + 16]);
        }
    }
}

/// The reference quantizer of each type `corelm quantize` writes (and the plain conversions).
pub fn quantizer(t: crate::DType) -> Option<super::FromFloat> {
    use super::portable::{quant_bf16, quant_f16, quant_f32};
    use crate::DType::*;
    Some(match t {
        Q4_0 => quant_q4_0,
        Q4_1 => quant_q4_1,
        Q5_0 => quant_q5_0,
        Q5_1 => quant_q5_1,
        Q8_0 => quant_q8_0,
        Q4K => quant_q4_k,
        Q6K => quant_q6_k,
        IQ4NL => quant_iq4_nl,
        IQ4XS => quant_iq4_xs,
        F16 => quant_f16,
        BF16 => quant_bf16,
        F32 => quant_f32,
        _ => return None,
    })
}
