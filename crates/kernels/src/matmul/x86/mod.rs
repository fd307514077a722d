//! x86-64 matrix kernels, one file per ISA level and layout (see the table in `matmul`). Every
//! function has a portable twin (`matmul::portable`, `matmul::layout`) and is tested against it
//! bit for bit (tests/parity/, tests/interleave.rs).
//!
//! # Safety
//! One contract for every `#[target_feature]` function in these modules: call it only on a CPU
//! with the features it names (AVX2, FMA, F16C; AVX-512 F/BW/VL/VNNI for the `avx512*` files).
//! `dispatch::Kernels::detect` checks them before it puts any of them in the table, and
//! nothing else calls them.
#![allow(clippy::missing_safety_doc)]

pub mod avx2;
pub mod avx2_ext;
pub mod avx2_il;
pub mod avx2_il_k;
pub mod avx2_iq;
pub mod avx512;
pub mod avx512_dense;
pub mod avx512_il;
pub mod avx512_il_k;
pub mod avx512_k;
pub mod common;
