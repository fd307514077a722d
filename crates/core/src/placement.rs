//! Where workers run and where memory lives, per `--numa` mode, planned once at load from the
//! machine's topology (`corelm_topo`). The modes keep llama.cpp's meanings:
//!
//! | mode | workers | weights, pools, KV cache |
//! |---|---|---|
//! | `off` | one per physical core, node by node | first touch (the kernel's default) |
//! | `distribute` | spread evenly: worker `i` on node `i mod nodes` | interleaved page by page over the nodes |
//! | `isolate` | only the cores of the node the process started on | bound to that node |
//! | `tp` | worker group `s` (tensor-parallel shard `s`, `--tp` default: one per node) on its node's cores | shard `s`'s weight copies, KV rows and activation regions bound to its node; the rest interleaved |
//!
//! Memory placement applies to what corelm allocates: the repacked weight buffer (every matmul
//! weight of a type with interleaved kernels), the activation pools and the KV cache. Weights
//! read straight from the model mapping (embeddings, norms, types without a repacked layout,
//! `--no-repack`) stay where the page cache holds them.

use crate::memory::Place;
use corelm_topo::Topology;
use std::fmt;
use std::str::FromStr;

/// `--numa`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NumaMode {
    #[default]
    Off,
    Distribute,
    Isolate,
    /// Tensor parallelism across nodes (ArcLight): one shard per node.
    Tp,
}

impl FromStr for NumaMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(NumaMode::Off),
            "distribute" => Ok(NumaMode::Distribute),
            "isolate" => Ok(NumaMode::Isolate),
            "tp" => Ok(NumaMode::Tp),
            _ => Err(format!("unknown NUMA mode '{s}' (off, distribute, isolate, tp)")),
        }
    }
}

impl fmt::Display for NumaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NumaMode::Off => "off",
            NumaMode::Distribute => "distribute",
            NumaMode::Isolate => "isolate",
            NumaMode::Tp => "tp",
        })
    }
}

/// The plan of one mode on one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// CPU of each worker slot, in worker order (worker `i` → `cpus[i % len]`).
    pub cpus: Vec<usize>,
    /// Where weights, activation pools and the KV cache go.
    pub memory: Place,
    /// Nodes (OS numbers) the workers run on.
    pub nodes: Vec<usize>,
    /// Each of `nodes`' allowed cores (first PU of each), in the same order.
    pub node_cpus: Vec<Vec<usize>>,
}

impl Placement {
    /// For `--numa tp` with `degree` shards and `n_threads` workers in groups of
    /// `group_sizes`: the CPU of every worker (group `s` on its shard's node's cores) and the
    /// node of every shard (shards spread over the nodes in order, several per node when the
    /// degree is larger).
    pub fn tp_workers(&self, group_sizes: &[usize]) -> (Vec<usize>, Vec<usize>) {
        let (degree, n) = (group_sizes.len(), self.nodes.len());
        let node_of = |s: usize| s * n / degree;
        let mut cpus = Vec::with_capacity(group_sizes.iter().sum());
        for (s, &size) in group_sizes.iter().enumerate() {
            let cores = &self.node_cpus[node_of(s)];
            // Shards sharing a node take its cores one after another.
            let first = (0..s).filter(|&t| node_of(t) == node_of(s)).map(|t| group_sizes[t]).sum::<usize>();
            cpus.extend((0..size).map(|i| cores[(first + i) % cores.len()]));
        }
        (cpus, (0..degree).map(|s| self.nodes[node_of(s)]).collect())
    }
}

/// Plan `mode` on `topo` for a process allowed to run on `allowed` CPUs, started on CPU
/// `current` (for `isolate`). Fails, naming the numbers, when a mode has no CPU to run on.
pub fn plan(mode: NumaMode, topo: &Topology, allowed: &[usize], current: usize) -> Result<Placement, String> {
    // Per node: the first allowed PU of each core.
    let per_node: Vec<(usize, Vec<usize>)> = topo
        .nodes
        .iter()
        .map(|n| {
            let cores = n.cores.iter().filter_map(|c| c.iter().map(|&p| p as usize).find(|p| allowed.contains(p)));
            (n.os_index as usize, cores.collect::<Vec<usize>>())
        })
        .filter(|(_, cores)| !cores.is_empty())
        .collect();
    if per_node.is_empty() {
        return Err(format!("none of the allowed CPUs {allowed:?} is in the topology ({})", topo.summary()));
    }
    let nodes: Vec<usize> = per_node.iter().map(|(n, _)| *n).collect();
    let node_cpus: Vec<Vec<usize>> = per_node.iter().map(|(_, c)| c.clone()).collect();
    let interleave = if nodes.len() > 1 { Place::Interleave(nodes.clone()) } else { Place::Any };
    Ok(match mode {
        NumaMode::Off => Placement { cpus: per_node.into_iter().flat_map(|(_, c)| c).collect(), memory: Place::Any, nodes, node_cpus },
        NumaMode::Tp => Placement { cpus: per_node.into_iter().flat_map(|(_, c)| c).collect(), memory: interleave, nodes, node_cpus },
        NumaMode::Distribute => {
            let most = per_node.iter().map(|(_, c)| c.len()).max().unwrap_or(0);
            let cpus = (0..most).flat_map(|i| per_node.iter().filter_map(move |(_, c)| c.get(i).copied())).collect();
            Placement { cpus, memory: interleave, nodes, node_cpus }
        }
        NumaMode::Isolate => {
            let node = topo.node_of_cpu(current as u32).map(|i| topo.nodes[i].os_index as usize);
            let Some((node, cpus)) = per_node.into_iter().find(|(n, _)| Some(*n) == node) else {
                return Err(format!(
                    "--numa isolate: the process started on CPU {current}, whose node has no allowed CPU \
                     (nodes with allowed CPUs: {nodes:?})"
                ));
            };
            Placement { node_cpus: vec![cpus.clone()], cpus, memory: Place::Node(node), nodes: vec![node] }
        }
    })
}

/// This machine's topology, read once per process (hwloc or `/sys` are not read again by later
/// loads or by [`physical_cores`]).
fn machine() -> Result<&'static Topology, String> {
    static MACHINE: std::sync::OnceLock<Result<Topology, String>> = std::sync::OnceLock::new();
    MACHINE.get_or_init(|| Topology::discover().map_err(|e| e.to_string())).as_ref().map_err(Clone::clone)
}

/// Plan `mode` on the machine this runs on (its topology, the process's allowed CPUs, the
/// calling thread's CPU). With `off`, a topology that cannot be read (or holds none of the
/// allowed CPUs) falls back to the allowed CPUs without placement.
pub fn this_machine(mode: NumaMode) -> Result<Placement, String> {
    let allowed = crate::threads::allowed_cpus();
    let planned = machine()
        .map_err(|e| format!("--numa {mode} needs the machine's topology: {e}"))
        .and_then(|t| plan(mode, t, &allowed, current_cpu()));
    match planned {
        Err(_) if mode == NumaMode::Off => Ok(Placement { node_cpus: vec![allowed.clone()], cpus: allowed, memory: Place::Any, nodes: vec![0] }),
        r => r,
    }
}

/// Physical cores among the allowed CPUs: the first allowed PU of each core, NUMA node by node
/// (so consecutive workers share a node) — the workers of `--numa off`.
pub fn physical_cores() -> Vec<usize> {
    this_machine(NumaMode::Off).map_or_else(|_| crate::threads::allowed_cpus(), |p| p.cpus)
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no arguments and only returns a number (or -1).
    let c = unsafe { libc::sched_getcpu() };
    c.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two nodes of four cores with two PUs each (siblings 8 apart), as a `/sys` tree.
    fn two_nodes() -> Topology {
        let dir = std::env::temp_dir().join(format!("corelm-placement-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        corelm_topo::sys::write_synthetic(&dir, 2, 4, 2).unwrap();
        let t = Topology::load(dir.to_str().unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        t
    }

    #[test]
    fn modes_on_two_nodes() {
        let t = two_nodes();
        let all: Vec<usize> = (0..16).collect();
        let off = plan(NumaMode::Off, &t, &all, 0).unwrap();
        assert_eq!(off.cpus, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(off.memory, Place::Any);
        let d = plan(NumaMode::Distribute, &t, &all, 0).unwrap();
        assert_eq!(d.cpus, [0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(d.memory, Place::Interleave(vec![0, 1]));
        let i = plan(NumaMode::Isolate, &t, &all, 13).unwrap();
        assert_eq!((i.cpus, i.memory, i.nodes), (vec![4, 5, 6, 7], Place::Node(1), vec![1]));
        // tp: one group per node on its cores; four shards, two per node; 3 workers a node.
        let tp = plan(NumaMode::Tp, &t, &all, 0).unwrap();
        assert_eq!(tp.memory, Place::Interleave(vec![0, 1]));
        assert_eq!(tp.tp_workers(&[4, 4]), (vec![0, 1, 2, 3, 4, 5, 6, 7], vec![0, 1]));
        assert_eq!(tp.tp_workers(&[2, 1, 2, 1]), (vec![0, 1, 2, 4, 5, 6], vec![0, 0, 1, 1]));
        assert_eq!(tp.tp_workers(&[3, 3]).0, [0, 1, 2, 4, 5, 6]);
        // A process allowed only some CPUs: siblings stand in for their core, node 0 is gone.
        let some = [12, 13, 6];
        assert_eq!(plan(NumaMode::Off, &t, &some, 6).unwrap().cpus, [12, 13, 6]);
        let e = plan(NumaMode::Isolate, &t, &some, 0).unwrap_err();
        assert!(e.contains("CPU 0") && e.contains("[1]"), "{e}");
        assert!("spread".parse::<NumaMode>().unwrap_err().contains("distribute"));
    }
}
