//! sandwich-config (§5.3): service configurations from horizontal cross-sections of a
//! TopoTree, and the search over them with early stopping.
//!
//! A cut at depth d makes every node at d one tensor-parallel group running on the cores below
//! it: the TP degree is the number of subtrees cut, the group size their core count. Only cuts
//! into groups of equal size are kept (a shard plan gives each group the same share of heads,
//! so a smaller group would hold the others up), and only TP degrees the model allows
//! ([`Limits`], the ArcLight rules: at most one group per query head, and per expert for a
//! mixture of experts). Two cuts with the same cores in the same groups are one configuration
//! (the key sorts them); trees that differ only in an unused level give such duplicates.
//!
//! [`search`] scores configurations grouped by class — (TP degree, whether every group lies in
//! one NUMA node) — most cores first, and stops a class once `patience` configurations in a row
//! did not beat its best: within a class, fewer cores rarely help once they stopped helping.

use super::topotree::TNode;

/// One service configuration: which cores run, grouped how.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ServiceConfig {
    /// Worker PUs of each tensor-parallel group (group i runs shard i), in tree order.
    pub groups: Vec<Vec<u32>>,
    /// The NUMA node (index into `Topology::nodes`) of each group where it lies in one.
    pub numa: Vec<Option<usize>>,
}

impl ServiceConfig {
    pub fn tp(&self) -> usize {
        self.groups.len()
    }

    pub fn cores_per_group(&self) -> usize {
        self.groups.first().map_or(0, Vec::len)
    }

    pub fn n_cores(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }

    /// Every group inside one NUMA node (its weights and KV can live there).
    pub fn numa_local(&self) -> bool {
        self.numa.iter().all(Option::is_some)
    }

    /// The early-stopping class: (TP degree, NUMA-local).
    pub fn class(&self) -> (usize, bool) {
        (self.tp(), self.numa_local())
    }

    /// The same cores in the same groups give the same key, whatever the order.
    pub fn key(&self) -> Vec<Vec<u32>> {
        let mut g: Vec<Vec<u32>> = self.groups.iter().map(|g| {
            let mut g = g.clone();
            g.sort_unstable();
            g
        }).collect();
        g.sort();
        g
    }

    /// `tp 2 × 24 cores (node-local): PUs 0-23 | 24-47`.
    pub fn describe(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(|g| ranges(g)).collect();
        let local = if self.numa_local() { "node-local" } else { "spans nodes" };
        format!("tp {} × {} cores ({local}): PUs {}", self.tp(), self.cores_per_group(), groups.join(" | "))
    }
}

/// `0-3,8,10-11`.
fn ranges(pus: &[u32]) -> String {
    let mut v = pus.to_vec();
    v.sort_unstable();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j > i { format!("{}-{}", v[i], v[j]) } else { v[i].to_string() });
        i = j + 1;
    }
    out.join(",")
}

/// What the model allows (ArcLight's tensor-parallel rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest TP degree: the query heads (a shard needs at least one).
    pub max_tp: usize,
    /// Experts of a mixture-of-experts model (a shard needs at least one), else `None`.
    pub experts: Option<usize>,
}

impl Limits {
    pub fn for_model(n_head: usize, n_expert: usize) -> Limits {
        Limits { max_tp: n_head.max(1), experts: (n_expert > 0).then_some(n_expert) }
    }

    pub fn allows(&self, tp: usize) -> bool {
        tp >= 1 && tp <= self.max_tp && self.experts.is_none_or(|e| tp <= e)
    }
}

/// The configurations of one tree: a cut at every depth, equal groups, allowed degrees.
pub fn configs(tree: &TNode, limits: &Limits) -> Vec<ServiceConfig> {
    let mut out: Vec<ServiceConfig> = Vec::new();
    for depth in 0..=tree.height() {
        let cut = tree.cut(depth);
        let size = cut[0].n_cores();
        if !limits.allows(cut.len()) || cut.iter().any(|n| n.n_cores() != size) {
            continue;
        }
        let c = ServiceConfig { groups: cut.iter().map(|n| n.pus()).collect(), numa: cut.iter().map(|n| n.numa).collect() };
        if !out.iter().any(|o| o.key() == c.key()) {
            out.push(c);
        }
    }
    out
}

/// Configurations of many trees without the duplicates.
pub fn dedup(configs: impl IntoIterator<Item = ServiceConfig>) -> Vec<ServiceConfig> {
    let mut seen = std::collections::HashSet::new();
    configs.into_iter().filter(|c| seen.insert(c.key())).collect()
}

/// The outcome of [`search`].
#[derive(Clone, Debug)]
pub struct Search {
    /// The best configuration and its score (lower is better: a latency), if any was scored.
    pub best: Option<(ServiceConfig, f64)>,
    /// Configurations scored, and skipped by early stopping.
    pub scored: usize,
    pub skipped: usize,
}

/// Score `configs` (lower is better) class by class, most cores first, stopping a class after
/// `patience` scores in a row that did not improve its best (`patience` 0: score them all).
pub fn search(configs: &[ServiceConfig], patience: usize, mut score: impl FnMut(&ServiceConfig) -> f64) -> Search {
    let mut order: Vec<&ServiceConfig> = configs.iter().collect();
    order.sort_by_key(|c| (c.class(), std::cmp::Reverse(c.n_cores())));
    let mut out = Search { best: None, scored: 0, skipped: 0 };
    let mut class = None;
    let (mut class_best, mut misses) = (f64::INFINITY, 0);
    for c in order {
        if class != Some(c.class()) {
            (class, class_best, misses) = (Some(c.class()), f64::INFINITY, 0);
        }
        if patience > 0 && misses >= patience {
            out.skipped += 1;
            continue;
        }
        let s = score(c);
        out.scored += 1;
        if s < class_best {
            (class_best, misses) = (s, 0);
        } else {
            misses += 1;
        }
        if out.best.as_ref().is_none_or(|(_, b)| s < *b) {
            out.best = Some((c.clone(), s));
        }
    }
    out
}
