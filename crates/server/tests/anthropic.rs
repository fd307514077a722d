//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) over real HTTP on
//! SmolLM2: the chat endpoint's answers in Anthropic's shape, streamed as its events, tool use
//! both ways, its errors; and an assistant prefill, which both APIs continue.

mod common;

use common::*;
use serde_json::{json, Value};

fn message(content: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "system": "You answer in one short sentence.",
           "messages": [{"role": "user", "content": content}]})
}

/// The same request on the chat endpoint.
fn as_chat(content: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
           "messages": [{"role": "system", "content": "You answer in one short sentence."}, {"role": "user", "content": content}]})
}

/// A stream's events, each checked to carry its name as its `type`.
fn events(r: &Reply) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.body);
    let names: Vec<&str> = r.body.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    let data: Vec<Value> = r.events().iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(names, data.iter().map(|d| d["type"].as_str().unwrap()).collect::<Vec<_>>(), "{}", r.body);
    data
}

/// Every block of a stream opens, takes deltas and closes in index order, one at a time;
/// returns each block's start and its deltas.
fn blocks(ev: &[Value]) -> Vec<(Value, Vec<Value>)> {
    assert_eq!(ev[0]["type"], "message_start");
    assert_eq!(ev[ev.len() - 2]["type"], "message_delta");
    assert_eq!(ev[ev.len() - 1]["type"], "message_stop");
    let mut out: Vec<(Value, Vec<Value>)> = vec![];
    let mut open = false;
    for e in &ev[1..ev.len() - 2] {
        let index = e["index"].as_u64().unwrap() as usize;
        match e["type"].as_str().unwrap() {
            "content_block_start" => {
                assert!(!open && index == out.len(), "{e}");
                out.push((e["content_block"].clone(), vec![]));
                open = true;
            }
            "content_block_delta" => {
                assert!(open && index + 1 == out.len(), "{e}");
                out[index].1.push(e["delta"].clone());
            }
            "content_block_stop" => {
                assert!(open && index + 1 == out.len(), "{e}");
                open = false;
            }
            t => panic!("unexpected event {t}"),
        }
    }
    assert!(!open);
    out
}

/// A text answer is the chat endpoint's, in Anthropic's shape, whole and streamed; its stop
/// reason and usage agree; `count_tokens` counts its prompt; a stop sequence ends it by name.
#[test]
fn messages_answer_as_the_chat_endpoint_does() {
    let srv = start(1, 16, None);
    let chat = post(&srv, "/v1/chat/completions", as_chat("What is the capital of France?", 24)).json();
    let text = chat["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let reason = if chat["choices"][0]["finish_reason"] == "length" { "max_tokens" } else { "end_turn" };
    let body = message("What is the capital of France?", 24);
    let v = post(&srv, "/v1/messages", body.clone()).json();
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!((&v["type"], &v["role"], &v["model"]), (&json!("message"), &json!("assistant"), &json!(MODEL)), "{v}");
    assert_eq!(v["content"], json!([{"type": "text", "text": text}]), "{v}");
    assert_eq!((v["stop_reason"].as_str(), &v["stop_sequence"]), (Some(reason), &Value::Null), "{v}");
    let u = &v["usage"];
    let input = u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input, chat["usage"]["prompt_tokens"].as_u64().unwrap(), "{v}");
    assert!(u["cache_read_input_tokens"].as_u64().unwrap() > 0, "the chat request's prompt was cached: {v}");
    assert_eq!(u["output_tokens"], chat["usage"]["completion_tokens"], "{v}");
    let counted = post(&srv, "/v1/messages/count_tokens", body.clone()).json();
    assert_eq!(counted, json!({"input_tokens": input}));
    let oai = post(&srv, "/v1/chat/completions/input_tokens", as_chat("What is the capital of France?", 24)).json();
    assert_eq!(oai["input_tokens"].as_u64(), Some(input));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let ev = events(&post(&srv, "/v1/messages", streamed));
    let start = &ev[0]["message"];
    assert_eq!((&start["id"].as_str().unwrap()[..4], &start["content"], start["usage"]["input_tokens"].as_u64()), ("msg_", &json!([]), Some(input)), "{start}");
    let b = blocks(&ev);
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].0, json!({"type": "text", "text": ""}));
    assert!(b[0].1.len() > 1 && b[0].1.iter().all(|d| d["type"] == "text_delta"), "{:?}", b[0].1);
    assert_eq!(b[0].1.iter().map(|d| d["text"].as_str().unwrap()).collect::<String>(), text);
    let end = &ev[ev.len() - 2];
    assert_eq!(end["delta"], json!({"stop_reason": reason, "stop_sequence": null}));
    assert_eq!(end["usage"]["output_tokens"], chat["usage"]["completion_tokens"]);

    // A stop sequence: the text before it, and which one ended it.
    let word = text.split_whitespace().nth(2).unwrap().to_string();
    let mut stopped = body;
    stopped["stop_sequences"] = json!(["never in this answer", word]);
    let v = post(&srv, "/v1/messages", stopped.clone()).json();
    assert_eq!(v["content"][0]["text"].as_str(), Some(&text[..text.find(&word).unwrap()]), "{v}");
    assert_eq!((&v["stop_reason"], v["stop_sequence"].as_str()), (&json!("stop_sequence"), Some(word.as_str())), "{v}");
    stopped["stream"] = json!(true);
    let ev = events(&post(&srv, "/v1/messages", stopped));
    assert_eq!(ev[ev.len() - 2]["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": word}));
}

/// A forced call is a `tool_use` block whose `input` fits the tool's schema, streamed as
/// `input_json_delta` pieces; its `tool_result` goes back as a `tool` turn and gets an answer.
#[test]
fn tool_use_both_ways() {
    let srv = start(1, 16, None);
    let tools = json!([
        {"name": "get_weather", "description": "Current weather in a city",
         "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}},
        {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}
    ]);
    let mut body = message("What will the weather be in Paris this week?", 60);
    body["tools"] = tools.clone();
    for choice in [json!({"type": "any"}), json!({"type": "tool", "name": "get_weather"})] {
        body["tool_choice"] = choice.clone();
        let v = post(&srv, "/v1/messages", body.clone()).json();
        assert_eq!(v["stop_reason"], "tool_use", "{choice}: {v}");
        let calls: Vec<&Value> = v["content"].as_array().unwrap().iter().filter(|b| b["type"] == "tool_use").collect();
        assert_eq!(calls.len(), 1, "{v}");
        let call = calls[0];
        assert!(call["id"].as_str().unwrap().starts_with("toolu_") && call["name"] == "get_weather", "{v}");
        let input = &call["input"];
        assert!(input["city"].as_str().is_some_and(|c| c.chars().count() <= 20) && (1..=7).contains(&input["days"].as_i64().unwrap()), "{input}");

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let ev = events(&post(&srv, "/v1/messages", streamed));
        let b = blocks(&ev);
        let (start, deltas) = b.iter().find(|(s, _)| s["type"] == "tool_use").unwrap();
        assert!(start["id"].as_str().unwrap().starts_with("toolu_"), "{start}");
        assert_eq!((&start["name"], &start["input"]), (&call["name"], &json!({})));
        assert!(deltas.len() > 1 && deltas.iter().all(|d| d["type"] == "input_json_delta"), "{deltas:?}");
        let joined: String = deltas.iter().map(|d| d["partial_json"].as_str().unwrap()).collect();
        assert_eq!(&serde_json::from_str::<Value>(&joined).unwrap(), input);
        assert_eq!(ev[ev.len() - 2]["delta"]["stop_reason"], "tool_use");
    }
    // The call and its result sent back: an answer in text.
    let v = post(&srv, "/v1/messages", {
        let mut b = body.clone();
        b["tool_choice"] = json!({"type": "tool", "name": "get_weather"});
        b
    })
    .json();
    let call = v["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").unwrap().clone();
    let mut next = body;
    next.as_object_mut().unwrap().remove("tool_choice");
    next["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": [call.clone()]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "Sunny, 24 °C all week."}]}]}),
    ]);
    let v = post(&srv, "/v1/messages", next).json();
    assert!(matches!(v["stop_reason"].as_str(), Some("end_turn" | "max_tokens" | "tool_use")), "{v}");
    assert!(!v["content"].as_array().unwrap().is_empty(), "{v}");
}

/// Bad requests get Anthropic's error body naming the problem; `x-api-key` is a key.
#[test]
fn errors_in_anthropics_shape_and_its_key_header() {
    let srv = start(1, 4, Some("sekret"));
    let send = |body: Value, key: &str| srv._rt.block_on(call(srv.addr, "POST", "/v1/messages", &body.to_string(), &format!("x-api-key: {key}\r\n")));
    let r = send(message("Hi", 4), "wrong");
    assert_eq!((r.status, &r.json()["error"]["type"]), (401, &json!("authentication_error")), "{}", r.body);
    let r = send(message("Hi", 4), "sekret");
    assert_eq!(r.status, 200, "{}", r.body);
    for (body, status, kind, says) in [
        (json!({"model": MODEL, "max_tokens": 4}), 400, "invalid_request_error", "messages"),
        (json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]}), 400, "invalid_request_error", "messages[0].content[0]"),
        ({
            let mut m = message("Hi", 4);
            m["model"] = json!("claude-sonnet-4-5");
            m
        }, 404, "not_found_error", "claude-sonnet-4-5"),
        ({
            let mut m = message("Hi", 4);
            m["temperature"] = json!(3.5);
            m
        }, 400, "invalid_request_error", "temperature"),
    ] {
        let r = send(body, "sekret");
        let v = r.json();
        assert_eq!((r.status, &v["type"], &v["error"]["type"]), (status, &json!("error"), &json!(kind)), "{}", r.body);
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{}", r.body);
    }
}

/// A last assistant message is a prefill: the answer goes on from its text (the chat endpoint
/// and the Messages one alike), as the plain completion of the rendered prompt and that text.
#[test]
fn an_assistant_prefill_is_continued() {
    let srv = start(1, 16, None);
    let prefill = "The capital of France is";
    let rendered = post(&srv, "/apply-template", as_chat("Tell me about France.", 12)).json()["prompt"].as_str().unwrap().to_string();
    let plain = post(&srv, "/completion", json!({"prompt": format!("{rendered}{prefill}"), "n_predict": 12, "temperature": 0})).json();
    let want = plain["content"].as_str().unwrap();
    assert!(want.contains("Paris"), "{plain}");
    let mut chat = as_chat("Tell me about France.", 12);
    chat["messages"].as_array_mut().unwrap().push(json!({"role": "assistant", "content": prefill}));
    let v = post(&srv, "/v1/chat/completions", chat).json();
    assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(want), "{v}");
    let mut msg = message("Tell me about France.", 12);
    msg["messages"].as_array_mut().unwrap().push(json!({"role": "assistant", "content": [{"type": "text", "text": prefill}]}));
    let v = post(&srv, "/v1/messages", msg).json();
    assert_eq!(v["content"][0]["text"].as_str(), Some(want), "{v}");
}
