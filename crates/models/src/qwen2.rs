//! Qwen2 / Qwen2.5: the LLaMA block with biases on Q, K and V, NeoX-style RoPE, and (usually) an
//! LM head of its own. Qwen2-MoE (`qwen2moe`): the same attention; experts chosen by a softmax
//! router, their weights not renormalised (hard-coded, as in llama.cpp), plus a
//! shared expert gated by `sigmoid(ffn_gate_inp_shexp · x)`. Qwen2-VL and Qwen2.5-VL
//! (`qwen2vl`): their language model on text, as [`crate::qwen3::mrope_sections`] explains.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec};
use crate::{Loader, ModelError};

pub(crate) fn load(l: &Loader, moe: bool) -> Result<PreNorm, ModelError> {
    let moe = if moe { Some(crate::qwen3::moe_params(l, false)?) } else { None };
    let extras = Extras { qkv_bias: true, moe, ..Extras::default() };
    // Qwen2-MoE's shared expert always has its gate (llama.cpp requires it).
    if moe.is_some() {
        for il in 0..l.u("block_count")? {
            let (sh, gate) = (format!("blk.{il}.ffn_gate_shexp.weight"), format!("blk.{il}.ffn_gate_inp_shexp.weight"));
            if l.has(&sh) && !l.has(&gate) {
                return Err(ModelError::MissingTensor(gate));
            }
        }
    }
    PreNorm::load(l, PreNormSpec { extras, neox: true, scale_q: false })
}

/// Qwen2-VL / Qwen2.5-VL's language model (`qwen2vl`) on text: Qwen2's block, its M-RoPE
/// sections checked. An output bias (which llama.cpp's loader allows) is refused by name.
pub(crate) fn load_vl(l: &Loader) -> Result<PreNorm, ModelError> {
    let sections = crate::qwen3::mrope_sections(l)?;
    if l.has("output.bias") {
        return Err(ModelError::Unsupported("qwen2vl output bias output.bias".into()));
    }
    let extras = Extras { qkv_bias: true, ..Extras::default() };
    let mut m = PreNorm::load(l, PreNormSpec { extras, neox: true, scale_q: false })?;
    m.set_still_pairs(crate::qwen3::mrope_still(sections, m.hyper_ref().n_rot / 2, false));
    Ok(m)
}
