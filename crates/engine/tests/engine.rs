//! Engine behaviour on a real model (SmolLM2): multi-sequence batches, graph reuse, errors that
//! leave the engine usable, refused models, templates, sampling and streaming.

mod common;

use common::*;
use corelm_engine::constraint::Constraint;
use corelm_engine::chat::{ChatTemplate, Message};
use corelm_engine::generate::{generate, GenerateParams, StopReason};
use corelm_engine::sample::{argmax, Sampler, SamplingParams};
use corelm_engine::{Batch, Engine, Error, Utf8Stream};
use corelm_gguf::writer::Writer;
use corelm_gguf::{GgmlType, Value};

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn logits_alone(engine: &mut Engine, seq: i32, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut b = Batch::new();
    for (i, &t) in tokens.iter().enumerate() {
        b.add(t, i as i32, seq, true);
    }
    let l = engine.decode(&b).unwrap();
    (0..l.rows()).map(|r| l.row(r).to_vec()).collect()
}

#[test]
fn two_sequences_in_one_batch_equal_each_alone() {
    let (mut engine, tok) = load(SMOL, test_config(2));
    let a = tok.encode("The quick brown fox jumps over", false, true).unwrap();
    let b = tok.encode("In 1492, Columbus sailed", false, true).unwrap();
    let alone_a = logits_alone(&mut engine, 0, &a);
    engine.clear_all();
    let alone_b = logits_alone(&mut engine, 1, &b);
    engine.clear_all();

    // Interleave the two prompts in one batch, sequences 2 and 3.
    let mut batch = Batch::new();
    let mut order = Vec::new();
    for i in 0..a.len().max(b.len()) {
        if i < a.len() {
            batch.add(a[i], i as i32, 2, true);
            order.push((0, i));
        }
        if i < b.len() {
            batch.add(b[i], i as i32, 3, true);
            order.push((1, i));
        }
    }
    let l = engine.decode(&batch).unwrap();
    for (row, &(s, i)) in order.iter().enumerate() {
        let want = if s == 0 { &alone_a[i] } else { &alone_b[i] };
        assert_eq!(l.row(row), &want[..], "sequence {s} position {i} differs when batched");
    }

    // And decoding one more token for each, in one batch, equals decoding alone.
    let (na, nb) = (argmax(&alone_a[a.len() - 1]), argmax(&alone_b[b.len() - 1]));
    let mut step = Batch::new();
    step.add(na, a.len() as i32, 2, true).add(nb, b.len() as i32, 3, true);
    let both: Vec<Vec<f32>> = {
        let l = engine.decode(&step).unwrap();
        (0..2).map(|r| l.row(r).to_vec()).collect()
    };
    engine.clear_all();
    let mut a2 = a.clone();
    a2.push(na);
    let solo = logits_alone(&mut engine, 0, &a2);
    let d: f32 = both[0].iter().zip(&solo[a.len()]).map(|(x, y)| (x - y).abs()).fold(0.0, max_nan);
    assert!(d < 1e-3, "batched decode step differs from a solo prefill by {d}");
}

#[test]
fn decode_reuses_one_graph_and_matches_prefill() {
    let (mut engine, tok) = load(SMOL, test_config(2));
    let ids = tok.encode("Once upon a time there was", false, true).unwrap();
    let full = logits_alone(&mut engine, 0, &ids);
    engine.clear_all();
    // Token by token: prompt one at a time, same logits (the reference attention path is used
    // for both, so equal to the bit).
    let graphs_before = engine.n_graphs();
    let mut b = Batch::new();
    for (i, &t) in ids.iter().enumerate() {
        b.clear();
        b.add(t, i as i32, 0, true);
        let l = engine.decode(&b).unwrap();
        assert_eq!(l.row(0), &full[i][..], "position {i}");
    }
    assert_eq!(engine.n_graphs(), graphs_before + 1, "single-token decode must plan exactly one graph");
}

#[test]
fn bad_batches_are_refused_and_state_is_kept() {
    let (mut engine, tok) = load(SMOL, EngineConfig { n_ctx: 16, ..test_config(1) });
    let ids = tok.encode("Hello there", false, true).unwrap();
    let before = logits_alone(&mut engine, 0, &ids);
    let n = ids.len() as i32;

    let mut b = Batch::new();
    b.add(1_000_000, n, 0, true);
    let e = engine.decode(&b).err().unwrap().to_string();
    assert!(e.contains("1000000") && e.contains("vocabulary"), "{e}");

    b.clear();
    b.add(1, 0, 0, true); // position already used
    let e = engine.decode(&b).err().unwrap().to_string();
    assert!(e.contains("position 0"), "{e}");

    b.clear();
    b.add(1, 0, 9, true);
    assert!(matches!(engine.decode(&b), Err(Error::Batch(_))));

    b.clear();
    for i in 0..20 {
        b.add(1, n + i, 0, true);
    }
    let e = engine.decode(&b).err().unwrap();
    assert!(matches!(e, Error::Batch(_) | Error::ContextFull { .. }), "{e}");

    // The sequence is intact: decoding its next token equals a fresh run.
    b.clear();
    b.add(argmax(&before[before.len() - 1]), n, 0, true);
    let next = engine.decode(&b).unwrap().row(0).to_vec();
    engine.clear_all();
    let mut ids2 = ids.clone();
    ids2.push(argmax(&before[before.len() - 1]));
    let fresh = logits_alone(&mut engine, 0, &ids2);
    assert_eq!(next, fresh[ids.len()]);

    // A prompt longer than the context is refused with the sizes.
    engine.clear_all();
    let long = vec![1u32; 40];
    let e = generate(&mut engine, &tok, &long, &GenerateParams::default(), |_| true).err().unwrap();
    assert!(matches!(e, Error::PromptTooLong { prompt: 40, n_ctx: 16 }), "{e}");
}

use corelm_engine::EngineConfig;

fn tiny_gguf(arch: &str, with_tensors: bool) -> Vec<u8> {
    let mut w = Writer::new();
    let k = |s: &str| format!("{arch}.{s}");
    w.kv("general.architecture", Value::String(arch.into()))
        .kv(&k("block_count"), Value::U32(1))
        .kv(&k("context_length"), Value::U32(64))
        .kv(&k("embedding_length"), Value::U32(32))
        .kv(&k("feed_forward_length"), Value::U32(64))
        .kv(&k("attention.head_count"), Value::U32(2))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
    if with_tensors {
        w.tensor("token_embd.weight", &[32, 10], GgmlType::F32, vec![0; 32 * 10 * 4]);
        w.tensor("output_norm.weight", &[32], GgmlType::F32, vec![0; 32 * 4]);
    }
    w.to_bytes()
}

#[test]
fn unknown_architecture_and_missing_tensor_are_named() {
    let dir = std::env::temp_dir().join(format!("corelm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("mamba.gguf");
    std::fs::write(&p, tiny_gguf("mamba9", true)).unwrap();
    let e = Engine::load(&p, test_config(1)).err().unwrap().to_string();
    assert!(e.contains("mamba9") && e.contains("unsupported architecture"), "{e}");

    let p = dir.join("llama.gguf");
    std::fs::write(&p, tiny_gguf("llama", true)).unwrap();
    let e = Engine::load(&p, test_config(1)).err().unwrap().to_string();
    assert!(e.contains("missing tensor 'blk.0."), "{e}");

    // A tensor type no kernel computes with is refused by tensor and type name.
    let p = dir.join("i8.gguf");
    let mut w = Writer::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(1))
        .kv("llama.context_length", Value::U32(64))
        .kv("llama.embedding_length", Value::U32(32))
        .kv("llama.feed_forward_length", Value::U32(64))
        .kv("llama.attention.head_count", Value::U32(2))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    w.tensor("token_embd.weight", &[32, 10], GgmlType::I8, vec![0; 32 * 10]);
    std::fs::write(&p, w.to_bytes()).unwrap();
    let e = Engine::load(&p, test_config(1)).err().unwrap().to_string();
    assert!(e.contains("token_embd.weight") && e.contains("I8"), "{e}");

    let p = dir.join("truncated.gguf");
    let bytes = tiny_gguf("llama", true);
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = Engine::load(&p, test_config(1)).err().unwrap().to_string();
    assert!(e.contains("token_embd.weight") || e.contains("truncated"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn impossible_context_sizes_are_errors_not_aborts() {
    // 2^40 cells of KV: far beyond any address space budget; must be a clear error.
    let cfg = EngineConfig { n_ctx: 1 << 40, ..test_config(1) };
    let e = Engine::load(model_path(SMOL), cfg).err().unwrap().to_string();
    assert!(e.contains("KV cache") && e.contains("1099511627776"), "{e}");
}

#[test]
fn chat_templates_reproduce_the_golden_prompts() {
    for (dir, file, _) in MODELS {
        let path = golden_dir().join(dir).join("p08_chat.json");
        let case: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let msgs: Vec<Message> = case["chat_messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let g = corelm_engine::engine::open_gguf(model_path(file)).unwrap();
        let tok = corelm_engine::Tokenizer::from_gguf(&g).unwrap();
        let t = ChatTemplate::from_gguf(&g, &tok).unwrap();
        assert_eq!(t.render(&msgs, true).unwrap(), case["prompt"].as_str().unwrap(), "{dir}");
    }
    // Templates that raise report the message.
    let t = ChatTemplate::from_jinja("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
    let e = t.render(&[], true).err().unwrap().to_string();
    assert!(e.contains("roles must alternate"), "{e}");
}

#[test]
fn sampler_behaviour() {
    let logits = vec![0.0, 3.0, 2.9, -1.0, 1.0];
    let mut s = Sampler::new(SamplingParams::greedy(), 5).unwrap();
    assert_eq!(s.sample(&logits), 1);
    // top_k = 1 is greedy at any temperature.
    let mut s = Sampler::new(SamplingParams { temperature: 5.0, top_k: 1, ..Default::default() }, 5).unwrap();
    assert!((0..20).all(|_| s.sample(&logits) == 1));
    // Same seed, same draws; the distribution is not degenerate at high temperature.
    let p = SamplingParams { temperature: 2.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 7, ..Default::default() };
    let draws = |p: &SamplingParams| {
        let mut s = Sampler::new(p.clone(), 5).unwrap();
        (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(draws(&p), draws(&p));
    assert!(draws(&p).iter().collect::<std::collections::HashSet<_>>().len() >= 3);
    // min_p keeps only tokens with p ≥ min_p · p_max: 1 and 2 here.
    let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.5, ..p.clone() }, 5).unwrap();
    assert!((0..50).all(|_| matches!(s.sample(&logits), 1 | 2)));
    // A repetition penalty steers greedy away from a recent token.
    let mut s = Sampler::new(SamplingParams { temperature: 0.0, repeat_penalty: 2.0, ..Default::default() }, 5).unwrap();
    s.accept(1);
    assert_eq!(s.sample(&logits), 2);
    // Presence penalty likewise.
    let mut s = Sampler::new(SamplingParams { temperature: 0.0, presence_penalty: 0.5, ..Default::default() }, 5).unwrap();
    s.accept(1);
    assert_eq!(s.sample(&logits), 2);
    // A logit bias lifts a token to the top, or bans one (−∞), before the penalties and the
    // chain; at a high temperature with top_k 1 the banned token never comes.
    let mut s = Sampler::new(SamplingParams { temperature: 0.0, logit_bias: vec![(4, 2.5)], ..Default::default() }, 5).unwrap();
    assert_eq!(s.sample(&logits), 4);
    let mut s = Sampler::new(SamplingParams { temperature: 0.0, logit_bias: vec![(1, f32::NEG_INFINITY), (2, -2.5)], ..Default::default() }, 5).unwrap();
    assert_eq!(s.sample(&logits), 4);
    let mut s = Sampler::new(SamplingParams { temperature: 5.0, top_k: 1, logit_bias: vec![(1, f32::NEG_INFINITY)], ..Default::default() }, 5).unwrap();
    assert!((0..20).all(|_| s.sample(&logits) == 2));
    let all: Vec<(u32, f32)> = (0..5).map(|t| (t, f32::NEG_INFINITY)).collect();
    let mut s = Sampler::new(SamplingParams { logit_bias: all, ..Default::default() }, 5).unwrap();
    assert_eq!(s.sample_allowed(&logits, None::<fn(u32) -> bool>), None, "every token banned");
    // Bad parameters are refused by name.
    for bad in [
        SamplingParams { temperature: -1.0, ..Default::default() },
        SamplingParams { top_p: 0.0, ..Default::default() },
        SamplingParams { min_p: 2.0, ..Default::default() },
        SamplingParams { repeat_penalty: 0.0, ..Default::default() },
        SamplingParams { logit_bias: vec![(5, 1.0)], ..Default::default() },
        SamplingParams { logit_bias: vec![(0, f32::NAN)], ..Default::default() },
    ] {
        assert!(matches!(Sampler::new(bad, 5), Err(Error::Sampling(_))));
    }
}

#[test]
fn utf8_stream_never_splits_a_character() {
    let mut s = Utf8Stream::default();
    let bytes = "é😀".as_bytes();
    assert_eq!(s.push(&bytes[..1]), "");
    assert_eq!(s.push(&bytes[1..3]), "é");
    assert_eq!(s.push(&bytes[3..5]), "");
    assert_eq!(s.push(&bytes[5..]), "😀");
    assert_eq!(s.push(&[0xFF, b'a']), "\u{FFFD}a");
    assert_eq!(s.push(&[0xE2, 0x82]), "");
    assert_eq!(s.finish(), "\u{FFFD}");
}

#[test]
fn generation_stops_on_stop_strings_and_limits() {
    let (mut engine, tok) = load(SMOL, test_config(2));
    let ids = tok.encode("1, 2, 3, 4, 5,", false, true).unwrap();
    let params = GenerateParams { max_tokens: 40, sampling: SamplingParams::greedy(), stop: vec!["9".into()], seq: 0, ignore_eos: false, constraint: None, lookup: 0, context_shift: None };
    let mut streamed = String::new();
    let g = generate(&mut engine, &tok, &ids, &params, |t| {
        streamed.push_str(t);
        true
    })
    .unwrap();
    assert_eq!(g.reason, StopReason::StopString, "text: {:?}", g.text);
    assert!(!g.text.contains('9') && g.text.contains('8'), "{:?}", g.text);
    assert_eq!(streamed, g.text, "streamed text equals the final text");

    engine.clear_all();
    let params = GenerateParams { max_tokens: 5, sampling: SamplingParams::greedy(), ..Default::default() };
    let g = generate(&mut engine, &tok, &ids, &params, |_| true).unwrap();
    assert_eq!((g.reason, g.tokens.len()), (StopReason::MaxTokens, 5));

    // Greedy generation is deterministic and the tokens are in the KV cache afterwards.
    assert_eq!(engine.seq_len(0), ids.len() + 4);

    // JSON mode: the same prompt (a list of numbers) answered as an object, which closes.
    engine.clear_all();
    let object = Some(Constraint::Json(std::sync::Arc::new(corelm_engine::json::Schema::object())));
    let params = GenerateParams { max_tokens: 64, sampling: SamplingParams::greedy(), constraint: object, ..Default::default() };
    let g = generate(&mut engine, &tok, &ids, &params, |_| true).unwrap();
    assert_eq!(g.reason, StopReason::Closed, "text: {:?}", g.text);
    let v: serde_json::Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{e}: {:?}", g.text));
    assert!(v.is_object(), "{:?}", g.text);

    // A JSON Schema: the answer has exactly its properties, in order, of their types.
    engine.clear_all();
    let schema = serde_json::json!({"type": "object", "properties": {"count": {"type": "integer"}, "numbers": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}, "done": {"type": "boolean"}}, "required": ["count", "numbers", "done"]});
    let json = Some(Constraint::Json(std::sync::Arc::new(corelm_engine::json::Schema::compile(&schema).unwrap())));
    let params = GenerateParams { max_tokens: 64, sampling: SamplingParams::greedy(), constraint: json, ..Default::default() };
    let g = generate(&mut engine, &tok, &ids, &params, |_| true).unwrap();
    assert_eq!(g.reason, StopReason::Closed, "text: {:?}", g.text);
    let v: serde_json::Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{e}: {:?}", g.text));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["count", "numbers", "done"], "{:?}", g.text);
    assert!(v["count"].is_i64() && v["done"].is_boolean(), "{:?}", g.text);
    assert!(v["numbers"].as_array().is_some_and(|a| a.len() <= 4 && a.iter().all(|n| n.is_i64())), "{:?}", g.text);
}

#[test]
fn prefix_cache_reuses_blocks_and_gives_the_same_logits() {
    // Gemma: Q4_K (batch-size-dependent dot order without batch invariance) and SWA layers.
    let cfg = EngineConfig { batch_invariant: true, ..test_config(2) };
    let (mut engine, tok) = load("gemma-3-270m-q4_k_m.gguf", cfg);
    let system = "You are a helpful assistant who answers in one short sentence. ".repeat(4);
    let a = tok.encode(&format!("{system}Question: what is the capital of France?"), true, true).unwrap();
    let b = tok.encode(&format!("{system}Question: name a large ocean."), true, true).unwrap();
    // Sequence 0 computes A; sequence 1 computes B from scratch (prefix caching unused).
    let last = |e: &mut Engine, seq: i32, toks: &[u32]| {
        let mut out = vec![];
        e.feed(seq, toks, false, |l| out = l.row(0).to_vec()).unwrap();
        out
    };
    last(&mut engine, 0, &a);
    let scratch_b = last(&mut engine, 1, &b);
    engine.clear_seq(1);
    // B again on sequence 2, starting from A's cached blocks.
    let hits = engine.blocks().hits;
    let reused = engine.attach_prefix(2, &b);
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(reused >= 16 && reused <= common && reused % 16 == 0, "reused {reused} of a {common}-token common prefix");
    assert_eq!(engine.seq_len(2), reused);
    assert_eq!(engine.blocks().hits - hits, reused as u64);
    let cached_b = last(&mut engine, 2, &b[reused..]);
    assert_eq!(cached_b, scratch_b, "logits after a cached prefix differ from a full computation");
    // Released sequences leave their full blocks cached; clear_all forgets them.
    engine.clear_seq(0);
    engine.clear_seq(2);
    assert!(engine.blocks().cached() > 0);
    assert_eq!(engine.blocks().used(), 0);
    engine.clear_all();
    assert_eq!((engine.blocks().cached(), engine.attach_prefix(0, &b)), (0, 0));
}

#[test]
fn positions_must_continue_the_sequence() {
    let (mut engine, _) = load(SMOL, test_config(1));
    let mut b = Batch::new();
    b.add(1, 1, 0, true);
    let e = engine.decode(&b).err().expect("gap refused");
    assert!(e.to_string().contains("not its next position 0"), "{e}");
    b.clear();
    b.add(1, 0, 0, true);
    engine.decode(&b).unwrap();
    assert_eq!(engine.seq_len(0), 1);
}

/// A prompt's logits do not depend on the thread count: 13 workers (oversubscribed here) split
/// SmolLM2's narrow Q/K/V matmuls into 2-D grids of column blocks × row groups and deal the
/// attention heads differently, and every logit keeps the bits of one worker's run.
#[test]
fn logits_are_the_same_for_any_thread_count() {
    let tokens: Vec<u32> = (0..45).map(|i| (i * 977 + 13) % 49152).collect();
    let (mut one, _) = load(SMOL, test_config(1));
    let want = logits_alone(&mut one, 0, &tokens);
    drop(one);
    for n_threads in [3, 13] {
        let (mut many, _) = load(SMOL, test_config(n_threads));
        let got = logits_alone(&mut many, 0, &tokens);
        for (r, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{n_threads} threads, row {r}");
        }
    }
}

/// Barriers left out between independent nodes and row-local chains
/// (`corelm_core::Graph::elide_barriers`) change no bits: each golden model, a 45-token prompt
/// and three one-token steps at 13 threads on this machine's few cores (workers preempted
/// mid-node, so a missing barrier shows), against every barrier kept. SmolLM2's one-token
/// graph drops 9 of each layer's 20 (Q/K, K/V, the RoPEs, gate/up; norm → quantize twice,
/// activation → quantize, the residual add → the next norm twice); a matmul never starts
/// before the quantized row it reads is whole. The same for group barriers at `--tp 2`.
#[test]
fn elided_barriers_keep_the_logits() {
    use corelm_core::{Op, Sync};
    let tokens: Vec<u32> = (0..45).map(|i| (i * 977 + 13) % 30000).collect();
    for (_, file, _) in MODELS {
        let run = |elide_barriers: bool| {
            let (mut e, _) = load(file, corelm_engine::EngineConfig { elide_barriers, ..test_config(13) });
            let mut rows = logits_alone(&mut e, 0, &tokens);
            for (i, t) in [11u32, 4000, 17].into_iter().enumerate() {
                let mut b = Batch::new();
                b.add(t, (tokens.len() + i) as i32, 0, true);
                rows.push(e.decode(&b).unwrap().row(0).to_vec());
            }
            let n_layer = e.hyper().n_layer;
            let g = e.graph(1, 1);
            for (i, w) in g.nodes.windows(2).enumerate() {
                if let Op::MatMul { x, .. } = g.tensor(w[1]).op {
                    assert!(x != w[0] || g.sync[i] != Sync::Elided, "{file}: a matmul starts before its input is whole");
                }
            }
            (rows, g.barriers().1, g.nodes.len(), n_layer)
        };
        let (kept, all, nodes, n_layer) = run(false);
        let (elided, fewer, _, _) = run(true);
        assert_eq!(all, nodes, "{file}: every node followed by the global barrier");
        eprintln!("{file}: {fewer} of {nodes} global barriers kept at one token");
        if file == SMOL {
            assert_eq!(nodes - fewer, 9 * n_layer, "{file}: nine per layer left out");
        } else {
            assert!(fewer < nodes - 4 * n_layer, "{file}: {fewer} of {nodes}");
        }
        for (r, (a, b)) in elided.iter().zip(&kept).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{file}: row {r} differs");
        }
    }
    // Inside tensor-parallel subgraphs (each shard's next node, the shards interleaved): the
    // group barriers, at --tp 2 over 13 workers.
    let run = |elide_barriers: bool| {
        let (mut e, _) = load(SMOL, corelm_engine::EngineConfig { elide_barriers, tp: 2, ..test_config(13) });
        let rows = logits_alone(&mut e, 0, &tokens);
        (rows, e.graph(tokens.len(), tokens.len()).barriers())
    };
    let ((kept, (group_all, _)), (elided, (group, _))) = (run(false), run(true));
    eprintln!("--tp 2: {group} of {group_all} group barriers kept");
    assert!(group < group_all, "--tp 2: group barriers {group} of {group_all}");
    for (r, (a, b)) in elided.iter().zip(&kept).enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "--tp 2: row {r} differs");
    }
}

/// Matrices repacked at load (the interleaved layout of the SIMD kernels) give the plain
/// rows' logits bit for bit, on all three golden models and under every SIMD table this CPU
/// runs (AVX2's and AVX-512's interleaved kernels): a 45-token prompt (tiles, the GEMV on its
/// last row) and single-token decode steps (the GEMV), at two threads.
#[test]
fn repacked_weights_give_the_plain_weights_logits() {
    use corelm_kernels::Isa;
    let tokens: Vec<u32> = (0..45).map(|i| (i * 977 + 13) % 30000).collect();
    // The tables with interleaved kernels (the x86 SIMD ones).
    let tables = Isa::ALL.into_iter().filter_map(|i| corelm_kernels::dispatch::kernels_for(i).ok());
    for isa in tables.filter(|k| k.ops(GgmlType::Q4_1).is_some_and(|o| o.interleaved.is_some())).map(|k| k.isa()) {
        for (_, file, _) in MODELS {
            let run = |repack: bool| {
                let (mut e, _) = load(file, corelm_engine::EngineConfig { repack, isa: Some(isa), ..test_config(2) });
                let mut rows = logits_alone(&mut e, 0, &tokens);
                for (i, t) in [11u32, 4000, 17].into_iter().enumerate() {
                    let mut b = Batch::new();
                    b.add(t, (tokens.len() + i) as i32, 0, true);
                    rows.push(e.decode(&b).unwrap().row(0).to_vec());
                }
                (rows, e.packed())
            };
            let (plain, none) = run(false);
            let (packed, (count, bytes)) = run(true);
            assert_eq!(none, (0, 0));
            eprintln!("{isa}: {file}: {count} matrices repacked, {:.1} MB", bytes as f64 / 1e6);
            assert!(count > 0, "{isa}: {file}: nothing repacked by a table with interleaved kernels");
            for (r, (a, b)) in packed.iter().zip(&plain).enumerate() {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{isa}: {file}: row {r} differs");
            }
        }
    }
}

/// `--numa distribute` and `isolate` move workers and memory, never results: a prompt's logits
/// keep the bits of `off`; the placement is what the mode says on this machine; `--no-pin`
/// with a placing mode is refused by name.
#[test]
fn numa_modes_place_memory_and_keep_logits() {
    use corelm_engine::{NumaMode, Placement};
    use corelm_core::memory::Place;
    let tokens: Vec<u32> = (0..45).map(|i| (i * 977 + 13) % 49152).collect();
    let (mut off, _) = load(SMOL, test_config(2));
    let want = logits_alone(&mut off, 0, &tokens);
    drop(off);
    // `tp` here: one node, so one shard (its default degree), same bits.
    for numa in [NumaMode::Distribute, NumaMode::Isolate, NumaMode::Tp] {
        let (mut e, _) = load(SMOL, corelm_engine::EngineConfig { numa, pin: true, ..test_config(2) });
        let Placement { cpus, memory, nodes, .. } = e.placement().clone();
        assert!(!cpus.is_empty());
        match numa {
            NumaMode::Isolate => assert_eq!(memory, Place::Node(nodes[0])),
            _ if nodes.len() > 1 => assert_eq!(memory, Place::Interleave(nodes)),
            _ => assert_eq!(memory, Place::Any),
        }
        let got = logits_alone(&mut e, 0, &tokens);
        for (r, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "--numa {numa}, row {r}");
        }
    }
    let cfg = corelm_engine::EngineConfig { numa: NumaMode::Isolate, pin: false, ..test_config(2) };
    let e = corelm_engine::Engine::load(model_path(SMOL), cfg).err().expect("refused").to_string();
    assert!(e.contains("--numa isolate") && e.contains("--no-pin"), "{e}");
}

#[test]
fn batched_bench_fills_every_sequence_and_leaves_the_cache_empty() {
    let (mut engine, _) = load(SMOL, test_config(2));
    let r = corelm_engine::bench::run_batched(&mut engine, 9, 3, 4, 0).expect("4 sequences fit");
    assert_eq!((r.npl, r.n_kv), (4, 4 * 12));
    assert!(r.t_pp > 0.0 && r.t_tg > 0.0 && r.s_tg().is_finite());
    assert_eq!(engine.free_cells(), engine.config().n_ctx, "the test clears what it filled");
    // More sequences than the engine holds: the batch is refused, naming the sequence.
    let e = corelm_engine::bench::run_batched(&mut engine, 2, 1, 5, 0).unwrap_err();
    assert!(e.to_string().contains('4'), "{e}");
    // Several counts in rounds: one result per count, in the order asked, each its own shape.
    let rs = corelm_engine::bench::run_batched_counts(&mut engine, 5, 2, &[4, 1, 2], 1).expect("every count fits");
    assert_eq!(rs.iter().map(|r| (r.npl, r.n_kv)).collect::<Vec<_>>(), [(4, 28), (1, 7), (2, 14)]);
    assert!(rs.iter().all(|r| r.t_pp > 0.0 && r.t_tg > 0.0 && r.t_tg.is_finite()));
    assert_eq!(engine.free_cells(), engine.config().n_ctx);
}

/// A plan with a prefill configuration of `prefill` CPUs in one group and a decode
/// configuration of the first of them.
fn nested_plan(cpus: &[u32], prefill_min_tokens: usize) -> corelm_engine::plan::Plan {
    use corelm_topo::sandwich::ServiceConfig;
    let cfg = |g: Vec<u32>| ServiceConfig { numa: vec![Some(0)], groups: vec![g] };
    corelm_engine::plan::Plan {
        cpu: "test".into(),
        topology: "test".into(),
        model: SMOL.into(),
        source: "measured".into(),
        prompt: 16,
        gen: 16,
        ..corelm_engine::plan::Plan::with_configs(cfg(cpus.to_vec()), cfg(cpus[..1].to_vec()), prefill_min_tokens)
    }
}

#[test]
fn a_plan_runs_short_passes_on_its_decode_view_with_the_same_logits() {
    let allowed: Vec<u32> = corelm_core::threads::allowed_cpus().iter().map(|&c| c as u32).take(2).collect();
    let plan = nested_plan(&allowed, 4);
    plan.check().unwrap();
    let prompt: Vec<u32> = vec![1, 504, 3458, 314, 4649, 28, 253, 2914];
    let (mut plain, _) = load(SMOL, test_config(allowed.len()));
    let cfg = corelm_engine::EngineConfig { plan: Some(plan), pin: true, tp: 0, ..test_config(1) };
    let (mut planned, _) = load(SMOL, cfg);
    assert_eq!(planned.config().n_threads, allowed.len(), "the plan sets the workers");
    let mut outs = Vec::new();
    for e in [&mut plain, &mut planned] {
        let mut rows = Vec::new();
        e.feed(0, &prompt, false, |l| rows.push(l.row(0).to_vec())).unwrap();
        let prefill_view = e.last_view();
        let mut b = Batch::new();
        b.add(42, prompt.len() as i32, 0, true);
        rows.push(e.decode(&b).unwrap().row(0).to_vec());
        outs.push((rows, prefill_view, e.last_view()));
    }
    assert_eq!(outs[0].0, outs[1].0, "a view changes which cores compute, not the bits");
    assert_eq!((outs[1].1, outs[1].2), (0, if allowed.len() > 1 { 1 } else { 0 }), "8 tokens on every worker, 1 on the decode view");
    // Plans that cannot be used are refused by name.
    let mut bad = nested_plan(&allowed, 4);
    bad.decode.groups = vec![vec![9999]];
    assert!(bad.check().unwrap_err().to_string().contains("inside the prefill group"));
    let far = nested_plan(&[9999], 1);
    let e = Engine::load(model_path(SMOL), corelm_engine::EngineConfig { plan: Some(far), pin: true, ..test_config(1) }).err().expect("refused");
    assert!(e.to_string().contains("CPU 9999"), "{e}");
    let no_pin = corelm_engine::EngineConfig { plan: Some(nested_plan(&allowed, 4)), pin: false, ..test_config(1) };
    let e = Engine::load(model_path(SMOL), no_pin).err().expect("refused");
    assert!(e.to_string().contains("--no-pin"), "{e}");
}

/// A plan's tuned matmul schedules (unusual ones: 4-row tiles, narrow and wide column
/// blocks, row blocks, a one-part grid) change no logit bit, on the default tiles and on the
/// panel GEMM, at every tuned length; schedules tuned for another kernel table are not used.
#[test]
fn tuned_gemm_schedules_keep_the_logits() {
    use corelm_engine::plan::GemmPlan;
    let allowed: Vec<u32> = corelm_core::threads::allowed_cpus().iter().map(|&c| c as u32).take(2).collect();
    let prompt: Vec<u32> = (0..40).map(|i| 1 + (i * 397) % 4000).collect();
    for fast_prefill in [false, true] {
        // The panel GEMM's schedules on matrices without tiles (`--no-repack`), where x86 runs it.
        let base = corelm_engine::EngineConfig { plan: Some(nested_plan(&allowed, 1)), pin: true, tp: 0, fast_prefill, repack: !fast_prefill, ..test_config(1) };
        let (mut plain, _) = load(SMOL, base.clone());
        let mut plan = nested_plan(&allowed, 1);
        plan.gemm_isa = plain.kernels().isa().name().into();
        plan.gemm_threads = allowed.len();
        let shapes = plain.gemm_shapes();
        assert!(shapes.len() >= 4, "{} shapes", shapes.len());
        for (i, s) in shapes.iter().enumerate() {
            for (rows, mr, nc, mc, kc, row_parts) in [(8, 4, 12, 8, 1, 1), (16, 8, 256, 16, 3, 0), (32, 6, 40, 0, 0, 2)] {
                let t = corelm_plan::gemm_search::Tuned { rows, sched: corelm_kernels::matmul::schedule::Schedule { mr, nc: nc + 4 * i, mc, kc, row_parts }, secs: 1.0, default_secs: 1.0, measured: 1, reused: false };
                plan.gemm.push(GemmPlan::from_tuned(s.path, s.dtype, s.k, s.n_out, &t));
            }
        }
        let mut other = plan.clone();
        other.gemm_isa = "portable-elsewhere".into();
        assert!(other.schedules(&plan.gemm_isa).is_none() && plan.schedules(&plan.gemm_isa).is_some());
        let (mut tuned, _) = load(SMOL, corelm_engine::EngineConfig { plan: Some(plan), ..base });
        let a = logits_alone(&mut plain, 0, &prompt);
        let b = logits_alone(&mut tuned, 0, &prompt);
        assert!(a.iter().zip(&b).all(|(x, y)| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())), "fast_prefill {fast_prefill}");
    }
}

#[test]
fn the_plan_rule_picks_the_faster_pair_and_where_they_cross() {
    use corelm_engine::plan::{Candidate, Plan};
    use corelm_topo::sandwich::ServiceConfig;
    let cfg = |g: Vec<u32>| ServiceConfig { numa: vec![Some(0)], groups: vec![g] };
    // Four cores: fast prefill, slower decode (contention); two cores: slow prefill, fast decode.
    let four = Candidate { config: cfg(vec![0, 1, 2, 3]), prefill_s: 0.100, decode_s: 0.012, rounds: 0 };
    let two = Candidate { config: cfg(vec![0, 1]), prefill_s: 0.190, decode_s: 0.010, rounds: 0 };
    let other = Candidate { config: cfg(vec![2, 3]), prefill_s: 0.190, decode_s: 0.009, rounds: 0 };
    let (i, j, min) = Plan::choose(&[four.clone(), two.clone(), other], 128, 128).unwrap();
    // Cores 2-3 decode fastest but are not inside... they are: any subset of the prefill group.
    assert_eq!((i, j), (0, 2));
    // Lines 12 ms → 100 ms and 9 ms → 190 ms over 1..128 tokens cross near n = 5.
    assert!((2..=8).contains(&min), "{min}");
    // Decode on two cores only pays when they are nested in the prefill group.
    let apart = Candidate { config: cfg(vec![4, 5]), prefill_s: 0.3, decode_s: 0.011, rounds: 0 };
    let (i, j, min) = Plan::choose(&[four, apart], 128, 128).unwrap();
    assert_eq!((i, j, min), (0, 0, 1), "no nested decode configuration: one for both");
    assert!(Plan::choose(&[], 128, 128).is_none());
    let _ = two;
}

#[test]
fn a_confirmed_plan_keeps_the_default_unless_its_gain_held() {
    use corelm_engine::plan::{Candidate, Plan};
    use corelm_topo::sandwich::ServiceConfig;
    let cfg = |g: Vec<Vec<u32>>| ServiceConfig { numa: vec![Some(0); g.len()], groups: g };
    let c = |g, p, d| Candidate { config: cfg(g), prefill_s: p, decode_s: d, rounds: 0 };
    // 0: one group of both cores (the default); 1: two groups, a little faster per request;
    // 2: one core, slow prefill but the fastest decode in this (noisy) search.
    let cands = [c(vec![vec![0, 1]], 0.070, 0.0024), c(vec![vec![0], vec![1]], 0.072, 0.0022), c(vec![vec![0]], 0.130, 0.0020)];
    assert_eq!(Plan::choose(&cands, 128, 128).map(|(i, j, _)| (i, j)), Some((0, 2)), "decode nested in the default's group");
    // The shortest request (two groups), then the fastest prefill (the default), the fastest
    // decode and the pair chosen (the single core), each once.
    assert_eq!(Plan::finalists(&cands, 128, 128, 1, Some(0)), vec![1, 0, 2]);
    assert_eq!(Plan::finalists(&cands[..2], 128, 128, 0, None), vec![0, 1]);
    // Confirmed times: the single core's decode was noise; two groups now shortest on the medians.
    let cands = [c(vec![vec![0, 1]], 0.070, 0.0024), c(vec![vec![0], vec![1]], 0.072, 0.0022), c(vec![vec![0]], 0.130, 0.0026)];
    let finalists = [0, 2, 1];
    // Per round (prefill, decode) of finalists 0, 2, 1: two groups win 3 of 5 rounds, then 5 of 5.
    let round = |d0: f64, d1: f64| vec![(0.070, d0), (0.130, 0.0026), (0.072, d1)];
    let mixed: Vec<_> = [(0.0024, 0.0022), (0.0022, 0.0024), (0.0024, 0.0021), (0.0023, 0.0025), (0.0025, 0.0022)].iter().map(|&(a, b)| round(a, b)).collect();
    assert_eq!(Plan::choose_confirmed(&cands, &finalists, &mixed, 128, 128, Some(0), 4), Some((0, 0, 1, Some(3))));
    let held: Vec<_> = (0..5).map(|_| round(0.0024, 0.0022)).collect();
    assert_eq!(Plan::choose_confirmed(&cands, &finalists, &held, 128, 128, Some(0), 4), Some((1, 1, 1, Some(5))));
    // Without a default among the finalists, or nothing confirmed: the plain choice.
    assert_eq!(Plan::choose_confirmed(&cands, &finalists, &mixed, 128, 128, None, 4), Some((1, 1, 1, None)));
    assert_eq!(Plan::choose_confirmed(&cands, &[], &[], 128, 128, Some(0), 4), Some((1, 1, 1, None)));
}

/// A roofline whose bandwidth saturates at one thread: memory-bound nodes run on one worker of
/// two, compute-bound ones (prefill's matmuls) on both, attention on both — the same logits.
#[test]
fn roofline_thread_caps_keep_the_logits() {
    use corelm_plan::profile::{Ceiling, Memory, Roofline, Target, TargetKind};
    let roof = Roofline {
        machine: "test".into(),
        source: "stated: test".into(),
        targets: vec![Target {
            name: "cpu".into(),
            kind: TargetKind::Vector,
            workers: 2,
            ceilings: ["int8_dot", "f32_fma"]
                .map(|f| Ceiling { family: f.into(), kernel: "test".into(), one_worker_gflops: 1000.0, all_workers_gflops: 2000.0 })
                .to_vec(),
            tile: None,
            link: None,
        }],
        combined: Vec::new(),
        memory: Memory { read_gbps: vec![(1, 40.0), (2, 41.0)], per_target_gbps: vec![("cpu".into(), 41.0)], all_busy_gbps: 41.0 },
    };
    assert_eq!(roof.bandwidth_knee(0.9), Some(1));
    let prompt: Vec<u32> = (0..40).map(|i| 100 + 37 * i).collect();
    let (mut plain, _) = load(SMOL, test_config(2));
    let (mut capped, _) = load(SMOL, corelm_engine::EngineConfig { roofline: Some(roof), ..test_config(2) });
    let mut outs = Vec::new();
    for e in [&mut plain, &mut capped] {
        let mut rows = Vec::new();
        e.feed(0, &prompt, true, |l| (0..l.rows()).for_each(|r| rows.push(l.row(r).to_vec()))).unwrap();
        let mut b = Batch::new();
        b.add(7, prompt.len() as i32, 0, true);
        rows.push(e.decode(&b).unwrap().row(0).to_vec());
        outs.push(rows);
    }
    assert_eq!(outs[0], outs[1]);
    // Decode: every matmul and element-wise node is memory-bound, attention is not capped.
    let n_decode = capped.capped_nodes(1, 1);
    let n_prefill = capped.capped_nodes(40, 40);
    // Decode's 211 matmuls are memory-bound (3 FLOP/byte, ridge 49), prefill's are not.
    assert!(n_decode >= n_prefill + 211, "decode {n_decode}, prefill {n_prefill}");
    assert_eq!(plain.capped_nodes(1, 1), 0);
}

/// A size of zero in the configuration is refused before anything runs, naming the flag.
#[test]
fn a_zero_size_is_refused_naming_its_flag() {
    let base = test_config(2);
    let cases = [
        (EngineConfig { n_ctx: 0, ..base.clone() }, "--ctx-size"),
        (EngineConfig { n_batch: 0, ..base.clone() }, "--batch-size"),
        (EngineConfig { n_seq_max: 0, ..base.clone() }, "--parallel"),
        (EngineConfig { n_threads: 0, ..base.clone() }, "--threads"),
    ];
    for (cfg, flag) in cases {
        let e = Engine::load(model_path(SMOL), cfg).err().expect("a zero size is refused").to_string();
        assert!(e.contains(flag) && e.contains("must be > 0"), "{e}");
    }
}

/// Every attention node's output of a pass, in order.
#[derive(Default)]
struct AttnOutputs(std::sync::Mutex<Vec<Vec<f32>>>);

impl corelm_core::Tap for AttnOutputs {
    fn node<'a>(&self, graph: &corelm_core::Graph, id: corelm_core::TensorId, read: &dyn Fn(corelm_core::TensorId) -> &'a [f32]) {
        if matches!(graph.tensor(id).op, corelm_core::Op::Attention { .. }) {
            self.0.lock().unwrap().push(read(id).to_vec());
        }
    }
}

/// A decode step's attention units — per row, KV head, range of ggml's split-KV decode (512+
/// cells) and query head — dealt to the workers by their cells give every attention output the
/// bits of the row alone, and so do the logits: a row alone (its ranges dealt), two long rows,
/// a long and a short one (the short one's heads riding with the long one's ranges), five long
/// rows, two long and sixteen short ones (eighteen rows, two split), and seventeen long ones,
/// more split rows than a decode node deals, where each row's ranges run one after another on
/// one worker (the reference). SmolLM2 600 cells in at 2 and 3 workers (its 3 KV
/// heads cut into 2 and 3 ranges); Gemma 3 1,400 cells in at 2 workers (one KV head: its
/// global layers' 2 ranges; its sliding-window layers see only the second range, whose 4 heads
/// are cut between workers).
#[test]
fn split_kv_decode_across_workers_equals_one_worker_per_row() {
    for (file, threads, cells, layers, long) in [(SMOL, 2, 600, 30, 23), (SMOL, 3, 600, 30, 9), ("gemma-3-270m-q4_k_m.gguf", 2, 1400, 18, 4)] {
        let n_short = if long > 20 { 18 } else { 2 };
        let cfg = EngineConfig { batch_invariant: true, n_ctx: long * (cells + 32) + n_short * 96 + 300, n_batch: 512, n_seq_max: long + n_short, ..test_config(threads) };
        let (mut engine, tok) = load(file, cfg);
        let text = "The river ran past the mill, and the miller counted the sacks of grain twice. ".repeat(cells / 10);
        let prompt = tok.encode(&text, true, true).unwrap();
        // Sequences 0 .. long hold `cells` tokens, the `n_short` after them 80; each decodes
        // once.
        let (prompt, short) = (&prompt[..cells], long as i32);
        for seq in 0..(long + n_short) as i32 {
            engine.feed(seq, if seq < short { prompt } else { &prompt[..80] }, false, |_| {}).unwrap();
        }
        let next = 42u32;
        let pos = |s: i32| if s >= short { 80 } else { cells as i32 };
        let mut step = |seqs: &[i32]| {
            let tap = std::sync::Arc::new(AttnOutputs::default());
            engine.set_tap(Some(tap.clone()));
            let mut b = Batch::new();
            for &s in seqs {
                b.add(next, pos(s), s, true);
            }
            let l = engine.decode(&b).unwrap();
            let logits: Vec<Vec<f32>> = (0..seqs.len()).map(|r| l.row(r).to_vec()).collect();
            engine.set_tap(None);
            let outs = std::mem::take(&mut *tap.0.lock().unwrap());
            assert_eq!(outs.len(), layers, "{file}: one attention node per layer");
            (logits, outs)
        };
        let alone = [step(&[0]), step(&[short])];
        let same = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        let mut batches = vec![vec![1, 2], vec![3, short + 1]];
        if long > 20 {
            batches.push([21, 22].into_iter().chain(short + 2..short + 18).collect());
            batches.push((4..21).collect());
        } else if long > 8 {
            batches.push(vec![4, 5, 6, 7, 8]);
        }
        for seqs in batches {
            let (logits, attn) = step(&seqs);
            for (r, &s) in seqs.iter().enumerate() {
                let (ref_logits, ref_attn) = &alone[usize::from(s >= short)];
                for (layer, (a, t)) in ref_attn.iter().zip(&attn).enumerate() {
                    assert!(same(a, &t[r * a.len()..(r + 1) * a.len()]), "{file}, {threads} workers, layer {layer}: row {r} of {seqs:?} differs from the row alone");
                }
                assert!(same(&logits[r], &ref_logits[0]), "{file}, {threads} workers: the logits of row {r} of {seqs:?} differ from the row alone");
            }
        }
    }
}
