//! x86-64 SIMD kernels. Every function here has a portable twin in `crate::portable` and is
//! tested against it (tests/parity.rs). They are only reached through the dispatch table, which
//! selects them after runtime feature detection.
//!
//! # Safety
//! One contract for every `#[target_feature]` function in these modules: call it only on a CPU
//! with the features it names (AVX2, FMA, F16C; AVX-512 F/BW/VL/VNNI for `avx512` and
//! `gemm_vnni`). `dispatch::Kernels::detect` checks them before
//! it puts any of them in the table, and nothing else calls them.
#![allow(clippy::missing_safety_doc)]

pub mod attn;
pub mod attn_decode;
pub mod attn_decode_avx2;
pub mod attn_rows;
pub mod avx512;
pub mod dense;
pub mod expf;
pub mod avx2;
pub mod avx2_ext;
pub mod gemm_vnni;
pub mod interleaved;
pub mod interleaved_k;
pub mod norm;
pub mod rope;
pub mod tiles_k;
