//! The per-sequence grammar constraint: its stack set, and which tokens may follow.

use super::sets::Sets;
use super::stacks::{Stacks, NIL};
use super::vocab::GrammarVocab;
use super::{decode, Elem, Grammar, Partial};
use crate::sample::Sampler;
use crate::tokenizer::Tokenizer;
use crate::Error;
use std::sync::Arc;

/// States whose token sets a mask keeps (each a bit per token).
pub const MEMO: usize = 16;

/// A remembered state (stack set, cut character) and its token set.
type Memo = ((Vec<u32>, Partial), Vec<u64>);

/// Interned stacks past which a sequence's table is rebuilt from its live stacks.
const COMPACT_AT: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct GrammarMask {
    grammar: Arc<Grammar>,
    stacks: Stacks,
    /// The current stack set (sorted ids; [`NIL`] where the grammar is complete).
    set: Vec<u32>,
    /// A character the last token left cut.
    partial: Partial,
    /// The token sets of the last [`MEMO`] states met, by (stack set, partial); `cur` is the
    /// current state's slot once computed ([`prepare`](Self::prepare)).
    memo: Vec<Memo>,
    memo_next: usize,
    cur: Option<usize>,
    /// The trie walk's stack sets and its path (reused).
    sets: Sets,
    path: Vec<(u32, u32, usize)>,
    cps: Vec<u32>,
    /// [`next`](Self::next)'s result and its two working sets (reused).
    after: Vec<u32>,
    work: [Vec<u32>; 2],
}

impl GrammarMask {
    /// Before the first token of a text of `grammar`.
    pub fn new(grammar: Arc<Grammar>) -> GrammarMask {
        let mut stacks = Stacks::default();
        let mut set = Vec::new();
        stacks.start(&grammar, &mut set);
        GrammarMask { grammar, stacks, set, partial: Partial::default(), memo: vec![], memo_next: 0, cur: None, sets: Sets::default(), path: vec![], cps: vec![], after: vec![], work: [vec![], vec![]] }
    }

    /// May token `id` come next? (Computes the whole token set of this state, or finds it
    /// remembered.)
    pub fn allows(&mut self, vocab: &GrammarVocab, tok: &Tokenizer, id: u32) -> bool {
        let m = self.prepare(vocab, tok);
        let bits = &self.memo[m].1;
        bits.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1)
    }

    /// Draw the next token with `sampler` among those the grammar takes. Greedy sampling first
    /// checks the best token alone and computes the whole token set only when the grammar
    /// refuses it (the same token either way, as llama.cpp's common sampler does); sampling at
    /// a temperature draws from the masked distribution.
    pub fn sample(&mut self, vocab: &GrammarVocab, tok: &Tokenizer, sampler: &mut Sampler, logits: &[f32]) -> Result<u32, Error> {
        if sampler.params.is_greedy() {
            let best = sampler.sample(logits);
            if self.takes(vocab, tok, best) {
                return Ok(best);
            }
        }
        let m = self.prepare(vocab, tok);
        let bits = &self.memo[m].1;
        let allowed = |id: u32| bits.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1);
        sampler.sample_allowed(logits, Some(allowed)).ok_or_else(|| Error::Sampling("no token of the vocabulary continues the grammar".into()))
    }

    /// Is the grammar complete with nothing more it could take (only an end token may follow)?
    pub fn is_done(&self) -> bool {
        self.set == [NIL] && self.partial.remain == 0
    }

    /// Take the sampled token `id`; whether the text is now done ([`is_done`](Self::is_done)).
    pub fn closes_with(&mut self, vocab: &GrammarVocab, tok: &Tokenizer, id: u32) -> bool {
        self.accept(vocab, tok, id) && self.is_done()
    }

    /// Does the grammar take token `id` here? (One token walked, no token set computed.)
    pub fn takes(&mut self, vocab: &GrammarVocab, tok: &Tokenizer, id: u32) -> bool {
        if tok.is_eog(id) {
            return self.set.contains(&NIL);
        }
        self.next(vocab, tok, id).is_some()
    }

    /// Take token `id`; `false` (the state unchanged) if the grammar does not take it.
    pub fn accept(&mut self, vocab: &GrammarVocab, tok: &Tokenizer, id: u32) -> bool {
        if tok.is_eog(id) {
            return self.set.contains(&NIL);
        }
        let Some(end) = self.next(vocab, tok, id) else { return false };
        self.commit(end);
        true
    }

    /// Take `text` as characters (a lazy grammar's text from its trigger on, which may end
    /// inside a character); `false` (the state unchanged) if the grammar does not take it.
    pub fn accept_text(&mut self, text: &[u8]) -> bool {
        if text.is_empty() {
            return true;
        }
        let Some(end) = self.next_chars(text, None) else { return false };
        self.commit(end);
        true
    }

    /// Make `after` the current set, with `end` the character left cut.
    fn commit(&mut self, end: Partial) {
        std::mem::swap(&mut self.set, &mut self.after);
        self.partial = end;
        self.cur = None;
        if self.stacks.len() > COMPACT_AT {
            self.stacks.compact(&mut self.set);
            self.set.sort_unstable();
            self.memo.clear();
            self.memo_next = 0;
            self.sets.clear();
        }
    }

    /// The stacks after non-end token `id` (into `after`: every stack its whole characters
    /// leave, as llama.cpp keeps them) and the character it leaves cut; `None` where the grammar
    /// refuses it (no stack takes its characters, or none could take the cut one).
    fn next(&mut self, vocab: &GrammarVocab, tok: &Tokenizer, id: u32) -> Option<Partial> {
        let piece = tok.piece(id);
        if piece.first().is_none_or(|&b| b == 0) {
            return None;
        }
        self.next_chars(piece, Some((id, vocab.whole[id as usize])))
    }

    /// [`next`](Self::next) for the bytes `piece`: of token `token` (its id, and whether it
    /// reads as whole characters, for token elements), or of text (`None`: no token element
    /// takes it).
    fn next_chars(&mut self, piece: &[u8], token: Option<(u32, bool)>) -> Option<Partial> {
        let g = self.grammar.clone();
        let mut cps = std::mem::take(&mut self.cps);
        cps.clear();
        let end = decode(piece, self.partial, &mut cps);
        let [mut cur, mut step] = std::mem::take(&mut self.work);
        let mut next = std::mem::take(&mut self.after);
        next.clear();
        let set = std::mem::take(&mut self.set);
        for &s in set.iter().filter(|_| end.is_some()) {
            if s == NIL {
                continue;
            }
            if let Elem::Token { id: t, not } = g.elems[self.stacks.top(s) as usize] {
                if token.is_some_and(|(id, whole)| (t == id) != not && whole) && self.partial.remain == 0 {
                    let span = self.stacks.after(&g, s);
                    next.extend_from_slice(self.stacks.list(span));
                }
                continue;
            }
            cur.clear();
            cur.push(s);
            for &c in &cps {
                self.step(&cur, c, &mut step);
                std::mem::swap(&mut cur, &mut step);
                if cur.is_empty() {
                    break;
                }
            }
            next.extend_from_slice(&cur);
        }
        self.set = set;
        self.cps = cps;
        self.work = [cur, step];
        next.sort_unstable();
        next.dedup();
        let end = end?;
        let ok = !next.is_empty() && (end.remain == 0 || next.iter().any(|&s| s != NIL && g.matches_partial(self.stacks.top(s), end)));
        self.after = next;
        ok.then_some(end)
    }

    /// `out` = the stacks of `set` after code point `c`.
    fn step(&mut self, set: &[u32], c: u32, out: &mut Vec<u32>) {
        out.clear();
        for &s in set {
            if s != NIL && self.grammar.matches(self.stacks.top(s), c) {
                let span = self.stacks.after(&self.grammar, s);
                out.extend_from_slice(self.stacks.list(span));
            }
        }
        out.sort_unstable();
        out.dedup();
    }

    /// The memo slot of the current state's token set: remembered, or computed into a new slot
    /// (or the oldest).
    fn prepare(&mut self, vocab: &GrammarVocab, tok: &Tokenizer) -> usize {
        if let Some(m) = self.cur {
            return m;
        }
        if let Some(m) = self.memo.iter().position(|((set, p), _)| *set == self.set && *p == self.partial) {
            self.cur = Some(m);
            return m;
        }
        let mut bits = if self.memo.len() < MEMO {
            vec![0u64; vocab.n_vocab.div_ceil(64)]
        } else {
            let mut old = std::mem::take(&mut self.memo[self.memo_next].1);
            old.fill(0);
            old
        };
        if self.partial.remain == 0 {
            self.walk(vocab, &mut bits);
        } else {
            self.each_token(vocab, tok, &mut bits);
        }
        let set = |bits: &mut [u64], id: u32| bits[id as usize / 64] |= 1 << (id % 64);
        if self.set.contains(&NIL) {
            for &id in &vocab.eog {
                set(&mut bits, id);
            }
        }
        // Token elements, where the token starts.
        for &s in &self.set {
            if s == NIL || self.partial.remain != 0 {
                continue;
            }
            if let Elem::Token { id, not } = self.grammar.elems[self.stacks.top(s) as usize] {
                for &t in &vocab.text {
                    if (t == id) != not && vocab.whole[t as usize] {
                        set(&mut bits, t);
                    }
                }
            }
        }
        let m = if self.memo.len() < MEMO {
            self.memo.push(((self.set.clone(), self.partial), bits));
            self.memo.len() - 1
        } else {
            // The oldest slot, its set's buffer reused.
            let m = self.memo_next;
            let ((set, partial), old) = &mut self.memo[m];
            set.clear();
            set.extend_from_slice(&self.set);
            *partial = self.partial;
            *old = bits;
            self.memo_next = (m + 1) % MEMO;
            m
        };
        self.cur = Some(m);
        m
    }

    /// The trie walk from a character boundary: a node is entered with the stack set that took
    /// its code points ([`Sets`]), and left as soon as none did.
    fn walk(&mut self, vocab: &GrammarVocab, bits: &mut [u64]) {
        self.sets.trim();
        let root = self.sets.intern(&self.stacks, &self.set);
        // (node, set, next child).
        let mut path: Vec<(u32, u32, usize)> = std::mem::take(&mut self.path);
        path.clear();
        path.push((0, root, 0));
        while let Some(&mut (node, set, ref mut k)) = path.last_mut() {
            if *k == 0 {
                self.mark(vocab, node, set, bits);
            }
            let kids = vocab.kids(node);
            let Some(&(c, child)) = kids.get(*k) else {
                path.pop();
                continue;
            };
            *k += 1;
            if let Some(next) = self.sets.step(&self.grammar, &mut self.stacks, set, c) {
                path.push((child, next, 0));
            }
        }
        self.path = path;
    }

    /// Set the bits of the tokens that end at trie `node`, reached with stack set `set`.
    fn mark(&self, vocab: &GrammarVocab, node: u32, set: u32, bits: &mut [u64]) {
        for &id in vocab.ends(node) {
            bits[id as usize / 64] |= 1 << (id % 64);
        }
        for &(id, p) in vocab.cuts(node) {
            if self.sets.get(set).iter().any(|&s| s != NIL && self.grammar.matches_partial(self.stacks.top(s), p)) {
                bits[id as usize / 64] |= 1 << (id % 64);
            }
        }
    }

    /// After a token that cut a character: each token tried alone from that character's rest.
    fn each_token(&mut self, vocab: &GrammarVocab, tok: &Tokenizer, bits: &mut [u64]) {
        for i in 0..vocab.text.len() {
            let id = vocab.text[i];
            if self.next(vocab, tok, id).is_some() {
                bits[id as usize / 64] |= 1 << (id % 64);
            }
        }
    }
}
