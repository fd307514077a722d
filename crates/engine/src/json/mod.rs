//! JSON mode and JSON Schema (OpenAI's `response_format` `{"type": "json_object"}` and
//! `{"type": "json_schema", ...}`): generation constrained so its text is a JSON value of a
//! schema (RFC 8259; JSON mode: any object), by masking at every step each token whose bytes
//! would leave the text no longer the prefix of one.
//!
//! Design:
//! - [`schema`] compiles a JSON Schema to a table of nodes; [`state::JsonState`] is a
//!   byte-level pushdown automaton over that table (a frame per open container, the lexical
//!   state of [`lex`] at the top). It is `Copy` (no heap), so trying a token is a copy and a
//!   feed of its bytes. A schema of alternatives that start alike ([`Schema::one_of`]: tool
//!   calls) has a root each, and an `anyOf` of such alternatives forks the automaton where its
//!   value begins (`JsonState::feed_forking`); the mask keeps every automaton the text still
//!   fits (at most [`MAX_STATES`]).
//! - [`JsonMask`] tries every token of the vocabulary from the sequence's state before each
//!   sample: control tokens, end-of-generation tokens and empty pieces are never allowed; the
//!   sequence ends (`Stop`) as soon as its top-level value is closed, so it needs no EOS.
//!   Most tokens are settled without a feed ([`JsonVocab`]): by their first two bytes (which
//!   bytes and pairs the state takes is noted once per token generated) or, inside a string, as
//!   whole characters of text (counted against a length bound, or run through the string's
//!   `pattern` alone).
//! - The text starts with its `{` (or `[`), and whitespace outside strings is capped at
//!   [`MAX_WS`] bytes in a row, so a model cannot stall in an endless run of blanks (llama.cpp's
//!   JSON grammar does both).
//!
//! Invariant: every prefix the mask lets through can still be completed (the vocabulary's
//! single-byte tokens close any open string, number, literal and container), so a sequence
//! ends either with a parseable value of its schema (`Stop`) or at `max_tokens` (`Length`).

mod all_of;
mod bounds;
mod lex;
pub mod loosen;
mod pattern;
pub mod schema;
pub mod state;

use std::sync::Arc;

pub use lex::MAX_NUM;
pub use schema::Schema;
pub use state::{JsonState, MAX_DEPTH, MAX_STATES, MAX_WS};

use crate::sample::Sampler;
use regex_automata::util::primitives::StateID;
use crate::tokenizer::Tokenizer;
use crate::Error;

/// What a token can be under JSON mode, computed once per vocabulary ([`JsonVocab::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Control, unknown, unused or end-of-generation token, or an empty piece: never allowed.
    Never,
    /// Whole UTF-8 characters without `"`, `\` or control characters: inside a string
    /// (outside an escape or a UTF-8 sequence) allowed where the string has room for that
    /// many characters, and it leaves the state as it was but for the count.
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
    /// Characters of a [`Class::Text`] token (at most 255), which a bounded string counts.
    chars: Vec<u8>,
    /// The most characters of any [`Class::Text`] token.
    longest: u32,
}

impl JsonVocab {
    pub fn new(tok: &Tokenizer) -> JsonVocab {
        let class: Vec<Class> = (0..tok.n_vocab() as u32)
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
        let chars = (0..tok.n_vocab() as u32).map(|id| tok.piece(id).iter().filter(|&&b| b & 0xC0 != 0x80).count().min(255) as u8).collect();
        let longest = (0..tok.n_vocab()).filter(|&i| class[i] == Class::Text).map(|i| tok.piece(i as u32).iter().filter(|&&b| b & 0xC0 != 0x80).count() as u32).max().unwrap_or(0);
        JsonVocab { class, first, second, chars, longest }
    }
}

/// [`JsonVocab`]'s second byte of a one-byte token.
const NO_BYTE: u16 = 256;

/// The per-sequence JSON constraint: its schema and automata, and which tokens may follow.
#[derive(Clone, Debug)]
pub struct JsonMask {
    schema: Arc<Schema>,
    /// The automaton of each root of the schema that the text so far still fits (one but for
    /// [`Schema::one_of`]'s alternatives).
    states: Vec<JsonState>,
    /// Which first bytes some state takes ([`prepare`](Self::prepare)).
    first: [bool; 256],
    /// Outside strings, `pair[a][b]`: whether the state takes `a` then `b` (for the first
    /// bytes it takes; ` word` or `every` where a number may end, which a first byte alone does
    /// not settle). Inside strings most tokens are whole characters of text, settled by class.
    pair: Box<[[bool; 256]; 256]>,
    /// Whether `pair` holds for the current states (outside strings).
    pairs: bool,
    /// Every state in plain string text: the most characters one of the strings may still take.
    room: Option<u32>,
    /// With one state, in plain text of a patterned string: where in `memo` the
    /// [`Class::Text`] tokens its pattern state takes are ([`accept`](Self::accept) notes them).
    text_ok: Option<usize>,
    /// The token sets (a bit per token id) of the last [`MEMO`] pattern states met: a string's
    /// pattern mostly returns to states it has been in (`[a-z]+` stays in one). Slots are
    /// reused once all are taken (`memo_next`: the oldest), so a long string allocates nothing.
    memo: Vec<((u16, StateID), Vec<u64>)>,
    memo_next: usize,
    /// [`accept`](Self::accept)'s buffer where the schema forks.
    scratch: Vec<JsonState>,
}

/// Pattern states whose token sets a mask keeps (each a bit per token: 32 KiB for a vocabulary
/// of 262,144).
const MEMO: usize = 16;

impl Default for JsonMask {
    fn default() -> Self {
        JsonMask::new(Arc::new(Schema::object()))
    }
}

impl JsonMask {
    /// Before the first token of a value of `schema` ([`Schema::object`]: JSON mode).
    pub fn new(schema: Arc<Schema>) -> JsonMask {
        let states = (0..schema.roots.len()).map(|i| JsonState::at_root(&schema, i)).collect();
        let mut m = JsonMask { schema, states, first: [false; 256], pair: Box::new([[false; 256]; 256]), pairs: false, room: None, text_ok: None, memo: Vec::new(), memo_next: 0, scratch: Vec::new() };
        m.prepare();
        m
    }

    /// Note which single bytes the current state takes (256 feeds) and, outside strings, which
    /// pairs starting with one of them (256 feeds for each: about 20 first bytes there), so that
    /// [`allows`](Self::allows) refuses most tokens by their first two bytes.
    fn prepare(&mut self) {
        let schema = &self.schema;
        for b in 0..=255u8 {
            self.first[b as usize] = self.states.iter().any(|&(mut s)| s.feed(schema, b));
        }
        self.pairs = self.states.iter().all(|s| !s.inside_string());
        self.room = self.states.iter().map(|s| s.plain_string_room()).try_fold(0, |m, r| r.map(|r| m.max(r)));
        if self.pairs {
            for a in (0..=255u8).filter(|&a| self.first[a as usize]) {
                let row = &mut self.pair[a as usize];
                row.fill(false);
                for &s in &self.states {
                    let mut after = s;
                    let mut forks = Vec::new();
                    let ok = after.feed_forking(schema, a, schema.forks.then_some(&mut forks));
                    for after in forks.into_iter().chain(ok.then_some(after)) {
                        for b in 0..=255u8 {
                            let mut s = after;
                            row[b as usize] |= s.feed(schema, b);
                        }
                    }
                }
            }
        }
    }

    /// May token `id` come next? Never a control or end-of-generation token, or an empty piece.
    pub fn allows(&self, vocab: &JsonVocab, tok: &Tokenizer, id: u32) -> bool {
        let i = id as usize;
        match (vocab.class.get(i), self.room, self.text_ok) {
            (None | Some(Class::Never), _, _) => false,
            (Some(Class::Text), Some(room), _) => room >= vocab.chars[i] as u32,
            (Some(Class::Text), None, Some(m)) => self.memo[m].1[i / 64] >> (i % 64) & 1 == 1,
            _ if !self.first[vocab.first[i] as usize] => false,
            // One byte, which the state takes.
            _ if vocab.second[i] == NO_BYTE => true,
            _ if self.pairs && !self.pair[vocab.first[i] as usize][vocab.second[i] as usize] => false,
            _ if self.schema.forks => self.states.iter().any(|&s| s.takes_all(&self.schema, tok.piece(id))),
            _ => self.states.iter().any(|&(mut s)| s.feed_all(&self.schema, tok.piece(id))),
        }
    }

    /// Draw the next token with `sampler` among those [`allows`](Self::allows) admits.
    pub fn sample(&self, vocab: &JsonVocab, tok: &Tokenizer, sampler: &mut Sampler, logits: &[f32]) -> Result<u32, Error> {
        sampler
            .sample_checked(logits, |id| self.allows(vocab, tok, id))
            .ok_or_else(|| Error::Sampling("no token of the vocabulary continues the JSON value".into()))
    }

    /// Take the sampled token `id`; whether the value is now closed (the sequence ends).
    pub fn closes_with(&mut self, vocab: &JsonVocab, tok: &Tokenizer, id: u32) -> bool {
        self.accept(vocab, tok, id) && self.is_complete()
    }

    /// Take token `id`; `false` (the state unchanged) if it does not fit.
    pub fn accept(&mut self, vocab: &JsonVocab, tok: &Tokenizer, id: u32) -> bool {
        if !self.allows(vocab, tok, id) {
            return false;
        }
        self.advance(vocab, tok, tok.piece(id));
        true
    }

    /// Take `text` (a lazy constraint's text from its trigger on); `false` (the state
    /// unchanged) if it is not the prefix of a value of the schema.
    pub fn accept_text(&mut self, vocab: &JsonVocab, tok: &Tokenizer, text: &[u8]) -> bool {
        let schema = &self.schema;
        if !self.states.iter().any(|&(mut s)| if schema.forks { s.takes_all(schema, text) } else { s.feed_all(schema, text) }) {
            return false;
        }
        self.advance(vocab, tok, text);
        true
    }

    /// Feed `piece`, which some state takes, and note what may follow.
    fn advance(&mut self, vocab: &JsonVocab, tok: &Tokenizer, piece: &[u8]) {
        let schema = &self.schema;
        if schema.forks {
            state::advance(&mut self.states, &mut self.scratch, schema, piece);
        } else {
            self.states.retain_mut(|s| s.feed_all(schema, piece));
        }
        self.prepare();
        // The memo says which text tokens the pattern takes; under a `maxLength` that is also
        // what the bound allows while the string has room for the longest token and then the
        // pattern's farthest state from a match. Nearer its end (and under a `minLength` the
        // pattern does not imply) each token is fed.
        let pattern = match self.states[..] {
            [s] => s.plain_pattern(),
            _ => None,
        };
        let far = |&(p, _, room): &(u16, StateID, u32)| room >= self.schema.patterns[p as usize].worst().saturating_add(vocab.longest);
        self.text_ok = pattern.filter(far).map(|(p, at, _)| self.text_tokens(vocab, tok, (p, at)));
    }

    /// The memo slot of the [`Class::Text`] tokens pattern state `key` takes: found, or
    /// computed (one pass over the vocabulary, as [`allows`](Self::allows) would make without
    /// it) into a new slot or the oldest.
    fn text_tokens(&mut self, vocab: &JsonVocab, tok: &Tokenizer, key: (u16, StateID)) -> usize {
        if let Some(m) = self.memo.iter().position(|(k, _)| *k == key) {
            return m;
        }
        let m = if self.memo.len() < MEMO {
            self.memo.push((key, vec![0; vocab.class.len().div_ceil(64)]));
            self.memo.len() - 1
        } else {
            let m = self.memo_next;
            self.memo_next = (m + 1) % MEMO;
            self.memo[m].0 = key;
            self.memo[m].1.fill(0);
            m
        };
        let (schema, bits) = (&self.schema, &mut self.memo[m].1);
        for (i, _) in vocab.class.iter().enumerate().filter(|(_, &c)| c == Class::Text) {
            if schema.pattern_takes(key.0, key.1, tok.piece(i as u32)) {
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        m
    }

    /// Is the value closed (the sequence should stop)?
    pub fn is_complete(&self) -> bool {
        self.states.iter().any(|s| s.is_complete())
    }
}

/// For tests: whether `text` is a whole value of `schema` (`Some(true)`), the prefix of one
/// (`Some(false)`), or neither — every alternative followed, as the mask does.
#[cfg(test)]
fn accepts(schema: &Schema, text: &str) -> Option<bool> {
    let (mut states, mut scratch) = (vec![JsonState::new(schema)], vec![]);
    state::advance(&mut states, &mut scratch, schema, text.as_bytes());
    (!states.is_empty()).then(|| states.iter().any(JsonState::is_complete))
}

/// For tests: feed `bytes` to a fresh state of `schema` (every alternative followed), skipping
/// those no state takes, then close the value by the first byte of `closer` some state takes,
/// a byte at a time. The text, or where it got stuck.
#[cfg(test)]
fn walk_and_close(schema: &Schema, bytes: &[u8], closer: &[u8]) -> Result<Vec<u8>, String> {
    let (mut states, mut scratch) = (vec![JsonState::new(schema)], vec![]);
    let mut text = Vec::new();
    let mut take = |states: &mut Vec<JsonState>, b: u8| {
        let mut next = states.clone();
        state::advance(&mut next, &mut scratch, schema, &[b]);
        !next.is_empty() && {
            *states = next;
            true
        }
    };
    for &b in bytes {
        if take(&mut states, b) {
            text.push(b);
        }
    }
    for _ in 0..10_000 {
        if states.iter().any(JsonState::is_complete) {
            return Ok(text);
        }
        let b = closer.iter().copied().find(|&b| take(&mut states, b));
        let b = b.ok_or_else(|| format!("stuck after {}", String::from_utf8_lossy(&text)))?;
        text.push(b);
    }
    Err(format!("not closed: {}", String::from_utf8_lossy(&text)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn accepts_object(s: &str) -> Option<bool> {
        accepts(&Schema::object(), s)
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
            assert_eq!(accepts_object(s), Some(true), "{s}");
            assert!(serde_json::from_str::<serde_json::Value>(s).unwrap().is_object());
        }
    }

    #[test]
    fn prefixes_are_accepted_incomplete() {
        for s in [r#"{"a"#, r#"{"a": [1, 2"#, r#"{"a": -"#, r#"{"a": 1."#, r#"{"a": tr"#, r#"{"a": "\u00"#, "{\"a\": \"\u{e9}"] {
            assert_eq!(accepts_object(s), Some(false), "{s}");
        }
        // A two-byte character cut after its lead byte.
        let o = Schema::object();
        let mut st = JsonState::new(&o);
        assert!(st.feed_all(&o, b"{\"a\": \"\xC3") && !st.is_complete());
    }

    #[test]
    fn non_json_is_refused() {
        for s in [
            "[1]", "\"s\"", "1", "x", " {}", "\n{}", "{a: 1}", "{'a': 1}", "{\"a\" 1}", "{\"a\": 01}", "{\"a\": 1.}", "{\"a\": .5}",
            "{\"a\": +1}", "{\"a\": tru }", "{\"a\": 1,}", "{\"a\": [1,]}", "{\"a\": [1}", "{\"a\": {]}", "{}}", "{},",
            "{\"a\": \"\\x\"}", "{\"a\": \"\\u12G4\"}", "{\"a\": \"tab\there\"}", "{\"a\": 1e}", "{\"a\": -}", "{,}", "{\"a\": 1e100}",
        ] {
            assert_eq!(accepts_object(s), None, "{s}");
        }
        // Invalid UTF-8: a stray continuation byte, an overlong form, a surrogate, past U+10FFFF.
        for b in [&b"{\"\x80\""[..], b"{\"\xC0\xAF\"", b"{\"\xED\xA0\x80\"", b"{\"\xF4\x90\x80\x80\""] {
            let o = Schema::object();
            assert!(!JsonState::new(&o).feed_all(&o, b), "{b:?}");
        }
    }

    #[test]
    fn depth_and_whitespace_are_capped() {
        let o = Schema::object();
        let deep = format!("{{\"a\":{}", "[".repeat(MAX_DEPTH - 1));
        let mut st = JsonState::new(&o);
        assert!(st.feed_all(&o, deep.as_bytes()));
        assert!(!st.clone().feed(&o, b'['), "one level past MAX_DEPTH");
        let mut st = JsonState::new(&o);
        assert!(st.feed(&o, b'{') && st.feed_all(&o, &[b' '; MAX_WS as usize]) && !st.feed(&o, b' '));
        // Whitespace inside strings is text, not capped.
        assert_eq!(accepts_object(&format!("{{\"{}\": 1}}", " ".repeat(100))), Some(true));
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
            let o = Schema::object();
            let mut st = JsonState::new(&o);
            for (i, &b) in s.as_bytes().iter().enumerate() {
                prop_assert!(!st.is_complete(), "complete before byte {} of {}", i, s);
                prop_assert!(st.feed(&o, b), "byte {} of {}", i, s);
            }
            prop_assert!(st.is_complete());
        }

        /// Soundness and completability: a random walk through the automaton (bytes it
        /// refuses skipped), closed by the first accepted of a few bytes at a time, ends as
        /// an object serde_json parses.
        #[test]
        fn random_walks_complete_and_parse(bytes in prop::collection::vec(prop::sample::select(b"{}[]:,\"\\ \n0123456789-+.eEtrufalsn\xC3\xA9\xE6\x97\xA5\xF0\x9F\x8E\x89u".to_vec()), 0..200)) {
            let text = walk_and_close(&Schema::object(), &bytes, b"\"}]:0rueals\x80\x90\xA9{").map_err(TestCaseError::fail)?;
            let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(&text))))?;
            prop_assert!(v.is_object());
        }
    }
}
