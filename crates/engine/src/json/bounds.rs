//! Bounds on numbers (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
//! `multipleOf`) and on string lengths (`minLength`, `maxLength`), held byte by byte like the
//! rest of the schema.
//!
//! Design, numbers: a bounded number is written without an exponent and with at most
//! [`DIGITS`] digits (so at most 14 after the point), which makes every such number a whole
//! count of units of 10⁻¹⁴ below 10²⁹ (an `i128`), and each bound becomes the nearest unit
//! inside it ([`Range`]: both ends inclusive). A prefix is taken only where some completion
//! lies in the range: the completions of a prefix are a few arithmetic grids (one per count
//! of integer digits still to come), each checked exactly ([`Range::meets`]). `multipleOf`
//! (a whole number `m`) keeps of a grid the points that are multiples of `m`: a grid again,
//! found by solving `a + j·step ≡ 0 (mod m)` for `j` (a step divides every whole `m`). Only whole multiples are taken:
//! validators test a fraction such as 0.1 in binary floating point, where 0.3 is not a
//! multiple of it, so a decimal answer could fail them. Why exact decimal
//! comparison is what validators do: they compare the parsed `f64` with the bound's `f64`;
//! two different decimals of at most 15 significant digits parse to different `f64`s (15 is
//! `DBL_DIG`) and a bound's shortest text parses to the bound, so with rounding monotone,
//! the decimal order of the text against the bound's shortest text is the `f64` order.
//!
//! Strings: characters are counted as they begin (an escape is one); a bounded string takes
//! no `\u` escape of a surrogate (the character itself is written instead), so each escape
//! is one character, as validators count code points.

use serde_json::{Map, Value};

use crate::Error;

/// Most digits of a bounded number, integer and fraction together.
pub const DIGITS: u8 = 15;
/// Units per one: a bounded number is a whole count of 10⁻¹⁴.
const UNIT: i128 = 100_000_000_000_000;
/// Past any bounded number (they stay below 10¹⁵ · [`UNIT`]).
const FAR: i128 = 1_000_000_000_000_000_000_000_000_000_000;

/// The keywords read here.
pub(super) const KEYWORDS: [&str; 7] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength"];

/// `10^e` in units.
fn pow10(e: u32) -> i128 {
    10i128.pow(e)
}

/// The numbers a bounded node admits: units `lo ..= hi` that are multiples of `multiple`
/// units (1: any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    lo: i128,
    hi: i128,
    multiple: i128,
}

/// No bounds: every number of at most [`DIGITS`] digits.
const OPEN: Range = Range { lo: -FAR, hi: FAR, multiple: 1 };

impl Range {
    /// The range of a `number` or `integer` schema `m` (`None` without bounds).
    pub(super) fn compile(m: &Map<String, Value>, path: &str) -> Result<Option<Range>, Error> {
        let num = |k: &str| m.get(k).map(|v| v.as_number().map(|n| n.to_string()).ok_or_else(|| bad(path, format!("{k} must be a number")))).transpose();
        // Draft 4's form: `exclusiveMinimum: true` makes `minimum` exclusive.
        let flag = |k: &str| matches!(m.get(k), Some(Value::Bool(true)));
        let excl = |k: &str| if matches!(m.get(k), Some(Value::Bool(_))) { Ok(None) } else { num(k) };
        let mut r = OPEN;
        if let Some(t) = num("minimum")? {
            r.lo = r.lo.max(units(&t, Round::Up, flag("exclusiveMinimum")));
        }
        if let Some(t) = excl("exclusiveMinimum")? {
            r.lo = r.lo.max(units(&t, Round::Up, true));
        }
        if let Some(t) = num("maximum")? {
            r.hi = r.hi.min(units(&t, Round::Down, flag("exclusiveMaximum")));
        }
        if let Some(t) = excl("exclusiveMaximum")? {
            r.hi = r.hi.min(units(&t, Round::Down, true));
        }
        if let Some(v) = m.get("multipleOf") {
            let whole = v.as_u64().filter(|&n| n > 0 && n < 10u64.pow(DIGITS as u32));
            let n = whole.ok_or_else(|| bad(path, "multipleOf must be a whole number from 1 to 10^15 (validators test fractions in binary floating point, where 0.3 is not a multiple of 0.1)"))?;
            r.multiple = n as i128 * UNIT;
        }
        Ok((r != OPEN).then_some(r))
    }

    fn contains(&self, v: i128) -> bool {
        (self.lo..=self.hi).contains(&v) && v.rem_euclid(self.multiple) == 0
    }

    /// Is some `a + j·step` (`0 ≤ j < n`) inside?
    fn meets(&self, a: i128, step: i128, n: i128) -> bool {
        if self.multiple == 1 {
            return self.meets_grid(a, step, n);
        }
        // The `j` with `a + j·step ≡ 0 (mod M)`. A grid's step is a power of ten up to one
        // (`UNIT`), so it divides M, a whole number of ones: none unless `step` divides `a`;
        // else every `j ≡ -a / step (mod M / step)`.
        debug_assert_eq!(self.multiple % step, 0);
        if a.rem_euclid(step) != 0 {
            return false;
        }
        let period = self.multiple / step;
        let j0 = (-a / step).rem_euclid(period);
        if j0 >= n {
            return false;
        }
        let first = a + j0 * step;
        if n - j0 <= period {
            return self.meets_grid(first, step, 1);
        }
        self.meets_grid(first, step * period, (n - 1 - j0) / period + 1)
    }

    /// Is some `a + j·step` (`0 ≤ j < n`) within `lo ..= hi`?
    fn meets_grid(&self, a: i128, step: i128, n: i128) -> bool {
        let last = a + (n - 1) * step;
        if last < self.lo || a > self.hi {
            return false;
        }
        // The first grid point at or above `lo`.
        let j = if a >= self.lo { 0 } else { (self.lo - a + step - 1) / step };
        a + j * step <= self.hi
    }

    /// Does any number (of `integer`s: any integer) lie inside?
    pub(super) fn satisfiable(&self, integer: bool) -> bool {
        [false, true].into_iter().any(|neg| Digits { neg, ..Digits::default() }.reachable(self, integer))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Round {
    Up,
    Down,
}

/// A bound's text (serde_json's shortest, maybe with an exponent) in units, rounded into the
/// range (`exclusive`: one unit further in where it falls on a unit), clamped to ±[`FAR`].
fn units(text: &str, round: Round, exclusive: bool) -> i128 {
    let (neg, t) = text.strip_prefix('-').map_or((false, text), |t| (true, t));
    let (mant, exp) = t.split_once(['e', 'E']).map_or((t, 0), |(m, e)| (m, e.parse::<i32>().unwrap_or(0)));
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    let digits: Vec<u8> = int.bytes().chain(frac.bytes()).map(|b| b - b'0').collect();
    // value = digits · 10^(exp − frac.len()); in units, 10^(shift).
    let shift = exp - frac.len() as i32 + 14;
    let first = digits.iter().position(|&d| d != 0);
    let Some(first) = first else { return if exclusive { [1, -1][(round == Round::Down) as usize] } else { 0 } };
    // Magnitude past FAR: clamp (no bounded number gets near).
    if (digits.len() - first) as i32 + shift > 31 {
        let m = FAR;
        return if neg { -m } else { m };
    }
    // Whole units and whether a fraction of one was cut off.
    let (mut mag, mut cut) = (0i128, false);
    for (i, &d) in digits.iter().enumerate() {
        let place = shift + (digits.len() - 1 - i) as i32;
        if place >= 0 {
            mag += d as i128 * pow10(place as u32);
        } else if d != 0 {
            cut = true;
        }
    }
    // Signed value v = ±(mag + frac); into the range from below (Up) or above (Down).
    let v = if neg { -mag } else { mag };
    match (round, neg, cut) {
        (Round::Up, false, true) => v + 1,
        (Round::Up, true, true) | (Round::Down, false, true) => v,
        (Round::Down, true, true) => v - 1,
        (Round::Up, _, false) => v + exclusive as i128,
        (Round::Down, _, false) => v - exclusive as i128,
    }
}

fn bad(path: &str, what: impl std::fmt::Display) -> Error {
    Error::Schema(format!("{path}: {what}"))
}

/// A bounded number's text so far: its sign, its digits as one integer, how many are before
/// and after the point, and whether the point came.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Digits {
    neg: bool,
    dot: bool,
    int: u8,
    frac: u8,
    mag: u64,
}

impl Digits {
    /// The text after byte `b`, which the number grammar took, if a bounded number can hold
    /// it (no exponent, at most [`DIGITS`] digits) and some completion of it lies in `r`.
    pub(super) fn push(self, b: u8, r: &Range, integer: bool) -> Option<Digits> {
        let mut d = self;
        match b {
            b'-' => d.neg = true,
            b'.' => d.dot = true,
            b'0'..=b'9' if d.int + d.frac < DIGITS => {
                d.mag = d.mag * 10 + (b - b'0') as u64;
                if d.dot {
                    d.frac += 1;
                } else {
                    d.int += 1;
                }
            }
            _ => return None,
        }
        d.reachable(r, integer).then_some(d)
    }

    /// The number as it stands, in units (whole: at least one digit, none owed after a point).
    fn value(&self) -> i128 {
        let v = self.mag as i128 * pow10(14 - self.frac as u32);
        if self.neg {
            -v
        } else {
            v
        }
    }

    /// Does the number as it stands lie in `r`?
    pub(super) fn ends_in(&self, r: &Range) -> bool {
        r.contains(self.value())
    }

    /// Do some of the grid `±(a + j·step)`, `0 ≤ j < n`, lie in `r`?
    fn meets(&self, r: &Range, a: i128, step: i128, n: i128) -> bool {
        if self.neg {
            r.meets(-(a + (n - 1) * step), step, n)
        } else {
            r.meets(a, step, n)
        }
    }

    /// Can the text be completed (more digits, a point and fraction digits) to a number in
    /// `r`? The completions with `k` more integer digits are the grid from `P·10^k` over
    /// `10^k` ones, in steps of the last fraction digit still free (of `integer`s: of one).
    fn reachable(&self, r: &Range, integer: bool) -> bool {
        let room = (DIGITS - self.int - self.frac) as u32;
        // Steps of the last digit when `f` fraction digits can be written.
        let step = |f: u32| if integer { UNIT } else { pow10(14 - f) };
        let grid = |a: i128, width: i128, f: u32| self.meets(r, a, step(f), width / step(f));
        if self.dot {
            // P.F: the grid [P.F, P.F + 10^-frac), its `room` fraction digits still free.
            let a = self.mag as i128 * pow10(14 - self.frac as u32);
            return (self.frac > 0 || room > 0) && grid(a, pow10(14 - self.frac as u32), self.frac as u32 + room);
        }
        if self.int == 0 {
            // Only the sign: a first integer digit 0‥9, then k more (no leading zero).
            return grid(0, 10 * UNIT, DIGITS as u32 - 1) || (2..=DIGITS as u32).any(|k| grid(pow10(k - 1) * UNIT, (pow10(k) - pow10(k - 1)) * UNIT, DIGITS as u32 - k));
        }
        if self.mag == 0 {
            // A leading zero: 0 or 0.F only.
            return grid(0, UNIT, room);
        }
        // P, then k more integer digits and room − k fraction digits.
        (0..=room).any(|k| grid(self.mag as i128 * pow10(k) * UNIT, pow10(k) * UNIT, room - k))
    }
}

/// `minLength` and `maxLength` of a string schema `m` (characters), `(0, u32::MAX)` without.
pub(super) fn lengths(m: &Map<String, Value>, path: &str) -> Result<(u32, u32), Error> {
    let count = |k: &str| m.get(k).map(|v| v.as_u64().filter(|&n| n < u32::MAX as u64).map(|n| n as u32).ok_or_else(|| bad(path, format!("{k} must be a count")))).transpose();
    let (min, max) = (count("minLength")?.unwrap_or(0), count("maxLength")?.unwrap_or(u32::MAX));
    if min > max {
        return Err(bad(path, "minLength is above maxLength"));
    }
    Ok((min, max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn range(s: Value) -> Range {
        Range::compile(s.as_object().unwrap(), "t").unwrap().unwrap()
    }

    #[test]
    fn bounds_become_units_inside() {
        assert_eq!(range(json!({"minimum": 0, "maximum": 1})), Range { lo: 0, hi: UNIT, multiple: 1 });
        assert_eq!(range(json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1})), Range { lo: 1, hi: UNIT - 1, multiple: 1 });
        assert_eq!(range(json!({"minimum": 0, "exclusiveMinimum": true})), Range { lo: 1, hi: FAR, multiple: 1 });
        assert_eq!(range(json!({"minimum": -2.5, "maximum": 1e-20})), Range { lo: -5 * UNIT / 2, hi: 0, multiple: 1 });
        assert_eq!(range(json!({"exclusiveMaximum": -1e-20})), Range { lo: -FAR, hi: -1, multiple: 1 });
        assert_eq!(range(json!({"minimum": 1e300, "maximum": -1.5e300})), Range { lo: FAR, hi: -FAR, multiple: 1 });
        assert_eq!(range(json!({"minimum": 0.1})), Range { lo: UNIT / 10, hi: FAR, multiple: 1 });
        assert!(Range::compile(json!({"maximum": "1"}).as_object().unwrap(), "t").is_err());
        assert_eq!(Range::compile(json!({}).as_object().unwrap(), "t").unwrap(), None);
    }

    /// Feed `text` to a bounded number; `Some(ends in range)` if every byte was taken.
    fn feed(r: &Range, integer: bool, text: &str) -> Option<bool> {
        let d = text.bytes().try_fold(Digits::default(), |d, b| d.push(b, r, integer))?;
        Some(d.int > 0 && (!d.dot || d.frac > 0) && d.ends_in(r))
    }

    #[test]
    fn prefixes_are_taken_only_where_they_can_end_inside() {
        let r = range(json!({"minimum": 5, "maximum": 7.25}));
        assert_eq!(feed(&r, false, "5"), Some(true));
        assert_eq!(feed(&r, false, "7.25"), Some(true));
        assert_eq!(feed(&r, false, "7.2"), Some(true));
        assert_eq!(feed(&r, false, "7.26"), None);
        assert_eq!(feed(&r, false, "8"), None);
        assert_eq!(feed(&r, false, "1"), None, "no completion of 1 in [5, 7.25]");
        assert_eq!(feed(&r, false, "-"), None);
        assert_eq!(feed(&r, false, "4.9"), None);
        let big = range(json!({"minimum": 100}));
        assert_eq!(feed(&big, true, "1"), Some(false), "1 can become 100");
        assert_eq!(feed(&big, true, "0"), None);
        assert_eq!(feed(&big, true, "999999999999999"), Some(true));
        assert_eq!(feed(&big, true, "1000000000000000"), None, "16 digits");
        let neg = range(json!({"exclusiveMaximum": 0}));
        assert_eq!(feed(&neg, false, "-0"), Some(false), "-0 is 0, -0.5 is inside");
        assert_eq!(feed(&neg, false, "-0.00000000000001"), Some(true));
        assert_eq!(feed(&neg, true, "-0"), None, "no negative integer starts -0");
        assert_eq!(feed(&neg, true, "-3"), Some(true));
        assert_eq!(feed(&neg, false, "0"), None);
        let tight = range(json!({"minimum": 0.2, "maximum": 0.8}));
        assert!(tight.satisfiable(false) && !tight.satisfiable(true));
        assert!(!range(json!({"minimum": 2, "maximum": 1})).satisfiable(false));
    }

    #[test]
    fn multiples_are_held_digit_by_digit() {
        let r = range(json!({"multipleOf": 7, "minimum": -20, "maximum": 100}));
        assert_eq!(feed(&r, true, "14"), Some(true));
        assert_eq!(feed(&r, true, "-14"), Some(true));
        assert_eq!(feed(&r, true, "0"), Some(true));
        assert_eq!(feed(&r, true, "98"), Some(true));
        assert_eq!(feed(&r, true, "15"), None, "no completion of 15 is a multiple of 7 up to 100");
        assert_eq!(feed(&r, true, "1"), Some(false), "1 may become 14");
        assert_eq!(feed(&r, true, "9"), Some(false), "9 may become 91 or 98");
        assert_eq!(feed(&r, true, "-2"), None, "-21 is below -20");
        assert_eq!(feed(&r, false, "14.0"), Some(true), "14.0 is a multiple of 7");
        assert_eq!(feed(&r, false, "14.5"), None);
        assert_eq!(feed(&r, false, "14."), Some(false));
        // Every prefix taken by a wide range of multiples can still end on one.
        let big = range(json!({"multipleOf": 1000003}));
        assert_eq!(feed(&big, true, "3000009"), Some(true));
        assert_eq!(feed(&big, true, "3000008"), Some(false), "30000080… may still be one");
        assert_eq!(feed(&big, true, "300000800000000"), None, "15 digits, not a multiple");
        assert!(!range(json!({"multipleOf": 10, "minimum": 1, "maximum": 9})).satisfiable(false));
        assert!(range(json!({"multipleOf": 10, "minimum": 1, "maximum": 10})).satisfiable(true));
        for bad in [json!({"multipleOf": 0.1}), json!({"multipleOf": 0}), json!({"multipleOf": -3}), json!({"multipleOf": 1e16})] {
            assert!(Range::compile(bad.as_object().unwrap(), "t").is_err(), "{bad}");
        }
    }

    /// Against every integer in a window: a text of it is taken whole exactly where it is a
    /// multiple in range, and each of its prefixes where some multiple in range extends it.
    #[test]
    fn multiples_agree_with_arithmetic() {
        for (m, lo, hi) in [(3i64, -50i64, 50i64), (25, 0, 1000), (1, 10, 20), (12, -1000, -100)] {
            let r = range(json!({"multipleOf": m, "minimum": lo, "maximum": hi}));
            for v in -1200i64..1200 {
                let t = v.to_string();
                let ok = (lo..=hi).contains(&v) && v % m == 0;
                assert_eq!(feed(&r, true, &t) == Some(true), ok, "{v} of {m} in {lo}..={hi}");
                for cut in 1..t.len() {
                    let p = &t[..cut];
                    // The texts of the multiples in range; 0 also as `-0`.
                    let texts = (lo..=hi).filter(|w| w % m == 0).flat_map(|w| [w.to_string(), if w == 0 { "-0".into() } else { String::new() }]);
                    let extends = texts.filter(|t| !t.is_empty()).any(|t| t.starts_with(p));
                    assert_eq!(feed(&r, true, p).is_some(), extends, "prefix {p} of {v}, multiples of {m} in {lo}..={hi}");
                }
            }
        }
    }
}
