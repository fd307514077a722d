use super::stacks::{Stacks, NIL};
use super::*;

/// Whether `text` is a whole text of `g` (`Some(true)`), the prefix of one (`Some(false)`), or
/// neither — the automaton run a code point at a time.
fn accepts(g: &Grammar, text: &str) -> Option<bool> {
    let mut st = Stacks::default();
    let mut set = Vec::new();
    st.start(g, &mut set);
    for c in text.chars() {
        let mut next = Vec::new();
        for &s in &set {
            if s != NIL && g.matches(st.top(s), c as u32) {
                let span = st.after(g, s);
                next.extend_from_slice(st.list(span));
            }
        }
        next.sort_unstable();
        next.dedup();
        if next.is_empty() {
            return None;
        }
        set = next;
    }
    Some(set.contains(&NIL))
}

fn g(src: &str) -> Grammar {
    Grammar::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

const ARITH: &str = r#"
# arithmetic, as llama.cpp's example
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"#;

#[test]
fn arithmetic_texts() {
    let a = g(ARITH);
    assert_eq!(accepts(&a, "1+2= 3\n"), Some(true));
    assert_eq!(accepts(&a, "(x1 +y)*2= z\nq=4\n"), Some(true));
    assert_eq!(accepts(&a, "(x1 +y)*2"), Some(false));
    assert_eq!(accepts(&a, "1+2="), Some(false));
    assert_eq!(accepts(&a, "1++2"), None);
    assert_eq!(accepts(&a, "X"), None);
    assert_eq!(accepts(&a, ""), Some(false));
}

#[test]
fn repetitions_count_as_llama_cpp_rewrites_them() {
    let r = g(r#"root ::= "a"{2,4} "b"?"#);
    for (t, want) in [("", Some(false)), ("a", Some(false)), ("aa", Some(true)), ("aaab", Some(true)), ("aaaa", Some(true)), ("aaaaa", None), ("ab", None), ("aabb", None)] {
        assert_eq!(accepts(&r, t), want, "{t:?}");
    }
    let r = g(r#"root ::= ("ab"){2,} | "x"{3} | [0-9]{0,2} "."{1}"#);
    for (t, want) in [("abab", Some(true)), ("ababab", Some(true)), ("ab", Some(false)), ("xxx", Some(true)), ("xx", Some(false)), ("xxxx", None), (".", Some(true)), ("12.", Some(true)), ("123.", None)] {
        assert_eq!(accepts(&r, t), want, "{t:?}");
    }
    // A literal repeats whole; `*` and `+`.
    let r = g("root ::= \"ab\"* \"c\"+");
    assert_eq!(accepts(&r, "ababcc"), Some(true));
    assert_eq!(accepts(&r, "abac"), None);
}

#[test]
fn classes_escapes_and_any() {
    let c = g(r#"root ::= [^"\\\n]+ "\x41\u00e9\U0001F389" . [a-c0-1é-ë\]]"#);
    assert_eq!(accepts(&c, "x y\tzAé🎉!]"), Some(true));
    assert_eq!(accepts(&c, "x y\tzAé🎉日ë"), Some(true));
    assert_eq!(accepts(&c, "x\"y"), None);
    assert_eq!(accepts(&c, "xAé🎉!\nd"), None);
    // Comments, newlines inside groups, after `|`, CRLF line ends.
    let c = g("root ::= ( \"a\" # first\n  | \"b\"\n ) tail # done\r\ntail ::=\n  \"!\" |\n  \"?\"\n");
    assert_eq!(accepts(&c, "b?"), Some(true));
    assert_eq!(accepts(&c, "a!"), Some(true));
    assert_eq!(accepts(&c, "c"), None, "{c:?}");
}

#[test]
fn nested_recursion_and_empty_alternatives() {
    let b = g("root ::= item*\nitem ::= \"(\" item* \")\" | \"x\"\n");
    assert_eq!(accepts(&b, "((x)(x(x)))x"), Some(true));
    assert_eq!(accepts(&b, "((x)("), Some(false));
    assert_eq!(accepts(&b, "())"), None);
    let e = g("root ::= a b \"!\"\na ::= \"a\" | \"\"\nb ::= | \"b\"\n");
    for t in ["!", "a!", "b!", "ab!"] {
        assert_eq!(accepts(&e, t), Some(true), "{t}");
    }
    assert_eq!(accepts(&e, "ba!"), None);
}

#[test]
fn bad_grammars_are_refused_by_name() {
    for (src, want) in [
        ("root ::= foo", "never defines it"),
        ("rot ::= \"a\"", "no `root` rule"),
        ("root ::= root \"a\" | \"b\"", "left-recursive"),
        ("root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", "left-recursive"),
        ("root ::= \"a", "unterminated string"),
        ("root ::= [a-", "unterminated character class"),
        ("root ::= \"\\q\"", "unknown escape"),
        ("root ::= \"a\"{3,1}", "below the least"),
        ("root ::= \"a\"{2001}", "at most 2000"),
        ("root ::= * \"a\"", "nothing before it"),
        ("root = \"a\"", "expected `::=`"),
        ("root ::= \"a\" )", "expected a newline"),
        ("root ::= (\"a\"", "expected `)`"),
        ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
        ("root ::= <hello>", "`<[id]>`"),
        (format!("root ::= \"{}\"{{1000,2000}}", "x".repeat(600)).as_str(), "more than 1048576 elements"),
    ] {
        let e = Grammar::parse(src).expect_err(src).to_string();
        assert!(e.contains(want), "{src:?}: {e}");
    }
    let e = Grammar::parse("root ::= \"a\"\n  x ::= \"\\q\"").unwrap_err().to_string();
    assert!(e.starts_with("grammar line 2, column "), "{e}");
}

#[test]
fn decode_reads_as_llama_cpp() {
    let mut out = vec![];
    assert_eq!(decode("aé🎉".as_bytes(), Partial::default(), &mut out), Some(Partial::default()));
    assert_eq!(out, ['a' as u32, 'é' as u32, '🎉' as u32]);
    // A character cut, then finished by the next piece.
    out.clear();
    let p = decode(b"x\xF0\x9F", Partial::default(), &mut out).unwrap();
    assert_eq!((out.as_slice(), p.remain), (&['x' as u32][..], 2));
    out.clear();
    assert_eq!(decode(b"\x8E\x89!", p, &mut out), Some(Partial::default()));
    assert_eq!(out, ['🎉' as u32, '!' as u32]);
    // A stray continuation byte, or a lead byte where one was due.
    assert_eq!(decode(b"\x80", Partial::default(), &mut out), None);
    assert_eq!(decode(b"a", p, &mut out), None);
    // A NUL byte ends the text.
    out.clear();
    decode(b"ab\0c", Partial::default(), &mut out);
    assert_eq!(out.len(), 2);
}

#[test]
fn partial_characters_match_by_their_possible_range() {
    let c = g("root ::= [一-龥]");
    let pos = |g: &Grammar| g.alts[g.root as usize][0];
    let start = |b: &[u8]| decode(b, Partial::default(), &mut vec![]).unwrap();
    // "日" is E6 97 A5: E6 alone could become it, as could E6 97.
    assert!(c.matches_partial(pos(&c), start(b"\xE6")));
    assert!(c.matches_partial(pos(&c), start(b"\xE6\x97")));
    // "é" starts C3: no CJK character does.
    assert!(!c.matches_partial(pos(&c), start(b"\xC3")));
    let n = g("root ::= [^一-龥]");
    assert!(!n.matches_partial(pos(&n), start(b"\xE6\x97")));
    assert!(n.matches_partial(pos(&n), start(b"\xC3")));
}

#[test]
fn token_elements_and_their_range() {
    let t = g("root ::= <[5]> !<[7]> \"a\"");
    assert!(t.check_tokens(8).is_ok());
    assert!(t.check_tokens(6).unwrap_err().to_string().contains("<[7]>"));
}

#[test]
fn literal_after_a_counted_class() {
    let y = g(r##"root ::= ("Yes" | "No") ", " [a-z ]{3,20} ".""##);
    assert_eq!(accepts(&y, "No, it is not."), Some(true));
}
