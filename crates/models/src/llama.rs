//! LLaMA family (SmolLM2, Llama 2, Llama 3.x, Mistral — all `llama` in GGUF; Ministral 3,
//! `mistral3`): pre-norm blocks,
//! RoPE on adjacent pairs (GGUF stores Q/K permuted for it), SwiGLU feed-forward, grouped-query
//! attention, LM head tied to the embedding if the file has no `output.weight`. Llama 3.x's
//! `llama3` RoPE scaling arrives as `rope_freqs.weight` (per-frequency divisors); linear
//! scaling as `rope.scaling.factor`.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec};
use crate::{Loader, ModelError};

pub(crate) fn load(l: &Loader) -> Result<PreNorm, ModelError> {
    if l.opt_u("expert_count")?.is_some_and(|n| n > 0) {
        return Err(ModelError::Unsupported("llama-architecture mixture of experts (Mixtral)".into()));
    }
    PreNorm::load(l, PreNormSpec { extras: Extras::default(), neox: false, scale_q: false })
}

/// ERNIE 4.5 (`ernie4_5`, the dense models) and EXAONE 3.x (`exaone`): the LLaMA block as
/// llama.cpp builds it for them, RoPE on adjacent pairs (ERNIE) or NeoX pairs (EXAONE; its
/// optional `rope_freqs` as Llama 3's). A bias on Wo, which ERNIE's loader allows and the
/// released models do not have, is refused by name.
pub(crate) fn load_llama_block(l: &Loader, neox: bool) -> Result<PreNorm, ModelError> {
    PreNorm::load(l, PreNormSpec { extras: Extras::default(), neox, scale_q: false })
}

/// Mistral 3 (`mistral3`: Ministral 3 3B, 8B, 14B): the LLaMA block with YaRN RoPE (its betas
/// and `yarn_log_multiplier` read, `Loader::rope_scaling`) and, where the file sets
/// `attention.temperature_scale`, Llama 4's temperature on the queries after RoPE, stepping
/// every `rope.scaling.original_context_length` positions (the training context without it),
/// as llama.cpp builds it. Biases (which its loader allows and the released models do not
/// have), LongRoPE factors and experts are refused by name.
pub(crate) fn load_mistral3(l: &Loader) -> Result<PreNorm, ModelError> {
    if l.opt_u("expert_count")?.is_some_and(|n| n > 0) {
        return Err(ModelError::Unsupported("mistral3 with experts".into()));
    }
    if l.g.opt_str("mistral3.rope.scaling.type")? == Some("longrope") {
        return Err(ModelError::Unsupported("mistral3 with LongRoPE factors".into()));
    }
    let mut m = PreNorm::load(l, PreNormSpec { extras: Extras::default(), neox: false, scale_q: false })?;
    if let Some(scale) = l.opt_f("attention.temperature_scale")?.filter(|&s| s != 0.0) {
        if !scale.is_finite() {
            return Err(ModelError::BadHyper(format!("mistral3.attention.temperature_scale = {scale}")));
        }
        let floor = l.opt_u("rope.scaling.original_context_length")?.unwrap_or(m.hyper_ref().n_ctx_train);
        let floor = u32::try_from(floor).map_err(|_| ModelError::BadHyper(format!("mistral3.rope.scaling.original_context_length = {floor}")))?;
        m.set_temperature(scale, floor);
    }
    Ok(m)
}

/// Seed-OSS (`seed_oss`, ByteDance's 36B): the LLaMA block with NeoX RoPE, Q/K/V biases where
/// the file has them, and the norm before the feed-forward stored as `post_attention_norm`,
/// as llama.cpp builds it. `--accel-layers` is refused (the device reads LLaMA's names).
pub(crate) fn load_seed_oss(l: &Loader) -> Result<PreNorm, ModelError> {
    let extras = Extras { ffn_norm_post_attention: true, ..Extras::default() };
    PreNorm::load(l, PreNormSpec { extras, neox: true, scale_q: false })
}
