//! corelm server: an OpenAI-compatible HTTP front end over the engine's continuous batcher.
//!
//! ```text
//!  HTTP (axum, tokio)                      engine thread (std)
//!  handler ─ validate ─ Request{sink} ──▶ mpsc ──▶ batcher::run: step, step, ...
//!     ▲                                              │ sink(Event) per token
//!     └──── tokio mpsc ◀──── (events) ◀──────────────┘
//! ```
//!
//! * [`api`]: request bodies, validation into engine parameters, OpenAI error bodies.
//! * [`metrics`]: Prometheus text exposition.
//! * `embed`: `/v1/embeddings`.
//! * `native`: llama.cpp's `/completion` and `/infill`, answered in llama.cpp's format.
//! * `anthropic`, `responses`: Anthropic's Messages API and OpenAI's Responses API, each a
//!   rewrite into a chat request ([`submit_chat`]) answered in its own shape (`blocks`: a
//!   streamed answer split into text and calls for them).
//! * this file: the router, the handlers (JSON and SSE; also `/v1/models/{id}`, `/tokenize`,
//!   `/detokenize` and `/tokenizer_info` in both llama.cpp's and vLLM's shapes — the latter is
//!   what lm-evaluation-harness's remote tokenizer asks for), admission (bounded queue → 429,
//!   never-fitting request → 400 `context_length_exceeded`), authentication (a bearer token
//!   or `x-api-key`).
//!
//! Invariants: HTTP and JSON live here only — the engine sees token ids and sinks. A client
//! that goes away drops its event receiver; the next event the engine sends fails and the
//! sequence is cancelled and its blocks released.

mod anthropic;
pub mod api;
mod blocks;
mod embed;
mod lora;
mod native;
pub mod metrics;
mod respond;
mod responses;
mod slots;

use api::{ApiError, ChatRequest, CompletionRequest, GenParams, Prompt};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use corelm_engine::batcher::{self, Batcher, Event, Request, Stats, Work};
use corelm_engine::constraint::Constraint;
use corelm_engine::embed::Pooling;
use corelm_engine::generate::ContextShift;
use corelm_engine::sample::{Breakers, InfillVocab, Stage};
use corelm_engine::chat::ChatTemplate;
use corelm_engine::draft::DraftModel;
use corelm_engine::{Engine, Tokenizer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

/// Server settings (the engine's own are in its `EngineConfig`).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The model's id (its file name without `.gguf`): a request's `model` may name it, and
    /// slot files record it.
    pub model_id: String,
    /// Other names a request's `model` may give (`--alias`); the first is the name answers
    /// and `/v1/models` report, as llama-server's.
    pub aliases: Vec<String>,
    /// Most requests accepted and still without a first token; beyond, 429.
    pub max_queue: usize,
    /// Longest prompt + completion of one request.
    pub ctx_size: usize,
    pub api_key: Option<String>,
    /// Keep steps with running decodes within this many seconds by shrinking prompt chunks.
    pub tpot_target: Option<f64>,
    /// How `/v1/embeddings` pools an input's rows.
    pub pooling: Pooling,
    /// Most prompt-lookup draft tokens a decoding request feeds per step (0: off).
    pub lookup: usize,
    /// The sampling of a request that leaves fields out.
    pub defaults: api::RequestDefaults,
    /// The chat template in place of the model's: `chatml`, `gemma` or jinja source.
    pub chat_template: Option<String>,
    /// Answer reasoning blocks apart where the template writes them (`--reasoning-format`).
    pub reasoning: bool,
    /// Template variables of every request, under its own `chat_template_kwargs`
    /// (`--chat-template-kwargs`).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Where `POST /slots/{id}` saves and restores slots (`--slot-save-path`; `None`: a 501).
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Context shift (`--context-shift`, with `--keep`'s default): an answer may pass the
    /// context, dropping tokens after the first kept ones when it fills; a request's
    /// `n_keep` and `n_discard` override the cut. `None`: answers end at the context.
    pub context_shift: Option<corelm_engine::generate::ContextShift>,
}

pub struct AppState {
    cfg: ServeConfig,
    /// Requests' decode steps feed drafts (prompt lookup's or a draft model's).
    speculative: bool,
    tx: Mutex<mpsc::Sender<Work>>,
    tok: Arc<Tokenizer>,
    /// The model's embedding width.
    n_embd: usize,
    template: ChatTemplate,
    /// The GGUF's chat template source, if it has one (`/tokenizer_info`).
    template_source: Option<String>,
    stats: Arc<Stats>,
    pub metrics: metrics::Metrics,
    /// Requests accepted and without a first event yet.
    queued: Arc<AtomicU64>,
    created: u64,
    /// DRY's breakers as found in the vocabulary, for the last few lists of texts asked for.
    breakers: Mutex<Vec<(Vec<String>, Arc<Breakers>)>>,
    /// What the `infill` sampler reads of the vocabulary, made when a request first asks for it
    /// (`None`: the vocabulary has no end token).
    infill: std::sync::OnceLock<Option<Arc<InfillVocab>>>,
    /// Sequences served at once (`--parallel`).
    slots: usize,
    /// LoRA adapters and the server's scales (`/lora-adapters`).
    lora: lora::Loras,
}

/// Start the engine thread and build the router. The engine thread ends when the router (and
/// with it every sender) is dropped.
pub fn app(engine: Engine, tok: Tokenizer, cfg: ServeConfig) -> Result<(Router, std::thread::JoinHandle<()>), String> {
    app_drafted(engine, None, tok, cfg)
}

/// [`app`], with a draft model proposing every decoding request's drafts where one is given
/// (in place of `cfg.lookup`'s).
pub fn app_drafted(engine: Engine, draft: Option<DraftModel>, tok: Tokenizer, cfg: ServeConfig) -> Result<(Router, std::thread::JoinHandle<()>), String> {
    let (template, template_source) = match &cfg.chat_template {
        Some(t) => (ChatTemplate::named(t, &tok).map_err(|e| e.to_string())?, Some(t.clone()).filter(|t| !ChatTemplate::is_builtin_name(t))),
        None => (
            ChatTemplate::from_gguf(engine.gguf(), &tok).map_err(|e| e.to_string())?,
            engine.gguf().opt_str("tokenizer.chat_template").ok().flatten().map(str::to_string),
        ),
    };
    let tok = Arc::new(tok);
    let n_embd = engine.hyper().n_embd;
    let loras = lora::Loras::new(engine.lora_adapters());
    let mut cfg = cfg;
    let mut b = Batcher::new(engine, tok.clone());
    b.set_tpot_target(cfg.tpot_target);
    b.set_lookup(cfg.lookup, true);
    let speculative = cfg.lookup > 0 || draft.is_some();
    if let Some(d) = draft {
        b.set_draft_model(d);
    }
    cfg.ctx_size = cfg.ctx_size.min(b.max_context());
    let stats = b.stats();
    let slots = b.engine().config().n_seq_max;
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("corelm-engine".into())
        .spawn(move || batcher::run(b, rx))
        .map_err(|e| format!("engine thread: {e}"))?;
    // With DRY on by default, its breakers are found in the vocabulary once, here.
    let d = &cfg.defaults;
    let seed_breakers = if d.sampling.dry.is_on() { vec![(d.dry_breakers.clone(), Arc::new(Breakers::new(&tok, &d.dry_breakers)))] } else { vec![] };
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let state = Arc::new(AppState {
        cfg,
        speculative,
        tx: Mutex::new(tx),
        tok,
        n_embd,
        template,
        template_source,
        stats,
        metrics: metrics::Metrics::default(),
        queued: Arc::new(AtomicU64::new(0)),
        breakers: Mutex::new(seed_breakers),
        infill: std::sync::OnceLock::new(),
        slots,
        created,
        lora: loras,
    });
    let router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/chat/completions/input_tokens", post(chat_input_tokens))
        .route("/chat/completions/input_tokens", post(chat_input_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/responses/input_tokens", post(responses::input_tokens))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embed::embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{model}", get(model))
        .route("/completion", post(native::completion))
        .route("/completions", post(native::completion))
        .route("/props", get(native::props).post(native::set_props))
        .route("/slots", get(slots::slots))
        .route("/slots/{id}", post(slots::slot_action))
        .route("/apply-template", post(native::apply_template))
        .route("/infill", post(native::infill))
        .route("/lora-adapters", get(lora::list).post(lora::set))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/tokenizer_info", get(tokenizer_info))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .with_state(state);
    Ok((router, handle))
}

/// Serve on `listener` until ctrl-c, then drain in-flight requests.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}

type S = State<Arc<AppState>>;

/// The API key as OpenAI's clients send it (`Authorization: Bearer KEY`) or Anthropic's
/// (`x-api-key: KEY`).
fn check_auth(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &st.cfg.api_key else { return Ok(()) };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let given = header("authorization").and_then(|v| v.strip_prefix("Bearer ")).or(header("x-api-key"));
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", Some("invalid_api_key"), "missing or invalid API key"))
    }
}

impl AppState {
    /// The name answers report: the first `--alias`, else the model's id.
    fn model_name(&self) -> &str {
        self.cfg.aliases.first().unwrap_or(&self.cfg.model_id)
    }
}

fn check_model(st: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if *m != st.cfg.model_id && !st.cfg.aliases.contains(m) => Err(ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model_not_found"),
                format!("model {m:?} does not exist; this server serves {:?}", st.model_name()),
            )
        }),
        _ => Ok(()),
    }
}

/// Record the status of a finished handler in the metrics.
fn counted(st: &AppState, endpoint: &'static str, r: Result<Response, ApiError>) -> Response {
    let r = r.unwrap_or_else(IntoResponse::into_response);
    st.metrics.request(endpoint, r.status().as_u16());
    r
}

async fn health(State(st): S) -> Response {
    let body = serde_json::json!({
        "status": "ok",
        "running": st.stats.running.load(Ordering::Relaxed),
        "waiting": st.stats.waiting.load(Ordering::Relaxed),
    });
    counted(&st, "health", Ok(axum::Json(body).into_response()))
}

async fn metrics_text(State(st): S) -> Response {
    let text = st.metrics.render(&st.stats, st.queued.load(Ordering::Relaxed));
    let r = ([("content-type", "text/plain; version=0.0.4")], text).into_response();
    counted(&st, "metrics", Ok(r))
}

/// The served model as `/v1/models` lists it.
fn model_card(st: &AppState) -> serde_json::Value {
    serde_json::json!({
        "id": st.model_name(), "aliases": st.cfg.aliases, "object": "model", "created": st.created, "owned_by": "corelm",
        "meta": {"n_ctx": st.cfg.ctx_size, "n_vocab": st.tok.n_vocab()},
    })
}

async fn models(State(st): S, headers: HeaderMap) -> Response {
    let r = check_auth(&st, &headers).map(|_| axum::Json(serde_json::json!({"object": "list", "data": [model_card(&st)]})).into_response());
    counted(&st, "models", r)
}

/// `GET /v1/models/{model}` (the `openai` client's `models.retrieve`).
async fn model(State(st): S, headers: HeaderMap, axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    let r = check_auth(&st, &headers).and_then(|_| check_model(&st, &Some(id))).map(|_| axum::Json(model_card(&st)).into_response());
    counted(&st, "models", r)
}

/// `POST /tokenize`, as llama.cpp's server: `{"content": TEXT, "add_special": false,
/// "with_pieces": false}` → `{"tokens": [ID, ...]}` (with pieces: `[{"id", "piece"}]`, a piece
/// that is not whole UTF-8 as its bytes); or as vLLM's: `{"prompt": TEXT,
/// "add_special_tokens": true}`. Special tokens' text is parsed either way.
async fn tokenize(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    #[derive(serde::Deserialize)]
    struct Req {
        #[serde(alias = "prompt")]
        content: String,
        add_special: Option<bool>,
        add_special_tokens: Option<bool>,
        #[serde(default)]
        with_pieces: bool,
    }
    let r = (|| {
        check_auth(&st, &headers)?;
        let req: Req = api::fields(&api::parse_body(&body)?)?;
        // Each server's default: llama.cpp adds no BOS unless asked, vLLM does.
        let special = req.add_special.or(req.add_special_tokens).unwrap_or(req.add_special_tokens.is_some());
        let ids = st.tok.encode(&req.content, special, true).map_err(|e| ApiError::bad("content", e.to_string()))?;
        let tokens: Vec<serde_json::Value> = if req.with_pieces {
            ids.iter()
                .map(|&id| {
                    let p = st.tok.piece(id);
                    let piece = std::str::from_utf8(p).map_or_else(|_| serde_json::json!(p), |t| serde_json::json!(t));
                    serde_json::json!({"id": id, "piece": piece})
                })
                .collect()
        } else {
            ids.iter().map(|&id| serde_json::json!(id)).collect()
        };
        let count = tokens.len();
        Ok(axum::Json(serde_json::json!({"tokens": tokens, "count": count, "max_model_len": st.cfg.ctx_size})).into_response())
    })();
    counted(&st, "tokenize", r)
}

/// `POST /detokenize`, as llama.cpp's server: `{"tokens": [ID, ...]}` → `{"content": TEXT}`
/// (and vLLM's `"prompt": TEXT`).
async fn detokenize(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    #[derive(serde::Deserialize)]
    struct Req {
        tokens: Vec<u32>,
    }
    let r = (|| {
        check_auth(&st, &headers)?;
        let req: Req = api::fields(&api::parse_body(&body)?)?;
        let n_vocab = st.tok.n_vocab();
        if let Some(t) = req.tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ApiError::bad("tokens", format!("token id {t} is outside the vocabulary of {n_vocab}")));
        }
        let text = st.tok.decode(&req.tokens);
        Ok(axum::Json(serde_json::json!({"content": text, "prompt": text})).into_response())
    })();
    counted(&st, "detokenize", r)
}

/// `GET /tokenizer_info`, as vLLM's: the special tokens' text, the chat template, the context.
async fn tokenizer_info(State(st): S, headers: HeaderMap) -> Response {
    let r = check_auth(&st, &headers).map(|_| {
        let text = |t: Option<u32>| t.map(|t| st.tok.text(t).to_string());
        axum::Json(serde_json::json!({
            "tokenizer_class": format!("{:?}", st.tok.kind),
            "bos_token": text(st.tok.bos),
            "eos_token": text(st.tok.eos),
            "add_bos_token": st.tok.add_bos,
            "chat_template": st.template_source,
            "model_max_length": st.cfg.ctx_size,
            "vocab_size": st.tok.n_vocab(),
        }))
        .into_response()
    });
    counted(&st, "tokenizer_info", r)
}

async fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", Some("not_found"), "no such endpoint").into_response()
}

/// What a handler needs to answer once the request is submitted.
pub(crate) struct Job {
    /// Each choice's events, in choice order: prompt `c / n`'s choice `c % n`.
    pub choices: Vec<tokio::sync::mpsc::UnboundedReceiver<Event>>,
    pub params: GenParams,
    pub logprobs: Option<usize>,
    pub id: String,
    /// With tools offered: how to read calls out of the answer.
    pub tools: Option<respond::ToolAnswer>,
    /// `echo`: each prompt's text, put before its choices' answers (empty: no echo).
    pub echo: Vec<String>,
    /// Chat: where reasoning is read apart from the content, whether the answer starts inside
    /// its block (`ChatPrompt::reasoning`).
    pub reasoning: Option<bool>,
}

/// DRY's breakers for `texts` in this vocabulary: a walk of the vocabulary per text, so the
/// last 8 lists are kept (seeded with the server's defaults).
fn breakers(st: &AppState, texts: Vec<String>) -> Arc<Breakers> {
    let mut cache = st.breakers.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(at) = cache.iter().position(|(t, _)| *t == texts) {
        let hit = cache.remove(at);
        let b = hit.1.clone();
        cache.push(hit);
        return b;
    }
    let b = Arc::new(Breakers::new(&st.tok, &texts));
    if cache.len() == 8 {
        cache.remove(0);
    }
    cache.push((texts, b.clone()));
    b
}

/// Admission: context checks, queue bound, then hand the requests to the engine thread — one
/// per prompt and choice (`params.n`), all or none.
fn submit(
    st: &Arc<AppState>,
    prompts: Vec<Vec<u32>>,
    mut params: GenParams,
    logprobs: Option<usize>,
    prefix: &str,
    prompt_field: &str,
) -> Result<Job, ApiError> {
    let ctx = st.cfg.ctx_size;
    let n_vocab = st.tok.n_vocab();
    let sp = &mut params.sampling;
    // `WHOLE_CONTEXT` (−1) and anything longer is the context.
    for n in [&mut sp.repeat_last_n, &mut sp.dry.last_n] {
        *n = (*n).min(ctx);
    }
    if let Some(texts) = params.dry_breakers.take() {
        params.sampling.dry.breakers = breakers(st, texts);
    }
    if params.sampling.order.contains(&Stage::Infill) {
        let v = st.infill.get_or_init(|| InfillVocab::new(&st.tok).map(Arc::new));
        params.sampling.infill = Some(v.clone().ok_or_else(|| ApiError::bad("samplers", "the infill sampler needs an end-of-generation token, and this vocabulary has none"))?);
    }
    if let Some((t, _)) = params.sampling.logit_bias.iter().find(|(t, _)| *t as usize >= n_vocab) {
        return Err(ApiError::bad("logit_bias", format!("token id {t} is outside the vocabulary of {n_vocab}")));
    }
    if let Some(Constraint::Lazy(l)) = &params.constraint {
        l.check_triggers(n_vocab).map_err(|e| ApiError::bad("grammar_triggers", e.to_string()))?;
    }
    if let Some(c) = &params.constraint {
        c.check(n_vocab).map_err(|e| ApiError::bad("grammar", e.to_string()))?;
    }
    let lora = st.lora.resolve(params.lora.as_ref())?;
    let count = prompts.len().saturating_mul(params.n);
    if prompts.is_empty() {
        return Err(ApiError::bad(prompt_field, "no prompt"));
    }
    let most = api::MAX_CHOICES.min(st.cfg.max_queue);
    if count > most {
        return Err(ApiError::bad("n", format!("{} prompts × n = {} asks for {count} choices; this server takes at most {most}", prompts.len(), params.n)));
    }
    let mut max_tokens = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.iter().enumerate() {
        let field = if prompts.len() > 1 { format!("{prompt_field}[{i}]") } else { prompt_field.to_string() };
        if prompt.is_empty() {
            return Err(ApiError::bad(&field, "the prompt is empty"));
        }
        if let Some(&t) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ApiError::bad(&field, format!("token id {t} is outside the vocabulary of {n_vocab}")));
        }
        // Unset: the server's `-n`, within the rest of the context.
        let room = ctx.saturating_sub(prompt.len());
        let m = params.max_tokens.unwrap_or_else(|| st.cfg.defaults.max_tokens.map_or(room, |d| d.min(room)));
        // With context shift, a limit past the context is taken (the prompt must leave room).
        let past = if st.cfg.context_shift.is_some() && room > 0 { 0 } else { m };
        if (m == 0 && params.max_tokens.is_none()) || prompt.len().saturating_add(past) > ctx {
            let mut e = ApiError::bad(
                &field,
                format!("this model's maximum context length is {ctx} tokens; the request has {} prompt tokens and asks for {} completion tokens", prompt.len(), m.max(1)),
            );
            e.code = Some("context_length_exceeded");
            return Err(e);
        }
        max_tokens.push(m);
    }
    let queued = st.queued.fetch_add(count as u64, Ordering::AcqRel);
    if queued as usize + count > st.cfg.max_queue {
        st.queued.fetch_sub(count as u64, Ordering::AcqRel);
        return Err(queue_full(st.cfg.max_queue, count));
    }
    let mut choices = Vec::with_capacity(count);
    let tx = st.tx.lock().unwrap_or_else(|e| e.into_inner());
    for c in 0..count {
        let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
        let st2 = st.clone();
        let mut first = true;
        // Runs on the engine thread: bookkeeping here sees every request's end, including those
        // whose client has gone.
        let sink = Box::new(move |e: Event| {
            if first {
                first = false;
                st2.queued.fetch_sub(1, Ordering::AcqRel);
            }
            if let Event::Done(f) = &e {
                st2.metrics.finished(f);
            }
            etx.send(e).is_ok()
        });
        let mut sampling = params.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add((c % params.n) as u64);
        let req = Request {
            prompt: prompts[c / params.n].clone(),
            max_tokens: max_tokens[c / params.n],
            sampling,
            stop: params.stop.clone(),
            ignore_eos: params.ignore_eos,
            logprobs,
            chain_probs: params.chain_probs,
            prompt_logprobs: params.prompt_logprobs,
            constraint: params.constraint.clone(),
            lora: lora.clone(),
            context_shift: st.cfg.context_shift.map(|d| ContextShift { n_keep: params.n_keep.unwrap_or(d.n_keep), n_discard: params.n_discard.unwrap_or(d.n_discard), n_ctx: ctx }),
            sink,
            arrived: Instant::now(),
        };
        if tx.send(Work::Generate(Box::new(req))).is_err() {
            // The requests sent before have their sinks; those never sent are unqueued here.
            st.queued.fetch_sub((count - c) as u64, Ordering::AcqRel);
            return Err(engine_stopped());
        }
        choices.push(erx);
    }
    drop(tx);
    let n = REQ_ID.fetch_add(1, Ordering::Relaxed);
    Ok(Job { choices, params, logprobs, id: format!("{prefix}-{:x}{n:06x}", st.created), tools: None, echo: vec![], reasoning: None })
}

/// A chat answer's reasoning, where its job reads it apart (`Job::reasoning`), and the rest,
/// its content.
pub(crate) fn split_reasoning(reasoning: Option<bool>, text: String) -> (Option<String>, String) {
    match reasoning {
        Some(open) => corelm_engine::reasoning::split(&text, open),
        None => (None, text),
    }
}

static REQ_ID: AtomicU64 = AtomicU64::new(0);

/// 429: the queue bound (`--max-queue`) would be passed by `count` more requests.
fn queue_full(max_queue: usize, count: usize) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        Some("queue_full"),
        format!("the server queue is full ({max_queue} requests waiting, this one brings {count}); retry later"),
    );
    e.retry_after = Some(1);
    e
}

fn engine_stopped() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", None, "the engine has stopped")
}

/// Authentication, then the body parsed as a JSON object.
fn read_body(st: &AppState, headers: &HeaderMap, body: &[u8]) -> Result<serde_json::Value, ApiError> {
    check_auth(st, headers)?;
    api::parse_body(body)
}

/// The shared start of both completion endpoints: authentication, the body parsed once, the
/// common fields and the endpoint's own, and the model check — in that order.
fn read_request<T: serde::de::DeserializeOwned>(
    st: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(api::Common, T), ApiError> {
    let body = read_body(st, headers, body)?;
    let common: api::Common = api::fields(&body)?;
    let req: T = api::fields(&body)?;
    check_model(st, &common.model)?;
    Ok((common, req))
}

/// A fill-in-the-middle prompt ([`corelm_engine::infill::prompt`]) in the context less the
/// answer's room (`max_tokens`, else a quarter of the context), or a 400 on `field`
/// (`context_length_exceeded` where even its FIM tokens do not fit).
fn fim_prompt(st: &AppState, prefix: &str, suffix: &str, extra: &[corelm_engine::infill::Chunk], prompt: &str, max_tokens: Option<usize>, field: &str) -> Result<Vec<u32>, ApiError> {
    let ctx = st.cfg.ctx_size;
    let budget = ctx.saturating_sub(max_tokens.unwrap_or(ctx / 4));
    corelm_engine::infill::prompt(&st.tok, prefix, suffix, extra, prompt, budget).map_err(|e| {
        let mut a = ApiError::bad(field, e.to_string());
        if matches!(e, corelm_engine::Error::PromptTooLong { .. }) {
            a.code = Some("context_length_exceeded");
        }
        a
    })
}

/// Tokenize request text (BOS as the model wants it, special tokens parsed), or a 400 on `field`.
fn encode(st: &AppState, text: &str, field: &str) -> Result<Vec<u32>, ApiError> {
    st.tok.encode(text, true, true).map_err(|e| ApiError::bad(field, e.to_string()))
}

/// A chat request's prompt, as its template renders it, and how to read its answer.
pub(crate) struct ChatPrompt {
    pub text: String,
    /// With tools: how to read calls out of the answer.
    pub tools: Option<respond::ToolAnswer>,
    /// Where reasoning is read apart (`corelm_engine::reasoning`): whether the answer starts
    /// inside a block.
    pub reasoning: Option<bool>,
}

/// A chat request's prompt text, as its template renders the messages (with the request's
/// `chat_template_kwargs`, and the tools, the constraint that holds their calls put in
/// `params`), and how to read calls and reasoning back.
///
/// A last message of the assistant's (its text, no calls) is a prefill, as llama-server takes
/// one: the turns before it are rendered up to the assistant's turn and its text follows, so
/// the answer goes on from it (and holds only what comes after).
fn chat_prompt(st: &AppState, req: &ChatRequest, params: &mut GenParams, logprobs: Option<usize>) -> Result<ChatPrompt, ApiError> {
    let mut msgs = req.messages()?;
    let plan = req.tool_plan()?;
    let mut kwargs = st.cfg.template_kwargs.clone();
    kwargs.extend(req.chat_template_kwargs.clone().unwrap_or_default());
    let reasoning = req.reasoning(st.cfg.reasoning)? && st.template.thinks();
    let prefill = match msgs.last() {
        Some(m) if m.role == "assistant" && m.tool_calls.is_none() && msgs.len() > 1 => msgs.pop().map(|m| m.content),
        _ => None,
    };
    let (text, tools) = match plan {
        // Earlier calls and results, as this template takes them.
        None => {
            let msgs = corelm_engine::tools::for_template(&msgs, &[], st.template.tool_format());
            let mut text = st.template.render_with(&msgs, &[], true, &kwargs).map_err(|e| ApiError::bad("messages", e.to_string()))?;
            text.push_str(prefill.as_deref().unwrap_or_default());
            (text, None)
        }
        Some(_) if prefill.is_some() => return Err(ApiError::bad("messages", "a last assistant message (a prefill) together with tools is not supported")),
        Some(plan) => {
            if logprobs.is_some() {
                return Err(ApiError::bad("logprobs", "logprobs together with tools is not supported"));
            }
            match params.constraint {
                Some(Constraint::Json(_)) => return Err(ApiError::bad("response_format", "response_format together with tools is not supported")),
                Some(Constraint::Grammar(_) | Constraint::Lazy(_)) => return Err(ApiError::bad("grammar", "grammar together with tools is not supported")),
                None => {}
            }
            let (text, answer, held) = corelm_engine::tools::prompt(&st.template, &msgs, &plan.tools, &plan.choice, plan.parallel, &kwargs).map_err(|e| match e {
                corelm_engine::Error::Schema(m) => ApiError::bad("tools", m),
                e => ApiError::bad("messages", e.to_string()),
            })?;
            params.constraint = held;
            (text, Some(respond::ToolAnswer { answer, tools: plan.tools }))
        }
    };
    let reasoning = reasoning.then(|| corelm_engine::reasoning::starts_open(&text));
    Ok(ChatPrompt { text, tools, reasoning })
}

/// A chat request (`body`, parsed) read as the chat endpoint reads it: its parameters, its
/// prompt and the prompt's tokens.
fn prepare_chat(st: &AppState, body: &serde_json::Value) -> Result<(GenParams, ChatPrompt, Vec<u32>), ApiError> {
    let (common, req): (api::Common, ChatRequest) = (api::fields(body)?, api::fields(body)?);
    check_model(st, &common.model)?;
    let mut params = common.params(&st.cfg.defaults)?;
    let p = chat_prompt(st, &req, &mut params, None)?;
    let prompt = encode(st, &p.text, "messages")?;
    Ok((params, p, prompt))
}

/// A chat request (`body`, parsed: another API's request rewritten into one) submitted as the
/// chat endpoint submits it, its ids prefixed `prefix`; and its prompt's tokens.
fn submit_chat(st: &Arc<AppState>, body: &serde_json::Value, prefix: &str) -> Result<(Job, usize), ApiError> {
    let (params, p, prompt) = prepare_chat(st, body)?;
    let n = prompt.len();
    let mut job = submit(st, vec![prompt], params, None, prefix, "messages")?;
    (job.tools, job.reasoning) = (p.tools, p.reasoning);
    Ok((job, n))
}

/// Tokens of the prompt a chat request (`body`, parsed) computes before its answer.
fn prompt_tokens(st: &AppState, body: &serde_json::Value) -> Result<usize, ApiError> {
    Ok(prepare_chat(st, body)?.2.len())
}

/// `POST /v1/chat/completions/input_tokens` (llama-server's): `{"input_tokens", "object"}`.
async fn chat_input_tokens(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = read_body(&st, &headers, &body)
        .and_then(|b| prompt_tokens(&st, &b))
        .map(|n| axum::Json(serde_json::json!({"input_tokens": n, "object": "response.input_tokens"})).into_response());
    counted(&st, "input_tokens", r)
}

async fn chat(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let (common, req): (_, ChatRequest) = read_request(&st, &headers, &body)?;
        let mut params = common.params(&st.cfg.defaults)?;
        let logprobs = req.top_logprobs()?;
        let p = chat_prompt(&st, &req, &mut params, logprobs)?;
        let prompt = encode(&st, &p.text, "messages")?;
        let mut job = submit(&st, vec![prompt], params, logprobs, "chatcmpl", "messages")?;
        (job.tools, job.reasoning) = (p.tools, p.reasoning);
        Ok(respond::answer(st.clone(), job, respond::Kind::Chat).await)
    }
    .await;
    counted(&st, "chat_completions", r)
}

async fn completions(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let (common, req): (_, CompletionRequest) = read_request(&st, &headers, &body)?;
        let mut params = common.params_with(&st.cfg.defaults, req.echo)?;
        let logprobs = req.top_logprobs()?;
        if req.echo {
            if req.suffix.is_some() {
                return Err(ApiError::bad("echo", "echo together with suffix is not supported"));
            }
            params.prompt_logprobs = logprobs;
        }
        // Several prompts: choices `p · n .. (p + 1) · n` are prompt p's.
        let texts = match (&req.prompt, req.echo) {
            (Prompt::Text(s), true) => Some(vec![s.clone()]),
            (Prompt::Texts(v), true) => Some(v.clone()),
            _ => None,
        };
        let prompts = match (req.prompt, req.suffix) {
            // Fill in the middle, in the model's FIM tokens, within the context less the
            // answer's room (a quarter of the context unless `max_tokens` says).
            (Prompt::Text(s), Some(suffix)) => {
                vec![fim_prompt(&st, &s, &suffix, &[], "", params.max_tokens, "suffix")?]
            }
            (_, Some(_)) => return Err(ApiError::bad("suffix", "suffix takes one prompt, as text")),
            (Prompt::Tokens(t), None) => vec![t],
            (Prompt::TokenLists(v), None) => v,
            (Prompt::Text(s), None) => vec![encode(&st, &s, "prompt")?],
            (Prompt::Texts(v), None) => v.iter().enumerate().map(|(i, s)| encode(&st, s, &format!("prompt[{i}]"))).collect::<Result<_, _>>()?,
        };
        // `echo`: the text as sent, or what token prompts decode to.
        let echo = match (&req.echo, &texts) {
            (false, _) => vec![],
            (true, Some(t)) => t.clone(),
            (true, None) => prompts.iter().map(|p| st.tok.decode(p)).collect(),
        };
        let mut job = submit(&st, prompts, params, logprobs, "cmpl", "prompt")?;
        job.echo = echo;
        Ok(respond::answer(st.clone(), job, respond::Kind::Text).await)
    }
    .await;
    counted(&st, "completions", r)
}
