//! SmolLM3: the LLaMA block (RoPE on adjacent pairs, SwiGLU, grouped-query attention, tied or
//! untied LM head) whose every fourth layer (`(il + 1) % 4 == 0`, llama.cpp hard-codes the
//! step) has no RoPE at all.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec, Tweaks};
use crate::{Loader, ModelError};

/// Layers `il` with `(il + 1) % NO_ROPE_STEP == 0` are not rotated.
const NO_ROPE_STEP: usize = 4;

pub(crate) fn load(l: &Loader) -> Result<PreNorm, ModelError> {
    let mut m = PreNorm::load(l, PreNormSpec { extras: Extras::default(), neox: false, scale_q: false })?;
    m.set_tweaks(Tweaks { no_rope_every: Some(NO_ROPE_STEP), ..Tweaks::default() });
    Ok(m)
}
