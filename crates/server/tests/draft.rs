//! `serve --spec-draft-model`: answers with a draft model are the answers without, for
//! concurrent chat and native requests; `/slots` says the slots speculate and `/metrics`
//! counts the draft tokens fed and kept.

mod common;

use common::*;
use serde_json::json;

#[test]
fn a_draft_model_changes_no_answer() {
    // SmolLM2 as its own draft: under greedy decoding every proposal is the target's token.
    let draft = corelm_engine::models_dir().join(format!("{MODEL}.gguf"));
    let (plain, drafted) = (start(2, 8, None), start_draft(2, &draft, 4));
    let slots = get(&drafted, "/slots").json();
    assert_eq!((slots[0]["speculative"].clone(), slots[1]["speculative"].clone()), (json!(true), json!(true)));
    let bodies = [
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "List three colours."}], "max_tokens": 24, "temperature": 0})),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24, "temperature": 0.8, "seed": 4})),
        ("/completion", json!({"prompt": "The capital of France is", "n_predict": 16, "temperature": 0})),
    ];
    let answer = |srv: &Server| -> Vec<String> {
        std::thread::scope(|s| {
            let handles: Vec<_> = bodies.iter().map(|(path, body)| s.spawn(move || post(srv, path, body.clone()))).collect();
            handles.into_iter().map(|h| h.join().unwrap().body).map(|b| {
                let v: serde_json::Value = serde_json::from_str(&b).unwrap();
                v["choices"][0]["message"]["content"].as_str().or(v["content"].as_str()).unwrap_or_else(|| panic!("{b}")).to_string()
            }).collect()
        })
    };
    assert_eq!(answer(&drafted), answer(&plain));
    let (fed, kept) = (metric(&drafted, "corelm_draft_tokens_total"), metric(&drafted, "corelm_draft_tokens_accepted_total"));
    assert!(fed >= 20.0 && kept >= fed / 2.0, "{kept} of {fed} kept");
}
