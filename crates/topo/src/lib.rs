//! Hardware topology: packages, NUMA nodes with their CPUs and memory, node distances, L3 and
//! L2 domains, cores and PUs — the facts ArcLight groups threads and places memory by, and the
//! tree Sandwich explores.
//!
//! Two readers fill one model: hwloc through `hwlocality` (feature `hwloc`; the live machine,
//! an hwloc XML snapshot, or an hwloc synthetic description such as `pack:2 numa:1 l3:8 core:8
//! pu:2`) and a reader of Linux's `/sys` (always built; the fallback when hwloc is absent, and
//! able to read a copy of another machine's `/sys`). Both produce the flat object list that
//! [`tree::build`] nests by CPU-set containment, so on one machine they give the same tree
//! (tested). [`Topology::load`] takes what `--topology` names; [`Topology::discover`] the
//! machine it runs on.
//!
//! Snapshots of the seed papers' machines (4× Kunpeng 920, 2× EPYC 7H12, 2× Xeon Gold 6230,
//! modelled from their specifications) and of the development machine are in
//! `fixtures/topo/` (written by `scripts/make_topo_fixtures.sh`).

pub mod cpuset;
#[cfg(feature = "hwloc")]
mod hwloc;
pub mod sandwich;
pub mod sys;
pub mod tree;

pub use cpuset::CpuSet;
use std::fmt;
use std::path::Path;
pub use tree::{Kind, Obj};

/// A topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {what}")]
    Parse { path: String, what: String },
    #[error("hwloc: {0}")]
    Hwloc(String),
    #[error(
        "{0} needs hwloc, and this corelm was built without it (build with the `hwloc` \
         feature: apt libhwloc-dev libudev-dev pkg-config); a directory holding a copy of \
         /sys works without it"
    )]
    NeedsHwloc(String),
    #[error("{0}: the topology has no PUs")]
    Empty(String),
}

/// One NUMA node: its CPUs grouped by core, and its memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaNode {
    /// The OS's node number (what `mbind` takes).
    pub os_index: u32,
    /// Local memory in bytes (0 if unknown).
    pub memory: u64,
    /// PUs of each core of the node, cores in tree order; SMT siblings share an entry.
    pub cores: Vec<Vec<u32>>,
}

impl NumaNode {
    /// Every PU of the node.
    pub fn cpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.cores.iter().flatten().copied()
    }

    /// One PU per core (the first sibling): where one worker per core goes.
    pub fn first_pus(&self) -> Vec<u32> {
        self.cores.iter().filter_map(|c| c.first().copied()).collect()
    }
}

/// The machine's tree and the facts derived from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Where it came from: `hwloc`, `/sys`, a file name or a synthetic description.
    pub source: String,
    /// Machine → package → NUMA node → L3 → L2 → core → PU.
    pub root: Obj,
    /// NUMA nodes in OS-number order (one node holding every CPU if the OS reports none).
    pub nodes: Vec<NumaNode>,
    /// Relative latency between nodes (`numactl -H`'s matrix: 10 local), in `nodes` order.
    /// Where the source gives none: 10 on the diagonal, 20 elsewhere (Linux's default).
    pub distances: Vec<Vec<u32>>,
}

impl Topology {
    /// The machine this runs on: hwloc where built with it (falling back to `/sys` if hwloc
    /// fails), else `/sys`.
    pub fn discover() -> Result<Topology, TopoError> {
        #[cfg(feature = "hwloc")]
        match hwloc::this_machine() {
            Ok(t) => return Ok(t),
            Err(e) => eprintln!("warning: hwloc could not read this machine ({e}); reading /sys"),
        }
        sys::read(Path::new("/sys"), "/sys")
    }

    /// What `--topology SPEC` names: a directory (a copy of a machine's `/sys`), an hwloc XML
    /// file, or else an hwloc synthetic description (`pack:2 numa:1 l3:8 core:8 pu:2`).
    pub fn load(spec: &str) -> Result<Topology, TopoError> {
        let path = Path::new(spec);
        if path.is_dir() {
            return sys::read(path, spec);
        }
        #[cfg(feature = "hwloc")]
        {
            if path.is_file() {
                hwloc::from_xml_file(path)
            } else {
                hwloc::from_synthetic(spec)
            }
        }
        #[cfg(not(feature = "hwloc"))]
        {
            if path.is_file() {
                Err(TopoError::NeedsHwloc(format!("reading the hwloc XML file {spec}")))
            } else {
                Err(TopoError::NeedsHwloc(format!("the synthetic topology {spec:?}")))
            }
        }
    }

    /// [`Topology::load`] if a spec is given, else [`Topology::discover`].
    pub fn load_or_discover(spec: Option<&str>) -> Result<Topology, TopoError> {
        match spec {
            Some(s) => Topology::load(s),
            None => Topology::discover(),
        }
    }

    /// Assemble from a reader's flat objects and node distances (by node OS number).
    pub(crate) fn assemble(
        source: String,
        flat: Vec<Obj>,
        distances: Option<Vec<Vec<u32>>>,
    ) -> Result<Topology, TopoError> {
        let memory = flat.iter().filter(|o| o.kind == Kind::NumaNode).map(|o| o.bytes).sum();
        let root = tree::build(flat, memory);
        if root.cpus.is_empty() {
            return Err(TopoError::Empty(source));
        }
        let mut nodes: Vec<NumaNode> = root
            .all(Kind::NumaNode)
            .into_iter()
            .map(|n| NumaNode { os_index: n.os_index.unwrap_or(0), memory: n.bytes, cores: cores_of(n) })
            .collect();
        if nodes.is_empty() {
            nodes.push(NumaNode { os_index: 0, memory, cores: cores_of(&root) });
        }
        nodes.sort_by_key(|n| n.os_index);
        let n = nodes.len();
        let distances = match distances {
            Some(d) if d.len() == n && d.iter().all(|r| r.len() == n) => d,
            _ => (0..n).map(|i| (0..n).map(|j| if i == j { 10 } else { 20 }).collect()).collect(),
        };
        Ok(Topology { source, root, nodes, distances })
    }

    pub fn n_pus(&self) -> usize {
        self.root.cpus.len()
    }

    pub fn n_cores(&self) -> usize {
        self.nodes.iter().map(|n| n.cores.len()).sum()
    }

    pub fn n_packages(&self) -> usize {
        self.root.all(Kind::Package).len().max(1)
    }

    /// The node (index into `nodes`) holding PU `cpu`.
    pub fn node_of_cpu(&self, cpu: u32) -> Option<usize> {
        self.nodes.iter().position(|n| n.cpus().any(|c| c == cpu))
    }

    /// One line: packages, nodes, cores, PUs, memory.
    pub fn summary(&self) -> String {
        let gib = self.root.bytes as f64 / (1u64 << 30) as f64;
        format!(
            "{} package(s), {} NUMA node(s), {} cores, {} PUs, {gib:.1} GiB",
            self.n_packages(),
            self.nodes.len(),
            self.n_cores(),
            self.n_pus()
        )
    }
}

/// PUs grouped by core below `obj` (a PU outside any core is its own core).
fn cores_of(obj: &Obj) -> Vec<Vec<u32>> {
    let cores = obj.all(Kind::Core);
    if cores.is_empty() {
        return obj.cpus.as_slice().iter().map(|&c| vec![c]).collect();
    }
    cores.iter().map(|c| c.cpus.as_slice().to_vec()).collect()
}

impl fmt::Display for Topology {
    /// The tree (lstopo's console form), the node distance matrix and the summary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "topology from {}", self.source)?;
        write!(f, "{}", self.root)?;
        writeln!(f, "node distances (relative latency, 10 = local):")?;
        write!(f, "node")?;
        for n in &self.nodes {
            write!(f, " {:>4}", n.os_index)?;
        }
        writeln!(f)?;
        for (n, row) in self.nodes.iter().zip(&self.distances) {
            write!(f, "{:>3}:", n.os_index)?;
            for d in row {
                write!(f, " {d:>4}")?;
            }
            writeln!(f)?;
        }
        writeln!(f, "{}", self.summary())
    }
}
