//! Qwen2 / Qwen2.5: the LLaMA block with biases on Q, K and V, NeoX-style RoPE, and (usually) an
//! LM head of its own. Qwen2-MoE (`qwen2moe`): the same attention; experts chosen by a softmax
//! router, their weights not renormalised (unless `expert_weights_norm` says so), plus a
//! shared expert gated by `sigmoid(ffn_gate_inp_shexp · x)`.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec};
use crate::{Loader, ModelError};
use corelm_gguf::Gguf;
use corelm_kernels::Kernels;

pub fn load(g: &Gguf, k: &Kernels, moe: bool) -> Result<PreNorm, ModelError> {
    let l = Loader::new(g, k)?;
    let moe = if moe { Some(crate::qwen3::moe_params(&l, false)?) } else { None };
    let extras = Extras { qkv_bias: true, moe, ..Extras::default() };
    PreNorm::load(&l, PreNormSpec { extras, neox: true, scale_q: false })
}
