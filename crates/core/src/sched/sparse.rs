//! The sparse feed-forward's nodes (`Op::SparseUp`, `Op::GluMasked`, `Op::SparseDown`).
//!
//! A neuron fires when `|act(gate)| > thr`; `act(g)` is the gated activation with an up value
//! of one (`swiglu(g, 1)`, `geglu(g, 1)`: the same bits as the dense kernels' first factor),
//! and a firing neuron's value is `act(g) · up`, as the dense `Glu` computes it. So the small
//! batches' `SparseUp` (rows of firing neurons only) and the large batches' dense up plus
//! `GluMasked` give the same `h`, and `SparseDown` gives the same bits whether it runs fused
//! on quantized rows (few tokens) or dequantizes each row once for a block of tokens.
//!
//! Work split: `SparseUp` by neurons, `GluMasked` by tokens, `SparseDown` by whole blocks of
//! output columns (each worker reads its column range of every firing neuron's row, so the
//! sum over neurons runs in neuron order for every element whatever the thread count).

use super::{split, Ctx};
use crate::tensor::{Glu, Tensor, TensorId};
use corelm_kernels::{act, sparse, Kernels};
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether neuron `n` is set in `mask` (an accelerator's current neurons).
fn held(mask: Option<&[AtomicU64]>, n: usize) -> bool {
    // Relaxed: the set changes only on worker 0 between barriers, which order it.
    mask.is_some_and(|m| m[n / 64].load(Ordering::Relaxed) >> (n % 64) & 1 == 1)
}

/// Per-worker buffers of the sparse nodes, sized once for the graph.
pub struct SparseScratch {
    /// `act(gate)` of a worker's neurons or of one token row.
    act: Vec<f32>,
    /// Ones: the up operand that turns a gated-activation kernel into `act` alone.
    ones: Vec<f32>,
    /// One dequantized column range of a neuron-major row.
    row: Vec<f32>,
    /// The firing neurons of one token.
    firing: Vec<u32>,
}

impl SparseScratch {
    /// For feed-forwards of at most `n_ff` neurons and outputs of at most `n_embd` values.
    pub fn new(n_ff: usize, n_embd: usize) -> Self {
        SparseScratch { act: vec![0.0; n_ff], ones: vec![1.0; n_ff], row: vec![0.0; n_embd], firing: Vec::with_capacity(n_ff) }
    }
}

/// Batches of more tokens than this run `SparseDown` a block of tokens per dequantized row.
const FUSED_TOKENS: usize = 4;
/// Tokens per block of that path.
const TOKEN_BLOCK: usize = 16;
/// Firing neurons ahead whose rows are prefetched.
const AHEAD: usize = 32;

/// `a = act(g)`, the gated activation's first factor (`ones`: at least `g.len()` ones), as
/// the sparse nodes and the activation statistics (`corelm sparsity collect`) compute it.
pub fn gate_activation(k: &Kernels, kind: Glu, g: &[f32], ones: &[f32], a: &mut [f32]) {
    match kind {
        Glu::Silu => act::swiglu(k, g, &ones[..g.len()], a),
        Glu::GeluTanh => act::geglu(k, g, &ones[..g.len()], a),
    }
}

impl Ctx<'_> {
    /// The neurons a `masked` node of `t`'s layer leaves to the accelerator.
    pub(super) fn mask(&self, t: &Tensor, masked: bool) -> Option<&[AtomicU64]> {
        if !masked {
            return None;
        }
        let device = self.offload.expect("a masked sparse node runs with an Offload");
        Some(device.resident(t.layer as usize).expect("a masked sparse node's layer has an online neuron set"))
    }

    /// `[gate, w, x]`: the gate product, the up matrix (plain rows), the quantized input.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sparse_up(&self, t: &Tensor, [gate, w, x]: [TensorId; 3], kind: Glu, thr: f32, mask: Option<&[AtomicU64]>, ith: usize, nth: usize, s: &mut SparseScratch) {
        let [n_ff, rows] = t.ne;
        let wt = self.t(w);
        let (wrb, wb) = (wt.row_bytes(), self.bytes(w));
        let dot = self.kernels.ops(wt.dtype).expect("weight type checked at load").vec_dot;
        let (xrb, xb) = (self.t(x).row_bytes(), self.bytes(x));
        let g = self.f32s(gate);
        let mine = split(n_ff, ith, nth);
        let a = &mut s.act[..mine.len()];
        let row = |i: usize| &wb[i * wrb..(i + 1) * wrb];
        for r in 0..rows {
            gate_activation(self.kernels, kind, &g[r * n_ff + mine.start..r * n_ff + mine.end], &s.ones, a);
            // SAFETY: neurons `mine` of row r are this worker's only.
            let out = unsafe { self.out_f32(t, r * n_ff + mine.start, mine.len()) };
            out.fill(0.0);
            s.firing.clear();
            s.firing.extend((0..mine.len() as u32).filter(|&j| a[j as usize].abs() > thr && !held(mask, mine.start + j as usize)));
            let xr = &xb[r * xrb..(r + 1) * xrb];
            for (n, &j) in s.firing.iter().enumerate() {
                if let Some(&next) = s.firing.get(n + AHEAD) {
                    sparse::prefetch(row(mine.start + next as usize));
                }
                let j = j as usize;
                out[j] = a[j] * dot(row(mine.start + j), xr);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn glu_masked(&self, t: &Tensor, gate: TensorId, up: TensorId, kind: Glu, thr: f32, mask: Option<&[AtomicU64]>, ith: usize, nth: usize, s: &mut SparseScratch) {
        let [n_ff, rows] = t.ne;
        let (g, u) = (self.f32s(gate), self.f32s(up));
        let a = &mut s.act[..n_ff];
        for r in split(rows, ith, nth) {
            gate_activation(self.kernels, kind, &g[r * n_ff..(r + 1) * n_ff], &s.ones, a);
            // SAFETY: row r belongs to this worker only.
            let out = unsafe { self.out_f32(t, r * n_ff, n_ff) };
            for (n, ((o, &a), &u)) in out.iter_mut().zip(a.iter()).zip(&u[r * n_ff..(r + 1) * n_ff]).enumerate() {
                *o = if a.abs() > thr && !held(mask, n) { a * u } else { 0.0 };
            }
        }
    }

    pub(super) fn sparse_down(&self, t: &Tensor, h: TensorId, w: TensorId, ith: usize, nth: usize, s: &mut SparseScratch) {
        let [n_embd, rows] = t.ne;
        let wt = self.t(w);
        let (dt, wrb, wb, n_ff) = (wt.dtype, wt.row_bytes(), self.bytes(w), wt.ne[1]);
        let (bs, ts) = (dt.block_size(), dt.type_size());
        let blocks = split(n_embd / bs, ith, nth);
        let (c0, c1) = (blocks.start * bs, blocks.end * bs);
        let (b0, b1) = (blocks.start * ts, blocks.end * ts);
        if c0 == c1 {
            return;
        }
        let h = self.f32s(h);
        let k = self.kernels;
        if rows <= FUSED_TOKENS {
            let part = |i: usize| &wb[i * wrb + b0..i * wrb + b1];
            for r in 0..rows {
                // SAFETY: columns c0..c1 of row r are this worker's only.
                let y = unsafe { self.out_f32(t, r * n_embd + c0, c1 - c0) };
                y.fill(0.0);
                let hr = &h[r * n_ff..(r + 1) * n_ff];
                s.firing.clear();
                s.firing.extend((0..n_ff as u32).filter(|&i| hr[i as usize] != 0.0));
                for &i in s.firing.iter().take(AHEAD) {
                    sparse::prefetch(part(i as usize));
                }
                // Four firing neurons at a time, then the rest one by one: the same order.
                let quads = s.firing.len() / 4 * 4;
                for n in (0..quads).step_by(4) {
                    for &next in s.firing.iter().skip(n + AHEAD).take(4) {
                        sparse::prefetch(part(next as usize));
                    }
                    let i: [usize; 4] = std::array::from_fn(|q| s.firing[n + q] as usize);
                    sparse::axpy_row4(k, dt, i.map(part), i.map(|i| hr[i]), y);
                }
                for &i in &s.firing[quads..] {
                    sparse::axpy_row(k, dt, part(i as usize), hr[i as usize], y);
                }
            }
            return;
        }
        let to_float = k.to_float(dt).expect("neuron-major type has a dequantizer");
        let wrow = &mut s.row[..c1 - c0];
        for r0 in (0..rows).step_by(TOKEN_BLOCK) {
            let r1 = (r0 + TOKEN_BLOCK).min(rows);
            for r in r0..r1 {
                // SAFETY: as above.
                unsafe { self.out_f32(t, r * n_embd + c0, c1 - c0) }.fill(0.0);
            }
            for i in 0..n_ff {
                if (r0..r1).all(|r| h[r * n_ff + i] == 0.0) {
                    continue;
                }
                to_float(&wb[i * wrb + b0..i * wrb + b1], wrow);
                for r in r0..r1 {
                    let hv = h[r * n_ff + i];
                    if hv != 0.0 {
                        // SAFETY: as above.
                        sparse::axpy_f32(k, hv, wrow, unsafe { self.out_f32(t, r * n_embd + c0, c1 - c0) });
                    }
                }
            }
        }
    }
}
