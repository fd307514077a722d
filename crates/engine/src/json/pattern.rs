//! A string's `pattern` (JSON Schema: a regular expression the string must match somewhere)
//! as a DFA over the string's decoded bytes, so the automaton in [`super::state`] can tell at
//! every byte whether the string can still become a match.
//!
//! Design: the pattern `P` becomes `(?s:.*)(?:P)(?s:.*)` — JSON Schema's patterns are not
//! anchored, `^`/`$` inside `P` still anchor — compiled by `regex-automata` into a dense DFA
//! run anchored from the string's first byte, with every match kind kept (`MatchKind::All`),
//! in UTF-8 mode (it matches only valid UTF-8, as a JSON string holds). The syntax is Rust's
//! `regex` (no look-around or back-references; `\d`, `\w`, `\s` are Unicode-aware, as in
//! Python's `re`). At compile time a search from the start state over the bytes a string can
//! hold (raw text 0x20‥0xFF, `"` and `\` through their escapes, and `\b \f \n \r \t`) marks
//! the *live* states: those from which a match is still reachable. A byte into a state that is
//! not live is refused, so every prefix taken can still be completed, and the closing `"` is
//! taken only where the text matches.
//!
//! Invariant: the automaton feeds the pattern the string's decoded bytes: raw text, and the
//! character of a short escape; a `\u` escape is refused in a patterned string (its text is
//! written as UTF-8 instead), so the decoded bytes are known a byte at a time.

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

/// Most bytes the DFA and its determinization may take: a pattern past it is refused as too
/// complex rather than slowing every schema compile.
const SIZE_LIMIT: usize = 8 << 20;

/// The bytes a JSON string's decoded text can hold here: raw text and short escapes.
fn holdable(b: u8) -> bool {
    b >= 0x20 || matches!(b, 0x08 | 0x09 | 0x0A | 0x0C | 0x0D)
}

/// A compiled `pattern` (see the module doc).
#[derive(Clone, Debug)]
pub(super) struct Pattern {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
    /// Whether the state of index `id >> stride2` can still reach a match.
    live: Vec<bool>,
}

impl Pattern {
    /// Compile `pattern`, or say why not (bad syntax, too complex, no JSON string matches it).
    pub(super) fn compile(pattern: &str) -> Result<Pattern, String> {
        // Checked alone first, so that an error is about the pattern as written (its last line:
        // the parser's message after a picture of where).
        regex_automata::util::syntax::parse(pattern).map_err(|e| {
            let e = e.to_string();
            format!("pattern {pattern:?}: {}", e.lines().last().unwrap_or_default().trim_start_matches("error: "))
        })?;
        let wrapped = format!("(?s:.*)(?:{pattern})(?s:.*)");
        let dfa = dense::Builder::new()
            .configure(
                dense::DFA::config()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    // `\b` where the text is ASCII; a non-ASCII byte then ends the search (a
                    // quit state), which the live states below leave out: such a string is
                    // held to ASCII.
                    .unicode_word_boundary(true)
                    .dfa_size_limit(Some(SIZE_LIMIT))
                    .determinize_size_limit(Some(SIZE_LIMIT)),
            )
            .build(&wrapped)
            .map_err(|e| format!("pattern {pattern:?}: {e}"))?;
        let start = dfa.start_state(&start::Config::new().anchored(Anchored::Yes)).map_err(|e| format!("pattern {pattern:?}: {e}"))?;
        let index = |s: StateID| s.as_usize() >> dfa.stride2();
        // Every state reachable from the start through holdable bytes, with its successors.
        let mut seen: Vec<Option<Vec<usize>>> = Vec::new();
        let mut order = vec![start];
        let mut todo = vec![start];
        while let Some(s) = todo.pop() {
            let i = index(s);
            if seen.len() <= i {
                seen.resize(i + 1, None);
            }
            let mut next: Vec<usize> = Vec::new();
            for b in (0..=255u8).filter(|&b| holdable(b)) {
                let t = dfa.next_state(s, b);
                if dfa.is_dead_state(t) || dfa.is_quit_state(t) {
                    continue;
                }
                let j = index(t);
                if !next.contains(&j) {
                    next.push(j);
                }
                if seen.get(j).is_none_or(Option::is_none) && !order.contains(&t) {
                    order.push(t);
                    todo.push(t);
                }
            }
            seen[i] = Some(next);
        }
        // Live: a match at the end of the string, or a live successor (to a fixed point).
        let mut live = vec![false; seen.len()];
        for &s in &order {
            live[index(s)] = dfa.is_match_state(dfa.next_eoi_state(s));
        }
        let mut changed = true;
        while changed {
            changed = false;
            for &s in &order {
                let i = index(s);
                if !live[i] && seen[i].as_ref().is_some_and(|n| n.iter().any(|&j| live[j])) {
                    live[i] = true;
                    changed = true;
                }
            }
        }
        if !live[index(start)] {
            return Err(format!("pattern {pattern:?}: no JSON string matches it"));
        }
        Ok(Pattern { dfa, start, live })
    }

    /// The state before a string's first byte.
    pub(super) fn start(&self) -> StateID {
        self.start
    }

    /// The state after decoded byte `b`, if a match can still follow.
    pub(super) fn step(&self, s: StateID, b: u8) -> Option<StateID> {
        let t = self.dfa.next_state(s, b);
        self.live.get(t.as_usize() >> self.dfa.stride2()).copied().unwrap_or(false).then_some(t)
    }

    /// Does the text that led to `s` match (may the string close here)?
    pub(super) fn matches(&self, s: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }
}

/// The decoded byte of the short escape `\b` (`b` after the backslash), or `None` for `\u`
/// (refused in a patterned string) and anything else.
pub(super) fn unescape(b: u8) -> Option<u8> {
    Some(match b {
        b'"' | b'\\' | b'/' => b,
        b'b' => 0x08,
        b'f' => 0x0C,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `text` (decoded bytes) matches, feeding `p` a byte at a time.
    fn run(p: &Pattern, text: &str) -> Option<bool> {
        let mut s = p.start();
        for &b in text.as_bytes() {
            s = p.step(s, b)?;
        }
        Some(p.matches(s))
    }

    #[test]
    fn anchored_and_unanchored_patterns_match_as_json_schema_says() {
        let p = Pattern::compile("^[A-Z]{3}-[0-9]{3}$").unwrap();
        assert_eq!(run(&p, "ABC-123"), Some(true));
        assert_eq!(run(&p, "ABC-12"), Some(false), "a prefix");
        assert_eq!(run(&p, "abc"), None, "refused at its first byte");
        assert_eq!(run(&p, "ABC-1234"), None);
        // Unanchored: somewhere in the string.
        let p = Pattern::compile("cat").unwrap();
        assert_eq!(run(&p, "concatenate"), Some(true));
        assert_eq!(run(&p, "dog"), Some(false), "a match may still come");
        let p = Pattern::compile("^a|b$").unwrap();
        assert_eq!(run(&p, "axx"), Some(true));
        assert_eq!(run(&p, "xxb"), Some(true));
        assert_eq!(run(&p, "xba"), Some(false));
        // Unicode classes and characters.
        let p = Pattern::compile(r"^\p{Greek}+ é$").unwrap();
        assert_eq!(run(&p, "αβγ é"), Some(true));
        assert_eq!(run(&p, "abc"), None);
    }

    #[test]
    fn bad_or_impossible_patterns_are_refused_by_name() {
        for (p, why) in [
            ("(?<=a)b", "look-around"),
            ("a(", "unclosed group"),
            ("^\\x00$", "no JSON string"),
            ("^[\\x01-\\x07]", "no JSON string"),
            ("(a|b)*a(a|b){24}", "size limit"),
        ] {
            let e = Pattern::compile(p).expect_err(p);
            assert!(e.contains(why), "{p}: {e}");
        }
        // `\b` holds the string to ASCII.
        let p = Pattern::compile(r"\bcat\b").unwrap();
        assert_eq!(run(&p, "a cat!"), Some(true));
        assert_eq!(run(&p, "concat"), Some(false));
        assert_eq!(run(&p, "é"), None);
        // A control character a short escape writes is fine.
        assert!(Pattern::compile("^a\\nb$").is_ok());
        assert_eq!(unescape(b'n'), Some(b'\n'));
        assert_eq!(unescape(b'u'), None);
    }
}
