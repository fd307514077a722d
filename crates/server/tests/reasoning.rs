//! Reasoning apart from the answer, over real HTTP: SmolLM2 served with a chat template that
//! opens a `<think>` block (as Qwen3's does), its answers held by a grammar to reasoning, the
//! closing tag and an answer. Each API gives the reasoning apart — chat as `reasoning_content`,
//! Anthropic's as a `thinking` block, the Responses API as a `reasoning` item — whole and
//! streamed alike; `reasoning_format: none` leaves the raw text; `chat_template_kwargs` reach
//! the template, and earlier turns' reasoning goes back into it.

mod common;

use common::*;
use serde_json::{json, Value};

/// ChatML, an assistant turn's reasoning in a block, and the answer opened inside one unless
/// `enable_thinking` is false (then an empty block, closed).
const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

/// Reasoning of a few words, the tag, an answer of a few (words of up to 7 letters).
const GRAMMAR: &str = "root ::= w \" \" w \" \" w \"\\n</think>\\n\\n\" [A-Z] w \" \" w \".\"\nw ::= [a-z] [a-z]? [a-z]? [a-z]? [a-z]? [a-z]? [a-z]?";

fn chat(extra: Value) -> Value {
    let mut b = json!({"model": MODEL, "max_tokens": 40, "temperature": 0, "grammar": GRAMMAR,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

fn stream_events(srv: &Server, path: &str, mut body: Value) -> Vec<Value> {
    body["stream"] = json!(true);
    let r = post(srv, path, body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.events().iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str(e).unwrap()).collect()
}

#[test]
fn reasoning_is_answered_apart_by_every_api() {
    let srv = start_template(TEMPLATE, json!({}));
    // The raw text: `reasoning_format: none`.
    let raw = post(&srv, "/v1/chat/completions", chat(json!({"reasoning_format": "none"}))).json();
    let raw = raw["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{raw}")).to_string();
    let (reasoning, content) = raw.split_once("\n</think>\n\n").unwrap_or_else(|| panic!("{raw:?}"));

    let v = post(&srv, "/v1/chat/completions", chat(json!({}))).json();
    let m = &v["choices"][0]["message"];
    assert_eq!((m["reasoning_content"].as_str(), m["content"].as_str()), (Some(reasoning), Some(content)), "{v}");
    let ev = stream_events(&srv, "/v1/chat/completions", chat(json!({})));
    let joined = |key: &str| ev.iter().filter_map(|e| e["choices"][0]["delta"][key].as_str()).collect::<String>();
    assert_eq!((joined("reasoning_content"), joined("content")), (reasoning.to_string(), content.to_string()));
    assert!(ev.iter().filter(|e| e["choices"][0]["delta"]["reasoning_content"].is_string()).count() > 1, "reasoning streams as it comes");

    // Anthropic's: a thinking block, then the text.
    let body = chat(json!({}));
    let v = post(&srv, "/v1/messages", body.clone()).json();
    assert_eq!(v["content"], json!([{"type": "thinking", "thinking": reasoning, "signature": ""}, {"type": "text", "text": content}]), "{v}");
    let ev = stream_events(&srv, "/v1/messages", body.clone());
    let deltas = |kind: &str, key: &str| ev.iter().filter(|e| e["delta"]["type"] == kind).map(|e| e["delta"][key].as_str().unwrap()).collect::<String>();
    assert_eq!((deltas("thinking_delta", "thinking"), deltas("text_delta", "text")), (reasoning.to_string(), content.to_string()));
    let starts: Vec<&Value> = ev.iter().filter(|e| e["type"] == "content_block_start").map(|e| &e["content_block"]["type"]).collect();
    assert_eq!(starts, [&json!("thinking"), &json!("text")]);
    let signature = ev.iter().position(|e| e["delta"]["type"] == "signature_delta").unwrap();
    assert_eq!((&ev[signature + 1]["type"], &ev[signature + 1]["index"]), (&json!("content_block_stop"), &json!(0)));

    // The Responses API's: a reasoning item, then the message.
    let mut body = json!({"model": MODEL, "max_output_tokens": 40, "temperature": 0, "grammar": GRAMMAR, "input": "What is the capital of France?"});
    let v = post(&srv, "/v1/responses", body.clone()).json();
    let out = v["output"].as_array().unwrap();
    assert_eq!((&out[0]["type"], &out[0]["content"]), (&json!("reasoning"), &json!([{"type": "reasoning_text", "text": reasoning}])), "{v}");
    assert_eq!(out[1]["content"][0]["text"], content, "{v}");
    body["stream"] = json!(true);
    let ev = stream_events(&srv, "/v1/responses", body);
    let deltas = |kind: &str| ev.iter().filter(|e| e["type"] == kind).map(|e| e["delta"].as_str().unwrap()).collect::<String>();
    assert_eq!((deltas("response.reasoning_text.delta"), deltas("response.output_text.delta")), (reasoning.to_string(), content.to_string()));
    let items = |o: &Value| o.as_array().unwrap().iter().map(|i| (i["type"].clone(), i["content"].clone())).collect::<Vec<_>>();
    assert_eq!(items(&ev.last().unwrap()["response"]["output"]), items(&v["output"]));
}

#[test]
fn template_kwargs_and_earlier_reasoning_reach_the_template() {
    // The server's variables (`--chat-template-kwargs`), under a request's own.
    let srv = start_template(TEMPLATE, json!({"enable_thinking": false}));
    let prompt = |body: Value| post(&srv, "/apply-template", body).json()["prompt"].as_str().unwrap().to_string();
    assert!(prompt(chat(json!({"chat_template_kwargs": {"enable_thinking": true}}))).ends_with("<|im_start|>assistant\n<think>\n"));
    let off = chat(json!({}));
    assert!(prompt(off.clone()).ends_with("<think>\n\n</think>\n\n"));
    // Thinking off: the answer is not inside a block, so all of it is content.
    let v = post(&srv, "/v1/chat/completions", off).json();
    assert!(v["choices"][0]["message"]["reasoning_content"].is_null() && v["choices"][0]["message"]["content"].as_str().unwrap().contains("</think>"), "{v}");
    // An earlier turn's reasoning, from each API's form of it.
    let history = json!([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "they greet"},
        {"role": "user", "content": "Bye"},
    ]);
    assert!(prompt(chat(json!({"messages": history}))).contains("<|im_start|>assistant\n<think>\nthey greet\n</think>\n\nHello.<|im_end|>"));
    let anthropic = json!({"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "they greet", "signature": ""}, {"type": "text", "text": "Hello."}]},
        {"role": "user", "content": "Bye"},
    ]});
    let responses = json!({"model": MODEL, "max_output_tokens": 4, "input": [
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "they greet"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": "Bye"},
    ]});
    let chat_count = post(&srv, "/v1/chat/completions/input_tokens", chat(json!({"messages": history}))).json()["input_tokens"].clone();
    assert_eq!(post(&srv, "/v1/messages/count_tokens", anthropic).json()["input_tokens"], chat_count);
    assert_eq!(post(&srv, "/v1/responses/input_tokens", responses).json()["input_tokens"], chat_count);
}
