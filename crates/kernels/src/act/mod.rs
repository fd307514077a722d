//! Gated activations of the FFN as ggml-cpu computes them: SwiGLU (`silu(g) · u`, SiLU through
//! ggml's `expf`) and GeGLU (`gelu_tanh(g) · u`, GELU read from ggml's F16 table); portable
//! versions here, 8/16-lane twins in [`x86`], the same bits.

use crate::{Isa, Kernels};

pub mod portable;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use portable::{geglu_scalar_table, gelu_tanh, swiglu_scalar};

/// `y = silu(g) · u`: sixteen or eight lanes at a time with an AVX-512 or AVX2 table
/// (`x86::swiglu_avx512`, `x86::swiglu`; same bits).
pub fn swiglu(k: &Kernels, g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k.isa() == Isa::Avx512 {
        // SAFETY: an Avx512 table is only built after detecting AVX-512 F/VL, AVX2, FMA and F16C.
        return unsafe { x86::swiglu_avx512(g, u, y) };
    }
    #[cfg(target_arch = "x86_64")]
    if k.isa() >= Isa::Avx2 {
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
        return unsafe { x86::swiglu(g, u, y) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (k, Isa::Avx2);
    swiglu_scalar(g, u, y)
}

/// `y = gelu_tanh(g) · u`: eight lanes at a time with an AVX2 table (`x86::geglu`, same bits).
pub fn geglu(k: &Kernels, g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k.isa() >= Isa::Avx2 {
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
        return unsafe { x86::geglu(g, u, y, portable::gelu_table()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (k, Isa::Avx2);
    geglu_scalar_table(g, u, y)
}
