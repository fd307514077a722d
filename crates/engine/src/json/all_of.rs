//! `allOf` (a value must fit every listed schema), merged away before [`super::schema`]
//! compiles: the compiler never sees the keyword.
//!
//! Design: [`expand`] walks the document's schema positions (the root, `properties`, `$defs`,
//! `definitions`, `items`, `prefixItems`, `additionalItems`, `additionalProperties`,
//! `anyOf`/`oneOf` alternatives) and replaces
//! each schema that has `allOf` by one schema of its parts — the schema's other keywords, each
//! member, and each part's `$ref` target — merged keyword by keyword into their intersection:
//! - `type`: the types in every part (`integer` within `number`); none left: refused;
//! - objects: the properties of every part in their first part's order, a property named by
//!   two parts held to both (an `allOf` of the two, merged in turn), `required` joined; a part
//!   with `additionalProperties: false` drops the others' properties (refused where one is
//!   required), one with a schema there holds the others' properties to it too;
//! - `items` held to both; `minimum`-like bounds the largest, `maximum`-like the smallest,
//!   `multipleOf` the least common multiple; `enum`/`const` the values in every part;
//! - `pattern`/`format`: one per string (two different ones are refused: a string would have
//!   to match both, which one DFA does not check);
//! - one part with `anyOf`/`oneOf`: the rest merged into each alternative (`A ∧ (B ∨ C)` is
//!   `(A ∧ B) ∨ (A ∧ C)`, and exactly one of `B`, `C` stays exactly one), alternatives left
//!   empty dropped; two such parts are refused;
//! - annotations: the first part's; any other keyword is carried where one part has it or all
//!   agree (for the compiler to read, or refuse by name), and refused where two parts differ;
//!   a tuple (`prefixItems`) beside another part's items is refused.
//!
//! Invariant: every value of the merged schema fits every part (the merge may only narrow), so
//! a constrained answer still validates against the schema as the client wrote it.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::schema::ANNOTATIONS;
use crate::Error;

/// Most `allOf`s and `$ref`s merged inside one another before a schema is called circular.
const MAX_DEPTH: u32 = 32;
/// Most schemas walked in one expansion (a `$def` merged into many places is walked at each).
const MAX_WORK: u32 = 100_000;

/// The document `$ref`s resolve in, and the schemas walked so far.
struct Ctx<'a> {
    doc: &'a Value,
    work: std::cell::Cell<u32>,
}

/// Lower and upper bounds: the merge keeps the tighter.
const LOWER: [&str; 5] = ["minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"];
const UPPER: [&str; 5] = ["maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"];

/// The document with every `allOf` merged away (borrowed as it is where it has none).
pub(super) fn expand(doc: &Value) -> Result<Cow<'_, Value>, Error> {
    if !mentions_all_of(doc) {
        return Ok(Cow::Borrowed(doc));
    }
    Ok(Cow::Owned(walk(doc, &Ctx { doc, work: 0.into() }, "schema", 0)?))
}

fn mentions_all_of(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.contains_key("allOf") || m.values().any(mentions_all_of),
        Value::Array(a) => a.iter().any(mentions_all_of),
        _ => false,
    }
}

fn bad(path: &str, what: impl std::fmt::Display) -> Error {
    Error::Schema(format!("{path}: {what}"))
}

/// Schema `v` with every `allOf` in it and under it merged away (`depth`: merges it is inside).
fn walk(v: &Value, cx: &Ctx, path: &str, depth: u32) -> Result<Value, Error> {
    let Value::Object(m) = v else { return Ok(v.clone()) };
    if depth > MAX_DEPTH {
        return Err(bad(path, "allOf or $ref nested too deep (or refers back to itself)"));
    }
    cx.work.set(cx.work.get() + 1);
    if cx.work.get() > MAX_WORK {
        return Err(bad(path, format!("allOf expands to more than {MAX_WORK} schemas")));
    }
    let mut m = match m.contains_key("allOf") {
        true => {
            let mut merged = merge_all(m, cx, path, depth)?;
            // Definitions stay where `$ref`s look for them (a union's merge has no room).
            for key in ["$defs", "definitions"] {
                if let Some(d) = m.get(key) {
                    merged.entry(key).or_insert_with(|| d.clone());
                }
            }
            merged
        }
        false => m.clone(),
    };
    for key in ["properties", "$defs", "definitions"] {
        if let Some(Value::Object(children)) = m.get_mut(key) {
            for (k, c) in children.iter_mut() {
                *c = walk(c, cx, &format!("{path}.{key}.{k}"), depth)?;
            }
        }
    }
    // A schema, or a list of them (alternatives, a tuple's items).
    for key in ["items", "additionalProperties", "additionalItems", "prefixItems", "anyOf", "oneOf"] {
        match m.get_mut(key) {
            Some(Value::Array(list)) => {
                for (i, a) in list.iter_mut().enumerate() {
                    *a = walk(a, cx, &format!("{path}.{key}[{i}]"), depth)?;
                }
            }
            Some(c) => *c = walk(c, cx, &format!("{path}.{key}"), depth)?,
            None => {}
        }
    }
    Ok(Value::Object(m))
}

/// The schema `m` (which has `allOf`) as one schema of its parts.
fn merge_all(m: &Map<String, Value>, cx: &Ctx, path: &str, depth: u32) -> Result<Map<String, Value>, Error> {
    let path = format!("{path}.allOf");
    let members = m["allOf"].as_array().filter(|a| !a.is_empty()).ok_or_else(|| bad(&path, "allOf must list schemas"))?;
    let mut own = m.clone();
    own.remove("allOf");
    let mut parts = Vec::new();
    push_part(&mut parts, Value::Object(own), cx, &path, depth)?;
    for (i, member) in members.iter().enumerate() {
        let member = walk(member, cx, &format!("{path}[{i}]"), depth + 1)?;
        push_part(&mut parts, member, cx, &format!("{path}[{i}]"), depth + 1)?;
    }
    let unions: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].contains_key("anyOf") || parts[i].contains_key("oneOf")).collect();
    match unions[..] {
        [] => parts.into_iter().try_fold(Map::new(), |acc, p| meet(acc, p, &path)),
        [u] => distribute(parts, u, cx, &path, depth),
        _ => Err(bad(&path, "more than one member with anyOf or oneOf is not supported")),
    }
}

/// Schema `v` onto `parts`, its `$ref`'s target (merged as it is) first, so that the
/// target's properties come before those written beside the `$ref`.
fn push_part(parts: &mut Vec<Map<String, Value>>, v: Value, cx: &Ctx, path: &str, depth: u32) -> Result<(), Error> {
    let mut p = match v {
        Value::Bool(true) => return Ok(()),
        Value::Object(p) => p,
        Value::Bool(false) => return Err(bad(path, format!("{EMPTY}: a member is false"))),
        _ => return Err(bad(path, "a member is not a schema")),
    };
    if depth > MAX_DEPTH {
        return Err(bad(path, "allOf or $ref nested too deep (or refers back to itself)"));
    }
    if let Some(r) = p.remove("$ref") {
        let target = resolve(cx.doc, &r).ok_or_else(|| bad(path, format!("$ref {r} is not #, #/$defs/NAME or #/definitions/NAME of this schema")))?;
        let target = walk(target, cx, &format!("{path}.$ref"), depth + 1)?;
        push_part(parts, target, cx, path, depth + 1)?;
    }
    parts.push(p);
    Ok(())
}

/// `#`, `#/$defs/NAME` or `#/definitions/NAME` of `doc`.
fn resolve<'a>(doc: &'a Value, r: &Value) -> Option<&'a Value> {
    let r = r.as_str()?;
    if r == "#" {
        return Some(doc);
    }
    let (defs, name) = r.strip_prefix("#/$defs/").map(|n| ("$defs", n)).or_else(|| r.strip_prefix("#/definitions/").map(|n| ("definitions", n)))?;
    doc.get(defs)?.get(name)
}

/// Part `u`'s alternatives, each merged with every other part; those no value fits dropped.
fn distribute(mut parts: Vec<Map<String, Value>>, u: usize, cx: &Ctx, path: &str, depth: u32) -> Result<Map<String, Value>, Error> {
    let mut union = parts.remove(u);
    let key = if union.contains_key("oneOf") { "oneOf" } else { "anyOf" };
    if union.contains_key("anyOf") && union.contains_key("oneOf") {
        return Err(bad(path, "anyOf beside oneOf is not supported"));
    }
    let alts = union.remove(key).and_then(|a| a.as_array().cloned()).ok_or_else(|| bad(path, format!("{key} must list schemas")))?;
    parts.push(union);
    let rest = parts.into_iter().try_fold(Map::new(), |acc, p| meet(acc, p, path))?;
    let mut kept = Vec::new();
    for (i, alt) in alts.iter().enumerate() {
        match walk(&all_of(Value::Object(rest.clone()), alt.clone()), cx, &format!("{path}.{key}[{i}]"), depth + 1) {
            Ok(v) => kept.push(v),
            // An alternative that contradicts the rest is one no value takes.
            Err(Error::Schema(e)) if e.contains(EMPTY) => {}
            Err(e) => return Err(e),
        }
    }
    if kept.is_empty() {
        return Err(bad(path, format!("every alternative of {key}: {EMPTY}")));
    }
    Ok(Map::from_iter([(key.to_string(), Value::Array(kept))]))
}

/// `{"allOf": [x, y]}`: a value of both, merged in turn by [`walk`].
fn all_of(x: Value, y: Value) -> Value {
    Value::Object(Map::from_iter([("allOf".to_string(), Value::Array(vec![x, y]))]))
}

/// What a contradiction says (an alternative that says it is dropped from a union).
const EMPTY: &str = "no value fits every member";

/// The intersection of schemas `a` and `b` (neither with `allOf`, `$ref` or a union, but
/// maybe beneath).
fn meet(mut a: Map<String, Value>, b: Map<String, Value>, path: &str) -> Result<Map<String, Value>, Error> {
    // A tuple's items beside another member's items would need merging item by item.
    let tuple = |m: &Map<String, Value>| m.contains_key("prefixItems") || m.contains_key("additionalItems") || m.get("items").is_some_and(Value::is_array);
    let items = |m: &Map<String, Value>| ["items", "prefixItems", "additionalItems"].iter().any(|k| m.contains_key(*k));
    if (tuple(&a) && items(&b)) || (tuple(&b) && items(&a)) {
        return Err(bad(path, "a tuple (prefixItems) beside another member's items is not supported"));
    }
    meet_objects(&mut a, &b, path)?;
    let values = meet_values(values(&a), values(&b), path)?;
    for (k, v) in b {
        if matches!(k.as_str(), "properties" | "required" | "additionalProperties" | "enum" | "const") {
            continue;
        }
        let Some(old) = a.get(&k).cloned() else {
            a.insert(k, v);
            continue;
        };
        let merged = match k.as_str() {
            "type" => meet_types(&old, &v, path)?,
            "items" => all_of(old, v),
            "multipleOf" => match (old.as_u64(), v.as_u64()) {
                (Some(x), Some(y)) if x > 0 && y > 0 => Value::from(lcm(x, y).ok_or_else(|| bad(path, "multipleOf: the least common multiple is too large"))?),
                _ if old == v => old,
                _ => return Err(bad(path, "two multipleOf that are not both whole numbers are not supported")),
            },
            "pattern" | "format" if old != v => return Err(bad(path, format!("two different {k}s for one string are not supported"))),
            "exclusiveMinimum" | "exclusiveMaximum" if old.is_boolean() || v.is_boolean() => {
                return Err(bad(path, format!("{k} as a flag (draft 4) is not supported in allOf; write it as a number")))
            }
            k if LOWER.contains(&k) => tighter(old, v, |x, y| x > y),
            k if UPPER.contains(&k) => tighter(old, v, |x, y| x < y),
            // Annotations: the first part's. Any other keyword two members give differently
            // is not merged here (so never silently widened).
            k if ANNOTATIONS.contains(&k) || old == v => old,
            _ => return Err(bad(path, format!("two different {k:?}s in allOf members are not supported"))),
        };
        a.insert(k, merged);
    }
    if let Some(mut values) = values {
        // The values the other parts' type and bounds allow, which then say all.
        values.retain(|v| a.get("type").is_none_or(|t| has_type(t, v)) && within(&a, v));
        if values.is_empty() {
            return Err(bad(path, format!("{EMPTY}: no value of enum or const fits the other members")));
        }
        for k in LOWER.iter().chain(&UPPER).chain(&["multipleOf", "const"]) {
            a.remove(*k);
        }
        a.insert("enum".into(), Value::Array(values));
    }
    Ok(a)
}

/// Types in both `a` and `b` (absent: any); an `integer` is a `number`.
fn meet_types(a: &Value, b: &Value, path: &str) -> Result<Value, Error> {
    let list = |v: &Value| -> Vec<String> {
        match v {
            Value::String(t) => vec![t.clone()],
            Value::Array(ts) => ts.iter().filter_map(|t| t.as_str().map(String::from)).collect(),
            _ => vec![],
        }
    };
    let (a, b) = (list(a), list(b));
    let has = |l: &[String], t: &str| l.iter().any(|x| x == t);
    let mut out: Vec<String> = Vec::new();
    for t in &a {
        let keep = if has(&b, t) {
            t.as_str()
        } else if (t == "integer" && has(&b, "number")) || (t == "number" && has(&b, "integer")) {
            "integer"
        } else {
            continue;
        };
        if !has(&out, keep) {
            out.push(keep.to_string());
        }
    }
    match out.len() {
        0 => Err(bad(path, format!("{EMPTY}: no type is in both {a:?} and {b:?}"))),
        1 => Ok(Value::String(out.remove(0))),
        _ => Ok(Value::Array(out.into_iter().map(Value::String).collect())),
    }
}

/// `properties`, `required` and `additionalProperties` of `a` and `b`, into `a`.
fn meet_objects(a: &mut Map<String, Value>, b: &Map<String, Value>, path: &str) -> Result<(), Error> {
    let props = |m: &Map<String, Value>| m.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
    let (pa, pb) = (props(a), props(b));
    let (xa, xb) = (a.get("additionalProperties").cloned(), b.get("additionalProperties").cloned());
    // What a part says of a key it does not declare: `None` forbidden, else the schema.
    let other = |extra: &Option<Value>| match extra {
        Some(Value::Bool(false)) => None,
        None | Some(Value::Bool(true)) => Some(Value::Bool(true)),
        Some(s) => Some(s.clone()),
    };
    let mut required: Vec<Value> = Vec::new();
    for r in [a.get("required"), b.get("required")].into_iter().flatten().filter_map(Value::as_array).flatten() {
        if !required.contains(r) {
            required.push(r.clone());
        }
    }
    let mut merged = Map::new();
    for (k, (own, extra)) in pa.iter().map(|(k, v)| (k, (v, other(&xb)))).chain(pb.iter().filter(|(k, _)| !pa.contains_key(*k)).map(|(k, v)| (k, (v, other(&xa))))) {
        let schema = match (pa.get(k), pb.get(k), extra) {
            (Some(x), Some(y), _) => all_of(x.clone(), y.clone()),
            (_, _, None) if required.iter().any(|r| r == k) => return Err(bad(path, format!("{EMPTY}: property {k:?} is required but another member has additionalProperties false"))),
            (_, _, None) => continue,
            (_, _, Some(Value::Bool(true))) => own.clone(),
            (_, _, Some(s)) => all_of(own.clone(), s),
        };
        merged.insert(k.clone(), schema);
    }
    if !merged.is_empty() {
        a.insert("properties".into(), Value::Object(merged));
    }
    if !required.is_empty() {
        a.insert("required".into(), Value::Array(required));
    }
    match (other(&xa), other(&xb)) {
        (None, _) | (_, None) => a.insert("additionalProperties".into(), Value::Bool(false)),
        (Some(Value::Bool(true)), Some(Value::Bool(true))) => a.remove("additionalProperties"),
        (Some(Value::Bool(true)), Some(s)) | (Some(s), Some(Value::Bool(true))) => a.insert("additionalProperties".into(), s),
        (Some(x), Some(y)) => a.insert("additionalProperties".into(), all_of(x, y)),
    };
    Ok(())
}

/// The values a part's `enum` or `const` lists (`None`: any).
fn values(m: &Map<String, Value>) -> Option<Vec<Value>> {
    m.get("const").map(|c| vec![c.clone()]).or_else(|| m.get("enum").and_then(Value::as_array).cloned())
}

/// The values in both lists (either `None`: the other).
fn meet_values(a: Option<Vec<Value>>, b: Option<Vec<Value>>, path: &str) -> Result<Option<Vec<Value>>, Error> {
    let (Some(a), Some(b)) = (&a, &b) else { return Ok(a.or(b)) };
    let both: Vec<Value> = a.iter().filter(|v| b.contains(v)).cloned().collect();
    if both.is_empty() {
        return Err(bad(path, format!("{EMPTY}: no value is in every enum or const")));
    }
    Ok(Some(both))
}

/// Whether `v` is within the bounds of `m` that apply to its type, compared as validators do
/// (numbers as `f64`, strings in code points).
fn within(m: &Map<String, Value>, v: &Value) -> bool {
    let bound = |k: &str| m.get(k).and_then(Value::as_f64);
    let (n, min, max) = match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            let strict = |k: &str, above: bool| bound(k).is_none_or(|b| if above { x > b } else { x < b });
            return bound("minimum").is_none_or(|b| x >= b)
                && bound("maximum").is_none_or(|b| x <= b)
                && strict("exclusiveMinimum", true)
                && strict("exclusiveMaximum", false)
                && bound("multipleOf").is_none_or(|b| x % b == 0.0);
        }
        Value::String(t) => (t.chars().count() as f64, "minLength", "maxLength"),
        Value::Array(a) => (a.len() as f64, "minItems", "maxItems"),
        _ => return true,
    };
    bound(min).is_none_or(|b| n >= b) && bound(max).is_none_or(|b| n <= b)
}

/// Whether `v` has one of the types `t` (a name or a list) names.
fn has_type(t: &Value, v: &Value) -> bool {
    let names: Vec<&str> = match t {
        Value::String(n) => vec![n],
        Value::Array(ns) => ns.iter().filter_map(Value::as_str).collect(),
        _ => return true,
    };
    names.iter().any(|&n| match (n, v) {
        ("object", Value::Object(_)) | ("array", Value::Array(_)) | ("string", Value::String(_)) | ("boolean", Value::Bool(_)) | ("null", Value::Null) | ("number", Value::Number(_)) => true,
        ("integer", Value::Number(x)) => x.is_i64() || x.is_u64() || x.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    })
}

/// The tighter of two numeric bounds (`first_wins(x, y)`: `x` is tighter than `y`).
fn tighter(old: Value, new: Value, first_wins: impl Fn(f64, f64) -> bool) -> Value {
    match (old.as_f64(), new.as_f64()) {
        (Some(x), Some(y)) if first_wins(y, x) => new,
        _ => old,
    }
}

fn lcm(x: u64, y: u64) -> Option<u64> {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    (x / gcd(x, y)).checked_mul(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged(doc: Value) -> Value {
        expand(&doc).unwrap().into_owned()
    }

    #[test]
    fn parts_meet_keyword_by_keyword() {
        let doc = json!({"allOf": [
            {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "multipleOf": 4}}, "additionalProperties": {"type": "integer", "maximum": 10}},
            {"properties": {"a": {"minimum": 2, "maximum": 20, "multipleOf": 6}, "b": {"exclusiveMinimum": 1}, "c": {"enum": [1, "x", 2.5, null, 12, 3]}}, "required": ["b"], "title": "second"},
            {"properties": {"c": {"type": ["integer", "string"], "multipleOf": 3}}, "title": "third"}
        ], "title": "first"});
        let want = json!({
            "type": "object", "title": "first", "required": ["b"], "additionalProperties": {"type": "integer", "maximum": 10},
            "properties": {
                "a": {"type": "integer", "minimum": 2, "maximum": 20, "multipleOf": 12},
                "b": {"type": "integer", "exclusiveMinimum": 1, "maximum": 10},
                // The first member's additionalProperties holds `c` too: an integer up to 10
                // ("x", 2.5 and null are none, 12 is above), of the third's multiples of 3.
                "c": {"type": "integer", "enum": [3]}
            }
        });
        assert_eq!(merged(doc), want);
        // A member's `additionalProperties: false` drops what only the others declare.
        let closed = json!({"allOf": [{"properties": {"a": {}}, "additionalProperties": false}, {"properties": {"a": {"type": "null"}, "b": {}}}]});
        assert_eq!(merged(closed), json!({"properties": {"a": {"type": "null"}}, "additionalProperties": false}));
        // A `$ref`'s target's keywords come before those beside it.
        let r = json!({"properties": {"x": {"allOf": [{"$ref": "#/$defs/A", "properties": {"z": {}}}]}}, "$defs": {"A": {"properties": {"y": {}}}}});
        let x = &merged(r)["properties"]["x"]["properties"];
        assert_eq!(x.as_object().unwrap().keys().collect::<Vec<_>>(), ["y", "z"]);
        // A union at the root keeps the definitions its alternatives refer to.
        let root = json!({"allOf": [{"type": "object"}, {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "array"}]}], "$defs": {"A": {"properties": {"a": {}}}}});
        let m = merged(root);
        assert_eq!(m["$defs"], json!({"A": {"properties": {"a": {}}}}));
        assert_eq!(m["anyOf"].as_array().unwrap().len(), 1, "the array alternative is dropped: {m}");
        // A definition merged twice into the next, 40 times over: refused, not 2^40 merges.
        let mut defs = Map::new();
        defs.insert("D0".into(), json!({"type": "object"}));
        for i in 1..40 {
            let prev = format!("#/$defs/D{}", i - 1);
            defs.insert(format!("D{i}"), json!({"allOf": [{"$ref": prev}, {"$ref": prev}]}));
        }
        let deep = json!({"$ref": "#/$defs/D39", "$defs": defs});
        assert!(expand(&deep).unwrap_err().to_string().contains("more than 100000 schemas"));
        // Inside a tuple's items too.
        let tuple = json!({"prefixItems": [{"allOf": [{"type": "integer"}, {"minimum": 1}]}], "items": [{"allOf": [{"type": "null"}]}]});
        assert_eq!(merged(tuple), json!({"prefixItems": [{"type": "integer", "minimum": 1}], "items": [{"type": "null"}]}));
        // No `allOf`: the document itself.
        let plain = json!({"type": "object"});
        assert!(matches!(expand(&plain).unwrap(), Cow::Borrowed(_)));
    }
}
