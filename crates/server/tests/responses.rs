//! OpenAI's Responses API (`/v1/responses`, `/v1/responses/input_tokens`) over real HTTP on
//! SmolLM2: the chat endpoint's answers as output items, streamed as the API's numbered
//! events, function calls both ways, refusals by name.

mod common;

use common::*;
use serde_json::{json, Value};

fn ask(input: Value, max_output_tokens: usize) -> Value {
    json!({"model": MODEL, "max_output_tokens": max_output_tokens, "temperature": 0, "instructions": "You answer in one short sentence.", "input": input})
}

/// A stream's events: named as their `type`, numbered from 0, opened by `response.created`
/// and `response.in_progress`, closed by the whole response.
fn events(r: &Reply) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.body);
    let names: Vec<&str> = r.body.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    let data: Vec<Value> = r.events().iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(names, data.iter().map(|d| d["type"].as_str().unwrap()).collect::<Vec<_>>(), "{}", r.body);
    assert!(data.iter().enumerate().all(|(i, d)| d["sequence_number"] == i), "{}", r.body);
    assert_eq!((names[0], names[1]), ("response.created", "response.in_progress"));
    assert_eq!(data[0]["response"]["status"], "in_progress");
    assert!(matches!(*names.last().unwrap(), "response.completed" | "response.incomplete"), "{}", r.body);
    data
}

fn of<'a>(ev: &'a [Value], kind: &str) -> Vec<&'a Value> {
    ev.iter().filter(|e| e["type"] == kind).collect()
}

/// A text answer is the chat endpoint's as one `message` item, whole and streamed; `status`
/// follows its end; `input_tokens` counts its prompt.
#[test]
fn responses_answer_as_the_chat_endpoint_does() {
    let srv = start(1, 16, None);
    for max in [8, 40] {
        let chat = post(&srv, "/v1/chat/completions", json!({"model": MODEL, "max_tokens": max, "temperature": 0,
            "messages": [{"role": "system", "content": "You answer in one short sentence."}, {"role": "user", "content": "What is the capital of France?"}]})).json();
        let text = chat["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let length = chat["choices"][0]["finish_reason"] == "length";
        let body = ask(json!("What is the capital of France?"), max);
        let v = post(&srv, "/v1/responses", body.clone()).json();
        assert!(v["id"].as_str().unwrap().starts_with("resp_") && v["object"] == "response" && v["model"] == MODEL, "{v}");
        assert_eq!(v["status"], if length { "incomplete" } else { "completed" }, "{v}");
        assert_eq!(v["incomplete_details"], if length { json!({"reason": "max_output_tokens"}) } else { Value::Null }, "{v}");
        let output = v["output"].as_array().unwrap();
        assert_eq!(output.len(), 1, "{v}");
        assert_eq!((&output[0]["type"], &output[0]["role"], &output[0]["status"]), (&json!("message"), &json!("assistant"), &json!("completed")));
        assert_eq!(output[0]["content"], json!([{"type": "output_text", "text": text, "annotations": []}]), "{v}");
        assert_eq!((&v["usage"]["input_tokens"], &v["usage"]["output_tokens"]), (&chat["usage"]["prompt_tokens"], &chat["usage"]["completion_tokens"]), "{v}");
        assert_eq!((&v["instructions"], &v["max_output_tokens"], &v["store"]), (&body["instructions"], &json!(max), &json!(false)), "{v}");
        let counted = post(&srv, "/v1/responses/input_tokens", body.clone()).json();
        assert_eq!(counted, json!({"object": "response.input_tokens", "input_tokens": chat["usage"]["prompt_tokens"]}));

        let mut streamed = body;
        streamed["stream"] = json!(true);
        let ev = events(&post(&srv, "/v1/responses", streamed));
        let deltas = of(&ev, "response.output_text.delta");
        assert!(deltas.len() > 1 && deltas.iter().all(|d| d["output_index"] == 0 && d["content_index"] == 0), "{ev:?}");
        assert_eq!(deltas.iter().map(|d| d["delta"].as_str().unwrap()).collect::<String>(), text);
        assert_eq!(of(&ev, "response.output_text.done")[0]["text"], text.as_str());
        let added = of(&ev, "response.output_item.added");
        assert_eq!((added.len(), &added[0]["item"]["status"]), (1, &json!("in_progress")));
        let last = &ev.last().unwrap()["response"];
        assert_eq!(last["status"], v["status"]);
        assert_eq!(last["output"][0]["content"], output[0]["content"]);
        assert_eq!(of(&ev, "response.output_item.done")[0]["item"], last["output"][0]);
    }
}

/// A forced call is a `function_call` item whose arguments fit the tool's schema, streamed as
/// argument deltas; its output sent back as a `function_call_output` item gets an answer.
#[test]
fn function_calls_both_ways() {
    let srv = start(1, 16, None);
    let tools = json!([
        {"type": "function", "name": "get_weather", "description": "Current weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}},
        {"type": "web_search"}
    ]);
    let mut body = ask(json!([{"role": "user", "content": "What will the weather be in Paris this week?"}]), 60);
    body["tools"] = tools;
    body["tool_choice"] = json!({"type": "function", "name": "get_weather"});
    let v = post(&srv, "/v1/responses", body.clone()).json();
    assert_eq!(v["status"], "completed", "{v}");
    let calls: Vec<&Value> = v["output"].as_array().unwrap().iter().filter(|o| o["type"] == "function_call").collect();
    assert_eq!(calls.len(), 1, "{v}");
    let call = calls[0];
    assert!(call["call_id"].as_str().unwrap().starts_with("call_") && call["id"].as_str().unwrap().starts_with("fc_") && call["name"] == "get_weather", "{v}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 20) && (1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let ev = events(&post(&srv, "/v1/responses", streamed));
    let added = of(&ev, "response.output_item.added");
    let item = &added.iter().find(|a| a["item"]["type"] == "function_call").unwrap()["item"];
    assert_eq!((&item["name"], &item["arguments"], &item["status"]), (&json!("get_weather"), &json!(""), &json!("in_progress")));
    let deltas = of(&ev, "response.function_call_arguments.delta");
    assert!(deltas.len() > 1 && deltas.iter().all(|d| d["item_id"] == item["id"]), "{ev:?}");
    let joined: String = deltas.iter().map(|d| d["delta"].as_str().unwrap()).collect();
    assert_eq!(serde_json::from_str::<Value>(&joined).unwrap(), args);
    assert_eq!(of(&ev, "response.function_call_arguments.done")[0]["arguments"], joined.as_str());

    // The call and its output sent back: an answer.
    let mut next = body;
    next["tool_choice"] = json!("auto");
    next["input"].as_array_mut().unwrap().extend([
        json!({"type": "function_call", "call_id": call["call_id"], "name": "get_weather", "arguments": call["arguments"]}),
        json!({"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 24 °C all week."}),
    ]);
    let v = post(&srv, "/v1/responses", next).json();
    assert!(matches!(v["status"].as_str(), Some("completed" | "incomplete")) && !v["output"].as_array().unwrap().is_empty(), "{v}");
}

/// What needs stored responses, and what these models cannot read, is a 400 naming the field.
#[test]
fn what_needs_storage_is_refused_by_name() {
    let srv = start(1, 4, None);
    for (body, param) in [
        (json!({"model": MODEL, "input": "Hi", "previous_response_id": "resp_1"}), "previous_response_id"),
        (json!({"model": MODEL, "input": [{"type": "item_reference", "id": "msg_1"}]}), "input[0]"),
        (json!({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}), "input[0].content[0]"),
        (json!({"model": MODEL}), "input"),
    ] {
        let r = post(&srv, "/v1/responses", body);
        assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some(param)), "{}", r.body);
    }
}
