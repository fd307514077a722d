//! ggml's `expf` ([`super::expf_ggml`], the x86 AVX-512 build's lanes) on 4 NEON lanes, bit for
//! bit: the same fused multiply-adds in the same order (`vfmaq_f32` fuses as `mul_add` does),
//! `2^n` built in the exponent field where `n` is a normal exponent. Lanes past that range
//! (126 < |n| ≤ 192: a subnormal or huge result) go through the scalar function, so every
//! lane equals it; past ±192 the result is 0 or ∞ as in the scalar, so `-∞` (a masked score)
//! stays on the vector path.

use std::arch::aarch64::*;

/// `expf_ggml(x[i])` for each lane.
#[inline(always)]
pub fn expf_ggml4(x: float32x4_t) -> float32x4_t {
    // SAFETY: register arithmetic (NEON is the aarch64 baseline), and a 16-byte stack array.
    unsafe {
        let r = vdupq_n_f32(f32::from_bits(0x4B40_0000));
        let z = vfmaq_f32(r, x, vdupq_n_f32(f32::from_bits(0x3FB8_AA3B)));
        let n = vsubq_f32(z, r);
        let hi = vfmsq_f32(x, n, vdupq_n_f32(f32::from_bits(0x3F31_7200)));
        let b = vfmsq_f32(hi, n, vdupq_n_f32(f32::from_bits(0x35BF_BE8E)));
        let u = vmulq_f32(b, b);
        let c = |bits: u32| vdupq_n_f32(f32::from_bits(bits));
        let p0 = vfmaq_f32(c(0x3D2B_9F17), c(0x3C07_2010), b);
        let p1 = vfmaq_f32(c(0x3EFF_FEDB), c(0x3E2A_AF33), b);
        let p2 = vfmaq_f32(vdupq_n_f32(1.0), c(0x3F7F_FFF6), b);
        let j = vfmaq_f32(p2, vfmaq_f32(p1, p0, u), u);
        // |n| > 192: 0 below, ∞ above (the scalar's early return); 126 < |n| <= 192: scalar.
        let under = vcltq_f32(n, vdupq_n_f32(-192.0));
        let over = vcgtq_f32(n, vdupq_n_f32(192.0));
        let mid = vbicq_u32(vcagtq_f32(n, vdupq_n_f32(126.0)), vorrq_u32(under, over));
        if vmaxvq_u32(mid) == 0 {
            // 2^n with n in -126..=126: (n + 127) in the exponent field.
            let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
            let y = vmulq_f32(j, vreinterpretq_f32_s32(e));
            let y = vbslq_f32(under, vdupq_n_f32(0.0), y);
            return vbslq_f32(over, vdupq_n_f32(f32::INFINITY), y);
        }
        let mut lanes = [0f32; 4];
        vst1q_f32(lanes.as_mut_ptr(), x);
        vld1q_f32(lanes.map(super::expf_ggml).as_ptr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `expf_ggml` on every element of `x`, 4 lanes at a time (the scalar for a tail).
    fn expf_ggml_slice(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(4);
        for c in &mut chunks {
            // SAFETY: 4 f32 readable and writable.
            unsafe { vst1q_f32(c.as_mut_ptr(), expf_ggml4(vld1q_f32(c.as_ptr()))) };
        }
        for e in chunks.into_remainder() {
            *e = super::super::expf_ggml(*e);
        }
    }

    /// Every float of the ranges the softmax passes (and past them: subnormal results, 0, ∞,
    /// -∞, NaN) gives the scalar function's bits on every lane.
    #[test]
    fn four_lanes_equal_the_scalar_expf_ggml() {
        let ranges = [((-140f32).to_bits(), (-64f32).to_bits(), 1usize), (64f32.to_bits(), 100f32.to_bits(), 1), (0, 64f32.to_bits(), 97), (0x8000_0000, (-64f32).to_bits(), 97)];
        let mut xs: Vec<f32> = vec![f32::NEG_INFINITY, f32::INFINITY, f32::NAN, -0.0, 0.0, -200.0, 200.0, -1e30, 1e30];
        for (a, b, step) in ranges {
            xs.extend((a.min(b)..=a.max(b)).step_by(step).map(f32::from_bits));
        }
        let mut ys = xs.clone();
        expf_ggml_slice(&mut ys);
        for (x, y) in xs.iter().zip(&ys) {
            assert_eq!(super::super::expf_ggml(*x).to_bits(), y.to_bits(), "expf_ggml({x:e})");
        }
    }
}
