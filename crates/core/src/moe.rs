//! Mixture-of-experts routing and the combination of expert outputs (what ggml does with
//! `argsort_top_k`, `get_rows` and `mul_mat_id`'s grouping), as plain functions the scheduler
//! calls per worker; the grouped expert matmul itself is `sched::experts`.
//!
//! A batch of `n_tokens` tokens routed to `n_used` experts each has `n_tokens · n_used`
//! *pairs*; pair `t · n_used + s` is token `t`'s `s`-th choice (best first). The routing table
//! orders the pairs by expert: pair `order[i]` sits at *position* `i`, and expert `e`'s pairs
//! take positions `offs[e] .. offs[e + 1]`. Expert matmuls write their outputs (and read
//! per-pair inputs) by position, so each expert's rows are one contiguous block — a small
//! matmul the matrix kernels (tiles, GEMV) run as they run any other — and each expert's
//! weights stream from memory once per batch whatever the number of tokens routed to it;
//! experts no token chose are not read at all.
//!
//! Invariant: every `[pairs][n]` tensor between the first expert matmul and [`combine`] is in
//! position order.

use crate::tensor::{MoeGating, MoeParams};
use std::ops::Range;

/// The routing table, an `i32` array:
/// `[expert of each pair (P)] [weight bits of each pair (P)] [position of each pair (P)]
/// [first position of each expert (n_expert + 1)] [pair at each position (P)]`, with
/// `P = n_tokens · n_used`.
pub struct Route;

impl Route {
    pub fn len(n_tokens: usize, p: MoeParams) -> usize {
        4 * n_tokens * p.n_used + p.n_expert + 1
    }

    /// Pairs in a table (the inverse of [`Route::len`]).
    pub fn n_pairs(table: &[i32], p: MoeParams) -> usize {
        (table.len() - p.n_expert - 1) / 4
    }

    /// Weight of each pair.
    pub fn weight(table: &[i32], n_pairs: usize, pair: usize) -> f32 {
        f32::from_bits(table[n_pairs + pair] as u32)
    }

    /// Where pair `pair`'s rows sit in position order.
    pub fn position(table: &[i32], n_pairs: usize, pair: usize) -> usize {
        table[2 * n_pairs + pair] as usize
    }

    /// The positions of expert `e`'s pairs.
    pub fn positions_of(table: &[i32], n_pairs: usize, e: usize) -> Range<usize> {
        let offs = &table[3 * n_pairs..];
        offs[e] as usize..offs[e + 1] as usize
    }

    /// The pairs routed to expert `e`, in token order (the pair at each of its positions).
    pub fn pairs_of(table: &[i32], n_pairs: usize, e: usize) -> &[i32] {
        let order = &table[table.len() - n_pairs..];
        &order[Self::positions_of(table, n_pairs, e)]
    }
}

/// Fill the routing table from router logits `[n_tokens][n_expert]`: [`select`] for every
/// token, then [`order`]. (The executor runs the two as nodes of their own: the selection split
/// among workers by tokens, the ordering on one.)
pub fn route(logits: &[f32], n_tokens: usize, p: MoeParams, table: &mut [i32]) {
    let k = p.n_used;
    let mut sel = vec![0i32; 2 * n_tokens * k];
    let (ids, weights) = sel.split_at_mut(n_tokens * k);
    for t in 0..n_tokens {
        select(&logits[t * p.n_expert..(t + 1) * p.n_expert], p, &mut ids[t * k..(t + 1) * k], &mut weights[t * k..(t + 1) * k]);
    }
    order(&sel, n_tokens, p, table);
}

/// One token's routing from its router logits `[n_expert]`: softmax over all experts, the
/// `n_used` most probable into `ids` (best first; ties to the lower id), their probabilities
/// optionally divided by their sum (clamped below at 2^-14, as llama.cpp) and scaled, as f32
/// bits into `weights`. With [`MoeGating::SoftmaxWeight`] the `n_used` largest logits are
/// chosen and a softmax over those alone gives their weights.
pub fn select(logits: &[f32], p: MoeParams, ids: &mut [i32], weights: &mut [i32]) {
    let k = p.n_used;
    let mut row = ProbRow::default();
    // What the experts are ranked by: their probabilities, or (softmax-weight) their logits.
    let scores = match p.gating {
        MoeGating::Softmax => row.softmax(logits),
        MoeGating::SoftmaxWeight => logits,
    };
    // Top-k by insertion into a descending list: an expert goes before the first one of
    // lower score, so equal ones stay in id order.
    let mut chosen = [0usize; MAX_USED];
    let mut n = 0;
    for (e, &pr) in scores.iter().enumerate() {
        if n == k && pr.partial_cmp(&scores[chosen[k - 1]]) != Some(std::cmp::Ordering::Greater) {
            continue;
        }
        let mut at = n.min(k - 1);
        while at > 0 && pr > scores[chosen[at - 1]] {
            chosen[at] = chosen[at - 1];
            at -= 1;
        }
        chosen[at] = e;
        n = (n + 1).min(k);
    }
    // Each slot's weight before renormalising: its probability, or its share of a softmax
    // over the chosen logits alone (ggml's `soft_max` of the `[n_used]` row).
    let w: [f32; MAX_USED] = match p.gating {
        MoeGating::Softmax => std::array::from_fn(|s| if s < k { scores[chosen[s]] } else { 0.0 }),
        MoeGating::SoftmaxWeight => {
            let picked: [f32; MAX_USED] = std::array::from_fn(|s| if s < k { logits[chosen[s]] } else { 0.0 });
            let mut top = ProbRow::default();
            let sm = top.softmax(&picked[..k]);
            std::array::from_fn(|s| if s < k { sm[s] } else { 0.0 })
        }
    };
    let wsum: f32 = w[..k].iter().fold(0f32, |a, &v| a + v);
    let div = if p.norm_w { wsum.max(6.103_515_6e-5) } else { 1.0 };
    for s in 0..k {
        let mut v = w[s];
        if p.norm_w {
            v /= div;
        }
        if p.w_scale != 0.0 && p.w_scale != 1.0 {
            v *= p.w_scale;
        }
        ids[s] = chosen[s] as i32;
        weights[s] = v.to_bits() as i32;
    }
}

/// The routing table from every token's selection `sel` (`[ids (P)] [weight bits (P)]`, as
/// [`select`] writes them per token): the selection copied, then the pairs grouped by expert
/// by a counting sort (stable: pairs of one expert stay in token order) — their positions,
/// each expert's first position and the pair at each position.
pub fn order(sel: &[i32], n_tokens: usize, p: MoeParams, table: &mut [i32]) {
    let ne = p.n_expert;
    let n_pairs = n_tokens * p.n_used;
    assert!(table.len() == Route::len(n_tokens, p) && sel.len() == 2 * n_pairs);
    table[..2 * n_pairs].copy_from_slice(sel);
    let (ids, rest) = table.split_at_mut(n_pairs);
    let (_, rest) = rest.split_at_mut(n_pairs);
    let (position, rest) = rest.split_at_mut(n_pairs);
    let (offs, order) = rest.split_at_mut(ne + 1);
    offs.fill(0);
    for &e in ids.iter() {
        offs[e as usize + 1] += 1;
    }
    for e in 0..ne {
        offs[e + 1] += offs[e];
    }
    let mut next: [i32; MAX_EXPERTS] = [0; MAX_EXPERTS];
    next[..ne].copy_from_slice(&offs[..ne]);
    for (pair, &e) in ids.iter().enumerate() {
        order[next[e as usize] as usize] = pair as i32;
        position[pair] = next[e as usize];
        next[e as usize] += 1;
    }
}

/// Largest expert count and top-k the routing handles (stack buffers; Qwen3-MoE: 128 and 8,
/// DeepSeek: 256 and 8).
pub const MAX_EXPERTS: usize = 512;
pub const MAX_USED: usize = 32;

/// Stack scratch for one token's softmax.
struct ProbRow {
    p: [f32; MAX_EXPERTS],
}

impl Default for ProbRow {
    fn default() -> Self {
        ProbRow { p: [0.0; MAX_EXPERTS] }
    }
}

impl ProbRow {
    /// ggml's `soft_max`: subtract the max, exponentiate, divide by the (f64) sum.
    fn softmax(&mut self, logits: &[f32]) -> &[f32] {
        let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut sum = 0f64;
        for (o, &l) in self.p.iter_mut().zip(logits) {
            *o = (l - max).exp();
            sum += *o as f64;
        }
        let inv = (1.0 / sum) as f32;
        let p = &mut self.p[..logits.len()];
        p.iter_mut().for_each(|v| *v *= inv);
        p
    }
}

/// `out[ne0]` of token `t` = Σ_s weight(t, s) · y[position(t·n_used + s)], slots in order,
/// over the slots whose expert is in `experts` (zeros if none is).
pub fn combine(y: &[f32], table: &[i32], p: MoeParams, t: usize, experts: Range<usize>, out: &mut [f32]) {
    let ne0 = out.len();
    let n_pairs = Route::n_pairs(table, p);
    let mut first = true;
    for s in 0..p.n_used {
        let pair = t * p.n_used + s;
        if !experts.contains(&(table[pair] as usize)) {
            continue;
        }
        let w = Route::weight(table, n_pairs, pair);
        let at = Route::position(table, n_pairs, pair);
        let yr = &y[at * ne0..(at + 1) * ne0];
        if first {
            out.iter_mut().zip(yr).for_each(|(o, &v)| *o = v * w);
        } else {
            out.iter_mut().zip(yr).for_each(|(o, &v)| *o += v * w);
        }
        first = false;
    }
    if first {
        out.fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The top-k by insertion picks what repeated selection of the maximum (ties to the lower
    /// id) picks, in that order, ties and all.
    #[test]
    fn select_is_repeated_selection_of_the_maximum() {
        let mut seed = 12345u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..2000 {
            let ne = 1 + (next() % 40) as usize;
            let k = (1 + (next() % 8) as usize).min(ne);
            // Few distinct values, so ties are common.
            let logits: Vec<f32> = (0..ne).map(|_| (next() % 5) as f32 * 0.5 - (case % 3) as f32).collect();
            let p = MoeParams { n_expert: ne, n_used: k, norm_w: case % 2 == 0, w_scale: 1.0, gating: MoeGating::Softmax };
            let (mut ids, mut w) = (vec![0; k], vec![0; k]);
            select(&logits, p, &mut ids, &mut w);
            let mut row = ProbRow::default();
            let probs = row.softmax(&logits).to_vec();
            let mut want: Vec<usize> = Vec::new();
            for _ in 0..k {
                let best = (0..ne).filter(|e| !want.contains(e)).fold(usize::MAX, |b, e| if b == usize::MAX || probs[e] > probs[b] { e } else { b });
                want.push(best);
            }
            let got: Vec<usize> = ids.iter().map(|&e| e as usize).collect();
            assert_eq!(got, want, "{logits:?} k {k}");
        }
    }

    #[test]
    fn route_picks_top_k_normalises_and_groups_by_expert() {
        let p = MoeParams { n_expert: 4, n_used: 2, norm_w: true, w_scale: 1.0, gating: MoeGating::Softmax };
        // Token 0 prefers experts 2 then 0; token 1 prefers 0 then 3; token 2: 2 then 3.
        let logits = [1.0, -1.0, 2.0, 0.0, 3.0, 0.0, 1.0, 2.0, 0.0, 0.0, 5.0, 4.0];
        let mut table = vec![0i32; Route::len(3, p)];
        route(&logits, 3, p, &mut table);
        assert_eq!(&table[..6], &[2, 0, 0, 3, 2, 3]);
        let np = 6;
        for t in 0..3 {
            let s: f32 = (0..2).map(|s| Route::weight(&table, np, t * 2 + s)).sum();
            assert!((s - 1.0).abs() < 1e-6);
        }
        // Softmax of (2, 1) normalised over the pair: e/(e+1).
        let w0 = Route::weight(&table, np, 0);
        assert!((w0 - std::f32::consts::E / (std::f32::consts::E + 1.0)).abs() < 1e-6);
        assert_eq!(Route::pairs_of(&table, np, 0), &[1, 2]);
        assert_eq!(Route::pairs_of(&table, np, 1), &[] as &[i32]);
        assert_eq!(Route::pairs_of(&table, np, 2), &[0, 4]);
        assert_eq!(Route::pairs_of(&table, np, 3), &[3, 5]);
        // Positions: expert 0's pairs first, then 2's, then 3's.
        assert_eq!(Route::positions_of(&table, np, 2), 2..4);
        let at: Vec<usize> = (0..np).map(|pair| Route::position(&table, np, pair)).collect();
        assert_eq!(at, [2, 0, 1, 4, 3, 5]);
    }
}
