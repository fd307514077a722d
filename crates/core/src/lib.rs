//! corelm core — the small, hackable engine core of ArcLight.
//!
//! * [`tensor`]: tensor headers (shape, type, op, sources) separate from their data, which
//!   lives in the model mapping, the activation pools, the output pool or the KV cache.
//! * [`memory`]: pools allocated once at start-up and tagged with their NUMA node; activations
//!   in two buffers alternating by layer parity. [`numa`]: `mbind` and the placement read back
//!   (`move_pages`, `get_mempolicy`, `/proc/self/numa_maps`).
//! * [`kv`]: the preallocated F16 KV cache in its reader's layout.
//! * [`threads`]: pinned workers that split into groups and re-join, with group and global
//!   barriers on their own cache lines; idle workers park.
//! * [`placement`]: `--numa off|distribute|isolate|tp` planned from the topology (read once
//!   per process): worker CPUs and where weights, pools and the KV cache live.
//! * [`packed`]: matrices repacked once at load into the interleaved layout their kernels read.
//! * [`graph`]: the builder (functions on tensor bundles, nodes appended in construction order)
//!   and the static graph with its memory plan.
//! * [`sched`]: the sequential scheduler, a barrier after each node.
//!
//! Invariant: depends only on `kernels` (and the GGUF type enum); knows nothing of models,
//! tokenizers or front ends.

pub mod graph;
pub mod kv;
pub mod memory;
pub mod moe;
pub mod numa;
pub mod packed;
pub mod placement;
pub mod rope;
pub mod sched;
pub mod tensor;
pub mod threads;
pub mod tp;

pub use graph::{Builder, Graph, LayerPredictor, Mode, Predictors, SparseFfn, Sync};
pub use kv::KvCache;
pub use memory::{Buffer, Place, Pools};
pub use packed::PackedWeights;
pub use placement::{NumaMode, Placement};
pub use sched::{BatchView, DeviceLayerSpec, DeviceLayers, DeviceMatmul, Executor, Offload, Profile, ProfileEntry, Tap, Weights};
pub use tensor::{AttnParams, AttnShard, Bundle, ClassSplit, DeviceSplit, Glu, MoeGating, MoeParams, Op, RopeParams, Storage, Tensor, TensorId, WeightForm, WeightRef};
pub use threads::{PoolConfig, ThreadPool, Worker};
