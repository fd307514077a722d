//! SMEPilot's planner: every operator of a planned graph on the multi-ceiling roofline.
//!
//! Per node: FLOPs, bytes moved, arithmetic intensity (FLOPs per byte), and the kernel family
//! whose ceilings apply (int8 dot for quantized matrices, the dense families for F32/F16/BF16
//! ones, F32 for attention and the element-wise ops). On each target that has the family:
//! attainable GFLOP/s = min(ceiling of all its workers, intensity × its memory bandwidth), and
//! the regime — memory-bound below half the target's ridge point, compute-bound above twice it,
//! ridge-crossing between.
//!
//! **Placement rule.** An operator is split across targets (output tiles in the ratio of their
//! ceilings, SMEPilot eq. 1) only when it is compute-bound on the *combined* roofline: its
//! intensity × the shared memory roof (every target busy) reaches the combined ceiling, so no
//! target starves the other of bandwidth. Otherwise it runs on the single target with the
//! highest attainable rate (the vector cores on ties). On the M4 Pro profile this gives the
//! paper's placements: a decode GEMV on the CPU, a 16-row batched decode on SME, a long prefill's
//! FFN split.
//!
//! A split matmul's output is then cut for real ([`crate::split`]): one contiguous range of its
//! larger dimension per target, on both targets' tile boundaries (`OpPlan::tiles`).
//!
//! **An accelerator** (a target of kind `accelerator`, `corelm profile --accel`) runs only
//! matmuls — the engine's device computes a matmul's first output columns — and every product
//! there pays its link: a fixed round trip plus the f32 activations in and the results out
//! at the link's rate (`Target::link`). A matmul stays on the vector cores or is split between
//! them and the device so that both finish together — the device's share `s` solves
//! `(1 − s)·t_cpu = fixed + s·t_acc`; that split's time is below the device's alone, so the
//! device never takes a whole matmul.
//! With both busy, a `combined` ceiling for the pair (measured: a software device shares the
//! CPU's cores) scales both rates down to it, and the CPU reads at the all-busy memory roof. A decode GEMV, microseconds on the CPU, stays
//! there; a long prefill's matmuls split. The device gets work only where the model says it
//! saves at least [`MIN_GAIN`] of the CPU's time.
//!
//! **MoE experts** are placed by their routed-token counts: an expert's matmul has as many
//! activation rows as (token, expert) pairs the router sends it, which is known only when the
//! batch runs, so the plan gives each MoE matmul a rule ([`ExpertRule`]) — for each count of
//! pairs, where an expert with that many runs (one expert's rows × that many rows, placed as
//! any matmul): on the M4 Pro profile an expert with a few pairs is a GEMV on the CPU, one
//! with many a GEMM on SME. The node itself is costed at the experts a batch of its tokens is
//! expected to read (`E·(1 − (1 − k/E)^tokens)` of `E` experts, `k` used per token).
//!
//! **Prefill attention as a pipeline** (`--attn-pipeline`): its matrix phases (`QKᵀ`, `PV`)
//! on a matrix unit while the vector cores run the softmax of other tiles take the longer of
//! the two instead of their sum ([`attention_pipeline`]); the plan gives both times where the
//! profile has a matrix target.
//!
//! **Threads.** A memory-bound operator on the vector target runs on the fewest threads that
//! reach 90 % of the measured bandwidth (the knee); everything else on every worker.
//!
//! The planner runs once per planned graph (batch shape), never per token.

use crate::profile::{Roofline, TargetKind};
use crate::split::{split_tiles, Class, Share};
use corelm_core::graph::Graph;
use corelm_core::tensor::{ClassSplit, Op};
use corelm_kernels::DType;

/// Where an operator runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Placement {
    /// One target by name.
    On(String),
    /// Output tiles split: (target, share) pairs, shares summing to 1.
    Split(Vec<(String, f64)>),
}

/// Memory-bound, ridge-crossing or compute-bound (on the chosen target, or the combined roof
/// for a split).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    Memory,
    Ridge,
    Compute,
}

/// One operator's plan.
#[derive(Clone, Debug)]
pub struct OpPlan {
    /// `matmul Q4_1 576×1536`, `attention`, `rms_norm`, …
    pub label: String,
    /// The kernel family whose ceilings were used (another than the operator's where the profile
    /// lacks it: see [`place`]).
    pub family: String,
    pub flops: f64,
    pub bytes: f64,
    pub regime: Regime,
    pub placement: Placement,
    pub threads: usize,
    /// Attainable GFLOP/s there, and the time it implies.
    pub gflops: f64,
    pub seconds: f64,
    /// For a split matmul: each target's rows × columns of the output ([`split_tiles`]).
    pub tiles: Vec<Share>,
    /// For a MoE matmul: where its experts run by their routed pairs.
    pub experts: Option<ExpertRule>,
    /// For prefill attention (a batch the tiled kernels take), where the profile has a matrix
    /// target: fused against pipelined, the softmax's work included.
    pub pipeline: Option<AttnPipeline>,
}

/// The softmax's vector work per (row, head, visible cell) of attention, in FLOPs at the FMA
/// rate: measured here (Zen 4, `perf`, docs/benchmarks.md 2026-11-24) as 19 % of a 4096-token
/// prefill's attention at head dimension 64, whose `QKᵀ` and `PV` are 4 · 64 FLOPs per
/// (row, head, cell): 0.19 / 0.81 · 256 ≈ 60 (ggml's `expf`, the maximum, the sums).
pub const SOFTMAX_FLOPS: f64 = 60.0;

/// Prefill attention fused against pipelined on a profile with a matrix target.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnPipeline {
    /// Where the matrix phases and the softmax run when pipelined.
    pub matrix: String,
    pub vector: String,
    /// Fused: the better of everything on the vector cores and the matrix phases on the
    /// matrix unit followed by the softmax on the vector cores. Pipelined: the longer phase.
    /// Neither below the time to read its bytes.
    pub fused_seconds: f64,
    pub pipelined_seconds: f64,
}

impl AttnPipeline {
    /// Whether the pipeline saves at least [`MIN_GAIN`] of the fused time.
    pub fn pays(&self) -> bool {
        self.pipelined_seconds < (1.0 - MIN_GAIN) * self.fused_seconds
    }
}

/// [`AttnPipeline`] for attention of `matrix_flops` (`QKᵀ` and `PV`) over `cells` (row, head,
/// visible cell) triples moving `bytes`, on `roof`'s first matrix and vector targets (their
/// `f32_fma` ceilings, or their first); `None` without both.
pub fn attention_pipeline(roof: &Roofline, matrix_flops: f64, cells: f64, bytes: f64) -> Option<AttnPipeline> {
    let find = |kind: TargetKind| roof.targets.iter().find(|t| t.kind == kind);
    let (m, v) = (find(TargetKind::Matrix)?, find(TargetKind::Vector)?);
    let rate = |t: &crate::profile::Target| t.ceilings.iter().find(|c| c.family == "f32_fma").or(t.ceilings.first()).map(|c| c.all_workers_gflops * 1e9);
    let (rm, rv) = (rate(m)?, rate(v)?);
    let soft = SOFTMAX_FLOPS * cells;
    let floor = bytes / (roof.memory.all_busy_gbps * 1e9);
    let fused = ((matrix_flops + soft) / rv).min(matrix_flops / rm + soft / rv).max(floor);
    let pipelined = (matrix_flops / rm).max(soft / rv).max(floor);
    Some(AttnPipeline { matrix: m.name.clone(), vector: v.name.clone(), fused_seconds: fused, pipelined_seconds: pipelined })
}

/// Where a MoE matmul's experts run by how many (token, expert) pairs each is routed: from
/// `steps[i].0` pairs on (to the next step's count), `steps[i].1`. The first step is at 1.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertRule {
    pub steps: Vec<(usize, Placement)>,
}

impl ExpertRule {
    /// Where an expert routed `pairs` pairs runs (at least 1).
    pub fn placement(&self, pairs: usize) -> &Placement {
        &self.steps.iter().rev().find(|(from, _)| *from <= pairs.max(1)).expect("a rule starts at 1 pair").1
    }
}

/// The rule of a MoE matmul whose experts are `k × n_out` matrices of `expert_bytes` bytes in
/// `family`, for 1 to `max_pairs` pairs per expert: each count placed by [`place`] as one
/// expert's matmul (its rows read once, f32 activations in and results out).
pub fn expert_rule(roof: &Roofline, family: &str, expert_bytes: f64, k: usize, n_out: usize, max_pairs: usize) -> ExpertRule {
    let mut steps: Vec<(usize, Placement)> = Vec::new();
    for c in 1..=max_pairs.max(1) {
        let flops = 2.0 * (c * k * n_out) as f64;
        let bytes = expert_bytes + 4.0 * (c * (k + n_out)) as f64;
        let p = place(roof, String::new(), family, flops, bytes).placement;
        if steps.last().is_none_or(|(_, q)| *q != p) {
            steps.push((c, p));
        }
    }
    ExpertRule { steps }
}

impl OpPlan {
    pub fn intensity(&self) -> f64 {
        self.flops / self.bytes.max(1.0)
    }
}

/// The family whose ceilings a matrix of `t` runs at.
fn family(t: DType) -> &'static str {
    match t {
        DType::F32 => "f32_fma",
        DType::F16 => "f16_fma",
        DType::BF16 => "bf16_dot",
        _ => "int8_dot",
    }
}

/// FLOPs, bytes and family of node `id` in `g`; attention sees `ctx` cached tokens per row.
fn cost(g: &Graph, t: &corelm_core::tensor::Tensor, ctx: usize) -> (String, &'static str, f64, f64) {
    let f32s = |n: usize| 4.0 * n as f64;
    let elems = (t.ne[0] * t.ne[1]) as f64;
    match t.op {
        Op::MatMulId { w, x, p, per_pair, e0, e1, .. } => {
            // Rows: one per routed pair. Matrices: the experts a batch of these tokens is
            // expected to route to, each read once.
            let (wt, xt) = (g.tensor(w), g.tensor(x));
            let (k, n_out, pairs) = (wt.ne[0], t.ne[0], t.ne[1]);
            let tokens = if per_pair { pairs / p.n_used.max(1) } else { xt.ne[1] };
            let e = (e1 - e0).max(1) as f64;
            let reach = p.n_expert.max(1) as f64;
            let used = e * (1.0 - (1.0 - p.n_used as f64 / reach).powi(tokens as i32));
            let flops = 2.0 * (pairs * k * n_out) as f64;
            let bytes = used * wt.n_bytes() as f64 / e + xt.n_bytes() as f64 + f32s(pairs * n_out);
            (format!("matmul_id {} {k}×{n_out} ×{}", wt.dtype, e1 - e0), family(wt.dtype), flops, bytes)
        }
        Op::MatMul { w, x } => {
            let (wt, xt) = (g.tensor(w), g.tensor(x));
            let [k, n_out] = wt.ne;
            let rows = t.ne[1];
            let flops = 2.0 * (rows * k) as f64 * t.ne[0] as f64;
            let bytes = wt.n_bytes() as f64 + xt.n_bytes() as f64 + f32s(rows * t.ne[0]);
            (format!("matmul {} {k}×{n_out}", wt.dtype), family(wt.dtype), flops, bytes)
        }
        Op::Attention { p, .. } => {
            let rows = t.ne[1] as f64;
            let heads = (t.ne[0] / p.head_dim.max(1)) as f64;
            // QKᵀ and PV: 2 multiply-adds per head, key and dimension; F16 keys and values of
            // the cached cells, read once per 64-row tile.
            let flops = 4.0 * rows * heads * (p.head_dim * ctx) as f64;
            let kv = 2.0 * 2.0 * (ctx * p.n_kv_head * p.head_dim) as f64 * (rows / 64.0).ceil();
            ("attention".into(), "f32_fma", flops, kv + 2.0 * f32s(t.ne[0] * t.ne[1]))
        }
        // K and V rows read as f32, written as F16 cache rows: no FLOPs, only bytes.
        Op::KvStore { k, v, width, .. } => {
            let rows = g.tensor(k.or(v).expect("a KV store of keys, values or both")).ne[1];
            let parts = (k.is_some() as usize + v.is_some() as usize) as f64;
            ("kv_store".into(), "f32_fma", 0.0, parts * 6.0 * (width as usize * rows) as f64)
        }
        // Element-wise and row ops: a few FLOPs per element, inputs and output streamed.
        _ => {
            let per = match t.op {
                Op::RmsNorm { .. } | Op::Rope { .. } | Op::Glu { .. } => 5.0,
                _ => 1.0,
            };
            (t.op.name().to_string(), "f32_fma", per * elems, 3.0 * f32s(t.ne[0] * t.ne[1]))
        }
    }
}

/// Place one operator of `flops` over `bytes` in `family` on `roof` (the rule above). Where no
/// target has `family` (a stated profile gives only some), each target's first ceiling stands
/// in, and the plan names the family it used. An accelerator is not a candidate: see
/// [`place_io`].
pub fn place(roof: &Roofline, label: String, family: &str, flops: f64, bytes: f64) -> OpPlan {
    match host_roof(roof) {
        Some(host) => place_host(&host, label, family, flops, bytes),
        None => place_host(roof, label, family, flops, bytes),
    }
}

/// `roof` without its accelerator targets (and the combined ceilings naming them); `None`
/// when it has none.
fn host_roof(roof: &Roofline) -> Option<Roofline> {
    let is_acc = |name: &str| roof.targets.iter().any(|t| t.name == name && t.kind == TargetKind::Accelerator);
    if !roof.targets.iter().any(|t| t.kind == TargetKind::Accelerator) {
        return None;
    }
    let mut host = roof.clone();
    host.targets.retain(|t| t.kind != TargetKind::Accelerator);
    host.combined.retain(|c| !c.targets.iter().any(|n| is_acc(n)));
    Some(host)
}

/// The least share of a matmul's CPU time an accelerator must save to be given any of it.
pub const MIN_GAIN: f64 = 0.05;

/// [`place`] for a matmul of `n_out` output columns that may also run on an accelerator
/// target: `io` is the bytes its products move over the link (f32 activations in, f32 results
/// out).
pub fn place_io(roof: &Roofline, label: String, family: &str, flops: f64, bytes: f64, io: f64, n_out: usize) -> OpPlan {
    let p = place(roof, label, family, flops, bytes);
    let Some(acc) = roof.targets.iter().find(|t| t.kind == TargetKind::Accelerator) else { return p };
    let Some(vector) = roof.targets.iter().find(|t| t.kind == TargetKind::Vector) else { return p };
    let ceiling = |t: &crate::profile::Target| t.ceilings.iter().find(|c| c.family == family).or(t.ceilings.first()).map(|c| c.all_workers_gflops);
    let (Some(c_acc), Placement::On(on)) = (ceiling(acc), &p.placement) else { return p };
    if on != &vector.name || flops <= 0.0 {
        return p;
    }
    let ai = flops / bytes.max(1.0);
    let bw = roof.memory.per_target_gbps.iter().find(|(t, _)| t == &acc.name).map_or(roof.memory.all_busy_gbps, |&(_, g)| g);
    let att = c_acc.min(ai * bw);
    let link = acc.link.unwrap_or(crate::profile::Link { overhead_us: 0.0, gbps: f64::INFINITY });
    let fixed = link.overhead_us * 1e-6 + io / (link.gbps * 1e9);
    let (t_cpu, t_acc) = (p.seconds, flops / (att.max(1e-9) * 1e9));
    // Both busy: a combined ceiling for the pair scales both rates down to it.
    let both = roof.combined.iter().find(|c| c.family == p.family && c.targets.len() == 2 && c.targets.contains(&acc.name) && c.targets.contains(&vector.name));
    let slow = match (both, ceiling(vector)) {
        (Some(b), Some(c_cpu)) => (b.gflops / (c_cpu + c_acc)).min(1.0),
        _ => 1.0,
    };
    // And the CPU's memory roof with the device reading too (`all_busy_gbps`).
    let c_cpu = ceiling(vector).unwrap_or(f64::INFINITY);
    let t_cpu_busy = flops / (c_cpu.min(ai * roof.memory.all_busy_gbps).max(1e-9) * 1e9);
    let (tc, ta) = ((t_cpu / slow).max(t_cpu_busy), t_acc / slow);
    let share = ((tc - fixed) / (tc + ta)).clamp(0.0, 1.0);
    let t_split = (1.0 - share) * tc;
    // The balanced split's time, `tc·(t_acc + fixed)/(tc + t_acc)`, is below both the CPU's and
    // the device's alone (`fixed + t_acc`), so the device never takes a whole matmul. It must
    // save at least `MIN_GAIN` of the CPU's time: below that the model's error (a software
    // device's threads on the CPU's cores, the wait on worker 0) decides. A share under one
    // four-row group is none.
    if device_cut(share, n_out) == 0 || t_split > (1.0 - MIN_GAIN) * t_cpu {
        return p;
    }
    let placement = Placement::Split(vec![(vector.name.clone(), 1.0 - share), (acc.name.clone(), share)]);
    OpPlan { placement, gflops: flops / t_split / 1e9, seconds: t_split, ..p }
}

/// Output columns of `n_out` an accelerator computes for a `share` of a matmul: its first
/// rows, in whole four-row groups (the CPU kernels' interleaved groups).
pub fn device_cut(share: f64, n_out: usize) -> usize {
    (share.clamp(0.0, 1.0) * n_out as f64) as usize / 4 * 4
}

/// The accelerator's share of a plan: the whole operator on it (1), a split's part, or 0.
pub fn device_share(p: &OpPlan, accel: &str) -> f64 {
    match &p.placement {
        Placement::On(t) => f64::from(u8::from(t == accel)),
        Placement::Split(shares) => shares.iter().find(|(t, _)| t == accel).map_or(0.0, |s| s.1),
    }
}

fn place_host(roof: &Roofline, label: String, family: &str, flops: f64, bytes: f64) -> OpPlan {
    let ai = flops / bytes.max(1.0);
    let alone = |name: &str| roof.memory.per_target_gbps.iter().find(|(t, _)| t == name).map_or(roof.memory.all_busy_gbps, |&(_, g)| g);
    let has = roof.targets.iter().any(|t| t.ceilings.iter().any(|c| c.family == family));
    // (target, family used, ceiling, attainable alone).
    let cands: Vec<(&str, &str, f64, f64)> = roof
        .targets
        .iter()
        .filter_map(|t| {
            let c = if has { t.ceilings.iter().find(|c| c.family == family)? } else { t.ceilings.first()? };
            Some((t.name.as_str(), c.family.as_str(), c.all_workers_gflops, c.all_workers_gflops.min(ai * alone(&t.name))))
        })
        .collect();
    let vector = roof.targets.iter().find(|t| t.kind == crate::profile::TargetKind::Vector).map_or("cpu", |t| t.name.as_str());
    let all_threads = roof.targets.iter().find(|t| t.name == vector).map_or(1, |t| t.workers);
    let knee = roof.bandwidth_knee(0.9).unwrap_or(all_threads);
    let used = cands.first().map_or(family, |c| c.1).to_string();
    let combined = roof.combined.iter().find(|c| c.family == used && c.targets.len() == cands.len() && cands.len() > 1);
    let time = |gflops: f64, bw: f64| if flops > 0.0 { flops / (gflops.max(1e-9) * 1e9) } else { bytes / (bw * 1e9) };
    let (placement, gflops, regime, on) = match combined {
        Some(c) if ai * roof.memory.all_busy_gbps >= c.gflops => {
            let total: f64 = cands.iter().map(|x| x.2).sum();
            let shares = cands.iter().map(|x| (x.0.to_string(), x.2 / total)).collect();
            (Placement::Split(shares), c.gflops, Regime::Compute, None)
        }
        _ => {
            let best = cands.iter().fold(None::<(&str, &str, f64, f64)>, |b, &x| match b {
                Some(b) if b.3 > x.3 || (b.3 == x.3 && b.0 == vector) => Some(b),
                _ => Some(x),
            });
            let Some((name, _, ceiling, att)) = best else {
                // No target has any ceiling: the vector cores at the memory roof.
                let att = ai * roof.memory.all_busy_gbps;
                let seconds = time(att, roof.memory.all_busy_gbps);
                return OpPlan { label, family: used, flops, bytes, regime: Regime::Memory, placement: Placement::On(vector.into()), threads: knee, gflops: att, seconds, tiles: Vec::new(), experts: None, pipeline: None };
            };
            let ridge = ceiling / alone(name);
            let regime = if ai < 0.5 * ridge { Regime::Memory } else if ai > 2.0 * ridge { Regime::Compute } else { Regime::Ridge };
            (Placement::On(name.to_string()), att, regime, Some(name))
        }
    };
    let threads = if regime == Regime::Memory && on == Some(vector) { knee.min(all_threads) } else { all_threads };
    let seconds = time(gflops, roof.memory.all_busy_gbps);
    OpPlan { label, family: used, flops, bytes, regime, placement, threads, gflops, seconds, tiles: Vec::new(), experts: None, pipeline: None }
}

/// The plan of every node of `g` (in node order), attention seeing `ctx` cached tokens.
pub fn plan_graph(g: &Graph, roof: &Roofline, ctx: usize) -> Vec<OpPlan> {
    g.nodes
        .iter()
        .map(|&id| {
            let t = g.tensor(id);
            let (label, family, flops, bytes) = cost(g, t, ctx);
            let mut p = match t.op {
                // f32 activations to an accelerator and f32 results back.
                Op::MatMul { w, .. } => place_io(roof, label, family, flops, bytes, 4.0 * (t.ne[1] * (g.tensor(w).ne[0] + t.ne[0])) as f64, t.ne[0]),
                Op::MatMulId { w, p: moe, e0, e1, .. } => {
                    let wt = g.tensor(w);
                    let expert_bytes = wt.n_bytes() as f64 / (e1 - e0).max(1) as f64;
                    let max_pairs = t.ne[1] / moe.n_used.max(1);
                    let rule = expert_rule(roof, family, expert_bytes, wt.ne[0], t.ne[0], max_pairs);
                    OpPlan { experts: Some(rule), ..place(roof, label, family, flops, bytes) }
                }
                // The pipeline runs where the tiled kernels would: prefill batches.
                Op::Attention { p: ap, .. } if t.ne[1] >= corelm_kernels::attention::TILED_MIN_ROWS => {
                    let cells = (t.ne[1] * (t.ne[0] / ap.head_dim.max(1)) * ctx) as f64;
                    OpPlan { pipeline: attention_pipeline(roof, flops, cells, bytes), ..place(roof, label, family, flops, bytes) }
                }
                _ => place(roof, label, family, flops, bytes),
            };
            // A split matmul's output tiles (`ne`: weight rows × activation rows), cut in the
            // ratio of the shares at both targets' tile boundaries.
            if let (Placement::Split(shares), Op::MatMul { .. } | Op::MatMulId { .. }) = (&p.placement, t.op) {
                let acc = shares.iter().find(|(n, _)| roof.targets.iter().any(|x| &x.name == n && x.kind == TargetKind::Accelerator));
                p.tiles = match acc {
                    // The accelerator's rows first, as the engine runs them (`device_cut`).
                    Some((name, share)) => {
                        let (m, n) = (t.ne[1], t.ne[0]);
                        let cut = device_cut(*share, n);
                        let cpu = shares.iter().find(|(x, _)| x != name).map_or("cpu", |x| x.0.as_str());
                        vec![Share { name: name.clone(), rows: 0..m, cols: 0..cut }, Share { name: cpu.into(), rows: 0..m, cols: cut..n }]
                    }
                    None => split_tiles(t.ne[1], t.ne[0], &classes(roof, shares, shares.iter().map(|(n, _)| n.as_str()))),
                };
            }
            p
        })
        .collect()
}

/// The split classes of `shares` in the order of `names` (each a target with its tile).
fn classes<'a>(roof: &Roofline, shares: &[(String, f64)], names: impl Iterator<Item = &'a str>) -> Vec<Class> {
    names
        .map(|name| Class {
            name: name.into(),
            tile: roof.targets.iter().find(|x| x.name == name).and_then(|x| x.tile).unwrap_or([1, 1]),
            gflops: shares.iter().find(|(n, _)| n == name).map_or(0.0, |s| s.1),
        })
        .collect()
}

/// Cut each matmul that the plan splits across exactly the targets `names` (in the executor's
/// worker-class order: `Executor::set_classes`) into one range per class — `Graph::splits`,
/// which the scheduler runs on those classes (the panel GEMM; other paths ignore a cut).
/// Applied once when a graph is planned, from its `plans` ([`plan_graph`] on `roof`). A MoE
/// matmul's expert rule becomes `Graph::expert_splits`: each expert cut by its routed pairs.
/// Returns how many matmuls (dense or expert) were cut.
pub fn apply_splits(g: &mut Graph, roof: &Roofline, plans: &[OpPlan], names: &[&str]) -> usize {
    g.splits.clear();
    g.expert_splits.clear();
    for (i, p) in plans.iter().enumerate() {
        let id = g.nodes[i];
        if let (Some(rule), Op::MatMulId { .. }) = (&p.experts, g.tensor(id).op) {
            let n_out = g.tensor(id).ne[0];
            if let Some(steps) = expert_cuts(roof, rule, n_out, names) {
                g.expert_splits.push((id, steps));
            }
            continue;
        }
        let Placement::Split(shares) = &p.placement else { continue };
        let t = g.tensor(id);
        let same = shares.len() == names.len() && names.iter().all(|n| shares.iter().any(|(s, _)| s == n));
        if !same || !matches!(t.op, Op::MatMul { .. }) {
            continue;
        }
        let (m, n) = (t.ne[1], t.ne[0]);
        let by_rows = n < m;
        let tiles = split_tiles(m, n, &classes(roof, shares, names.iter().copied()));
        let bounds = std::iter::once(0).chain(tiles.iter().map(|s| if by_rows { s.rows.end } else { s.cols.end })).collect();
        g.splits.push((id, ClassSplit { by_rows, bounds }));
    }
    g.splits.len() + g.expert_splits.len()
}

/// An expert rule as cuts of an expert's `n_out` output columns among the classes `names`: a
/// step on one of them gives it every column, a split across exactly them cuts at both
/// targets' tile boundaries. `None` where some step places experts elsewhere, or every step on
/// the vector cores (nothing to cut).
pub fn expert_cuts(roof: &Roofline, rule: &ExpertRule, n_out: usize, names: &[&str]) -> Option<Vec<(usize, ClassSplit)>> {
    let vector = |n: &str| roof.targets.iter().any(|t| t.name == n && t.kind == TargetKind::Vector);
    if rule.steps.iter().all(|(_, p)| matches!(p, Placement::On(n) if vector(n))) {
        return None;
    }
    let mut steps = Vec::with_capacity(rule.steps.len());
    for (from, placement) in &rule.steps {
        let shares = match placement {
            Placement::On(n) if names.contains(&n.as_str()) => vec![(n.clone(), 1.0)],
            Placement::Split(shares) if shares.len() == names.len() && names.iter().all(|n| shares.iter().any(|(s, _)| s == n)) => shares.clone(),
            _ => return None,
        };
        let tiles = split_tiles(1, n_out, &classes(roof, &shares, names.iter().copied()));
        let bounds = std::iter::once(0).chain(tiles.iter().map(|s| s.cols.end)).collect();
        steps.push((*from, ClassSplit { by_rows: false, bounds }));
    }
    Some(steps)
}

/// Operators with the same label and placement summed, most time first: (plan of the first,
/// count, total FLOPs, total bytes, total seconds).
pub fn summarize(plans: &[OpPlan]) -> Vec<(OpPlan, usize, f64, f64, f64)> {
    let mut out: Vec<(OpPlan, usize, f64, f64, f64)> = Vec::new();
    for p in plans {
        match out.iter_mut().find(|(q, ..)| q.label == p.label && q.placement == p.placement) {
            Some((_, n, f, b, s)) => {
                *n += 1;
                *f += p.flops;
                *b += p.bytes;
                *s += p.seconds;
            }
            None => out.push((p.clone(), 1, p.flops, p.bytes, p.seconds)),
        }
    }
    out.sort_by(|a, b| b.4.total_cmp(&a.4));
    out
}

/// Cap each memory-bound node of `g` at the bandwidth knee its `plans` ([`plan_graph`]) give
/// (`Graph::threads`), where the knee is below the node's workers — the planner's thread
/// counts, applied once when a graph is planned. Attention is never capped: llama.cpp's split
/// of long single-row attention follows the thread count, and its bits with it. Returns how
/// many nodes were capped.
pub fn cap_threads(g: &mut Graph, plans: &[OpPlan]) -> usize {
    let mut capped = 0;
    for (i, p) in plans.iter().enumerate() {
        let attention = matches!(g.tensor(g.nodes[i]).op, Op::Attention { .. });
        let vector_only = matches!(&p.placement, Placement::On(_));
        if p.regime == Regime::Memory && vector_only && !attention && p.threads < u16::MAX as usize {
            g.threads[i] = p.threads as u16;
            capped += 1;
        }
    }
    capped
}
