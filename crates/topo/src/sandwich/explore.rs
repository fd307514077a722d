//! The transformation tree (§5.2): from the machine's TopoTree, every applicable `group` and
//! `remove`, breadth first, up to a number of steps.
//!
//! Each new tree is scored (lower is better: the best latency of its configurations, measured
//! or modelled — the caller decides). Trees whose shape hash was seen are explored once. A tree
//! is expanded further only where it paid: a `remove` must beat its parent (it gives up cores),
//! a `group` must be no worse (it only adds a level to cut at, so it may pay only after a
//! `remove` below it — Kunpeng's clusters are worth finding for the core they let go).

use super::topotree::{TNode, Transform};
use std::collections::HashSet;

/// One tree of the transformation tree.
#[derive(Clone, Debug)]
pub struct Explored {
    pub tree: TNode,
    pub hash: u64,
    /// The tree it came from (index into [`Exploration::trees`]) and by which transform.
    pub parent: Option<(usize, Transform)>,
    /// Transforms from the root.
    pub steps: usize,
    pub score: f64,
    /// Whether its own transforms were explored (it paid, and steps were left).
    pub expanded: bool,
}

/// The explored transformation tree.
#[derive(Clone, Debug, Default)]
pub struct Exploration {
    /// The root first, then breadth first.
    pub trees: Vec<Explored>,
    /// Trees that had the shape of one already explored.
    pub duplicates: usize,
    /// Trees kept but not expanded because they did not pay.
    pub pruned: usize,
}

impl Exploration {
    /// The transforms that lead from the root to tree `i`.
    pub fn path(&self, mut i: usize) -> Vec<Transform> {
        let mut out = Vec::new();
        while let Some((p, t)) = self.trees[i].parent {
            out.push(t);
            i = p;
        }
        out.reverse();
        out
    }

    /// The tree with the lowest score (the root on ties).
    pub fn best(&self) -> &Explored {
        self.trees.iter().fold(&self.trees[0], |b, t| if t.score < b.score { t } else { b })
    }
}

/// Explore from `root`, at most `max_steps` transforms deep and `max_trees` trees in all.
pub fn explore(root: TNode, max_steps: usize, max_trees: usize, mut score: impl FnMut(&TNode) -> f64) -> Exploration {
    let hash = root.shape_hash();
    let s = score(&root);
    let mut ex = Exploration::default();
    ex.trees.push(Explored { tree: root, hash, parent: None, steps: 0, score: s, expanded: false });
    let mut seen: HashSet<u64> = HashSet::from([hash]);
    let mut next = 0;
    while next < ex.trees.len() {
        let i = next;
        next += 1;
        let (steps, paid) = {
            let e = &ex.trees[i];
            let paid = match e.parent {
                None => true,
                Some((p, t)) => {
                    let ps = ex.trees[p].score;
                    match t {
                        Transform::Remove { .. } => e.score < ps,
                        Transform::Group { .. } => e.score <= ps,
                    }
                }
            };
            (e.steps, paid)
        };
        if !paid {
            ex.pruned += 1;
            continue;
        }
        if steps >= max_steps {
            continue;
        }
        ex.trees[i].expanded = true;
        for t in ex.trees[i].tree.transforms() {
            let Some(child) = ex.trees[i].tree.apply(t) else { continue };
            let h = child.shape_hash();
            if !seen.insert(h) {
                ex.duplicates += 1;
                continue;
            }
            if ex.trees.len() >= max_trees {
                return ex;
            }
            let s = score(&child);
            ex.trees.push(Explored { tree: child, hash: h, parent: Some((i, t)), steps: steps + 1, score: s, expanded: false });
        }
    }
    ex
}
