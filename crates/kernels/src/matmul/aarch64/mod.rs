//! aarch64 matrix kernels (see the table in `matmul`). Every function has a reference twin
//! (`matmul::lanes` for the x86 lane order they follow, `matmul::portable` for Q4_K and
//! the F16/BF16 orders) and is
//! tested against it bit for bit (tests/parity/), under qemu in CI (`scripts/test_arm.sh`).
//!
//! # Safety
//! One contract for every `#[target_feature]` function here: call it only on a CPU with the
//! features it names (NEON; `dotprod` for the `Sdot` instances). `dispatch::Kernels` checks
//! them (`Isa::Neon`, `Isa::Dotprod`) before it puts any of them in a table. The SME kernels
//! ([`sme`]) need `Isa::Sme`, which `dispatch` grants only after their self-test passed.
#![allow(clippy::missing_safety_doc)]

pub mod neon;
pub mod neon_dense;
pub mod neon_il;
pub mod neon_il_k;
pub mod neon_iq;
pub mod neon_mxfp4;
pub mod sme;
