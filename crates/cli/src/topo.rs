//! `corelm topo`: print the hardware tree, and with `--explore` run Sandwich's configuration
//! search on it (TopoTree transforms, cross-sections, the latency model) for decode and prefill.
//!
//! The profile the model is fed: for a shipped snapshot its stated one
//! (`MachineProfile::stated`, by file stem); for this machine one measured here — read bandwidth
//! of one core and of all, the pool's barrier, and one core's compute from a timed prefill pass
//! of the model. The workload is the model's (`corelm_engine::bench::workload`).

use anyhow::{bail, Context, Result};
use corelm_topo::sandwich::{self, MachineProfile, ServiceConfig, TNode};
use corelm_topo::Topology;
use std::io::Write;

/// Options of `corelm topo --explore`.
pub struct Explore {
    pub model: std::path::PathBuf,
    pub prompt: usize,
    pub steps: usize,
}

/// This machine's profile, measured: bandwidth at 1 thread and at every core, the barrier, and
/// one core's FLOP/s on a prefill pass of `engine`'s model.
fn measure(topo: &Topology, engine: &mut corelm_engine::Engine, w: &sandwich::Workload) -> Result<MachineProfile> {
    use corelm_engine::bench::{barrier_ns, memory_bandwidth, run_test};
    let n = topo.n_cores().max(1);
    let one = memory_bandwidth(1, 512 << 20, 3) / 1e9;
    let all = memory_bandwidth(n, 512 << 20, 3) / 1e9;
    let (pp, _, _, _) = run_test(engine, 0, 128, 0, 2)?;
    let threads = engine.config().n_threads as f64;
    Ok(MachineProfile {
        name: "this machine (measured)".into(),
        core_gflops: pp * w.flops_per_token / 1e9 / threads,
        core_gbps: one,
        node_gbps: all / topo.nodes.len() as f64,
        remote_ratio: 0.5, // not measurable on one node; what two-socket machines show
        cluster: None,
        barrier_ns: barrier_ns(2.min(n), 20_000),
        barrier_ns_per_doubling: 100.0,
        barrier_ns_cross_node: 400.0,
    })
}

/// The profile the model is fed: the stated one of a snapshot (`spec`'s file stem), or for
/// this machine (`spec` none) one measured now.
pub fn profile(spec: Option<&str>, topo: &Topology, engine: &mut corelm_engine::Engine, w: &sandwich::Workload) -> Result<MachineProfile> {
    Ok(match spec {
        Some(s) => {
            let stem = std::path::Path::new(s).file_stem().and_then(|x| x.to_str()).unwrap_or(s);
            match MachineProfile::stated(stem) {
                Some(p) => p,
                None => bail!(
                    "no stated profile for {s}: stated ones exist for the snapshots in fixtures/topo/ (kunpeng920-4p, epyc7h12-2p, xeon6230-2p, xeon6151-2p, xeon8272cl-2p); without --topology this machine is measured"
                ),
            }
        }
        None => measure(topo, engine, w)?,
    })
}

pub fn explore(spec: Option<&str>, topo: &Topology, opts: &Explore) -> Result<()> {
    let cfg = corelm_engine::EngineConfig { n_ctx: 512, n_batch: 128, n_seq_max: 1, pin: false, ..Default::default() };
    let mut engine = corelm_engine::Engine::load(&opts.model, cfg).with_context(|| format!("loading {}", opts.model.display()))?;
    // Plan the one-token graph, whose nodes per layer the workload counts.
    engine.feed(0, &[1], false, |_| {})?;
    engine.clear_all();
    let w = corelm_engine::bench::workload(&engine);
    let prof = profile(spec, topo, &mut engine, &w)?;
    let h = engine.hyper();
    let lim = sandwich::Limits::for_model(h.n_head, 0);
    let tree = TNode::from_topology(topo);
    let mut out = std::io::stdout().lock();
    writeln!(out, "TopoTree ({} cores, height {}):\n{tree}", tree.n_cores(), tree.height())?;
    writeln!(
        out,
        "profile {}: {:.0} GFLOP/s and {:.1} GB/s per core, {:.0} GB/s per node, remote {:.2}×; workload {}: {:.1} MB and {:.2} GFLOP per token, {} layers of {} nodes",
        prof.name, prof.core_gflops, prof.core_gbps, prof.node_gbps, prof.remote_ratio,
        h.arch, w.weight_bytes / 1e6, w.flops_per_token / 1e9, w.layers, w.nodes_per_layer
    )?;
    for (phase, tokens) in [("decode", 1), ("prefill", opts.prompt)] {
        let t0 = std::time::Instant::now();
        let score = |c: &ServiceConfig| sandwich::pass_seconds(topo, &prof, &w, c, tokens);
        let ex = sandwich::explore(tree.clone(), opts.steps, 50_000, |t| {
            sandwich::search(&sandwich::configs(t, &lim), 0, score).best.map_or(f64::INFINITY, |b| b.1)
        });
        let all = sandwich::dedup(ex.trees.iter().flat_map(|e| sandwich::configs(&e.tree, &lim)));
        let mut ranked: Vec<(f64, &ServiceConfig)> = all.iter().map(|c| (score(c), c)).collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
        writeln!(
            out,
            "\n{phase} ({tokens} rows per pass): {} trees explored ({} duplicate shapes, {} pruned), {} configurations, {:.0} ms; best by the model (modelled, not measured):",
            ex.trees.len(), ex.duplicates, ex.pruned, all.len(), 1e3 * t0.elapsed().as_secs_f64()
        )?;
        for (s, c) in ranked.iter().take(5) {
            writeln!(out, "  {:>9.3} ms/pass  {}", 1e3 * s, c.describe())?;
        }
    }
    Ok(())
}
