//! Turning a job's engine events into OpenAI answers: one JSON body, or an SSE stream of
//! chunks ending with `data: [DONE]`.
//!
//! With tools offered, the answer's calls are read out of its text when it ends
//! (`corelm_engine::tools::parse`): `message.tool_calls` and `finish_reason: "tool_calls"`. A
//! stream sends as content only the text that cannot be part of a call
//! (`tools::plain_prefix`), holds the rest, and at the end sends the calls as one
//! `delta.tool_calls` chunk — or, when there were none, the held text.

use crate::{AppState, Job};
use axum::response::sse::{Event as Sse, Sse as SseResponse};
use axum::response::{IntoResponse, Response};
use corelm_engine::batcher::{Event, Finish, FinishReason, TokenLogprob};
use corelm_engine::tools::{self, Answer, Tool, ToolCall};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Text,
}

fn finish_reason(r: &FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// How to read a chat answer's tool calls.
#[derive(Debug)]
pub(crate) struct ToolAnswer {
    pub answer: Answer,
    pub tools: Vec<Tool>,
}

impl ToolAnswer {
    /// The held-back text's content and calls.
    fn read(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        tools::parse(text, self.answer, &self.tools)
    }

    /// Bytes of `text` that are surely content (a forced call's: none).
    fn plain(&self, text: &str) -> usize {
        match self.answer {
            Answer::Bare => 0,
            Answer::Free(f) => tools::plain_prefix(text, f),
        }
    }
}

/// OpenAI's `tool_calls` (with `index`, as stream deltas carry them).
fn tool_calls(job_id: &str, calls: &[ToolCall]) -> Value {
    let id = job_id.rsplit('-').next().unwrap_or(job_id);
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"index": i, "id": format!("call_{id}_{i}"), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect()
}

fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    })
}

/// Log-probabilities of tokens in the shape of `kind`'s API.
struct Logprobs {
    kind: Kind,
    content: Vec<Value>,
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top: Vec<Value>,
    offsets: Vec<usize>,
}

impl Logprobs {
    fn new(kind: Kind) -> Self {
        Logprobs { kind, content: vec![], tokens: vec![], token_logprobs: vec![], top: vec![], offsets: vec![] }
    }

    fn push(&mut self, st: &AppState, id: u32, lp: &TokenLogprob, offset: usize) {
        let piece = |t: u32| String::from_utf8_lossy(st.tok.piece(t)).into_owned();
        match self.kind {
            Kind::Chat => {
                let top: Vec<Value> = lp
                    .top
                    .iter()
                    .map(|&(t, l)| json!({"token": piece(t), "logprob": l, "bytes": st.tok.piece(t)}))
                    .collect();
                self.content.push(json!({"token": piece(id), "logprob": lp.logprob, "bytes": st.tok.piece(id), "top_logprobs": top}));
            }
            Kind::Text => {
                self.tokens.push(piece(id));
                self.token_logprobs.push(lp.logprob);
                let m: serde_json::Map<String, Value> = lp.top.iter().map(|&(t, l)| (piece(t), json!(l))).collect();
                self.top.push(Value::Object(m));
                self.offsets.push(offset);
            }
        }
    }

    fn take(&mut self) -> Value {
        match self.kind {
            Kind::Chat => json!({"content": std::mem::take(&mut self.content)}),
            Kind::Text => json!({
                "tokens": std::mem::take(&mut self.tokens),
                "token_logprobs": std::mem::take(&mut self.token_logprobs),
                "top_logprobs": std::mem::take(&mut self.top),
                "text_offset": std::mem::take(&mut self.offsets),
            }),
        }
    }
}

fn error_response(msg: &str) -> Response {
    crate::api::ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, msg).into_response()
}

pub(crate) async fn answer(st: Arc<AppState>, job: Job, kind: Kind) -> Response {
    if job.params.stream {
        stream(st, job, kind)
    } else {
        whole(st, job, kind).await
    }
}

async fn whole(st: Arc<AppState>, mut job: Job, kind: Kind) -> Response {
    let mut text = String::new();
    let mut lps = job.logprobs.map(|_| Logprobs::new(kind));
    let fin = loop {
        match job.events.recv().await {
            Some(Event::Token { id, text: t, logprob }) => {
                if let (Some(l), Some(lp)) = (lps.as_mut(), logprob.as_ref()) {
                    l.push(&st, id, lp, text.len());
                }
                text.push_str(&t);
            }
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(f)) => break f,
            None => return error_response("the engine dropped the request"),
        }
    };
    if let FinishReason::Error(e) = &fin.reason {
        return error_response(e);
    }
    let lp = lps.as_mut().map_or(Value::Null, Logprobs::take);
    let choice = match (kind, &job.tools) {
        (Kind::Chat, Some(t)) => {
            let (content, calls) = t.read(&text);
            let mut message = json!({"role": "assistant", "content": content});
            let mut finish = finish_reason(&fin.reason);
            if !calls.is_empty() {
                message["tool_calls"] = tool_calls(&job.id, &calls);
                finish = "tool_calls";
            }
            json!({"index": 0, "message": message, "logprobs": lp, "finish_reason": finish})
        }
        (Kind::Chat, None) => json!({
            "index": 0, "message": {"role": "assistant", "content": text},
            "logprobs": lp, "finish_reason": finish_reason(&fin.reason),
        }),
        (Kind::Text, _) => json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": finish_reason(&fin.reason)}),
    };
    let object = if kind == Kind::Chat { "chat.completion" } else { "text_completion" };
    axum::Json(json!({
        "id": job.id, "object": object, "created": st.created, "model": st.cfg.model_id,
        "choices": [choice], "usage": usage(&fin),
    }))
    .into_response()
}

/// SSE: engine events are converted to chunks on a task; when the client goes, the SSE body is
/// dropped, the task's send fails, it drops the event receiver and the engine cancels.
fn stream(st: Arc<AppState>, mut job: Job, kind: Kind) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Sse, Infallible>>(64);
    let object = if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
    let chunk = {
        let (id, created, model) = (job.id.clone(), st.created, st.cfg.model_id.clone());
        move |choices: Value, usage: Option<Value>| {
            let mut v = json!({"id": id, "object": object, "created": created, "model": model, "choices": choices});
            if let Some(u) = usage {
                v["usage"] = u;
            }
            Sse::default().data(v.to_string())
        }
    };
    let choice = move |text: Option<&str>, lp: Value, finish: Value| match kind {
        Kind::Chat => {
            let delta = text.map_or(json!({}), |t| json!({"content": t}));
            json!([{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}])
        }
        Kind::Text => json!([{"index": 0, "text": text.unwrap_or(""), "logprobs": lp, "finish_reason": finish}]),
    };
    tokio::spawn(async move {
        let send = |e: Sse| tx.send(Ok(e));
        if kind == Kind::Chat {
            let first = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
            if send(chunk(first, None)).await.is_err() {
                return;
            }
        }
        let mut lps = job.logprobs.map(|_| Logprobs::new(kind));
        let mut offset = 0;
        // With tools: the whole text so far, and how much of it went out as content.
        let (mut full, mut sent) = (String::new(), 0);
        loop {
            let (piece, lp) = match job.events.recv().await {
                Some(Event::Token { id, text, logprob }) => {
                    let lp = match (lps.as_mut(), logprob.as_ref()) {
                        (Some(l), Some(p)) => {
                            l.push(&st, id, p, offset);
                            l.take()
                        }
                        _ => Value::Null,
                    };
                    (text, lp)
                }
                Some(Event::Text(t)) => (t, Value::Null),
                Some(Event::Done(f)) => {
                    if let FinishReason::Error(e) = &f.reason {
                        let err = json!({"error": {"message": e, "type": "server_error"}});
                        let _ = send(Sse::default().data(err.to_string())).await;
                    } else {
                        let mut finish = finish_reason(&f.reason);
                        if let Some(t) = &job.tools {
                            let (_, calls) = t.read(&full);
                            let last = if calls.is_empty() {
                                (sent < full.len()).then(|| json!([{"index": 0, "delta": {"content": &full[sent..]}, "logprobs": null, "finish_reason": null}]))
                            } else {
                                finish = "tool_calls";
                                Some(json!([{"index": 0, "delta": {"tool_calls": tool_calls(&job.id, &calls)}, "logprobs": null, "finish_reason": null}]))
                            };
                            if let Some(c) = last {
                                let _ = send(chunk(c, None)).await;
                            }
                        }
                        let _ = send(chunk(choice(None, Value::Null, json!(finish)), None)).await;
                        if job.params.include_usage {
                            let _ = send(chunk(json!([]), Some(usage(&f)))).await;
                        }
                    }
                    let _ = send(Sse::default().data("[DONE]")).await;
                    return;
                }
                None => return,
            };
            offset += piece.len();
            let piece = match &job.tools {
                Some(t) => {
                    full.push_str(&piece);
                    let plain = t.plain(&full).max(sent);
                    let out = full[sent..plain].to_string();
                    sent = plain;
                    out
                }
                None => piece,
            };
            if piece.is_empty() && lp.is_null() {
                continue;
            }
            if send(chunk(choice(Some(&piece), lp, Value::Null), None)).await.is_err() {
                return; // client gone: dropping job.events cancels the sequence
            }
        }
    });
    SseResponse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response()
}
