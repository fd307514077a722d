//! SMEPilot's multi-ceiling roofline (issue 18): what each compute target of a machine can do
//! and what memory can feed it.
//!
//! A CPU may hold several compute targets — its vector cores, matrix units (Arm SME, Intel
//! AMX), an attached accelerator — whose compute adds up while memory bandwidth is shared.
//! [`profile`] measures one [`Roofline`] per machine (the vector target's ceilings per kernel
//! family at one core and at all cores; read bandwidth at 1..N threads), caches it as JSON, and
//! reads the stated profiles of the seed's platforms shipped in `fixtures/profiles/`.
//! [`planner`] puts every operator of a planned graph on that roofline: intensity, regime,
//! target (or a split across targets) and thread count.
//!
//! Layering: `profile ← planner`; `plan ← core ← kernels`; the engine and the CLI use it, it
//! knows no model file.

pub mod file;
pub mod gemm_search;
pub mod planner;
pub mod profile;
pub mod split;

pub use profile::{Ceiling, Memory, Roofline, Target, TargetKind};
