//! Qwen3 and Qwen3-MoE: the Qwen2 block without biases, with an RMS norm on each query and key
//! head before RoPE (QK-norm), NeoX RoPE, and `head_dim` from `attention.key_length` (it need
//! not be `n_embd / n_head`).
//!
//! Qwen3-MoE (`qwen3moe`) replaces every feed-forward with `expert_count` SwiGLU experts of
//! `expert_feed_forward_length`: a softmax router picks `expert_used_count` per token and their
//! probabilities are renormalised to sum to one (llama.cpp hard-codes this for the family; an
//! `expert_weights_norm` key overrides it). No shared experts.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec};
use crate::{Loader, ModelError};
use corelm_core::MoeParams;
use corelm_gguf::Gguf;
use corelm_kernels::Kernels;

pub fn load(g: &Gguf, k: &Kernels, moe: bool) -> Result<PreNorm, ModelError> {
    let l = Loader::new(g, k)?;
    let moe = if moe { Some(moe_params(&l, true)?) } else { None };
    let extras = Extras { qk_norm: true, moe, ..Extras::default() };
    PreNorm::load(&l, PreNormSpec { extras, neox: true, scale_q: false })
}

/// Expert counts and weight handling from `<arch>.expert_*` keys.
pub(crate) fn moe_params(l: &Loader, default_norm: bool) -> Result<MoeParams, ModelError> {
    let n_expert = l.u("expert_count")?;
    let n_used = l.u("expert_used_count")?;
    if n_used > n_expert || n_expert > corelm_core::moe::MAX_EXPERTS || n_used > corelm_core::moe::MAX_USED {
        return Err(ModelError::BadHyper(format!("{n_used} of {n_expert} experts per token")));
    }
    let norm_w = match l.g.opt_bool(&format!("{}.expert_weights_norm", l.arch))? {
        Some(v) => v,
        None => default_norm,
    };
    let w_scale = l.opt_f("expert_weights_scale")?.unwrap_or(1.0);
    Ok(MoeParams { n_expert, n_used, norm_w, w_scale })
}
