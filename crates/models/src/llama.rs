//! LLaMA family (SmolLM2, Llama 2, Llama 3.x, Mistral — all `llama` in GGUF): pre-norm blocks,
//! RoPE on adjacent pairs (GGUF stores Q/K permuted for it), SwiGLU feed-forward, grouped-query
//! attention, LM head tied to the embedding if the file has no `output.weight`. Llama 3.x's
//! `llama3` RoPE scaling arrives as `rope_freqs.weight` (per-frequency divisors); linear
//! scaling as `rope.scaling.factor`.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec};
use crate::{Loader, ModelError};
use corelm_gguf::Gguf;
use corelm_kernels::Kernels;

pub fn load(g: &Gguf, k: &Kernels) -> Result<PreNorm, ModelError> {
    let l = Loader::new(g, k)?;
    if l.opt_u("expert_count")?.is_some_and(|n| n > 0) {
        return Err(ModelError::Unsupported("llama-architecture mixture of experts (Mixtral)".into()));
    }
    PreNorm::load(&l, PreNormSpec { extras: Extras::default(), neox: false, scale_q: false })
}
