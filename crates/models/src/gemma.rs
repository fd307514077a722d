//! Gemma (`gemma`) and Gemma 3 (`gemma3`): embeddings scaled by √n_embd; GELU-tanh gated FFN;
//! NeoX RoPE; queries scaled by 1/√head_dim as a node of their own; LM head tied to the
//! embedding. Gemma 3 adds interleaved sliding-window and global attention layers (every
//! `pattern`-th layer global), each kind with its own RoPE base; RMS norm on Q and K per head;
//! and norms after attention and the feed-forward as well as before. (Gemma 2's soft-capped
//! attention logits are not supported: `gemma2` is refused as an unknown architecture.)

use crate::common::{attention, embed_input, ffn, head, load_layers, output_weight, AttnCfg, Extras, LayerWeights};
use crate::{Hyper, Loader, Model, ModelError};
use corelm_core::{Builder, Bundle, Glu, RopeParams, WeightRef};
use corelm_gguf::Gguf;
use corelm_kernels::Kernels;

/// RoPE base of the sliding-window layers (llama.cpp hard-codes it for Gemma 3).
const ROPE_BASE_SWA: f32 = 10_000.0;
/// Every sixth layer is global unless the file says otherwise.
const DEFAULT_SWA_PATTERN: usize = 6;

/// Which Gemma.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Family {
    /// Gemma (1): the plain pre-norm block, every layer global.
    Gemma,
    Gemma3,
}

pub struct Gemma {
    h: Hyper,
    tok_embd: WeightRef,
    layers: Vec<LayerWeights>,
    norm: WeightRef,
    output: WeightRef,
    /// Sliding window of the local layers (Gemma 3).
    window: u32,
    /// Every `pattern`-th layer global (Gemma 3; Gemma's are all global: 1).
    pattern: usize,
    freq_scale_global: f32,
}

impl Gemma {
    pub fn load(g: &Gguf, k: &Kernels, family: Family) -> Result<Self, ModelError> {
        let l = Loader::new(g, k)?;
        let h = l.hyper()?;
        let v3 = family == Family::Gemma3;
        let extras = Extras { qk_norm: v3, post_norms: v3, ..Extras::default() };
        let layers = load_layers(&l, &h, extras)?;
        let (window, pattern) = if v3 {
            let window = l.u("attention.sliding_window")?;
            let window = u32::try_from(window).map_err(|_| ModelError::BadHyper(format!("sliding window {window}")))?;
            (window, l.opt_u("attention.sliding_window_pattern")?.unwrap_or(DEFAULT_SWA_PATTERN))
        } else {
            (0, 1)
        };
        let freq_scale_global = match l.opt_f("rope.scaling.factor")? {
            Some(f) if f > 0.0 => 1.0 / f,
            _ => 1.0,
        };
        Ok(Gemma {
            tok_embd: l.weight("token_embd.weight", [h.n_embd, h.n_vocab])?,
            norm: l.vector("output_norm.weight", h.n_embd)?,
            output: output_weight(&l, &h)?,
            layers,
            h,
            window,
            pattern,
            freq_scale_global,
        })
    }

    /// Sliding-window layers are all but the last of each group of `pattern`.
    fn is_swa(&self, il: usize) -> bool {
        il % self.pattern < self.pattern - 1
    }

    /// Layer `il`'s attention: RoPE base and scaling and window by its kind, queries scaled by
    /// a node of their own.
    fn attn_cfg(&self, il: usize) -> AttnCfg {
        let (h, swa) = (&self.h, self.is_swa(il));
        AttnCfg {
            rope: RopeParams {
                n_head: h.n_head,
                head_dim: h.head_dim,
                n_rot: h.n_rot,
                base: if swa { ROPE_BASE_SWA } else { h.rope_base },
                freq_scale: if swa { 1.0 } else { self.freq_scale_global },
                mscale: 1.0,
                neox: true,
            },
            scale: 1.0,
            q_scale: Some(1.0 / (h.head_dim as f32).sqrt()),
            window: swa.then_some(self.window),
            freqs: None,
        }
    }
}

impl Model for Gemma {
    fn hyper(&self) -> &Hyper {
        &self.h
    }

    fn device_layer(&self, il: usize) -> Option<crate::DeviceLayerSpec> {
        let c = self.attn_cfg(il);
        (il < self.layers.len()).then_some(crate::DeviceLayerSpec {
            rope_base: c.rope.base,
            freq_scale: c.rope.freq_scale,
            neox: true,
            window: c.window,
            gelu: true,
            scale: c.q_scale.unwrap_or(1.0),
        })
    }

    fn key_rope(&self, il: usize) -> Option<crate::KeyRope> {
        (il < self.layers.len()).then(|| crate::KeyRope { rope: self.attn_cfg(il).rope, freqs: None })
    }

    fn build(&self, b: &mut Builder) -> Bundle {
        let h = &self.h;
        let (mut x, on_device) = embed_input(b, &self.tok_embd, Some((h.n_embd as f32).sqrt())); // [n_tokens, n_embd]
        for (il, lw) in self.layers.iter().enumerate().skip(on_device) {
            b.begin_layer(il);
            let cfg = self.attn_cfg(il);
            let an = b.weight(&lw.attn_norm);
            let hn = b.rms_norm(&x, &an, h.eps);
            let mut a = attention(b, h, lw, il, &hn, &cfg); // Gemma 3's Q/K norms inside
            if let Some(pn) = &lw.attn_post_norm {
                let pn = b.weight(pn);
                a = b.rms_norm(&a, &pn, h.eps);
            }
            let x1 = b.add(&a, &x);
            let fnw = b.weight(&lw.ffn_norm);
            let hn = b.rms_norm(&x1, &fnw, h.eps);
            let mut f = ffn(b, lw, &hn, Glu::GeluTanh);
            if let Some(pf) = &lw.ffn_post_norm {
                let pf = b.weight(pf);
                f = b.rms_norm(&f, &pf, h.eps);
            }
            x = b.add(&f, &x1);
        }
        head(b, h, &x, &self.norm, &self.output)
    }
}
