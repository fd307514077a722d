//! `corelm plan`: a Sandwich plan file in words (`--plan`), or SMEPilot's per-operator plan of a
//! model's prefill and decode graphs on this machine's roofline (`--model`, `--profile`), drawn
//! with `--svg`.

use anyhow::{bail, Context, Result};
use corelm_plan::planner::{plan_graph, summarize, OpPlan, Placement, Regime};
use corelm_plan::Roofline;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct PlanArgs {
    /// A plan file of `corelm tune` to explain.
    #[arg(long)]
    plan: Option<PathBuf>,
    /// The model whose graphs are planned on the roofline (default: SmolLM2).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// A roofline profile (`corelm profile -o`, fixtures/profiles/); default: this machine's
    /// cached one, measured if absent.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Prompt length of the prefill graph, and cached tokens the decode graph's attention reads.
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Draw the roofline with every operator as a point (SVG).
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// The target, or the split's shares and (for a matmul) each target's output range along the
/// cut dimension (`sme cols 0..8776`).
fn placement(p: &OpPlan) -> String {
    match &p.placement {
        Placement::On(t) => t.clone(),
        Placement::Split(s) if !p.tiles.is_empty() => {
            // Cut by columns: the column ranges add up to the whole width.
            let by_cols = p.tiles.iter().map(|u| u.cols.len()).sum::<usize>() == p.tiles.iter().map(|u| u.cols.end).max().unwrap_or(0);
            p.tiles
                .iter()
                .map(|t| {
                    let x = s.iter().find(|(n, _)| n == &t.name).map_or(0.0, |v| v.1);
                    let (dim, r) = if by_cols { ("cols", &t.cols) } else { ("rows", &t.rows) };
                    format!("{} {:.0}% ({dim} {}..{})", t.name, 100.0 * x, r.start, r.end)
                })
                .collect::<Vec<_>>()
                .join(" + ")
        }
        Placement::Split(s) => s.iter().map(|(t, x)| format!("{t} {:.0}%", 100.0 * x)).collect::<Vec<_>>().join(" + "),
    }
}

fn table(title: &str, plans: &[OpPlan]) -> String {
    let total: f64 = plans.iter().map(|p| p.seconds).sum();
    let mut used: Vec<&str> = plans.iter().map(|p| p.family.as_str()).collect();
    used.sort_unstable();
    used.dedup();
    let mut s = format!(
        "\n{title}: {} operators, modelled {:.3} ms per pass (ceilings used: {})\n",
        plans.len(),
        1e3 * total,
        used.join(", ")
    );
    s += "| operator | count | GFLOP | MB | FLOP/byte | regime | target | threads | modelled ms | share |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for (p, n, f, b, sec) in summarize(plans) {
        let regime = match p.regime {
            Regime::Memory => "memory",
            Regime::Ridge => "ridge",
            Regime::Compute => "compute",
        };
        s += &format!(
            "| {} | {n} | {:.3} | {:.2} | {:.2} | {regime} | {} | {} | {:.3} | {:.1}% |\n",
            p.label,
            f / 1e9,
            b / 1e6,
            f / b.max(1.0),
            placement(&p),
            p.threads,
            1e3 * sec,
            100.0 * sec / total.max(1e-12)
        );
    }
    // MoE matmuls: where an expert runs by the pairs routed to it (one line per matrix shape).
    let mut seen: Vec<&str> = Vec::new();
    for p in plans {
        let Some(rule) = p.experts.as_ref().filter(|_| !seen.contains(&p.label.as_str())) else { continue };
        seen.push(&p.label);
        let steps: Vec<String> = rule
            .steps
            .iter()
            .enumerate()
            .map(|(i, (from, at))| {
                let to = rule.steps.get(i + 1).map_or(String::from("+"), |(next, _)| if next - 1 > *from { format!("–{}", next - 1) } else { String::new() });
                let at = match at {
                    Placement::On(t) => t.clone(),
                    Placement::Split(sh) => sh.iter().map(|(t, x)| format!("{t} {:.0}%", 100.0 * x)).collect::<Vec<_>>().join(" + "),
                };
                format!("{from}{to} → {at}")
            })
            .collect();
        s += &format!("experts of {} by routed pairs: {}\n", p.label, steps.join("; "));
    }
    // Attention fused against pipelined (`--attn-pipeline`), summed over the pass's nodes.
    let piped: Vec<_> = plans.iter().filter_map(|p| p.pipeline.as_ref()).collect();
    if let Some(first) = piped.first() {
        let (fused, pipe) = piped.iter().fold((0.0, 0.0), |(f, q), a| (f + a.fused_seconds, q + a.pipelined_seconds));
        let verdict = if pipe < (1.0 - corelm_plan::planner::MIN_GAIN) * fused { "pays" } else { "does not pay" };
        s += &format!(
            "attention with its softmax ({} FLOPs per row, head and cell) as a pipeline, QKᵀ and PV on {} and the softmax on {}: modelled {:.3} ms against {:.3} ms fused — {verdict}\n",
            corelm_plan::planner::SOFTMAX_FLOPS,
            first.matrix,
            first.vector,
            1e3 * pipe,
            1e3 * fused
        );
    }
    s
}

pub fn plan(a: &PlanArgs) -> Result<()> {
    if let Some(p) = &a.plan {
        if a.model.is_some() || a.profile.is_some() {
            bail!("--plan explains a plan file; --model/--profile plan a model on a roofline: one or the other");
        }
        print!("{}", corelm_engine::plan::Plan::load(p)?.explain());
        return Ok(());
    }
    let roof = match &a.profile {
        Some(p) => Roofline::load(p)?,
        None => crate::profile::this_machine(false)?,
    };
    let model = crate::resolve_model(&a.model)?;
    let n = a.prompt.max(1);
    let cfg = corelm_engine::EngineConfig { n_ctx: n.max(a.ctx) + 16, n_batch: n, n_seq_max: 1, pin: false, ..Default::default() };
    let mut engine = corelm_engine::Engine::load(&model, cfg).with_context(|| format!("loading {}", model.display()))?;
    println!("{} on {} ({})", model.display(), roof.machine, roof.source);
    let prefill = plan_graph(engine.graph(n, 1), &roof, n / 2);
    let decode = plan_graph(engine.graph(1, 1), &roof, a.ctx);
    print!("{}", table(&format!("prefill of {n} tokens"), &prefill));
    print!("{}", table(&format!("decode at {} cached tokens", a.ctx), &decode));
    if let Some(out) = &a.svg {
        draw(&roof, &[("prefill", &prefill), ("decode", &decode)], out)?;
        eprintln!("roofline drawn to {}", out.display());
    }
    Ok(())
}

type Area<'a> = plotters::drawing::DrawingArea<plotters::backend::SVGBackend<'a>, plotters::coord::Shift>;

/// The roofline on log-log axes: each target's roof per family, every distinct operator a point
/// (prefill blue, decode red) at its intensity and attainable rate.
fn draw(roof: &Roofline, phases: &[(&str, &[OpPlan])], out: &Path) -> Result<()> {
    use plotters::prelude::*;
    let (w, h) = (900i32, 560i32);
    let (x0, x1, y0, y1) = (70i32, w - 30, 40i32, h - 50);
    let (lx0, lx1) = (-2.0f64, 4.0f64); // FLOP/byte 0.01 .. 10^4
    let top = roof.targets.iter().flat_map(|t| t.ceilings.iter().map(|c| c.all_workers_gflops)).chain(roof.combined.iter().map(|c| c.gflops)).fold(1.0, f64::max);
    let (ly0, ly1) = (-1.0f64, top.log10().ceil() + 0.3);
    let px = |ai: f64| x0 + ((ai.max(1e-9).log10() - lx0) / (lx1 - lx0) * (x1 - x0) as f64) as i32;
    let py = |g: f64| y1 - ((g.max(1e-9).log10() - ly0) / (ly1 - ly0) * (y1 - y0) as f64) as i32;
    let area = SVGBackend::new(out, (w as u32, h as u32)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", out.display());
    area.fill(&WHITE).map_err(|e| err(&e))?;
    let font = ("sans-serif", 12).into_font();
    let d = |e: &dyn Fn(&Area) -> Result<(), String>| e(&area).map_err(|x| err(&x));
    d(&|a| a.draw(&Rectangle::new([(x0, y0), (x1, y1)], BLACK.stroke_width(1))).map_err(|e| e.to_string()))?;
    // Decade ticks.
    for k in lx0 as i32..=lx1 as i32 {
        let x = px(10f64.powi(k));
        d(&|a| a.draw(&Text::new(format!("1e{k}"), (x - 10, y1 + 8), font.clone())).map_err(|e| e.to_string()))?;
    }
    for k in ly0 as i32..=ly1 as i32 {
        let y = py(10f64.powi(k));
        d(&|a| a.draw(&Text::new(format!("1e{k}"), (x0 - 40, y - 6), font.clone())).map_err(|e| e.to_string()))?;
    }
    d(&|a| a.draw(&Text::new("FLOP/byte".to_string(), ((x0 + x1) / 2, h - 22), font.clone())).map_err(|e| e.to_string()))?;
    d(&|a| a.draw(&Text::new(format!("GFLOP/s — roofline of {} ({})", roof.machine, roof.source.split([' ', ':']).next().unwrap_or("")), (x0, 12), font.clone())).map_err(|e| e.to_string()))?;
    // Roofs: min(ceiling, AI × bandwidth alone).
    let palette = [RGBColor(31, 119, 180), RGBColor(44, 160, 44), RGBColor(148, 103, 189), RGBColor(140, 86, 75)];
    let mut li = 0;
    for t in &roof.targets {
        let bw = roof.memory.per_target_gbps.iter().find(|(n, _)| n == &t.name).map_or(roof.memory.all_busy_gbps, |x| x.1);
        for c in &t.ceilings {
            let col = palette[li % palette.len()];
            let ridge = c.all_workers_gflops / bw;
            let pts = vec![(px(10f64.powf(lx0)), py(10f64.powf(lx0) * bw)), (px(ridge), py(c.all_workers_gflops)), (x1, py(c.all_workers_gflops))];
            let label = format!("{} {} {:.0}", t.name, c.family, c.all_workers_gflops);
            let y = y1 - 24 - 14 * li as i32;
            d(&|a| {
                a.draw(&PathElement::new(pts.clone(), col.stroke_width(2))).map_err(|e| e.to_string())?;
                a.draw(&Text::new(label.clone(), (x1 - 200, y), font.clone().color(&col))).map_err(|e| e.to_string())
            })?;
            li += 1;
        }
    }
    // Operators.
    for (i, (name, plans)) in phases.iter().enumerate() {
        let col = if i == 0 { RGBColor(31, 119, 180) } else { RGBColor(214, 39, 40) };
        for (p, ..) in summarize(plans) {
            let (x, y) = (px(p.intensity()), py(p.gflops));
            d(&|a| a.draw(&Circle::new((x, y), 4, col.filled())).map_err(|e| e.to_string()))?;
        }
        let y = y1 - 20 - 14 * i as i32;
        d(&|a| a.draw(&Text::new(format!("● {name} operators"), (x0 + 10, y), font.clone().color(&col))).map_err(|e| e.to_string()))?;
    }
    area.present().map_err(|e| err(&e))?;
    Ok(())
}
