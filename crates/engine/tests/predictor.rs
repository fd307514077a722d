//! The adjacent-layer activation predictor (KAIROX §5.1) on SmolLM2: trained here on traces
//! of the dense model at the thresholds of 50 % sparsity, it names far fewer neurons than all
//! of them at the recall it was cut for; loaded into the graph (`--predictor`), the prompt's
//! batched path (dense gate, masked) and the token-by-token path (gate rows of predicted
//! neurons only) keep the same firing set and logits, the recall measured inside the graph on
//! text it was not trained on stays near its target, and the gate rows really read shrink.

mod common;

use common::*;
use corelm_core::{Graph, LayerPredictor, Op, Predictors, Tap, TensorId};
use corelm_engine::predictor::{self, to_gguf, trace, TraceSetup, train_all, LowRank, Quality, Target, TrainOptions};
use corelm_engine::sparsity::{collect, Allocation};
use corelm_engine::{Batch, Engine, EngineConfig, SparseFfn};
use corelm_kernels::DType;
use std::sync::{Arc, Mutex, OnceLock};

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

struct Trained {
    thresholds: Vec<f32>,
    trace: predictor::Trace,
    models: Vec<(LowRank, Quality)>,
    /// The text's tokens: the first 512 traced (384 trained on, 128 held out), the rest unseen.
    tokens: Vec<u32>,
}

/// Calibrated on the first 256 tokens, traced on 512, trained on 384 (rank 16, padded to 32
/// in the engine's Q8_0 form): once for every test of this file.
fn trained() -> &'static Trained {
    static T: OnceLock<Trained> = OnceLock::new();
    T.get_or_init(|| {
        let (mut e, tok) = load(SMOL, test_config(2));
        let text = std::fs::read_to_string(format!("{}/../../fixtures/ppl-gpl3.txt", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let tokens = tok.encode(&text, true, false).unwrap();
        let side = collect(&mut e, &tokens[..256], 128, SMOL, "ppl-gpl3.txt", |_, _, _| {}).unwrap();
        let thresholds = side.thresholds(0.5, Allocation::Uniform).unwrap();
        let setup = TraceSetup::new(&e, &thresholds).unwrap();
        let t = trace(&mut e, &tokens, 128, &setup, 512).unwrap();
        assert_eq!((t.tokens(), t.x.len(), t.fired[29].len(), t.mass[29].len()), (512, 30, 512 * 24, 512 * 1536));
        // A mass only where a neuron fires; every firing neuron has one but those whose up
        // product is exactly 0.
        for (l, (f, m)) in t.fired.iter().zip(&t.mass).enumerate() {
            let fires = |k: usize| f[k / 1536 * 24 + k % 1536 / 64] >> (k % 64) & 1 == 1;
            assert!(m.iter().enumerate().all(|(k, &m)| m == 0 || fires(k)), "layer {l}");
            let zero = m.iter().enumerate().filter(|&(k, &m)| m == 0 && fires(k)).count();
            assert!(zero * 1000 < 512 * 1536, "layer {l}: {zero} firing neurons without a mass");
        }
        // Counted recall, nothing pinned: the pinned test below compares against these.
        let opts = TrainOptions { rank: 16, epochs: 4, recall: 0.9, target: Target::Count, pin: 0.0, ..Default::default() };
        Trained { thresholds, models: train_all(&t, 0.75, &opts), trace: t, tokens }
    })
}

/// The trained predictors in the engine's form, each cut at its trained margin, or at `cut`
/// for all ([`EVERY`]: every neuron predicted).
fn predictors(cut: Option<f32>) -> Arc<Predictors> {
    let layers = trained().models.iter().map(|(m, _)| Some(LayerPredictor::new(m.rank, m.n_embd, &m.a, &m.b, &m.c, cut.unwrap_or(m.cut)).unwrap()));
    Arc::new(Predictors { n_embd: 576, n_ff: 1536, layers: layers.collect() })
}

/// A cut below every margin: the predictor names every neuron.
const EVERY: Option<f32> = Some(-1e30);

#[test]
fn adjacent_layer_predictor_learns_which_neurons_fire() {
    let t = trained();
    // Held out: at the recall it was cut for, far fewer neurons than all, and a precision
    // above guessing's (the firing rate).
    for (l, (_, q)) in t.models.iter().enumerate() {
        assert!(q.recall > 0.8 && q.predicted < 0.97 && q.precision > q.firing + 0.02, "layer {l}: {q:?}");
    }
    let g = corelm_gguf::Gguf::from_bytes(to_gguf(&t.models, SMOL, 0.5)).unwrap();
    assert_eq!(g.tensor("pred.29.b").map(|t| [t.shape[0], t.shape[1]]), Some([16, 1536]));
}

#[test]
fn pinned_neurons_catch_the_first_tokens_massive_activations() {
    // Layer 11 of SmolLM2 has a neuron whose activation at a sequence's first token is
    // thousands of times the layer's mean firing mass (an attention sink); the low-rank model
    // misses it on the held-out chunk's first token (token 384, the trace runs chunks of 128).
    // Pinned (`TrainOptions::pin`), it is always predicted and the worst miss is ordinary.
    let t = trained();
    let (tr, l) = (&t.trace, 11);
    let (x, f, m) = (&tr.x[l - 1], &tr.fired[l], &tr.mass[l]);
    let (xh, fh, mh) = (&x[384 * 576..], &f[384 * 24..], &m[384 * 1536..]);
    let unpinned = t.models[l].0.quality(xh, fh, mh);
    assert!(unpinned.worst_miss > 1000.0, "{unpinned:?}");
    // The defaults: a mass target, pinned at 64 times the mean.
    let opts = TrainOptions { rank: 16, epochs: 4, ..Default::default() };
    assert_eq!((opts.target, opts.pin), (Target::Mass, 64.0));
    let p = predictor::train(&x[..384 * 576], &f[..384 * 24], &m[..384 * 1536], 576, 1536, &opts);
    let pinned = p.quality(xh, fh, mh);
    assert!((1..=20).contains(&p.pinned()) && pinned.worst_miss < 100.0, "{} pinned: {pinned:?}", p.pinned());
    assert!(pinned.mass_recall > unpinned.mass_recall, "{pinned:?} against {unpinned:?}");
}

/// Per layer: (firing and predicted, firing, predicted, all) over the batched path's masked
/// GLUs (whose gate is dense, so firing is known for every neuron), and (gate rows computed,
/// all) over the small batches' sparse gates.
#[derive(Default)]
struct Counts {
    masked: Vec<[u64; 4]>,
    gate: Vec<[u64; 2]>,
    /// Firing neurons among the sparse gates' outputs (with `Counter::thr`).
    gate_fired: u64,
}

struct Counter {
    counts: Mutex<Counts>,
    kernels: &'static corelm_kernels::Kernels,
    /// The layers' thresholds, to count the sparse gates' firing (empty: not counted).
    thr: Vec<f32>,
}

impl Tap for Counter {
    fn node<'a>(&self, graph: &Graph, id: TensorId, read: &dyn Fn(TensorId) -> &'a [f32]) {
        let t = graph.tensor(id);
        if !matches!(t.op, Op::GluMasked { pred: Some(_), .. } | Op::SparseGate { .. }) {
            return;
        }
        let c = &mut *self.counts.lock().unwrap();
        let l = t.layer as usize;
        c.masked.resize(c.masked.len().max(l + 1), [0; 4]);
        c.gate.resize(c.gate.len().max(l + 1), [0; 2]);
        match t.op {
            Op::GluMasked { gate, kind, thr, pred: Some(p), .. } => {
                let (g, p) = (read(gate), read(p));
                let (ones, mut a) = (vec![1f32; g.len()], vec![0f32; g.len()]);
                corelm_core::sched::gate_activation(self.kernels, kind, g, &ones, &mut a);
                for (a, &m) in a.iter().zip(p) {
                    let (f, pr) = (a.abs() > thr, m > 0.0);
                    let e = &mut c.masked[l];
                    e[0] += u64::from(f && pr);
                    e[1] += u64::from(f);
                    e[2] += u64::from(pr);
                    e[3] += 1;
                }
            }
            Op::SparseGate { .. } => {
                let g = read(id);
                c.gate[l][0] += g.iter().filter(|&&v| v != 0.0).count() as u64;
                c.gate[l][1] += g.len() as u64;
                if let Some(&thr) = self.thr.get(l) {
                    let (ones, mut a) = (vec![1f32; g.len()], vec![0f32; g.len()]);
                    corelm_core::sched::gate_activation(self.kernels, corelm_core::Glu::Silu, g, &ones, &mut a);
                    c.gate_fired += a.iter().filter(|a| a.abs() > thr).count() as u64;
                }
            }
            _ => {}
        }
    }
}

fn logits(engine: &mut Engine, ids: &[u32], one_pass: bool) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    let mut b = Batch::new();
    if one_pass {
        for (i, &t) in ids.iter().enumerate() {
            b.add(t, i as i32, 0, true);
        }
        let l = engine.decode(&b).unwrap();
        out.extend((0..l.rows()).map(|r| l.row(r).to_vec()));
    } else {
        for (i, &t) in ids.iter().enumerate() {
            b.clear();
            b.add(t, i as i32, 0, true);
            out.push(engine.decode(&b).unwrap().row(0).to_vec());
        }
    }
    engine.clear_all();
    out
}

fn sparse(thresholds: &[f32], predictor: Option<Arc<corelm_core::Predictors>>) -> EngineConfig {
    let mut s = SparseFfn::new(thresholds.to_vec(), DType::Q8_0);
    s.predictor = predictor;
    EngineConfig { sparsity: Some(Arc::new(s)), ..test_config(2) }
}

#[test]
fn the_predictor_runs_in_the_graph_on_both_paths() {
    let t = trained();
    let path = std::env::temp_dir().join(format!("corelm-test-{}.predictor.gguf", std::process::id()));
    std::fs::write(&path, to_gguf(&t.models, SMOL, 0.5)).unwrap();
    let loaded = predictor::load(&path);
    std::fs::remove_file(&path).unwrap();
    let loaded = loaded.unwrap();
    assert_eq!((loaded.meta.model.as_str(), loaded.meta.sparsity, loaded.meta.recall.len()), (SMOL, 0.5, 30));
    assert!(loaded.predictors.layers.iter().all(|p| p.as_ref().is_some_and(|p| p.rank == 32)), "rank 16 padded to a Q8_0 block");

    // 48 tokens the predictor never saw (longer prompts take batched kernels whose float
    // order differs from decode's, dense or not, so bit equality holds up to here).
    let ids = &t.tokens[600..648];
    let (mut e, _) = load(SMOL, sparse(&t.thresholds, Some(Arc::new(loaded.predictors))));
    let tap = Arc::new(Counter { counts: Mutex::new(Counts::default()), kernels: e.kernels(), thr: Vec::new() });
    e.set_tap(Some(tap.clone()));
    let full = logits(&mut e, ids, true);
    let steps = logits(&mut e, ids, false);
    e.set_tap(None);
    // The same neurons fire on both paths, and the down sums run in the same order.
    let differ: Vec<usize> = (0..ids.len()).filter(|&i| full[i] != steps[i]).collect();
    assert!(differ.is_empty(), "the batched and the token-by-token paths disagree at positions {differ:?}");

    let c = tap.counts.lock().unwrap();
    let (mut recall, mut read) = (0.0, 0.0);
    for l in 0..30 {
        let [tp, fired, predicted, all] = c.masked[l];
        let [rows, gate_all] = c.gate[l];
        assert_eq!((all, gate_all), (48 * 1536, 48 * 1536), "layer {l}: every pass ran the predicted nodes");
        // The batched path's predicted set is the token path's set of computed gate rows.
        assert_eq!(rows, predicted, "layer {l}");
        let r = tp as f64 / fired as f64;
        assert!(r > 0.75, "layer {l}: recall {r:.3} in the graph");
        assert!(predicted < all * 97 / 100 && predicted > fired, "layer {l}: {predicted} of {all} predicted, {fired} firing");
        recall += r / 30.0;
        read += predicted as f64 / all as f64 / 30.0;
    }
    // Held-out recall was cut for 0.9 on the training tokens; A and B in Q8_0 and the inputs of
    // the sparse model itself (not the dense traces) keep it near there.
    assert!(recall > 0.85, "mean recall {recall:.3} in the graph");
    assert!(read < 0.9, "mean fraction of gate rows read {read:.3}");
    drop(c);
    drop(e);

    // Without the predictor the same thresholds fire more neurons, and the logits move (by
    // how much, and what it costs in perplexity per recall target: docs/sparsity.md).
    let (mut plain, _) = load(SMOL, sparse(&t.thresholds, None));
    let want = logits(&mut plain, ids, true);
    drop(plain);
    assert!(want != full, "the predictor changed nothing");
    // A predictor that names every neuron gives the plain sparse logits, bit for bit, on both
    // paths: the predicted nodes add no arithmetic of their own to the neurons they compute.
    let (mut e, _) = load(SMOL, sparse(&t.thresholds, Some(predictors(EVERY))));
    assert!(logits(&mut e, ids, true) == want && logits(&mut e, ids, false) == want, "all-predicted differs from plain sparse");
}

#[test]
fn predictors_that_do_not_fit_are_refused() {
    let t = trained();
    let mut wrong = t.models.clone();
    wrong.pop();
    let path = std::env::temp_dir().join(format!("corelm-test-{}-29.predictor.gguf", std::process::id()));
    std::fs::write(&path, to_gguf(&wrong, SMOL, 0.5)).unwrap();
    let loaded = predictor::load(&path);
    std::fs::remove_file(&path).unwrap();
    let err = Engine::load(model_path(SMOL), sparse(&t.thresholds, Some(Arc::new(loaded.unwrap().predictors)))).err().expect("refused");
    assert!(err.to_string().contains("predictors are for 29 layers"), "{err}");
    // Not a predictor file at all: the model itself.
    let err = predictor::load(&model_path(SMOL)).err().expect("refused");
    assert!(err.to_string().contains("not a predictor file"), "{err}");
}


/// Every `Predict` node's margins of one pass, by (predicted layer, first neuron).
struct Margins(Mutex<Vec<(u32, u32, Vec<f32>)>>);

impl Tap for Margins {
    fn node<'a>(&self, graph: &Graph, id: TensorId, read: &dyn Fn(TensorId) -> &'a [f32]) {
        if let Op::Predict { layer, n0, .. } = graph.tensor(id).op {
            self.0.lock().unwrap().push((layer, n0, read(id).to_vec()));
        }
    }
}

/// Tensor parallel (`--tp 2`): each shard predicts the firing of its own feed-forward range
/// (one `Predict` per shard, from its first neuron) and reads only those gate rows. The
/// shards' margins are the serial model's, up to the inputs' rounding (the attention's partial
/// sums are added in another order); the batched and the token-by-token paths keep the same
/// bits; a predictor naming every neuron gives the plain sparse shards' logits, bit for bit.
#[test]
fn the_predictor_splits_across_tensor_parallel_shards() {
    let t = trained();
    let preds = predictors(None);
    let ids = &t.tokens[600..624];
    let tp = |n: usize, p: Option<Arc<Predictors>>| EngineConfig { tp: n, ..sparse(&t.thresholds, p) };
    // Layer l's margins (predicted during layer l − 1, or from layer 0's own input), assembled
    // over shards: [n_tokens × 1536] per layer.
    let margins = |e: &mut Engine| {
        let tap = Arc::new(Margins(Mutex::new(Vec::new())));
        e.set_tap(Some(tap.clone()));
        logits(e, ids, true);
        e.set_tap(None);
        let mut m = vec![vec![0f32; ids.len() * 1536]; 30];
        let mut seen = vec![0usize; 30];
        for (layer, n0, v) in tap.0.lock().unwrap().iter() {
            let (target, n) = (*layer as usize, v.len() / ids.len());
            for r in 0..ids.len() {
                m[target][r * 1536 + *n0 as usize..][..n].copy_from_slice(&v[r * n..(r + 1) * n]);
            }
            seen[target] += n;
        }
        assert!(seen.iter().all(|&s| s == 1536), "every layer's neurons predicted once: {seen:?}");
        m
    };
    let (mut one, _) = load(SMOL, tp(1, Some(preds.clone())));
    let want = margins(&mut one);
    drop(one);
    let (mut two, _) = load(SMOL, tp(2, Some(preds.clone())));
    let g = two.graph(1, 1);
    let firsts: Vec<u32> = g.nodes.iter().filter_map(|id| match g.tensors[id.0 as usize].op {
        Op::Predict { n0, .. } if g.tensors[id.0 as usize].layer == 5 => Some(n0),
        _ => None,
    }).collect();
    assert_eq!(firsts, [0, 768], "one Predict per shard, from its first neuron");
    let got = margins(&mut two);
    for l in 0..30 {
        let (d, s) = got[l].iter().zip(&want[l]).fold((0f64, 0f64), |(d, s), (a, b)| (d + (a - b).abs() as f64, s + b.abs() as f64));
        // What a shard reading the other's neurons would give (about the margins' size).
        let swapped: f64 = (0..ids.len() * 1536).map(|i| (got[l][i] - want[l][i / 1536 * 1536 + (i % 1536 + 768) % 1536]).abs() as f64).sum();
        // Layer 0's inputs differ only by the attention's rounding; deeper, neurons near their
        // thresholds fire on one side only and the inputs drift apart (measured: up to 0.11).
        let bound = if l == 0 { 1e-3 } else { 0.25 };
        assert!(d <= bound * s && swapped > 0.5 * s, "layer {l}: margins differ by {:.2e} of their size (swapped shards: {:.2e})", d / s, swapped / s);
    }
    let full = logits(&mut two, ids, true);
    assert_eq!(full, logits(&mut two, ids, false), "the batched and the token-by-token paths disagree");
    drop(two);
    let (mut plain, _) = load(SMOL, tp(2, None));
    let want = logits(&mut plain, ids, true);
    drop(plain);
    assert_ne!(want, full, "the predictor changed nothing");
    let (mut e, _) = load(SMOL, tp(2, Some(predictors(EVERY))));
    assert!(logits(&mut e, ids, true) == want && logits(&mut e, ids, false) == want, "all-predicted differs from plain sparse");
}

/// With an accelerator's neurons (static `--accel-mem 1000K`: SmolLM2's layer 0 neurons
/// 0..768 on the device, on lavapipe in CI), the predictors cover the CPU's neurons only (the
/// device computes its neurons by their threshold alone), at `--tp 1` and `--tp 2`:
/// - one `Predict` per shard over its CPU neurons (none where the device holds them all: a
///   node with nothing to compute is not scheduled), layer 0's margins those of the whole
///   predictor at those neurons, bit for bit (layer 0's input does not depend on the device);
/// - a predictor naming every neuron gives the accelerator run without a predictor, bit for
///   bit, on each path, and the trained one changes its logits.
///
/// Against the CPU alone no useful bound holds at these thresholds (50 %): the device's f32
/// gate and the CPU's differ near the threshold, and without any predictor the two runs
/// already differ by 0.18 of the largest logit (0.07 at threshold 0.12, `sparsity.rs`).
#[test]
fn the_predictor_covers_the_cpus_neurons_beside_an_accelerator() {
    let t = trained();
    let (preds, everything) = (predictors(None), predictors(EVERY));
    let ids = &t.tokens[600..624];
    let layer0 = |e: &mut Engine| -> Vec<Vec<f32>> {
        let tap = Arc::new(Margins(Mutex::new(Vec::new())));
        e.set_tap(Some(tap.clone()));
        logits(e, ids, true);
        e.set_tap(None);
        let mut parts: Vec<(u32, Vec<f32>)> = tap.0.lock().unwrap().iter().filter(|(l, _, _)| *l == 0).map(|(_, n0, v)| (*n0, v.clone())).collect();
        parts.sort_by_key(|p| p.0);
        // Row by row, the pieces side by side.
        (0..ids.len())
            .map(|r| parts.iter().flat_map(|(_, v)| { let n = v.len() / ids.len(); v[r * n..(r + 1) * n].to_vec() }).collect())
            .collect()
    };
    for tp in [1, 2] {
        let cfg = |accel: bool| EngineConfig {
            tp,
            accel: accel.then(|| corelm_engine::offload::AccelConfig::new(1000 << 10)),
            ..sparse(&t.thresholds, Some(preds.clone()))
        };
        let (mut cpu, _) = load(SMOL, cfg(false));
        let whole = layer0(&mut cpu);
        drop(cpu);
        let (mut e, _) = load(SMOL, cfg(true));
        assert_eq!(e.accel().expect("an accelerator").hot_counts()[..2], [768, 0]);
        let g = e.graph(1, 1);
        let sizes: Vec<usize> = g.nodes.iter().map(|id| &g.tensors[id.0 as usize]).filter(|x| matches!(x.op, Op::Predict { layer: 0, .. })).map(|x| x.ne[0]).collect();
        // At --tp 2, shard 0's neurons (0..768) are all on the device: no node of its own.
        assert_eq!(sizes, [768], "--tp {tp}: layer 0's CPU neurons per shard");
        let cold = layer0(&mut e);
        for (r, (c, w)) in cold.iter().zip(&whole).enumerate() {
            assert!(c[..] == w[768..], "--tp {tp}, row {r}: layer 0's margins of the CPU's neurons");
        }
        let trained = logits(&mut e, ids, true);
        drop(e);
        let accel = |p: Option<Arc<Predictors>>| EngineConfig {
            tp,
            accel: Some(corelm_engine::offload::AccelConfig::new(1000 << 10)),
            ..sparse(&t.thresholds, p)
        };
        // (The device's sums differ between a prompt and single tokens, so each path against
        // its own.)
        let (mut plain, _) = load(SMOL, accel(None));
        let want = [logits(&mut plain, ids, true), logits(&mut plain, ids, false)];
        drop(plain);
        assert!(trained != want[0], "--tp {tp}: the predictor changed nothing");
        let (mut all, _) = load(SMOL, accel(Some(everything.clone())));
        assert!(logits(&mut all, ids, true) == want[0], "--tp {tp}: all-predicted differs from the plain accelerator run (one pass)");
        assert!(logits(&mut all, ids, false) == want[1], "--tp {tp}: all-predicted differs from the plain accelerator run (token by token)");
    }
}

/// Online balancing with a predictor (TAM, `--accel-mem 8M`; lavapipe in CI), `--tp 1` and
/// `--tp 2`: the device's neurons move, so the predictor covers every neuron (one `Predict`
/// per shard over its whole range) and the masked nodes skip the device's current ones.
/// - A predictor naming every neuron gives the online run without one, bit for bit, on each
///   path, with the same loads and firing counts: the device observes the same gate products.
/// - The trained one reads fewer gate rows and changes the logits; the device observes the
///   firing of the predicted neurons' gates, exactly (the others counted quiet), and groups
///   still move.
#[test]
fn the_predictor_runs_beside_online_balancing() {
    use corelm_engine::balance::{BalanceConfig, Policy};
    let t = trained();
    let ids = &t.tokens[600..616];
    for tp in [1, 2] {
        let cfg = |p: Option<Arc<Predictors>>| EngineConfig {
            tp,
            accel: Some(corelm_engine::offload::AccelConfig { balance: BalanceConfig::new(Policy::Tam), ..corelm_engine::offload::AccelConfig::new(8 << 20) }),
            ..sparse(&t.thresholds, p)
        };
        // Token by token (the balancer's stats after it), then the prompt in one pass.
        let run = |p: Option<Arc<Predictors>>, count: bool| {
            let (mut e, _) = load(SMOL, cfg(p));
            let counter = Arc::new(Counter { counts: Mutex::new(Counts::default()), kernels: e.kernels(), thr: t.thresholds.clone() });
            if count {
                e.set_tap(Some(counter.clone()));
            }
            let steps = logits(&mut e, ids, false);
            let st = e.balance().expect("online balancing").stats();
            (steps, logits(&mut e, ids, true), st, counter)
        };
        let (want, want_pass, plain, _) = run(None, false);
        let (all, all_pass, everything, _) = run(Some(predictors(EVERY)), false);
        assert!(all == want, "--tp {tp}: all-predicted differs from the online run without a predictor (token by token)");
        assert!(all_pass == want_pass, "--tp {tp}: all-predicted differs from the online run without a predictor (one pass)");
        assert_eq!((everything.loads, everything.fired_device, everything.fired), (plain.loads, plain.fired_device, plain.fired), "--tp {tp}");
        let (mut e, _) = load(SMOL, cfg(Some(predictors(None))));
        let g = e.graph(1, 1);
        let sizes: Vec<usize> = g.nodes.iter().map(|id| &g.tensors[id.0 as usize]).filter(|x| matches!(x.op, Op::Predict { layer: 3, .. })).map(|x| x.ne[0]).collect();
        assert_eq!(sizes, if tp == 1 { vec![1536] } else { vec![768, 768] }, "--tp {tp}: layer 3's predicted neurons per shard");
        drop(e);
        let (trained, _, st, counter) = run(Some(predictors(None)), true);
        let c = counter.counts.lock().unwrap();
        let gate = c.gate.iter().fold([0u64; 2], |a, g| [a[0] + g[0], a[1] + g[1]]);
        eprintln!("--tp {tp}: gate rows read {:.3}, without a predictor {plain:?}, with {st:?}", gate[0] as f64 / gate[1] as f64);
        assert!(trained != want, "--tp {tp}: the predictor changed nothing");
        assert!(gate[1] > 0 && (gate[0] as f64) < 0.9 * gate[1] as f64, "--tp {tp}: gate rows read {gate:?}");
        assert!(st.passes == ids.len() as u64 && st.loads > 0 && st.fired_device > 0, "--tp {tp}: {st:?}");
        // The device observed exactly the firing of the predicted gates (a quiet neuron's gate
        // is zero), every layer being balanced.
        assert_eq!(st.fired, c.gate_fired, "--tp {tp}: firing observed against firing among the predicted gates");
    }
}
