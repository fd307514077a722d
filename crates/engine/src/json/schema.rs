//! JSON Schema (OpenAI's `response_format: {"type": "json_schema"}`) compiled to the node
//! table [`super::state::JsonState`] walks.
//!
//! Design: a schema becomes a flat `Vec` of [`Node`]s addressed by `u16`, so the automaton's
//! state names the node it is in and stays `Copy`. `$ref`s (to `#`, `#/$defs/…` or
//! `#/definitions/…`) become one-alternative `AnyOf` nodes reserved before their target is
//! compiled, so recursive schemas compile. What is supported, as OpenAI's structured outputs
//! and llama.cpp's schema grammars write answers:
//! - `type` (one or a list): `object`, `array`, `string`, `number`, `integer`, `boolean`, `null`;
//! - objects: `properties` written **in their declared order**, those not in `required`
//!   optional; no other keys (`additionalProperties` is only read when there are no
//!   `properties`: `false` gives `{}`, a schema the values of free keys);
//! - arrays: `items`, `minItems`, `maxItems`; `enum` and `const` (any JSON values);
//! - `anyOf`/`oneOf` (a union of objects too: where alternatives start alike, the mask follows
//!   each until the text tells them apart; [`Schema::forks`]);
//! - beside `type`, string lengths and number bounds ([`super::bounds`]), and a string's
//!   `pattern` or `format` (`date`, `time`, `date-time`, `uuid`, `ipv4`, `email`: as patterns,
//!   [`super::pattern`]; one of the three kinds per string).
//!
//! Annotations (`title`, `description`, `default`, `examples`, …) are ignored; every other
//! keyword (`multipleOf`, `allOf`, …) and format is refused by name rather than ignored, so an
//! answer never claims a constraint it was not held to.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::bounds::{self, Range};
use super::pattern::{self, Pattern};
use regex_automata::util::primitives::StateID;
use crate::Error;

/// Index of a node in [`Schema`]'s table.
pub type NodeId = u16;

/// Any JSON value; an object of any keys and values; an array of any values.
pub(super) const ANY: NodeId = 0;
pub(super) const ANY_OBJECT: NodeId = 1;
pub(super) const ANY_ARRAY: NodeId = 2;

/// Most properties an object may have in a row that are all optional (the automaton matches
/// keys against a 64-bit mask of candidates), and most values of an `enum`.
pub const MAX_CHOICES: usize = 64;

/// One declared property: its key as JSON writes it inside the quotes (escaped), and its value.
#[derive(Clone, Debug)]
pub(super) struct Prop {
    pub key: Vec<u8>,
    pub node: NodeId,
    pub required: bool,
}

#[derive(Clone, Debug)]
pub(super) enum Node {
    Any,
    /// Declared `props` in order, or (none declared) free keys whose values are `extra`
    /// (`None`: the object is `{}`).
    Object { props: Vec<Prop>, extra: Option<NodeId> },
    Array { items: NodeId, min: u32, max: u32 },
    /// A string of `min ..= max` characters (code points), matching [`Schema`]'s pattern
    /// `pattern` where it has one.
    String { min: u32, max: u32, pattern: Option<u16> },
    /// A number (`integer`: no fraction or exponent), within `range` where it has bounds.
    Number { integer: bool, range: Option<Range> },
    Bool,
    Null,
    /// One of these texts (`enum`/`const`, compact JSON).
    Literal(Vec<Vec<u8>>),
    /// The first alternative whose first byte fits.
    AnyOf(Vec<NodeId>),
}

/// A compiled schema: the nodes, and the roots: a value of any one of them (more than one
/// only from [`Schema::one_of`], whose alternatives a first byte need not tell apart).
#[derive(Debug)]
pub struct Schema {
    pub(super) nodes: Vec<Node>,
    pub(super) roots: Vec<NodeId>,
    /// The strings' patterns, by [`Node::String`]'s index.
    pub(super) patterns: Vec<Pattern>,
    /// Whether some `anyOf` has alternatives that start with the same byte: the mask then
    /// follows the automaton of each (`JsonState::feed_forking`).
    pub(super) forks: bool,
}

/// Most distinct patterns in one schema (each a DFA of up to a few MB).
const MAX_PATTERNS: usize = 64;

/// A string's form, beside `type`: its pattern, or a format that stands for one.
const STRING_FORMS: [&str; 2] = ["pattern", "format"];

/// Keywords that describe and do not constrain (`discriminator`, OpenAPI's and pydantic's
/// name for a `oneOf`'s telling property: the `oneOf` check finds it itself).
const ANNOTATIONS: [&str; 13] =
    ["title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "discriminator"];
/// Keywords read here, under some type.
const READ: [&str; 12] = ["type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "$ref"];

impl Schema {
    /// JSON mode: any object.
    pub fn object() -> Schema {
        Schema { nodes: base(), roots: vec![ANY_OBJECT], patterns: vec![], forks: false }
    }

    /// How many roots (alternatives) the schema has.
    pub fn alternatives(&self) -> usize {
        self.roots.len()
    }

    /// A value of any one of `alts`, which may start alike (tool calls: one object per tool,
    /// told apart only by their `name`): the mask follows every alternative the text so far
    /// still fits. Their node tables are joined, each alternative's ids moved past the others'.
    pub fn one_of(alts: Vec<Schema>) -> Result<Schema, Error> {
        let mut nodes = base();
        let mut roots = Vec::new();
        let mut patterns = Vec::new();
        let mut forks = false;
        for a in alts {
            forks |= a.forks;
            let offset = (nodes.len() - base().len()) as NodeId;
            let at = |id: NodeId| if (id as usize) < base().len() { id } else { id + offset };
            let first_pattern = patterns.len() as u16;
            nodes.extend(a.nodes[base().len()..].iter().map(|n| match n {
                Node::Object { props, extra } => Node::Object {
                    props: props.iter().map(|p| Prop { node: at(p.node), ..p.clone() }).collect(),
                    extra: extra.map(at),
                },
                &Node::Array { items, min, max } => Node::Array { items: at(items), min, max },
                Node::AnyOf(alts) => Node::AnyOf(alts.iter().map(|&x| at(x)).collect()),
                &Node::String { min, max, pattern } => Node::String { min, max, pattern: pattern.map(|p| p + first_pattern) },
                other => other.clone(),
            }));
            roots.extend(a.roots.iter().map(|&r| at(r)));
            patterns.extend(a.patterns);
            if nodes.len() > NodeId::MAX as usize {
                return Err(bad("schema", "too many nodes"));
            }
        }
        if roots.is_empty() {
            return Err(bad("schema", "no alternatives"));
        }
        if patterns.len() > MAX_PATTERNS {
            return Err(bad("schema", format!("more than {MAX_PATTERNS} patterns")));
        }
        Ok(Schema { nodes, roots, patterns, forks })
    }

    /// Compile a JSON Schema. Its root must be an object or an array (the answer opens with
    /// `{` or `[`, so the end of the answer is known).
    pub fn compile(schema: &Value) -> Result<Schema, Error> {
        let mut c = Compiler { doc: schema, nodes: base(), refs: HashMap::new(), depth: 0, patterns: vec![], pattern_ids: HashMap::new(), forks: false };
        let root = c.node(schema, "schema")?;
        let s = Schema { nodes: c.nodes, roots: vec![root], patterns: c.patterns, forks: c.forks };
        let first = first_bytes(&s.nodes, root, 0);
        if first.iter().enumerate().any(|(b, &on)| on && b != b'{' as usize && b != b'[' as usize) {
            return Err(bad("schema", "the root must be an object or an array"));
        }
        if s.nodes.len() > NodeId::MAX as usize {
            return Err(bad("schema", "too many nodes"));
        }
        if s.has_alias_cycle() {
            return Err(bad("schema", "a $ref or anyOf refers back to itself before any value begins"));
        }
        if !first.contains(&true) {
            return Err(bad("schema", "no value matches it"));
        }
        Ok(s)
    }

    /// Whether pattern `p` in state `at` takes `text` (decoded bytes) with a match still ahead.
    pub(super) fn pattern_takes(&self, p: u16, at: StateID, text: &[u8]) -> bool {
        let p = &self.patterns[p as usize];
        text.iter().try_fold(at, |s, &b| p.step(s, b)).is_some()
    }

    /// Does some chain of `anyOf` alternatives and `$ref`s lead back to where it started
    /// without a value beginning (`{"$ref": "#"}` at the root)? The automaton would follow it
    /// for ever.
    fn has_alias_cycle(&self) -> bool {
        // 0 unseen, 1 on the current path, 2 done.
        let mut mark = vec![0u8; self.nodes.len()];
        fn visit(s: &Schema, n: usize, mark: &mut [u8]) -> bool {
            match mark[n] {
                1 => return true,
                2 => return false,
                _ => {}
            }
            mark[n] = 1;
            let cycle = match &s.nodes[n] {
                Node::AnyOf(alts) => alts.iter().any(|&a| visit(s, a as usize, mark)),
                _ => false,
            };
            mark[n] = 2;
            cycle
        }
        (0..self.nodes.len()).any(|n| visit(self, n, &mut mark))
    }
}

/// Which bytes can start a value of `node` (`depth`: `anyOf`s followed so far, a guard while a
/// recursive reference is still a placeholder).
fn first_bytes(nodes: &[Node], node: NodeId, depth: u32) -> [bool; 256] {
    let mut f = [false; 256];
    let mut on = |bytes: &[u8]| bytes.iter().for_each(|&b| f[b as usize] = true);
    match &nodes[node as usize] {
        Node::Any => on(b"{[\"-0123456789tfn"),
        Node::Object { .. } => on(b"{"),
        Node::Array { .. } => on(b"["),
        Node::String { .. } => on(b"\""),
        Node::Number { .. } => on(b"-0123456789"),
        Node::Bool => on(b"tf"),
        Node::Null => on(b"n"),
        Node::Literal(texts) => texts.iter().for_each(|t| on(&t[..1])),
        Node::AnyOf(alts) if depth < 64 => {
            for &a in alts {
                let g = first_bytes(nodes, a, depth + 1);
                f.iter_mut().zip(g).for_each(|(x, y)| *x |= y);
            }
        }
        Node::AnyOf(_) => {}
    }
    f
}

/// The three nodes every table starts with.
fn base() -> Vec<Node> {
    vec![Node::Any, Node::Object { props: vec![], extra: Some(ANY) }, Node::Array { items: ANY, min: 0, max: u32::MAX }]
}

fn bad(path: &str, what: impl std::fmt::Display) -> Error {
    Error::Schema(format!("{path}: {what}"))
}

struct Compiler<'a> {
    doc: &'a Value,
    nodes: Vec<Node>,
    refs: HashMap<String, NodeId>,
    depth: u32,
    patterns: Vec<Pattern>,
    /// Each distinct pattern text's index in `patterns`.
    pattern_ids: HashMap<String, u16>,
    /// Some `anyOf`'s alternatives start alike ([`Schema::forks`]).
    forks: bool,
}

impl<'a> Compiler<'a> {
    fn push(&mut self, n: Node) -> NodeId {
        self.nodes.push(n);
        (self.nodes.len() - 1).min(NodeId::MAX as usize) as NodeId
    }

    fn node(&mut self, v: &'a Value, path: &str) -> Result<NodeId, Error> {
        self.depth += 1;
        if self.depth > 128 {
            return Err(bad(path, "nested too deep"));
        }
        let r = self.node_inner(v, path);
        self.depth -= 1;
        r
    }

    fn node_inner(&mut self, v: &'a Value, path: &str) -> Result<NodeId, Error> {
        let m = match v {
            Value::Bool(true) => return Ok(ANY),
            Value::Object(m) => m,
            _ => return Err(bad(path, "a schema must be an object (or true)")),
        };
        if let Some(k) = m.keys().find(|k| !ANNOTATIONS.contains(&k.as_str()) && !READ.contains(&k.as_str()) && !bounds::KEYWORDS.contains(&k.as_str()) && !STRING_FORMS.contains(&k.as_str())) {
            return Err(bad(path, format!("the keyword {k:?} is not supported")));
        }
        // Bounds and patterns apply to the types they name; beside anything but `type` they
        // would be lost.
        let bounded = bounds::KEYWORDS.iter().chain(&STRING_FORMS).find(|k| m.contains_key(**k));
        let lone = ["$ref", "const", "enum", "anyOf", "oneOf"].into_iter().find(|k| m.contains_key(*k)).or(m.get("type").is_none().then_some("no type"));
        if let (Some(b), Some(l)) = (bounded, lone) {
            return Err(bad(path, format!("{b:?} is supported beside \"type\" only, not with {l}")));
        }
        if let Some(r) = m.get("$ref") {
            return self.reference(r, path);
        }
        if let Some(c) = m.get("const") {
            return Ok(self.push(Node::Literal(vec![serde_json::to_vec(c).unwrap_or_default()])));
        }
        if let Some(e) = m.get("enum") {
            let vals = e.as_array().filter(|a| !a.is_empty() && a.len() <= MAX_CHOICES).ok_or_else(|| bad(path, format!("enum must list 1 to {MAX_CHOICES} values")))?;
            return Ok(self.push(Node::Literal(vals.iter().map(|v| serde_json::to_vec(v).unwrap_or_default()).collect())));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = m.get(key) {
                let alts = alts.as_array().filter(|a| !a.is_empty()).ok_or_else(|| bad(path, format!("{key} must list schemas")))?;
                let ids = alts.iter().enumerate().map(|(i, a)| self.node(a, &format!("{path}.{key}[{i}]"))).collect::<Result<Vec<_>, _>>()?;
                // `oneOf`: no value may fit two alternatives, which `anyOf`'s automaton would
                // allow where they start alike and are not told apart by a discriminator.
                if key == "oneOf" && self.clash(&ids) && !self.discriminated(&ids) {
                    return Err(bad(path, "oneOf alternatives that start alike must be objects told apart by a required property of distinct constants (a discriminator); anyOf takes them as they are"));
                }
                return self.any_of(ids, &format!("{path}.{key}"));
            }
        }
        let types: Vec<&str> = match m.get("type") {
            None if m.contains_key("properties") || m.contains_key("additionalProperties") => vec!["object"],
            None if m.contains_key("items") => vec!["array"],
            None => return Ok(ANY),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().map(|t| t.as_str().ok_or_else(|| bad(path, "type must be a string or a list of them"))).collect::<Result<_, _>>()?,
            Some(_) => return Err(bad(path, "type must be a string or a list of them")),
        };
        let ids = types.iter().map(|t| self.typed(t, m, path)).collect::<Result<Vec<_>, _>>()?;
        if ids.len() == 1 {
            Ok(ids[0])
        } else {
            self.any_of(ids, &format!("{path}.type"))
        }
    }

    fn typed(&mut self, t: &str, m: &'a Map<String, Value>, path: &str) -> Result<NodeId, Error> {
        Ok(match t {
            "object" => return self.object(m, path),
            "array" => {
                let items = match m.get("items") {
                    Some(i) => self.node(i, &format!("{path}.items"))?,
                    None => ANY,
                };
                let count = |k: &str| m.get(k).map(|v| v.as_u64().filter(|&n| n <= u16::MAX as u64).ok_or_else(|| bad(path, format!("{k} must be a count up to 65535")))).transpose();
                let min = count("minItems")?.unwrap_or(0) as u32;
                let max = count("maxItems")?.map_or(u32::MAX, |n| n as u32);
                if min > max {
                    return Err(bad(path, "minItems is above maxItems"));
                }
                self.push(Node::Array { items, min, max })
            }
            "string" => {
                let (min, max) = bounds::lengths(m, path)?;
                let pattern = match (m.get("pattern"), m.get("format")) {
                    (None, None) => None,
                    _ if min > 0 || max < u32::MAX => return Err(bad(path, "minLength and maxLength beside pattern or format are not supported")),
                    (Some(_), Some(_)) => return Err(bad(path, "pattern and format together are not supported")),
                    (Some(Value::String(p)), None) => Some(self.pattern(p, path)?),
                    (None, Some(Value::String(f))) => {
                        let p = pattern::format(f).ok_or_else(|| bad(path, format!("the format {f:?} is not supported (date, time, date-time, uuid, uuid1-5, ipv4, email are)")))?;
                        Some(self.pattern(&p, path)?)
                    }
                    (Some(_), _) => return Err(bad(path, "pattern must be a string")),
                    (_, Some(_)) => return Err(bad(path, "format must be a string")),
                };
                self.push(Node::String { min, max, pattern })
            }
            "number" | "integer" => {
                let integer = t == "integer";
                let range = Range::compile(m, path)?;
                if range.is_some_and(|r| !r.satisfiable(integer)) {
                    return Err(bad(path, format!("no {t} of at most {} digits lies within its bounds", bounds::DIGITS)));
                }
                self.push(Node::Number { integer, range })
            }
            "boolean" => self.push(Node::Bool),
            "null" => self.push(Node::Null),
            _ => return Err(bad(path, format!("unknown type {t:?}"))),
        })
    }

    /// The index of pattern `p`, compiled on its first use.
    fn pattern(&mut self, p: &str, path: &str) -> Result<u16, Error> {
        if let Some(&i) = self.pattern_ids.get(p) {
            return Ok(i);
        }
        if self.patterns.len() == MAX_PATTERNS {
            return Err(bad(path, format!("more than {MAX_PATTERNS} patterns")));
        }
        self.patterns.push(Pattern::compile(p).map_err(|e| bad(path, e))?);
        let i = (self.patterns.len() - 1) as u16;
        self.pattern_ids.insert(p.to_string(), i);
        Ok(i)
    }

    fn object(&mut self, m: &'a Map<String, Value>, path: &str) -> Result<NodeId, Error> {
        let required: Vec<&str> = match m.get("required") {
            None => vec![],
            Some(Value::Array(r)) => r.iter().map(|k| k.as_str().ok_or_else(|| bad(path, "required must list property names"))).collect::<Result<_, _>>()?,
            Some(_) => return Err(bad(path, "required must list property names")),
        };
        let declared = match m.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return Err(bad(path, "properties must be an object")),
        };
        let Some(declared) = declared.filter(|p| !p.is_empty()) else {
            if let Some(k) = required.first() {
                return Err(bad(path, format!("required property {k:?} is not in properties")));
            }
            let extra = match m.get("additionalProperties") {
                None | Some(Value::Bool(true)) => Some(ANY),
                Some(Value::Bool(false)) => None,
                Some(s) => Some(self.node(s, &format!("{path}.additionalProperties"))?),
            };
            return Ok(self.push(Node::Object { props: vec![], extra }));
        };
        if let Some(k) = required.iter().find(|k| !declared.contains_key(**k)) {
            return Err(bad(path, format!("required property {k:?} is not in properties")));
        }
        let mut props = Vec::with_capacity(declared.len());
        let mut optional_run = 0;
        for (k, v) in declared {
            let node = self.node(v, &format!("{path}.properties.{k}"))?;
            let quoted = serde_json::to_vec(k).unwrap_or_default();
            let req = required.contains(&k.as_str());
            optional_run = if req { 0 } else { optional_run + 1 };
            if optional_run >= MAX_CHOICES {
                return Err(bad(path, format!("more than {} optional properties in a row", MAX_CHOICES - 1)));
            }
            props.push(Prop { key: quoted[1..quoted.len() - 1].to_vec(), node, required: req });
        }
        Ok(self.push(Node::Object { props, extra: None }))
    }

    fn any_of(&mut self, ids: Vec<NodeId>, path: &str) -> Result<NodeId, Error> {
        if ids.len() > MAX_CHOICES {
            return Err(bad(path, format!("more than {MAX_CHOICES} alternatives")));
        }
        self.forks |= self.clash(&ids);
        Ok(self.push(Node::AnyOf(ids)))
    }

    /// Whether two of the alternatives `ids` can start with the same byte (a reference still
    /// being compiled, with no first bytes yet, counts as one).
    fn clash(&self, ids: &[NodeId]) -> bool {
        let mut seen = [false; 256];
        let mut clash = false;
        for &id in ids {
            let f = first_bytes(&self.nodes, id, 0);
            clash |= (0..256).any(|b| f[b] && seen[b]) || !f.contains(&true);
            seen.iter_mut().zip(f).for_each(|(x, y)| *x |= y);
        }
        clash
    }

    /// Whether the alternatives `ids` are objects (through `$ref`s) that all require one key
    /// whose values are constants no two of them share: no value fits two.
    fn discriminated(&self, ids: &[NodeId]) -> bool {
        let resolve = |mut id: NodeId| {
            for _ in 0..64 {
                match &self.nodes[id as usize] {
                    Node::AnyOf(a) if a.len() == 1 => id = a[0],
                    _ => break,
                }
            }
            &self.nodes[id as usize]
        };
        let props: Vec<&[Prop]> = ids.iter().filter_map(|&id| if let Node::Object { props, .. } = resolve(id) { Some(&props[..]) } else { None }).collect();
        if props.len() != ids.len() {
            return false;
        }
        props[0].iter().filter(|p| p.required).any(|k| {
            let mut texts: Vec<&Vec<u8>> = Vec::new();
            props.iter().all(|ps| match ps.iter().find(|p| p.required && p.key == k.key).map(|p| resolve(p.node)) {
                Some(Node::Literal(t)) => t.iter().all(|t| !texts.contains(&t) && {
                    texts.push(t);
                    true
                }),
                _ => false,
            })
        })
    }

    fn reference(&mut self, r: &'a Value, path: &str) -> Result<NodeId, Error> {
        let r = r.as_str().ok_or_else(|| bad(path, "$ref must be a string"))?;
        if let Some(&id) = self.refs.get(r) {
            return Ok(id);
        }
        let target = if r == "#" {
            Some(self.doc)
        } else {
            r.strip_prefix("#/$defs/").map(|n| ("$defs", n)).or_else(|| r.strip_prefix("#/definitions/").map(|n| ("definitions", n))).and_then(|(d, n)| self.doc.get(d)?.get(n))
        };
        let target = target.ok_or_else(|| bad(path, format!("$ref {r:?} is not #, #/$defs/NAME or #/definitions/NAME of this schema")))?;
        // Reserved first, so a reference back to it (a recursive schema) finds it.
        let id = self.push(Node::AnyOf(vec![]));
        self.refs.insert(r.to_string(), id);
        let t = self.node(target, r)?;
        self.nodes[id as usize] = Node::AnyOf(vec![t]);
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
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

    /// Patterns: anchored, with an escape in its text, a `\b`, and in an array's items.
    fn patterned() -> Value {
        json!({
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"},
                "note": {"type": ["string", "null"], "pattern": "^(yes|no)\\b"},
                "tags": {"type": "array", "items": {"type": "string", "pattern": "^#[a-z]+$"}, "maxItems": 3},
                "line": {"type": "string", "pattern": "^a\\n\"$"},
                "day": {"type": "string", "format": "date"}
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
    fn unsupported_schemas_are_refused_by_name() {
        for (schema, says) in [
            (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}), "look-around"),
            (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": 5}}}), "pattern must be a string"),
            (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "x", "maxLength": 3}}}), "beside pattern"),
            (json!({"type": "object", "properties": {"a": {"enum": ["x"], "pattern": "x"}}}), "\"pattern\" is supported beside \"type\" only"),
            (json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "^\\x01$"}}}), "no JSON string matches"),
            (json!({"type": "object", "properties": {"d": {"type": "string", "format": "uri"}}}), "the format \"uri\""),
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
        let types: Vec<&str> = match &s["type"] {
            Value::String(t) => vec![t],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return true,
        };
        types.iter().any(|t| match (*t, v) {
            ("object", Value::Object(m)) => {
                let props = s["properties"].as_object().cloned().unwrap_or_default();
                let req = s["required"].as_array().cloned().unwrap_or_default();
                req.iter().all(|k| m.contains_key(k.as_str().unwrap())) && m.iter().all(|(k, x)| props.get(k).is_some_and(|p| valid(p, x, root)))
            }
            ("array", Value::Array(a)) => {
                let n = a.len() as u64;
                n >= s["minItems"].as_u64().unwrap_or(0) && n <= s["maxItems"].as_u64().unwrap_or(u64::MAX) && a.iter().all(|x| valid(&s["items"], x, root))
            }
            ("string", Value::String(t)) => {
                let n = t.chars().count() as u64;
                let pattern = s["pattern"].as_str().is_none_or(|p| regex::Regex::new(p).unwrap().is_match(t)) && (s["format"] != "date" || is_date(t));
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
        b("minimum").is_none_or(|m| x >= m) && b("maximum").is_none_or(|m| x <= m) && b("exclusiveMinimum").is_none_or(|m| x > m) && b("exclusiveMaximum").is_none_or(|m| x < m)
    }

    proptest! {
        /// Soundness and completability under a schema: a random walk (bytes the automaton
        /// refuses skipped), closed greedily a byte at a time, parses as a value the schema
        /// admits.
        #[test]
        fn random_walks_complete_and_validate(which in 0..5usize, bytes in prop::collection::vec(prop::sample::select(b"{}[]:,\" \n0123456789-.eEtrufalsnabcdegimopqrstvwxyz7\xC3\xA9AB#\\".to_vec()), 0..300)) {
            let sv = [person, tree, bounded, patterned, union][which]();
            let s = Schema::compile(&sv).unwrap();
            let order: Vec<u8> = b"\"}]:,0".iter().copied().chain(0..=255).collect();
            let text = super::super::walk_and_close(&s, &bytes, &order).map_err(TestCaseError::fail)?;
            let v: Value = serde_json::from_slice(&text).map_err(|e| TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(&text))))?;
            prop_assert!(valid(&sv, &v, &sv), "{} is not valid", String::from_utf8_lossy(&text));
        }
    }
}
