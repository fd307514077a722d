//! The optional stages of the chain, each llama.cpp's sampler of the same name: top-nσ,
//! locally typical sampling, XTC, dynamic temperature and Mirostat 1 and 2. Each works on the
//! candidate list `(token, logit)`; those that need probabilities compute them as llama.cpp
//! does (a softmax in `f32` over the list, sorted by logit, highest first) into `probs`.

/// `probs[i]` = the softmax of `cand` (sorted, highest logit first) at `i`.
pub(crate) fn softmax(cand: &[(u32, f32)], probs: &mut Vec<f32>) {
    probs.clear();
    let max = cand[0].1;
    let mut sum = 0f32;
    for c in cand {
        let p = (c.1 - max).exp();
        probs.push(p);
        sum += p;
    }
    for p in probs.iter_mut() {
        *p /= sum;
    }
}

/// The chain's order: by logit, highest first (ties: the lower id first).
pub(crate) fn by_logit(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Sort by logit, highest first (ties: the lower id first).
pub(crate) fn sort(cand: &mut [(u32, f32)]) {
    cand.sort_unstable_by(by_logit);
}

/// Top-nσ: logits more than `n` standard deviations (of the finite logits) below the highest
/// become −∞ (kept in the list, as llama.cpp keeps them).
pub(crate) fn top_n_sigma(cand: &mut [(u32, f32)], n: f32) {
    if n <= 0.0 || cand.len() <= 1 {
        return;
    }
    let (mut max, mut sum, mut count) = (cand[0].1, 0f32, 0usize);
    for c in cand.iter().filter(|c| c.1 != f32::NEG_INFINITY) {
        max = max.max(c.1);
        sum += c.1;
        count += 1;
    }
    let mean = if count > 0 { sum / count as f32 } else { 0.0 };
    let mut acc = 0f32;
    for c in cand.iter().filter(|c| c.1 != f32::NEG_INFINITY) {
        acc += ((c.1 - mean) as f64).powi(2) as f32;
    }
    let std = if count > 0 { (acc / count as f32).sqrt() } else { 0.0 };
    for c in cand.iter_mut() {
        if c.1 < max - n * std {
            c.1 = f32::NEG_INFINITY;
        }
    }
}

/// Locally typical sampling: keep the tokens whose surprise is nearest the distribution's
/// entropy until their probabilities pass `p`. `cand` comes sorted and leaves sorted.
pub(crate) fn typical(cand: &mut Vec<(u32, f32)>, p: f32, probs: &mut Vec<f32>, scratch: &mut Vec<(f32, u32, f32, f32)>) {
    if p >= 1.0 {
        return;
    }
    softmax(cand, probs);
    let entropy: f32 = probs.iter().filter(|&&q| q > 0.0).map(|&q| -q * q.ln()).sum();
    scratch.clear();
    scratch.extend(cand.iter().zip(probs.iter()).map(|(c, &q)| ((-q.ln() - entropy).abs(), c.0, c.1, q)));
    scratch.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut cum = 0f32;
    let mut keep = scratch.len();
    for (i, s) in scratch.iter().enumerate() {
        cum += s.3;
        if cum > p {
            keep = i + 1;
            break;
        }
    }
    cand.clear();
    cand.extend(scratch[..keep].iter().map(|s| (s.1, s.2)));
    sort(cand);
}

/// XTC ("exclude top choices"), once `chance` (a uniform draw) falls within `probability`:
/// every token at or above `threshold` but the least likely of them leaves. `cand` is sorted.
pub(crate) fn xtc(cand: &mut Vec<(u32, f32)>, chance: f32, probability: f32, threshold: f32, probs: &mut Vec<f32>) {
    if chance > probability {
        return;
    }
    softmax(cand, probs);
    let above = probs.iter().take_while(|&&q| q >= threshold).count();
    if above > 1 {
        cand.drain(..above - 1);
    }
}

/// Dynamic temperature: `temp ± range`, placed by the normalised entropy of `cand` (sorted)
/// raised to `exponent`.
pub(crate) fn dynamic_temperature(cand: &[(u32, f32)], temp: f32, range: f32, exponent: f32, probs: &mut Vec<f32>) -> f32 {
    if cand.len() <= 1 {
        return temp.max(f32::MIN_POSITIVE);
    }
    let (min_t, max_t) = ((temp - range).max(0.0), temp + range);
    let max_entropy = -(1.0 / cand.len() as f32).ln();
    softmax(cand, probs);
    let entropy: f32 = probs.iter().filter(|&&q| q > 0.0).map(|&q| -q * q.ln()).sum();
    min_t + (max_t - min_t) * (entropy / max_entropy).powf(exponent)
}

/// Top-p: the most likely tokens until their probability (at temperature 1) reaches `p`.
/// `cand` is sorted.
pub(crate) fn top_p(cand: &mut Vec<(u32, f32)>, p: f32) {
    let max = cand[0].1;
    let mut probs_sum = 0f64;
    for c in cand.iter() {
        probs_sum += ((c.1 - max) as f64).exp();
    }
    let mut cum = 0f64;
    let mut keep = cand.len();
    for (i, c) in cand.iter().enumerate() {
        cum += ((c.1 - max) as f64).exp() / probs_sum;
        if cum >= p as f64 {
            keep = i + 1;
            break;
        }
    }
    cand.truncate(keep.max(1));
}

/// Min-p: the tokens at least `p` times as likely as the best. `cand` is sorted.
pub(crate) fn min_p(cand: &mut Vec<(u32, f32)>, p: f32) {
    // Relative to the most likely token: p_i / p_max = exp(l_i - l_max).
    let (max, thresh) = (cand[0].1, (p as f64).ln());
    let keep = cand.iter().take_while(|c| ((c.1 - max) as f64) >= thresh).count();
    cand.truncate(keep.max(1));
}

/// The `k` (≥ 1) best of `cand`, sorted (a selection, then a sort of those alone).
pub(crate) fn top(cand: &mut Vec<(u32, f32)>, k: usize) {
    if k < cand.len() {
        cand.select_nth_unstable_by(k - 1, by_logit);
        cand.truncate(k);
    }
    sort(cand);
}

/// Mirostat 1's cut: estimate the Zipf exponent from the top 100 tokens, and keep the `k`
/// that bring the expected surprise to `mu`. (llama.cpp sorts the whole vocabulary first;
/// the ratios p_i / p_{i+1} are exp(l_i − l_{i+1}), so a selection of the top 100 does.)
pub(crate) fn mirostat_v1_cut(cand: &mut Vec<(u32, f32)>, mu: f32, n_vocab: usize) {
    let m = 100.min(cand.len());
    if m < cand.len() {
        cand.select_nth_unstable_by(m - 1, by_logit);
    }
    cand[..m].sort_unstable_by(by_logit);
    let (mut ti_bi, mut ti_sq) = (0f32, 0f32);
    for i in 0..m.saturating_sub(1) {
        let t = ((i + 2) as f32 / (i + 1) as f32).ln();
        let b = cand[i].1 - cand[i + 1].1;
        ti_bi += t * b;
        ti_sq += t * t;
    }
    let s_hat = ti_bi / ti_sq;
    let eps = s_hat - 1.0;
    let k = ((eps * 2f32.powf(mu)) / (1.0 - (n_vocab as f32).powf(-eps))).powf(1.0 / s_hat);
    let k = (k as i64).max(1) as usize;
    if k <= m {
        cand.truncate(k);
    } else {
        top(cand, k);
    }
}

/// Mirostat 2's cut: the tokens whose surprise, −log₂ p, is within `mu` (at least the best),
/// sorted. p ≥ 2^−mu is a bound on the logit, so only those kept are sorted.
pub(crate) fn mirostat_v2_cut(cand: &mut Vec<(u32, f32)>, mu: f32) {
    let max = cand.iter().fold(f32::NEG_INFINITY, |a, c| a.max(c.1));
    let sum: f32 = cand.iter().map(|c| (c.1 - max).exp()).sum();
    let bound = max + sum.ln() - mu * std::f32::consts::LN_2;
    if cand.iter().any(|c| c.1 >= bound) {
        cand.retain(|c| c.1 >= bound);
        sort(cand);
    } else {
        top(cand, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_temperature_follows_the_entropy() {
        let mut probs = vec![];
        let flat: Vec<(u32, f32)> = (0..8).map(|i| (i, 1.0)).collect();
        assert!((dynamic_temperature(&flat, 1.0, 0.5, 1.0, &mut probs) - 1.5).abs() < 1e-5);
        let peaked: Vec<(u32, f32)> = (0..8).map(|i| (i, if i == 0 { 100.0 } else { 0.0 })).collect();
        assert!((dynamic_temperature(&peaked, 1.0, 0.5, 1.0, &mut probs) - 0.5).abs() < 1e-5);
    }

    #[test]
    fn xtc_keeps_the_least_likely_of_the_likely() {
        // Probabilities about 0.47, 0.32, 0.17, 0.04: three at or above 0.1.
        let mut cand = vec![(0, 2.0f32), (1, 1.6), (2, 1.0), (3, -0.5)];
        xtc(&mut cand, 0.0, 1.0, 0.1, &mut vec![]);
        assert_eq!(cand.iter().map(|c| c.0).collect::<Vec<_>>(), [2, 3]);
        // A chance above the probability leaves them all.
        let mut cand = vec![(0, 2.0f32), (1, 1.6)];
        xtc(&mut cand, 0.6, 0.5, 0.1, &mut vec![]);
        assert_eq!(cand.len(), 2);
    }
}
