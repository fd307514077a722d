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

/// What a RoPE's angles depend on besides the position: ggml's `rope_yarn` parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Angles {
    pub base: f32,
    /// Multiplies every angle (linear scaling's 1/factor; YaRN's interpolated angles).
    pub freq_scale: f32,
    /// Multiplies every cosine and sine: ggml's `attn_factor`, with YaRN's magnitude
    /// correction `1 + 0.1·ln(1/freq_scale)` folded in (LongRoPE's and YaRN's attention
    /// factors; 1 for a plain rotation, where the product is exact).
    pub mscale: f32,
    /// YaRN's mix of interpolated and extrapolated angles (0: none, every angle interpolated).
    pub ext_factor: f32,
    /// YaRN's correction dimensions ([`yarn_corr_dims`]): below the first the angles are
    /// extrapolated, past the second interpolated, ramped between.
    pub corr_dims: [f32; 2],
    /// Pairs whose angle stays 0 at every position (bit i: pair i): the pairs of interleaved
    /// M-RoPE (Qwen3-VL) turned by the fourth position, which llama.cpp sets to 0 for text.
    pub still: u128,
}

impl Angles {
    /// Plain RoPE of `base`, angles times `freq_scale`.
    pub fn plain(base: f32, freq_scale: f32) -> Self {
        Angles { base, freq_scale, mscale: 1.0, ext_factor: 0.0, corr_dims: [0.0; 2], still: 0 }
    }
}

/// Cosines and sines for one position: `cache[i] = m · cos θ_i`, `cache[n_rot/2 + i] = m · sin θ_i`,
/// with `θ_i = pos · base^(-2i/n_rot)` computed by repeated multiplication as ggml does,
/// divided by the frequency factor where given, then scaled (`freq_scale`) or, with YaRN,
/// ramped between scaled and not by dimension; `m` = `a.mscale`. A still pair (`a.still`)
/// has θ = 0, as ggml's M-RoPE cache gives a pair of a position 0 (`0 / ff` is 0).
pub fn rope_cache(pos: i32, n_rot: usize, a: &Angles, freq_factors: Option<&[f32]>, cache: &mut [f32]) {
    let theta_scale = a.base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    let half = n_rot / 2;
    for i in 0..half {
        // Per-frequency divisors (Llama 3 `rope_freqs`, Phi-3 rope factors), as ggml applies them.
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let extrap = if a.still >> i & 1 == 1 { 0.0 } else { theta / ff };
        let interp = a.freq_scale * extrap;
        let t = if a.ext_factor != 0.0 {
            let mix = yarn_ramp(a.corr_dims, i) * a.ext_factor;
            // ggml is built with FMA contraction: the first product is fused.
            interp.mul_add(1.0 - mix, extrap * mix)
        } else {
            interp
        };
        cache[i] = t.cos() * a.mscale;
        cache[half + i] = t.sin() * a.mscale;
        theta *= theta_scale;
    }
}

/// ggml's `rope_yarn_ramp` for the pair `i`: 1 below the first correction dimension, 0 past
/// the second, linear between.
fn yarn_ramp(dims: [f32; 2], i: usize) -> f32 {
    let y = (i as f32 - dims[0]) / 0.001f32.max(dims[1] - dims[0]);
    1.0 - y.clamp(0.0, 1.0)
}

/// ggml's `ggml_rope_yarn_corr_dims`: the dimensions where rotations of `beta_fast` and
/// `beta_slow` turns over `n_ctx_orig` positions fall, floored and ceiled into `0..n_dims`.
pub fn yarn_corr_dims(n_dims: usize, n_ctx_orig: usize, base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
    let dim = |beta: f32| n_dims as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
    [dim(beta_fast).floor().max(0.0), dim(beta_slow).ceil().min(n_dims as f32 - 1.0)]
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
