//! Continuous batching on real models: concurrent requests give exactly the tokens each gives
//! alone; cancelled and finished sequences release their blocks; prefixes are reused.

mod common;

use common::*;
use corelm_engine::batcher::{Batcher, Event, FinishReason, Request};
use corelm_engine::sample::SamplingParams;
use corelm_engine::{EngineConfig, Tokenizer};
use corelm_core::kv::BLOCK;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Tokens, text, finish and log-probabilities of one request.
type Answer = (Vec<u32>, String, Option<FinishReason>, Vec<f32>);
type Log = Arc<Mutex<Answer>>;

fn request(prompt: Vec<u32>, max_tokens: usize, cancel_after: Option<usize>) -> (Request, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let sink = Box::new(move |e: Event| {
        let mut g = l.lock().unwrap();
        match e {
            Event::Token { id, text, logprob } => {
                g.0.push(id);
                g.1.push_str(&text);
                g.3.extend(logprob.map(|l| l.logprob));
            }
            Event::Text(t) => g.1.push_str(&t),
            Event::Prompt { .. } => {}
            Event::Done(f) => g.2 = Some(f.reason),
        }
        cancel_after.is_none_or(|n| g.0.len() < n)
    });
    let req = Request {
        prompt,
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: vec![],
        ignore_eos: true,
        logprobs: Some(2),
        chain_probs: false,
        lora: None,
        prompt_logprobs: None,
        constraint: None,
        context_shift: None,
        sink,
        arrived: Instant::now(),
    };
    (req, log)
}

fn drain(b: &mut Batcher) {
    drain_within(b, 10_000);
}

fn prompts(tok: &corelm_engine::Tokenizer, n: usize) -> Vec<Vec<u32>> {
    let topics = ["the sea", "a small robot", "winter in the mountains", "a chess game", "bread", "the moon"];
    (0..n)
        .map(|i| {
            let sys = if i % 2 == 0 { "You are a poet who writes short, vivid lines. " } else { "" };
            tok.encode(&format!("{sys}Write about {} (variant {i}):", topics[i % topics.len()]), true, true).unwrap()
        })
        .collect()
}

fn concurrent_equals_alone(file: &str, n_req: usize, n_seq: usize, max_tokens: usize) {
    let cfg = EngineConfig { n_seq_max: n_seq, n_batch: 32, batch_invariant: true, ..test_config(2) };
    let (engine, tok) = load(file, cfg);
    let tok = Arc::new(tok);
    let mut b = Batcher::new(engine, tok.clone());
    let ps = prompts(&tok, n_req);
    // Alone, one after the other.
    let mut alone = vec![];
    for p in &ps {
        let (r, log) = request(p.clone(), max_tokens, None);
        b.submit(r).map_err(|e| e.1).unwrap();
        drain(&mut b);
        alone.push(log.lock().unwrap().clone());
    }
    // All at once: more requests than slots, prompts chunked across steps beside decodes.
    let logs: Vec<Log> = ps
        .iter()
        .map(|p| {
            let (r, log) = request(p.clone(), max_tokens, None);
            b.submit(r).map_err(|e| e.1).unwrap();
            log
        })
        .collect();
    assert_eq!(b.n_waiting(), n_req);
    drain(&mut b);
    for (i, (log, want)) in logs.iter().zip(&alone).enumerate() {
        let got = log.lock().unwrap().clone();
        assert_eq!(got.0.len(), max_tokens);
        assert_eq!(got.0, want.0, "request {i}: tokens differ when batched");
        assert_eq!(got.1, want.1);
        // Bit-identical log-probabilities: batching changes no arithmetic at all.
        assert_eq!(got.3, want.3, "request {i}: logprobs differ when batched");
        assert_eq!(got.2, Some(FinishReason::Length));
    }
    assert_eq!(b.engine().blocks().used(), 0, "finished sequences release their blocks");
    assert!(b.engine().blocks().hits > 0, "the shared system prompt is served from the prefix cache");
}

#[test]
fn sixteen_concurrent_greedy_requests_equal_each_alone() {
    concurrent_equals_alone("SmolLM2-135M-Instruct.Q4_1.gguf", 16, 4, 24);
}

#[test]
fn batching_is_invariant_on_q4_k_and_sliding_window_models() {
    concurrent_equals_alone("gemma-3-270m-q4_k_m.gguf", 5, 3, 12);
}

#[test]
fn cancelled_requests_leave_at_once_and_free_their_blocks() {
    let cfg = EngineConfig { n_seq_max: 2, n_batch: 32, batch_invariant: true, ..test_config(1) };
    let (engine, tok) = load("SmolLM2-135M-Instruct.Q4_1.gguf", cfg);
    let tok = Arc::new(tok);
    let mut b = Batcher::new(engine, tok.clone());
    let ps = prompts(&tok, 3);
    let (r0, l0) = request(ps[0].clone(), 50, Some(3));
    let (r1, l1) = request(ps[1].clone(), 8, None);
    let (r2, l2) = request(ps[2].clone(), 4, None);
    for r in [r0, r1, r2] {
        b.submit(r).map_err(|e| e.1).unwrap();
    }
    drain(&mut b);
    assert_eq!(l0.lock().unwrap().0.len(), 3);
    assert_eq!(l0.lock().unwrap().2, Some(FinishReason::Cancelled));
    assert_eq!(l1.lock().unwrap().0.len(), 8);
    assert_eq!(l2.lock().unwrap().2, Some(FinishReason::Length));
    assert_eq!(b.engine().blocks().used(), 0);
    // A request that can never fit is refused at submission.
    let (r, _) = request(ps[0].clone(), 1 << 20, None);
    let e = b.submit(r).expect_err("refused").1;
    assert!(e.to_string().contains("does not fit"), "{e}");
}

/// Requests with one long prompt submitted together (an `n > 1` request's choices): the first
/// prefills it, the others wait for that and attach its full blocks, and every one gives the
/// tokens it gives alone. A request behind them with another prompt is not held up.
#[test]
fn requests_sharing_a_prompt_wait_for_its_prefill_and_reuse_it() {
    let cfg = EngineConfig { n_seq_max: 4, n_batch: 64, batch_invariant: true, ..test_config(1) };
    let (engine, tok) = load("SmolLM2-135M-Instruct.Q4_1.gguf", cfg);
    let tok = Arc::new(tok);
    let mut b = Batcher::new(engine, tok.clone());
    let text = "You are a careful assistant. Answer in one short sentence, plainly, without lists, tables or headings, and never repeat the question back. If you do not know, say so; do not guess, and do not apologise. Keep to facts a school textbook would state. Question: why is the sky blue?";
    let prompt = tok.encode(text, true, true).unwrap();
    assert!(prompt.len() > 3 * BLOCK, "{} tokens", prompt.len());
    let other = prompts(&tok, 1).remove(0);
    type Ends = Arc<Mutex<Vec<(usize, usize)>>>;
    let ends: Ends = Arc::default();
    let submit = |b: &mut Batcher, i: usize, p: &[u32]| {
        let (mut r, log) = request(p.to_vec(), 6, None);
        let (mut inner, ends) = (r.sink, ends.clone());
        r.sink = Box::new(move |e: Event| {
            if let Event::Done(f) = &e {
                ends.lock().unwrap().push((i, f.cached_tokens));
            }
            inner(e)
        });
        b.submit(r).map_err(|e| e.1).unwrap();
        log
    };
    let mut logs = vec![];
    for (i, p) in [&prompt, &prompt, &prompt, &other].into_iter().enumerate() {
        logs.push(submit(&mut b, i, p));
    }
    // The first and the other prompt are admitted; the copies wait for the first's prefill.
    b.step();
    assert_eq!((b.n_running(), b.n_waiting()), (2, 2));
    drain(&mut b);
    let full = (prompt.len() - 1) / BLOCK * BLOCK;
    let mut got = ends.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, [(0, 0), (1, full), (2, full), (3, 0)], "prompt tokens served from the first's blocks");
    // Alone (its prefix cached by now; batch-invariant, so the same tokens either way).
    let alone = submit(&mut b, 4, &prompt);
    drain(&mut b);
    for log in &logs[..3] {
        assert_eq!(log.lock().unwrap().0, alone.lock().unwrap().0, "a copy's tokens");
    }
}

/// JSON mode's and a JSON Schema's prefilters (a token's first two bytes, whole characters
/// inside a string) settle every token of all three golden vocabularies as feeding its bytes to
/// the automaton would, in every kind of state.
#[test]
fn json_mask_prefilters_agree_with_feeding_every_token() {
    use corelm_engine::json::{JsonMask, JsonState, JsonVocab, Schema};
    use std::sync::Arc;
    let object = Arc::new(Schema::object());
    let person = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "nick": {"type": "string"},
        "pet": {"enum": ["cat", "dog", null]}, "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}, "required": ["name", "age", "pet", "tags"]});
    let person = Arc::new(Schema::compile(&person).unwrap());
    let bounded = serde_json::json!({"type": "object", "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 4}, "n": {"type": "number", "minimum": 10, "exclusiveMaximum": 12.5}}, "required": ["code", "n"]});
    let bounded = Arc::new(Schema::compile(&bounded).unwrap());
    let patterned = serde_json::json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]{2}[0-9]+$"}, "say": {"type": "string", "pattern": "^(hello|héllo) world"}}, "required": ["id", "say"]});
    let patterned = Arc::new(Schema::compile(&patterned).unwrap());
    // Patterns under a maxLength: far from it (the memo of what the pattern takes) and near it
    // (each token fed).
    let capped = serde_json::json!({"type": "object", "properties": {"home": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083},
        "slug": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 8}, "pin": {"type": "string", "pattern": "^[0-9]+$", "minLength": 4, "maxLength": 6}}, "required": ["home", "slug", "pin"]});
    let capped = Arc::new(Schema::compile(&capped).unwrap());
    // A union of objects that start alike (the mask follows each until the text tells them apart).
    let union = serde_json::json!({"type": "object", "properties": {"pet": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind", "lives"]},
        {"type": "object", "properties": {"kind": {"const": "cow"}, "name": {"type": "string"}}, "required": ["kind"]},
        {"type": "object", "properties": {"size": {"type": "number"}}}]}}, "required": ["pet"]});
    let union = Arc::new(Schema::compile(&union).unwrap());
    // Tool calls: alternatives a first byte does not tell apart (two live until the name).
    let tools: Vec<corelm_engine::tools::Tool> = [
        serde_json::json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}}}),
        serde_json::json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer"}}, "required": ["zone"]}}}),
    ]
    .iter()
    .map(|t| corelm_engine::tools::Tool::from_openai(t, "t").unwrap())
    .collect();
    let calls = Arc::new(corelm_engine::tools::call_schema(&tools, &corelm_engine::tools::Choice::Required).unwrap().unwrap());
    let cases: [(&Arc<Schema>, &[&str]); 7] = [
        (
            &object,
            &["", "{", "{\"na", "{\"name\"", "{\"name\":", "{\"a\": \"Fel", "{\"a\": \"\\", "{\"a\": \"\\u0", "{\"a\": \"\u{e9}", "{\"a\": 1", "{\"a\": -", "{\"a\": 1.5e", "{\"a\": tr", "{\"a\": [", "{\"a\": [1, {}", "{\"a\": 1}\n"],
        ),
        (&person, &["", "{", "{\"n", "{\"name\": \"Bo", "{\"name\": \"Bob\", \"age\": 1", "{\"name\": \"Bob\", \"age\": 1,", "{\"name\": \"Bob\", \"age\": 1, \"pet\": \"c", "{\"name\": \"Bob\", \"age\": 1, \"pet\": null, \"tags\": [true, "]),
        (&calls, &["", "{", "{\"name\": \"get_", "{\"name\": \"get_time\", \"arguments\": {\"zone\": 1", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par"]),
        (&bounded, &["{\"code\": \"", "{\"code\": \"a", "{\"code\": \"ab", "{\"code\": \"abc", "{\"code\": \"abcd", "{\"code\": \"abcd\", \"n\": ", "{\"code\": \"abcd\", \"n\": 1", "{\"code\": \"abcd\", \"n\": 12."]),
        (&union, &["{\"pet\":", "{\"pet\": ", "{\"pet\": {", "{\"pet\": {\"", "{\"pet\": {\"kind\": \"c", "{\"pet\": {\"kind\": \"co", "{\"pet\": {\"kind\": \"cow\"", "{\"pet\": {\"size\": 1"]),
        // Inside patterned strings every token is fed (no whole-character shortcut).
        (&patterned, &["{\"id\": \"", "{\"id\": \"ab", "{\"id\": \"ab1", "{\"id\": \"ab12\", \"say\": \"", "{\"id\": \"ab12\", \"say\": \"hello", "{\"id\": \"ab12\", \"say\": \"hello world, "]),
        (&capped, &["{\"home\": \"", "{\"home\": \"https://ex", "{\"home\": \"https://ex.org/%", "{\"home\": \"h:\", \"slug\": \"", "{\"home\": \"h:\", \"slug\": \"abc", "{\"home\": \"h:\", \"slug\": \"abcdef-", "{\"home\": \"h:\", \"slug\": \"abcdefg", "{\"home\": \"h:\", \"slug\": \"a\", \"pin\": \"12", "{\"home\": \"h:\", \"slug\": \"a\", \"pin\": \"12345"]),
    ];
    for file in ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"] {
        let g = corelm_gguf::Gguf::open(model_path(file)).unwrap();
        let tok = corelm_engine::Tokenizer::from_gguf(&g).unwrap();
        let vocab = JsonVocab::new(&tok);
        for (schema, prefixes) in cases {
            let mut checked = 0;
            for prefix in prefixes {
                let mut mask = JsonMask::new(schema.clone());
                // The mask fed the prefix's single-byte tokens (all in these vocabularies but an
                // odd one), the states of the roots (and of the alternatives) it fits their bytes.
                let mut states: Vec<JsonState> = (0..schema.alternatives()).map(|i| JsonState::at_root(schema, i)).collect();
                corelm_engine::json::state::advance(&mut states, &mut vec![], schema, prefix.as_bytes());
                assert!(!states.is_empty(), "{prefix:?}");
                let byte_tokens: Vec<u32> = prefix.bytes().filter_map(|b| (0..tok.n_vocab() as u32).find(|&id| tok.piece(id) == [b] && !tok.is_control(id))).collect();
                if byte_tokens.len() != prefix.len() {
                    continue;
                }
                for &id in &byte_tokens {
                    assert!(mask.accept(&vocab, &tok, id), "{file} {prefix:?}");
                }
                let mut allowed = 0;
                for id in 0..tok.n_vocab() as u32 {
                    let p = tok.piece(id);
                    let want = !p.is_empty() && !tok.is_control(id) && !tok.is_eog(id) && states.iter().any(|&s| s.takes_all(schema, p));
                    assert_eq!(mask.allows(&vocab, &tok, id), want, "{file} {prefix:?} token {id} {:?}", String::from_utf8_lossy(p));
                    allowed += want as usize;
                }
                assert!(allowed > 0, "{file} {prefix:?}: no token continues");
                checked += 1;
            }
            assert!(checked >= prefixes.len() - 2, "{file}: {checked} prefixes had single-byte tokens");
        }
    }
}

/// A scored prompt (`prompt_logprobs`, the legacy API's `echo`): one event per prompt token, in
/// order, each the log-softmax of the logits of the position before it exactly as a pass with
/// every row's logits gives it (the perplexity path), whether the prompt goes in chunks beside
/// another request's decode, is already in the prefix cache, or is followed by an answer —
/// which is then the answer an unscored request gets.
#[test]
fn scored_prompts_equal_the_all_logits_pass() {
    use corelm_engine::batcher::{token_logprob, TokenLogprob};
    let cfg = EngineConfig { n_seq_max: 3, n_batch: 16, batch_invariant: true, ..test_config(2) };
    let (mut engine, tok) = load("SmolLM2-135M-Instruct.Q4_1.gguf", cfg);
    let text = "The quick brown fox jumps over the lazy dog, and then it runs into the forest where the owls are sleeping until night. \
        When the moon rises the owls wake, and the fox, tired from the day, curls up under an old oak and listens to them calling across the valley.";
    let prompt = tok.encode(text, true, true).unwrap();
    assert!(prompt.len() > 2 * BLOCK && prompt.len() > 16, "{} tokens", prompt.len());
    // The reference: one sequence, every row's logits, in passes of 16.
    let mut want: Vec<TokenLogprob> = vec![];
    let mut pos = 0;
    engine
        .feed(0, &prompt, true, |l| {
            for r in 0..l.rows() {
                if pos + r + 1 < prompt.len() {
                    want.push(token_logprob(l.row(r), prompt[pos + r + 1], 3));
                }
            }
            pos += l.rows();
        })
        .unwrap();
    engine.clear_all();
    let tok = Arc::new(tok);
    let mut b = Batcher::new(engine, tok.clone());
    type Scored = Arc<Mutex<(Vec<(u32, Option<TokenLogprob>)>, Vec<u32>, Option<(FinishReason, usize)>)>>;
    let scored = |b: &mut Batcher, max_tokens: usize| -> Scored {
        let log: Scored = Arc::default();
        let l = log.clone();
        let sink = Box::new(move |e: Event| {
            let mut g = l.lock().unwrap();
            match e {
                Event::Prompt { id, logprob } => {
                    assert!(g.1.is_empty(), "a prompt event after a generated token");
                    g.0.push((id, logprob));
                }
                Event::Token { id, .. } => g.1.push(id),
                Event::Text(_) => {}
                Event::Done(f) => g.2 = Some((f.reason, f.completion_tokens)),
            }
            true
        });
        let (mut r, _) = request(prompt.clone(), max_tokens, None);
        r.sink = sink;
        r.prompt_logprobs = Some(3);
        b.submit(r).map_err(|e| e.1).unwrap();
        log
    };
    let check = |log: &Scored, max_tokens: usize| {
        let g = log.lock().unwrap();
        assert_eq!(g.0.len(), prompt.len(), "one event per prompt token");
        assert_eq!(g.0[0], (prompt[0], None), "the first token has no log-probability");
        for (p, (id, lp)) in g.0.iter().enumerate().skip(1) {
            assert_eq!(*id, prompt[p]);
            assert_eq!(lp.as_ref(), Some(&want[p - 1]), "prompt token {p}");
        }
        assert_eq!(g.2, Some((FinishReason::Length, max_tokens)));
        assert_eq!(g.1.len(), max_tokens);
    };
    // Beside an unscored request of the same prompt: chunks of 16 share each step.
    let (plain, plain_log) = request(prompt.clone(), 5, None);
    b.submit(plain).map_err(|e| e.1).unwrap();
    let only_prompt = scored(&mut b, 0);
    drain(&mut b);
    check(&only_prompt, 0);
    // Its blocks are cached now; a scored request computes the prompt again, then answers.
    let answered = scored(&mut b, 5);
    drain(&mut b);
    check(&answered, 5);
    assert_eq!(answered.lock().unwrap().1, plain_log.lock().unwrap().0, "the answer after a scored prompt");
    assert_eq!(b.engine().blocks().used(), 0);
}

/// Four requests at once, their answers: greedy ones (repetitive text, a story with a stop
/// string) and seeded sampled ones with a repetition penalty, each with log-probabilities.
fn four_requests(b: &mut Batcher, tok: &Tokenizer) -> Vec<Answer> {
    let texts = [
        "Copy the list exactly, three times:\n- red apple\n- green pear\n- blue plum\n",
        "fn add(a: i32, b: i32) -> i32 { a + b }\nfn sub(a: i32, b: i32) -> i32 { a - b }\nfn mul(",
        "The cat sat on the mat. The cat sat on the mat. The cat",
        "Once upon a time, in a small village by the sea,",
    ];
    let logs: Vec<Log> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (mut r, log) = request(tok.encode(t, true, true).unwrap(), 40, None);
            r.logprobs = Some(2);
            if i % 2 == 1 {
                r.sampling.temperature = 0.7;
                r.sampling.seed = 11 + i as u64;
                r.sampling.repeat_penalty = 1.1;
            }
            if i == 3 {
                r.stop = vec!["sea.".into()];
            }
            b.submit(r).map_err(|e| e.1).unwrap();
            log
        })
        .collect();
    drain(b);
    logs.iter().map(|l| l.lock().unwrap().clone()).collect()
}

/// Prompt-lookup drafts change no token and no log-probability: greedy and seeded sampled
/// requests, four at once, with repetition penalties and a stop string, give with drafts (of
/// a fixed length, and as long as the timed costs say) what they give without; the drafts of
/// repetitive text are mostly kept; every block comes back.
#[test]
fn prompt_lookup_drafts_change_nothing_but_the_passes() {
    use std::sync::atomic::Ordering::Relaxed;
    let cfg = EngineConfig { n_seq_max: 4, n_batch: 48, batch_invariant: true, ..test_config(2) };
    let (engine, tok) = load("SmolLM2-135M-Instruct.Q4_1.gguf", cfg);
    let tok = Arc::new(tok);
    let mut b = Batcher::new(engine, tok.clone());
    let run = |b: &mut Batcher| four_requests(b, &tok);
    let plain = run(&mut b);
    for adaptive in [false, true] {
        b.set_lookup(6, adaptive);
        let counts = |b: &Batcher| (b.stats().drafted.load(Relaxed), b.stats().drafts_kept.load(Relaxed));
        let before = counts(&b);
        let drafted = run(&mut b);
        assert_eq!(b.engine().blocks().used(), 0, "finished sequences release their blocks");
        for (i, (a, d)) in plain.iter().zip(&drafted).enumerate() {
            assert_eq!(a.0, d.0, "request {i}: tokens");
            assert_eq!(a.1, d.1, "request {i}: text");
            assert_eq!(a.2, d.2, "request {i}: finish");
            assert_eq!(a.3, d.3, "request {i}: log-probabilities");
        }
        let after = counts(&b);
        let (fed, kept) = (after.0 - before.0, after.1 - before.1);
        eprintln!("adaptive {adaptive}: {kept} of {fed} draft tokens kept");
        if !adaptive {
            assert!(fed > 40 && kept * 3 > fed, "{kept} of {fed} draft tokens kept");
        }
    }
}

/// A draft model's proposals change no token and no log-probability either: the same four
/// requests (two sampled, one with a stop string) with SmolLM2 requantized to Q4_0 as the
/// draft; all four sequences draft in the same passes; every block of both caches comes back.
#[test]
fn a_draft_model_changes_nothing_but_the_passes() {
    use corelm_engine::draft::{DraftModel, DraftParams};
    use std::sync::atomic::Ordering::Relaxed;
    let cfg = EngineConfig { n_seq_max: 4, n_batch: 48, batch_invariant: true, ..test_config(2) };
    let (engine, tok) = load("SmolLM2-135M-Instruct.Q4_1.gguf", cfg);
    let tok = Arc::new(tok);
    let q4_0 = DraftFile::smollm2_q4_0();
    let model = DraftModel::load(&q4_0.0, &engine, &tok, DraftParams { n_max: 5, ..Default::default() }).unwrap();
    let mut b = Batcher::new(engine, tok.clone());
    let run = |b: &mut Batcher| four_requests(b, &tok);
    let plain = run(&mut b);
    b.set_draft_model(model);
    let drafted = run(&mut b);
    for (i, (a, d)) in plain.iter().zip(&drafted).enumerate() {
        assert_eq!((&a.0, &a.1, &a.2), (&d.0, &d.1, &d.2), "request {i}: tokens, text, finish");
        assert_eq!(a.3, d.3, "request {i}: log-probabilities");
    }
    let (fed, kept) = (b.stats().drafted.load(Relaxed), b.stats().drafts_kept.load(Relaxed));
    eprintln!("{kept} of {fed} proposals kept");
    assert!(fed > 40 && kept > fed / 4, "{kept} of {fed} proposals kept");
    assert_eq!(b.engine().blocks().used(), 0, "the target's blocks come back");
    let m = b.draft_model().unwrap();
    assert_eq!((m.engine().blocks().used(), m.failed()), (0, 0), "the draft's blocks come back; no draft pass failed");
}
