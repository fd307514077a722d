//! The x86 SIMD dot products' float order written out without SIMD: the reference every SIMD
//! table's dot of these types equals bit for bit (AVX2 and AVX-512 on x86, NEON on aarch64), so
//! a machine of either architecture gives the logits of the AVX-512 llama.cpp that made the
//! golden data. ggml's generic scalar order (`matmul::portable`, one float per block) differs
//! from it in the last bits.
//!
//! Per 32-value block, eight f32 lanes: lane `L` takes the exact integer `Σ q·y` of values
//! `4L‥4L+4` and accumulates `acc_L = fma(d_w·d_y, sum, acc_L)` (`_mm256_fmadd_ps`); at the end
//! `hsum_f32x8` (`simd::hsum_8`), plus for types with a min `Σ m·s` summed block by block.
//! Q6_K keeps eight lanes per super-block the same way (ggml's AVX2 kernel, see
//! `x86::avx2::dot_q6_k_q8_k`), and Q2_K, Q3_K, Q5_K and IQ4_XS likewise (`x86::avx2_ext`). Q4_K's order (one FMA per super-block on exact integers) is
//! already `portable::dot_q4_k_q8_k`'s.

use crate::quant::blocks::*;
use crate::quant::portable::*;
use crate::simd::hsum_8;

/// One block: `acc_L = fma(d, Σ_{4L ≤ i < 4L+4} w_i·y_i, acc_L)`.
#[inline]
fn block(acc: &mut [f32; 8], d: f32, w: &[i32; 32], y: &[i8; 32]) {
    for (l, a) in acc.iter_mut().enumerate() {
        let s: i32 = (4 * l..4 * l + 4).map(|i| w[i] * y[i] as i32).sum();
        *a = d.mul_add(s as f32, *a);
    }
}

fn widen<T: Copy + Into<i32>>(v: [T; 32]) -> [i32; 32] {
    v.map(Into::into)
}

pub fn dot_q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = [0f32; 8];
    for (a, b) in x.iter().zip(y) {
        block(&mut acc, a.d.to_f32() * b.d.to_f32(), &widen(q4_0_values(a)), &b.qs);
    }
    hsum_8(&acc)
}

pub fn dot_q4_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ4_1>(x), as_blocks::<BlockQ8_1>(y));
    let (mut acc, mut summs) = ([0f32; 8], 0f32);
    for (a, b) in x.iter().zip(y) {
        let w: [i32; 32] = std::array::from_fn(|i| (if i < 16 { a.qs[i] & 0xF } else { a.qs[i - 16] >> 4 }) as i32);
        summs += a.m.to_f32() * b.s.to_f32();
        block(&mut acc, a.d.to_f32() * b.d.to_f32(), &w, &b.qs);
    }
    hsum_8(&acc) + summs
}

pub fn dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = [0f32; 8];
    for (a, b) in x.iter().zip(y) {
        block(&mut acc, a.d.to_f32() * b.d.to_f32(), &widen(q5_0_values(a)), &b.qs);
    }
    hsum_8(&acc)
}

pub fn dot_q5_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_1>(x), as_blocks::<BlockQ8_1>(y));
    let (mut acc, mut summs) = ([0f32; 8], 0f32);
    for (a, b) in x.iter().zip(y) {
        summs += a.m.to_f32() * b.s.to_f32();
        block(&mut acc, a.d.to_f32() * b.d.to_f32(), &widen(q5_1_values(a)), &b.qs);
    }
    hsum_8(&acc) + summs
}

pub fn dot_q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ8_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = [0f32; 8];
    for (a, b) in x.iter().zip(y) {
        block(&mut acc, a.d.to_f32() * b.d.to_f32(), &widen(a.qs), &b.qs);
    }
    hsum_8(&acc)
}

pub fn dot_iq4_nl_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockIQ4NL>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = [0f32; 8];
    for (a, b) in x.iter().zip(y) {
        block(&mut acc, a.d.to_f32() * b.d.to_f32(), &widen(iq4_nl_values(&a.qs)), &b.qs);
    }
    hsum_8(&acc)
}

/// ggml's AVX2 MXFP4 order (`ggml_vec_dot_mxfp4_q8_0`): blocks in pairs, the first of each
/// pair into one set of eight lanes and the second into another (`acc_L = fma(d_y·d_w, sum,
/// acc_L)`, `d_w` = [`e8m0_half`]), the two sets added lane by lane and summed
/// (`hsum_f32x8`); an odd last block then added as one float, as its scalar tail does.
pub fn dot_mxfp4_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockMXFP4>(x), as_blocks::<BlockQ8_0>(y));
    let (mut a1, mut a2) = ([0f32; 8], [0f32; 8]);
    let pairs = x.len() / 2;
    for i in 0..pairs {
        for (acc, j) in [(&mut a1, 2 * i), (&mut a2, 2 * i + 1)] {
            let (a, b) = (&x[j], &y[j]);
            block(acc, b.d.to_f32() * e8m0_half(a.e), &widen(mxfp4_values(&a.qs)), &b.qs);
        }
    }
    let sum: [f32; 8] = std::array::from_fn(|l| a1[l] + a2[l]);
    let s = hsum_8(&sum);
    match (x.get(2 * pairs), y.get(2 * pairs)) {
        (Some(a), Some(b)) => s + mxfp4_odd_block(a, b),
        _ => s,
    }
}

/// The MXFP4 dots' odd last block as one float, as ggml's AVX2 scalar tail computes it:
/// `d_y · d_w · Σ v·y` (the NEON kernels add it the same way).
pub(crate) fn mxfp4_odd_block(a: &BlockMXFP4, b: &BlockQ8_0) -> f32 {
    let v = mxfp4_values(&a.qs);
    let sumi: i32 = v.iter().zip(&b.qs).map(|(&w, &q)| w as i32 * q as i32).sum();
    b.d.to_f32() * e8m0_half(a.e) * sumi as f32
}

/// ggml's AVX2 IQ4_XS order: per super-block, lane L sums over the eight 32-value sub-blocks
/// the products of values `4L‥4L+4` of the sub-block's first (L < 4) or second half, times the
/// sub-block's scale; then `acc_L = fma(d_w·d_y, lane, acc_L)`.
pub fn dot_iq4_xs_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockIQ4XS>(x), as_blocks::<BlockQ8K>(y));
    let mut acc = [0f32; 8];
    for (a, b) in x.iter().zip(y) {
        let sc = iq4_xs_scales(a);
        let mut sumi = [0i32; 8];
        for (grp, &s) in sc.iter().enumerate() {
            let v = iq4_nl_values(a.qs[16 * grp..16 * grp + 16].try_into().expect("16 bytes"));
            for (l, acc) in sumi.iter_mut().enumerate() {
                let p: i32 = (4 * l..4 * l + 4).map(|i| v[i] as i32 * b.qs[32 * grp + i] as i32).sum();
                *acc += s as i32 * p;
            }
        }
        let d = a.d.to_f32() * b.d;
        for (a, &s) in acc.iter_mut().zip(&sumi) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum_8(&acc)
}

/// ggml's AVX2 Q6_K order: per super-block, lane L sums over the eight 32-value groups the
/// products of values `4L‥4L+4` of the group's first (L < 4) or second (L ≥ 4) half times that
/// half's scale, less `32·(bsums[2L]·sc[2L] + bsums[2L+1]·sc[2L+1])` (the −32 offset); then
/// `acc_L = fma(d_w·d_y, lane, acc_L)`.
pub fn dot_q6_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ6K>(x), as_blocks::<BlockQ8K>(y));
    let mut acc = [0f32; 8];
    for (a, b) in x.iter().zip(y) {
        // Unsigned 6-bit values (q + 32), element order.
        let u = q6_k_values(a).map(|v| v as i32 + 32);
        let mut sumi = [0i32; 8];
        for (l, s) in sumi.iter_mut().enumerate() {
            *s = -32 * (b.bsums[2 * l] as i32 * a.scales[2 * l] as i32 + b.bsums[2 * l + 1] as i32 * a.scales[2 * l + 1] as i32);
        }
        for grp in 0..QK_K / 32 {
            for (l, s) in sumi.iter_mut().enumerate() {
                let at = 32 * grp + 4 * l;
                let p: i32 = (at..at + 4).map(|i| u[i] * b.qs[i] as i32).sum();
                *s += a.scales[2 * grp + l / 4] as i32 * p;
            }
        }
        let d = b.d * a.d.to_f32();
        for (a, &s) in acc.iter_mut().zip(&sumi) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum_8(&acc)
}

/// ggml's AVX2 Q5_K order (`x86::avx2_ext::dot_q5_k_q8_k`): per super-block, lane L sums over
/// the eight 32-value groups the products of values `4L‥4L+4` of the group times its scale
/// (exact); `acc_L = fma(d_w·d_y, lane, acc_L)`; the mins `Σ m·(bsums pair)` in an integer per
/// super-block, summed as `(dmin·d_y)·summ` in one float, subtracted after `hsum_f32x8`.
pub fn dot_q5_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5K>(x), as_blocks::<BlockQ8K>(y));
    let (mut acc, mut acc_m) = ([0f32; 8], 0f32);
    for (a, b) in x.iter().zip(y) {
        let u = q5_k_values(a);
        let (mut sumi, mut summ) = ([0i32; 8], 0i32);
        for grp in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(grp, &a.scales);
            summ += m as i32 * (b.bsums[2 * grp] as i32 + b.bsums[2 * grp + 1] as i32);
            for (l, s) in sumi.iter_mut().enumerate() {
                let at = 32 * grp + 4 * l;
                let p: i32 = (at..at + 4).map(|i| u[i] as i32 * b.qs[i] as i32).sum();
                *s += sc as i32 * p;
            }
        }
        let d = a.d.to_f32() * b.d;
        for (a, &s) in acc.iter_mut().zip(&sumi) {
            *a = d.mul_add(s as f32, *a);
        }
        acc_m += a.dmin.to_f32() * b.d * summ as f32;
    }
    hsum_8(&acc) - acc_m
}

/// The eight exact lane sums of a 2-bit-based super-block (Q2_K, Q3_K) in ggml's AVX2 order:
/// lane L sums over the eight 32-value groups the products of values `4L‥4L+4` of the group
/// times the scale of its first (L < 4) or second (L ≥ 4) 16 values (`sc[g]`, g = element / 16).
fn lanes_16(v: &[i8; QK_K], sc: impl Fn(usize) -> i32, y: &[i8; QK_K]) -> [i32; 8] {
    let mut sumi = [0i32; 8];
    for grp in 0..QK_K / 32 {
        for (l, s) in sumi.iter_mut().enumerate() {
            let at = 32 * grp + 4 * l;
            let p: i32 = (at..at + 4).map(|i| v[i] as i32 * y[i] as i32).sum();
            *s += sc(2 * grp + l / 4) * p;
        }
    }
    sumi
}

/// ggml's AVX2 Q2_K order (`x86::avx2_ext::dot_q2_k_q8_k`): per super-block [`lanes_16`] with
/// the scales' low nibbles, `acc_L = fma(d_w·d_y, lane, acc_L)`; the mins `Σ (sc >> 4)·bsums`
/// in an integer per super-block, as `(dmin·d_y)·summ` in one float, subtracted after
/// `hsum_f32x8`.
pub fn dot_q2_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ2K>(x), as_blocks::<BlockQ8K>(y));
    let (mut acc, mut acc_m) = ([0f32; 8], 0f32);
    for (a, b) in x.iter().zip(y) {
        let v = q2_bits(&a.qs).map(|q| q as i8);
        let sumi = lanes_16(&v, |g| (a.scales[g] & 0xF) as i32, &b.qs);
        let summ: i32 = a.scales.iter().zip(&b.bsums).map(|(&sc, &s)| (sc >> 4) as i32 * s as i32).sum();
        let d = a.d.to_f32() * b.d;
        for (a, &s) in acc.iter_mut().zip(&sumi) {
            *a = d.mul_add(s as f32, *a);
        }
        acc_m += a.dmin.to_f32() * b.d * summ as f32;
    }
    hsum_8(&acc) - acc_m
}

/// ggml's AVX2 Q3_K order (`x86::avx2_ext::dot_q3_k_q8_k`): per super-block [`lanes_16`] of
/// the signed 3-bit values with the signed 6-bit scales, `acc_L = fma(d_w·d_y, lane, acc_L)`,
/// then `hsum_f32x8`.
pub fn dot_q3_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ3K>(x), as_blocks::<BlockQ8K>(y));
    let mut acc = [0f32; 8];
    for (a, b) in x.iter().zip(y) {
        let sc = q3_k_scales(&a.scales);
        let sumi = lanes_16(&q3_k_values(a), |g| sc[g] as i32, &b.qs);
        let d = a.d.to_f32() * b.d;
        for (a, &s) in acc.iter_mut().zip(&sumi) {
            *a = d.mul_add(s as f32, *a);
        }
    }
    hsum_8(&acc)
}

/// F32·F32 in the AVX2 kernel's order (`x86::avx2::dot_f32`): per 8 values one fused
/// multiply-add per lane (lane `L` takes values `8i + L`), `hsum_f32x8` of the lanes, then the
/// ragged tail added value by value (product rounded, then the sum).
pub fn dot_f32(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<f32>(x), as_blocks::<f32>(y));
    let n = x.len().min(y.len());
    let mut acc = [0f32; 8];
    for (a, b) in x[..n - n % 8].chunks_exact(8).zip(y.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = a[l].mul_add(b[l], acc[l]);
        }
    }
    let mut s = hsum_8(&acc);
    for j in n - n % 8..n {
        s += x[j] * y[j];
    }
    s
}

/// An i-quant row against Q8_K in ggml's AVX2 order (`x86::avx2_iq`): per super-block eight
/// exact lane sums, lane `L` over values `4L‥4L+4` of each 32 times their scale, one FMA per
/// lane; the type's constant times `hsum_8` at the end. IQ1_S adds `Σ d·(Σ ls·±Σ y)` (one
/// fused multiply-add a super-block, the sums from `bsums`) at 1/8; IQ1_M keeps its shifts in eight lanes
/// of their own, added at 1/8 after both sums.
pub fn dot_iq_q8_k(t: crate::quant::iq::IqType, x: &[u8], y: &[u8]) -> f32 {
    use crate::quant::iq::IqType;
    let y = as_blocks::<BlockQ8K>(y);
    let (mut acc, mut acc2, mut shifts1) = ([0f32; 8], [0f32; 8], 0f32);
    for (xb, b) in x.chunks_exact(t.block_bytes()).zip(y) {
        let q = t.decode(xb);
        let d = q.d * b.d;
        let (mut lanes, mut lanes2, mut sumi1) = ([0i32; 8], [0i32; 8], 0i32);
        for c in 0..QK_K / 32 {
            for (l, (s, s2)) in lanes.iter_mut().zip(&mut lanes2).enumerate() {
                let (i, ls) = (32 * c + 4 * l, q.ls[2 * c + l / 4] as i32);
                *s += ls * (i..i + 4).map(|j| q.v[j] as i32 * b.qs[j] as i32).sum::<i32>();
                *s2 += ls * q.shift[i / 8] as i32 * (i..i + 4).map(|j| b.qs[j] as i32).sum::<i32>();
            }
            if t == IqType::IQ1S {
                sumi1 += (b.bsums[2 * c] as i32 + b.bsums[2 * c + 1] as i32) * q.shift[4 * c] as i32 * q.ls[2 * c] as i32;
            }
        }
        for l in 0..8 {
            acc[l] = d.mul_add(lanes[l] as f32, acc[l]);
            acc2[l] = d.mul_add(lanes2[l] as f32, acc2[l]);
        }
        // ggml's build contracts `accum1 += d * sumi1` into an FMA.
        shifts1 = d.mul_add(sumi1 as f32, shifts1);
    }
    match t {
        IqType::IQ1S => hsum_8(&acc) + 0.125 * shifts1,
        IqType::IQ1M => hsum_8(&acc) + 0.125 * hsum_8(&acc2),
        _ => t.c() * hsum_8(&acc),
    }
}
