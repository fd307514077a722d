//! LLaMA family (SmolLM2, Llama 2/3 layouts): pre-norm blocks, RoPE on adjacent pairs (GGUF
//! stores Q/K permuted for it), SwiGLU feed-forward, LM head tied to the embedding if the file
//! has no `output.weight`.

use crate::common::{head, load_layers, output_weight, pre_norm_block, AttnCfg, Extras, LayerWeights};
use crate::{Hyper, Loader, Model, ModelError};
use corelm_core::{Builder, Bundle, Glu, RopeParams, WeightRef};
use corelm_gguf::Gguf;
use corelm_kernels::Kernels;

pub struct Llama {
    h: Hyper,
    tok_embd: WeightRef,
    layers: Vec<LayerWeights>,
    norm: WeightRef,
    output: WeightRef,
    freq_scale: f32,
}

impl Llama {
    pub fn load(g: &Gguf, k: &Kernels) -> Result<Self, ModelError> {
        let l = Loader::new(g, k)?;
        let h = l.hyper()?;
        let layers = load_layers(&l, &h, Extras::default())?;
        let freq_scale = match l.opt_f("rope.scaling.factor")? {
            Some(f) if f > 0.0 => 1.0 / f,
            _ => 1.0,
        };
        Ok(Llama {
            tok_embd: l.weight("token_embd.weight", [h.n_embd, h.n_vocab])?,
            norm: l.vector("output_norm.weight", h.n_embd)?,
            output: output_weight(&l, &h)?,
            layers,
            h,
            freq_scale,
        })
    }
}

impl Model for Llama {
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
                freq_scale: self.freq_scale,
                neox: false,
            },
            scale: 1.0 / (h.head_dim as f32).sqrt(),
            q_scale: None,
            window: None,
        };
        let te = b.weight(&self.tok_embd);
        let mut x = b.embed(&te); // [n_tokens, n_embd]
        for (il, lw) in self.layers.iter().enumerate() {
            b.begin_layer(il);
            x = pre_norm_block(b, h, lw, il, &x, &cfg, Glu::Silu); // [n_tokens, n_embd]
        }
        head(b, h, &x, &self.norm, &self.output)
    }
}
