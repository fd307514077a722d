//! NEON dots of the dense weight types (F32, F16, BF16), each in the float order of an x86
//! table's kernel, so an ARM machine gives that table's values bit for bit:
//!
//! | type | order | reference twin |
//! |---|---|---|
//! | F32 | ggml's AVX-512 `ggml_vec_dot_f32` (the AVX-512 table's): four 16-lane accumulators over 64-value steps, folded, the tail one FMA per value | `matmul::portable::dot_f32_ggml` |
//! | F16 | ggml's AVX-512 `ggml_vec_dot_f16` (the AVX-512 table's and the attention kernels'): four 16-lane accumulators over 64-value steps, folded, the tail in double | `matmul::portable::dot_f16_ggml` |
//! | BF16 | ggml's AVX2 BF16 path: four 8-lane accumulators of rounded products per 32 values, the f64 tail | `matmul::portable::dot_bf16_avx2_order` |
//!
//! The batch dots of F32 and F16 (`BatchDot`: matmuls of two or more activation rows) follow
//! llamafile's tinyBLAS on AVX-512 (`portable::batch_order`: 16 lanes, one FMA chain each,
//! `_mm512_reduce_add_ps`), with its register tiles: so the aarch64 tables give the AVX-512
//! table's F32 and F16 values, single rows and batches alike.
//!
//! Every lane of those orders is a `float32x4_t` lane here (8 lanes: two registers, 16: four).
//! F16 values widen with `fcvtl` (`simd::aarch64::load_f16x8`, exact), BF16 values with a
//! 16-bit left shift (exact). NEON is the aarch64 baseline: these are safe functions.

use crate::quant::blocks::as_blocks;
use crate::simd::aarch64::{load_f16x8, reduce_add_16x4};
use half::f16;
use std::arch::aarch64::*;

/// ggml's AVX-512 accumulation (`matmul::portable::ggml_steps64`) over the first `np` values
/// (a multiple of 64): `load(o)` gives the 16 values at `o` of both rows, four lanes per
/// register; four 16-lane accumulators of fused multiply-adds, folded 0+2, 1+3, then 0+1, and
/// reduced as GCC's `_mm512_reduce_add_ps`.
fn ggml_steps64(np: usize, load: impl Fn(usize) -> ([float32x4_t; 4], [float32x4_t; 4])) -> f32 {
    // SAFETY: NEON is the aarch64 baseline (the loads are the caller's `load`).
    unsafe {
        // Accumulator j (values 16j‥16j+16 of each step) is `acc[j]`, four lanes per register.
        let mut acc = [[vdupq_n_f32(0.0); 4]; 4];
        for i in (0..np).step_by(64) {
            for (j, a) in acc.iter_mut().enumerate() {
                let (xv, yv) = load(i + 16 * j);
                for q in 0..4 {
                    a[q] = vfmaq_f32(a[q], xv[q], yv[q]);
                }
            }
        }
        for q in 0..4 {
            acc[0][q] = vaddq_f32(acc[0][q], acc[2][q]);
            acc[1][q] = vaddq_f32(acc[1][q], acc[3][q]);
        }
        for q in 0..4 {
            acc[0][q] = vaddq_f32(acc[0][q], acc[1][q]);
        }
        reduce_add_16x4(acc[0])
    }
}

/// F32·F32 in `matmul::portable::dot_f32_ggml`'s order (the AVX-512 table's): the tail one
/// fused multiply-add per value.
pub fn dot_f32_ggml(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<f32>(x), as_blocks::<f32>(y));
    let n = x.len().min(y.len());
    let np = n & !63;
    // SAFETY (the loads): 16 values at `o` ≤ `np - 16`, inside both slices.
    let load16 = |p: *const f32, o: usize| unsafe { [0, 4, 8, 12].map(|q| vld1q_f32(p.add(o + q))) };
    let mut sum = ggml_steps64(np, |o| (load16(x.as_ptr(), o), load16(y.as_ptr(), o)));
    for k in np..n {
        sum = x[k].mul_add(y[k], sum);
    }
    sum
}

/// F16·F16 in `matmul::portable::dot_f16_ggml`'s order.
pub fn dot_f16(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<f16>(x), as_blocks::<f16>(y));
    let n = x.len().min(y.len());
    let np = n & !63;
    // SAFETY (the loads): 16 values at `o` ≤ `np - 16`, inside both slices.
    let load = |o: usize| unsafe { (load16::<true>(x.as_ptr().add(o) as *const u8), load16::<true>(y.as_ptr().add(o) as *const u8)) };
    let mut sum = ggml_steps64(np, load) as f64;
    for k in np..n {
        sum += (x[k].to_f32() * y[k].to_f32()) as f64;
    }
    sum as f32
}

/// BF16·BF16 in `matmul::portable::dot_bf16_avx2_order`'s order.
pub fn dot_bf16(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<u16>(x), as_blocks::<u16>(y));
    let n = x.len().min(y.len());
    let body = n - n % 32;
    // SAFETY: NEON is the aarch64 baseline; every load reads 4 values at `i + 8k + 4h` ≤
    // `i + 28` with `i + 32 <= body <= n`, inside both slices.
    let head = unsafe {
        // BF16 bits shifted into the high half of an f32: the value, exactly.
        let widen = |p: *const u16| vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p)));
        // Accumulator k (values 8k‥8k+8 of each step): lanes 0‥3 in `c[k][0]`, 4‥7 in `c[k][1]`.
        let mut c = [[vdupq_n_f32(0.0); 2]; 4];
        for i in (0..body).step_by(32) {
            for (k, c) in c.iter_mut().enumerate() {
                for (h, c) in c.iter_mut().enumerate() {
                    let o = i + 8 * k + 4 * h;
                    // Product rounded, then the sum (ggml's `_mm256_add_ps(_mm256_mul_ps ..)`).
                    *c = vaddq_f32(*c, vmulq_f32(widen(x.as_ptr().add(o)), widen(y.as_ptr().add(o))));
                }
            }
        }
        let v: [float32x4_t; 2] = std::array::from_fn(|h| vaddq_f32(vaddq_f32(c[0][h], c[2][h]), vaddq_f32(c[1][h], c[3][h])));
        super::neon::hsum8(v)
    };
    crate::matmul::portable::bf16_tail(head as f64, &x[body..n], &y[body..n])
}

/// 16 values at `p` as f32 (four registers, values `4q‥4q+4` in register `q`): f32 values, or
/// F16 values widened (`HALF`).
///
/// # Safety
/// 64 (f32) or 32 (F16) readable bytes at `p`, aligned to the element.
#[inline(always)]
unsafe fn load16<const HALF: bool>(p: *const u8) -> [float32x4_t; 4] {
    // SAFETY: the caller's contract; NEON is the aarch64 baseline.
    unsafe {
        if HALF {
            let p = p as *const f16;
            let ([a, b], [c, d]) = (load_f16x8(p), load_f16x8(p.add(8)));
            [a, b, c, d]
        } else {
            let p = p as *const f32;
            [vld1q_f32(p), vld1q_f32(p.add(4)), vld1q_f32(p.add(8)), vld1q_f32(p.add(12))]
        }
    }
}

/// Bytes of 16 values.
const fn step_bytes<const HALF: bool>() -> usize {
    if HALF { 32 } else { 64 }
}

/// tinyBLAS's value (`portable::batch_order`): one 16-lane FMA chain over steps of 16 values,
/// reduced as `_mm512_reduce_add_ps`.
fn batch<const HALF: bool>(x: &[u8], y: &[u8]) -> f32 {
    let bytes = x.len().min(y.len());
    let step = step_bytes::<HALF>();
    assert!(bytes % step == 0, "tinyBLAS needs k % 16 == 0");
    // SAFETY: every step `s·step..(s + 1)·step` is inside both rows; NEON is the baseline.
    unsafe {
        let mut c = [vdupq_n_f32(0.0); 4];
        for s in 0..bytes / step {
            let (a, b) = (load16::<HALF>(x.as_ptr().add(s * step)), load16::<HALF>(y.as_ptr().add(s * step)));
            for q in 0..4 {
                c[q] = vfmaq_f32(c[q], a[q], b[q]);
            }
        }
        reduce_add_16x4(c)
    }
}

/// tinyBLAS's F32 value (`BatchDot::dot`; `k` a multiple of 16).
pub fn batch_f32(x: &[u8], y: &[u8]) -> f32 {
    batch::<false>(x, y)
}

/// tinyBLAS's F16 value: the values widened to f32, one FMA chain (`k` a multiple of 16).
pub fn batch_f16(x: &[u8], y: &[u8]) -> f32 {
    batch::<true>(x, y)
}

/// [`batch`]'s values for `out.len()` weight rows (a multiple of four, `xrb` bytes apart, each
/// `xrb` bytes of values) × four activation rows. Per group of four weight rows, four passes
/// of two weight rows × two activation rows (sixteen accumulator registers), each output its
/// own chain over the steps in order: `out[c][j]` is the batch dot of row c and `y[j]`.
fn tiles<const HALF: bool>(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    let step = step_bytes::<HALF>();
    assert!(xrb % step == 0 && out.len() % 4 == 0 && x.len() >= out.len() * xrb && y.iter().all(|y| y.len() >= xrb));
    for (g, o) in out.chunks_exact_mut(4).enumerate() {
        for (rp, jp) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let rows = [4 * g + 2 * rp, 4 * g + 2 * rp + 1].map(|r| x[r * xrb..].as_ptr());
            let acts = [y[2 * jp].as_ptr(), y[2 * jp + 1].as_ptr()];
            // SAFETY: every step is inside its weight row (group g's rows lie in `x`, asserted)
            // and its activation row (`xrb` bytes each, asserted); NEON is the baseline.
            let acc = unsafe {
                let mut acc = [[[vdupq_n_f32(0.0); 4]; 2]; 2];
                for s in 0..xrb / step {
                    let b = acts.map(|p| load16::<HALF>(p.add(s * step)));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let a = load16::<HALF>(rows[r].add(s * step));
                        for (j, acc) in acc.iter_mut().enumerate() {
                            for q in 0..4 {
                                acc[q] = vfmaq_f32(acc[q], a[q], b[j][q]);
                            }
                        }
                    }
                }
                acc
            };
            for (r, acc) in acc.iter().enumerate() {
                for (j, &acc) in acc.iter().enumerate() {
                    o[2 * rp + r][2 * jp + j] = reduce_add_16x4(acc);
                }
            }
        }
    }
}

/// [`batch_f32`]'s values, four weight rows × four activation rows at a time.
pub fn tiles_f32(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    tiles::<false>(x, xrb, y, out)
}

/// [`batch_f16`]'s values, four weight rows × four activation rows at a time.
pub fn tiles_f16(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    tiles::<true>(x, xrb, y, out)
}

/// F16 values widened to f32 (exact), eight at a time; `out.len()` values.
pub fn widen_f16(x: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(x.len() >= 2 * n);
    let body = n - n % 8;
    for i in (0..body).step_by(8) {
        // SAFETY: 16 bytes at 2i and 8 f32 at i are in bounds (asserted, loop bound).
        unsafe {
            let [a, b] = load_f16x8(x.as_ptr().add(2 * i) as *const f16);
            vst1q_f32(out.as_mut_ptr().add(i), a);
            vst1q_f32(out.as_mut_ptr().add(i + 4), b);
        }
    }
    for j in body..n {
        out[j] = f16::from_le_bytes([x[2 * j], x[2 * j + 1]]).to_f32();
    }
}
