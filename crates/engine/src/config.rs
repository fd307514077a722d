//! The engine's load-time settings ([`EngineConfig`]) and the parsers and defaults the
//! command line fills them with (cache types, key layout, thread counts).

use corelm_core::graph::TpSync;
use corelm_core::tp::TpKv;
use corelm_core::NumaMode;
use corelm_kernels::attention::KeyLayout;
use corelm_kernels::{DType, Isa};
use std::sync::Arc;

/// Load-time settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// KV cells shared by all sequences (rounded up to whole blocks of 16); also the longest
    /// a single sequence can grow.
    pub n_ctx: usize,
    /// Most tokens one `decode` call may carry (and most outputs).
    pub n_batch: usize,
    /// Most sequences alive at once.
    pub n_seq_max: usize,
    pub n_threads: usize,
    /// Pin worker threads to physical cores.
    pub pin: bool,
    /// NUMA placement of workers and memory (`corelm_core::placement`); `distribute` and
    /// `isolate` pin, so they cannot be combined with `pin: false`.
    pub numa: NumaMode,
    /// Tensor-parallel degree (`corelm_core::tp`): the worker pool splits into this many groups,
    /// each running its shard of the split layers; 1 = none; 0 = one per NUMA node under
    /// `NumaMode::Tp`, else none.
    pub tp: usize,
    /// Barriers inside the parallel subgraphs (`--tp-sync`).
    pub tp_sync: TpSync,
    /// How a KV head that several shards read is projected (`--tp-kv`).
    pub tp_kv: TpKv,
    /// Results of a token independent of the rest of its batch (see
    /// `Executor::batch_invariant`); `serve` sets it unless
    /// `--no-batch-invariant`, so batching never changes an answer.
    pub batch_invariant: bool,
    /// Element types of the cached keys and values (`corelm_core::kv::KV_TYPES`: F16, Q8_0,
    /// Q4_0), like llama.cpp's `--cache-type-k/-v`.
    pub cache_type_k: DType,
    pub cache_type_v: DType,
    /// How cached keys are laid out (`--kv-layout`): `Rows` (ggml's, its algorithms and bits)
    /// or `Columns` (transposed per block of 16 cells as they are stored, read by
    /// `corelm_kernels::attention::matrix` — AVX-512, AVX2, NEON or the SME matrix unit —, not
    /// ggml's bits; any cache type: quantized blocks are widened to F16 as they are read).
    pub kv_layout: KeyLayout,
    /// Prefill attention over keys in columns as a pipeline (`--attn-pipeline`): the scores,
    /// softmax and values of different tiles on different workers at once, the matrix phases
    /// first on `matrix_workers`' matrix-unit workers (`Executor::set_attn_pipeline`); same
    /// bits as without. Needs `kv_layout: Columns`; not with tensor parallelism.
    pub attn_pipeline: bool,
    /// Prefill matmuls of Q4_0/Q5_0/Q8_0/Q4_1/Q5_1/Q4_K/Q5_K weights through the panel GEMM
    /// (`kernels::matmul::gemm`, AVX-512 VNNI or AVX2): faster prefill than the tiles on AVX2,
    /// slower on AVX-512 (README); the float
    /// summation order is no longer ggml's, so logits are no longer bit-identical to llama.cpp
    /// (off by default; never used with `batch_invariant`).
    pub fast_prefill: bool,
    /// Repack matrices once at load into the interleaved layout of the table's kernels
    /// (`corelm_core::packed`; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, IQ4_NL, IQ4_XS under
    /// every SIMD table: AVX-512, AVX2, NEON): same bytes, same results bit for bit, faster GEMV
    /// and tiles. The plain rows stay mapped for other readers.
    pub repack: bool,
    /// Kernel table (`--isa`): `None` for the process default (`corelm_kernels::kernels`: the
    /// best this CPU runs, or what `CORELM_ISA` / `set_default_isa` chose); a lower level forces
    /// its kernels everywhere (matmuls, attention, norms, RoPE, activations). A level this CPU
    /// cannot run fails the load with the features it lacks.
    pub isa: Option<Isa>,
    /// A Sandwich plan (`corelm tune`, [`crate::plan`]): it sets the workers, their CPUs and
    /// groups (the prefill configuration; `n_threads` and `tp` follow it) and a decode view of
    /// them that passes shorter than its `prefill_min_tokens` run on.
    pub plan: Option<crate::plan::Plan>,
    /// A roofline profile (`corelm profile`): each graph, when planned, caps its memory-bound
    /// nodes at the profile's bandwidth knee (`corelm_plan::planner::cap_threads`). Same bits.
    pub roofline: Option<corelm_plan::Roofline>,
    /// Workers (the first ones) that run their share of split matmuls on the matrix unit (Arm
    /// SME), the others on the vector cores (`--matrix-workers`): prefill panel GEMMs that the
    /// roofline plan splits across the profile's `sme` and `cpu` targets are cut between them
    /// in the ratio of their ceilings (SMEPilot's tile split; same bits). 0: every worker uses
    /// the table's kernels. Needs an SME table, `roofline` with an `sme` target, `fast_prefill`
    /// and no tensor parallelism.
    pub matrix_workers: usize,
    /// Sparse feed-forwards (`--sparsity`, [`crate::sparsity`]): per-layer activation
    /// thresholds from a calibration and the neuron-major down projection's type. `None`: dense,
    /// bit-identical to llama.cpp as without it.
    pub sparsity: Option<Arc<corelm_core::SparseFfn>>,
    /// An accelerator holding the hottest FFN neurons (`--accel-mem`, [`crate::offload`]),
    /// the CPU computing the rest; `None`: CPU only.
    pub accel: Option<crate::offload::AccelConfig>,
    /// Share matmuls with an accelerator as the roofline plan places them (`--accel-split`,
    /// [`crate::device`]): needs `roofline` with an accelerator target; no tensor parallelism,
    /// `--accel-mem` or `--matrix-workers` with it.
    pub accel_split: bool,
    /// The model's first layers run whole on an accelerator (`--accel-layers`,
    /// [`crate::device_layers`]): layers the model says can go (LLaMA, Qwen2, Qwen3, Gemma 3),
    /// without tensor parallelism or the other accelerator modes; 0: none.
    pub accel_layers: usize,
    /// Passes of fewer tokens than this run those layers on the CPU too (`--accel-min-tokens`,
    /// [`crate::device_layers`]): prefill on the accelerator, decode steps on the CPU, each
    /// cache kept in step with the other's rows. 0 or 1: every pass on the accelerator.
    pub accel_min_tokens: usize,
    /// Leave out the barriers between independent nodes and row-local chains
    /// (`corelm_core::Graph::elide_barriers`; same bits). Off only to compare.
    pub elide_barriers: bool,
    /// LoRA adapters applied at run time (`--lora`, `--lora-scaled`, [`crate::lora`]), in
    /// order, each at its starting scale; not with `--tp`, `--sparsity` or the accelerator.
    pub lora: Vec<crate::lora::LoraSpec>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            n_ctx: 4096,
            n_batch: 512,
            n_seq_max: 4,
            n_threads: default_threads(),
            pin: true,
            numa: NumaMode::Off,
            tp: 1,
            tp_sync: TpSync::Async,
            tp_kv: TpKv::Exchange,
            batch_invariant: false,
            cache_type_k: DType::F16,
            cache_type_v: DType::F16,
            kv_layout: KeyLayout::Rows,
            attn_pipeline: false,
            fast_prefill: false,
            repack: true,
            isa: None,
            plan: None,
            roofline: None,
            matrix_workers: 0,
            sparsity: None,
            accel: None,
            accel_split: false,
            accel_layers: 0,
            accel_min_tokens: 0,
            elide_barriers: true,
            lora: Vec::new(),
        }
    }
}

impl EngineConfig {
    /// The first layers the accelerator runs in a pass of `n_tokens` tokens (`--accel-layers`,
    /// none below `--accel-min-tokens`).
    pub fn device_layers_for(&self, n_tokens: usize) -> usize {
        if n_tokens >= self.accel_min_tokens { self.accel_layers } else { 0 }
    }

    /// Whether some passes run the accelerator's layers and others run them on the CPU.
    pub fn alternates_layers(&self) -> bool {
        self.accel_layers > 0 && self.accel_min_tokens > 1
    }
}

/// Parse a key layout name (`--kv-layout`): `rows` or `columns`.
pub fn parse_kv_layout(s: &str) -> Result<KeyLayout, String> {
    match s {
        "rows" => Ok(KeyLayout::Rows),
        "columns" => Ok(KeyLayout::Columns),
        _ => Err(format!("unknown key layout {s:?} (rows, columns)")),
    }
}

/// Parse a KV cache type name as llama.cpp spells it (`f16`, `q8_0`, `q4_0`).
pub fn parse_cache_type(s: &str) -> Result<DType, String> {
    let names: Vec<String> = corelm_core::kv::KV_TYPES.iter().map(|t| t.name().to_lowercase()).collect();
    corelm_core::kv::KV_TYPES
        .iter()
        .find(|t| t.name().eq_ignore_ascii_case(s))
        .copied()
        .ok_or_else(|| format!("unknown KV cache type '{s}' (supported: {})", names.join(", ")))
}

/// Physical cores available to this process.
pub fn default_threads() -> usize {
    corelm_core::placement::physical_cores().len().max(1)
}

/// Physical cores a `--numa` mode runs on (`isolate`: the starting node's), or
/// [`default_threads`] if the mode cannot be planned (the load then says why).
pub fn default_threads_for(numa: NumaMode) -> usize {
    corelm_core::placement::this_machine(numa).map_or_else(|_| default_threads(), |p| p.cpus.len().max(1))
}
