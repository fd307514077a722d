//! The one decoder of the LLaMA-like families (LLaMA, Mistral 1–3, Qwen2/3, the Qwen-VL
//! language models and the mixtures of experts, Phi-3, SmolLM3, Granite, ERNIE 4.5, EXAONE 3
//! and 4, OLMo 2 and 3, Seed-OSS, gpt-oss): embeddings, `n_layer` × [`pre_norm_block`], final norm and LM head.
//! What the families change is data, not code: [`PreNormSpec`] (optional tensors — norms
//! before or only after each half, Q/K norms per head or per row —, RoPE pairing, where the
//! queries are scaled) and [`Tweaks`] (Granite's four multipliers, SmolLM3's layers without
//! RoPE, sliding windows), plus the RoPE's still pairs and Mistral 3's query temperature, each
//! applied where llama.cpp's graph for the family applies it.

use crate::common::{embed_input, head_then, load_layers, pre_norm_block, output_weight, AttnCfg, Extras, Ffn, LayerWeights, LogitsPost};
use crate::{Hyper, Loader, Model, ModelError};
use corelm_core::{Builder, Bundle, Glu, RopeParams, WeightRef};

/// What distinguishes the pre-norm families' tensors and attention.
pub struct PreNormSpec {
    pub extras: Extras,
    /// NeoX RoPE pairing (all but LLaMA's permuted layout).
    pub neox: bool,
    /// Scale queries by 1/√head_dim as a node of its own (Phi-3) instead of inside attention.
    pub scale_q: bool,
}

/// Departures from the plain block, all off for LLaMA, Qwen and Phi-3.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tweaks {
    /// Multiplies the token embeddings (Granite's `embedding_scale`).
    pub embd_scale: Option<f32>,
    /// Multiplies attention's and the feed-forward's outputs before each residual add
    /// (Granite's `residual_scale`).
    pub residual_scale: Option<f32>,
    /// The logits are multiplied by its reciprocal (Granite's `logit_scale`).
    pub logit_scale: Option<f32>,
    /// Layers `il` with `(il + 1) % n == 0` have no RoPE (SmolLM3: every fourth).
    pub no_rope_every: Option<usize>,
    /// Sliding-window layers (OLMo 3, gpt-oss).
    pub swa: Option<Swa>,
    /// The feed-forward's gated activation where it is not SwiGLU (gpt-oss's clamped one).
    pub glu: Option<Glu>,
}

/// Sliding-window attention on all but the last layer of every `pattern` (llama.cpp's
/// `set_swa_pattern`; 0: on every layer).
#[derive(Clone, Copy, Debug)]
pub struct Swa {
    pub window: u32,
    pub pattern: usize,
    /// The windowed layers' own RoPE, without per-frequency divisors (OLMo 3); `None`: the
    /// model's.
    pub rope: Option<RopeParams>,
    /// Whether the other (global) layers rotate: false for EXAONE 4's, which have no RoPE.
    pub global_rope: bool,
}

impl Swa {
    pub fn covers(&self, il: usize) -> bool {
        self.pattern == 0 || il % self.pattern < self.pattern - 1
    }
}

/// A pre-norm decoder: embeddings, `n_layer` × [`pre_norm_block`], final norm and LM head.
pub struct PreNorm {
    h: Hyper,
    tok_embd: WeightRef,
    layers: Vec<LayerWeights>,
    norm: WeightRef,
    output: WeightRef,
    cfg: AttnCfg,
    tweaks: Tweaks,
    /// Whether every layer's tensors carry LLaMA's names, which the accelerator's layer loader
    /// reads (not Seed-OSS's `post_attention_norm` before the feed-forward).
    llama_names: bool,
}

impl PreNorm {
    pub(crate) fn load(l: &Loader, spec: PreNormSpec) -> Result<Self, ModelError> {
        let h = l.hyper()?;
        let layers = load_layers(l, &h, spec.extras)?;
        // Llama 3.x stores its `llama3` RoPE scaling as per-frequency divisors.
        let freqs = if l.has("rope_freqs.weight") { Some(l.vector("rope_freqs.weight", h.n_rot / 2)?) } else { None };
        let scale = 1.0 / (h.head_dim as f32).sqrt();
        let cfg = AttnCfg {
            rope: RopeParams { n_head: h.n_head, head_dim: h.head_dim, neox: spec.neox, ..l.rope_scaling(h.n_rot, h.rope_base, h.n_ctx_train)? },
            scale: if spec.scale_q { 1.0 } else { scale },
            q_scale: spec.scale_q.then_some(scale),
            window: None,
            softcap: 0.0,
            freqs,
            temp: None,
        };
        Ok(PreNorm {
            tok_embd: l.weight("token_embd.weight", [h.n_embd, h.n_vocab])?,
            norm: l.vector("output_norm.weight", h.n_embd)?,
            output: output_weight(l, &h)?,
            layers,
            h,
            cfg,
            tweaks: Tweaks::default(),
            llama_names: !spec.extras.ffn_norm_post_attention,
        })
    }

    pub(crate) fn hyper_ref(&self) -> &Hyper {
        &self.h
    }

    /// Every layer's RoPE divides its frequencies by `freqs` (`n_rot / 2` F32 values: Phi-3
    /// LongRoPE's; its attention factor is `rope.scaling.attn_factor`, read for every model).
    pub(crate) fn set_rope_factors(&mut self, freqs: WeightRef) {
        self.cfg.freqs = Some(freqs);
    }

    /// q·k multiplied by `scale` inside attention instead of 1/√head_dim (Granite's and
    /// SmolLM3's `attention.scale`).
    pub(crate) fn set_attention_scale(&mut self, scale: f32) {
        assert!(self.cfg.q_scale.is_none(), "queries scaled by a node of their own");
        self.cfg.scale = scale;
    }

    /// Every layer's queries times their position's attention temperature after RoPE
    /// (Mistral 3: `1 + scale · ln(⌊pos / floor⌋ + 1)`, `Op::TempScale`).
    pub(crate) fn set_temperature(&mut self, scale: f32, floor: u32) {
        self.cfg.temp = Some((scale, floor));
    }

    /// Rotary pairs that never turn (`RopeParams::still`: M-RoPE's fourth section on text).
    pub(crate) fn set_still_pairs(&mut self, still: u128) {
        self.cfg.rope.still = still;
    }

    pub(crate) fn set_tweaks(&mut self, t: Tweaks) {
        self.tweaks = t;
    }

    /// Whether layer `il` rotates its queries and keys.
    fn has_rope(&self, il: usize) -> bool {
        self.tweaks.no_rope_every.is_none_or(|n| !(il + 1).is_multiple_of(n))
    }

    /// Layer `il`'s attention: the model's, without RoPE where the layer has none (a rotated
    /// width of 0), windowed on a sliding-window layer (with its own RoPE where it has one),
    /// without RoPE on a global layer of a model whose global layers have none.
    fn attn_cfg(&self, il: usize) -> AttnCfg {
        let mut c = self.cfg.clone();
        if !self.has_rope(il) {
            c.rope.n_rot = 0;
            c.freqs = None;
        }
        match self.tweaks.swa {
            Some(swa) if swa.covers(il) => {
                c.window = Some(swa.window);
                if let Some(rope) = swa.rope {
                    c.rope = rope;
                    c.freqs = None;
                }
            }
            Some(swa) if !swa.global_rope => {
                c.rope.n_rot = 0;
                c.freqs = None;
            }
            _ => {}
        }
        c
    }
}

impl Model for PreNorm {
    fn hyper(&self) -> &Hyper {
        &self.h
    }

    fn device_layer(&self, il: usize) -> Option<crate::DeviceLayerSpec> {
        // Not: per-frequency RoPE divisors (Llama 3, Phi-3 LongRoPE, whose attention factor
        // the device's RoPE has not either), queries scaled as a node (Phi-3, whose Q/K/V are
        // one fused matrix too), mixtures of experts, Granite's multipliers and SmolLM3's
        // layers without RoPE (the device's layer has neither), YaRN and attention factors,
        // Mistral 3's query temperature.
        let c = &self.cfg;
        let t = &self.tweaks;
        let plain = self.llama_names && t.embd_scale.is_none() && t.residual_scale.is_none() && t.no_rope_every.is_none() && t.swa.is_none();
        let lw = self.layers.get(il)?;
        let dense = matches!(lw.ffn, Ffn::Dense { .. });
        // Norms before attention and the feed-forward, none after, Q/K norms per head.
        let norms = lw.attn_norm.is_some() && lw.attn_post_norm.is_none() && lw.q_norm.as_ref().is_none_or(|w| w.ne[0] == self.h.head_dim);
        let rotation = c.rope.mscale == 1.0 && c.rope.ext_factor == 0.0 && c.rope.still == 0;
        (plain && norms && rotation && dense && c.freqs.is_none() && c.q_scale.is_none() && c.temp.is_none()).then_some(crate::DeviceLayerSpec {
            rope_base: c.rope.base,
            freq_scale: c.rope.freq_scale,
            neox: c.rope.neox,
            window: None,
            gelu: false,
            scale: c.scale,
        })
    }

    fn key_rope(&self, il: usize) -> Option<crate::KeyRope> {
        // A layer without RoPE: a rotated width of 0, so a context shift leaves its keys.
        (il < self.layers.len()).then(|| {
            let c = self.attn_cfg(il);
            crate::KeyRope { rope: c.rope, freqs: c.freqs }
        })
    }

    fn tp_refusal(&self) -> Option<String> {
        let rows = self.layers.iter().any(|lw| lw.q_norm.as_ref().is_some_and(|w| w.ne[0] != self.h.head_dim));
        rows.then(|| format!("this {} model's Q/K norms span every head of a row, which no shard holds whole", self.h.arch))
    }

    fn build(&self, b: &mut Builder) -> Bundle {
        let h = &self.h;
        let t = &self.tweaks;
        let (mut x, on_device) = embed_input(b, &self.tok_embd, t.embd_scale); // [n_tokens, n_embd]
        for (il, lw) in self.layers.iter().enumerate().skip(on_device) {
            b.begin_layer(il);
            let cfg = self.attn_cfg(il);
            x = pre_norm_block(b, h, lw, il, &x, &cfg, t.glu.unwrap_or(Glu::Silu), t.residual_scale); // [n_tokens, n_embd]
        }
        // llama.cpp multiplies by the reciprocal, rounded to f32 once.
        head_then(b, h, &x, &self.norm, &self.output, t.logit_scale.map(|s| LogitsPost::Scale(1.0 / s))) // [n_outputs, n_vocab]
    }
}
