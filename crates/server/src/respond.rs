//! Turning a job's engine events into OpenAI answers: one JSON body, or an SSE stream of
//! chunks ending with `data: [DONE]`.
//!
//! With tools offered, the answer's calls are read out of its text when it ends
//! (`corelm_engine::tools::parse`): `message.tool_calls` and `finish_reason: "tool_calls"`. A
//! stream sends as content only the text that cannot be part of a call
//! (`tools::plain_prefix`) and holds the rest; calls in the held text go out as OpenAI streams
//! them while they are written (`tools::CallReader`: a `delta.tool_calls` with the call's
//! `id`, `type` and name, then its arguments' text piece by piece). At the end, calls the
//! reader did not follow (JSON of no call came first) go out whole — or, when there were
//! none at all, the held text.
//!
//! Where the template writes reasoning blocks (`Job::reasoning`), a chat answer's reasoning is
//! `message.reasoning_content` (streamed as `delta.reasoning_content`) and the rest its content
//! (`corelm_engine::reasoning`), where tool calls are read.
//!
//! `echo` (legacy completions): each choice's text opens with its prompt's, and its
//! log-probabilities with the prompt tokens' (the first one's `null`); a stream sends them as
//! the choice's first chunk, once the prompt is computed.
//!
//! Several choices (`n`, several prompts): an answer holds one per engine request, `index` in
//! request order; a stream interleaves their chunks as their tokens come, each chunk one
//! choice's, and ends after every choice's last. Usage counts each prompt once (its first
//! choice's prompt and cached tokens) and every choice's completion tokens.

use crate::{AppState, Job};
use axum::response::sse::{Event as Sse, Sse as SseResponse};
use axum::response::{IntoResponse, Response};
use corelm_engine::batcher::{Event, Finish, FinishReason, TokenLogprob};
use crate::blocks::{Blocks, Split};
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
    pub(crate) fn read(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        tools::parse(text, self.answer, &self.tools)
    }

    /// Bytes of `text` that are surely content (a forced call's: none).
    pub(crate) fn plain(&self, text: &str) -> usize {
        match self.answer {
            Answer::Bare => 0,
            Answer::Free(f) => tools::plain_prefix(text, f),
        }
    }
}

/// OpenAI's `tool_calls` of choice `choice` (with `index`, as stream deltas carry them), the
/// first `first`.
fn tool_calls(job_id: &str, choice: usize, first: usize, calls: &[ToolCall]) -> Value {
    calls.iter().enumerate().map(|(i, c)| tool_call(job_id, choice, first + i, &c.name, &c.arguments)).collect()
}

/// A stream chunk's `choices` carrying `calls` (a list of `tool_calls` entries) for choice `c`.
fn tool_delta(c: usize, calls: Value) -> Value {
    json!([{"index": c, "delta": {"tool_calls": calls}, "logprobs": null, "finish_reason": null}])
}

/// A stream chunk's `choices` carrying more of choice `c`'s reasoning.
fn reasoning_delta(c: usize, r: &str) -> Value {
    json!([{"index": c, "delta": {"reasoning_content": r}, "logprobs": null, "finish_reason": null}])
}

/// Call `i` of choice `choice`: its id is the job's.
fn tool_call(job_id: &str, choice: usize, i: usize, name: &str, arguments: &str) -> Value {
    let id = job_id.rsplit('-').next().unwrap_or(job_id);
    let id = if choice == 0 { id.to_string() } else { format!("{id}_{choice}") };
    json!({"index": i, "id": format!("call_{id}_{i}"), "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// Token counts over a job's choices: each prompt once, every completion.
#[derive(Default)]
struct Usage {
    prompt: usize,
    cached: usize,
    completion: usize,
}

impl Usage {
    /// Count choice `c`'s end (of `n` per prompt).
    fn add(&mut self, c: usize, n: usize, f: &Finish) {
        if c.is_multiple_of(n) {
            self.prompt += f.prompt_tokens;
            self.cached += f.cached_tokens;
        }
        self.completion += f.completion_tokens;
    }

    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

/// Log-probabilities of tokens in the shape of `kind`'s API.
struct Logprobs {
    kind: Kind,
    content: Vec<Value>,
    tokens: Vec<String>,
    token_logprobs: Vec<Option<f32>>,
    top: Vec<Value>,
    offsets: Vec<usize>,
    /// Characters of the prompt tokens' pieces so far (their `text_offset`s).
    prompt_chars: usize,
}

impl Logprobs {
    fn new(kind: Kind) -> Self {
        Logprobs { kind, content: vec![], tokens: vec![], token_logprobs: vec![], top: vec![], offsets: vec![], prompt_chars: 0 }
    }

    /// An echoed prompt token (legacy completions only): `lp` is `None` for the first.
    fn push_prompt(&mut self, st: &AppState, id: u32, lp: Option<&TokenLogprob>) {
        match lp {
            Some(lp) => self.push(st, id, lp, self.prompt_chars),
            None => {
                self.tokens.push(String::from_utf8_lossy(st.tok.piece(id)).into_owned());
                self.token_logprobs.push(None);
                self.top.push(Value::Null);
                self.offsets.push(self.prompt_chars);
            }
        }
        self.prompt_chars += self.tokens.last().map_or(0, |t| t.chars().count());
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
                self.token_logprobs.push(Some(lp.logprob));
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

pub(crate) fn error_response(msg: &str) -> Response {
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
    let mut choices = Vec::with_capacity(job.choices.len());
    let mut usage = Usage::default();
    // In order: the others' events wait in their channels meanwhile.
    for (c, events) in job.choices.iter_mut().enumerate() {
        let mut text = job.echo.get(c / job.params.n).cloned().unwrap_or_default();
        let mut chars = text.chars().count();
        let mut lps = job.logprobs.map(|_| Logprobs::new(kind));
        let fin = loop {
            match events.recv().await {
                Some(Event::Prompt { id, logprob }) => {
                    if let Some(l) = lps.as_mut() {
                        l.push_prompt(&st, id, logprob.as_ref());
                    }
                }
                Some(Event::Token { id, text: t, logprob }) => {
                    if let (Some(l), Some(lp)) = (lps.as_mut(), logprob.as_ref()) {
                        l.push(&st, id, lp, chars);
                    }
                    chars += t.chars().count();
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
        usage.add(c, job.params.n, &fin);
        let lp = lps.as_mut().map_or(Value::Null, Logprobs::take);
        let (reasoning, text) = crate::split_reasoning(job.reasoning, text);
        let mut choice = match (kind, &job.tools) {
            (Kind::Chat, Some(t)) => {
                let (content, calls) = t.read(&text);
                let mut message = json!({"role": "assistant", "content": content});
                let mut finish = finish_reason(&fin.reason);
                if !calls.is_empty() {
                    message["tool_calls"] = tool_calls(&job.id, c, 0, &calls);
                    finish = "tool_calls";
                }
                json!({"index": c, "message": message, "logprobs": lp, "finish_reason": finish})
            }
            (Kind::Chat, None) => json!({
                "index": c, "message": {"role": "assistant", "content": text},
                "logprobs": lp, "finish_reason": finish_reason(&fin.reason),
            }),
            (Kind::Text, _) => json!({"index": c, "text": text, "logprobs": lp, "finish_reason": finish_reason(&fin.reason)}),
        };
        if let Some(r) = reasoning {
            choice["message"]["reasoning_content"] = json!(r);
        }
        choices.push(choice);
    }
    let object = if kind == Kind::Chat { "chat.completion" } else { "text_completion" };
    axum::Json(json!({
        "id": job.id, "object": object, "created": st.created, "model": st.model_name(),
        "choices": choices, "usage": usage.json(),
    }))
    .into_response()
}

/// A stream's chunk: its `choices` (and `usage`) with the job's id, object, time and model.
type ChunkOf = Arc<dyn Fn(Value, Option<Value>) -> Sse + Send + Sync>;

/// One choice's stream chunks, as the blocks a [`Split`] reads out of its answer.
struct Chunks {
    c: usize,
    kind: Kind,
    job_id: Arc<str>,
    chunk: ChunkOf,
    /// The token's log-probabilities, until a chunk of its text carries them.
    lp: Value,
    /// The call whose arguments come next.
    call: usize,
    out: Vec<Sse>,
}

impl Chunks {
    fn push(&mut self, choices: Value) {
        self.out.push((self.chunk)(choices, None));
    }

    /// A text chunk (`None`: none, where the finish or log-probabilities alone go out).
    fn choice(&self, text: Option<&str>, lp: Value, finish: Value) -> Value {
        let c = self.c;
        match self.kind {
            Kind::Chat => {
                let delta = text.map_or(json!({}), |t| json!({"content": t}));
                json!([{"index": c, "delta": delta, "logprobs": lp, "finish_reason": finish}])
            }
            Kind::Text => json!([{"index": c, "text": text.unwrap_or(""), "logprobs": lp, "finish_reason": finish}]),
        }
    }

    /// The token's log-probabilities where no text of it went out (text held back, or all
    /// reasoning): in a chunk of no text.
    fn flush_logprobs(&mut self) {
        if !self.lp.is_null() {
            let lp = std::mem::take(&mut self.lp);
            let v = self.choice(Some(""), lp, Value::Null);
            self.push(v);
        }
    }
}

impl Blocks for Chunks {
    fn reasoning(&mut self, t: &str) {
        let v = reasoning_delta(self.c, t);
        self.push(v);
    }

    fn text(&mut self, t: &str) {
        let lp = std::mem::take(&mut self.lp);
        let v = self.choice(Some(t), lp, Value::Null);
        self.push(v);
    }

    fn call(&mut self, i: usize, name: &str) {
        self.call = i;
        let v = tool_delta(self.c, json!([tool_call(&self.job_id, self.c, i, name, "")]));
        self.push(v);
    }

    fn args(&mut self, piece: &str) {
        let v = tool_delta(self.c, json!([{"index": self.call, "function": {"arguments": piece}}]));
        self.push(v);
    }

    /// The calls the reader did not follow go out in one chunk, each whole.
    fn calls(&mut self, first: usize, calls: &[ToolCall]) {
        let v = tool_delta(self.c, tool_calls(&self.job_id, self.c, first, calls));
        self.push(v);
    }

    fn drain(&mut self) -> Vec<Sse> {
        std::mem::take(&mut self.out)
    }
}

/// A streamed choice's state.
struct Streamed {
    lps: Option<Logprobs>,
    /// Characters of text so far (the legacy logprobs' `text_offset`s count characters, as
    /// OpenAI's and the clients that cut a prompt by its Python length).
    offset: usize,
    /// `echo`: the prompt's text, until it goes out as the choice's first chunk.
    echo: Option<String>,
    /// Its answer read apart: reasoning, text and calls.
    split: Split,
    chunks: Chunks,
}

/// SSE: engine events are converted to chunks on a task; when the client goes, the SSE body is
/// dropped, the task's send fails, it drops the event receivers and the engine cancels.
fn stream(st: Arc<AppState>, mut job: Job, kind: Kind) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Sse, Infallible>>(64);
    let object = if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
    let chunk: ChunkOf = {
        let (id, created, model) = (job.id.clone(), st.created, st.model_name().to_string());
        Arc::new(move |choices: Value, usage: Option<Value>| {
            let mut v = json!({"id": id, "object": object, "created": created, "model": model, "choices": choices});
            if let Some(u) = usage {
                v["usage"] = u;
            }
            Sse::default().data(v.to_string())
        })
    };
    let mut events = tokio_stream::StreamMap::new();
    for (c, r) in std::mem::take(&mut job.choices).into_iter().enumerate() {
        events.insert(c, tokio_stream::wrappers::UnboundedReceiverStream::new(r));
    }
    tokio::spawn(async move {
        use tokio_stream::StreamExt;
        let send = |e: Sse| tx.send(Ok(e));
        let count = events.len();
        if kind == Kind::Chat {
            for c in 0..count {
                let first = json!([{"index": c, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
                if send(chunk(first, None)).await.is_err() {
                    return;
                }
            }
        }
        let job_id: Arc<str> = job.id.as_str().into();
        let mut state: Vec<Streamed> = (0..count)
            .map(|c| Streamed {
                lps: job.logprobs.map(|_| Logprobs::new(kind)),
                offset: 0,
                echo: job.echo.get(c / job.params.n).cloned(),
                split: Split::new(job.reasoning),
                chunks: Chunks { c, kind, job_id: job_id.clone(), chunk: chunk.clone(), lp: Value::Null, call: 0, out: vec![] },
            })
            .collect();
        let tools = job.tools.as_ref();
        let (mut usage, mut ended) = (Usage::default(), 0);
        loop {
            let Some((c, event)) = events.next().await else { return };
            let s = &mut state[c];
            if let Event::Prompt { id, logprob } = &event {
                if let Some(l) = s.lps.as_mut() {
                    l.push_prompt(&st, *id, logprob.as_ref());
                }
                continue;
            }
            // The echoed prompt (and its tokens' log-probabilities) before the first answer chunk.
            if let (Some(e), false) = (s.echo.take(), matches!(&event, Event::Done(f) if matches!(f.reason, FinishReason::Error(_)))) {
                s.offset = e.chars().count();
                let lp = s.lps.as_mut().map_or(Value::Null, Logprobs::take);
                let v = s.chunks.choice(Some(&e), lp, Value::Null);
                if send(chunk(v, None)).await.is_err() {
                    return;
                }
            }
            let done = match event {
                Event::Prompt { .. } => continue, // taken above
                Event::Token { id, text, logprob } => {
                    if let (Some(l), Some(p)) = (s.lps.as_mut(), logprob.as_ref()) {
                        l.push(&st, id, p, s.offset);
                        s.chunks.lp = l.take();
                    }
                    s.offset += text.chars().count();
                    s.split.piece(tools, &text, &mut s.chunks);
                    s.chunks.flush_logprobs();
                    None
                }
                Event::Text(t) => {
                    s.offset += t.chars().count();
                    s.split.piece(tools, &t, &mut s.chunks);
                    None
                }
                Event::Done(f) => Some(f),
            };
            if let Some(f) = done {
                if let FinishReason::Error(e) = &f.reason {
                    let err = json!({"error": {"message": e, "type": "server_error"}});
                    let _ = send(Sse::default().data(err.to_string())).await;
                    let _ = send(Sse::default().data("[DONE]")).await;
                    return;
                }
                let calls = s.split.end(tools, &mut s.chunks);
                let finish = if calls > 0 && s.split.all_closed() { "tool_calls" } else { finish_reason(&f.reason) };
                let v = s.chunks.choice(None, Value::Null, json!(finish));
                s.chunks.push(v);
                usage.add(c, job.params.n, &f);
                ended += 1;
            }
            for e in s.chunks.drain() {
                if send(e).await.is_err() {
                    return; // client gone: dropping the receivers cancels the sequences
                }
            }
            if ended == count {
                if job.params.include_usage {
                    let _ = send(chunk(json!([]), Some(usage.json()))).await;
                }
                let _ = send(Sse::default().data("[DONE]")).await;
                return;
            }
        }
    });
    SseResponse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response()
}
