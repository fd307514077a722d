//! `corelm sparsity`: FFN activation statistics of a model over a text (`collect`, a sidecar
//! file and its heat map), the quality of sparsity levels against the dense model (`eval`:
//! perplexity and greedy agreement on a text the calibration did not see), and the
//! `--sparsity` flags every model-loading command takes.

use anyhow::{bail, Context, Result};
use corelm_engine::offload::AccelConfig;
use corelm_engine::sparsity::{self, Allocation, Sidecar};
use corelm_engine::{Engine, Tokenizer};
use corelm_kernels::DType;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `--sparsity` and its companions, shared by the commands that load a model.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct SparseArgs {
    /// Skip FFN neurons that do not fire (KAIROX/CATS activation sparsity): the mean fraction
    /// of (token, neuron) pairs skipped, from 0 to 0.95, with thresholds from the model's
    /// calibration (`corelm sparsity collect`). Off by default (the dense model, bit-identical
    /// to llama.cpp). Quality and speed per level: docs/sparsity.md.
    #[arg(long, env = "CORELM_SPARSITY")]
    pub(crate) sparsity: Option<f32>,
    /// The calibration file (default: the model's in the cache, `~/.cache/corelm/sparsity/`).
    #[arg(long)]
    pub(crate) sparsity_file: Option<PathBuf>,
    /// How the sparsity is spread over layers: uniform (the same in every layer), or greedy
    /// (more where the estimated error grows least; measured worse so far: docs/sparsity.md).
    #[arg(long, default_value = "uniform")]
    pub(crate) sparsity_alloc: Allocation,
    /// Type the down projection is stored in, neuron-major (q8_0, q5_1, q5_0, q4_1, q4_0).
    #[arg(long, default_value = "q8_0", value_parser = parse_down_type)]
    pub(crate) sparse_down_type: DType,
    /// Put the most frequently firing FFN neurons on an accelerator (Vulkan, Metal or DX12
    /// through wgpu) holding at most this many bytes of their weights (e.g. 64M, 1.5G), the
    /// CPU computing the rest; with --sparsity, neurons are chosen by the calibration's firing
    /// frequencies, without it whole layers go first. Off by default.
    #[arg(long, value_parser = parse_bytes)]
    pub(crate) accel_mem: Option<u64>,
    /// How the accelerator's neurons change as the run goes: static (chosen at load, never
    /// moved), static-groups (the same through the online machinery: groups, masks and
    /// statistics, no moves; the ablation's baseline), or online balancing of neuron groups between the accelerator and the CPU —
    /// topk (the groups most active in the last pass), lru, tam (momentum score with decay
    /// --accel-lambda; loads only groups active in more than one recent pass), tam-adaptive
    /// (tam with the decay moved by the measured stall: loads stalling → higher, CPU the
    /// bottleneck → lower).
    #[arg(long, default_value = "static")]
    pub(crate) accel_policy: corelm_engine::balance::Policy,
    /// Neurons per group moved by the online policies (a multiple of 4; with --sparsity the
    /// neurons are grouped by the calibration's firing frequency, hottest first).
    #[arg(long, default_value_t = 64)]
    pub(crate) accel_group: usize,
    /// How the online policies group neurons: coact (neurons that fire together, from the
    /// sparsity file's co-activation partition, METIS) or freq (by firing frequency).
    #[arg(long, value_enum, default_value = "coact")]
    pub(crate) accel_groups: GroupBy,
    /// Adjacent-layer activation predictors (`corelm sparsity predict` writes them, for one
    /// --sparsity level): each layer's gate rows are then read only for the neurons predicted
    /// from the previous layer's FFN input, and only those can fire (KAIROX §5.1). Needs
    /// --sparsity at the level they were trained for. Quality and speed: docs/sparsity.md.
    #[arg(long)]
    pub(crate) predictor: Option<PathBuf>,
    /// The momentum score's decay λ (tam; tam-adaptive's start).
    #[arg(long, default_value_t = 0.9)]
    pub(crate) accel_lambda: f32,
}

/// `--accel-groups`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum GroupBy {
    Coact,
    Freq,
}

/// `123`, `64K`, `64M`, `1.5G` (powers of 1024; a trailing `B` or `iB` is allowed).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['B', 'b']).trim_end_matches('i');
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("'{s}': unknown size suffix '{c}' (K, M, G, T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("'{s}' is not a size in bytes (e.g. 512M, 2G)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("'{s}' is not a size in bytes"));
    }
    Ok((v * mul as f64) as u64)
}

fn parse_down_type(s: &str) -> Result<DType, String> {
    let names: Vec<String> = corelm_kernels::sparse::NEURON_MAJOR_TYPES.iter().map(|t| t.name().to_lowercase()).collect();
    corelm_kernels::sparse::NEURON_MAJOR_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(s))
        .ok_or_else(|| format!("unknown neuron-major type '{s}' (supported: {})", names.join(", ")))
}

impl SparseArgs {
    /// The accelerator's configuration for `mem` bytes, the calibration's level nearest the
    /// target (firing frequencies; co-activation groups unless --accel-groups freq).
    fn accel(&self, mem: u64, level: Option<&corelm_engine::sparsity::LevelStats>) -> Result<AccelConfig> {
        if self.accel_group == 0 || !self.accel_group.is_multiple_of(4) {
            bail!("--accel-group {}: groups are a positive multiple of 4 neurons", self.accel_group);
        }
        if !(0.0..1.0).contains(&self.accel_lambda) {
            bail!("--accel-lambda {}: a decay in [0, 1)", self.accel_lambda);
        }
        let mut balance = corelm_engine::balance::BalanceConfig::new(self.accel_policy);
        balance.group = self.accel_group;
        balance.lambda = self.accel_lambda;
        let groups = match self.accel_groups {
            GroupBy::Coact => level.and_then(|l| l.groups_of(self.accel_group)).map(<[_]>::to_vec),
            GroupBy::Freq => None,
        };
        if self.accel_groups == GroupBy::Coact && groups.is_none() && self.accel_policy != corelm_engine::balance::Policy::Static && level.is_some() {
            eprintln!("note: the sparsity file has no co-activation groups of {} neurons (collect makes 32, 64, 128): grouping by firing frequency", self.accel_group);
        }
        Ok(AccelConfig { freq: level.map(|l| l.freq.clone()), balance, groups, ..AccelConfig::new(mem) })
    }

    /// The engine's sparse configuration for `model` (`None` without `--sparsity`) and its
    /// accelerator's (`None` without `--accel-mem`).
    pub(crate) fn load(&self, model: &Path) -> Result<(Option<Arc<corelm_engine::SparseFfn>>, Option<AccelConfig>)> {
        let Some(s) = self.sparsity else {
            if self.predictor.is_some() {
                bail!("--predictor predicts which neurons fire at a sparsity level: give --sparsity too");
            }
            return Ok((None, self.accel_mem.map(|mem| self.accel(mem, None)).transpose()?));
        };
        let path = self.sparsity_file.clone().unwrap_or_else(|| sparsity::default_path(model));
        if !path.exists() {
            bail!(
                "--sparsity needs the model's activation statistics, and {} does not exist: run `corelm sparsity collect -m {} --file TEXT` first (or give --sparsity-file)",
                path.display(),
                model.display()
            );
        }
        let side = Sidecar::read(&path)?;
        let thresholds = side.thresholds(s, self.sparsity_alloc)?;
        // The hot neurons: by firing frequency at the recorded level nearest the target.
        let accel = self
            .accel_mem
            .map(|mem| {
                let level = side.levels.iter().min_by(|a, b| (a.sparsity - s).abs().total_cmp(&(b.sparsity - s).abs()));
                self.accel(mem, level)
            })
            .transpose()?;
        let predictor = match &self.predictor {
            Some(p) => {
                let l = corelm_engine::predictor::load(p)?;
                if (l.meta.sparsity - s).abs() > 0.005 {
                    bail!("{} was trained for --sparsity {}; run `corelm sparsity predict --level {s}` for this level", p.display(), l.meta.sparsity);
                }
                let name = model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                if !l.meta.model.is_empty() && l.meta.model != name {
                    eprintln!("note: {} was trained on {}, not {name}", p.display(), l.meta.model);
                }
                Some(Arc::new(l.predictors))
            }
            None => None,
        };
        let mut sparse = corelm_engine::SparseFfn::new(thresholds, self.sparse_down_type);
        sparse.predictor = predictor;
        Ok((Some(Arc::new(sparse)), accel))
    }
}

/// One line on what online balancing did (`corelm bench`).
pub(crate) fn describe_balance(b: &corelm_engine::balance::Online) -> String {
    let s = b.stats();
    format!(
        "balance {}: {} passes, device hit rate {:.1} % of firing neurons (best fixed set in hindsight {:.1} %), {} group loads ({:.2} MB, {:.3} s issuing and waiting on them), {:.3} s waiting for the device, {:.3} s choosing, λ {:.2}",
        b.policy(),
        s.passes,
        100.0 * s.hit_rate(),
        100.0 * s.best_hit_rate(),
        s.loads,
        s.load_bytes as f64 / 1e6,
        s.load_secs,
        s.wait_secs,
        s.policy_secs,
        s.lambda
    )
}

/// One line on what `--accel-mem` put on the accelerator.
pub(crate) fn describe_accel(a: &corelm_accel::HotFfn) -> String {
    let hot = a.hot_counts();
    let layers = hot.iter().filter(|&&n| n > 0).count();
    let software = if a.gpu().is_software() { " (a CPU emulating a GPU: correct, not fast)" } else { "" };
    format!(
        "accelerator: {}{software}: {} FFN neurons of {layers} layers, {:.1} MiB of weights",
        a.gpu().name(),
        hot.iter().sum::<usize>(),
        a.weight_bytes() as f64 / (1 << 20) as f64
    )
}

#[derive(clap::Subcommand)]
pub enum SparsityCmd {
    /// Run the dense model over a text and record, per layer and neuron, its activation
    /// statistics: the distribution of |act(gate)| (thresholds for any sparsity), the
    /// estimated output error per sparsity level, firing frequencies and reactivation
    /// probabilities at 25/40/50 % (a sidecar JSON file; --svg draws the heat map).
    Collect {
        #[command(flatten)]
        model: crate::ModelArgs,
        /// Calibration text.
        #[arg(short, long)]
        file: PathBuf,
        /// Sidecar file to write (default: the model's in the cache, which --sparsity reads).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Tokens per pass (a chunk of the text, from an empty context).
        #[arg(long, default_value_t = 512)]
        chunk: usize,
        /// Use at most this many tokens of the text.
        #[arg(long)]
        max_tokens: Option<usize>,
        /// Heat map of firing frequency per layer and neuron at 50 % sparsity (SVG).
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// Train the adjacent-layer activation predictors (KAIROX §5.1): from layer l-1's FFN
    /// input, a low-rank model per layer predicts which of layer l's neurons fire at the
    /// calibration's threshold for --level. Trained on the first 80 % of the traced tokens (the
    /// last --cut-share of those held back from the fit to choose the cut on), recall and
    /// precision reported on the rest (and on --eval-file); written as GGUF.
    Predict {
        #[command(flatten)]
        model: crate::ModelArgs,
        /// Text to trace (the calibration text).
        #[arg(short, long)]
        file: PathBuf,
        /// Sparsity level whose thresholds define firing (the sidecar's; uniform).
        #[arg(long, default_value_t = 0.5)]
        level: f32,
        /// Tokens traced.
        #[arg(long, default_value_t = 4096)]
        tokens: usize,
        #[arg(long, default_value_t = 32)]
        rank: usize,
        #[arg(long, default_value_t = 6)]
        epochs: usize,
        /// Recall the cut is chosen for, on the last training tokens (--cut-share), which the
        /// fit does not see.
        #[arg(long, default_value_t = 0.95)]
        recall: f64,
        /// Share of the training tokens held back from the fit to choose the cut on (0: the
        /// fitted tokens).
        #[arg(long, default_value_t = 0.125)]
        cut_share: f64,
        /// What --recall counts: `count` (firing neurons) or `mass` (their summed
        /// |act(gate)·up|·‖down column‖, each firing example weighted by it in the fit).
        #[arg(long, default_value = "mass")]
        target: corelm_engine::predictor::Target,
        /// With `--target mass`, the cut also keeps at least this share of the firing neurons.
        #[arg(long, default_value_t = 0.92)]
        min_recall: f64,
        /// Always predict the neurons whose largest activation mass in the traced text is at
        /// least this many times their layer's mean firing mass (0: none).
        #[arg(long, default_value_t = 64.0)]
        pin: f32,
        /// Train nothing: report the recall, mass recall and precision of this predictor file
        /// on --file's tokens (its level's thresholds).
        #[arg(long, conflicts_with = "output")]
        check: Option<PathBuf>,
        /// A second held-out text to report recall and precision on.
        #[arg(long)]
        eval_file: Option<PathBuf>,
        /// Predictor file (default: beside the sidecar, `<model>.predictor.gguf`).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Quality of sparsity levels: perplexity of a text (llama-perplexity's protocol) and
    /// greedy agreement (the dense model's most likely token kept) at each level, against the
    /// dense model in the same run; with --predictor, its level also with the predictor.
    Eval {
        #[command(flatten)]
        model: crate::ModelArgs,
        /// Text to score (not the calibration text).
        #[arg(short, long)]
        file: PathBuf,
        /// Sparsity levels (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "0.25,0.4,0.5")]
        levels: Vec<f32>,
        /// Score at most this many chunks of --ctx-size tokens.
        #[arg(long)]
        chunks: Option<usize>,
        /// Print one JSON object per row.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: SparsityCmd) -> Result<()> {
    match cmd {
        SparsityCmd::Collect { model, file, output, chunk, max_tokens, svg } => collect(&model, &file, output, chunk, max_tokens, svg),
        SparsityCmd::Eval { model, file, levels, chunks, json } => eval(&model, &file, &levels, chunks, json),
        SparsityCmd::Predict { model, file, level, tokens, rank, epochs, recall, cut_share, target, min_recall, pin, eval_file, output, check } => {
            if let Some(c) = check {
                return check_predictor(&model, &file, tokens, &c);
            }
            let opts = corelm_engine::predictor::TrainOptions { rank, epochs, recall, cut_share, target, min_recall, pin, ..Default::default() };
            predict(&model, &file, level, tokens, &opts, eval_file.as_deref(), output)
        }
    }
}

fn dense_args(m: &crate::ModelArgs) -> crate::ModelArgs {
    let mut d = m.clone();
    d.place.sparse.sparsity = None;
    d.place.sparse.predictor = None;
    d
}

fn tokens_of(tok: &Tokenizer, file: &Path) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    Ok(tok.encode(&text, true, false)?)
}

fn collect(m: &crate::ModelArgs, file: &Path, output: Option<PathBuf>, chunk: usize, max_tokens: Option<usize>, svg: Option<PathBuf>) -> Result<()> {
    let path = crate::resolve_model(&m.model)?;
    let (mut engine, tok) = crate::load(&dense_args(m), 1)?;
    let mut tokens = tokens_of(&tok, file)?;
    if let Some(n) = max_tokens {
        tokens.truncate(n);
    }
    let name = path.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
    let t0 = std::time::Instant::now();
    let side = sparsity::collect(&mut engine, &tokens, chunk, &name, &file.display().to_string(), |pass, c, n| {
        eprint!("\rpass {pass}/2: chunk {}/{n}", c + 1);
    })?;
    eprintln!("\r{} tokens, two passes, {:.1} s", side.tokens, t0.elapsed().as_secs_f64());
    print_summary(&side);
    let out = output.unwrap_or_else(|| sparsity::default_path(&path));
    side.write(&out)?;
    eprintln!("statistics written to {}", out.display());
    if let Some(p) = svg {
        heat_map(&side, &p)?;
        eprintln!("heat map drawn to {}", p.display());
    }
    Ok(())
}

fn print_summary(s: &Sidecar) {
    let thr = |l: usize, x: f32| s.threshold(l, x);
    println!("| layer | θ at 25% | θ at 40% | θ at 50% | est. error at 25/40/50% | P(fire) at 50% | P(again after δ=1/2/4/8) |");
    println!("|---|---|---|---|---|---|---|");
    let half = s.levels.iter().find(|l| l.sparsity == 0.5);
    for l in 0..s.n_layer {
        let e = |k: usize| 100.0 * s.error[l][k];
        let (base, re) = match half {
            Some(h) => (
                format!("{:.3}", h.base_rate[l]),
                [0, 1, 3, 7].iter().map(|&d| format!("{:.3}", h.reactivation[l][d])).collect::<Vec<_>>().join(" / "),
            ),
            None => (String::new(), String::new()),
        };
        println!(
            "| {l} | {:.4} | {:.4} | {:.4} | {:.1} / {:.1} / {:.1} % | {base} | {re} |",
            thr(l, 0.25),
            thr(l, 0.4),
            thr(l, 0.5),
            e(5),
            e(8),
            e(10)
        );
    }
    for lvl in [0.25, 0.4, 0.5] {
        match s.allocate(lvl, Allocation::Greedy) {
            Ok(a) => println!("greedy allocation at {:.0}%: {}", 100.0 * lvl, a.iter().map(|x| format!("{:.0}", 100.0 * x)).collect::<Vec<_>>().join(" ")),
            Err(e) => println!("greedy allocation at {lvl}: {e}"),
        }
    }
}

/// Firing frequency at 50 % sparsity: a row per layer, neurons binned into at most 512 columns.
fn heat_map(s: &Sidecar, out: &Path) -> Result<()> {
    use plotters::prelude::*;
    let Some(h) = s.levels.iter().find(|l| l.sparsity == 0.5) else { bail!("no statistics at 50 %") };
    let cols = s.n_ff.min(512);
    let per = s.n_ff.div_ceil(cols);
    let root = SVGBackend::new(out, (1100, 120 + 14 * s.n_layer as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{}: P(neuron fires) at 50% sparsity, {} tokens", s.model, s.tokens), ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(0..s.n_ff, 0..s.n_layer)?;
    chart.configure_mesh().disable_mesh().x_desc("neuron").y_desc("layer").draw()?;
    for l in 0..s.n_layer {
        for c in 0..cols {
            let (a, b) = (c * per, ((c + 1) * per).min(s.n_ff));
            if a >= b {
                continue;
            }
            let f = h.freq[l][a..b].iter().sum::<f32>() / (b - a) as f32;
            // Dark blue (never fires) to yellow (always fires).
            let mix = |lo: f32, hi: f32| (lo + (hi - lo) * f.clamp(0.0, 1.0)) as u8;
            let color = RGBColor(mix(30.0, 250.0), mix(20.0, 230.0), mix(90.0, 40.0));
            chart.draw_series(std::iter::once(Rectangle::new([(a, l), (b, l + 1)], color.filled())))?;
        }
    }
    root.present()?;
    Ok(())
}

fn eval(m: &crate::ModelArgs, file: &Path, levels: &[f32], chunks: Option<usize>, json: bool) -> Result<()> {
    let path = crate::resolve_model(&m.model)?;
    let run = |args: &crate::ModelArgs| -> Result<corelm_engine::perplexity::Perplexity> {
        let (mut engine, tok): (Engine, Tokenizer) = crate::load(args, 1)?;
        let tokens = tokens_of(&tok, file)?;
        let bos = if tok.add_bos { tok.bos } else { None };
        Ok(corelm_engine::perplexity::perplexity(&mut engine, &tokens, bos, m.ctx_size, chunks, |_, _, _| {})?)
    };
    let dense = run(&dense_args(m))?;
    let mut rows = vec![("dense".to_string(), dense.clone())];
    // The predictor's level, if given, also runs with it.
    let pred_level = match &m.place.sparse.predictor {
        Some(p) => Some(corelm_engine::predictor::load(p)?.meta.sparsity),
        None => None,
    };
    for &lv in levels {
        let mut a = m.clone();
        a.place.sparse.sparsity = Some(lv);
        a.place.sparse.predictor = None;
        let name = format!("{}% {:?}", 100.0 * lv, m.place.sparse.sparsity_alloc).to_lowercase();
        let p = run(&a).with_context(|| format!("sparsity {lv} on {}", path.display()))?;
        rows.push((name.clone(), p));
        if pred_level.is_some_and(|l| (l - lv).abs() <= 0.005) {
            a.place.sparse.predictor = m.place.sparse.predictor.clone();
            let p = run(&a).with_context(|| format!("sparsity {lv} with the predictor on {}", path.display()))?;
            rows.push((format!("{name} + predictor"), p));
        }
    }
    if !json {
        println!("| FFN sparsity | perplexity | vs dense | greedy agreement | seconds |\n|---|---|---|---|---|");
    }
    for (name, p) in &rows {
        let agree = p.argmax.iter().zip(&dense.argmax).filter(|(a, b)| a == b).count() as f64 / dense.argmax.len().max(1) as f64;
        let rel = 100.0 * (p.ppl / dense.ppl - 1.0);
        if json {
            println!(
                "{}",
                serde_json::json!({"sparsity": name, "ppl": p.ppl, "ppl_stderr": p.ppl_stderr, "vs_dense_pct": rel, "agreement": agree, "tokens": p.tokens_scored, "down_type": m.place.sparse.sparse_down_type.name()})
            );
        } else {
            println!("| {name} | {:.4} ± {:.4} | {rel:+.2}% | {:.1}% | {:.1} |", p.ppl, p.ppl_stderr, 100.0 * agree, p.seconds);
        }
    }
    Ok(())
}

/// What tracing a predictor's firing needs: the dense model, and its sidecar's uniform
/// thresholds for a sparsity level.
struct Traced {
    path: PathBuf,
    side_path: PathBuf,
    engine: Engine,
    tok: Tokenizer,
    thresholds: Vec<f32>,
}

fn traced(m: &crate::ModelArgs, level: f32) -> Result<Traced> {
    let path = crate::resolve_model(&m.model)?;
    let side_path = m.place.sparse.sparsity_file.clone().unwrap_or_else(|| sparsity::default_path(&path));
    let side = Sidecar::read(&side_path).with_context(|| format!("the predictor needs the model's thresholds: run `corelm sparsity collect -m {}` first", path.display()))?;
    let thresholds = side.thresholds(level, sparsity::Allocation::Uniform)?;
    let (engine, tok) = crate::load(&dense_args(m), 1)?;
    side.check(&engine, &path.display().to_string())?;
    Ok(Traced { path, side_path, engine, tok, thresholds })
}

fn predict(m: &crate::ModelArgs, file: &Path, level: f32, max_tokens: usize, opts: &corelm_engine::predictor::TrainOptions, eval_file: Option<&Path>, output: Option<PathBuf>) -> Result<()> {
    use corelm_engine::predictor;
    let Traced { path, side_path, mut engine, tok, thresholds } = traced(m, level)?;
    let t0 = std::time::Instant::now();
    let setup = predictor::TraceSetup::new(&engine, &thresholds)?;
    let trace = predictor::trace(&mut engine, &tokens_of(&tok, file)?, m.ctx_size, &setup, max_tokens)?;
    let traced = t0.elapsed().as_secs_f64();
    let eval = match eval_file {
        Some(f) => Some(predictor::trace(&mut engine, &tokens_of(&tok, f)?, m.ctx_size, &setup, 1024)?),
        None => None,
    };
    let t1 = std::time::Instant::now();
    let models = predictor::train_all(&trace, 0.8, opts);
    eprintln!("traced {} tokens in {traced:.1} s, trained {} layers (rank {}, {} epochs) in {:.1} s", trace.tokens(), models.len(), opts.rank, opts.epochs, t1.elapsed().as_secs_f64());
    let on_eval = |l: usize, p: &predictor::LowRank| eval.as_ref().map(|e| p.quality(&e.x[l.saturating_sub(1)], &e.fired[l], &e.mass[l]));
    let rows: Vec<_> = models.iter().enumerate().map(|(l, (p, q))| (*q, on_eval(l, p), p.pinned())).collect();
    quality_table(&rows, eval_file);
    let stem = path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
    let out = output.unwrap_or_else(|| side_path.with_file_name(format!("{stem}.predictor.gguf")));
    let name = path.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
    std::fs::write(&out, predictor::to_gguf(&models, &name, level)).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("predictors written to {}", out.display());
    Ok(())
}

/// Per layer: recall, mass recall and precision on the held-out tokens, and on a second text.
fn quality_table(rows: &[(corelm_engine::predictor::Quality, Option<corelm_engine::predictor::Quality>, usize)], other: Option<&Path>) {
    let o = other.map_or(String::new(), |f| format!(" | recall / mass recall / worst miss on {}", f.display()));
    println!("| layer | predicts from | pinned | firing | predicted | recall | mass recall | worst miss | precision{o} |");
    println!("|---|---|---|---|---|---|---|---|---|{}", if other.is_some() { "---|" } else { "" });
    let mut sums = [0.0f64; 6];
    let mut worst = [0f64; 2];
    for (l, (q, e, pinned)) in rows.iter().enumerate() {
        let o = e.map_or(String::new(), |e| {
            sums[4] += e.recall;
            sums[5] += e.mass_recall;
            worst[1] = worst[1].max(e.worst_miss);
            format!(" | {:.3} / {:.3} / {:.0}×", e.recall, e.mass_recall, e.worst_miss)
        });
        worst[0] = worst[0].max(q.worst_miss);
        for (s, v) in sums.iter_mut().zip([q.recall, q.mass_recall, q.precision, q.predicted]) {
            *s += v;
        }
        let from = if l == 0 { "layer 0".to_string() } else { format!("layer {}", l - 1) };
        println!("| {l} | {from} | {pinned} | {:.1}% | {:.1}% | {:.3} | {:.3} | {:.0}× | {:.3}{o} |", 100.0 * q.firing, 100.0 * q.predicted, q.recall, q.mass_recall, q.worst_miss, q.precision);
    }
    let n = rows.len().max(1) as f64;
    let o = if other.is_some() { format!(" | {:.3} / {:.3} / {:.0}× (largest)", sums[4] / n, sums[5] / n, worst[1]) } else { String::new() };
    let pinned: usize = rows.iter().map(|r| r.2).sum();
    println!("| mean | | {pinned} in all | | {:.1}% | {:.3} | {:.3} | {:.0}× (largest) | {:.3}{o} |", 100.0 * sums[3] / n, sums[0] / n, sums[1] / n, worst[0], sums[2] / n);
}

/// `sparsity predict --check`: a predictor file's quality on `file`'s first `max_tokens` tokens.
fn check_predictor(m: &crate::ModelArgs, file: &Path, max_tokens: usize, pred: &Path) -> Result<()> {
    use corelm_engine::predictor;
    let stored = predictor::read(pred)?;
    let Traced { mut engine, tok, thresholds, .. } = traced(m, stored.meta.sparsity)?;
    let h = engine.hyper();
    if stored.layers.len() != h.n_layer || stored.layers[0].n_embd != h.n_embd || stored.layers[0].n_ff != h.n_ff {
        bail!("{} was trained for {} ({} layers, n_ff {}), not this model ({} layers, n_ff {})", pred.display(), stored.meta.model, stored.layers.len(), stored.layers[0].n_ff, h.n_layer, h.n_ff);
    }
    let setup = predictor::TraceSetup::new(&engine, &thresholds)?;
    let trace = predictor::trace(&mut engine, &tokens_of(&tok, file)?, m.ctx_size, &setup, max_tokens)?;
    eprintln!("{} at sparsity {} on {} tokens of {}", pred.display(), stored.meta.sparsity, trace.tokens(), file.display());
    let rows: Vec<_> = stored.layers.iter().enumerate().map(|(l, p)| (p.quality(&trace.x[l.saturating_sub(1)], &trace.fired[l], &trace.mass[l]), None, p.pinned())).collect();
    quality_table(&rows, None);
    Ok(())
}
