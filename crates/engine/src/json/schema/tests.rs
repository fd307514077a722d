//! Tests of the schema compiler: answers accepted and refused per keyword, and a random
//! walk checked against a validator of the supported subset.

use super::*;
use proptest::prelude::*;
use serde_json::json;

/// A person: required and optional properties, an integer, an array of an enum with
/// bounds, a `$ref`, a nullable field, a `const`.
fn person() -> Value {
    json!({
        "title": "Person", "type": "object",
        "properties": {
            "name": {"type": "string", "description": "full name"},
            "age": {"type": "integer"},
            "email": {"type": "string"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", 7]}, "minItems": 2, "maxItems": 3},
            "address": {"$ref": "#/$defs/Address"},
            "kind": {"const": "person"},
            "score": {"type": ["number", "null"]}
        },
        "required": ["name", "age", "tags", "address", "kind"],
        "$defs": {"Address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["street", "zip"]}}
    })
}

/// A tree: a recursive `$ref` to the root.
fn tree() -> Value {
    json!({"type": "object", "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["value"]})
}

/// Bounds: an integer and a number range, string lengths, as pydantic's `Field(ge=…,
/// lt=…, max_length=…)` writes them.
fn bounded() -> Value {
    json!({
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 120},
            "code": {"type": "string", "minLength": 2, "maxLength": 3},
            "score": {"type": "number", "exclusiveMinimum": -0.5, "exclusiveMaximum": 1},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 1}, "maxItems": 2},
            "big": {"type": ["integer", "null"], "minimum": 1000}
        },
        "required": ["age", "code", "score", "big"]
    })
}

/// Patterns: anchored, with an escape in its text, a `\b`, and in an array's items; beside a
/// `maxLength` (and pydantic's `HttpUrl`: a URI of `minLength` 1, which its format implies).
fn patterned() -> Value {
    json!({
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"},
            "note": {"type": ["string", "null"], "pattern": "^(yes|no)\\b"},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^#[a-z]+$"}, "maxItems": 3},
            "line": {"type": "string", "pattern": "^a\\n\"$"},
            "day": {"type": "string", "format": "date"},
            "slug": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 5},
            "link": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 20},
            "esc": {"type": "string", "pattern": "^(\n|é)+$", "maxLength": 2},
            "pin": {"type": "string", "pattern": "^[0-9]+$", "minLength": 4, "maxLength": 6},
            "even": {"type": "string", "pattern": "^(ab)+$", "minLength": 3, "maxLength": 5},
            "word": {"type": "string", "pattern": "^[a-zé]+$", "minLength": 3, "maxLength": 100000}
        },
        "required": ["code"]
    })
}

/// Unions of objects that start alike (pydantic's `Union[Cat, Dog]`, a discriminator
/// `kind`), in an array too, and alternatives nested in alternatives.
fn union() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pet": {"$ref": "#/$defs/Pet"},
            "more": {"type": "array", "items": {"$ref": "#/$defs/Pet"}, "maxItems": 3},
            "id": {"anyOf": [{"type": "integer"}, {"type": "number", "minimum": 0.5, "maximum": 2}, {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "string", "pattern": "^x+$"}]}]}
        },
        "required": ["pet", "id"],
        "$defs": {
            "Pet": {"oneOf": [
                {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind", "lives"]},
                {"type": "object", "properties": {"kind": {"const": "dog"}, "breed": {"type": "string"}}, "required": ["kind", "breed"]},
                {"type": "object", "properties": {"kind": {"const": "cow"}}, "required": ["kind"]}
            ]}
        }
    })
}

/// `allOf`: pydantic v1's field of a model (a lone `$ref` with a description), an
/// intersection of two objects (zod's `.and()`), numbers narrowed part by part to multiples,
/// and a union whose alternatives take the rest (one no value fits: dropped); a URI; tuples
/// (pydantic's `Tuple[int, str]`, one with more items after it, and the older `items: [...]`).
fn merged() -> Value {
    json!({
        "type": "object",
        "properties": {
            "owner": {"allOf": [{"$ref": "#/$defs/Person"}], "description": "who"},
            "item": {"allOf": [{"$ref": "#/$defs/Named"}, {"type": "object", "properties": {"price": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 1000}, "name": {"maxLength": 4}}, "required": ["price"]}]},
            "size": {"allOf": [{"type": "number"}, {"type": ["integer", "null"], "minimum": 1}, {"maximum": 12, "multipleOf": 3}]},
            "shape": {"allOf": [
                {"type": "object", "properties": {"id": {"type": "integer", "multipleOf": 2}}, "required": ["id"]},
                {"anyOf": [{"properties": {"kind": {"const": "dot"}}, "required": ["kind"]}, {"properties": {"kind": {"const": "box"}, "side": {"type": "integer"}}, "required": ["kind", "side"]}, {"type": "string"}]}
            ]},
            "link": {"type": "string", "format": "uri"},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 3}], "minItems": 2, "maxItems": 2},
            "row": {"prefixItems": [{"const": "id"}], "items": {"type": "integer"}},
            "old": {"type": "array", "items": [{"type": "boolean"}, {"type": "null"}], "additionalItems": false},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2}
        },
        "required": ["owner", "item", "size", "shape"],
        "$defs": {
            "Person": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            "Named": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name"]}
        }
    })
}

fn accepts(schema: &Value, text: &str) -> Option<bool> {
    super::super::accepts(&Schema::compile(schema).unwrap(), text)
}

#[test]
fn answers_of_the_schema_are_accepted() {
    let p = person();
    for text in [
        r#"{"name":"Bob","age":3,"tags":["a","a"],"address":{"street":"x","zip":null},"kind":"person"}"#,
        r#"{"name": "Bob", "age": -30, "email": "b@x", "tags": ["b", 7, "a"], "address": {"street": "x", "zip": "123"}, "kind": "person", "score": 1.5e3}"#,
        "{\n  \"name\": \"\\u00e9\",\n  \"age\": 0,\n  \"tags\": [7, 7],\n  \"address\": {\"street\": \"\", \"zip\": \"\"},\n  \"kind\": \"person\",\n  \"score\": null\n}",
    ] {
        assert_eq!(accepts(&p, text), Some(true), "{text}");
    }
    let t = tree();
    assert_eq!(accepts(&t, r#"{"value": 1, "children": [{"value": 2}, {"value": 3, "children": [{"value": 4, "children": []}]}]}"#), Some(true));
    assert_eq!(accepts(&json!({"type": "array", "items": {"type": "boolean"}}), "[true, false]"), Some(true));
    assert_eq!(accepts(&json!({"type": "object", "additionalProperties": {"type": "integer"}}), r#"{"x": 1, "y": 2}"#), Some(true));
    assert_eq!(accepts(&json!({"type": "object", "additionalProperties": false}), "{}"), Some(true));
    assert_eq!(accepts(&json!({"enum": [{"a": 1}, [1, 2]]}), "[1,2]"), Some(true));
    assert_eq!(accepts(&p, r#"{"name":"Bob","age":3,"tags":["a","a"],"address":{"street":"x","zip":null},"kind":"pers"#), Some(false));
}

#[test]
fn answers_off_the_schema_are_refused() {
    let p = person();
    let ok = r#"{"name":"Bob","age":3,"tags":["a","b"],"address":{"street":"x","zip":null},"kind":"person"}"#;
    for (what, text) in [
        ("order", ok.replace(r#""name":"Bob","age":3"#, r#""age":3,"name":"Bob""#)),
        ("missing required", ok.replace(r#""age":3,"#, "")),
        ("unknown key", ok.replace(r#""age":3,"#, r#""age":3,"x":1,"#)),
        ("integer", ok.replace("3", "3.5")),
        ("minItems", ok.replace(r#"["a","b"]"#, "[]")),
        ("minItems 2", ok.replace(r#"["a","b"]"#, r#"["a"]"#)),
        ("maxItems", ok.replace(r#"["a","b"]"#, r#"["a","a","a","a"]"#)),
        ("enum", ok.replace(r#"["a","b"]"#, r#"["a","c"]"#)),
        ("enum number", ok.replace(r#"["a","b"]"#, "[7,77]")),
        ("anyOf", ok.replace("null", "5")),
        ("const", ok.replace("person", "persons")),
        ("type", ok.replace(r#""Bob""#, "1")),
        ("leading space", format!(" {ok}")),
    ] {
        let r = accepts(&p, &text);
        assert!(r != Some(true), "{what}: {text} gave {r:?}");
    }
    assert_eq!(accepts(&tree(), r#"{"children": []}"#), None, "value is required first");
}

#[test]
fn bounds_are_held() {
    let b = bounded();
    let ok = r#"{"age": 18, "code": "ab", "score": 0.25, "tags": ["x", "é"], "big": 1000}"#;
    assert_eq!(accepts(&b, ok), Some(true));
    for text in [ok.replace("18", "120"), ok.replace("\"ab\"", "\"a\\n\\u00e9\""), ok.replace("0.25", "-0.49999999999999"), ok.replace("1000}", "null}")] {
        assert_eq!(accepts(&b, &text), Some(true), "{text}");
    }
    for (what, text) in [
        ("below minimum", ok.replace("18", "17")),
        ("above maximum", ok.replace("18", "121")),
        ("integer", ok.replace("18", "18.0")),
        ("too short", ok.replace("\"ab\"", "\"a\"")),
        ("too long", ok.replace("\"ab\"", "\"abcd\"")),
        ("too long, escapes", ok.replace("\"ab\"", "\"\\t\\t\\t\\t\"")),
        ("surrogate escape", ok.replace("\"ab\"", "\"\\ud83d\\ude00a\"")),
        ("item too long", ok.replace("\"é\"", "\"éé\"")),
        ("exclusive maximum", ok.replace("0.25", "1")),
        ("exclusive minimum", ok.replace("0.25", "-0.5")),
        ("exponent", ok.replace("0.25", "2.5e-1")),
        ("16 digits", ok.replace("0.25", "0.250000000000000")),
        ("below minimum, nullable", ok.replace("1000}", "999}")),
    ] {
        assert_eq!(accepts(&b, &text), None, "{what}: {text}");
    }
    // Prefixes that can still end inside are taken: "1" may become 18..=120 or 1000.
    assert_eq!(accepts(&b, r#"{"age": 1"#), Some(false));
    assert_eq!(accepts(&b, r#"{"age": 2"#), Some(false));
    assert_eq!(accepts(&b, r#"{"age": 13"#), None, "no completion of 13 in 18..=120");
    assert_eq!(accepts(&b, r#"{"age": 18, "code": "ab", "score": 0.25, "big": 9"#), Some(false), "9 may become 1000");
}

#[test]
fn patterns_are_held() {
    let p = patterned();
    let ok = r##"{"code": "AB-12", "note": "yes, fine", "tags": ["#a", "#bc"], "line": "a\n\""}"##;
    assert_eq!(accepts(&p, ok), Some(true));
    assert_eq!(accepts(&p, r#"{"code": "ZZ-0", "note": null}"#), Some(true));
    for (what, text) in [
        ("too short", ok.replace("AB-12", "AB-")),
        ("lower case", ok.replace("AB-12", "ab-12")),
        ("a `\\u` escape", ok.replace("AB-12", "\\u0041B-12")),
        ("no word boundary", ok.replace("yes, fine", "yesterday")),
        ("item", ok.replace("#bc", "#b1")),
        ("escape decoded", ok.replace(r#"a\n\""#, r#"a\\n\""#)),
    ] {
        assert_eq!(accepts(&p, &text), None, "{what}: {text}");
    }
    // Prefixes that can still match are taken.
    assert_eq!(accepts(&p, r#"{"code": "A"#), Some(false));
    assert_eq!(accepts(&p, r#"{"code": "AB-1"#), Some(false));
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "note": "n"#), Some(false));
    // Beside a maxLength: a prefix is taken only if the pattern's shortest way to a match fits.
    let ok = r#"{"code": "AB-1", "slug": "ab-cd", "link": "http://e.org/ab%20", "esc": "\né"}"#;
    assert_eq!(accepts(&p, ok), Some(true));
    for (what, text) in [
        ("slug too long", ok.replace("ab-cd", "abcdef")),
        ("slug ends in a hyphen", ok.replace("ab-cd", "abcd-")),
        ("three characters of esc", ok.replace(r#"\né"#, r#"\n\n\n"#)),
        ("three characters of esc, not ASCII", ok.replace(r#"\né"#, "ééé")),
    ] {
        assert_eq!(accepts(&p, &text), None, "{what}: {text}");
    }
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "slug": "abc-"#), Some(false), "abc-d fits in 5");
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "slug": "abcd-"#), None, "abcd-e is 6");
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "slug": "a", "link": "http://e.org/ab%"#), Some(false), "%20: 18 characters");
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "slug": "a", "link": "http://e.org/abcde%"#), None, "19 characters, but %20 would make 21");
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "slug": "a", "link": "http://e.org/abcde"#), Some(false));
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "slug": "a", "link": "h"#), Some(false), "h: is a URI");
    // Beside a minLength the pattern does not imply: each state's lengths of completion.
    let ok = r#"{"code": "AB-1", "pin": "1234", "even": "abab", "word": "abé"}"#;
    assert_eq!(accepts(&p, ok), Some(true));
    assert_eq!(accepts(&p, &ok.replace("1234", "123456")), Some(true));
    assert_eq!(accepts(&p, &ok.replace("abé", "abcdefghijé")), Some(true));
    for (what, text) in [
        ("a pin of 3", ok.replace("1234", "123")),
        ("a pin of 7", ok.replace("1234", "1234567")),
        ("even of 2", ok.replace("abab", "ab")),
        ("even of 6", ok.replace("abab", "ababab")),
        ("a word of 2", ok.replace("abé", "aé")),
    ] {
        assert_eq!(accepts(&p, &text), None, "{what}: {text}");
    }
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "even": "a"#), Some(false));
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "even": "abab"#), Some(false));
    assert_eq!(accepts(&p, r#"{"code": "AB-1", "even": "ababa"#), None, "ababab is 6");
}

#[test]
fn unions_that_start_alike_are_followed_until_they_part() {
    let u = union();
    let ok = r#"{"pet": {"kind": "dog", "breed": "pug"}, "more": [{"kind": "cat", "lives": 9}, {"kind": "cow"}], "id": 1.5}"#;
    assert_eq!(accepts(&u, ok), Some(true));
    for text in [ok.replace("1.5", "7"), ok.replace("1.5", "\"ab\""), ok.replace("1.5", "\"xxxxx\"")] {
        assert_eq!(accepts(&u, &text), Some(true), "{text}");
    }
    for (what, text) in [
        ("a dog's lives", ok.replace(r#""breed": "pug""#, r#""lives": 3"#)),
        ("a cat's breed", ok.replace(r#""lives": 9"#, r#""breed": "x""#)),
        ("a cow with lives", ok.replace(r#"{"kind": "cow"}"#, r#"{"kind": "cow", "lives": 1}"#)),
        ("no such kind", ok.replace("dog", "cat")),
        ("number out of range", ok.replace("1.5", "2.5")),
        ("string of neither", ok.replace("1.5", "\"abc\"")),
    ] {
        assert_eq!(accepts(&u, &text), None, "{what}: {text}");
    }
    // The forks merge once a union's value closes: one state after each item.
    let schema = Schema::compile(&u).unwrap();
    let mut text = String::from(r#"{"pet": {"kind": "cow"}, "more": ["#);
    for item in [r#"{"kind": "cow"}"#, r#", {"kind": "cat", "lives": 1}"#, r#", {"kind": "dog", "breed": "x"}"#] {
        text.push_str(item);
        let mut states = vec![super::super::JsonState::new(&schema)];
        super::super::state::advance(&mut states, &mut vec![], &schema, text.as_bytes());
        assert_eq!(states.len(), 1, "{text}");
    }
    // Alternatives that both fit an item: two automata through it, one after it.
    let both = json!({"type": "array", "items": {"anyOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "object", "properties": {"a": {"type": "number"}}}]}});
    let schema = Schema::compile(&both).unwrap();
    let mut states = vec![super::super::JsonState::new(&schema)];
    super::super::state::advance(&mut states, &mut vec![], &schema, br#"[{"a": 1"#);
    assert_eq!(states.len(), 2);
    super::super::state::advance(&mut states, &mut vec![], &schema, br#"}, {"a": 2}, {"a": 3}"#);
    assert_eq!(states.len(), 1);
    assert_eq!(accepts(&u, r#"{"pet": {"kind": "c"#), Some(false), "cat or cow");
    assert_eq!(accepts(&u, r#"{"pet": {"kind": "co"#), Some(false));
    assert_eq!(accepts(&u, r#"{"pet": {"kind": "cx"#), None);
}

#[test]
fn all_of_multiples_uris_and_tuples_are_held() {
    let m = merged();
    let ok = r#"{"owner": {"name": "Al"}, "item": {"name": "ab", "tags": [], "price": 15}, "size": 3, "shape": {"id": 4, "kind": "box", "side": 2}, "link": "https://example.org/a?b#c"}"#;
    assert_eq!(accepts(&m, ok), Some(true));
    let tuples = ok.replace(r#"a?b#c""#, r#"a?b#c", "pair": [7, "ab"], "row": ["id", 1, 2], "old": [true, null]"#);
    for text in [ok.replace(r#""kind": "box", "side": 2"#, r#""kind": "dot""#), ok.replace(r#""tags": [], "#, ""), tuples.clone(), tuples.replace(r#"["id", 1, 2]"#, r#"["id"]"#), tuples.replace("[true, null]", "[false]"), tuples.replace("[true, null]", r#"[true, null], "counts": {"a": 1}"#), tuples.replace("[true, null]", r#"[true, null], "counts": {"a": 1, "b": 2}"#)] {
        assert_eq!(accepts(&m, &text), Some(true), "{text}");
    }
    for (what, text) in [
        ("the $ref's required name", ok.replace(r#"{"name": "Al"}"#, "{}")),
        ("price not a multiple of 5", ok.replace("15", "17")),
        ("name longer than the second member's maxLength", ok.replace(r#""ab""#, r#""abcde""#)),
        ("name shorter than the first member's minLength", ok.replace(r#""ab""#, "\"\"")),
        ("price written before the $ref's properties", ok.replace(r#""name": "ab", "tags": [], "price": 15"#, r#""price": 15, "name": "ab""#)),
        ("size null, which the first member's number excludes", ok.replace(r#""size": 3"#, r#""size": null"#)),
        ("size not a multiple of 3", ok.replace(r#""size": 3"#, r#""size": 4"#)),
        ("size above the third member's maximum", ok.replace(r#""size": 3"#, r#""size": 15"#)),
        ("size a number, not the integer of the second member", ok.replace(r#""size": 3"#, r#""size": 3.0"#)),
        ("an odd id", ok.replace(r#""id": 4"#, r#""id": 3"#)),
        ("a box without its side", ok.replace(r#", "side": 2"#, "")),
        ("the string alternative, which no object part allows", ok.replace(r#"{"id": 4, "kind": "box", "side": 2}"#, r#""box""#)),
        ("a link that is no URI", ok.replace("https://example.org/a?b#c", "example.org")),
        ("a pair's items swapped", tuples.replace(r#"[7, "ab"]"#, r#"["ab", 7]"#)),
        ("a pair of one", tuples.replace(r#"[7, "ab"]"#, "[7]")),
        ("a pair of three", tuples.replace(r#"[7, "ab"]"#, r#"[7, "ab", 1]"#)),
        ("a pair's string too long", tuples.replace(r#""ab""#, r#""abcd""#)),
        ("a row's rest not integers", tuples.replace(r#"["id", 1, 2]"#, r#"["id", 1, "x"]"#)),
        ("a row's first not its const", tuples.replace(r#"["id", 1, 2]"#, "[1, 2]")),
        ("an old tuple with more items", tuples.replace("[true, null]", "[true, null, null]")),
        ("an old tuple's second not null", tuples.replace("[true, null]", "[true, true]")),
        ("no counts", tuples.replace("[true, null]", r#"[true, null], "counts": {}"#)),
        ("three counts", tuples.replace("[true, null]", r#"[true, null], "counts": {"a": 1, "b": 2, "c": 3}"#)),
    ] {
        assert_eq!(accepts(&m, &text), None, "{what}: {text}");
    }
}

#[test]
fn unsupported_schemas_are_refused_by_name() {
    for (schema, says) in [
        (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}), "look-around"),
        (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": 5}}}), "pattern must be a string"),
        (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x{1,2}$", "minLength": 3}}}), "no string of its pattern or format has 3 to 4294967295 characters"),
        (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(ab)+$", "minLength": 3, "maxLength": 3}}}), "has 3 to 3 characters"),
        (json!({"type": "object", "properties": {"a": {"type": "string", "format": "date", "maxLength": 9}}}), "has 0 to 9 characters"),
        (json!({"type": "object", "properties": {"a": {"enum": ["x"], "pattern": "x"}}}), "\"pattern\" is supported beside \"type\" only"),
        (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "^\\x01$"}}}), "no JSON string matches"),
        (json!({"type": "object", "properties": {"d": {"type": "string", "format": "uri-reference"}}}), "the format \"uri-reference\""),
        (json!({"type": "object", "properties": {"d": {"type": "string", "format": "date", "pattern": "x"}}}), "pattern and format"),
        (json!({"type": "object", "properties": {"d": {"format": "date"}}}), "\"format\" is supported beside \"type\" only"),
        (json!({"type": "string"}), "root must be an object or an array"),
        (json!({"type": "object", "properties": {"a": {"anyOf": (0..65).map(|i| json!({"const": i})).collect::<Vec<_>>()}}}), "more than 64 alternatives"),
        (json!({"type": "object", "properties": {"a": {"oneOf": [{"type": "object"}, {"type": "object", "properties": {"b": {}}}]}}}), "discriminator"),
        (json!({"type": "object", "properties": {"a": {"oneOf": [
            {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}, {"type": "object", "properties": {"k": {"enum": [2, 1]}}, "required": ["k"]}]}}}), "discriminator"),
        (json!({"type": "object", "properties": {"a": {}}, "required": ["b"]}), "\"b\" is not in properties"),
        (json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}), "$ref"),
        (json!({"type": "object", "properties": {"a": {"enum": []}}}), "enum"),
        (json!({"type": "object", "properties": {"a": {"type": "decimal"}}}), "unknown type"),
        (json!({"type": "array", "minItems": 3, "maxItems": 2}), "minItems"),
        (json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}}), "refers back to itself"),
        (json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"$ref": "#/$defs/A"}}}), "refers back to itself"),
        (json!({"type": "object", "properties": {"a": {"minimum": 0}}}), "\"minimum\" is supported beside \"type\" only"),
        (json!({"type": "object", "properties": {"a": {"enum": [1, 5], "maximum": 3}}}), "not with enum"),
        (json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0.2, "maximum": 0.8}}}), "no integer"),
        (json!({"type": "object", "properties": {"a": {"type": "number", "minimum": 1e16}}}), "no number of at most 15 digits"),
        (json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 2}}}), "minLength"),
        (json!({"type": "object", "properties": {"a": {"type": "number", "maximum": "1"}}}), "maximum must be a number"),
        (json!({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0.5}}}), "multipleOf must be a whole number"),
        (json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 6, "multipleOf": 7}}}), "no integer"),
        (json!({"type": "object", "properties": {"a": {"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]}}}), "two different patterns"),
        (json!({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"type": "integer"}]}}}), "no value fits every member"),
        (json!({"type": "object", "properties": {"a": {"allOf": [{"enum": [1, 2]}, {"const": 3}]}}}), "no value is in every enum"),
        (json!({"type": "object", "properties": {"a": {"allOf": [{"anyOf": [{"type": "string"}]}, {"oneOf": [{"type": "string"}]}]}}}), "more than one member with anyOf"),
        (json!({"type": "object", "properties": {"a": {"allOf": [{"type": "object", "additionalProperties": false}, {"properties": {"b": {}}, "required": ["b"]}]}}}), "additionalProperties false"),
        (json!({"allOf": [{"$ref": "#"}]}), "refers back to itself"),
        (json!({"type": "object", "properties": {"a": {"allOf": []}}}), "allOf must list schemas"),
        (json!({"type": "object", "properties": {"a": {"allOf": [{"not": {}}]}}}), "the keyword \"not\""),
        (json!({"type": "object", "properties": {"a": {"allOf": [{"not": {}}, {"not": {"type": "null"}}]}}}), "two different \"not\"s"),
        (json!({"type": "object", "properties": {"a": {"allOf": [{"prefixItems": [{}]}, {"items": {"type": "null"}}]}}}), "a tuple (prefixItems) beside"),
        (json!({"type": "object", "properties": {"a": {"type": "array", "prefixItems": [{}], "items": false, "minItems": 2}}}), "minItems is above"),
        (json!({"type": "object", "properties": {"a": {"type": "object", "minProperties": 2}}}), "minProperties above 1"),
        (json!({"type": "object", "properties": {"a": {"type": "object", "minProperties": 1, "additionalProperties": false}}}), "no object has as many properties"),
        (json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"x": {}, "y": {}}, "maxProperties": 1}}}), "only where the required and declared properties imply"),
    ] {
        let e = Schema::compile(&schema).expect_err(&schema.to_string()).to_string();
        assert!(e.contains(says), "{schema}: {e}");
    }
}

/// Whether `v` is valid under `s` (the subset [`Schema::compile`] takes; `root` for `$ref`).
fn valid(s: &Value, v: &Value, root: &Value) -> bool {
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let target = if r == "#" { root } else { &root["$defs"][r.trim_start_matches("#/$defs/")] };
        return valid(target, v, root);
    }
    if let Some(c) = s.get("const") {
        return c == v;
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        return e.contains(v);
    }
    if let Some(alts) = s.get("anyOf").and_then(Value::as_array) {
        return alts.iter().any(|a| valid(a, v, root));
    }
    if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
        return alts.iter().filter(|a| valid(a, v, root)).count() == 1;
    }
    if let Some(parts) = s.get("allOf").and_then(Value::as_array) {
        let mut rest = s.clone();
        rest.as_object_mut().unwrap().remove("allOf");
        return parts.iter().all(|a| valid(a, v, root)) && valid(&rest, v, root);
    }
    // Keys beyond `properties` are free unless `additionalProperties` says otherwise.
    let object = |m: &Map<String, Value>| {
        let props = s["properties"].as_object().cloned().unwrap_or_default();
        let req = s["required"].as_array().cloned().unwrap_or_default();
        let n = m.len() as u64;
        n >= s["minProperties"].as_u64().unwrap_or(0) && n <= s["maxProperties"].as_u64().unwrap_or(u64::MAX)
            && req.iter().all(|k| m.contains_key(k.as_str().unwrap()))
            && m.iter().all(|(k, x)| match (props.get(k), s.get("additionalProperties")) {
                (Some(p), _) => valid(p, x, root),
                (None, Some(Value::Bool(b))) => *b,
                (None, Some(a)) => valid(a, x, root),
                (None, None) => true,
            })
    };
    let types: Vec<&str> = match &s["type"] {
        Value::String(t) => vec![t],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return v.as_object().is_none_or(object),
    };
    types.iter().any(|t| match (*t, v) {
        ("object", Value::Object(m)) => object(m),

        ("array", Value::Array(a)) => {
            let n = a.len() as u64;
            // A tuple's own schemas, then `items` (`additionalItems` after `items: [...]`).
            let (prefix, rest) = match (&s["prefixItems"], &s["items"]) {
                (Value::Array(p), r) => (p.clone(), r),
                (_, Value::Array(p)) => (p.clone(), &s["additionalItems"]),
                (_, r) => (vec![], r),
            };
            let item = |i: usize, x: &Value| match (prefix.get(i), rest) {
                (Some(p), _) => valid(p, x, root),
                (None, Value::Bool(b)) => *b,
                (None, Value::Null) => true,
                (None, r) => valid(r, x, root),
            };
            n >= s["minItems"].as_u64().unwrap_or(0) && n <= s["maxItems"].as_u64().unwrap_or(u64::MAX) && a.iter().enumerate().all(|(i, x)| item(i, x))
        }
        ("string", Value::String(t)) => {
            let n = t.chars().count() as u64;
            let pattern = s["pattern"].as_str().is_none_or(|p| regex::Regex::new(p).unwrap().is_match(t)) && (s["format"] != "date" || is_date(t)) && (s["format"] != "uri" || t.contains(':'));
            n >= s["minLength"].as_u64().unwrap_or(0) && n <= s["maxLength"].as_u64().unwrap_or(u64::MAX) && pattern
        }
        ("boolean", Value::Bool(_)) | ("null", Value::Null) => true,
        ("number", Value::Number(n)) => in_bounds(s, n.as_f64().unwrap()),
        // `-0` is an integer, which serde_json reads as the float -0.0.
        ("integer", Value::Number(n)) => (n.is_i64() || n.is_u64() || n.to_string() == "-0.0") && in_bounds(s, n.as_f64().unwrap()),
        _ => false,
    })
}

/// A Gregorian `YYYY-MM-DD` from year 1, by arithmetic.
fn is_date(t: &str) -> bool {
    let p: Vec<&str> = t.split('-').collect();
    let n = |s: &str, len: usize| (s.len() == len && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u32>().unwrap());
    let (Some(y), Some(m), Some(d)) = (p.first().and_then(|s| n(s, 4)), p.get(1).and_then(|s| n(s, 2)), p.get(2).and_then(|s| n(s, 2))) else { return false };
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    p.len() == 3 && y >= 1 && (1..=12).contains(&m) && d >= 1 && d <= days[m as usize - 1]
}

/// `x` against `s`'s numeric bounds, in `f64` as validators compare.
fn in_bounds(s: &Value, x: f64) -> bool {
    let b = |k: &str| s[k].as_f64();
    b("minimum").is_none_or(|m| x >= m) && b("maximum").is_none_or(|m| x <= m) && b("exclusiveMinimum").is_none_or(|m| x > m) && b("exclusiveMaximum").is_none_or(|m| x < m) && b("multipleOf").is_none_or(|m| x % m == 0.0)
}

proptest! {
    /// Soundness and completability under a schema: a random walk (bytes the automaton
    /// refuses skipped), closed greedily a byte at a time, parses as a value the schema
    /// admits.
    #[test]
    fn random_walks_complete_and_validate(which in 0..6usize, bytes in prop::collection::vec(prop::sample::select(b"{}[]:,\" \n0123456789-.eEtrufalsnabcdegimopqrstvwxyz7\xC3\xA9AB#\\".to_vec()), 0..300)) {
        let sv = [person, tree, bounded, patterned, union, merged][which]();
        let s = Schema::compile(&sv).unwrap();
        let order: Vec<u8> = b"\"}]:,0".iter().copied().chain(0..=255).collect();
        let text = super::super::walk_and_close(&s, &bytes, &order).map_err(TestCaseError::fail)?;
        let v: Value = serde_json::from_slice(&text).map_err(|e| TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(&text))))?;
        prop_assert!(valid(&sv, &v, &sv), "{} is not valid", String::from_utf8_lossy(&text));
    }
}
