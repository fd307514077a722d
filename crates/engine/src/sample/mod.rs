//! Token sampling, in the order of llama.cpp's default chain: logit biases, the repetition
//! penalties, DRY, (a constraint's mask), top-nσ, top-k, locally typical, top-p, min-p, XTC,
//! then the temperature (fixed or dynamic) and a seeded draw. The stages after the biases may
//! come in another order ([`SamplingParams::order`], llama.cpp's `--samplers`): a stage left
//! out is not applied, stages after the temperature see the divided logits, and the mask
//! comes before the first cut (the penalties and DRY work on any list). Mirostat 1 or 2
//! replaces the chain after the biases, as in llama.cpp (no penalties, no cuts: the
//! temperature, then Mirostat's own cut and draw). Temperature 0 is greedy (ties go to the
//! lower id) unless a stage before the temperature can drop the best token (typical, XTC) or
//! a dynamic temperature is on.
//!
//! Every stage is llama.cpp's (`llama-sampler.cpp` at 4df29be); the draw is this crate's own
//! seeded generator, so a seed gives other tokens than llama.cpp's does, from the same
//! distribution. With the stages added here off, the chain is the one it was, token for token.
//!
//! Invariant: the buffers are allocated once per sampler; sampling a token allocates nothing
//! (DRY's map of repeat ends keeps its capacity).

mod dry;
mod infill;
mod order;
mod stages;

pub use dry::Breakers;
pub use infill::InfillVocab;
pub use order::{Item, Parsed, Stage, DEFAULT_ORDER};

use crate::Error;
use dry::DryState;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Mirostat, which replaces the cuts and the draw (llama.cpp's `--mirostat N`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mirostat {
    #[default]
    Off,
    V1,
    V2,
}

/// DRY's settings (llama.cpp's `--dry-*`): off while `multiplier` is 0.
#[derive(Clone, Debug)]
pub struct Dry {
    pub multiplier: f32,
    /// At least 1.
    pub base: f32,
    /// Repeats up to this long are free.
    pub allowed_length: usize,
    /// How many recent tokens are searched for repeats (0 = off).
    pub last_n: usize,
    /// Built for a vocabulary with [`Breakers::new`] (llama.cpp's default texts are
    /// [`Breakers::DEFAULT`]).
    pub breakers: Arc<Breakers>,
}

impl Default for Dry {
    fn default() -> Self {
        Dry { multiplier: 0.0, base: 1.75, allowed_length: 2, last_n: 64, breakers: Arc::default() }
    }
}

impl Dry {
    pub fn is_on(&self) -> bool {
        self.multiplier != 0.0 && self.base >= 1.0 && self.last_n > 0
    }
}

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
    /// Locally typical sampling's mass (1 = off).
    pub typical_p: f32,
    /// Keep logits within this many standard deviations of the best (≤ 0 = off).
    pub top_n_sigma: f32,
    /// XTC: the chance per token of removing the likely tokens (0 = off) ...
    pub xtc_probability: f32,
    /// ... those at or above this probability but the least likely of them (> 0.5 = off).
    pub xtc_threshold: f32,
    /// Dynamic temperature: `temperature ± range` by the candidates' entropy (0 = off).
    pub dynatemp_range: f32,
    pub dynatemp_exponent: f32,
    pub mirostat: Mirostat,
    /// Mirostat's target surprise (τ) and learning rate (η).
    pub mirostat_tau: f32,
    pub mirostat_eta: f32,
    pub dry: Dry,
    /// The stages after the biases, in order (llama.cpp's `--samplers`; default
    /// [`DEFAULT_ORDER`]). A stage left out is not applied; without the temperature the draw
    /// is at temperature 1.
    pub order: Vec<Stage>,
    /// The vocabulary the `infill` stage reads (needed when the order has it).
    pub infill: Option<Arc<InfillVocab>>,
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
            typical_p: 1.0,
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            mirostat: Mirostat::Off,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            dry: Dry::default(),
            order: DEFAULT_ORDER.to_vec(),
            infill: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    fn xtc_on(&self) -> bool {
        self.xtc_probability > 0.0 && self.xtc_threshold <= 0.5
    }

    /// Does sampling take the best token (after the penalties and DRY) without a draw?
    /// (Temperature 0 and no stage before it that can drop the best: typical, XTC; with
    /// Mirostat, temperature 0 alone.)
    pub fn is_greedy(&self) -> bool {
        if self.temperature > 0.0 || (self.mirostat == Mirostat::Off && self.dynatemp_range > 0.0) {
            return false;
        }
        if self.mirostat != Mirostat::Off {
            return true;
        }
        match self.order.iter().position(|&s| s == Stage::Temperature) {
            None => false,
            Some(at) => self.order[..at].iter().all(|&s| match s {
                Stage::Typical => self.typical_p >= 1.0,
                Stage::Xtc => !self.xtc_on(),
                Stage::Infill => false,
                _ => true,
            }),
        }
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
        let finite = [
            ("typical_p", self.typical_p),
            ("top_n_sigma", self.top_n_sigma),
            ("dynatemp_exponent", self.dynatemp_exponent),
            ("mirostat_tau", self.mirostat_tau),
            ("mirostat_eta", self.mirostat_eta),
            ("dry_multiplier", self.dry.multiplier),
        ];
        if let Some((name, v)) = finite.iter().find(|(_, v)| !v.is_finite()) {
            return bad(format!("{name} must be a finite number, got {v}"));
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) || !(0.0..=1.0).contains(&self.xtc_threshold) {
            return bad(format!("xtc_probability and xtc_threshold must be in [0, 1], got {} and {}", self.xtc_probability, self.xtc_threshold));
        }
        if !(self.dynatemp_range >= 0.0 && self.dynatemp_range.is_finite()) {
            return bad(format!("dynatemp_range must be >= 0, got {}", self.dynatemp_range));
        }
        if !(self.dry.base >= 1.0 && self.dry.base.is_finite()) {
            return bad(format!("dry_base must be >= 1, got {}", self.dry.base));
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
    /// The last `max(repeat_last_n, dry.last_n)` tokens, oldest first.
    recent: VecDeque<u32>,
    window: usize,
    cand: Vec<(u32, f32)>,
    probs: Vec<f32>,
    scratch: Vec<(f32, u32, f32, f32)>,
    dry: DryState,
    /// The penalties' count of each recent token.
    counts: HashMap<u32, u32>,
    /// Mirostat's running target (starts at 2τ).
    mu: f32,
    n_vocab: usize,
    /// How the last token was chosen, for [`chain_probs`](Self::chain_probs).
    last: Last,
}

/// The chain's distribution at the last draw, as `cand` (and `probs`) hold it.
#[derive(Clone, Copy)]
enum Last {
    /// Nothing sampled yet, or no token allowed.
    None,
    /// Chosen without a draw (greedy, or temperature 0 after the cuts): probability 1.
    Chosen(u32),
    /// `cand[i].1` are weights summing to this.
    Weights(f64),
    /// Mirostat: `probs[i]` is `cand[i]`'s probability.
    Probs,
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
        if params.order.contains(&Stage::Infill) && params.infill.is_none() {
            return Err(Error::Sampling("the infill sampler needs its vocabulary (SamplingParams::infill)".into()));
        }
        if let Some((t, _)) = params.logit_bias.iter().find(|(t, _)| *t as usize >= n_vocab) {
            return Err(Error::Sampling(format!("logit bias for token {t}, outside the vocabulary of {n_vocab}")));
        }
        let dry_n = if params.dry.is_on() { params.dry.last_n } else { 0 };
        let window = params.repeat_last_n.max(dry_n);
        // Buffers for up to a million-token context up front (a window past any context, as a
        // careless flag asks, must not allocate it whole).
        let room = |n: usize| n.min(1 << 20);
        let typical = params.typical_p < 1.0 && params.mirostat == Mirostat::Off;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            recent: VecDeque::with_capacity(room(window + 1)),
            window,
            cand: Vec::with_capacity(n_vocab),
            probs: Vec::with_capacity(n_vocab),
            scratch: Vec::with_capacity(if typical { n_vocab } else { 0 }),
            dry: DryState::new(room(dry_n)),
            counts: HashMap::with_capacity(room(params.repeat_last_n)),
            mu: 2.0 * params.mirostat_tau,
            n_vocab,
            last: Last::None,
            params,
        })
    }

    /// Record a token (prompt or generated) for the penalties and DRY.
    pub fn accept(&mut self, tok: u32) {
        if self.window == 0 {
            return;
        }
        if self.recent.len() == self.window {
            self.recent.pop_front();
        }
        self.recent.push_back(tok);
    }

    fn penalties_active(&self) -> bool {
        let p = &self.params;
        p.mirostat == Mirostat::Off
            && p.repeat_last_n > 0
            && !self.recent.is_empty()
            && (p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0)
    }

    /// Choose the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_allowed(logits, None::<fn(u32) -> bool>).unwrap_or(0)
    }

    /// [`sample`](Self::sample) among the tokens `allowed` admits (all without it; a
    /// constraint such as JSON mode's), after the penalties and DRY and before the cuts, as
    /// llama.cpp applies a grammar; `None` when it admits none.
    pub fn sample_allowed(&mut self, logits: &[f32], allowed: Option<impl Fn(u32) -> bool>) -> Option<u32> {
        self.draw_among(logits, allowed, false)
    }

    /// [`sample_allowed`](Self::sample_allowed) for a check that costs something per token
    /// (JSON mode's): where the chain is greedy or starts with top-k, only the best tokens are
    /// checked, until the best one or the k best admitted are found (among the 4k + 64 best;
    /// else every token is). The same token as `sample_allowed`.
    pub fn sample_checked(&mut self, logits: &[f32], check: impl Fn(u32) -> bool) -> Option<u32> {
        self.draw_among(logits, Some(check), true)
    }

    fn draw_among(&mut self, logits: &[f32], allowed: Option<impl Fn(u32) -> bool>, best_first: bool) -> Option<u32> {
        self.last = Last::None;
        let temp = match self.cut(logits, allowed, best_first)? {
            Cut::Chosen(t) => {
                self.last = Last::Chosen(t);
                return Some(t);
            }
            Cut::Mirostat(t) => {
                self.last = Last::Probs;
                return Some(t);
            }
            Cut::Draw(temp) => temp,
        };
        // Temperature, then draw.
        let Sampler { rng, cand, .. } = self;
        // (The list is sorted unless a custom order left it otherwise.)
        let max = cand.iter().fold(cand[0].1, |m, c| m.max(c.1));
        let mut total = 0f64;
        for c in cand.iter_mut() {
            c.1 = (((c.1 - max) / temp) as f64).exp() as f32;
            total += c.1 as f64;
        }
        self.last = Last::Weights(total);
        Some(draw(rng, cand, total))
    }

    /// The probability of `t` and the `n` most likely tokens (best first, none of probability
    /// 0) under the distribution the last [`sample`](Self::sample) drew from: after every cut,
    /// the temperature and a constraint's mask, as llama-server's `post_sampling_probs`
    /// reports it. A token chosen without a draw has probability 1, the rest none. `(0, [])`
    /// before the first draw.
    pub fn chain_probs(&self, t: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
        let prob = |i: usize| match self.last {
            Last::Weights(total) => (self.cand[i].1 as f64 / total) as f32,
            _ => self.probs[i],
        };
        match self.last {
            Last::None => (0.0, vec![]),
            Last::Chosen(c) => (if c == t { 1.0 } else { 0.0 }, if n > 0 { vec![(c, 1.0)] } else { vec![] }),
            Last::Weights(_) | Last::Probs => {
                let mut p_t = 0.0;
                let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
                for i in 0..self.cand.len() {
                    let (id, p) = (self.cand[i].0, prob(i));
                    if id == t {
                        p_t = p;
                    }
                    if p > 0.0 {
                        keep_top(&mut top, n, id, p);
                    }
                }
                (p_t, top)
            }
        }
    }

    /// The candidates (token, logit) left after every stage of the chain, as llama.cpp's
    /// chain leaves them for its draw (divided by the temperature), sorted by logit (for
    /// checking the stages against llama.cpp's); empty when the chain chose without a draw.
    /// Uses the generator as [`sample`](Self::sample) would (XTC's chance) but draws nothing.
    pub fn candidates(&mut self, logits: &[f32]) -> Vec<(u32, f32)> {
        self.last = Last::None;
        match self.cut(logits, None::<fn(u32) -> bool>, false) {
            Some(Cut::Draw(temp)) => {
                let mut out: Vec<(u32, f32)> = self.cand.iter().map(|&(t, l)| (t, if temp == 1.0 { l } else { l / temp })).collect();
                stages::sort(&mut out);
                out
            }
            _ => vec![],
        }
    }

    /// Everything before the draw: `None` when `allowed` admits no token. `best_first`: ask
    /// `allowed` about the best tokens first ([`sample_checked`](Self::sample_checked)).
    fn cut(&mut self, logits: &[f32], allowed: Option<impl Fn(u32) -> bool>, best_first: bool) -> Option<Cut> {
        let penalties = self.penalties_active();
        let dry = self.params.dry.is_on() && self.params.mirostat == Mirostat::Off;
        let greedy = self.params.is_greedy();
        let Sampler { params: p, rng, recent, cand, probs, scratch, dry: dry_state, mu, n_vocab, counts, .. } = self;
        cand.clear();
        cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        for &(t, b) in &p.logit_bias {
            cand[t as usize].1 += b;
        }
        let mirostat_on = p.mirostat != Mirostat::Off;
        let order: &[Stage] = if mirostat_on { &[] } else { &p.order };
        // `cand[t]` is token t until the first stage that is not a penalty: the banned tokens
        // and those the mask refuses leave there (before every cut, as llama.cpp applies a
        // grammar first).
        let mut indexed = true;
        let mut sorted = false;
        // A temperature not yet divided into the logits (the draw's, when nothing follows it).
        let mut temp = 1.0f32;
        // Greedy takes the best token the mask admits, and top-k first (the default order) the
        // k best: those are found by asking the mask about the best tokens only.
        let best_k = match allowed {
            Some(_) if best_first && greedy => Some(1),
            Some(_) if best_first && top_k_first(p, order) => Some(p.top_k),
            _ => None,
        };
        let banned = p.logit_bias.iter().any(|&(_, b)| b == f32::NEG_INFINITY);
        for &stage in order {
            if indexed && !matches!(stage, Stage::Penalties | Stage::Dry) {
                if let (Some(k), Some(a)) = (best_k, &allowed) {
                    sorted = best_allowed(cand, k, banned, a);
                }
                if !sorted {
                    leave_out(cand, banned, &allowed);
                }
                if cand.is_empty() {
                    return None;
                }
                indexed = false;
            }
            if temp != 1.0 {
                // A stage after the temperature sees the logits it made.
                for c in cand.iter_mut() {
                    c.1 /= temp;
                }
                temp = 1.0;
            }
            match stage {
                Stage::Penalties if penalties => {
                    // Each distinct token once, with its count in the last `repeat_last_n`.
                    counts.clear();
                    for &t in recent.range(recent.len().saturating_sub(p.repeat_last_n)..) {
                        *counts.entry(t).or_insert(0) += 1;
                    }
                    let penalise = |c: &mut (u32, f32), count: u32| {
                        c.1 = if c.1 <= 0.0 { c.1 * p.repeat_penalty } else { c.1 / p.repeat_penalty };
                        c.1 -= count as f32 * p.frequency_penalty + p.presence_penalty;
                    };
                    if indexed {
                        for (&t, &n) in counts.iter() {
                            if let Some(c) = cand.get_mut(t as usize) {
                                penalise(c, n);
                            }
                        }
                    } else {
                        for c in cand.iter_mut() {
                            if let Some(&n) = counts.get(&c.0) {
                                penalise(c, n);
                            }
                        }
                    }
                    sorted = false;
                }
                Stage::Dry if dry => {
                    let d = &p.dry;
                    dry_state.find(recent.iter().copied(), d.last_n, d.allowed_length, &d.breakers);
                    let penalty = |t: u32| dry_state.penalty(t, d.multiplier, d.base, d.allowed_length, &d.breakers);
                    if indexed {
                        for &t in dry_state.extend.keys() {
                            if let Some(c) = cand.get_mut(t as usize) {
                                c.1 -= penalty(t);
                            }
                        }
                    } else {
                        cand.iter_mut().filter(|c| dry_state.extend.contains_key(&c.0)).for_each(|c| c.1 -= penalty(c.0));
                    }
                    sorted = false;
                }
                Stage::Penalties | Stage::Dry => {}
                // Greedy: the cuts that keep the best are skipped; the temperature takes it.
                s if greedy && s.keeps_best() => {}
                Stage::TopNSigma => stages::top_n_sigma(cand, p.top_n_sigma),
                Stage::TopK => {
                    // Top-k (0: all), sorted highest first.
                    stages::top(cand, if p.top_k > 0 { p.top_k } else { cand.len() });
                    sorted = true;
                }
                // The stages below read the list sorted, highest first; each is skipped when off.
                Stage::Typical if p.typical_p < 1.0 => {
                    ensure_sorted(cand, &mut sorted);
                    stages::typical(cand, p.typical_p, probs, scratch);
                }
                Stage::TopP if p.top_p < 1.0 => {
                    ensure_sorted(cand, &mut sorted);
                    stages::top_p(cand, p.top_p);
                }
                Stage::MinP if p.min_p > 0.0 => {
                    ensure_sorted(cand, &mut sorted);
                    stages::min_p(cand, p.min_p);
                }
                Stage::Xtc if p.xtc_on() && cand.len() >= 2 => {
                    ensure_sorted(cand, &mut sorted);
                    let chance = rng.random::<f32>();
                    stages::xtc(cand, chance, p.xtc_probability, p.xtc_threshold, probs);
                }
                Stage::Infill => {
                    if let Some(v) = &p.infill {
                        ensure_sorted(cand, &mut sorted);
                        infill::infill(cand, probs, v);
                    }
                }
                Stage::Typical | Stage::TopP | Stage::MinP | Stage::Xtc => {}
                Stage::Temperature => {
                    temp = if p.dynatemp_range > 0.0 {
                        ensure_sorted(cand, &mut sorted);
                        stages::dynamic_temperature(cand, p.temperature, p.dynatemp_range, p.dynatemp_exponent, probs)
                    } else {
                        p.temperature
                    };
                    if temp <= 0.0 {
                        return Some(Cut::Chosen(best(cand)));
                    }
                }
            }
        }
        if indexed {
            leave_out(cand, banned, &allowed);
            if cand.is_empty() {
                return None;
            }
        }
        if greedy {
            // Mirostat at temperature 0, or a chain whose stages before the temperature keep
            // the best token.
            return Some(Cut::Chosen(best(cand)));
        }
        if mirostat_on {
            return Some(Cut::Mirostat(mirostat(p, rng, cand, probs, mu, *n_vocab)));
        }
        Some(Cut::Draw(temp))
    }
}

fn ensure_sorted(cand: &mut [(u32, f32)], sorted: &mut bool) {
    if !*sorted {
        stages::sort(cand);
        *sorted = true;
    }
}

/// Is top-k (on) the first cut after the penalties and DRY, as in the default order?
fn top_k_first(p: &SamplingParams, order: &[Stage]) -> bool {
    // Top-nσ at 0 or below cuts nothing.
    let passes = |s: Stage| matches!(s, Stage::Penalties | Stage::Dry) || (s == Stage::TopNSigma && p.top_n_sigma <= 0.0);
    let first_cut = order.iter().find(|&&s| !passes(s));
    p.top_k > 0 && first_cut == Some(&Stage::TopK)
}

/// What the mask and then top-k leave: the `k` best tokens that `allowed` admits (and that are
/// not `banned`, −∞), sorted — found among the `4k + 64` best alone, so the mask is asked about
/// those only. `false` when fewer than `k` of them are admitted (and more tokens remain):
/// `cand` is then whole, in another order, for the mask over every token.
fn best_allowed(cand: &mut Vec<(u32, f32)>, k: usize, banned: bool, allowed: &impl Fn(u32) -> bool) -> bool {
    if k == 1 {
        // The best alone first: one pass and one question.
        let b = best_at(cand);
        if !(banned && cand[b].1 == f32::NEG_INFINITY) && allowed(cand[b].0) {
            cand.swap(0, b);
            cand.truncate(1);
            return true;
        }
    }
    let m = (4 * k + 64).min(cand.len());
    if m < cand.len() {
        cand.select_nth_unstable_by(m - 1, stages::by_logit);
    }
    cand[..m].sort_unstable_by(stages::by_logit);
    let mut n = 0;
    for i in 0..m {
        if !(banned && cand[i].1 == f32::NEG_INFINITY) && allowed(cand[i].0) {
            cand.swap(n, i);
            n += 1;
            if n == k {
                break;
            }
        }
    }
    if n < k && m < cand.len() {
        return false;
    }
    cand.truncate(n);
    true
}

/// The `banned` tokens (when some bias is −∞, those at −∞) and those `allowed` refuses leave
/// `cand`.
fn leave_out(cand: &mut Vec<(u32, f32)>, banned: bool, allowed: &Option<impl Fn(u32) -> bool>) {
    if banned {
        cand.retain(|c| c.1 > f32::NEG_INFINITY);
    }
    if let Some(allowed) = allowed {
        cand.retain(|c| allowed(c.0));
    }
}

/// What the chain left for the draw.
enum Cut {
    /// Without a draw (greedy, or a temperature of 0).
    Chosen(u32),
    /// Drawn by Mirostat from `probs` over `cand`.
    Mirostat(u32),
    /// Draw from `cand` at this temperature.
    Draw(f32),
}

/// Put `(id, v)` into `top`, the `n` largest values so far, largest first (an equal value goes
/// after those already there).
pub(crate) fn keep_top(top: &mut Vec<(u32, f32)>, n: usize, id: u32, v: f32) {
    if top.len() < n || top.last().is_some_and(|x| v > x.1) {
        let at = top.partition_point(|x| x.1 >= v);
        top.insert(at, (id, v));
        top.truncate(n);
    }
}

/// The candidate with the highest logit (ties: the lower id, wherever the list put it).
fn best(cand: &[(u32, f32)]) -> u32 {
    cand[best_at(cand)].0
}

/// Where [`best`]'s candidate is.
fn best_at(cand: &[(u32, f32)]) -> usize {
    let mut best = 0;
    for i in 1..cand.len() {
        let (c, b) = (cand[i], cand[best]);
        if c.1 > b.1 || (c.1 == b.1 && c.0 < b.0) {
            best = i;
        }
    }
    best
}

/// Draw by `weights` in `cand[i].1`, which sum to `total`.
fn draw(rng: &mut ChaCha8Rng, cand: &[(u32, f32)], total: f64) -> u32 {
    let mut r = rng.random::<f64>() * total;
    for c in cand.iter() {
        r -= c.1 as f64;
        if r <= 0.0 {
            return c.0;
        }
    }
    cand.last().map_or(0, |c| c.0)
}

/// Mirostat 1 or 2 over the biased (and masked) logits: the temperature, the cut, a draw from
/// the softmax of what is left, and `mu` moved toward the target surprise.
fn mirostat(p: &SamplingParams, rng: &mut ChaCha8Rng, cand: &mut Vec<(u32, f32)>, probs: &mut Vec<f32>, mu: &mut f32, n_vocab: usize) -> u32 {
    for c in cand.iter_mut() {
        c.1 /= p.temperature;
    }
    match p.mirostat {
        Mirostat::V1 => stages::mirostat_v1_cut(cand, *mu, n_vocab),
        _ => stages::mirostat_v2_cut(cand, *mu),
    }
    stages::softmax(cand, probs);
    let total: f64 = probs.iter().map(|&q| q as f64).sum();
    let mut r = rng.random::<f64>() * total;
    let mut idx = cand.len() - 1;
    for (i, &q) in probs.iter().enumerate() {
        r -= q as f64;
        if r <= 0.0 {
            idx = i;
            break;
        }
    }
    let surprise = -probs[idx].log2();
    *mu -= p.mirostat_eta * (surprise - p.mirostat_tau);
    cand[idx].0
}
