//! corelm kernels: the compute at the bottom of the engine.
//!
//! * [`blocks`]: GGML block layouts (`#[repr(C)]`, size-asserted) viewed zero-copy from bytes.
//! * [`portable`]: the scalar twin of every kernel — dequantize, activation quantizers (Q8_0,
//!   Q8_1, Q8_K, as ggml rounds them), and integer dot products.
//! * [`x86`]: AVX2/FMA/F16C versions of the hot dot products.
//! * [`interleave`]: weights repacked once at load, four rows interleaved block by block (same
//!   bytes), read by decode's GEMV and prefill's tiles alike.
//! * [`dispatch`]: the per-type table (`vec_dot_type`, `vec_dot`, `to_float`, `from_float`),
//!   filled once from runtime CPU detection (never `-C target-cpu=native`).
//! * [`ops`]: RMS norm, RoPE, gated activations; [`attention`]: fused online-softmax attention
//!   (re-exported by `ops`).
//!
//! Invariant: this crate depends on nothing of corelm's but the GGUF type enum; it performs no
//! allocation in any per-row kernel (callers pass scratch).

pub mod attention;
pub mod blocks;
pub mod dispatch;
pub mod gemm;
pub mod interleave;
pub mod ops;
pub mod portable;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use corelm_gguf::GgmlType as DType;
pub use dispatch::{kernels, max_packed_row_bytes, BatchDot, InterleavedOps, Isa, Kernels, TilePacking, TypeOps};

/// Bytes of a row of `n` elements of `t` (`n` must be a whole number of blocks).
pub fn row_bytes(t: DType, n: usize) -> usize {
    n / t.block_size() * t.type_size()
}
