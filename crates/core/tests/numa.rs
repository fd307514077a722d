//! NUMA placement read back from the kernel, not assumed: every node of the machine's topology
//! gets a bound buffer whose pages `move_pages`, `get_mempolicy` and `/proc/self/numa_maps` all
//! place on that node; an interleaved buffer spreads over every node. On a one-node machine
//! this checks node 0; `scripts/numa_qemu.sh` runs it in a two-node guest.

#![cfg(target_os = "linux")]

use corelm_core::memory::{Buffer, Place};
use corelm_core::numa::{numa_maps_counts, numa_maps_line, pages_per_node, policy_of, MPOL_BIND, MPOL_DEFAULT, MPOL_INTERLEAVE};
use corelm_topo::Topology;
use std::collections::BTreeSet;

const LEN: usize = 16 << 20;

fn memory_nodes() -> Vec<usize> {
    let t = Topology::discover().expect("this machine's topology");
    t.nodes.iter().filter(|n| n.memory > 0).map(|n| n.os_index as usize).collect()
}

#[test]
fn a_bound_buffer_is_on_its_node_by_every_account() {
    for node in memory_nodes() {
        let b = Buffer::new(LEN, &Place::Node(node)).unwrap();
        assert_eq!(b.node(), Some(node));
        assert_eq!(policy_of(b.as_ptr() as usize).unwrap(), (MPOL_BIND, vec![node]));
        let pages = pages_per_node(b.as_ptr() as usize, b.len(), 4096).unwrap();
        assert_eq!(pages.keys().copied().collect::<Vec<i32>>(), [node as i32], "pages by node: {pages:?}");
        let line = numa_maps_line(b.as_ptr() as usize).expect("the mapping in /proc/self/numa_maps");
        assert!(line.contains(&format!("bind:{node}")), "{line}");
        let counts = numa_maps_counts(&line);
        assert_eq!(counts.keys().copied().collect::<Vec<usize>>(), [node], "{line}");
        println!("node {node}: {line}");
    }
}

#[test]
fn an_interleaved_buffer_spreads_over_every_node() {
    let nodes = memory_nodes();
    let b = Buffer::new(LEN, &Place::Interleave(nodes.clone())).unwrap();
    assert_eq!(policy_of(b.as_ptr() as usize).unwrap(), (MPOL_INTERLEAVE, nodes.clone()));
    let pages = pages_per_node(b.as_ptr() as usize, b.len(), 4096).unwrap();
    let on: BTreeSet<usize> = pages.keys().map(|&n| n as usize).collect();
    assert_eq!(on, nodes.iter().copied().collect(), "pages by node: {pages:?}");
    let line = numa_maps_line(b.as_ptr() as usize).unwrap();
    assert!(line.contains("interleave:"), "{line}");
}

#[test]
fn unplaced_and_lazy_buffers() {
    let b = Buffer::new(LEN, &Place::Any).unwrap();
    assert_eq!(policy_of(b.as_ptr() as usize).unwrap().0, MPOL_DEFAULT);
    assert!(pages_per_node(b.as_ptr() as usize, b.len(), 64).unwrap().keys().all(|&n| n >= 0));
    // Not faulted in yet: move_pages reports no node for its pages (-ENOENT; Linux 6.1 says
    // -EFAULT).
    let lazy = Buffer::lazy(LEN, &Place::Node(memory_nodes()[0])).unwrap();
    let pages = pages_per_node(lazy.as_ptr() as usize, lazy.len(), 64).unwrap();
    assert!(pages.keys().all(|&s| s == -libc::ENOENT || s == -libc::EFAULT), "{pages:?}");
    // Small placed buffers are mappings of their own too.
    let small = Buffer::new(100, &Place::Node(memory_nodes()[0])).unwrap();
    assert_eq!(policy_of(small.as_ptr() as usize).unwrap().0, MPOL_BIND);
}

#[test]
fn a_node_that_does_not_exist_is_an_error_naming_it() {
    let e = Buffer::new(LEN, &Place::Node(1000)).err().expect("no buffer on node 1000").to_string();
    assert!(e.contains("Node(1000)") && e.contains("mbind"), "{e}");
}

#[test]
fn parts_of_one_buffer_are_placed_separately() {
    // Two halves on the first and the last node (the same node on a one-node machine).
    let nodes = memory_nodes();
    let (a, b) = (nodes[0], *nodes.last().unwrap());
    let place = Place::Parts(vec![(0, Place::Node(a)), (LEN / 2, Place::Node(b))]);
    let buf = Buffer::new(LEN, &place).unwrap();
    let base = buf.as_ptr() as usize;
    assert_eq!(policy_of(base).unwrap(), (MPOL_BIND, vec![a]));
    assert_eq!(policy_of(base + LEN / 2).unwrap(), (MPOL_BIND, vec![b]));
    let first = pages_per_node(base, LEN / 2, 1024).unwrap();
    let second = pages_per_node(base + LEN / 2, LEN / 2, 1024).unwrap();
    assert_eq!((first.keys().copied().collect::<Vec<i32>>(), second.keys().copied().collect::<Vec<i32>>()), (vec![a as i32], vec![b as i32]));
    println!("halves on nodes {a} and {b}: {first:?} {second:?}");
}
