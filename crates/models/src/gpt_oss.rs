//! gpt-oss (`gpt-oss`, OpenAI's open-weight mixtures of experts), as llama.cpp's `openai-moe`
//! graph builds it: the pre-norm block with NeoX RoPE (YaRN from the file's scaling keys), Q,
//! K, V and Wo biases, an attention sink per query head (`attn_sinks`: a logit each head's
//! softmax counts with no value), a window on every other layer (`attention.sliding_window`,
//! the even layers unless `sliding_window_pattern` says otherwise) and the norm before the
//! feed-forward stored as `post_attention_norm`. Every feed-forward is a mixture of experts:
//! the router's logits plus its bias, the `expert_used_count` largest chosen and weighted by
//! a softmax over those alone; each expert's gate, up and down products plus that expert's
//! bias row, joined by the clamped SwiGLU (`Glu::SwigluOai`).
//!
//! Attention with sinks runs on the F16 cache of key rows' split-KV decode kernels, one range
//! per row (`attention::attend_with_sinks`), or ggml's tiled kernel for prefill; on a quantized
//! cache its one-chunk kernel counts them after the last cell, and over keys in columns the
//! column kernels' last step does (`attention::attend_rows`).

use crate::common::Extras;
use crate::postnorm::{pattern, window_u32};
use crate::prenorm::{PreNorm, PreNormSpec, Swa, Tweaks};
use crate::{Loader, ModelError};
use corelm_core::{Glu, MoeGating, MoeParams};

/// llama.cpp's sliding-window period for gpt-oss where the file gives none.
const SWA_PERIOD: usize = 2;

pub(crate) fn load(l: &Loader) -> Result<PreNorm, ModelError> {
    let moe = MoeParams { gating: MoeGating::SoftmaxWeight, ..crate::qwen3::moe_params(l, false)? };
    let extras = Extras { moe: Some(moe), ffn_norm_post_attention: true, oai: true, ..Extras::default() };
    // The windowed layers rotate with the model's RoPE; a base of their own is not read here.
    if let (Some(swa), Some(base)) = (l.opt_f("rope.freq_base_swa")?, l.opt_f("rope.freq_base")?) {
        if swa != base {
            return Err(ModelError::Unsupported(format!("gpt-oss with a RoPE base of {swa} on its windowed layers (rope.freq_base_swa; the others' {base})")));
        }
    }
    let mut m = PreNorm::load(l, PreNormSpec { extras, neox: true, scale_q: false })?;
    let window = l.u("attention.sliding_window")? as u64;
    let swa = Swa { window: window_u32(l, window)?, pattern: pattern(l, SWA_PERIOD)?, rope: None, global_rope: true };
    m.set_tweaks(Tweaks { swa: Some(swa), glu: Some(Glu::SwigluOai), ..Tweaks::default() });
    Ok(m)
}
