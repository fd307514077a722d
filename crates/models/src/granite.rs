//! IBM Granite 3.x (`granite`): the LLaMA block with four multipliers where llama.cpp's graph
//! puts them — the embeddings times `embedding_scale`, attention's and the feed-forward's
//! outputs times `residual_scale` before each residual add, q·k times `attention.scale`
//! (instead of 1/√head_dim), the logits times 1/`logit_scale` — and RoPE only where
//! `rope.scaling.finetuned` (default true) says so. Biases on Wo or the feed-forward (none
//! in the released dense models) are refused by name.
//!
//! Granite MoE (`granitemoe`: Granite 3.x 1B-A400M, 3B-A800M): the same block with experts —
//! `feed_forward_length` wide, a softmax router, the chosen experts' weights renormalised
//! (llama.cpp hard-codes it for the family) — and, where the file has them
//! (GraniteMoeShared), a shared expert added ungated. The hybrid variant (`granitehybrid`,
//! Mamba layers) is another architecture name, refused as unknown.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec, Tweaks};
use crate::{Loader, ModelError};

pub(crate) fn load(l: &Loader, moe: bool) -> Result<PreNorm, ModelError> {
    if !moe && l.opt_u("expert_count")?.is_some_and(|n| n > 0) {
        return Err(ModelError::Unsupported("granite with experts (a granitemoe file names its architecture so)".into()));
    }
    let moe = if moe { Some(crate::qwen3::moe_params(l, true)?) } else { None };
    let extras = Extras { moe, experts_n_ff: true, ..Extras::default() };
    let mut m = PreNorm::load(l, PreNormSpec { extras, neox: false, scale_q: false })?;
    // llama.cpp applies a multiplier only where it is non-zero; the logit scale it requires.
    let nonzero = |key: &str| -> Result<Option<f32>, ModelError> { Ok(l.opt_f(key)?.filter(|&v| v != 0.0)) };
    let logit_scale = l.f("logit_scale")?;
    if !(logit_scale.is_finite() && logit_scale != 0.0) {
        return Err(ModelError::BadHyper(format!("granite.logit_scale = {logit_scale}")));
    }
    if let Some(s) = nonzero("attention.scale")? {
        m.set_attention_scale(s);
    }
    let rope = l.g.opt_bool(&format!("{}.rope.scaling.finetuned", l.arch))?.unwrap_or(true);
    m.set_tweaks(Tweaks {
        embd_scale: nonzero("embedding_scale")?,
        residual_scale: nonzero("residual_scale")?,
        logit_scale: Some(logit_scale),
        // Every layer without RoPE where the file turns it off.
        no_rope_every: (!rope).then_some(1),
        swa: None,
        glu: None,
    });
    Ok(m)
}
