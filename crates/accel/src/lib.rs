//! corelm's accelerator backend (KAIROX's second device, SMEPilot's accelerator target): the
//! quantized matrix-vector products of the golden models' weight types and the hot-neuron
//! feed-forward, written in WGSL and run through `wgpu` — Vulkan, Metal or DX12 on a GPU,
//! Mesa's software Vulkan (lavapipe) in CI.
//!
//! Design:
//! - Weights are uploaded once, in the model file's own block layout (GGML blocks as bytes in
//!   a `u32` storage buffer): no format of our own to keep in step, and a GPU holds as many
//!   weights per byte of `--accel-mem` as the file does. Each weight type has a `sub_val4`
//!   (`shaders/<type>.wgsl`: 4 of a block's values, dequantized as ggml does) under one GEMV
//!   body (`shaders/common.wgsl`: a workgroup per 8 output rows × 8 tokens — one token in a
//!   copy compiled for decode steps, the same sums in the same order — 32 lanes per row on
//!   neighbouring groups of 4 values, four groups' loads in flight together, a tree reduction
//!   per row and token) and one tiled
//!   GEMM body for batches of
//!   [`GEMM_MIN_TOKENS`] or more (`shaders/gemm.wgsl` over `tile.wgsl`: a workgroup per 64
//!   rows × 64 tokens, each block decoded once per tile into workgroup memory, 4 × 4 outputs
//!   per thread). Both share one binding layout, so a matrix's bind group serves either.
//! - Activations travel as f32, and the sums are f32 — unlike the CPU kernels, which quantize
//!   the activations to 8 bits first — so results agree with the CPU within a bound, not
//!   bit for bit ([`gemv_bound`] states it; the tests check it on every type).
//! - [`HotFfn`] keeps, per layer, rows of hot neurons (gate and up rows copied from the file,
//!   the down projection's columns requantized to Q8_0 rows, neuron-major), computes their
//!   part of the layer's output while the CPU computes the rest, and replaces groups of rows
//!   when online balancing moves neurons ([`HotFfn::load`]). A layer's work is submitted by
//!   `begin` and read back by `finish`, so the CPU works in between.
//! - [`SplitMatrices`] holds the first rows of matrices whose matmuls the roofline plan splits
//!   between the CPU and the accelerator (SMEPilot's accelerator target), and [`probe`]
//!   measures the device as such a target (`corelm profile --accel`).
//!
//! Invariant: nothing here runs unless a device was opened ([`Gpu::open`]); every buffer is
//! allocated when the weights are uploaded, none per token.

pub mod clock;
mod device;
mod ffn;
mod layers;
mod matrix;
pub mod probe;
mod split;

pub use device::{AccelError, Gpu};
pub use ffn::{down_neuron_major, gather_rows, FileMatrix, HotFfn, HotLayer};
pub use layers::{DeviceLayers, LayerFiles, LayerShape, PassTimes};
pub use matrix::{gemv_bound, supported, Matrix, GEMM_MIN_TOKENS};
pub use split::SplitMatrices;
