//! FFN activation sparsity (KAIROX on the CPU, CATS/TEAL-style thresholds): statistics of a
//! model's gated activations over a text, kept in a sidecar file, and the per-layer thresholds
//! a sparsity level asks for.
//!
//! A neuron `i` of layer `l` fires for a token when `|act(gate · x)_i| > θ_l`; the gate product
//! is computed densely, so it is an exact predictor, and a neuron that does not fire costs
//! neither its up row nor its down column (`corelm_core::sched` sparse nodes). Sparsity `s`
//! of a layer is the fraction of (token, neuron) pairs that do not fire.
//!
//! [`collect`] runs the dense model over a text twice with a [`Tap`] on every `Glu` node:
//! - pass 1: a histogram of `|act|` per layer (log-spaced bins, 32 per octave), from which any
//!   quantile — the threshold of any sparsity — is read ([`Sidecar::threshold`]);
//! - pass 2, at the thresholds of the level grid ([`LEVELS`]): per layer and level the
//!   relative error the skipped neurons cause in the FFN output, estimated as
//!   `Σ_skipped (act·up)² ‖down_i‖² / Σ_all (act·up)² ‖down_i‖²` (columns of down taken as
//!   orthogonal) — what the greedy allocation spends; per neuron how often it fires at the
//!   [`REPORT`] levels; and KAIROX Fig. 8's reactivation probability: for a neuron that fires
//!   at token t, the chance it fires again at t + δ (δ = 1..8), next to its base rate; and
//!   which neurons fired for a sample of tokens, from which [`crate::coact`] groups the
//!   neurons that fire together (METIS; KAIROX §5.2) for each size of [`coact::GROUP_SIZES`].
//!
//! [`Sidecar::thresholds`] turns a target sparsity into per-layer thresholds: the same
//! sparsity in every layer ([`Allocation::Uniform`]) or a greedy allocation that raises, 5 % at
//! a time, the layer whose error grows least until the mean reaches the target
//! ([`Allocation::Greedy`], TEAL's greedy on the estimated errors).

use crate::coact::{self, CoGraph};
use crate::{Engine, Error};
use corelm_core::sched::gate_activation;
use corelm_core::{Graph, Op, Tap, TensorId};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Sparsity levels of the error table: 0, 5, …, 95 %.
pub const LEVELS: usize = 20;
/// Step between two levels.
pub const LEVEL_STEP: f32 = 0.05;
/// Levels whose per-neuron firing and reactivation statistics are kept.
pub const REPORT: [f32; 3] = [0.25, 0.40, 0.50];
/// Largest step δ of the reactivation statistics.
pub const MAX_DELTA: usize = 8;
/// Histogram bins per octave of `|act|`, and the octaves covered (2^-24 .. 2^8).
const BINS_PER_OCTAVE: usize = 32;
const MIN_EXP: i32 = -24;
const OCTAVES: usize = 32;
const BINS: usize = 1 + OCTAVES * BINS_PER_OCTAVE;

/// Firing statistics at one sparsity level.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LevelStats {
    pub sparsity: f32,
    /// `[layer][neuron]`: fraction of tokens it fired for.
    pub freq: Vec<Vec<f32>>,
    /// `[layer][δ - 1]`: P(fires at t + δ | fired at t).
    pub reactivation: Vec<Vec<f64>>,
    /// `[layer]`: P(fires) over all neurons and tokens.
    pub base_rate: Vec<f64>,
    /// Neurons grouped by co-activation, one partition per group size.
    #[serde(default)]
    pub groups: Vec<NeuronGroups>,
}

/// Each layer's neurons cut into groups of `size` that fire together ([`coact::groups`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NeuronGroups {
    pub size: usize,
    /// `[layer]`: a permutation of the neurons, group `g` at `[g·size ..][..size]`, hottest
    /// group first.
    pub members: Vec<Vec<u32>>,
}

impl LevelStats {
    /// The co-activation groups of `size`, if the collection made them.
    pub fn groups_of(&self, size: usize) -> Option<&[Vec<u32>]> {
        self.groups.iter().find(|g| g.size == size).map(|g| &g.members[..])
    }
}

/// What `corelm sparsity collect` writes: a model's activation statistics over a text.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sidecar {
    /// The model file's name and architecture, checked when the file is used.
    pub model: String,
    pub arch: String,
    pub n_layer: usize,
    pub n_ff: usize,
    /// The calibration text and how many tokens of it were run.
    pub text: String,
    pub tokens: usize,
    /// `[layer][bin]`: counts of `|act|` (bin 0: below 2^-24; then 32 per octave).
    pub histogram: Vec<Vec<u64>>,
    /// `[layer][level]`: estimated relative FFN output error at sparsity `level · 5 %`.
    pub error: Vec<Vec<f64>>,
    pub levels: Vec<LevelStats>,
}

/// How a target sparsity is spread over the layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    Uniform,
    Greedy,
}

impl std::str::FromStr for Allocation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uniform" => Ok(Allocation::Uniform),
            "greedy" => Ok(Allocation::Greedy),
            _ => Err(format!("unknown sparsity allocation '{s}' (uniform, greedy)")),
        }
    }
}

fn bin_of(v: f32) -> usize {
    // Below the first octave, and NaN, count as zero.
    if v.is_nan() || v < f32::powi(2.0, MIN_EXP) {
        return 0;
    }
    let b = ((v.log2() - MIN_EXP as f32) * BINS_PER_OCTAVE as f32).floor() as isize;
    1 + b.clamp(0, (BINS - 2) as isize) as usize
}

/// Lower edge of bin `b` (≥ 1).
fn bin_edge(b: usize) -> f32 {
    f32::powf(2.0, MIN_EXP as f32 + (b - 1) as f32 / BINS_PER_OCTAVE as f32)
}

impl Sidecar {
    /// The threshold below which a fraction `s` of layer `il`'s activations lie (log-linear
    /// inside a bin).
    pub fn threshold(&self, il: usize, s: f32) -> f32 {
        let h = &self.histogram[il];
        let total: u64 = h.iter().sum();
        let want = (s.clamp(0.0, 1.0) as f64 * total as f64).max(0.0);
        if want <= 0.0 {
            return 0.0;
        }
        let mut cum = 0u64;
        for (b, &c) in h.iter().enumerate() {
            if (cum + c) as f64 >= want && c > 0 {
                if b == 0 {
                    return bin_edge(1);
                }
                let f = ((want - cum as f64) / c as f64) as f32;
                let (lo, hi) = (bin_edge(b).log2(), bin_edge(b).log2() + 1.0 / BINS_PER_OCTAVE as f32);
                return f32::powf(2.0, lo + f * (hi - lo));
            }
            cum += c;
        }
        f32::INFINITY
    }

    /// Per-layer sparsities for a mean of `target` (0 ≤ target < 0.95).
    pub fn allocate(&self, target: f32, how: Allocation) -> Result<Vec<f32>, Error> {
        if !(0.0..0.95).contains(&target) {
            return Err(Error::Config(format!("sparsity {target} is outside 0 .. 0.95")));
        }
        Ok(match how {
            Allocation::Uniform => vec![target; self.n_layer],
            Allocation::Greedy => {
                let mut lv = vec![0usize; self.n_layer];
                let steps = (target / LEVEL_STEP * self.n_layer as f32).round() as usize;
                for _ in 0..steps {
                    let best = (0..self.n_layer)
                        .filter(|&l| lv[l] + 1 < LEVELS)
                        .min_by(|&a, &b| {
                            let d = |l: usize| self.error[l][lv[l] + 1] - self.error[l][lv[l]];
                            d(a).total_cmp(&d(b))
                        })
                        .expect("levels left below 95 %");
                    lv[best] += 1;
                }
                lv.into_iter().map(|l| l as f32 * LEVEL_STEP).collect()
            }
        })
    }

    /// Per-layer thresholds for a mean sparsity of `target`.
    pub fn thresholds(&self, target: f32, how: Allocation) -> Result<Vec<f32>, Error> {
        let s = self.allocate(target, how)?;
        Ok(s.iter().enumerate().map(|(l, &s)| if s <= 0.0 { -1.0 } else { self.threshold(l, s) }).collect())
    }

    pub fn read(path: &Path) -> Result<Sidecar, Error> {
        corelm_plan::file::read_json(path).map_err(|e| Error::Config(format!("sparsity file {e}")))
    }

    pub fn write(&self, path: &Path) -> Result<(), Error> {
        corelm_plan::file::write_json_compact(path, self).map_err(|e| Error::Config(e.to_string()))
    }

    /// Checks the file is about this model.
    pub fn check(&self, engine: &Engine, model_file: &str) -> Result<(), Error> {
        let h = engine.hyper();
        if self.n_layer != h.n_layer || self.n_ff != h.n_ff || self.arch != h.arch {
            return Err(Error::Config(format!(
                "the sparsity file was collected on {} ({} {} layers × {} neurons), not on {model_file} ({} {} × {})",
                self.model, self.arch, self.n_layer, self.n_ff, h.arch, h.n_layer, h.n_ff
            )));
        }
        Ok(())
    }
}

/// Where `corelm sparsity collect` keeps a model's sidecar by default: `sparsity/<stem>.json`
/// beside the model cache (`~/.cache/corelm/sparsity`).
pub fn default_path(model: &Path) -> PathBuf {
    let stem = model.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "model".into());
    let models = crate::models_dir();
    models.parent().unwrap_or(&models).join("sparsity").join(format!("{stem}.json"))
}

/// Running statistics of a collection pass.
struct State {
    n_ff: usize,
    hist: Vec<Vec<u64>>,
    /// Pass 2 only: thresholds of the level grid and of the reported levels, per layer.
    grid: Option<Vec<Vec<f32>>>,
    report: Vec<Vec<f32>>,
    /// Ones, the up operand of `gate_activation`.
    ones: Vec<f32>,
    /// `‖down_i‖²` per layer and neuron.
    col_norms: Vec<Vec<f32>>,
    err: Vec<Vec<f64>>,
    err_total: Vec<f64>,
    fired: Vec<Vec<Vec<u64>>>,
    react: Vec<Vec<[u64; MAX_DELTA]>>,
    react_den: Vec<Vec<[u64; MAX_DELTA]>>,
    tokens_seen: Vec<u64>,
    act: Vec<f32>,
    /// Pass 2: `[level][layer]` the firing bitsets of every `stride`-th token, up to
    /// `coact::SAMPLE_TOKENS`.
    samples: Vec<Vec<Vec<u64>>>,
    stride: u64,
}

struct Collector {
    state: Mutex<State>,
    kernels: &'static corelm_kernels::Kernels,
}

impl Tap for Collector {
    fn node<'a>(&self, graph: &Graph, id: TensorId, read: &dyn Fn(TensorId) -> &'a [f32]) {
        let t = graph.tensor(id);
        let Op::Glu { gate, up, kind } = t.op else { return };
        let Ok(il) = usize::try_from(t.layer) else { return };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let [n_ff, rows] = t.ne;
        if n_ff != s.n_ff || il >= s.hist.len() {
            return; // not a dense feed-forward of the model (an expert's, a shared one's)
        }
        let (g, u) = (read(gate), read(up));
        let first_token = s.tokens_seen[il];
        s.tokens_seen[il] += rows as u64;
        let words = n_ff.div_ceil(64);
        let mut act = std::mem::take(&mut s.act);
        act.resize(n_ff, 0.0);
        let grid = s.grid.as_ref().map(|g| g[il].clone());
        // Pass 2: each token's firing neurons per reported level, for the reactivation counts.
        let mut bits: Vec<Vec<u64>> = if grid.is_some() { vec![vec![0u64; words * rows]; REPORT.len()] } else { Vec::new() };
        for r in 0..rows {
            gate_activation(self.kernels, kind, &g[r * n_ff..(r + 1) * n_ff], &s.ones, &mut act);
            let Some(grid) = &grid else {
                for &a in &act {
                    s.hist[il][bin_of(a.abs())] += 1;
                }
                continue;
            };
            for i in 0..n_ff {
                let v = act[i].abs();
                let e = (act[i] as f64 * u[r * n_ff + i] as f64).powi(2) * s.col_norms[il][i] as f64;
                // Skipped at every level whose threshold is at least v.
                let first = grid.iter().position(|&th| v <= th).unwrap_or(LEVELS);
                if first < LEVELS {
                    s.err[il][first] += e;
                }
                s.err_total[il] += e;
                for (k, b) in bits.iter_mut().enumerate() {
                    if v > s.report[il][k] {
                        s.fired[k][il][i] += 1;
                        b[r * words + i / 64] |= 1 << (i % 64);
                    }
                }
            }
        }
        s.act = act;
        if s.grid.is_none() {
            return;
        }
        let stride = s.stride.max(1);
        for (k, b) in bits.iter().enumerate() {
            for r in 0..rows {
                let kept = &mut s.samples[k][il];
                if (first_token + r as u64).is_multiple_of(stride) && kept.len() < coact::SAMPLE_TOKENS * words {
                    kept.extend_from_slice(&b[r * words..(r + 1) * words]);
                }
                let at = &b[r * words..(r + 1) * words];
                let n: u64 = at.iter().map(|w| w.count_ones() as u64).sum();
                for d in (1..=MAX_DELTA).take_while(|&d| r + d < rows) {
                    let later = &b[(r + d) * words..(r + d + 1) * words];
                    let both: u64 = at.iter().zip(later).map(|(x, y)| (x & y).count_ones() as u64).sum();
                    s.react[k][il][d - 1] += both;
                    s.react_den[k][il][d - 1] += n;
                }
            }
        }
    }
}

/// `‖column i‖²` of layer `il`'s down matrix (`blk.il.ffn_down.weight`, `[n_ff, n_embd]`);
/// ones where the model names it otherwise.
pub(crate) fn down_column_norms(engine: &Engine, il: usize, n_ff: usize) -> Vec<f32> {
    let g = engine.gguf();
    let Some(t) = g.tensor(&format!("blk.{il}.ffn_down.weight")) else { return vec![1.0; n_ff] };
    let Some(to_float) = engine.kernels().to_float(t.dtype) else { return vec![1.0; n_ff] };
    if t.shape[0] as usize != n_ff {
        return vec![1.0; n_ff];
    }
    let start = (g.data_start() + t.offset) as usize;
    let bytes = &g.bytes()[start..start + t.n_bytes as usize];
    let rb = corelm_kernels::row_bytes(t.dtype, n_ff);
    let mut row = vec![0f32; n_ff];
    let mut norms = vec![0f32; n_ff];
    for r in bytes.chunks_exact(rb) {
        to_float(r, &mut row);
        for (n, &v) in norms.iter_mut().zip(&row) {
            *n += v * v;
        }
    }
    norms
}

/// Run `tokens` through `engine` (dense) in chunks of `n_ctx`, twice, and gather a
/// [`Sidecar`]. `progress(pass, chunk, chunks)` after each chunk.
pub fn collect(engine: &mut Engine, tokens: &[u32], n_ctx: usize, model: &str, text: &str, mut progress: impl FnMut(usize, usize, usize)) -> Result<Sidecar, Error> {
    if engine.config().sparsity.is_some() {
        return Err(Error::Config("collect runs the dense model: load it without --sparsity".into()));
    }
    if engine.tp_degree() > 1 {
        return Err(Error::Config(format!("collect reads whole layers' activations: load the model without --tp {}", engine.tp_degree())));
    }
    let n_expert = crate::engine::expert_count(engine.gguf());
    if n_expert > 0 {
        return Err(Error::Config(format!("activation statistics are of dense feed-forwards; this model's are mixtures of {n_expert} experts")));
    }
    let h = engine.hyper().clone();
    let n_ctx = n_ctx.min(engine.config().n_ctx).min(engine.config().n_batch);
    if tokens.len() < n_ctx || n_ctx < 2 {
        return Err(Error::Config(format!("the text has {} tokens; collecting needs at least {n_ctx}", tokens.len())));
    }
    let n_layer = h.n_layer;
    let state = State {
        n_ff: h.n_ff,
        hist: vec![vec![0; BINS]; n_layer],
        grid: None,
        report: Vec::new(),
        ones: vec![1.0; h.n_ff],
        col_norms: Vec::new(),
        err: vec![vec![0.0; LEVELS]; n_layer],
        err_total: vec![0.0; n_layer],
        fired: vec![vec![vec![0; h.n_ff]; n_layer]; REPORT.len()],
        react: vec![vec![[0; MAX_DELTA]; n_layer]; REPORT.len()],
        react_den: vec![vec![[0; MAX_DELTA]; n_layer]; REPORT.len()],
        tokens_seen: vec![0; n_layer],
        act: Vec::new(),
        samples: vec![vec![Vec::new(); n_layer]; REPORT.len()],
        stride: 1,
    };
    let tap = Arc::new(Collector { state: Mutex::new(state), kernels: engine.kernels() });
    let chunks = tokens.len() / n_ctx;
    tap.state.lock().unwrap_or_else(|e| e.into_inner()).stride = (chunks * n_ctx / coact::SAMPLE_TOKENS).max(1) as u64;
    let mut run_pass = |engine: &mut Engine, pass: usize| -> Result<(), Error> {
        for c in 0..chunks {
            engine.clear_seq(0);
            engine.feed(0, &tokens[c * n_ctx..(c + 1) * n_ctx], false, |_| {})?;
            progress(pass, c, chunks);
        }
        engine.clear_seq(0);
        Ok(())
    };
    engine.set_tap(Some(tap.clone()));
    let r1 = run_pass(engine, 1);
    let mut side = Sidecar {
        model: model.to_string(),
        arch: h.arch.clone(),
        n_layer,
        n_ff: h.n_ff,
        text: text.to_string(),
        tokens: chunks * n_ctx,
        histogram: Vec::new(),
        error: Vec::new(),
        levels: Vec::new(),
    };
    let r2 = r1.and_then(|_| {
        let mut s = tap.state.lock().unwrap_or_else(|e| e.into_inner());
        side.histogram = s.hist.clone();
        s.grid = Some((0..n_layer).map(|l| (0..LEVELS).map(|k| if k == 0 { -1.0 } else { side.threshold(l, k as f32 * LEVEL_STEP) }).collect()).collect());
        s.report = (0..n_layer).map(|l| REPORT.iter().map(|&r| side.threshold(l, r)).collect()).collect();
        s.col_norms = (0..n_layer).map(|l| down_column_norms(engine, l, h.n_ff)).collect();
        s.tokens_seen.iter_mut().for_each(|t| *t = 0);
        drop(s);
        run_pass(engine, 2)
    });
    engine.set_tap(None);
    r2?;
    let s = tap.state.lock().unwrap_or_else(|e| e.into_inner());
    side.error = (0..n_layer)
        .map(|l| {
            let mut cum = 0.0;
            (0..LEVELS)
                .map(|k| {
                    cum += s.err[l][k];
                    if s.err_total[l] > 0.0 { cum / s.err_total[l] } else { 0.0 }
                })
                .collect()
        })
        .collect();
    side.levels = REPORT
        .iter()
        .enumerate()
        .map(|(k, &sp)| {
            let n = |l: usize| s.tokens_seen[l].max(1) as f64;
            LevelStats {
                sparsity: sp,
                freq: (0..n_layer).map(|l| s.fired[k][l].iter().map(|&c| (c as f64 / n(l)) as f32).collect()).collect(),
                reactivation: (0..n_layer)
                    .map(|l| (0..MAX_DELTA).map(|d| s.react[k][l][d] as f64 / s.react_den[k][l][d].max(1) as f64).collect())
                    .collect(),
                base_rate: (0..n_layer).map(|l| s.fired[k][l].iter().sum::<u64>() as f64 / (n(l) * h.n_ff as f64)).collect(),
                groups: Vec::new(),
            }
        })
        .collect();
    // Co-activation groups: one graph per level and layer, cut for every group size.
    let sizes: Vec<usize> = coact::GROUP_SIZES.into_iter().filter(|&g| h.n_ff.is_multiple_of(g) && h.n_ff / g > 1).collect();
    for (k, level) in side.levels.iter_mut().enumerate() {
        let graphs: Vec<CoGraph> = (0..n_layer).map(|l| CoGraph::new(&s.samples[k][l], h.n_ff)).collect();
        level.groups = sizes.iter().map(|&size| NeuronGroups { size, members: graphs.iter().map(|g| g.groups(size)).collect() }).collect();
    }
    Ok(side)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sidecar(hist: Vec<Vec<u64>>, error: Vec<Vec<f64>>) -> Sidecar {
        Sidecar {
            model: "m".into(),
            arch: "llama".into(),
            n_layer: hist.len(),
            n_ff: 4,
            text: "t".into(),
            tokens: 1,
            histogram: hist,
            error,
            levels: Vec::new(),
        }
    }

    #[test]
    fn thresholds_are_quantiles_of_the_histogram() {
        let mut h = vec![0u64; BINS];
        // Equal counts in the bins of 1/8, 1/4, 1/2 and 1.
        for v in [0.125f32, 0.25, 0.5, 1.0] {
            h[bin_of(v)] += 100;
        }
        let s = sidecar(vec![h], vec![vec![0.0; LEVELS]]);
        assert_eq!(s.threshold(0, 0.0), 0.0);
        let t = s.threshold(0, 0.5); // all of the 1/4 bin, none of the 1/2 bin
        assert!((t / 0.25 - 2f32.powf(1.0 / 32.0)).abs() < 1e-4, "{t}");
        assert!(s.threshold(0, 0.25) > 0.125 && s.threshold(0, 0.25) < 0.13);
        assert_eq!(bin_of(0.0), 0);
        assert_eq!(bin_of(f32::NAN), 0);
        assert_eq!(bin_of(1e9), BINS - 1);
    }

    #[test]
    fn greedy_allocation_spends_sparsity_where_error_grows_least() {
        // Layer 0's error rises fast, layer 1's slowly: greedy puts more sparsity on layer 1,
        // and the mean is the target.
        let fast: Vec<f64> = (0..LEVELS).map(|k| (k as f64 * 0.05).powi(2) * 4.0).collect();
        let slow: Vec<f64> = (0..LEVELS).map(|k| (k as f64 * 0.05).powi(2)).collect();
        let s = sidecar(vec![vec![1; BINS], vec![1; BINS]], vec![fast, slow]);
        let a = s.allocate(0.4, Allocation::Greedy).unwrap();
        assert!(a[1] > a[0], "{a:?}");
        assert!(((a[0] + a[1]) / 2.0 - 0.4).abs() < 1e-6, "{a:?}");
        assert_eq!(s.allocate(0.4, Allocation::Uniform).unwrap(), vec![0.4, 0.4]);
        assert!(s.allocate(0.99, Allocation::Uniform).is_err());
        // Sparsity 0 leaves a layer dense (a negative threshold).
        assert_eq!(s.thresholds(0.0, Allocation::Uniform).unwrap(), vec![-1.0, -1.0]);
    }
}
