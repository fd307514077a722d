//! The HTTP test harness: a server on a real model over a local port, and a minimal HTTP/1.1
//! client over a TCP socket (so a test can also hang up mid-stream).
#![allow(dead_code)] // each test file uses a part

use corelm_engine::{Engine, EngineConfig, Tokenizer};
use corelm_server::ServeConfig;
use serde_json::{json, Value};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

pub struct Server {
    pub addr: SocketAddr,
    pub _rt: tokio::runtime::Runtime,
}

pub fn start(parallel: usize, max_queue: usize, api_key: Option<&str>) -> Server {
    start_tp(parallel, max_queue, api_key, 1)
}

/// A server whose engine runs `tp` tensor-parallel shards (virtual nodes).
pub fn start_tp(parallel: usize, max_queue: usize, api_key: Option<&str>, tp: usize) -> Server {
    start_model(MODEL, parallel, max_queue, api_key, tp)
}

/// A server of the model file `model` (no `.gguf`).
pub fn start_model(model: &str, parallel: usize, max_queue: usize, api_key: Option<&str>, tp: usize) -> Server {
    start_cfg(model, parallel, max_queue, api_key, tp, Default::default())
}

/// A server whose requests take `defaults` for the sampling fields they leave out.
pub fn start_defaults(parallel: usize, defaults: corelm_server::api::RequestDefaults) -> Server {
    start_cfg(MODEL, parallel, 16, None, 1, defaults)
}

fn start_cfg(model: &str, parallel: usize, max_queue: usize, api_key: Option<&str>, tp: usize, defaults: corelm_server::api::RequestDefaults) -> Server {
    start_with(model, parallel, max_queue, api_key, tp, defaults, vec![], None, None, None)
}

/// A server of SmolLM2 with LoRA adapters loaded (`serve --lora`).
pub fn start_lora(parallel: usize, lora: Vec<corelm_engine::lora::LoraSpec>) -> Server {
    start_with(MODEL, parallel, 16, None, 1, Default::default(), lora, None, None, None)
}

/// A server of SmolLM2 with `template` as its chat template (`serve --chat-template`) and
/// `kwargs` its variables (`--chat-template-kwargs`).
pub fn start_template(template: &str, kwargs: Value) -> Server {
    start_with(MODEL, 1, 16, None, 1, Default::default(), vec![], None, Some((template, kwargs)), None)
}

/// A server of SmolLM2 with `--context-shift` (its `--keep` in `shift`) and a context of
/// `ctx` tokens.
pub fn start_shift(parallel: usize, ctx: usize, shift: corelm_engine::generate::ContextShift) -> Server {
    start_with(MODEL, parallel, 16, None, 1, Default::default(), vec![], None, None, Some((ctx, shift)))
}

/// A server of SmolLM2 with a draft model (`serve --spec-draft-model`), proposing up to
/// `n_max` tokens a step.
pub fn start_draft(parallel: usize, draft: &std::path::Path, n_max: usize) -> Server {
    start_with(MODEL, parallel, 16, None, 1, Default::default(), vec![], Some((draft, n_max)), None, None)
}

#[allow(clippy::too_many_arguments)]
fn start_with(
    model: &str,
    parallel: usize,
    max_queue: usize,
    api_key: Option<&str>,
    tp: usize,
    defaults: corelm_server::api::RequestDefaults,
    lora: Vec<corelm_engine::lora::LoraSpec>,
    draft: Option<(&std::path::Path, usize)>,
    chat_template: Option<(&str, Value)>,
    shift: Option<(usize, corelm_engine::generate::ContextShift)>,
) -> Server {
    let ctx = shift.map_or(1024, |s| s.0);
    let path = corelm_engine::models_dir().join(format!("{model}.gguf"));
    assert!(path.exists(), "{} missing: run scripts/fetch_models.py all", path.display());
    let cfg = EngineConfig {
        lora,
        n_ctx: ctx * parallel,
        n_batch: 64,
        n_seq_max: parallel,
        n_threads: 2,
        pin: false,
        batch_invariant: true,
        tp,
        ..Default::default()
    };
    let engine = Engine::load(&path, cfg).unwrap();
    let tok = Tokenizer::from_gguf(engine.gguf()).unwrap();
    let scfg = ServeConfig { context_shift: shift.map(|s| s.1), model_id: model.into(), aliases: vec![], max_queue, ctx_size: ctx, api_key: api_key.map(Into::into), tpot_target: Some(0.1), pooling: corelm_engine::embed::Pooling::Mean, lookup: 0, defaults, chat_template: chat_template.as_ref().map(|t| t.0.into()), reasoning: true,
        template_kwargs: chat_template.and_then(|t| t.1.as_object().cloned()).unwrap_or_default(), slot_save_path: Some(slot_dir()) };
    let draft = draft.map(|(path, n_max)| {
        let params = corelm_engine::draft::DraftParams { n_max, ..Default::default() };
        corelm_engine::draft::DraftModel::load(path, &engine, &tok, params).unwrap()
    });
    let (router, _engine) = corelm_server::app_drafted(engine, draft, tok, scfg).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, router).await });
    Server { addr, _rt: rt }
}

/// The test servers' `--slot-save-path`: one directory per test process.
pub fn slot_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("corelm-test-slots-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of an SSE body.
    pub fn events(&self) -> Vec<String> {
        self.body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
    }
}

pub fn request(method: &str, path: &str, body: &str, extra: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
        body.len()
    )
}

pub async fn call(addr: SocketAddr, method: &str, path: &str, body: &str, extra: &str) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request(method, path, body, extra).as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
    Reply { status, headers: head.to_ascii_lowercase(), body }
}

pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

pub fn post(srv: &Server, path: &str, body: Value) -> Reply {
    srv._rt.block_on(call(srv.addr, "POST", path, &body.to_string(), ""))
}

pub fn get(srv: &Server, path: &str) -> Reply {
    srv._rt.block_on(call(srv.addr, "GET", path, "", ""))
}

pub fn metric(srv: &Server, name: &str) -> f64 {
    let m = get(srv, "/metrics").body;
    m.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

pub fn chat(content: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
           "temperature": 0, "stream": stream, "stream_options": {"include_usage": true}})
}

