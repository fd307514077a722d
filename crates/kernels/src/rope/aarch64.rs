//! RoPE rotation on 4 NEON lanes, bit-identical to `rope::rope_apply`'s scalar loop: every
//! pair `(x0, x1)` becomes `(fma(x0, c, -(x1·s)), fma(x0, s, x1·c))` (`vfmaq_f32` fuses as
//! `mul_add` does). NeoX pairs `(i, i + n_rot/2)` load as two contiguous vectors; adjacent
//! pairs `(2i, 2i + 1)` are split into their even and odd lanes by `vld2q_f32` and written back
//! interleaved by `vst2q_f32`. Pairs past the last whole vector go through the scalar loop.

use std::arch::aarch64::*;

/// `(fma(x0, c, -(x1·s)), fma(x0, s, x1·c))` on 4 lanes.
#[inline(always)]
fn rotate(x0: float32x4_t, x1: float32x4_t, c: float32x4_t, s: float32x4_t) -> (float32x4_t, float32x4_t) {
    // SAFETY: register arithmetic.
    unsafe { (vfmaq_f32(vnegq_f32(vmulq_f32(x1, s)), x0, c), vfmaq_f32(vmulq_f32(x1, c), x0, s)) }
}

/// Rotate one head in place (see the module doc).
pub fn rope_neon(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    let half = n_rot / 2;
    assert!(x.len() >= n_rot && cache.len() >= n_rot);
    let (cos, sin) = cache[..n_rot].split_at(half);
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i + 4 <= half {
        // SAFETY: i + 4 <= half, so cos/sin[i..i + 4] and (NeoX) x[i..i + 4], x[half + i..][..4]
        // or (adjacent) x[2i..2i + 8] are in bounds (asserted above).
        unsafe {
            let (c, s) = (vld1q_f32(cos.as_ptr().add(i)), vld1q_f32(sin.as_ptr().add(i)));
            if neox {
                let (a, b) = rotate(vld1q_f32(p.add(i)), vld1q_f32(p.add(half + i)), c, s);
                vst1q_f32(p.add(i), a);
                vst1q_f32(p.add(half + i), b);
            } else {
                let v = vld2q_f32(p.add(2 * i));
                let (a, b) = rotate(v.0, v.1, c, s);
                vst2q_f32(p.add(2 * i), float32x4x2_t(a, b));
            }
        }
        i += 4;
    }
    for j in i..half {
        let (a, b) = if neox { (j, j + half) } else { (2 * j, 2 * j + 1) };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0.mul_add(cos[j], -(x1 * sin[j]));
        x[b] = x0.mul_add(sin[j], x1 * cos[j]);
    }
}
