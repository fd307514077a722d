//! Context shift (`Engine::shift_seq`): the rows after the dropped tokens move down with
//! their keys rotated back, so layer 0's rows (which depend on a token and its position only)
//! match those a prefill of the remaining tokens computes — values to the bit, keys within
//! F16 rounding; a block shared with another sequence is copied, not written.

mod common;

use common::*;
use corelm_engine::batcher::{Batcher, Event, Finish, FinishReason, Request};
use corelm_engine::draft::{DraftModel, DraftParams};
use corelm_engine::generate::{generate, generate_drafted, ContextShift, GenerateParams, StopReason};
use corelm_engine::sample::SamplingParams;
use corelm_engine::{shift_cut, Engine, EngineConfig};
use corelm_kernels::attention::KeyLayout;
use corelm_kernels::DType;
use std::sync::{Arc, Mutex};

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn last(e: &mut Engine, seq: i32, toks: &[u32]) -> Vec<f32> {
    let mut out = vec![];
    e.feed(seq, toks, false, |l| out = l.row(0).to_vec()).unwrap();
    out
}

#[test]
fn shifted_rows_are_the_rows_of_the_shifted_tokens() {
    shifted_rows_match(KeyLayout::Rows, DType::F16);
}

#[test]
fn shifted_keys_in_columns_are_the_keys_of_the_shifted_tokens() {
    shifted_rows_match(KeyLayout::Columns, DType::F16);
    shifted_rows_match(KeyLayout::Columns, DType::Q8_0);
}

fn shifted_rows_match(kv_layout: KeyLayout, k_type: DType) {
    let cfg = || EngineConfig { batch_invariant: true, kv_layout, cache_type_k: k_type, cache_type_v: k_type, ..test_config(2) };
    let (mut a, tok) = load(SMOL, cfg());
    let text = "Seven ravens crossed the valley at dawn, and the shepherd counted them twice before the frost. ".repeat(4);
    let ids = tok.encode(&text, true, true).unwrap();
    assert!(ids.len() > 60, "{} tokens", ids.len());
    let (keep, discard) = (5, 20);
    last(&mut a, 0, &ids);
    // Sequence 1 shares the first blocks; the shift writes block 0 from row 5 on.
    let shared = a.attach_prefix(1, &ids[..40]);
    assert_eq!(shared, 32);
    let before = last(&mut a, 1, &ids[shared..40]);
    a.shift_seq(0, keep, discard).unwrap();
    assert_eq!(a.seq_len(0), ids.len() - discard);
    a.clear_seq(1);
    assert_eq!(a.attach_prefix(1, &ids[..40]), shared);
    assert_eq!(last(&mut a, 1, &ids[shared..40]), before, "a shared block was written");

    let kept: Vec<u32> = ids[..keep].iter().chain(&ids[keep + discard..]).copied().collect();
    let (mut b, _) = load(SMOL, cfg());
    last(&mut b, 0, &kept);
    let worst = shifted_key_error(&a, &b, kept.len(), keep);
    // F16 keys: within two roundings; Q8_0 keys: within two quantizations of a block.
    let bound = if k_type == DType::F16 { 4e-3 } else { 2e-2 };
    assert!(worst < bound, "layer 0's keys off by {worst} of their largest element");
    // Later layers saw the dropped tokens: their rows differ, but the kept ones do not.
    assert_eq!(a.kv_cell(0, keep - 1, 20), b.kv_cell(0, keep - 1, 20));
    assert_ne!(a.kv_cell(0, keep + 3, 20), b.kv_cell(0, keep + 3, 20));
    // The sequence goes on from its new length.
    let n = a.seq_len(0);
    last(&mut a, 0, &ids[..1]);
    assert_eq!(a.seq_len(0), n + 1);
    assert!(a.shift_seq(0, n, 5).is_err());
    assert_eq!(shift_cut(n, 10, 0, 0, true, n), (1, (n - 1) / 2));
}

type Answer = Arc<Mutex<(Vec<u32>, Option<Finish>)>>;

fn shifting_request(prompt: Vec<u32>, max_tokens: usize, shift: ContextShift) -> (Request, Answer) {
    let log: Answer = Arc::default();
    let l = log.clone();
    let sink = Box::new(move |e: Event| {
        let mut g = l.lock().unwrap();
        match e {
            Event::Token { id, .. } => g.0.push(id),
            Event::Done(f) => g.1 = Some(f),
            _ => {}
        }
        true
    });
    let mut r = greedy_request(prompt, max_tokens, None, None, sink);
    r.ignore_eos = true;
    r.context_shift = Some(shift);
    (r, log)
}

/// Serve one shifting request per prompt until all are done; their answers.
fn serve_all(b: &mut Batcher, prompts: &[&Vec<u32>], max_tokens: usize, shift: ContextShift) -> Vec<Answer> {
    let logs: Vec<Answer> = prompts
        .iter()
        .map(|prompt| {
            let (r, log) = shifting_request(prompt.to_vec(), max_tokens, shift);
            b.submit(r).map_err(|e| e.1).unwrap();
            log
        })
        .collect();
    drain_within(b, 1000);
    logs
}

#[test]
fn serving_shifts_as_generate_does() {
    let cfg = EngineConfig { n_ctx: 256, n_seq_max: 2, n_batch: 32, batch_invariant: true, ..test_config(2) };
    let (mut engine, tok) = load(SMOL, cfg);
    let p = tok.encode("Write a long story about an old lighthouse keeper, his dog, and all the ships he saw pass:", true, true).unwrap();
    let q: Vec<u32> = p.iter().chain(&p[1..6]).copied().collect();
    assert!(p.len() > 16 && p.len() < 32, "{} tokens", p.len());
    // Keep nothing, so the first shift writes the prompt's first block, which the second
    // request shares.
    let shift = ContextShift { n_keep: 0, n_discard: 0, n_ctx: 64 };
    let params = GenerateParams { max_tokens: 100, sampling: SamplingParams::greedy(), ignore_eos: true, context_shift: Some(shift), ..Default::default() };
    let mut want = vec![];
    for prompt in [&p, &q] {
        let g = generate(&mut engine, &tok, prompt, &params, |_| true).unwrap();
        assert_eq!((g.tokens.len(), g.reason), (100, StopReason::MaxTokens));
        assert!(g.shifts >= 2, "{} shifts", g.shifts);
        want.push(g.tokens);
        engine.clear_seq(0);
    }
    let mut b = Batcher::new(engine, Arc::new(tok));
    let logs = serve_all(&mut b, &[&p, &q], 100, shift);
    for (log, want) in logs.iter().zip(&want) {
        let (tokens, f) = log.lock().unwrap().clone();
        let f = f.unwrap();
        assert_eq!(f.reason, FinishReason::Length);
        assert!(f.dropped_tokens > 0);
        assert_eq!(&tokens, want, "served tokens differ from generate's");
    }
    assert!(b.stats().shifts.load(std::sync::atomic::Ordering::Relaxed) >= 4);
    assert_eq!(b.engine().blocks().used(), 0);
}

#[test]
fn a_session_prompt_that_does_not_fit_shifts_what_is_held_first() {
    let (mut e, tok) = load(SMOL, EngineConfig { n_ctx: 64, ..test_config(2) });
    let p = tok.encode("Tell me about the ships the old lighthouse keeper saw.", true, true).unwrap();
    let shift = ContextShift { n_keep: 4, n_discard: 0, n_ctx: 0 };
    let mut params = GenerateParams { max_tokens: 50, sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
    generate(&mut e, &tok, &p, &params, |_| true).unwrap();
    let held = e.seq_len(0);
    assert!(held + p.len() + 1 > 64, "{held} + {}", p.len());
    // Without context shift the next prompt does not fit; with it, the session goes on.
    assert!(matches!(generate(&mut e, &tok, &p, &params, |_| true), Err(corelm_engine::Error::PromptTooLong { .. })));
    params.context_shift = Some(shift);
    let g = generate(&mut e, &tok, &p, &params, |_| true).unwrap();
    assert!(g.shifts >= 1 && g.tokens.len() == 50, "{} shifts, {} tokens", g.shifts, g.tokens.len());
}

/// A draft model beside context shift: its cache drops the tokens the target drops (its keys
/// rotated by its own RoPE), so the model as its own draft still proposes exactly the target's
/// tokens after each shift, every proposal kept; the answer is the one without drafts, in
/// `generate` and served.
#[test]
fn a_draft_models_cache_shifts_with_its_target() {
    let cfg = EngineConfig { n_ctx: 128, n_seq_max: 2, n_batch: 32, batch_invariant: true, ..test_config(2) };
    let (mut engine, tok) = load(SMOL, cfg);
    let p = tok.encode("Write a long story about an old lighthouse keeper, his dog, and all the ships he saw pass:", true, true).unwrap();
    let shift = ContextShift { n_keep: 0, n_discard: 0, n_ctx: 0 };
    let params = GenerateParams { max_tokens: 200, sampling: SamplingParams::greedy(), ignore_eos: true, context_shift: Some(shift), ..Default::default() };
    let plain = generate(&mut engine, &tok, &p, &params, |_| true).unwrap();
    assert!(plain.shifts >= 2, "{} shifts", plain.shifts);
    engine.clear_seq(0);
    let params_draft = DraftParams { n_max: 4, ..Default::default() };
    let mut model = DraftModel::load(&model_path(SMOL), &engine, &tok, params_draft).unwrap();
    let g = generate_drafted(&mut engine, Some(&mut model), &tok, &p, &params, |_| true).unwrap();
    assert_eq!((&g.tokens, g.reason), (&plain.tokens, plain.reason), "drafted tokens differ from the plain answer's");
    assert_eq!(g.shifts, plain.shifts);
    assert!(g.drafted > 100 && g.kept == g.drafted, "{} of {} proposals kept", g.kept, g.drafted);
    // The draft's cache holds the target's tokens (a BOS where the tokenizer adds one, then
    // the latest fed: all but the last answer token), the dropped ones gone.
    let (held, n, keep) = (engine.seq_len(0), g.tokens.len(), usize::from(tok.add_bos));
    assert!(model.cached(0).len() >= held - 4, "{} of {held}", model.cached(0).len());
    let want = [&p[..keep], &g.tokens[n + keep - held - 1..n - 1]].concat();
    let m = model.cached(0).len().min(held);
    assert_eq!(model.cached(0)[..m], want[..m]);
    engine.clear_seq(0);
    model.forget(0);

    // Served: two requests, each shifting, their drafts from the same model.
    let serve_shift = ContextShift { n_ctx: 128, ..shift };
    let mut b = Batcher::new(engine, Arc::new(tok));
    b.set_draft_model(model);
    let logs = serve_all(&mut b, &[&p, &p], 200, serve_shift);
    for log in &logs {
        let (tokens, f) = log.lock().unwrap().clone();
        assert!(f.unwrap().dropped_tokens > 0);
        assert_eq!(tokens, plain.tokens, "served drafted tokens differ from the plain answer's");
    }
    let st = b.stats();
    let (drafted, kept) = (st.drafted.load(std::sync::atomic::Ordering::Relaxed), st.drafts_kept.load(std::sync::atomic::Ordering::Relaxed));
    assert!(drafted > 100 && kept == drafted, "{kept} of {drafted} proposals kept");
    assert_eq!(b.engine().blocks().used(), 0);
}
