//! Sandwich's service-configuration search (§5): the machine as a TopoTree, transformed by
//! `group` and `remove` into the trees worth cutting ([`topotree`], [`explore`]); each tree's
//! horizontal cross-sections as service configurations — TP degree, cores per group, which cores
//! ([`config`]); and a latency model scoring them on machines that are not this one ([`model`]).
//!
//! Layering: `topotree ← explore`, `topotree ← config ← model`; none of them knows a model
//! file or the engine: the caller passes the limits (heads, experts) and the workload (bytes,
//! FLOPs, barriers per layer), and scores configurations by measurement or by the model.

pub mod config;
pub mod explore;
pub mod model;
pub mod topotree;

pub use config::{configs, dedup, search, Limits, Search, ServiceConfig};
pub use explore::{explore, Exploration, Explored};
pub use model::{pass_seconds, Cluster, MachineProfile, Workload};
pub use topotree::{Level, TNode, Transform};

/// The candidates of a machine: `root` explored (at most `max_steps` transforms deep,
/// `max_trees` trees), each tree scored by its best configuration under `score`; returns the
/// exploration and every configuration of every explored tree within `limits`, duplicates gone.
pub fn candidates(
    root: TNode,
    max_steps: usize,
    max_trees: usize,
    limits: &Limits,
    mut score: impl FnMut(&ServiceConfig) -> f64,
) -> (Exploration, Vec<ServiceConfig>) {
    let ex = explore(root, max_steps, max_trees, |t| search(&configs(t, limits), 0, &mut score).best.map_or(f64::INFINITY, |b| b.1));
    let all = dedup(ex.trees.iter().flat_map(|e| configs(&e.tree, limits)));
    (ex, all)
}
