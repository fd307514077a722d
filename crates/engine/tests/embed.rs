//! Embeddings on a real model: the hidden rows are exactly what the LM head reads, pooled
//! vectors do not depend on the pass size, and the batcher's embedding passes — many inputs
//! packed into one pass, alternating with generation — give each input's vector alone.

mod common;

use common::*;
use corelm_engine::batcher::{Batcher, EmbedRequest, EmbedSink, Event, Request};
use corelm_engine::embed::{cosine, normalize, Pooling};
use corelm_engine::sample::SamplingParams;
use corelm_engine::{Batch, EngineConfig};
use corelm_kernels::DType;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn invariant(n_batch: usize) -> EngineConfig {
    EngineConfig { n_batch, batch_invariant: true, ..test_config(2) }
}

#[test]
fn hidden_rows_are_what_the_lm_head_reads() {
    let (mut engine, tok) = load(SMOL, invariant(128));
    let ids = tok.encode("The capital of France is", false, true).unwrap();
    let mut b = Batch::new();
    for (i, &t) in ids.iter().enumerate() {
        b.add(t, i as i32, 0, i + 1 == ids.len());
    }
    let logits = engine.decode(&b).unwrap().row(0).to_vec();
    b.clear();
    for (i, &t) in ids.iter().enumerate() {
        b.add(t, i as i32, 1, i + 1 == ids.len());
    }
    let n_embd = engine.hyper().n_embd;
    let hidden = engine.decode_hidden(&b).unwrap();
    assert_eq!((hidden.rows(), hidden.width), (1, n_embd));
    let h = hidden.row(0).to_vec();
    // The LM head (SmolLM2's tied Q8_0 embedding) applied to the row by the kernel table.
    let g = engine.gguf().clone();
    let w = g.tensor("token_embd.weight").unwrap();
    let ops = engine.kernels().ops(DType::Q8_0).unwrap();
    let row_bytes = corelm_kernels::row_bytes(DType::Q8_0, h.len());
    let mut q = vec![0u8; corelm_kernels::row_bytes(ops.vec_dot_type, h.len())];
    (ops.from_float.unwrap())(&h, &mut q);
    let data = g.tensor_data(w);
    let mut worst = 0f32;
    for (v, &l) in logits.iter().enumerate() {
        let dot = (ops.vec_dot)(&data[v * row_bytes..(v + 1) * row_bytes], &q);
        worst = worst.max((dot - l).abs());
    }
    assert!(worst <= 1e-4, "logits from the hidden row differ from the engine's by {worst}");
    assert_eq!(tok.decode(&[corelm_engine::sample::argmax(&logits)]), " Paris");
}

#[test]
fn pooled_vectors_do_not_depend_on_the_pass_size() {
    let text = "Embeddings pool the hidden states of every token of a text into one vector, here over several passes.";
    let mut vectors = vec![];
    for n_batch in [128, 7] {
        let (mut engine, tok) = load(SMOL, invariant(n_batch));
        let ids = tok.encode(text, true, true).unwrap();
        assert!(ids.len() > 2 * 7);
        let v: Vec<Vec<f32>> = [Pooling::Mean, Pooling::Cls, Pooling::Last].iter().map(|&p| engine.embed(0, &ids, p).unwrap()).collect();
        assert_eq!(engine.seq_len(0), 0, "the sequence is left empty");
        // Last pooling reuses the blocks the earlier passes cached, and gives the same vector.
        assert_eq!(engine.embed(0, &ids, Pooling::Last).unwrap(), v[2]);
        vectors.push(v);
    }
    assert!(vectors[0] == vectors[1], "vectors depend on n_batch");
    let [mean, cls, last] = &vectors[0][..] else { unreachable!() };
    assert!(mean != cls && mean != last && cls != last);
    // Attention is causal: the first row is the first token's alone.
    let (mut engine, tok) = load(SMOL, invariant(128));
    let first = tok.encode(text, true, true).unwrap()[..1].to_vec();
    assert!(engine.embed(0, &first, Pooling::Mean).unwrap() == *cls, "CLS is not the first token's row");
    let mut unit = mean.clone();
    normalize(&mut unit);
    let len: f32 = unit.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((len - 1.0).abs() < 1e-5, "{len}");
    assert!((cosine(mean, &unit) - 1.0).abs() < 1e-6);
}

type Answer = Arc<Mutex<Option<Result<Vec<Vec<f32>>, String>>>>;

struct TestSink(Answer);

impl EmbedSink for TestSink {
    fn waiting(&self) -> bool {
        true
    }
    fn answer(self: Box<Self>, result: Result<Vec<Vec<f32>>, String>) {
        *self.0.lock().unwrap() = Some(result);
    }
}

fn embed_request(inputs: Vec<Vec<u32>>, pooling: Pooling) -> (EmbedRequest, Answer) {
    let a: Answer = Arc::default();
    let req = EmbedRequest { inputs, pooling, normalize: false, sink: Box::new(TestSink(a.clone())), arrived: Instant::now() };
    (req, a)
}

#[test]
fn batched_embedding_passes_equal_each_input_alone() {
    let (mut engine, tok) = load(SMOL, invariant(32));
    let texts = [
        "A short one.",
        "The cat sat on the mat while the dog slept by the fire, and nobody moved for an hour or more.",
        "Stock markets fell sharply on Tuesday.",
        "Interest rates rose.",
        "Bread needs flour, water, salt and time.",
        "The moon was full.",
    ];
    let inputs: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t, true, true).unwrap()).collect();
    let alone: Vec<Vec<f32>> = inputs.iter().map(|i| engine.embed(0, i, Pooling::Mean).unwrap()).collect();
    let last_alone: Vec<Vec<f32>> = inputs.iter().map(|i| engine.embed(0, i, Pooling::Last).unwrap()).collect();
    let cls_alone: Vec<Vec<f32>> = inputs.iter().map(|i| engine.embed(0, i, Pooling::Cls).unwrap()).collect();
    engine.clear_all();
    let tok = Arc::new(tok);
    let mut b = Batcher::new(engine, tok.clone());
    // A generation request first, then two embedding requests: six inputs over four sequences
    // (one generating), packed several to a 32-token pass, alternating with decode steps.
    let gen = || {
        let (tx, rx) = mpsc::channel();
        let req = Request {
            prompt: tok.encode("Write about the sea:", true, true).unwrap(),
            max_tokens: 12,
            sampling: SamplingParams::greedy(),
            stop: vec![],
            ignore_eos: true,
            logprobs: None,
            chain_probs: false,
            lora: None,
            prompt_logprobs: None,
            constraint: None,
            context_shift: None,
            sink: Box::new(move |e: Event| tx.send(e).is_ok()),
            arrived: Instant::now(),
        };
        (req, rx)
    };
    let tokens = |rx: mpsc::Receiver<Event>| -> Vec<u32> { rx.try_iter().filter_map(|e| if let Event::Token { id, .. } = e { Some(id) } else { None }).collect() };
    let (req, rx) = gen();
    b.submit(req).map_err(|e| e.1).unwrap();
    while !b.is_idle() {
        b.step();
    }
    let gen_alone = tokens(rx);
    assert_eq!(gen_alone.len(), 12);
    let (req, gen_rx) = gen();
    b.submit(req).map_err(|e| e.1).unwrap();
    let (mean_req, mean) = embed_request(inputs.clone(), Pooling::Mean);
    let (last_req, last) = embed_request(inputs.clone(), Pooling::Last);
    b.submit_embed(mean_req).map_err(|e| e.1).unwrap();
    b.submit_embed(last_req).map_err(|e| e.1).unwrap();
    let (cls_req, cls) = embed_request(inputs.clone(), Pooling::Cls);
    b.submit_embed(cls_req).map_err(|e| e.1).unwrap();
    let (empty, _) = embed_request(vec![vec![]], Pooling::Mean);
    assert!(b.submit_embed(empty).map_err(|e| e.1).unwrap_err().contains("input 0 has no tokens"));
    drain_within(&mut b, 1000);
    assert!(mean.lock().unwrap().take().unwrap().unwrap() == alone, "mean vectors differ from each input's alone");
    assert!(last.lock().unwrap().take().unwrap().unwrap() == last_alone, "last-token vectors differ from each input's alone");
    assert!(cls.lock().unwrap().take().unwrap().unwrap() == cls_alone, "first-token vectors differ from each input's alone");
    assert_eq!(tokens(gen_rx), gen_alone, "generation changed beside embedding passes");
    assert_eq!(b.engine().blocks().used(), 0, "every sequence released its blocks");
}

#[test]
fn add_eos_token_appends_eos_to_special_tokenization() {
    // SmolLM2's vocabulary, its metadata copied with `add_eos_token` set (as embedding models
    // with last-token pooling state it).
    let g = corelm_gguf::Gguf::open(model_path(SMOL)).unwrap();
    let with_eos = tokenizer_edited(&g, &[("tokenizer.ggml.add_eos_token", Some(corelm_gguf::Value::Bool(true)))]);
    let plain = corelm_engine::Tokenizer::from_gguf(&g).unwrap();
    let text = "The cat sat.";
    let ids = plain.encode(text, true, true).unwrap();
    assert!(!plain.add_eos && ids.last() != plain.eos.as_ref());
    let mut expected = ids.clone();
    expected.push(plain.eos.unwrap());
    assert_eq!(with_eos.encode(text, true, true).unwrap(), expected);
    assert_eq!(with_eos.encode(text, false, true).unwrap(), ids, "EOS only with the special tokens");
}
