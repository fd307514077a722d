//! Portable (scalar) kernels: the reference twin of every SIMD kernel. Written for clarity and
//! to reproduce ggml's `_generic`/`_ref` arithmetic (rounding, integer sums, scale order).

pub mod quant;
pub mod dot;
pub mod quantize;
