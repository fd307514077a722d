//! The graph builder and the static graph it produces.
//!
//! Builder functions append nodes in construction order, which is already a topological order,
//! so the scheduler simply walks the list. Activations are placed as the graph is built: layer
//! `il` allocates from activation buffer `il % 2` (reset at the start of the layer) and may only
//! read the previous layer's tensors, which are in the other buffer; embeddings count as layer
//! -1 and the output head as layer `n_layer`. The graph records how many bytes each buffer and
//! the output pool need, so pools are sized by planning the largest batch once.
//!
//! Modes (ArcLight): serial now; scatter/parallel/gather arrive with tensor parallelism and will
//! make bundles hold one tensor per subgraph.
//!
//! Invariant: a graph depends only on the batch *shape* (tokens, outputs), never on token ids
//! or positions, which are read from the batch at run time; so the decode graph is planned once
//! and reused for every token.

use crate::tensor::*;
use corelm_kernels::{DType, Kernels};
use std::collections::HashMap;

const ALIGN: usize = 64;

/// Graph construction mode (only `Serial` exists until tensor parallelism lands).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Serial,
}

/// A planned graph: tensor headers and the nodes to run, in order.
pub struct Graph {
    pub tensors: Vec<Tensor>,
    pub nodes: Vec<TensorId>,
    pub n_tokens: usize,
    pub n_outputs: usize,
    /// Bytes needed in each activation buffer and in the output pool.
    pub act_bytes: [usize; 2],
    pub out_bytes: usize,
    /// The tensor holding the result rows (logits).
    pub result: TensorId,
    /// Largest head dimension used by attention (per-thread scratch size).
    pub max_head_dim: usize,
}

impl Graph {
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.0 as usize]
    }
}

pub struct Builder<'k> {
    kernels: &'k Kernels,
    tensors: Vec<Tensor>,
    nodes: Vec<TensorId>,
    n_tokens: usize,
    n_outputs: usize,
    layer: i32,
    bump: [usize; 2],
    peak: [usize; 2],
    out_bump: usize,
    quantized: HashMap<(TensorId, DType), TensorId>,
    max_head_dim: usize,
    pub mode: Mode,
}

impl<'k> Builder<'k> {
    /// Start a graph for a batch of `n_tokens` tokens of which `n_outputs` produce outputs.
    pub fn new(kernels: &'k Kernels, n_tokens: usize, n_outputs: usize) -> Self {
        Builder {
            kernels,
            tensors: Vec::new(),
            nodes: Vec::new(),
            n_tokens,
            n_outputs,
            layer: -1,
            bump: [0; 2],
            peak: [0; 2],
            out_bump: 0,
            quantized: HashMap::new(),
            max_head_dim: 0,
            mode: Mode::Serial,
        }
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    fn t(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.0 as usize]
    }

    /// Begin layer `il`: its activations go to buffer `il % 2`, which is reset.
    pub fn begin_layer(&mut self, il: usize) {
        self.layer = il as i32;
        self.bump[il % 2] = 0;
        self.quantized.clear();
    }

    fn parity(&self) -> usize {
        self.layer.rem_euclid(2) as usize
    }

    fn check_src(&self, id: TensorId) {
        let t = self.t(id);
        if matches!(t.storage, Storage::Act { .. }) {
            assert!(
                t.layer >= self.layer - 1,
                "layer {} reads a tensor of layer {}: activations live for one layer only",
                self.layer,
                t.layer
            );
        }
    }

    fn push(&mut self, ne: [usize; 2], dtype: DType, op: Op, storage: Storage) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor { ne, dtype, op, storage, layer: self.layer });
        if op != Op::Leaf {
            self.nodes.push(id);
        }
        id
    }

    /// A new node whose result is an activation of the current layer.
    fn node(&mut self, ne: [usize; 2], dtype: DType, op: Op) -> Bundle {
        let p = self.parity();
        let bytes = corelm_kernels::row_bytes(dtype, ne[0]) * ne[1];
        let offset = self.bump[p];
        self.bump[p] = (offset + bytes).div_ceil(ALIGN) * ALIGN;
        self.peak[p] = self.peak[p].max(self.bump[p]);
        Bundle::one(self.push(ne, dtype, op, Storage::Act { buf: p as u8, offset }))
    }

    /// Register a weight of the model file.
    pub fn weight(&mut self, w: &WeightRef) -> Bundle {
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor {
            ne: w.ne,
            dtype: w.dtype,
            op: Op::Leaf,
            storage: Storage::Weight { offset: w.offset, len: w.len, packed: None },
            layer: -1,
        });
        Bundle::one(id)
    }

    /// Embedding rows of the batch tokens: `[n_tokens, table.ne0]`.
    pub fn embed(&mut self, table: &Bundle) -> Bundle {
        let t = table.single();
        let ne0 = self.t(t).ne[0];
        self.node([ne0, self.n_tokens], DType::F32, Op::Embed { table: t })
    }

    pub fn rms_norm(&mut self, x: &Bundle, w: &Bundle, eps: f32) -> Bundle {
        let (x, w) = (x.single(), w.single());
        self.check_src(x);
        let ne = self.t(x).ne;
        assert!(ne[0] % self.t(w).ne[0] == 0, "norm weight does not divide rows");
        self.node(ne, DType::F32, Op::RmsNorm { x, w, eps })
    }

    pub fn add(&mut self, a: &Bundle, b: &Bundle) -> Bundle {
        let (a, b) = (a.single(), b.single());
        self.check_src(a);
        self.check_src(b);
        let (na, nb) = (self.t(a).ne, self.t(b).ne);
        assert!(na[0] == nb[0] && (nb[1] == na[1] || nb[1] == 1), "add shapes {na:?} {nb:?}");
        self.node(na, DType::F32, Op::Add { a, b })
    }

    pub fn scale(&mut self, x: &Bundle, s: f32) -> Bundle {
        let x = x.single();
        self.check_src(x);
        let ne = self.t(x).ne;
        self.node(ne, DType::F32, Op::Scale { x, s })
    }

    /// `x` quantized for the dot product of weight type `wt`; one node per (x, type), shared by
    /// every matrix that reads `x` (Q/K/V share one, gate/up share one).
    fn quantized_for(&mut self, x: TensorId, wt: DType) -> TensorId {
        let vdt = self.kernels.ops(wt).map(|o| o.vec_dot_type).unwrap_or(DType::F32);
        if vdt == DType::F32 {
            return x;
        }
        if let Some(&q) = self.quantized.get(&(x, vdt)) {
            return q;
        }
        let ne = self.t(x).ne;
        let q = self.node(ne, vdt, Op::Quantize { x }).single();
        self.quantized.insert((x, vdt), q);
        q
    }

    /// Checks shapes and quantizes `x` for `w`: the op and result shape of `x · wᵀ`.
    fn matmul_op(&mut self, w: &Bundle, x: &Bundle) -> (Op, [usize; 2]) {
        let (w, x) = (w.single(), x.single());
        self.check_src(x);
        let (nw, nx) = (self.t(w).ne, self.t(x).ne);
        assert_eq!(nw[0], nx[0], "matmul inner dimensions");
        let xq = self.quantized_for(x, self.t(w).dtype);
        (Op::MatMul { w, x: xq }, [nw[1], nx[1]])
    }

    /// `[rows, w.ne1]` = x · wᵀ.
    pub fn matmul(&mut self, w: &Bundle, x: &Bundle) -> Bundle {
        let (op, ne) = self.matmul_op(w, x);
        self.node(ne, DType::F32, op)
    }

    /// Like [`Builder::matmul`] but the result goes to the output pool (logits).
    pub fn matmul_output(&mut self, w: &Bundle, x: &Bundle) -> Bundle {
        let (op, ne) = self.matmul_op(w, x);
        let offset = self.out_bump;
        self.out_bump += ne[0] * ne[1] * 4;
        Bundle::one(self.push(ne, DType::F32, op, Storage::Output { offset }))
    }

    pub fn rope(&mut self, x: &Bundle, p: RopeParams) -> Bundle {
        self.rope_ext(x, p, None)
    }

    /// RoPE with per-frequency divisors (`freqs`: an F32 weight of `n_rot / 2`).
    pub fn rope_ext(&mut self, x: &Bundle, p: RopeParams, freqs: Option<&Bundle>) -> Bundle {
        let x = x.single();
        self.check_src(x);
        let ne = self.t(x).ne;
        assert_eq!(ne[0], p.n_head * p.head_dim, "rope row length");
        assert!(p.n_rot <= p.head_dim && p.n_rot % 2 == 0 && p.n_rot <= crate::sched::MAX_ROT);
        let freqs = freqs.map(|f| f.single());
        if let Some(f) = freqs {
            let t = self.t(f);
            assert!(t.dtype == DType::F32 && t.ne[0] * t.ne[1] == p.n_rot / 2, "rope freq factors");
        }
        self.node(ne, DType::F32, Op::Rope { x, p, freqs })
    }

    /// Route each token to its top experts: `logits` `[n_expert, n_tokens]` → routing table.
    pub fn moe_route(&mut self, logits: &Bundle, p: MoeParams) -> Bundle {
        let logits = logits.single();
        self.check_src(logits);
        let ne = self.t(logits).ne;
        assert!(ne[0] == p.n_expert && p.n_used >= 1 && p.n_used <= p.n_expert, "moe routing shape");
        let len = crate::moe::Route::len(ne[1], p);
        self.node([len, 1], DType::I32, Op::MoeRoute { logits, p })
    }

    /// Grouped expert matmul: `w` stacks `n_expert` matrices of `w.ne1 / n_expert` rows; `x`
    /// has one row per token or (`per_pair`) per routed pair. Result `[n_out, n_tokens·n_used]`.
    pub fn matmul_id(&mut self, w: &Bundle, x: &Bundle, route: &Bundle, p: MoeParams, per_pair: bool) -> Bundle {
        let (w, x, route) = (w.single(), x.single(), route.single());
        self.check_src(x);
        let (nw, nx) = (self.t(w).ne, self.t(x).ne);
        assert_eq!(nw[0], nx[0], "matmul_id inner dimensions");
        assert_eq!(nw[1] % p.n_expert, 0, "stacked experts");
        let n_tok = self.n_tokens;
        assert_eq!(nx[1], if per_pair { n_tok * p.n_used } else { n_tok }, "matmul_id rows");
        let xq = self.quantized_for(x, self.t(w).dtype);
        let op = Op::MatMulId { w, x: xq, route, p, per_pair };
        self.node([nw[1] / p.n_expert, n_tok * p.n_used], DType::F32, op)
    }

    /// `x · sigmoid(g)` with `g` one value per row: `[ne0, rows]`, `[1, rows]` → `[ne0, rows]`.
    pub fn sigmoid_mul(&mut self, x: &Bundle, g: &Bundle) -> Bundle {
        let (x, g) = (x.single(), g.single());
        self.check_src(x);
        self.check_src(g);
        let (nx, ng) = (self.t(x).ne, self.t(g).ne);
        assert!(ng[0] == 1 && ng[1] == nx[1], "sigmoid_mul shapes {nx:?} {ng:?}");
        self.node(nx, DType::F32, Op::SigmoidMul { x, g })
    }

    /// Weighted sum of each token's expert outputs: `[ne0, n_tokens·n_used]` → `[ne0, n_tokens]`.
    pub fn moe_combine(&mut self, y: &Bundle, route: &Bundle, p: MoeParams) -> Bundle {
        let (y, route) = (y.single(), route.single());
        self.check_src(y);
        let ne = self.t(y).ne;
        assert_eq!(ne[1], self.n_tokens * p.n_used, "moe_combine rows");
        self.node([ne[0], self.n_tokens], DType::F32, Op::MoeCombine { y, route, p })
    }

    pub fn kv_store(&mut self, layer: usize, k: &Bundle, v: &Bundle) {
        let (k, v) = (k.single(), v.single());
        self.check_src(k);
        self.check_src(v);
        self.push([0, 0], DType::F32, Op::KvStore { layer: layer as u32, k, v }, Storage::None);
    }

    pub fn attention(&mut self, layer: usize, q: &Bundle, p: AttnParams) -> Bundle {
        let q = q.single();
        self.check_src(q);
        let ne = self.t(q).ne;
        assert_eq!(ne[0], p.n_head * p.head_dim, "attention query row length");
        assert!(p.n_kv_head > 0 && p.n_head % p.n_kv_head == 0, "heads not a multiple of KV heads");
        self.max_head_dim = self.max_head_dim.max(p.head_dim);
        self.node(ne, DType::F32, Op::Attention { layer: layer as u32, q, p })
    }

    pub fn glu(&mut self, gate: &Bundle, up: &Bundle, kind: Glu) -> Bundle {
        let (gate, up) = (gate.single(), up.single());
        self.check_src(gate);
        self.check_src(up);
        let ne = self.t(gate).ne;
        assert_eq!(ne, self.t(up).ne, "glu shapes");
        self.node(ne, DType::F32, Op::Glu { gate, up, kind })
    }

    /// Keep only the rows whose outputs the batch asks for: `[ne0, n_outputs]`.
    pub fn select_outputs(&mut self, x: &Bundle) -> Bundle {
        let x = x.single();
        self.check_src(x);
        let ne0 = self.t(x).ne[0];
        self.node([ne0, self.n_outputs], DType::F32, Op::SelectOutputs { x })
    }

    pub fn finish(self, result: &Bundle) -> Graph {
        Graph {
            result: result.single(),
            tensors: self.tensors,
            nodes: self.nodes,
            n_tokens: self.n_tokens,
            n_outputs: self.n_outputs,
            act_bytes: self.peak,
            out_bytes: self.out_bump,
            max_head_dim: self.max_head_dim,
        }
    }
}
