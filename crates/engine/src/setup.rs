//! What [`Engine::from_gguf`](crate::Engine::from_gguf) decides before it runs anything: the
//! model's expert count, the tensor-parallel shard plan, each shard's node under a plan, the
//! worker classes of `--matrix-workers`, whether `--accel-split` can run, and how a batch
//! shape's graph is built and finished (weights pointed at their repacked copies, the roofline's caps and splits).
//!
//! Invariant: nothing here touches the engine's pools or KV cache; each function answers from
//! the configuration, the model and the machine's placement.

use crate::{EngineConfig, Error, Outputs};
use corelm_core::memory::{ActLayout, Place};
use corelm_core::sched::matmul::WorkerClass;
use corelm_core::tp::{lcm, TpDims, TpKv, TpPlan};
use corelm_core::graph::Lora;
use corelm_core::{Builder, Graph, PackedWeights, Placement};
use corelm_gguf::Gguf;
use corelm_kernels::{Isa, Kernels};
use corelm_models::Model;
use std::sync::Arc;

/// Under a plan with tensor parallelism on a machine of several nodes: each shard's node, where
/// its group lies in one (its weight copies and KV rows go there); else none.
pub(crate) fn plan_places(placement: &Placement, w: &crate::plan::Workers, tp: bool) -> Vec<Place> {
    if !tp || placement.nodes.len() < 2 {
        return Vec::new();
    }
    let node_of = |cpu: usize| placement.node_cpus.iter().position(|cs| cs.contains(&cpu)).map(|i| placement.nodes[i]);
    let mut start = 0;
    let mut places = Vec::new();
    for &size in &w.group_sizes {
        let nodes: Vec<Option<usize>> = w.cpus[start..start + size].iter().map(|&c| node_of(c)).collect();
        start += size;
        match nodes[0] {
            Some(n) if nodes.iter().all(|&x| x == Some(n)) => places.push(Place::Node(n)),
            _ => return Vec::new(),
        }
    }
    places
}

/// The profile targets of `--matrix-workers`' worker classes, in class order.
const MATRIX_CLASSES: [&str; 2] = ["sme", "cpu"];

/// The worker classes of `--matrix-workers m` among `n` workers (`EngineConfig::matrix_workers`),
/// or why they cannot be.
pub(crate) fn matrix_classes(cfg: &EngineConfig, kernels: &Kernels) -> Result<Vec<WorkerClass>, Error> {
    let m = cfg.matrix_workers;
    let refuse = |why: String| Err(Error::Config(format!("--matrix-workers {m}: {why}")));
    if kernels.isa() != Isa::Sme {
        return refuse(format!("needs a matrix unit (Arm SME); these kernels are {}", kernels.isa().name()));
    }
    if m >= cfg.n_threads {
        return refuse(format!("leaves no vector worker among {} threads", cfg.n_threads));
    }
    if !cfg.roofline.as_ref().is_some_and(|r| MATRIX_CLASSES.iter().all(|n| r.targets.iter().any(|t| &t.name == n))) {
        return refuse("needs --roofline with `sme` and `cpu` targets (`corelm profile` measures them)".into());
    }
    if !cfg.fast_prefill || cfg.tp > 1 || cfg.batch_invariant {
        return refuse("splits the panel GEMM: needs --fast-prefill, without --tp or --batch-invariant".into());
    }
    let vector = if Isa::Dotprod.missing().is_empty() { Isa::Dotprod } else { Isa::Neon };
    Ok(vec![WorkerClass { isa: Isa::Sme, workers: m }, WorkerClass { isa: vector, workers: cfg.n_threads - m }])
}

/// The graph of passes of `n_tokens` tokens with `n_out` output rows (logits or hidden states)
/// as `model` builds it,
/// tensor-parallel per `tp`, its activations in `layout`'s regions (`None`: its own, for the
/// graph that sizes the pools), with `lora`'s adapters.
pub(crate) fn build_graph(
    kernels: &'static Kernels,
    model: &dyn Model,
    (tp, lora): (&Option<Arc<TpPlan>>, &Option<Arc<Lora>>),
    cfg: &EngineConfig,
    (n_tokens, n_out, outputs): (usize, usize, Outputs),
    layout: Option<&ActLayout>,
) -> Graph {
    let mut b = Builder::new(kernels, n_tokens, n_out)
        .with_lora(lora.clone())
        .with_hidden_output(outputs == Outputs::Hidden)
        .with_tp(tp.clone(), cfg.tp_sync)
        .with_sparsity(cfg.sparsity.clone())
        .with_key_layout(cfg.kv_layout)
        .with_device_layers(cfg.device_layers_for(n_tokens))
        .with_act_layout(layout.cloned());
    let out = model.build(&mut b);
    b.finish(&out)
}

/// What a built graph needs before it runs: its weights pointed at their repacked copies and,
/// under a roofline profile, its memory-bound nodes capped at the bandwidth knee, its matmuls
/// cut among worker classes or shared with the accelerator as the plan places them.
pub(crate) fn finish_graph(g: &mut Graph, packed: &PackedWeights, cfg: &EngineConfig, device: Option<&crate::device::DeviceSplits>) {
    packed.apply(g);
    if let Some(roof) = &cfg.roofline {
        let plans = corelm_plan::planner::plan_graph(g, roof, cfg.n_ctx / 2);
        corelm_plan::planner::cap_threads(g, &plans);
        if cfg.matrix_workers > 0 {
            corelm_plan::planner::apply_splits(g, roof, &plans, &MATRIX_CLASSES);
        }
        if let Some(d) = device {
            d.apply(g, &plans);
        }
    }
    if cfg.elide_barriers {
        g.elide_barriers();
    }
}

/// Why `cfg`'s `--accel-split` cannot run, if it cannot.
pub(crate) fn check_accel_split(cfg: &EngineConfig) -> Result<(), Error> {
    let refuse = |why: &str| Err(Error::Config(format!("--accel-split: {why}")));
    crate::device::target(cfg.roofline.as_ref()).map_err(|e| Error::Config(format!("--accel-split: {e}")))?;
    if cfg.tp > 1 {
        return refuse("runs without tensor parallelism for now; drop --tp");
    }
    if cfg.accel.is_some() || cfg.matrix_workers > 0 {
        return refuse("shares matmuls with the accelerator; --accel-mem and --matrix-workers share other work: use one");
    }
    if cfg.batch_invariant {
        return refuse("the cut moves with the batch size, so a token's results would depend on its batch: it cannot run batch-invariant (--batch-invariant, serve without --no-batch-invariant)");
    }
    Ok(())
}

/// Experts per mixture-of-experts layer (`<arch>.expert_count`; 0 for a dense model).
pub fn expert_count(g: &Gguf) -> usize {
    let arch = g.str("general.architecture").unwrap_or_default();
    g.opt_u64(&format!("{arch}.expert_count")).ok().flatten().unwrap_or(0) as usize
}

/// The shard plan of `--tp` for this model over worker groups of `groups` workers (one per
/// shard), or why that degree cannot work (`None` at 1).
pub(crate) fn tp_plan(gguf: &Gguf, model: &dyn corelm_models::Model, cfg: &EngineConfig, groups: &[usize]) -> Result<Option<Arc<TpPlan>>, Error> {
    let degree = groups.len();
    if degree <= 1 {
        return Ok(None);
    }
    let refuse = |why: String| Err(Error::Config(format!("--tp {degree}: {why}")));
    if let Some(why) = model.tp_refusal() {
        return refuse(why);
    }
    let h = model.hyper();
    if degree > cfg.n_threads {
        return refuse(format!("needs at least {degree} worker threads, one per shard; got {}", cfg.n_threads));
    }
    // Down's quantization blocks: cut every `FF_UNIT` neurons where they are larger
    // (`Builder::matmul_cols` pads the shard's activations to whole blocks).
    let block = |name: &str| -> Option<usize> {
        (0..h.n_layer).map(|il| gguf.tensor(&format!("blk.{il}.{name}.weight")).map(|t| t.dtype.block_size())).try_fold(1, |a, b| b.map(|b| lcm(a, b)))
    };
    // Dense feed-forward layers are cut by their width; mixtures of experts by experts.
    let n_expert = expert_count(gguf);
    let (n_ff, ff_block) = match block("ffn_down") {
        Some(b) => (h.n_ff, b),
        None if n_expert > 0 => (0, 1),
        None => return refuse("the model has neither dense feed-forward layers nor experts to split".into()),
    };
    let ff_unit = TpDims::ff_unit(ff_block);
    let dims = TpDims { n_head: h.n_head, n_kv_head: h.n_kv_head, head_dim: h.head_dim, n_ff, n_expert, ff_block, ff_unit };
    let plan = TpPlan::sized(dims, groups).map_err(Error::Config)?;
    Ok(Some(Arc::new(if cfg.tp_kv == TpKv::Replicate { plan.replicated() } else { plan })))
}
