//! Phi-3 / Phi-3.5 / Phi-4-mini: the LLaMA block with Q, K and V fused in one `attn_qkv`
//! matrix and gate and up fused in one `ffn_up` (gate first), both split by rows at load
//! (zero-copy); NeoX RoPE (Phi-4-mini rotates 3/4 of each head); queries scaled by
//! 1/√head_dim before attention.
//!
//! The long-context variants (Phi-3-128k, Phi-3.5-mini, Phi-4-mini) use LongRoPE, as llama.cpp
//! runs it: two F32 vectors of per-frequency divisors, `rope_factors_short` and
//! `rope_factors_long`, the long ones where a sequence's context (llama.cpp's `n_ctx_seq`, the
//! context padded to 256 cells) exceeds `rope.scaling.original_context_length`; and every
//! cosine and sine multiplied by `rope.scaling.attn_factor` (`RopeParams::mscale`), so q·k
//! grows by its square. Only the context decides: a 128k model run with a 4k context keeps
//! the short factors at every position.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec};
use crate::{LoadOptions, Loader, ModelError};

pub(crate) fn load(l: &Loader, opts: LoadOptions) -> Result<PreNorm, ModelError> {
    let mut m = PreNorm::load(l, PreNormSpec { extras: Extras::default(), neox: true, scale_q: true })?;
    if !(l.has("rope_factors_long.weight") || l.has("rope_factors_short.weight")) {
        return Ok(m);
    }
    let h = m.hyper_ref();
    let orig = l.opt_u("rope.scaling.original_context_length")?.unwrap_or(h.n_ctx_train);
    // llama.cpp's choice (`get_rope_factors`): the context of one sequence, padded as its
    // context is, against the length the model was first trained on.
    let name = if opts.n_ctx.next_multiple_of(256) > orig { "rope_factors_long.weight" } else { "rope_factors_short.weight" };
    // (`vector` names it as missing where the file has only the other one.) The other set is
    // read too, checked as llama.cpp checks it: a file carries both.
    let freqs = l.vector(name, h.n_rot / 2)?;
    for other in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if other != name && l.has(other) {
            l.vector(other, h.n_rot / 2)?;
        }
    }
    m.set_rope_factors(freqs);
    Ok(m)
}
