//! corelm kernels: the compute at the bottom of the engine, one folder per operation family,
//! each holding its portable twin and its per-ISA versions side by side (ggml-cpu's scheme: a
//! portable twin for every SIMD kernel, chosen at run time, a table per weight type).
//!
//! Layers, lowest first; a module imports only from layers below it (never from the one that
//! dispatches to it):
//!
//! 1. [`simd`]: CPU feature flags, the portable lane orders of SIMD reductions, x86 helpers.
//! 2. [`quant`]: GGML block layouts, dequantizers, activation and weight quantizers.
//! 3. [`exp`]: ggml's and glibc's `expf`, scalar and on 8/16 lanes.
//! 4. [`matmul`]: dot products, tiles and GEMVs per weight type; the interleaved layout; the
//!    panel GEMM.
//! 5. [`dispatch`]: the per-type table (`Kernels`), filled once from runtime CPU detection
//!    (never `-C target-cpu=native`).
//! 6. [`norm`], [`rope`], [`act`]: RMS norm, RoPE, gated activations.
//! 7. [`attention`]: ggml's flash-attention kernels over the paged KV cache.
//!
//! Invariant: this crate depends on nothing of corelm's but the GGUF type enum; it performs no
//! allocation in any per-row kernel (callers pass scratch).

// Kernels index lanes, rows and accumulators of several arrays by one loop variable; iterator
// chains over three or four of them would hide that arithmetic.
#![allow(clippy::needless_range_loop)]

pub mod act;
pub mod attention;
pub mod dispatch;
pub mod exp;
pub mod matmul;
pub mod norm;
pub mod quant;
pub mod rope;
pub mod simd;
pub mod sparse;

pub use corelm_gguf::GgmlType as DType;
pub use dispatch::{best_isa, kernels, Isa, Kernels};
pub use matmul::{max_packed_row_bytes, BatchDot, InterleavedOps, TilePacking, TypeOps};

/// Bytes of a row of `n` elements of `t` (`n` must be a whole number of blocks).
pub fn row_bytes(t: DType, n: usize) -> usize {
    n / t.block_size() * t.type_size()
}
