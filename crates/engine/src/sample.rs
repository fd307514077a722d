//! Token sampling: logit biases, penalties, then top-k, top-p, min-p, temperature and a seeded
//! draw (the order of llama.cpp's default chain). Temperature 0 is greedy (ties go to the lower
//! id).
//!
//! Invariant: the candidate buffer is allocated once per sampler; sampling a token allocates
//! nothing.

use crate::Error;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

#[derive(Clone, Debug)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub seed: u64,
    /// Added to these tokens' logits before anything else (OpenAI's `logit_bias`, llama.cpp's
    /// `--logit-bias`; −∞ bans a token).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0xC0FFEE,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    pub fn validate(&self) -> Result<(), Error> {
        let bad = |s: String| Err(Error::Sampling(s));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return bad(format!("repeat_penalty must be > 0, got {}", self.repeat_penalty));
        }
        if !self.frequency_penalty.is_finite() || !self.presence_penalty.is_finite() {
            return bad("penalties must be finite".into());
        }
        if let Some((t, b)) = self.logit_bias.iter().find(|(_, b)| b.is_nan() || *b == f32::INFINITY) {
            return bad(format!("the logit bias of token {t} must be a number or -inf, got {b}"));
        }
        Ok(())
    }
}

pub struct Sampler {
    pub params: SamplingParams,
    rng: ChaCha8Rng,
    recent: VecDeque<u32>,
    cand: Vec<(u32, f32)>,
}

/// Index of the largest logit; ties go to the lower id.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplingParams, n_vocab: usize) -> Result<Sampler, Error> {
        params.validate()?;
        if let Some((t, _)) = params.logit_bias.iter().find(|(t, _)| *t as usize >= n_vocab) {
            return Err(Error::Sampling(format!("logit bias for token {t}, outside the vocabulary of {n_vocab}")));
        }
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            recent: VecDeque::with_capacity(params.repeat_last_n + 1),
            cand: Vec::with_capacity(n_vocab),
            params,
        })
    }

    /// Record a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, tok: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(tok);
    }

    fn penalties_active(&self) -> bool {
        let p = &self.params;
        !self.recent.is_empty() && (p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0)
    }

    /// Choose the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_allowed(logits, None::<fn(u32) -> bool>).unwrap_or(0)
    }

    /// [`sample`](Self::sample) among the tokens `allowed` admits (all without it; a
    /// constraint such as JSON mode's), after the penalties and before the chain, as
    /// llama.cpp applies a grammar; `None` when it admits none.
    pub fn sample_allowed(&mut self, logits: &[f32], allowed: Option<impl Fn(u32) -> bool>) -> Option<u32> {
        let penalties = self.penalties_active();
        let Sampler { params: p, rng, recent, cand } = self;
        cand.clear();
        cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        for &(t, b) in &p.logit_bias {
            cand[t as usize].1 += b;
        }
        if p.logit_bias.iter().any(|&(_, b)| b == f32::NEG_INFINITY) {
            cand.retain(|c| c.1 > f32::NEG_INFINITY);
        }
        if penalties {
            for (idx, &t) in recent.iter().enumerate() {
                // Apply each distinct token once, with its count.
                if recent.iter().take(idx).any(|&u| u == t) {
                    continue;
                }
                let count = recent.iter().filter(|&&u| u == t).count() as f32;
                if let Some(c) = cand.get_mut(t as usize) {
                    c.1 = if c.1 <= 0.0 { c.1 * p.repeat_penalty } else { c.1 / p.repeat_penalty };
                    c.1 -= count * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
        if let Some(allowed) = allowed {
            cand.retain(|c| allowed(c.0));
        }
        if cand.is_empty() {
            return None;
        }
        if p.temperature <= 0.0 {
            let mut best = 0;
            for i in 1..cand.len() {
                if cand[i].1 > cand[best].1 {
                    best = i;
                }
            }
            return Some(cand[best].0);
        }
        // Sort descending (ties: lower id first), after cutting to top-k.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let k = if p.top_k > 0 { p.top_k.min(cand.len()) } else { cand.len() };
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, by_logit);
            cand.truncate(k);
        }
        cand.sort_unstable_by(by_logit);
        // Softmax at temperature 1 for top-p / min-p (as llama.cpp's chain, before temperature).
        let max = cand[0].1;
        let mut probs_sum = 0f64;
        for c in cand.iter() {
            probs_sum += ((c.1 - max) as f64).exp();
        }
        if p.top_p < 1.0 {
            let mut cum = 0f64;
            let mut keep = cand.len();
            for (i, c) in cand.iter().enumerate() {
                cum += ((c.1 - max) as f64).exp() / probs_sum;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            // Relative to the most likely token: p_i / p_max = exp(l_i - l_max).
            let thresh = (p.min_p as f64).ln();
            let keep = cand.iter().take_while(|c| ((c.1 - max) as f64) >= thresh).count();
            cand.truncate(keep.max(1));
        }
        // Temperature, then draw.
        let mut total = 0f64;
        for c in cand.iter_mut() {
            c.1 = (((c.1 - max) / p.temperature) as f64).exp() as f32;
            total += c.1 as f64;
        }
        let mut r = rng.random::<f64>() * total;
        for c in cand.iter() {
            r -= c.1 as f64;
            if r <= 0.0 {
                return Some(c.0);
            }
        }
        cand.last().map(|c| c.0)
    }
}
