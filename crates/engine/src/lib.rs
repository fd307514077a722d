//! corelm engine: the API front ends use.
//!
//! * [`engine`]: load a GGUF, the multi-sequence batch API (`decode(batch) → logits`).
//! * [`tokenizer`]: GGUF vocabulary → `tokenizers` BPE (byte-level or SentencePiece-style),
//!   byte-exact pieces and a UTF-8-safe stream.
//! * [`chat`]: chat templates from the GGUF rendered with minijinja, built-in ones when absent.
//! * [`sample`]: llama.cpp's chain — penalties, DRY, top-nσ, top-k, typical, top-p, min-p, XTC,
//!   temperature (or dynamic), Mirostat — and a seeded draw.
//! * [`generate`]: prompt → stream of tokens with stop conditions.
//! * [`batcher`]: continuous batching for serving — requests in, token events out, on the
//!   engine thread (no HTTP here).
//! * [`embed`]: embeddings pooled from the final norm's rows (mean, CLS, last).
//! * [`eval`]: golden-case evaluation in the format of llama.cpp's reference data.
//! * [`bench`]: llama-bench-style pp/tg measurements, memory bandwidth and decode roofline.
//! * [`perplexity`]: perplexity of a text by llama-perplexity's protocol.
//! * [`sparsity`]: FFN activation statistics (sidecar files) and per-layer sparsity thresholds.
//! * [`device`]: `--accel-split`, matmuls shared with an accelerator as the roofline plan
//!   places them.
//! * [`lora`]: LoRA adapter files, applied at run time at scales that can change.
//! * [`quantize`]: GGUF F32/F16/BF16 → quantized types with ggml's block semantics.

pub mod balance;
pub mod batch;
pub mod batcher;
pub mod bench;
pub mod chat;
pub mod coact;
pub mod config;
pub mod constraint;
pub mod device;
pub mod device_layers;
pub mod draft;
pub mod embed;
pub mod engine;
pub mod eval;
pub mod gemm_tune;
pub mod grammar;
pub mod json;
pub mod lookup;
pub mod lora;
pub mod generate;
pub mod infill;
pub mod offload;
pub mod perplexity;
pub mod predictor;
pub mod plan;
pub mod quantize;
pub mod reasoning;
pub mod sample;
mod setup;
pub mod sparsity;
pub mod tokenizer;
pub mod tools;

pub use engine::{parse_cache_type, parse_kv_layout, shift_cut, Batch, Engine, EngineConfig, Hidden, Logits, Outputs};
pub use tokenizer::{Tokenizer, Utf8Stream};
pub use corelm_core::graph::TpSync;
pub use corelm_core::tp::TpKv;
pub use corelm_core::{NumaMode, Placement, Profile, ProfileEntry, SparseFfn};

/// Where models are cached: `$CORELM_MODELS_DIR`, else `$XDG_CACHE_HOME/corelm/models`, else
/// `~/.cache/corelm/models` (the same rule as `scripts/fetch_models.py`).
pub fn models_dir() -> std::path::PathBuf {
    use std::path::PathBuf;
    if let Some(d) = std::env::var_os("CORELM_MODELS_DIR") {
        return d.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
    base.join("corelm").join("models")
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] corelm_gguf::Error),
    #[error(transparent)]
    Model(#[from] corelm_models::ModelError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("invalid batch: {0}")]
    Batch(String),
    #[error("context full: {needed} tokens need cells but only {free} of {n_ctx} are free")]
    ContextFull { needed: usize, free: usize, n_ctx: usize },
    #[error("prompt of {prompt} tokens does not fit in the context of {n_ctx}")]
    PromptTooLong { prompt: usize, n_ctx: usize },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid sampling parameter: {0}")]
    Sampling(String),
    #[error("JSON schema: {0}")]
    Schema(String),
    #[error("{0}")]
    Grammar(String),
    #[error("golden case: {0}")]
    Case(String),
    /// A slot's KV cache could not be saved, restored or erased.
    #[error("{0}")]
    Slot(String),
}
