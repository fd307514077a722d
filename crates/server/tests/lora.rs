//! llama-server's LoRA API on SmolLM2 with an adapter written here: `GET /lora-adapters`,
//! `POST /lora-adapters` (the server's scales), a request's own `lora` field, and requests of
//! different scales in flight at once (run in turn by the batcher, each as if alone).

mod common;

use common::*;
use corelm_engine::lora::LoraSpec;
use corelm_gguf::writer::Writer;
use corelm_gguf::{GgmlType, Value as GValue};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// A rank-4 F32 adapter on every layer's Q, V and down (alpha 4: factor = scale), values from
/// a fixed LCG, strong enough to change greedy text.
fn write_adapter(path: &Path) {
    let model = corelm_gguf::Gguf::open(corelm_engine::models_dir().join(format!("{MODEL}.gguf"))).unwrap();
    let mut w = Writer::new();
    w.kv("general.type", GValue::String("adapter".into())).kv("general.architecture", GValue::String("llama".into()));
    w.kv("adapter.type", GValue::String("lora".into())).kv("adapter.lora.alpha", GValue::F32(4.0));
    w.kv("adapter.lora.task_name", GValue::String("test".into()));
    let mut state = 12345u64;
    let mut values = |n: u64| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.25).to_le_bytes()
            })
            .collect()
    };
    for t in model.tensors.iter().filter(|t| ["attn_q", "attn_v", "ffn_down"].iter().any(|m| t.name.ends_with(&format!("{m}.weight")))) {
        let (n_in, n_out) = (t.shape[0], t.shape[1]);
        let a = values(n_in * 4);
        let b = values(4 * n_out);
        w.tensor(&format!("{}.lora_a", t.name), &[n_in, 4], GgmlType::F32, a);
        w.tensor(&format!("{}.lora_b", t.name), &[4, n_out], GgmlType::F32, b);
    }
    std::fs::write(path, w.to_bytes()).unwrap();
}

fn adapter_file(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("corelm-lora-{tag}-{}.gguf", std::process::id()));
    write_adapter(&p);
    p
}

fn completion(lora: Option<Value>) -> Value {
    let mut body = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
    if let Some(l) = lora {
        body["lora"] = l;
    }
    body
}

fn text(srv: &Server, body: Value) -> String {
    let r = post(srv, "/v1/completions", body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn scales_per_server_and_per_request() {
    let file = adapter_file("scales");
    let srv = start_lora(2, vec![LoraSpec::new(&file)]);
    let list = get(&srv, "/lora-adapters").json();
    assert_eq!(list, json!([{"id": 0, "path": file.display().to_string(), "scale": 1.0, "task_name": "test", "prompt_prefix": ""}]));
    let on = text(&srv, completion(None));
    let off = text(&srv, completion(Some(json!([{"id": 0, "scale": 0.0}]))));
    assert_ne!(on, off, "the adapter changes the greedy text");
    // An empty list is the server's scales; a listed scale of 1 is the adapter at 1.
    assert_eq!(text(&srv, completion(Some(json!([])))), on);
    assert_eq!(text(&srv, completion(Some(json!([{"id": 0, "scale": 1}])))), on);
    // The server's scale set to 0 (an adapter left out of the list: 0).
    let r = post(&srv, "/lora-adapters", json!([]));
    assert_eq!((r.status, r.json()), (200, json!({"success": true})));
    assert_eq!(get(&srv, "/lora-adapters").json()[0]["scale"], json!(0.0));
    assert_eq!(text(&srv, completion(None)), off);
    assert_eq!(text(&srv, completion(Some(json!([{"id": 0, "scale": 1.0}])))), on);
    // Both at once, many times over: each request runs under its own scales.
    let srv_ref = &srv;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..6).map(|i| s.spawn(move || (i, text(srv_ref, completion(Some(json!([{"id": 0, "scale": (i % 2) as f32}]))))))).collect();
        for h in handles {
            let (i, t) = h.join().unwrap();
            assert_eq!(&t, if i % 2 == 1 { &on } else { &off }, "request {i}");
        }
    });
    // The chat endpoint and llama.cpp's /completion read the field too.
    let chat_off = post(&srv, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}));
    let mut with = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0, "lora": [{"id": 0, "scale": 1}]});
    let chat_on = post(&srv, "/v1/chat/completions", with.clone());
    assert_ne!(chat_off.json()["choices"][0]["message"]["content"], chat_on.json()["choices"][0]["message"]["content"]);
    let native = post(&srv, "/completion", json!({"prompt": "The capital of France is", "n_predict": 12, "temperature": 0, "lora": [{"id": 0, "scale": 1}]}));
    assert_eq!(native.json()["content"].as_str().unwrap(), on);
    // Bad values: a 400 naming the field.
    with["lora"] = json!([{"id": 3, "scale": 1}]);
    let r = post(&srv, "/v1/chat/completions", with.clone());
    assert!(r.status == 400 && r.body.contains("no adapter has id 3") && r.body.contains("\"param\":\"lora[0]\""), "{}", r.body);
    with["lora"] = json!({"id": 0});
    assert_eq!(post(&srv, "/v1/chat/completions", with).status, 400);
    let r = post(&srv, "/lora-adapters", json!([{"id": 0, "scale": "high"}]));
    assert!(r.status == 400 && r.body.contains("\\\"scale\\\" must be a number"), "{}", r.body);
    std::fs::remove_file(&file).unwrap();
}

/// `--lora-init-without-apply`: listed at 0, applied once set; a server without adapters
/// refuses the field.
#[test]
fn adapters_start_unapplied_and_servers_without_them_refuse_the_field() {
    let file = adapter_file("unapplied");
    let srv = start_lora(1, vec![LoraSpec { path: file.clone(), scale: 0.0 }]);
    assert_eq!(get(&srv, "/lora-adapters").json()[0]["scale"], json!(0.0));
    let off = text(&srv, completion(None));
    post(&srv, "/lora-adapters", json!([{"id": 0, "scale": 1}]));
    assert_ne!(text(&srv, completion(None)), off);
    std::fs::remove_file(&file).unwrap();
    let plain = start(1, 4, None);
    assert_eq!(text(&plain, completion(None)), off, "scale 0 is the model without adapters");
    let r = post(&plain, "/v1/completions", completion(Some(json!([{"id": 0, "scale": 1}]))));
    assert!(r.status == 400 && r.body.contains("no LoRA adapters are loaded"), "{}", r.body);
    assert_eq!(get(&plain, "/lora-adapters").json(), json!([]));
}
