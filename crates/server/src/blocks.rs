//! An answer split, as it streams, into the blocks of the APIs that send reasoning, text and
//! tool calls as separate items (Anthropic's content blocks, the Responses API's output items):
//! reasoning, text, a call's start, more of its arguments — and the chat stream, whose chunks
//! are its blocks too (`respond.rs`'s module doc: how calls are read while they are written).

use crate::respond::ToolAnswer;
use axum::response::sse::Event as Sse;
use corelm_engine::batcher::{Event, Finish, FinishReason};
use corelm_engine::reasoning::Splitter;
use corelm_engine::tools::{CallDelta, CallReader, ToolCall};
use std::convert::Infallible;

/// Where a [`Split`] puts what it reads.
pub(crate) trait Blocks {
    /// More of the answer's reasoning (never empty; before its text and calls).
    fn reasoning(&mut self, t: &str);
    /// More of the answer's text (never empty).
    fn text(&mut self, t: &str);
    /// Call `i` of tool `name` begins.
    fn call(&mut self, i: usize, name: &str);
    /// More of the last call's arguments (JSON text).
    fn args(&mut self, piece: &str);
    /// Calls `first..` whole, at the end: those the reader did not follow while they were
    /// written. By default each one's start and then all of its arguments.
    fn calls(&mut self, first: usize, calls: &[ToolCall]) {
        for (i, c) in calls.iter().enumerate() {
            self.call(first + i, &c.name);
            self.args(&c.arguments);
        }
    }
    /// The events made so far, to send.
    fn drain(&mut self) -> Vec<Sse>;
}

/// A whole answer, read apart: its reasoning (where the job asks for it), its content (no
/// longer empty) and its calls, with how it ended.
pub(crate) struct Whole {
    pub reasoning: Option<String>,
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
    pub finish: Finish,
}

/// Wait for the job's (one) answer and read it apart; `Err` with the engine's error, or where
/// the engine dropped the request.
pub(crate) async fn whole(job: &mut crate::Job) -> Result<Whole, String> {
    let mut text = String::new();
    let finish = loop {
        match job.choices[0].recv().await {
            Some(Event::Token { text: t, .. } | Event::Text(t)) => text.push_str(&t),
            Some(Event::Prompt { .. }) => {}
            Some(Event::Done(f)) => break f,
            None => return Err("the engine dropped the request".into()),
        }
    };
    if let FinishReason::Error(e) = &finish.reason {
        return Err(e.clone());
    }
    let (reasoning, text) = crate::split_reasoning(job.reasoning, text);
    let (content, calls) = match &job.tools {
        Some(t) => t.read(&text),
        None => (Some(text), vec![]),
    };
    Ok(Whole { reasoning: reasoning.filter(|r| !r.is_empty()), content: content.filter(|c| !c.is_empty()), calls, finish })
}

/// An SSE response whose events the task `run` makes sends into its sender.
pub(crate) fn sse<F: std::future::Future<Output = ()> + Send + 'static>(run: impl FnOnce(Sender) -> F) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(run(tx));
    axum::response::sse::Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response()
}

/// Where a stream's task sends its events.
pub(crate) type Sender = tokio::sync::mpsc::Sender<Result<Sse, Infallible>>;

/// Run a stream: each of a request's `events` split into `out`, and at its end `done` given
/// the finish and how many calls the answer made (or the engine's error); after each event,
/// what `out` made goes to `tx`. Returns when the answer ended, or when the client went (a
/// failed send: the receivers dropped with this task cancel the sequence).
pub(crate) async fn pump<B: Blocks>(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    (tools, reasoning): (Option<&ToolAnswer>, Option<bool>),
    out: &mut B,
    tx: &Sender,
    done: impl FnOnce(&mut B, Result<(&Finish, usize), &str>),
) {
    let (mut split, mut done) = (Split::new(reasoning), Some(done));
    loop {
        let ended = match events.recv().await {
            Some(Event::Token { text, .. } | Event::Text(text)) => {
                split.piece(tools, &text, out);
                false
            }
            Some(Event::Prompt { .. }) => false,
            Some(Event::Done(f)) => {
                let end = match &f.reason {
                    FinishReason::Error(e) => Err(e.as_str()),
                    _ => Ok((&f, split.end(tools, out))),
                };
                if let Some(d) = done.take() {
                    d(out, end);
                }
                true
            }
            None => true,
        };
        for e in out.drain() {
            if tx.send(Ok(e)).await.is_err() {
                return;
            }
        }
        if ended {
            return;
        }
    }
}

/// The stream's state: its reasoning read apart where the job asks (`Job::reasoning`); without
/// tools every other piece is text; with them, the text that cannot be part of a call goes out
/// as it comes and the rest is held while the call reader follows it.
#[derive(Default)]
pub(crate) struct Split {
    think: Option<Splitter>,
    /// The whole text so far and how much of it went out as text.
    full: String,
    sent: usize,
    reader: CallReader,
}

impl Split {
    /// Reasoning read apart where `reasoning` says whether the answer starts inside its block.
    pub(crate) fn new(reasoning: Option<bool>) -> Split {
        Split { think: reasoning.map(Splitter::new), ..Default::default() }
    }

    /// One more piece of the answer.
    pub(crate) fn piece(&mut self, tools: Option<&ToolAnswer>, piece: &str, out: &mut impl Blocks) {
        let piece = match self.think.as_mut().map(|t| t.push(piece)) {
            Some(p) => {
                if !p.reasoning.is_empty() {
                    out.reasoning(&p.reasoning);
                }
                p.content
            }
            None => piece.to_string(),
        };
        self.content(tools, &piece, out);
    }

    /// One more piece of the content.
    fn content(&mut self, tools: Option<&ToolAnswer>, piece: &str, out: &mut impl Blocks) {
        let Some(t) = tools else {
            if !piece.is_empty() {
                out.text(piece);
            }
            return;
        };
        self.full.push_str(piece);
        let plain = t.plain(&self.full).max(self.sent);
        if plain > self.sent {
            out.text(&self.full[self.sent..plain]);
        }
        self.sent = plain;
        let mut deltas = vec![];
        self.reader.feed(&self.full, self.sent, &t.tools, &mut deltas);
        for d in deltas {
            match d {
                CallDelta::Start { index, name } => out.call(index, &name),
                CallDelta::Args { text, .. } => out.args(&text),
            }
        }
    }

    /// The answer ended: the calls the reader did not follow go out whole, or, where there
    /// were none at all, the held text. Returns how many calls the answer made.
    pub(crate) fn end(&mut self, tools: Option<&ToolAnswer>, out: &mut impl Blocks) -> usize {
        if let Some(p) = self.think.as_mut().map(Splitter::finish) {
            if !p.reasoning.is_empty() {
                out.reasoning(&p.reasoning);
            }
            self.content(tools, &p.content, out);
        }
        let Some(t) = tools else { return 0 };
        let (_, calls) = t.read(&self.full);
        let streamed = self.reader.started();
        if streamed == 0 && calls.is_empty() && self.sent < self.full.len() {
            out.text(&self.full[self.sent..]);
        }
        if let Some(rest) = calls.get(streamed..).filter(|r| !r.is_empty()) {
            out.calls(streamed, rest);
        }
        calls.len().max(streamed)
    }

    /// Whether every call the reader followed closed its arguments (an answer cut inside one
    /// did not end with calls).
    pub(crate) fn all_closed(&self) -> bool {
        self.reader.all_closed()
    }
}
