//! The adjacent-layer activation predictor (KAIROX §5.1; Deja Vu's low-rank classifiers):
//! from layer `l − 1`'s FFN input (its attention output, normalized), a low-rank model
//! predicts which neurons of layer `l` will fire, so layer `l`'s work can be planned (and its
//! gate rows of silent neurons skipped) while layer `l − 1` still runs. Layer 0, which has no
//! predecessor, predicts from its own FFN input.
//!
//! Model per layer: `p = σ(B·(A·x) + c)`, `A`: `[rank, n_embd]`, `B`: `[n_ff, rank]`, trained
//! here by Adam on binary cross-entropy over traces of the dense model ([`trace`]: FFN inputs
//! and which neurons fired at the calibration's thresholds). A neuron is predicted to fire when
//! its logit is above the layer's cut, chosen for a recall target (missing a firing neuron
//! costs quality; predicting a silent one only costs its rows) on the last training tokens,
//! which the fit did not see (a cut chosen on the fitted tokens is optimistic: held out, its
//! recall came 0.01–0.03 below the target), and recall and precision are reported on held-out
//! tokens ([`Quality`]).
//!
//! Not every missed neuron costs the same: a neuron just above its threshold adds little to the
//! layer's output, one far above it a lot. The trace keeps each firing neuron's **mass**, the
//! size of what it adds, `|act(gate)·up|·‖down column‖` (the norm of its term in the FFN
//! output). [`Target::Mass`] fits with each firing example weighted by its mass and cuts for a
//! share of the firing mass instead of the firing count; [`Quality::mass_recall`] reports that
//! share either way.

use crate::{Engine, Error};
use corelm_core::sched::gate_activation;
use corelm_core::{Graph, Op, Tap, TensorId};
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};

/// FFN inputs and firing, token by token, per layer.
pub struct Trace {
    pub n_embd: usize,
    pub n_ff: usize,
    /// `[layer]`: `[tokens × n_embd]` FFN inputs.
    pub x: Vec<Vec<f32>>,
    /// `[layer]`: `[tokens × words]` firing bitsets (`words = n_ff.div_ceil(64)`).
    pub fired: Vec<Vec<u64>>,
    /// `[layer]`: `[tokens × n_ff]` each neuron's mass `|act(gate)·up|·‖down_n‖` as bfloat16
    /// bits ([`bf16`]), 0 where it does not fire.
    pub mass: Vec<Vec<u16>>,
}

impl Trace {
    pub fn tokens(&self) -> usize {
        self.x.first().map_or(0, |x| x.len() / self.n_embd)
    }

    fn words(&self) -> usize {
        self.n_ff.div_ceil(64)
    }

    fn empty() -> Trace {
        Trace { n_embd: 0, n_ff: 0, x: Vec::new(), fired: Vec::new(), mass: Vec::new() }
    }
}

/// `x` as bfloat16 bits, rounded to nearest even (masses only need a few digits: half the
/// trace's memory of f32).
pub fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of bfloat16 bits.
pub fn from_bf16(v: u16) -> f32 {
    f32::from_bits(u32::from(v) << 16)
}

struct Tracer {
    state: Mutex<Trace>,
    thresholds: Vec<f32>,
    /// `[layer][neuron]`: the norm of the neuron's column of down.
    down_norms: Vec<Vec<f32>>,
    max_tokens: usize,
    kernels: &'static corelm_kernels::Kernels,
}

impl Tap for Tracer {
    fn node<'a>(&self, graph: &Graph, id: TensorId, read: &dyn Fn(TensorId) -> &'a [f32]) {
        let t = graph.tensor(id);
        let Op::Glu { gate, up, kind } = t.op else { return };
        let Ok(il) = usize::try_from(t.layer) else { return };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let [n_ff, rows] = t.ne;
        if n_ff != s.n_ff || il >= s.x.len() {
            return;
        }
        // The FFN input: the gate product's operand, before its quantization.
        let Op::MatMul { x: xq, .. } = graph.tensor(gate).op else { return };
        let x = match graph.tensor(xq).op {
            Op::Quantize { x, .. } => x,
            _ => xq,
        };
        let (g, u, xs) = (read(gate), read(up), read(x));
        let (n_embd, words) = (s.n_embd, s.words());
        let take = rows.min(self.max_tokens.saturating_sub(s.x[il].len() / n_embd));
        let (mut act, ones) = (vec![0f32; n_ff], vec![1f32; n_ff]);
        let norms = &self.down_norms[il];
        for r in 0..take {
            s.x[il].extend_from_slice(&xs[r * n_embd..(r + 1) * n_embd]);
            gate_activation(self.kernels, kind, &g[r * n_ff..(r + 1) * n_ff], &ones, &mut act);
            let at = s.fired[il].len();
            s.fired[il].resize(at + words, 0);
            s.mass[il].resize((at / words + 1) * n_ff, 0);
            let u = &u[r * n_ff..(r + 1) * n_ff];
            for (n, a) in act.iter().enumerate() {
                if a.abs() > self.thresholds[il] {
                    s.fired[il][at + n / 64] |= 1 << (n % 64);
                    s.mass[il][at / words * n_ff + n] = bf16((a * u[n]).abs() * norms[n]);
                }
            }
        }
    }
}

/// What tracing needs besides the text: the per-layer thresholds at which a neuron fires, and
/// the norms of down's columns (a firing neuron's mass), read from the model once for any number
/// of traces.
pub struct TraceSetup {
    thresholds: Vec<f32>,
    /// `[layer][neuron]`: the norm of the neuron's column of down.
    down_norms: Vec<Vec<f32>>,
}

impl TraceSetup {
    /// For `engine`'s model firing at `thresholds` (one per layer).
    pub fn new(engine: &Engine, thresholds: &[f32]) -> Result<Self, Error> {
        let h = engine.hyper();
        if thresholds.len() != h.n_layer {
            return Err(Error::Config(format!("{} thresholds for {} layers", thresholds.len(), h.n_layer)));
        }
        let down_norms = (0..h.n_layer).map(|l| crate::sparsity::down_column_norms(engine, l, h.n_ff).iter().map(|n| n.sqrt()).collect()).collect();
        Ok(TraceSetup { thresholds: thresholds.to_vec(), down_norms })
    }
}

/// Run `tokens` through `engine` (dense) in chunks of `n_ctx` and keep the first `max_tokens`
/// tokens' FFN inputs, firing and masses at `setup`'s thresholds.
pub fn trace(engine: &mut Engine, tokens: &[u32], n_ctx: usize, setup: &TraceSetup, max_tokens: usize) -> Result<Trace, Error> {
    if engine.config().sparsity.is_some() {
        return Err(Error::Config("tracing runs the dense model: load it without --sparsity".into()));
    }
    if engine.tp_degree() > 1 {
        return Err(Error::Config(format!("tracing reads whole layers' activations: load the model without --tp {}", engine.tp_degree())));
    }
    let h = engine.hyper().clone();
    if setup.down_norms.len() != h.n_layer || setup.down_norms.iter().any(|n| n.len() != h.n_ff) {
        return Err(Error::Config("the trace setup is of another model".into()));
    }
    let n_ctx = n_ctx.min(engine.config().n_ctx).min(engine.config().n_batch);
    let n = h.n_layer;
    let trace = Trace { n_embd: h.n_embd, n_ff: h.n_ff, x: vec![Vec::new(); n], fired: vec![Vec::new(); n], mass: vec![Vec::new(); n] };
    let tap = Arc::new(Tracer { state: Mutex::new(trace), thresholds: setup.thresholds.clone(), down_norms: setup.down_norms.clone(), max_tokens, kernels: engine.kernels() });
    engine.set_tap(Some(tap.clone()));
    let mut run = || -> Result<(), Error> {
        for chunk in tokens.chunks(n_ctx).take(max_tokens.div_ceil(n_ctx)) {
            engine.clear_seq(0);
            engine.feed(0, chunk, false, |_| {})?;
        }
        engine.clear_seq(0);
        Ok(())
    };
    let r = run();
    engine.set_tap(None);
    r?;
    let t = std::mem::replace(&mut *tap.state.lock().unwrap_or_else(|e| e.into_inner()), Trace::empty());
    Ok(t)
}

/// Training settings.
#[derive(Clone, Copy, Debug)]
pub struct TrainOptions {
    pub rank: usize,
    pub epochs: usize,
    pub batch: usize,
    pub lr: f32,
    /// Recall the cut is chosen for, on the training tokens `cut_share` holds back: of the
    /// firing neurons or of their mass ([`Target`]).
    pub recall: f64,
    pub target: Target,
    /// With [`Target::Mass`], the cut also keeps at least this share of the firing neurons
    /// (0: no floor).
    pub min_recall: f64,
    /// Neurons whose largest mass among the fitted tokens is at least `pin` times the layer's
    /// mean firing mass are always predicted (bias [`PINNED_BIAS`]); 0: none. The massive
    /// activations of a sequence's first tokens (attention sinks) come from a few such
    /// neurons, and a low-rank model of the previous layer misses them.
    pub pin: f32,
    /// Share of the training tokens (the last) not fitted but used to choose the cut; 0: the
    /// cut is chosen on the fitted tokens.
    pub cut_share: f64,
    pub seed: u64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions { rank: 32, epochs: 6, batch: 32, lr: 2e-3, recall: 0.95, target: Target::Mass, min_recall: 0.92, pin: 64.0, cut_share: 0.125, seed: 1 }
    }
}

/// What a predictor's recall target counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Firing neurons: every one weighs the same in the fit, and the cut keeps `recall` of them.
    Count,
    /// Firing mass ([`Trace::mass`]): each firing example weighs its mass over the layer's mean
    /// in the fit (at most [`MAX_WEIGHT`]), and the cut keeps `recall` of the summed mass.
    Mass,
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "count" => Ok(Target::Count),
            "mass" => Ok(Target::Mass),
            _ => Err(format!("unknown recall target '{s}' (count, mass)")),
        }
    }
}

/// The largest weight one firing example gets in a [`Target::Mass`] fit: a few huge
/// activations would otherwise decide the whole fit.
pub const MAX_WEIGHT: f32 = 16.0;

/// One layer's low-rank predictor.
#[derive(Clone, Debug)]
pub struct LowRank {
    pub rank: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    /// `[rank × n_embd]`, `[n_ff × rank]`, `[n_ff]`.
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub c: Vec<f32>,
    /// Neurons whose logit is above this are predicted to fire.
    pub cut: f32,
}

/// Recall and precision of a predictor on some tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Quality {
    /// Firing neurons predicted / firing neurons.
    pub recall: f64,
    /// Mass of the firing neurons predicted / mass of the firing neurons (NaN without masses).
    pub mass_recall: f64,
    /// The largest mass of one firing neuron not predicted, over the mean firing mass (NaN
    /// without masses): a massive activation missed shows here, not in the recalls.
    pub worst_miss: f64,
    /// Firing neurons predicted / neurons predicted.
    pub precision: f64,
    /// Neurons predicted / all (the rows the layer would read).
    pub predicted: f64,
    /// Neurons firing / all.
    pub firing: f64,
}

impl LowRank {
    /// Logits of `x` (`hidden`: `rank` scratch values) into `z` (`n_ff`).
    pub fn logits(&self, x: &[f32], hidden: &mut [f32], z: &mut [f32]) {
        for (h, a) in hidden.iter_mut().zip(self.a.chunks_exact(self.n_embd)) {
            *h = dot(a, x);
        }
        for ((z, b), &c) in z.iter_mut().zip(self.b.chunks_exact(self.rank)).zip(&self.c) {
            *z = dot(b, hidden) + c;
        }
    }

    /// Neurons always predicted ([`TrainOptions::pin`]).
    pub fn pinned(&self) -> usize {
        self.c.iter().filter(|&&c| c == PINNED_BIAS).count()
    }

    /// Recall and precision over `xs` (`[tokens × n_embd]`) against `fired`, and the mass
    /// recall against `mass` (`[tokens × n_ff]`, or empty).
    pub fn quality(&self, xs: &[f32], fired: &[u64], mass: &[u16]) -> Quality {
        let words = self.n_ff.div_ceil(64);
        let (mut h, mut z) = (vec![0f32; self.rank], vec![0f32; self.n_ff]);
        let (mut tp, mut pred, mut pos, mut all) = (0u64, 0u64, 0u64, 0u64);
        let (mut kept, mut total) = (0f64, 0f64);
        let mut worst = 0f64;
        for (t, (x, y)) in xs.chunks_exact(self.n_embd).zip(fired.chunks_exact(words)).enumerate() {
            self.logits(x, &mut h, &mut z);
            let w = mass.get(t * self.n_ff..(t + 1) * self.n_ff);
            for (n, &zn) in z.iter().enumerate() {
                let (p, f) = (zn > self.cut, y[n / 64] >> (n % 64) & 1 == 1);
                tp += u64::from(p && f);
                pred += u64::from(p);
                pos += u64::from(f);
                if let (true, Some(w)) = (f, w) {
                    let m = f64::from(from_bf16(w[n]));
                    total += m;
                    kept += if p { m } else { 0.0 };
                    if !p {
                        worst = worst.max(m);
                    }
                }
            }
            all += self.n_ff as u64;
        }
        let r = |a: u64, b: u64| if b == 0 { 1.0 } else { a as f64 / b as f64 };
        let (mass_recall, worst_miss) = match (mass.is_empty(), total == 0.0) {
            (true, _) => (f64::NAN, f64::NAN),
            (false, true) => (1.0, 0.0),
            (false, false) => (kept / total, worst / (total / pos as f64)),
        };
        Quality { recall: r(tp, pos), mass_recall, worst_miss, precision: r(tp, pred), predicted: r(pred, all), firing: r(pos, all) }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight lanes so the compiler vectorizes the sum.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Adam state of one parameter vector.
struct Adam {
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Adam {
    fn new(n: usize) -> Self {
        Adam { m: vec![0.0; n], v: vec![0.0; n] }
    }

    fn step(&mut self, p: &mut [f32], g: &[f32], lr: f32, t: i32) {
        let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for ((p, &g), (m, v)) in p.iter_mut().zip(g).zip(self.m.iter_mut().zip(self.v.iter_mut())) {
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            *p -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
        }
    }
}

/// Train a predictor of `fired` (`[tokens × words]`, with their `mass`, `[tokens × n_ff]`)
/// from `xs` (`[tokens × n_embd]`): fitted on the first tokens, its cut chosen for
/// `opts.recall` of `opts.target` on the last `opts.cut_share` of them (on all of them when
/// that share is 0 or leaves nothing to fit).
pub fn train(xs: &[f32], fired: &[u64], mass: &[u16], n_embd: usize, n_ff: usize, opts: &TrainOptions) -> LowRank {
    let (r, words) = (opts.rank, n_ff.div_ceil(64));
    let all = xs.len() / n_embd;
    let by_mass = opts.target == Target::Mass;
    assert!(!by_mass || mass.len() == all * n_ff, "a mass target needs the trace's masses");
    let held = (all as f64 * opts.cut_share.clamp(0.0, 1.0)) as usize;
    let n = if held == 0 || held >= all { all } else { all - held };
    let cut_from = if n < all { n } else { 0 };
    let (cut_xs, cut_fired) = (&xs[cut_from * n_embd..], &fired[cut_from * words..]);
    let cut_mass = if by_mass { &mass[cut_from * n_ff..] } else { &[][..] };
    let (xs, fired) = (&xs[..n * n_embd], &fired[..n * words]);
    // The mean firing mass and each neuron's largest mass on the fitted tokens.
    let (mut sum, mut k, mut largest) = (0f64, 0u64, vec![0f32; if mass.is_empty() { 0 } else { n_ff }]);
    for t in mass.get(..n * n_ff).unwrap_or(&[]).chunks_exact(n_ff) {
        for (l, &m) in largest.iter_mut().zip(t).filter(|(_, &m)| m != 0) {
            let m = from_bf16(m);
            (sum, k, *l) = (sum + f64::from(m), k + 1, l.max(m));
        }
    }
    let mean = if k == 0 { 1.0 } else { (sum / k as f64) as f32 };
    // Per firing example its weight in the fit: 1, or its mass over the mean firing mass.
    let fit = if by_mass { &mass[..n * n_ff] } else { &[][..] };
    let weight_of = |s: usize, i: usize| fit.get(s * n_ff + i).map_or(1.0, |&m| (from_bf16(m) / mean).min(MAX_WEIGHT));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(opts.seed);
    let mut normal = |scale: f32| (rng.random::<f32>() + rng.random::<f32>() + rng.random::<f32>() - 1.5) * 2.0 * scale;
    let a: Vec<f32> = (0..r * n_embd).map(|_| normal(1.0 / (n_embd as f32).sqrt())).collect();
    let b: Vec<f32> = (0..n_ff * r).map(|_| normal(1.0 / (r as f32).sqrt())).collect();
    // Biases start at each neuron's firing log-odds.
    let c: Vec<f32> = (0..n_ff)
        .map(|i| {
            let k = fired.chunks_exact(words).filter(|y| y[i / 64] >> (i % 64) & 1 == 1).count();
            let p = (k as f32 + 0.5) / (n as f32 + 1.0);
            (p / (1.0 - p)).ln()
        })
        .collect();
    let mut m = LowRank { rank: r, n_embd, n_ff, a, b, c, cut: 0.0 };
    let (mut ga, mut gb, mut gc) = (vec![0f32; r * n_embd], vec![0f32; n_ff * r], vec![0f32; n_ff]);
    let (mut oa, mut ob, mut oc) = (Adam::new(ga.len()), Adam::new(gb.len()), Adam::new(gc.len()));
    let (mut h, mut z, mut dh) = (vec![0f32; r], vec![0f32; n_ff], vec![0f32; r]);
    let mut order: Vec<usize> = (0..n).collect();
    let mut t = 0;
    for _ in 0..opts.epochs {
        // Shuffle the tokens each epoch.
        for i in (1..n).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        for batch in order.chunks(opts.batch) {
            ga.fill(0.0);
            gb.fill(0.0);
            gc.fill(0.0);
            let scale = 1.0 / batch.len() as f32;
            for &s in batch {
                let (x, y) = (&xs[s * n_embd..(s + 1) * n_embd], &fired[s * words..(s + 1) * words]);
                m.logits(x, &mut h, &mut z);
                dh.fill(0.0);
                for (i, (&zi, (gbi, bi))) in z.iter().zip(gb.chunks_exact_mut(r).zip(m.b.chunks_exact(r))).enumerate() {
                    // d(BCE)/dz = σ(z) − y, a firing example's weighted (`weight_of`).
                    let on = y[i / 64] >> (i % 64) & 1 == 1;
                    let dz = (1.0 / (1.0 + (-zi).exp()) - f32::from(u8::from(on))) * scale * if on { weight_of(s, i) } else { 1.0 };
                    gc[i] += dz;
                    for k in 0..r {
                        gbi[k] += dz * h[k];
                        dh[k] += dz * bi[k];
                    }
                }
                for (gak, &d) in ga.chunks_exact_mut(n_embd).zip(&dh) {
                    gak.iter_mut().zip(x).for_each(|(g, &xv)| *g += d * xv);
                }
            }
            t += 1;
            oa.step(&mut m.a, &ga, opts.lr, t);
            ob.step(&mut m.b, &gb, opts.lr, t);
            oc.step(&mut m.c, &gc, opts.lr, t);
        }
    }
    // Neurons with a massive activation among the fitted tokens are always predicted.
    if opts.pin > 0.0 {
        for (c, _) in m.c.iter_mut().zip(&largest).filter(|(_, &l)| l >= opts.pin * mean) {
            *c = PINNED_BIAS;
        }
    }
    m.cut = cut_for_recall(&m, cut_xs, cut_fired, cut_mass, opts.recall);
    if by_mass && opts.min_recall > 0.0 {
        m.cut = m.cut.min(cut_for_recall(&m, cut_xs, cut_fired, &[], opts.min_recall));
    }
    m
}

/// The bias of a pinned neuron ([`TrainOptions::pin`]): its logit is above any cut.
pub const PINNED_BIAS: f32 = 1e30;

/// The largest cut whose recall on `xs` is at least `recall`: of the firing neurons, or with
/// `mass` (`[tokens × n_ff]`, non-empty) of their summed mass.
fn cut_for_recall(m: &LowRank, xs: &[f32], fired: &[u64], mass: &[u16], recall: f64) -> f32 {
    let words = m.n_ff.div_ceil(64);
    let (mut h, mut z) = (vec![0f32; m.rank], vec![0f32; m.n_ff]);
    // (logit, weight) of every firing example.
    let mut firing: Vec<(f32, f32)> = Vec::new();
    for (t, (x, y)) in xs.chunks_exact(m.n_embd).zip(fired.chunks_exact(words)).enumerate() {
        m.logits(x, &mut h, &mut z);
        let w = |n: usize| if mass.is_empty() { 1.0 } else { from_bf16(mass[t * m.n_ff + n]) };
        firing.extend(z.iter().enumerate().filter(|(n, _)| y[n / 64] >> (n % 64) & 1 == 1).map(|(n, &v)| (v, w(n))));
    }
    if firing.is_empty() {
        return f32::INFINITY;
    }
    firing.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Keep the top `recall` of the firing weight: the cut sits just below the smallest logit
    // kept. Counting, the examples missed are the first `⌊(1 − recall)·n⌋`.
    let miss = if mass.is_empty() {
        ((1.0 - recall) * firing.len() as f64).floor() as usize
    } else {
        let total: f64 = firing.iter().map(|&(_, w)| f64::from(w)).sum();
        let budget = (1.0 - recall) * total;
        let mut lost = 0.0;
        firing.iter().take_while(|&&(_, w)| {
            lost += f64::from(w);
            lost <= budget
        }).count()
    };
    let v = firing[miss.min(firing.len() - 1)].0;
    v - v.abs().max(1.0) * 1e-6
}

/// Per layer: the predictor of layer `l` (from layer `l − 1`'s FFN input; layer 0 from its
/// own), trained on the first `train_frac` of the trace, and its quality on the rest.
pub fn train_all(trace: &Trace, train_frac: f64, opts: &TrainOptions) -> Vec<(LowRank, Quality)> {
    let (n_embd, words, n) = (trace.n_embd, trace.words(), trace.tokens());
    let cut = ((n as f64 * train_frac) as usize).clamp(1, n.saturating_sub(1).max(1));
    (0..trace.x.len())
        .map(|l| {
            let (src, y, w, n_ff) = (&trace.x[l.saturating_sub(1)], &trace.fired[l], &trace.mass[l], trace.n_ff);
            let w = if w.len() == n * n_ff { &w[..] } else { &[][..] };
            let wt = w.get(..cut * n_ff).unwrap_or(&[]);
            let m = train(&src[..cut * n_embd], &y[..cut * words], wt, n_embd, n_ff, opts);
            let q = m.quality(&src[cut * n_embd..], &y[cut * words..], w.get(cut * n_ff..).unwrap_or(&[]));
            (m, q)
        })
        .collect()
}

/// The predictors as a GGUF file: per layer `pred.<l>.a` (`[n_embd, rank]` in GGML order),
/// `pred.<l>.b` (`[rank, n_ff]`), `pred.<l>.c` (`[n_ff]`), F32, and metadata `pred.<l>.cut`,
/// `pred.<l>.recall`, `pred.<l>.precision` (held-out), with the model's name and the level.
pub fn to_gguf(models: &[(LowRank, Quality)], model: &str, sparsity: f32) -> Vec<u8> {
    use corelm_gguf::{GgmlType, Value};
    let mut w = corelm_gguf::writer::Writer::new();
    w.kv("general.architecture", Value::String("corelm-predictor".into()));
    w.kv("pred.model", Value::String(model.into()));
    w.kv("pred.sparsity", Value::F32(sparsity));
    w.kv("pred.layers", Value::U32(models.len() as u32));
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for (l, (m, q)) in models.iter().enumerate() {
        w.kv(&format!("pred.{l}.cut"), Value::F32(m.cut));
        w.kv(&format!("pred.{l}.recall"), Value::F32(q.recall as f32));
        w.kv(&format!("pred.{l}.precision"), Value::F32(q.precision as f32));
        w.tensor(&format!("pred.{l}.a"), &[m.n_embd as u64, m.rank as u64], GgmlType::F32, f32s(&m.a));
        w.tensor(&format!("pred.{l}.b"), &[m.rank as u64, m.n_ff as u64], GgmlType::F32, f32s(&m.b));
        w.tensor(&format!("pred.{l}.c"), &[m.n_ff as u64], GgmlType::F32, f32s(&m.c));
    }
    w.to_bytes()
}

/// A predictor file written by [`to_gguf`], in the engine's form (`A` and `B` quantized to
/// Q8_0; the engine checks its sizes against the model's).
pub struct Loaded {
    pub predictors: corelm_core::Predictors,
    pub meta: Meta,
}

/// A predictor file written by [`to_gguf`], as trained (f32).
pub struct Stored {
    pub layers: Vec<LowRank>,
    pub meta: Meta,
}

/// What a predictor file says of itself besides its layers.
pub struct Meta {
    /// The model file it was trained for, and the sparsity level.
    pub model: String,
    pub sparsity: f32,
    /// Per layer: the held-out recall `corelm sparsity predict` measured.
    pub recall: Vec<f32>,
}

/// Read a predictor file written by [`to_gguf`].
pub fn read(path: &std::path::Path) -> Result<Stored, Error> {
    let bad = |what: String| Error::Config(format!("predictor file {}: {what}", path.display()));
    let g = corelm_gguf::Gguf::open(path).map_err(|e| bad(e.to_string()))?;
    if g.opt_str("general.architecture")? != Some("corelm-predictor") {
        return Err(bad("not a predictor file (general.architecture is not corelm-predictor; `corelm sparsity predict` writes them)".into()));
    }
    let layers = g.u64("pred.layers")? as usize;
    let dims = g.tensor("pred.0.b").map(|t| (g.tensor("pred.0.a").map_or(0, |a| a.shape[0]), t.shape[1]));
    let Some((n_embd, n_ff)) = dims.filter(|_| layers > 0) else { return Err(bad("no layers".into())) };
    let (n_embd, n_ff) = (n_embd as usize, n_ff as usize);
    let level = g.f32("pred.sparsity")?;
    let f32s = |name: &str, shape: [u64; 2]| -> Result<Vec<f32>, Error> {
        let t = g.tensor(name).ok_or_else(|| bad(format!("no tensor {name}")))?;
        if t.dtype != corelm_gguf::GgmlType::F32 || [t.shape[0], t.shape[1]] != shape || t.n_elements() != shape[0] * shape[1] {
            return Err(bad(format!("{name} is {:?} {:?}, expected F32 {shape:?}", t.dtype, &t.shape[..2])));
        }
        Ok(g.tensor_data(t).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    };
    let (mut out, mut recall) = (Vec::with_capacity(layers), Vec::with_capacity(layers));
    for l in 0..layers {
        let rank = g.tensor(&format!("pred.{l}.a")).map_or(0, |t| t.shape[1]);
        let a = f32s(&format!("pred.{l}.a"), [n_embd as u64, rank])?;
        let b = f32s(&format!("pred.{l}.b"), [rank, n_ff as u64])?;
        let c = f32s(&format!("pred.{l}.c"), [n_ff as u64, 1])?;
        let cut = g.f32(&format!("pred.{l}.cut"))?;
        out.push(LowRank { rank: rank as usize, n_embd, n_ff, a, b, c, cut });
        recall.push(g.opt_f32(&format!("pred.{l}.recall"))?.unwrap_or(f32::NAN));
    }
    let model = g.opt_str("pred.model")?.unwrap_or("").to_string();
    Ok(Stored { layers: out, meta: Meta { model, sparsity: level, recall } })
}

/// Read a predictor file written by [`to_gguf`], in the engine's form.
pub fn load(path: &std::path::Path) -> Result<Loaded, Error> {
    let Stored { layers, meta } = read(path)?;
    let (n_embd, n_ff) = (layers[0].n_embd, layers[0].n_ff);
    let mut out = Vec::with_capacity(layers.len());
    for (l, m) in layers.iter().enumerate() {
        let p = corelm_core::LayerPredictor::new(m.rank, n_embd, &m.a, &m.b, &m.c, m.cut)
            .map_err(|e| Error::Config(format!("predictor file {}: layer {l}: {e}", path.display())))?;
        out.push(Some(p));
    }
    Ok(Loaded { predictors: corelm_core::Predictors { n_embd, n_ff, layers: out }, meta })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` tokens of 32 inputs whose 128 neurons fire by the sign of one of 4 hidden
    /// directions of x, plus 5 % label noise: a rank-4 rule.
    fn rank4_rule(n: usize) -> Trace {
        let (n_embd, n_ff) = (32, 128);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let dirs: Vec<f32> = (0..4 * n_embd).map(|_| rng.random::<f32>() - 0.5).collect();
        let (mut xs, mut fired, mut mass) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let x: Vec<f32> = (0..n_embd).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
            let proj: Vec<f32> = dirs.chunks_exact(n_embd).map(|d| dot(d, &x)).collect();
            let mut bits = [0u64; 2];
            for i in 0..n_ff {
                let on = (proj[i % 4] > 0.0) != (rng.random::<f32>() < 0.05);
                if on {
                    bits[i / 64] |= 1 << (i % 64);
                }
            }
            xs.extend(x);
            fired.extend(bits);
            // Masses: 1 + the size of the margin where a neuron fires.
            mass.extend((0..n_ff).map(|i| if bits[i / 64] >> (i % 64) & 1 == 1 { bf16(1.0 + proj[i % 4].abs()) } else { 0 }));
        }
        Trace { n_embd, n_ff, x: vec![xs], fired: vec![fired], mass: vec![mass] }
    }

    #[test]
    fn bfloat16_rounds_to_nearest_even() {
        for x in [0.0f32, 1.0, -2.5, 3.0e-5, 19072.0, 1.0e30] {
            let b = bf16(x);
            assert!((from_bf16(b) - x).abs() <= x.abs() / 256.0, "{x}");
        }
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one, 1.
        assert_eq!(from_bf16(bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(from_bf16(bf16(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
    }

    #[test]
    fn the_mass_cut_keeps_the_mass_asked_for() {
        // With masses the cut keeps 0.9 of the held-back tokens' firing mass; counting, 0.9
        // of their firing neurons. The masses grow with the margin, so the mass target misses
        // more neurons (the small ones) for the same share.
        let t = rank4_rule(800);
        let (xs, fired, mass) = (&t.x[0], &t.fired[0], &t.mass[0]);
        let (cx, cf, cm) = (&xs[600 * 32..], &fired[600 * 2..], &mass[600 * 128..]);
        let mut q = [Quality::default(); 2];
        for (k, target) in [Target::Count, Target::Mass].into_iter().enumerate() {
            let opts = TrainOptions { rank: 4, epochs: 4, recall: 0.9, cut_share: 0.25, target, min_recall: 0.0, pin: 0.0, ..Default::default() };
            let m = train(xs, fired, mass, 32, 128, &opts);
            let by = if target == Target::Mass { cm } else { &[][..] };
            assert_eq!(m.cut, cut_for_recall(&m, cx, cf, by, 0.9), "{target:?}");
            q[k] = m.quality(cx, cf, cm);
        }
        assert!(q[0].recall >= 0.9 && q[1].mass_recall >= 0.9, "{q:?}");
        assert!(q[1].recall < q[0].recall && q[1].mass_recall < q[0].mass_recall, "{q:?}");
    }

    #[test]
    fn a_neuron_with_massive_activations_is_pinned() {
        // Neuron 127 fires on 2 % of the tokens at random, with a mass 1000 times the others':
        // nothing in x predicts it. Pinned, it is predicted on every token and nothing of it
        // is missed; unpinned, the predictor misses it.
        let mut t = rank4_rule(800);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for k in 0..800 {
            let on = rng.random::<f32>() < 0.02;
            let bit = &mut t.fired[0][k * 2 + 1];
            *bit = if on { *bit | 1 << 63 } else { *bit & !(1 << 63) };
            t.mass[0][k * 128 + 127] = if on { bf16(2000.0) } else { 0 };
        }
        let (xs, fired, mass) = (&t.x[0], &t.fired[0], &t.mass[0]);
        for pin in [0.0, 64.0] {
            let opts = TrainOptions { rank: 4, epochs: 4, recall: 0.9, pin, ..Default::default() };
            let m = train(&xs[..600 * 32], &fired[..600 * 2], &mass[..600 * 128], 32, 128, &opts);
            let q = m.quality(&xs[600 * 32..], &fired[600 * 2..], &mass[600 * 128..]);
            if pin > 0.0 {
                assert_eq!(m.pinned(), 1);
                assert_eq!(m.c[127], PINNED_BIAS);
                assert!(q.worst_miss < 64.0, "{q:?}");
            } else {
                assert_eq!(m.pinned(), 0);
                assert!(q.worst_miss > 64.0, "{q:?}");
            }
        }
    }

    #[test]
    fn a_low_rank_rule_is_learned_to_the_recall_asked_for() {
        // Held-out recall meets the target, precision far above the base rate (0.5) that
        // guessing would give at that recall.
        let opts = TrainOptions { rank: 8, epochs: 20, ..Default::default() };
        let (_, q) = &train_all(&rank4_rule(1200), 0.75, &opts)[0];
        assert!(q.recall >= 0.88 && q.precision > 0.75, "{q:?}");
        assert!((q.firing - 0.5).abs() < 0.05, "{q:?}");
    }

    #[test]
    fn the_cut_is_chosen_on_tokens_the_fit_did_not_see() {
        let t = rank4_rule(800);
        let (xs, fired) = (&t.x[0], &t.fired[0]);
        for share in [0.0, 0.25] {
            let opts = TrainOptions { rank: 4, epochs: 4, recall: 0.9, cut_share: share, target: Target::Count, ..Default::default() };
            let m = train(xs, fired, &[], 32, 128, &opts);
            // The cut's tokens: the last quarter, or all of them.
            let from = if share > 0.0 { 600 } else { 0 };
            let (cx, cf) = (&xs[from * 32..], &fired[from * 2..]);
            assert_eq!(m.cut, cut_for_recall(&m, cx, cf, &[], 0.9), "share {share}");
            assert!(m.quality(cx, cf, &[]).recall >= 0.9, "share {share}");
        }
    }
}
