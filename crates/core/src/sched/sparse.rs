//! The sparse feed-forward's nodes (`Op::SparseUp`, `Op::GluMasked`, `Op::SparseDown`, and
//! the adjacent-layer predictor's `Op::Predict` and `Op::SparseGate`).
//!
//! A neuron fires when `|act(gate)| > thr`; `act(g)` is the gated activation with an up value
//! of one (`swiglu(g, 1)`, `geglu(g, 1)`: the same bits as the dense kernels' first factor),
//! and a firing neuron's value is `act(g) · up`, as the dense `Glu` computes it. So the small
//! batches' `SparseUp` (rows of firing neurons only) and the large batches' dense up plus
//! `GluMasked` give the same `h`, and `SparseDown` gives the same bits whether it runs fused
//! on quantized rows (few tokens) or dequantizes a block of 32 columns of every row once for
//! all the batch's tokens (`sparse::down_block`, eight tokens' accumulators in registers).
//!
//! With a predictor, a neuron can fire only where its predicted margin is positive: small
//! batches compute the gate of those neurons alone (`SparseGate`, zero elsewhere, and a zero
//! gate never fires), large ones mask the dense gate's (`GluMasked` with `pred`), so both
//! paths keep the same firing set. `Predict` computes `B·(A·x) − cut` on Q8_0 `A`, `B` with
//! the table's Q8_0 dot; each worker computes a row's hidden vector `A·x` (`rank` dots) itself
//! rather than wait at a barrier for it, then its share of the neurons.
//!
//! Work split: `SparseUp`, `SparseGate` and `Predict` by neurons (`Predict` of a large batch
//! by tokens), `GluMasked` by tokens, `SparseDown` by whole blocks of
//! output columns (each worker reads its column range of every firing neuron's row, so the
//! sum over neurons runs in neuron order for every element whatever the thread count).

use super::{split, Ctx};
use crate::tensor::{Glu, Tensor, TensorId};
use crate::graph::LayerPredictor;
use corelm_kernels::matmul::layout::ROWS;
use corelm_kernels::matmul::VecDot;
use corelm_kernels::{act, sparse, DType, Kernels};
use corelm_kernels::simd::{prefetch, CacheLevel};
use std::sync::atomic::{AtomicU64, Ordering};

/// `put(j, dot(row_j, x))` for each neuron `j` of `listed` in order (`rows`: `rb` bytes each),
/// prefetching the row of the neuron `AHEAD` places later: the addresses jump, so the hardware
/// prefetcher does not see them coming.
fn dot_listed(rows: &[u8], rb: usize, dot: VecDot, x: &[u8], listed: &[u32], mut put: impl FnMut(usize, f32)) {
    let row = |j: u32| &rows[j as usize * rb..(j as usize + 1) * rb];
    for (n, &j) in listed.iter().enumerate() {
        if let Some(&next) = listed.get(n + AHEAD) {
            prefetch(row(next), CacheLevel::L2);
        }
        put(j as usize, dot(row(j), x));
    }
}

/// `list` = the indices `i < n` with `keep(i)`, in order, written without a branch per index
/// (which neurons fire is not predictable: at 50 % a branch mispredicts every other neuron);
/// `list` has room for `n`, so nothing allocates.
fn list_where(list: &mut Vec<u32>, n: usize, keep: impl Fn(usize) -> bool) {
    list.clear();
    list.resize(n, 0);
    let mut k = 0;
    for i in 0..n {
        list[k] = i as u32;
        k += keep(i) as usize;
    }
    list.truncate(k);
}

/// The neurons of a layer an accelerator holds now (`Offload::resident`), seen from a node
/// whose neuron 0 is the layer's neuron `n0`.
#[derive(Clone, Copy)]
pub(super) struct Mask<'a> {
    bits: &'a [AtomicU64],
    n0: usize,
}

/// Whether the node's neuron `n` is set in `mask` (an accelerator's current neurons).
fn held(mask: Option<Mask>, n: usize) -> bool {
    // Relaxed: the set changes only on worker 0 between barriers, which order it.
    mask.is_some_and(|m| {
        let n = m.n0 + n;
        m.bits[n / 64].load(Ordering::Relaxed) >> (n % 64) & 1 == 1
    })
}

/// Per-worker buffers of the sparse nodes, sized once for the graph.
pub struct SparseScratch {
    /// `act(gate)` of a worker's neurons or of one token row.
    act: Vec<f32>,
    /// Ones: the up operand that turns a gated-activation kernel into `act` alone.
    ones: Vec<f32>,
    /// One block of 32 columns of every neuron's neuron-major row, dequantized (prefill's
    /// sparse down).
    down: Vec<f32>,
    /// The firing (or, for `SparseGate`, predicted) neurons of one token.
    firing: Vec<u32>,
    /// A predictor's input row quantized (Q8_0), its hidden vector, and that quantized.
    pred_x: Vec<u8>,
    hidden: Vec<f32>,
    pred_h: Vec<u8>,
    /// Scratch of the interleaved Q8_0 kernels.
    prep: Vec<i32>,
}

impl SparseScratch {
    /// For feed-forwards of at most `n_ff` neurons, and predictors over `pred_embd` inputs of
    /// at most `rank` hidden values.
    pub fn new(n_ff: usize, pred_embd: usize, rank: usize) -> Self {
        SparseScratch {
            act: vec![0.0; n_ff],
            ones: vec![1.0; n_ff],
            down: vec![0.0; n_ff * sparse::DOWN_COLS],
            firing: Vec::with_capacity(n_ff),
            pred_x: vec![0; corelm_kernels::row_bytes(DType::Q8_0, pred_embd)],
            hidden: vec![0.0; rank],
            pred_h: vec![0; corelm_kernels::row_bytes(DType::Q8_0, rank)],
            prep: vec![0; corelm_kernels::matmul::layout::scratch_len(pred_embd.max(rank))],
        }
    }
}

/// `SparseUp` reads the interleaved copy when at least one in this many of a worker's neurons
/// fires (a run of groups costs what the dense GEMV costs per row; a plain row dotted alone,
/// measured, about three times that).
const IL_MIN_FIRING: usize = 8;
/// Quiet groups of four a run of `SparseUp`'s interleaved GEMV computes rather than end there.
const RUN_GAP: usize = 2;

/// Large batches split `Predict` by tokens from this many rows per worker.
const PREDICT_ROWS_PER_WORKER: usize = 4;

/// Batches of more tokens than this run `SparseDown` a block of tokens per dequantized row.
const FUSED_TOKENS: usize = 4;
/// Firing neurons ahead whose rows are prefetched.
const AHEAD: usize = 32;

/// `a = act(g)`, the gated activation's first factor (`ones`: at least `g.len()` ones), as
/// the sparse nodes and the activation statistics (`corelm sparsity collect`) compute it.
pub fn gate_activation(k: &Kernels, kind: Glu, g: &[f32], ones: &[f32], a: &mut [f32]) {
    match kind {
        Glu::Silu => act::swiglu(k, g, &ones[..g.len()], a),
        Glu::GeluTanh => act::geglu(k, g, &ones[..g.len()], a),
        // `up` of 1 doubles what the gate gives (`v + 1`); halved back, exactly.
        Glu::SwigluOai => {
            act::swiglu_oai(g, &ones[..g.len()], a);
            a.iter_mut().for_each(|v| *v *= 0.5);
        }
    }
}

impl Ctx<'_> {
    /// The neurons a `masked` node of `t`'s layer leaves to the accelerator (`masked`: the
    /// layer neuron of the node's first).
    pub(super) fn mask(&self, t: &Tensor, masked: Option<u32>) -> Option<Mask<'_>> {
        let n0 = masked? as usize;
        let device = self.offload.expect("a masked sparse node runs with an Offload");
        Some(Mask { bits: device.resident(t.layer as usize).expect("a masked sparse node's layer has an online neuron set"), n0 })
    }

    /// `[gate, w, x]`: the gate product, the up matrix, the quantized input. Where the up
    /// matrix has a copy interleaved at load and at least one neuron in [`IL_MIN_FIRING`] of
    /// the worker's fires, each run of neighbouring groups of four rows holding a firing neuron
    /// goes through the interleaved GEMV (the plain rows' dots, bit for bit), its quiet neurons
    /// set to zero after; otherwise each firing neuron's plain row is dotted alone.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sparse_up(&self, t: &Tensor, [gate, w, x]: [TensorId; 3], kind: Glu, thr: f32, mask: Option<Mask>, ith: usize, nth: usize, s: &mut SparseScratch) {
        let [n_ff, rows] = t.ne;
        let wt = self.t(w);
        let wrb = wt.row_bytes();
        let (wb, il_rows) = self.weight_rows(w);
        let ops = self.kernels.ops(wt.dtype).expect("weight type checked at load");
        let il = il_rows.zip(ops.interleaved).filter(|_| n_ff % ROWS == 0);
        let (xrb, xb) = (self.t(x).row_bytes(), self.bytes(x));
        let g = self.f32s(gate);
        let mine = match il {
            Some(_) => {
                let groups = split(n_ff / ROWS, ith, nth);
                groups.start * ROWS..groups.end * ROWS
            }
            None => split(n_ff, ith, nth),
        };
        let a = &mut s.act[..mine.len()];
        for r in 0..rows {
            gate_activation(self.kernels, kind, &g[r * n_ff + mine.start..r * n_ff + mine.end], &s.ones, a);
            let a = &*a;
            // Whether the worker's neuron j fires (`&`, not `&&`: no branch).
            let fires = |j: usize| (a[j].abs() > thr) & !held(mask, mine.start + j);
            // SAFETY: neurons `mine` of row r are this worker's only.
            let out = unsafe { self.out_f32(t, r * n_ff + mine.start, mine.len()) };
            out.fill(0.0);
            list_where(&mut s.firing, mine.len(), fires);
            let xr = &xb[r * xrb..(r + 1) * xrb];
            match il {
                Some((gb, ilops)) if s.firing.len() * IL_MIN_FIRING >= mine.len() => {
                    let my_groups = &gb[mine.start * wrb..mine.end * wrb];
                    let f = &s.firing;
                    let mut n = 0;
                    while n < f.len() {
                        // A run of groups: from the group of firing neuron n while the next
                        // firing neuron lies at most `RUN_GAP` quiet groups after the run
                        // (each call prepares the activation row again).
                        let g0 = f[n] as usize / ROWS;
                        let mut g1 = g0 + 1;
                        let mut m = n + 1;
                        while m < f.len() && f[m] as usize / ROWS <= g1 + RUN_GAP {
                            g1 = f[m] as usize / ROWS + 1;
                            m += 1;
                        }
                        let (j0, j1) = (g0 * ROWS, g1 * ROWS);
                        (ilops.rows)(&my_groups[j0 * wrb..j1 * wrb], wrb, xr, &mut out[j0..j1], &mut s.prep);
                        // The firing test again, as a select rather than a branch.
                        for j in j0..j1 {
                            out[j] = if fires(j) { out[j] * a[j] } else { 0.0 };
                        }
                        n = m;
                    }
                }
                _ => {
                    let my_rows = &wb[mine.start * wrb..mine.end * wrb];
                    dot_listed(my_rows, wrb, ops.vec_dot, xr, &s.firing, |j, v| out[j] = a[j] * v);
                }
            }
        }
    }

    /// `pred`: the margins of `Op::Predict` (only positive ones can fire).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn glu_masked(&self, t: &Tensor, [gate, up]: [TensorId; 2], pred: Option<TensorId>, kind: Glu, thr: f32, mask: Option<Mask>, ith: usize, nth: usize, s: &mut SparseScratch) {
        let [n_ff, rows] = t.ne;
        let (g, u) = (self.f32s(gate), self.f32s(up));
        let pred = pred.map(|p| self.f32s(p));
        let a = &mut s.act[..n_ff];
        for r in split(rows, ith, nth) {
            gate_activation(self.kernels, kind, &g[r * n_ff..(r + 1) * n_ff], &s.ones, a);
            // SAFETY: row r belongs to this worker only.
            let out = unsafe { self.out_f32(t, r * n_ff, n_ff) };
            let predicted = |n: usize| pred.is_none_or(|p| p[r * n_ff + n] > 0.0);
            for (n, ((o, &a), &u)) in out.iter_mut().zip(a.iter()).zip(&u[r * n_ff..(r + 1) * n_ff]).enumerate() {
                *o = if a.abs() > thr && !held(mask, n) && predicted(n) { a * u } else { 0.0 };
            }
        }
    }

    /// The predictor of `t`'s target layer.
    fn layer_predictor(&self, layer: u32) -> &LayerPredictor {
        let p = self.graph.sparse.as_ref().and_then(|s| s.predictor.as_ref()).expect("a Predict node comes with predictors");
        p.layers[layer as usize].as_ref().expect("a Predict node's layer has a predictor")
    }

    /// `Op::Predict`: margins `B·(A·x) − cut` of layer `layer`'s neurons `n0 ..` for each row
    /// of `x`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn predict(&self, t: &Tensor, layer: u32, x: TensorId, n0: usize, ith: usize, nth: usize, s: &mut SparseScratch) {
        let [n_ff, rows] = t.ne;
        let p = self.layer_predictor(layer);
        // The node's neurons: B's rows and cuts from `n0` (the interleaved copy only where
        // they are whole groups of four).
        debug_assert!(n0 + n_ff <= p.cut.len());
        let n_embd = self.t(x).ne[0];
        let xs = self.f32s(x);
        let q8 = self.kernels.ops(DType::Q8_0).expect("Q8_0 kernels");
        let quant = self.kernels.from_float(DType::Q8_0).expect("a Q8_0 quantizer");
        let (arb, brb) = (corelm_kernels::row_bytes(DType::Q8_0, n_embd), corelm_kernels::row_bytes(DType::Q8_0, p.rank));
        let (pb, pcut) = (&p.b[n0 * brb..], &p.cut[n0..]);
        // The interleaved GEMV where the table has one (the same values as the plain dots).
        let il = q8.interleaved.map(|il| il.rows);
        let b_il = p.b_il.as_deref().filter(|_| il.is_some() && n0.is_multiple_of(ROWS) && n_ff.is_multiple_of(ROWS)).map(|b| &b[n0 * brb..]);
        // Many rows: each worker takes whole rows; few: every worker takes a range of neurons
        // of every row (whole groups of four on the interleaved layout).
        let by_rows = rows >= nth * PREDICT_ROWS_PER_WORKER;
        let mine = match (by_rows, b_il) {
            (true, _) => 0..n_ff,
            (false, Some(_)) => {
                let g = split(n_ff / ROWS, ith, nth);
                g.start * ROWS..g.end * ROWS
            }
            (false, None) => split(n_ff, ith, nth),
        };
        let my_rows = if by_rows { split(rows, ith, nth) } else { 0..rows };
        let (xq, h, hq, prep) = (&mut s.pred_x[..arb], &mut s.hidden[..p.rank], &mut s.pred_h[..brb], &mut s.prep);
        for r in my_rows {
            quant(&xs[r * n_embd..(r + 1) * n_embd], xq);
            match il {
                Some(rows_il) => rows_il(&p.a_il, arb, xq, h, prep),
                None => h.iter_mut().zip(p.a.chunks_exact(arb)).for_each(|(hk, a)| *hk = (q8.vec_dot)(a, xq)),
            }
            quant(h, hq);
            // SAFETY: neurons `mine` of row r belong to this worker only.
            let out = unsafe { self.out_f32(t, r * n_ff + mine.start, mine.len()) };
            match (il, b_il) {
                (Some(rows_il), Some(b)) => rows_il(&b[mine.start * brb..mine.end * brb], brb, hq, out, prep),
                _ => out.iter_mut().zip(pb[mine.start * brb..mine.end * brb].chunks_exact(brb)).for_each(|(o, b)| *o = (q8.vec_dot)(b, hq)),
            }
            out.iter_mut().zip(&pcut[mine.clone()]).for_each(|(o, &cut)| *o -= cut);
        }
    }

    /// `Op::SparseGate`: `[pred, w, x]`, the margins, the gate matrix (plain rows), the
    /// quantized input.
    pub(super) fn sparse_gate(&self, t: &Tensor, [pred, w, x]: [TensorId; 3], ith: usize, nth: usize, s: &mut SparseScratch) {
        let [n_ff, rows] = t.ne;
        let wt = self.t(w);
        let (wrb, wb) = (wt.row_bytes(), self.bytes(w));
        let dot = self.kernels.ops(wt.dtype).expect("weight type checked at load").vec_dot;
        let (xrb, xb) = (self.t(x).row_bytes(), self.bytes(x));
        let pred = self.f32s(pred);
        let mine = split(n_ff, ith, nth);
        let my_rows = &wb[mine.start * wrb..mine.end * wrb];
        for r in 0..rows {
            // SAFETY: neurons `mine` of row r are this worker's only.
            let out = unsafe { self.out_f32(t, r * n_ff + mine.start, mine.len()) };
            out.fill(0.0);
            let p = &pred[r * n_ff + mine.start..r * n_ff + mine.end];
            list_where(&mut s.firing, mine.len(), |j| p[j] > 0.0);
            dot_listed(my_rows, wrb, dot, &xb[r * xrb..(r + 1) * xrb], &s.firing, |j, v| out[j] = v);
        }
    }

    pub(super) fn sparse_down(&self, t: &Tensor, h: TensorId, w: TensorId, ith: usize, nth: usize, s: &mut SparseScratch) {
        let [n_embd, rows] = t.ne;
        let wt = self.t(w);
        let (dt, wb, n_ff) = (wt.dtype, self.bytes(w), wt.ne[1]);
        let (bs, ts) = (dt.block_size(), dt.type_size());
        let blocks = split(n_embd / bs, ith, nth);
        let (c0, c1) = (blocks.start * bs, blocks.end * bs);
        if c0 == c1 {
            return;
        }
        let h = self.f32s(h);
        let k = self.kernels;
        let panels = sparse::Panels { neurons: n_ff, blocks: n_embd / bs, type_size: ts };
        if rows <= FUSED_TOKENS {
            for r in 0..rows {
                // SAFETY: columns c0..c1 of row r are this worker's only.
                let y = unsafe { self.out_f32(t, r * n_embd + c0, c1 - c0) };
                y.fill(0.0);
                let hr = &h[r * n_ff..(r + 1) * n_ff];
                list_where(&mut s.firing, n_ff, |i| hr[i] != 0.0);
                // Panel by panel (the part of it in this worker's blocks), every firing
                // neuron's piece in neuron order: each output's sum keeps the neuron order.
                let mut blk = blocks.start;
                while blk < blocks.end {
                    let p = blk / sparse::PANEL_BLOCKS;
                    let end = (p * sparse::PANEL_BLOCKS + panels.width(p)).min(blocks.end);
                    let ys = &mut y[(blk - blocks.start) * bs..(end - blocks.start) * bs];
                    sparse::axpy_panel(k, dt, &wb[panels.at(0, blk)..], panels.stride(p), &s.firing, hr, ys);
                    blk = end;
                }
            }
            return;
        }
        // Many tokens: column block by column block (32 values: one block of the type), every
        // neuron's values of the block dequantized once, then `down_block` for groups of up to
        // eight tokens, their accumulators in registers while the block's rows stream past.
        debug_assert_eq!(bs, sparse::DOWN_COLS);
        let to_float = k.to_float(dt).expect("neuron-major type has a dequantizer");
        let wcol = &mut s.down[..n_ff * bs];
        let mut y = [[0f32; sparse::DOWN_COLS]; sparse::DOWN_TOKENS];
        for blk in blocks {
            let c = blk * bs;
            for (i, w) in wcol.chunks_exact_mut(bs).enumerate() {
                to_float(&wb[panels.at(i, blk)..][..ts], w);
            }
            for r0 in (0..rows).step_by(sparse::DOWN_TOKENS) {
                let r1 = (r0 + sparse::DOWN_TOKENS).min(rows);
                let hs: [&[f32]; sparse::DOWN_TOKENS] = std::array::from_fn(|j| &h[(r0 + j).min(rows - 1) * n_ff..][..n_ff]);
                let y = &mut y[..r1 - r0];
                y.iter_mut().for_each(|v| v.fill(0.0));
                sparse::down_block(k, &hs[..r1 - r0], wcol, y);
                for (r, v) in (r0..r1).zip(y.iter()) {
                    // SAFETY: columns c..c + 32 of row r are this worker's only.
                    unsafe { self.out_f32(t, r * n_embd + c, bs) }.copy_from_slice(v);
                }
            }
        }
    }
}
