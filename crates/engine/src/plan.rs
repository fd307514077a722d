//! Sandwich's plan file: a prefill and a decode service configuration for one model on one
//! machine, and the rule that picks one per forward pass.
//!
//! The two configurations share their tensor-parallel degree — weights are sharded and the KV
//! cache laid out once, at load — and every decode group is a subset of the prefill group of
//! the same shard (its weights and KV rows are where that group runs). The engine starts one
//! pool on the prefill configuration's cores and adds the decode configuration as a view of it
//! (`ThreadPool::add_view`), so switching costs nothing: no thread is started, stopped or
//! re-pinned.
//!
//! **The rule**: a pass of `n` tokens runs on the prefill configuration when
//! `n ≥ prefill_min_tokens`, else on the decode one. `corelm tune` sets `prefill_min_tokens`
//! where the two configurations' pass times cross, each taken as linear in `n` between the
//! one-token pass and the `prompt`-token pass it measured (or modelled). A serving step mixing
//! prompt chunks and decode tokens is one pass of their sum, so it follows the same rule: a
//! step with a long enough prompt chunk runs on the prefill cores, decode-only steps on the
//! decode cores.
//!
//! **The accelerator** (`corelm tune --accel`, [`AccelPlan`]): where a device is found, tune
//! times passes of 1, 2, 4, … `prompt` tokens with the model's first layers on it (the rest on
//! the best configurations without tensor parallelism, which whole layers on the device need)
//! against the same passes on the CPU configurations above, and keeps the device — and those
//! configurations — for passes from the length where its line crosses the CPU's (`--accel-layers N --accel-min-tokens T`, chosen rather
//! than typed): on a discrete GPU that is prefill on the device and decode on the CPU. A plan
//! whose device lost the longest pass records the times and places nothing there.

use corelm_core::sched::matmul::{Path as GemmPath, ScheduleEntry, Schedules};
use corelm_kernels::matmul::schedule::Schedule;
use corelm_kernels::DType;
use corelm_topo::sandwich::ServiceConfig;
use std::path::Path;

/// One candidate's pass times (seconds): one token, and `prompt` tokens.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Candidate {
    pub config: ServiceConfig,
    pub decode_s: f64,
    pub prefill_s: f64,
    /// How many interleaved rounds confirmed the two times (`corelm tune --confirm`, the
    /// finalists: medians within rounds); 0: one measurement of the search, or the latency
    /// model's times.
    #[serde(default)]
    pub rounds: usize,
}

impl Candidate {
    /// Seconds of a request on this candidate alone: its prefill pass, then `gen` decode passes.
    pub fn request(&self, gen: usize) -> f64 {
        self.prefill_s + gen as f64 * self.decode_s
    }

    /// Pass time at `n` tokens, linear between the two points (`prompt` the longer one).
    pub fn at(&self, n: usize, prompt: usize) -> f64 {
        if prompt <= 1 {
            return self.prefill_s;
        }
        self.decode_s + (n as f64 - 1.0) * (self.prefill_s - self.decode_s) / (prompt as f64 - 1.0)
    }
}

/// A plan file (`corelm tune --out`, `--plan` on run/bench/perplexity/serve).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// What it was made for: CPU model name, topology source, model file.
    pub cpu: String,
    pub topology: String,
    pub model: String,
    /// `measured` (passes timed on this machine) or `modelled` (the latency model).
    pub source: String,
    /// Prompt and generation lengths the choice weighed (one request: a prompt pass, then
    /// `gen` decode passes).
    pub prompt: usize,
    pub gen: usize,
    pub prefill: ServiceConfig,
    pub decode: ServiceConfig,
    pub prefill_min_tokens: usize,
    /// Every candidate that was timed, best request time first.
    pub candidates: Vec<Candidate>,
    /// Tuned prefill matmul schedules (Sandwich §6), valid for the kernel table `gemm_isa` on
    /// `gemm_threads` workers (the CPU is `cpu`); tuning took `gemm_tuning_s` seconds. Empty
    /// when `corelm tune --gemm 0` skipped them (and in plans written before them).
    #[serde(default)]
    pub gemm_isa: String,
    #[serde(default)]
    pub gemm_threads: usize,
    #[serde(default)]
    pub gemm_tuning_s: f64,
    #[serde(default)]
    pub gemm: Vec<GemmPlan>,
    /// The accelerator's share, where `corelm tune` measured one (`None`: not measured).
    #[serde(default)]
    pub accel: Option<AccelPlan>,
}

/// The model's first `layers` layers on the accelerator `device` for passes of at least
/// `min_tokens` tokens (`--accel-layers`, `--accel-min-tokens`), chosen from `points`
/// (ascending lengths, from the last one the CPU won, where it won one);
/// `layers` 0: the device was slower at the longest pass, so nothing runs there.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AccelPlan {
    pub device: String,
    pub layers: usize,
    pub min_tokens: usize,
    pub points: Vec<AccelPoint>,
}

/// One pass length's times (seconds): on the CPU configurations, and with the layers on the
/// device.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AccelPoint {
    pub tokens: usize,
    pub cpu_s: f64,
    pub device_s: f64,
}

impl AccelPlan {
    /// From `points` (ascending lengths) with `layers` layers timed on `device`: the device
    /// from where it stays faster up to the longest length, the crossing placed by linear
    /// interpolation between the last length the CPU won and the first the device won. The
    /// device is taken only where it wins the longest pass, so a device that wins only short
    /// passes (an integrated GPU whose decode beats a slow CPU's but whose prefill does not)
    /// is left out: a pass's target is a threshold on its length.
    pub fn choose(device: String, layers: usize, points: Vec<AccelPoint>) -> AccelPlan {
        let wins = |p: &AccelPoint| p.device_s < p.cpu_s;
        let first = points.iter().rposition(|p| !wins(p)).map_or(0, |i| i + 1);
        let (layers, min_tokens) = match (first, points.get(first)) {
            (_, None) => (0, 0),
            (0, Some(_)) => (layers, 1),
            (i, Some(b)) => {
                let a = &points[i - 1];
                // CPU minus device, linear in n: ≤ 0 at a, > 0 at b; where it reaches 0.
                let (da, db) = (a.cpu_s - a.device_s, b.cpu_s - b.device_s);
                let n = a.tokens as f64 + da / (da - db) * (b.tokens - a.tokens) as f64;
                (layers, (n.ceil() as usize).clamp(a.tokens + 1, b.tokens))
            }
        };
        AccelPlan { device, layers, min_tokens, points }
    }
}

/// One tuned matmul schedule: for the `path` (`tiles` or `panel`) of `dtype` matrices of
/// `n_out` rows of `k` values, from `rows` activation rows on (to the next entry's), with the
/// times measured at `rows` for it and for the path's default.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GemmPlan {
    pub path: String,
    pub dtype: String,
    pub k: usize,
    pub n_out: usize,
    pub rows: usize,
    pub mr: usize,
    pub nc: usize,
    pub mc: usize,
    pub kc: usize,
    pub row_parts: usize,
    pub secs: f64,
    pub default_secs: f64,
    /// The previous length's schedule kept (its gain held), without a search.
    pub reused: bool,
}

impl GemmPlan {
    /// The scheduler's entry, or what in the file is not one.
    pub fn entry(&self) -> Result<ScheduleEntry, PlanError> {
        let path = match self.path.as_str() {
            "tiles" => GemmPath::Tiles,
            "panel" => GemmPath::Panel,
            p => return Err(PlanError::Invalid(format!("GEMM schedule path '{p}' (tiles or panel)"))),
        };
        let dtype = DType::from_name(&self.dtype)
            .ok_or_else(|| PlanError::Invalid(format!("GEMM schedule weight type '{}'", self.dtype)))?;
        if self.k == 0 || self.n_out == 0 || self.nc == 0 || self.mr == 0 {
            return Err(PlanError::Invalid(format!("GEMM schedule {} {}×{}: zero k, n_out, nc or mr", self.dtype, self.k, self.n_out)));
        }
        let sched = Schedule { mr: self.mr, nc: self.nc, mc: self.mc, kc: self.kc, row_parts: self.row_parts };
        Ok(ScheduleEntry { path, dtype, k: self.k, n_out: self.n_out, rows: self.rows, sched, secs: self.secs })
    }

    /// The file's form of a tuned length.
    pub fn from_tuned(path: GemmPath, dtype: DType, k: usize, n_out: usize, t: &corelm_plan::gemm_search::Tuned) -> GemmPlan {
        let s = t.sched;
        GemmPlan {
            path: if path == GemmPath::Panel { "panel" } else { "tiles" }.into(),
            dtype: dtype.name().into(),
            k,
            n_out,
            rows: t.rows,
            mr: s.mr,
            nc: s.nc,
            mc: s.mc,
            kc: s.kc,
            row_parts: s.row_parts,
            secs: t.secs,
            default_secs: t.default_secs,
            reused: t.reused,
        }
    }
}

/// A plan file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("plan {0}")]
    File(#[from] corelm_plan::file::FileError),
    #[error("plan: {0}")]
    Invalid(String),
}

/// Each decode group a subset of the prefill group of the same shard, same number of groups.
fn nested(prefill: &ServiceConfig, decode: &ServiceConfig) -> bool {
    prefill.tp() == decode.tp() && prefill.groups.iter().zip(&decode.groups).all(|(p, d)| d.iter().all(|c| p.contains(c)))
}

impl Plan {
    /// A plan of just these configurations and rule: nothing tuned, timed or named yet (what
    /// `corelm tune` loads an engine with to time a candidate, and what tests state).
    pub fn with_configs(prefill: ServiceConfig, decode: ServiceConfig, prefill_min_tokens: usize) -> Plan {
        Plan {
            cpu: String::new(),
            topology: String::new(),
            model: String::new(),
            source: String::new(),
            prompt: 0,
            gen: 0,
            prefill,
            decode,
            prefill_min_tokens,
            candidates: Vec::new(),
            gemm_isa: String::new(),
            gemm_threads: 0,
            gemm_tuning_s: 0.0,
            gemm: Vec::new(),
            accel: None,
        }
    }

    pub fn load(path: &Path) -> Result<Plan, PlanError> {
        let plan: Plan = corelm_plan::file::read_json(path)?;
        plan.check()?;
        Ok(plan)
    }

    pub fn save(&self, path: &Path) -> Result<(), PlanError> {
        Ok(corelm_plan::file::write_json(path, self)?)
    }

    /// The structural rules: non-empty groups, no CPU twice, decode nested in prefill.
    pub fn check(&self) -> Result<(), PlanError> {
        for (name, c) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            if c.groups.is_empty() || c.groups.iter().any(Vec::is_empty) {
                return Err(PlanError::Invalid(format!("the {name} configuration has an empty group")));
            }
            let mut all: Vec<u32> = c.groups.concat();
            all.sort_unstable();
            if all.windows(2).any(|w| w[0] == w[1]) {
                return Err(PlanError::Invalid(format!("the {name} configuration names a CPU twice")));
            }
        }
        for g in &self.gemm {
            g.entry()?;
        }
        if !nested(&self.prefill, &self.decode) {
            return Err(PlanError::Invalid(format!(
                "the decode configuration ({}) must have the prefill one's {} groups, each inside the prefill group of its shard ({})",
                self.decode.describe(),
                self.prefill.tp(),
                self.prefill.describe()
            )));
        }
        Ok(())
    }

    /// The tuned matmul schedules for the kernel table `isa`: `None` when there are none, or
    /// when they were tuned for another table (their speed would not carry over; the bits do
    /// not depend on them either way).
    pub fn schedules(&self, isa: &str) -> Option<Schedules> {
        if self.gemm.is_empty() || !self.gemm_isa.eq_ignore_ascii_case(isa) {
            return None;
        }
        Some(Schedules::new(self.gemm.iter().filter_map(|g| g.entry().ok()).collect()))
    }

    /// The accelerator's layers and the shortest pass they run in (`EngineConfig::accel_layers`,
    /// `accel_min_tokens`) for an engine configured as `cfg`: `Ok(None)` where the plan places
    /// nothing on the device or `--accel-layers` was given (the flags win), `Err` naming what
    /// keeps the plan's device choice from running with `cfg` (the engine then runs on the CPU
    /// configurations alone and says why).
    pub fn accel_for(&self, cfg: &crate::EngineConfig) -> Result<Option<(usize, usize)>, String> {
        let Some(a) = self.accel.as_ref().filter(|a| a.layers > 0) else { return Ok(None) };
        if cfg.accel_layers > 0 {
            return Ok(None);
        }
        crate::device_layers::check_with(cfg, self.prefill.tp(), a.min_tokens)
            .map_err(|why| format!("the plan's {} layers on {} from {} tokens are not used: {why}", a.layers, a.device, a.min_tokens))?;
        Ok(Some((a.layers, a.min_tokens)))
    }

    /// Whether a pass of `n_tokens` runs on the prefill configuration (the rule above).
    pub fn prefill_for(&self, n_tokens: usize) -> bool {
        n_tokens >= self.prefill_min_tokens
    }

    /// Pick the pair of candidates with the shortest request (`prompt` tokens of prefill, then
    /// `gen` single-token passes) among pairs of equal TP degree with the decode groups nested in
    /// the prefill ones, and where their pass times cross. `None` without candidates.
    pub fn choose(candidates: &[Candidate], prompt: usize, gen: usize) -> Option<(usize, usize, usize)> {
        let mut best: Option<(f64, usize, usize)> = None;
        for (i, p) in candidates.iter().enumerate() {
            for (j, d) in candidates.iter().enumerate() {
                if !nested(&p.config, &d.config) {
                    continue;
                }
                let t = p.prefill_s + gen as f64 * d.decode_s;
                // Ties go to one configuration for both phases (no switching).
                if best.is_none_or(|(b, bi, bj)| t < b || (t == b && i == j && bi != bj)) {
                    best = Some((t, i, j));
                }
            }
        }
        let (_, i, j) = best?;
        let (p, d) = (&candidates[i], &candidates[j]);
        let min = if i == j { 1 } else { (1..=prompt.max(1)).find(|&n| p.at(n, prompt) <= d.at(n, prompt)).unwrap_or(prompt.max(1)) };
        Some((i, j, min))
    }

    /// The candidates worth timing again before the choice (`corelm tune --confirm`): the
    /// `top` shortest requests, the fastest prefill and the fastest decode pass, the pair
    /// [`Plan::choose`] takes from these times, and `default` (the configuration an engine runs
    /// without a plan) — indices, each once, in that order. One measurement each on a busy or
    /// virtual machine can be off by more than the candidates differ (two cores: decode passes
    /// of 1.8–2.4 ms on one configuration in three runs), so the choice is made again on the
    /// finalists' confirmed times.
    pub fn finalists(candidates: &[Candidate], prompt: usize, gen: usize, top: usize, default: Option<usize>) -> Vec<usize> {
        let mut order: Vec<usize> = (0..candidates.len()).collect();
        order.sort_by(|&a, &b| candidates[a].request(gen).total_cmp(&candidates[b].request(gen)));
        let fastest = |key: fn(&Candidate) -> f64| (0..candidates.len()).min_by(|&a, &b| key(&candidates[a]).total_cmp(&key(&candidates[b])));
        let mut out: Vec<usize> = Vec::new();
        let chosen = Plan::choose(candidates, prompt, gen).map(|(i, j, _)| [i, j]);
        let more = [fastest(|c| c.prefill_s), fastest(|c| c.decode_s)].into_iter().flatten().chain(chosen.into_iter().flatten()).chain(default);
        for i in order.into_iter().take(top).chain(more) {
            if !out.contains(&i) {
                out.push(i);
            }
        }
        out
    }

    /// [`Plan::choose`] over confirmed candidates, kept only where it held: `rounds[r][k]` is
    /// round `r`'s (prefill, decode) seconds of `candidates[finalists[k]]`, and a chosen pair
    /// other than (`default`, `default`) — one group of every core, what runs without a plan —
    /// must make a shorter request than the default in at least `need` rounds, else the default
    /// is taken. So a plan changes what runs only where its gain outlasted the machine's noise.
    /// Returns the pair, the prefill threshold, and the rounds the chosen pair won against the
    /// default (`None` where there is no default among the finalists).
    pub fn choose_confirmed(candidates: &[Candidate], finalists: &[usize], rounds: &[Vec<(f64, f64)>], prompt: usize, gen: usize, default: Option<usize>, need: usize) -> Option<(usize, usize, usize, Option<usize>)> {
        let (i, j, min) = Plan::choose(candidates, prompt, gen)?;
        let at = |c: usize| finalists.iter().position(|&f| f == c);
        let (Some(d), Some(ki), Some(kj)) = (default, at(i), at(j)) else { return Some((i, j, min, None)) };
        let Some(kd) = at(d).filter(|_| (i, j) != (d, d)) else { return Some((i, j, min, None)) };
        let won = rounds.iter().filter(|t| t[ki].0 + gen as f64 * t[kj].1 < t[kd].0 + gen as f64 * t[kd].1).count();
        Some(if won >= need { (i, j, min, Some(won)) } else { (d, d, 1, Some(won)) })
    }

    /// The plan in words (`corelm plan --plan`).
    pub fn explain(&self) -> String {
        let mut s = format!(
            "Plan for {} on {} ({}), {} from {} candidates, weighing a {}-token prompt and {} generated tokens.\n",
            self.model,
            self.cpu,
            self.topology,
            self.source,
            self.candidates.len(),
            self.prompt,
            self.gen
        );
        s += &format!("Prefill: {}.\n", self.prefill.describe());
        s += &format!("Decode:  {}.\n", self.decode.describe());
        let find = |c: &ServiceConfig| self.candidates.iter().find(|x| &x.config == c);
        let chosen = find(&self.prefill).zip(find(&self.decode)).map(|(p, d)| p.prefill_s + self.gen as f64 * d.decode_s);
        let shortest = self.candidates.iter().min_by(|a, b| a.request(self.gen).total_cmp(&b.request(self.gen)));
        if let Some(c) = shortest.filter(|c| c.rounds > 0 && chosen.is_some_and(|t| c.request(self.gen) < t)) {
            s += &format!(
                "Kept over {}, whose request was shorter on the confirmed times ({:.2} ms) but not in enough of the {} rounds.\n",
                c.config.describe(),
                1e3 * c.request(self.gen),
                c.rounds
            );
        } else if self.prefill == self.decode {
            s += "Both phases run on the same configuration: no other candidate made a request faster.\n";
        } else {
            let spare = self.prefill.n_cores() - self.decode.n_cores();
            s += &format!(
                "Passes of {} tokens or more run on the prefill cores; shorter ones (decode steps) on the decode cores, leaving {spare} core(s) idle, because decode is bound by memory bandwidth that fewer cores already saturate.\n",
                self.prefill_min_tokens
            );
        }
        if let (Some(p), Some(d)) = (find(&self.prefill), find(&self.decode)) {
            s += &format!(
                "{}: prefill pass {:.2} ms ({:.0} tokens/s), decode pass {:.3} ms ({:.1} tokens/s).\n",
                self.source,
                1e3 * p.prefill_s,
                self.prompt as f64 / p.prefill_s,
                1e3 * d.decode_s,
                1.0 / d.decode_s
            );
        }
        if !self.gemm.is_empty() {
            let tuned: Vec<&GemmPlan> = self.gemm.iter().filter(|g| !g.reused).collect();
            // The geometric mean of the gains over the default schedules, of one path or all.
            let gain = |path: Option<&str>| {
                let logs: Vec<f64> = self.gemm.iter().filter(|g| path.is_none_or(|p| g.path == p)).map(|g| (g.default_secs / g.secs).ln()).collect();
                (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp())
            };
            let per_path = match (gain(Some("tiles")), gain(Some("panel"))) {
                (Some(t), Some(p)) => format!("; the tiles {t:.2}×, the panel GEMM (--fast-prefill) {p:.2}×"),
                (None, Some(_)) => "; the panel GEMM's, run with --fast-prefill".into(),
                _ => String::new(),
            };
            s += &format!(
                "Prefill matmuls: {} schedules ({} searched, {} reused) for the {} table on {} workers, tuned in {:.0} s; {:.2}× the default schedules' speed (geometric mean over matrices and lengths{per_path}).\n",
                self.gemm.len(),
                tuned.len(),
                self.gemm.len() - tuned.len(),
                self.gemm_isa,
                self.gemm_threads,
                self.gemm_tuning_s,
                gain(None).unwrap_or(1.0),
            );
            let (panel, tiles) = fast_prefill_paths(&self.gemm);
            if panel + tiles > 0 {
                s += &format!(
                    "With --fast-prefill: of {} (matrix, length) pairs timed on both paths, {panel} run the panel GEMM and {tiles} keep the tiles, which were faster.\n",
                    panel + tiles
                );
            }
        }
        if let Some(a) = &self.accel {
            s += &match (a.layers, a.min_tokens) {
                (0, _) => format!("Accelerator {}: slower than the CPU at {} tokens, the longest pass timed, so nothing runs there.\n", a.device, a.points.last().map_or(0, |p| p.tokens)),
                (n, 1) => format!("Accelerator {}: the first {n} layers of every pass run there (faster at every length timed).\n", a.device),
                (n, t) => format!("Accelerator {}: passes of {t} tokens or more run the first {n} layers there (prefill), shorter ones on the CPU (decode), where the times cross.\n", a.device),
            };
            for p in &a.points {
                s += &format!("  {:>5} tokens: CPU {:>9.3} ms, device {:>9.3} ms ({:.2}× the CPU's speed)\n", p.tokens, 1e3 * p.cpu_s, 1e3 * p.device_s, p.cpu_s / p.device_s);
            }
        }
        s += "Candidates (request time = prefill + gen × decode):\n";
        for c in self.candidates.iter().take(8) {
            s += &format!(
                "  {:>9.2} ms  prefill {:.2} ms, decode {:.3} ms  {}{}\n",
                1e3 * c.request(self.gen),
                1e3 * c.prefill_s,
                1e3 * c.decode_s,
                c.config.describe(),
                if c.rounds > 0 { format!(" (confirmed in {} rounds)", c.rounds) } else { String::new() }
            );
        }
        s
    }
}

/// Set `cfg`'s accelerator layers from its plan (`Plan::accel_for`): whether they came from
/// it, and why the plan's were left out where they were.
pub(crate) fn apply_accel(cfg: &mut crate::EngineConfig) -> (bool, Option<String>) {
    match cfg.plan.as_ref().map(|p| p.accel_for(cfg)) {
        Some(Ok(Some((n, t)))) => {
            (cfg.accel_layers, cfg.accel_min_tokens) = (n, t);
            (true, None)
        }
        Some(Err(why)) => (false, Some(why)),
        _ => (false, None),
    }
}

/// Of the (matrix, length) pairs tuned on both GEMM paths, how many `--fast-prefill` runs on the
/// panel and how many on the tiles: the path the scheduler takes (`Schedules::faster_path`).
fn fast_prefill_paths(gemm: &[GemmPlan]) -> (usize, usize) {
    let schedules = Schedules::new(gemm.iter().filter_map(|g| g.entry().ok()).collect());
    let paths: Vec<GemmPath> = schedules
        .entries()
        .iter()
        .filter(|e| e.path == GemmPath::Panel)
        .filter_map(|e| schedules.faster_path(e.dtype, e.k, e.n_out, e.rows))
        .collect();
    let tiles = paths.iter().filter(|&&p| p == GemmPath::Tiles).count();
    (paths.len() - tiles, tiles)
}

/// Where a plan puts the engine's workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workers {
    /// CPU of every worker, shard by shard; within a shard its decode cores first.
    pub cpus: Vec<usize>,
    /// Workers per shard (the prefill groups).
    pub group_sizes: Vec<usize>,
    /// The decode view: each shard's first workers (`None` when it is the prefill one).
    pub decode: Option<Vec<std::ops::Range<usize>>>,
}

impl Plan {
    /// The workers of this plan for a process allowed to run on `allowed` CPUs; refused,
    /// naming the CPU, where the plan was made for other cores.
    pub fn workers(&self, allowed: &[usize]) -> Result<Workers, PlanError> {
        let mut w = Workers { cpus: Vec::new(), group_sizes: Vec::new(), decode: None };
        let mut ranges = Vec::new();
        for (p, d) in self.prefill.groups.iter().zip(&self.decode.groups) {
            let start = w.cpus.len();
            let rest = p.iter().filter(|c| !d.contains(c));
            for &c in d.iter().chain(rest) {
                if !allowed.contains(&(c as usize)) {
                    return Err(PlanError::Invalid(format!(
                        "it runs a worker on CPU {c}, which this process may not use (allowed: {allowed:?}); the plan was made for another machine or CPU set — run `corelm tune` here"
                    )));
                }
                w.cpus.push(c as usize);
            }
            w.group_sizes.push(p.len());
            ranges.push(start..start + d.len());
        }
        if self.decode != self.prefill {
            w.decode = Some(ranges);
        }
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `corelm plan` counts the pairs as the scheduler chooses: each tuned length of a matrix
    /// timed on both paths, the faster one; a length tuned on one path only counts for neither.
    #[test]
    fn plan_counts_the_paths_fast_prefill_takes() {
        let g = |path: &str, rows, secs| GemmPlan {
            path: path.into(),
            dtype: "q4_0".into(),
            k: 96,
            n_out: 72,
            rows,
            mr: 4,
            nc: 64,
            mc: 64,
            kc: 96,
            row_parts: 1,
            secs,
            default_secs: secs,
            reused: false,
        };
        let gemm = [g("tiles", 8, 1.0), g("panel", 8, 2.0), g("tiles", 64, 3.0), g("panel", 64, 2.0), g("panel", 128, 1.0), g("tiles", 256, 1.0)];
        assert_eq!(fast_prefill_paths(&gemm), (1, 1));
        assert_eq!(fast_prefill_paths(&gemm[..1]), (0, 0));
    }

    /// `corelm plan` gives the geometric mean of the schedules' gains over all of them, then per
    /// path where both were tuned.
    #[test]
    fn plan_explains_the_gains_per_path() {
        let g = |path: &str, secs: f64, default_secs: f64| GemmPlan {
            path: path.into(),
            dtype: "q4_0".into(),
            k: 96,
            n_out: 72,
            rows: 8,
            mr: 4,
            nc: 64,
            mc: 0,
            kc: 0,
            row_parts: 0,
            secs,
            default_secs,
            reused: false,
        };
        let one = ServiceConfig { numa: vec![Some(0)], groups: vec![vec![0]] };
        let plan = |gemm: Vec<GemmPlan>| Plan { gemm, ..Plan::with_configs(one.clone(), one.clone(), 1) }.explain();
        // Tiles 1× and 1.21× (geometric mean 1.10×), panel 1.44× and 1.0×  (1.20×): 1.15× in all.
        let both = plan(vec![g("tiles", 1.0, 1.0), g("tiles", 1.0, 1.21), g("panel", 1.0, 1.44), g("panel", 2.0, 2.0)]);
        assert!(both.contains("1.15× the default schedules' speed (geometric mean over matrices and lengths; the tiles 1.10×, the panel GEMM (--fast-prefill) 1.20×)"), "{both}");
        let tiles = plan(vec![g("tiles", 1.0, 1.21)]);
        assert!(tiles.contains("1.21× the default schedules' speed (geometric mean over matrices and lengths)."), "{tiles}");
        let panel = plan(vec![g("panel", 1.0, 1.44)]);
        assert!(panel.contains("1.44× the default schedules' speed (geometric mean over matrices and lengths; the panel GEMM's, run with --fast-prefill)."), "{panel}");
    }

    /// The device from where its line crosses the CPU's and stays below it; nothing where it
    /// never wins or wins only short passes.
    #[test]
    fn accel_plan_keeps_the_device_from_the_crossing() {
        let pts = |t: &[(usize, f64, f64)]| t.iter().map(|&(tokens, cpu_s, device_s)| AccelPoint { tokens, cpu_s, device_s }).collect::<Vec<_>>();
        let choose = |t: &[(usize, f64, f64)]| {
            let a = AccelPlan::choose("gpu".into(), 30, pts(t));
            (a.layers, a.min_tokens)
        };
        // A discrete GPU: decode on the CPU, the lines crossing 3/4 of the way from 8 to 16.
        assert_eq!(choose(&[(1, 1.0, 5.0), (8, 2.0, 5.0), (16, 5.0, 4.0), (64, 20.0, 6.0)]), (30, 14));
        assert_eq!(choose(&[(1, 1.0, 0.5), (64, 20.0, 6.0)]), (30, 1));
        assert_eq!(choose(&[(1, 1.0, 5.0), (64, 20.0, 30.0)]), (0, 0));
        // Faster on one-token passes only: a threshold cannot express it.
        assert_eq!(choose(&[(1, 1.0, 0.5), (64, 20.0, 30.0)]), (0, 0));
        // Wins at 4, loses at 8, wins from 16: from the last crossing on.
        assert_eq!(choose(&[(1, 1.0, 5.0), (4, 2.0, 1.0), (8, 2.0, 3.0), (16, 5.0, 4.0)]), (30, 12));
        // A tie goes to the CPU: the device from the next token.
        assert_eq!(choose(&[(1, 1.0, 1.0), (2, 2.0, 1.0)]), (30, 2));
        assert_eq!(choose(&[]), (0, 0));
    }

    /// A plan's device layers run where the configuration allows them; where it does not, the
    /// reason names what is in the way, and `--accel-layers` wins over the plan.
    #[test]
    fn a_plans_accelerator_layers_give_way_with_a_reason() {
        let one = ServiceConfig { numa: vec![Some(0)], groups: vec![vec![0]] };
        let points = vec![AccelPoint { tokens: 1, cpu_s: 1.0, device_s: 2.0 }, AccelPoint { tokens: 64, cpu_s: 9.0, device_s: 3.0 }];
        let plan = Plan { prompt: 64, gen: 16, accel: Some(AccelPlan::choose("gpu".into(), 24, points)), ..Plan::with_configs(one.clone(), one, 1) };
        let cfg = crate::EngineConfig::default();
        assert_eq!(plan.accel_for(&cfg), Ok(Some((24, 10))));
        assert!(plan.explain().contains("passes of 10 tokens or more run the first 24 layers there"), "{}", plan.explain());
        let why = |c: crate::EngineConfig| plan.accel_for(&c).unwrap_err();
        assert!(why(crate::EngineConfig { n_batch: 8, ..Default::default() }).contains("batch size's 8 tokens"));
        assert!(why(crate::EngineConfig { batch_invariant: true, ..Default::default() }).contains("--batch-invariant"));
        assert!(why(crate::EngineConfig { accel_split: true, ..Default::default() }).contains("--accel-split"));
        assert!(why(crate::EngineConfig { kv_layout: corelm_kernels::attention::KeyLayout::Columns, ..Default::default() }).contains("--kv-layout columns"));
        assert_eq!(plan.accel_for(&crate::EngineConfig { accel_layers: 4, ..Default::default() }), Ok(None));
        let cpu_only = Plan { accel: Some(AccelPlan::choose("gpu".into(), 24, vec![AccelPoint { tokens: 64, cpu_s: 1.0, device_s: 2.0 }])), ..plan.clone() };
        assert_eq!(cpu_only.accel_for(&cfg), Ok(None));
        assert!(cpu_only.explain().contains("slower than the CPU at 64 tokens"));
    }
}
