//! x86-64 SIMD kernels. Every function here has a portable twin in `crate::portable` and is
//! tested against it (tests/parity.rs). They are only reached through the dispatch table, which
//! selects them after runtime feature detection.

pub mod attn;
pub mod avx2;
pub mod avx2_ext;
