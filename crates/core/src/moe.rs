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

use crate::tensor::MoeParams;
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

/// Fill the routing table from router logits `[n_tokens][n_expert]`: softmax over all experts,
/// the `n_used` most probable (ties to the lower id), their probabilities optionally divided by
/// their sum (clamped below at 2^-14, as llama.cpp) and scaled; then pairs grouped by expert.
pub fn route(logits: &[f32], n_tokens: usize, p: MoeParams, table: &mut [i32]) {
    let (ne, k) = (p.n_expert, p.n_used);
    let n_pairs = n_tokens * k;
    assert_eq!(table.len(), Route::len(n_tokens, p));
    let (ids, rest) = table.split_at_mut(n_pairs);
    let (weights, rest) = rest.split_at_mut(n_pairs);
    let (position, rest) = rest.split_at_mut(n_pairs);
    let (offs, order) = rest.split_at_mut(ne + 1);
    let mut counts_and_probs = ProbRow::default();
    for t in 0..n_tokens {
        let probs = counts_and_probs.softmax(&logits[t * ne..(t + 1) * ne]);
        // Top-k by repeated selection: k is small (≤ 8 in practice) next to n_expert.
        let mut chosen = [usize::MAX; MAX_USED];
        let mut wsum = 0f32;
        for s in 0..k {
            let mut best = usize::MAX;
            for (e, &pr) in probs.iter().enumerate() {
                if chosen[..s].contains(&e) {
                    continue;
                }
                if best == usize::MAX || pr > probs[best] {
                    best = e;
                }
            }
            chosen[s] = best;
            wsum += probs[best];
        }
        let div = if p.norm_w { wsum.max(6.103_515_6e-5) } else { 1.0 };
        for s in 0..k {
            let e = chosen[s];
            let mut w = probs[e];
            if p.norm_w {
                w /= div;
            }
            if p.w_scale != 0.0 && p.w_scale != 1.0 {
                w *= p.w_scale;
            }
            ids[t * k + s] = e as i32;
            weights[t * k + s] = w.to_bits() as i32;
        }
    }
    // Counting sort of pairs by expert (stable: pairs of one expert stay in token order).
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

    #[test]
    fn route_picks_top_k_normalises_and_groups_by_expert() {
        let p = MoeParams { n_expert: 4, n_used: 2, norm_w: true, w_scale: 1.0 };
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
