//! The sequential scheduler: walks the graph's node list; every worker runs its share of each
//! node (rows, output columns or (token, head) pairs), then all meet at a barrier before the
//! next node — unless the graph left that barrier out (`Sync::Elided`: the next node reads
//! nothing of the open nodes but rows its worker wrote, `Graph::elide_barriers`). Kernels come
//! from the dispatch table chosen at start-up.
//!
//! Invariant: running a graph allocates nothing; per-worker scratch is created with the
//! executor and reused.

use crate::graph::Graph;
use crate::kv::KvCache;
use crate::memory::Pools;
use crate::graph::Sync as After;
use crate::tensor::{Glu, Op, Storage, Tensor, TensorId, WeightCopy};
use crate::threads::{ThreadPool, Worker};
use corelm_kernels::attention::{self, AttnScratch};
use corelm_kernels::matmul::gemm;
use corelm_kernels::{act, norm, rope};
use corelm_kernels::{DType, Kernels};
use std::ops::Range;
use std::time::Instant;

mod attend;
mod dense;
mod device;
mod partials;
mod pointwise;
pub mod experts;
pub mod matmul;
mod profile;
mod sparse;

pub use profile::{Profile, ProfileEntry};

use matmul::{MatmulScratch, Schedules, WorkerClass, COL_BLOCK};
pub use matmul::{matmul_part, GEMM_MIN_ROWS};

pub use attend::attention_items;
pub use device::DeviceMatmul;
pub use sparse::gate_activation;

/// Largest rotary dimension supported (per-thread stack cache).
pub const MAX_ROT: usize = 1024;

/// The contents of one batch, read by nodes at run time.
#[derive(Clone, Copy)]
pub struct BatchView<'a> {
    pub tokens: &'a [u32],
    pub pos: &'a [i32],
    pub seq: &'a [i32],
    /// KV cell each token writes.
    pub slots: &'a [u32],
    /// Batch rows whose outputs are wanted, in output order.
    pub out_rows: &'a [u32],
}

/// Per-worker scratch, allocated once.
pub struct Scratch {
    attn: AttnScratch,
    mm: MatmulScratch,
    /// One column block of F16 weight rows, and one chunk of F16 activation rows, widened to
    /// f32 (`BatchDot::wide`).
    wide: Vec<f32>,
    wide_act: Vec<f32>,
    /// Cosines and sines of this worker's rows, shared by the pass's RoPE nodes.
    rope: crate::rope::RopeTables,
    /// Buffers of the sparse feed-forward's nodes.
    sparse: sparse::SparseScratch,
    /// Worker 0: the device's columns of a split matmul (`device.rs`; sized by
    /// `Executor::set_device`).
    device_y: Vec<f32>,
    /// A decode node's row plans (`Ctx::decode_dealt`), room for an attention node's rows.
    plans: Vec<attend::RowPlan>,
}

/// Sees nodes' results as a graph runs (statistics such as `corelm sparsity collect`'s):
/// called after each node's barrier on worker 0 — for a tensor-parallel shard's node, on its
/// group's first worker, so shards' calls may overlap — with a reader of any f32 tensor of the
/// current or previous layer that the node's worker group has waited for (their buffers are
/// not reused before the next barrier).
pub trait Tap: Send + Sync {
    fn node<'a>(&self, graph: &Graph, id: TensorId, read: &dyn Fn(TensorId) -> &'a [f32]);
}

/// An accelerator running the model's first layers whole (`Op::DeviceLayers`, the engine's
/// `--accel-layers`), with their KV cache on the device. Called on worker 0 with the layers'
/// input `x` `[n_tokens, n_embd]`, which it replaces by their output, and the pass's batch and
/// the CPU's cache (whose block tables say where each token's rows go and which it attends
/// over). A device lost mid-run cannot hand these layers back (their cache lives there): the
/// call panics with what happened, which fails the pass.
pub trait DeviceLayers: Send + Sync {
    fn forward(&self, x: &mut [f32], batch: &BatchView, kv: &KvCache);
}

/// What one layer run whole on an accelerator needs besides its weights (a model's
/// `device_layer` says it; the accelerator's layers compute with it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceLayerSpec {
    pub rope_base: f32,
    pub freq_scale: f32,
    /// NeoX pairing (Qwen2, Gemma 3) instead of adjacent pairs (LLaMA).
    pub neox: bool,
    /// Its sliding window of positions, if it has one (Gemma 3's local layers).
    pub window: Option<u32>,
    /// GELU (tanh) gating instead of SiLU.
    pub gelu: bool,
    /// Multiplies q · k.
    pub scale: f32,
}

/// A second device that computes part of some layers' feed-forwards (`Op::OffloadBegin`,
/// `Op::OffloadEnd`; KAIROX's hot neurons on an accelerator). Called on worker 0: `begin` with
/// the FFN input `[n_tokens, n_embd]`, the gated activation's kind and the firing threshold
/// (`|act(gate)| > thr`; negative: every neuron fires) must start the work and return; `finish`
/// waits for it and writes the layer's partial output `[n_tokens, n_embd]`. The CPU nodes in
/// between overlap it.
///
/// Online balancing (the device's neurons change as the run goes): `resident` gives the
/// neurons of a layer the device computes now, which the CPU's `masked` sparse nodes skip, and
/// `observe` receives the layer's gate product of every neuron after `finish`. The set may
/// change only inside `begin`, `finish` or `observe` (worker 0, between barriers), so every
/// worker of a pass sees the same set, the one the device computed.
pub trait Offload: Send + Sync {
    fn begin(&self, layer: usize, x: &[f32], kind: Glu, thr: f32);
    fn finish(&self, layer: usize, y: &mut [f32]);
    /// Bit `n % 64` of word `n / 64`: neuron `n` of `layer` is on the device now.
    fn resident(&self, _layer: usize) -> Option<&[std::sync::atomic::AtomicU64]> {
        None
    }
    /// The CPU's gate product of every neuron of layer `layer` for `n_tokens` tokens, in
    /// pieces of consecutive neurons: `piece(i)` is the `i`-th, `[n_tokens, n_i]` (tensor
    /// parallel: shard `i`'s range; else one piece of all), `None` past the last.
    fn observe<'a>(&self, _layer: usize, _n_tokens: usize, _piece: &dyn Fn(usize) -> Option<&'a [f32]>) {}
}

/// Panels per column block the workers' GEMM scratch holds before any plan: the default
/// schedule's (two), or AMX's ([`Schedule::AMX_DEFAULT`](corelm_kernels::matmul::schedule::Schedule::AMX_DEFAULT))
/// on a CPU that runs the AMX table.
fn default_panels() -> usize {
    use corelm_kernels::matmul::schedule::Schedule;
    if corelm_kernels::Isa::Amx.missing().is_empty() {
        Schedule::AMX_DEFAULT.nc / gemm::PANEL
    } else {
        Schedule::PANEL_DEFAULT.nc / gemm::PANEL
    }
}

/// Runs graphs on a thread pool.
pub struct Executor {
    scratch: Vec<std::sync::Mutex<Scratch>>,
    /// When set, every F32 node's result is written to `<dir>/<node>_<op>_L<layer>_<ne0>.bin`
    /// (raw little-endian f32) after it runs — for comparing against another engine's tensors.
    /// Debugging only: it allocates and writes files on the hot path.
    pub dump_dir: Option<std::path::PathBuf>,
    /// Compute every row as if it were alone: single-row dot order in matmuls and the
    /// reference attention kernel whatever the batch size, so a token's results do not depend
    /// on what else shares its batch (serving). Off, kernels follow llama.cpp's choice by batch
    /// size (bit-identical to it).
    pub batch_invariant: bool,
    /// Use the panel GEMM for batches of at least [`GEMM_MIN_ROWS`] rows (`matmul::gemm_min_rows`: fewer for some types), the types it supports.
    /// Off, every matmul uses ggml's per-row dot order (bit-identical to llama.cpp).
    pub panel_gemm: bool,
    /// Statistics taken as nodes run (off the hot path: worker 0 runs it between barriers).
    pub tap: Option<std::sync::Arc<dyn Tap>>,
    /// The device of graphs with `Op::OffloadBegin`/`OffloadEnd` nodes.
    pub offload: Option<std::sync::Arc<dyn Offload>>,
    /// The device of graphs with an `Op::DeviceLayers` node.
    pub device_layers: Option<std::sync::Arc<dyn DeviceLayers>>,
    /// The accelerator of graphs with `Graph::device_splits` ([`Executor::set_device`]).
    device: Option<std::sync::Arc<dyn DeviceMatmul>>,
    /// Tuned matmul schedules (`corelm tune`; set with [`Executor::set_schedules`]).
    schedules: Option<std::sync::Arc<Schedules>>,
    /// The largest panel GEMM's (inner dimension, rows), the scratch it needs.
    gemm_dims: (usize, usize),
    /// Worker classes of matmuls a plan split (`Graph::splits`; [`Executor::set_classes`]).
    classes: Vec<WorkerClass>,
    /// Prefill attention over keys in columns as a pipeline, one per worker group
    /// ([`Executor::set_attn_pipeline`]; empty: none).
    pipelines: Vec<attention::matrix::Pipeline>,
    /// Split-KV decode's partials, shared by an attention node's workers.
    split_parts: partials::SplitParts,
}

impl Executor {
    /// Scratch for attention rows of `max_head_dim` and panel GEMMs of the largest (inner
    /// dimension, rows) among `graphs`' matmuls (the largest batch's, and any other that has
    /// nodes it lacks), for `n_threads` workers of which the smallest group (tensor
    /// parallelism; else all) has `group_threads`.
    pub fn new(n_threads: usize, group_threads: usize, max_head_dim: usize, graphs: &[&Graph]) -> Self {
        let (mut max_k, mut max_rows, mut max_group, mut max_k_all, mut gather) = (0, 0, 1, 0, 0);
        let (mut rope_rows, mut max_rot, mut max_k_f16, mut max_heads, mut attn_rows) = (0, 0, 0, 0, 0);
        let (mut sparse_ff, mut il_k, mut pred_rank) = (0, 0, 0);
        for (graph, id) in graphs.iter().flat_map(|g| g.nodes.iter().map(move |&id| (*g, id))) {
            let t = graph.tensor(id);
            match t.op {
                Op::SparseUp { w, .. } => {
                    sparse_ff = sparse_ff.max(t.ne[0]);
                    il_k = il_k.max(graph.tensor(w).ne[0]);
                }
                Op::GluMasked { .. } => sparse_ff = sparse_ff.max(t.ne[0]),
                Op::Predict { layer, x, .. } => {
                    il_k = il_k.max(graph.tensor(x).ne[0]);
                    let p = graph.sparse.as_ref().and_then(|s| s.predictor.as_ref()).and_then(|p| p.layers[layer as usize].as_ref());
                    pred_rank = pred_rank.max(p.expect("a Predict node's layer has a predictor").rank);
                }
                // The up projection's input is as wide as the down projection's output (a
                // large batch's graph, the one planned, has no `SparseUp`).
                Op::SparseDown { w, .. } => {
                    sparse_ff = sparse_ff.max(graph.tensor(w).ne[1]);
                    il_k = il_k.max(t.ne[0]);
                }
                _ => {}
            }
            if let Op::Rope { p, .. } = t.op {
                rope_rows = rope_rows.max(t.ne[1]);
                max_rot = max_rot.max(p.n_rot);
            }
            if let Op::Attention { shard, p, .. } = t.op {
                attn_rows = attn_rows.max(t.ne[1]);
                max_group = max_group.max(shard.group);
                max_heads = max_heads.max(shard.q_head0 + p.n_head);
            }
            if let Op::MatMulId { w, x, p, per_pair, .. } = t.op {
                let (wt, xt) = (graph.tensor(w), graph.tensor(x));
                max_k_all = max_k_all.max(wt.ne[0]);
                // An expert's panel GEMM: at most one row per token (a token picks an expert
                // once), per-token rows gathered in order.
                if gemm::supported(wt.dtype) {
                    let tokens = t.ne[1] / p.n_used;
                    max_k = max_k.max(wt.ne[0]);
                    max_rows = max_rows.max(tokens);
                    if !per_pair {
                        gather = gather.max(tokens * xt.row_bytes());
                    }
                }
            }
            if let Op::MatMul { w, .. } = t.op {
                let wt = graph.tensor(w);
                max_k_all = max_k_all.max(wt.ne[0]);
                if wt.dtype == DType::F16 {
                    max_k_f16 = max_k_f16.max(wt.ne[0]);
                }
                if gemm::supported(wt.dtype) {
                    max_k = max_k.max(wt.ne[0]);
                    max_rows = max_rows.max(t.ne[1]);
                }
            }
        }
        Executor {
            scratch: (0..n_threads)
                .map(|_| {
                    std::sync::Mutex::new(Scratch {
                        attn: AttnScratch::with_heads(max_head_dim, max_group),
                        mm: MatmulScratch::new(max_k_all, max_k, max_rows, default_panels()).with_gather(gather),
                        wide: vec![0.0; COL_BLOCK * max_k_f16],
                        wide_act: vec![0.0; dense::ACT_CHUNK * max_k_f16],
                        // A worker's largest share of RoPE rows: in the smallest group.
                        rope: crate::rope::RopeTables::new(split(rope_rows, 0, group_threads.clamp(1, n_threads)).len(), max_rot),
                        sparse: sparse::SparseScratch::new(sparse_ff, il_k, pred_rank),
                        device_y: Vec::new(),
                        plans: Vec::with_capacity(attn_rows),
                    })
                })
                .collect(),
            dump_dir: None,
            batch_invariant: false,
            panel_gemm: false,
            tap: None,
            offload: None,
            device_layers: None,
            device: None,
            schedules: None,
            gemm_dims: (max_k, max_rows),
            classes: Vec::new(),
            pipelines: Vec::new(),
            split_parts: partials::SplitParts::new(attend::SPLIT_ROWS, max_heads, n_threads, max_head_dim),
        }
    }

    /// Run the split matmuls of a graph (`Graph::splits`) on these worker classes, consecutive
    /// workers from worker 0 (of the pool, or of a group for a shard's nodes); a split applies
    /// only where the node runs on as many workers as the classes hold. Refused unless every
    /// class's kernel level runs on this CPU and has workers.
    pub fn set_classes(&mut self, classes: Vec<WorkerClass>) -> Result<(), String> {
        for c in &classes {
            let missing = c.isa.missing();
            if !missing.is_empty() || c.workers == 0 {
                return Err(format!("worker class {} × {}: this CPU lacks {}", c.workers, c.isa.name(), missing.join(", ")));
            }
        }
        self.classes = classes;
        Ok(())
    }

    /// Run the attention of prefills over keys stored in columns (a graph's serial attention
    /// nodes of one sequence, the tiled kernel's batches, rows of `head_dim`) as a pipeline
    /// whose scores, softmax and values of different tiles run on different workers at once
    /// (`attention::matrix::attend_pipelined`; same bits as the fused kernels), with slots for
    /// `2·workers + 1` items in flight, allocated here, once. With tensor parallelism each
    /// worker group (`groups`: their sizes; one entry without) has a pipeline of its own, which
    /// its shard's attention nodes run on while the other groups run theirs. Workers of a
    /// matrix-unit class ([`Executor::set_classes`]) take the matrix phases first.
    pub fn set_attn_pipeline(&mut self, head_dim: usize, groups: &[usize]) {
        self.pipelines = groups.iter().map(|&n| attention::matrix::Pipeline::new(head_dim, 2 * n + 1)).collect();
    }

    /// Key blocks the attention pipeline scored since it was set (what the masks left).
    pub fn pipeline_blocks(&self) -> Option<u64> {
        (!self.pipelines.is_empty()).then(|| self.pipelines.iter().map(|p| p.blocks_scored()).sum())
    }

    /// Run the matmuls graphs share with an accelerator (`Graph::device_splits`) on `device`,
    /// whose products hold at most `max_values` floats (tokens × columns); worker 0's buffer
    /// for them is allocated here, once.
    pub fn set_device(&mut self, device: std::sync::Arc<dyn DeviceMatmul>, max_values: usize) {
        if let Some(s) = self.scratch.first_mut() {
            s.get_mut().unwrap_or_else(|e| e.into_inner()).device_y = vec![0.0; max_values];
        }
        self.device = Some(device);
    }

    /// Run matmuls with `schedules` where they have one for the matrix and length; each
    /// worker's panel scratch grows to the widest column block they use (allocated here, once).
    pub fn set_schedules(&mut self, schedules: Option<std::sync::Arc<Schedules>>) {
        let panels = schedules.as_ref().map_or(default_panels(), |s| s.max_panels());
        let (k, rows) = self.gemm_dims;
        for s in &mut self.scratch {
            let s = s.get_mut().unwrap_or_else(|e| e.into_inner());
            if s.mm.gemm.panels(k.max(32)) < panels {
                s.mm.gemm = gemm::GemmScratch::new(k, rows, panels);
            }
        }
        self.schedules = schedules;
    }

    /// Run `graph` to completion over `weights` on view `view` of `pool` (0: every worker;
    /// a view has as many groups as the graph has shards). Results do not depend on the view, but
    /// for single-row attention over 512+ cells, split by the view's thread count (`kv_split`).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        pool: &ThreadPool,
        view: usize,
        graph: &Graph,
        weights: Weights,
        pools: &Pools,
        kv: &KvCache,
        batch: BatchView,
        kernels: &Kernels,
        profile: Option<&mut Profile>,
    ) {
        assert!(graph.act == pools.layout, "a graph planned for other activation regions than the pools'");
        assert!(pools.act[0].len() >= graph.act.bytes(0) && pools.act[1].len() >= graph.act.bytes(1));
        assert!(pools.out.len() >= graph.out_bytes);
        assert!(batch.tokens.len() == graph.n_tokens && batch.out_rows.len() == graph.n_outputs);
        assert!(self.scratch.len() >= pool.n_threads());
        let ctx = Ctx {
            graph,
            weights,
            act: [pools.act[0].as_ptr(), pools.act[1].as_ptr()],
            out: pools.out.as_ptr(),
            kv,
            batch,
            kernels,
            mode: matmul::Mode { batch_invariant: self.batch_invariant, panel_gemm: self.panel_gemm },
            schedules: self.schedules.as_deref(),
            offload: self.offload.as_deref(),
            device_layers: self.device_layers.as_deref(),
            device: self.device.as_deref(),
            classes: &self.classes,
            pipelines: &self.pipelines,
            split_parts: &self.split_parts,
        };
        self.split_parts.reset();
        // With a profile, each worker times its waits in global barriers.
        let timing = profile.is_some();
        let n_groups = pool.view_groups(view).len();
        let waits = profile::BarrierWaits::new(if timing { n_groups } else { 0 }, graph.nodes.len());
        let prof = std::sync::Mutex::new(profile);
        // With several groups, each group's first worker also times its own shard's nodes.
        let busy: Vec<std::sync::Mutex<Profile>> =
            if timing && n_groups > 1 { (0..n_groups).map(|_| Default::default()).collect() } else { Vec::new() };
        // A dump or a tap reads each node whole after it: no barrier is left out then.
        let observing = self.dump_dir.is_some() || self.tap.is_some();
        pool.run_view(view, &|w: &Worker| {
            let mut scratch = self.scratch[w.ith].lock().unwrap_or_else(|e| e.into_inner());
            let mut prof = if w.ith == 0 { prof.lock().ok() } else { None };
            let profiling = prof.as_ref().is_some_and(|g| g.is_some());
            let mut busy = if w.group_ith == 0 { busy.get(w.group).and_then(|b| b.lock().ok()) } else { None };
            for (node, ((&id, &sync), &cap)) in graph.nodes.iter().zip(&graph.sync).zip(&graph.threads).enumerate() {
                let t0 = profiling.then(Instant::now);
                let t_busy = busy.is_some().then(Instant::now);
                // A parallel subgraph's node runs on its group only, split among the group's
                // workers; a serial node on every worker; either capped at `cap` workers.
                let (mine, ith, nth) = match graph.tensor(id).group {
                    Some(g) => (g as usize == w.group, w.group_ith, w.group_nth),
                    None => (true, w.ith, w.nth),
                };
                let nth_cap = if cap == 0 { nth } else { nth.min(cap as usize) };
                if mine && ith < nth_cap {
                    ctx.exec(id, ith, nth_cap, &mut scratch);
                }
                let sync = if sync == After::Elided && observing { After::Global } else { sync };
                if sync == After::Group && mine {
                    w.barrier();
                }
                // A shard's node, timed by its group's first worker without the global wait.
                if let (Some(t), Some(b), true) = (t_busy, busy.as_deref_mut(), mine && graph.tensor(id).group.is_some()) {
                    b.add(graph.tensor(id).op.name(), profile::weight_of(graph, id).0, t.elapsed().as_secs_f64(), 0);
                }
                match sync {
                    After::Group | After::Elided => {}
                    After::Global if timing => waits.time(w.group, node, || w.global_barrier()),
                    After::Global => w.global_barrier(),
                }
                // Seen by the first worker that waited for the node: a shard's node by its
                // group's first worker (async groups do not wait for each other), a serial
                // node by the pool's.
                let first = if graph.tensor(id).group.is_some() { mine && ith == 0 } else { w.ith == 0 };
                if let (true, Some(dir)) = (first, &self.dump_dir) {
                    ctx.dump(id, dir);
                }
                if let (true, Some(tap)) = (first, &self.tap) {
                    tap.node(graph, id, &|t| ctx.f32s(t));
                }
                if let (Some(t0), Some(Some(p))) = (t0, prof.as_deref_mut()) {
                    let (weight, bytes) = profile::weight_of(graph, id);
                    p.add(graph.tensor(id).op.name(), weight, t0.elapsed().as_secs_f64(), bytes);
                }
            }
        });
        if let Some(p) = prof.into_inner().unwrap_or_else(|e| e.into_inner()) {
            p.add_waits(&waits.per_worker(pool.view_groups(view)));
            p.add_node_waits(graph, &waits.per_node(pool.view_groups(view).iter().map(|r| r.len()).sum()));
            for (g, b) in busy.iter().enumerate() {
                p.add_group(g, n_groups, &b.lock().unwrap_or_else(|e| e.into_inner()));
            }
        }
    }
}

/// Contiguous share `ith` of `n` items split `nth` ways.
pub fn split(n: usize, ith: usize, nth: usize) -> Range<usize> {
    let per = n.div_ceil(nth);
    let start = (ith * per).min(n);
    start..(start + per).min(n)
}

/// The bytes weights live in: the model file, and the interleaved copies of the matrices
/// repacked at load (`crate::packed`; empty when none are).
#[derive(Clone, Copy)]
pub struct Weights<'a> {
    pub file: &'a [u8],
    pub packed: &'a [u8],
    /// LoRA adapters' matrices (`Storage::Adapter`); empty without adapters.
    pub adapters: &'a [u8],
}

struct Ctx<'a> {
    graph: &'a Graph,
    weights: Weights<'a>,
    act: [*mut u8; 2],
    out: *mut u8,
    kv: &'a KvCache,
    batch: BatchView<'a>,
    kernels: &'a Kernels,
    mode: matmul::Mode,
    schedules: Option<&'a Schedules>,
    offload: Option<&'a dyn Offload>,
    device_layers: Option<&'a dyn DeviceLayers>,
    device: Option<&'a dyn DeviceMatmul>,
    classes: &'a [WorkerClass],
    /// Prefill attention's pipelines, one per worker group ([`Executor::set_attn_pipeline`]).
    pipelines: &'a [attention::matrix::Pipeline],
    split_parts: &'a partials::SplitParts,
}

// SAFETY: the raw pointers address the pools, which outlive the run; workers write disjoint
// ranges within a node and are separated by barriers between nodes.
unsafe impl Sync for Ctx<'_> {}

impl Ctx<'_> {
    fn t(&self, id: TensorId) -> &Tensor {
        self.graph.tensor(id)
    }

    /// Elements between a result tensor's rows: `ne0`, or the whole vocabulary for a
    /// tensor-parallel shard's columns of the logits.
    fn row_stride(&self, t: &Tensor) -> usize {
        match t.storage {
            Storage::Output { ld, .. } => ld,
            _ => t.ne[0],
        }
    }

    /// Base pointer of a tensor's bytes (a weight's plain rows: its copy made at load, if it
    /// has a plain one, else the file).
    fn base(&self, t: &Tensor) -> *mut u8 {
        match t.storage {
            Storage::Weight { copy: Some(WeightCopy { at, interleaved: false }), .. } => self.weights.packed[at..].as_ptr() as *mut u8,
            Storage::Weight { offset, cols, .. } => {
                assert!(cols.is_none(), "a column slice of a weight without its copy");
                self.weights.file[offset..].as_ptr() as *mut u8
            }
            Storage::Adapter { offset, .. } => self.weights.adapters[offset..].as_ptr() as *mut u8,
            // SAFETY: offsets were planned within the pool sizes asserted in `run`.
            Storage::Act { buf, offset } => unsafe { self.act[buf as usize].add(offset) },
            // SAFETY: as above, for the output pool.
            Storage::Output { offset, .. } => unsafe { self.out.add(offset) },
            Storage::None => std::ptr::null_mut(),
        }
    }

    /// All bytes of a source tensor (read-only while the node runs).
    fn bytes(&self, id: TensorId) -> &[u8] {
        let t = self.t(id);
        match t.storage {
            Storage::Weight { copy: Some(WeightCopy { at, interleaved: false }), .. } => {
                return &self.weights.packed[at..at + t.n_bytes()];
            }
            Storage::Weight { offset, len, cols: None, .. } => return &self.weights.file[offset..offset + len],
            Storage::Adapter { offset, len } => return &self.weights.adapters[offset..offset + len],
            _ => {}
        }
        // SAFETY: the tensor's planned range lies in its pool; no worker writes it during the
        // nodes that read it (it was produced by an earlier node, before a barrier).
        unsafe { std::slice::from_raw_parts(self.base(t), t.n_bytes()) }
    }

    fn f32s(&self, id: TensorId) -> &[f32] {
        let b = self.bytes(id);
        // SAFETY: activation tensors are f32, 64-byte aligned, whole rows.
        unsafe { std::slice::from_raw_parts(b.as_ptr() as *const f32, b.len() / 4) }
    }

    fn i32s(&self, id: TensorId) -> &[i32] {
        let b = self.bytes(id);
        // SAFETY: I32 tensors are 64-byte aligned whole rows.
        unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i32, b.len() / 4) }
    }

    /// Mutable f32 elements `[start, start+len)` of the node's own tensor.
    ///
    /// # Safety
    /// Callers in different workers must pass disjoint ranges.
    #[allow(clippy::mut_from_ref)]
    unsafe fn out_f32(&self, t: &Tensor, start: usize, len: usize) -> &mut [f32] {
        debug_assert!(start + len <= t.ne[0] * t.ne[1]);
        // SAFETY: within the tensor (asserted); disjointness is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut((self.base(t) as *mut f32).add(start), len) }
    }

    fn dump(&self, id: TensorId, dir: &std::path::Path) {
        let t = self.t(id);
        if t.dtype != corelm_kernels::DType::F32 || t.ne[1] == 0 {
            return;
        }
        let bytes: Vec<u8> = self.f32s(id).iter().flat_map(|v| v.to_le_bytes()).collect();
        let name = format!("{:05}_{}_L{}_{}.bin", id.0, t.op.name(), t.layer, t.ne[0]);
        if let Err(e) = std::fs::write(dir.join(&name), bytes) {
            eprintln!("corelm: cannot dump {name}: {e}");
        }
    }

    fn exec(&self, id: TensorId, ith: usize, nth: usize, scratch: &mut Scratch) {
        let t = self.t(id);
        let [ne0, rows] = t.ne;
        match t.op {
            Op::Leaf => {}
            Op::Embed { table } => {
                let tt = self.t(table);
                let rb = tt.row_bytes();
                let to_float = self.kernels.to_float(tt.dtype).expect("embedding type checked at load");
                let data = self.bytes(table);
                for r in split(rows, ith, nth) {
                    let tok = self.batch.tokens[r] as usize;
                    // SAFETY: row r belongs to this worker only.
                    let y = unsafe { self.out_f32(t, r * ne0, ne0) };
                    to_float(&data[tok * rb..(tok + 1) * rb], y);
                }
            }
            Op::RmsNorm { x, w: wt, eps } => {
                let (x, g) = (self.f32s(x), self.f32s(wt));
                let rs = split(rows, ith, nth);
                // SAFETY: rows `rs` belong to this worker only.
                let y = unsafe { self.out_f32(t, rs.start * ne0, rs.len() * ne0) };
                norm::rms_norm_groups(self.kernels, &x[rs.start * ne0..rs.end * ne0], g, eps, y);
            }
            Op::Add { .. } | Op::AddScaled { .. } | Op::Scale { .. } | Op::TempScale { .. } | Op::Softcap { .. } | Op::SigmoidMul { .. } => self.pointwise(t, ith, nth),
            Op::Quantize { x, pad } => {
                // Rows of `w` values, after `pad` zeros where they are padded (`ne0 > w`).
                let w = self.t(x).ne[0];
                let x = self.f32s(x);
                let q = self.kernels.from_float(t.dtype).expect("activation type has a quantizer");
                let rb = t.row_bytes();
                for r in split(rows, ith, nth) {
                    // SAFETY: row r's bytes belong to this worker only.
                    let y = unsafe { std::slice::from_raw_parts_mut(self.base(t).add(r * rb), rb) };
                    if w == ne0 {
                        q(&x[r * w..(r + 1) * w], y);
                    } else {
                        crate::graph::quantize_padded(q, &x[r * w..(r + 1) * w], pad as usize, t.dtype, y);
                    }
                }
            }
            Op::MatMul { w: wid, x } => self.matmul(id, wid, x, ith, nth, scratch),
            Op::Rope { x, p, freqs } => {
                let x = self.f32s(x);
                let freqs = freqs.map(|f| self.f32s(f));
                let rs = split(rows, ith, nth);
                let table = scratch.rope.get(&self.batch.pos[rs.clone()], &p, freqs);
                for (r, cache) in rs.zip(table.chunks_exact(p.n_rot)) {
                    // SAFETY: row r belongs to this worker only.
                    let y = unsafe { self.out_f32(t, r * ne0, ne0) };
                    y.copy_from_slice(&x[r * ne0..(r + 1) * ne0]);
                    for h in y.chunks_exact_mut(p.head_dim) {
                        rope::rope_apply(self.kernels, h, cache, p.n_rot, p.neox);
                    }
                }
            }
            Op::KvStore { layer, k, v, c0, width, kv_base, keys } => {
                assert_eq!(keys, self.kv.k_layout, "a graph planned for another key layout than its cache's");
                self.kv_store(layer as usize, [k, v], c0 as usize..(c0 + width) as usize, kv_base as usize, ith, nth)
            }
            Op::Attention { layer, q, p, shard, sinks } => self.attention(t, layer as usize, q, p, shard, sinks, attend::AttnWorker { ith, nth, scratch: &mut scratch.attn, plans: &mut scratch.plans }),
            Op::Glu { gate, up, kind } => {
                let (g, u) = (self.f32s(gate), self.f32s(up));
                for r in split(rows, ith, nth) {
                    // SAFETY: row r belongs to this worker only.
                    let y = unsafe { self.out_f32(t, r * ne0, ne0) };
                    let (gr, ur) = (&g[r * ne0..(r + 1) * ne0], &u[r * ne0..(r + 1) * ne0]);
                    match kind {
                        Glu::Silu => act::swiglu(self.kernels, gr, ur, y),
                        Glu::GeluTanh => act::geglu(self.kernels, gr, ur, y),
                        Glu::SwigluOai => act::swiglu_oai(gr, ur, y),
                    }
                }
            }
            Op::SparseUp { gate, w, x, kind, thr, masked } => {
                let mask = self.mask(t, masked);
                self.sparse_up(t, [gate, w, x], kind, thr, mask, ith, nth, &mut scratch.sparse)
            }
            Op::GluMasked { gate, up, kind, thr, masked, pred } => self.glu_masked(t, [gate, up], pred, kind, thr, self.mask(t, masked), ith, nth, &mut scratch.sparse),
            Op::Predict { layer, x, n0 } => self.predict(t, layer, x, n0 as usize, ith, nth, &mut scratch.sparse),
            Op::SparseGate { pred, w, x } => self.sparse_gate(t, [pred, w, x], ith, nth, &mut scratch.sparse),
            Op::SparseDown { h, w } => self.sparse_down(t, h, w, ith, nth, &mut scratch.sparse),
            Op::OffloadBegin { layer, x, kind, thr } => {
                if ith == 0 {
                    self.offload.expect("a graph with offloaded layers runs with an Offload").begin(layer as usize, self.f32s(x), kind, thr);
                }
            }
            Op::OffloadEnd { layer, gates, .. } => {
                if ith == 0 {
                    // SAFETY: only worker 0 writes this node's tensor.
                    let y = unsafe { self.out_f32(t, 0, ne0 * rows) };
                    let device = self.offload.expect("a graph with offloaded layers runs with an Offload");
                    device.finish(layer as usize, y);
                    if let Some(list) = gates {
                        let list = &self.graph.lists[list as usize];
                        device.observe(layer as usize, rows, &|i| list.get(i).map(|&g| self.f32s(g)));
                    }
                }
            }
            Op::DeviceLayers { x } => {
                if ith == 0 {
                    // SAFETY: only worker 0 writes this node's tensor.
                    let y = unsafe { self.out_f32(t, 0, ne0 * rows) };
                    y.copy_from_slice(&self.f32s(x)[..ne0 * rows]);
                    self.device_layers.expect("a graph with device layers runs with a DeviceLayers").forward(y, &self.batch, self.kv);
                }
            }
            Op::MoeSelect { .. } | Op::MoeRoute { .. } | Op::MatMulId { .. } | Op::MoeCombine { .. } | Op::AddId { .. } => self.moe(id, t, ith, nth, &mut scratch.mm),
            Op::SelectOutputs { x } => {
                let x = self.f32s(x);
                for i in split(rows, ith, nth) {
                    let r = self.batch.out_rows[i] as usize;
                    // SAFETY: output row i belongs to this worker only.
                    let y = unsafe { self.out_f32(t, i * ne0, ne0) };
                    y.copy_from_slice(&x[r * ne0..(r + 1) * ne0]);
                }
            }
            Op::GatherSum { list } => {
                // Each worker adds its range of elements over every shard's partial, in shard
                // order: every partial is read once, by one worker per element.
                let parts = &self.graph.lists[list as usize];
                let r = split(ne0 * rows, ith, nth);
                // SAFETY: this worker's elements only.
                let o = unsafe { self.out_f32(t, r.start, r.len()) };
                o.copy_from_slice(&self.f32s(parts[0])[r.clone()]);
                for &p in &parts[1..] {
                    for (y, &v) in o.iter_mut().zip(&self.f32s(p)[r.clone()]) {
                        *y += v;
                    }
                }
            }
        }
    }

    /// Worker `ith`'s share of a matmul node: dense types' batch dots (`dense.rs`), else
    /// `matmul::run` on the weight's bytes (its interleaved copy where it has one).
    fn matmul(&self, id: TensorId, wid: TensorId, x: TensorId, ith: usize, nth: usize, scratch: &mut Scratch) {
        let t = self.t(id);
        let wt = self.t(wid);
        let [k, n_out] = wt.ne;
        let rows = t.ne[1];
        let ops = self.kernels.ops(wt.dtype).expect("weight type checked at load");
        // The accelerator's share of this node, if it has one (`device.rs`).
        let device = self.device.zip(self.graph.device_split_of(id));
        // Dense types in a batch: llama.cpp's tinyBLAS values (`dense.rs`); a device split
        // runs its CPU columns on the other paths.
        if let Some(b) = ops.batch_dot.filter(|b| device.is_none() && !self.mode.batch_invariant && b.applies(rows, k, n_out)) {
            return self.matmul_dense(t, wid, x, b, ith, nth, scratch);
        }
        let (w, il) = self.weight_rows(wid);
        let split = self.graph.split_of(id).filter(|_| !self.classes.is_empty()).map(|c| (c, self.classes));
        let o = matmul::Operands { dtype: wt.dtype, k, n_out, w, il, x: self.bytes(x), xrb: self.t(x).row_bytes(), rows, xmap: None, out: self.base(t) as *mut f32, ldo: self.row_stride(t), split };
        if let Some((dev, ds)) = device {
            return self.matmul_device(id, &o, ds, dev, ith, nth, scratch);
        }
        // SAFETY: the output tensor is [rows][n_out] f32, written during this node only by its
        // workers, each its own share; the classes' levels run here (`set_classes`).
        unsafe { matmul::run(self.kernels, &o, self.mode, self.schedules, ith, nth, &mut scratch.mm) };
    }

    /// A weight matrix's plain rows and its interleaved copy, where it has one. The plain rows
    /// are the file's (or the copy made at load), empty for a column slice (tensor
    /// parallelism) that has only its interleaved copy.
    fn weight_rows(&self, wid: TensorId) -> (&[u8], Option<&[u8]>) {
        let wt = self.t(wid);
        let il = match wt.storage {
            Storage::Weight { copy: Some(WeightCopy { at, interleaved: true }), .. } => Some(&self.weights.packed[at..at + wt.n_bytes()]),
            _ => None,
        };
        let plain = !(il.is_some() && matches!(wt.storage, Storage::Weight { cols: Some(_), .. }));
        (if plain { self.bytes(wid) } else { &[] }, il)
    }

    /// Values `cols` of each row of `k` and `v` (whichever are given), a head at a time, into
    /// cache slots from `kv_base`.
    fn kv_store(&self, layer: usize, [k, v]: [Option<TensorId>; 2], cols: std::ops::Range<usize>, kv_base: usize, ith: usize, nth: usize) {
        let kv = self.kv;
        let (hd, cells) = (kv.head_dim, kv.n_cells);
        let ne0 = self.t(k.or(v).expect("a KV store of keys, values or both")).ne[0];
        assert!(cols.end <= ne0 && cols.len().is_multiple_of(hd) && cols.start.is_multiple_of(hd), "KV store of values {cols:?} of rows of {ne0}");
        let (k, v) = (k.map(|k| self.f32s(k)), v.map(|v| self.f32s(v)));
        assert!(kv_base + cols.len() / hd <= kv.n_kv_head, "KV slots {kv_base}.. past the cache's {}", kv.n_kv_head);
        let conv = kv.converters(self.kernels);
        // One F16, Q8_0 or Q4_0 key (keys in columns), on the stack.
        let mut key_row = [0u8; 2 * crate::kv::COLUMNS_MAX_HEAD_DIM];
        assert!(kv.k_layout == attention::KeyLayout::Rows || kv.row_bytes().0 <= key_row.len(), "head dimension {hd} past {}", crate::kv::COLUMNS_MAX_HEAD_DIM);
        for r in split(self.batch.tokens.len(), ith, nth) {
            let slot = self.batch.slots[r] as usize;
            for h in 0..cols.len() / hd {
                let row = (kv_base + h) * cells + slot;
                let src = r * ne0 + cols.start + h * hd..r * ne0 + cols.start + (h + 1) * hd;
                // SAFETY: each token has its own slot (engine invariant) and each slot's keys and
                // values one writer (`TpPlan::k_heads`), so rows written by different workers
                // are disjoint, and no node reads the cache while a store runs (barriers).
                unsafe { kv.store_row(layer, row, k.map(|k| &k[src.clone()]), v.map(|v| &v[src.clone()]), conv, &mut key_row) };
            }
        }
    }
}
