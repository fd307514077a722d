//! A latency model of one forward pass under a service configuration, for planning a machine
//! that is not this one (a snapshot) — Sandwich measures on the machine; this stands in where
//! it cannot, and is checked against measurements where both exist.
//!
//! Each TP group streams its share of the weights and computes its share of the FLOPs; its
//! time is the larger of the two (a roofline per group), the pass waits for the slowest group,
//! and barriers are added: `nodes_per_layer` group barriers and `gathers_per_layer` global ones
//! per layer, a barrier costing more with more threads and more still across NUMA nodes.
//! Bandwidth of a group: its cores' own (`core_gbps` each), capped per cluster of cores that
//! share a memory path (Kunpeng 920's 4-core L3-tag clusters) and per NUMA node (shared by the
//! groups on it). A group inside one node reads local memory (`--numa tp` puts its shard
//! there); a group spanning nodes reads pages interleaved over them, remote ones at
//! `remote_ratio` of the local rate.
//!
//! Decode passes are memory-bound and prefill passes compute-bound in this model for the same
//! reason they are on the hardware, so the two phases choose different configurations: decode
//! gives up a core where its cluster's bandwidth is already saturated (fewer threads per
//! barrier), prefill keeps every core.

use super::config::ServiceConfig;
use crate::Topology;

/// Cores sharing one memory path, and what it carries.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cluster {
    /// Consecutive cores of a NUMA node's core list per cluster.
    pub cores: usize,
    pub gbps: f64,
}

/// A machine's performance, measured (`corelm tune` on the machine) or stated (a snapshot).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MachineProfile {
    pub name: String,
    /// Compute of one core on the prefill kernels (int8 dot products), GFLOP/s.
    pub core_gflops: f64,
    /// Read bandwidth one core pulls alone, GB/s.
    pub core_gbps: f64,
    /// Read bandwidth of one NUMA node's memory with all its cores reading, GB/s.
    pub node_gbps: f64,
    /// Remote over local read bandwidth (0..1].
    pub remote_ratio: f64,
    pub cluster: Option<Cluster>,
    /// One barrier of 2 threads, ns; added per doubling of the threads; added when the
    /// threads span NUMA nodes.
    pub barrier_ns: f64,
    pub barrier_ns_per_doubling: f64,
    pub barrier_ns_cross_node: f64,
}

impl MachineProfile {
    /// Stated profiles of the shipped snapshots (`fixtures/topo/<name>.xml`), from public
    /// specifications and published measurements, not measured here: compute at 2 int8 ops
    /// per sdot/VNNI lane per cycle at the all-core clock, node bandwidth at about 75 % of the
    /// channels' peak, one core's bandwidth from single-thread STREAM figures.
    pub fn stated(snapshot: &str) -> Option<MachineProfile> {
        let p = |name: &str, core_gflops, core_gbps, node_gbps, remote_ratio, cluster| MachineProfile {
            name: name.to_string(),
            core_gflops,
            core_gbps,
            node_gbps,
            remote_ratio,
            cluster,
            barrier_ns: 150.0,
            barrier_ns_per_doubling: 120.0,
            barrier_ns_cross_node: 400.0,
        };
        Some(match snapshot {
            // 2.6 GHz, 2×128-bit NEON (sdot: 32 int8 MACs/cycle); 4 DDR4-2933 channels per die
            // (94 GB/s peak); a 4-core cluster's path to the L3 tag saturates near 3 cores.
            "kunpeng920-4p" => p(snapshot, 166.0, 12.0, 70.0, 0.45, Some(Cluster { cores: 4, gbps: 30.0 })),
            // 2.6 GHz, AVX2 (no VNNI: 32 int8 MACs/cycle via maddubs); 8 DDR4-3200 channels per
            // socket (205 GB/s peak); a CCX's fabric link carries ~50 GB/s.
            "epyc7h12-2p" => p(snapshot, 166.0, 20.0, 150.0, 0.55, Some(Cluster { cores: 4, gbps: 50.0 })),
            // 2.1 GHz all-core AVX-512 VNNI (2 FMA units: 128 int8 MACs/cycle); 6 DDR4-2933
            // channels per socket (141 GB/s peak).
            "xeon6230-2p" => p(snapshot, 538.0, 12.0, 105.0, 0.55, None),
            // 2.7 GHz AVX-512 without VNNI (maddubs: 64 int8 MACs/cycle); 6 DDR4-2666 channels.
            "xeon6151-2p" => p(snapshot, 346.0, 12.0, 96.0, 0.55, None),
            // 2.6 GHz AVX-512 VNNI; 6 DDR4-2933 channels per socket.
            "xeon8272cl-2p" => p(snapshot, 666.0, 12.0, 105.0, 0.55, None),
            _ => return None,
        })
    }

    /// A barrier of `threads` threads (none for one).
    fn barrier(&self, threads: usize, cross_node: bool) -> f64 {
        if threads <= 1 {
            return 0.0;
        }
        let doublings = (threads.max(2) as f64).log2() - 1.0;
        1e-9 * (self.barrier_ns + self.barrier_ns_per_doubling * doublings + if cross_node { self.barrier_ns_cross_node } else { 0.0 })
    }
}

/// What one forward pass of a model costs, independent of the machine.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// Weight bytes read per pass (all layers and the output matrix).
    pub weight_bytes: f64,
    /// FLOPs per token (2 per multiply-add of every matrix).
    pub flops_per_token: f64,
    pub layers: usize,
    /// Query heads: a TP degree that does not divide them leaves some shards a head more.
    pub n_head: usize,
    /// KV heads, and the bytes of the K and V projections among `weight_bytes`: past this
    /// many shards a KV head is replicated, so each shard reads 1/n_kv_head of them.
    pub n_kv_head: usize,
    pub kv_bytes: f64,
    /// Row length of the activations a gather sums (the model dimension).
    pub d_model: usize,
    /// Graph nodes (group barriers) per layer, and gathers (global barriers) per layer under
    /// tensor parallelism.
    pub nodes_per_layer: usize,
    pub gathers_per_layer: usize,
}

/// Modelled seconds of one pass of `tokens` rows (decode: the batch; prefill: the prompt) of
/// `w` under `cfg` on `topo` with `prof`.
pub fn pass_seconds(topo: &Topology, prof: &MachineProfile, w: &Workload, cfg: &ServiceConfig, tokens: usize) -> f64 {
    let node_of = |pu: u32| topo.node_of_cpu(pu).unwrap_or(0);
    let nodes_of = |g: &[u32]| {
        let mut v: Vec<usize> = g.iter().map(|&p| node_of(p)).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    // Groups reading each node's memory share its bandwidth; a group spanning nodes reads
    // its pages interleaved over its own nodes.
    let mut readers = vec![0f64; topo.nodes.len().max(1)];
    for g in &cfg.groups {
        let own = nodes_of(g);
        for &n in &own {
            readers[n] += 1.0 / own.len() as f64;
        }
    }
    // The slowest shard: heads split unevenly give some shards one more.
    let share = w.n_head.div_ceil(cfg.tp()) as f64 / w.n_head as f64;
    let mut slowest = 0f64;
    for g in &cfg.groups {
        // The cores' own bandwidth, capped per cluster.
        let mut per_cluster: std::collections::HashMap<(usize, usize), usize> = Default::default();
        for &pu in g {
            let n = node_of(pu);
            let idx = topo.nodes[n].cores.iter().position(|c| c.contains(&pu)).unwrap_or(0);
            let cl = prof.cluster.map_or(idx, |c| idx / c.cores);
            *per_cluster.entry((n, cl)).or_default() += 1;
        }
        let cores_bw: f64 = per_cluster
            .values()
            .map(|&k| {
                let own = k as f64 * prof.core_gbps;
                prof.cluster.map_or(own, |c| own.min(c.gbps))
            })
            .sum();
        let own = nodes_of(g);
        let memory_bw: f64 = own.iter().map(|&n| prof.node_gbps / readers[n].max(1.0)).sum();
        // Interleaved over k nodes: 1/k of the pages local, the rest remote at the lower rate.
        let local = 1.0 / own.len() as f64;
        let eff = 1.0 / (local + (1.0 - local) / prof.remote_ratio);
        let bw = cores_bw.min(memory_bw) * eff;
        let kv_share = share.max(1.0 / w.n_kv_head.max(1) as f64);
        let t_mem = ((w.weight_bytes - w.kv_bytes) * share + w.kv_bytes * kv_share) / (bw * 1e9);
        let t_cmp = w.flops_per_token * tokens as f64 * share / (g.len() as f64 * prof.core_gflops * 1e9);
        slowest = slowest.max(t_mem.max(t_cmp));
    }
    let spans = cfg.groups.iter().any(|g| nodes_of(g).len() > 1);
    let all: Vec<u32> = cfg.groups.concat();
    let cross = nodes_of(&all).len() > 1;
    // A gather: a global barrier, then every worker sums its slice of the tp partial rows (a
    // remote read where the machine spans nodes).
    let gather_bytes = if cfg.tp() > 1 { (cfg.tp() * w.d_model * tokens * 4) as f64 / cfg.n_cores() as f64 } else { 0.0 };
    let gather_bw = prof.core_gbps * 1e9 * if cross { prof.remote_ratio } else { 1.0 };
    let gathers = if cfg.tp() > 1 { w.gathers_per_layer as f64 } else { 0.0 };
    let per_layer = w.nodes_per_layer as f64 * prof.barrier(cfg.cores_per_group(), spans)
        + gathers * (prof.barrier(cfg.n_cores(), cross) + gather_bytes / gather_bw);
    slowest + w.layers as f64 * per_layer
}
