//! llama.cpp's own endpoints, answered in llama.cpp's completion format, not OpenAI's:
//! `POST /completion` (`prompt` a text or token ids) and `POST /infill`, the fill-in-the-middle
//! endpoint editor plugins call (llama.vim, llama.vscode).
//!
//! Requests: `n_predict` (−1: the rest of the context) and the sampling fields the OpenAI
//! endpoints take under their names. `/infill`: `input_prefix` and `input_suffix` (required),
//! `input_extra` (files of context, `[{"filename", "text"}]`), `prompt` (text after the
//! prefix); the prompt is [`corelm_engine::infill::prompt`]'s (llama-server's repository
//! layout where files are given).
//!
//! Answer: one JSON object (`content`, `stop: true`, `stop_type` `eos`/`word`/`limit`/`none`
//! with the stop string as `stopping_word`,
//! `tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `timings`; cut to the paths of
//! `response_fields` where given), or with `stream` SSE `data:` chunks of `content` with
//! `stop: false`, then that object with `content` empty — and no `[DONE]`, as llama-server
//! sends them.
//!
//! `n_probs: N` (1..=20; `logprobs` as its alias) adds llama-server's
//! `completion_probabilities`: per generated token `{id, token, bytes, logprob,
//! top_logprobs: [{id, token, bytes, logprob}; N]}`, the model's own distribution (before the
//! sampling chain) — all of them in the final object, or one per streamed chunk. With
//! `post_sampling_probs: true` they are the sampling chain's distribution instead (after the
//! cuts, the temperature and a grammar's mask), as probabilities under `prob` and `top_probs`,
//! tokens the chain cut left out: llama-server's shape. A token chosen without a draw
//! (temperature 0) has probability 1 and is its own only alternative.
//!
//! Also llama-server's `GET /props` (the default generation settings, slots, context, chat
//! template, BOS/EOS; `POST /props` changes nothing and says so) and `POST /apply-template`
//! (a chat request's messages, and tools, rendered as the prompt the chat endpoint would
//! generate after: `{"prompt"}`).

use crate::api::{self, ApiError};
use crate::{AppState, Job, S};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as Sse, Sse as SseResponse};
use axum::response::{IntoResponse, Response};
use corelm_engine::batcher::{Event, Finish, FinishReason, TokenLogprob};
use corelm_engine::infill::Chunk;
use corelm_engine::sample::Mirostat;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;

#[derive(Deserialize, Debug)]
struct InfillRequest {
    input_prefix: String,
    input_suffix: String,
    #[serde(default)]
    input_extra: Vec<ExtraChunk>,
    #[serde(default)]
    prompt: String,
}

#[derive(Deserialize, Debug)]
struct ExtraChunk {
    text: String,
    #[serde(default = "tmp")]
    filename: String,
}

/// llama-server's name for a context file without one.
fn tmp() -> String {
    "tmp".into()
}

/// The body, with llama.cpp's `n_predict` as `max_tokens` (−1 or absent: the rest of the
/// context), its common fields checked, and the model.
/// `n_probs` (or its alias `logprobs`, a number): how many alternatives per token, `None` for
/// no `completion_probabilities`.
fn n_probs(body: &Value) -> Result<Option<usize>, ApiError> {
    let (field, v) = match (body.get("n_probs"), body.get("logprobs")) {
        (Some(v), _) if !v.is_null() => ("n_probs", v),
        (_, Some(v)) if v.is_number() => ("logprobs", v),
        _ => return Ok(None),
    };
    match v.as_u64() {
        Some(0) => Ok(None),
        Some(n) if n <= 20 => Ok(Some(n as usize)),
        _ => Err(ApiError::bad(field, format!("{field} must be an integer in 0..=20, got {v}"))),
    }
}

fn read(st: &AppState, headers: &HeaderMap, body: &[u8]) -> Result<(Value, crate::api::GenParams), ApiError> {
    let mut body = crate::read_body(st, headers, body)?;
    match body.get("n_predict").map(Value::as_i64) {
        Some(Some(n)) if n >= 0 && body.get("max_tokens").is_none() => body["max_tokens"] = json!(n),
        Some(Some(_)) | None => {}
        Some(None) => return Err(ApiError::bad("n_predict", "n_predict must be an integer")),
    }
    let common: api::Common = api::fields(&body)?;
    crate::check_model(st, &common.model)?;
    let params = common.params(&st.cfg.defaults)?;
    if params.n != 1 {
        return Err(ApiError::bad("n", "llama.cpp's endpoints answer one completion"));
    }
    let mut params = params;
    params.chain_probs = match body.get("post_sampling_probs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("post_sampling_probs", "post_sampling_probs must be a boolean")),
    };
    Ok((body, params))
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum NativePrompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Deserialize, Debug)]
struct CompletionRequest {
    prompt: NativePrompt,
}

pub(crate) async fn completion(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let (body, params) = read(&st, &headers, &body)?;
        let req: CompletionRequest = api::fields(&body)?;
        let paths = fields(&body)?;
        let tokens = match req.prompt {
            NativePrompt::Tokens(t) => t,
            NativePrompt::Text(s) => st.tok.encode(&s, true, true).map_err(|e| ApiError::bad("prompt", e.to_string()))?,
        };
        let job = crate::submit(&st, vec![tokens], params, n_probs(&body)?, "cmpl", "prompt")?;
        Ok(answer(st.clone(), job, paths).await)
    }
    .await;
    crate::counted(&st, "completion", r)
}

pub(crate) async fn infill(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let (body, params) = read(&st, &headers, &body)?;
        let req: InfillRequest = api::fields(&body)?;
        let paths = fields(&body)?;
        let extra: Vec<Chunk> = req.input_extra.into_iter().map(|c| Chunk { filename: c.filename, text: c.text }).collect();
        let tokens = crate::fim_prompt(&st, &req.input_prefix, &req.input_suffix, &extra, &req.prompt, params.max_tokens, "input_prefix")?;
        let job = crate::submit(&st, vec![tokens], params, n_probs(&body)?, "infill", "input_prefix")?;
        Ok(answer(st.clone(), job, paths).await)
    }
    .await;
    crate::counted(&st, "infill", r)
}

/// One token of llama-server's `completion_probabilities`: log-probabilities, or with
/// `chain` (`post_sampling_probs`) probabilities under llama-server's other keys.
fn token_probs(st: &AppState, id: u32, lp: &TokenLogprob, chain: bool) -> Value {
    let (key, top_key) = if chain { ("prob", "top_probs") } else { ("logprob", "top_logprobs") };
    let value = |l: f32| if chain { json!(l.exp()) } else { json!(l) };
    let piece = |t: u32| {
        let bytes = st.tok.piece(t);
        (String::from_utf8_lossy(bytes).into_owned(), bytes.to_vec())
    };
    let (token, bytes) = piece(id);
    let top: Vec<Value> = lp
        .top
        .iter()
        .map(|&(t, l)| {
            let (token, bytes) = piece(t);
            json!({"id": t, "token": token, "bytes": bytes, key: value(l)})
        })
        .collect();
    json!({"id": id, "token": token, "bytes": bytes, key: value(lp.logprob), top_key: top})
}

/// llama.cpp's final object for a finished request.
fn final_object(st: &AppState, content: &str, f: &Finish) -> Value {
    let stop_type = match f.reason {
        FinishReason::Stop if f.stop_word.is_some() => "word",
        FinishReason::Stop => "eos",
        FinishReason::Length => "limit",
        _ => "none",
    };
    let prompt_ms = 1000.0 * (f.ttft_secs - f.queue_secs).max(0.0);
    let predicted_ms = 1000.0 * f.tpot_secs * f.completion_tokens.saturating_sub(1) as f64;
    let per_second = |n: usize, ms: f64| if ms > 0.0 { 1000.0 * n as f64 / ms } else { 0.0 };
    let evaluated = f.prompt_tokens.saturating_sub(f.cached_tokens);
    json!({
        "index": 0, "content": content, "tokens": [], "stop": true, "model": st.model_name(),
        "tokens_predicted": f.completion_tokens, "tokens_evaluated": f.prompt_tokens, "tokens_cached": f.cached_tokens,
        "stop_type": stop_type, "stopping_word": f.stop_word.as_deref().unwrap_or_default(), "has_new_line": content.contains('\n'),
        "truncated": f.dropped_tokens > 0,
        "timings": {
            "prompt_n": evaluated, "prompt_ms": prompt_ms, "prompt_per_second": per_second(evaluated, prompt_ms),
            "predicted_n": f.completion_tokens, "predicted_ms": predicted_ms, "predicted_per_second": per_second(f.completion_tokens.saturating_sub(1), predicted_ms),
        },
    })
}

/// `response_fields`: the paths (`timings/prompt_n`) the final object is cut to, each its own
/// key, as llama-server does (none: the whole object).
fn fields(body: &Value) -> Result<Vec<String>, ApiError> {
    match body.get("response_fields") {
        None | Some(Value::Null) => Ok(vec![]),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| ApiError::bad("response_fields", "response_fields must list strings")),
    }
}

/// `v` cut to `paths` (`a/b`: `v["a"]["b"]`, under the key `a/b`; absent ones left out).
fn only(paths: &[String], v: Value) -> Value {
    if paths.is_empty() {
        return v;
    }
    let picked = paths.iter().filter_map(|p| p.split('/').try_fold(&v, |at, k| at.get(k)).map(|x| (p.clone(), x.clone())));
    Value::Object(picked.collect())
}

async fn answer(st: Arc<AppState>, mut job: Job, paths: Vec<String>) -> Response {
    let Some(mut events) = job.choices.pop() else { return crate::respond::error_response("no request") };
    if !job.params.stream {
        let mut content = String::new();
        let mut probs = vec![];
        loop {
            match events.recv().await {
                Some(Event::Token { id, text, logprob }) => {
                    content.push_str(&text);
                    if let Some(lp) = &logprob {
                        probs.push(token_probs(&st, id, lp, job.params.chain_probs));
                    }
                }
                Some(Event::Text(text)) => content.push_str(&text),
                Some(Event::Prompt { .. }) => {} // not asked for here
                Some(Event::Done(f)) => {
                    if let FinishReason::Error(e) = &f.reason {
                        return crate::respond::error_response(e);
                    }
                    let mut out = final_object(&st, &content, &f);
                    if job.logprobs.is_some() {
                        out["completion_probabilities"] = Value::Array(probs);
                    }
                    return axum::Json(only(&paths, out)).into_response();
                }
                None => return crate::respond::error_response("the engine dropped the request"),
            }
        }
    }
    // SSE: when the client goes, the send fails and dropping the receiver cancels the sequence.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Sse, Infallible>>(64);
    let chain = job.params.chain_probs;
    tokio::spawn(async move {
        let mut predicted = 0;
        while let Some(event) = events.recv().await {
            let data = match event {
                Event::Prompt { .. } => continue, // not asked for here
                Event::Token { id, text, logprob } => {
                    predicted += 1;
                    let mut chunk = json!({"index": 0, "content": text, "tokens": [], "stop": false, "tokens_predicted": predicted});
                    if let Some(lp) = &logprob {
                        chunk["completion_probabilities"] = json!([token_probs(&st, id, lp, chain)]);
                    }
                    chunk
                }
                Event::Text(text) => json!({"index": 0, "content": text, "tokens": [], "stop": false, "tokens_predicted": predicted}),
                Event::Done(f) => match &f.reason {
                    FinishReason::Error(e) => json!({"error": {"message": e, "type": "server_error"}}),
                    _ => only(&paths, final_object(&st, "", &f)),
                },
            };
            let last = data["stop"] != json!(false);
            if tx.send(Ok(Sse::default().data(data.to_string()))).await.is_err() || last {
                return;
            }
        }
    });
    SseResponse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response()
}

/// llama-server's `GET /props`.
pub(crate) async fn props(State(st): S, headers: HeaderMap) -> Response {
    let r = crate::check_auth(&st, &headers).map(|_| {
        let d = &st.cfg.defaults.sampling;
        let params = json!({
            "n_predict": st.cfg.defaults.max_tokens.map_or(-1, |n| n as i64), "seed": -1, "temperature": d.temperature, "dynatemp_range": d.dynatemp_range,
            "dynatemp_exponent": d.dynatemp_exponent, "top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p,
            "top_n_sigma": d.top_n_sigma, "xtc_probability": d.xtc_probability, "xtc_threshold": d.xtc_threshold,
            "typical_p": d.typical_p, "repeat_last_n": d.repeat_last_n, "repeat_penalty": d.repeat_penalty,
            "presence_penalty": d.presence_penalty, "frequency_penalty": d.frequency_penalty,
            "dry_multiplier": d.dry.multiplier, "dry_base": d.dry.base, "dry_allowed_length": d.dry.allowed_length,
            "dry_penalty_last_n": d.dry.last_n, "dry_sequence_breakers": st.cfg.defaults.dry_breakers,
            "mirostat": match d.mirostat { Mirostat::Off => 0, Mirostat::V1 => 1, Mirostat::V2 => 2 },
            "mirostat_tau": d.mirostat_tau, "mirostat_eta": d.mirostat_eta, "n_probs": 0, "min_keep": 0,
            "n_keep": st.cfg.context_shift.map_or(0, |c| c.n_keep), "n_discard": 0, "context_shift": st.cfg.context_shift.is_some(),
            "stop": [], "ignore_eos": false, "stream": false, "post_sampling_probs": false,
            "samplers": d.order.iter().map(|s| s.name()).collect::<Vec<_>>(),
        });
        let token = |t: Option<u32>| t.map_or(String::new(), |t| st.tok.text(t).to_string());
        axum::Json(json!({
            "default_generation_settings": {"params": params, "n_ctx": st.cfg.ctx_size},
            "total_slots": st.slots,
            "model_alias": st.model_name(),
            "model_path": st.cfg.model_id,
            "modalities": {"vision": false, "audio": false, "video": false},
            "chat_template": st.template_source.clone().unwrap_or_default(),
            "bos_token": token(st.tok.bos),
            "eos_token": token(st.tok.eos),
            "build_info": concat!("corelm ", env!("CARGO_PKG_VERSION")),
            "is_sleeping": false,
        }))
        .into_response()
    });
    crate::counted(&st, "props", r)
}

/// llama-server's `POST /props`: nothing here can be changed while serving.
pub(crate) async fn set_props(State(st): S, headers: HeaderMap) -> Response {
    let r = crate::check_auth(&st, &headers).and_then(|_| {
        Err(ApiError::new(axum::http::StatusCode::NOT_IMPLEMENTED, "not_supported_error", None, "this server does not change its properties while serving"))
    });
    crate::counted(&st, "props", r)
}

/// llama-server's `POST /apply-template`: the prompt a chat request would generate after.
pub(crate) async fn apply_template(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        let (common, req): (_, api::ChatRequest) = crate::read_request(&st, &headers, &body)?;
        let mut params = common.params(&st.cfg.defaults)?;
        let p = crate::chat_prompt(&st, &req, &mut params, None)?;
        Ok(axum::Json(json!({"prompt": p.text})).into_response())
    })();
    crate::counted(&st, "apply_template", r)
}
