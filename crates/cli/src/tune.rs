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
//!    plan says `modelled`. The finalists (`Plan::finalists`: the `--confirm-top` shortest
//!    requests, the fastest prefill, the fastest decode, the pair chosen, the default) are
//!    loaded side by side and timed again in `--confirm` interleaved rounds, each round in a
//!    rotated order; times within rounds replace the single measurements, which on a shared or
//!    virtual machine differ from run to run by more than the candidates differ.
//! 3. `Plan::choose_confirmed` picks the prefill and decode configurations (same TP degree,
//!    decode groups inside the prefill ones) with the shortest request and where they cross,
//!    and keeps the default (one group of every core) unless that pair beat it in 4 of 5 rounds.
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
    /// Interleaved rounds the finalists are timed again in before the choice, which then takes
    /// their medians (0: choose from the search's single measurements).
    #[arg(long, default_value_t = 5)]
    confirm: usize,
    /// Shortest requests among the finalists (with the fastest prefill and decode configurations
    /// and the pair the search chose); they are loaded side by side while confirmed.
    #[arg(long, default_value_t = 2)]
    confirm_top: usize,
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

/// An engine on `c` alone (both phases), sized for a `prompt`-token pass and the decode after it.
fn load_on(model: &std::path::Path, c: &ServiceConfig, prompt: usize) -> Result<Engine> {
    let plan = Plan { source: "measured".into(), prompt, ..Plan::with_configs(c.clone(), c.clone(), 1) };
    let cfg = EngineConfig { n_ctx: prompt + 64, n_batch: prompt.max(1), n_seq_max: 1, tp: 0, plan: Some(plan), ..Default::default() };
    Ok(Engine::load(model, cfg)?)
}

/// Time `c` on this machine: a prefill pass of `prompt` tokens and a single-token decode pass.
fn measure(model: &std::path::Path, c: &ServiceConfig, prompt: usize, reps: usize) -> Result<(f64, f64)> {
    let mut engine = load_on(model, c, prompt)?;
    Ok((pass_seconds(&mut engine, prompt, prompt, reps)?, pass_seconds(&mut engine, 1, prompt, reps)?))
}

/// Step 2's confirmation: the finalists loaded side by side and timed `a.confirm` times each,
/// round by round, the order rotated every round. Each finalist's pass times become the first
/// finalist's median times scaled by the median of its ratios to the first one *within* rounds:
/// the machine's drift from minute to minute (10–25 % on the development VMs) meets every
/// finalist of a round alike and cancels in those ratios. Returns the finalists (indices into
/// `candidates`) and each round's times of them, for [`Plan::choose_confirmed`].
fn confirm(a: &TuneArgs, model: &std::path::Path, candidates: &mut [Candidate], default: Option<usize>) -> Result<(Vec<usize>, Rounds)> {
    let finalists = Plan::finalists(candidates, a.prompt, a.gen, a.confirm_top, default);
    if a.confirm == 0 || finalists.len() < 2 {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut engines = Vec::with_capacity(finalists.len());
    for &i in &finalists {
        let c = &candidates[i].config;
        engines.push(load_on(model, c, a.prompt).with_context(|| format!("loading {} again to confirm its times", c.describe()))?);
    }
    let n = finalists.len();
    let bar = indicatif::ProgressBar::new((n * a.confirm) as u64);
    bar.set_style(indicatif::ProgressStyle::with_template("confirming {bar:30} {pos}/{len} {msg}").expect("a valid template"));
    // [round][finalist] → (prefill s, decode s)
    let mut rounds = vec![vec![(0.0, 0.0); n]; a.confirm];
    for (r, times) in rounds.iter_mut().enumerate() {
        for k in (0..n).map(|k| (r + k) % n) {
            bar.set_message(candidates[finalists[k]].config.describe().chars().take(60).collect::<String>());
            times[k] = (pass_seconds(&mut engines[k], a.prompt, a.prompt, 1)?, decode_seconds(&mut engines[k], a.prompt, CONFIRM_STEPS, 1)?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let first = |f: fn(&(f64, f64)) -> f64| median(&mut rounds.iter().map(|t| f(&t[0])).collect::<Vec<_>>());
    let (p0, d0) = (first(|t| t.0), first(|t| t.1));
    for (k, &i) in finalists.iter().enumerate() {
        let ratio = |f: fn(&(f64, f64)) -> f64| median(&mut rounds.iter().map(|t| f(&t[k]) / f(&t[0])).collect::<Vec<_>>());
        let c = &mut candidates[i];
        (c.prefill_s, c.decode_s, c.rounds) = (p0 * ratio(|t| t.0), d0 * ratio(|t| t.1), a.confirm);
    }
    Ok((finalists, rounds))
}

/// Per confirmation round, per finalist: (prefill seconds, decode seconds).
type Rounds = Vec<Vec<(f64, f64)>>;

/// Decode steps timed per confirmation sample: twice the search's, since a decode pass is a
/// few milliseconds and weighs `--gen` times in a request.
const CONFIRM_STEPS: usize = 32;

/// The middle of `x` (the mean of the two middle values for an even count); sorts `x`.
fn median(x: &mut [f64]) -> f64 {
    x.sort_by(f64::total_cmp);
    let h = x.len() / 2;
    if x.len() % 2 == 1 { x[h] } else { 0.5 * (x[h - 1] + x[h]) }
}

/// Seconds of one pass of `n` tokens (`bench::run_test`'s mean of `reps` runs after a warm-up
/// one): a prefill of `n` from an empty cache, or for `n` = 1 a decode step after a
/// `prompt`-token prompt (16 steps a run).
fn pass_seconds(engine: &mut Engine, n: usize, prompt: usize, reps: usize) -> Result<f64> {
    if n == 1 {
        return decode_seconds(engine, prompt, 16, reps);
    }
    Ok(n as f64 / corelm_engine::bench::run_test(engine, 0, n, 0, reps)?.0)
}

/// Seconds of one decode step after a `prompt`-token prompt, over runs of `steps` steps.
fn decode_seconds(engine: &mut Engine, prompt: usize, steps: usize, reps: usize) -> Result<f64> {
    Ok(1.0 / corelm_engine::bench::run_test(engine, prompt, 0, steps, reps)?.0)
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
        .filter_map(|c| times.get(&c.key()).map(|&(p, d)| Candidate { config: c.clone(), prefill_s: p, decode_s: d, rounds: 0 }))
        .collect();
    // What runs without a plan: one group of every core.
    let most = candidates.iter().map(|c| c.config.n_cores()).max().unwrap_or(0);
    let default = candidates.iter().position(|c| c.config.tp() == 1 && c.config.n_cores() == most);
    let (finalists, rounds) = if measured { confirm(a, &model, &mut candidates, default)? } else { (Vec::new(), Vec::new()) };
    // 3. The pair.
    let need = (a.confirm * 4).div_ceil(5);
    let (i, j, min, won) = Plan::choose_confirmed(&candidates, &finalists, &rounds, a.prompt, a.gen, default, need).context("no candidate configuration could be timed")?;
    if !finalists.is_empty() {
        eprintln!("confirmed {} finalists: times from {} interleaved rounds", finalists.len(), a.confirm);
    }
    if let (Some(won), Some(d)) = (won, default) {
        let what = if won >= need { "chosen" } else { "not chosen, the default kept" };
        eprintln!("the best pair made a shorter request than the default ({}) in {won} of {} rounds ({need} needed): {what}", candidates[d].config.describe(), a.confirm);
    }
    let (prefill, decode) = (candidates[i].config.clone(), candidates[j].config.clone());
    candidates.sort_by(|x, y| x.request(a.gen).total_cmp(&y.request(a.gen)));
    let mut plan = Plan {
        cpu: if measured { crate::profile::cpu_model() } else { prof.name.clone() },
        topology: topo.source.clone(),
        model: model.file_name().map_or("model".into(), |f| f.to_string_lossy().into_owned()),
        source: if measured { "measured" } else { "modelled" }.into(),
        prompt: a.prompt,
        gen: a.gen,
        prefill,
        decode,
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
