//! Pieces shared by the architectures: per-layer weights of a pre-norm transformer block and
//! the attention and feed-forward sub-graphs.

use crate::{Hyper, Loader, ModelError};
use corelm_core::{AttnParams, Builder, Bundle, Glu, RopeParams, WeightRef};

/// Weights of one transformer layer. Optional tensors are those only some families have.
pub struct LayerWeights {
    pub attn_norm: WeightRef,
    pub wq: WeightRef,
    pub wk: WeightRef,
    pub wv: WeightRef,
    pub wo: WeightRef,
    pub bq: Option<WeightRef>,
    pub bk: Option<WeightRef>,
    pub bv: Option<WeightRef>,
    pub q_norm: Option<WeightRef>,
    pub k_norm: Option<WeightRef>,
    pub attn_post_norm: Option<WeightRef>,
    pub ffn_norm: WeightRef,
    pub gate: WeightRef,
    pub up: WeightRef,
    pub down: WeightRef,
    pub ffn_post_norm: Option<WeightRef>,
}

/// Which optional tensors a family has.
#[derive(Clone, Copy, Default)]
pub struct Extras {
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub post_norms: bool,
}

impl LayerWeights {
    pub fn load(l: &Loader, h: &Hyper, il: usize, x: Extras) -> Result<Self, ModelError> {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let b = |s: &str| format!("blk.{il}.{s}.bias");
        let (e, qd, kvd) = (h.n_embd, h.n_head * h.head_dim, h.n_kv_head * h.head_dim);
        let opt = |cond: bool, name: String, len: usize| -> Result<Option<WeightRef>, ModelError> {
            cond.then(|| l.vector(&name, len)).transpose()
        };
        Ok(LayerWeights {
            attn_norm: l.vector(&n("attn_norm"), e)?,
            wq: l.weight(&n("attn_q"), [e, qd])?,
            wk: l.weight(&n("attn_k"), [e, kvd])?,
            wv: l.weight(&n("attn_v"), [e, kvd])?,
            wo: l.weight(&n("attn_output"), [qd, e])?,
            bq: opt(x.qkv_bias, b("attn_q"), qd)?,
            bk: opt(x.qkv_bias, b("attn_k"), kvd)?,
            bv: opt(x.qkv_bias, b("attn_v"), kvd)?,
            q_norm: opt(x.qk_norm, n("attn_q_norm"), h.head_dim)?,
            k_norm: opt(x.qk_norm, n("attn_k_norm"), h.head_dim)?,
            attn_post_norm: opt(x.post_norms, n("post_attention_norm"), e)?,
            ffn_norm: l.vector(&n("ffn_norm"), e)?,
            gate: l.weight(&n("ffn_gate"), [e, h.n_ff])?,
            up: l.weight(&n("ffn_up"), [e, h.n_ff])?,
            down: l.weight(&n("ffn_down"), [h.n_ff, e])?,
            ffn_post_norm: opt(x.post_norms, n("post_ffw_norm"), e)?,
        })
    }
}

/// Per-layer attention settings.
pub struct AttnCfg {
    pub rope: RopeParams,
    /// Multiplies q·k inside attention.
    pub scale: f32,
    /// Multiplies the queries before attention (Gemma), as a graph node of its own: the
    /// attention kernel rounds queries to F16, so where the scale is applied shows in the bits.
    pub q_scale: Option<f32>,
    pub window: Option<u32>,
}

/// `x_in [n_tokens, n_embd]` → attention output `[n_tokens, n_embd]` (before the residual add).
pub fn attention(b: &mut Builder, h: &Hyper, lw: &LayerWeights, il: usize, x: &Bundle, cfg: &AttnCfg) -> Bundle {
    let wq = b.weight(&lw.wq);
    let wk = b.weight(&lw.wk);
    let wv = b.weight(&lw.wv);
    let mut q = b.matmul(&wq, x); // [n_tokens, n_head * head_dim]
    let mut k = b.matmul(&wk, x); // [n_tokens, n_kv_head * head_dim]
    let mut v = b.matmul(&wv, x); // [n_tokens, n_kv_head * head_dim]
    for (t, bias) in [(&mut q, &lw.bq), (&mut k, &lw.bk), (&mut v, &lw.bv)] {
        if let Some(bias) = bias {
            let bw = b.weight(bias);
            *t = b.add(t, &bw);
        }
    }
    if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
        // Per-head RMS norm: the weight's length (head_dim) sets the group size.
        let (qn, kn) = (b.weight(qn), b.weight(kn));
        q = b.rms_norm(&q, &qn, h.eps);
        k = b.rms_norm(&k, &kn, h.eps);
    }
    let mut q = b.rope(&q, RopeParams { n_head: h.n_head, ..cfg.rope });
    if let Some(s) = cfg.q_scale {
        q = b.scale(&q, s);
    }
    let k = b.rope(&k, RopeParams { n_head: h.n_kv_head, ..cfg.rope });
    b.kv_store(il, &k, &v);
    let p = AttnParams {
        n_head: h.n_head,
        n_kv_head: h.n_kv_head,
        head_dim: h.head_dim,
        scale: cfg.scale,
        window: cfg.window,
    };
    let a = b.attention(il, &q, p); // [n_tokens, n_head * head_dim]
    let wo = b.weight(&lw.wo);
    b.matmul(&wo, &a) // [n_tokens, n_embd]
}

/// Gated feed-forward: `down(act(gate x) · up x)`, `[n_tokens, n_embd]` → same.
pub fn ffn(b: &mut Builder, lw: &LayerWeights, x: &Bundle, kind: Glu) -> Bundle {
    let (wg, wu, wd) = (b.weight(&lw.gate), b.weight(&lw.up), b.weight(&lw.down));
    let g = b.matmul(&wg, x); // [n_tokens, n_ff]
    let u = b.matmul(&wu, x); // [n_tokens, n_ff]
    let a = b.glu(&g, &u, kind);
    b.matmul(&wd, &a) // [n_tokens, n_embd]
}

/// Weights of every layer.
pub fn load_layers(l: &Loader, h: &Hyper, x: Extras) -> Result<Vec<LayerWeights>, ModelError> {
    (0..h.n_layer).map(|il| LayerWeights::load(l, h, il, x)).collect()
}

/// One pre-norm transformer block (LLaMA, Qwen2):
/// `x1 = x + attn(norm(x))`, `out = x1 + ffn(norm(x1))`, all `[n_tokens, n_embd]`.
pub fn pre_norm_block(b: &mut Builder, h: &Hyper, lw: &LayerWeights, il: usize, x: &Bundle, cfg: &AttnCfg, glu: Glu) -> Bundle {
    let an = b.weight(&lw.attn_norm);
    let hn = b.rms_norm(x, &an, h.eps);
    let a = attention(b, h, lw, il, &hn, cfg);
    let x1 = b.add(&a, x);
    let fnw = b.weight(&lw.ffn_norm);
    let hn = b.rms_norm(&x1, &fnw, h.eps);
    let f = ffn(b, lw, &hn, glu);
    b.add(&f, &x1)
}

/// Final norm and LM head over the output rows: `[n_outputs, n_vocab]` logits.
pub fn head(b: &mut Builder, h: &Hyper, x: &Bundle, norm: &WeightRef, output: &WeightRef) -> Bundle {
    b.begin_layer(h.n_layer);
    let x = b.select_outputs(x); // [n_outputs, n_embd]
    let nw = b.weight(norm);
    let x = b.rms_norm(&x, &nw, h.eps);
    let w = b.weight(output);
    b.matmul_output(&w, &x) // [n_outputs, n_vocab]
}

/// The LM head: `output.weight`, or the token embedding when tied.
pub fn output_weight(l: &Loader, h: &Hyper) -> Result<WeightRef, ModelError> {
    let name = if l.has("output.weight") { "output.weight" } else { "token_embd.weight" };
    l.weight(name, [h.n_embd, h.n_vocab])
}
