//! The `/sys` reader: Linux's own view of packages, cores, caches and NUMA nodes, for builds
//! without hwloc and as hwloc's fallback. It reads below a root directory (`/sys` for this
//! machine), so a saved copy of another machine's files plans as that machine — and tests
//! write small synthetic trees ([`write_synthetic`]).
//!
//! Files read, all under `<root>/devices/system/`:
//! `cpu/online`; per CPU `cpu/cpuN/topology/{physical_package_id, core_id, core_cpus_list}`
//! (older kernels: `thread_siblings_list`) and `cpu/cpuN/cache/indexK/{level, type, size,
//! shared_cpu_list}`; per node `node/nodeN/{cpulist, meminfo, distance}`.

use crate::tree::{Kind, Obj};
use crate::{CpuSet, TopoError, Topology};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn read_text(path: &Path) -> Result<String, TopoError> {
    std::fs::read_to_string(path).map_err(|source| TopoError::Io { path: path.display().to_string(), source })
}

fn parse_err(path: &Path, what: impl Into<String>) -> TopoError {
    TopoError::Parse { path: path.display().to_string(), what: what.into() }
}

fn cpulist(path: &Path) -> Result<CpuSet, TopoError> {
    let text = read_text(path)?;
    CpuSet::parse_list(&text).ok_or_else(|| parse_err(path, format!("not a CPU list: {:?}", text.trim())))
}

fn number(path: &Path) -> Result<i64, TopoError> {
    let text = read_text(path)?;
    text.trim().parse().map_err(|_| parse_err(path, format!("not a number: {:?}", text.trim())))
}

/// `32768K`, `1M`, `512` → bytes.
fn size(path: &Path) -> Result<u64, TopoError> {
    let text = read_text(path)?;
    let t = text.trim();
    let (digits, mult) = match t.as_bytes().last() {
        Some(b'K') => (&t[..t.len() - 1], 1 << 10),
        Some(b'M') => (&t[..t.len() - 1], 1 << 20),
        Some(b'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits.parse::<u64>().map(|v| v * mult).map_err(|_| parse_err(path, format!("not a size: {t:?}")))
}

/// Numbered entries `<dir>/<prefix>N`, sorted by N.
fn numbered(dir: &Path, prefix: &str) -> Vec<(u32, PathBuf)> {
    let mut out: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix(prefix)?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Read the topology below `root` (a `/sys` directory); `source` names it in messages.
pub fn read(root: &Path, source: &str) -> Result<Topology, TopoError> {
    let sys = root.join("devices/system");
    let cpu_dir = sys.join("cpu");
    let online = match cpulist(&cpu_dir.join("online")) {
        Ok(set) => set,
        Err(_) => CpuSet::new(numbered(&cpu_dir, "cpu").into_iter().map(|(n, _)| n).collect()),
    };
    let mut flat = Vec::new();
    let mut packages: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
    let mut cores: BTreeMap<CpuSet, u32> = BTreeMap::new();
    let mut caches: BTreeMap<(Kind, CpuSet), u64> = BTreeMap::new();
    for &cpu in online.as_slice() {
        let dir = cpu_dir.join(format!("cpu{cpu}"));
        let topo = dir.join("topology");
        packages.entry(number(&topo.join("physical_package_id"))?).or_default().push(cpu);
        let siblings = cpulist(&topo.join("core_cpus_list")).or_else(|_| cpulist(&topo.join("thread_siblings_list")))?;
        let core_id = number(&topo.join("core_id"))?;
        cores.entry(siblings).or_insert(core_id.max(0) as u32);
        for (_, index) in numbered(&dir.join("cache"), "index") {
            let kind = match number(&index.join("level"))? {
                2 => Kind::L2,
                3 => Kind::L3,
                _ => continue,
            };
            if read_text(&index.join("type"))?.trim() == "Instruction" {
                continue;
            }
            let shared = cpulist(&index.join("shared_cpu_list"))?;
            let bytes = size(&index.join("size"))?;
            caches.insert((kind, shared), bytes);
        }
        flat.push(Obj::leaf(Kind::Pu, Some(cpu), CpuSet::new(vec![cpu]), 0));
    }
    for (id, cpus) in packages {
        flat.push(Obj::leaf(Kind::Package, Some(id.max(0) as u32), CpuSet::new(cpus), 0));
    }
    for (cpus, id) in cores {
        flat.push(Obj::leaf(Kind::Core, Some(id), cpus, 0));
    }
    for ((kind, cpus), bytes) in caches {
        // A cache line listing CPUs that are offline keeps only the online ones.
        let cpus = CpuSet::new(cpus.as_slice().iter().copied().filter(|&c| online.contains(c)).collect());
        flat.push(Obj::leaf(kind, None, cpus, bytes));
    }
    let nodes = numbered(&sys.join("node"), "node");
    let mut distances = Vec::new();
    for (n, dir) in &nodes {
        let cpus = cpulist(&dir.join("cpulist"))?;
        let cpus = CpuSet::new(cpus.as_slice().iter().copied().filter(|&c| online.contains(c)).collect());
        flat.push(Obj::leaf(Kind::NumaNode, Some(*n), cpus, node_memory(&dir.join("meminfo"))?));
        let row = read_text(&dir.join("distance"))?;
        let row: Option<Vec<u32>> = row.split_whitespace().map(|d| d.parse().ok()).collect();
        distances.push(row.ok_or_else(|| parse_err(&dir.join("distance"), "not a list of numbers"))?);
    }
    Topology::assemble(source.to_string(), flat, (!nodes.is_empty()).then_some(distances))
}

/// `Node 0 MemTotal:  10053852 kB` → bytes.
fn node_memory(path: &Path) -> Result<u64, TopoError> {
    let text = read_text(path)?;
    let line = text.lines().find(|l| l.contains("MemTotal:")).ok_or_else(|| parse_err(path, "no MemTotal line"))?;
    let kb = line.split_whitespace().rev().nth(1).and_then(|v| v.parse::<u64>().ok());
    kb.map(|kb| kb * 1024).ok_or_else(|| parse_err(path, format!("bad MemTotal line: {line:?}")))
}

/// Write a `/sys` tree below `dir` for a machine of `nodes` NUMA nodes (one package each) of
/// `cores` cores with `smt` PUs each — numbered as Linux numbers them, SMT siblings
/// `nodes · cores` apart — an L2 per core, a 32 MiB L3 per node, 8 GiB per node and distances
/// 10/21: a multi-node machine for tests of what plans by topology, with or without hwloc.
pub fn write_synthetic(dir: &Path, nodes: u32, cores: u32, smt: u32) -> std::io::Result<()> {
    let w = |p: PathBuf, s: String| -> std::io::Result<()> {
        std::fs::create_dir_all(p.parent().expect("a file below dir"))?;
        std::fs::write(p, s + "\n")
    };
    let n_cores = nodes * cores;
    // PUs of node n: each SMT sibling's range of its cores.
    let node_cpus = |n: u32| -> String {
        (0..smt).map(|s| format!("{}-{}", n * cores + s * n_cores, n * cores + cores - 1 + s * n_cores)).collect::<Vec<_>>().join(",")
    };
    let sys = dir.join("devices/system");
    w(sys.join("cpu/online"), format!("0-{}", n_cores * smt - 1))?;
    for cpu in 0..n_cores * smt {
        let core = cpu % n_cores;
        let node = core / cores;
        let siblings = (0..smt).map(|s| (core + s * n_cores).to_string()).collect::<Vec<_>>().join(",");
        let c = sys.join(format!("cpu/cpu{cpu}"));
        w(c.join("topology/physical_package_id"), node.to_string())?;
        w(c.join("topology/core_id"), (core % cores).to_string())?;
        w(c.join("topology/core_cpus_list"), siblings.clone())?;
        for (i, (level, ty, size, shared)) in [
            (1, "Data", "32K", siblings.clone()),
            (1, "Instruction", "32K", siblings.clone()),
            (2, "Unified", "1024K", siblings),
            (3, "Unified", "32768K", node_cpus(node)),
        ]
        .into_iter()
        .enumerate()
        {
            let idx = c.join(format!("cache/index{i}"));
            w(idx.join("level"), level.to_string())?;
            w(idx.join("type"), ty.to_string())?;
            w(idx.join("size"), size.to_string())?;
            w(idx.join("shared_cpu_list"), shared)?;
        }
    }
    for node in 0..nodes {
        let d = sys.join(format!("node/node{node}"));
        w(d.join("cpulist"), node_cpus(node))?;
        w(d.join("meminfo"), format!("Node {node} MemTotal:       {} kB\nNode {node} MemFree: 1 kB", 8 << 20))?;
        let row: Vec<&str> = (0..nodes).map(|j| if j == node { "10" } else { "21" }).collect();
        w(d.join("distance"), row.join(" "))?;
    }
    Ok(())
}
