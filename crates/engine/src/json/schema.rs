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
//!   `properties`: `false` gives `{}`, a schema the values of free keys, up to
//!   `maxProperties` of them and at least a `minProperties` of 0 or 1);
//! - arrays: `items`, `minItems`, `maxItems`, a tuple's `prefixItems` (or the older
//!   `items: [...]` and `additionalItems`); `enum` and `const` (any JSON values);
//! - `anyOf`/`oneOf` (a union of objects too: where alternatives start alike, the mask follows
//!   each until the text tells them apart; [`Schema::forks`]); `allOf`, merged into one schema
//!   before compiling ([`super::all_of`]);
//! - beside `type`, string lengths and number bounds with `multipleOf` ([`super::bounds`]),
//!   and a string's `pattern` or `format` (`date`, `time`, `date-time`, `uuid`, `ipv4`,
//!   `email`, `uri`: as patterns, [`super::pattern`]; one of the three kinds per string).
//!
//! Annotations (`title`, `description`, `default`, `examples`, …) are ignored; every other
//! keyword (`not`, `if`, `patternProperties`, …) and format is refused by name rather than
//! ignored, so an answer never claims a constraint it was not held to.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::all_of;
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
    /// (`None`: the object is `{}`), `keys.0 ..= keys.1` of them (`minProperties`,
    /// `maxProperties`; 0 or 1 at least: a repeated key counts once).
    Object { props: Vec<Prop>, extra: Option<NodeId>, keys: (u16, u16) },
    /// `min ..= max` items: item `i` of `prefix` (a tuple's, `prefixItems`), the rest `items`.
    Array { items: NodeId, min: u32, max: u32, prefix: Vec<NodeId> },
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
pub(super) const ANNOTATIONS: [&str; 13] =
    ["title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "discriminator"];
/// Keywords read here, under some type.
const READ: [&str; 16] = ["type", "properties", "required", "additionalProperties", "minProperties", "maxProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "$ref"];

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
                Node::Object { props, extra, keys } => Node::Object {
                    props: props.iter().map(|p| Prop { node: at(p.node), ..p.clone() }).collect(),
                    extra: extra.map(at),
                    keys: *keys,
                },
                Node::Array { items, min, max, prefix } => Node::Array { items: at(*items), min: *min, max: *max, prefix: prefix.iter().map(|&p| at(p)).collect() },
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
        let merged = all_of::expand(schema)?;
        let schema = &*merged;
        let mut c = Compiler { doc: schema, nodes: base(), refs: HashMap::new(), depth: 0, patterns: vec![], pattern_ids: HashMap::new(), length_ids: HashMap::new(), forks: false };
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
    vec![Node::Any, Node::Object { props: vec![], extra: Some(ANY), keys: (0, u16::MAX) }, Node::Array { items: ANY, min: 0, max: u32::MAX, prefix: vec![] }]
}

fn bad(path: &str, what: impl std::fmt::Display) -> Error {
    Error::Schema(format!("{path}: {what}"))
}

/// Keyword `k` of `m` as a count of items or properties (up to 65535), if given.
fn count(m: &Map<String, Value>, k: &str, path: &str) -> Result<Option<u16>, Error> {
    m.get(k).map(|v| v.as_u64().filter(|&n| n <= u16::MAX as u64).map(|n| n as u16).ok_or_else(|| bad(path, format!("{k} must be a count up to 65535")))).transpose()
}

struct Compiler<'a> {
    doc: &'a Value,
    nodes: Vec<Node>,
    refs: HashMap<String, NodeId>,
    depth: u32,
    patterns: Vec<Pattern>,
    /// Each distinct pattern text's index in `patterns`.
    pattern_ids: HashMap<String, u16>,
    /// Each (pattern, minLength, maxLength)'s copy with lengths in `patterns`.
    length_ids: HashMap<(u16, u32, u32), u16>,
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
            None if m.contains_key("items") || m.contains_key("prefixItems") => vec!["array"],
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
                // A tuple: `prefixItems` (2020-12, pydantic's `Tuple[…]`) then `items` for the
                // rest, or the older `items: [...]` then `additionalItems`.
                let (prefix, rest_key) = match (m.get("prefixItems"), m.get("items")) {
                    (Some(p), _) => (Some(("prefixItems", p)), "items"),
                    (None, Some(p @ Value::Array(_))) => (Some(("items", p)), "additionalItems"),
                    (None, _) => (None, "items"),
                };
                let prefix = match prefix {
                    None => vec![],
                    Some((key, Value::Array(p))) if p.len() <= u16::MAX as usize => p.iter().enumerate().map(|(i, s)| self.node(s, &format!("{path}.{key}[{i}]"))).collect::<Result<Vec<_>, _>>()?,
                    Some((key, _)) => return Err(bad(path, format!("{key} must list up to 65535 schemas"))),
                };
                let min = count(m, "minItems", path)?.unwrap_or(0) as u32;
                let mut max = count(m, "maxItems", path)?.map_or(u32::MAX, |n| n as u32);
                let items = match m.get(rest_key) {
                    None | Some(Value::Bool(true)) => ANY,
                    // No items past the tuple's.
                    Some(Value::Bool(false)) => {
                        max = max.min(prefix.len() as u32);
                        ANY
                    }
                    Some(i) => self.node(i, &format!("{path}.{rest_key}"))?,
                };
                if min > max {
                    return Err(bad(path, "minItems is above maxItems (or the tuple's length, with no items past it)"));
                }
                self.push(Node::Array { items, min, max, prefix })
            }
            "string" => {
                let (min, max) = bounds::lengths(m, path)?;
                let pattern = match (m.get("pattern"), m.get("format")) {
                    (None, None) => None,
                    (Some(_), Some(_)) => return Err(bad(path, "pattern and format together are not supported")),
                    (Some(Value::String(p)), None) => Some(self.pattern(p, path)?),
                    (None, Some(Value::String(f))) => {
                        let p = pattern::format(f).ok_or_else(|| bad(path, format!("the format {f:?} is not supported (date, time, date-time, uuid, uuid1-5, ipv4, email, uri are)")))?;
                        Some(self.pattern(&p, path)?)
                    }
                    (Some(_), _) => return Err(bad(path, "pattern must be a string")),
                    (_, Some(_)) => return Err(bad(path, "format must be a string")),
                };
                // Beside a pattern, a `maxLength` is held by the pattern's shortest way to a
                // match; a `minLength` the pattern does not imply by a copy of the pattern with
                // each state's lengths of completion.
                let pattern = match pattern {
                    Some(p) if min > self.patterns[p as usize].shortest(self.patterns[p as usize].start()) => Some(self.with_lengths(p, min, max, path)?),
                    p => p,
                };
                if let Some(p) = pattern.map(|p| &self.patterns[p as usize]) {
                    if !p.fits(p.start(), 0, min, max) {
                        return Err(bad(path, format!("no string of its pattern or format has {min} to {max} characters")));
                    }
                }
                self.push(Node::String { min, max, pattern })
            }
            "number" | "integer" => {
                let integer = t == "integer";
                let range = Range::compile(m, path)?;
                if range.is_some_and(|r| !r.satisfiable(integer)) {
                    return Err(bad(path, format!("no {t} of at most {} digits meets its bounds (minimum, maximum, multipleOf)", bounds::DIGITS)));
                }
                self.push(Node::Number { integer, range })
            }
            "boolean" => self.push(Node::Bool),
            "null" => self.push(Node::Null),
            _ => return Err(bad(path, format!("unknown type {t:?}"))),
        })
    }

    /// The index of pattern `p`'s copy for strings of `min ..= max` characters (its
    /// [`Pattern::with_lengths`]), made on its first use.
    fn with_lengths(&mut self, p: u16, min: u32, max: u32, path: &str) -> Result<u16, Error> {
        if let Some(&i) = self.length_ids.get(&(p, min, max)) {
            return Ok(i);
        }
        if self.patterns.len() == MAX_PATTERNS {
            return Err(bad(path, format!("more than {MAX_PATTERNS} patterns")));
        }
        let copy = self.patterns[p as usize].with_lengths(min, max).map_err(|e| bad(path, e))?;
        self.patterns.push(copy);
        let i = (self.patterns.len() - 1) as u16;
        self.length_ids.insert((p, min, max), i);
        Ok(i)
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
        let keys = (count(m, "minProperties", path)?.unwrap_or(0), count(m, "maxProperties", path)?.unwrap_or(u16::MAX));
        let Some(declared) = declared.filter(|p| !p.is_empty()) else {
            if let Some(k) = required.first() {
                return Err(bad(path, format!("required property {k:?} is not in properties")));
            }
            let extra = match m.get("additionalProperties") {
                None | Some(Value::Bool(true)) => Some(ANY),
                Some(Value::Bool(false)) => None,
                Some(s) => Some(self.node(s, &format!("{path}.additionalProperties"))?),
            };
            if keys.0 > 1 {
                return Err(bad(path, "minProperties above 1 is not supported for free keys (a repeated key would count once)"));
            }
            if keys.0 > keys.1 || (keys.0 > 0 && extra.is_none()) {
                return Err(bad(path, "no object has as many properties as minProperties asks within maxProperties and additionalProperties"));
            }
            return Ok(self.push(Node::Object { props: vec![], extra, keys }));
        };
        if let Some(k) = required.iter().find(|k| !declared.contains_key(**k)) {
            return Err(bad(path, format!("required property {k:?} is not in properties")));
        }
        // Beside declared properties only as they imply (the required ones, all of them).
        if (keys.0 as usize) > required.len() || (keys.1 as usize) < declared.len() {
            return Err(bad(path, "minProperties and maxProperties beside properties are supported only where the required and declared properties imply them"));
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
        Ok(self.push(Node::Object { props, extra: None, keys: (0, u16::MAX) }))
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
mod tests;
