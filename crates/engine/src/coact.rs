//! Neuron groups from co-activation (KAIROX §5.2): neurons that fire together are kept
//! together, so a group moved to the accelerator carries work that happens at the same time.
//!
//! Input: which neurons of a layer fired for a sample of tokens (`corelm sparsity collect`
//! keeps up to [`SAMPLE_TOKENS`]). Per pair, co-activation beyond chance is
//! `c_ij − f_i·f_j·T` (`c_ij` tokens where both fired, `f` firing rates, `T` tokens); each
//! neuron keeps its [`NEIGHBOURS`] strongest positive pairs, and the union is an undirected
//! weighted graph. The neurons, ordered by firing rate, are cut into tiers of
//! [`TIER_GROUPS`] groups, and METIS cuts each tier's graph into groups of `size` with the
//! least weight between them: a group is neurons that fire together *and* about as often,
//! because which neurons the device holds matters most (regrouping across all rates mixes hot
//! and cold neurons: on SmolLM2 the device's hit rate fell from 19.4 % to 16.2 %). METIS
//! balances parts only to within a few percent, so vertices then move from oversized parts to
//! undersized ones (those with the least weight inside their part first, to the part they
//! are most tied to) until every group has exactly `size` neurons. Groups come out hottest
//! first.

/// Tokens of the calibration text whose firing is kept for co-activation.
pub const SAMPLE_TOKENS: usize = 1024;
/// Strongest partners kept per neuron.
pub const NEIGHBOURS: usize = 16;
/// A neuron's partners and the weights of the edges to them.
type Edges = std::collections::BTreeMap<u32, i32>;

/// Groups per tier: METIS regroups the neurons of each run of `TIER_GROUPS · size` neurons of
/// similar firing rate, so the first groups stay the hottest.
pub const TIER_GROUPS: usize = 2;
/// Group sizes partitioned at collection (the online policies' `--accel-group` choices).
pub const GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// A layer's co-activation graph: each neuron's partners and weights, and firing rates.
pub struct CoGraph {
    edges: Vec<Edges>,
    rate: Vec<f64>,
}

/// Layer neurons as groups of `size`, hottest group first: a permutation of `0..n_ff`
/// (group `g` is `[g·size ..][..size]`). `fired`: one bitset of `n_ff` bits (`n_ff.div_ceil(64)`
/// words) per sampled token.
pub fn groups(fired: &[u64], n_ff: usize, size: usize) -> Vec<u32> {
    CoGraph::new(fired, n_ff).groups(size)
}

impl CoGraph {
    /// The graph of `fired` (as [`groups`] takes it).
    pub fn new(fired: &[u64], n_ff: usize) -> CoGraph {
        let words = n_ff.div_ceil(64);
        let t = fired.len() / words.max(1);
        // Per neuron: its bits over the sampled tokens.
        let tw = t.div_ceil(64);
        let mut by_neuron = vec![0u64; n_ff * tw];
        for (r, row) in fired.chunks_exact(words).enumerate() {
            for n in 0..n_ff {
                if row[n / 64] >> (n % 64) & 1 == 1 {
                    by_neuron[n * tw + r / 64] |= 1 << (r % 64);
                }
            }
        }
        let count = |n: usize| {
            by_neuron[n * tw..(n + 1) * tw]
                .iter()
                .map(|w| w.count_ones())
                .sum::<u32>()
        };
        let rate: Vec<f64> = (0..n_ff)
            .map(|n| count(n) as f64 / t.max(1) as f64)
            .collect();
        // Each neuron's strongest partners beyond chance.
        let mut best: Vec<Vec<(f64, u32)>> = vec![Vec::new(); n_ff];
        for i in 0..n_ff {
            let a = &by_neuron[i * tw..(i + 1) * tw];
            for j in i + 1..n_ff {
                let b = &by_neuron[j * tw..(j + 1) * tw];
                let c: u32 = a.iter().zip(b).map(|(x, y)| (x & y).count_ones()).sum();
                let excess = c as f64 - rate[i] * rate[j] * t as f64;
                if excess > 0.0 {
                    for (v, u) in [(i, j), (j, i)] {
                        keep(&mut best[v], (excess, u as u32));
                    }
                }
            }
        }
        // The undirected union, weights scaled to integers (at least 1).
        let mut edges: Vec<Edges> = vec![Default::default(); n_ff];
        for (v, list) in best.iter().enumerate() {
            for &(w, u) in list {
                let w = 1 + (w * 1000.0 / t.max(1) as f64) as i32;
                edges[v].insert(u, w);
                edges[u as usize].insert(v as u32, w);
            }
        }
        CoGraph { edges, rate }
    }

    /// The neurons as groups of `size` (see [`groups`]).
    pub fn groups(&self, size: usize) -> Vec<u32> {
        let n_ff = self.rate.len();
        assert!(size > 0 && n_ff.is_multiple_of(size), "groups of {size} dividing {n_ff}");
        let rate = &self.rate;
        let mut order: Vec<u32> = (0..n_ff as u32).collect();
        order.sort_by(|&a, &b| rate[b as usize].total_cmp(&rate[a as usize]).then(a.cmp(&b)));
        order.chunks(size * TIER_GROUPS).flat_map(|tier| self.tier_groups(tier, size)).collect()
    }

    /// `tier`'s neurons as groups of `size` by co-activation inside the tier, hottest group
    /// first; in the order given where the tier is one group, has no edges or METIS fails.
    fn tier_groups(&self, tier: &[u32], size: usize) -> Vec<u32> {
        let parts = tier.len() / size;
        let local: std::collections::HashMap<u32, u32> = tier.iter().enumerate().map(|(i, &n)| (n, i as u32)).collect();
        let edges: Vec<Edges> = tier
            .iter()
            .map(|&n| self.edges[n as usize].iter().filter_map(|(u, &w)| local.get(u).map(|&lu| (lu, w))).collect())
            .collect();
        if parts <= 1 || edges.iter().all(|e| e.is_empty()) {
            return tier.to_vec();
        }
        let Some(part) = metis_parts(&edges, parts) else { return tier.to_vec() };
        let part = balance(part, &edges, parts, size);
        let mut members: Vec<Vec<u32>> = vec![Vec::new(); parts];
        for (i, &p) in part.iter().enumerate() {
            members[p].push(tier[i]);
        }
        members.iter_mut().for_each(|m| m.sort_unstable());
        let heat = |m: &Vec<u32>| m.iter().map(|&n| self.rate[n as usize]).sum::<f64>();
        members.sort_by(|a, b| heat(b).total_cmp(&heat(a)).then(a[0].cmp(&b[0])));
        members.concat()
    }
}

/// Keep the [`NEIGHBOURS`] largest of `list` with `e`.
fn keep(list: &mut Vec<(f64, u32)>, e: (f64, u32)) {
    if list.len() < NEIGHBOURS {
        list.push(e);
        return;
    }
    let (min_at, min) = list
        .iter()
        .enumerate()
        .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
        .map(|(i, &v)| (i, v))
        .expect("a full list");
    if e.0 > min.0 {
        list[min_at] = e;
    }
}

/// METIS k-way parts of the graph (`None` if METIS refuses it).
fn metis_parts(edges: &[Edges], parts: usize) -> Option<Vec<usize>> {
    let mut xadj: Vec<metis::Idx> = Vec::with_capacity(edges.len() + 1);
    let (mut adjncy, mut adjwgt): (Vec<metis::Idx>, Vec<metis::Idx>) = (Vec::new(), Vec::new());
    xadj.push(0);
    for e in edges {
        for (&u, &w) in e {
            adjncy.push(u as metis::Idx);
            adjwgt.push(w as metis::Idx);
        }
        xadj.push(adjncy.len() as metis::Idx);
    }
    let mut part = vec![0 as metis::Idx; edges.len()];
    let graph = metis::Graph::new(1, parts as metis::Idx, &xadj, &adjncy)
        .ok()?
        .set_adjwgt(&adjwgt)
        .set_option(metis::option::Seed(1));
    graph.part_kway(&mut part).ok()?;
    Some(part.into_iter().map(|p| p as usize).collect())
}

/// Move vertices until every part has exactly `size`: from the largest part, its vertex with
/// the least weight inside it goes to the undersized part it is most tied to.
fn balance(
    mut part: Vec<usize>,
    edges: &[Edges],
    parts: usize,
    size: usize,
) -> Vec<usize> {
    let mut len = vec![0usize; parts];
    part.iter().for_each(|&p| len[p] += 1);
    let tie = |part: &[usize], v: usize, p: usize| {
        edges[v]
            .iter()
            .filter(|(&u, _)| part[u as usize] == p)
            .map(|(_, &w)| w as i64)
            .sum::<i64>()
    };
    while let Some(big) = (0..parts)
        .filter(|&p| len[p] > size)
        .max_by_key(|&p| (len[p], std::cmp::Reverse(p)))
    {
        let v = (0..part.len())
            .filter(|&v| part[v] == big)
            .min_by_key(|&v| (tie(&part, v, big), v))
            .expect("a vertex in an oversized part");
        let to = (0..parts)
            .filter(|&p| len[p] < size)
            .max_by_key(|&p| (tie(&part, v, p), std::cmp::Reverse(p)))
            .expect("an undersized part");
        part[v] = to;
        len[big] -= 1;
        len[to] += 1;
    }
    part
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn planted_co_firing_clusters_are_recovered_where_firing_rates_cannot_tell() {
        // 256 neurons in 4 planted clusters of 64, interleaved (neuron n in cluster n % 4);
        // each token wakes one cluster (90 % of its neurons; clusters 0 and 1 with
        // probability 0.35 each, 2 and 3 with 0.15) plus 10 % noise elsewhere. Tiers by rate
        // hold clusters {0, 1} and {2, 3}; firing rates alone cannot split a tier.
        let (n_ff, t) = (256, 1024);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut fired = vec![0u64; t * 4];
        for r in 0..t {
            let u: f64 = rng.random();
            let c = if u < 0.35 { 0 } else if u < 0.7 { 1 } else if u < 0.85 { 2 } else { 3 };
            for n in 0..n_ff {
                let p = if n % 4 == c { 0.9 } else { 0.1 };
                if rng.random::<f64>() < p {
                    fired[r * 4 + n / 64] |= 1 << (n % 64);
                }
            }
        }
        let g = groups(&fired, n_ff, 64);
        let mut sorted = g.clone();
        sorted.sort();
        assert_eq!(sorted, (0..256).collect::<Vec<u32>>(), "a permutation");
        let mut seen = Vec::new();
        for (k, grp) in g.chunks(64).enumerate() {
            let mut in_cluster = [0; 4];
            grp.iter().for_each(|&n| in_cluster[n as usize % 4] += 1);
            let c = (0..4).max_by_key(|&c| in_cluster[c]).unwrap();
            // One cluster each, the hotter tier's first.
            assert!(in_cluster[c] >= 58 && (c < 2) == (k < 2) && !seen.contains(&c), "group {k}: {in_cluster:?}");
            seen.push(c);
        }
        // Groups of 32: tiers of 64 neurons hold parts of two clusters of equal rate in
        // random shares, so a group may have to mix; on average they are mostly one cluster
        // (rate order alone: about half).
        let g = groups(&fired, n_ff, 32);
        let most: usize = g.chunks(32).map(|grp| (0..4).map(|c| grp.iter().filter(|&&n| n % 4 == c).count()).max().unwrap()).sum();
        assert!(most as f64 / 256.0 >= 0.75, "{most} of 256 in their group's main cluster");
    }

    #[test]
    fn independent_neurons_fall_back_to_firing_rate_order() {
        // No neuron fires for any token: no pair beyond chance, no edges.
        let fired = vec![0u64; 16 * 2];
        let g = groups(&fired, 128, 64);
        assert_eq!(g, (0..128).collect::<Vec<u32>>());
    }
}
