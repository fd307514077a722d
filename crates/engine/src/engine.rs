//! The engine: one loaded model, its pools, KV cache and thread pool, and the batch API.
//!
//! A [`Batch`] lists tokens, each with its sequence id, position and whether its logits are
//! wanted (like `llama_batch`). [`Engine::decode`] appends every token to its sequence in the
//! paged KV cache, plans (or reuses) the graph for the batch shape, runs it, and returns the
//! wanted logits as a view of the output pool ([`Engine::decode_hidden`]: the final norm's rows
//! instead, for embeddings; no LM head runs). [`Engine::attach_prefix`] starts a sequence on
//! cached blocks of an earlier one with the same leading tokens.
//!
//! Invariants: pools and the KV cache are sized at load and never grow; a graph is planned once
//! per batch shape (`n_tokens`, `n_outputs`, logits or hidden rows) and reused, so decoding token after token does no
//! planning and no allocation; a sequence's positions are `0..len` with no gaps.

pub use crate::batch::{Batch, Hidden, Logits, Outputs, Rows};
pub use crate::config::{default_threads, default_threads_for, parse_cache_type, parse_kv_layout, EngineConfig};
pub use crate::setup::expert_count;
use crate::setup::{build_graph, check_accel_split, finish_graph, matrix_classes, plan_places, tp_plan};
use crate::Error;
use corelm_core::kv::BLOCK;

mod seqs;
mod shift;
mod slot_file;
pub(crate) use shift::drop_shifted;
pub use shift::shift_cut;
pub use slot_file::SlotIo;
use corelm_core::memory::Place;
use corelm_core::tp::TpPlan;
use corelm_core::{BatchView, Executor, Graph, NumaMode, Placement, KvCache, PackedWeights, PoolConfig, Pools, Profile, ThreadPool, Weights};
use corelm_gguf::Gguf;
use corelm_kernels::attention::KeyLayout;
use corelm_kernels::{DType, Isa, Kernels};
use corelm_models::{Hyper, Model};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;


/// Map and parse a GGUF without loading a model (tokenizer-only uses).
pub fn open_gguf(path: impl AsRef<Path>) -> Result<Gguf, Error> {
    Ok(Gguf::open(path)?)
}

pub struct Engine {
    gguf: Arc<Gguf>,
    model: Box<dyn Model>,
    kernels: &'static Kernels,
    /// Shared with a draft model's engine ([`crate::draft`]), which runs on it too.
    pool: Arc<ThreadPool>,
    exec: Executor,
    /// Matrices repacked at load; graphs' weight tensors point into it.
    packed: PackedWeights,
    /// Worker CPUs and memory placement of the `--numa` mode.
    placement: Placement,
    /// The tensor-parallel shard plan (`None`: degree 1).
    tp: Option<Arc<TpPlan>>,
    pools: Pools,
    kv: KvCache,
    graphs: HashMap<(usize, usize, Outputs), Graph>,
    cfg: EngineConfig,
    // Reused per-call buffers (capacity n_batch / n_seq_max).
    slots: Vec<u32>,
    next_pos: Vec<usize>,
    out_rows: Vec<u32>,
    n_out: usize,
    /// The plan's decode view of the pool, and the view the last pass ran on (0: all workers).
    decode_view: Option<usize>,
    last_view: usize,
    /// The view passes run on otherwise (0; an engine on another's pool: that pool's
    /// `whole_view`), and the view of every worker as one group this pool lends such an
    /// engine (0 unless view 0 is split into shard groups).
    base_view: usize,
    whole_view: usize,
    pub profile: Option<Profile>,
    /// The accelerator's hot neurons (`--accel-mem`).
    accel: Option<Arc<corelm_accel::HotFfn>>,
    /// Their online balancing (`--accel-policy` other than static).
    online: Option<Arc<crate::balance::Online>>,
    /// The accelerator's share of split matmuls (`--accel-split`).
    device: Option<Arc<crate::device::DeviceSplits>>,
    /// The accelerator's whole layers (`--accel-layers`).
    device_layers: Option<Arc<crate::device_layers::LayersOnDevice>>,
    /// Why the plan's accelerator layers do not run with this configuration, if they do not.
    plan_note: Option<String>,
    /// LoRA adapters (`--lora`), and what the graphs apply of them at their current scales.
    adapters: Option<crate::lora::Adapters>,
    lora: Option<Arc<corelm_core::graph::Lora>>,
}

impl Engine {
    /// Map a GGUF, resolve the architecture and plan memory for `cfg`.
    pub fn load(path: impl AsRef<Path>, cfg: EngineConfig) -> Result<Engine, Error> {
        let gguf = Arc::new(Gguf::open(path)?);
        Self::from_gguf(gguf, cfg)
    }

    pub fn from_gguf(gguf: Arc<Gguf>, cfg: EngineConfig) -> Result<Engine, Error> {
        Self::from_gguf_on(gguf, cfg, None)
    }

    /// As [`Engine::from_gguf`], on `shared`'s workers where given (a draft model's engine on
    /// its target's pool: all its workers, one group).
    pub(crate) fn from_gguf_on(gguf: Arc<Gguf>, mut cfg: EngineConfig, shared: Option<(Arc<ThreadPool>, usize)>) -> Result<Engine, Error> {
        if let Some((p, _)) = shared.as_ref().filter(|(p, _)| p.n_threads() != cfg.n_threads || cfg.tp > 1 || cfg.plan.is_some()) {
            return Err(Error::Config(format!("an engine on another's {} workers runs on all of them, without --tp or a plan", p.n_threads())));
        }
        // A plan fixes the workers: its prefill configuration's cores, one group per shard.
        let plan_workers = match &cfg.plan {
            Some(p) => {
                if !cfg.pin || cfg.numa != NumaMode::Off || (!matches!(cfg.tp, 0 | 1) && cfg.tp != p.prefill.tp()) {
                    return Err(Error::Config(format!(
                        "a plan sets the worker cores and tensor-parallel degree ({}): it cannot be combined with --no-pin, --numa {} or --tp {}",
                        p.prefill.describe(), cfg.numa, cfg.tp
                    )));
                }
                let w = p.workers(&corelm_core::threads::allowed_cpus()).map_err(|e| Error::Config(e.to_string()))?;
                (cfg.n_threads, cfg.tp) = (w.cpus.len(), p.prefill.tp());
                Some(w)
            }
            None => None,
        };
        // The plan's accelerator layers, where they can run with the rest of `cfg`.
        let (from_plan, plan_note) = crate::plan::apply_accel(&mut cfg);
        let sizes = [("the context size (--ctx-size)", cfg.n_ctx), ("the batch size (--batch-size)", cfg.n_batch), ("the number of sequences (--parallel)", cfg.n_seq_max), ("the number of threads (--threads)", cfg.n_threads)];
        if let Some((what, _)) = sizes.iter().find(|(_, n)| *n == 0) {
            return Err(Error::Config(format!("{what} must be > 0, got 0")));
        }
        let kernels = match cfg.isa {
            Some(isa) => corelm_kernels::dispatch::kernels_for(isa).map_err(|e| Error::Config(e.to_string()))?,
            None => corelm_kernels::kernels(),
        };
        if !cfg.pin && cfg.numa != NumaMode::Off {
            return Err(Error::Config(format!("--numa {} places workers on cores: it cannot be combined with --no-pin", cfg.numa)));
        }
        if cfg.accel_split {
            check_accel_split(&cfg)?;
        }
        if cfg.accel_layers > 0 {
            crate::device_layers::check(&cfg)?;
        }
        let placement = corelm_core::placement::this_machine(cfg.numa).map_err(Error::Config)?;
        let model = corelm_models::load(&gguf, kernels, corelm_models::LoadOptions { n_ctx: cfg.n_ctx })?;
        // Weights resident before the first request (llama.cpp maps with MAP_POPULATE too).
        gguf.populate();
        let h = model.hyper().clone();
        // `--tp` (0: one shard per NUMA node under `--numa tp`, else none).
        let degree = match cfg.tp {
            0 if cfg.numa == NumaMode::Tp => placement.nodes.len(),
            0 => 1,
            d => d,
        };
        // Worker groups: one per shard, consecutive workers.
        let group_sizes: Vec<usize> = match &plan_workers {
            Some(w) => w.group_sizes.clone(),
            None => (0..degree).map(|s| corelm_core::tp::balanced(cfg.n_threads, s, degree).len()).collect(),
        };
        let tp = tp_plan(&gguf, model.as_ref(), &cfg, &group_sizes)?;
        // Sparsity and hot neurons skip or move neurons of dense feed-forwards.
        let n_expert = expert_count(&gguf);
        if n_expert > 0 && (cfg.sparsity.is_some() || cfg.accel.is_some()) {
            return Err(Error::Config(format!("--sparsity and --accel-mem work on dense feed-forwards; this model's are mixtures of {n_expert} experts")));
        }
        // The online policies' neuron groups per layer, and the groups they start with.
        type Groups = (Vec<Vec<u32>>, Vec<Vec<u32>>);
        let mut accel_groups: Option<Groups> = None;
        if let Some(a) = &cfg.accel {
            // The accelerator's neurons become part of the sparse configuration (a dense one,
            // every neuron firing, without --sparsity).
            let (cost, n_ff) = crate::offload::costs(&gguf, h.n_layer)?;
            let balanced = a.balance.policy != crate::balance::Policy::Static;
            let gs = if balanced { a.balance.group } else { 32 };
            if balanced && n_ff % gs != 0 {
                return Err(Error::Config(format!("--accel-policy {}: groups of {gs} neurons do not divide the FFN's {n_ff}", a.balance.policy)));
            }
            let hot = if balanced {
                let members = match &a.groups {
                    Some(g) if g.len() == h.n_layer => g.clone(),
                    Some(g) => return Err(Error::Config(format!("neuron groups for {} layers, the model has {}", g.len(), h.n_layer))),
                    None => crate::offload::neuron_groups(h.n_layer, n_ff, a.freq.as_deref()),
                };
                if members.iter().any(|m| m.len() != n_ff) {
                    return Err(Error::Config(format!("neuron groups that do not cover the FFN's {n_ff} neurons")));
                }
                let groups = crate::offload::choose_groups(&cost, n_ff, a.mem, a.freq.as_deref(), &members, gs);
                let rows: Vec<Vec<u32>> = groups
                    .iter()
                    .zip(&members)
                    .map(|(gr, m)| gr.iter().flat_map(|&g| m[g as usize * gs..][..gs].iter().copied()).collect())
                    .collect();
                accel_groups = Some((members, groups));
                rows
            } else {
                crate::offload::choose(&cost, n_ff, a.mem, a.freq.as_deref())
            };
            if hot.iter().all(Vec::is_empty) {
                let min = cost.iter().min().copied().unwrap_or(0) * gs as u64;
                return Err(Error::Config(format!("--accel-mem {}: less than one group of {gs} neurons ({min} bytes)", a.mem)));
            }
            let mut s = cfg.sparsity.as_deref().cloned().unwrap_or(corelm_core::SparseFfn::new(vec![-1.0; h.n_layer], DType::Q8_0));
            s.offloaded = hot.into_iter().map(|mut v| {
                v.sort_unstable();
                v
            }).collect();
            s.balanced = balanced;
            cfg.sparsity = Some(Arc::new(s));
        }
        if let Some(s) = &cfg.sparsity {
            if s.thresholds.len() != h.n_layer {
                return Err(Error::Config(format!("the sparsity thresholds are for {} layers, the model has {}", s.thresholds.len(), h.n_layer)));
            }
            if h.n_embd % s.down_type.block_size() != 0 || !corelm_kernels::sparse::NEURON_MAJOR_TYPES.contains(&s.down_type) {
                return Err(Error::Config(format!("the sparse down projection cannot be stored as {} for a width of {}", s.down_type, h.n_embd)));
            }
            if let Some(p) = &s.predictor {
                if (p.n_embd, p.n_ff, p.layers.len()) != (h.n_embd, h.n_ff, h.n_layer) {
                    return Err(Error::Config(format!(
                        "the predictors are for {} layers of {} inputs and {} neurons, the model has {} of {} and {}",
                        p.layers.len(),
                        p.n_embd,
                        p.n_ff,
                        h.n_layer,
                        h.n_embd,
                        h.n_ff
                    )));
                }
            }
        }
        // An accelerator's (static) neurons leave the predictors the CPU's.
        if let Some(s) = cfg.sparsity.as_mut().filter(|s| s.predicts_cold_only()) {
            Arc::make_mut(s).predict_cold_only(h.n_ff);
        }
        // Under `--numa tp`, each worker's CPU and each shard's node.
        let (worker_cpus, shard_places) = match (&tp, cfg.numa) {
            _ if plan_workers.is_some() => {
                let w = plan_workers.as_ref().expect("checked");
                (w.cpus.clone(), plan_places(&placement, w, tp.is_some()))
            }
            (Some(_), NumaMode::Tp) => {
                let (cpus, nodes) = placement.tp_workers(&group_sizes);
                (cpus, nodes.into_iter().map(Place::Node).collect::<Vec<Place>>())
            }
            _ => (placement.cpus.clone(), Vec::new()),
        };
        // LoRA adapters: the graphs that size the pools and pick the weights' forms hold every
        // adapter's nodes; the engine's graphs only those of non-zero scale.
        let adapters = match cfg.lora.is_empty() {
            true => None,
            false => {
                crate::lora::check(&cfg)?;
                Some(crate::lora::Adapters::open(&cfg.lora, &gguf, kernels)?)
            }
        };
        let every = adapters.as_ref().and_then(|a| a.lora(true));
        let tpl = (&tp, &every);
        // Plan the largest batch once to size the pools.
        let mut g = build_graph(kernels, &*model, tpl, &cfg, (cfg.n_batch, cfg.n_batch, Outputs::Logits), None);
        if let Some(a) = &adapters {
            a.check_applied(&g)?;
        }
        // Passes below --accel-min-tokens run every layer here: the largest of them sizes the
        // pools and the workers' scratch with the largest batch.
        let cpu_passes = cfg.alternates_layers().then(|| {
            let n = (cfg.accel_min_tokens - 1).min(cfg.n_batch);
            build_graph(kernels, &*model, tpl, &cfg, (n, n, Outputs::Logits), None)
        });
        if let Some(cpu) = &cpu_passes {
            g = build_graph(kernels, &*model, tpl, &cfg, (cfg.n_batch, cfg.n_batch, Outputs::Logits), Some(&g.act.max(&cpu.act)));
        }
        // A one-token decode's graph too: small batches may read forms of weights the largest
        // does not (`PackedWeights::build`).
        let mut one = build_graph(kernels, &*model, tpl, &cfg, (1, 1, Outputs::Logits), None);
        let forms: Vec<&corelm_core::graph::Graph> = [&g, &one].into_iter().chain(&cpu_passes).collect();
        let packed = PackedWeights::build(&forms, gguf.bytes(), kernels, &placement.memory, cfg.repack, &shard_places)
            .map_err(|e| Error::Config(format!("repacked weights: {e}")))?;
        // The copied matrices' file pages are not read again by the kernels; drop them from
        // this process (the page cache keeps them for any other reader).
        for (offset, len) in packed.file_ranges() {
            gguf.release(offset, len);
        }
        finish_graph(&mut g, &packed, &cfg, None);
        // The accelerator's rows of the matrices the largest batch's plan shares with it.
        let device = match (&cfg.roofline, cfg.accel_split) {
            (Some(roof), true) => {
                // The largest batch's plan and a one-token decode's: the device holds the larger
                // cut of each matrix.
                let plans = corelm_plan::planner::plan_graph(&g, roof, cfg.n_ctx / 2);
                packed.apply(&mut one);
                let one_plans = corelm_plan::planner::plan_graph(&one, roof, cfg.n_ctx / 2);
                let d = crate::device::DeviceSplits::open(&gguf, &[(&g, &plans), (&one, &one_plans)], roof, cfg.n_batch)?.map(Arc::new);
                if let Some(d) = &d {
                    d.apply(&mut g, &plans);
                }
                d
            }
            _ => None,
        };
        // Under `--numa tp` each shard's activation regions are bound to its node.
        let pools = Pools::new(&g.act, g.out_bytes, &placement.memory, &shard_places)
            .map_err(|e| Error::Config(format!("activation pools for a batch of {}: {e}", cfg.n_batch)))?;
        for (what, t) in [("K", cfg.cache_type_k), ("V", cfg.cache_type_v)] {
            if !corelm_core::kv::KV_TYPES.contains(&t) {
                return Err(Error::Config(format!("KV cache type {t} for {what} is not supported (F16, Q8_0, Q4_0)")));
            }
            if h.head_dim % t.block_size() != 0 {
                return Err(Error::Config(format!(
                    "{what} cache type {t} needs a head dimension that is a multiple of {}, the model's is {}",
                    t.block_size(),
                    h.head_dim
                )));
            }
        }
        let types = (cfg.cache_type_k, cfg.cache_type_v);
        // With tensor parallelism each shard keeps its own KV heads' rows (shared heads once per
        // shard that reads them), one shard after another.
        let kv_slots = tp.as_ref().map_or(h.n_kv_head, |p| p.kv_slots());
        let kv_place = match &tp {
            Some(plan) if !shard_places.is_empty() => {
                Place::Parts(plan.kv_base.iter().copied().zip(shard_places.iter().cloned()).collect())
            }
            _ => placement.memory.clone(),
        };
        let mut kv = KvCache::new(h.n_layer, cfg.n_ctx, kv_slots, h.head_dim, types, cfg.n_seq_max, &kv_place)
            .map_err(|e| Error::Config(format!("KV cache for a context of {} tokens: {e}", cfg.n_ctx)))?;
        kv.set_key_layout(cfg.kv_layout).map_err(|e| Error::Config(format!("--kv-layout columns: {e}")))?;
        // Keys in columns are read by the column-key kernels; where this table has none (a
        // head dimension not a multiple of 16) only their portable twin would run, several
        // times slower than ggml's kernels on rows: refused, unless the portable table itself
        // was asked for.
        if cfg.kv_layout == KeyLayout::Columns && kernels.isa() != Isa::Portable && !corelm_kernels::attention::matrix::has_simd(kernels, h.head_dim) {
            return Err(Error::Config(format!(
                "--kv-layout columns: the {} kernel table has no column-key attention for a head dimension of {} (its kernels take multiples of 16); use --kv-layout rows",
                kernels.isa().name(),
                h.head_dim
            )));
        }
        if cfg.kv_layout == KeyLayout::Columns && model.attn_softcap() {
            return Err(Error::Config(format!("--kv-layout columns: the column-key kernels have no soft-capped attention scores, which this {} model has; use --kv-layout rows", h.arch)));
        }
        if cfg.attn_pipeline && cfg.kv_layout != KeyLayout::Columns {
            return Err(Error::Config("--attn-pipeline pipelines the column-key kernels: it needs --kv-layout columns".into()));
        }
        let cpus = if cfg.pin { worker_cpus } else { vec![] };
        let (pool, decode_view, base_view, whole_view) = match shared {
            Some((p, view)) => (p, None, view, 0),
            None => {
                let mut pool = ThreadPool::new(PoolConfig { n_threads: cfg.n_threads, cpus });
                if tp.is_some() {
                    // One group of workers per shard, consecutive workers (under `--numa tp`, a
                    // node's cores) together.
                    pool.split(&group_sizes).map_err(Error::Config)?;
                }
                let decode_view = match plan_workers.as_ref().and_then(|w| w.decode.as_ref()) {
                    Some(groups) => Some(pool.add_view(groups).map_err(Error::Config)?),
                    None => None,
                };
                // Every worker as one group, for a draft model's engine on this pool.
                let whole_view = if pool.groups().len() > 1 { pool.add_view(std::slice::from_ref(&(0..cfg.n_threads))).map_err(Error::Config)? } else { 0 };
                (Arc::new(pool), decode_view, 0, whole_view)
            }
        };
        // The smallest group of any view sizes the per-worker scratch.
        let views = std::iter::once(base_view).chain(decode_view);
        let mut group_threads = views.flat_map(|v| pool.view_groups(v).iter().map(|g| g.len())).min().unwrap_or(cfg.n_threads);
        if cfg.roofline.is_some() {
            // A roofline plan may cap a node at one worker, which then takes all its rows.
            group_threads = 1;
        }
        let sizing: Vec<&corelm_core::graph::Graph> = std::iter::once(&g).chain(&cpu_passes).collect();
        let max_head_dim = sizing.iter().map(|s| s.max_head_dim).max().unwrap_or(0);
        let mut exec = Executor::new(cfg.n_threads, group_threads, max_head_dim, &sizing);
        exec.dump_dir = std::env::var_os("CORELM_DUMP_DIR").map(Into::into);
        exec.batch_invariant = cfg.batch_invariant;
        exec.panel_gemm = cfg.fast_prefill;
        if cfg.matrix_workers > 0 {
            exec.set_classes(matrix_classes(&cfg, kernels)?).map_err(Error::Config)?;
        }
        if cfg.attn_pipeline {
            exec.set_attn_pipeline(h.head_dim, &group_sizes);
        }
        exec.set_schedules(cfg.plan.as_ref().and_then(|p| p.schedules(kernels.isa().name())).map(Arc::new));
        if let Some(d) = &device {
            exec.set_device(d.clone(), d.max_values(cfg.n_batch));
        }
        let device_layers = crate::device_layers::LayersOnDevice::open_for(&gguf, model.as_ref(), &kv, &cfg, from_plan)?.map(Arc::new);
        exec.device_layers = device_layers.clone().map(|d| d as Arc<dyn corelm_core::DeviceLayers>);
        let (accel, online) = match (cfg.sparsity.as_ref().filter(|s| s.offloaded.iter().any(|v| !v.is_empty())), accel_groups, &cfg.accel) {
            (Some(_), Some((members, groups)), Some(a)) => {
                let online = Arc::new(crate::balance::Online::new(gguf.clone(), kernels, a.balance, cfg.n_batch, members, &groups)?);
                exec.offload = Some(online.clone());
                (Some(online.ffn().clone()), Some(online))
            }
            (Some(s), _, _) => {
                let a = Arc::new(crate::offload::Static::open(gguf.clone(), &s.offloaded, h.n_embd, cfg.n_batch)?);
                exec.offload = Some(a.clone());
                (Some(a.ffn().clone()), None)
            }
            (None, _, _) => (None, None),
        };
        if let (Some(a), true) = (&accel, cfg.batch_invariant) {
            a.set_batch_invariant();
        }
        let mut graphs = HashMap::new();
        let lora = adapters.as_ref().and_then(|a| a.lora(false));
        if lora == every {
            graphs.insert((cfg.n_batch, cfg.n_batch, Outputs::Logits), g);
        }
        Ok(Engine {
            gguf,
            model,
            kernels,
            pool,
            exec,
            packed,
            placement,
            tp,
            pools,
            kv,
            graphs,
            slots: Vec::with_capacity(cfg.n_batch),
            next_pos: vec![0; cfg.n_seq_max],
            out_rows: Vec::with_capacity(cfg.n_batch),
            n_out: 0,
            decode_view,
            last_view: base_view,
            base_view,
            whole_view,
            cfg,
            profile: None,
            accel,
            online,
            device,
            device_layers,
            plan_note,
            adapters,
            lora,
        })
    }

    pub(crate) fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// This engine's workers for another engine (a draft model's), with the view that runs
    /// them as one group.
    pub(crate) fn shared_pool(&self) -> (Arc<ThreadPool>, usize) {
        (self.pool.clone(), self.whole_view)
    }

    pub(crate) fn exec_mut(&mut self) -> &mut Executor {
        &mut self.exec
    }

    pub(crate) fn packed_bytes(&self) -> &[u8] {
        self.packed.bytes()
    }

    pub fn hyper(&self) -> &Hyper {
        self.model.hyper()
    }

    /// The online balancing of the accelerator's neurons (`--accel-policy`), if any.
    pub fn balance(&self) -> Option<&crate::balance::Online> {
        self.online.as_deref()
    }

    /// The accelerator's share of split matmuls, when `--accel-split` gave it one.
    pub fn device(&self) -> Option<&crate::device::DeviceSplits> {
        self.device.as_deref()
    }

    /// How many of the model's first layers could run whole on an accelerator
    /// (`--accel-layers`): those its architecture says can, counted from layer 0.
    pub fn device_capable_layers(&self) -> usize {
        (0..self.hyper().n_layer).take_while(|&il| self.model.device_layer(il).is_some()).count()
    }

    /// Why the plan's accelerator layers (`corelm tune`) do not run with this configuration.
    pub fn plan_note(&self) -> Option<&str> {
        self.plan_note.as_deref()
    }

    /// The accelerator's whole layers, when `--accel-layers` or the plan gave it some.
    pub fn device_layers(&self) -> Option<&crate::device_layers::LayersOnDevice> {
        self.device_layers.as_deref()
    }

    /// The accelerator's part of the FFNs, when `--accel-mem` gave it one.
    pub fn accel(&self) -> Option<&corelm_accel::HotFfn> {
        self.accel.as_deref()
    }

    /// Watch nodes' results as passes run (`corelm_core::Tap`; `None` stops).
    pub fn set_tap(&mut self, tap: Option<Arc<dyn corelm_core::Tap>>) {
        self.exec.tap = tap;
    }

    pub fn gguf(&self) -> &Arc<Gguf> {
        &self.gguf
    }

    /// Key blocks the prefill attention pipeline (`--attn-pipeline`) scored since load: what
    /// the causal mask and sliding windows left to compute (`None` without the pipeline).
    pub fn attn_pipeline_blocks(&self) -> Option<u64> {
        self.exec.pipeline_blocks()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn kernels(&self) -> &'static Kernels {
        self.kernels
    }

    /// Barriers per pass (group, global) of the planned graph for batches of `n_tokens`, if one
    /// has been planned: with `--tp`, group barriers separate nodes of the parallel subgraphs.
    pub fn barriers(&self, n_tokens: usize) -> Option<(usize, usize)> {
        self.graphs.iter().find(|(&(n, _, _), _)| n == n_tokens).map(|(_, g)| g.barriers())
    }

    /// Nodes of the graph for `n_tokens` tokens capped below every worker by the roofline plan.
    pub fn capped_nodes(&mut self, n_tokens: usize, n_out: usize) -> usize {
        self.graph(n_tokens, n_out).threads.iter().filter(|&&t| t > 0).count()
    }

    /// The graph of passes of `n_tokens` tokens with `n_out` logit rows, planned (once per
    /// shape, then cached) if it was not yet. `n_tokens` at most the batch size.
    pub fn graph(&mut self, n_tokens: usize, n_out: usize) -> &corelm_core::graph::Graph {
        self.graph_of(n_tokens, n_out, Outputs::Logits)
    }

    /// [`Self::graph`] for either kind of output rows.
    fn graph_of(&mut self, n_tokens: usize, n_out: usize, outputs: Outputs) -> &corelm_core::graph::Graph {
        let key = (n_tokens, n_out, outputs);
        if !self.graphs.contains_key(&key) {
            let mut g = build_graph(self.kernels, &*self.model, (&self.tp, &self.lora), &self.cfg, key, Some(&self.pools.layout));
            finish_graph(&mut g, &self.packed, &self.cfg, self.device.as_deref());
            self.graphs.insert(key, g);
        }
        &self.graphs[&key]
    }

    /// The pool view the last pass ran on: 0 for every worker (an engine on another's pool:
    /// its view of them as one group), else the plan's decode view.
    pub fn last_view(&self) -> usize {
        self.last_view
    }

    /// Where workers run and memory lives (`--numa`).
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The tensor-parallel degree (1: off).
    pub fn tp_degree(&self) -> usize {
        self.tp.as_ref().map_or(1, |p| p.degree())
    }

    /// Graphs planned so far (one per batch shape; decoding reuses one).
    pub fn n_graphs(&self) -> usize {
        self.graphs.len()
    }

    /// Bytes of the pools planned at load: activations (both buffers), outputs, KV cache.
    pub fn memory(&self) -> (usize, usize, usize) {
        (self.pools.act[0].len() + self.pools.act[1].len(), self.pools.out.len(), self.kv.bytes())
    }

    /// The activation and output pools planned at load (their regions: [`Pools::layout`]).
    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    /// Matrices repacked at load into the interleaved layout, and their bytes.
    pub fn packed(&self) -> (usize, usize) {
        (self.packed.count(), self.packed.len())
    }

    /// Bytes of K and V that one cached token occupies, over all layers.
    pub fn kv_bytes_per_cell(&self) -> usize {
        self.kv.bytes() / self.kv.n_cells.max(1)
    }

    /// The LoRA adapters loaded (`--lora`), in order, with their scales.
    pub fn lora_adapters(&self) -> &[crate::lora::Adapter] {
        self.adapters.as_ref().map_or(&[], |a| a.list())
    }

    /// Whether the adapters run at `scales` now (one per adapter; none loaded: empty).
    pub fn lora_scales_are(&self, scales: &[f32]) -> bool {
        let list = self.lora_adapters();
        list.len() == scales.len() && list.iter().zip(scales).all(|(a, &s)| a.scale == s)
    }

    /// Set the adapters' scales (one per adapter; 0 leaves one out). The graphs are rebuilt
    /// and the prefix cache emptied; sequences keep the KV rows they have.
    pub fn set_lora_scales(&mut self, scales: &[f32]) -> Result<(), Error> {
        let Some(a) = self.adapters.as_mut() else {
            return match scales.len() {
                0 => Ok(()),
                n => Err(Error::Config(format!("{n} LoRA scales but no adapter is loaded (--lora)"))),
            };
        };
        a.set_scales(scales)?;
        let lora = a.lora(false);
        if lora != self.lora {
            self.lora = lora;
            self.graphs.clear();
            self.kv.blocks.clear_cache();
        }
        Ok(())
    }

    fn validate(&mut self, batch: &Batch) -> Result<(), Error> {
        let n = batch.len();
        if n == 0 {
            return Err(Error::Batch("empty batch".into()));
        }
        if batch.pos.len() != n || batch.seq.len() != n || batch.logits.len() != n {
            return Err(Error::Batch("tokens, pos, seq and logits must have the same length".into()));
        }
        if n > self.cfg.n_batch {
            return Err(Error::Batch(format!("{n} tokens exceed the batch size {}", self.cfg.n_batch)));
        }
        let n_vocab = self.hyper().n_vocab;
        for s in 0..self.cfg.n_seq_max {
            self.next_pos[s] = self.kv.blocks.len(s);
        }
        let mut new_blocks = 0;
        for i in 0..n {
            let (t, p, s) = (batch.tokens[i], batch.pos[i], batch.seq[i]);
            if t as usize >= n_vocab {
                return Err(Error::Batch(format!("token id {t} at batch index {i} is outside the vocabulary of {n_vocab}")));
            }
            let Some(si) = self.seq_index(s) else {
                return Err(Error::Batch(format!("sequence id {s} outside 0..{}", self.cfg.n_seq_max)));
            };
            let next = &mut self.next_pos[si];
            if p < 0 || p as usize != *next {
                return Err(Error::Batch(format!("position {p} of sequence {s} is not its next position {next}")));
            }
            if *next >= self.cfg.n_ctx {
                return Err(Error::ContextFull { needed: n, free: 0, n_ctx: self.cfg.n_ctx });
            }
            new_blocks += usize::from((*next).is_multiple_of(BLOCK));
            *next += 1;
        }
        if new_blocks > self.kv.blocks.available() {
            return Err(Error::ContextFull { needed: n, free: self.free_cells(), n_ctx: self.cfg.n_ctx });
        }
        Ok(())
    }

    /// Run one forward pass over `batch`; returns the logits of the tokens flagged `logits`,
    /// in batch order. On error nothing is changed (the KV cache keeps its contents).
    pub fn decode(&mut self, batch: &Batch) -> Result<Logits<'_>, Error> {
        self.pass(batch, Outputs::Logits)?;
        Ok(self.logits())
    }

    /// Like [`Self::decode`], but the flagged tokens' rows are the final norm's output (the
    /// hidden states embeddings are pooled from, `[n_embd]` each) and no LM head runs.
    pub fn decode_hidden(&mut self, batch: &Batch) -> Result<Hidden<'_>, Error> {
        self.pass(batch, Outputs::Hidden)?;
        Ok(self.output_rows(self.hyper().n_embd))
    }

    fn pass(&mut self, batch: &Batch, outputs: Outputs) -> Result<(), Error> {
        self.validate(batch)?;
        let n = batch.len();
        // Append each token to its sequence's blocks.
        self.slots.clear();
        for i in 0..n {
            let row = self.kv.blocks.append(batch.seq[i] as usize, batch.tokens[i]);
            self.slots.push(row as u32);
        }
        self.out_rows.clear();
        self.out_rows.extend((0..n as u32).filter(|&i| batch.logits[i as usize]));
        let n_out = self.out_rows.len();
        self.graph_of(n, n_out, outputs);
        let graph = &self.graphs[&(n, n_out, outputs)];
        // The plan's rule: short passes on the decode view, the rest on every worker.
        self.last_view = match (&self.cfg.plan, self.decode_view) {
            (Some(p), Some(v)) if !p.prefill_for(n) => v,
            _ => self.base_view,
        };
        // --accel-min-tokens: a pass on the device first gets the rows CPU passes wrote.
        let on_device = self.cfg.device_layers_for(n) > 0;
        if let (Some(d), true) = (&self.device_layers, on_device) {
            d.upload_stale(&self.kv, self.kernels);
        }
        let view = BatchView {
            tokens: &batch.tokens,
            pos: &batch.pos,
            seq: &batch.seq,
            slots: &self.slots,
            out_rows: &self.out_rows,
        };
        self.exec.run(
            &self.pool,
            self.last_view,
            graph,
            Weights { file: self.gguf.bytes(), packed: self.packed.bytes(), adapters: self.adapters.as_ref().map_or(&[], |a| a.bytes()) },
            &self.pools,
            &self.kv,
            view,
            self.kernels,
            self.profile.as_mut(),
        );
        // … and the CPU's cache gets a device pass's rows; the device learns which cells the
        // CPU wrote.
        if let Some(d) = &self.device_layers {
            if on_device {
                d.read_back(&mut self.kv, self.kernels, &self.slots);
            } else {
                d.cpu_pass(&self.slots);
            }
        }
        self.n_out = n_out;
        Ok(())
    }

    /// Append `tokens` to sequence `seq` (positions continue from its length) in forward passes
    /// of at most `n_batch` tokens. Logits are produced for every token when `all_logits`, else
    /// for the last one only; `on_logits` sees each pass's logits (in token order). Prefill,
    /// evaluation and benchmarks all go through here.
    pub fn feed(
        &mut self,
        seq: i32,
        tokens: &[u32],
        all_logits: bool,
        mut on_logits: impl FnMut(&Logits),
    ) -> Result<(), Error> {
        let start = self.seq_len(seq);
        let nb = self.cfg.n_batch;
        let mut batch = Batch::with_capacity(nb.min(tokens.len()));
        for (ci, chunk) in tokens.chunks(nb).enumerate() {
            batch.clear();
            for (j, &t) in chunk.iter().enumerate() {
                let i = ci * nb + j;
                batch.add(t, (start + i) as i32, seq, all_logits || i + 1 == tokens.len());
            }
            let logits = self.decode(&batch)?;
            if logits.rows() > 0 {
                on_logits(&logits);
            }
        }
        Ok(())
    }

    /// The logits of the last `decode`.
    pub fn logits(&self) -> Logits<'_> {
        self.output_rows(self.hyper().n_vocab)
    }

    /// The last pass's `n_out` output rows of `width` f32 (logits or hidden states).
    fn output_rows(&self, width: usize) -> Rows<'_> {
        let data = &self.pools.out.as_slice()[..self.n_out * width * 4];
        // SAFETY: the output pool is 64-byte aligned and holds the f32 rows the last run wrote.
        let data = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const f32, self.n_out * width) };
        Rows { data, width }
    }
}
