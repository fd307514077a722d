//! The mixture-of-experts nodes: routing (`Op::MoeSelect` split among workers by tokens,
//! `Op::MoeRoute` on one), the grouped expert matmul (`Op::MatMulId`, ggml's `mul_mat_id`:
//! for each expert a token chose, one ordinary matmul over that expert's weight rows and the
//! rows of its pairs) and the weighted combination (`Op::MoeCombine`).
//!
//! The routing table puts expert `e`'s pairs at consecutive positions (`moe::Route`), and the
//! node's output is written by position, so an expert's outputs are one contiguous block of
//! rows: its matmul is [`matmul::run`] on the expert's slice of the stacked weights — the tiles
//! and GEMV on the copy interleaved at load, or the plain rows' kernels — with the same
//! choices and the same bits as a dense matmul of that many rows. Its activation rows are the
//! per-pair input's rows at those positions (contiguous too), or the tokens' rows through
//! [`Operands::xmap`] (pair / experts per token).
//!
//! Every worker walks the experts in order and takes its share of each (columns, or the grid
//! `matmul::run` chooses for the expert's row count); experts no token chose are skipped, so
//! their weights are not read.
//!
//! **Placed by routed pairs** (SMEPilot's MoE placement, `--matrix-workers`): where a plan's
//! expert rule cuts experts among worker classes (`Graph::expert_splits`), an expert routed
//! `c` pairs takes the cut of the last step at or below `c` — e.g. every column to the vector
//! cores up to 20 pairs, to the matrix unit from 21 — and runs as a panel GEMM of that cut
//! (under `--fast-prefill` an expert of 8 pairs or more has its per-token rows gathered in
//! order first, cut or not, since the panel reads rows in order). No
//! barrier separates experts, so while the matrix unit's workers run a large expert the
//! vector workers go on to the next. The panel's integer sums are exact: a cut changes no bits.

use super::matmul::{self, MatmulScratch, Mode, Operands, Schedules, WorkerClass, GEMM_MIN_ROWS};
use super::{split, Ctx};
use crate::moe::Route;
use crate::tensor::{ClassSplit, MoeParams, Op, Tensor, TensorId};
use corelm_kernels::{DType, Kernels};
use std::ops::Range;

/// One expert matmul node's operands.
pub struct Experts<'a> {
    pub dtype: DType,
    /// Inner dimension (values per weight row).
    pub k: usize,
    /// The stacked experts' weight rows — of `experts` only, in order, each expert
    /// `n_out` rows — plain (empty if only the interleaved copy exists) and interleaved at
    /// load where they were.
    pub plain: &'a [u8],
    pub il: Option<&'a [u8]>,
    /// Activation rows, `xrb` bytes apart: one per token, or (`per_pair`) one per pair in
    /// position order.
    pub x: &'a [u8],
    pub xrb: usize,
    pub per_pair: bool,
    pub table: &'a [i32],
    pub p: MoeParams,
    pub experts: Range<usize>,
    /// Cuts of an expert's output among `classes` by its routed pairs: (from pairs, cut),
    /// ascending (`Graph::expert_steps`; empty: none).
    pub cuts: &'a [(usize, ClassSplit)],
    pub classes: &'a [WorkerClass],
}

impl Experts<'_> {
    /// Worker `ith` of `nth`'s share of every routed expert's matmul into `out`, the node's
    /// `[pairs][n_out]` f32 output in position order.
    ///
    /// # Safety
    /// `out` addresses the node's `pairs × n_out` f32, written during the node only by the
    /// `nth` workers of this call, each through this function.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run(&self, kernels: &Kernels, mode: Mode, schedules: Option<&Schedules>, out: *mut f32, ith: usize, nth: usize, s: &mut MatmulScratch) {
        let n_pairs = Route::n_pairs(self.table, self.p);
        let wrb = corelm_kernels::row_bytes(self.dtype, self.k);
        let stacked = self.il.map_or(self.plain.len(), <[u8]>::len) / wrb;
        let n_out = stacked / self.experts.len();
        // The gather buffer, out of `s` while `s` runs the experts' matmuls.
        let mut gather = std::mem::take(&mut s.gather);
        for (i, e) in self.experts.clone().enumerate() {
            let at = Route::positions_of(self.table, n_pairs, e);
            if at.is_empty() {
                continue;
            }
            let rows = i * n_out * wrb..(i + 1) * n_out * wrb;
            let pairs = Route::pairs_of(self.table, n_pairs, e);
            let panel = mode.panel_gemm && at.len() >= GEMM_MIN_ROWS;
            // The rule's cut for this many pairs, where it runs one (a panel GEMM).
            let cut = self.cuts.iter().rev().find(|(from, _)| *from <= at.len()).map(|(_, c)| c).filter(|_| panel && !self.classes.is_empty());
            // Where the panel may run, per-token rows gathered in order (the panel reads rows
            // in order; the other paths give the same bits on either).
            let gathered = panel && !self.per_pair && gather.len() >= at.len() * self.xrb;
            if gathered {
                for (i, &pair) in pairs.iter().enumerate() {
                    let r = pair as usize / self.p.n_used;
                    gather[i * self.xrb..(i + 1) * self.xrb].copy_from_slice(&self.x[r * self.xrb..(r + 1) * self.xrb]);
                }
            }
            let (x, xmap) = if self.per_pair {
                (&self.x[at.start * self.xrb..at.end * self.xrb], None)
            } else if gathered {
                (&gather[..at.len() * self.xrb], None)
            } else {
                (self.x, Some((pairs, self.p.n_used)))
            };
            let o = Operands {
                dtype: self.dtype,
                k: self.k,
                n_out,
                w: if self.plain.is_empty() { self.plain } else { &self.plain[rows.clone()] },
                il: self.il.map(|g| &g[rows]),
                x,
                xrb: self.xrb,
                rows: at.len(),
                xmap,
                // SAFETY: position `at.start`'s row lies inside the `[pairs][n_out]` output.
                out: unsafe { out.add(at.start * n_out) },
                ldo: n_out,
                split: cut.map(|c| (c, self.classes)),
            };
            // SAFETY: rows `at` of the output are this expert's alone; within them each worker
            // writes its own share (the caller's contract, kept on the expert's operands).
            unsafe { matmul::run(kernels, &o, mode, schedules, ith, nth, s) };
        }
        s.gather = gather;
    }
}

impl Ctx<'_> {
    /// Worker `ith` of `nth`'s share of MoE node `id` (`t`): routing, expert matmul, combine.
    pub(super) fn moe(&self, id: TensorId, t: &Tensor, ith: usize, nth: usize, mm: &mut MatmulScratch) {
        let [ne0, rows] = t.ne;
        match t.op {
            Op::MoeSelect { logits, p } => {
                let (logits, k) = (self.f32s(logits), p.n_used);
                let n_pairs = ne0 / 2;
                let base = self.base(t) as *mut i32;
                for tok in split(n_pairs / k, ith, nth) {
                    // SAFETY: token `tok`'s ids and weights (k each, at `tok·k` and
                    // `n_pairs + tok·k` of this I32 tensor) are written by this worker only.
                    let (ids, weights) = unsafe { (std::slice::from_raw_parts_mut(base.add(tok * k), k), std::slice::from_raw_parts_mut(base.add(n_pairs + tok * k), k)) };
                    crate::moe::select(&logits[tok * p.n_expert..(tok + 1) * p.n_expert], p, ids, weights);
                }
            }
            Op::MoeRoute { sel, p } => {
                if ith == 0 {
                    let sel = self.i32s(sel);
                    // SAFETY: only worker 0 writes the table; it is I32, 64-byte aligned.
                    let table = unsafe { std::slice::from_raw_parts_mut(self.base(t) as *mut i32, ne0) };
                    crate::moe::order(sel, sel.len() / 2 / p.n_used, p, table);
                }
            }
            Op::MatMulId { w, x, route, p, per_pair, e0, e1 } => {
                let wt = self.t(w);
                let (plain, il) = self.weight_rows(w);
                let (xb, xrb, table) = (self.bytes(x), self.t(x).row_bytes(), self.i32s(route));
                let (cuts, classes) = (self.graph.expert_steps(id), self.classes);
                let m = Experts { dtype: wt.dtype, k: wt.ne[0], plain, il, x: xb, xrb, per_pair, table, p, experts: e0 as usize..e1 as usize, cuts, classes };
                // SAFETY: this node's tensor is `[pairs][ne0]` f32 (`ne0` = each expert's
                // rows), written during the node only by its workers, each its own share.
                unsafe { m.run(self.kernels, self.mode, self.schedules, self.base(t) as *mut f32, ith, nth, mm) };
            }
            Op::MoeCombine { y, route, p, e0, e1 } => {
                let (y, table) = (self.f32s(y), self.i32s(route));
                for r in split(rows, ith, nth) {
                    // SAFETY: row r belongs to this worker only.
                    let o = unsafe { self.out_f32(t, r * ne0, ne0) };
                    crate::moe::combine(y, table, p, r, e0 as usize..e1 as usize, o);
                }
            }
            Op::AddId { x, bias, route, p, e0, e1 } => {
                let (x, table) = (self.f32s(x), self.i32s(route));
                let bias = self.f32s(bias);
                let n_pairs = Route::n_pairs(table, p);
                // Each worker its share of the experts' positions, expert by expert.
                for e in e0 as usize..e1 as usize {
                    let at = Route::positions_of(table, n_pairs, e);
                    let b = &bias[(e - e0 as usize) * ne0..(e - e0 as usize + 1) * ne0];
                    for pos in split(at.len(), ith, nth).map(|i| at.start + i) {
                        // SAFETY: position `pos` (a row of this node) belongs to this worker only.
                        let o = unsafe { self.out_f32(t, pos * ne0, ne0) };
                        for ((o, &v), &c) in o.iter_mut().zip(&x[pos * ne0..(pos + 1) * ne0]).zip(b) {
                            *o = v + c;
                        }
                    }
                }
            }
            _ => unreachable!("not a MoE node: {}", t.op.name()),
        }
    }
}
