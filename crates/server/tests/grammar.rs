//! llama-server's `grammar` field on both completion endpoints and its own `/completion`:
//! answers of the grammar, streamed and whole alike, several concurrent requests each with its
//! own grammar, and bad grammars refused by name; llama-server's `json_schema` field.

mod common;

use common::*;
use serde_json::json;

#[test]
fn grammar_field_holds_answers_and_bad_grammars_are_refused() {
    let srv = start(4, 64, None);
    let list = r#"root ::= ("- " [A-Z] [a-z]+ "\n"){3}"#;
    let r = post(&srv, "/v1/completions", json!({"prompt": "Three fruits, one per line:\n", "max_tokens": 40, "temperature": 0, "grammar": list}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text:?}");
    assert!(lines.iter().all(|l| l.starts_with("- ") && l[2..].chars().next().unwrap().is_ascii_uppercase() && l[3..].chars().all(|c| c.is_ascii_lowercase())), "{text:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "the grammar is complete after three lines");

    // Chat, sampled, streamed: the same rule; concurrent requests keep their own grammars.
    let yes_no = r##"root ::= ("Yes" | "No") ", " [a-z ]{3,20} ".""##;
    let digits = r#"root ::= [0-9]{2,5}"#;
    let (a, b, c) = std::thread::scope(|s| {
        let a = s.spawn(|| post(&srv, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Is water wet?"}], "max_tokens": 32, "temperature": 1.0, "seed": 7, "grammar": yes_no})));
        let b = s.spawn(|| post(&srv, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Is water wet?"}], "max_tokens": 32, "temperature": 1.0, "seed": 7, "grammar": yes_no, "stream": true})));
        let c = s.spawn(|| post(&srv, "/v1/completions", json!({"prompt": "The year the war ended:", "max_tokens": 8, "temperature": 0.7, "seed": 3, "grammar": digits})));
        (a.join().unwrap(), b.join().unwrap(), c.join().unwrap())
    });
    let whole = a.json()["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{}", a.body)).to_string();
    let streamed: String = b
        .events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<serde_json::Value>(e).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(whole, streamed, "same seed, same answer, streamed or not");
    let (word, rest) = whole.split_once(", ").unwrap_or_else(|| panic!("{whole:?}"));
    assert!(["Yes", "No"].contains(&word) && rest.ends_with('.') && rest[..rest.len() - 1].chars().all(|c| c.is_ascii_lowercase() || c == ' '), "{whole:?}");
    let year = c.json()["choices"][0]["text"].as_str().unwrap().to_string();
    assert!((2..=5).contains(&year.len()) && year.chars().all(|c| c.is_ascii_digit()), "{year:?}");

    // Refusals name the field and what is wrong.
    for (body, want) in [
        (json!({"prompt": "x", "grammar": "root ::= item\n"}), "never defines it"),
        (json!({"prompt": "x", "grammar": "root ::= \"a\"\nitem ::= [a-z\n"}), "grammar line 3, column 1: unterminated character class"),
        (json!({"prompt": "x", "grammar": "root ::= root \"a\" | \"b\""}), "left-recursive"),
        (json!({"prompt": "x", "grammar": "root ::= <[99999999]>"}), "outside the vocabulary"),
        (json!({"prompt": "x", "grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}}), "together with json_schema or a JSON response_format"),
        (json!({"prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {"type": "object"}}), "together with json_schema or a JSON response_format"),
    ] {
        let r = post(&srv, "/v1/completions", body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let e = r.json();
        assert_eq!(e["error"]["param"], "grammar", "{}", r.body);
        assert!(e["error"]["message"].as_str().unwrap().contains(want), "{body}: {}", r.body);
    }
    // An empty grammar is none (as llama-server).
    assert_eq!(post(&srv, "/v1/completions", json!({"prompt": "Hi", "max_tokens": 2, "grammar": ""})).status, 200);

    // llama.cpp's own endpoint takes both fields too.
    let r = post(&srv, "/completion", json!({"prompt": "Count:", "n_predict": 24, "temperature": 0, "grammar": r#"root ::= " " [0-9]{1,3} (", " [0-9]{1,3}){2}"#}));
    let content = r.json()["content"].as_str().unwrap_or_else(|| panic!("{}", r.body)).to_string();
    let nums: Vec<&str> = content.trim_start().split(", ").collect();
    assert!(nums.len() == 3 && nums.iter().all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())), "{content:?}");
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "legs": {"type": "integer"}}, "required": ["name", "legs"]});
    let r = post(&srv, "/completion", json!({"prompt": "A cat as JSON:", "n_predict": 40, "temperature": 0, "json_schema": schema}));
    let v: serde_json::Value = serde_json::from_str(r.json()["content"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}: {}", r.body));
    assert!(v["name"].is_string() && v["legs"].is_i64(), "{v}");
    let r = post(&srv, "/v1/completions", json!({"prompt": "x", "json_schema": {"type": "object"}, "response_format": {"type": "json_object"}}));
    assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some("json_schema")), "{}", r.body);
}

/// llama-server's lazy grammars: the answer is free until a trigger and held from it (the
/// free part the same as without the grammar), on the OpenAI endpoints and `/completion`;
/// bad triggers refused by name.
#[test]
fn lazy_grammars_hold_answers_from_their_trigger() {
    let srv = start(1, 16, None);
    let free = post(&srv, "/v1/chat/completions", chat("Where is the Eiffel Tower?", 30, false)).json();
    let free = free["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let at = free.find("Paris").unwrap_or_else(|| panic!("{free:?}"));
    let grammar = r#"root ::= "Paris, population " [1-9] [0-9]{2} " thousand.""#;
    for (lazy, triggers) in [(json!(true), json!([{"type": 1, "value": "Paris"}])), (json!(true), json!([{"type": "pattern", "value": "Par(is)"}]))] {
        let mut body = chat("Where is the Eiffel Tower?", 30, false);
        body["grammar"] = json!(grammar);
        body["grammar_lazy"] = lazy;
        body["grammar_triggers"] = triggers.clone();
        let v = post(&srv, "/v1/chat/completions", body).json();
        let text = v["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{v}")).to_string();
        assert_eq!(text[..at], free[..at], "{triggers}: free until the trigger");
        let held = &text[at..];
        assert!(held.starts_with("Paris, population ") && held.ends_with(" thousand.") && held.len() == "Paris, population 123 thousand.".len(), "{triggers}: {text:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    }
    // `/completion`, the grammar a JSON Schema, the trigger a full pattern whose group starts
    // the held text.
    let schema = json!({"type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}}, "required": ["city"]});
    let r = post(&srv, "/completion", json!({"prompt": "Answer in JSON. The capital of France:", "n_predict": 30, "temperature": 0, "json_schema": schema,
        "grammar_lazy": true, "grammar_triggers": [{"type": 3, "value": r"[\s\S]*?(\{)[\s\S]*"}]}));
    let content = r.json()["content"].as_str().unwrap_or_else(|| panic!("{}", r.body)).to_string();
    let open = content.find('{').unwrap_or_else(|| panic!("{content:?}"));
    let v: serde_json::Value = serde_json::from_str(&content[open..]).unwrap_or_else(|e| panic!("{e}: {content:?}"));
    assert!(["Paris", "Lyon"].contains(&v["city"].as_str().unwrap()), "{content:?}");

    for (body, want) in [
        (json!({"prompt": "x", "grammar": "root ::= \"a\"", "grammar_lazy": true}), "at least one trigger"),
        (json!({"prompt": "x", "grammar": "root ::= \"a\"", "grammar_lazy": true, "grammar_triggers": [{"type": 1, "value": ""}]}), "empty"),
        (json!({"prompt": "x", "grammar": "root ::= \"a\"", "grammar_lazy": true, "grammar_triggers": [{"type": 2, "value": "a("}]}), "trigger pattern \"a(\""),
        (json!({"prompt": "x", "grammar": "root ::= \"a\"", "grammar_lazy": true, "grammar_triggers": [{"type": 7, "value": "a"}]}), "type must be"),
        (json!({"prompt": "x", "grammar": "root ::= \"a\"", "grammar_lazy": true, "grammar_triggers": [{"type": 0, "value": "a"}]}), "needs a \"token\" id"),
        (json!({"prompt": "x", "grammar": "root ::= \"a\"", "grammar_lazy": true, "grammar_triggers": [{"type": 0, "token": 99999999}]}), "outside the vocabulary"),
        (json!({"prompt": "x", "grammar_lazy": true, "grammar_triggers": [{"type": 1, "value": "a"}]}), "needs a grammar or a json_schema"),
    ] {
        let r = post(&srv, "/v1/completions", body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(want), "{body}: {msg}");
        let param = r.json()["error"]["param"].as_str().unwrap_or_default().to_string();
        assert!(param.starts_with(if body.get("grammar").is_some() { "grammar_triggers" } else { "grammar_lazy" }), "{body}: {param}");
    }
}
