//! GBNF grammars (llama.cpp's `--grammar`, llama-server's `grammar` field): generation
//! constrained so its text stays the prefix of a text the grammar derives.
//!
//! Design:
//! - [`parse`] reads GBNF into a flat element table ([`Grammar`]): each rule's alternatives
//!   are runs of [`Elem`]s closed by [`Elem::End`], groups and repetitions rewritten into
//!   rules as llama.cpp rewrites them.
//! - The automaton is llama.cpp's: a set of pushdown stacks whose tops are terminals, advanced
//!   a Unicode code point at a time; a token's bytes are decoded with llama.cpp's lenient UTF-8
//!   reader, so a token may end inside a character ([`Partial`]) and the next one finish it.
//!   [`stacks::Stacks`] interns stacks so that a set is a sorted list of ids and expansions are
//!   computed once per sequence.
//! - [`vocab::GrammarVocab`] is the vocabulary as a trie of code points (built once per
//!   tokenizer). [`GrammarMask`] walks it from the current stack set before each sample, so the
//!   tokens that share a prefix share its steps, and a branch no stack takes is left at once;
//!   the resulting token set (a bit per token) is kept for the last [`mask::MEMO`] states, since
//!   a grammar mostly returns to states it has been in (`[a-z]*` stays in one).
//!
//! Which tokens are allowed is llama.cpp's rule (`llama_grammar_apply_impl`): an
//! end-of-generation token only where the grammar is complete (some stack empty); any other
//! token whose piece is empty or starts with a NUL byte never; the rest where some stack takes
//! all its code points, a trailing partial character being one some stack's top could become.
//! Control tokens count as the text of their piece, as there. A token element (`<[id]>`)
//! matches a token that reads as at least one whole character, and (unlike llama.cpp's mask,
//! which its own `accept` then refuses) only where the token starts.
//!
//! Invariant: when every stack is empty, nothing but an end token may follow, and the sequence
//! stops there ([`GrammarMask::is_done`]) — the same tokens llama.cpp would produce.

pub mod mask;
mod parse;
mod sets;
pub mod stacks;
pub mod vocab;

pub use mask::GrammarMask;
pub use vocab::GrammarVocab;

use crate::Error;

/// One element of a rule's alternative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// The end of an alternative.
    End,
    /// A reference to rule `.0`.
    Ref(u32),
    /// A character class: ranges `ranges[at..at + n]` (inclusive), or any character but them.
    Chars { neg: bool, at: u32, n: u32 },
    /// Any character (`.`).
    Any,
    /// The token `id` (`<[id]>`), or any token but it (`!<[id]>`).
    Token { id: u32, not: bool },
}

/// A compiled grammar: the element table and each rule's alternatives.
#[derive(Debug, Clone)]
pub struct Grammar {
    pub elems: Vec<Elem>,
    ranges: Vec<(u32, u32)>,
    /// Per rule, where each alternative starts in `elems`.
    alts: Vec<Vec<u32>>,
    names: Vec<String>,
    root: u32,
}

/// The state of a character cut by a token's end: the bits read so far and how many
/// continuation bytes remain (0: none pending).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Partial {
    pub value: u32,
    pub remain: u8,
}

impl Grammar {
    /// Parse GBNF text; the start symbol is `root`. The error names the line and column.
    pub fn parse(src: &str) -> Result<Grammar, Error> {
        parse::parse(src).map_err(Error::Grammar)
    }

    /// Refuse token elements outside a vocabulary of `n_vocab`.
    pub fn check_tokens(&self, n_vocab: usize) -> Result<(), Error> {
        for e in &self.elems {
            if let Elem::Token { id, .. } = *e {
                if id as usize >= n_vocab {
                    return Err(Error::Grammar(format!("token <[{id}]> is outside the vocabulary of {n_vocab}")));
                }
            }
        }
        Ok(())
    }

    pub fn n_rules(&self) -> usize {
        self.alts.len()
    }

    /// Does terminal `pos` take code point `c`? (`false` for a token element.)
    pub fn matches(&self, pos: u32, c: u32) -> bool {
        match self.elems[pos as usize] {
            Elem::Any => true,
            Elem::Chars { neg, at, n } => self.ranges[at as usize..(at + n) as usize].iter().any(|&(lo, hi)| lo <= c && c <= hi) != neg,
            _ => false,
        }
    }

    /// Could terminal `pos` take the character `p` is the start of (llama.cpp's
    /// `match_partial_char`)?
    pub fn matches_partial(&self, pos: u32, p: Partial) -> bool {
        let n = p.remain as u32;
        // A 7-bit character split across two bytes (overlong).
        if n == 1 && p.value < 2 {
            return false;
        }
        let mut low = p.value << (n * 6);
        let high = low | ((1 << (n * 6)) - 1);
        if low == 0 {
            low = match n {
                2 => 1 << 11,
                3 => 1 << 16,
                _ => low,
            };
        }
        match self.elems[pos as usize] {
            Elem::Any => true,
            Elem::Chars { neg, at, n } => self.ranges[at as usize..(at + n) as usize].iter().any(|&(lo, hi)| lo <= high && low <= hi) != neg,
            _ => false,
        }
    }

    /// A rule that can reach itself without taking a character (its automaton would expand
    /// forever), if any.
    fn left_recursive(&self) -> Option<u32> {
        let n = self.alts.len();
        let elems_of = |a: u32| self.elems[a as usize..].iter().take_while(|e| **e != Elem::End);
        // Rules that derive the empty text (fixpoint).
        let mut nullable = vec![false; n];
        loop {
            let mut changed = false;
            for r in 0..n {
                if !nullable[r] && self.alts[r].iter().any(|&a| elems_of(a).all(|e| matches!(e, Elem::Ref(s) if nullable[*s as usize]))) {
                    nullable[r] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        // Rule → the rules it can start with.
        let left: Vec<Vec<u32>> = (0..n)
            .map(|r| {
                let mut out = Vec::new();
                for &a in &self.alts[r] {
                    for e in elems_of(a) {
                        match *e {
                            Elem::Ref(s) => {
                                out.push(s);
                                if !nullable[s as usize] {
                                    break;
                                }
                            }
                            _ => break,
                        }
                    }
                }
                out
            })
            .collect();
        // Depth-first search for a cycle: 0 new, 1 on the path, 2 done.
        let mut color = vec![0u8; n];
        for start in 0..n {
            if color[start] != 0 {
                continue;
            }
            let mut path: Vec<(u32, usize)> = vec![(start as u32, 0)];
            color[start] = 1;
            while let Some(&mut (r, ref mut i)) = path.last_mut() {
                if let Some(&s) = left[r as usize].get(*i) {
                    *i += 1;
                    match color[s as usize] {
                        1 => return Some(s),
                        0 => {
                            color[s as usize] = 1;
                            path.push((s, 0));
                        }
                        _ => {}
                    }
                } else {
                    color[r as usize] = 2;
                    path.pop();
                }
            }
        }
        None
    }
}

/// Decode `bytes` after `start` as llama.cpp's `decode_utf8` does (continuation bytes are not
/// checked after a lead byte; a NUL byte ends the text), pushing whole code points to `out`.
/// The character left cut at the end, or `None` where a byte cannot be read (a stray
/// continuation byte, or a lead byte where a continuation was due).
pub fn decode(bytes: &[u8], start: Partial, out: &mut Vec<u32>) -> Option<Partial> {
    let bytes = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())];
    let (mut value, mut remain) = (start.value, start.remain);
    let mut i = 0;
    while i < bytes.len() && remain > 0 {
        if bytes[i] >> 6 != 2 {
            return None;
        }
        value = (value << 6) + (bytes[i] & 0x3F) as u32;
        i += 1;
        remain -= 1;
    }
    if start.remain > 0 && remain == 0 {
        out.push(value);
    }
    while i < bytes.len() {
        let first = bytes[i];
        remain = match first >> 4 {
            0..=7 => 0,
            8..=11 => return None,
            12 | 13 => 1,
            14 => 2,
            _ => 3,
        };
        value = (first & ((1u8 << (7 - remain)) - 1)) as u32;
        i += 1;
        while i < bytes.len() && remain > 0 {
            value = (value << 6) + (bytes[i] & 0x3F) as u32;
            i += 1;
            remain -= 1;
        }
        if remain == 0 {
            out.push(value);
        }
    }
    Some(if remain == 0 { Partial::default() } else { Partial { value, remain } })
}

#[cfg(test)]
mod tests;
