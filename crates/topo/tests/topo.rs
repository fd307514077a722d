//! The readers against known machines: the shipped snapshots (counts, nesting, distances), a
//! fake two-node `/sys`, and hwloc against `/sys` on the machine the tests run on.

use corelm_topo::{Kind, Topology};

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

#[test]
fn a_two_node_sys_tree_reads_as_two_nodes() {
    let dir = std::env::temp_dir().join(format!("corelm-topo-sys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    corelm_topo::sys::write_synthetic(&dir, 2, 4, 2).unwrap();
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
