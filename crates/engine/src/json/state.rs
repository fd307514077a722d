//! The byte-level pushdown automaton of JSON text held to a [`Schema`]: JSON mode is the schema
//! [`Schema::object`] (any object), `json_schema` any compiled one.
//!
//! Design: one [`Frame`] per open container (its schema node, how far it has got, what may come
//! next), at most [`MAX_DEPTH`]; the lexical state at the top ([`Lex`]: a string, a declared key
//! still matching some properties, a number, a word, an `enum` text). The schema is passed to
//! [`JsonState::feed`], not held, so the state is `Copy` (no heap): trying a token is a copy and
//! a feed of its bytes.
//!
//! An `anyOf` whose alternatives start alike forks the automaton where its value begins
//! ([`JsonState::feed_forking`]): [`advance`] keeps every state the text still fits, the
//! mask's view of a union until the text tells its alternatives apart.
//!
//! Invariant: every prefix the automaton takes can still be completed by single bytes (a
//! string, number, word or literal can always end — a patterned string through its pattern's
//! live states, within its length bounds by `Pattern::fits` —, every
//! container close; a required property or item is always startable) —
//! except through a schema whose required parts recurse without end or nest past
//! [`MAX_DEPTH`].

use super::bounds::{Digits, Range};
use super::lex::{Num, StrLex, StrStep, MAX_NUM, WORDS};
use super::pattern::unescape;
use super::schema::{Node, NodeId, Prop, Schema, ANY, ANY_ARRAY, ANY_OBJECT};
use regex_automata::util::primitives::StateID;

/// Deepest nesting of objects and arrays.
pub const MAX_DEPTH: usize = 32;
/// Longest run of whitespace outside strings.
pub const MAX_WS: u8 = 32;

/// What an open container expects next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum Phase {
    /// After `{`: a key or `}`.
    #[default]
    ObjOpen,
    /// After `,` in an object: a key.
    ObjComma,
    /// After a key: `:`.
    ObjColon,
    /// After a member's value: `,` or `}`.
    ObjAfter,
    /// After `[`: an item or `]`.
    ArrOpen,
    /// After `,` in an array: an item.
    ArrComma,
    /// After an item: `,` or `]`.
    ArrAfter,
}

/// An open container: its node, and (object) the index of the next declared property that may
/// come or (array) the items begun.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct Frame {
    node: NodeId,
    idx: u16,
    phase: Phase,
}

/// The lexical state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lex {
    /// A value of this node comes next (the root's first; after `:`).
    Value(NodeId),
    /// Between tokens inside a container: its frame's phase says what may come.
    Between,
    /// Inside a string: a value, or a free key (`key`), which `:` follows; `chars` begun so
    /// far, of `min ..= max`; with a pattern (`pat`: its index + 1, 0 none) the pattern's
    /// state `at` after the decoded text so far.
    Str { key: bool, s: StrLex, chars: u32, min: u32, max: u32, pat: u16, at: StateID },
    /// Inside a declared key: bit `j` of `cand` is property `idx + j` of the top frame, whose
    /// escaped key matches the `at` bytes so far.
    Key { cand: u64, at: u16 },
    /// A number of `node`; with bounds, its text so far in `dig`.
    Num { n: Num, len: u8, integer: bool, node: NodeId, dig: Digits },
    Word { word: u8, at: u8 },
    /// Inside one of an `enum`'s texts: bit `j` of `cand` is text `j`, matching so far.
    Lit { node: NodeId, cand: u64, at: u16 },
    /// The root value is closed: only whitespace may follow.
    Done,
}

/// The automaton's state after the bytes fed so far (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonState {
    frames: [Frame; MAX_DEPTH],
    depth: u8,
    lex: Lex,
    /// Whitespace bytes in a row outside strings.
    ws: u8,
}

/// Of the candidates in `cand` (bit `j`: `text(j)`), those whose byte `at` is `b`.
fn narrow<'a>(cand: u64, at: u16, b: u8, text: impl Fn(usize) -> &'a [u8]) -> u64 {
    bits(cand).filter(|&j| text(j).get(at as usize) == Some(&b)).fold(0, |m, j| m | 1 << j)
}

/// The set bits of `m`, lowest first.
fn bits(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let j = m.trailing_zeros() as usize;
            m &= m - 1;
            j
        })
    })
}

impl JsonState {
    /// Before the first byte of a value of `schema` (its first root).
    pub fn new(schema: &Schema) -> JsonState {
        JsonState::at_root(schema, 0)
    }

    /// Before the first byte of a value of `schema`'s root `i`.
    pub fn at_root(schema: &Schema, i: usize) -> JsonState {
        JsonState { frames: [Frame::default(); MAX_DEPTH], depth: 0, lex: Lex::Value(schema.roots[i]), ws: 0 }
    }

    /// Is the text fed so far a whole value of the schema (possibly followed by whitespace)?
    pub fn is_complete(&self) -> bool {
        self.lex == Lex::Done
    }

    /// Inside a string (a value or a free key), where most bytes are text.
    pub(super) fn inside_string(&self) -> bool {
        matches!(self.lex, Lex::Str { .. })
    }

    /// Inside a string, outside an escape and a UTF-8 sequence, where whole characters other
    /// than `"`, `\` and control characters are text that changes nothing but the count:
    /// how many more characters the string may take (`None` elsewhere).
    pub(super) fn plain_string_room(&self) -> Option<u32> {
        match self.lex {
            Lex::Str { s, chars, max, pat: 0, .. } if s.plain() => Some(max - chars),
            _ => None,
        }
    }

    /// Inside a patterned string, outside an escape and a UTF-8 sequence: its pattern, the
    /// pattern's state, which whole characters of text only advance, and how many more
    /// characters its `maxLength` lets it take (`None` elsewhere).
    pub(super) fn plain_pattern(&self) -> Option<(u16, StateID, u32)> {
        match self.lex {
            Lex::Str { s, pat, at, chars, max, .. } if pat > 0 && s.plain() => Some((pat - 1, at, max - chars)),
            _ => None,
        }
    }

    /// Feed every byte of `bytes`; `false` (the state then unspecified) at the first one that
    /// makes the text no longer the prefix of a value of `schema` (first alternatives only:
    /// [`Self::takes_all`] follows every one).
    pub fn feed_all(&mut self, schema: &Schema, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.feed(schema, b))
    }

    /// Whether some path through the alternatives of the `anyOf`s met takes every byte of
    /// `bytes` (forks followed depth first; a fork allocates its list).
    pub fn takes_all(self, schema: &Schema, bytes: &[u8]) -> bool {
        self.follow(schema, bytes, &mut |_| true)
    }

    /// Follow `bytes` through every alternative, depth first, handing each state they lead to
    /// to `end`; `true` as soon as `end` does.
    fn follow(self, schema: &Schema, bytes: &[u8], end: &mut impl FnMut(JsonState) -> bool) -> bool {
        let mut s = self;
        for (i, &b) in bytes.iter().enumerate() {
            let mut forks = Vec::new();
            let ok = s.feed_forking(schema, b, Some(&mut forks));
            if forks.into_iter().any(|f| f.follow(schema, &bytes[i + 1..], end)) {
                return true;
            }
            if !ok {
                return false;
            }
        }
        end(s)
    }

    /// Feed one byte; `false` where it makes the text no longer the prefix of a value of
    /// `schema` (the state then unspecified). Where an `anyOf`'s alternatives start alike, the
    /// first one the byte fits is taken ([`Self::feed_forking`] follows the others too).
    pub fn feed(&mut self, schema: &Schema, b: u8) -> bool {
        self.feed_forking(schema, b, None)
    }

    /// [`Self::feed`], pushing to `forks` the state after `b` in each other alternative of an
    /// `anyOf` that `b` begins and fits (this state is then the first such alternative's, and
    /// the call returns `true` whenever it pushed one).
    pub fn feed_forking(&mut self, schema: &Schema, b: u8, mut forks: Option<&mut Vec<JsonState>>) -> bool {
        match self.lex {
            Lex::Str { key, s, chars, min, max, pat, at } => {
                // A bounded string counts each `\u` escape as one character: no surrogates.
                if (min > 0 || max < u32::MAX) && s.surrogate_escape(b) {
                    return false;
                }
                // A character begins at each byte of plain text but the closing quote.
                let chars = chars + (s.plain() && b != b'"') as u32;
                if chars > max {
                    return false;
                }
                let step = s.step(b);
                if matches!(step, StrStep::Bad) {
                    return false;
                }
                // A pattern reads the decoded text: raw bytes, and a short escape's character
                // (no `\u` escapes: `pattern`'s invariant). Under length bounds, a state is
                // taken only where a match of an allowed length can still follow from it (a
                // character is counted where it begins, so the state after its first byte or
                // after a backslash owes the rest of it only).
                let pattern = (pat > 0).then(|| &schema.patterns[pat as usize - 1]);
                let fits = |p: &super::pattern::Pattern, t: StateID, chars: u32| p.fits(t, chars, min, max);
                let at = match pattern {
                    None => at,
                    Some(_) if s.plain() && b == b'"' => at,
                    // An escape only where some short escape's character can follow.
                    Some(p) if s.plain() && b == b'\\' => match b"\"\\/bfnrt".iter().any(|&e| unescape(e).and_then(|c| p.step(at, c)).is_some_and(|t| fits(p, t, chars))) {
                        true => at,
                        false => return false,
                    },
                    Some(p) => match (if s.after_backslash() { unescape(b) } else { Some(b) }).and_then(|c| p.step(at, c)) {
                        Some(t) if fits(p, t, chars) => t,
                        _ => return false,
                    },
                };
                return match step {
                    StrStep::In(s) => {
                        self.lex = Lex::Str { key, s, chars, min, max, pat, at };
                        true
                    }
                    StrStep::Close if key => {
                        self.top().phase = Phase::ObjColon;
                        self.lex = Lex::Between;
                        true
                    }
                    StrStep::Close => {
                        self.value_done();
                        chars >= min && pattern.is_none_or(|p| p.matches(at))
                    }
                    StrStep::Bad => false,
                }
            }
            Lex::Key { cand, at } => return self.key_byte(schema, cand, at, b),
            Lex::Word { word, at } => {
                let w = WORDS[word as usize];
                if w[at as usize] != b {
                    return false;
                }
                if at as usize + 1 == w.len() {
                    self.value_done();
                } else {
                    self.lex = Lex::Word { word, at: at + 1 };
                }
                return true;
            }
            Lex::Num { n, len, integer, node, dig } => match n.step(b, integer) {
                Some(n) if len < MAX_NUM => {
                    let dig = match range(schema, node) {
                        Some(r) => match dig.push(b, r, integer) {
                            Some(d) => d,
                            None => return false,
                        },
                        None => dig,
                    };
                    self.lex = Lex::Num { n, len: len + 1, integer, node, dig };
                    return true;
                }
                Some(_) => return false,
                // The number ends at this byte, which the state after it must take.
                None if n.complete() && range(schema, node).is_none_or(|r| dig.ends_in(r)) => self.value_done(),
                None => return false,
            },
            Lex::Lit { node, cand, at } => {
                let texts = literal(schema, node);
                let next = narrow(cand, at, b, |j| &texts[j]);
                if next != 0 {
                    self.literal_at(texts, node, next, at + 1);
                    return true;
                }
                // A text ended at the last byte (another one went on); this byte follows it.
                if !bits(cand).any(|j| texts[j].len() == at as usize) {
                    return false;
                }
                self.value_done();
            }
            _ => {}
        }
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            // The answer starts with its first byte, as llama.cpp's JSON grammar has it (a model
            // left free spends tokens on leading blanks).
            if self.depth == 0 && matches!(self.lex, Lex::Value(_)) {
                return false;
            }
            self.ws += 1;
            return self.ws <= MAX_WS;
        }
        self.ws = 0;
        match self.lex {
            Lex::Value(node) => self.begin(schema, node, b, forks.as_deref_mut()),
            Lex::Between => self.between(schema, b, forks),
            _ => false,
        }
    }

    fn top(&mut self) -> &mut Frame {
        &mut self.frames[self.depth as usize - 1]
    }

    /// A value has ended: the next of its container (whose phase was set when it began), or
    /// `Done` at the root.
    fn value_done(&mut self) {
        self.lex = if self.depth == 0 { Lex::Done } else { Lex::Between };
    }

    fn push(&mut self, node: NodeId, phase: Phase) -> bool {
        if self.depth as usize == MAX_DEPTH {
            return false;
        }
        self.frames[self.depth as usize] = Frame { node, idx: 0, phase };
        self.depth += 1;
        self.lex = Lex::Between;
        true
    }

    fn close(&mut self) -> bool {
        self.depth -= 1;
        // Cleared, so that states equal in every open frame compare equal ([`advance`] merges
        // the forks of a union once its value has closed).
        self.frames[self.depth as usize] = Frame::default();
        self.value_done();
        true
    }

    fn word(&mut self, b: u8) -> bool {
        let word = match b {
            b't' => 0,
            b'f' => 1,
            b'n' => 2,
            _ => return false,
        };
        self.lex = Lex::Word { word, at: 1 };
        true
    }

    /// The first byte of a number of `node`.
    fn number(&mut self, schema: &Schema, node: NodeId, b: u8, integer: bool) -> bool {
        let Some(n) = Num::start(b) else { return false };
        let dig = match range(schema, node) {
            Some(r) => match Digits::default().push(b, r, integer) {
                Some(d) => d,
                None => return false,
            },
            None => Digits::default(),
        };
        self.lex = Lex::Num { n, len: 1, integer, node, dig };
        true
    }

    /// The opening `"` of a key (`key`) or of a string value of `min ..= max` characters.
    fn string(&mut self, key: bool, min: u32, max: u32) -> bool {
        self.lex = Lex::Str { key, s: StrLex::default(), chars: 0, min, max, pat: 0, at: StateID::ZERO };
        true
    }

    /// The opening `"` of a string value of `min ..= max` characters matching `schema`'s
    /// pattern `p`.
    fn patterned(&mut self, schema: &Schema, p: u16, min: u32, max: u32) -> bool {
        self.lex = Lex::Str { key: false, s: StrLex::default(), chars: 0, min, max, pat: p + 1, at: schema.patterns[p as usize].start() };
        true
    }

    /// `at` bytes of the texts in `cand` matched: the value ends here if none can go on.
    fn literal_at(&mut self, texts: &[Vec<u8>], node: NodeId, cand: u64, at: u16) {
        if bits(cand).all(|j| texts[j].len() == at as usize) {
            self.value_done();
        } else {
            self.lex = Lex::Lit { node, cand, at };
        }
    }

    /// The first byte `b` of a value of `node`.
    fn begin(&mut self, schema: &Schema, node: NodeId, b: u8, mut forks: Option<&mut Vec<JsonState>>) -> bool {
        match &schema.nodes[node as usize] {
            Node::Any => match b {
                b'{' => self.push(ANY_OBJECT, Phase::ObjOpen),
                b'[' => self.push(ANY_ARRAY, Phase::ArrOpen),
                b'"' => self.string(false, 0, u32::MAX),
                _ => self.word(b) || self.number(schema, ANY, b, false),
            },
            Node::Object { .. } => b == b'{' && self.push(node, Phase::ObjOpen),
            Node::Array { .. } => b == b'[' && self.push(node, Phase::ArrOpen),
            &Node::String { min, max, pattern } => {
                b == b'"'
                    && match pattern {
                        Some(p) => self.patterned(schema, p, min, max),
                        None => self.string(false, min, max),
                    }
            }
            &Node::Number { integer, .. } => self.number(schema, node, b, integer),
            Node::Bool => matches!(b, b't' | b'f') && self.word(b),
            Node::Null => b == b'n' && self.word(b),
            Node::Literal(texts) => {
                let all = u64::MAX >> (64 - texts.len());
                let cand = narrow(all, 0, b, |j| &texts[j]);
                cand != 0 && {
                    self.literal_at(texts, node, cand, 1);
                    true
                }
            }
            Node::AnyOf(alts) => {
                let before = *self;
                let mut taken = false;
                for &a in alts {
                    let mut t = before;
                    if !t.begin(schema, a, b, forks.as_deref_mut()) {
                        continue;
                    }
                    if !taken {
                        *self = t;
                        taken = true;
                        if forks.is_none() {
                            break;
                        }
                    } else if let Some(f) = forks.as_deref_mut() {
                        f.push(t);
                    }
                }
                taken
            }
        }
    }

    /// Byte `b` between tokens inside the top container.
    fn between(&mut self, schema: &Schema, b: u8, forks: Option<&mut Vec<JsonState>>) -> bool {
        let f = *self.top();
        match &schema.nodes[f.node as usize] {
            // Free keys (no `props`): `idx` counts them.
            Node::Object { props, extra, keys } => match (f.phase, b) {
                (Phase::ObjOpen | Phase::ObjAfter, b'}') if props.iter().skip(f.idx as usize).all(|p| !p.required) && (!props.is_empty() || f.idx >= keys.0) => self.close(),
                (Phase::ObjOpen | Phase::ObjComma, b'"') if props.is_empty() => {
                    self.top().idx = f.idx.saturating_add(1);
                    (f.idx < keys.1 || keys.1 == u16::MAX) && self.start_key(props, extra.is_some(), f.idx)
                }
                (Phase::ObjOpen | Phase::ObjComma, b'"') => self.start_key(props, extra.is_some(), f.idx),
                (Phase::ObjAfter, b',') if (props.is_empty() && (f.idx < keys.1 || keys.1 == u16::MAX)) || (f.idx as usize) < props.len() => {
                    self.top().phase = Phase::ObjComma;
                    true
                }
                (Phase::ObjColon, b':') => {
                    let value = if props.is_empty() { extra.unwrap_or(0) } else { props[f.idx as usize - 1].node };
                    self.top().phase = Phase::ObjAfter;
                    self.lex = Lex::Value(value);
                    true
                }
                _ => false,
            },
            &Node::Array { items, min, max, ref prefix } => match (f.phase, b) {
                (Phase::ArrOpen, b']') if min == 0 => self.close(),
                (Phase::ArrAfter, b']') if f.idx as u32 >= min => self.close(),
                (Phase::ArrAfter, b',') if (f.idx as u32) < max => {
                    self.top().phase = Phase::ArrComma;
                    true
                }
                (Phase::ArrOpen | Phase::ArrComma, _) => {
                    // Item `idx`: its own schema in a tuple, else `items`.
                    let item = prefix.get(f.idx as usize).copied().unwrap_or(items);
                    let top = self.top();
                    top.idx = top.idx.saturating_add(1);
                    top.phase = Phase::ArrAfter;
                    self.begin(schema, item, b, forks)
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// The opening `"` of a key: a free one, or one of the declared properties from `idx` up
    /// to the first required one (those between may be left out).
    fn start_key(&mut self, props: &[Prop], free: bool, idx: u16) -> bool {
        if props.is_empty() {
            return free && self.string(true, 0, u32::MAX);
        }
        let mut cand = 0u64;
        for (j, p) in props.iter().skip(idx as usize).enumerate().take(64) {
            cand |= 1 << j;
            if p.required {
                break;
            }
        }
        self.lex = Lex::Key { cand, at: 0 };
        cand != 0
    }

    fn key_byte(&mut self, schema: &Schema, cand: u64, at: u16, b: u8) -> bool {
        let f = *self.top();
        let Node::Object { props, .. } = &schema.nodes[f.node as usize] else { return false };
        let props = &props[f.idx as usize..];
        // A complete key's escaped text never ends inside an escape, so a `"` that would go
        // on with another candidate cannot come where one is complete.
        if b == b'"' {
            if let Some(j) = bits(cand).find(|&j| props[j].key.len() == at as usize) {
                let top = self.top();
                top.idx += j as u16 + 1;
                top.phase = Phase::ObjColon;
                self.lex = Lex::Between;
                return true;
            }
        }
        let next = narrow(cand, at, b, |j| &props[j].key);
        self.lex = Lex::Key { cand: next, at: at + 1 };
        next != 0
    }
}

/// Most automata a mask follows at once: past it, later alternatives are dropped (their texts
/// refused, never a text off the schema taken).
pub const MAX_STATES: usize = 64;

/// Replace `states` by those `bytes` lead them to through every alternative, each once
/// (`scratch`: a buffer kept between calls).
pub fn advance(states: &mut Vec<JsonState>, scratch: &mut Vec<JsonState>, schema: &Schema, bytes: &[u8]) {
    scratch.clear();
    for &s in states.iter() {
        s.follow(schema, bytes, &mut |t| {
            scratch.push(t);
            false
        });
    }
    states.clear();
    for s in scratch.drain(..) {
        if states.len() < MAX_STATES && !states.contains(&s) {
            states.push(s);
        }
    }
}

/// The bounds of number node `node`, if it has some.
fn range(schema: &Schema, node: NodeId) -> Option<&Range> {
    match &schema.nodes[node as usize] {
        Node::Number { range, .. } => range.as_ref(),
        _ => None,
    }
}

/// The texts of literal node `node`.
fn literal(schema: &Schema, node: NodeId) -> &[Vec<u8>] {
    match &schema.nodes[node as usize] {
        Node::Literal(t) => t,
        _ => &[],
    }
}
