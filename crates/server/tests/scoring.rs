//! Prompts scored over HTTP as lm-evaluation-harness's `local-completions` model scores them:
//! token lists sent with `echo: true, logprobs: 1, max_tokens: 1`, `token_logprobs[ctxlen:-1]`
//! summed, greedy where each equals its position's best; its remote tokenizer's calls
//! (`/tokenizer_info`, vLLM's `/tokenize` and `/detokenize`); `echo`'s text and stream.

mod common;

use common::*;
use serde_json::{json, Value};

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap_or_else(|| panic!("not a list: {v}")).iter().map(|t| t.as_u64().unwrap()).collect()
}

/// lm-evaluation-harness's reading of one choice: the continuation's log-likelihood and
/// whether it is the greedy one.
fn loglikelihood(choice: &Value, ctxlen: usize) -> (f64, bool) {
    let lps = choice["logprobs"]["token_logprobs"].as_array().unwrap();
    let tops = choice["logprobs"]["top_logprobs"].as_array().unwrap();
    let (lps, tops) = (&lps[ctxlen..lps.len() - 1], &tops[ctxlen..tops.len() - 1]);
    let sum = lps.iter().map(|l| l.as_f64().unwrap()).sum();
    let best = |top: &Value| top.as_object().unwrap().values().map(|v| v.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
    (sum, lps.iter().zip(tops).all(|(l, t)| l.as_f64().unwrap() == best(t)))
}

#[test]
fn prompts_are_scored_as_lm_evaluation_harness_reads_them() {
    let srv = start(2, 64, None);
    // The remote tokenizer: the special tokens, vLLM's field names, text back.
    let info = get(&srv, "/tokenizer_info").json();
    let eos = info["eos_token"].as_str().unwrap_or_else(|| panic!("{info}"));
    assert!(info["chat_template"].is_string() && info["model_max_length"] == 1024, "{info}");
    let tok = |t: &str| ids(&post(&srv, "/tokenize", json!({"prompt": t, "add_special_tokens": false})).json()["tokens"]);
    assert_eq!(tok(eos).len(), 1, "the end token's text is one token");
    let question = "Question: What is the capital of France?\nAnswer:";
    let ctx = tok(question);
    assert_eq!(post(&srv, "/detokenize", json!({"tokens": ctx})).json()["prompt"], question);

    let score = |prompt: Value| {
        let r = post(&srv, "/v1/completions", json!({"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": true}));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    // The greedy continuation, then it and another one scored in one request.
    let greedy = post(&srv, "/v1/completions", json!({"prompt": ctx, "max_tokens": 3, "temperature": 0})).json()["choices"][0]["text"].as_str().unwrap().to_string();
    let (cont, other) = (tok(&greedy), tok(" London"));
    let joined = |c: &[u64]| [ctx.as_slice(), c].concat();
    let v = score(json!([joined(&cont), joined(&other)]));
    let (a, b) = (&v["choices"][0], &v["choices"][1]);
    assert_eq!((a["index"].as_u64(), b["index"].as_u64()), (Some(0), Some(1)));
    let lps = a["logprobs"]["token_logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), ctx.len() + cont.len() + 1, "every prompt token and the one generated");
    assert!(lps[0].is_null() && a["logprobs"]["top_logprobs"][0].is_null(), "the first token has no log-probability");
    assert!(lps[1..].iter().all(|l| l.as_f64().is_some_and(|l| l <= 0.0)), "{lps:?}");
    assert_eq!(a["logprobs"]["tokens"].as_array().unwrap().len(), lps.len());
    let text = a["text"].as_str().unwrap();
    assert!(text.starts_with(&format!("{question}{greedy}")), "the echo opens the text: {text:?}");
    let (ll_greedy, is_greedy) = loglikelihood(a, ctx.len());
    let (ll_other, other_greedy) = loglikelihood(b, ctx.len());
    assert!(is_greedy && !other_greedy, "{greedy:?} is the greedy answer, \" London\" is not");
    assert!(ll_greedy <= 0.0 && ll_other < ll_greedy, "{greedy:?}: {ll_greedy}, \" London\": {ll_other}");
    // Causal: the context's scores do not depend on what follows, nor on the batch.
    let alone = score(json!(ctx));
    let ctx_lps = &alone["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap()[..ctx.len()];
    assert_eq!(ctx_lps, &lps[..ctx.len()]);
    assert_eq!(ctx_lps, &b["logprobs"]["token_logprobs"].as_array().unwrap()[..ctx.len()]);
    // The generated token's log-probability is its score as a prompt token.
    assert_eq!(alone["choices"][0]["logprobs"]["token_logprobs"][ctx.len()], lps[ctx.len()]);

    // `max_tokens: 0`: the prompt only, as text; a stream sends it (and its scores) first.
    let body = |stream: bool| json!({"prompt": "The capital of France is", "max_tokens": 0, "logprobs": 2, "echo": true, "stream": stream});
    let v = post(&srv, "/v1/completions", body(false)).json();
    let c = &v["choices"][0];
    assert_eq!((c["text"].as_str(), c["finish_reason"].as_str()), (Some("The capital of France is"), Some("length")), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let n = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(c["logprobs"]["token_logprobs"].as_array().unwrap().len(), n);
    assert!(c["logprobs"]["top_logprobs"][n - 1].as_object().is_some_and(|t| t.len() == 2));
    let ev = post(&srv, "/v1/completions", body(true)).events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let first: Value = serde_json::from_str(&ev[0]).unwrap();
    assert_eq!(first["choices"][0]["text"], c["text"]);
    assert_eq!(first["choices"][0]["logprobs"], c["logprobs"]);
    // With an answer: the stream's text and scores, joined, are the whole answer's.
    let body = json!({"prompt": question, "max_tokens": 4, "temperature": 0, "logprobs": 1, "echo": true});
    let whole = post(&srv, "/v1/completions", body.clone()).json();
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let ev = post(&srv, "/v1/completions", streamed).events();
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    let lps: Vec<Value> = chunks.iter().filter_map(|c| c["choices"][0]["logprobs"]["token_logprobs"].as_array()).flatten().cloned().collect();
    assert_eq!(&lps, whole["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap());
    // `text_offset` counts characters (a client cuts the prompt by its Python length).
    let v = post(&srv, "/v1/completions", json!({"prompt": "Un café, s'il vous plaît :", "max_tokens": 3, "temperature": 0, "logprobs": 0, "echo": true})).json();
    let lp = &v["choices"][0]["logprobs"];
    let mut at = 0;
    for (t, o) in lp["tokens"].as_array().unwrap().iter().zip(lp["text_offset"].as_array().unwrap()) {
        assert_eq!(o.as_u64(), Some(at), "{lp}");
        at += t.as_str().unwrap().chars().count() as u64;
    }
    assert_eq!(at as usize, v["choices"][0]["text"].as_str().unwrap().chars().count());

    // Refused by name.
    let r = post(&srv, "/v1/completions", json!({"prompt": "def f(", "suffix": "\n", "echo": true}));
    assert!(r.status == 400 && r.json()["error"]["param"] == "echo", "{}", r.body);
    let r = post(&srv, "/v1/completions", json!({"prompt": "Hi", "max_tokens": 0}));
    assert!(r.status == 400 && r.json()["error"]["param"] == "max_tokens", "{}", r.body);
}

/// The scores' best tokens are llama.cpp's: at every position of a golden case where its top
/// logit leads by more than the golden tolerance, the echoed prompt's best alternative there
/// is that token (the logits each position predicts the next token from, as llama.cpp's
/// `prompt_top10`).
#[test]
fn echoed_best_tokens_are_llama_cpp_s() {
    let srv = start(1, 8, None);
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden").join(MODEL);
    for case in ["p02_sentence.json", "p04_long_prose.json"] {
        let raw: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(case)).unwrap()).unwrap();
        let prompt = ids(&raw["prompt_token_ids"]);
        let v = post(&srv, "/v1/completions", json!({"prompt": prompt, "max_tokens": 0, "logprobs": 1, "echo": true})).json();
        let tops = v["choices"][0]["logprobs"]["top_logprobs"].as_array().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(tops.len(), prompt.len());
        let mut checked = 0;
        for (i, gold) in raw["prompt_top10"].as_array().unwrap().iter().enumerate().take(prompt.len() - 1) {
            let (l0, l1) = (gold[0][1].as_f64().unwrap(), gold[1][1].as_f64().unwrap());
            if l0 - l1 <= 1.0 {
                continue;
            }
            let piece = post(&srv, "/detokenize", json!({"tokens": [gold[0][0]]})).json()["content"].as_str().unwrap().to_string();
            let ours = tops[i + 1].as_object().unwrap();
            assert!(ours.contains_key(&piece), "{case} position {i}: llama.cpp's best {piece:?}, ours {ours:?}");
            checked += 1;
        }
        assert!(checked * 3 >= prompt.len(), "{case}: {checked} of {} positions had a clear best", prompt.len());
    }
}
