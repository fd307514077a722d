//! llama-server's samplers beyond OpenAI's (DRY, XTC, typical, top-nσ, dynamic temperature,
//! Mirostat, `repeat_last_n`) through the server: what they change, and their refusals.

mod common;

use common::*;
use serde_json::{json, Value};

/// `body` with `extra`'s fields added (replacing its own of the same names).
fn with(mut body: Value, extra: &Value) -> Value {
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn text(v: &Value) -> String {
    v["choices"][0]["text"].as_str().map(str::to_string).or_else(|| v["content"].as_str().map(str::to_string)).unwrap_or_else(|| panic!("{v}"))
}

#[test]
fn dry_breaks_a_greedy_loop_and_the_other_samplers_answer() {
    let srv = start(2, 16, None);
    let prompt = "Write the line \"the cat sat on the mat\" five times:\n";
    let ask = |extra: Value| {
        let body = with(json!({"prompt": prompt, "max_tokens": 48, "temperature": 0}), &extra);
        let r = post(&srv, "/v1/completions", body);
        assert_eq!(r.status, 200, "{}", r.body);
        text(&r.json())
    };
    let plain = ask(json!({}));
    let dry = ask(json!({"dry_multiplier": 1.0}));
    let count = |t: &str| t.matches("the cat sat on the mat").count();
    assert!(count(&plain) >= 3, "greedy repeats the line: {plain:?}");
    assert!(count(&dry) < count(&plain), "DRY repeats it less: {dry:?} against {plain:?}");
    // Breakers that the text does not contain let the repeat reach across lines: no less DRY.
    let far = ask(json!({"dry_multiplier": 1.0, "dry_sequence_breakers": ["@@"]}));
    assert!(count(&far) <= count(&dry), "{far:?}");

    // Each sampler answers, the same seed the same text (native endpoint too).
    for extra in [
        json!({"typical_p": 0.8}),
        json!({"top_n_sigma": 1.0}),
        json!({"xtc_probability": 0.5, "xtc_threshold": 0.1}),
        json!({"dynatemp_range": 0.5, "dynatemp_exponent": 2.0}),
        json!({"mirostat": 1, "mirostat_tau": 4.0}),
        json!({"mirostat": 2, "mirostat_eta": 0.2}),
        json!({"dry_multiplier": 0.8, "dry_penalty_last_n": -1, "repeat_last_n": -1, "repeat_penalty": 1.1}),
    ] {
        let body = with(json!({"prompt": "Once upon a time", "n_predict": 24, "temperature": 0.9, "seed": 11}), &extra);
        let a = post(&srv, "/completion", body.clone());
        let b = post(&srv, "/completion", body);
        assert_eq!((a.status, b.status), (200, 200), "{extra}: {}", a.body);
        assert_eq!(text(&a.json()), text(&b.json()), "{extra}: the same seed");
    }
}

#[test]
fn bad_sampler_fields_name_themselves() {
    let srv = start(1, 16, None);
    for (field, value) in [
        ("mirostat", json!(3)),
        ("xtc_probability", json!(1.5)),
        ("xtc_threshold", json!(-0.1)),
        ("dynatemp_range", json!(-1)),
        ("repeat_last_n", json!(-2)),
        ("dry_penalty_last_n", json!(-5)),
        ("dry_allowed_length", json!(-1)),
        ("dry_sequence_breakers", json!([])),
        ("dry_multiplier", json!(-1)),
    ] {
        let mut body = json!({"prompt": "Hi", "max_tokens": 4});
        body[field] = value.clone();
        let r = post(&srv, "/v1/completions", body);
        assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some(field)), "{field} = {value}: {}", r.body);
    }
}

/// llama-server's `n_probs` on `/completion`: `completion_probabilities`, whole and streamed.
#[test]
fn completion_probabilities_on_the_native_endpoint() {
    let srv = start(1, 16, None);
    let body = json!({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "n_probs": 3});
    let r = post(&srv, "/completion", body.clone());
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let probs = v["completion_probabilities"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(probs.len() as u64, v["tokens_predicted"].as_u64().unwrap());
    let mut text = String::new();
    for p in probs {
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{p}");
        // Greedy: the token is the best of the model's own distribution.
        assert_eq!(p["id"], top[0]["id"], "{p}");
        assert!((p["logprob"].as_f64().unwrap() - top[0]["logprob"].as_f64().unwrap()).abs() < 1e-6, "{p}");
        assert!(top.windows(2).all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()), "{p}");
        assert!(top.iter().all(|t| t["logprob"].as_f64().unwrap() <= 0.0), "{p}");
        let bytes: Vec<u8> = p["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
        assert_eq!(String::from_utf8_lossy(&bytes), p["token"].as_str().unwrap());
        text.push_str(p["token"].as_str().unwrap());
    }
    assert_eq!(text, v["content"].as_str().unwrap(), "the tokens spell the answer");

    // Streamed: one entry per chunk, the same tokens.
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let r = post(&srv, "/completion", stream);
    let chunks: Vec<Value> = r.events().iter().filter_map(|e| serde_json::from_str(e).ok()).collect();
    let ids: Vec<Value> = chunks.iter().filter_map(|c| c["completion_probabilities"].as_array()).map(|a| {
        assert_eq!(a.len(), 1);
        a[0]["id"].clone()
    }).collect();
    assert_eq!(ids, probs.iter().map(|p| p["id"].clone()).collect::<Vec<_>>());

    // Without n_probs: none; out of range or not a boolean: refused by name.
    let r = post(&srv, "/completion", json!({"prompt": "Hi", "n_predict": 2}));
    assert!(r.json().get("completion_probabilities").is_none());
    for (field, extra) in [("n_probs", json!({"n_probs": 21})), ("post_sampling_probs", json!({"n_probs": 2, "post_sampling_probs": 1}))] {
        let b = with(json!({"prompt": "Hi", "n_predict": 2}), &extra);
        let r = post(&srv, "/completion", b);
        assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some(field)), "{}", r.body);
    }
}

/// llama-server's `samplers`: the chain's order by names or letters; a stage left out is not
/// applied; names of no stage are skipped, as llama-server skips them.
#[test]
fn samplers_order_the_chain() {
    let srv = start(1, 16, None);
    let prompt = "Write the line \"the cat sat on the mat\" five times:\n";
    let ask = |extra: Value| {
        let body = with(json!({"prompt": prompt, "n_predict": 24, "temperature": 0, "repeat_penalty": 1.5}), &extra);
        let r = post(&srv, "/completion", body);
        assert_eq!(r.status, 200, "{extra}: {}", r.body);
        text(&r.json())
    };
    let penalised = ask(json!({}));
    let plain = ask(json!({"repeat_penalty": 1.0}));
    assert_ne!(penalised, plain, "the penalty changes the greedy text");
    assert_eq!(ask(json!({"samplers": "edskypmxt"})), penalised, "the default order by letters");
    assert_eq!(ask(json!({"samplers": ["top_k", "temperature"]})), plain, "penalties left out");
    assert_eq!(ask(json!({"samplers": ["tfs_z", "Penalties", "top-k", "temp"]})), penalised, "an unknown name skipped, aliases taken");
    // The temperature before the penalties: greedy takes the model's best, the penalty comes too late.
    assert_eq!(ask(json!({"samplers": "te"})), plain);
    for bad in [json!(5), json!(["top_k", 3]), json!("kat"), json!(["adaptive_p"])] {
        let r = post(&srv, "/completion", json!({"prompt": "Hi", "n_predict": 2, "samplers": bad}));
        assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some("samplers")), "{bad}: {}", r.body);
    }
    let props = get(&srv, "/props").json();
    let want = json!(["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]);
    assert_eq!(props["default_generation_settings"]["params"]["samplers"], want);
}

/// `post_sampling_probs`: the chain's distribution as probabilities, under llama-server's keys.
#[test]
fn post_sampling_probs_are_the_chains() {
    let srv = start(1, 16, None);
    let ask = |extra: Value| {
        let body = with(json!({"prompt": "Once upon a time", "n_predict": 6, "n_probs": 10, "post_sampling_probs": true}), &extra);
        let r = post(&srv, "/completion", body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["completion_probabilities"].as_array().unwrap_or_else(|| panic!("{}", r.body)).clone()
    };
    // Greedy: each token is certain and its own only alternative.
    for p in ask(json!({"temperature": 0})) {
        assert_eq!(p["prob"], 1.0, "{p}");
        assert!(p.get("logprob").is_none() && p.get("top_logprobs").is_none(), "{p}");
        assert_eq!(p["top_probs"], json!([{"id": p["id"], "token": p["token"], "bytes": p["bytes"], "prob": 1.0}]));
    }
    // Top-k 3 at temperature 1: at most three alternatives, best first, the whole mass, the
    // drawn token among them with its own probability.
    for p in ask(json!({"temperature": 1.0, "top_k": 3, "top_p": 1.0, "min_p": 0.0, "seed": 5})) {
        let top = p["top_probs"].as_array().unwrap();
        let probs: Vec<f64> = top.iter().map(|t| t["prob"].as_f64().unwrap()).collect();
        assert!(!top.is_empty() && top.len() <= 3, "{p}");
        assert!(probs.windows(2).all(|w| w[0] >= w[1]), "{p}");
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-4, "{p}");
        let own = top.iter().find(|t| t["id"] == p["id"]).unwrap_or_else(|| panic!("{p}"));
        assert_eq!(own["prob"], p["prob"], "{p}");
    }
}

/// llama-server's `/props`, `/apply-template` and its route aliases.
#[test]
fn props_apply_template_and_llama_server_routes() {
    let srv = start(3, 16, None);
    let p = get(&srv, "/props");
    assert_eq!(p.status, 200, "{}", p.body);
    let v = p.json();
    assert_eq!(v["total_slots"], 3);
    assert_eq!(v["default_generation_settings"]["params"]["top_k"], 40);
    assert_eq!(v["default_generation_settings"]["params"]["dry_sequence_breakers"], json!(["\n", ":", "\"", "*"]));
    assert!(v["default_generation_settings"]["n_ctx"].as_u64().unwrap() > 0);
    assert!(v["chat_template"].as_str().unwrap().contains("im_start"), "SmolLM2's template: {v}");
    assert_eq!(v["eos_token"], "<|im_end|>");
    assert_eq!(post(&srv, "/props", json!({})).status, 501);

    // The prompt the chat endpoint generates after: the same answer from /completion.
    let msgs = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]);
    let t = post(&srv, "/apply-template", json!({"messages": msgs}));
    assert_eq!(t.status, 200, "{}", t.body);
    let prompt = t.json()["prompt"].as_str().unwrap().to_string();
    assert!(prompt.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n") && prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    let chat = post(&srv, "/chat/completions", json!({"messages": msgs, "max_tokens": 12, "temperature": 0})).json();
    let native = post(&srv, "/completions", json!({"prompt": prompt, "n_predict": 12, "temperature": 0})).json();
    assert_eq!(chat["choices"][0]["message"]["content"], native["content"], "{chat} {native}");
    assert_eq!(post(&srv, "/apply-template", json!({"messages": "nope"})).status, 400);
    assert_eq!(get(&srv, "/v1/health").status, 200);
}

/// `serve`'s sampling flags are the defaults of requests that leave those fields out.
#[test]
fn server_defaults_fill_the_fields_a_request_leaves_out() {
    use corelm_engine::sample::{Dry, SamplingParams};
    use corelm_server::api::RequestDefaults;
    let sampling = SamplingParams { temperature: 0.0, dry: Dry { multiplier: 1.0, ..Dry::default() }, ..Default::default() };
    let srv = start_defaults(1, RequestDefaults { sampling, max_tokens: Some(5), ..Default::default() });
    let plain = start(1, 16, None);
    let prompt = "Write the line \"the cat sat on the mat\" five times:\n";
    let got = post(&srv, "/v1/completions", json!({"prompt": prompt, "max_tokens": 32}));
    let want = post(&plain, "/v1/completions", json!({"prompt": prompt, "max_tokens": 32, "temperature": 0, "dry_multiplier": 1.0}));
    assert_eq!(text(&got.json()), text(&want.json()));
    // A field the request gives wins: DRY off again repeats the line.
    let off = post(&srv, "/v1/completions", json!({"prompt": prompt, "max_tokens": 32, "dry_multiplier": 0}));
    let greedy = post(&plain, "/v1/completions", json!({"prompt": prompt, "max_tokens": 32, "temperature": 0}));
    assert_eq!(text(&off.json()), text(&greedy.json()));
    assert_ne!(text(&off.json()), text(&got.json()));
    let props = get(&srv, "/props").json();
    assert_eq!(props["default_generation_settings"]["params"]["temperature"], 0.0);
    assert_eq!(props["default_generation_settings"]["params"]["dry_multiplier"], 1.0);
    // `-n 5`: a request without a limit stops after five tokens; one with its own goes on.
    let r = post(&srv, "/v1/completions", json!({"prompt": prompt, "ignore_eos": true})).json();
    assert_eq!((r["usage"]["completion_tokens"].as_u64(), r["choices"][0]["finish_reason"].as_str()), (Some(5), Some("length")), "{r}");
    assert_eq!(props["default_generation_settings"]["params"]["n_predict"], 5);
}

/// llama-server's `/slots`: each slot idle or processing, its request's progress (kept when
/// it ends); `fail_on_no_slot` a 503 while every slot works; slot actions a 501.
#[test]
fn slots_show_what_each_sequence_does() {
    let srv = start(1, 16, None);
    let v = get(&srv, "/slots").json();
    assert_eq!(v, json!([{"id": 0, "n_ctx": v[0]["n_ctx"], "speculative": false, "is_processing": false}]), "before any request");
    let r = post(&srv, "/completion", json!({"prompt": "Once upon a time", "n_predict": 8, "ignore_eos": true})).json();
    let s = &get(&srv, "/slots").json()[0];
    assert_eq!((s["is_processing"].as_bool(), s["id_task"].as_u64()), (Some(false), Some(1)), "{s}");
    assert_eq!(s["n_prompt_tokens"], r["tokens_evaluated"], "{s}");
    assert_eq!(s["next_token"][0]["n_decoded"], 8, "{s}");
    assert_eq!(s["next_token"][0]["n_remain"], 0, "{s}");
    assert_eq!(get(&srv, "/slots?fail_on_no_slot=1").status, 200, "the slot is idle");
    // While a long answer is written, the slot is busy.
    std::thread::scope(|scope| {
        scope.spawn(|| post(&srv, "/completion", json!({"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": true})));
        let t0 = std::time::Instant::now();
        let busy = loop {
            let s = get(&srv, "/slots").json();
            if s[0]["is_processing"] == true {
                break s;
            }
            assert!(t0.elapsed().as_secs() < 30, "the slot never showed the request");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(busy[0]["id_task"], 2, "{busy}");
        let full = get(&srv, "/slots?fail_on_no_slot=1");
        assert_eq!((full.status, full.json()["error"]["message"].as_str()), (503, Some("no slot available")), "{}", full.body);
    });
    // The last request's whole blocks (its prompt and answer) leave the prefix cache.
    let a = post(&srv, "/slots/0?action=erase", json!({})).json();
    assert!(a["n_erased"].as_u64().is_some_and(|n| n > 0 && n % 16 == 0), "{a}");
}
