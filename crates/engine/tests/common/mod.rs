//! Shared helpers for the engine's integration tests: where models and golden data live.

#![allow(dead_code)]

use corelm_engine::batcher::{Batcher, Request, Sink};
use corelm_engine::constraint::Constraint;
use corelm_engine::sample::SamplingParams;
use corelm_engine::{Batch, Engine, EngineConfig, Tokenizer};
use std::path::PathBuf;
use std::time::Instant;

/// A greedy batcher request of `prompt` held to `constraint`: up to `max_tokens`, with
/// `logprobs` alternatives per token, its events to `sink`.
pub fn greedy_request(prompt: Vec<u32>, max_tokens: usize, logprobs: Option<usize>, constraint: Option<Constraint>, sink: Sink) -> Request {
    Request { prompt, max_tokens, sampling: SamplingParams::greedy(), stop: vec![], ignore_eos: false, logprobs, chain_probs: false, prompt_logprobs: None, constraint, lora: None, context_shift: None, sink, arrived: Instant::now() }
}

/// The tokenizer of `g`'s metadata with `edits` made: each listed key set to its value (added
/// where `g` lacks it), or left out where the value is `None`. For tokenizer variants the
/// golden models lack.
pub fn tokenizer_edited(g: &corelm_gguf::Gguf, edits: &[(&str, Option<corelm_gguf::Value>)]) -> Tokenizer {
    let mut w = corelm_gguf::writer::Writer::new();
    for (k, v) in &g.metadata {
        match edits.iter().find(|(e, _)| e == k) {
            Some((_, None)) => {}
            Some((_, Some(new))) => {
                w.kv(k, new.clone());
            }
            None => {
                w.kv(k, v.clone());
            }
        }
    }
    for (k, v) in edits.iter().filter(|(k, _)| g.get(k).is_none()) {
        if let Some(v) = v {
            w.kv(k, v.clone());
        }
    }
    Tokenizer::from_gguf(&corelm_gguf::Gguf::from_bytes(w.to_bytes()).unwrap()).unwrap()
}

/// (golden directory name, model file name, logit tolerance from ../shared/golden/README.md)
pub const MODELS: [(&str, &str, f32); 3] = [
    ("SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf", 1.0),
    ("gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m.gguf", 2.5),
    ("qwen2.5-coder-0.5b-instruct-awq-q4_k_m", "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf", 1.5),
];


pub fn golden_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CORELM_GOLDEN_DIR") {
        return d.into();
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden")
}

pub fn model_path(file: &str) -> PathBuf {
    let p = corelm_engine::models_dir().join(file);
    assert!(
        p.exists(),
        "model {} is missing: run `scripts/fetch_models.py all` (or `make test`, which does)",
        p.display()
    );
    p
}

pub fn load(file: &str, cfg: EngineConfig) -> (Engine, Tokenizer) {
    let engine = Engine::load(model_path(file), cfg).expect("model loads");
    let tok = Tokenizer::from_gguf(engine.gguf()).expect("tokenizer builds");
    (engine, tok)
}

/// Small deterministic config for tests (no pinning: the harness runs tests in parallel).
pub fn test_config(n_threads: usize) -> EngineConfig {
    EngineConfig { n_ctx: 1024, n_batch: 128, n_seq_max: 4, n_threads, pin: false, batch_invariant: false, ..Default::default() }
}

/// The larger of two differences, NaN if either is (`f32::max` returns the other one, so a
/// NaN would pass every bound).
pub fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// The largest absolute difference between two sets of logit rows, over the largest `|a|`;
/// NaN where either holds a NaN (`f32::max` alone would skip it, and every bound would pass).
pub fn max_rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    if a.iter().chain(b).flatten().any(|v| v.is_nan()) {
        return f32::NAN;
    }
    let scale = a.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().flatten().zip(b.iter().flatten()).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// The ten largest logits' ids, largest first.
pub fn top10(r: &[f32]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..r.len()).collect();
    idx.select_nth_unstable_by(9, |&a, &b| r[b].total_cmp(&r[a]));
    idx.truncate(10);
    idx.sort_by(|&a, &b| r[b].total_cmp(&r[a]));
    idx
}

/// The golden checks' measure of `got` against `want` row by row: panics (naming `what` and
/// the row) where the greedy choices differ and `want`'s margin is at least 0.5; returns the
/// largest |Δlogit| over `want`'s ten largest logits and over any logit.
pub fn golden_rule(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) -> (f32, f32) {
    let (mut max, mut all) = (0f32, 0f32);
    for (r, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(a.iter().all(|v| v.is_finite()), "{what}: row {r} holds a logit that is not finite");
        let top = top10(b);
        max = top.iter().map(|&i| (a[i] - b[i]).abs()).fold(max, max_nan);
        all = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(all, max_nan);
        let (ia, ib, margin) = (top10(a)[0], top[0], b[top[0]] - b[top[1]]);
        assert!(ia == ib || margin < 0.5, "{what}: row {r} argmax {ia} vs {ib} (margin {margin:.3})");
    }
    (max, all)
}

/// Every logit row of `ids` as one prompt of sequence 0, which is cleared after.
pub fn prompt_logits(engine: &mut Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut b = Batch::new();
    for (i, &t) in ids.iter().enumerate() {
        b.add(t, i as i32, 0, true);
    }
    let l = engine.decode(&b).unwrap();
    let out = (0..l.rows()).map(|r| l.row(r).to_vec()).collect();
    engine.clear_all();
    out
}

/// The logits of `ids` fed one token per pass to sequence 0, which is cleared after.
pub fn token_by_token(engine: &mut Engine, ids: &[u32]) -> Vec<Vec<f32>> {
    token_by_token_with(engine, ids, |_, _| {})
}

/// [`token_by_token`], `after(engine, i)` run after token `i`'s pass.
pub fn token_by_token_with(engine: &mut Engine, ids: &[u32], mut after: impl FnMut(&Engine, usize)) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    let mut b = Batch::new();
    for (i, &t) in ids.iter().enumerate() {
        b.clear();
        b.add(t, i as i32, 0, true);
        out.push(engine.decode(&b).unwrap().row(0).to_vec());
        after(engine, i);
    }
    engine.clear_all();
    out
}

/// A draft model for SmolLM2 with other weights and the same vocabulary: the model requantized
/// to Q4_0, written once per test process into the temporary directory (removed by
/// [`DraftFile`]'s drop).
pub struct DraftFile(pub PathBuf);

impl DraftFile {
    pub fn smollm2_q4_0() -> DraftFile {
        let out = std::env::temp_dir().join(format!("corelm-draft-{}-smollm2-q4_0.gguf", std::process::id()));
        corelm_engine::quantize::quantize_file(&model_path("SmolLM2-135M-Instruct.Q4_1.gguf"), &out, corelm_kernels::DType::Q4_0, true, 2).expect("requantized");
        DraftFile(out)
    }
}

impl Drop for DraftFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Step `b` until it is idle, within `max_steps` steps.
pub fn drain_within(b: &mut Batcher, max_steps: usize) {
    let mut steps = 0;
    while !b.is_idle() {
        b.step();
        steps += 1;
        assert!(steps < max_steps, "batcher does not finish");
    }
}

/// Layer 0's rows of sequence 0 in `a` (shifted) against `b` (a prefill of the kept tokens)
/// at positions `0..n`: values bit for bit, the first `keep` keys too. Returns the worst key
/// difference relative to the key's largest element.
pub fn shifted_key_error(a: &Engine, b: &Engine, n: usize, keep: usize) -> f32 {
    let mut worst = 0f32;
    for pos in 0..n {
        let ((ka, va), (kb, vb)) = (a.kv_cell(0, pos, 0).unwrap(), b.kv_cell(0, pos, 0).unwrap());
        assert_eq!(va, vb, "layer 0's values at position {pos}");
        let scale = kb.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = ka.iter().zip(&kb).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        if pos < keep {
            assert_eq!(diff, 0.0, "a kept key moved at {pos}");
        }
        worst = worst.max(diff / scale);
    }
    worst
}
