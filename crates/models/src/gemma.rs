//! Gemma (`gemma`), Gemma 2 (`gemma2`) and Gemma 3 (`gemma3`): embeddings scaled by √n_embd;
//! GELU-tanh gated FFN; NeoX RoPE; queries scaled as a node of their own; LM head tied to the
//! embedding. Gemma 2 and 3 interleave sliding-window and global attention layers (every
//! `pattern`-th layer global: 2 and 6 by default) and put norms after attention and the
//! feed-forward as well as before. Gemma 2 soft-caps every attention score
//! (`attn_logit_softcapping`, 50: `cap · tanh(s / cap)` inside the attention kernels,
//! `attention::Scale`) and the logits (`final_logit_softcapping`, 30), and scales its queries
//! by 1/√head_dim (the 27B model: 1/√(n_embd / n_head)); Gemma 3 has an RMS norm on Q and K
//! per head and a RoPE base of its own (10 000) in the sliding-window layers.

use crate::common::{embed_input, head_then, load_layers, output_weight, pre_norm_block, AttnCfg, Extras, LayerWeights, LogitsPost};
use crate::{Hyper, Loader, Model, ModelError};
use corelm_core::{Builder, Bundle, Glu, RopeParams, WeightRef};

/// RoPE base of the sliding-window layers (llama.cpp hard-codes it for Gemma 3).
const ROPE_BASE_SWA: f32 = 10_000.0;
/// Every sixth layer (Gemma 3), every second (Gemma 2) is global unless the file says otherwise.
const DEFAULT_SWA_PATTERN: usize = 6;
const GEMMA2_SWA_PATTERN: usize = 2;
/// Gemma 2's defaults where the file does not say (llama.cpp's).
const GEMMA2_WINDOW: usize = 4096;
const GEMMA2_ATTN_SOFTCAP: f32 = 50.0;
const GEMMA2_FINAL_SOFTCAP: f32 = 30.0;
/// Gemma 2 27B (its layer count, as llama.cpp tells it) scales queries by 1/√(n_embd / n_head).
const GEMMA2_27B_LAYERS: usize = 46;

/// Which Gemma.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Family {
    /// Gemma (1): the plain pre-norm block, every layer global.
    Gemma,
    Gemma2,
    Gemma3,
}

pub struct Gemma {
    h: Hyper,
    tok_embd: WeightRef,
    layers: Vec<LayerWeights>,
    norm: WeightRef,
    output: WeightRef,
    /// Sliding window of the local layers (Gemma 2 and 3).
    window: u32,
    /// Every `pattern`-th layer global (Gemma's are all global: 1).
    pattern: usize,
    freq_scale_global: f32,
    /// RoPE base and frequency scale of the sliding-window layers.
    rope_swa: (f32, f32),
    /// Multiplies the queries.
    q_scale: f32,
    /// Soft cap of every attention score (Gemma 2; 0: none).
    softcap: f32,
    /// Soft cap of the logits (Gemma 2).
    final_softcap: Option<f32>,
}

impl Gemma {
    pub(crate) fn load(l: &Loader, family: Family) -> Result<Self, ModelError> {
        let h = l.hyper()?;
        let (v2, v3) = (family == Family::Gemma2, family == Family::Gemma3);
        let extras = Extras { qk_norm: v3, post_norms: v2 || v3, ..Extras::default() };
        let layers = load_layers(l, &h, extras)?;
        let (window, pattern) = match family {
            Family::Gemma => (0, 1),
            Family::Gemma2 => (l.opt_u("attention.sliding_window")?.unwrap_or(GEMMA2_WINDOW), l.opt_u("attention.sliding_window_pattern")?.unwrap_or(GEMMA2_SWA_PATTERN)),
            Family::Gemma3 => (l.u("attention.sliding_window")?, l.opt_u("attention.sliding_window_pattern")?.unwrap_or(DEFAULT_SWA_PATTERN)),
        };
        let window = u32::try_from(window).map_err(|_| ModelError::BadHyper(format!("sliding window {window}")))?;
        // Linear scaling of the global layers (Gemma 3's larger models); YaRN and attention
        // factors, which llama.cpp would apply to the local layers too, are refused.
        let scaling = l.rope_scaling(h.n_rot, h.rope_base, h.n_ctx_train)?;
        if scaling.ext_factor != 0.0 || scaling.mscale != 1.0 {
            return Err(ModelError::Unsupported(format!("{} with YaRN or a RoPE attention factor", l.arch)));
        }
        let freq_scale_global = scaling.freq_scale;
        // Gemma 2's local layers rotate as its global ones unless the file gives them a base.
        let rope_swa = if v2 { (l.opt_f("rope.freq_base_swa")?.unwrap_or(h.rope_base), freq_scale_global) } else { (ROPE_BASE_SWA, 1.0) };
        let q_scale = if v2 && h.n_layer == GEMMA2_27B_LAYERS { 1.0 / ((h.n_embd / h.n_head) as f32).sqrt() } else { 1.0 / (h.head_dim as f32).sqrt() };
        let cap = |key: &str, default: f32| -> Result<f32, ModelError> {
            let c = l.opt_f(key)?.unwrap_or(default);
            if !(c.is_finite() && c > 0.0) {
                return Err(ModelError::BadHyper(format!("{}.{key} = {c}", l.arch)));
            }
            Ok(c)
        };
        let (softcap, final_softcap) = if v2 { (cap("attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP)?, Some(cap("final_logit_softcapping", GEMMA2_FINAL_SOFTCAP)?)) } else { (0.0, None) };
        Ok(Gemma {
            tok_embd: l.weight("token_embd.weight", [h.n_embd, h.n_vocab])?,
            norm: l.vector("output_norm.weight", h.n_embd)?,
            output: output_weight(l, &h)?,
            layers,
            h,
            window,
            pattern,
            freq_scale_global,
            rope_swa,
            q_scale,
            softcap,
            final_softcap,
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
            rope: RopeParams::plain(
                h.n_head,
                h.head_dim,
                h.n_rot,
                if swa { self.rope_swa.0 } else { h.rope_base },
                if swa { self.rope_swa.1 } else { self.freq_scale_global },
                true,
            ),
            scale: 1.0,
            q_scale: Some(self.q_scale),
            window: swa.then_some(self.window),
            softcap: self.softcap,
            freqs: None,
            temp: None,
        }
    }
}

impl Model for Gemma {
    fn hyper(&self) -> &Hyper {
        &self.h
    }

    fn device_layer(&self, il: usize) -> Option<crate::DeviceLayerSpec> {
        // Not Gemma 2's: the device's attention has no soft cap.
        let c = self.attn_cfg(il);
        (il < self.layers.len() && c.softcap == 0.0).then_some(crate::DeviceLayerSpec {
            rope_base: c.rope.base,
            freq_scale: c.rope.freq_scale,
            neox: true,
            window: c.window,
            gelu: true,
            scale: c.q_scale.unwrap_or(1.0),
        })
    }

    fn attn_softcap(&self) -> bool {
        self.softcap != 0.0
    }

    fn key_rope(&self, il: usize) -> Option<crate::KeyRope> {
        (il < self.layers.len()).then(|| crate::KeyRope { rope: self.attn_cfg(il).rope, freqs: None })
    }

    fn build(&self, b: &mut Builder) -> Bundle {
        let h = &self.h;
        let (mut x, on_device) = embed_input(b, &self.tok_embd, Some((h.n_embd as f32).sqrt())); // [n_tokens, n_embd]
        for (il, lw) in self.layers.iter().enumerate().skip(on_device) {
            b.begin_layer(il);
            x = pre_norm_block(b, h, lw, il, &x, &self.attn_cfg(il), Glu::GeluTanh, None); // [n_tokens, n_embd]
        }
        head_then(b, h, &x, &self.norm, &self.output, self.final_softcap.map(LogitsPost::Softcap)) // [n_outputs, n_vocab]
    }
}
