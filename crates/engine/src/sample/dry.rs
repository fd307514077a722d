//! DRY ("don't repeat yourself", llama.cpp's `llama_sampler_dry`, from koboldcpp): a token
//! that would extend a sequence already seen in the last `penalty_last_n` tokens loses
//! `multiplier · base^(length − allowed_length)` from its logit, where `length` is the longest
//! such repeat it would continue. Sequence breakers (`"\n"`, `":"`, `"\""`, `"*"` by default)
//! end the look back: no repeat is counted across one, and a token that is one is never
//! penalised.
//!
//! A breaker is a text; [`Breakers::new`] finds, once per request, every token whose piece
//! contains it (a one-token breaker) or ends with its beginning (the head of a breaker whose
//! rest is the tokenization of what remains, at most 20 tokens), as llama.cpp does.
//!
//! The repeats are found with the Z-algorithm run backwards over the window (linear in its
//! length); the window and the per-position counts live in buffers sized at creation.

use crate::Tokenizer;
use std::collections::HashMap;

/// How long a breaker may be (bytes) and how many tokens its tail may take (llama.cpp's).
const MAX_CHARS: usize = 40;
const MAX_TAIL: usize = 20;

/// Breakers by their head token: each tail (empty for a one-token breaker).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Breakers(HashMap<u32, Vec<Vec<u32>>>);

impl Breakers {
    /// llama.cpp's default breakers: newline, colon, quote, asterisk.
    pub const DEFAULT: [&'static str; 4] = ["\n", ":", "\"", "*"];

    /// Every way `texts` can start in `tok`'s vocabulary. Empty texts are skipped; a text over
    /// 40 bytes is cut there.
    pub fn new(tok: &Tokenizer, texts: &[impl AsRef<str>]) -> Breakers {
        let mut map: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        for text in texts {
            let mut s = text.as_ref().as_bytes();
            if s.is_empty() {
                continue;
            }
            if s.len() > MAX_CHARS {
                s = &s[..MAX_CHARS];
            }
            for id in 0..tok.n_vocab() as u32 {
                let word = tok.piece(id);
                if word.windows(s.len()).any(|w| w == s) {
                    push_unique(&mut map, id, vec![]);
                    continue;
                }
                // Each place the word ends with a beginning of `s`: the rest of `s` follows.
                for pos in (0..word.len()).filter(|&p| word[p] == s[0]) {
                    let n = word.len() - pos;
                    if n < s.len() && word[pos..] == s[..n] {
                        let rest = String::from_utf8_lossy(&s[n..]);
                        let mut tail = tok.encode(&rest, false, false).unwrap_or_default();
                        tail.truncate(MAX_TAIL);
                        push_unique(&mut map, id, tail);
                    }
                }
            }
        }
        Breakers(map)
    }

    /// The breakers of these token sequences, each a head token and its tail (for tests and
    /// for callers that hold token ids).
    pub fn from_tokens(seqs: &[Vec<u32>]) -> Breakers {
        let mut map: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        for s in seqs.iter().filter(|s| !s.is_empty()) {
            push_unique(&mut map, s[0], s[1..].iter().take(MAX_TAIL).copied().collect());
        }
        Breakers(map)
    }
}

fn push_unique(map: &mut HashMap<u32, Vec<Vec<u32>>>, head: u32, tail: Vec<u32>) {
    let tails = map.entry(head).or_default();
    if !tails.contains(&tail) {
        tails.push(tail);
    }
}

/// DRY's working buffers, sized once for a window of `last_n` tokens.
#[derive(Debug)]
pub(crate) struct DryState {
    /// The window, newest first (`back[i]` is llama.cpp's `last_tokens.rat(i)`).
    back: Vec<u32>,
    repeat: Vec<usize>,
    /// Token → the longest repeat it would continue.
    pub(crate) extend: HashMap<u32, usize>,
}

impl DryState {
    pub(crate) fn new(last_n: usize) -> DryState {
        DryState { back: Vec::with_capacity(last_n), repeat: Vec::with_capacity(last_n), extend: HashMap::with_capacity(last_n) }
    }

    /// Fill [`extend`](Self::extend) from the `window` (oldest first; at most the last
    /// `last_n` are read): the tokens that would continue a repeat of at least
    /// `allowed_length` tokens, each with its longest.
    pub(crate) fn find(&mut self, window: impl DoubleEndedIterator<Item = u32>, last_n: usize, allowed_length: usize, breakers: &Breakers) {
        self.extend.clear();
        self.back.clear();
        self.back.extend(window.rev().take(last_n));
        let n = self.back.len();
        if n <= allowed_length {
            return;
        }
        let back = &self.back;
        // Step 1: the nearest breaker limits how far back a repeat may reach.
        let mut rep_limit = n;
        for i in 0..n {
            let Some(tails) = breakers.0.get(&back[i]) else { continue };
            let mut longest: Option<usize> = None;
            for tail in tails {
                let len = tail.len();
                if longest.is_none_or(|l| len > l) && len <= i && (0..len).all(|o| tail[o] == back[i - o - 1]) {
                    longest = Some(len);
                }
            }
            if let Some(len) = longest {
                rep_limit = i - len;
                break;
            }
        }
        if rep_limit < allowed_length {
            return;
        }
        // Step 2: repeat[n-1-k] = how many of the newest tokens also end k tokens back (the
        // Z-algorithm over the reversed window), at most `rep_limit`.
        self.repeat.clear();
        self.repeat.resize(n, 0);
        let last = n - 1;
        let (mut lt, mut rt) = (0usize, 0usize);
        for k in 1..n {
            if k > rt {
                let mut m = 0;
                while m + k < n && back[m] == back[m + k] {
                    m += 1;
                }
                self.repeat[last - k] = m.min(rep_limit);
                if m > 0 {
                    lt = k;
                    rt = k + m - 1;
                }
            } else {
                let p = k - lt;
                let right = rt - k + 1;
                if self.repeat[last - p] < right {
                    self.repeat[last - k] = self.repeat[last - p].min(rep_limit);
                } else {
                    let mut i = rt + 1;
                    while i < n && back[i] == back[i - k] {
                        i += 1;
                    }
                    self.repeat[last - k] = (i - k).min(rep_limit);
                    lt = k;
                    rt = i - 1;
                }
            }
        }
        // Step 3: the token after each repeat would extend it.
        for i in 0..n - 1 {
            let len = self.repeat[i];
            if len >= allowed_length {
                let t = back[n - 2 - i];
                let e = self.extend.entry(t).or_insert(len);
                *e = (*e).max(len);
            }
        }
    }

    /// The penalty for `token` (0 when it continues no repeat or is a one-token breaker).
    pub(crate) fn penalty(&self, token: u32, multiplier: f32, base: f32, allowed_length: usize, breakers: &Breakers) -> f32 {
        let Some(&len) = self.extend.get(&token) else { return 0.0 };
        if breakers.0.get(&token).is_some_and(|tails| tails.iter().any(|t| t.is_empty())) {
            return 0.0;
        }
        // Clamp the exponent so that base^exp stays finite.
        let max_exp = if base > 1.000001 { (88.722_84_f32 / base.ln()) as i64 } else { 0 };
        let mut exp = len as i64 - allowed_length as i64;
        if max_exp > 0 && exp > max_exp {
            exp = max_exp;
        }
        // As llama.cpp: a float times std::pow's double, rounded once.
        (multiplier as f64 * (base as f64).powf(exp as f64)) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition: for each distance k back, how many of the newest tokens also end
    /// there (at most `limit`); the token after that earlier place would extend the repeat.
    fn naive(back: &[u32], allowed: usize, limit: usize) -> HashMap<u32, usize> {
        let n = back.len();
        let mut out = HashMap::new();
        for k in 1..n {
            let m = (0..n - k).take_while(|&t| back[t] == back[t + k]).count().min(limit);
            if m >= allowed {
                let e = out.entry(back[k - 1]).or_insert(m);
                *e = (*e).max(m);
            }
        }
        out
    }

    proptest! {
        #[test]
        fn repeats_are_the_definitions(window in proptest::collection::vec(0u32..3, 0..60), allowed in 0usize..4, brk in proptest::option::of(0u32..4)) {
            let breakers = Breakers::from_tokens(&brk.map(|b| vec![vec![b]]).unwrap_or_default());
            let mut st = DryState::new(64);
            st.find(window.iter().copied(), 64, allowed, &breakers);
            let back: Vec<u32> = window.iter().rev().copied().collect();
            let n = back.len();
            let limit = brk.and_then(|b| back.iter().position(|&t| t == b)).unwrap_or(n);
            let want = if n <= allowed || limit < allowed { HashMap::new() } else { naive(&back, allowed, limit) };
            prop_assert_eq!(&st.extend, &want);
        }
    }

    #[test]
    fn a_two_token_breaker_limits_only_where_both_stand() {
        // Breaker 7 8: the window ends ... 1 2 7 8 1 2 and an earlier 1 2 3.
        let breakers = Breakers::from_tokens(&[vec![7, 8]]);
        let window = [1u32, 2, 3, 5, 1, 2, 7, 8, 1, 2];
        let mut st = DryState::new(64);
        st.find(window.iter().copied(), 64, 1, &breakers);
        // The look back stops at the breaker: only the 2-token repeat "1 2" counts.
        assert_eq!(st.extend.get(&3), Some(&2));
        assert_eq!(st.extend.get(&7), Some(&2));
        assert_eq!(st.penalty(3, 1.0, 2.0, 1, &breakers), 2.0);
        // A one-token breaker is never penalised; a breaker's head alone is.
        let one = Breakers::from_tokens(&[vec![3]]);
        assert_eq!(st.penalty(3, 1.0, 2.0, 1, &one), 0.0);
    }
}
