//! `generate`'s features on real models: lazy constraints, prompt-lookup drafts and a draft
//! model's.
//!
//! Lazy constraints: free text until the trigger, held from there on. The reference is a plain (not lazy) grammar that spells out the free answer up to the
//! trigger's token and then holds the rest as the lazy grammar does: greedy decoding under it
//! takes the free answer's own tokens (each the best and allowed), so both runs see the same
//! logits at every step and must give the same tokens — through `generate` and through the
//! batcher, with the answer ending where the grammar closes. With `again` the answer goes on
//! after the held part, each token again the model's best.

mod common;

use common::*;
use corelm_engine::batcher::{Batcher, Event, FinishReason};
use corelm_engine::constraint::{Constraint, Lazy, Trigger};
use corelm_engine::draft::{DraftModel, DraftParams};
use corelm_engine::generate::{generate, generate_drafted, GenerateParams, StopReason};
use corelm_engine::grammar::Grammar;
use corelm_engine::sample::{Breakers, Dry, Mirostat, SamplingParams};
use corelm_engine::{Engine, EngineConfig, Tokenizer};
use std::sync::{Arc, Mutex};

/// `text` as a GBNF string literal.
fn literal(text: &str) -> String {
    let mut s = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn run(engine: &mut Engine, tok: &Tokenizer, prompt: &[u32], n: usize, c: Option<Constraint>) -> (Vec<u32>, StopReason) {
    engine.clear_all();
    let params = GenerateParams { max_tokens: n, sampling: SamplingParams::greedy(), constraint: c, ..Default::default() };
    let g = generate(engine, tok, prompt, &params, |_| true).unwrap();
    (g.tokens, g.reason)
}

fn lazy(word: &str, then: &str, again: bool) -> Constraint {
    let g = Constraint::Grammar(Arc::new(Grammar::parse(then).unwrap()));
    Constraint::Lazy(Arc::new(Lazy::new(vec![Trigger::Word(word.into())], g, again).unwrap()))
}

/// The free answer's first token (past the fourth) that reads as a word of three or more
/// letters not met earlier in the answer: its index and the word.
fn trigger_in(tok: &Tokenizer, free: &[u32]) -> (usize, String) {
    let mut text = String::new();
    for (k, &t) in free.iter().enumerate() {
        let piece = String::from_utf8_lossy(tok.piece(t)).to_string();
        let word = piece.trim_start();
        if k > 4 && word.len() >= 3 && word.chars().all(|c| c.is_ascii_alphabetic()) && !text.contains(word) {
            return (k, word.to_string());
        }
        text.push_str(&piece);
    }
    panic!("no trigger word in {:?}", tok.decode(free));
}

#[test]
fn lazy_grammars_are_free_until_their_trigger() {
    for file in ["SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"] {
        let (mut engine, tok) = load(file, test_config(2));
        let prompt = tok.encode("<|im_start|>user\nWhat is the capital of France, and why is it famous?<|im_end|>\n<|im_start|>assistant\n", true, true).unwrap();
        let (free, _) = run(&mut engine, &tok, &prompt, 40, None);
        let (k, word) = trigger_in(&tok, &free);
        let before = String::from_utf8(free[..=k].iter().flat_map(|&t| tok.piece(t).to_vec()).collect()).unwrap();
        let cut = before.len() - word.len();
        let digits = r#"": " [0-9] [0-9] [0-9] "\n""#;

        // Held to the end: the answer closes with the grammar.
        let (got, reason) = run(&mut engine, &tok, &prompt, 40, Some(lazy(&word, &format!("root ::= {} {digits}", literal(&word)), false)));
        let plain = Constraint::Grammar(Arc::new(Grammar::parse(&format!("root ::= {} {digits}", literal(&before))).unwrap()));
        let (want, want_reason) = run(&mut engine, &tok, &prompt, 40, Some(plain));
        assert_eq!(got[..=k], free[..=k], "{file}: free until {word:?}");
        assert_eq!(got, want, "{file}: {:?} against {:?}", tok.decode(&got), tok.decode(&want));
        assert_eq!((reason, want_reason), (StopReason::Closed, StopReason::Closed), "{file}: {:?}", tok.decode(&got));
        let text = tok.decode(&got);
        assert!(text[cut..].starts_with(&format!("{word}: ")) && text.ends_with('\n'), "{file}: {text:?}");

        // Free again after it (`again`): the same until the grammar closes, then more.
        let again = lazy(&word, &format!("root ::= {} {digits}", literal(&word)), true);
        let (got2, _) = run(&mut engine, &tok, &prompt, 40, Some(again.clone()));
        let held = got.len();
        assert_eq!(got2[..held], got[..], "{file}: again");
        assert!(got2.len() > held, "{file}: free text after the held part");

        // The batcher (the serving path), both at once: the same tokens.
        engine.clear_all();
        let tok = Arc::new(tok);
        let mut b = Batcher::new(engine, tok.clone());
        // Per request: its tokens, each one's best alternative, and its finish.
        type Log = Arc<Mutex<(Vec<u32>, Vec<u32>, Option<FinishReason>)>>;
        let logs: Vec<Log> = vec![Arc::default(), Arc::default()];
        for (c, log) in [lazy(&word, &format!("root ::= {} {digits}", literal(&word)), false), again].into_iter().zip(&logs) {
            let l = log.clone();
            let sink = Box::new(move |e: Event| {
                let mut g = l.lock().unwrap();
                match e {
                    Event::Token { id, logprob, .. } => {
                        g.0.push(id);
                        g.1.push(logprob.unwrap().top[0].0);
                    }
                    Event::Done(f) => g.2 = Some(f.reason),
                    _ => {}
                }
                true
            });
            let req = greedy_request(prompt.clone(), 40, Some(1), Some(c), sink);
            b.submit(req).map_err(|e| e.1).unwrap();
        }
        drain_within(&mut b, 1_000);
        let (one, two) = (logs[0].lock().unwrap(), logs[1].lock().unwrap());
        assert_eq!((&one.0, &one.2), (&got, &Some(FinishReason::Stop)), "{file} batched");
        assert_eq!(two.0, got2, "{file} batched, again");
        // Free text is the model's best token at each step: before the trigger and after the
        // held part closed (until the word comes back, held again there).
        let back = (held..got2.len()).find(|&i| tok.decode(&got2[held..=i]).contains(&word)).unwrap_or(got2.len());
        for i in (0..=k).chain(held..back) {
            assert_eq!(two.0[i], two.1[i], "{file}: step {i} of {:?} is not the best token", tok.decode(&got2));
        }
    }
}

/// Prompt-lookup drafts in `generate` change nothing but the passes (batch-invariant
/// arithmetic): greedy and seeded sampled answers with a repetition penalty, a stop string, a
/// grammar, a lazy grammar; a session that goes on in the same sequence after an answer whose
/// last step fed drafts. Drafts of repetitive text are mostly kept.
#[test]
fn lookup_drafts_in_generate_change_nothing_but_the_passes() {
    let cfg = EngineConfig { n_batch: 48, batch_invariant: true, ..test_config(2) };
    let (mut engine, tok) = load("SmolLM2-135M-Instruct.Q4_1.gguf", cfg);
    let list = Constraint::Grammar(Arc::new(Grammar::parse(r#"root ::= ("- " [a-z]+ " " [a-z]+ "\n")+"#).unwrap()));
    let breakers = Arc::new(Breakers::new(&tok, &Breakers::DEFAULT));
    let dry = Dry { multiplier: 0.8, breakers, ..Dry::default() };
    // llama.cpp's other samplers: state carried from token to token (Mirostat's target, DRY's
    // window, XTC's draws) must come out the same with drafts.
    let miro = SamplingParams { temperature: 0.8, seed: 5, mirostat: Mirostat::V2, dry: dry.clone(), ..Default::default() };
    let cuts = SamplingParams { temperature: 0.7, seed: 6, dry, typical_p: 0.9, xtc_probability: 0.5, dynatemp_range: 0.3, top_n_sigma: 2.0, ..Default::default() };
    let greedy = SamplingParams::greedy;
    let sampled = |t: f32, seed: u64| SamplingParams { temperature: t, seed, repeat_penalty: 1.1, ..greedy() };
    let cases: Vec<(&str, SamplingParams, Vec<String>, Option<Constraint>)> = vec![
        ("Copy the list exactly, three times:\n- red apple\n- green pear\n- blue plum\n", greedy(), vec![], None),
        ("fn add(a: i32, b: i32) -> i32 { a + b }\nfn sub(a: i32, b: i32) -> i32 { a - b }\nfn mul(", sampled(0.7, 12), vec![], None),
        ("Copy the list:\n- red apple\n- green pear\n- blue plum\nCopy:\n", greedy(), vec!["plum".into()], None),
        ("Copy the list:\n- red apple\n- green pear\n- blue plum\nCopy:\n", greedy(), vec![], Some(list.clone())),
        ("Copy the list:\n- red apple\n- green pear\n- blue plum\nCopy:\n", sampled(0.7, 15), vec![], Some(lazy("green", r#"root ::= "green " [a-z]+ "\n""#, true))),
        ("Copy the list exactly, three times:\n- red apple\n- green pear\n- blue plum\n", miro, vec![], None),
        ("fn add(a: i32, b: i32) -> i32 { a + b }\nfn sub(a: i32, b: i32) -> i32 { a - b }\nfn mul(", cuts, vec![], None),
    ];
    let (mut drafted, mut kept) = (0, 0);
    for (i, (text, sampling, stop, c)) in cases.iter().enumerate() {
        let prompt = tok.encode(text, true, true).unwrap();
        let answer = |engine: &mut Engine, lookup: usize| {
            engine.clear_all();
            let params = GenerateParams { max_tokens: 48, sampling: sampling.clone(), stop: stop.clone(), constraint: c.clone(), lookup, ..Default::default() };
            let g = generate(engine, &tok, &prompt, &params, |_| true).unwrap();
            // A session goes on in the same sequence.
            let more = tok.encode("\nAgain:", false, true).unwrap();
            let params = GenerateParams { max_tokens: 12, lookup, ..Default::default() };
            let next = generate(engine, &tok, &more, &params, |_| true).unwrap();
            (g, next.tokens, engine.seq_len(0))
        };
        let (plain, plain_next, plain_len) = answer(&mut engine, 0);
        let (with, with_next, with_len) = answer(&mut engine, 6);
        assert_eq!((&with.tokens, &with.text, with.reason), (&plain.tokens, &plain.text, plain.reason), "case {i}: {text:?}");
        assert_eq!((with_next, with_len), (plain_next, plain_len), "case {i}: the session after it");
        assert_eq!((plain.drafted, plain.kept), (0, 0));
        drafted += with.drafted;
        kept += with.kept;
    }
    assert!(kept > 0 && 3 * kept > drafted, "{kept} of {drafted} drafts kept");
}

/// A draft model's proposals in `generate` change nothing but the passes (batch-invariant
/// arithmetic), greedy or sampled, with a stop string or a grammar, and in a session that goes
/// on in the same sequence. The model as its own draft has every proposal kept under greedy
/// decoding (it computes the target's own rows); a requantized one (Q4_0) has some kept and
/// some not. Drafts shorter than `n_min` are not fed; `p_min` 1 proposes nothing.
#[test]
fn a_draft_model_in_generate_changes_nothing_but_the_passes() {
    let cfg = EngineConfig { n_batch: 48, batch_invariant: true, ..test_config(2) };
    let (mut engine, tok) = load("SmolLM2-135M-Instruct.Q4_1.gguf", cfg);
    let q4_0 = DraftFile::smollm2_q4_0();
    let list = Constraint::Grammar(Arc::new(Grammar::parse(r#"root ::= ("- " [a-z]+ " " [a-z]+ "\n")+"#).unwrap()));
    let greedy = SamplingParams::greedy;
    let sampled = SamplingParams { temperature: 0.8, seed: 3, repeat_penalty: 1.1, ..greedy() };
    let cases: Vec<(&str, SamplingParams, Vec<String>, Option<Constraint>)> = vec![
        ("Copy the list exactly, three times:\n- red apple\n- green pear\n- blue plum\n", greedy(), vec![], None),
        ("Once upon a time, in a small village by the sea,", sampled, vec![], None),
        ("Copy the list:\n- red apple\n- green pear\n- blue plum\nCopy:\n", greedy(), vec!["plum".into()], None),
        ("Copy the list:\n- red apple\n- green pear\n- blue plum\nCopy:\n", greedy(), vec![], Some(list)),
    ];
    let answer = |engine: &mut Engine, mut model: Option<&mut DraftModel>, case: &(&str, SamplingParams, Vec<String>, Option<Constraint>)| {
        let (text, sampling, stop, c) = case;
        engine.clear_all();
        let prompt = tok.encode(text, true, true).unwrap();
        let params = GenerateParams { max_tokens: 40, sampling: sampling.clone(), stop: stop.clone(), constraint: c.clone(), ..Default::default() };
        let g = generate_drafted(engine, model.as_deref_mut(), &tok, &prompt, &params, |_| true).unwrap();
        // A session goes on in the same sequence.
        let more = tok.encode("\nAgain:", false, true).unwrap();
        let params = GenerateParams { max_tokens: 12, ..Default::default() };
        let next = generate_drafted(engine, model, &tok, &more, &params, |_| true).unwrap();
        (g, next, engine.seq_len(0))
    };
    let plain: Vec<_> = cases.iter().map(|c| answer(&mut engine, None, c)).collect();
    let drafts = [model_path("SmolLM2-135M-Instruct.Q4_1.gguf"), q4_0.0.clone()];
    for (which, path) in drafts.iter().enumerate() {
        let mut model = DraftModel::load(path, &engine, &tok, DraftParams { n_max: 4, ..Default::default() }).unwrap();
        let (mut drafted, mut kept) = (0, 0);
        for (i, case) in cases.iter().enumerate() {
            let (g, next, len) = answer(&mut engine, Some(&mut model), case);
            let (p, p_next, p_len) = &plain[i];
            assert_eq!((&g.tokens, &g.text, g.reason), (&p.tokens, &p.text, p.reason), "draft {which}, case {i}");
            assert_eq!((&next.tokens, len), (&p_next.tokens, *p_len), "draft {which}, case {i}: the session after it");
            if which == 0 && i == 0 {
                // Greedy, no stop string: every proposal is the target's own token, but for
                // those after the end of the answer.
                assert!(g.drafted > 12 && g.kept + 4 >= g.drafted, "{} of {} kept, {} tokens, {:?}", g.kept, g.drafted, g.tokens.len(), g.reason);
            }
            eprintln!("draft {which} case {i}: {}/{} then {}/{} ({} tokens {:?})", g.kept, g.drafted, next.kept, next.drafted, g.tokens.len(), g.reason);
            (drafted, kept) = (drafted + g.drafted + next.drafted, kept + g.kept + next.kept);
        }
        eprintln!("draft {which}: {kept} of {drafted} proposals kept");
        assert!(kept > 0 && drafted > 40, "draft {which}: {kept} of {drafted} kept");
        if which == 1 {
            assert!(kept < drafted, "a requantized draft proposes some token the target does not take");
        }
    }
    // n_min above n_max's reach: nothing fed; p_min 1: no proposal is that sure.
    for params in [DraftParams { n_max: 2, n_min: 3, p_min: 0.0 }, DraftParams { n_max: 4, n_min: 0, p_min: 1.0 }] {
        let mut model = DraftModel::load(&q4_0.0, &engine, &tok, params).unwrap();
        let (g, next, _) = answer(&mut engine, Some(&mut model), &cases[0]);
        assert_eq!((&g.tokens, g.drafted, next.drafted), (&plain[0].0.tokens, 0, 0), "{params:?}");
    }
}

/// A draft model of another vocabulary, or asked to propose nothing, is refused by name.
#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let (engine, tok) = load("SmolLM2-135M-Instruct.Q4_1.gguf", test_config(1));
    let other = model_path("gemma-3-270m-q4_k_m.gguf");
    let e = DraftModel::load(&other, &engine, &tok, DraftParams::default()).err().unwrap().to_string();
    assert!(e.contains("gemma-3-270m-q4_k_m.gguf") && e.contains("vocabulary"), "{e}");
    let own = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    let e = DraftModel::load(&own, &engine, &tok, DraftParams { n_max: 0, ..Default::default() }).err().unwrap().to_string();
    assert!(e.contains("--spec-draft-n-max"), "{e}");
}

/// Drafts see the tokens a sequence holds before the prompt (here blocks attached from the
/// prefix cache, as `--prompt-cache` and `serve` attach them): the model as its own draft
/// then proposes exactly the target's tokens, every proposal kept.
#[test]
fn drafts_see_the_tokens_a_sequence_holds_before_its_prompt() {
    let cfg = EngineConfig { batch_invariant: true, ..test_config(2) };
    let (mut engine, tok) = load("SmolLM2-135M-Instruct.Q4_1.gguf", cfg);
    let prompt = tok.encode(&format!("{}Copy that sentence three times:", "The keeper of the lighthouse wrote in his log every night. ".repeat(5)), true, true).unwrap();
    engine.feed(0, &prompt, false, |_| {}).unwrap();
    engine.clear_seq(0);
    let reused = engine.attach_prefix(1, &prompt);
    assert!(reused >= 48, "{reused} tokens attached");
    let mut model = DraftModel::load(&model_path("SmolLM2-135M-Instruct.Q4_1.gguf"), &engine, &tok, DraftParams::default()).unwrap();
    let params = GenerateParams { max_tokens: 40, seq: 1, sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
    let g = generate_drafted(&mut engine, Some(&mut model), &tok, &prompt[reused..], &params, |_| true).unwrap();
    assert!(g.drafted > 20 && g.kept == g.drafted, "{} of {} proposals kept", g.kept, g.drafted);
}
