//! Sandwich's TopoTree (§5.2): the hardware tree reduced to what a service configuration is cut
//! from, and the two transforms that reveal structure hwloc does not show.
//!
//! From [`crate::Topology`]'s tree: leaves are cores (one worker per core, SMT siblings are
//! not separate leaves), and a chain of only children is one node (`Machine+Package+NUMANode+
//! L3` on a one-socket machine, `L2+Core` where every core has its own L2), so the depth of a
//! node counts real branchings. Every node knows the NUMA node its cores lie in, if only one.
//!
//! * `group(n, stride, depth)` inserts a level below every node at `depth`: its children in
//!   groups of `n`, consecutive (`stride` 1) or interleaved (`stride` s: children j, j+s, …,
//!   j+(n−1)s of each run of n·s). Kunpeng 920's 4-core clusters sharing an L3 tag, invisible
//!   to hwloc, are `group(4, 1, depth of the L3)`.
//! * `remove(n, depth)` drops the `n` right-most children of every node at `depth` (and so
//!   their cores): one core per cluster less, say, where a cluster's bandwidth is already
//!   saturated by the others.
//!
//! [`TNode::shape_hash`] is a Merkle hash of the shape (level names and children's hashes,
//! sorted, so the order of siblings does not matter): two trees with the same hash give the same
//! configurations up to renaming cores, and are explored once.

use crate::{Kind, Obj, Topology};
use std::fmt;

/// What a TopoTree level is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// Hardware levels (a chain of only children collapsed into one node), top first.
    Hw(Vec<Kind>),
    /// A level inserted by `group(n, stride, ·)`.
    Group { n: usize, stride: usize },
}

/// One node of a TopoTree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TNode {
    pub level: Level,
    /// The NUMA node (index into [`Topology::nodes`]) holding every core below, if one does.
    pub numa: Option<usize>,
    /// For a leaf (a core): the PU a worker on it is pinned to (its first SMT sibling).
    pub pu: Option<u32>,
    pub children: Vec<TNode>,
}

/// A transform of [`TNode`] trees (Sandwich's `group` and `remove`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transform {
    Group { n: usize, stride: usize, depth: usize },
    Remove { n: usize, depth: usize },
}

impl Transform {
    /// The depth of the nodes whose children it rewrites.
    pub fn depth(self) -> usize {
        match self {
            Transform::Group { depth, .. } | Transform::Remove { depth, .. } => depth,
        }
    }

    /// Whether it applies to a node of `children` children: `group` when 1 < n < children and
    /// the children are a multiple of n·stride; `remove` when it leaves at least one.
    fn applies_to(self, children: usize) -> bool {
        match self {
            Transform::Group { n, stride, .. } => n > 1 && n < children && stride >= 1 && children.is_multiple_of(n * stride),
            Transform::Remove { n, .. } => n >= 1 && n < children,
        }
    }
}

impl fmt::Display for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Transform::Group { n, stride, depth } => write!(f, "group({n}, {stride}, {depth})"),
            Transform::Remove { n, depth } => write!(f, "remove({n}, {depth})"),
        }
    }
}

/// FNV-1a, 64 bits: a hash that is the same on every build (a plan file may keep it).
fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}
const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

impl TNode {
    /// The TopoTree of a topology: cores as leaves, chains of only children collapsed.
    pub fn from_topology(t: &Topology) -> TNode {
        let mut root = Self::from_obj(&t.root, t);
        root.set_numa();
        root
    }

    fn from_obj(o: &Obj, t: &Topology) -> TNode {
        if o.kind == Kind::Core || o.kind == Kind::Pu || o.children.is_empty() {
            let pu = o.cpus.first();
            let numa = pu.and_then(|c| t.node_of_cpu(c));
            return TNode { level: Level::Hw(vec![Kind::Core]), numa, pu, children: Vec::new() };
        }
        // Objects without CPUs (memory-only nodes) hold no cores.
        let kids: Vec<&Obj> = o.children.iter().filter(|c| !c.cpus.is_empty()).collect();
        if kids.len() == 1 {
            let mut below = Self::from_obj(kids[0], t);
            if let Level::Hw(kinds) = &mut below.level {
                kinds.insert(0, o.kind);
            }
            return below;
        }
        let children = kids.into_iter().map(|c| Self::from_obj(c, t)).collect();
        TNode { level: Level::Hw(vec![o.kind]), numa: None, pu: None, children }
    }

    /// Each inner node's NUMA node: its children's, where they all agree.
    fn set_numa(&mut self) {
        if self.children.is_empty() {
            return;
        }
        for c in &mut self.children {
            c.set_numa();
        }
        let first = self.children[0].numa;
        self.numa = first.filter(|_| self.children.iter().all(|c| c.numa == first));
    }

    pub fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }

    /// An inner node whose children are all cores (a cluster, an L3, a node of cores).
    pub fn of_cores(&self) -> bool {
        !self.is_leaf() && self.children.iter().all(TNode::is_leaf)
    }

    /// Cores below (leaves), in tree order.
    pub fn n_cores(&self) -> usize {
        if self.is_leaf() {
            1
        } else {
            self.children.iter().map(TNode::n_cores).sum()
        }
    }

    /// The worker PUs of the cores below, in tree order.
    pub fn pus(&self) -> Vec<u32> {
        let mut out = Vec::new();
        self.walk_leaves(&mut |l| out.extend(l.pu));
        out
    }

    fn walk_leaves(&self, f: &mut impl FnMut(&TNode)) {
        if self.is_leaf() {
            f(self);
        }
        for c in &self.children {
            c.walk_leaves(f);
        }
    }

    /// Depth of the deepest leaf (0 for a lone core).
    pub fn height(&self) -> usize {
        self.children.iter().map(|c| 1 + c.height()).max().unwrap_or(0)
    }

    /// The nodes at `depth` (the root is depth 0); a leaf above `depth` stands for itself, so
    /// every core is below exactly one returned node (a horizontal cross-section).
    pub fn cut(&self, depth: usize) -> Vec<&TNode> {
        let mut out = Vec::new();
        self.cut_into(depth, &mut out);
        out
    }

    fn cut_into<'a>(&'a self, depth: usize, out: &mut Vec<&'a TNode>) {
        if depth == 0 || self.is_leaf() {
            out.push(self);
        } else {
            for c in &self.children {
                c.cut_into(depth - 1, out);
            }
        }
    }

    /// The Merkle hash of the shape: level and the sorted hashes of the children.
    pub fn shape_hash(&self) -> u64 {
        let mut h = match &self.level {
            Level::Hw(kinds) => kinds.iter().fold(fnv(FNV_BASIS, b"hw"), |h, k| fnv(h, k.name().as_bytes())),
            Level::Group { n, stride } => fnv(fnv(fnv(FNV_BASIS, b"group"), &n.to_le_bytes()), &stride.to_le_bytes()),
        };
        // Whether the subtree stays inside one NUMA node is part of its shape.
        h = fnv(h, &[self.numa.is_some() as u8]);
        let mut kids: Vec<u64> = self.children.iter().map(TNode::shape_hash).collect();
        kids.sort_unstable();
        kids.iter().fold(h, |h, k| fnv(h, &k.to_le_bytes()))
    }

    /// Child counts of the nodes at `depth` that are not leaves (empty if none).
    fn fanouts(&self, depth: usize) -> Vec<usize> {
        self.cut(depth).iter().filter(|n| !n.is_leaf()).map(|n| n.children.len()).collect()
    }

    /// `t` applied, or `None` where it does not apply to every inner node at its depth
    /// (`group`: 1 < n < children, children a multiple of n·stride; `remove`: fewer than the
    /// children), or there is no inner node at that depth.
    pub fn apply(&self, t: Transform) -> Option<TNode> {
        let fan = self.fanouts(t.depth());
        if fan.is_empty() || !fan.into_iter().all(|c| t.applies_to(c)) {
            return None;
        }
        let mut out = self.clone();
        out.rewrite(t.depth(), t);
        out.set_numa();
        Some(out)
    }

    fn rewrite(&mut self, depth: usize, t: Transform) {
        if self.is_leaf() {
            return;
        }
        if depth > 0 {
            for c in &mut self.children {
                c.rewrite(depth - 1, t);
            }
            return;
        }
        match t {
            Transform::Remove { n, .. } => {
                let keep = self.children.len() - n;
                self.children.truncate(keep);
            }
            Transform::Group { n, stride, .. } => {
                let old = std::mem::take(&mut self.children);
                let run = n * stride;
                for r in 0..old.len() / run {
                    for j in 0..stride {
                        let members = (0..n).map(|k| old[r * run + j + k * stride].clone()).collect();
                        self.children.push(TNode { level: Level::Group { n, stride }, numa: None, pu: None, children: members });
                    }
                }
            }
        }
    }

    /// Every transform that applies to this tree: at each depth with inner nodes, `group` by
    /// each divisor n of the (common) child count with strides 1 and children/n (consecutive
    /// and fully interleaved), and `remove` of 1 up to half the children.
    pub fn transforms(&self) -> Vec<Transform> {
        let mut out = Vec::new();
        for depth in 0..self.height() {
            let fan = self.fanouts(depth);
            let Some(&c) = fan.first() else { continue };
            if fan.iter().any(|&x| x != c) {
                continue; // an uneven level: no transform applies to all of it alike
            }
            for n in (2..c).filter(|n| c % n == 0) {
                out.push(Transform::Group { n, stride: 1, depth });
                if c / n > 1 {
                    out.push(Transform::Group { n, stride: c / n, depth });
                }
            }
            for n in 1..=c / 2 {
                out.push(Transform::Remove { n, depth });
            }
        }
        out
    }

    /// `Package+NUMANode`, `Group(4, stride 1)`, …
    pub fn level_name(&self) -> String {
        match &self.level {
            Level::Hw(kinds) => kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join("+"),
            Level::Group { n, stride } => format!("Group({n}, stride {stride})"),
        }
    }

    fn write(&self, f: &mut fmt::Formatter<'_>, depth: usize) -> fmt::Result {
        let numa = self.numa.map_or(String::new(), |n| format!(" [node {n}]"));
        if self.is_leaf() {
            return writeln!(f, "{:indent$}{} PU {}{numa}", "", self.level_name(), self.pu.unwrap_or(0), indent = 2 * depth);
        }
        // Runs of identical leaves print as one line.
        let leaves = self.of_cores();
        writeln!(f, "{:indent$}{} ({} cores){numa}", "", self.level_name(), self.n_cores(), indent = 2 * depth)?;
        if leaves {
            let pus: Vec<String> = self.children.iter().filter_map(|c| c.pu).map(|p| p.to_string()).collect();
            return writeln!(f, "{:indent$}{} × Core: PUs {}", "", self.children.len(), pus.join(","), indent = 2 * depth + 2);
        }
        for c in &self.children {
            c.write(f, depth + 1)?;
        }
        Ok(())
    }
}

impl fmt::Display for TNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, 0)
    }
}
