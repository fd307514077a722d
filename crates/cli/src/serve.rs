//! `corelm serve`: the OpenAI-compatible server (see the `corelm-server` crate).

use anyhow::{bail, Context, Result};
use clap::Args;
use corelm_engine::generate::ContextShift;
use corelm_engine::{Engine, EngineConfig, Tokenizer};
use corelm_server::ServeConfig;
use std::path::PathBuf;

#[derive(Args, Clone)]
pub struct ServeArgs {
    /// GGUF file (default: SmolLM2-135M-Instruct Q4_1 from the model cache, fetched if missing).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Address to bind (default 127.0.0.1; 0.0.0.0 when --api-key is set).
    #[arg(long)]
    host: Option<String>,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Longest prompt + completion of one request, in tokens.
    #[arg(short = 'c', long, default_value_t = 4096)]
    ctx_size: usize,
    /// KV cache size in tokens shared by all sequences (default: ctx-size × parallel).
    #[arg(long)]
    kv_size: Option<usize>,
    /// Token budget of one step (decode tokens plus prompt chunks): smaller keeps TPOT low
    /// while prompts are prefilled, larger finishes prompts in fewer steps.
    #[arg(short = 'b', long, default_value_t = 64)]
    batch_size: usize,
    /// TPOT target in milliseconds: while sequences are decoding, prompt chunks are cut so a
    /// step stays within it (0 = off: prompts always get the whole --batch-size).
    #[arg(long, default_value_t = 0.0)]
    tpot_target_ms: f64,
    /// Requests accepted and waiting for their first token before new ones get 429.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Prompt-lookup speculative decoding: each decoding request feeds up to N tokens copied
    /// from where its last few tokens occurred before, and keeps those the model would have
    /// chosen anyway (answers unchanged; several tokens a pass where text repeats). 0 = off.
    #[arg(long, default_value_t = 0)]
    lookup: usize,
    #[command(flatten)]
    draft: crate::draft::DraftArgs,
    /// Context shift, llama-server's: an answer may pass the context; when its sequence fills
    /// it, half of the tokens after the first `--keep` are dropped (a request's `n_keep` and
    /// `n_discard` override) and it goes on (a draft model's cache drops the same tokens).
    /// Off: answers end at the context.
    #[arg(long)]
    context_shift: bool,
    /// With --context-shift: prompt tokens always kept, besides a BOS (-1: the whole prompt).
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true, requires = "context_shift")]
    keep: i64,
    /// The chat template: `chatml`, `gemma`, or jinja source (default: the model's), as
    /// llama-server's --chat-template.
    #[arg(long, conflicts_with = "chat_template_file")]
    chat_template: Option<String>,
    /// The chat template's jinja source from a file (llama-server's --chat-template-file).
    #[arg(long)]
    chat_template_file: Option<PathBuf>,
    /// Variables for the chat template in every request, as a JSON object (e.g.
    /// '{"enable_thinking": false}'); a request's `chat_template_kwargs` override them.
    #[arg(long, value_parser = parse_kwargs)]
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Reasoning blocks (`<think>`) of models whose template writes them: `deepseek` (or
    /// `auto`) answers them apart as `reasoning_content` (Anthropic's `thinking` blocks, the
    /// Responses API's `reasoning` items), `none` leaves them in the content. A request's
    /// `reasoning_format` overrides it.
    #[arg(long, default_value = "auto", value_parser = ["auto", "deepseek", "none"])]
    reasoning_format: String,
    /// Most tokens a request that sets no limit (`max_tokens`, `n_predict`, …) generates; -1:
    /// the rest of its context (llama-server's -n/--n-predict).
    #[arg(short = 'n', long, default_value_t = -1, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..))]
    n_predict: i64,
    /// Other names requests may give the model, comma-separated (llama-server's -a/--alias);
    /// the first is the name answers and /v1/models report. The file's name is always taken.
    #[arg(short = 'a', long, value_delimiter = ',')]
    alias: Vec<String>,
    /// Let `POST /slots/{id}?action=save|restore` write and read slots' KV caches as files in
    /// this directory (llama-server's --slot-save-path); without it those actions are a 501.
    #[arg(long)]
    slot_save_path: Option<PathBuf>,
    /// Require the key on /v1 endpoints (`Authorization: Bearer <key>` or `x-api-key: <key>`).
    #[arg(long, env = "CORELM_API_KEY")]
    api_key: Option<String>,
    /// Worker threads (default: physical cores).
    #[arg(short, long)]
    threads: Option<usize>,
    #[arg(long)]
    no_pin: bool,
    /// Let a request's results depend on what else shares its steps, as llama-server's do:
    /// the batch-size-dependent kernel choices of `run` (llama.cpp's), and with them
    /// --fast-prefill, --accel-split and a plan's or --accel-min-tokens' prefill on the
    /// accelerator. Default: every request computed as if alone (same tokens and
    /// log-probabilities under any load).
    #[arg(long)]
    no_batch_invariant: bool,
    /// Load the LoRA adapters at scale 0: applied once `POST /lora-adapters` or a request's
    /// `lora` field sets their scales.
    #[arg(long)]
    lora_init_without_apply: bool,
    /// Prefill with the panel GEMM (as `run --fast-prefill`: batches of 32 rows or more on
    /// x86, 8 for the types whose panels are decoded from interleaved groups). Needs
    /// --no-batch-invariant.
    #[arg(long, requires = "no_batch_invariant")]
    fast_prefill: bool,
    /// How `/v1/embeddings` pools an input's hidden rows: mean, cls or last (default: the
    /// model's `pooling_type`, else mean).
    #[arg(long, value_parser = crate::embed::parse_pooling)]
    pooling: Option<corelm_engine::embed::Pooling>,
    #[command(flatten)]
    place: crate::PlaceArgs,
    #[command(flatten)]
    cache: crate::CacheArgs,
    /// The sampling of requests that leave a field out (llama-server's flags).
    #[command(flatten)]
    chain: crate::sampling::ChainArgs,
}

impl ServeArgs {
    pub fn model_path(&self) -> Option<PathBuf> {
        self.model.clone()
    }
}

/// `--chat-template-kwargs`: a JSON object.
fn parse_kwargs(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(s) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err("a JSON object, e.g. '{\"enable_thinking\": false}'".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

pub fn serve(a: ServeArgs, model: PathBuf) -> Result<()> {
    if a.parallel == 0 || a.ctx_size == 0 || a.max_queue == 0 {
        bail!("--parallel, --ctx-size and --max-queue must be at least 1");
    }
    let kv = a.kv_size.unwrap_or(a.ctx_size.saturating_mul(a.parallel));
    let (sparsity, accel) = a.place.sparse.load(&model)?;
    let cfg = EngineConfig {
        n_ctx: kv,
        n_batch: a.batch_size,
        n_seq_max: a.parallel,
        n_threads: a.threads.unwrap_or_else(|| corelm_engine::engine::default_threads_for(a.place.numa)),
        pin: !a.no_pin,
        numa: a.place.numa,
        tp: a.place.tp.unwrap_or(0),
        tp_sync: a.place.tp_sync,
        tp_kv: a.place.tp_kv,
        batch_invariant: !a.no_batch_invariant,
        cache_type_k: a.cache.cache_type_k,
        cache_type_v: a.cache.cache_type_v,
        kv_layout: a.cache.kv_layout,
        attn_pipeline: false, // it takes only passes of one sequence; a server's steps mix them
        fast_prefill: a.fast_prefill,
        repack: true,
        isa: None, // the process default, which `--isa` set
        plan: a.place.load_plan()?,
        roofline: a.place.load_roofline()?,
        matrix_workers: 0, // splits only the panel GEMM, which the server does not use
        sparsity,
        accel,
        accel_split: a.place.accel_split,
        accel_layers: a.place.accel_layers,
        accel_min_tokens: a.place.accel_min_tokens,
        elide_barriers: true,
        lora: {
            let mut specs = a.place.lora.specs()?;
            if a.lora_init_without_apply {
                specs.iter_mut().for_each(|s| s.scale = 0.0);
            }
            specs
        },
    };
    let engine = Engine::load(&model, cfg).with_context(|| format!("loading {}", model.display()))?;
    if let Some(d) = engine.device() {
        eprintln!("accel-split: {}", d.summary());
    }
    if let Some(d) = engine.device_layers() {
        eprintln!("accel-layers: {}", d.summary());
    }
    if let Some(why) = engine.plan_note() {
        eprintln!("plan: {why}");
    }
    for (id, a) in engine.lora_adapters().iter().enumerate() {
        eprintln!("lora {id}: {} ({} matrices, scale {})", a.path.display(), a.n_matrices(), a.scale);
    }
    if let Some(a) = engine.accel() {
        eprintln!("{}", crate::sparsity::describe_accel(a));
    }
    let tok = Tokenizer::from_gguf(engine.gguf()).with_context(|| format!("tokenizer of {}", model.display()))?;
    let draft = a.draft.load(&engine, &tok)?;
    if a.context_shift {
        engine.can_shift().context("--context-shift")?;
    }
    let pooling = match a.pooling {
        Some(p) => p,
        None => corelm_engine::embed::Pooling::from_gguf(engine.gguf())?.unwrap_or(corelm_engine::embed::Pooling::Mean),
    };
    let model_id = crate::model_id(&model);
    let host = a.host.clone().unwrap_or_else(|| if a.api_key.is_some() { "0.0.0.0" } else { "127.0.0.1" }.into());
    if a.api_key.is_none() && host != "127.0.0.1" && host != "localhost" && host != "::1" {
        eprintln!("warning: serving on {host} without --api-key: anyone who can reach it can use it");
    }
    let max_tokens = usize::try_from(a.n_predict).ok();
    let defaults = corelm_server::api::RequestDefaults { sampling: a.chain.params(None, a.ctx_size), dry_breakers: a.chain.breaker_texts(), max_tokens };
    defaults.sampling.validate().context("the sampling flags")?;
    let aliases: Vec<String> = a.alias.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    let scfg = ServeConfig { model_id: model_id.clone(), aliases: aliases.clone(), max_queue: a.max_queue, ctx_size: a.ctx_size, api_key: a.api_key,
        tpot_target: Some(a.tpot_target_ms / 1e3).filter(|t| *t > 0.0), pooling, lookup: a.lookup, defaults,
        chat_template: match (&a.chat_template, &a.chat_template_file) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(f)) => Some(std::fs::read_to_string(f).with_context(|| format!("reading the chat template {}", f.display()))?),
            (None, None) => None,
        },
        reasoning: a.reasoning_format != "none", template_kwargs: a.chat_template_kwargs.clone().unwrap_or_default(),
        slot_save_path: match &a.slot_save_path {
            Some(d) if !d.is_dir() => anyhow::bail!("--slot-save-path {}: not a directory", d.display()),
            d => d.clone(),
        },
        context_shift: a.context_shift.then_some(ContextShift { n_keep: a.keep, n_discard: 0, n_ctx: a.ctx_size }) };

    let (router, engine_thread) = corelm_server::app_drafted(engine, draft, tok, scfg).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((host.as_str(), a.port))
            .await
            .with_context(|| format!("binding {host}:{}", a.port))?;
        eprintln!(
            "corelm serving {} on http://{} (parallel {}, context {} per request, KV {kv} tokens, {})",
            aliases.first().unwrap_or(&model_id),
            listener.local_addr()?,
            a.parallel,
            a.ctx_size,
            match (a.no_batch_invariant, a.fast_prefill) {
                (false, _) => "batch-invariant",
                (true, false) => "results depend on batching",
                (true, true) => "results depend on batching, panel GEMM prefill",
            }
        );
        corelm_server::serve(listener, router).await.context("serving")
    })?;
    drop(rt);
    let _ = engine_thread.join();
    Ok(())
}
