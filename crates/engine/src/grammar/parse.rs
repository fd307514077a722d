//! GBNF text → rules: llama.cpp's grammar syntax, read the way its parser reads it.
//!
//! A grammar is lines `name ::= alternatives`; an alternative is a sequence of `"literal"`,
//! `[class]` / `[^class]` (ranges `a-z`), `.` (any character), rule names, `( … )` groups,
//! `<[id]>` / `!<[id]>` (one token by id, or any token but it), each optionally followed by
//! `*`, `+`, `?`, `{m}`, `{m,}` or `{m,n}`; `#` starts a comment; newlines end a rule except
//! inside parentheses and after `|`. Escapes: `\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`.
//!
//! Groups become rules of their own and repetitions are rewritten into rules as llama.cpp does
//! (`S{m,n}` → `S`×m then `S'(n−m)`, `S'(x) ::= S S'(x−1) |`; `S{m,}` → `S`×m then
//! `S' ::= S S' |`), so a grammar's automaton and the set of texts it takes are llama.cpp's.

use super::{Elem, Grammar};
use std::collections::HashMap;

/// Most repetitions of one item (`{m,n}` beyond this: unbounded, as llama.cpp).
const MAX_REPETITION: u64 = 2000;

/// Most elements repetitions may write out in all (a request's grammar is untrusted input).
const MAX_WRITTEN: usize = 1 << 20;

/// One item of a sequence while parsing (flattened into [`Elem`]s by [`finish`]).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    /// A character class: ranges (inclusive), negated or not; a literal's character is a class
    /// of one.
    Chars { neg: bool, ranges: Vec<(u32, u32)> },
    Any,
    Ref(u32),
    Token { id: u32, not: bool },
}

/// A rule's alternatives, each a sequence.
type Rule = Vec<Vec<Item>>;

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    ids: HashMap<String, u32>,
    names: Vec<String>,
    rules: Vec<Option<Rule>>,
    /// Elements repetitions have written out so far.
    written: usize,
}

/// Parse GBNF text into a grammar whose start symbol is `root`.
pub fn parse(src: &str) -> Result<Grammar, String> {
    let mut p = Parser { src: src.as_bytes(), pos: 0, ids: HashMap::new(), names: Vec::new(), rules: Vec::new(), written: 0 };
    p.grammar().map_err(|e| {
        let before = &src.as_bytes()[..p.pos.min(src.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let col = before.len() - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
        format!("grammar line {line}, column {col}: {e}")
    })?;
    let root = *p.ids.get("root").ok_or("grammar has no `root` rule")?;
    let mut rules = Vec::with_capacity(p.rules.len());
    for (id, r) in p.rules.into_iter().enumerate() {
        rules.push(r.ok_or_else(|| format!("grammar uses rule `{}` but never defines it", p.names[id]))?);
    }
    let g = finish(rules, p.names, root);
    if let Some(r) = g.left_recursive() {
        return Err(format!("grammar rule `{}` is left-recursive (llama.cpp refuses it too)", g.names[r as usize]));
    }
    Ok(g)
}

impl Parser<'_> {
    fn peek(&self, k: usize) -> u8 {
        self.src.get(self.pos + k).copied().unwrap_or(0)
    }

    fn grammar(&mut self) -> Result<(), String> {
        self.space(true);
        while self.pos < self.src.len() {
            self.rule()?;
        }
        Ok(())
    }

    /// Blanks and comments; newlines too where `newline_ok`.
    fn space(&mut self, newline_ok: bool) {
        loop {
            match self.peek(0) {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(0), 0 | b'\r' | b'\n') {
                        self.pos += 1;
                    }
                }
                _ => return,
            }
        }
    }

    fn name(&mut self) -> Result<String, String> {
        let start = self.pos;
        while matches!(self.peek(0), b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-') {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(format!("expected a rule name, found {}", self.found()));
        }
        Ok(String::from_utf8_lossy(&self.src[start..self.pos]).into_owned())
    }

    fn found(&self) -> String {
        match std::str::from_utf8(&self.src[self.pos.min(self.src.len())..]).ok().and_then(|s| s.chars().next()) {
            None => "the end".into(),
            Some(c) => format!("{c:?}"),
        }
    }

    fn symbol(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.ids.insert(name.to_string(), id);
        self.names.push(name.to_string());
        self.rules.push(None);
        id
    }

    /// A new rule for a group or repetition inside `base`.
    fn generated(&mut self, base: &str) -> u32 {
        let name = format!("{base}_{}", self.names.len());
        self.symbol(&name)
    }

    fn rule(&mut self) -> Result<(), String> {
        let name = self.name()?;
        self.space(false);
        if !self.src[self.pos..].starts_with(b"::=") {
            return Err(format!("expected `::=` after `{name}`, found {}", self.found()));
        }
        self.pos += 3;
        self.space(true);
        let id = self.symbol(&name);
        let alts = self.alternates(&name, false)?;
        if self.rules[id as usize].is_some() {
            return Err(format!("rule `{name}` is defined twice"));
        }
        self.rules[id as usize] = Some(alts);
        match self.peek(0) {
            b'\r' => self.pos += if self.peek(1) == b'\n' { 2 } else { 1 },
            b'\n' => self.pos += 1,
            0 if self.pos >= self.src.len() => {}
            _ => return Err(format!("expected a newline or the end, found {}", self.found())),
        }
        self.space(true);
        Ok(())
    }

    fn alternates(&mut self, name: &str, nested: bool) -> Result<Rule, String> {
        let mut alts = vec![self.sequence(name, nested)?];
        while self.peek(0) == b'|' {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(name, nested)?);
        }
        Ok(alts)
    }

    /// One character of a literal or class: an escape or a UTF-8 character.
    fn char(&mut self) -> Result<u32, String> {
        let c = self.peek(0);
        if c == b'\\' {
            let (kind, at) = (self.peek(1), self.pos);
            self.pos += 2;
            return match kind {
                b'x' => self.hex(2),
                b'u' => self.hex(4),
                b'U' => self.hex(8),
                b't' => Ok('\t' as u32),
                b'r' => Ok('\r' as u32),
                b'n' => Ok('\n' as u32),
                b'\\' | b'"' | b'[' | b']' => Ok(kind as u32),
                _ => {
                    self.pos = at;
                    Err(format!("unknown escape `\\{}`", kind as char))
                }
            };
        }
        if self.pos >= self.src.len() {
            return Err("unexpected end of the grammar".into());
        }
        // The source is a &str, so a whole character starts here.
        let s = std::str::from_utf8(&self.src[self.pos..]).map_err(|e| e.to_string())?;
        let ch = s.chars().next().unwrap_or('\0');
        self.pos += ch.len_utf8();
        Ok(ch as u32)
    }

    fn hex(&mut self, n: usize) -> Result<u32, String> {
        let digits = self.src.get(self.pos..self.pos + n).ok_or("expected hex digits")?;
        let s = std::str::from_utf8(digits).map_err(|e| e.to_string())?;
        let v = u32::from_str_radix(s, 16).map_err(|_| format!("expected {n} hex digits, found {s:?}"))?;
        self.pos += n;
        Ok(v)
    }

    fn int(&mut self) -> Result<u64, String> {
        let start = self.pos;
        while self.peek(0).is_ascii_digit() {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(format!("expected a number, found {}", self.found()));
        }
        std::str::from_utf8(&self.src[start..self.pos]).unwrap_or("").parse().map_err(|_| "repetition count too large".to_string())
    }

    fn sequence(&mut self, name: &str, nested: bool) -> Result<Vec<Item>, String> {
        let mut seq: Vec<Item> = Vec::new();
        // Where the last item starts (a literal is several), for a repetition after it.
        let mut last = None;
        loop {
            let c = self.peek(0);
            match c {
                b'"' => {
                    self.pos += 1;
                    last = Some(seq.len());
                    while self.peek(0) != b'"' {
                        if self.pos >= self.src.len() {
                            return Err("unterminated string literal".into());
                        }
                        let ch = self.char()?;
                        seq.push(Item::Chars { neg: false, ranges: vec![(ch, ch)] });
                    }
                    self.pos += 1;
                    self.space(nested);
                }
                b'[' => {
                    self.pos += 1;
                    let neg = self.peek(0) == b'^';
                    if neg {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    while self.peek(0) != b']' {
                        if self.pos >= self.src.len() {
                            return Err("unterminated character class".into());
                        }
                        let lo = self.char()?;
                        let mut hi = lo;
                        if self.peek(0) == b'-' && self.peek(1) != b']' {
                            self.pos += 1;
                            if self.pos >= self.src.len() {
                                return Err("unterminated character class".into());
                            }
                            hi = self.char()?;
                        }
                        ranges.push((lo, hi));
                    }
                    self.pos += 1;
                    last = Some(seq.len());
                    seq.push(Item::Chars { neg, ranges });
                    self.space(nested);
                }
                b'<' | b'!' => {
                    let not = c == b'!';
                    if not {
                        self.pos += 1;
                    }
                    if !self.src[self.pos..].starts_with(b"<[") {
                        return Err("a token is written `<[id]>` (token texts are not supported)".into());
                    }
                    self.pos += 2;
                    let id = self.int()?;
                    if !self.src[self.pos..].starts_with(b"]>") {
                        return Err(format!("expected `]>`, found {}", self.found()));
                    }
                    self.pos += 2;
                    last = Some(seq.len());
                    seq.push(Item::Token { id: u32::try_from(id).map_err(|_| "token id too large")?, not });
                    self.space(nested);
                }
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' => {
                    let r = self.name()?;
                    let id = self.symbol(&r);
                    last = Some(seq.len());
                    seq.push(Item::Ref(id));
                    self.space(nested);
                }
                b'(' => {
                    self.pos += 1;
                    self.space(true);
                    let id = self.generated(name);
                    let alts = self.alternates(name, true)?;
                    self.rules[id as usize] = Some(alts);
                    if self.peek(0) != b')' {
                        return Err(format!("expected `)`, found {}", self.found()));
                    }
                    self.pos += 1;
                    last = Some(seq.len());
                    seq.push(Item::Ref(id));
                    self.space(nested);
                }
                b'.' => {
                    self.pos += 1;
                    last = Some(seq.len());
                    seq.push(Item::Any);
                    self.space(nested);
                }
                b'*' | b'+' | b'?' => {
                    self.pos += 1;
                    self.space(nested);
                    let (min, max) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat(name, &mut seq, last, min, max)?;
                }
                b'{' => {
                    self.pos += 1;
                    self.space(nested);
                    let min = self.int()?;
                    self.space(nested);
                    let max = match self.peek(0) {
                        b'}' => Some(min),
                        b',' => {
                            self.pos += 1;
                            self.space(nested);
                            let max = if self.peek(0).is_ascii_digit() { Some(self.int()?) } else { None };
                            self.space(nested);
                            max
                        }
                        _ => return Err(format!("expected `,` or `}}`, found {}", self.found())),
                    };
                    if self.peek(0) != b'}' {
                        return Err(format!("expected `}}`, found {}", self.found()));
                    }
                    self.pos += 1;
                    self.space(nested);
                    if min > MAX_REPETITION {
                        return Err(format!("{min} repetitions: at most {MAX_REPETITION}"));
                    }
                    if max.is_some_and(|m| m < min) {
                        return Err(format!("repetition `{{{min},{}}}`: the most is below the least", max.unwrap_or(0)));
                    }
                    let max = max.filter(|&m| m <= MAX_REPETITION);
                    self.repeat(name, &mut seq, last, min, max)?;
                }
                _ => return Ok(seq),
            }
        }
    }

    /// Rewrite the items from `last` on as repeated `min` to `max` (`None`: unbounded) times.
    fn repeat(&mut self, name: &str, seq: &mut Vec<Item>, last: Option<usize>, min: u64, max: Option<u64>) -> Result<(), String> {
        let start = last.filter(|&l| l < seq.len()).ok_or("`*`, `+`, `?` or `{` with nothing before it")?;
        let item: Vec<Item> = seq.split_off(start);
        let copies = min + max.map_or(1, |m| m - min);
        self.written = self.written.saturating_add(item.len().saturating_mul(copies as usize));
        if self.written > MAX_WRITTEN {
            return Err(format!("repetitions write out more than {MAX_WRITTEN} elements"));
        }
        for _ in 0..min {
            seq.extend(item.iter().cloned());
        }
        // S' rules, innermost first: S'(1) ::= S | ; S'(x) ::= S S'(x-1) | ; or S' ::= S S' | .
        let n_opt = match max {
            None => 1,
            Some(m) => m - min,
        };
        let mut inner: Option<u32> = None;
        for _ in 0..n_opt {
            let id = self.generated(name);
            let mut alt = item.clone();
            match (max, inner) {
                (None, _) => alt.push(Item::Ref(id)),
                (Some(_), Some(prev)) => alt.push(Item::Ref(prev)),
                (Some(_), None) => {}
            }
            self.rules[id as usize] = Some(vec![alt, vec![]]);
            inner = Some(id);
        }
        if let Some(id) = inner {
            seq.push(Item::Ref(id));
        }
        Ok(())
    }
}

/// Lay the rules out as [`Grammar`]'s flat element table.
fn finish(rules: Vec<Rule>, names: Vec<String>, root: u32) -> Grammar {
    let mut g = Grammar { elems: Vec::new(), ranges: Vec::new(), alts: Vec::new(), names, root };
    for rule in rules {
        let mut starts = Vec::with_capacity(rule.len());
        for alt in rule {
            starts.push(g.elems.len() as u32);
            for item in alt {
                let e = match item {
                    Item::Chars { neg, ranges } => {
                        let at = g.ranges.len() as u32;
                        g.ranges.extend(ranges.iter().copied());
                        Elem::Chars { neg, at, n: ranges.len() as u32 }
                    }
                    Item::Any => Elem::Any,
                    Item::Ref(r) => Elem::Ref(r),
                    Item::Token { id, not } => Elem::Token { id, not },
                };
                g.elems.push(e);
            }
            g.elems.push(Elem::End);
        }
        g.alts.push(starts);
    }
    g
}
