//! `POST /v1/embeddings`, as OpenAI's: `input` a text, a list of texts, a token list or a
//! list of token lists; `encoding_format` `float` (default) or `base64` (little-endian f32,
//! what the `openai` client asks for by default); `dimensions` only the model's own.
//! Vectors are pooled as the server was started (`--pooling`, else the model's, else mean)
//! and Euclidean-normalized, as llama-server's.
//!
//! The inputs go to the engine thread as one `EmbedRequest`; the answer comes back on a
//! oneshot channel. A client that leaves closes it, and the batcher drops the request's
//! remaining inputs at its next pass.

use crate::api::{self, ApiError, Prompt};
use crate::{check_model, counted, read_body, AppState, S};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use corelm_engine::batcher::{EmbedRequest, EmbedSink, Work};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Most inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

#[derive(Deserialize, Debug)]
struct EmbeddingRequest {
    input: Prompt,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

type Answer = Result<Vec<Vec<f32>>, String>;

// The answer's body, serialized as typed values so each float keeps its shortest f32 form.
#[derive(Serialize)]
struct Answered<'a> {
    object: &'static str,
    data: Vec<Item>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct Item {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// The engine thread's end of one request: answers once; takes the request off the queue
/// count when it goes (answered or not).
struct Sink {
    tx: Option<tokio::sync::oneshot::Sender<Answer>>,
    st: Arc<AppState>,
}

impl EmbedSink for Sink {
    fn waiting(&self) -> bool {
        self.tx.as_ref().is_some_and(|t| !t.is_closed())
    }

    fn answer(mut self: Box<Self>, result: Answer) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(result);
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.st.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(crate) async fn embeddings(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let body = read_body(&st, &headers, &body)?;
        let req: EmbeddingRequest = api::fields(&body)?;
        check_model(&st, &req.model)?;
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(f) => return Err(ApiError::bad("encoding_format", format!("encoding_format must be \"float\" or \"base64\", got {f:?}"))),
        };
        let n_embd = st.n_embd;
        if let Some(d) = req.dimensions.filter(|&d| d != n_embd as u64) {
            return Err(ApiError::bad("dimensions", format!("this model's embeddings have {n_embd} dimensions; {d} cannot be given")));
        }
        let inputs = inputs(&st, req.input)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        if st.queued.fetch_add(1, Ordering::AcqRel) as usize >= st.cfg.max_queue {
            st.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(crate::queue_full(st.cfg.max_queue, 1));
        }
        let sink = Box::new(Sink { tx: Some(tx), st: st.clone() });
        let n_tokens: usize = inputs.iter().map(Vec::len).sum();
        let work = Work::Embed(EmbedRequest { inputs, pooling: st.cfg.pooling, normalize: true, sink, arrived: Instant::now() });
        if st.tx.lock().unwrap_or_else(|e| e.into_inner()).send(work).is_err() {
            return Err(crate::engine_stopped());
        }
        let vectors = match rx.await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, e)),
            Err(_) => return Err(crate::engine_stopped()),
        };
        let data = vectors
            .into_iter()
            .enumerate()
            .map(|(index, v)| {
                let embedding = if base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    Vector::Float(v)
                };
                Item { object: "embedding", index, embedding }
            })
            .collect();
        let usage = Usage { prompt_tokens: n_tokens, total_tokens: n_tokens };
        Ok(axum::Json(Answered { object: "list", data, model: st.model_name(), usage }).into_response())
    }
    .await;
    counted(&st, "embeddings", r)
}

/// The inputs as token lists (texts tokenized as prompts are: BOS as the model wants it,
/// special tokens parsed), each checked against the context and the vocabulary.
fn inputs(st: &AppState, input: Prompt) -> Result<Vec<Vec<u32>>, ApiError> {
    let text = |s: &str, field: &str| {
        if s.is_empty() {
            return Err(ApiError::bad(field, "the input is empty"));
        }
        crate::encode(st, s, field)
    };
    let lists = match input {
        Prompt::Text(s) => vec![text(&s, "input")?],
        Prompt::Tokens(t) => vec![t],
        Prompt::Texts(v) => v.iter().enumerate().map(|(i, s)| text(s, &format!("input[{i}]"))).collect::<Result<_, _>>()?,
        Prompt::TokenLists(v) => v,
    };
    if lists.is_empty() {
        return Err(ApiError::bad("input", "no input to embed"));
    }
    if lists.len() > MAX_INPUTS {
        return Err(ApiError::bad("input", format!("{} inputs; one request takes at most {MAX_INPUTS}", lists.len())));
    }
    let (ctx, n_vocab) = (st.cfg.ctx_size, st.tok.n_vocab());
    for (i, l) in lists.iter().enumerate() {
        let field = if lists.len() > 1 { format!("input[{i}]") } else { "input".to_string() };
        if l.is_empty() {
            return Err(ApiError::bad(&field, "the input is empty"));
        }
        if let Some(&t) = l.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ApiError::bad(&field, format!("token id {t} is outside the vocabulary of {n_vocab}")));
        }
        if l.len() > ctx {
            let mut e = ApiError::bad(&field, format!("this model's maximum context length is {ctx} tokens; the input has {}", l.len()));
            e.code = Some("context_length_exceeded");
            return Err(e);
        }
    }
    Ok(lists)
}
