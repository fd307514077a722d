//! Rotary position embedding as ggml-cpu computes it: angles by repeated multiplication
//! ([`rope_cache`]), each pair rotated with the first product of each expression fused
//! ([`rope_apply`]); SIMD twins on 8/16 lanes in [`x86`] and on 4 in [`aarch64`], the same
//! bits.

#[cfg(target_arch = "x86_64")]
use crate::simd::has_fma;
use crate::{Isa, Kernels};

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// Cosines and sines for one position: `cache[i] = m · cos θ_i`, `cache[n_rot/2 + i] = m · sin θ_i`,
/// with `θ_i = pos · freq_scale · base^(-2i/n_rot)` computed by repeated multiplication as ggml
/// does, and `m` = `mscale`, ggml's `attn_factor` (LongRoPE's attention factor; 1 for a plain
/// rotation, where the product is exact).
pub fn rope_cache(pos: i32, n_rot: usize, base: f32, freq_scale: f32, freq_factors: Option<&[f32]>, mscale: f32, cache: &mut [f32]) {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    let half = n_rot / 2;
    for i in 0..half {
        // Per-frequency divisors (Llama 3 `rope_freqs`, Phi-3 rope factors), as ggml applies them.
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let t = freq_scale * (theta / ff);
        cache[i] = t.cos() * mscale;
        cache[half + i] = t.sin() * mscale;
        theta *= theta_scale;
    }
}

/// Rotate one head in place. `neox`: pairs `(i, i + n_rot/2)` (GPT-NeoX, Qwen, Gemma); otherwise
/// adjacent pairs `(2i, 2i+1)` (LLaMA layout in GGUF). Dimensions past `n_rot` are untouched.
/// 16, 8 or 4 pairs at a time with an AVX-512, AVX2 or NEON table ([`x86`], [`aarch64`]; same
/// bits).
pub fn rope_apply(k: &Kernels, x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if k.isa().avx512() {
            // SAFETY: an Avx512 table is only built after detecting AVX-512 F/VL, AVX2 and FMA.
            return unsafe { x86::rope_avx512(x, cache, n_rot, neox) };
        }
        if k.isa() >= Isa::Avx2 {
            // SAFETY: an Avx2 table is only built after detecting AVX2 and FMA.
            return unsafe { x86::rope_avx2(x, cache, n_rot, neox) };
        }
    }
    #[cfg(target_arch = "aarch64")]
    if k.isa() != Isa::Portable {
        return aarch64::rope_neon(x, cache, n_rot, neox);
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (k, Isa::Avx2);
    rope_apply_scalar(x, cache, n_rot, neox)
}

/// [`rope_apply`] one pair at a time: the portable twin.
pub fn rope_apply_scalar(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: FMA support was detected.
        return unsafe { rope_apply_fma(x, cache, n_rot, neox) };
    }
    rope_apply_body(x, cache, n_rot, neox)
}

#[inline(always)]
fn rope_apply_body(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    let half = n_rot / 2;
    for i in 0..half {
        let (c, s) = (cache[i], cache[half + i]);
        let (a, b) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
        let (x0, x1) = (x[a], x[b]);
        // ggml is built with FMA contraction: the first product of each expression is fused.
        x[a] = x0.mul_add(c, -(x1 * s));
        x[b] = x0.mul_add(s, x1 * c);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn rope_apply_fma(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    rope_apply_body(x, cache, n_rot, neox)
}
