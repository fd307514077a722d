//! llama-server's slot actions (`POST /slots/{id}?action=save|restore|erase`, the test
//! servers' `--slot-save-path` a directory per test process): a slot saved by one server and
//! restored by another serves the same prompt from the restored blocks with the same answer;
//! an erased slot's prompt is computed again; bad names, slots and actions are refused.

mod common;

use common::*;
use serde_json::json;

#[test]
fn a_slot_saved_by_one_server_serves_another() {
    let prompt = "The keeper of the northern lighthouse wrote in his log every night. ".repeat(6);
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0});
    let a = start(2, 16, None);
    let first = post(&a, "/v1/completions", body.clone()).json();
    let n_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let s = post(&a, "/slots/0?action=save", json!({"filename": "lighthouse.kv"})).json();
    // The prompt and the answer but its last token (sampled, never fed), in whole blocks.
    assert_eq!(s["n_saved"], (n_prompt + 11) / 16 * 16, "{s}");
    let size = std::fs::metadata(slot_dir().join("lighthouse.kv")).unwrap().len();
    assert_eq!((s["filename"].as_str(), s["n_written"].as_u64()), (Some("lighthouse.kv"), Some(size)), "{s}");
    let e = post(&a, "/slots/0?action=erase", json!({})).json();
    assert_eq!(e, json!({"id_slot": 0, "n_erased": s["n_saved"]}));
    let again = post(&a, "/v1/completions", body.clone()).json();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "erased: {again}");
    // Refused: a name outside the directory, a slot that does not exist, an unknown action, a
    // file that is not there.
    let r = post(&a, "/slots/0?action=save", json!({"filename": "../x.kv"}));
    assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some("filename")), "{}", r.body);
    let r = post(&a, "/slots/5?action=erase", json!({}));
    assert!(r.status == 400 && r.body.contains("only 2 slots"), "{}", r.body);
    let r = post(&a, "/slots/0?action=load", json!({}));
    assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some("action")), "{}", r.body);
    let r = post(&a, "/slots/1?action=restore", json!({"filename": "absent.kv"}));
    assert!(r.status == 400 && r.body.contains("absent.kv"), "{}", r.body);
    drop(a);
    // Another server restores it, on any slot, and the prompt's whole blocks come from it.
    let b = start(2, 16, None);
    let r = post(&b, "/slots/1?action=restore", json!({"filename": "lighthouse.kv"})).json();
    assert_eq!((r["id_slot"].as_u64(), &r["n_restored"], r["n_read"].as_u64()), (Some(1), &s["n_saved"], Some(size)), "{r}");
    let restored = post(&b, "/v1/completions", body).json();
    assert_eq!(restored["usage"]["prompt_tokens_details"]["cached_tokens"], (n_prompt - 1) / 16 * 16, "{restored}");
    assert_eq!(restored["choices"][0]["text"], first["choices"][0]["text"]);
}
