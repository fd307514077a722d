//! Prompt-lookup drafts (speculative decoding without a draft model): the tokens that followed
//! the latest earlier occurrence of a sequence's last few tokens, proposed as its next ones.
//!
//! A decode step feeds the pending token and the draft in one pass; each row's logits are
//! sampled in turn, and a draft token is kept while it equals what was sampled at the row
//! before it, so the answer is the one token-by-token decoding gives (the same samples drawn in
//! the same order; bit for bit with batch invariance, where a row's arithmetic does not depend
//! on the rows beside it). The rest is cut from the KV cache. Text that repeats what came
//! before (code edits, extraction, quoting) gets several tokens per pass.
//!
//! A draft row is not free: a decode step's time grows with its rows (on a 2-core Zen 4 with
//! SmolLM2, a row costs over half of a one-row step). So each sequence drafts only as far as
//! pays: [`RowCost`] fits a step's seconds as `fixed + per_row · rows` over recent decode
//! steps, [`Acceptance`] follows how often the sequence's draft tokens are kept, and
//! [`best_len`] picks the length with the most expected tokens per second.

/// Longest and shortest suffix matched.
const NGRAM_MAX: usize = 4;
const NGRAM_MIN: usize = 2;

/// Fill `out` with at most `max` tokens that followed the most recent earlier occurrence of the
/// longest suffix of `history` (`NGRAM_MAX` down to `NGRAM_MIN` tokens) found again in it;
/// empty when none recurs.
pub fn draft(history: &[u32], max: usize, out: &mut Vec<u32>) {
    out.clear();
    let n = history.len();
    if max == 0 {
        return;
    }
    for g in (NGRAM_MIN..=NGRAM_MAX.min(n.saturating_sub(1))).rev() {
        let tail = &history[n - g..];
        // Latest start `s` < n - g with history[s..s + g] == tail.
        if let Some(s) = (0..n - g).rev().find(|&s| &history[s..s + g] == tail) {
            let from = s + g;
            out.extend_from_slice(&history[from..(from + max).min(n)]);
            return;
        }
    }
}

/// Decode steps' seconds as `fixed + per_row · rows`: least squares over recent steps
/// (each older step weighs 5 % less).
#[derive(Clone, Copy, Debug, Default)]
pub struct RowCost {
    /// Sums of w, w·n, w·t, w·n², w·n·t.
    s: [f64; 5],
}

impl RowCost {
    pub fn observe(&mut self, rows: usize, secs: f64) {
        let n = rows as f64;
        for (x, v) in self.s.iter_mut().zip([1.0, n, secs, n * n, n * secs]) {
            *x = 0.95 * *x + v;
        }
    }

    /// `(fixed, per_row)` seconds, once steps of different sizes have been seen.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let [w, n, t, nn, nt] = self.s;
        let det = w * nn - n * n;
        if det <= 1e-6 * w * nn {
            return None;
        }
        let per_row = ((w * nt - n * t) / det).max(0.0);
        Some((((t - per_row * n) / w).max(0.0), per_row))
    }
}

/// How often a sequence's draft tokens are kept: the chance that the next one is, given the
/// ones before it were (an exponential average over the tokens tried).
#[derive(Clone, Copy, Debug)]
pub struct Acceptance(pub f64);

impl Acceptance {
    /// Before any draft: as likely as not, a little more (a lookup match is some evidence).
    pub const PRIOR: f64 = 0.6;

    /// A step tried `fed` draft tokens and kept the first `kept`.
    pub fn observe(&mut self, fed: usize, kept: usize) {
        let tried = kept + usize::from(kept < fed);
        for i in 0..tried {
            let hit = if i < kept { 1.0 } else { 0.0 };
            self.0 += 0.15 * (hit - self.0);
        }
        if fed == 0 {
            // Without drafts nothing is learnt; drift back so that drafting is tried again.
            self.0 += 0.02 * (Self::PRIOR - self.0);
        }
    }
}

/// The draft length (at most `max`) with the most expected tokens per second of a step, for
/// a sequence whose draft tokens are kept with chance `p` each (so `k` drafts give
/// `1 + p + … + p^k` tokens) in steps costing `fixed` (shared by `seqs` sequences) plus
/// `per_row` a row.
pub fn best_len(p: f64, (fixed, per_row): (f64, f64), seqs: usize, max: usize) -> usize {
    let fixed = fixed / seqs.max(1) as f64;
    let (mut best, mut best_rate) = (0, 0.0);
    let (mut tokens, mut pk) = (0.0, 1.0);
    for k in 0..=max {
        tokens += pk;
        pk *= p;
        let rate = tokens / (fixed + per_row * (1 + k) as f64).max(1e-9);
        if rate > best_rate * (1.0 + 1e-9) {
            (best, best_rate) = (k, rate);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::{best_len, draft, Acceptance, RowCost};

    #[test]
    fn draft_lengths_follow_cost_and_acceptance() {
        // Steps of 1 ms plus 0.5 ms a row, fitted from steps of 1 to 7 rows.
        let mut c = RowCost::default();
        assert_eq!(c.fit(), None);
        for i in 0..50 {
            let n = 1 + i % 7;
            c.observe(n, 0.001 + 0.0005 * n as f64);
        }
        let (f, r) = c.fit().unwrap();
        assert!((f - 0.001).abs() < 1e-9 && (r - 0.0005).abs() < 1e-9, "{f} {r}");
        // Sure drafts: as long as allowed; hopeless ones: none; in between, a few.
        assert_eq!(best_len(1.0, (f, r), 1, 8), 8);
        assert_eq!(best_len(0.1, (f, r), 1, 8), 0);
        let mid = best_len(0.8, (f, r), 1, 8);
        assert!((2..8).contains(&mid), "{mid}");
        // Rows that cost nearly nothing beside the step: even doubtful drafts pay.
        assert_eq!(best_len(0.3, (0.01, 1e-6), 1, 4), 4);
        // The fixed part shared by many sequences makes each one's rows dearer.
        assert!(best_len(0.8, (f, r), 16, 8) <= mid);
        // Acceptance: all kept raises it, the first rejected lowers it, nothing tried drifts back.
        let mut a = Acceptance(0.6);
        a.observe(4, 4);
        assert!(a.0 > 0.75);
        let high = a.0;
        a.observe(4, 0);
        assert!(a.0 < high);
        let mut idle = Acceptance(0.1);
        for _ in 0..100 {
            idle.observe(0, 0);
        }
        assert!(idle.0 > 0.5);
    }

    #[test]
    fn drafts_follow_the_latest_longest_match() {
        let mut out = vec![];
        // "a b c d x a b c" → after the suffix "a b c": "d x a b c".
        draft(&[1, 2, 3, 4, 9, 1, 2, 3], 3, &mut out);
        assert_eq!(out, [4, 9, 1]);
        // The latest occurrence wins: "1 2 | 7 ... 1 2 | 8 ... 1 2" → 8.
        draft(&[1, 2, 7, 5, 1, 2, 8, 6, 1, 2], 2, &mut out);
        assert_eq!(out, [8, 6]);
        // A longer match is preferred to a later shorter one.
        draft(&[5, 1, 2, 3, 0, 2, 3, 4, 5, 1, 2, 3], 1, &mut out);
        assert_eq!(out, [0]);
        // Cut at the end of the history; nothing when no pair recurs, or when nothing is asked.
        draft(&[1, 2, 3, 1, 2], 8, &mut out);
        assert_eq!(out, [3, 1, 2]);
        draft(&[1, 2, 3, 4], 4, &mut out);
        assert!(out.is_empty());
        draft(&[1, 2, 1, 2], 0, &mut out);
        assert!(out.is_empty());
        draft(&[7], 4, &mut out);
        assert!(out.is_empty());
    }
}
