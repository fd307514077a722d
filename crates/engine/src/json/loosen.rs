//! A schema with the keywords the mask cannot hold and that only narrow what it admits taken
//! out, for tools' parameters: a client's tool schemas (Claude Code's use `propertyNames`) are
//! descriptions for the model first, and an `auto` call held to a slightly wider schema is
//! what llama-server's grammars do (they skip keywords they do not know). A response format's
//! schema is never loosened: that is a promise about the answer, so its keywords are held or
//! refused by name.
//!
//! Taken out: `propertyNames`, `uniqueItems`, `not`, `if`/`then`/`else`, `contains` (and its
//! counts), `dependentRequired`, `dependentSchemas`, `unevaluatedProperties`,
//! `unevaluatedItems`; `patternProperties` too, with `additionalProperties: false` beside it
//! turned to any value (the pattern's keys were allowed). Subschemas are visited where schemas
//! sit (under `properties`, `items`, `anyOf`, `$defs` …), never a property *named* like a
//! keyword.

use serde_json::{Map, Value};

/// Keywords that only narrow what a schema admits.
const NARROWING: [&str; 13] = [
    "propertyNames", "uniqueItems", "not", "if", "then", "else", "contains", "minContains", "maxContains", "dependentRequired", "dependentSchemas",
    "unevaluatedProperties", "unevaluatedItems",
];

/// `schema` without [`NARROWING`] keywords and `patternProperties` (see the module doc).
pub fn loosen(schema: &Value) -> Value {
    let Value::Object(m) = schema else { return schema.clone() };
    let mut out = Map::with_capacity(m.len());
    for (k, v) in m {
        if NARROWING.contains(&k.as_str()) || k == "patternProperties" {
            continue;
        }
        let v = match k.as_str() {
            // Maps of subschemas.
            "properties" | "$defs" | "definitions" => match v {
                Value::Object(props) => Value::Object(props.iter().map(|(name, s)| (name.clone(), loosen(s))).collect()),
                v => v.clone(),
            },
            // Lists of subschemas.
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => match v {
                Value::Array(list) => Value::Array(list.iter().map(loosen).collect()),
                v => v.clone(),
            },
            // A subschema (or a draft-4 tuple's list of them).
            "items" | "additionalItems" | "additionalProperties" => match v {
                Value::Array(list) => Value::Array(list.iter().map(loosen).collect()),
                v => loosen(v),
            },
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    if m.contains_key("patternProperties") && out.get("additionalProperties") == Some(&Value::Bool(false)) {
        out.insert("additionalProperties".into(), Value::Bool(true));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_narrowing_keywords_go_and_only_where_schemas_sit() {
        let given = json!({
            "type": "object", "additionalProperties": false,
            "properties": {
                "not": {"type": "string", "not": {"const": ""}},
                "tags": {"type": "array", "items": {"type": "string", "propertyNames": {}}, "uniqueItems": true},
                "meta": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": {"type": "string"}},
                "either": {"anyOf": [{"type": "integer", "if": {"minimum": 0}, "then": {"maximum": 9}}, {"type": "null"}]},
                "free": {"type": "object", "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": false},
            },
            "$defs": {"d": {"type": "string", "contains": {}}},
        });
        let want = json!({
            "type": "object", "additionalProperties": false,
            "properties": {
                "not": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "meta": {"type": "object", "additionalProperties": {"type": "string"}},
                "either": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "free": {"type": "object", "additionalProperties": true},
            },
            "$defs": {"d": {"type": "string"}},
        });
        assert_eq!(loosen(&given), want);
        assert!(crate::json::Schema::compile(&loosen(&given)).is_ok());
        assert!(crate::json::Schema::compile(&given).is_err());
    }
}
