//! The lexical pieces of JSON (RFC 8259) as byte-at-a-time automata, `Copy` and heap-free:
//! numbers ([`Num`]), the inside of strings ([`StrLex`]: escapes, `\u` digits, UTF-8 checked as
//! `str` requires) and the words `true`, `false`, `null`. [`super::state`] strings them together.

/// Longest number, and most exponent digits: every number then fits an `f64` (serde_json,
/// like most parsers without arbitrary precision, refuses `1e1000`).
pub const MAX_NUM: u8 = 40;
const MAX_EXP_DIGITS: u8 = 2;

/// The words a value may be.
pub(super) const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// Where in a number the automaton is (JSON's `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Num {
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
    /// The state after a number's first byte `b`, if `b` can start one.
    pub(super) fn start(b: u8) -> Option<Num> {
        match b {
            b'-' => Some(Num::Minus),
            b'0' => Some(Num::Zero),
            b'1'..=b'9' => Some(Num::Int),
            _ => None,
        }
    }

    /// May the number end here?
    pub(super) fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits(_))
    }

    /// The state after `b`, or `None` where `b` does not continue the number (an `integer`
    /// takes no fraction or exponent).
    pub(super) fn step(self, b: u8, integer: bool) -> Option<Num> {
        let digit = b.is_ascii_digit();
        Some(match (self, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, _) if digit => Num::Int,
            (Num::Zero | Num::Int, b'.') if !integer => Num::Dot,
            (Num::Int, _) if digit => Num::Int,
            (Num::Dot | Num::Frac, _) if digit => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') if !integer => Num::Exp,
            (Num::Exp, b'+' | b'-') => Num::ExpSign,
            (Num::Exp | Num::ExpSign, _) if digit => Num::ExpDigits(1),
            (Num::ExpDigits(n), _) if digit && n < MAX_EXP_DIGITS => Num::ExpDigits(n + 1),
            _ => return None,
        })
    }
}

/// Inside a string, after its opening `"`. `esc`: 0 none, 1 after `\`, 2..=5 that many `\u`
/// hex digits still to come. `need`: UTF-8 continuation bytes still to come, the next in
/// `lo..=hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(super) struct StrLex {
    esc: u8,
    need: u8,
    lo: u8,
    hi: u8,
}

/// What a byte does to a string.
pub(super) enum StrStep {
    /// Still inside, in this state.
    In(StrLex),
    /// The closing `"`.
    Close,
    /// Not a string's byte here.
    Bad,
}

impl StrLex {
    /// Outside an escape and a UTF-8 sequence: where whole characters other than `"`, `\`
    /// and control characters are text that changes nothing.
    pub(super) fn plain(self) -> bool {
        self.esc == 0 && self.need == 0
    }

    /// Right after a `\`, where the escape's letter comes.
    pub(super) fn after_backslash(self) -> bool {
        self.esc == 1
    }

    /// Would `b` make the `\u` escape under way one of a surrogate (`\uD800`‥`\uDFFF`)?
    pub(super) fn surrogate_escape(self, b: u8) -> bool {
        self.esc == 4 && self.lo == 1 && matches!(b, b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F')
    }

    pub(super) fn step(self, b: u8) -> StrStep {
        let s = |esc, need, lo, hi| StrStep::In(StrLex { esc, need, lo, hi });
        if self.need > 0 {
            return if (self.lo..=self.hi).contains(&b) { s(0, self.need - 1, 0x80, 0xBF) } else { StrStep::Bad };
        }
        match self.esc {
            1 if matches!(b, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' | b'u') => return s(if b == b'u' { 5 } else { 0 }, 0, 0, 0),
            // `lo` after a `\u`'s first digit: whether it was `d` (a surrogate may follow).
            2..=5 if b.is_ascii_hexdigit() => return s(if self.esc == 2 { 0 } else { self.esc - 1 }, 0, (self.esc == 5 && b | 0x20 == b'd') as u8, 0),
            1..=5 => return StrStep::Bad,
            _ => {}
        }
        // UTF-8 as `str` accepts it: no overlong forms, no surrogates, nothing past U+10FFFF.
        match b {
            b'"' => StrStep::Close,
            b'\\' => s(1, 0, 0, 0),
            0x00..=0x1F | 0x80..=0xC1 | 0xF5..=0xFF => StrStep::Bad,
            0x20..=0x7F => s(0, 0, 0, 0),
            0xC2..=0xDF => s(0, 1, 0x80, 0xBF),
            0xE0 => s(0, 2, 0xA0, 0xBF),
            0xED => s(0, 2, 0x80, 0x9F),
            0xE1..=0xEF => s(0, 2, 0x80, 0xBF),
            0xF0 => s(0, 3, 0x90, 0xBF),
            0xF4 => s(0, 3, 0x80, 0x8F),
            0xF1..=0xF3 => s(0, 3, 0x80, 0xBF),
        }
    }
}
