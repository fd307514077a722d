//! Phi-3 / Phi-3.5 (4k-context variants): the LLaMA block with Q, K and V fused in one
//! `attn_qkv` matrix and gate and up fused in one `ffn_up` (gate first), both split by rows at
//! load (zero-copy); NeoX RoPE; queries scaled by 1/√head_dim before attention. The 128k
//! variants' LongRoPE (`rope_factors_long/short`, attention factor) is refused by name.

use crate::common::{Extras, PreNorm, PreNormSpec};
use crate::{Loader, ModelError};
use corelm_gguf::Gguf;
use corelm_kernels::Kernels;

pub fn load(g: &Gguf, k: &Kernels) -> Result<PreNorm, ModelError> {
    let l = Loader::new(g, k)?;
    if l.has("rope_factors_long.weight") || l.has("rope_factors_short.weight") {
        return Err(ModelError::Unsupported("Phi-3 LongRoPE (128k-context variants)".into()));
    }
    PreNorm::load(&l, PreNormSpec { extras: Extras::default(), neox: true, scale_q: true })
}
