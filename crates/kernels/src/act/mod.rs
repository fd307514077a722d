//! Gated activations of the FFN as ggml-cpu computes them: SwiGLU (`silu(g) · u`, SiLU through
//! ggml's `expf`) and GeGLU (`gelu_tanh(g) · u`, GELU read from ggml's F16 table); portable
//! versions here, 8/16-lane twins in [`x86`], the same bits.

#[cfg(target_arch = "x86_64")]
use crate::simd::{has_avx2, has_avx512, has_f16c};

pub mod portable;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use portable::{geglu_scalar_table, gelu_tanh, swiglu_scalar};

/// `y = silu(g) · u`: sixteen or eight lanes at a time with AVX-512 or AVX2
/// (`x86::swiglu_avx512`, `x86::swiglu`; same bits).
pub fn swiglu(g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && has_f16c() {
        // SAFETY: AVX-512 F/VL, AVX2, FMA and F16C were detected.
        return unsafe { x86::swiglu_avx512(g, u, y) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && has_f16c() {
        // SAFETY: AVX2, FMA and F16C were detected.
        return unsafe { x86::swiglu(g, u, y) };
    }
    swiglu_scalar(g, u, y)
}

/// `y = gelu_tanh(g) · u`.
pub fn geglu(g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && has_f16c() {
        // SAFETY: AVX2, FMA and F16C were detected.
        return unsafe { x86::geglu(g, u, y, portable::gelu_table()) };
    }
    geglu_scalar_table(g, u, y)
}
