//! Pieces shared by the architectures: per-layer weights of a pre-norm transformer block and
//! the attention and feed-forward sub-graphs.

use crate::{Hyper, Loader, ModelError};
use corelm_core::graph::{Split, SPARSE_UP_MAX_TOKENS};
use corelm_core::{AttnParams, Builder, Bundle, Glu, MoeParams, RopeParams, WeightForm, WeightRef};

/// Weights of one transformer layer. Optional tensors are those only some families have.
pub struct LayerWeights {
    /// The norm before attention (all but OLMo 2, whose norms come after).
    pub attn_norm: Option<WeightRef>,
    pub wq: WeightRef,
    pub wk: WeightRef,
    pub wv: WeightRef,
    pub wo: WeightRef,
    pub bq: Option<WeightRef>,
    pub bk: Option<WeightRef>,
    pub bv: Option<WeightRef>,
    /// Q/K RMS norms: over each head (Qwen3, Gemma 3: `head_dim` values) or over the whole
    /// projection row (OLMo 2: all heads at once).
    pub q_norm: Option<WeightRef>,
    pub k_norm: Option<WeightRef>,
    pub attn_post_norm: Option<WeightRef>,
    /// Wo's bias (gpt-oss).
    pub bo: Option<WeightRef>,
    /// One attention-sink logit per query head (gpt-oss, `attn_sinks`: `[n_head]` f32).
    pub sinks: Option<WeightRef>,
    pub ffn_norm: Option<WeightRef>,
    pub ffn: Ffn,
    pub ffn_post_norm: Option<WeightRef>,
}

/// The feed-forward part of a layer.
#[allow(clippy::large_enum_variant)] // one per layer, made once at load
pub enum Ffn {
    /// `down(act(gate x) · up x)`.
    Dense { gate: WeightRef, up: WeightRef, down: WeightRef },
    /// Mixture of experts: a router (`[n_embd, n_expert]`) and the experts' matrices stacked
    /// (`[n_embd, n_ff_exp · n_expert]`, expert `e` at rows `e · n_ff_exp ..`).
    Moe { router: WeightRef, gate: WeightRef, up: WeightRef, down: WeightRef, p: MoeParams, shared: Option<Shared>, biases: Option<MoeBiases> },
}

/// gpt-oss's biases of a mixture of experts: the router's (`[n_expert]`) and each expert's
/// gate, up (`[n_ff_exp, n_expert]`) and down (`[n_embd, n_expert]`) rows.
pub struct MoeBiases {
    pub router: WeightRef,
    pub gate: WeightRef,
    pub up: WeightRef,
    pub down: WeightRef,
}

/// A shared expert every token goes through, scaled by `sigmoid(gate_inp · x)` where the file
/// has that gate (Qwen2-MoE), else added as it is (Granite MoE).
pub struct Shared {
    pub gate_inp: Option<WeightRef>,
    pub gate: WeightRef,
    pub up: WeightRef,
    pub down: WeightRef,
}

/// Which optional tensors a family has.
#[derive(Clone, Copy, Default)]
pub struct Extras {
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// The Q/K norms span the whole projection row instead of one head (OLMo 2).
    pub row_qk_norm: bool,
    pub post_norms: bool,
    /// No norms before attention and the feed-forward, only after (OLMo 2).
    pub no_pre_norms: bool,
    /// Experts instead of a dense feed-forward.
    pub moe: Option<MoeParams>,
    /// The experts are `feed_forward_length` wide, whatever `expert_feed_forward_length` says
    /// (Granite MoE, as llama.cpp reads it).
    pub experts_n_ff: bool,
    /// The norm before the feed-forward is stored as `post_attention_norm` (Seed-OSS), not
    /// `ffn_norm`.
    pub ffn_norm_post_attention: bool,
    /// gpt-oss's tensors: Wo's bias, the router's and the experts' biases, attention sinks.
    pub oai: bool,
}

impl LayerWeights {
    pub fn load(l: &Loader, h: &Hyper, il: usize, x: Extras) -> Result<Self, ModelError> {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let b = |s: &str| format!("blk.{il}.{s}.bias");
        let (e, qd, kvd) = (h.n_embd, h.n_head * h.head_dim, h.n_kv_head * h.head_dim);
        let opt = |cond: bool, name: String, len: usize| -> Result<Option<WeightRef>, ModelError> {
            cond.then(|| l.vector(&name, len)).transpose()
        };
        // Biases corelm's block has no place for are refused by name (llama.cpp adds them
        // where a file has them).
        // gpt-oss reads Wo's and the experts' (below).
        let read = |t: &str| x.oai && ["attn_output", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"].contains(&t);
        for t in ["attn_output", "ffn_gate", "ffn_up", "ffn_down", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
            if l.has(&b(t)) && !read(t) {
                return Err(ModelError::Unsupported(format!("{} bias {}", l.arch, b(t))));
            }
        }
        // Q, K and V as separate matrices or one fused `attn_qkv` (Phi-3), split by rows; their
        // biases wherever the file has them, as llama.cpp's `create_tensor_qkv` reads them for
        // every family (required where the family always has them, Qwen2's).
        let fused = l.has(&n("attn_qkv"));
        let (wq, wk, wv) = if fused {
            let name = n("attn_qkv");
            let total = qd + 2 * kvd;
            (l.rows(&name, e, total, 0, qd)?, l.rows(&name, e, total, qd, kvd)?, l.rows(&name, e, total, qd + kvd, kvd)?)
        } else {
            (l.weight(&n("attn_q"), [e, qd])?, l.weight(&n("attn_k"), [e, kvd])?, l.weight(&n("attn_v"), [e, kvd])?)
        };
        let (bq, bk, bv) = if fused && l.has(&b("attn_qkv")) {
            let name = b("attn_qkv");
            let total = qd + 2 * kvd;
            (Some(l.vector_part(&name, total, 0, qd)?), Some(l.vector_part(&name, total, qd, kvd)?), Some(l.vector_part(&name, total, qd + kvd, kvd)?))
        } else {
            let bias = |t: &str, len: usize| opt(x.qkv_bias || l.has(&b(t)), b(t), len);
            (bias("attn_q", qd)?, bias("attn_k", kvd)?, bias("attn_v", kvd)?)
        };
        let ffn = match x.moe {
            Some(p) => {
                // Without the key, llama.cpp's Qwen3 families take n_ff / n_used.
                let ff = match l.opt_u("expert_feed_forward_length")? {
                    _ if x.experts_n_ff => h.n_ff,
                    Some(ff) => ff,
                    None => h.n_ff / p.n_used,
                };
                Ffn::Moe {
                    router: l.weight(&n("ffn_gate_inp"), [e, p.n_expert])?,
                    gate: l.weight3(&n("ffn_gate_exps"), [e, ff, p.n_expert])?,
                    up: l.weight3(&n("ffn_up_exps"), [e, ff, p.n_expert])?,
                    down: l.weight3(&n("ffn_down_exps"), [ff, e, p.n_expert])?,
                    p,
                    shared: if l.has(&n("ffn_gate_shexp")) {
                        let sf = l.opt_u("expert_shared_feed_forward_length")?.unwrap_or(h.n_ff);
                        Some(Shared {
                            gate_inp: if l.has(&n("ffn_gate_inp_shexp")) { Some(l.weight(&n("ffn_gate_inp_shexp"), [e, 1])?) } else { None },
                            gate: l.weight(&n("ffn_gate_shexp"), [e, sf])?,
                            up: l.weight(&n("ffn_up_shexp"), [e, sf])?,
                            down: l.weight(&n("ffn_down_shexp"), [sf, e])?,
                        })
                    } else {
                        None
                    },
                    biases: if x.oai {
                        Some(MoeBiases {
                            router: l.vector(&b("ffn_gate_inp"), p.n_expert)?,
                            gate: l.weight(&b("ffn_gate_exps"), [ff, p.n_expert])?,
                            up: l.weight(&b("ffn_up_exps"), [ff, p.n_expert])?,
                            down: l.weight(&b("ffn_down_exps"), [e, p.n_expert])?,
                        })
                    } else {
                        None
                    },
                }
            }
            // Gate and up fused in one `ffn_up` of 2·n_ff rows, gate first (Phi-3).
            None if !l.has(&n("ffn_gate")) => Ffn::Dense {
                gate: l.rows(&n("ffn_up"), e, 2 * h.n_ff, 0, h.n_ff)?,
                up: l.rows(&n("ffn_up"), e, 2 * h.n_ff, h.n_ff, h.n_ff)?,
                down: l.weight(&n("ffn_down"), [h.n_ff, e])?,
            },
            None => Ffn::Dense {
                gate: l.weight(&n("ffn_gate"), [e, h.n_ff])?,
                up: l.weight(&n("ffn_up"), [e, h.n_ff])?,
                down: l.weight(&n("ffn_down"), [h.n_ff, e])?,
            },
        };
        let (qn, kn) = if x.row_qk_norm { (qd, kvd) } else { (h.head_dim, h.head_dim) };
        Ok(LayerWeights {
            attn_norm: opt(!x.no_pre_norms, n("attn_norm"), e)?,
            wq,
            wk,
            wv,
            wo: l.weight(&n("attn_output"), [qd, e])?,
            bq,
            bk,
            bv,
            q_norm: opt(x.qk_norm, n("attn_q_norm"), qn)?,
            k_norm: opt(x.qk_norm, n("attn_k_norm"), kn)?,
            attn_post_norm: opt(x.post_norms, n("post_attention_norm"), e)?,
            bo: opt(x.oai, b("attn_output"), e)?,
            sinks: opt(x.oai, n("attn_sinks"), h.n_head)?,
            ffn_norm: opt(!x.no_pre_norms, n(if x.ffn_norm_post_attention { "post_attention_norm" } else { "ffn_norm" }), e)?,
            ffn,
            ffn_post_norm: opt(x.post_norms, n("post_ffw_norm"), e)?,
        })
    }
}

/// Per-layer attention settings.
#[derive(Clone)]
pub struct AttnCfg {
    pub rope: RopeParams,
    /// Multiplies q·k inside attention.
    pub scale: f32,
    /// Multiplies the queries before attention (Gemma), as a graph node of its own: the
    /// attention kernel rounds queries to F16, so where the scale is applied shows in the bits.
    pub q_scale: Option<f32>,
    pub window: Option<u32>,
    /// Soft cap of the attention scores (Gemma 2; 0: none, `AttnParams::softcap`).
    pub softcap: f32,
    /// Per-frequency RoPE divisors (Llama 3 `rope_freqs.weight`).
    pub freqs: Option<WeightRef>,
    /// The queries' attention temperature `(scale, floor)` after RoPE (Mistral 3,
    /// `Op::TempScale`): each query times `1 + scale · ln(⌊pos / floor⌋ + 1)`.
    pub temp: Option<(f32, u32)>,
}

/// `x_in [n_tokens, n_embd]` → attention output `[n_tokens, n_embd]` (before the residual add).
///
/// Tensor parallel: each shard computes its query heads (Wq rows) and the KV heads they read
/// (Wk/Wv rows; a head several shards read: its keys and its values each on one of them,
/// stored into every reader's slots), stores those in its own cache slots, attends, and
/// multiplies by its columns of Wo; the shards' partial outputs are added at the gather. Head
/// counts below are per shard.
pub fn attention(b: &mut Builder, h: &Hyper, lw: &LayerWeights, il: usize, x: &Bundle, cfg: &AttnCfg) -> Bundle {
    let x = &b.scatter(x);
    let wq = b.weight_split(&lw.wq, Split::QHeads);
    let wk = b.weight_split(&lw.wk, Split::KHeads);
    let wv = b.weight_split(&lw.wv, Split::VHeads);
    // Each product plus its LoRA adapters' (`Builder::lora`; none under `--tp`).
    let q = b.matmul(&wq, x); // [n_tokens, n_head * head_dim]
    let mut q = b.lora(&lw.wq, x, q);
    let k = b.matmul(&wk, x); // [n_tokens, n_kv_head * head_dim]
    let mut k = b.lora(&lw.wk, x, k);
    let v = b.matmul(&wv, x); // [n_tokens, n_kv_head * head_dim]
    let mut v = b.lora(&lw.wv, x, v);
    for (t, bias, split) in [(&mut q, &lw.bq, Split::QHeads), (&mut k, &lw.bk, Split::KHeads), (&mut v, &lw.bv, Split::VHeads)] {
        if let Some(bias) = bias {
            let bw = b.weight_split(bias, split);
            *t = b.add(t, &bw);
        }
    }
    if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
        // RMS norm per head, or per row (OLMo 2; never under `--tp`, whose shards hold only
        // some heads of a row): the weight's length sets the group size.
        let (qn, kn) = (b.weight(qn), b.weight(kn));
        q = b.rms_norm(&q, &qn, h.eps);
        k = b.rms_norm(&k, &kn, h.eps);
    }
    // A rotated width of 0: a layer without RoPE (SmolLM3's every fourth).
    let (q, k) = if cfg.rope.n_rot > 0 {
        let freqs = cfg.freqs.as_ref().map(|f| b.weight(f));
        let q = b.rope_ext(&q, RopeParams { n_head: h.n_head, ..cfg.rope }, freqs.as_ref());
        (q, b.rope_ext(&k, RopeParams { n_head: h.n_kv_head, ..cfg.rope }, freqs.as_ref()))
    } else {
        (q, k)
    };
    let q = match cfg.temp {
        Some((scale, floor)) => b.temp_scale(&q, scale, floor),
        None => q,
    };
    let q = match cfg.q_scale {
        Some(s) => b.scale(&q, s),
        None => q,
    };
    b.kv_store(il, &k, &v);
    let p = AttnParams {
        n_head: h.n_head,
        n_kv_head: h.n_kv_head,
        head_dim: h.head_dim,
        scale: cfg.scale,
        softcap: cfg.softcap,
        window: cfg.window,
    };
    let sinks = lw.sinks.as_ref().map(|w| b.weight(w));
    let a = b.attention_sinks(il, &q, p, sinks.as_ref()); // [n_tokens, n_head * head_dim]
    let y = b.matmul_cols(&lw.wo, &a, Split::HeadCols); // [n_tokens, n_embd] (per shard: a partial sum)
    let y = b.lora(&lw.wo, &a, y);
    let y = b.gather_sum(&y);
    match &lw.bo {
        Some(bo) => {
            let bo = b.weight(bo);
            b.add(&y, &bo)
        }
        None => y,
    }
}

/// Gated feed-forward: `down(act(gate x) · up x)`, `[n_tokens, n_embd]` → same; with
/// experts, the same per routed (token, expert) pair, summed with the routing weights.
pub fn ffn(b: &mut Builder, lw: &LayerWeights, x: &Bundle, kind: Glu) -> Bundle {
    match &lw.ffn {
        Ffn::Dense { gate, up, down } if b.sparse_threshold().is_some() || b.offloaded().is_some() => {
            // Negative: every neuron fires (a dense layer split with an accelerator).
            let thr = b.sparse_threshold().unwrap_or(-1.0);
            sparse_ffn(b, gate, up, down, x, kind, thr)
        }
        Ffn::Dense { gate, up, down } => {
            // Tensor parallel: gate/up by rows and down by columns of each shard's feed-forward
            // range; the shards' partial outputs are added at the gather.
            // A cut inside one of down's quantization blocks: both shards multiply that block,
            // each by its own activations and zeros (`Builder::matmul_cols`).
            let x = b.scatter(x);
            let (wg, wu) = (b.weight_split(gate, Split::FfRows), b.weight_split(up, Split::FfRows));
            let g = b.matmul(&wg, &x); // per shard [n_tokens, ff_s]
            let g = b.lora(gate, &x, g);
            let u = b.matmul(&wu, &x); // per shard [n_tokens, ff_s]
            let u = b.lora(up, &x, u);
            let a = b.glu(&g, &u, kind);
            let y = b.matmul_cols(down, &a, Split::FfCols); // per shard [n_tokens, n_embd], partial sums
            let y = b.lora(down, &a, y);
            b.gather_sum(&y) // [n_tokens, n_embd]
        }
        Ffn::Moe { router, gate, up, down, p, shared, biases } => {
            let wr = b.weight(router);
            let logits = b.matmul(&wr, x); // [n_tokens, n_expert]
            let mut logits = b.lora(router, x, logits);
            if let Some(bs) = biases {
                let rb = b.weight(&bs.router);
                logits = b.add(&logits, &rb);
            }
            let route = b.moe_route(&logits, *p); // routing table
            // Tensor parallel: each shard computes the pairs routed to its experts and their
            // weighted sum; the gather adds the shards' sums.
            let xs = b.scatter(x);
            let (wg, wu) = (b.weight_split(gate, Split::Experts), b.weight_split(up, Split::Experts));
            let wd = b.weight_split(down, Split::Experts);
            // gpt-oss: each pair's product plus its expert's bias row.
            let biased = |b: &mut Builder, y: Bundle, bias: Option<&WeightRef>| match bias {
                Some(w) => {
                    let w = b.weight_split(w, Split::Experts);
                    b.add_expert_bias(&y, &w, &route, *p)
                }
                None => y,
            };
            let g = b.matmul_id(&wg, &xs, &route, *p, false); // [n_tokens · n_used, n_ff_exp]
            let g = biased(b, g, biases.as_ref().map(|bs| &bs.gate));
            let u = b.matmul_id(&wu, &xs, &route, *p, false); // [n_tokens · n_used, n_ff_exp]
            let u = biased(b, u, biases.as_ref().map(|bs| &bs.up));
            let a = b.glu(&g, &u, kind);
            let y = b.matmul_id(&wd, &a, &route, *p, true); // [n_tokens · n_used, n_embd]
            let y = biased(b, y, biases.as_ref().map(|bs| &bs.down));
            let moe = b.moe_combine(&y, &route, *p); // [n_tokens, n_embd]
            let moe = b.gather_sum(&moe);
            let Some(sh) = shared else { return moe };
            let s = dense_ffn(b, &sh.gate, &sh.up, &sh.down, x, kind); // [n_tokens, n_embd]
            let s = match &sh.gate_inp {
                Some(gate_inp) => {
                    let wgi = b.weight(gate_inp);
                    let g = b.matmul(&wgi, x); // [n_tokens, 1]
                    let g = b.lora(gate_inp, x, g);
                    b.sigmoid_mul(&s, &g)
                }
                None => s,
            };
            b.add(&moe, &s)
        }
    }
}

/// The sparse feed-forward (CATS-style, KAIROX on the CPU): the gate product is computed
/// densely and is an exact predictor — a neuron fires when `|act(gate x)| > thr` — so only the
/// firing neurons' rows of up (their groups of four) and of down (stored neuron-major) are read.
/// `[n_tokens, n_embd]` → same.
fn sparse_ffn(b: &mut Builder, gate: &WeightRef, up: &WeightRef, down: &WeightRef, x: &Bundle, kind: Glu, thr: f32) -> Bundle {
    let Some(hot) = b.offloaded().map(<[u32]>::len) else {
        // Tensor parallel: each shard computes its feed-forward range's neurons — gate and up
        // rows, down's neuron-major rows — and the shards' partial outputs are added at the
        // gather. A neuron fires on its threshold alone, so the firing set does not depend on
        // the split.
        let x = b.scatter(x);
        // With an adjacent-layer predictor (KAIROX §5.1), the next layer's firing is predicted
        // from this layer's input, and this layer's gate rows are read only for the neurons
        // predicted here (so the gate matrix stays plain rows).
        // Large batches compute gate and up densely, on the copies interleaved at load (the
        // tiles); small ones only the rows they need: up's groups of four holding a firing
        // neuron on that copy (or, when few fire, the file's plain rows), the predicted gate
        // rows on plain rows.
        let pred = b.predicted_firing(&x); // per shard [n_tokens, ff_s] margins
        let gate_form = if predicted_gate_rows(b, pred.as_ref()) { WeightForm::PlainRows } else { WeightForm::Rows };
        let wg = b.weight_split_in(gate, Split::FfRows, gate_form);
        let wu = b.weight_split(up, Split::FfRows);
        let wd = b.weight_split_in(down, Split::FfCols, WeightForm::NeuronMajor { from: down.dtype }); // per shard [n_embd, ff_s]
        let y = cpu_sparse_ffn(b, &wg, &wu, &wd, &x, kind, thr, false, pred.as_ref()).0; // per shard [n_tokens, n_embd]
        return b.gather_sum(&y); // [n_tokens, n_embd]
    };
    // KAIROX: an accelerator computes the hot neurons while the CPU computes the others from
    // copies of their rows; the two partial outputs add up to the layer's.
    let n_embd = down.ne[1];
    let begin = b.offload_begin(x, kind, thr);
    if b.balanced() {
        // Online balancing: the CPU holds every neuron (tensor parallel: each shard those of
        // its range) and skips those the device holds at this pass; the device observes the
        // CPU's gate product of every neuron (the shards' pieces). With a predictor (over every
        // neuron, since the device's set moves), small batches compute the gate of the
        // predicted neurons only, so the device observes those, the others counted quiet.
        let xs = b.scatter(x);
        let pred = b.predicted_firing(&xs); // per shard [n_tokens, ff_s] margins
        let gate_form = if predicted_gate_rows(b, pred.as_ref()) { WeightForm::PlainRows } else { WeightForm::Rows };
        let (wg, wu) = (b.weight_split_in(gate, Split::FfRows, gate_form), b.weight_split(up, Split::FfRows));
        let wd = b.weight_split_in(down, Split::FfCols, WeightForm::NeuronMajor { from: down.dtype }); // per shard [n_embd, ff_s]
        let (y_cpu, g) = cpu_sparse_ffn(b, &wg, &wu, &wd, &xs, kind, thr, true, pred.as_ref()); // per shard [n_tokens, n_embd]
        let y_cpu = b.gather_sum(&y_cpu); // [n_tokens, n_embd]
        let y_acc = b.offload_end(&begin, n_embd, Some(&g)); // [n_tokens, n_embd]
        return b.add(&y_cpu, &y_acc);
    }
    // Tensor parallel: each shard computes the CPU's neurons of its feed-forward range. With a
    // predictor (over the CPU's neurons only), as without an accelerator.
    let xs = b.scatter(x);
    let pred = b.predicted_firing(&xs); // per shard [n_tokens, n_cold_s] margins
    if hot == gate.ne[1] {
        // Every neuron on the device: no CPU part (the scatter was for the next layer's
        // prediction).
        b.leave_parallel();
        return b.offload_end(&begin, n_embd, None); // [n_tokens, n_embd]
    }
    let (layer, n_ff) = (b.layer() as u16, gate.ne[1]);
    let plain = predicted_gate_rows(b, pred.as_ref());
    let wg = b.weight_cold(gate, WeightForm::ColdRows { layer, plain, n0: 0, n1: 0 }, n_ff); // per shard [n_embd, n_cold]
    let wu = b.weight_cold(up, WeightForm::ColdRows { layer, plain: true, n0: 0, n1: 0 }, n_ff); // per shard [n_embd, n_cold]
    let wd = b.weight_cold(down, WeightForm::ColdNeuronMajor { from: down.dtype, layer, n0: 0, n1: 0 }, n_ff); // per shard [n_embd, n_cold]
    let y_cpu = cpu_sparse_ffn(b, &wg, &wu, &wd, &xs, kind, thr, false, pred.as_ref()).0; // per shard [n_tokens, n_embd]
    let y_cpu = b.gather_sum(&y_cpu); // [n_tokens, n_embd]
    let y_acc = b.offload_end(&begin, n_embd, None); // [n_tokens, n_embd]
    b.add(&y_cpu, &y_acc)
}

/// Whether the sparse FFN's gate reads only the predicted neurons' rows (`Op::SparseGate`, on
/// plain rows): with a prediction, in small batches; otherwise the gate is computed densely.
fn predicted_gate_rows(b: &Builder, pred: Option<&Bundle>) -> bool {
    pred.is_some() && b.n_tokens() <= SPARSE_UP_MAX_TOKENS
}

/// The CPU's sparse FFN over gate `wg`, up `wu` and neuron-major down `wd`
/// (`masked`: skipping the neurons the accelerator holds now; `pred`: only the predicted
/// neurons can fire, and small batches read only their gate rows, `wg` plain rows): the
/// output and the gate product.
#[allow(clippy::too_many_arguments)]
fn cpu_sparse_ffn(b: &mut Builder, wg: &Bundle, wu: &Bundle, wd: &Bundle, x: &Bundle, kind: Glu, thr: f32, masked: bool, pred: Option<&Bundle>) -> (Bundle, Bundle) {
    let small = b.n_tokens() <= SPARSE_UP_MAX_TOKENS;
    let g = match pred {
        Some(p) if small => b.sparse_gate(p, wg, x), // [n_tokens, n_ff], zero where not predicted
        _ => b.matmul(wg, x),                        // [n_tokens, n_ff]
    };
    let h = if small {
        b.sparse_up(&g, wu, x, kind, thr, masked) // [n_tokens, n_ff], zero where not firing
    } else {
        let u = b.matmul(wu, x); // [n_tokens, n_ff]
        b.glu_masked(&g, &u, kind, thr, masked, pred)
    };
    (b.sparse_down(&h, wd), g) // [n_tokens, n_embd], [n_tokens, n_ff]
}

/// `down(act(gate x) · up x)`: `[n_tokens, n_embd]` → same.
fn dense_ffn(b: &mut Builder, gate: &WeightRef, up: &WeightRef, down: &WeightRef, x: &Bundle, kind: Glu) -> Bundle {
    let (wg, wu, wd) = (b.weight(gate), b.weight(up), b.weight(down));
    let g = b.matmul(&wg, x); // [n_tokens, n_ff]
    let g = b.lora(gate, x, g);
    let u = b.matmul(&wu, x); // [n_tokens, n_ff]
    let u = b.lora(up, x, u);
    let a = b.glu(&g, &u, kind);
    let y = b.matmul(&wd, &a); // [n_tokens, n_embd]
    b.lora(down, &a, y)
}

/// Weights of every layer.
pub fn load_layers(l: &Loader, h: &Hyper, x: Extras) -> Result<Vec<LayerWeights>, ModelError> {
    (0..h.n_layer).map(|il| LayerWeights::load(l, h, il, x)).collect()
}

/// One pre-norm transformer block, `[n_tokens, n_embd]` → the same:
/// `x1 = x + r·post(attn(norm(x)))`, `out = x1 + r·post(ffn(norm(x1)))`, where `norm` is the
/// layer's norm before attention or the feed-forward (all but OLMo 2), `post` its norm after
/// them where it has one (Gemma 2 and 3, OLMo 2) and `r` the residual scale where there is one
/// (Granite).
#[allow(clippy::too_many_arguments)]
pub fn pre_norm_block(b: &mut Builder, h: &Hyper, lw: &LayerWeights, il: usize, x: &Bundle, cfg: &AttnCfg, glu: Glu, residual: Option<f32>) -> Bundle {
    let finish = |b: &mut Builder, y: Bundle, post: &Option<WeightRef>| {
        let y = match post {
            Some(w) => {
                let w = b.weight(w);
                b.rms_norm(&y, &w, h.eps)
            }
            None => y,
        };
        match residual {
            Some(r) => b.scale(&y, r),
            None => y,
        }
    };
    let pre = |b: &mut Builder, x: &Bundle, norm: &Option<WeightRef>| match norm {
        Some(w) => {
            let w = b.weight(w);
            b.rms_norm(x, &w, h.eps)
        }
        None => x.clone(),
    };
    let hn = pre(b, x, &lw.attn_norm);
    let a = attention(b, h, lw, il, &hn, cfg); // Q/K norms inside, where the layer has them
    let a = finish(b, a, &lw.attn_post_norm);
    let x1 = b.add(&a, x);
    let hn = pre(b, &x1, &lw.ffn_norm);
    let f = ffn(b, lw, &hn, glu);
    let f = finish(b, f, &lw.ffn_post_norm);
    b.add(&f, &x1)
}

/// The token embeddings, `[n_tokens, n_embd]`, times `scale` where given (Gemma's √n_embd,
/// Granite's `embedding_scale`), then the first layers whole on the accelerator
/// (`--accel-layers`); returns the rows and how many layers the accelerator ran.
pub fn embed_input(b: &mut Builder, tok_embd: &WeightRef, scale: Option<f32>) -> (Bundle, usize) {
    let te = b.weight(tok_embd);
    let mut x = b.embed(&te); // [n_tokens, n_embd]
    if let Some(s) = scale {
        x = b.scale(&x, s);
    }
    let on_device = b.device_layers();
    if on_device > 0 {
        x = b.device_block(&x); // [n_tokens, n_embd]
    }
    (x, on_device)
}

/// What the logits go through before they are written (Granite, Gemma 2).
#[derive(Clone, Copy, Debug)]
pub enum LogitsPost {
    /// Multiplied by this (Granite's 1/`logit_scale`).
    Scale(f32),
    /// `cap · tanh(l / cap)` (Gemma 2's `final_logit_softcapping`).
    Softcap(f32),
}

/// Final norm and LM head over the output rows: `[n_outputs, n_vocab]` logits — or, for a
/// graph of hidden states (`Builder::with_hidden_output`, embeddings), the normed rows
/// themselves, `[n_outputs, n_embd]` (llama.cpp's `t_embd`). The logits then go through
/// `post` where given: one product over the whole vocabulary (not cut by shards), and the
/// node of `post` writes the output pool.
pub fn head_then(b: &mut Builder, h: &Hyper, x: &Bundle, norm: &WeightRef, output: &WeightRef, post: Option<LogitsPost>) -> Bundle {
    b.begin_layer(h.n_layer);
    let x = b.select_outputs(x); // [n_outputs, n_embd]
    let nw = b.weight(norm);
    let x = b.rms_norm(&x, &nw, h.eps);
    if b.hidden_output() {
        return b.hidden_to_output(&x); // [n_outputs, n_embd]
    }
    if let Some(post) = post {
        let w = b.weight(output);
        let y = b.matmul(&w, &x); // [n_outputs, n_vocab]
        let y = match post {
            LogitsPost::Scale(s) => b.scale(&y, s),
            LogitsPost::Softcap(c) => b.softcap(&y, c),
        };
        return b.hidden_to_output(&y);
    }
    // Tensor parallel: each shard computes its vocabulary rows' logits.
    let x = b.scatter(&x);
    let w = b.weight_split(output, Split::Vocab);
    b.matmul_output(&w, &x) // [n_outputs, n_vocab]
}

/// The LM head: `output.weight`, or the token embedding when tied.
pub fn output_weight(l: &Loader, h: &Hyper) -> Result<WeightRef, ModelError> {
    let name = if l.has("output.weight") { "output.weight" } else { "token_embd.weight" };
    l.weight(name, [h.n_embd, h.n_vocab])
}
