//! The grouped expert matmul (`Op::MatMulId`, ggml's `mul_mat_id`): for each expert a token
//! chose, one ordinary matmul over that expert's weight rows and the rows of its pairs.
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
use crate::moe::Route;
use crate::tensor::{ClassSplit, MoeParams};
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
            let mut gather = std::mem::take(&mut s.gather);
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
            s.gather = gather;
        }
    }
}
