//! Speculative decoding with a draft model: `--spec-draft-model` and its limits (llama.cpp's
//! names and defaults), for `run`, `chat` and `serve` (each of which also has `--lookup`, the
//! other source of drafts: one or the other).

use anyhow::{Context, Result};
use clap::Args;
use corelm_engine::draft::{DraftModel, DraftParams};
use corelm_engine::{Engine, Tokenizer};
use std::path::PathBuf;

#[derive(Args, Clone, Debug)]
pub(crate) struct DraftArgs {
    /// Speculative decoding with a draft model: a smaller GGUF of the same vocabulary proposes
    /// each sequence's next tokens, fed beside its token and kept where the model samples them
    /// anyway. The answer is the one without (bit for bit with --batch-invariant).
    #[arg(id = "spec_draft_model", long = "spec-draft-model", visible_alias = "model-draft", value_name = "FILE", conflicts_with = "lookup")]
    pub(crate) model: Option<PathBuf>,
    /// Most tokens the draft model proposes per step.
    #[arg(id = "spec_draft_n_max", long = "spec-draft-n-max", visible_alias = "draft-max", value_name = "N", default_value_t = DraftParams::default().n_max)]
    pub(crate) n_max: usize,
    /// Proposals shorter than this are not fed.
    #[arg(id = "spec_draft_n_min", long = "spec-draft-n-min", visible_alias = "draft-min", value_name = "N", default_value_t = DraftParams::default().n_min)]
    pub(crate) n_min: usize,
    /// A proposal stops before a token the draft model gives less than this probability
    /// among its ten most likely.
    #[arg(id = "spec_draft_p_min", long = "spec-draft-p-min", visible_alias = "draft-p-min", value_name = "P", default_value_t = DraftParams::default().p_min)]
    pub(crate) p_min: f32,
}

impl DraftArgs {
    /// The draft model for `engine`, if one was asked for (named on standard error).
    pub(crate) fn load(&self, engine: &Engine, tok: &Tokenizer) -> Result<Option<DraftModel>> {
        let Some(path) = &self.model else { return Ok(None) };
        let params = DraftParams { n_max: self.n_max, n_min: self.n_min, p_min: self.p_min };
        let model = DraftModel::load(path, engine, tok, params).with_context(|| format!("loading the draft model {}", path.display()))?;
        eprintln!("draft model: {} (up to {} tokens a step, at least {}, p-min {})", path.display(), params.n_max, params.n_min, params.p_min);
        Ok(Some(model))
    }
}
