//! `corelm tune`: Sandwich's search for one model on one machine, written as a plan file.
//!
//! 1. The TopoTree of the machine (or `--topology`) is explored with `group`/`remove`, trees
//!    scored by the latency model; every cross-section of every explored tree within the
//!    model's limits is a candidate (`corelm_topo::sandwich`).
//! 2. On this machine, candidates are *measured*: an engine is loaded on each one's cores
//!    and groups, and a `--prompt`-token prefill pass and single-token decode passes (after that
//!    prompt) are timed, best of `--reps`. Candidates go in the model's order, class by class
//!    (TP degree, NUMA-local), and a class stops after `--patience` measurements that did not
//!    beat its best. With `--topology` (another machine) the model's times stand in, and the
//!    plan says `modelled`.
//! 3. `Plan::choose` picks the prefill and decode configurations (same TP degree, decode
//!    groups inside the prefill ones) with the shortest request and where they cross.
//! 4. The prefill matmul schedules (`--gemm`), on the prefill configuration's workers.
//! 5. The accelerator (`--accel`): passes of 1, 2, 4, … `--prompt` tokens timed on the chosen
//!    CPU configurations, then with the model's first layers whole on the device, longest
//!    first until the CPU wins one; `AccelPlan::choose` keeps the device from where the two
//!    cross (on a discrete GPU: prefill there, decode on the CPU).

use anyhow::{bail, Context, Result};
use corelm_engine::plan::{AccelPlan, AccelPoint, Candidate, Plan};
use corelm_engine::{Engine, EngineConfig};
use corelm_topo::sandwich::{self, ServiceConfig, TNode};
use corelm_topo::Topology;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct TuneArgs {
    /// GGUF file (default: SmolLM2 from the model cache).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Plan for another machine (hwloc XML, synthetic description, or /sys copy) with the
    /// latency model instead of measuring here.
    #[arg(long)]
    topology: Option<String>,
    /// The plan file to write.
    #[arg(short, long, default_value = "corelm-plan.json")]
    out: PathBuf,
    /// Prompt tokens of the prefill pass timed, and generated tokens a request weighs.
    #[arg(long, default_value_t = 128)]
    prompt: usize,
    #[arg(long, default_value_t = 128)]
    gen: usize,
    /// Transforms deep the tree search goes.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Measurements per (TP degree, NUMA-local) class that may miss its best before the class stops.
    #[arg(long, default_value_t = 3)]
    patience: usize,
    /// Most candidates measured.
    #[arg(long, default_value_t = 24)]
    max_measured: usize,
    /// Repetitions per timing (best kept).
    #[arg(short, long, default_value_t = 2)]
    reps: usize,
    /// Sequence lengths the prefill matmul schedules are tuned at (comma-separated, ascending;
    /// `0` skips the GEMM tuning). Shorter passes take the first length's schedule, except single
    /// rows (decode's GEMV), which take none.
    #[arg(long, default_value = "8,16,32,64,128,256,512", value_delimiter = ',')]
    gemm: Vec<usize>,
    /// Which matmul paths to tune: tiles (the default kernels, bit-identical to llama.cpp),
    /// panel (the panel GEMM of --fast-prefill), or both.
    #[arg(long, default_value = "both", value_parser = ["tiles", "panel", "both"])]
    gemm_path: String,
    /// Micro-kernel heights timed around the previous length's best (σ).
    #[arg(long, default_value_t = 3)]
    gemm_window: usize,
    /// Keep the previous length's schedule without a search when its gain over the default is
    /// within this fraction of the average gain so far (negative: search every length).
    #[arg(long, default_value_t = 0.05, allow_hyphen_values = true)]
    gemm_reuse: f64,
    /// Times each winner (searched, or reused from the previous length) and the default are
    /// timed again, alternately, before the winner is kept (0: keep the pick unconfirmed).
    #[arg(long, default_value_t = 2)]
    gemm_confirm: usize,
    /// Time the model's layers on an accelerator against the CPU and put it in the plan where
    /// it wins: auto (a GPU, not a software renderer such as lavapipe), on (whatever adapter
    /// wgpu finds; an error without one), off.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    accel: String,
}

impl TuneArgs {
    pub fn model_path(&self) -> Option<PathBuf> {
        self.model.clone()
    }
}

/// Time `c` on this machine: a prefill pass of `prompt` tokens and a single-token decode pass.
fn measure(model: &std::path::Path, c: &ServiceConfig, prompt: usize, reps: usize) -> Result<(f64, f64)> {
    let plan = Plan { source: "measured".into(), prompt, ..Plan::with_configs(c.clone(), c.clone(), 1) };
    let cfg = EngineConfig { n_ctx: prompt + 64, n_batch: prompt.max(1), n_seq_max: 1, tp: 0, plan: Some(plan), ..Default::default() };
    let mut engine = Engine::load(model, cfg)?;
    Ok((pass_seconds(&mut engine, prompt, prompt, reps)?, pass_seconds(&mut engine, 1, prompt, reps)?))
}

/// Seconds of one pass of `n` tokens (`bench::run_test`'s mean of `reps` runs after a warm-up
/// one): a prefill of `n` from an empty cache, or for `n` = 1 a decode step after a
/// `prompt`-token prompt (16 steps a run).
fn pass_seconds(engine: &mut Engine, n: usize, prompt: usize, reps: usize) -> Result<f64> {
    Ok(if n == 1 {
        1.0 / corelm_engine::bench::run_test(engine, prompt, 0, 16, reps)?.0
    } else {
        n as f64 / corelm_engine::bench::run_test(engine, 0, n, 0, reps)?.0
    })
}

pub fn tune(a: &TuneArgs, model: PathBuf) -> Result<()> {
    let t0 = std::time::Instant::now();
    let topo = Topology::load_or_discover(a.topology.as_deref())?;
    let (engine, w, prof) = crate::topo::model_and_profile(&model, a.topology.as_deref(), &topo, a.prompt)?;
    let lim = crate::topo::limits(&engine);
    drop(engine);
    let modelled = |c: &ServiceConfig| {
        (sandwich::pass_seconds(&topo, &prof, &w, c, a.prompt), sandwich::pass_seconds(&topo, &prof, &w, c, 1))
    };
    let request = |(p, d): (f64, f64)| p + a.gen as f64 * d;
    // 1. Candidates from the explored trees, in the model's order.
    let (ex, mut all) = sandwich::candidates(TNode::from_topology(&topo), a.steps, 50_000, &lim, |c| request(modelled(c)));
    all.sort_by(|x, y| request(modelled(x)).total_cmp(&request(modelled(y))));
    eprintln!(
        "{}: {} trees explored ({} duplicate shapes, {} pruned), {} candidate configurations",
        topo.source,
        ex.trees.len(),
        ex.duplicates,
        ex.pruned,
        all.len()
    );
    // 2. Times: measured here, or modelled for another machine.
    let measured = a.topology.is_none();
    let mut times: HashMap<Vec<Vec<u32>>, (f64, f64)> = HashMap::new();
    if measured {
        all.truncate(a.max_measured);
        let bar = indicatif::ProgressBar::new(all.len() as u64);
        bar.set_style(indicatif::ProgressStyle::with_template("measuring {bar:30} {pos}/{len} {msg}").expect("a valid template"));
        let s = sandwich::search(&all, a.patience, |c| {
            bar.set_message(c.describe().chars().take(60).collect::<String>());
            let r = match measure(&model, c, a.prompt, a.reps) {
                Ok(t) => {
                    times.insert(c.key(), t);
                    request(t)
                }
                Err(e) => {
                    bar.println(format!("  skipped {}: {e:#}", c.describe()));
                    f64::INFINITY
                }
            };
            bar.inc(1);
            r
        });
        bar.finish_and_clear();
        eprintln!("measured {} configurations, {} skipped by early stopping", s.scored, s.skipped);
    } else {
        for c in &all {
            times.insert(c.key(), modelled(c));
        }
    }
    let mut candidates: Vec<Candidate> = all
        .iter()
        .filter_map(|c| times.get(&c.key()).map(|&(p, d)| Candidate { config: c.clone(), prefill_s: p, decode_s: d }))
        .collect();
    candidates.sort_by(|x, y| request((x.prefill_s, x.decode_s)).total_cmp(&request((y.prefill_s, y.decode_s))));
    // 3. The pair.
    let (i, j, min) = Plan::choose(&candidates, a.prompt, a.gen).context("no candidate configuration could be timed")?;
    let mut plan = Plan {
        cpu: if measured { crate::profile::cpu_model() } else { prof.name.clone() },
        topology: topo.source.clone(),
        model: model.file_name().map_or("model".into(), |f| f.to_string_lossy().into_owned()),
        source: if measured { "measured" } else { "modelled" }.into(),
        prompt: a.prompt,
        gen: a.gen,
        prefill: candidates[i].config.clone(),
        decode: candidates[j].config.clone(),
        prefill_min_tokens: min,
        candidates,
        gemm_isa: String::new(),
        gemm_threads: 0,
        gemm_tuning_s: 0.0,
        gemm: Vec::new(),
        accel: None,
    };
    if measured && a.gemm.iter().any(|&m| m >= 2) {
        tune_gemm(a, &model, &mut plan)?;
    }
    if measured {
        // Whole layers on the device run without tensor parallelism: with them, the CPU's part
        // runs on the best one-group pair, which replaces the plan's where the device wins.
        let single = match plan.prefill.tp() {
            1 => Some(plan.clone()),
            _ => {
                let one: Vec<Candidate> = plan.candidates.iter().filter(|c| c.config.tp() == 1).cloned().collect();
                Plan::choose(&one, a.prompt, a.gen).map(|(i, j, min)| Plan { prefill: one[i].config.clone(), decode: one[j].config.clone(), prefill_min_tokens: min, ..plan.clone() })
            }
        };
        if let Some(accel) = tune_accel(a, &model, &plan, single.as_ref())? {
            if let (true, Some(single)) = (accel.layers > 0, single) {
                plan = single;
            }
            plan.accel = Some(accel);
        }
    }
    plan.save(&a.out)?;
    print!("{}", plan.explain());
    println!("Written to {} in {:.1} s; use it with --plan {0} on run, bench, perplexity and serve.", a.out.display(), t0.elapsed().as_secs_f64());
    Ok(())
}

/// Step 4: the prefill matmul schedules (`corelm_plan::gemm_search`) of every distinct matrix
/// of the model, on the plan's prefill workers, for each path asked for; the result and each
/// matrix's gain over the default schedules go into the plan and on stderr.
fn tune_gemm(a: &TuneArgs, model: &std::path::Path, plan: &mut Plan) -> Result<()> {
    use corelm_plan::gemm_search::{search, Options, Space};
    let t0 = std::time::Instant::now();
    let mut lengths: Vec<usize> = a.gemm.iter().copied().filter(|&m| m >= 2).collect();
    lengths.sort_unstable();
    lengths.dedup();
    let max_len = *lengths.last().expect("checked by the caller");
    let paths: &[bool] = match a.gemm_path.as_str() {
        "tiles" => &[false],
        "panel" => &[true],
        _ => &[false, true],
    };
    let opts = Options { window: a.gemm_window, reuse: a.gemm_reuse, confirm: a.gemm_confirm, ..Options::default() };
    for &panel in paths {
        let cfg = EngineConfig { n_ctx: max_len + 16, n_batch: max_len, n_seq_max: 1, tp: 0, plan: Some(plan.clone()), fast_prefill: panel, ..Default::default() };
        let mut engine = Engine::load(model, cfg)?;
        plan.gemm_isa = engine.kernels().isa().name().into();
        plan.gemm_threads = engine.gemm_workers();
        // The panel engine's matrices without a panel (tensor-parallel slices) run the tiles,
        // already tuned with the other engine.
        let shapes: Vec<_> = engine.gemm_shapes().into_iter().filter(|s| (s.path == corelm_engine::gemm_tune::Path::Panel) == panel).collect();
        let bar = indicatif::ProgressBar::new((shapes.len() * lengths.len()) as u64);
        bar.set_style(indicatif::ProgressStyle::with_template("tuning GEMMs {bar:30} {pos}/{len} {msg}").expect("a valid template"));
        for shape in &shapes {
            bar.set_message(shape.label());
            // The start: what this matrix runs untuned (AMX's own default on the AMX table).
            let start = if panel { corelm_kernels::matmul::gemm::default_schedule(engine.kernels().isa(), shape.dtype) } else { corelm_plan::gemm_search::default_schedule(false) };
            let space = Space { panel, nth: plan.gemm_threads, n_out: shape.n_out, nb: shape.k / 32, max_nc: corelm_engine::gemm_tune::MAX_NC, start };
            let tuned = search(&lengths, &space, &opts, &mut |m, s| {
                let t = engine.time_gemm(shape, m, s, a.reps);
                if *s == start {
                    bar.inc(1);
                }
                t
            });
            let gains: Vec<String> = tuned.iter().map(|t| format!("{}:{:.2}{}", t.rows, t.gain(), if t.reused { "r" } else { "" })).collect();
            bar.suspend(|| eprintln!("  {} (×{} per pass): gain per length {}", shape.label(), shape.per_pass, gains.join(" ")));
            for t in &tuned {
                plan.gemm.push(corelm_engine::plan::GemmPlan::from_tuned(shape.path, shape.dtype, shape.k, shape.n_out, t));
            }
        }
        bar.finish_and_clear();
    }
    plan.gemm_tuning_s = t0.elapsed().as_secs_f64();
    Ok(())
}

/// Step 5: the accelerator's layers, their CPU part on `single` (the best pair without tensor
/// parallelism), against the plan's CPU configurations, pass length by pass length; `None`
/// where none was timed (`--accel off`, no adapter or a software one under `auto`, no
/// one-group candidate, a model none of whose layers can go).
fn tune_accel(a: &TuneArgs, model: &std::path::Path, plan: &Plan, single: Option<&Plan>) -> Result<Option<AccelPlan>> {
    let skip = |why: String| -> Result<Option<AccelPlan>> {
        if a.accel == "on" {
            bail!("--accel on: {why}");
        }
        eprintln!("accelerator not timed: {why}");
        Ok(None)
    };
    if a.accel == "off" {
        return Ok(None);
    }
    let Some(single) = single else {
        return skip("whole layers on the accelerator run without tensor parallelism, and no one-group configuration could be timed".into());
    };
    let device = match corelm_accel::Gpu::open() {
        Ok(g) if g.is_software() && a.accel == "auto" => return skip(format!("{} renders in software (--accel on times it anyway)", g.name())),
        Ok(g) => g.name(),
        Err(e) => return skip(e.to_string()),
    };
    // 1, 2, 4, … below the prompt, then the prompt.
    let mut lengths: Vec<usize> = std::iter::successors(Some(1usize), |n| Some(n * 2)).take_while(|&n| n < a.prompt).collect();
    lengths.push(a.prompt.max(1));
    let config = |plan: &Plan, layers| EngineConfig {
        n_ctx: a.prompt + 64,
        n_batch: a.prompt.max(1),
        n_seq_max: 1,
        tp: 0,
        plan: Some(Plan { accel: None, ..plan.clone() }),
        accel_layers: layers,
        ..Default::default()
    };
    let bar = indicatif::ProgressBar::new(2 * lengths.len() as u64);
    bar.set_style(indicatif::ProgressStyle::with_template("timing the accelerator {bar:30} {pos}/{len} {msg}").expect("a valid template"));
    let mut cpu = Engine::load(model, config(plan, 0))?;
    let layers = cpu.device_capable_layers();
    if layers == 0 {
        bar.finish_and_clear();
        return skip(format!("no layer of this {} model can run on the accelerator", cpu.hyper().arch));
    }
    let mut cpu_s = Vec::with_capacity(lengths.len());
    for &n in &lengths {
        bar.set_message(format!("CPU, {n} tokens"));
        cpu_s.push(pass_seconds(&mut cpu, n, a.prompt, a.reps)?);
        bar.inc(1);
    }
    drop(cpu);
    // Longest first, stopping at the first length the CPU wins: the device runs from a
    // threshold up, so shorter lengths cannot change the choice (and a device that loses the
    // prompt pass costs one pass to rule out).
    let mut dev = Engine::load(model, config(single, layers)).with_context(|| format!("{layers} layers on {device}"))?;
    let mut points = Vec::with_capacity(lengths.len());
    for (&n, &cpu_s) in lengths.iter().zip(&cpu_s).rev() {
        bar.set_message(format!("{layers} layers on the device, {n} tokens"));
        let p = AccelPoint { tokens: n, cpu_s, device_s: pass_seconds(&mut dev, n, a.prompt, a.reps)? };
        points.push(p);
        bar.inc(1);
        if p.device_s >= p.cpu_s {
            break;
        }
    }
    bar.finish_and_clear();
    points.reverse();
    Ok(Some(AccelPlan::choose(device, layers, points)))
}
