//! Sandwich's configuration search on known trees: the transforms on a synthetic two-node
//! machine, and the exploration of the shipped snapshots with their stated profiles (counts of
//! trees and configurations, and the answers the paper reports: Kunpeng's decode drops a core
//! per 4-core cluster, EPYC cuts TP over groups of L3 domains, prefill keeps every core).

use corelm_topo::sandwich::*;
use corelm_topo::Topology;

/// A `/sys` copy of `nodes` × `cores` (SMT 2), read back.
fn synthetic(nodes: u32, cores: u32) -> Topology {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("corelm-sandwich-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    corelm_topo::sys::write_synthetic(&dir, nodes, cores, 2).unwrap();
    let t = corelm_topo::sys::read(&dir, "synthetic").unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    t
}

#[test]
fn topotree_collapses_chains_and_keeps_cores_as_leaves() {
    let t = synthetic(2, 8);
    let tree = TNode::from_topology(&t);
    println!("{tree}");
    assert_eq!(tree.n_cores(), 16);
    assert_eq!(tree.height(), 2, "machine → node (+ package + L3) → core");
    assert_eq!(tree.cut(1).len(), 2);
    assert_eq!(tree.cut(1).iter().map(|n| n.numa).collect::<Vec<_>>(), vec![Some(0), Some(1)]);
    assert_eq!(tree.numa, None, "the root spans both nodes");
    // Leaves are the first PU of each core (SMT siblings are not workers).
    assert_eq!(tree.pus().len(), 16);
}

#[test]
fn group_and_remove_rewrite_every_node_at_their_depth() {
    let tree = TNode::from_topology(&synthetic(2, 8));
    // Consecutive pairs, then interleaved pairs (stride 4: cores j and j+4).
    let g = tree.apply(Transform::Group { n: 2, stride: 1, depth: 1 }).unwrap();
    assert_eq!(g.height(), 3);
    assert_eq!(g.cut(2).iter().map(|n| n.pus()).take(2).collect::<Vec<_>>(), vec![vec![0, 1], vec![2, 3]]);
    let s = tree.apply(Transform::Group { n: 2, stride: 4, depth: 1 }).unwrap();
    assert_eq!(s.cut(2).iter().map(|n| n.pus()).take(4).collect::<Vec<_>>(), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    assert_eq!(s.cut(2).len(), 8);
    // Remove the right-most core of every pair: 8 cores left, 0, 2, 4, … on node 0.
    let r = g.apply(Transform::Remove { n: 1, depth: 2 }).unwrap();
    assert_eq!(r.n_cores(), 8);
    assert_eq!(r.pus(), vec![0, 2, 4, 6, 8, 10, 12, 14]);
    assert_eq!(r.cut(1).iter().map(|n| n.numa).collect::<Vec<_>>(), vec![Some(0), Some(1)]);
    // What cannot apply to every node at the depth is refused.
    assert!(tree.apply(Transform::Group { n: 3, stride: 1, depth: 1 }).is_none(), "8 cores in groups of 3");
    assert!(tree.apply(Transform::Group { n: 2, stride: 3, depth: 1 }).is_none(), "runs of 6 in 8");
    assert!(tree.apply(Transform::Group { n: 8, stride: 1, depth: 1 }).is_none(), "one group of all is no level");
    assert!(tree.apply(Transform::Remove { n: 2, depth: 0 }).is_none(), "the root has two children");
    assert!(tree.apply(Transform::Remove { n: 1, depth: 2 }).is_none(), "cores have no children");
}

#[test]
fn shape_hash_ignores_which_cores_and_sees_the_shape() {
    let tree = TNode::from_topology(&synthetic(2, 8));
    let drop_right = tree.apply(Transform::Remove { n: 2, depth: 1 }).unwrap();
    // The same shape by another route: groups of two, then one core of a pair dropped,
    // versus two cores dropped outright — different shapes (a group level), different hashes.
    let other = tree.apply(Transform::Group { n: 2, stride: 1, depth: 1 }).unwrap();
    assert_ne!(drop_right.shape_hash(), other.shape_hash());
    // Sibling order does not matter: reversing every node's children keeps the hash.
    fn reverse(n: &mut TNode) {
        n.children.reverse();
        n.children.iter_mut().for_each(reverse);
    }
    let mut rev = drop_right.clone();
    reverse(&mut rev);
    assert_ne!(rev.pus(), drop_right.pus());
    assert_eq!(rev.shape_hash(), drop_right.shape_hash());
    // Stable across builds (FNV-1a, not the std hasher): a plan file may keep it.
    assert_eq!(tree.shape_hash(), TNode::from_topology(&synthetic(2, 8)).shape_hash());
}

#[test]
fn cross_sections_are_configurations_within_the_models_limits() {
    let tree = TNode::from_topology(&synthetic(2, 8));
    let g = tree.apply(Transform::Group { n: 4, stride: 1, depth: 1 }).unwrap();
    let all = configs(&g, &Limits::for_model(32, 0));
    let shape: Vec<(usize, usize, bool)> = all.iter().map(|c| (c.tp(), c.cores_per_group(), c.numa_local())).collect();
    assert_eq!(shape, vec![(1, 16, false), (2, 8, true), (4, 4, true), (16, 1, true)]);
    // SmolLM2's 9 query heads: no cut into 16 groups.
    let smol = configs(&g, &Limits::for_model(9, 0));
    assert_eq!(smol.iter().map(ServiceConfig::tp).collect::<Vec<_>>(), vec![1, 2, 4]);
    // A mixture of 3 experts bounds it further.
    let moe = configs(&g, &Limits::for_model(32, 3));
    assert_eq!(moe.iter().map(ServiceConfig::tp).collect::<Vec<_>>(), vec![1, 2]);
    // Uneven cuts (a leaf above the cut depth beside a subtree) are not configurations.
    assert!(all.iter().all(|c| c.groups.iter().all(|x| x.len() == c.cores_per_group())));
    // The same groups from two trees are one configuration.
    let twice = dedup(all.iter().cloned().chain(configs(&tree, &Limits::for_model(32, 0))));
    assert_eq!(twice.len(), 4, "{:?}", twice.iter().map(ServiceConfig::describe).collect::<Vec<_>>());
}

#[test]
fn search_stops_a_class_after_patience_misses() {
    let tree = TNode::from_topology(&synthetic(2, 8));
    // Every tree reachable in two steps, and its configurations.
    let ex = explore(tree, 2, 10_000, |_| 0.0);
    let all = dedup(ex.trees.iter().flat_map(|e| configs(&e.tree, &Limits::for_model(32, 0))));
    // A score that is best with the most cores: after the first of a class, every one misses.
    let score = |c: &ServiceConfig| 1.0 / c.n_cores() as f64;
    let full = search(&all, 0, score);
    let early = search(&all, 2, score);
    assert_eq!(full.scored, all.len());
    assert_eq!(early.scored + early.skipped, all.len());
    assert!(early.skipped > 0);
    assert_eq!(early.best.as_ref().map(|b| b.1), full.best.as_ref().map(|b| b.1), "the best of each class comes first");
    // Per class at most 1 + patience scored.
    let mut classes: Vec<(usize, bool)> = all.iter().map(ServiceConfig::class).collect();
    classes.sort();
    classes.dedup();
    assert!(early.scored <= classes.len() * 3);
}

/// The snapshots with hwloc (XML needs it).
#[cfg(feature = "hwloc")]
mod snapshots {
    use super::*;

    fn load(name: &str) -> Topology {
        Topology::load(&format!("{}/../../fixtures/topo/{name}.xml", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    /// A 7B Llama-2-class model in 4-bit weights with grouped KV heads (stated, not a file): 3.8 GB
    /// read per pass, 13.4 GFLOP per token, 32 layers of ~20 nodes and 2 gathers.
    const W7B: Workload = Workload {
        weight_bytes: 3.8e9,
        flops_per_token: 13.4e9,
        layers: 32,
        n_head: 32,
        n_kv_head: 8,
        kv_bytes: 0.15e9,
        d_model: 4096,
        nodes_per_layer: 20,
        gathers_per_layer: 2,
    };

    struct Plan {
        ex: Exploration,
        candidates: Vec<ServiceConfig>,
        best: (ServiceConfig, f64),
    }

    /// Explore `name` for a pass of `tokens` rows, three transforms deep, scoring each tree by
    /// its best configuration under the stated profile.
    fn plan(topo: &Topology, name: &str, tokens: usize) -> Plan {
        let prof = MachineProfile::stated(name).unwrap();
        let lim = Limits::for_model(W7B.n_head, 0);
        let score = |c: &ServiceConfig| pass_seconds(topo, &prof, &W7B, c, tokens);
        let (ex, candidates) = corelm_topo::sandwich::candidates(TNode::from_topology(topo), 3, 20_000, &lim, score);
        let best = search(&candidates, 0, score).best.unwrap();
        println!(
            "{name} ({tokens} rows): {} trees, {} duplicates, {} pruned, {} configurations; best {:.3} ms {}",
            ex.trees.len(),
            ex.duplicates,
            ex.pruned,
            candidates.len(),
            1e3 * best.1,
            best.0.describe()
        );
        Plan { ex, candidates, best }
    }

    #[test]
    fn kunpeng_decode_drops_a_core_per_cluster_and_prefill_keeps_all() {
        let topo = load("kunpeng920-4p");
        let decode = plan(&topo, "kunpeng920-4p", 1);
        let prefill = plan(&topo, "kunpeng920-4p", 512);
        // One core of every 4-core cluster removed, TP per NUMA node: found only through
        // group(4, 1, ·) (hwloc shows no clusters) then remove(1, ·).
        let three_of_four = |c: &ServiceConfig| {
            c.tp() == 8
                && c.cores_per_group() == 18
                && c.groups.iter().all(|g| g.iter().all(|&p| p % 4 != 3) && g.iter().all(|&p| g.contains(&(p / 4 * 4))))
        };
        assert!(decode.candidates.iter().any(three_of_four));
        let via: Vec<String> = decode
            .ex
            .trees
            .iter()
            .enumerate()
            .filter(|(_, e)| configs(&e.tree, &Limits::for_model(32, 0)).iter().any(three_of_four))
            .map(|(i, _)| decode.ex.path(i).iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" "))
            .collect();
        assert!(via.iter().any(|p| p.contains("group(4, 1, 2)") && p.contains("remove(1, 3)")), "{via:?}");
        // The phases choose differently: decode gives up cores, prefill uses all 192.
        assert_eq!(prefill.best.0.n_cores(), 192);
        assert!(decode.best.0.n_cores() < 192 && decode.best.0.numa_local(), "{}", decode.best.0.describe());
        // Counts of the exploration (a change in the transforms or the pruning shows here).
        assert_eq!((decode.ex.trees.len(), decode.candidates.len()), (2152, 1163));
        assert_eq!((prefill.ex.trees.len(), prefill.candidates.len()), (1298, 354));
    }

    #[test]
    fn epyc_cuts_tp_over_groups_of_l3_domains() {
        let topo = load("epyc7h12-2p");
        let decode = plan(&topo, "epyc7h12-2p", 1);
        let prefill = plan(&topo, "epyc7h12-2p", 512);
        // L3 domains are 4 consecutive cores (PUs 4k..4k+3): TP groups made of whole ones.
        let whole_l3s = |c: &ServiceConfig| {
            (2..32).contains(&c.tp())
                && c.cores_per_group() >= 8
                && c.groups.iter().all(|g| g.iter().all(|&p| (0..4).all(|j| g.contains(&(p / 4 * 4 + j)))))
        };
        let n = decode.candidates.iter().filter(|c| whole_l3s(c)).count();
        assert!(n >= 4, "{n} configurations of whole L3 groups");
        assert_eq!(prefill.best.0.n_cores(), 128);
        assert!(decode.best.0.n_cores() < 128);
        assert_eq!((decode.ex.trees.len(), decode.candidates.len()), (958, 765));
    }

    #[test]
    fn every_snapshot_plans_both_phases() {
        for name in ["kunpeng920-4p", "epyc7h12-2p", "xeon6230-2p", "xeon6151-2p", "xeon8272cl-2p"] {
            let topo = load(name);
            let (d, p) = (plan(&topo, name, 1), plan(&topo, name, 512));
            assert_eq!(p.best.0.n_cores(), topo.n_cores(), "{name}: prefill is compute-bound");
            assert!(d.best.0.n_cores() <= p.best.0.n_cores(), "{name}");
            assert!(d.best.0.numa_local(), "{name}: decode reads node-local memory");
            assert!(d.ex.duplicates > 0 && d.ex.pruned > 0, "{name}: hashing and pruning both cut work");
        }
        // This machine: one node of two cores, three configurations.
        let here = load("this-machine");
        let tree = TNode::from_topology(&here);
        let ex = explore(tree, 3, 100, |_| 1.0);
        let all = dedup(ex.trees.iter().flat_map(|e| configs(&e.tree, &Limits::for_model(9, 0))));
        assert_eq!(all.iter().map(|c| (c.tp(), c.n_cores())).collect::<Vec<_>>(), vec![(1, 2), (2, 2), (1, 1)]);
    }
}
