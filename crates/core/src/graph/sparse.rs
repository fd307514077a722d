//! The sparse feed-forward's part of the graph builder (`--sparsity`, KAIROX on the CPU):
//! the sparse configuration ([`SparseFfn`]), the weight forms its nodes read, the nodes
//! themselves, the accelerator's hand-off nodes, and the adjacent-layer predictor's nodes.

use super::*;
use corelm_kernels::matmul::layout::ROWS;

/// Sparse FFNs (`--sparsity`): the per-layer activation thresholds a calibration chose and
/// the type of the neuron-major down projection.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseFfn {
    /// Per layer: neurons whose `|act(gate)|` is at most this do not fire; negative: the
    /// layer's FFN stays dense.
    pub thresholds: Vec<f32>,
    /// Type of the down projection stored neuron-major (32-value blocks:
    /// `corelm_kernels::sparse::NEURON_MAJOR_TYPES`).
    pub down_type: DType,
    /// Per layer: the neurons an accelerator computes (gate, up and down, sorted; empty: none),
    /// the CPU computing the rest (`WeightForm::ColdRows`...) and adding the two parts.
    pub offloaded: Vec<Vec<u32>>,
    /// Online balancing: the device's neurons change as the run goes, so the CPU keeps every
    /// neuron's weights and skips the ones the device holds at each pass
    /// (`Offload::resident`); `offloaded` is then only where the device starts.
    pub balanced: bool,
    /// Adjacent-layer predictors (`--predictor`): layer `l`'s gate rows are computed only for
    /// the neurons predicted from layer `l − 1`'s FFN input, and only those can fire.
    pub predictor: Option<Arc<Predictors>>,
}

impl SparseFfn {
    /// Thresholds per layer and the neuron-major down type; no accelerator, no predictor.
    pub fn new(thresholds: Vec<f32>, down_type: DType) -> Self {
        SparseFfn { thresholds, down_type, offloaded: Vec::new(), balanced: false, predictor: None }
    }

    /// With an accelerator's neurons (`offloaded`, static), each layer's predictor cut down to
    /// the CPU's neurons (`LayerPredictor::of_neurons`; none where the device holds them all):
    /// the CPU's sparse nodes are built over those neurons alone.
    pub fn predict_cold_only(&mut self, n_ff: usize) {
        if !self.predicts_cold_only() {
            return;
        }
        let Some(p) = self.predictor.as_ref() else { return };
        let layers = p
            .layers
            .iter()
            .enumerate()
            .map(|(l, lp)| {
                let cold = self.cold(l, 0..n_ff);
                lp.as_ref().filter(|_| !cold.is_empty()).map(|lp| if cold.len() == n_ff { lp.clone() } else { lp.of_neurons(&cold) })
            })
            .collect();
        self.predictor = Some(Arc::new(Predictors { n_embd: p.n_embd, n_ff: p.n_ff, layers }));
    }

    /// Whether [`SparseFfn::predict_cold_only`] cuts the predictors: with a predictor and an
    /// accelerator's static neurons (under online balancing the CPU holds every neuron, the
    /// device's set moves).
    pub fn predicts_cold_only(&self) -> bool {
        self.predictor.is_some() && !self.balanced && self.offloaded.iter().any(|v| !v.is_empty())
    }

    /// The neurons of `layer` among `range` the CPU computes, in order.
    pub fn cold(&self, layer: usize, range: std::ops::Range<usize>) -> Vec<u32> {
        let hot = self.offloaded.get(layer).map_or(&[][..], |v| &v[..]);
        (range.start as u32..range.end as u32).filter(|i| hot.binary_search(i).is_err()).collect()
    }
}

/// One layer's adjacent-layer predictor (KAIROX §5.1) in the form `Op::Predict` reads:
/// `margin = B·(A·x) − cut`, `A` and `B` quantized to Q8_0 once at load.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerPredictor {
    /// Hidden width: the trained rank zero-padded to whole Q8_0 blocks.
    pub rank: usize,
    /// `A`: `rank` rows of `n_embd` values, Q8_0.
    pub a: Vec<u8>,
    /// `B`: `n_ff` rows of `rank` values, Q8_0.
    pub b: Vec<u8>,
    /// `A` and `B` in the interleaved layout (`corelm_kernels::matmul::layout`, four rows
    /// block by block; `B` only when `n_ff` is a multiple of four), for tables with
    /// interleaved Q8_0 kernels: the same values as the plain rows' dots.
    pub a_il: Vec<u8>,
    pub b_il: Option<Vec<u8>>,
    /// Per neuron: the logit cut minus the neuron's bias.
    pub cut: Vec<f32>,
}

impl LayerPredictor {
    /// From a trained model `p = σ(B·(A·x) + c)` cut at logit `cut`: `a` `[rank × n_embd]`,
    /// `b` `[n_ff × rank]`, `c` `[n_ff]`, f32.
    pub fn new(rank: usize, n_embd: usize, a: &[f32], b: &[f32], c: &[f32], cut: f32) -> Result<Self, String> {
        let q = DType::Q8_0;
        let n_ff = c.len();
        if rank == 0 || !n_embd.is_multiple_of(q.block_size()) || a.len() != rank * n_embd || b.len() != n_ff * rank {
            return Err(format!("a predictor of rank {rank} over {n_embd} inputs needs a [{rank} × {n_embd}] A and a [{n_ff} × {rank}] B, and inputs in whole blocks of 32"));
        }
        let padded = rank.next_multiple_of(q.block_size());
        let quant = corelm_kernels::quant::reference::quantizer(q).expect("Q8_0 has a quantizer");
        let mut qa = vec![0u8; corelm_kernels::row_bytes(q, n_embd) * padded];
        for (row, out) in a.chunks_exact(n_embd).zip(qa.chunks_exact_mut(corelm_kernels::row_bytes(q, n_embd))) {
            quant(row, out);
        }
        // The padding rows of A stay zero blocks (d = 0): their hidden values are 0.
        let brb = corelm_kernels::row_bytes(q, padded);
        let mut qb = vec![0u8; brb * n_ff];
        let mut row = vec![0f32; padded];
        for (src, out) in b.chunks_exact(rank).zip(qb.chunks_exact_mut(brb)) {
            row[..rank].copy_from_slice(src);
            quant(&row, out);
        }
        let a_il = interleaved(&qa, corelm_kernels::row_bytes(q, n_embd));
        let b_il = n_ff.is_multiple_of(ROWS).then(|| interleaved(&qb, brb));
        Ok(LayerPredictor { rank: padded, a: qa, b: qb, a_il, b_il, cut: c.iter().map(|&ci| cut - ci).collect() })
    }

    /// The predictor of `neurons` only (sorted layer neurons, e.g. the CPU's when an
    /// accelerator holds the others): their rows of `B` and their cuts, in that order, `B`
    /// interleaved again when their count is a multiple of four. Each margin is the whole
    /// predictor's for that neuron, bit for bit.
    pub fn of_neurons(&self, neurons: &[u32]) -> LayerPredictor {
        let brb = corelm_kernels::row_bytes(DType::Q8_0, self.rank);
        let b: Vec<u8> = neurons.iter().flat_map(|&n| &self.b[n as usize * brb..(n as usize + 1) * brb]).copied().collect();
        let b_il = neurons.len().is_multiple_of(ROWS).then(|| interleaved(&b, brb));
        let cut = neurons.iter().map(|&n| self.cut[n as usize]).collect();
        LayerPredictor { rank: self.rank, a: self.a.clone(), b, a_il: self.a_il.clone(), b_il, cut }
    }
}

/// Q8_0 rows (`rb` bytes each, a multiple of four of them) in the interleaved layout, which
/// packs Q8_0 to the same bytes in every table's layout (only the Q5 types' and Q6_K's differ).
fn interleaved(rows: &[u8], rb: usize) -> Vec<u8> {
    use corelm_kernels::matmul::layout::{Layout, Q5Bits, Q6Form};
    let mut il = vec![0u8; rows.len()];
    Layout { q5: Q5Bits::Folded, q6: Q6Form::Split }.pack(DType::Q8_0, rows, rb, &mut il);
    il
}

/// The adjacent-layer predictors of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct Predictors {
    pub n_embd: usize,
    pub n_ff: usize,
    /// Per layer; `None`: the layer's gate is computed for every neuron.
    pub layers: Vec<Option<LayerPredictor>>,
}

/// Batches of at most this many tokens compute only the firing rows of the up projection
/// (`Op::SparseUp`); larger ones compute it densely and mask (`Op::GluMasked`), same values.
pub const SPARSE_UP_MAX_TOKENS: usize = 8;

impl Builder<'_> {
    /// Build dense feed-forward layers sparse where `s` gives them a threshold.
    pub fn with_sparsity(mut self, s: Option<Arc<SparseFfn>>) -> Self {
        self.sparse = s;
        self
    }

    /// The activation threshold of the current layer's feed-forward when it runs sparse.
    pub fn sparse_threshold(&self) -> Option<f32> {
        let s = self.sparse.as_ref()?;
        let t = *s.thresholds.get(usize::try_from(self.layer).ok()?)?;
        (t >= 0.0).then_some(t)
    }

    /// The neurons an accelerator computes in the current layer's FFN (`None`: none).
    pub fn offloaded(&self) -> Option<&[u32]> {
        let v = self.sparse.as_ref()?.offloaded.get(usize::try_from(self.layer).ok()?)?;
        (!v.is_empty()).then_some(&v[..])
    }

    /// A weight of the model file in `form` (serial mode): plain rows, or neuron-major — the
    /// transpose, `[w.ne1, w.ne0]`, in the sparse configuration's down type (copied at load).
    pub fn weight_in(&mut self, w: &WeightRef, form: WeightForm) -> Bundle {
        assert_eq!(self.mode, Mode::Serial, "weight forms in parallel subgraphs");
        Bundle::one(self.form_leaf(w, form))
    }

    /// `w` in `form`, a weight of the current shard (`weight_in`'s tensor).
    fn form_leaf(&mut self, w: &WeightRef, form: WeightForm) -> TensorId {
        let (ne, dtype) = match form {
            WeightForm::NeuronMajor { .. } | WeightForm::ColdNeuronMajor { .. } => {
                let n = match form.cold_range() {
                    Some((l, r)) => self.n_cold(l, r),
                    None => w.ne[0],
                };
                ([w.ne[1], n], self.neuron_major_type(w))
            }
            WeightForm::ColdRows { layer, n0, n1, .. } => ([w.ne[0], self.n_cold(layer as usize, n0 as usize..n1 as usize)], w.dtype),
            _ => (w.ne, w.dtype),
        };
        self.leaf(ne, dtype, Storage::Weight { offset: w.offset, len: w.len, cols: None, copy: None, form })
    }

    /// The type `w` (a down projection) is stored in neuron-major: whole blocks of its rows.
    fn neuron_major_type(&self, w: &WeightRef) -> DType {
        let dt = self.sparse.as_ref().expect("a sparse configuration").down_type;
        assert!(w.ne[1].is_multiple_of(dt.block_size()), "{}: rows of {} values in {dt} blocks", w.name, w.ne[1]);
        dt
    }

    /// A weight cut across the shards of the plan (tensor parallelism) in `form`: `PlainRows`
    /// of a row split (each shard's predicted gate rows), or `NeuronMajor` of
    /// [`Split::FfCols`] — shard `s` holds its neurons' rows `[n_embd, ff_s]` of the transpose,
    /// a [`ColSlice`] of the file's matrix copied and requantized at load. In serial mode, the
    /// whole weight in `form` ([`Builder::weight_in`]).
    pub fn weight_split_in(&mut self, w: &WeightRef, split: Split, form: WeightForm) -> Bundle {
        if self.tp.is_none() || self.mode != Mode::Parallel {
            return self.weight_in(w, form);
        }
        // A neuron-major copy is requantized, so its columns need not be whole blocks.
        let parts = self.weight_cut(w, split, !matches!(form, WeightForm::NeuronMajor { .. }));
        let down_type = matches!(form, WeightForm::NeuronMajor { .. }).then(|| self.neuron_major_type(w));
        for &id in &parts.0 {
            let t = &mut self.tensors[id.0 as usize];
            let Storage::Weight { form: f, cols, .. } = &mut t.storage else { unreachable!("weight_split makes weights") };
            match form {
                WeightForm::Rows => {}
                WeightForm::PlainRows => {
                    assert!(cols.is_none(), "{}: plain rows of a column split", w.name);
                    *f = form;
                }
                WeightForm::NeuronMajor { .. } => {
                    assert_eq!(split, Split::FfCols, "{}: neuron-major shards are feed-forward columns", w.name);
                    // The slice's columns (neurons) become rows: `[n_embd, ff_s]`.
                    t.ne = [t.ne[1], t.ne[0]];
                    t.dtype = down_type.expect("set above for neuron-major forms");
                    *f = form;
                }
                WeightForm::ColdRows { .. } | WeightForm::ColdNeuronMajor { .. } => panic!("{}: an accelerator's CPU part is Builder::weight_cold's", w.name),
            }
        }
        parts
    }

    /// How many of layer `layer`'s neurons `range` the CPU computes (holds, under online
    /// balancing: all of them).
    fn n_cold(&self, layer: usize, range: std::ops::Range<usize>) -> usize {
        if self.balanced() {
            return range.len();
        }
        let hot = self.sparse.as_ref().and_then(|s| s.offloaded.get(layer)).map_or(&[][..], |v| &v[..]);
        range.len() - hot.iter().filter(|&&n| range.contains(&(n as usize))).count()
    }

    /// The CPU's part of an accelerator's layer (`form` a cold form, its range replaced): in
    /// serial mode the cold neurons of all `n_ff`; in parallel subgraphs, each shard's cold
    /// neurons of its feed-forward range (a shard whose neurons are all on the device gets a
    /// weight of none).
    pub fn weight_cold(&mut self, w: &WeightRef, form: WeightForm, n_ff: usize) -> Bundle {
        let Some(plan) = self.shard_plan() else {
            return self.weight_in(w, form.with_range(0..n_ff));
        };
        let mut parts = Vec::with_capacity(plan.degree());
        for (s, r) in plan.ff.iter().enumerate() {
            self.group = Some(s as u16);
            parts.push(self.form_leaf(w, form.with_range(r.clone())));
        }
        self.group = None;
        Bundle(parts)
    }

    /// Hand `x` (`[n_tokens, n_embd]`) to the accelerator for the current layer's offloaded
    /// neurons (activation `kind`, firing threshold `thr` as the CPU's sparse nodes); the
    /// returned node only orders [`Builder::offload_end`] after it.
    pub fn offload_begin(&mut self, x: &Bundle, kind: Glu, thr: f32) -> Bundle {
        let x = x.single();
        self.check_src(x);
        let layer = self.layer() as u32;
        Bundle::one(self.push([0, 0], DType::F32, Op::OffloadBegin { layer, x, kind, thr }, Storage::None))
    }

    /// The accelerator's part of the current layer's FFN output: `[n_tokens, n_embd]`.
    /// With `gate` (the CPU's gate product of every neuron: one tensor, or the shards' of their
    /// ranges), the device observes it after.
    pub fn offload_end(&mut self, begin: &Bundle, n_embd: usize, gate: Option<&Bundle>) -> Bundle {
        let begin = begin.single();
        let gates = gate.map(|g| {
            g.0.iter().for_each(|&t| self.check_src(t));
            self.lists.push(g.0.clone());
            self.lists.len() as u32 - 1
        });
        let layer = self.layer() as u32;
        self.node([n_embd, self.n_tokens], DType::F32, Op::OffloadEnd { layer, begin, gates })
    }

    /// The layer neuron of the current shard's first (0 in serial mode): where its masks start.
    fn shard_first_neuron(&self) -> u32 {
        match (&self.tp, self.group) {
            (Some(plan), Some(s)) => plan.ff[s as usize].start as u32,
            _ => 0,
        }
    }

    /// The predictor of layer `il` when it has one and the layer runs sparse. With an
    /// accelerator's static neurons it covers the CPU's neurons only
    /// (`SparseFfn::predict_cold_only`); under online balancing, where the device's set moves,
    /// every neuron (the masked nodes skip the device's).
    pub fn layer_predictor(&self, il: usize) -> Option<&LayerPredictor> {
        let s = self.sparse.as_ref()?;
        let sparse = s.thresholds.get(il).is_some_and(|&t| t >= 0.0);
        s.predictor.as_ref()?.layers.get(il)?.as_ref().filter(|_| sparse)
    }

    /// The adjacent-layer pipeline of the current layer's sparse FFN, whose input is `x`
    /// (`[n_embd, n_tokens]`): appends the prediction of the next layer's firing from `x`
    /// (KAIROX §5.1: made a layer ahead), and returns the current layer's — made by the
    /// previous layer, or from `x` itself for layer 0 — `[n_ff, n_tokens]` margins, `None`
    /// when the layer has no predictor (a prediction is only ever made for a layer that has).
    pub fn predicted_firing(&mut self, x: &Bundle) -> Option<Bundle> {
        let il = self.layer();
        let own = match self.prediction.take() {
            Some((l, p)) if l == il => Some(p),
            _ if il == 0 && self.layer_predictor(0).is_some() => Some(self.predict(0, x)),
            _ => None,
        };
        if self.layer_predictor(il + 1).is_some() {
            let next = self.predict(il + 1, x);
            self.prediction = Some((il + 1, next));
        }
        own
    }

    /// `Op::Predict` of layer `layer`'s neurons from `x`; in parallel subgraphs, one node per
    /// shard for the shard's feed-forward range.
    fn predict(&mut self, layer: usize, x: &Bundle) -> Bundle {
        let x = x.single();
        self.check_src(x);
        let n_ff = self.sparse.as_ref().and_then(|s| s.predictor.as_ref()).expect("a predictor").n_ff;
        assert_eq!(self.t(x).dtype, DType::F32, "a predictor reads f32 FFN inputs");
        let ranges = match self.tp.as_ref().filter(|_| self.mode == Mode::Parallel) {
            Some(plan) => plan.ff.clone(),
            None => vec![0..n_ff; 1],
        };
        // With an accelerator's neurons the layer's predictor holds the CPU's only: each range
        // counted in those.
        let shards: Vec<std::ops::Range<usize>> = ranges
            .into_iter()
            .map(|r| {
                let a = self.n_cold(layer, 0..r.start);
                a..a + self.n_cold(layer, r)
            })
            .collect();
        let rows = self.t(x).ne[1];
        let mut parts = Vec::with_capacity(shards.len());
        for (s, r) in shards.iter().enumerate() {
            self.group = (shards.len() > 1).then_some(s as u16);
            let op = Op::Predict { layer: layer as u32, x, n0: r.start as u32 };
            parts.push(self.node([r.len(), rows], DType::F32, op).single());
        }
        self.group = None;
        Bundle(parts)
    }

    /// Gate of the predicted neurons only: `[n_ff, n_tokens]` from `w` (plain rows) over `x`,
    /// zero for the neurons `pred` does not name (`Op::SparseGate`).
    pub fn sparse_gate(&mut self, pred: &Bundle, w: &Bundle, x: &Bundle) -> Bundle {
        self.zip(&[pred, w, x], |b, t| {
            let (pred, w) = (t[0], t[1]);
            let (ne, xq) = b.rows_beside(pred, w, t[2], "sparse_gate");
            b.node(ne, DType::F32, Op::SparseGate { pred, w, x: xq }).single()
        })
    }

    /// The shape and quantized input of a product of some rows of `w` with `x` whose result
    /// lies beside `like` (a gate product or margins of the same shape).
    fn rows_beside(&mut self, like: TensorId, w: TensorId, x: TensorId, what: &str) -> ([usize; 2], TensorId) {
        self.check_src(like);
        let (op, ne) = self.matmul_op(w, x);
        let Op::MatMul { x: xq, .. } = op else { unreachable!() };
        assert_eq!(ne, self.t(like).ne, "{what} shapes");
        (ne, xq)
    }

    /// Whether the sparse FFNs are balanced online (`SparseFfn::balanced`).
    pub fn balanced(&self) -> bool {
        self.sparse.as_ref().is_some_and(|s| s.balanced)
    }

    /// Sparse up projection: `[n_ff, n_tokens]` `h`, from the gate's `[n_ff, n_tokens]` and
    /// the up matrix `w` (plain rows) over `x` `[n_embd, n_tokens]`; zero for neurons with
    /// `|act(gate)| ≤ thr`.
    /// `masked`: the accelerator's current neurons are left to it (`Op::SparseUp`).
    pub fn sparse_up(&mut self, gate: &Bundle, w: &Bundle, x: &Bundle, kind: Glu, thr: f32, masked: bool) -> Bundle {
        self.zip(&[gate, w, x], |b, t| {
            let (gate, w) = (t[0], t[1]);
            let (ne, xq) = b.rows_beside(gate, w, t[2], "sparse_up");
            let masked = masked.then(|| b.shard_first_neuron());
            b.node(ne, DType::F32, Op::SparseUp { gate, w, x: xq, kind, thr, masked }).single()
        })
    }

    /// `act(gate) · up` where `|act(gate)| > thr`, else 0 (a sparse FFN's dense-up batches).
    /// `pred`: only the neurons with a positive margin there can fire.
    #[allow(clippy::too_many_arguments)]
    pub fn glu_masked(&mut self, gate: &Bundle, up: &Bundle, kind: Glu, thr: f32, masked: bool, pred: Option<&Bundle>) -> Bundle {
        let srcs: Vec<&Bundle> = [gate, up].into_iter().chain(pred).collect();
        self.zip(&srcs, |b, t| {
            let (gate, up, pred) = (t[0], t[1], t.get(2).copied());
            b.check_src(gate);
            b.check_src(up);
            let ne = b.t(gate).ne;
            assert_eq!(ne, b.t(up).ne, "glu shapes");
            if let Some(p) = pred {
                b.check_src(p);
                assert_eq!(ne, b.t(p).ne, "prediction shape");
            }
            let masked = masked.then(|| b.shard_first_neuron());
            b.node(ne, DType::F32, Op::GluMasked { gate, up, kind, thr, masked, pred }).single()
        })
    }

    /// Sparse down projection: `[n_ff, n_tokens]` `h` → `[n_embd, n_tokens]` through the
    /// neuron-major `w` (`[n_embd, n_ff]`), reading only the rows of neurons with `h ≠ 0`.
    /// Tensor parallel: each shard's partial output over its neurons (`w` a
    /// [`Builder::weight_split_in`] of [`Split::FfCols`]), added at the gather.
    pub fn sparse_down(&mut self, h: &Bundle, w: &Bundle) -> Bundle {
        self.zip(&[h, w], |b, t| {
            let (h, w) = (t[0], t[1]);
            b.check_src(h);
            let (nh, nw) = (b.t(h).ne, b.t(w).ne);
            assert!(matches!(b.t(w).storage, Storage::Weight { form: WeightForm::NeuronMajor { .. } | WeightForm::ColdNeuronMajor { .. }, .. }));
            assert_eq!(nh[0], nw[1], "sparse_down inner dimensions");
            b.node([nw[0], nh[1]], DType::F32, Op::SparseDown { h, w }).single()
        })
    }
}
