//! SwiGLU and GeGLU on 4 NEON lanes, bit-identical to the portable twins (`act::portable`), as
//! `act::x86`: every lane performs the scalar function's operations, the exponential is ggml's
//! `expf` lane for lane (`exp::aarch64::expf_ggml4`), GELU is read from the same F16 table
//! (indices from `fcvtn`, four scalar reads: NEON has no gather).

use super::portable::{geglu_scalar_table, swiglu_scalar};
use crate::exp::aarch64::expf_ggml4;
use crate::simd::aarch64::{from_f16_bits4, to_f16_bits4};
use std::arch::aarch64::*;

/// `y = silu(g) · u` on four lanes: `g / (1 + expf_ggml(0 - g)) · u`, the scalar's operations
/// (division and multiplication correctly rounded), so the bits are equal.
pub fn swiglu(g: &[f32], u: &[f32], y: &mut [f32]) {
    let n = y.len().min(g.len()).min(u.len());
    let body = n & !3;
    for i in (0..body).step_by(4) {
        // SAFETY: i + 4 <= n ≤ every slice's length.
        unsafe {
            let x = vld1q_f32(g.as_ptr().add(i));
            let e = expf_ggml4(vsubq_f32(vdupq_n_f32(0.0), x));
            let s = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), e));
            vst1q_f32(y.as_mut_ptr().add(i), vmulq_f32(s, vld1q_f32(u.as_ptr().add(i))));
        }
    }
    swiglu_scalar(&g[body..n], &u[body..n], &mut y[body..n]);
}

/// `y = gelu(g) · u` through ggml's F16 table on four lanes: inputs rounded to F16 (nearest
/// even), entries read, widened; `g ≤ -10` gives 0 and `g ≥ 10` gives `g`, as `act::geglu`.
pub fn geglu(g: &[f32], u: &[f32], y: &mut [f32], table: &[u16]) {
    assert!(table.len() >= 1 << 16);
    let n = y.len().min(g.len()).min(u.len());
    let body = n & !3;
    for i in (0..body).step_by(4) {
        // SAFETY: i + 4 <= n ≤ every slice's length; every index is an F16 bit pattern, < 2^16
        // <= table.len().
        unsafe {
            let a = vld1q_f32(g.as_ptr().add(i));
            let mut idx = [0u16; 4];
            vst1_u16(idx.as_mut_ptr(), to_f16_bits4(a));
            let h = idx.map(|b| *table.get_unchecked(b as usize));
            let act = from_f16_bits4(vld1_u16(h.as_ptr()));
            let act = vbslq_f32(vcleq_f32(a, vdupq_n_f32(-10.0)), vdupq_n_f32(0.0), act);
            let act = vbslq_f32(vcgeq_f32(a, vdupq_n_f32(10.0)), a, act);
            vst1q_f32(y.as_mut_ptr().add(i), vmulq_f32(act, vld1q_f32(u.as_ptr().add(i))));
        }
    }
    geglu_scalar_table(&g[body..n], &u[body..n], &mut y[body..n]);
}
