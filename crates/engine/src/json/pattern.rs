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
//! Beside `maxLength`, each state's shortest way to a match (in characters) says whether a
//! match still fits; beside a `minLength` the pattern does not imply, a copy of the pattern
//! carries each state's lengths of completion ([`Pattern::with_lengths`]).
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
    /// The fewest characters (bytes that begin one) from the state of that index to a match
    /// (`u32::MAX` where none is reachable), for a string that also has a `maxLength`.
    shortest: Vec<u32>,
    /// The most of `shortest` over the live states: a string with at least this many
    /// characters left (past a token's) cannot be stopped by its `maxLength`.
    worst: u32,
    /// Each reachable state's predecessors and the characters the byte between begins (0 or
    /// 1, both where bytes of both kinds lead there), indexed as `live` is.
    preds: Vec<Vec<(usize, u32)>>,
    /// For a string held to a `minLength` the pattern does not imply: which lengths of
    /// completion each state has ([`Lengths`]).
    lengths: Option<Lengths>,
}

/// Bit `k` of state `i`'s row: some completion of exactly `k` characters leads from state `i`
/// to a match, for `k` up to `limit`: the `maxLength`, or the `minLength` plus the state count
/// where that is less. A completion longer than `lo` + the state count repeats a state, and
/// losing that cycle (at most a state count of characters) leaves one of at least `lo`: so
/// where a string needs `lo ..= hi` more characters, bits `lo ..= min(hi, limit)` decide.
#[derive(Clone, Debug)]
struct Lengths {
    limit: u32,
    words: usize,
    bits: Vec<u64>,
}

/// Most bits of a [`Lengths`] table (8 MB).
const MAX_LENGTH_BITS: usize = 1 << 26;

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
        // Every state reachable from the start through holdable bytes, with the states each
        // is reached from (indexed as `live` is).
        // (`preds` and `queued` grow together, to the highest index met.)
        // Each edge weighs the characters its byte begins: 0 for a UTF-8 continuation byte.
        let mut preds: Vec<Vec<(usize, u32)>> = vec![Vec::new(); index(start) + 1];
        let mut queued = vec![false; index(start) + 1];
        queued[index(start)] = true;
        let (mut order, mut todo) = (vec![start], vec![start]);
        let mut next: Vec<(StateID, u32)> = Vec::new();
        while let Some(s) = todo.pop() {
            // Its distinct successors (a few: the bytes fall in a few classes), each through
            // its lightest byte.
            next.clear();
            for b in (0..=255u8).filter(|&b| holdable(b)) {
                let (t, w) = (dfa.next_state(s, b), (b & 0xC0 != 0x80) as u32);
                if !dfa.is_dead_state(t) && !dfa.is_quit_state(t) && !next.contains(&(t, w)) {
                    next.push((t, w));
                }
            }
            for &(t, w) in &next {
                let j = index(t);
                if preds.len() <= j {
                    preds.resize(j + 1, Vec::new());
                    queued.resize(j + 1, false);
                }
                preds[j].push((index(s), w));
                if !queued[j] {
                    queued[j] = true;
                    order.push(t);
                    todo.push(t);
                }
            }
        }
        // Live: a match at the end of the string, or a live successor: back from the matches.
        let mut live = vec![false; queued.len()];
        let mut todo: Vec<usize> = order.iter().filter(|&&s| dfa.is_match_state(dfa.next_eoi_state(s))).map(|&s| index(s)).collect();
        todo.iter().for_each(|&i| live[i] = true);
        let ends = todo.clone();
        while let Some(j) = todo.pop() {
            for &(i, _) in &preds[j] {
                if !live[i] {
                    live[i] = true;
                    todo.push(i);
                }
            }
        }
        if !live[index(start)] {
            return Err(format!("pattern {pattern:?}: no JSON string matches it"));
        }
        // Fewest characters to a match: a breadth-first search back from the matches, edges
        // of weight 0 first.
        let mut shortest = vec![u32::MAX; queued.len()];
        let mut queue: std::collections::VecDeque<usize> = ends.iter().copied().collect();
        ends.iter().for_each(|&i| shortest[i] = 0);
        while let Some(j) = queue.pop_front() {
            for &(i, w) in &preds[j] {
                if shortest[j] + w < shortest[i] {
                    shortest[i] = shortest[j] + w;
                    if w == 0 {
                        queue.push_front(i);
                    } else {
                        queue.push_back(i);
                    }
                }
            }
        }
        let worst = shortest.iter().zip(&live).filter(|(_, &l)| l).map(|(&s, _)| s).max().unwrap_or(0);
        Ok(Pattern { dfa, start, live, shortest, worst, preds, lengths: None })
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

    /// The fewest characters that lead from `s` to a match.
    pub(super) fn shortest(&self, s: StateID) -> u32 {
        self.shortest.get(s.as_usize() >> self.dfa.stride2()).copied().unwrap_or(u32::MAX)
    }

    /// The most characters any live state is from a match (with a [`Lengths`] table, more
    /// than any string has: a token's fit then depends on the count).
    pub(super) fn worst(&self) -> u32 {
        if self.lengths.is_some() {
            u32::MAX / 2
        } else {
            self.worst
        }
    }

    /// This pattern for strings of `min ..= max` characters where `min` is more than its
    /// shortest match: with the table of each state's lengths of completion ([`Lengths`]).
    pub(super) fn with_lengths(&self, min: u32, max: u32) -> Result<Pattern, String> {
        let n = self.live.len();
        let limit = max.min(min.saturating_add(n as u32));
        let words = (limit as usize + 1).div_ceil(64);
        if n.saturating_mul(words * 64) > MAX_LENGTH_BITS {
            return Err(format!("minLength {min} beside this pattern needs a table of more than {MAX_LENGTH_BITS} bits"));
        }
        let mut bits = vec![0u64; n * words];
        // `at[i]`: state i has a completion of exactly k characters, k = 0, 1, …: the matches,
        // then one character before the last set, each closed over continuation bytes.
        let mut at: Vec<bool> = (0..n).map(|i| self.live[i] && self.shortest[i] == 0).collect();
        let mut next = vec![false; n];
        let mut todo = Vec::new();
        for k in 0..=limit as usize {
            if k > 0 {
                next.iter_mut().for_each(|x| *x = false);
                for j in (0..n).filter(|&j| at[j]) {
                    for &(i, w) in &self.preds[j] {
                        if w == 1 {
                            next[i] = true;
                        }
                    }
                }
                std::mem::swap(&mut at, &mut next);
            }
            todo.extend((0..n).filter(|&i| at[i]));
            while let Some(j) = todo.pop() {
                for &(i, w) in &self.preds[j] {
                    if w == 0 && !at[i] {
                        at[i] = true;
                        todo.push(i);
                    }
                }
            }
            for i in (0..n).filter(|&i| at[i]) {
                bits[i * words + k / 64] |= 1 << (k % 64);
            }
        }
        Ok(Pattern { lengths: Some(Lengths { limit, words, bits }), ..self.clone() })
    }

    /// May a string in state `t` with `chars` characters so far still end on a match with
    /// `min ..= max` characters? (Without a [`Lengths`] table `min` is one the pattern
    /// implies, and the shortest way to a match decides.)
    pub(super) fn fits(&self, t: StateID, chars: u32, min: u32, max: u32) -> bool {
        let i = t.as_usize() >> self.dfa.stride2();
        let Some(l) = &self.lengths else { return max == u32::MAX || self.shortest(t).saturating_add(chars) <= max };
        if chars > max || i >= self.live.len() {
            return false;
        }
        let (lo, hi) = (min.saturating_sub(chars) as usize, (max - chars).min(l.limit) as usize);
        let row = &l.bits[i * l.words..(i + 1) * l.words];
        (lo <= hi) && (lo / 64..=hi / 64).any(|w| {
            let from = if w == lo / 64 { lo % 64 } else { 0 };
            let to = if w == hi / 64 { hi % 64 } else { 63 };
            row[w] >> from << (63 - (to - from)) != 0
        })
    }

    /// Does the text that led to `s` match (may the string close here)?
    pub(super) fn matches(&self, s: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }
}

/// Gregorian dates `YYYY-MM-DD` from 0001 (Python's `date.min`) with each month's days and
/// 29 February in leap years only (divisible by 4, centuries by 400).
const DATE: &str = concat!(
    "(([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})-",
    "((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))",
    "|([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)"
);
/// `HH:MM:SS`, a fraction of up to 6 digits (Python's microseconds), a zone or none.
const TIME: &str = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?";

/// The pattern a JSON Schema string `format` stands for (anchored), for the formats pydantic
/// writes that a regular expression states exactly: `date`, `time`, `date-time` (RFC 3339, as
/// Python's `datetime` reads them), `uuid` (`uuid1` ‥ `uuid5`: that version and RFC 4122's
/// variant), `ipv4` (dotted decimal, no leading zeros), `email` (a conservative subset of
/// addresses: dot-separated atoms of letters, digits and `_%+-`, a domain of letter-digit
/// labels with inner hyphens and a top-level label of two letters or more), `uri` (RFC 3986's
/// `URI` rule, less the bracketed IP literals of its hosts: a subset, so every answer is one).
pub(super) fn format(name: &str) -> Option<String> {
    let hex = |n: usize| format!("[0-9a-f]{{{n}}}");
    let uuid = |v: &str| format!("^{}-{}-{v}{}-{}-{}$", hex(8), hex(4), hex(3), if v == "[0-9a-f]" { hex(4) } else { format!("[89ab]{}", hex(3)) }, hex(12));
    let octet = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    Some(match name {
        "date" => format!("^{DATE}$"),
        "time" => format!("^{TIME}$"),
        "date-time" => format!("^{DATE}T{TIME}$"),
        "uuid" => uuid("[0-9a-f]"),
        "uuid1" | "uuid3" | "uuid4" | "uuid5" => uuid(&name[4..]),
        "ipv4" => format!("^({octet}\\.){{3}}{octet}$"),
        "email" => "^[A-Za-z0-9_%+-]+(\\.[A-Za-z0-9_%+-]+)*@([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?\\.)+[A-Za-z]{2,}$".to_string(),
        "uri" => uri(),
        _ => return None,
    })
}

/// RFC 3986 §3: `scheme ":" hier-part ["?" query] ["#" fragment]`, the host a `reg-name`
/// (which covers IPv4 addresses).
fn uri() -> String {
    // unreserved, sub-delims; pchar; a %-escape.
    let (unreserved, sub) = ("A-Za-z0-9._~\\-", "!$&'()*+,;=");
    let pct = "%[0-9A-Fa-f]{2}";
    let pchar = format!("(?:[{unreserved}{sub}:@]|{pct})");
    let userinfo = format!("(?:(?:[{unreserved}{sub}:]|{pct})*@)?");
    let host = format!("(?:[{unreserved}{sub}]|{pct})*");
    let segments = format!("(?:/{pchar}*)*");
    let hier = format!("(?://{userinfo}{host}(?::[0-9]*)?{segments}|/(?:{pchar}+{segments})?|{pchar}+{segments}|)");
    format!("^[A-Za-z][A-Za-z0-9+.\\-]*:{hier}(?:\\?(?:{pchar}|[/?])*)?(?:#(?:{pchar}|[/?])*)?$")
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
    fn formats_are_their_exact_patterns() {
        let f = |name: &str| Pattern::compile(&format(name).unwrap()).unwrap();
        let whole = |p: &Pattern, t: &str| run(p, t) == Some(true);
        let date = f("date");
        for t in ["2024-02-29", "2000-02-29", "0004-02-29", "1999-12-31", "0001-01-01", "2023-04-30"] {
            assert!(whole(&date, t), "{t}");
        }
        for t in ["2023-02-29", "1900-02-29", "0000-01-01", "2023-04-31", "2023-13-01", "2023-00-10", "2023-1-10", "2023-01-32"] {
            assert!(!whole(&date, t), "{t}");
        }
        let dt = f("date-time");
        for t in ["2024-05-06T07:08:09Z", "2024-05-06T23:59:59.123456+05:30", "2024-05-06T00:00:00"] {
            assert!(whole(&dt, t), "{t}");
        }
        for t in ["2024-05-06 07:08:09", "2024-05-06T24:00:00", "2024-05-06T07:60:00", "2024-05-06T07:08:09.1234567", "2024-05-06T07:08:09+24:00"] {
            assert!(!whole(&dt, t), "{t}");
        }
        let uuid4 = f("uuid4");
        assert!(whole(&uuid4, "1b4e28ba-2fa1-41d2-883f-0016d3cca427"));
        assert!(!whole(&uuid4, "1b4e28ba-2fa1-11d2-883f-0016d3cca427"), "version 1");
        assert!(!whole(&uuid4, "1b4e28ba-2fa1-41d2-c83f-0016d3cca427"), "variant");
        assert!(whole(&f("uuid"), "1b4e28ba-2fa1-11d2-c83f-0016d3cca427"));
        let ip = f("ipv4");
        assert!(whole(&ip, "192.168.0.1") && whole(&ip, "255.255.255.255") && !whole(&ip, "256.1.1.1") && !whole(&ip, "01.2.3.4"));
        let email = f("email");
        assert!(whole(&email, "ada.lovelace+x@math.example.org"));
        for t in ["a..b@x.org", ".a@x.org", "a@-x.org", "a@x", "a@x.o", "a b@x.org"] {
            assert!(!whole(&email, t), "{t}");
        }
        let uri = f("uri");
        for t in ["https://example.org", "http://user:pw@host.example:8080/a/b%20c?q=1&r=/x?#frag", "mailto:ada@example.org", "urn:isbn:0451450523", "file:///etc/hosts", "a:", "h://1.2.3.4/"] {
            assert!(whole(&uri, t), "{t}");
        }
        for t in ["example.org/x", "//host/x", "1http://x", "http://exa mple.org", "http://x/%2", "http://x/\"", "http://x/a#b#c", "http://[::1]/", "ht tp://x", "http://x/?a=[1]"] {
            assert!(!whole(&uri, t), "{t}");
        }
        assert_eq!(format("uri-reference"), None);
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
