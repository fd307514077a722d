//! x86-64 attention kernels, bit-identical per head to `attention::portable`:
//!
//! | file | kernel |
//! |---|---|
//! | `reference.rs` | AVX2 twins of the one-chunk kernel (per head, and per GQA group with rows widened once) and of the tiled kernel (one head or a GQA group) |
//! | `rows.rs` | the tiled kernel for a block of query rows at once (prefill) |
//! | `rows512.rs` | the same with AVX-512 (16-cell chunks, 16-lane softmax and values) |
//! | `softmax.rs` | ggml's softmax step of the tiled kernel on 8 lanes (shared by both above) and on 16 |
//! | `decode.rs` | decode's one-chunk kernel with AVX-512 over a GQA group (two phases per 64-cell chunk) |
//! | `decode_avx2.rs` | the same with AVX2 |
//!
//! # Safety
//! One contract for every `#[target_feature]` function in these modules: call it only on a CPU
//! with the features it names; `attention` calls them only under a table built after detecting
//! them (`Isa::Avx2`, `Kernels::avx512`).
#![allow(clippy::missing_safety_doc)]

pub mod decode;
pub mod decode_avx2;
pub mod reference;
pub mod rows;
pub mod rows512;
pub mod softmax;
