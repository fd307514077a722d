//! `serve --context-shift`: an answer may ask for more tokens than the context holds; its
//! sequence drops tokens when it fills and goes on, and llama.cpp's `/completion` says
//! `truncated`. Without the flag the same request is a 400 (`context_length_exceeded`).

mod common;

use common::*;
use corelm_engine::generate::ContextShift;
use serde_json::json;

#[test]
fn an_answer_longer_than_the_context_shifts_it() {
    let shift = ContextShift { n_keep: -1, n_discard: 0, n_ctx: 0 };
    let srv = start_shift(2, 128, shift);
    let prompt = "Tell me a long story about a lighthouse keeper.";
    let body = json!({"prompt": prompt, "n_predict": 200, "temperature": 0, "ignore_eos": true});
    let props = get(&srv, "/props").json();
    assert_eq!((props["default_generation_settings"]["params"]["context_shift"].as_bool(), props["default_generation_settings"]["params"]["n_keep"].as_i64()), (Some(true), Some(-1)), "{props}");
    let r = post(&srv, "/completion", body.clone()).json();
    assert_eq!((r["tokens_predicted"].as_u64(), r["truncated"].as_bool(), r["stop_type"].as_str()), (Some(200), Some(true), Some("limit")), "{r}");
    // A request's own cut (`n_keep`, `n_discard`) is taken.
    let r = post(&srv, "/completion", json!({"prompt": prompt, "n_predict": 200, "temperature": 0, "ignore_eos": true, "n_keep": 4, "n_discard": 100})).json();
    assert_eq!((r["tokens_predicted"].as_u64(), r["truncated"].as_bool()), (Some(200), Some(true)), "{r}");
    // Within the context nothing is dropped.
    let r = post(&srv, "/completion", json!({"prompt": prompt, "n_predict": 20, "temperature": 0})).json();
    assert_eq!(r["truncated"].as_bool(), Some(false), "{r}");
    let chat = post(&srv, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 300, "temperature": 0, "ignore_eos": true}));
    assert_eq!((chat.status, chat.json()["usage"]["completion_tokens"].as_u64()), (200, Some(300)), "{}", chat.body);
    drop(srv);
    // Without context shift the same request does not fit.
    let srv = start(1, 16, None);
    let r = post(&srv, "/completion", json!({"prompt": prompt, "n_predict": 2000}));
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{}", r.body);
}
