//! Tensor headers, kept apart from tensor data. A header says what a tensor is (shape, type,
//! the op that produces it and its sources) and where its bytes are (a [`Storage`]); the bytes
//! themselves live in the model mapping, the activation pools, the output pool or the KV cache.

use corelm_kernels::attention::KeyLayout;
use corelm_kernels::DType;

/// Index of a tensor in its graph's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorId(pub u32);

/// A weight made of whole-block columns `c0 .. c0 + n` (its `ne[0]`) of every row of a file
/// matrix whose rows hold `row_len` values (a tensor-parallel shard of Wo or down): not
/// contiguous in the file, so always read from a copy made at load. Two shards may slice the
/// same first column with different widths (a block cut in two: `Builder::matmul_cols`), so
/// the width is part of the slice's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ColSlice {
    pub row_len: usize,
    pub c0: usize,
    pub n: usize,
}

/// A weight's copy made at load (`crate::packed`): its byte offset in the copies' buffer, and
/// whether it is in the interleaved layout of the table's kernels or plain rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightCopy {
    pub at: usize,
    pub interleaved: bool,
}

/// How a weight tensor's rows relate to the file's matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightForm {
    /// The file's rows (repacked at load into the interleaved layout where the table has
    /// kernels for it).
    Rows,
    /// The file's rows, never interleaved: read one row at a time (a predicted gate reads
    /// only the rows of predicted neurons).
    PlainRows,
    /// Transposed — row `i` holds column `i` of the file's matrix of type `from` — and
    /// requantized to the tensor's type: the down projection stored neuron-major, so a neuron
    /// that does not fire is a row not read (sparse FFN). Always a copy made at load.
    NeuronMajor { from: DType },
    /// The rows of layer `layer`'s neurons `n0 .. n1` (all of them, or a tensor-parallel
    /// shard's range) that stay on the CPU when an accelerator computes the others
    /// (`SparseFfn::offloaded`), in neuron order: gate (`plain` false: interleaved where the
    /// table has kernels) or up (`plain` true). Always a copy made at load.
    ColdRows { layer: u16, plain: bool, n0: u32, n1: u32 },
    /// `NeuronMajor` of only those neurons: the down projection's CPU part.
    ColdNeuronMajor { from: DType, layer: u16, n0: u32, n1: u32 },
}

impl WeightForm {
    /// The layer and the range of neurons whose CPU neurons the form selects.
    pub fn cold_range(self) -> Option<(usize, std::ops::Range<usize>)> {
        match self {
            WeightForm::ColdRows { layer, n0, n1, .. } | WeightForm::ColdNeuronMajor { layer, n0, n1, .. } => Some((layer as usize, n0 as usize..n1 as usize)),
            _ => None,
        }
    }

    /// The form with its neuron range set to `r` (cold forms; others unchanged).
    pub fn with_range(self, r: std::ops::Range<usize>) -> Self {
        let (a, b) = (r.start as u32, r.end as u32);
        match self {
            WeightForm::ColdRows { layer, plain, .. } => WeightForm::ColdRows { layer, plain, n0: a, n1: b },
            WeightForm::ColdNeuronMajor { from, layer, .. } => WeightForm::ColdNeuronMajor { from, layer, n0: a, n1: b },
            f => f,
        }
    }
}

/// Where a tensor's bytes are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Storage {
    /// A range of the model file mapping (`offset`, `len`: the whole matrix, or with `cols` the
    /// matrix whose columns it slices), in `form`; `copy`: where the executor's copy made at
    /// load starts, if it has one (always, for a column slice or a neuron-major form).
    Weight { offset: usize, len: usize, cols: Option<ColSlice>, copy: Option<WeightCopy>, form: WeightForm },
    /// In activation buffer `buf` (0 or 1: layer parity) at a byte offset.
    Act { buf: u8, offset: usize },
    /// In the output (logits) buffer at a byte offset, rows `ld` f32 apart (`ne0`, or the whole
    /// vocabulary for a tensor-parallel shard's columns of the logits).
    Output { offset: usize, ld: usize },
    /// A LoRA adapter's matrix in the executor's adapter buffer (`Weights::adapters`), plain
    /// rows at a byte offset.
    Adapter { offset: usize, len: usize },
    /// Produces no tensor of its own (writes into the KV cache).
    None,
}

/// Gated activation kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// `silu(gate) · up` (LLaMA, Qwen).
    Silu,
    /// `gelu_tanh(gate) · up` (Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (ggml `swiglu_oai`, α = 1.702, limit 7, as llama.cpp hard-codes
    /// them): `x = min(gate, 7)`, `y = clamp(up, −7, 7)`, `x · σ(α·x) · (y + 1)`.
    SwigluOai,
}

/// RoPE parameters of one `rope` node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub n_head: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub base: f32,
    pub freq_scale: f32,
    /// Multiplies every cosine and sine (ggml's `attn_factor`, YaRN's magnitude correction
    /// folded in: Phi-3 LongRoPE's and YaRN's attention factors, so q·k grows by its square);
    /// 1 for a plain rotation.
    pub mscale: f32,
    /// YaRN's mix of extrapolated angles (0: none) and its correction dimensions
    /// (`rope::Angles`).
    pub ext_factor: f32,
    pub corr_dims: [f32; 2],
    /// NeoX pairing `(i, i + n_rot/2)` instead of adjacent pairs.
    pub neox: bool,
    /// Pairs that never turn (`rope::Angles::still`: Qwen3-VL's fourth M-RoPE section on text).
    pub still: u128,
}

impl RopeParams {
    /// A plain rotation: no attention factor, no YaRN.
    pub fn plain(n_head: usize, head_dim: usize, n_rot: usize, base: f32, freq_scale: f32, neox: bool) -> Self {
        RopeParams { n_head, head_dim, n_rot, base, freq_scale, mscale: 1.0, ext_factor: 0.0, corr_dims: [0.0; 2], neox, still: 0 }
    }

    /// What the angles depend on besides the position.
    pub fn angles(&self) -> corelm_kernels::rope::Angles {
        corelm_kernels::rope::Angles { base: self.base, freq_scale: self.freq_scale, mscale: self.mscale, ext_factor: self.ext_factor, corr_dims: self.corr_dims, still: self.still }
    }
}

/// Attention parameters of one `attention` node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Multiplies q·k before the softmax.
    pub scale: f32,
    /// Where not 0, each score `s` becomes `softcap · tanh(s / softcap)` (Gemma 2's
    /// attention logit soft-capping, `attention::Scale`).
    pub softcap: f32,
    /// Sliding window: a query at position p sees keys at positions > p - window.
    pub window: Option<u32>,
}

impl AttnParams {
    /// How the kernels turn a dot product into a score: the scale, and the soft cap.
    pub fn scores(&self) -> corelm_kernels::attention::Scale {
        corelm_kernels::attention::Scale::new(self.scale, self.softcap)
    }
}

/// Which query heads and KV cache rows an `attention` node covers: all of them in serial mode,
/// a tensor-parallel shard's otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShard {
    /// The model's index of the node's first query head.
    pub q_head0: usize,
    /// Query heads per KV head in the model.
    pub group: usize,
    /// The cache slot (KV head row block of every layer) of the node's first KV head.
    pub kv_base: usize,
}

impl AttnShard {
    /// The node's KV head (from 0) that its query head `i` (from 0) reads.
    pub fn kv_of(&self, i: usize) -> usize {
        (self.q_head0 + i) / self.group - self.q_head0 / self.group
    }
}

/// A matmul's output cut among the executor's worker classes (SMEPilot's tile-level split,
/// planned by `corelm_plan::planner::apply_splits`): along the output columns (weight rows), or
/// along the activation rows when `by_rows`; class `c` computes `bounds[c]..bounds[c + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassSplit {
    pub by_rows: bool,
    pub bounds: Vec<usize>,
}

/// A matmul whose first output columns (weight rows `0..cols`) an accelerator computes while
/// the CPU's workers compute the others (SMEPilot's accelerator target; the engine's
/// `--accel-split`): `matrix` names the device's copy of those rows (`Executor::device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSplit {
    pub matrix: u32,
    pub cols: usize,
}

/// The operation producing a tensor. Activation tensors are f32 rows (one row per batch token
/// or output) unless quantized by `Quantize`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// A weight (no computation).
    Leaf,
    /// Rows of an embedding table, one per batch token.
    Embed { table: TensorId },
    /// RMS-normalise groups of `w.len()` elements, then multiply by `w`.
    RmsNorm { x: TensorId, w: TensorId, eps: f32 },
    /// `a + b`; `b` may be a single row broadcast over `a`'s rows (a bias).
    Add { a: TensorId, b: TensorId },
    /// `x · s`.
    Scale { x: TensorId, s: f32 },
    /// Each row times its batch position's `1 + scale · ln(⌊pos / floor⌋ + 1)`: the queries'
    /// attention temperature of Llama 4 and Mistral 3 (llama.cpp's `attn_scale` input, each
    /// row's factor computed as there: the quotient and its floor in f32, the logarithm and
    /// the rest in f64, rounded to f32 once; then one f32 product per value).
    TempScale { x: TensorId, scale: f32, floor: u32 },
    /// `cap · tanh(x · (1 / cap))` elementwise: ggml's scale, tanh and scale (Gemma 2's final
    /// logit soft-capping), each rounded as there, `tanh` the C library's `tanhf`.
    Softcap { x: TensorId, cap: f32 },
    /// `a + b · s`, the product rounded before the sum: a [`Op::Scale`] then an [`Op::Add`]
    /// in one pass (a LoRA adapter's term, `graph::lora`).
    AddScaled { a: TensorId, b: TensorId, s: f32 },
    /// Quantize f32 rows to the `vec_dot_type` of the matrices that will read them: each row
    /// of `x` after `pad` zeros, and zeros after it up to `ne0` (`pad` 0 and `x`'s width but
    /// for a tensor-parallel down product whose cut falls inside a quantization block,
    /// `Builder::matmul_cols`).
    Quantize { x: TensorId, pad: u32 },
    /// `y[r][c] = w[c] · x[r]` for weight rows `c`.
    MatMul { w: TensorId, x: TensorId },
    /// Rotary embedding at each batch token's position; `freqs`: optional per-frequency
    /// divisors (`n_rot / 2` f32).
    Rope { x: TensorId, p: RopeParams, freqs: Option<TensorId> },
    /// Write K and V rows into the cache cells the batch was given: values `c0 .. c0 + width`
    /// of each row (whole heads, one after another), head `h` of them into cache slot
    /// `kv_base + h`, the keys in the layout `keys` (the cache's). Keys only or values only
    /// where a tensor-parallel shard stores a shared head's projection into another shard's
    /// slots (`TpPlan::k_heads`).
    KvStore { layer: u32, k: Option<TensorId>, v: Option<TensorId>, c0: u32, width: u32, kv_base: u32, keys: KeyLayout },
    /// Fused attention of each query head over the cache (`p` counts the node's own heads).
    /// `sinks`: per query head of the model (`[n_head]` f32), a logit each head's softmax
    /// counts in its denominator with no value (gpt-oss's attention sinks).
    Attention { layer: u32, q: TensorId, p: AttnParams, shard: AttnShard, sinks: Option<TensorId> },
    /// Gated activation.
    Glu { gate: TensorId, up: TensorId, kind: Glu },
    /// Sparse FFN, up projection of a small batch: `h = a · (w_i · x)` for each neuron `i` whose
    /// activation `a = act(gate)` has `|a| > thr`, else 0 (`w`: plain rows, only firing ones
    /// read; `x` quantized for them).
    /// `masked`: neurons an accelerator holds now (`Offload::resident`) are left to it (0 here);
    /// `Some(n0)`: the node's neuron 0 is the layer's neuron `n0` (a tensor-parallel shard's
    /// first), `None`: not masked.
    SparseUp { gate: TensorId, w: TensorId, x: TensorId, kind: Glu, thr: f32, masked: Option<u32> },
    /// Sparse FFN of a batch whose up projection was computed densely: `h = a · up` where
    /// `|a| > thr`, else 0, `a = act(gate)` — the same values as `SparseUp`.
    /// `masked` as `SparseUp`'s; `pred`: only neurons with a positive margin there can fire
    /// (the same set `SparseGate` computes the gate of).
    GluMasked { gate: TensorId, up: TensorId, kind: Glu, thr: f32, masked: Option<u32>, pred: Option<TensorId> },
    /// Adjacent-layer prediction (`SparseFfn::predictor`, KAIROX §5.1): per row of `x` (an FFN
    /// input, `[n_embd, n_tokens]` f32), the margins `B·(A·x) − cut` of layer `layer`'s
    /// neurons `n0 .. n0 + ne0` (`[ne0, n_tokens]`; tensor parallel: a shard's range, else
    /// all): positive where the neuron is predicted to fire.
    Predict { layer: u32, x: TensorId, n0: u32 },
    /// Sparse FFN gate of a small batch: `g_i = w_i · x` for the neurons with a positive
    /// margin in `pred`, else 0 (`w`: plain rows, only predicted ones read; `x` quantized for
    /// them). A zero gate never fires (`act(0) = 0`).
    SparseGate { pred: TensorId, w: TensorId, x: TensorId },
    /// Sparse FFN, down projection: `y[r] = Σ h[r][i] · w_i` over the neurons with `h[r][i] ≠ 0`,
    /// `w` the down matrix stored neuron-major (`WeightForm::NeuronMajor`), neurons in order.
    SparseDown { h: TensorId, w: TensorId },
    /// The batch rows whose outputs were asked for.
    SelectOutputs { x: TensorId },
    /// Hand `x` (`[n_embd, n_tokens]`, the FFN's input) to the accelerator, which starts
    /// computing layer `layer`'s offloaded neurons with the CPU's activation `kind` and firing
    /// threshold `thr` (worker 0; produces no tensor).
    OffloadBegin { layer: u32, x: TensorId, kind: Glu, thr: f32 },
    /// The accelerator's part of layer `layer`'s FFN output, `[n_embd, n_tokens]`, once it is
    /// done (worker 0 waits for it); `begin` is the `OffloadBegin` node it completes. `gates`:
    /// the CPU's gate product of every neuron (`Graph::lists`: one tensor, or each
    /// tensor-parallel shard's of its range in shard order), handed to `Offload::observe`
    /// (online balancing).
    OffloadEnd { layer: u32, begin: TensorId, gates: Option<u32> },
    /// The model's first layers run whole on the accelerator (`--accel-layers`): their output
    /// `[n_embd, n_tokens]` from their input `x` (the embeddings), worker 0 waiting for it
    /// (`sched::DeviceLayers`).
    DeviceLayers { x: TensorId },
    /// Mixture-of-experts selection of each token from its router logits `[n_expert, n_tokens]`
    /// (`crate::moe::select`, workers split the tokens): I32 `[ids (P)] [weight bits (P)]`.
    MoeSelect { logits: TensorId, p: MoeParams },
    /// The routing table of a selection (`crate::moe::order`, one worker): an I32 table
    /// (layout in `crate::moe::Route`) of the chosen experts, their weights and the (token,
    /// slot) pairs grouped by expert.
    MoeRoute { sel: TensorId, p: MoeParams },
    /// Grouped matmul over the routed pairs: `y[pair] = w[expert(pair)] · x[row(pair)]`, where
    /// `w` stacks the experts' matrices (`n_out` rows each) and `x` has a row per token
    /// (`per_pair` false) or per pair. Each expert's rows are read once for all its tokens.
    /// A tensor-parallel shard's `w` stacks only experts `e0 .. e1` and computes only their pairs.
    MatMulId { w: TensorId, x: TensorId, route: TensorId, p: MoeParams, per_pair: bool, e0: u32, e1: u32 },
    /// `x[r][c] · sigmoid(g[r][0])`: a per-row gate (Qwen2-MoE's shared expert).
    SigmoidMul { x: TensorId, g: TensorId },
    /// `out[token] = Σ_slot weight · y[pair]`, slots in order, over the slots whose expert is in
    /// `e0 .. e1` (all of them in serial mode; a shard's, whose partial sums a gather adds).
    MoeCombine { y: TensorId, route: TensorId, p: MoeParams, e0: u32, e1: u32 },
    /// `y[pos] = x[pos] + bias[expert(pos)]` over the rows (in position order) of the pairs
    /// routed to experts `e0 .. e1`, whose bias rows `bias` stacks (ggml's `add_id`: per-expert
    /// biases, gpt-oss).
    AddId { x: TensorId, bias: TensorId, route: TensorId, p: MoeParams, e0: u32, e1: u32 },
    /// Gather of tensor parallelism: the element-wise sum of the shards' partial results
    /// (`Graph::lists[list]`, added in shard order).
    GatherSum { list: u32 },
}

/// Shape of a mixture-of-experts layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeParams {
    pub n_expert: usize,
    /// Experts per token (top-k).
    pub n_used: usize,
    /// Divide the chosen experts' probabilities by their sum.
    pub norm_w: bool,
    /// Multiply the weights by this (1 = none).
    pub w_scale: f32,
    /// How router logits become the chosen experts' weights.
    pub gating: MoeGating,
}

/// How a router's logits become weights (llama.cpp's `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeGating {
    /// A softmax over every expert; the `n_used` most probable chosen, their probabilities
    /// the weights.
    Softmax,
    /// The `n_used` largest logits chosen, a softmax over those alone the weights (gpt-oss).
    SoftmaxWeight,
}

impl Op {
    /// Short name for profiles and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Leaf => "leaf",
            Op::Embed { .. } => "embed",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Add { .. } => "add",
            Op::AddScaled { .. } => "add_scaled",
            Op::Scale { .. } => "scale",
            Op::TempScale { .. } => "temp_scale",
            Op::Softcap { .. } => "softcap",
            Op::Quantize { .. } => "quantize",
            Op::MatMul { .. } => "matmul",
            Op::Rope { .. } => "rope",
            Op::KvStore { .. } => "kv_store",
            Op::Attention { .. } => "attention",
            Op::Glu { .. } => "glu",
            Op::SparseUp { .. } => "sparse_up",
            Op::GluMasked { .. } => "glu_masked",
            Op::Predict { .. } => "predict",
            Op::SparseGate { .. } => "sparse_gate",
            Op::SparseDown { .. } => "sparse_down",
            Op::OffloadBegin { .. } => "offload_begin",
            Op::OffloadEnd { .. } => "offload_end",
            Op::DeviceLayers { .. } => "device_layers",
            Op::SelectOutputs { .. } => "select_outputs",
            Op::MoeSelect { .. } => "moe_select",
            Op::MoeRoute { .. } => "moe_route",
            Op::MatMulId { .. } => "matmul_id",
            Op::MoeCombine { .. } => "moe_combine",
            Op::AddId { .. } => "add_id",
            Op::SigmoidMul { .. } => "sigmoid_mul",
            Op::GatherSum { .. } => "gather_sum",
        }
    }
}

/// A tensor header.
#[derive(Clone, Debug)]
pub struct Tensor {
    /// `ne[0]` is the row length (contiguous), `ne[1]` the number of rows.
    pub ne: [usize; 2],
    pub dtype: DType,
    pub op: Op,
    pub storage: Storage,
    /// Layer that produced it (-1 before the first layer; weights: -1).
    pub layer: i32,
    /// The tensor-parallel shard (worker group) that computes it; `None`: every worker.
    pub group: Option<u16>,
}

/// The layout a tensor's bytes are in: the one the kernel that reads it expects, fixed when the
/// graph is planned and its weights copied at load (SMEPilot's layout state). Nothing on the
/// per-token path converts one into another (`corelm_kernels::matmul::layout::repacks`
/// counts every weight re-layout; an engine test requires none while decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Plain rows of `ne[0]` values: the file's, an activation's, the logits.
    Rows,
    /// Four rows interleaved block by block (`matmul::layout`), copied at load for decode's
    /// GEMV and prefill's tiles.
    Interleaved,
    /// A row per FFN neuron (the down projection transposed) in column panels
    /// (`sparse::Panels`: every neuron's 64 columns of a panel together), copied at load for
    /// the sparse FFN, which skips a neuron by skipping its pieces.
    NeuronMajor,
    /// Rows written into the KV cache (a key row and a value row per cell and KV head, in the
    /// cache's type): what ggml's attention kernels read.
    KvCells,
    /// Keys written into the KV cache transposed per block of 16 cells (`[head_dim][16]`
    /// F16), values as rows: what the column-key kernels (`attention::matrix`: AVX-512, AVX2,
    /// NEON, the SME matrix unit) read, with no transposition while they run.
    KvColumns,
    /// No bytes of its own (an accelerator hand-off).
    Nothing,
}

impl Tensor {
    /// The layout of this tensor's bytes.
    pub fn layout(&self) -> Layout {
        match (self.storage, self.op) {
            (Storage::Weight { copy: Some(WeightCopy { interleaved: true, .. }), .. }, _) => Layout::Interleaved,
            (Storage::Weight { form: WeightForm::NeuronMajor { .. } | WeightForm::ColdNeuronMajor { .. }, .. }, _) => Layout::NeuronMajor,
            (Storage::None, Op::KvStore { keys: KeyLayout::Columns, .. }) => Layout::KvColumns,
            (Storage::None, Op::KvStore { .. }) => Layout::KvCells,
            (Storage::None, _) => Layout::Nothing,
            _ => Layout::Rows,
        }
    }

    pub fn row_bytes(&self) -> usize {
        corelm_kernels::row_bytes(self.dtype, self.ne[0])
    }

    pub fn n_bytes(&self) -> usize {
        self.row_bytes() * self.ne[1]
    }
}

/// A weight as models name it: its type, GGML shape and byte range in the model file.
#[derive(Clone, Debug)]
pub struct WeightRef {
    pub name: String,
    pub dtype: DType,
    pub ne: [usize; 2],
    pub offset: usize,
    pub len: usize,
}

/// One tensor, or one per parallel subgraph: builder functions take and return bundles so a
/// model is written once and runs with or without tensor parallelism. In serial mode a bundle
/// holds exactly one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Bundle(pub Vec<TensorId>);

impl Bundle {
    pub fn one(t: TensorId) -> Bundle {
        Bundle(vec![t])
    }

    /// The single tensor of a serial-mode bundle.
    pub fn single(&self) -> TensorId {
        assert_eq!(self.0.len(), 1, "bundle of {} tensors used where one was expected", self.0.len());
        self.0[0]
    }
}
