//! Anthropic's Messages API, as llama-server serves it: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`, for the clients that speak only Anthropic's protocol
//! (the `anthropic` SDKs, Claude Code with `ANTHROPIC_BASE_URL`).
//!
//! A request is rewritten into an OpenAI chat request ([`to_chat`]) and runs as `/v1/chat/
//! completions` does — the same template, tools, constraints, samplers and admission — so an
//! answer is token for token the chat endpoint's; only the answer's shape is Anthropic's:
//! `content` blocks (`text`, then `tool_use` with `input` an object), `stop_reason`
//! (`end_turn`, `max_tokens`, `stop_sequence` with the `stop_sequence` that ended it,
//! `tool_use`), `usage` with the prefix cache's tokens as `cache_read_input_tokens`. A stream
//! is Anthropic's named SSE events: `message_start`, per block `content_block_start`,
//! `content_block_delta`s (`text_delta`; a call's arguments as `input_json_delta` pieces while
//! they are written) and `content_block_stop`, then `message_delta` (the stop reason, the
//! output tokens) and `message_stop`. Errors are Anthropic's body
//! (`{"type": "error", "error": {"type", "message"}}`), before a stream or as its `error` event.
//!
//! The rewrite: `system` (a string or text blocks, joined) leads as a system message;
//! `tool_use` blocks become the assistant turn's `tool_calls` and `tool_result` blocks `tool`
//! turns (before the rest of their user turn's text); `tools` (`name`, `description`,
//! `input_schema`) and `tool_choice` (`auto`, `any`, `tool` by name, `none`,
//! `disable_parallel_tool_use`) map to OpenAI's; `stop_sequences` to `stop`; `thinking` blocks
//! of earlier turns become the turn's `reasoning_content`. Where the template writes
//! reasoning blocks (`corelm_engine::reasoning`), an answer's reasoning is a `thinking` block
//! first (its `signature` empty: there is nothing to verify locally), streamed as
//! `thinking_delta`s; the request's `thinking` (`enabled` or `disabled`) sets the template's
//! `enable_thinking` (Qwen3's switch) unless its `chat_template_kwargs` do. Image and document blocks, and Anthropic's server tools,
//! are refused by name. Claude Code's `x-anthropic-billing-header` system line carries a
//! per-request stamp (`cch=`) that would stop the prefix cache at it; it is made constant, as
//! llama-server does.

use crate::api::ApiError;
use crate::blocks::Blocks;
use crate::{AppState, Job, S};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event as Sse;
use axum::response::{IntoResponse, Response};
use corelm_engine::batcher::{Finish, FinishReason};
use corelm_engine::tools::ToolCall;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// An error as Anthropic's API answers one.
fn error_response(e: ApiError) -> Response {
    let kind = match e.status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        _ => "api_error",
    };
    let mut r = (e.status, axum::Json(error_body(kind, &e.message))).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut().insert("retry-after", s.into());
    }
    r
}

fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// Claude Code's first system line, `x-anthropic-billing-header: …; cch=XXXXX; …`: its
/// five-character stamp changes with every request, so it is written as `fffff` (as
/// llama-server does) and the prefix cache reaches past it.
fn normalize_billing_header(text: &mut String) {
    let Some(rest) = text.strip_prefix("x-anthropic-billing-header:") else { return };
    let Some(at) = rest.find("cch=").map(|i| text.len() - rest.len() + i + 4) else { return };
    if text.as_bytes().get(at + 5) == Some(&b';') && text.is_char_boundary(at) && text.is_char_boundary(at + 5) {
        text.replace_range(at..at + 5, "fffff");
    }
}

/// The text of a `system` field or a `tool_result`'s `content`: a string, or text blocks
/// joined; `field` names what a block of another type is refused in.
fn text_of(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut t = String::new();
            for (i, b) in blocks.iter().enumerate() {
                match (b["type"].as_str(), b["text"].as_str()) {
                    (Some("text"), Some(s)) => t.push_str(s),
                    (kind, _) => return Err(ApiError::bad(&format!("{field}[{i}]"), format!("{field}[{i}]: only text blocks are supported here, got {}", kind.unwrap_or("a block without a type")))),
                }
            }
            Ok(t)
        }
        _ => Err(ApiError::bad(field, format!("{field} must be a string or a list of text blocks"))),
    }
}

/// One Anthropic message as OpenAI chat messages: its tool results (`tool` turns) first,
/// then its text and calls as one turn. A `system` message among them (Claude Code sends its
/// context so) is a system turn there.
fn message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let field = format!("messages[{i}]");
    let role = m["role"].as_str().unwrap_or_default();
    if !matches!(role, "user" | "assistant" | "system") {
        return Err(ApiError::bad(&format!("{field}.role"), format!("{field}.role must be \"user\", \"assistant\" or \"system\", got {}", m["role"])));
    }
    let blocks = match &m["content"] {
        Value::String(s) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Value::Array(b) => b,
        _ => return Err(ApiError::bad(&format!("{field}.content"), format!("{field}.content must be a string or a list of content blocks"))),
    };
    let (mut text, mut calls, mut thinking) = (vec![], vec![], String::new());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{field}.content[{j}]");
        match b["type"].as_str().unwrap_or_default() {
            "text" => text.push(json!({"type": "text", "text": b["text"].as_str().unwrap_or_default()})),
            // The model's own reasoning of an earlier turn, for templates that render it.
            "thinking" => thinking.push_str(b["thinking"].as_str().unwrap_or_default()),
            "redacted_thinking" => {}
            "tool_use" => {
                let (Some(id), Some(name)) = (b["id"].as_str(), b["name"].as_str()) else {
                    return Err(ApiError::bad(&at, format!("{at}: a tool_use block needs an id and a name")));
                };
                let input = if b["input"].is_null() { json!({}) } else { b["input"].clone() };
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}));
            }
            "tool_result" => {
                let id = b["tool_use_id"].as_str().ok_or_else(|| ApiError::bad(&at, format!("{at}: a tool_result block needs a tool_use_id")))?;
                let content = text_of(&b["content"], &format!("{at}.content"))?;
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            "" => return Err(ApiError::bad(&at, format!("{at}: a content block needs a type"))),
            other => return Err(ApiError::bad(&at, format!("{at}: content blocks of type {other:?} are not supported (this server's models read text)"))),
        }
    }
    if !text.is_empty() || !calls.is_empty() || !thinking.is_empty() {
        let mut turn = json!({"role": role, "content": if text.is_empty() { json!("") } else { json!(text) }});
        if !calls.is_empty() {
            turn["tool_calls"] = json!(calls);
        }
        if !thinking.is_empty() {
            turn["reasoning_content"] = json!(thinking);
        }
        out.push(turn);
    }
    Ok(())
}

/// Fields of a Messages request that are rewritten (or have no chat counterpart) and are not
/// passed on as they are.
const REWRITTEN: [&str; 13] = ["system", "messages", "tools", "tool_choice", "stop_sequences", "metadata", "thinking", "n", "logprobs", "top_logprobs", "stream_options", "parallel_tool_calls", "stop"];

/// A Messages request body as the OpenAI chat request it runs as (see the module doc). The
/// fields both APIs share, and llama-server's sampling fields, pass on as they are.
pub(crate) fn to_chat(body: &Value) -> Result<Value, ApiError> {
    let mut chat: Map<String, Value> = body.as_object().into_iter().flatten().filter(|(k, _)| !REWRITTEN.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut messages = vec![];
    if !body["system"].is_null() {
        let mut system = text_of(&body["system"], "system")?;
        normalize_billing_header(&mut system);
        messages.push(json!({"role": "system", "content": system}));
    }
    let list = body["messages"].as_array().ok_or_else(|| ApiError::bad("messages", "messages is required: a list of {\"role\", \"content\"}"))?;
    for (i, m) in list.iter().enumerate() {
        message(i, m, &mut messages)?;
    }
    chat.insert("messages".into(), json!(messages));
    if let Some(tools) = body.get("tools").filter(|t| !t.is_null()) {
        let tools = tools.as_array().ok_or_else(|| ApiError::bad("tools", "tools must be a list"))?;
        let mut out = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            let kind = t["type"].as_str().unwrap_or("custom");
            if kind != "custom" || t["input_schema"].is_null() {
                return Err(ApiError::bad(&format!("tools[{i}]"), format!("tools[{i}]: only custom tools with an input_schema are supported, got type {kind:?}")));
            }
            let mut f = json!({"name": t["name"], "parameters": t["input_schema"]});
            if let Some(d) = t["description"].as_str() {
                f["description"] = json!(d);
            }
            out.push(json!({"type": "function", "function": f}));
        }
        chat.insert("tools".into(), json!(out));
    }
    if let Some(tc) = body.get("tool_choice").filter(|t| !t.is_null()) {
        let choice = match tc["type"].as_str() {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => match tc["name"].as_str() {
                Some(n) => json!({"type": "function", "function": {"name": n}}),
                None => return Err(ApiError::bad("tool_choice", "a tool_choice of type tool needs a name")),
            },
            _ => return Err(ApiError::bad("tool_choice", "tool_choice.type must be auto, any, tool or none")),
        };
        chat.insert("tool_choice".into(), choice);
        if tc["disable_parallel_tool_use"] == true {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    if let Some(s) = body.get("stop_sequences").filter(|s| !s.is_null()) {
        chat.insert("stop".into(), s.clone());
    }
    // Extended thinking on or off, as a template that can switch it reads it (Qwen3's
    // `enable_thinking`), unless the request sets that variable itself.
    if let Some(on) = match body["thinking"]["type"].as_str() {
        Some("enabled") => Some(true),
        Some("disabled") => Some(false),
        _ => None,
    } {
        crate::api::template_default(&mut chat, "enable_thinking", json!(on));
    }
    Ok(Value::Object(chat))
}

/// A Messages request's job, submitted as the chat request it is rewritten into, and its
/// prompt's tokens.
fn submit(st: &Arc<AppState>, headers: &HeaderMap, body: &[u8]) -> Result<(Job, usize), ApiError> {
    let chat = to_chat(&crate::read_body(st, headers, body)?)?;
    let (mut job, n) = crate::submit_chat(st, &chat, "msg")?;
    job.id = job.id.replace('-', "_");
    Ok((job, n))
}

/// `POST /v1/messages`.
pub(crate) async fn messages(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = match submit(&st, &headers, &body) {
        Ok((job, n)) if job.params.stream => stream(st.clone(), job, n),
        Ok((job, _)) => whole(&st, job).await,
        Err(e) => error_response(e),
    };
    crate::counted(&st, "messages", Ok(r))
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}`, the prompt `/v1/messages` would
/// compute for the same body.
pub(crate) async fn count_tokens(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        let chat = to_chat(&crate::read_body(&st, &headers, &body)?)?;
        Ok(json!({"input_tokens": crate::prompt_tokens(&st, &chat)?}))
    })();
    let r = r.map_or_else(error_response, |v: Value| axum::Json(v).into_response());
    crate::counted(&st, "count_tokens", Ok(r))
}

/// Call `i`'s id in this job's answer.
fn tool_use_id(job_id: &str, i: usize) -> String {
    format!("toolu_{}_{i}", job_id.rsplit('_').next().unwrap_or(job_id))
}

/// A `tool_use` block (its `input` the arguments' object; `{}` where they are not JSON).
fn tool_use(job_id: &str, i: usize, c: &ToolCall) -> Value {
    let input = serde_json::from_str::<Value>(&c.arguments).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
    json!({"type": "tool_use", "id": tool_use_id(job_id, i), "name": c.name, "input": input})
}

/// `stop_reason` and `stop_sequence` of an answer that ended as `f` says, having made `calls`.
fn stop_reason(f: &Finish, calls: usize) -> (&'static str, Value) {
    match (&f.reason, &f.stop_word) {
        (FinishReason::Length, _) => ("max_tokens", Value::Null),
        _ if calls > 0 => ("tool_use", Value::Null),
        (_, Some(w)) => ("stop_sequence", json!(w)),
        _ => ("end_turn", Value::Null),
    }
}

fn usage(f: &Finish) -> Value {
    json!({
        "input_tokens": f.prompt_tokens - f.cached_tokens, "cache_read_input_tokens": f.cached_tokens,
        "cache_creation_input_tokens": 0, "output_tokens": f.completion_tokens,
    })
}

async fn whole(st: &AppState, mut job: Job) -> Response {
    let w = match crate::blocks::whole(&mut job).await {
        Ok(w) => w,
        Err(e) => return error_response(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "api_error", None, e)),
    };
    let mut blocks: Vec<Value> = w.reasoning.map(|r| json!({"type": "thinking", "thinking": r, "signature": ""})).into_iter().collect();
    blocks.extend(w.content.map(|c| json!({"type": "text", "text": c})));
    blocks.extend(w.calls.iter().enumerate().map(|(i, c)| tool_use(&job.id, i, c)));
    let (reason, sequence) = stop_reason(&w.finish, w.calls.len());
    axum::Json(json!({
        "id": job.id, "type": "message", "role": "assistant", "model": st.model_name(), "content": blocks,
        "stop_reason": reason, "stop_sequence": sequence, "usage": usage(&w.finish),
    }))
    .into_response()
}

/// A content block's kind.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Thinking,
    Text,
    ToolUse,
}

/// A stream's content blocks: at most one open, numbered in order; the events to send.
struct Content<'a> {
    job_id: &'a str,
    /// The open block's index and kind.
    open: Option<(usize, Kind)>,
    next: usize,
    out: Vec<Sse>,
}

impl Content<'_> {
    fn event(&mut self, name: &str, data: Value) {
        self.out.push(Sse::default().event(name).data(data.to_string()));
    }

    fn delta(&mut self, index: usize, delta: Value) {
        self.event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}));
    }

    fn close(&mut self) {
        if let Some((index, kind)) = self.open.take() {
            // A thinking block carries a signature (none here: nothing to verify locally).
            if kind == Kind::Thinking {
                self.delta(index, json!({"type": "signature_delta", "signature": ""}));
            }
            self.event("content_block_stop", json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// The open block's index if it is of `kind`, else a new one opened as `block`.
    fn block(&mut self, kind: Kind, block: Value) -> usize {
        match self.open {
            Some((i, k)) if k == kind && kind != Kind::ToolUse => i,
            _ => {
                self.close();
                let index = self.next;
                self.next += 1;
                self.event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": block}));
                self.open = Some((index, kind));
                index
            }
        }
    }
}

impl Blocks for Content<'_> {
    fn reasoning(&mut self, t: &str) {
        let index = self.block(Kind::Thinking, json!({"type": "thinking", "thinking": ""}));
        self.delta(index, json!({"type": "thinking_delta", "thinking": t}));
    }

    fn text(&mut self, t: &str) {
        let index = self.block(Kind::Text, json!({"type": "text", "text": ""}));
        self.delta(index, json!({"type": "text_delta", "text": t}));
    }

    fn call(&mut self, i: usize, name: &str) {
        let id = tool_use_id(self.job_id, i);
        self.block(Kind::ToolUse, json!({"type": "tool_use", "id": id, "name": name, "input": {}}));
    }

    fn args(&mut self, piece: &str) {
        if let Some((index, Kind::ToolUse)) = self.open {
            self.delta(index, json!({"type": "input_json_delta", "partial_json": piece}));
        }
    }

    fn drain(&mut self) -> Vec<Sse> {
        std::mem::take(&mut self.out)
    }
}

/// SSE in Anthropic's events; as the chat stream, a client that goes drops the receiver and
/// the engine cancels. `message_start` counts the prompt's `n` tokens as input (the prefix
/// cache's share is known at the end, in `message_delta`).
fn stream(st: Arc<AppState>, mut job: Job, n: usize) -> Response {
    let events = job.choices.remove(0);
    crate::blocks::sse(move |tx| async move {
        let mut b = Content { job_id: &job.id, open: None, next: 0, out: vec![] };
        let start = json!({"id": job.id, "type": "message", "role": "assistant", "model": st.model_name(), "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": n, "output_tokens": 0}});
        b.event("message_start", json!({"type": "message_start", "message": start}));
        crate::blocks::pump(events, (job.tools.as_ref(), job.reasoning), &mut b, &tx, |b, end| match end {
            Err(e) => b.event("error", error_body("api_error", e)),
            Ok((f, calls)) => {
                b.close();
                let (reason, sequence) = stop_reason(f, calls);
                b.event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage(f)}));
                b.event("message_stop", json!({"type": "message_stop"}));
            }
        })
        .await;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_becomes_the_chat_request_it_runs_as() {
        let body = json!({
            "model": "m", "max_tokens": 64, "temperature": 0.5, "stop_sequences": ["END"],
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=a5145; You are"}, {"type": "text", "text": " helpful."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "Thanks."}]},
            ],
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
            "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"},
        });
        let chat = to_chat(&body).unwrap();
        assert_eq!(
            chat,
            json!({
                "model": "m", "max_tokens": 64, "temperature": 0.5, "stop": ["END"],
                "messages": [
                    {"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1; cch=fffff; You are helpful."},
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}], "reasoning_content": "hm",
                        "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                    {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
                ],
                "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": false,
                "chat_template_kwargs": {"enable_thinking": false},
            })
        );
    }

    #[test]
    fn what_cannot_be_served_is_refused_by_name() {
        let refused = |body: Value, param: &str| {
            let e = to_chat(&body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        };
        let user = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
        refused(json!({}), "messages");
        refused(user(json!([{"type": "image", "source": {"type": "base64", "data": ""}}])), "messages[0].content[0]");
        refused(user(json!([{"type": "tool_result", "content": "x"}])), "messages[0].content[0]");
        refused(json!({"messages": [{"role": "tool", "content": "x"}]}), "messages[0].role");
        refused(json!({"messages": [], "system": [{"type": "image"}]}), "system[0]");
        refused(json!({"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}), "tools[0]");
        refused(json!({"messages": [], "tool_choice": {"type": "tool"}}), "tool_choice");
    }

    #[test]
    fn only_the_billing_stamp_changes() {
        for (given, want) in [
            ("x-anthropic-billing-header: a=1; cch=12345; rest", "x-anthropic-billing-header: a=1; cch=fffff; rest"),
            ("x-anthropic-billing-header: cch=123;", "x-anthropic-billing-header: cch=123;"),
            ("You are helpful. cch=12345;", "You are helpful. cch=12345;"),
        ] {
            let mut s = given.to_string();
            normalize_billing_header(&mut s);
            assert_eq!(s, want);
        }
    }
}
