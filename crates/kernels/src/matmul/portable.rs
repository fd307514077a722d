//! Portable dot products between one weight row and one activation row in its `vec_dot_type`.
//! Integer sums per block as ggml does, then one float multiply-add per block.

use crate::quant::blocks::*;
use crate::quant::portable::*;
use crate::simd::{hsum_8, reduce_add_16};
use half::f16;

pub fn dot_f32(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<f32>(x), as_blocks::<f32>(y));
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

pub fn dot_f16(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<f16>(x), as_blocks::<f16>(y));
    x.iter().zip(y).map(|(a, b)| a.to_f32() * b.to_f32()).sum()
}

pub fn dot_q4_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4_1>(x), as_blocks::<BlockQ8_1>(y));
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for j in 0..QK4_1 / 2 {
            sumi += (a.qs[j] & 0xF) as i32 * b.qs[j] as i32;
            sumi += (a.qs[j] >> 4) as i32 * b.qs[j + QK4_1 / 2] as i32;
        }
        sum += a.d.to_f32() * b.d.to_f32() * sumi as f32 + a.m.to_f32() * b.s.to_f32();
    }
    sum
}

pub fn dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let q = q5_0_values(a);
        let sumi: i32 = q.iter().zip(&b.qs).map(|(&u, &v)| u as i32 * v as i32).sum();
        sum += a.d.to_f32() * b.d.to_f32() * sumi as f32;
    }
    sum
}

pub fn dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ8_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let sumi: i32 = a.qs.iter().zip(&b.qs).map(|(&u, &v)| u as i32 * v as i32).sum();
        sum += a.d.to_f32() * b.d.to_f32() * sumi as f32;
    }
    sum
}

/// Float order of ggml's repacked `q4_K_8x8` kernels (what llama.cpp runs for Q4_K on AVX2):
/// per super-block an exact integer sum for the scales and one for the mins, each folded into
/// its own running sum with one FMA by `d_w·d_x` (resp. `dmin_w·d_x`); the two are subtracted
/// at the end.
pub fn dot_q4_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4K>(x), as_blocks::<BlockQ8K>(y));
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (a, b) in x.iter().zip(y) {
        let q = q4_k_values(a);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(j, &a.scales);
            let s: i32 = (0..32).map(|l| q[j * 32 + l] as i32 * b.qs[j * 32 + l] as i32).sum();
            sumi += sc as i32 * s;
            summ += m as i32 * (b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32);
        }
        acc = (sumi as f32).mul_add(a.d.to_f32() * b.d, acc);
        acc_min = (summ as f32).mul_add(a.dmin.to_f32() * b.d, acc_min);
    }
    acc - acc_min
}

/// Float order of ggml's 4-row `q4_K_8x8` gemm (batch rows in complete groups of four): the
/// same integer sums as [`dot_q4_k_q8_k`], folded in per pair of sub-blocks (64 values) instead
/// of per super-block.
pub fn dot_q4_k_q8_k_tile(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4K>(x), as_blocks::<BlockQ8K>(y));
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (a, b) in x.iter().zip(y) {
        let q = q4_k_values(a);
        let (d, dmin) = (a.d.to_f32() * b.d, a.dmin.to_f32() * b.d);
        for p in 0..QK_K / 64 {
            let (mut sumi, mut summ) = (0i32, 0i32);
            for j in 2 * p..2 * p + 2 {
                let (sc, m) = scale_min_k4(j, &a.scales);
                let s: i32 = (0..32).map(|l| q[j * 32 + l] as i32 * b.qs[j * 32 + l] as i32).sum();
                sumi += sc as i32 * s;
                summ += m as i32 * (b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32);
            }
            acc = (sumi as f32).mul_add(d, acc);
            acc_min = (summ as f32).mul_add(dmin, acc_min);
        }
    }
    acc - acc_min
}

pub fn dot_q6_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ6K>(x), as_blocks::<BlockQ8K>(y));
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let q = q6_k_values(a);
        let mut sumi = 0i32;
        for g in 0..QK_K / 16 {
            let s: i32 = (0..16).map(|l| q[g * 16 + l] as i32 * b.qs[g * 16 + l] as i32).sum();
            sumi += a.scales[g] as i32 * s;
        }
        sum += b.d * a.d.to_f32() * sumi as f32;
    }
    sum
}

/// ggml's `ggml_vec_dot_bf16` without SIMD: f32 products summed in f64 (`ggml_float`).
pub fn dot_bf16(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<u16>(x), as_blocks::<u16>(y));
    bf16_tail(0.0, x, y)
}

/// The scalar tail every `ggml_vec_dot_bf16` path ends with (the SIMD kernels' too):
/// `sumf += (double)(x·y)`, then the sum as f32.
pub(crate) fn bf16_tail(mut sumf: f64, x: &[u16], y: &[u16]) -> f32 {
    for (&a, &b) in x.iter().zip(y) {
        sumf += (bf16_to_f32(a) * bf16_to_f32(b)) as f64;
    }
    sumf as f32
}

/// The portable twin of the AVX2 BF16 dot, in ggml's AVX2 order: per 32 values four 8-lane
/// accumulators `c += x·y` (product rounded, then the sum), combined `(c1 + c3) + (c2 + c4)`,
/// `hsum_f32x8`, then the f64 tail.
pub fn dot_bf16_avx2_order(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<u16>(x), as_blocks::<u16>(y));
    let n = x.len().min(y.len());
    let mut c = [[0f32; 8]; 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, c) in c.iter_mut().enumerate() {
            for (l, c) in c.iter_mut().enumerate() {
                *c += bf16_to_f32(x[i + 8 * k + l]) * bf16_to_f32(y[i + 8 * k + l]);
            }
        }
        i += 32;
    }
    let v: [f32; 8] = std::array::from_fn(|l| (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]));
    bf16_tail(hsum_8(&v) as f64, &x[i..n], &y[i..n])
}

/// One step of `vdpbf16ps` on lane values: `(c + a1·b1) + a0·b0`, each sum rounded, BF16
/// denormals read as zero and denormal sums flushed.
fn dpbf16(c: f32, a: [u16; 2], b: [u16; 2]) -> f32 {
    let daz = |v: u16| if v & 0x7F80 == 0 { 0f32.copysign(bf16_to_f32(v)) } else { bf16_to_f32(v) };
    let ftz = |v: f32| if v.is_subnormal() { 0f32.copysign(v) } else { v };
    ftz(ftz(c + daz(a[1]) * daz(b[1])) + daz(a[0]) * daz(b[0]))
}

/// The portable twin of the dense types' batch dots (`x86::avx512_dense::batch_*`, llamafile's
/// tinyBLAS on AVX-512): 16 lanes, lane j accumulating values `j` of each step of 16 (F32, F16:
/// FMA of the values as f32) or pairs `2j, 2j+1` of each step of 32 (BF16: `vdpbf16ps`), then
/// `_mm512_reduce_add_ps`. `t`: F32, F16 or BF16; `k` a multiple of the step.
pub fn batch_order(t: crate::DType, x: &[u8], y: &[u8]) -> f32 {
    let mut c = [0f32; 16];
    match t {
        crate::DType::F32 => {
            let (x, y) = (as_blocks::<f32>(x), as_blocks::<f32>(y));
            for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
                c[i % 16] = a.mul_add(b, c[i % 16]);
            }
        }
        crate::DType::F16 => {
            let (x, y) = (as_blocks::<half::f16>(x), as_blocks::<half::f16>(y));
            for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
                c[i % 16] = a.to_f32().mul_add(b.to_f32(), c[i % 16]);
            }
        }
        _ => {
            let (x, y) = (as_blocks::<u16>(x), as_blocks::<u16>(y));
            for (i, (a, b)) in x.chunks_exact(2).zip(y.chunks_exact(2)).enumerate() {
                c[i % 16] = dpbf16(c[i % 16], [a[0], a[1]], [b[0], b[1]]);
            }
        }
    }
    reduce_add_16(&c)
}

/// The portable twin of the AVX-512 BF16 dot, in ggml's `__AVX512BF16__` order: per 64 values
/// two 16-lane `vdpbf16ps` accumulators (lane j: `c = (c + x[2j+1]·y[2j+1]) + x[2j]·y[2j]`, each
/// sum rounded, BF16 denormals read as zero and denormal sums flushed, as the instruction does),
/// each reduced as GCC's `_mm512_reduce_add_ps` (halves down to two lanes) into the f64 sum,
/// then the f64 tail.
pub fn dot_bf16_dp_order(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<u16>(x), as_blocks::<u16>(y));
    let n = x.len().min(y.len());
    let mut c = [[0f32; 16]; 2];
    let mut i = 0;
    while i + 64 <= n {
        for (k, c) in c.iter_mut().enumerate() {
            for (j, c) in c.iter_mut().enumerate() {
                let e = i + 32 * k + 2 * j;
                *c = dpbf16(*c, [x[e], x[e + 1]], [y[e], y[e + 1]]);
            }
        }
        i += 64;
    }
    let sumf = reduce_add_16(&c[0]) as f64 + reduce_add_16(&c[1]) as f64;
    bf16_tail(sumf, &x[i..n], &y[i..n])
}

/// Integer dot of 32 signed weights with 32 activations.
#[inline]
fn isum(q: &[i8], a: &[i8]) -> i32 {
    q.iter().zip(a).map(|(&u, &v)| u as i32 * v as i32).sum()
}

#[inline]
fn usum(q: &[u8], a: &[i8]) -> i32 {
    q.iter().zip(a).map(|(&u, &v)| u as i32 * v as i32).sum()
}

pub fn dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4_0>(x), as_blocks::<BlockQ8_0>(y));
    x.iter().zip(y).map(|(a, b)| a.d.to_f32() * b.d.to_f32() * isum(&q4_0_values(a), &b.qs) as f32).sum()
}

pub fn dot_q5_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_1>(x), as_blocks::<BlockQ8_1>(y));
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let sumi = usum(&q5_1_values(a), &b.qs);
        sum += a.d.to_f32() * b.d.to_f32() * sumi as f32 + a.m.to_f32() * b.s.to_f32();
    }
    sum
}

/// ggml's `ggml_vec_dot_mxfp4_q8_0_generic`: per block `d_y · e8m0_half(e) · Σ v·y`.
pub fn dot_mxfp4_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockMXFP4>(x), as_blocks::<BlockQ8_0>(y));
    x.iter().zip(y).map(|(a, b)| b.d.to_f32() * e8m0_half(a.e) * isum(&mxfp4_values(&a.qs), &b.qs) as f32).sum()
}

pub fn dot_iq4_nl_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockIQ4NL>(x), as_blocks::<BlockQ8_0>(y));
    x.iter().zip(y).map(|(a, b)| a.d.to_f32() * b.d.to_f32() * isum(&iq4_nl_values(&a.qs), &b.qs) as f32).sum()
}

pub fn dot_q2_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ2K>(x), as_blocks::<BlockQ8K>(y));
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let q = q2_bits(&a.qs);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for (g, &sc) in a.scales.iter().enumerate() {
            sumi += (sc & 0xF) as i32 * usum(&q[g * 16..g * 16 + 16], &b.qs[g * 16..g * 16 + 16]);
            summ += (sc >> 4) as i32 * b.bsums[g] as i32;
        }
        sum += b.d * a.d.to_f32() * sumi as f32 - b.d * a.dmin.to_f32() * summ as f32;
    }
    sum
}

pub fn dot_q3_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ3K>(x), as_blocks::<BlockQ8K>(y));
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (q, sc) = (q3_k_values(a), q3_k_scales(&a.scales));
        let sumi: i32 = (0..16).map(|g| sc[g] as i32 * isum(&q[g * 16..g * 16 + 16], &b.qs[g * 16..g * 16 + 16])).sum();
        sum += b.d * a.d.to_f32() * sumi as f32;
    }
    sum
}

pub fn dot_q5_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5K>(x), as_blocks::<BlockQ8K>(y));
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let q = q5_k_values(a);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(j, &a.scales);
            sumi += sc as i32 * usum(&q[j * 32..j * 32 + 32], &b.qs[j * 32..j * 32 + 32]);
            summ += m as i32 * (b.bsums[2 * j] as i32 + b.bsums[2 * j + 1] as i32);
        }
        sum += b.d * a.d.to_f32() * sumi as f32 - b.d * a.dmin.to_f32() * summ as f32;
    }
    sum
}

pub fn dot_iq4_xs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockIQ4XS>(x), as_blocks::<BlockQ8K>(y));
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let sc = iq4_xs_scales(a);
        let mut sumi = 0i32;
        for ib in 0..QK_K / 32 {
            let qs: &[u8; 16] = a.qs[ib * 16..ib * 16 + 16].try_into().unwrap();
            sumi += sc[ib] as i32 * isum(&iq4_nl_values(qs), &b.qs[ib * 32..ib * 32 + 32]);
        }
        sum += b.d * a.d.to_f32() * sumi as f32;
    }
    sum
}

/// ggml-cpu's AVX-512 accumulation (`GGML_F32_STEP` 64: four 16-lane accumulators of fused
/// multiply-adds), folded 0+2, 1+3, then 0+1, the 16 lanes reduced as GCC's
/// `_mm512_reduce_add_ps` does: the sum of the products `pair(k)` over the first `n & !63`
/// values. The rest is each caller's tail.
fn ggml_steps64(n: usize, pair: impl Fn(usize) -> (f32, f32)) -> f32 {
    let mut acc = [[0f32; 16]; 4];
    for i in (0..n & !63).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, al) in a.iter_mut().enumerate() {
                let (x, y) = pair(i + j * 16 + l);
                *al = x.mul_add(y, *al);
            }
        }
    }
    for l in 0..16 {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
    }
    for l in 0..16 {
        acc[0][l] += acc[1][l];
    }
    reduce_add_16(&acc[0])
}

/// F32 dot product in the order ggml-cpu's AVX-512 build sums it (`ggml_vec_dot_f32`):
/// [`ggml_steps64`], then the tail value by value in f32 (`sumf += x[i]*y[i]`, which GCC
/// contracts into a fused multiply-add). The matmuls of F32 weights — routers, LoRA adapters —
/// give llama.cpp's bits with it.
pub fn dot_f32_ggml(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<f32>(x), as_blocks::<f32>(y));
    let n = x.len().min(y.len());
    let mut sum = ggml_steps64(n, |k| (x[k], y[k]));
    for k in n & !63..n {
        sum = x[k].mul_add(y[k], sum);
    }
    sum
}

/// F16 dot product in exactly the order ggml-cpu's AVX-512 build sums it (`ggml_vec_dot_f16`
/// with `F32Cx16`): [`ggml_steps64`] on the values widened to f32, the tail added in double.
/// Attention scores of massive-activation rows are sensitive to these bits.
pub fn dot_f16_ggml(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let mut sum = ggml_steps64(n, |k| (x[k].to_f32(), y[k].to_f32())) as f64;
    for k in n & !63..n {
        sum += (x[k].to_f32() * y[k].to_f32()) as f64;
    }
    sum as f32
}

/// An i-quant row against Q8_K activations in ggml's generic order (`quant::iq`): per
/// super-block the exact `Σ ls·Σ v·y`, one float multiply-add, the type's constant at the end;
/// IQ1 adds its shifts' `Σ ls·±Σ y` at 1/8 inside the super-block's product.
pub fn dot_iq_q8_k(t: crate::quant::iq::IqType, x: &[u8], y: &[u8]) -> f32 {
    let y = as_blocks::<BlockQ8K>(y);
    let mut sumf = 0f32;
    for (xb, b) in x.chunks_exact(t.block_bytes()).zip(y) {
        let q = t.decode(xb);
        let (mut sumi, mut shifts) = (0i32, 0i32);
        for g in 0..QK_K / 16 {
            let (v, ys) = (&q.v[16 * g..16 * g + 16], &b.qs[16 * g..16 * g + 16]);
            sumi += q.ls[g] as i32 * v.iter().zip(ys).map(|(&a, &c)| a as i32 * c as i32).sum::<i32>();
            if t.shifted() {
                let s8 = |h: usize| q.shift[2 * g + h] as i32 * ys[8 * h..8 * h + 8].iter().map(|&c| c as i32).sum::<i32>();
                shifts += q.ls[g] as i32 * (s8(0) + s8(1));
            }
        }
        if t.shifted() {
            sumf += q.d * b.d * (sumi as f32 + 0.125 * shifts as f32);
        } else {
            sumf += q.d * b.d * sumi as f32;
        }
    }
    t.c() * sumf
}
