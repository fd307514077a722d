//! OpenAI's Responses API, as llama-server serves it: `POST /v1/responses` and
//! `POST /v1/responses/input_tokens`, for the clients built on it (the `openai` SDKs'
//! `client.responses`, agents that speak only it).
//!
//! As with Anthropic's API (`anthropic.rs`), a request is rewritten into the chat request it
//! runs as ([`to_chat`]), so its answer is the chat endpoint's token for token; the answer is
//! a `response` object whose `output` holds a `message` item (one `output_text` part) and a
//! `function_call` item per call (`call_id`, `name`, `arguments`); `status` is `completed`, or
//! `incomplete` with `incomplete_details.reason: "max_output_tokens"` at the token limit.
//! Where the template writes reasoning blocks (`corelm_engine::reasoning`), a `reasoning` item
//! (its text a `reasoning_text` part, streamed as `response.reasoning_text.delta`s) comes first.
//! A stream is the API's typed events, each with its `sequence_number`:
//! `response.created`, `response.in_progress`, per item `response.output_item.added`, a
//! message's `response.content_part.added`, `response.output_text.delta`s,
//! `response.output_text.done` and `response.content_part.done`, a call's
//! `response.function_call_arguments.delta`s (while they are written) and `…done`, then
//! `response.output_item.done`; last `response.completed` (or `response.incomplete`) with the
//! whole response, or an `error` event.
//!
//! The rewrite: `instructions` leads as a system message; `input` is a text (one user turn) or
//! items — messages (`input_text`/`output_text` parts), `function_call`s (joined to the
//! assistant turn before them) and `function_call_output`s (`tool` turns); `reasoning` items
//! give the next assistant turn its `reasoning_content`; `tools` of type `function` become
//! chat tools (others, the hosted tools, are left out, as llama-server does); `tool_choice`, `parallel_tool_calls`, `max_output_tokens`,
//! `text.format` (`text`, `json_object`, `json_schema`), `temperature`, `top_p` map to theirs;
//! `reasoning.effort` sets the template's `enable_thinking` (false at `none`) unless the
//! request's `chat_template_kwargs` do.
//! Nothing is stored (`store` is answered `false`), so `previous_response_id`, `item_reference`
//! items and `background` are refused by name, as are image and file parts.

use crate::api::ApiError;
use crate::blocks::Blocks;
use crate::{AppState, Job, S};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event as Sse;
use axum::response::{IntoResponse, Response};
use corelm_engine::batcher::{Finish, FinishReason};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Fields of a Responses request that are rewritten (or have no chat counterpart) and are not
/// passed on as they are.
const REWRITTEN: [&str; 16] = [
    "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "reasoning", "store", "include", "metadata", "truncation", "n", "logprobs",
    "top_logprobs", "stream_options", "response_format",
];

/// A text of parts (`input_text`, `output_text`; a string as it is) in item `at`.
fn parts_text(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut t = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p["type"].as_str().unwrap_or_default(), p["text"].as_str()) {
                    ("input_text" | "output_text" | "text", Some(s)) => t.push_str(s),
                    ("refusal", _) => t.push_str(p["refusal"].as_str().unwrap_or_default()),
                    (kind, _) => return Err(ApiError::bad(&format!("{at}[{j}]"), format!("{at}[{j}]: content parts of type {kind:?} are not supported (this server's models read text)"))),
                }
            }
            Ok(t)
        }
        _ => Err(ApiError::bad(at, format!("{at} must be a string or a list of content parts"))),
    }
}

/// Input item `i` appended to the chat messages; a `reasoning` item's text waits in `thought`
/// for the assistant turn after it.
fn item(i: usize, it: &Value, out: &mut Vec<Value>, thought: &mut Option<String>) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    let kind = it["type"].as_str().unwrap_or(if it.get("role").is_some() { "message" } else { "" });
    match kind {
        "message" => {
            let role = it["role"].as_str().unwrap_or_default();
            if !matches!(role, "user" | "system" | "developer" | "assistant") {
                return Err(ApiError::bad(&format!("{at}.role"), format!("{at}.role must be user, system, developer or assistant, got {}", it["role"])));
            }
            let mut turn = json!({"role": role, "content": parts_text(&it["content"], &format!("{at}.content"))?});
            if let Some(r) = thought.take().filter(|_| role == "assistant") {
                turn["reasoning_content"] = json!(r);
            }
            out.push(turn);
        }
        "function_call" => {
            let (Some(id), Some(name)) = (it["call_id"].as_str(), it["name"].as_str()) else {
                return Err(ApiError::bad(&at, format!("{at}: a function_call needs a call_id and a name")));
            };
            let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": it["arguments"].as_str().unwrap_or("{}")}});
            match out.last_mut() {
                // Calls after the assistant's text (or other calls) are that turn's.
                Some(m) if m["role"] == "assistant" => match m["tool_calls"].as_array_mut() {
                    Some(calls) => calls.push(call),
                    None => m["tool_calls"] = json!([call]),
                },
                _ => {
                    let mut turn = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                    if let Some(r) = thought.take() {
                        turn["reasoning_content"] = json!(r);
                    }
                    out.push(turn);
                }
            }
        }
        "function_call_output" => {
            let id = it["call_id"].as_str().ok_or_else(|| ApiError::bad(&at, format!("{at}: a function_call_output needs a call_id")))?;
            out.push(json!({"role": "tool", "tool_call_id": id, "content": parts_text(&it["output"], &format!("{at}.output"))?}));
        }
        // The model's own reasoning of an earlier turn: its text, for templates that render it.
        "reasoning" => {
            let parts = it["content"].as_array().into_iter().flatten().chain(it["summary"].as_array().into_iter().flatten());
            let text: String = parts.filter_map(|p| p["text"].as_str()).collect();
            *thought = Some(text).filter(|t| !t.is_empty());
        }
        "item_reference" => return Err(ApiError::bad(&at, format!("{at}: item references need stored responses, and this server stores none"))),
        "" => return Err(ApiError::bad(&at, format!("{at}: an input item needs a type (or a role)"))),
        other => return Err(ApiError::bad(&at, format!("{at}: input items of type {other:?} are not supported"))),
    }
    Ok(())
}

/// A Responses request body as the OpenAI chat request it runs as (see the module doc).
pub(crate) fn to_chat(body: &Value) -> Result<Value, ApiError> {
    for (field, why) in [("previous_response_id", "this server stores no responses"), ("background", "this server answers while the request waits"), ("prompt", "stored prompts are not supported")] {
        if body.get(field).is_some_and(|v| !v.is_null() && *v != false) {
            return Err(ApiError::bad(field, format!("{field} is not supported: {why}")));
        }
    }
    let mut chat: Map<String, Value> = body.as_object().into_iter().flatten().filter(|(k, _)| !REWRITTEN.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut messages = vec![];
    if let Some(s) = body["instructions"].as_str() {
        messages.push(json!({"role": "system", "content": s}));
    }
    match &body["input"] {
        Value::String(s) => messages.push(json!({"role": "user", "content": s})),
        Value::Array(items) => {
            let mut thought = None;
            for (i, it) in items.iter().enumerate() {
                item(i, it, &mut messages, &mut thought)?;
            }
        }
        Value::Null => return Err(ApiError::bad("input", "input is required: a text or a list of items")),
        _ => return Err(ApiError::bad("input", "input must be a text or a list of items")),
    }
    chat.insert("messages".into(), json!(messages));
    if let Some(tools) = body.get("tools").filter(|t| !t.is_null()) {
        let tools = tools.as_array().ok_or_else(|| ApiError::bad("tools", "tools must be a list"))?;
        let functions: Vec<Value> = tools
            .iter()
            .filter(|t| t["type"] == "function")
            .map(|t| {
                let mut f = json!({"name": t["name"], "parameters": if t["parameters"].is_null() { json!({"type": "object"}) } else { t["parameters"].clone() }});
                if let Some(d) = t["description"].as_str() {
                    f["description"] = json!(d);
                }
                json!({"type": "function", "function": f})
            })
            .collect();
        if !functions.is_empty() {
            chat.insert("tools".into(), json!(functions));
        }
    }
    if let Some(tc) = body.get("tool_choice").filter(|t| !t.is_null()) {
        let choice = match (tc.as_str(), tc["type"].as_str(), tc["name"].as_str()) {
            (Some(s @ ("none" | "auto" | "required")), _, _) => json!(s),
            (None, Some("function"), Some(n)) => json!({"type": "function", "function": {"name": n}}),
            _ => return Err(ApiError::bad("tool_choice", "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": ...}")),
        };
        chat.insert("tool_choice".into(), choice);
    }
    if let Some(m) = body.get("max_output_tokens").filter(|m| !m.is_null()) {
        chat.insert("max_tokens".into(), m.clone());
    }
    let format = &body["text"]["format"];
    match format["type"].as_str() {
        None | Some("text") => {}
        Some("json_object") => {
            chat.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some("json_schema") => {
            chat.insert("response_format".into(), json!({"type": "json_schema", "json_schema": {"schema": format["schema"]}}));
        }
        Some(k) => return Err(ApiError::bad("text.format", format!("text.format.type must be text, json_object or json_schema, got {k:?}"))),
    }
    // Reasoning on or off (effort `none`), as a template that can switch it reads it (Qwen3's
    // `enable_thinking`), unless the request sets that variable itself.
    if let Some(effort) = body["reasoning"]["effort"].as_str() {
        crate::api::template_default(&mut chat, "enable_thinking", json!(effort != "none"));
    }
    Ok(Value::Object(chat))
}

/// What a response object repeats of its request.
fn echoed(body: &Value) -> Value {
    let or = |k: &str, d: Value| if body[k].is_null() { d } else { body[k].clone() };
    json!({
        "instructions": body["instructions"], "max_output_tokens": body["max_output_tokens"],
        "parallel_tool_calls": or("parallel_tool_calls", json!(true)), "previous_response_id": null, "store": false,
        "temperature": body["temperature"], "top_p": body["top_p"], "text": or("text", json!({"format": {"type": "text"}})),
        "tool_choice": or("tool_choice", json!("auto")), "tools": or("tools", json!([])), "truncation": "disabled",
        "metadata": or("metadata", json!({})), "error": null, "incomplete_details": null, "usage": null,
    })
}

/// A request's job, submitted as the chat request it is rewritten into; what its response
/// object repeats of it.
fn submit(st: &Arc<AppState>, headers: &HeaderMap, body: &[u8]) -> Result<(Job, Value), ApiError> {
    let body = crate::read_body(st, headers, body)?;
    let (mut job, _) = crate::submit_chat(st, &to_chat(&body)?, "resp")?;
    job.id = job.id.replace('-', "_");
    Ok((job, echoed(&body)))
}

/// `POST /v1/responses`.
pub(crate) async fn create(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = match submit(&st, &headers, &body) {
        Ok((job, echo)) if job.params.stream => Ok(stream(st.clone(), job, echo)),
        Ok((job, echo)) => Ok(whole(&st, job, echo).await),
        Err(e) => Err(e),
    };
    crate::counted(&st, "responses", r)
}

/// `POST /v1/responses/input_tokens`: `{"object": "response.input_tokens", "input_tokens"}`.
pub(crate) async fn input_tokens(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = crate::read_body(&st, &headers, &body).and_then(|b| to_chat(&b)).and_then(|c| crate::prompt_tokens(&st, &c));
    let r = r.map(|n| axum::Json(json!({"object": "response.input_tokens", "input_tokens": n})).into_response());
    crate::counted(&st, "input_tokens", r)
}

fn usage(f: &Finish) -> Value {
    json!({
        "input_tokens": f.prompt_tokens, "input_tokens_details": {"cached_tokens": f.cached_tokens},
        "output_tokens": f.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    })
}

/// The response object: `echo` with its id, model, status and (once done) output and usage.
fn response(st: &AppState, job: &Job, echo: &Value, output: Vec<Value>, f: Option<&Finish>) -> Value {
    let mut r = echo.clone();
    let status = match f.map(|f| &f.reason) {
        None => "in_progress",
        Some(FinishReason::Length) => {
            r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            "incomplete"
        }
        Some(_) => "completed",
    };
    for (k, v) in [("id", json!(job.id)), ("object", json!("response")), ("created_at", json!(st.created)), ("model", json!(st.model_name())), ("status", json!(status)), ("output", json!(output))] {
        r[k] = v;
    }
    if let Some(f) = f {
        r["usage"] = usage(f);
    }
    r
}

/// Ids of the answer's message item and of its call `i` (`fc_…`, with `call_…` its `call_id`).
fn message_id(job: &Job) -> String {
    format!("msg_{}", job.id.rsplit('_').next().unwrap_or(&job.id))
}

/// Id of the answer's reasoning item.
fn reasoning_id(job: &Job) -> String {
    format!("rs_{}", job.id.rsplit('_').next().unwrap_or(&job.id))
}

fn call_ids(job_id: &str, i: usize) -> (String, String) {
    let id = job_id.rsplit('_').next().unwrap_or(job_id);
    (format!("fc_{id}_{i}"), format!("call_{id}_{i}"))
}

/// The answer's reasoning as an item (its text as one `reasoning_text` part once done).
fn reasoning_item(job: &Job, text: &str, status: &str) -> Value {
    let id = reasoning_id(job);
    let content = if status == "in_progress" { json!([]) } else { json!([{"type": "reasoning_text", "text": text}]) };
    json!({"type": "reasoning", "id": id, "summary": [], "content": content, "status": status})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([{"type": "output_text", "text": text, "annotations": []}]) };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(job_id: &str, i: usize, name: &str, arguments: &str, status: &str) -> Value {
    let (id, call_id) = call_ids(job_id, i);
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

async fn whole(st: &AppState, mut job: Job, echo: Value) -> Response {
    let w = match crate::blocks::whole(&mut job).await {
        Ok(w) => w,
        Err(e) => return crate::respond::error_response(&e),
    };
    let mut output: Vec<Value> = w.reasoning.map(|r| reasoning_item(&job, &r, "completed")).into_iter().collect();
    output.extend(w.content.map(|c| message_item(&message_id(&job), &c, "completed")));
    output.extend(w.calls.iter().enumerate().map(|(i, c)| call_item(&job.id, i, &c.name, &c.arguments, "completed")));
    axum::Json(response(st, &job, &echo, output, Some(&w.finish))).into_response()
}

/// The item a stream is writing.
enum Open {
    Reasoning { text: String },
    Message { id: String, text: String },
    Call { i: usize, name: String, arguments: String },
}

/// A stream's output items, one open at a time; the events to send, numbered.
struct Output<'a> {
    job: &'a Job,
    open: Option<Open>,
    /// The items closed so far, as the final response lists them.
    done: Vec<Value>,
    seq: u64,
    out: Vec<Sse>,
}

impl Output<'_> {
    fn event(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.out.push(Sse::default().event(kind).data(data.to_string()));
    }

    fn close(&mut self) {
        let index = self.done.len();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { text }) => {
                let item = reasoning_item(self.job, &text, "completed");
                self.event("response.reasoning_text.done", json!({"item_id": item["id"], "output_index": index, "content_index": 0, "text": text}));
                item
            }
            Some(Open::Message { id, text }) => {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                self.event("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
                self.event("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}));
                message_item(&id, &text, "completed")
            }
            Some(Open::Call { i, name, arguments }) => {
                let (id, _) = call_ids(&self.job.id, i);
                self.event("response.function_call_arguments.done", json!({"item_id": id, "output_index": index, "arguments": arguments}));
                call_item(&self.job.id, i, &name, &arguments, "completed")
            }
        };
        self.event("response.output_item.done", json!({"output_index": index, "item": item}));
        self.done.push(item);
    }
}

impl Blocks for Output<'_> {
    fn reasoning(&mut self, t: &str) {
        let index = self.done.len();
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close();
            self.event("response.output_item.added", json!({"output_index": index, "item": reasoning_item(self.job, "", "in_progress")}));
            self.open = Some(Open::Reasoning { text: String::new() });
        }
        let id = reasoning_id(self.job);
        if let Some(Open::Reasoning { text }) = &mut self.open {
            text.push_str(t);
            self.event("response.reasoning_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t}));
        }
    }

    fn text(&mut self, t: &str) {
        let index = self.done.len();
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close();
            let id = message_id(self.job);
            self.event("response.output_item.added", json!({"output_index": index, "item": message_item(&id, "", "in_progress")}));
            self.event("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}));
            self.open = Some(Open::Message { id, text: String::new() });
        }
        let index = self.done.len();
        if let Some(Open::Message { id, text }) = &mut self.open {
            text.push_str(t);
            let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []});
            self.event("response.output_text.delta", data);
        }
    }

    fn call(&mut self, i: usize, name: &str) {
        self.close();
        let index = self.done.len();
        self.event("response.output_item.added", json!({"output_index": index, "item": call_item(&self.job.id, i, name, "", "in_progress")}));
        self.open = Some(Open::Call { i, name: name.to_string(), arguments: String::new() });
    }

    fn args(&mut self, piece: &str) {
        let index = self.done.len();
        if let Some(Open::Call { i, arguments, .. }) = &mut self.open {
            arguments.push_str(piece);
            let (id, _) = call_ids(&self.job.id, *i);
            self.event("response.function_call_arguments.delta", json!({"item_id": id, "output_index": index, "delta": piece}));
        }
    }

    fn drain(&mut self) -> Vec<Sse> {
        std::mem::take(&mut self.out)
    }
}

/// SSE in the Responses API's events; a client that goes drops the receiver and the engine
/// cancels.
fn stream(st: Arc<AppState>, mut job: Job, echo: Value) -> Response {
    let events = job.choices.remove(0);
    crate::blocks::sse(move |tx| async move {
        let mut o = Output { job: &job, open: None, done: vec![], seq: 0, out: vec![] };
        let start = response(&st, &job, &echo, vec![], None);
        o.event("response.created", json!({"response": start}));
        o.event("response.in_progress", json!({"response": start}));
        crate::blocks::pump(events, (job.tools.as_ref(), job.reasoning), &mut o, &tx, |o, end| match end {
            Err(e) => o.event("error", json!({"code": "server_error", "message": e, "param": null})),
            Ok((f, _)) => {
                o.close();
                let r = response(&st, &job, &echo, std::mem::take(&mut o.done), Some(f));
                let kind = if r["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
                o.event(kind, json!({"response": r}));
            }
        })
        .await;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_items_become_the_chat_messages_they_stand_for() {
        assert_eq!(to_chat(&json!({"input": "Hi"})).unwrap(), json!({"messages": [{"role": "user", "content": "Hi"}]}));
        let body = json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 64, "temperature": 0.5, "store": true,
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ],
            "tools": [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}, {"type": "web_search"}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "reasoning": {"effort": "none"}, "chat_template_kwargs": {"enable_thinking": true},
        });
        assert_eq!(
            to_chat(&body).unwrap(),
            json!({
                "model": "m", "max_tokens": 64, "temperature": 0.5,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "Let me look.",
                        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                ],
                "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
                "chat_template_kwargs": {"enable_thinking": true},
            })
        );
    }

    #[test]
    fn what_cannot_be_served_is_refused_by_name() {
        let refused = |body: Value, param: &str| {
            let e = to_chat(&body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        };
        refused(json!({}), "input");
        refused(json!({"input": "x", "previous_response_id": "resp_1"}), "previous_response_id");
        refused(json!({"input": "x", "background": true}), "background");
        refused(json!({"input": [{"type": "item_reference", "id": "msg_1"}]}), "input[0]");
        refused(json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}), "input[0].content[0]");
        refused(json!({"input": [{"type": "function_call_output", "output": "x"}]}), "input[0]");
        refused(json!({"input": "x", "tool_choice": {"type": "file_search"}}), "tool_choice");
        refused(json!({"input": "x", "text": {"format": {"type": "xml"}}}), "text.format");
    }
}
