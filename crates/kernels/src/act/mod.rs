//! Gated activations of the FFN as ggml-cpu computes them: SwiGLU (`silu(g) · u`, SiLU through
//! ggml's `expf`) and GeGLU (`gelu_tanh(g) · u`, GELU read from ggml's F16 table); portable
//! versions here, 8/16-lane twins in [`x86`] and 4-lane ones in [`aarch64`], the same bits.
//! gpt-oss's clamped SwiGLU ([`swiglu_oai`]) is scalar on every table, as ggml-cpu's is.

use crate::{Isa, Kernels};

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
pub mod portable;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use portable::{geglu_scalar_table, gelu_tanh, swiglu_oai, swiglu_scalar};

/// `y = silu(g) · u`: sixteen, eight or four lanes at a time with an AVX-512, AVX2 or NEON
/// table (`x86::swiglu_avx512`, `x86::swiglu`, `aarch64::swiglu`; same bits).
pub fn swiglu(k: &Kernels, g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k.isa().avx512() {
        // SAFETY: an Avx512 table is only built after detecting AVX-512 F/VL, AVX2, FMA and F16C.
        return unsafe { x86::swiglu_avx512(g, u, y) };
    }
    #[cfg(target_arch = "x86_64")]
    if k.isa() >= Isa::Avx2 {
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
        return unsafe { x86::swiglu(g, u, y) };
    }
    #[cfg(target_arch = "aarch64")]
    if k.isa() != Isa::Portable {
        return aarch64::swiglu(g, u, y);
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (k, Isa::Avx2);
    swiglu_scalar(g, u, y)
}

/// `y = gelu_tanh(g) · u`: eight or four lanes at a time with an AVX2 or NEON table
/// (`x86::geglu`, `aarch64::geglu`; same bits).
pub fn geglu(k: &Kernels, g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k.isa() >= Isa::Avx2 {
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
        return unsafe { x86::geglu(g, u, y, portable::gelu_table()) };
    }
    #[cfg(target_arch = "aarch64")]
    if k.isa() != Isa::Portable {
        return aarch64::geglu(g, u, y, portable::gelu_table());
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (k, Isa::Avx2);
    geglu_scalar_table(g, u, y)
}
