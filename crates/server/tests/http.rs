//! The server over real HTTP on a real model (SmolLM2): answers, streams, errors, admission,
//! batching invariance and cancellation on disconnect. The client is a minimal HTTP/1.1 one
//! over a TCP socket, so a test can also hang up mid-stream.

mod common;

use common::*;
use corelm_engine::{Engine, EngineConfig, Tokenizer};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[test]
fn chat_completions_json_and_stream_agree() {
    let srv = start(2, 16, None);
    let r = post(&srv, "/v1/chat/completions", chat("What is the capital of France?", 12, false));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    assert_eq!(v["object"], "chat.completion");
    let usage = &v["usage"];
    assert_eq!(usage["total_tokens"], usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap());

    // The same request streamed: same text, chunks then usage then [DONE].
    let r = post(&srv, "/v1/chat/completions", chat("What is the capital of France?", 12, true));
    assert_eq!(r.status, 200);
    assert!(r.headers.contains("text/event-stream"), "{}", r.headers);
    let ev = r.events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, text);
    let fin = chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str()).unwrap();
    assert_eq!(fin, v["choices"][0]["finish_reason"].as_str().unwrap());
    let u = &chunks.last().unwrap()["usage"];
    assert_eq!(u["completion_tokens"], usage["completion_tokens"]);
    // The repeated prompt was served from the prefix cache.
    assert!(u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() >= 16, "{u}");

    // Text completions with logprobs.
    let r = post(&srv, "/v1/completions", json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "logprobs": 3}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // `logit_bias`: the greedy first token (" Paris", id 7042 in SmolLM2's vocabulary) banned
    // at −100 gives way to another; lifted by +100, a token the model did not favour comes.
    assert_eq!(lp["tokens"][0], " Paris");
    let biased = |bias: Value| {
        let r = post(&srv, "/v1/completions", json!({"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0, "logit_bias": bias}));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    assert_ne!(biased(json!({"7042": -100})), " Paris");
    assert_eq!(biased(json!({"7042": -100, "19": 100})), biased(json!({"19": 100})), "token 19 wins either way");
    assert_ne!(biased(json!({"19": 100})), " Paris");

    // Models, health, metrics.
    let m = get(&srv, "/v1/models").json();
    assert_eq!(m["data"][0]["id"], MODEL);
    assert_eq!(get(&srv, &format!("/v1/models/{MODEL}")).json()["id"], MODEL);
    assert_eq!(get(&srv, "/v1/models/gpt-4o").status, 404);
    assert_eq!(get(&srv, "/health").json()["status"], "ok");
    // llama.cpp's /tokenize and /detokenize: the text back, pieces as text.
    let t = post(&srv, "/tokenize", json!({"content": "The capital of France is Paris"})).json();
    let ids = t["tokens"].as_array().unwrap().clone();
    assert_eq!(ids[ids.len() - 1], json!(7042), "{t}");
    assert_eq!(post(&srv, "/detokenize", json!({"tokens": ids})).json()["content"], "The capital of France is Paris");
    let p = post(&srv, "/tokenize", json!({"content": " Paris", "with_pieces": true})).json();
    assert_eq!(p["tokens"], json!([{"id": 7042, "piece": " Paris"}]));
    let r = post(&srv, "/detokenize", json!({"tokens": [1, 99999999]}));
    assert!(r.status == 400 && r.body.contains("outside the vocabulary"), "{}", r.body);
    assert_eq!(post(&srv, "/tokenize", json!({"text": "x"})).status, 400);
    assert!(metric(&srv, "corelm_generated_tokens_total") >= 28.0);
    assert!(metric(&srv, "corelm_ttft_seconds_count") >= 3.0);
    assert_eq!(metric(&srv, "corelm_sequences_running"), 0.0);
    assert!(metric(&srv, "corelm_kv_blocks_cached") > 0.0);
    let body = get(&srv, "/metrics").body;
    assert!(body.contains("corelm_requests_total{endpoint=\"chat_completions\",status=\"200\"} 2"), "{body}");
}

/// Whether `text` is a JSON object (`Some(true)`), the prefix of one (`Some(false)`), or neither.
fn json_object_prefix(text: &str) -> Option<bool> {
    json_prefix(&corelm_engine::json::Schema::object(), text)
}

/// Whether `text` is a JSON value of `schema` (`Some(true)`), the prefix of one (`Some(false)`),
/// or neither.
fn json_prefix(schema: &corelm_engine::json::Schema, text: &str) -> Option<bool> {
    let mut st = corelm_engine::json::JsonState::new(schema);
    st.feed_all(schema, text.as_bytes()).then(|| st.is_complete())
}

#[test]
fn json_mode_answers_json_objects() {
    let srv = start(2, 16, None);
    // Greedy: SmolLM2 closes its object well before the limit, and the answer stops there.
    let mut body = chat("Give me a JSON object describing a cat with name and age.", 160, false);
    body["response_format"] = json!({"type": "json_object"});
    let r = post(&srv, "/v1/chat/completions", body.clone());
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{text}");
    let obj: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(obj.as_object().is_some_and(|o| !o.is_empty()), "{text}");
    // Streamed, the same text.
    body["stream"] = json!(true);
    let ev = post(&srv, "/v1/chat/completions", body).events();
    let streamed: String = ev[..ev.len() - 1]
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok()?["choices"][0]["delta"]["content"].as_str().map(String::from))
        .collect();
    assert_eq!(streamed, text);
    // Sampled at a high temperature, from prompts that do not ask for JSON: every answer is a
    // JSON object, or the prefix of one where max_tokens cut it.
    for (seed, prompt) in [(1, "Write a poem."), (2, "What is 2 + 2?"), (3, "Tell me about the sea."), (4, "List three colours.")] {
        let body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "temperature": 1.5, "top_k": 0,
                          "top_p": 1.0, "min_p": 0.0, "seed": seed, "response_format": {"type": "json_object"}});
        let v = post(&srv, "/v1/chat/completions", body).json();
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        let done = json_object_prefix(text).unwrap_or_else(|| panic!("not JSON: {text:?}"));
        assert_eq!(v["choices"][0]["finish_reason"], if done { "stop" } else { "length" }, "{text:?}");
        if done {
            assert!(serde_json::from_str::<Value>(text).is_ok_and(|o| o.is_object()), "{text:?}");
        }
    }
    // Without it, the same greedy request answers in prose.
    let v = post(&srv, "/v1/chat/completions", chat("What is the capital of France?", 12, false)).json();
    assert_eq!(json_object_prefix(v["choices"][0]["message"]["content"].as_str().unwrap()), None);

    // A JSON Schema (as the `openai` client sends a pydantic model): the greedy answer has
    // exactly the properties, in order, of their types and bounds; sampled answers are values of the
    // schema or, cut by max_tokens, prefixes of one.
    let schema = json!({"title": "Cat", "type": "object", "additionalProperties": false, "required": ["name", "age", "colour", "indoor", "chip"],
        "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 30}, "colour": {"enum": ["black", "white", "ginger", "grey"]}, "indoor": {"type": "boolean"},
                       "chip": {"type": "string", "pattern": "^[A-F0-9]{6}$"}}});
    let compiled = corelm_engine::json::Schema::compile(&schema).unwrap();
    let mut body = chat("Give me a JSON object describing a cat.", 112, false);
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "Cat", "strict": true, "schema": schema}});
    let v = post(&srv, "/v1/chat/completions", body.clone()).json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{text}");
    let cat: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(cat.as_object().unwrap().keys().collect::<Vec<_>>(), ["name", "age", "colour", "indoor", "chip"], "{text}");
    let chip = cat["chip"].as_str().unwrap();
    assert!(chip.len() == 6 && chip.bytes().all(|b| matches!(b, b'A'..=b'F' | b'0'..=b'9')), "pattern: {text}");
    assert!(cat["name"].is_string() && cat["age"].is_i64() && cat["indoor"].is_boolean(), "{text}");
    assert!((1..=10).contains(&cat["name"].as_str().unwrap().chars().count()) && (0..=30).contains(&cat["age"].as_i64().unwrap()), "bounds: {text}");
    assert!(["black", "white", "ginger", "grey"].contains(&cat["colour"].as_str().unwrap()), "{text}");
    for seed in 1..=4 {
        body["temperature"] = json!(1.5);
        body["seed"] = json!(seed);
        body["max_tokens"] = json!(40);
        let v = post(&srv, "/v1/chat/completions", body.clone()).json();
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        let done = json_prefix(&compiled, text).unwrap_or_else(|| panic!("not of the schema: {text:?}"));
        assert_eq!(v["choices"][0]["finish_reason"], if done { "stop" } else { "length" }, "{text:?}");
    }
}

/// `body` streamed: the answer's one call `call` as OpenAI streams one — a `delta.tool_calls`
/// with its id, type and name, then its arguments in pieces (more than one: they go out as
/// written) that join to the same value — and no content.
fn streams_the_call(srv: &Server, mut body: Value, call: &Value) {
    body["stream"] = json!(true);
    let ev = post(srv, "/v1/chat/completions", body).events();
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let streamed: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    assert!(streamed.len() > 2, "{streamed:?}");
    assert!(streamed.iter().all(|d| d["index"] == 0), "{streamed:?}");
    assert!(streamed[0]["id"].as_str().is_some_and(|id| id.starts_with("call_") && id.ends_with("_0")), "{}", streamed[0]);
    assert_eq!((&streamed[0]["type"], &streamed[0]["function"]["name"]), (&call["type"], &call["function"]["name"]));
    assert!(streamed[1..].iter().all(|d| d.get("id").is_none() && d["function"].get("name").is_none()), "{streamed:?}");
    let args: String = streamed.iter().map(|d| d["function"]["arguments"].as_str().unwrap()).collect();
    let value = |s: &str| serde_json::from_str::<Value>(s).unwrap_or_else(|e| panic!("{s}: {e}"));
    assert_eq!(value(&args), value(call["function"]["arguments"].as_str().unwrap()));
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"]["content"].as_str().is_none_or(str::is_empty)), "no content chunks");
    assert_eq!(chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str()), Some("tool_calls"));
}

/// Tools: a forced call is a call of the named tool whose arguments are a value of its
/// parameters, the same streamed as one `delta.tool_calls`; an `auto` answer in prose is
/// content, streamed as it comes.
#[test]
fn tool_calls_are_held_to_their_tools_and_read_back() {
    let srv = start(1, 16, None);
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
    ]);
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "get_weather"}})] {
        let mut body = chat("What will the weather be in Paris this week?", 60, false);
        body["tools"] = tools.clone();
        body["tool_choice"] = choice.clone();
        let v = post(&srv, "/v1/chat/completions", body.clone()).json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{choice}: {v}");
        assert!(c["message"]["content"].is_null(), "{v}");
        let call = &c["message"]["tool_calls"][0];
        assert_eq!((call["type"].as_str(), call["function"]["name"].as_str()), (Some("function"), Some("get_weather")), "{v}");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 20) && (1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");
        streams_the_call(&srv, body, call);
    }
    // `auto` on a question SmolLM2 answers in prose: content, the same streamed.
    let mut body = chat("Say hello.", 12, false);
    body["tools"] = tools;
    let v = post(&srv, "/v1/chat/completions", body.clone()).json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{v}")).to_string();
    assert!(v["choices"][0]["message"]["tool_calls"].is_null(), "{v}");
    body["stream"] = json!(true);
    let ev = post(&srv, "/v1/chat/completions", body).events();
    let streamed: String = ev[..ev.len() - 1].iter().filter_map(|e| serde_json::from_str::<Value>(e).ok()?["choices"][0]["delta"]["content"].as_str().map(String::from)).collect();
    assert_eq!(streamed, text);
}

/// `auto` on Qwen2.5-Coder, which writes its calls in a code fence: each call is held to the
/// tools' schemas from where it starts (an enum the model would not pick unheld, a pattern),
/// read back as a call, the same streamed; prose stays content.
#[test]
fn auto_tool_calls_are_held_where_they_start() {
    let srv = start_model("qwen2.5-coder-0.5b-instruct-awq-q4_k_m", 1, 16, None, 1);
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather at an airport",
            "parameters": {"type": "object", "properties": {"airport": {"type": "string", "pattern": "^[A-Z]{3}$"}, "unit": {"enum": ["kelvin", "rankine"]}}, "required": ["airport", "unit"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
    ]);
    let qwen = |q: &str, n: usize| {
        let mut b = chat(q, n, false);
        b.as_object_mut().unwrap().remove("model");
        b
    };
    let mut body = qwen("What's the weather at Oslo airport?", 80);
    body["tools"] = tools.clone();
    let v = post(&srv, "/v1/chat/completions", body.clone()).json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let airport = args["airport"].as_str().unwrap();
    assert!(airport.len() == 3 && airport.chars().all(|c| c.is_ascii_uppercase()), "{args}");
    assert!(["kelvin", "rankine"].contains(&args["unit"].as_str().unwrap()), "{args}");
    streams_the_call(&srv, body, call);

    let mut body = qwen("Write a haiku about rain.", 30);
    body["tools"] = tools;
    let v = post(&srv, "/v1/chat/completions", body).json();
    assert!(v["choices"][0]["message"]["content"].as_str().is_some_and(|t| t.contains("Rain")), "{v}");
    assert!(v["choices"][0]["message"]["tool_calls"].is_null(), "{v}");
}

#[test]
fn bad_requests_get_openai_errors_naming_the_problem() {
    let srv = start(1, 16, None);
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "five"}), 400, "max_tokens"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"x": 1}}), 400, "logit_bias"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 101}}), 400, "logit_bias"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"4000000": 1}}), 400, "logit_bias"),
        (json!({"messages": [{"role": "user", "content": 5}]}), 400, "messages[0].content"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "a b"}}]}), 400, "tools[0]"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}), 400, "tool_choice"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}), 400, "tool_choice"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}], "logprobs": true}), 400, "logprobs"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "format": "x"}}}}}], "tool_choice": "required"}), 400, "the format \"x\""),
        (json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}), 400, "messages[0].tool_calls[0].function.arguments"),
        (json!({"messages": [{"role": "wizard", "content": "hi"}]}), 400, "messages[0].role"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 9}), 400, "temperature"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "n": 0}), 400, "n"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "n": 65}), 400, "n"),
        // More choices than the queue (16 here) would ever hold.
        (json!({"messages": [{"role": "user", "content": "hi"}], "n": 17}), 400, "n"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4o"}), 404, "model"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}), 400, "messages"),
        (json!({"model": MODEL}), 400, "messages"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {}}}), 400, "response_format"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}}), 400, "response_format"),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
                {"type": "object", "properties": {"id": {"type": "string", "pattern": "^(?=[a-z])"}}}}}}),
            400,
            "look-around",
        ),
    ];
    for (body, status, param) in cases {
        let r = post(&srv, "/v1/chat/completions", body.clone());
        assert_eq!(r.status, status, "{body} -> {}", r.body);
        let e = r.json();
        assert!(e["error"]["message"].as_str().unwrap().contains(param) || e["error"]["param"] == param, "{body} -> {e}");
    }
    // Fill in the middle: SmolLM2 has no FIM tokens; a suffix takes one prompt text.
    let r = post(&srv, "/infill", json!({"input_prefix": "a", "input_suffix": "b"}));
    assert!(r.status == 400 && r.body.contains("no fill-in-the-middle tokens"), "{}", r.body);
    let r = post(&srv, "/infill", json!({"input_prefix": "a"}));
    assert!(r.status == 400 && r.body.contains("input_suffix"), "{}", r.body);
    for (body, says) in [(json!({"prompt": "def f(", "suffix": "):"}), "no fill-in-the-middle tokens"), (json!({"prompt": ["a", "b"], "suffix": "c"}), "one prompt")] {
        let r = post(&srv, "/v1/completions", body.clone());
        assert_eq!(r.status, 400, "{body} -> {}", r.body);
        assert!(r.json()["error"]["message"].as_str().unwrap().contains(says) && r.json()["error"]["param"] == "suffix", "{body} -> {}", r.body);
    }
    let r = post(&srv, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}));
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    let r = srv._rt.block_on(call(srv.addr, "POST", "/v1/completions", "{\"prompt\": ", ""));
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("malformed JSON"));
    let r = post(&srv, "/v1/completions", json!({"prompt": [1, 2, 999999]}));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("999999"), "{}", r.body);
    assert_eq!(get(&srv, "/v1/nothing").status, 404);
    // The server is unharmed.
    assert_eq!(post(&srv, "/v1/completions", json!({"prompt": "Hi", "max_tokens": 2})).status, 200);
}

/// `n` choices and several prompts: one engine request each, `index` in order, choice `i`
/// sampled with seed `seed + i`; a stream interleaves the choices' chunks; usage counts each
/// prompt once.
#[test]
fn several_choices_and_prompts_answer_in_order() {
    let srv = start(4, 64, None);
    let ask = |n: u64, seed: u64, stream: bool| {
        let body = json!({"messages": [{"role": "user", "content": "Name a colour and a fruit."}], "max_tokens": 8, "temperature": 1.0,
                          "seed": seed, "n": n, "stream": stream, "stream_options": {"include_usage": true}});
        let r = post(&srv, "/v1/chat/completions", body);
        assert_eq!(r.status, 200, "{}", r.body);
        r
    };
    let v = ask(3, 5, false).json();
    let texts: Vec<String> = (0..3).map(|i| {
        assert_eq!(v["choices"][i]["index"], i);
        v["choices"][i]["message"]["content"].as_str().unwrap().to_string()
    }).collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "three seeds, one text: {texts:?}");
    // Choice i is the one-choice answer with seed 5 + i.
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(&ask(1, 5 + i as u64, false).json()["choices"][0]["message"]["content"], t, "choice {i}");
    }
    let one = ask(1, 5, false).json();
    assert_eq!(v["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"], "the prompt counted once");
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((3..=24).contains(&completion), "{}", v["usage"]);
    // Streamed: each choice's deltas, gathered by index, are its text; one finish each.
    let ev = ask(3, 5, true).events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    for (i, t) in texts.iter().enumerate() {
        let mine: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"].as_array()?.first().filter(|c| c["index"] == i)).collect();
        let streamed: String = mine.iter().filter_map(|c| c["delta"]["content"].as_str()).collect();
        assert_eq!(&streamed, t, "choice {i} streamed");
        assert_eq!(mine.iter().filter(|c| !c["finish_reason"].is_null()).count(), 1, "choice {i}'s finish");
    }
    let u = &chunks.last().unwrap()["usage"];
    assert_eq!((&u["prompt_tokens"], &u["completion_tokens"]), (&v["usage"]["prompt_tokens"], &v["usage"]["completion_tokens"]));

    // Two prompts (as texts, then as token lists) × n = 2, greedy: choices 2p and 2p + 1 are
    // prompt p's, each the one-prompt answer.
    let alone = |p: &str| post(&srv, "/v1/completions", json!({"prompt": p, "max_tokens": 3, "temperature": 0})).json();
    let (a, b) = (alone("The capital of France is"), alone("One, two, three,"));
    let r = post(&srv, "/v1/completions", json!({"prompt": ["The capital of France is", "One, two, three,"], "n": 2, "max_tokens": 3, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = |i: usize| v["choices"][i]["text"].clone();
    assert_eq!([text(0), text(1), text(2), text(3)], [a["choices"][0]["text"].clone(), a["choices"][0]["text"].clone(), b["choices"][0]["text"].clone(), b["choices"][0]["text"].clone()]);
    let prompts = a["usage"]["prompt_tokens"].as_u64().unwrap() + b["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], prompts);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    let ids = |p: &str| post(&srv, "/tokenize", json!({"content": p, "add_special": true})).json()["tokens"].clone();
    let r = post(&srv, "/v1/completions", json!({"prompt": [ids("The capital of France is"), ids("One, two, three,")], "max_tokens": 3, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][1]["text"], b["choices"][0]["text"]);
    let r = post(&srv, "/v1/completions", json!({"prompt": ["fine", ""], "max_tokens": 3}));
    assert!(r.status == 400 && r.json()["error"]["param"] == "prompt[1]", "{}", r.body);
}

#[test]
fn embeddings_equal_the_engine_alone_beside_a_running_chat() {
    use base64::Engine as _;
    let texts = ["The cat sat on the mat.", "A kitten was sitting on the rug, purring softly.", "Stock markets fell."];
    // Each text alone on an engine of the server's settings, normalized as the server does.
    let path = corelm_engine::models_dir().join(format!("{MODEL}.gguf"));
    let cfg = EngineConfig { n_ctx: 2048, n_batch: 64, n_seq_max: 2, n_threads: 2, pin: false, batch_invariant: true, ..Default::default() };
    let mut engine = Engine::load(&path, cfg).unwrap();
    let tok = Tokenizer::from_gguf(engine.gguf()).unwrap();
    let alone: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| {
            let mut v = engine.embed(0, &tok.encode(t, true, true).unwrap(), corelm_engine::embed::Pooling::Mean).unwrap();
            corelm_engine::embed::normalize(&mut v);
            v
        })
        .collect();
    drop(engine);
    // A chat holds one of the two sequences while the three inputs take turns on the other.
    let srv = start(2, 8, None);
    let embed = json!({"model": MODEL, "input": texts}).to_string();
    let story = chat("Tell me a long story about the sea.", 48, false).to_string();
    let (c, e) = srv._rt.block_on(async {
        let c = call(srv.addr, "POST", "/v1/chat/completions", &story, "");
        let e = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            call(srv.addr, "POST", "/v1/embeddings", &embed, "").await
        };
        tokio::join!(c, e)
    });
    assert_eq!((c.status, e.status), (200, 200), "{} {}", c.body, e.body);
    let v = e.json();
    let got: Vec<Vec<f32>> = (0..3)
        .map(|i| {
            assert_eq!(v["data"][i]["index"], i);
            v["data"][i]["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
        })
        .collect();
    assert!(got == alone, "vectors over HTTP differ from each text alone");
    let n: usize = texts.iter().map(|t| tok.encode(t, true, true).unwrap().len()).sum();
    assert_eq!((v["usage"]["prompt_tokens"].as_u64(), v["object"].as_str()), (Some(n as u64), Some("list")));
    // base64: the same f32 values, little-endian.
    let r = post(&srv, "/v1/embeddings", json!({"input": texts[1], "encoding_format": "base64"}));
    let bytes = base64::engine::general_purpose::STANDARD.decode(r.json()["data"][0]["embedding"].as_str().unwrap()).unwrap();
    let floats: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert!(floats == alone[1], "base64 vector differs");
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": ["fine", ""]}), "input[1]"),
        (json!({"input": [[1, 2], [49152]]}), "input[1]"),
        (json!({"input": "x", "dimensions": 64}), "dimensions"),
        (json!({"input": "x", "encoding_format": "int8"}), "encoding_format"),
    ] {
        let r = post(&srv, "/v1/embeddings", body.clone());
        assert!(r.status == 400 && r.json()["error"]["param"] == param, "{body}: {}", r.body);
    }
    let long = vec![1; 1025];
    let r = post(&srv, "/v1/embeddings", json!({"input": long}));
    assert!(r.status == 400 && r.json()["error"]["code"] == "context_length_exceeded", "{}", r.body);
    assert_eq!(metric(&srv, "corelm_kv_blocks_used"), 0.0, "every lane released its blocks");
}

#[test]
fn api_key_is_required_when_set() {
    let srv = start(1, 4, Some("sekret"));
    assert_eq!(get(&srv, "/v1/models").status, 401);
    let r = srv._rt.block_on(call(srv.addr, "GET", "/v1/models", "", "authorization: Bearer wrong\r\n"));
    assert_eq!(r.status, 401);
    let r = srv._rt.block_on(call(srv.addr, "GET", "/v1/models", "", "authorization: Bearer sekret\r\n"));
    assert_eq!(r.status, 200);
    assert_eq!(get(&srv, "/health").status, 200);
}

#[test]
fn full_queue_answers_429_with_retry_after() {
    let srv = start(1, 1, None);
    let long = "Tell me a long story about the sea and its ships. ".repeat(40);
    let addr = srv.addr;
    let first = srv._rt.spawn(async move {
        let body = json!({"prompt": long, "max_tokens": 4, "temperature": 0}).to_string();
        call(addr, "POST", "/v1/completions", &body, "").await
    });
    // Wait until the long request is accepted and still without its first token.
    let t0 = Instant::now();
    while metric(&srv, "corelm_queue_depth") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the first request never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = post(&srv, "/v1/completions", json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.headers.contains("retry-after: 1"), "{}", r.headers);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert_eq!(srv._rt.block_on(first).unwrap().status, 200);
    assert_eq!(post(&srv, "/v1/completions", json!({"prompt": "Hi", "max_tokens": 2})).status, 200);
}

#[test]
fn sixteen_concurrent_requests_equal_each_alone_over_http() {
    // Without tensor parallelism and with two shards.
    for tp in [1, 2] {
        sixteen_concurrent(start_tp(4, 64, None, tp), tp);
    }
}

fn sixteen_concurrent(srv: Server, tp: usize) {
    let topics = ["the sea", "robots", "bread", "winter", "chess", "the moon", "rivers", "music"];
    let bodies: Vec<String> = (0..16)
        .map(|i| chat(&format!("Write one sentence about {} (#{i}).", topics[i % 8]), 16, false).to_string())
        .collect();
    let text = |r: &Reply| r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let alone: Vec<String> =
        bodies.iter().map(|b| text(&srv._rt.block_on(call(srv.addr, "POST", "/v1/chat/completions", b, "")))).collect();
    let addr = srv.addr;
    let together: Vec<String> = srv._rt.block_on(async {
        let hs: Vec<_> = bodies
            .iter()
            .cloned()
            .map(|b| tokio::spawn(async move { call(addr, "POST", "/v1/chat/completions", &b, "").await }))
            .collect();
        let mut out = vec![];
        for h in hs {
            out.push(text(&h.await.unwrap()));
        }
        out
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "--tp {tp}: request {i} differs when run with 15 others");
    }
}

#[test]
fn a_client_that_hangs_up_cancels_its_sequence() {
    let srv = start(1, 4, None);
    let body = json!({"prompt": "Count slowly:", "max_tokens": 800, "ignore_eos": true, "stream": true}).to_string();
    srv._rt.block_on(async {
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(request("POST", "/v1/completions", &body, "").as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut seen = String::new();
        while !seen.contains("data: ") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0);
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        drop(s); // hang up mid-stream
    });
    let t0 = Instant::now();
    while metric(&srv, "corelm_requests_cancelled_total") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "the sequence was not cancelled");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(metric(&srv, "corelm_generated_tokens_total") < 800.0);
    assert_eq!(metric(&srv, "corelm_kv_blocks_used"), 0.0);
    assert_eq!(metric(&srv, "corelm_sequences_running"), 0.0);
}

/// Fill in the middle on Qwen2.5-Coder: `/v1/completions`' `suffix` writes llama.cpp's middle
/// (the engine's infill test has it); llama.cpp's `/infill` takes files of context and answers
/// in llama.cpp's format, streamed as the same text.
#[test]
fn fill_in_the_middle_on_qwen_coder() {
    let srv = start_model("qwen2.5-coder-0.5b-instruct-awq-q4_k_m", 1, 4, None, 1);
    let v = post(&srv, "/v1/completions", json!({"prompt": "def fib(n):\n    ", "suffix": "\n\nprint(fib(10))\n", "max_tokens": 64, "temperature": 0})).json();
    assert_eq!(v["choices"][0]["text"], "if n <= 1:\n        return n\n    else:\n        return fib(n-1) + fib(n-2)\n\nprint(fib(10))\n", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 16, "[PRE] 5 tokens [SUF] 8 tokens [MID]");
    // As llama.vim sends it (fields it alone knows are ignored): its chain, top-k, top-p and
    // the infill cut, has no temperature, so it draws at 1 (seeded here) and may end early.
    let body = json!({"input_prefix": "def fib(n):\n    ", "input_suffix": "\n\nprint(fib(10))\n", "input_extra": [{"filename": "util.py", "text": "def helper():\n    pass\n"}],
        "prompt": "", "n_predict": 12, "temperature": 0, "samplers": ["top_k", "top_p", "infill"], "n_indent": 4, "cache_prompt": true, "seed": 1});
    let v = post(&srv, "/infill", body.clone()).json();
    let content = v["content"].as_str().unwrap().to_string();
    let ended = (v["stop_type"] == "limit" && v["tokens_predicted"] == 12) || (v["stop_type"] == "eos" && v["tokens_predicted"].as_u64() < Some(12));
    assert!(!content.is_empty() && v["stop"] == true && ended, "{v}");
    assert_eq!(v["tokens_evaluated"], 33, "the repository layout: 17 tokens of files before the 16: {v}");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let r = post(&srv, "/infill", streamed);
    let events: Vec<Value> = r.events().iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = events.iter().map(|e| e["content"].as_str().unwrap()).collect();
    assert_eq!(text, content, "{}", r.body);
    assert!(events[..events.len() - 1].iter().all(|e| e["stop"] == false) && events.last().unwrap()["stop"] == true, "{}", r.body);
    assert!(!r.body.contains("[DONE]"));
    // `response_fields` cuts the answer to those paths, each its own key (llama.vim asks so).
    let mut body = json!({"input_prefix": "def fib(n):\n    ", "input_suffix": "\n", "n_predict": 2, "temperature": 0});
    body["response_fields"] = json!(["content", "timings/prompt_n", "nothing/here"]);
    let v = post(&srv, "/infill", body).json();
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["content", "timings/prompt_n"], "{v}");
}

/// llama.cpp's `/completion`: a text or token ids, `n_predict`, answered in llama.cpp's format
/// (the stream the same text, ending in a chunk with `stop: true`).
#[test]
fn llama_cpp_completion_endpoint() {
    let srv = start(1, 4, None);
    let body = json!({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0});
    let v = post(&srv, "/completion", body.clone()).json();
    let content = v["content"].as_str().unwrap().to_string();
    assert!(content.contains("Paris") && v["stop"] == true && v["stop_type"] == "limit" && v["tokens_predicted"] == 8 && v["tokens_evaluated"] == 5, "{v}");
    let ids: Vec<u32> = post(&srv, "/tokenize", json!({"content": "The capital of France is"})).json()["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let v = post(&srv, "/completion", json!({"prompt": ids, "n_predict": 8, "temperature": 0})).json();
    assert_eq!(v["content"], content.as_str(), "token ids give the same answer");
    let v = post(&srv, "/completion", json!({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "stop": ["Paris"]})).json();
    assert_eq!((&v["content"], &v["stop_type"], &v["stopping_word"]), (&json!(content[..content.find("Paris").unwrap()]), &json!("word"), &json!("Paris")), "{v}");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let r = post(&srv, "/completion", streamed);
    let events: Vec<Value> = r.events().iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(events.iter().map(|e| e["content"].as_str().unwrap()).collect::<String>(), content);
    assert_eq!(events.last().unwrap()["stop"], true);
    let r = post(&srv, "/completion", json!({"prompt": "x", "n_predict": 2.5}));
    assert!(r.status == 400 && r.body.contains("n_predict"), "{}", r.body);
    let r = post(&srv, "/completion", json!({"prompt": "x", "response_fields": 5}));
    assert!(r.status == 400 && r.body.contains("response_fields"), "{}", r.body);
}
