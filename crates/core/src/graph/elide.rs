//! Barriers a planned graph does without ([`Graph::elide_barriers`]).
//!
//! Every node is followed by a barrier by default, so that the next node may read anything it
//! wrote. Two kinds of neighbours need none:
//!
//! - **Independent nodes**: the next node reads nothing the nodes since the last barrier write,
//!   and writes nothing they read or write — Q, K and V's products of one normed input, gate
//!   and up, the two RoPEs.
//! - **Row-local chains**: the next node reads a tensor written since the last barrier only
//!   row by row, and both nodes split their rows among the same workers in the same way
//!   ([`crate::sched::split`] of the same row count, the same cap) — the RMS norm and the
//!   quantization after it, the activation and its quantization, a residual add and the next
//!   norm. Each worker then reads only rows it wrote itself.
//!
//! Either way each worker goes on to its share of the next node as soon as its share of this
//! one is done, with the same operations on the same values: results do not change (tested
//! bit for bit). At one token a step of SmolLM2 has 20 nodes per layer and 9 of its 20
//! barriers go; a barrier costs hundreds of nanoseconds at two threads and grows with the
//! worker count.
//!
//! Only plain nodes take part — norms, adds, scales, quantizations, activations, RoPE, and
//! matmuls that no worker class, accelerator or plan cuts. Inside tensor-parallel subgraphs the
//! same holds for a shard's node and that shard's next one (the shards' nodes interleave, each
//! group waiting at its own barriers only): group barriers are left out the same way. Conflicts
//! are found from the bytes each node reads and writes in the activation buffers, not from
//! tensor ids, since activation memory is reused across layers; anything in the output buffer
//! counts as overlapping.
//!
//! Invariant: called once the graph's caps and cuts are final (`engine::setup::finish_graph`);
//! a graph that was not passed through it keeps every barrier, which is always correct.

use super::{Graph, Sync};
use crate::tensor::{Op, Storage, TensorId};
use std::ops::Range;

impl Graph {
    /// Drop the barrier after each node whose successor is independent of, or row-local to,
    /// the nodes since the last barrier (module doc).
    pub fn elide_barriers(&mut self) {
        // The open nodes of the serial graph (slot 0) and of each shard's subgraph (1 + s): a
        // global barrier closes them all, a group barrier its group's. Every open node but the
        // first was checked plain when it joined, so only `i` is checked here.
        let mut open: Vec<Vec<usize>> = Vec::new();
        for i in 0..self.nodes.len().saturating_sub(1) {
            let slot = self.tensor(self.nodes[i]).group.map_or(0, |g| g as usize + 1);
            if open.len() <= slot {
                open.resize(slot + 1, Vec::new());
            }
            open[slot].push(i);
            let next = self.next_in_group(i);
            let elide = match (self.sync[i], next) {
                (Sync::Elided, _) => true,
                (_, Some(j)) => self.plain(i) && self.plain(j) && self.joins(&open[slot], j),
                (_, None) => false,
            };
            if elide {
                self.sync[i] = Sync::Elided;
            } else if self.sync[i] == Sync::Global {
                open.iter_mut().for_each(Vec::clear);
            } else {
                open[slot].clear();
            }
        }
    }

    /// The node the workers of node `i` run next, where only `i`'s barrier stands between
    /// them: for a serial node followed by the global barrier, the next node if serial too;
    /// for a shard's node followed by its group's barrier, the shard's next node if only other
    /// shards' nodes (their own group barriers) come between.
    fn next_in_group(&self, i: usize) -> Option<usize> {
        let group = self.tensor(self.nodes[i]).group;
        match (self.sync[i], group) {
            (Sync::Global, None) => (self.tensor(self.nodes[i + 1]).group.is_none()).then_some(i + 1),
            (Sync::Group, Some(_)) => {
                let j = (i + 1..self.nodes.len()).find(|&j| self.tensor(self.nodes[j]).group == group)?;
                (i + 1..j).all(|k| self.sync[k] == Sync::Group).then_some(j)
            }
            _ => None,
        }
    }

    /// Whether node `i` may run without a barrier before or after it: a plain operation
    /// writing the activation buffers.
    fn plain(&self, i: usize) -> bool {
        let id = self.nodes[i];
        let t = self.tensor(id);
        let op = match t.op {
            Op::MatMul { .. } => self.split_of(id).is_none() && self.device_split_of(id).is_none(),
            _ => row_local(&t.op),
        };
        op && matches!(t.storage, Storage::Act { .. })
    }

    /// Whether node `j` may start, on each worker, right after that worker's share of the
    /// nodes `open` (indices since the last barrier, all [`Graph::plain`]).
    fn joins(&self, open: &[usize], j: usize) -> bool {
        let jt = self.nodes[j];
        let out = self.bytes(jt);
        open.iter().all(|&p| {
            let pt = self.nodes[p];
            // Write after write, and write after read.
            if overlap(&out, &self.bytes(pt)) || inputs(&self.tensor(pt).op).iter().any(|&x| overlap(&out, &self.bytes(x))) {
                return false;
            }
            // Read after write: only row by row, on the same rows of the same workers.
            inputs(&self.tensor(jt).op).iter().all(|&x| {
                if x == pt {
                    self.same_rows(p, j)
                } else {
                    !overlap(&self.bytes(x), &self.bytes(pt))
                }
            })
        })
    }

    /// Whether node `j` reads node `p`'s output row by row on the workers that wrote it.
    fn same_rows(&self, p: usize, j: usize) -> bool {
        let (pt, jt) = (self.tensor(self.nodes[p]), self.tensor(self.nodes[j]));
        row_local(&pt.op) && row_local(&jt.op) && pt.ne[1] == jt.ne[1] && self.threads[p] == self.threads[j]
    }

    /// The bytes a tensor occupies in the activation buffers as `(buffer, range)`; the output
    /// buffer as buffer 2, whole; weights and the KV cache (read-only here, or not touched by
    /// plain nodes) as nothing.
    fn bytes(&self, id: TensorId) -> Option<(u8, Range<usize>)> {
        let t = self.tensor(id);
        match t.storage {
            Storage::Act { buf, offset } => Some((buf, offset..offset + t.n_bytes())),
            Storage::Output { .. } => Some((2, 0..usize::MAX)),
            Storage::Weight { .. } | Storage::Adapter { .. } | Storage::None => None,
        }
    }
}

/// Operations that split their rows with `sched::split(rows, ith, nth)` and read each input
/// row `r` only for their own row `r` (an add's one-row bias is caught by the row counts).
fn row_local(op: &Op) -> bool {
    matches!(op, Op::RmsNorm { .. } | Op::Quantize { .. } | Op::Add { .. } | Op::AddScaled { .. } | Op::Scale { .. } | Op::TempScale { .. } | Op::Softcap { .. } | Op::Glu { .. } | Op::Rope { .. })
}

/// The tensors a plain node reads.
fn inputs(op: &Op) -> Vec<TensorId> {
    match *op {
        Op::RmsNorm { x, w, .. } => vec![x, w],
        Op::Quantize { x, .. } | Op::Scale { x, .. } | Op::TempScale { x, .. } | Op::Softcap { x, .. } => vec![x],
        Op::Add { a, b } | Op::AddScaled { a, b, .. } => vec![a, b],
        Op::Glu { gate, up, .. } => vec![gate, up],
        Op::Rope { x, freqs, .. } => std::iter::once(x).chain(freqs).collect(),
        Op::MatMul { w, x } => vec![w, x],
        _ => unreachable!("only plain nodes are asked for their inputs"),
    }
}

fn overlap(a: &Option<(u8, Range<usize>)>, b: &Option<(u8, Range<usize>)>) -> bool {
    match (a, b) {
        (Some((ba, ra)), Some((bb, rb))) => ba == bb && ra.start < rb.end && rb.start < ra.end,
        _ => false,
    }
}
