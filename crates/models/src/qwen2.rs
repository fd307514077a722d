//! Qwen2 family: the LLaMA block with biases on Q, K and V, NeoX-style RoPE, and (usually) an
//! LM head of its own.

use crate::common::{head, load_layers, output_weight, pre_norm_block, AttnCfg, Extras, LayerWeights};
use crate::{Hyper, Loader, Model, ModelError};
use corelm_core::{Builder, Bundle, Glu, RopeParams, WeightRef};
use corelm_gguf::Gguf;
use corelm_kernels::Kernels;

pub struct Qwen2 {
    h: Hyper,
    tok_embd: WeightRef,
    layers: Vec<LayerWeights>,
    norm: WeightRef,
    output: WeightRef,
}

impl Qwen2 {
    pub fn load(g: &Gguf, k: &Kernels) -> Result<Self, ModelError> {
        let l = Loader::new(g, k)?;
        let h = l.hyper()?;
        let extras = Extras { qkv_bias: true, ..Extras::default() };
        let layers = load_layers(&l, &h, extras)?;
        Ok(Qwen2 {
            tok_embd: l.weight("token_embd.weight", [h.n_embd, h.n_vocab])?,
            norm: l.vector("output_norm.weight", h.n_embd)?,
            output: output_weight(&l, &h)?,
            layers,
            h,
        })
    }
}

impl Model for Qwen2 {
    fn hyper(&self) -> &Hyper {
        &self.h
    }

    fn build(&self, b: &mut Builder) -> Bundle {
        let h = &self.h;
        let cfg = AttnCfg {
            rope: RopeParams {
                n_head: h.n_head,
                head_dim: h.head_dim,
                n_rot: h.n_rot,
                base: h.rope_base,
                freq_scale: 1.0,
                neox: true,
            },
            scale: 1.0 / (h.head_dim as f32).sqrt(),
            q_scale: None,
            window: None,
        };
        let te = b.weight(&self.tok_embd);
        let mut x = b.embed(&te); // [n_tokens, n_embd]
        for (il, lw) in self.layers.iter().enumerate() {
            b.begin_layer(il);
            x = pre_norm_block(b, h, lw, il, &x, &cfg, Glu::Silu); // Q/K/V biases inside
        }
        head(b, h, &x, &self.norm, &self.output)
    }
}
