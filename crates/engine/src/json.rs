//! JSON mode (OpenAI's `response_format: {"type": "json_object"}`): generation constrained so
//! its text is a JSON object (RFC 8259), by masking at every step each token whose bytes would
//! leave the text no longer the prefix of one.
//!
//! Design:
//! - [`JsonState`] is a byte-level pushdown automaton of the JSON grammar with an object at the
//!   top: containers on a 64-deep bit stack (object or array), the position inside a string
//!   (escapes, `\u` digits, UTF-8 sequences checked as `str` requires), a number or a literal.
//!   It is `Copy` (no heap), so trying a token is a copy and a feed of its bytes.
//! - [`JsonMask`] tries every token of the vocabulary from the sequence's state before each
//!   sample: control tokens, end-of-generation tokens and empty pieces are never allowed; the
//!   sequence ends (`Stop`) as soon as its top-level object is closed, so it needs no EOS.
//!   Most tokens are settled without a feed ([`JsonVocab`]): by their first two bytes (which
//!   bytes and pairs the state takes is noted once per token generated) or, inside a string, as
//!   whole characters of text.
//! - The text starts with its `{`, and whitespace outside strings is capped at [`MAX_WS`]
//!   bytes in a row, so a model cannot stall in an endless run of blanks (llama.cpp's JSON
//!   grammar does both).
//!
//! Invariant: every prefix the mask lets through can still be completed (the vocabulary's
//! single-byte tokens close any open string, number, literal and container), so a sequence
//! ends either with a parseable object (`Stop`) or at `max_tokens` (`Length`).

use crate::sample::Sampler;
use crate::tokenizer::Tokenizer;
use crate::Error;

/// Deepest nesting of objects and arrays allowed.
pub const MAX_DEPTH: u8 = 64;
/// Longest run of whitespace outside strings.
pub const MAX_WS: u8 = 32;
/// Longest number, and most exponent digits: every number then fits an `f64` (serde_json,
/// like most parsers without arbitrary precision, refuses `1e1000`).
pub const MAX_NUM: u8 = 40;
const MAX_EXP_DIGITS: u8 = 2;

/// Where in a number the automaton is (JSON's `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    /// After `-`: a digit must follow.
    Minus,
    /// A leading `0`: a fraction, an exponent or the end.
    Zero,
    /// Integer digits after a non-zero first one.
    Int,
    /// After `.`: a digit must follow.
    Dot,
    /// Fraction digits.
    Frac,
    /// After `e`/`E`: a sign or a digit.
    Exp,
    /// After the exponent's sign: a digit.
    ExpSign,
    /// This many exponent digits.
    ExpDigits(u8),
}

impl Num {
    /// May the number end here?
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits(_))
    }

    /// The state after `b`, or `None` where `b` does not continue the number.
    fn step(self, b: u8) -> Option<Num> {
        let digit = b.is_ascii_digit();
        Some(match (self, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, _) if digit => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Int, _) if digit => Num::Int,
            (Num::Dot | Num::Frac, _) if digit => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::Exp,
            (Num::Exp, b'+' | b'-') => Num::ExpSign,
            (Num::Exp | Num::ExpSign, _) if digit => Num::ExpDigits(1),
            (Num::ExpDigits(n), _) if digit && n < MAX_EXP_DIGITS => Num::ExpDigits(n + 1),
            _ => return None,
        })
    }
}

/// What the automaton expects next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing yet: the top-level `{`, first.
    Start,
    /// A value (after `:`, `[` … `,`).
    Value,
    /// After `{`: a key or `}`.
    ObjFirst,
    /// After `,` in an object: a key.
    ObjKey,
    /// After a key: `:`.
    Colon,
    /// After `[`: a value or `]`.
    ArrFirst,
    /// After a value inside a container: `,` or its closing bracket.
    After,
    /// Inside a string (`key`: an object's key, followed by `:`). `esc`: 0 none, 1 after `\`,
    /// 2..=5 that many `\u` hex digits still to come. `need`: UTF-8 continuation bytes still
    /// to come, the next in `lo..=hi`.
    Str { key: bool, esc: u8, need: u8, lo: u8, hi: u8 },
    /// Inside a number of `len` bytes so far.
    Num(Num, u8),
    /// Inside `true`, `false` or `null`: `lit` is the word, `at` the bytes matched.
    Lit { lit: u8, at: u8 },
    /// The top-level object is closed: only whitespace may follow.
    Done,
}

const LITERALS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// The automaton's state after the bytes fed so far (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonState {
    mode: Mode,
    /// Bit `i` set: container `i` (0 = outermost) is an object, else an array.
    stack: u64,
    depth: u8,
    /// Whitespace bytes in a row outside strings.
    ws: u8,
}

impl Default for JsonState {
    fn default() -> Self {
        JsonState::new()
    }
}

impl JsonState {
    pub fn new() -> JsonState {
        JsonState { mode: Mode::Start, stack: 0, depth: 0, ws: 0 }
    }

    /// Is the text fed so far a whole JSON object (possibly followed by whitespace)?
    pub fn is_complete(&self) -> bool {
        self.mode == Mode::Done
    }

    fn inside_string(&self) -> bool {
        matches!(self.mode, Mode::Str { .. })
    }

    /// Inside a string, outside an escape and a UTF-8 sequence: where whole characters other
    /// than `"`, `\` and control characters are text that changes nothing.
    fn in_plain_string(&self) -> bool {
        matches!(self.mode, Mode::Str { esc: 0, need: 0, .. })
    }

    /// Feed every byte of `bytes`; `false` (the state then unspecified) at the first one that
    /// makes the text no longer the prefix of a JSON object.
    pub fn feed_all(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.feed(b))
    }

    /// Feed one byte; `false` where it makes the text no longer the prefix of a JSON object.
    pub fn feed(&mut self, b: u8) -> bool {
        match self.mode {
            Mode::Str { key, esc, need, lo, hi } => return self.in_string(b, key, esc, need, lo, hi),
            Mode::Lit { lit, at } => {
                let word = LITERALS[lit as usize];
                if word[at as usize] != b {
                    return false;
                }
                self.mode = if at as usize + 1 == word.len() { self.after_value() } else { Mode::Lit { lit, at: at + 1 } };
                return true;
            }
            Mode::Num(n, len) => match n.step(b) {
                Some(next) if len < MAX_NUM => {
                    self.mode = Mode::Num(next, len + 1);
                    return true;
                }
                Some(_) => return false,
                // The number ends at this byte, which the state after it must take.
                None if n.complete() => self.mode = self.after_value(),
                None => return false,
            },
            _ => {}
        }
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            // The answer starts with its `{`, as llama.cpp's JSON grammar has it (a model left
            // free spends tokens on leading blanks).
            if self.mode == Mode::Start {
                return false;
            }
            self.ws += 1;
            return self.ws <= MAX_WS;
        }
        self.ws = 0;
        match (self.mode, b) {
            (Mode::Start, b'{') => self.open(true),
            (Mode::Value | Mode::ArrFirst, b'{') => self.open(true),
            (Mode::Value | Mode::ArrFirst, b'[') => self.open(false),
            (Mode::Value | Mode::ArrFirst, b'"') => {
                self.mode = Mode::Str { key: false, esc: 0, need: 0, lo: 0, hi: 0 };
                true
            }
            (Mode::Value | Mode::ArrFirst, b'-') => {
                self.mode = Mode::Num(Num::Minus, 1);
                true
            }
            (Mode::Value | Mode::ArrFirst, b'0') => {
                self.mode = Mode::Num(Num::Zero, 1);
                true
            }
            (Mode::Value | Mode::ArrFirst, b'1'..=b'9') => {
                self.mode = Mode::Num(Num::Int, 1);
                true
            }
            (Mode::Value | Mode::ArrFirst, b't' | b'f' | b'n') => {
                let lit = match b {
                    b't' => 0,
                    b'f' => 1,
                    _ => 2,
                };
                self.mode = Mode::Lit { lit, at: 1 };
                true
            }
            (Mode::ObjFirst | Mode::ObjKey, b'"') => {
                self.mode = Mode::Str { key: true, esc: 0, need: 0, lo: 0, hi: 0 };
                true
            }
            (Mode::Colon, b':') => {
                self.mode = Mode::Value;
                true
            }
            (Mode::After, b',') => {
                self.mode = if self.top_is_object() { Mode::ObjKey } else { Mode::Value };
                true
            }
            (Mode::ObjFirst, b'}') => self.close(true),
            (Mode::ArrFirst, b']') => self.close(false),
            (Mode::After, b'}') => self.close(true),
            (Mode::After, b']') => self.close(false),
            _ => false,
        }
    }

    fn top_is_object(&self) -> bool {
        self.depth > 0 && self.stack >> (self.depth - 1) & 1 == 1
    }

    fn open(&mut self, object: bool) -> bool {
        if self.depth == MAX_DEPTH {
            return false;
        }
        self.stack = self.stack & !(1 << self.depth) | (object as u64) << self.depth;
        self.depth += 1;
        self.mode = if object { Mode::ObjFirst } else { Mode::ArrFirst };
        true
    }

    fn close(&mut self, object: bool) -> bool {
        if self.depth == 0 || self.top_is_object() != object {
            return false;
        }
        self.depth -= 1;
        self.mode = self.after_value();
        true
    }

    /// The mode after a value ends: the next of its container, or `Done` at the top.
    fn after_value(&self) -> Mode {
        if self.depth == 0 {
            Mode::Done
        } else {
            Mode::After
        }
    }

    fn in_string(&mut self, b: u8, key: bool, esc: u8, need: u8, lo: u8, hi: u8) -> bool {
        let str_mode = |esc, need, lo, hi| Mode::Str { key, esc, need, lo, hi };
        if need > 0 {
            if !(lo..=hi).contains(&b) {
                return false;
            }
            self.mode = str_mode(0, need - 1, 0x80, 0xBF);
            return true;
        }
        match esc {
            1 => {
                if !matches!(b, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' | b'u') {
                    return false;
                }
                self.mode = str_mode(if b == b'u' { 5 } else { 0 }, 0, 0, 0);
                return true;
            }
            2..=5 => {
                if !b.is_ascii_hexdigit() {
                    return false;
                }
                self.mode = str_mode(if esc == 2 { 0 } else { esc - 1 }, 0, 0, 0);
                return true;
            }
            _ => {}
        }
        // UTF-8 as `str` accepts it: no overlong forms, no surrogates, nothing past U+10FFFF.
        let (need, lo, hi) = match b {
            b'"' => {
                self.mode = if key { Mode::Colon } else { self.after_value() };
                return true;
            }
            b'\\' => (0, 0, 0),
            0x00..=0x1F | 0x80..=0xC1 | 0xF5..=0xFF => return false,
            0x20..=0x7F => (0, 0, 0),
            0xC2..=0xDF => (1, 0x80, 0xBF),
            0xE0 => (2, 0xA0, 0xBF),
            0xED => (2, 0x80, 0x9F),
            0xE1..=0xEF => (2, 0x80, 0xBF),
            0xF0 => (3, 0x90, 0xBF),
            0xF4 => (3, 0x80, 0x8F),
            0xF1..=0xF3 => (3, 0x80, 0xBF),
        };
        self.mode = str_mode(if b == b'\\' { 1 } else { 0 }, need, lo, hi);
        true
    }
}

/// What a token can be under JSON mode, computed once per vocabulary ([`JsonVocab::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Control, unknown, unused or end-of-generation token, or an empty piece: never allowed.
    Never,
    /// Whole UTF-8 characters without `"`, `\` or control characters: inside a string
    /// (outside an escape or a UTF-8 sequence) always allowed, and it leaves the state as it
    /// was.
    Text,
    /// Anything else: its bytes are fed to a copy of the state.
    Other,
}

/// The vocabulary as JSON mode sees it: each token's [`Class`] and first two bytes, side by
/// side, so that trying the whole vocabulary before a sample reads these arrays and feeds only
/// the tokens that need it.
#[derive(Debug)]
pub struct JsonVocab {
    class: Vec<Class>,
    first: Vec<u8>,
    /// The second byte of a token of two or more, else [`NO_BYTE`].
    second: Vec<u16>,
}

impl JsonVocab {
    pub fn new(tok: &Tokenizer) -> JsonVocab {
        let class = (0..tok.n_vocab() as u32)
            .map(|id| {
                let p = tok.piece(id);
                if p.is_empty() || tok.is_control(id) || tok.is_eog(id) {
                    Class::Never
                } else if std::str::from_utf8(p).is_ok() && p.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\') {
                    Class::Text
                } else {
                    Class::Other
                }
            })
            .collect();
        let first = (0..tok.n_vocab() as u32).map(|id| tok.piece(id).first().copied().unwrap_or(0)).collect();
        let second = (0..tok.n_vocab() as u32).map(|id| tok.piece(id).get(1).map_or(NO_BYTE, |&b| b as u16)).collect();
        JsonVocab { class, first, second }
    }
}

/// [`JsonVocab`]'s second byte of a one-byte token.
const NO_BYTE: u16 = 256;

/// The per-sequence JSON constraint: its automaton, and which tokens may follow.
#[derive(Clone, Debug)]
pub struct JsonMask {
    state: JsonState,
    /// Which first bytes the state takes ([`prepare`](Self::prepare)).
    first: [bool; 256],
    /// Outside strings, `pair[a][b]`: whether the state takes `a` then `b` (for the first
    /// bytes it takes; ` word` or `every` where a number may end, which a first byte alone does
    /// not settle). Inside strings most tokens are whole characters of text, settled by class.
    pair: Box<[[bool; 256]; 256]>,
    /// Whether `pair` holds for the current state (outside strings).
    pairs: bool,
}

impl Default for JsonMask {
    fn default() -> Self {
        JsonMask::new()
    }
}

impl JsonMask {
    pub fn new() -> JsonMask {
        let mut m = JsonMask { state: JsonState::new(), first: [false; 256], pair: Box::new([[false; 256]; 256]), pairs: false };
        m.prepare();
        m
    }

    /// Note which single bytes the current state takes (256 feeds) and, outside strings, which
    /// pairs starting with one of them (256 feeds for each: about 20 first bytes there), so that
    /// [`allows`](Self::allows) refuses most tokens by their first two bytes.
    fn prepare(&mut self) {
        for b in 0..=255u8 {
            let mut s = self.state;
            self.first[b as usize] = s.feed(b);
        }
        self.pairs = !self.state.inside_string();
        if self.pairs {
            for a in (0..=255u8).filter(|&a| self.first[a as usize]) {
                let mut after = self.state;
                after.feed(a);
                for b in 0..=255u8 {
                    let mut s = after;
                    self.pair[a as usize][b as usize] = s.feed(b);
                }
            }
        }
    }

    /// May token `id` come next? Never a control or end-of-generation token, or an empty piece.
    pub fn allows(&self, vocab: &JsonVocab, tok: &Tokenizer, id: u32) -> bool {
        let i = id as usize;
        match vocab.class.get(i) {
            None | Some(Class::Never) => false,
            Some(Class::Text) if self.state.in_plain_string() => true,
            _ if !self.first[vocab.first[i] as usize] => false,
            // One byte, which the state takes.
            _ if vocab.second[i] == NO_BYTE => true,
            _ if self.pairs && !self.pair[vocab.first[i] as usize][vocab.second[i] as usize] => false,
            _ => {
                let mut s = self.state;
                s.feed_all(tok.piece(id))
            }
        }
    }

    /// Draw the next token with `sampler` among those [`allows`](Self::allows) admits.
    pub fn sample(&self, vocab: &JsonVocab, tok: &Tokenizer, sampler: &mut Sampler, logits: &[f32]) -> Result<u32, Error> {
        sampler
            .sample_allowed(logits, Some(|id| self.allows(vocab, tok, id)))
            .ok_or_else(|| Error::Sampling("no token of the vocabulary continues the JSON object".into()))
    }

    /// Take the sampled token `id`; whether the object is now closed (the sequence ends).
    pub fn closes_with(&mut self, vocab: &JsonVocab, tok: &Tokenizer, id: u32) -> bool {
        self.accept(vocab, tok, id) && self.is_complete()
    }

    /// Take token `id`; `false` (the state unchanged) if it does not fit.
    pub fn accept(&mut self, vocab: &JsonVocab, tok: &Tokenizer, id: u32) -> bool {
        if !self.allows(vocab, tok, id) {
            return false;
        }
        self.state.feed_all(tok.piece(id));
        self.prepare();
        true
    }

    /// Is the object closed (the sequence should stop)?
    pub fn is_complete(&self) -> bool {
        self.state.is_complete()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn accepts(s: &str) -> Option<bool> {
        let mut st = JsonState::new();
        st.feed_all(s.as_bytes()).then(|| st.is_complete())
    }

    #[test]
    fn objects_are_accepted_and_complete() {
        for s in [
            r#"{}"#,
            r#"{"a": 1}  "#,
            r#"{"a":[1,-2.5e+3,0,0.0,1E9,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9"],"b":{"c":{}}}"#,
            "{\"é\": \"日本語 🎉\", \"k\": []}\n",
            "{\n  \"name\": \"Bob\",\n  \"age\": 30\n}",
        ] {
            assert_eq!(accepts(s), Some(true), "{s}");
            assert!(serde_json::from_str::<serde_json::Value>(s).unwrap().is_object());
        }
    }

    #[test]
    fn prefixes_are_accepted_incomplete() {
        for s in [r#"{"a"#, r#"{"a": [1, 2"#, r#"{"a": -"#, r#"{"a": 1."#, r#"{"a": tr"#, r#"{"a": "\u00"#, "{\"a\": \"\u{e9}"] {
            assert_eq!(accepts(s), Some(false), "{s}");
        }
        // A two-byte character cut after its lead byte.
        let mut st = JsonState::new();
        assert!(st.feed_all(b"{\"a\": \"\xC3") && !st.is_complete());
    }

    #[test]
    fn non_json_is_refused() {
        for s in [
            "[1]", "\"s\"", "1", "x", " {}", "\n{}", "{a: 1}", "{'a': 1}", "{\"a\" 1}", "{\"a\": 01}", "{\"a\": 1.}", "{\"a\": .5}",
            "{\"a\": +1}", "{\"a\": tru }", "{\"a\": 1,}", "{\"a\": [1,]}", "{\"a\": [1}", "{\"a\": {]}", "{}}", "{},",
            "{\"a\": \"\\x\"}", "{\"a\": \"\\u12G4\"}", "{\"a\": \"tab\there\"}", "{\"a\": 1e}", "{\"a\": -}", "{,}", "{\"a\": 1e100}",
        ] {
            assert_eq!(accepts(s), None, "{s}");
        }
        // Invalid UTF-8: a stray continuation byte, an overlong form, a surrogate, past U+10FFFF.
        for b in [&b"{\"\x80\""[..], b"{\"\xC0\xAF\"", b"{\"\xED\xA0\x80\"", b"{\"\xF4\x90\x80\x80\""] {
            assert!(!JsonState::new().feed_all(b), "{b:?}");
        }
    }

    #[test]
    fn depth_and_whitespace_are_capped() {
        let deep = format!("{{\"a\":{}", "[".repeat(MAX_DEPTH as usize - 1));
        let mut st = JsonState::new();
        assert!(st.feed_all(deep.as_bytes()));
        assert!(!st.clone().feed(b'['), "one level past MAX_DEPTH");
        let mut st = JsonState::new();
        assert!(st.feed(b'{') && st.feed_all(&[b' '; MAX_WS as usize]) && !st.feed(b' '));
        // Whitespace inside strings is text, not capped.
        assert_eq!(accepts(&format!("{{\"{}\": 1}}", " ".repeat(100))), Some(true));
    }

    fn value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|i| serde_json::json!(i)),
            (-1e30f64..1e30).prop_map(|f| serde_json::json!(f)),
            any::<String>().prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(any::<String>(), inner, 0..6).prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Every object serde_json writes (compact and pretty) is accepted whole, and none of
        /// its proper prefixes is complete.
        #[test]
        fn serde_objects_are_accepted(m in prop::collection::btree_map(any::<String>(), value(), 0..5), pretty in any::<bool>()) {
            let v = serde_json::Value::Object(m.into_iter().collect());
            let s = if pretty { serde_json::to_string_pretty(&v).unwrap() } else { serde_json::to_string(&v).unwrap() };
            let mut st = JsonState::new();
            for (i, &b) in s.as_bytes().iter().enumerate() {
                prop_assert!(!st.is_complete(), "complete before byte {} of {}", i, s);
                prop_assert!(st.feed(b), "byte {} of {}", i, s);
            }
            prop_assert!(st.is_complete());
        }

        /// Soundness and completability: a random walk through the automaton (bytes it
        /// refuses skipped), closed by the first accepted of a few bytes at a time, ends as
        /// an object serde_json parses.
        #[test]
        fn random_walks_complete_and_parse(bytes in prop::collection::vec(prop::sample::select(b"{}[]:,\"\\ \n0123456789-+.eEtrufalsn\xC3\xA9\xE6\x97\xA5\xF0\x9F\x8E\x89u".to_vec()), 0..200)) {
            let mut st = JsonState::new();
            let mut text = Vec::new();
            for b in bytes {
                let mut t = st;
                if t.feed(b) {
                    st = t;
                    text.push(b);
                }
            }
            let close = b"\"}]:0rueals\x80\x90\xA9{";
            for _ in 0..10_000 {
                if st.is_complete() {
                    break;
                }
                let b = close.iter().copied().find(|&b| { let mut t = st; t.feed(b) });
                let b = b.ok_or_else(|| TestCaseError::fail(format!("stuck after {}", String::from_utf8_lossy(&text))))?;
                prop_assert!(st.feed(b));
                text.push(b);
            }
            prop_assert!(st.is_complete(), "not closed: {}", String::from_utf8_lossy(&text));
            let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(&text))))?;
            prop_assert!(v.is_object());
        }
    }
}
