//! Block formats and the conversions between them and f32: [`blocks`] (GGML's `#[repr(C)]`
//! blocks, size-asserted), [`portable`] (dequantizers of every type, the activation quantizers
//! Q8_0/Q8_1/Q8_K as ggml's SIMD code rounds them, per-block value decoders the dot products
//! share), [`iq`] (the 1- to 3-bit i-quants decoded, over the grids of [`iq_grids`]), [`reference`] (ggml's reference weight quantizers, for `corelm quantize` and
//! quantized KV rows), [`x86`] (AVX2 activation quantizers, the same bytes) and `aarch64`
//! (their NEON twins).

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
pub mod blocks;
pub mod iq;
pub mod iq_grids;
pub mod portable;
pub mod reference;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// Convert a row of blocks to f32.
pub type ToFloat = fn(x: &[u8], y: &mut [f32]);
/// Quantize an f32 row into blocks.
pub type FromFloat = fn(x: &[f32], y: &mut [u8]);
