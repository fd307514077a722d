//! `corelm topo`: print the hardware tree, and with `--explore` run Sandwich's configuration
//! search on it (TopoTree transforms, cross-sections, the latency model) for decode and prefill.
//!
//! The profile the model is fed: for a shipped snapshot its stated one
//! (`MachineProfile::stated`, by file stem); for this machine one measured here — read bandwidth
//! of one core and of all, the pool's barrier, and one core's compute from a timed prefill pass
//! of the model (up to 128 tokens). The workload is the model's (`corelm_engine::bench::workload`).

use anyhow::{bail, Context, Result};
use corelm_topo::sandwich::{self, MachineProfile, ServiceConfig, TNode};
use corelm_topo::Topology;
use std::io::Write;
use std::path::Path;

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
    let cores = topo.n_cores().max(1);
    let one = memory_bandwidth(1, 512 << 20, 3) / 1e9;
    let all = memory_bandwidth(cores, 512 << 20, 3) / 1e9;
    // A prompt pass as long as the engine's context and batch allow, up to 128 tokens.
    let tokens = 128.min(engine.config().n_batch).min(engine.config().n_ctx / 2).max(1);
    let (pp, _, _, _) = run_test(engine, 0, tokens, 0, 2)?;
    let threads = engine.config().n_threads as f64;
    Ok(MachineProfile {
        name: "this machine (measured)".into(),
        core_gflops: pp * w.flops_per_token / 1e9 / threads,
        core_gbps: one,
        node_gbps: all / topo.nodes.len() as f64,
        remote_ratio: 0.5, // not measurable on one node; what two-socket machines show
        cluster: None,
        barrier_ns: barrier_ns(2.min(cores), 20_000),
        barrier_ns_per_doubling: 100.0,
        barrier_ns_cross_node: 400.0,
    })
}

/// The profile the model is fed: the stated one of a snapshot (`spec`'s file stem), or for
/// this machine (`spec` none) one measured now.
fn profile(spec: Option<&str>, topo: &Topology, engine: &mut corelm_engine::Engine, w: &sandwich::Workload) -> Result<MachineProfile> {
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

/// `model` loaded for passes of up to `prompt` tokens, its workload, and the profile of the
/// machine (`spec`, or this one measured) the latency model is fed.
pub fn model_and_profile(
    model: &Path,
    spec: Option<&str>,
    topo: &Topology,
    prompt: usize,
) -> Result<(corelm_engine::Engine, sandwich::Workload, MachineProfile)> {
    let cfg = corelm_engine::EngineConfig { n_ctx: prompt + 64, n_batch: prompt.max(1), n_seq_max: 1, pin: false, ..Default::default() };
    let mut engine = corelm_engine::Engine::load(model, cfg).with_context(|| format!("loading {}", model.display()))?;
    // The one-token graph, whose nodes per layer the workload counts.
    engine.graph(1, 1);
    let w = corelm_engine::bench::workload(&engine);
    let prof = profile(spec, topo, &mut engine, &w)?;
    Ok((engine, w, prof))
}

/// The TP limits of the engine's model: its query heads, and its experts if it has them.
pub fn limits(engine: &corelm_engine::Engine) -> sandwich::Limits {
    let h = engine.hyper();
    let n_expert = engine.gguf().opt_u64(&format!("{}.expert_count", h.arch)).ok().flatten().unwrap_or(0) as usize;
    sandwich::Limits::for_model(h.n_head, n_expert)
}

pub fn explore(spec: Option<&str>, topo: &Topology, opts: &Explore) -> Result<()> {
    let (engine, w, prof) = model_and_profile(&opts.model, spec, topo, opts.prompt)?;
    let h = engine.hyper();
    let lim = limits(&engine);
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
        let (ex, all) = sandwich::candidates(tree.clone(), opts.steps, 50_000, &lim, score);
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

/// Units of width a node takes in the drawing: a node whose children are all cores is one box.
fn units(n: &TNode) -> usize {
    if n.is_leaf() || n.of_cores() {
        1
    } else {
        n.children.iter().map(units).sum()
    }
}

/// Box text of a node: its level and cores; for a box of cores, their PUs.
fn label(n: &TNode) -> (String, String) {
    let head = n.level_name();
    let numa = n.numa.map_or(String::new(), |i| format!(" · node {i}"));
    if n.of_cores() {
        let mut pus = n.pus();
        pus.sort_unstable();
        let span = match (pus.first(), pus.last()) {
            (Some(a), Some(b)) if pus.len() as u32 == b - a + 1 => format!("PUs {a}-{b}"),
            _ => format!("{} PUs", pus.len()),
        };
        return (format!("{head}{numa}"), format!("{} cores, {span}", n.children.len()));
    }
    (format!("{head}{numa}"), format!("{} cores", n.n_cores()))
}

/// Draw the TopoTree as an SVG file: one row per depth, boxes as wide as the cores they hold
/// (a box of only cores stands for all of them), colored by NUMA node.
pub fn draw_svg(tree: &TNode, path: &std::path::Path, title: &str) -> Result<()> {
    use plotters::prelude::*;
    const W: i32 = 150;
    const H: i32 = 46;
    const GAP: i32 = 44;
    let width = (units(tree) as i32 * W + 20).max(420);
    let depth = |n: &TNode| -> i32 {
        fn d(n: &TNode) -> i32 {
            if n.is_leaf() || n.of_cores() { 0 } else { 1 + n.children.iter().map(d).max().unwrap_or(0) }
        }
        d(n)
    };
    let height = 50 + (depth(tree) + 1) * (H + GAP);
    let root = SVGBackend::new(path, (width as u32, height as u32)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    root.draw(&Text::new(title.to_string(), (10, 10), ("sans-serif", 16).into_font())).map_err(|e| err(&e))?;
    let palette = [RGBColor(198, 219, 239), RGBColor(199, 233, 192), RGBColor(253, 208, 162), RGBColor(218, 218, 235), RGBColor(252, 187, 161), RGBColor(204, 236, 230), RGBColor(254, 230, 206), RGBColor(229, 216, 189)];
    // Depth-first: each node drawn in [x0, x0 + units · W) at its depth; returns its top centre.
    fn draw<DB: DrawingBackend>(
        area: &DrawingArea<DB, plotters::coord::Shift>,
        n: &TNode,
        x0: i32,
        level: i32,
        palette: &[RGBColor],
    ) -> Result<(i32, i32), String> {
        let w = units(n) as i32 * W;
        let y = 40 + level * (H + GAP);
        let fill = n.numa.map_or(RGBColor(230, 230, 230), |i| palette[i % palette.len()]);
        let (a, b) = (x0 + 6, x0 + w - 6);
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        area.draw(&Rectangle::new([(a, y), (b, y + H)], fill.filled())).map_err(e)?;
        area.draw(&Rectangle::new([(a, y), (b, y + H)], BLACK.stroke_width(1))).map_err(e)?;
        let (l1, l2) = label(n);
        area.draw(&Text::new(l1, (a + 6, y + 8), ("sans-serif", 12).into_font())).map_err(e)?;
        area.draw(&Text::new(l2, (a + 6, y + 26), ("sans-serif", 12).into_font())).map_err(e)?;
        if !(n.is_leaf() || n.of_cores()) {
            let mut cx = x0;
            for c in &n.children {
                let top = draw(area, c, cx, level + 1, palette)?;
                area.draw(&PathElement::new(vec![(x0 + w / 2, y + H), top], BLACK)).map_err(e)?;
                cx += units(c) as i32 * W;
            }
        }
        Ok((x0 + w / 2, y))
    }
    draw(&root, tree, 10, 0, &palette).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A two-node machine draws as a root and two boxes of cores, one colour per node.
    #[test]
    fn svg_has_a_box_per_node_and_its_cores() {
        let dir = std::env::temp_dir().join(format!("corelm-svg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        corelm_topo::sys::write_synthetic(&dir, 2, 4, 1).unwrap();
        let t = corelm_topo::sys::read(&dir, "synthetic").unwrap();
        let tree = super::TNode::from_topology(&t);
        let out = dir.join("tree.svg");
        super::draw_svg(&tree, &out, "test").unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("fill=\"none\" stroke=\"#000000\"").count(), 3, "three boxes");
        assert!(svg.contains("4 cores, PUs 0-3") && svg.contains("4 cores, PUs 4-7"), "{svg}");
        assert!(svg.contains("node 0") && svg.contains("node 1"));
    }
}
