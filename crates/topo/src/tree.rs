//! The hardware tree: machine → package → NUMA node → L3 → L2 → core → PU, built from a flat
//! list of objects by CPU-set containment, so every reader (hwloc, /sys) yields the same tree.
//!
//! hwloc 2.x keeps NUMA nodes as *memory children* beside the normal tree; here a node is an
//! ordinary level between package and L3 (what ArcLight groups threads by and Sandwich's
//! TopoTree cuts). Where a level is larger than the one normally above it (an L3 shared by two
//! NUMA nodes, as with Intel's sub-NUMA clustering) containment puts it higher: the tree
//! follows the hardware, not a fixed level order. Objects with equal CPU sets nest in
//! [`Kind`] order (package above node above L3 ...).

use crate::cpuset::CpuSet;
use std::fmt::{self, Write};

/// The levels corelm keeps (L1 caches, dies and groups are not used by any planner).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Machine,
    Package,
    NumaNode,
    L3,
    L2,
    Core,
    Pu,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Machine => "Machine",
            Kind::Package => "Package",
            Kind::NumaNode => "NUMANode",
            Kind::L3 => "L3",
            Kind::L2 => "L2",
            Kind::Core => "Core",
            Kind::Pu => "PU",
        }
    }
}

/// One object of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Obj {
    pub kind: Kind,
    /// The OS's number (package id, node number, core id, PU number); none for caches.
    pub os_index: Option<u32>,
    /// PUs below this object.
    pub cpus: CpuSet,
    /// Bytes: local memory of a NUMA node, size of a cache; 0 otherwise or unknown.
    pub bytes: u64,
    pub children: Vec<Obj>,
}

impl Obj {
    pub fn leaf(kind: Kind, os_index: Option<u32>, cpus: CpuSet, bytes: u64) -> Obj {
        Obj { kind, os_index, cpus, bytes, children: Vec::new() }
    }

    /// Every object of `kind` below (and including) this one, in tree order.
    pub fn all(&self, kind: Kind) -> Vec<&Obj> {
        let mut out = Vec::new();
        self.collect(kind, &mut out);
        out
    }

    fn collect<'a>(&'a self, kind: Kind, out: &mut Vec<&'a Obj>) {
        if self.kind == kind {
            out.push(self);
        }
        for c in &self.children {
            c.collect(kind, out);
        }
    }

    /// Insert `obj` below the deepest object that contains its CPUs (ties by kind order).
    fn insert(&mut self, obj: Obj) {
        let fits = |c: &Obj| {
            c.cpus.contains_all(&obj.cpus) && (c.cpus.len() > obj.cpus.len() || c.kind < obj.kind)
        };
        match self.children.iter_mut().find(|c| fits(c)) {
            Some(child) => child.insert(obj),
            None => self.children.push(obj),
        }
    }

    fn sort(&mut self) {
        self.children.sort_by_key(|c| (c.cpus.first().unwrap_or(u32::MAX), c.kind));
        for c in &mut self.children {
            c.sort();
        }
    }
}

/// Build the tree under a machine object from a flat list (any order). Objects without CPUs
/// (memory-only NUMA nodes) hang under the machine.
pub fn build(flat: Vec<Obj>, machine_bytes: u64) -> Obj {
    let all = flat.iter().fold(CpuSet::default(), |acc, o| acc.union(&o.cpus));
    let mut root = Obj::leaf(Kind::Machine, None, all, machine_bytes);
    let mut flat = flat;
    flat.sort_by(|a, b| b.cpus.len().cmp(&a.cpus.len()).then(a.kind.cmp(&b.kind)));
    for obj in flat {
        if obj.cpus.is_empty() {
            root.children.push(obj);
        } else {
            root.insert(obj);
        }
    }
    root.sort();
    root
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl Obj {
    fn label(&self) -> String {
        let mut s = self.kind.name().to_string();
        if let Some(i) = self.os_index.filter(|_| self.kind != Kind::Machine) {
            let _ = write!(s, " P#{i}");
        }
        match self.kind {
            Kind::Machine => {
                let _ = write!(s, " ({} PUs, {})", self.cpus.len(), human(self.bytes));
            }
            Kind::NumaNode => {
                let _ = write!(s, " ({}, PUs {})", human(self.bytes), self.cpus);
            }
            Kind::L3 | Kind::L2 if self.bytes > 0 => {
                let _ = write!(s, " ({})", human(self.bytes));
            }
            _ => {}
        }
        s
    }

    /// lstopo's console form: one line per object, chains of only children joined by ` + `.
    fn write_tree(&self, f: &mut fmt::Formatter<'_>, depth: usize) -> fmt::Result {
        let mut line = self.label();
        let mut obj = self;
        while obj.children.len() == 1 && obj.kind != Kind::Machine {
            obj = &obj.children[0];
            line.push_str(" + ");
            line.push_str(&obj.label());
        }
        writeln!(f, "{:indent$}{line}", "", indent = 2 * depth)?;
        for c in &obj.children {
            c.write_tree(f, depth + 1)?;
        }
        Ok(())
    }
}

impl fmt::Display for Obj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_tree(f, 0)
    }
}
