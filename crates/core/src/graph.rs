//! The graph builder and the static graph it produces.
//!
//! Builder functions append nodes in construction order, which is already a topological order,
//! so the scheduler simply walks the list. Activations are placed as the graph is built: layer
//! `il` allocates from activation buffer `il % 2` (reset at the start of the layer) and may only
//! read the previous layer's tensors, which are in the other buffer; embeddings count as layer
//! -1 and the output head as layer `n_layer`. The graph records how many bytes each buffer and
//! the output pool need, so pools are sized by planning the largest batch once.
//!
//! Modes (ArcLight appendix A.1): in serial mode a bundle holds one tensor and every worker
//! runs every node. With a tensor-parallel plan ([`crate::tp::TpPlan`]) [`Builder::scatter`]
//! enters parallel mode: [`Builder::weight_split`] gives one shard of a weight per subgraph,
//! every builder function maps over the bundles' shards (a one-tensor bundle, such as the
//! scattered input, is read by every shard), and each node it appends carries its shard as
//! `Tensor::group`, run by that group of workers only. [`Builder::gather_sum`] adds the shards'
//! partial results in one serial node and returns to serial mode. The model code is the same
//! in both modes; with no plan, scatter and gather are no-ops.
//!
//! Synchronisation ([`Graph::sync`]): a node is followed by its group's barrier when the next
//! node is also a parallel one (`async`, ArcLight's Sync B), or by the global barrier — always
//! after a serial node, before a serial node, after the last KV store of shards that store
//! each other's keys and values (`kv_store`), and after every node in `lockstep` (Sync A).
//! Once the graph is final, [`Graph::elide_barriers`] drops the global barriers that separate
//! independent nodes and row-local chains (`graph/elide.rs`).
//!
//! Invariant: a graph depends only on the batch *shape* (tokens, outputs), never on token ids
//! or positions, which are read from the batch at run time; so the decode graph is planned once
//! and reused for every token.

use crate::memory::ActLayout;
use crate::tensor::*;
use crate::tp::TpPlan;
use corelm_kernels::attention::KeyLayout;
use corelm_kernels::{DType, Kernels};
use std::collections::HashMap;
use std::sync::Arc;

mod attend;
mod col_split;
mod elide;
mod lora;
mod pointwise;
pub(crate) use col_split::quantize_padded;
mod sparse;
pub use lora::{AdapterMatrix, Lora, LoraPair};
pub use sparse::{LayerPredictor, Predictors, SparseFfn, SPARSE_UP_MAX_TOKENS};

const ALIGN: usize = 64;

/// Graph construction mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One subgraph, every worker on every node.
    Serial,
    /// One subgraph per shard, between a scatter and a gather.
    Parallel,
}

/// How [`Builder::weight_split`] cuts a weight across shards (ranges of the plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Rows of the shard's query heads (Wq, its bias).
    QHeads,
    /// Rows of the KV heads whose keys the shard projects (Wk, its bias: `TpPlan::k_heads`).
    KHeads,
    /// Rows of the KV heads whose values the shard projects (Wv, its bias: `TpPlan::v_heads`).
    VHeads,
    /// Rows of the shard's feed-forward range (gate, up).
    FfRows,
    /// Columns of the shard's query heads (Wo: [`Builder::matmul_cols`]).
    HeadCols,
    /// Columns of the shard's feed-forward range (down: [`Builder::matmul_cols`]; its
    /// neuron-major copy: [`Builder::weight_split_in`]).
    FfCols,
    /// Rows of the shard's experts in a stack of expert matrices.
    Experts,
    /// Rows of the shard's vocabulary range (the LM head, `TpPlan::vocab`).
    Vocab,
}

impl Split {
    /// Shard `s`'s rows (or with `true` columns) of `w` under `plan`.
    fn range(self, plan: &TpPlan, s: usize, w: &WeightRef) -> (std::ops::Range<usize>, bool) {
        let hd = plan.dims.head_dim;
        match self {
            Split::QHeads => (plan.q_heads[s].start * hd..plan.q_heads[s].end * hd, false),
            Split::KHeads => (plan.k_heads[s].start * hd..plan.k_heads[s].end * hd, false),
            Split::VHeads => (plan.v_heads[s].start * hd..plan.v_heads[s].end * hd, false),
            Split::FfRows => (plan.ff[s].clone(), false),
            Split::HeadCols => (plan.q_heads[s].start * hd..plan.q_heads[s].end * hd, true),
            Split::FfCols => (plan.ff[s].clone(), true),
            Split::Vocab => (plan.vocab(w.ne[1], s), false),
            Split::Experts => {
                let per = w.ne[1] / plan.dims.n_expert.max(1);
                (plan.experts[s].start * per..plan.experts[s].end * per, false)
            }
        }
    }
}

/// What separates a node from the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// The barrier of the node's worker group (between two nodes of the same subgraphs).
    Group,
    /// Every worker of the pool.
    Global,
    /// None: each worker goes on to the next node once its own share of this one is done
    /// ([`Graph::elide_barriers`]: the next node reads nothing of this one but its own rows).
    Elided,
}

impl std::str::FromStr for TpSync {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "async" => Ok(TpSync::Async),
            "lockstep" => Ok(TpSync::Lockstep),
            _ => Err(format!("unknown --tp-sync '{s}' (async, lockstep)")),
        }
    }
}

impl std::fmt::Display for TpSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if *self == TpSync::Async { "async" } else { "lockstep" })
    }
}

/// `--tp-sync`: ArcLight's two synchronisation schemes for parallel subgraphs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TpSync {
    /// Group barriers inside subgraphs, global ones only at scatter and gather (Sync B).
    #[default]
    Async,
    /// A global barrier after every node (Sync A).
    Lockstep,
}

/// A planned graph: tensor headers and the nodes to run, in order.
pub struct Graph {
    pub tensors: Vec<Tensor>,
    pub nodes: Vec<TensorId>,
    pub n_tokens: usize,
    pub n_outputs: usize,
    /// The activation buffers' regions (serial, then one per shard) and the output pool's bytes.
    pub act: ActLayout,
    pub out_bytes: usize,
    /// The tensor holding the result rows (logits).
    pub result: TensorId,
    /// Largest head dimension used by attention (per-thread scratch size).
    pub max_head_dim: usize,
    /// The partial results each `GatherSum` node adds (`Op::GatherSum::list`).
    pub lists: Vec<Vec<TensorId>>,
    /// What follows each node of `nodes`.
    pub sync: Vec<Sync>,
    /// Most workers each node of `nodes` is split among (0: all of its group or of the pool):
    /// a roofline plan caps memory-bound nodes at the bandwidth knee. The others wait at the
    /// node's barrier.
    pub threads: Vec<u16>,
    /// Matmul nodes whose output is cut among worker classes, by node id (ascending): empty
    /// unless a plan placed some on two targets (`Executor::set_classes` names the classes).
    pub splits: Vec<(TensorId, ClassSplit)>,
    /// Expert matmul nodes (`Op::MatMulId`) whose experts a plan places among worker classes by
    /// their routed pairs, by node id (ascending): from each step's pair count on, each
    /// expert's output columns cut among the classes (SMEPilot's MoE placement; the panel GEMM
    /// runs a cut, other paths ignore it).
    pub expert_splits: Vec<(TensorId, Vec<(usize, ClassSplit)>)>,
    /// Matmul nodes an accelerator shares (its columns first), by node id (ascending): empty
    /// unless a plan placed some there (`Executor::device` runs them).
    pub device_splits: Vec<(TensorId, DeviceSplit)>,
    /// The sparse configuration the graph was built with (its weights' `Cold*` forms name
    /// neuron sets of it).
    pub sparse: Option<Arc<SparseFfn>>,
}

impl Graph {
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.0 as usize]
    }

    /// How node `id`'s output is cut among worker classes, if it is.
    pub fn split_of(&self, id: TensorId) -> Option<&ClassSplit> {
        self.splits.binary_search_by_key(&id.0, |(i, _)| i.0).ok().map(|i| &self.splits[i].1)
    }

    /// The cuts of expert matmul node `id`'s experts by routed pairs (empty: not cut).
    pub fn expert_steps(&self, id: TensorId) -> &[(usize, ClassSplit)] {
        match self.expert_splits.binary_search_by_key(&id.0, |(i, _)| i.0) {
            Ok(i) => &self.expert_splits[i].1,
            Err(_) => &[],
        }
    }

    /// The accelerator's share of node `id`, if it has one.
    pub fn device_split_of(&self, id: TensorId) -> Option<DeviceSplit> {
        self.device_splits.binary_search_by_key(&id.0, |(i, _)| i.0).ok().map(|i| self.device_splits[i].1)
    }

    /// Barriers per pass: (group, global).
    pub fn barriers(&self) -> (usize, usize) {
        let count = |kind| self.sync.iter().filter(|&&s| s == kind).count();
        (count(Sync::Group), count(Sync::Global))
    }
}

/// The activation region of a node of `group` ([`ActLayout`]): 0 for serial nodes, `1 + s`
/// for shard `s`'s.
fn region(group: Option<u16>) -> usize {
    group.map_or(0, |g| g as usize + 1)
}

pub struct Builder<'k> {
    kernels: &'k Kernels,
    tensors: Vec<Tensor>,
    nodes: Vec<TensorId>,
    n_tokens: usize,
    n_outputs: usize,
    layer: i32,
    /// Per activation buffer, per region (serial, then shard by shard): the next free byte in
    /// the current layer, and the most any layer used.
    bump: [Vec<usize>; 2],
    peak: [Vec<usize>; 2],
    /// The regions to lay activations out in, when they are fixed already (the pools').
    layout: Option<ActLayout>,
    out_bump: usize,
    /// Quantize nodes by (source, activation type, zeros before, padded width).
    quantized: HashMap<(TensorId, DType, u32, usize), TensorId>,
    max_head_dim: usize,
    mode: Mode,
    tp: Option<Arc<TpPlan>>,
    tp_sync: TpSync,
    /// Shard of the nodes being appended (`None`: serial).
    group: Option<u16>,
    lists: Vec<Vec<TensorId>>,
    sparse: Option<Arc<SparseFfn>>,
    /// The next layer's predicted firing, made in the current layer (`predicted_firing`).
    prediction: Option<(usize, Bundle)>,
    /// How the KV cache the graph writes lays its keys out.
    key_layout: KeyLayout,
    /// The model's first layers the accelerator runs whole (`--accel-layers`).
    device_layers: usize,
    /// The graph ends at the final norm's rows in the output pool (embeddings), not the logits.
    hidden_output: bool,
    /// Nodes (indices into `nodes`) followed by the global barrier whatever their neighbours
    /// (the last key and value stores of an exchange, `kv_store`).
    global_after: Vec<usize>,
    /// LoRA adapters applied to the matrices they pair (`lora::Builder::lora`).
    lora: Option<Arc<Lora>>,
}

impl<'k> Builder<'k> {
    /// Start a graph for a batch of `n_tokens` tokens of which `n_outputs` produce outputs.
    pub fn new(kernels: &'k Kernels, n_tokens: usize, n_outputs: usize) -> Self {
        Builder {
            kernels,
            tensors: Vec::new(),
            nodes: Vec::new(),
            n_tokens,
            n_outputs,
            layer: -1,
            bump: [vec![0], vec![0]],
            peak: [vec![0], vec![0]],
            layout: None,
            out_bump: 0,
            quantized: HashMap::new(),
            max_head_dim: 0,
            mode: Mode::Serial,
            tp: None,
            tp_sync: TpSync::Async,
            group: None,
            lists: Vec::new(),
            sparse: None,
            prediction: None,
            key_layout: KeyLayout::Rows,
            device_layers: 0,
            hidden_output: false,
            global_after: Vec::new(),
            lora: None,
        }
    }

    /// Run the model's first `n` layers whole on the accelerator (`Op::DeviceLayers`): the
    /// model's `build` hands its embeddings to [`Self::device_block`] and starts at layer `n`.
    pub fn with_device_layers(mut self, n: usize) -> Self {
        self.device_layers = n;
        self
    }

    /// End the graph at the final norm's output rows instead of the LM head
    /// ([`Self::hidden_to_output`]): the hidden states embeddings are pooled from.
    pub fn with_hidden_output(mut self, on: bool) -> Self {
        self.hidden_output = on;
        self
    }

    /// Whether the model's head should stop before the LM head.
    pub fn hidden_output(&self) -> bool {
        self.hidden_output
    }

    /// Move `x`, the last node built (serial, F32), into the output pool as the graph's
    /// result, `[ne0, rows]` packed rows; its activation bytes stay reserved, unused.
    pub fn hidden_to_output(&mut self, x: &Bundle) -> Bundle {
        let id = x.single();
        assert_eq!(self.mode, Mode::Serial, "output rows from inside parallel subgraphs");
        let offset = self.out_bump;
        let last = self.nodes.last() == Some(&id);
        let t = &mut self.tensors[id.0 as usize];
        // (A pass with no output rows has no node here.)
        assert!(last || t.ne[1] == 0, "only the last node can write the output pool");
        assert_eq!(t.dtype, DType::F32, "output rows are f32");
        t.storage = Storage::Output { offset, ld: t.ne[0] };
        self.out_bump += t.ne[0] * t.ne[1] * 4;
        x.clone()
    }

    /// How many first layers the accelerator runs whole (0: none).
    pub fn device_layers(&self) -> usize {
        self.device_layers
    }

    /// The accelerator's first layers over `x` (`[n_tokens, n_embd]`, the embeddings,
    /// serial): their output, an activation of the last of them, which the CPU's first layer
    /// reads. (Same parity as the embeddings' layer: after them in that region; the other: a
    /// region of its own. Either way not where the first CPU layer writes.)
    pub fn device_block(&mut self, x: &Bundle) -> Bundle {
        assert!(self.device_layers > 0, "a device block needs --accel-layers");
        let x = x.single();
        self.check_src(x);
        let ne = self.tensors[x.0 as usize].ne;
        self.layer = self.device_layers as i32 - 1;
        self.node(ne, DType::F32, Op::DeviceLayers { x })
    }

    /// Store keys in `layout` (the KV cache's, `--kv-layout`).
    pub fn with_key_layout(mut self, layout: KeyLayout) -> Self {
        self.key_layout = layout;
        self
    }

    /// Lay activations out in `layout`'s regions (those of the pools the graph will run on)
    /// instead of regions of this graph's own sizes; `finish` checks that they fit.
    pub fn with_act_layout(mut self, layout: Option<ActLayout>) -> Self {
        self.layout = layout;
        self
    }

    /// The current layer's index (for forms naming it).
    pub fn layer(&self) -> usize {
        usize::try_from(self.layer).expect("inside a layer")
    }

    /// Build with tensor parallelism over `plan`'s shards (a plan of degree 1 is none).
    pub fn with_tp(mut self, plan: Option<Arc<TpPlan>>, sync: TpSync) -> Self {
        self.tp = plan.filter(|p| p.degree() > 1);
        self.tp_sync = sync;
        self
    }

    /// The plan and the shard whose nodes are being appended (`None` in serial mode).
    fn shard(&self) -> Option<(&TpPlan, usize)> {
        Some((self.tp.as_deref()?, self.group? as usize))
    }

    /// Enter parallel mode (no-op without a plan): `x` stays one tensor that every shard reads.
    pub fn scatter(&mut self, x: &Bundle) -> Bundle {
        if self.tp.is_some() {
            assert_eq!(self.mode, Mode::Serial, "scatter inside parallel subgraphs");
            self.mode = Mode::Parallel;
        }
        x.clone()
    }

    /// Leave parallel mode with no shard result to gather (the subgraph made only nodes that
    /// later layers read, such as the next layer's prediction).
    pub fn leave_parallel(&mut self) {
        self.mode = Mode::Serial;
    }

    /// Leave parallel mode: one serial node adding the shards' partial results element-wise, in
    /// shard order. A one-tensor bundle passes through.
    pub fn gather_sum(&mut self, x: &Bundle) -> Bundle {
        self.mode = Mode::Serial;
        if x.0.len() == 1 {
            return x.clone();
        }
        let ne = self.t(x.0[0]).ne;
        for &p in &x.0 {
            self.check_src(p);
            assert_eq!(self.t(p).ne, ne, "gathered partials of different shapes");
        }
        let list = self.lists.len() as u32;
        self.lists.push(x.0.clone());
        self.node(ne, DType::F32, Op::GatherSum { list })
    }

    /// Apply `f` to each shard of `srcs` (a one-tensor bundle is every shard's), appending the
    /// nodes of shard `s` as group `s`; with only one-tensor bundles, one serial node.
    fn zip(&mut self, srcs: &[&Bundle], mut f: impl FnMut(&mut Self, &[TensorId]) -> TensorId) -> Bundle {
        let n = srcs.iter().map(|b| b.0.len()).max().unwrap_or(1);
        assert!(srcs.iter().all(|b| b.0.len() == 1 || b.0.len() == n), "bundles of different widths");
        assert!(n == 1 || self.mode == Mode::Parallel, "a bundle of {n} tensors in serial mode");
        let mut out = Vec::with_capacity(n);
        let mut ids = Vec::with_capacity(srcs.len());
        for s in 0..n {
            self.group = (n > 1).then_some(s as u16);
            ids.clear();
            ids.extend(srcs.iter().map(|b| b.0[if b.0.len() == 1 { 0 } else { s }]));
            out.push(f(self, &ids));
        }
        self.group = None;
        Bundle(out)
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    fn t(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.0 as usize]
    }

    /// Begin layer `il`: its activations go to buffer `il % 2`, which is reset.
    pub fn begin_layer(&mut self, il: usize) {
        self.layer = il as i32;
        self.bump[il % 2].fill(0);
        self.quantized.clear();
    }

    fn parity(&self) -> usize {
        self.layer.rem_euclid(2) as usize
    }

    fn check_src(&self, id: TensorId) {
        let t = self.t(id);
        if matches!(t.storage, Storage::Act { .. }) {
            assert!(
                t.layer >= self.layer - 1,
                "layer {} reads a tensor of layer {}: activations live for one layer only",
                self.layer,
                t.layer
            );
        }
    }

    fn push(&mut self, ne: [usize; 2], dtype: DType, op: Op, storage: Storage) -> TensorId {
        let id = self.unscheduled(ne, dtype, op, storage);
        if op != Op::Leaf {
            self.nodes.push(id);
        }
        id
    }

    /// A tensor of the current layer and shard that no node computes.
    fn unscheduled(&mut self, ne: [usize; 2], dtype: DType, op: Op, storage: Storage) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor { ne, dtype, op, storage, layer: self.layer, group: self.group });
        id
    }

    /// A new node whose result is an activation of the current layer, in its shard's region
    /// (offsets are relative to the region until `finish`).
    ///
    /// A result with no elements (the keys of a shard that projects none, `TpPlan::k_heads`;
    /// the sparse feed-forward of a shard whose neurons are all on an accelerator) is a
    /// tensor and no node: nothing runs it.
    fn node(&mut self, ne: [usize; 2], dtype: DType, op: Op) -> Bundle {
        let (p, r) = (self.parity(), region(self.group));
        let bytes = corelm_kernels::row_bytes(dtype, ne[0]) * ne[1];
        if self.bump[p].len() <= r {
            for v in self.bump.iter_mut().chain(self.peak.iter_mut()) {
                v.resize(r + 1, 0);
            }
        }
        let offset = self.bump[p][r];
        self.bump[p][r] = (offset + bytes).div_ceil(ALIGN) * ALIGN;
        self.peak[p][r] = self.peak[p][r].max(self.bump[p][r]);
        let storage = Storage::Act { buf: p as u8, offset };
        if bytes == 0 {
            // Its storage is an empty range of its region (a valid address for a reader's
            // empty slice); no node.
            return Bundle::one(self.unscheduled(ne, dtype, op, storage));
        }
        Bundle::one(self.push(ne, dtype, op, storage))
    }

    /// Register a weight of the model file (read whole by every shard).
    pub fn weight(&mut self, w: &WeightRef) -> Bundle {
        Bundle::one(self.weight_part(w, w.ne, w.offset, w.len, None))
    }

    fn weight_part(&mut self, w: &WeightRef, ne: [usize; 2], offset: usize, len: usize, cols: Option<ColSlice>) -> TensorId {
        self.leaf(ne, w.dtype, Storage::Weight { offset, len, cols, copy: None, form: WeightForm::Rows })
    }

    /// A weight tensor (no node) of the current shard.
    fn leaf(&mut self, ne: [usize; 2], dtype: DType, storage: Storage) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor { ne, dtype, op: Op::Leaf, storage, layer: -1, group: self.group });
        id
    }

    /// A weight cut across the shards of the plan as `split` says (rows: a contiguous part of
    /// the file; columns: a [`ColSlice`], copied at load); the whole weight in serial mode. A
    /// vector (one row) is cut by elements.
    pub fn weight_split(&mut self, w: &WeightRef, split: Split) -> Bundle {
        self.weight_cut(w, split, true)
    }

    /// [`Builder::weight_split`]; a column slice must be whole blocks of `w`'s type where
    /// `whole_blocks` (it is copied as it is; a form that requantizes it takes any columns).
    fn weight_cut(&mut self, w: &WeightRef, split: Split, whole_blocks: bool) -> Bundle {
        let Some(plan) = self.shard_plan() else {
            return self.weight(w);
        };
        let mut parts = Vec::with_capacity(plan.degree());
        for s in 0..plan.degree() {
            let (r, by_cols) = split.range(&plan, s, w);
            self.group = Some(s as u16);
            let [ne0, ne1] = w.ne;
            let id = if by_cols {
                let bs = w.dtype.block_size();
                let whole = !whole_blocks || (r.start % bs == 0 && r.len() % bs == 0);
                assert!(r.end <= ne0 && whole, "{}: columns {r:?} are not whole {bs}-value blocks", w.name);
                self.weight_part(w, [r.len(), ne1], w.offset, w.len, Some(ColSlice { row_len: ne0, c0: r.start, n: r.len() }))
            } else if ne1 == 1 {
                assert!(r.end <= ne0 && w.dtype == DType::F32, "{}: elements {r:?} of a vector", w.name);
                self.weight_part(w, [r.len(), 1], w.offset + 4 * r.start, 4 * r.len(), None)
            } else {
                assert!(r.end <= ne1, "{}: rows {r:?} of {ne1}", w.name);
                let rb = corelm_kernels::row_bytes(w.dtype, ne0);
                self.weight_part(w, [ne0, r.len()], w.offset + rb * r.start, rb * r.len(), None)
            };
            parts.push(id);
        }
        self.group = None;
        Bundle(parts)
    }

    /// Embedding rows of the batch tokens: `[n_tokens, table.ne0]`.
    pub fn embed(&mut self, table: &Bundle) -> Bundle {
        let t = table.single();
        let ne0 = self.t(t).ne[0];
        self.node([ne0, self.n_tokens], DType::F32, Op::Embed { table: t })
    }

    /// `x` quantized for the dot product of weight type `wt`; one node per (x, type), shared by
    /// every matrix that reads `x` (Q/K/V share one, gate/up share one). A serial `x` is
    /// quantized by a serial node even inside parallel subgraphs, once for every shard.
    fn quantized_for(&mut self, x: TensorId, wt: DType) -> TensorId {
        let width = self.t(x).ne[0];
        self.quantized_padded(x, wt, 0, width)
    }

    /// [`Builder::quantized_for`] with each row after `pad` zeros and zeros after it up to
    /// `width` values (a column shard cut inside a block, `Builder::matmul_cols`); one node per
    /// (x, type, pad, width).
    fn quantized_padded(&mut self, x: TensorId, wt: DType, pad: usize, width: usize) -> TensorId {
        let vdt = self.kernels.ops(wt).map(|o| o.vec_dot_type).unwrap_or(DType::F32);
        let [ne0, rows] = self.t(x).ne;
        if vdt == DType::F32 {
            assert!(pad == 0 && width == ne0, "padded f32 activations: a block size of 1 is never cut inside");
            return x;
        }
        assert!(pad + ne0 <= width, "{ne0} values after {pad} zeros in rows of {width}");
        let key = (x, vdt, pad as u32, width);
        if let Some(&q) = self.quantized.get(&key) {
            return q;
        }
        let xg = self.t(x).group;
        let group = std::mem::replace(&mut self.group, xg);
        let q = self.node([width, rows], vdt, Op::Quantize { x, pad: pad as u32 }).single();
        self.group = group;
        self.quantized.insert(key, q);
        q
    }

    /// Checks shapes and quantizes `x` for `w`: the op and result shape of `x · wᵀ`.
    fn matmul_op(&mut self, w: TensorId, x: TensorId) -> (Op, [usize; 2]) {
        self.check_src(x);
        let (nw, nx) = (self.t(w).ne, self.t(x).ne);
        assert_eq!(nw[0], nx[0], "matmul inner dimensions");
        let xq = self.quantized_for(x, self.t(w).dtype);
        (Op::MatMul { w, x: xq }, [nw[1], nx[1]])
    }

    /// `[rows, w.ne1]` = x · wᵀ.
    pub fn matmul(&mut self, w: &Bundle, x: &Bundle) -> Bundle {
        self.zip(&[w, x], |b, t| {
            let (op, ne) = b.matmul_op(t[0], t[1]);
            b.node(ne, DType::F32, op).single()
        })
    }

    /// Like [`Builder::matmul`] but the result goes to the output pool (logits), `[rows,
    /// w.ne1]`, and the graph leaves parallel mode. With `w` cut by [`Split::Vocab`] (tensor
    /// parallelism, after a scatter) each shard writes its vocabulary columns of the one logits
    /// tensor, which needs no reduction; the result is then that whole tensor (no node).
    pub fn matmul_output(&mut self, w: &Bundle, x: &Bundle) -> Bundle {
        let offset = self.out_bump;
        let n_vocab: usize = w.0.iter().map(|&p| self.t(p).ne[1]).sum();
        let rows = self.t(x.single()).ne[1];
        let mut col = 0;
        let parts = self.zip(&[w, x], |b, t| {
            let (op, ne) = b.matmul_op(t[0], t[1]);
            let id = b.push(ne, DType::F32, op, Storage::Output { offset: offset + 4 * col, ld: n_vocab });
            col += ne[0];
            id
        });
        self.out_bump += n_vocab * rows * 4;
        self.mode = Mode::Serial;
        if parts.0.len() == 1 {
            return parts;
        }
        Bundle::one(self.leaf([n_vocab, rows], DType::F32, Storage::Output { offset, ld: n_vocab }))
    }

    pub fn rope(&mut self, x: &Bundle, p: RopeParams) -> Bundle {
        self.rope_ext(x, p, None)
    }

    /// RoPE with per-frequency divisors (`freqs`: an F32 weight of `n_rot / 2`). A shard's
    /// rows hold its own heads: their count comes from the row length.
    pub fn rope_ext(&mut self, x: &Bundle, p: RopeParams, freqs: Option<&Bundle>) -> Bundle {
        assert!(p.n_rot <= p.head_dim && p.n_rot.is_multiple_of(2) && p.n_rot <= crate::sched::MAX_ROT);
        let freqs = freqs.map(|f| f.single());
        if let Some(f) = freqs {
            let t = self.t(f);
            assert!(t.dtype == DType::F32 && t.ne[0] * t.ne[1] == p.n_rot / 2, "rope freq factors");
        }
        self.zip(&[x], |b, t| {
            let x = t[0];
            b.check_src(x);
            let ne = b.t(x).ne;
            let p = if b.shard().is_some() { RopeParams { n_head: ne[0] / p.head_dim, ..p } } else { p };
            assert_eq!(ne[0], p.n_head * p.head_dim, "rope row length");
            b.node(ne, DType::F32, Op::Rope { x, p, freqs }).single()
        })
    }

    /// Route each token to its top experts: `logits` `[n_expert, n_tokens]` → routing table.
    pub fn moe_route(&mut self, logits: &Bundle, p: MoeParams) -> Bundle {
        let logits = logits.single();
        self.check_src(logits);
        let ne = self.t(logits).ne;
        assert!(ne[0] == p.n_expert && p.n_used >= 1 && p.n_used <= p.n_expert, "moe routing shape");
        let sel = self.node([2 * ne[1] * p.n_used, 1], DType::I32, Op::MoeSelect { logits, p }).single();
        let len = crate::moe::Route::len(ne[1], p);
        self.node([len, 1], DType::I32, Op::MoeRoute { sel, p })
    }

    /// The experts the current shard computes (all in serial mode).
    fn experts(&self, n_expert: usize) -> (u32, u32) {
        match self.shard() {
            Some((plan, s)) => (plan.experts[s].start as u32, plan.experts[s].end as u32),
            None => (0, n_expert as u32),
        }
    }

    /// Grouped expert matmul: `w` stacks `n_expert` matrices of `w.ne1 / n_expert` rows (a
    /// shard's: its experts' only); `x` has one row per token or (`per_pair`) per routed pair.
    /// Result `[n_out, n_tokens·n_used]`.
    pub fn matmul_id(&mut self, w: &Bundle, x: &Bundle, route: &Bundle, p: MoeParams, per_pair: bool) -> Bundle {
        self.zip(&[w, x, route], |b, t| {
            let (w, x, route) = (t[0], t[1], t[2]);
            b.check_src(x);
            let (nw, nx) = (b.t(w).ne, b.t(x).ne);
            assert_eq!(nw[0], nx[0], "matmul_id inner dimensions");
            let (e0, e1) = b.experts(p.n_expert);
            assert_eq!(nw[1] % (e1 - e0) as usize, 0, "stacked experts");
            let n_tok = b.n_tokens;
            assert_eq!(nx[1], if per_pair { n_tok * p.n_used } else { n_tok }, "matmul_id rows");
            let xq = b.quantized_for(x, b.t(w).dtype);
            let op = Op::MatMulId { w, x: xq, route, p, per_pair, e0, e1 };
            b.node([nw[1] / (e1 - e0) as usize, n_tok * p.n_used], DType::F32, op).single()
        })
    }

    /// Weighted sum of each token's expert outputs: `[ne0, n_tokens·n_used]` → `[ne0, n_tokens]`
    /// (a shard's: over its experts only, a partial sum for the gather).
    pub fn moe_combine(&mut self, y: &Bundle, route: &Bundle, p: MoeParams) -> Bundle {
        self.zip(&[y, route], |b, t| {
            let (y, route) = (t[0], t[1]);
            b.check_src(y);
            let ne = b.t(y).ne;
            assert_eq!(ne[1], b.n_tokens * p.n_used, "moe_combine rows");
            let (e0, e1) = b.experts(p.n_expert);
            b.node([ne[0], b.n_tokens], DType::F32, Op::MoeCombine { y, route, p, e0, e1 }).single()
        })
    }

    /// Each routed pair's row of `x` (`[ne0, n_tokens·n_used]`, position order) plus its
    /// expert's row of `bias` (`[ne0, n_expert]`; a shard's: its experts' rows), over the pairs
    /// of the shard's experts (ggml's `add_id`: gpt-oss's per-expert biases).
    pub fn add_expert_bias(&mut self, x: &Bundle, bias: &Bundle, route: &Bundle, p: MoeParams) -> Bundle {
        self.zip(&[x, bias, route], |b, t| {
            let (x, bias, route) = (t[0], t[1], t[2]);
            b.check_src(x);
            let (ne, nb) = (b.t(x).ne, b.t(bias).ne);
            let (e0, e1) = b.experts(p.n_expert);
            assert!(ne[1] == b.n_tokens * p.n_used && nb == [ne[0], (e1 - e0) as usize], "expert bias shape");
            b.node(ne, DType::F32, Op::AddId { x, bias, route, p, e0, e1 }).single()
        })
    }

    /// The tensor-parallel plan while inside parallel subgraphs.
    fn shard_plan(&self) -> Option<Arc<TpPlan>> {
        self.tp.clone().filter(|_| self.mode == Mode::Parallel)
    }

    /// Keep only the rows whose outputs the batch asks for: `[ne0, n_outputs]`.
    pub fn select_outputs(&mut self, x: &Bundle) -> Bundle {
        let x = x.single();
        self.check_src(x);
        let ne0 = self.t(x).ne[0];
        self.node([ne0, self.n_outputs], DType::F32, Op::SelectOutputs { x })
    }

    pub fn finish(mut self, result: &Bundle) -> Graph {
        assert_eq!(self.mode, Mode::Serial, "graph finished inside parallel subgraphs");
        // Group barriers only between two nodes of parallel subgraphs, and only in async mode.
        let group = |id: &TensorId| self.tensors[id.0 as usize].group;
        let sync = (0..self.nodes.len())
            .map(|i| {
                let next = self.nodes.get(i + 1).map(group);
                match (group(&self.nodes[i]), next) {
                    _ if self.global_after.contains(&i) => Sync::Global,
                    (Some(_), Some(Some(_))) if self.tp_sync == TpSync::Async => Sync::Group,
                    _ => Sync::Global,
                }
            })
            .collect();
        // Regions: the pools' when given (each must hold this graph's peak), else this graph's.
        let act = match self.layout.take() {
            Some(given) => {
                for (p, peaks) in self.peak.iter().enumerate() {
                    for (r, &peak) in peaks.iter().enumerate() {
                        let room = given.range(p, r).len();
                        assert!(peak <= room, "activation region {r} of buffer {p} needs {peak} bytes; the pools have {room}");
                    }
                }
                given
            }
            None => ActLayout::from_peaks(&self.peak),
        };
        for t in &mut self.tensors {
            if let Storage::Act { buf, offset } = &mut t.storage {
                *offset += act.range(*buf as usize, region(t.group)).start;
            }
        }
        Graph {
            result: result.single(),
            lists: self.lists,
            threads: vec![0; self.nodes.len()],
            splits: Vec::new(),
            expert_splits: Vec::new(),
            device_splits: Vec::new(),
            sync,
            tensors: self.tensors,
            nodes: self.nodes,
            n_tokens: self.n_tokens,
            n_outputs: self.n_outputs,
            act,
            out_bytes: self.out_bump,
            max_head_dim: self.max_head_dim,
            sparse: self.sparse,
        }
    }
}
