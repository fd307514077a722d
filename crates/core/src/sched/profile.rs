//! `--profile`'s accounting: time per op kind summed over a pass's nodes, matmuls kept apart
//! by weight type and layout with the bytes they read.

use crate::graph::Graph;
use crate::tensor::{Op, Storage, TensorId, WeightCopy};
use corelm_kernels::DType;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Time spent per op kind, summed over nodes (worker 0's view, barrier included). Matmuls are
/// kept apart by weight type and layout, with the weight bytes they read, so a profile shows
/// the bandwidth each kind of matrix is read at.
#[derive(Default, Clone, Debug)]
pub struct Profile {
    pub per_op: Vec<ProfileEntry>,
    /// Seconds each worker group spent waiting in global barriers (the mean over its
    /// workers), summed over the profiled passes: with tensor parallelism, the shards' idle
    /// time at scatters and gathers, so a shard that waits less than the others sets the pace.
    pub group_wait: Vec<f64>,
}

/// One line of a [`Profile`].
#[derive(Clone, Debug)]
pub struct ProfileEntry {
    /// The op kind (`Op::name`).
    pub op: &'static str,
    /// For matmuls: the weight type, and whether it was read in the interleaved layout.
    pub weight: Option<(DType, bool)>,
    pub secs: f64,
    pub nodes: usize,
    /// Weight bytes read (matmuls; 0 otherwise).
    pub bytes: usize,
    /// With tensor parallelism: seconds each worker group's first worker spent running its
    /// own shard's nodes of this kind (group barriers included, global waits not), so a
    /// profile shows which op kind makes one shard slower than the others. Empty without groups.
    pub group_secs: Vec<f64>,
    /// Seconds a worker spent in the global barriers after this kind's nodes (the mean over
    /// the pass's workers): what the kind's uneven shares, or its work on fewer workers than
    /// the pool's, cost the others.
    pub wait_secs: f64,
}

impl ProfileEntry {
    /// `op`, or `matmul Q5_0 il` for a matmul on an interleaved Q5_0 matrix.
    pub fn label(&self) -> String {
        match self.weight {
            Some((d, il)) => format!("{} {}{}", self.op, d.name(), if il { " il" } else { "" }),
            None => self.op.to_string(),
        }
    }
}

impl Profile {
    pub(super) fn add(&mut self, op: &'static str, weight: Option<(DType, bool)>, secs: f64, bytes: usize) {
        match self.per_op.iter_mut().find(|e| e.op == op && e.weight == weight) {
            Some(e) => {
                e.secs += secs;
                e.nodes += 1;
                e.bytes += bytes;
            }
            None => self.per_op.push(ProfileEntry { op, weight, secs, nodes: 1, bytes, group_secs: Vec::new(), wait_secs: 0.0 }),
        }
    }

    /// Add group `g`'s busy time per op kind (`busy`'s entries, timed by that group's first
    /// worker) to the matching entries' `group_secs`, for `groups` groups.
    pub(super) fn add_group(&mut self, g: usize, groups: usize, busy: &Profile) {
        for b in &busy.per_op {
            let Some(e) = self.per_op.iter_mut().find(|e| e.op == b.op && e.weight == b.weight) else { continue };
            if e.group_secs.len() < groups {
                e.group_secs.resize(groups, 0.0);
            }
            e.group_secs[g] += b.secs;
        }
    }

    /// Add the workers' mean wait after each node (`per_node`, in the graph's node order) to
    /// its kind's entry.
    pub(super) fn add_node_waits(&mut self, graph: &Graph, per_node: &[f64]) {
        for (&id, &w) in graph.nodes.iter().zip(per_node) {
            let (op, weight) = (graph.tensor(id).op.name(), weight_of(graph, id).0);
            if let Some(e) = self.per_op.iter_mut().find(|e| e.op == op && e.weight == weight) {
                e.wait_secs += w;
            }
        }
    }

    pub(super) fn add_waits(&mut self, waits: &[f64]) {
        if self.group_wait.len() < waits.len() {
            self.group_wait.resize(waits.len(), 0.0);
        }
        for (a, w) in self.group_wait.iter_mut().zip(waits) {
            *a += w;
        }
    }

    /// Total seconds over all entries.
    pub fn total_secs(&self) -> f64 {
        self.per_op.iter().map(|e| e.secs).sum()
    }
}

/// A node's weight type and layout, and the weight bytes it reads (matmuls; `(None, 0)`
/// otherwise).
pub(super) fn weight_of(graph: &Graph, id: TensorId) -> (Option<(DType, bool)>, usize) {
    let t = graph.tensor(id);
    match t.op {
        Op::MatMul { w, .. } | Op::MatMulId { w, .. } => {
            let wt = graph.tensor(w);
            let il = matches!(wt.storage, Storage::Weight { copy: Some(WeightCopy { interleaved: true, .. }), .. });
            // An expert matmul reads only the experts its tokens chose.
            let bytes = if matches!(t.op, Op::MatMul { .. }) { wt.n_bytes() } else { 0 };
            (Some((wt.dtype, il)), bytes)
        }
        _ => (None, 0),
    }
}

/// Nanoseconds the workers of each group, and all workers after each node, spent in global
/// barriers during one pass.
pub(super) struct BarrierWaits {
    per_group: Vec<AtomicU64>,
    per_node: Vec<AtomicU64>,
}

impl BarrierWaits {
    /// Room for up to `groups` groups and `nodes` nodes (0 groups: nothing is timed).
    pub(super) fn new(groups: usize, nodes: usize) -> Self {
        let zeros = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect();
        BarrierWaits { per_group: zeros(groups), per_node: zeros(if groups == 0 { 0 } else { nodes }) }
    }

    /// Run `barrier`, the one after node `node`, adding its time to `group`'s and the node's.
    #[inline]
    pub(super) fn time(&self, group: usize, node: usize, barrier: impl FnOnce()) {
        let t = Instant::now();
        barrier();
        let ns = t.elapsed().as_nanos() as u64;
        self.per_group[group].fetch_add(ns, Ordering::Relaxed);
        self.per_node[node].fetch_add(ns, Ordering::Relaxed);
    }

    /// Seconds per group, divided by its worker count (`groups`: the workers of each).
    pub(super) fn per_worker(&self, groups: &[Range<usize>]) -> Vec<f64> {
        groups.iter().zip(&self.per_group).map(|(r, ns)| ns.load(Ordering::Relaxed) as f64 * 1e-9 / r.len().max(1) as f64).collect()
    }

    /// Seconds per node, divided by the pool's `workers`.
    pub(super) fn per_node(&self, workers: usize) -> Vec<f64> {
        self.per_node.iter().map(|ns| ns.load(Ordering::Relaxed) as f64 * 1e-9 / workers.max(1) as f64).collect()
    }
}
