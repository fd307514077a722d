//! Qwen2 / Qwen2.5: the LLaMA block with biases on Q, K and V, NeoX-style RoPE, and (usually) an
//! LM head of its own.

use crate::common::{Extras, PreNorm, PreNormSpec};
use crate::{Loader, ModelError};
use corelm_gguf::Gguf;
use corelm_kernels::Kernels;

pub fn load(g: &Gguf, k: &Kernels) -> Result<PreNorm, ModelError> {
    let l = Loader::new(g, k)?;
    let extras = Extras { qkv_bias: true, ..Extras::default() };
    PreNorm::load(&l, PreNormSpec { extras, neox: true, scale_q: false })
}
