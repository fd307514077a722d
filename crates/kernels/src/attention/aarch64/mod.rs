//! aarch64 attention kernels with NEON (every aarch64 CPU), bit-identical per head to
//! `attention::portable` — the x86 kernels' lane orders written with 4-lane vectors:
//!
//! | file | kernel | x86 twin |
//! |---|---|---|
//! | `decode.rs` | decode's one-chunk kernel over a GQA group (two phases per 64-cell chunk, shared driver `attention::chunks`) | `x86::decode`, `x86::decode_avx2` |
//! | `rows.rs` | the tiled kernel for a block of query rows at once (prefill), with ggml's softmax step | `x86::rows`, `x86::softmax` |
//!
//! F16 conversions go through `fcvtl`/`fcvtn` (`simd::aarch64`): the F16 vector intrinsics are
//! not stable. No timing of these kernels exists: they were checked under qemu-user only.

pub mod decode;
pub mod rows;
