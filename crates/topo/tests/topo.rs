//! The readers against known machines: the shipped snapshots (counts, nesting, distances), a
//! fake two-node `/sys`, and hwloc against `/sys` on the machine the tests run on.

use corelm_topo::{Kind, Topology};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> String {
    format!("{}/../../fixtures/topo/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Children kinds of each level below the root, first object's chain: e.g. [Package,
/// NumaNode, L3, L2, Core, Pu].
fn chain(t: &Topology) -> Vec<Kind> {
    let mut out = Vec::new();
    let mut o = &t.root;
    while let Some(c) = o.children.first() {
        out.push(c.kind);
        o = c;
    }
    out
}

fn symmetric(d: &[Vec<u32>]) -> bool {
    (0..d.len()).all(|i| d[i][i] == 10 && (0..d.len()).all(|j| d[i][j] == d[j][i]))
}

/// Write a fake `/sys` with `nodes` nodes, `cores` cores per node, `smt` PUs per core (siblings
/// numbered `n_cores` apart, as Linux does), an L3 per node and an L2 per core.
fn fake_sys(dir: &Path, nodes: u32, cores: u32, smt: u32) {
    let w = |p: PathBuf, s: String| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s + "\n").unwrap();
    };
    let n_cores = nodes * cores;
    let sys = dir.join("devices/system");
    w(sys.join("cpu/online"), format!("0-{}", n_cores * smt - 1));
    for cpu in 0..n_cores * smt {
        let core = cpu % n_cores;
        let node = core / cores;
        let siblings: Vec<String> = (0..smt).map(|s| (core + s * n_cores).to_string()).collect();
        let node_cpus: Vec<String> =
            (0..smt).map(|s| format!("{}-{}", node * cores + s * n_cores, node * cores + cores - 1 + s * n_cores)).collect();
        let c = sys.join(format!("cpu/cpu{cpu}"));
        w(c.join("topology/physical_package_id"), node.to_string());
        w(c.join("topology/core_id"), (core % cores).to_string());
        w(c.join("topology/core_cpus_list"), siblings.join(","));
        for (i, (level, ty, size, shared)) in [
            (1, "Data", "32K", siblings.join(",")),
            (1, "Instruction", "32K", siblings.join(",")),
            (2, "Unified", "1024K", siblings.join(",")),
            (3, "Unified", "32768K", node_cpus.join(",")),
        ]
        .into_iter()
        .enumerate()
        {
            let idx = c.join(format!("cache/index{i}"));
            w(idx.join("level"), level.to_string());
            w(idx.join("type"), ty.to_string());
            w(idx.join("size"), size.to_string());
            w(idx.join("shared_cpu_list"), shared);
        }
    }
    for node in 0..nodes {
        let d = sys.join(format!("node/node{node}"));
        let cpus: Vec<String> =
            (0..smt).map(|s| format!("{}-{}", node * cores + s * n_cores, node * cores + cores - 1 + s * n_cores)).collect();
        w(d.join("cpulist"), cpus.join(","));
        w(d.join("meminfo"), format!("Node {node} MemTotal:       {} kB\nNode {node} MemFree: 1 kB", 8 << 20));
        let row: Vec<String> = (0..nodes).map(|j| if j == node { "10".into() } else { "21".into() }).collect();
        w(d.join("distance"), row.join(" "));
    }
}

#[test]
fn a_two_node_sys_tree_reads_as_two_nodes() {
    let dir = std::env::temp_dir().join(format!("corelm-topo-sys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    fake_sys(&dir, 2, 4, 2);
    let t = Topology::load(dir.to_str().unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(chain(&t), [Kind::Package, Kind::NumaNode, Kind::L3, Kind::L2, Kind::Core, Kind::Pu]);
    assert_eq!((t.n_packages(), t.nodes.len(), t.n_cores(), t.n_pus()), (2, 2, 8, 16));
    assert_eq!(t.nodes[1].cores[0], [4, 12]);
    assert_eq!(t.nodes[1].first_pus(), [4, 5, 6, 7]);
    assert_eq!(t.nodes[0].memory, 8 << 30);
    assert_eq!(t.distances, [[10, 21], [21, 10]]);
    assert_eq!(t.node_of_cpu(13), Some(1));
    let l3 = t.root.all(Kind::L3);
    assert_eq!((l3.len(), l3[0].bytes, l3[0].cpus.to_string().as_str()), (2, 32 << 20, "0-3,8-11"));
}

#[test]
fn this_machines_sys_reads() {
    let t = Topology::load("/sys").unwrap();
    assert!(t.n_pus() >= 1 && t.n_cores() >= 1 && !t.nodes.is_empty());
    assert!(symmetric(&t.distances));
    let text = t.to_string();
    assert!(text.contains("NUMANode") && text.contains("PU P#0"), "{text}");
}

#[cfg(feature = "hwloc")]
mod hwloc {
    use super::*;

    #[test]
    fn hwloc_and_sys_give_the_same_tree_here() {
        let hw = Topology::discover().unwrap();
        let sys = Topology::load("/sys").unwrap();
        assert_eq!(hw.source, "hwloc");
        assert_eq!(hw.root, sys.root, "hwloc:\n{hw}\n/sys:\n{sys}");
        assert_eq!(hw.nodes, sys.nodes);
        assert_eq!(hw.distances, sys.distances);
    }

    #[test]
    fn kunpeng_snapshot() {
        let t = Topology::load(&fixture("kunpeng920-4p.xml")).unwrap();
        assert_eq!((t.n_packages(), t.nodes.len(), t.n_cores(), t.n_pus()), (4, 8, 192, 192));
        assert_eq!(chain(&t), [Kind::Package, Kind::NumaNode, Kind::L3, Kind::L2, Kind::Core, Kind::Pu]);
        assert!(t.nodes.iter().all(|n| n.cores.len() == 24 && n.memory == 64 << 30));
        assert_eq!(t.nodes[3].first_pus(), (72..96).collect::<Vec<u32>>());
        assert_eq!(t.root.all(Kind::L3).iter().map(|o| o.bytes).collect::<Vec<_>>(), [24 << 20; 8]);
        assert!(symmetric(&t.distances));
        assert_eq!(t.distances[0], [10, 12, 20, 22, 24, 26, 20, 22]);
    }

    #[test]
    fn epyc_snapshot_numbers_smt_siblings_apart() {
        let t = Topology::load(&fixture("epyc7h12-2p.xml")).unwrap();
        assert_eq!((t.n_packages(), t.nodes.len(), t.n_cores(), t.n_pus()), (2, 2, 128, 256));
        assert_eq!(t.root.all(Kind::L3).len(), 32);
        assert_eq!(t.nodes[0].cores[0], [0, 128]);
        assert_eq!(t.nodes[1].first_pus(), (64..128).collect::<Vec<u32>>());
        assert_eq!(t.distances, [[10, 32], [32, 10]]);
    }

    #[test]
    fn xeon_snapshot() {
        let t = Topology::load(&fixture("xeon6230-2p.xml")).unwrap();
        assert_eq!((t.n_packages(), t.nodes.len(), t.n_cores(), t.n_pus()), (2, 2, 40, 80));
        assert_eq!(t.nodes[1].cores[0], [20, 60]);
        assert_eq!(t.root.all(Kind::L3)[0].bytes, 55 << 19);
        assert_eq!(t.distances, [[10, 21], [21, 10]]);
    }

    #[test]
    fn this_machine_snapshot() {
        let t = Topology::load(&fixture("this-machine.xml")).unwrap();
        assert_eq!((t.nodes.len(), t.n_cores(), t.n_pus()), (1, 2, 2));
        assert_eq!(t.distances, [[10]]);
    }

    #[test]
    fn synthetic_descriptions_and_bad_input() {
        let t = Topology::load("pack:2 numa:2 l3:1 core:4 pu:2").unwrap();
        assert_eq!((t.n_packages(), t.nodes.len(), t.n_cores(), t.n_pus()), (2, 4, 16, 32));
        assert_eq!(t.distances[0], [10, 20, 20, 20], "no matrix: Linux's default");
        let e = Topology::load("no-such-thing:3").unwrap_err().to_string();
        assert!(e.contains("synthetic description"), "{e}");
        let bad = std::env::temp_dir().join(format!("corelm-topo-bad-{}.xml", std::process::id()));
        std::fs::write(&bad, "<topology><object type=").unwrap();
        let e = Topology::load(bad.to_str().unwrap()).unwrap_err().to_string();
        std::fs::remove_file(&bad).unwrap();
        assert!(e.contains("not an hwloc XML topology"), "{e}");
    }
}

#[cfg(not(feature = "hwloc"))]
#[test]
fn xml_without_hwloc_is_refused_by_name() {
    let e = Topology::load(&fixture("kunpeng920-4p.xml")).unwrap_err().to_string();
    assert!(e.contains("needs hwloc") && e.contains("kunpeng920-4p.xml"), "{e}");
}
