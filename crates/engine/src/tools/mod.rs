//! Tool calling (OpenAI's `tools` and `tool_choice`): how the tools and earlier calls reach
//! the prompt, how an answer that must call a tool is held to a call, and how calls are read
//! back out of the answer's text.
//!
//! Two formats ([`Format`]):
//! - `Hermes`: the model's chat template renders `tools` itself and writes each call as
//!   `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (Qwen2.5, Qwen3, Hermes); earlier
//!   calls and results go to the template as messages with `tool_calls` and role `tool`.
//! - `Json`, every other template: the tools are described in the system message, a call is
//!   an answer that is one JSON object `{"name": …, "arguments": {…}}` (or a list of them),
//!   and earlier calls and results become plain assistant and user turns.
//!
//! A forced call (`tool_choice` `required` or a named function) is held to
//! [`call_schema`]: one alternative per allowed tool, `{"name": <its name>, "arguments": <its
//! parameters>}`, through the JSON mask (Hermes: after `<tool_call>\n` ends the prompt). An
//! `auto` answer is free but for its calls, each held to the same schema from where it starts
//! (a lazy constraint, [`crate::constraint::lazy`]); it is read by [`parse`] when it ends.

mod stream;

pub use stream::{CallDelta, CallReader};

use serde_json::{json, Map, Value};

use std::sync::Arc;

use crate::chat::{ChatTemplate, Message};
use crate::constraint::{Constraint, Lazy, Trigger};
use crate::json::Schema;
use crate::Error;

/// A function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments (an object).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// No calls: the tools are left out of the prompt.
    None,
    /// The model chooses: free text, read for calls when it ends.
    Auto,
    /// A call of some tool, held to the tools' schemas.
    Required,
    /// A call of this tool.
    Named(String),
}

/// One call read from an answer: the tool and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// How a chat template takes tools (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Hermes,
    Json,
}

/// What [`parse`] reads: an answer free to call tools in its format, or (`Bare`) the text a
/// forced call produced (the JSON of one call; Hermes' tags were in the prompt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Free(Format),
    Bare,
}

impl Tool {
    /// A tool from OpenAI's `{"type": "function", "function": {"name", "description",
    /// "parameters"}}`, checked: a name of 1–64 letters, digits, `_` or `-`, parameters an
    /// object schema (none: no arguments). `what` names it in errors.
    pub fn from_openai(v: &Value, what: &str) -> Result<Tool, Error> {
        let bad = |m: String| Error::Schema(format!("{what}: {m}"));
        if v.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("only tools of type \"function\" are supported".into()));
        }
        let f = v.get("function").and_then(Value::as_object).ok_or_else(|| bad("needs a \"function\" object".into()))?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return Err(bad(format!("function.name must be 1 to 64 letters, digits, _ or -, got {name:?}")));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad("function.parameters must be a JSON Schema object".into())),
        };
        Ok(Tool { name: name.to_string(), description: f.get("description").and_then(Value::as_str).map(String::from), parameters })
    }

    /// OpenAI's form, as templates read `tools` (keys in the order of OpenAI's documents).
    pub fn to_openai(&self) -> Value {
        let mut f = Map::new();
        f.insert("name".into(), json!(self.name));
        if let Some(d) = &self.description {
            f.insert("description".into(), json!(d));
        }
        f.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": f})
    }
}

/// The schema of one call of `tool`: its parameters (loosened: `crate::json::loosen`) with
/// their `$defs`/`definitions` lifted to the top, so their references still resolve.
fn call_json(tool: &Tool) -> Result<Value, Error> {
    let mut args = crate::json::loosen::loosen(&tool.parameters);
    let mut top = Map::new();
    if let Some(o) = args.as_object_mut() {
        for key in ["$defs", "definitions"] {
            if let Some(d) = o.remove(key) {
                top.insert(key.to_string(), d);
            }
        }
    }
    if args.to_string().contains("\"$ref\":\"#\"") {
        return Err(Error::Schema(format!("tool {:?}: a $ref to the parameters' root (\"#\") is not supported", tool.name)));
    }
    top.insert("type".into(), json!("object"));
    top.insert("properties".into(), json!({"name": {"const": tool.name}, "arguments": args}));
    top.insert("required".into(), json!(["name", "arguments"]));
    Ok(Value::Object(top))
}

/// What a forced call is held to: for `Required` one alternative per tool, for `Named` that
/// tool's; `None` for `Auto` and `None`.
pub fn call_schema(tools: &[Tool], choice: &Choice) -> Result<Option<Schema>, Error> {
    let chosen: Vec<&Tool> = match choice {
        Choice::None | Choice::Auto => return Ok(None),
        Choice::Required => tools.iter().collect(),
        Choice::Named(n) => tools.iter().filter(|t| &t.name == n).collect(),
    };
    if chosen.is_empty() {
        return Err(Error::Schema(match choice {
            Choice::Named(n) => format!("tool_choice names {n:?}, which is not among the tools"),
            _ => "tool_choice \"required\" needs at least one tool".into(),
        }));
    }
    let alts = chosen
        .iter()
        .map(|t| Schema::compile(&call_json(t)?).map_err(|e| Error::Schema(format!("tool {:?}: {}", t.name, e.to_string().trim_start_matches("invalid JSON Schema: ")))))
        .collect::<Result<Vec<_>, _>>()?;
    Schema::one_of(alts).map(Some)
}

/// The system text that describes `tools` to a template of the `Json` format.
pub fn system_text(tools: &[Tool]) -> String {
    let mut s = String::from("You can call these tools (each with a JSON Schema of its arguments):\n");
    for t in tools {
        s.push_str(&t.to_openai()["function"].to_string());
        s.push('\n');
    }
    s.push_str("To call a tool, answer with only a JSON object: {\"name\": <the tool's name>, \"arguments\": <its arguments>}. Otherwise answer normally.");
    s
}

/// The messages as a template of `format` takes them, with `tools` offered (empty: none).
/// `Hermes` passes them as they are (the template renders `tools`, `tool_calls` and role
/// `tool`); `Json` describes the tools in the system message (joined to one given) and turns
/// earlier calls into the assistant's JSON and results into user turns.
pub fn for_template(messages: &[Message], tools: &[Tool], format: Format) -> Vec<Message> {
    if format == Format::Hermes {
        return messages.to_vec();
    }
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages;
    if !tools.is_empty() {
        let text = system_text(tools);
        match messages.first() {
            Some(m) if m.role == "system" => {
                out.push(Message::new("system", &format!("{}\n\n{text}", m.content)));
                rest = &messages[1..];
            }
            _ => out.push(Message::new("system", &text)),
        }
    }
    for m in rest {
        match (m.role.as_str(), &m.tool_calls) {
            ("assistant", Some(calls)) if !calls.is_empty() => {
                let mut text = m.content.clone();
                for c in calls {
                    let f = &c["function"];
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&json!({"name": f["name"], "arguments": f["arguments"]}).to_string());
                }
                out.push(Message::new("assistant", &text));
            }
            ("tool", _) => {
                let name = m.tool_call_id.as_deref().and_then(|id| call_name(messages, id));
                let head = name.map_or("Tool result".to_string(), |n| format!("Result of {n}"));
                out.push(Message::new("user", &format!("{head}: {}", m.content)));
            }
            _ => out.push(m.clone()),
        }
    }
    out
}

/// Where a call starts in a free Hermes answer (full patterns, the held text from the group):
/// the JSON after `<tool_call>`; a call's JSON in a code fence (as Qwen2.5-Coder writes them)
/// or opening the answer, once it reads `{"name":`.
const HERMES_TRIGGERS: [&str; 3] = [r"[\s\S]*?<tool_call>\s*(\{)[\s\S]*", r#"[\s\S]*?```(?:json)?\s*(\{\s*"name"\s*:)[\s\S]*"#, r#"\s*(\{\s*"name"\s*:)[\s\S]*"#];

/// Where a call starts in a free `Json`-format answer: the answer opens with `{"name":`, in a
/// code fence or not.
const JSON_TRIGGER: &str = r#"\s*(?:```(?:json)?\s*)?(\{\s*"name"\s*:)[\s\S]*"#;

/// The prompt for `messages` with `tools` offered under `choice`, how to read the answer, and
/// what the answer is held to ([`Constraint`]):
/// - a forced call: the call's schema. A Hermes template's forced call starts after
///   `<tool_call>\n`, which ends the prompt.
/// - `auto`, Hermes: free text, each call's JSON held to the tools' schemas from where it
///   starts ([`HERMES_TRIGGERS`]), free again once it closes — or, without `parallel` calls,
///   the answer ending there.
/// - `auto`, `Json`: free text, or — where the answer opens with a call ([`JSON_TRIGGER`]) — a
///   call held to the tools' schemas, the answer ending when it closes.
///
/// `kwargs`: more variables for the template (`ChatTemplate::render_with`).
pub fn prompt(template: &ChatTemplate, messages: &[Message], tools: &[Tool], choice: &Choice, parallel: bool, kwargs: &serde_json::Map<String, Value>) -> Result<(String, Answer, Option<Constraint>), Error> {
    let format = template.tool_format();
    let msgs = for_template(messages, tools, format);
    let offered: Vec<Value> = if format == Format::Hermes { tools.iter().map(Tool::to_openai).collect() } else { vec![] };
    let mut text = template.render_with(&msgs, &offered, true, kwargs)?;
    let forced = call_schema(tools, choice)?.map(Arc::new);
    let (answer, held) = match (forced, format) {
        (Some(s), Format::Hermes) => {
            text.push_str(OPEN);
            text.push('\n');
            (Answer::Bare, Some(Constraint::Json(s)))
        }
        (Some(s), Format::Json) => (Answer::Bare, Some(Constraint::Json(s))),
        (None, f) => {
            let any = match tools {
                [] => None,
                _ => call_schema(tools, &Choice::Required)?.map(|s| Constraint::Json(Arc::new(s))),
            };
            let lazy = match (any, f) {
                (None, _) => None,
                (Some(then), Format::Hermes) => Some(Lazy::new(HERMES_TRIGGERS.iter().map(|t| Trigger::full(t)).collect::<Result<_, _>>()?, then, parallel)?),
                (Some(then), Format::Json) => Some(Lazy::new(vec![Trigger::full(JSON_TRIGGER)?], then, false)?),
            };
            (Answer::Free(f), lazy.map(|l| Constraint::Lazy(Arc::new(l))))
        }
    };
    Ok((text, answer, held))
}

/// The function name of the earlier call `id`.
fn call_name<'a>(messages: &'a [Message], id: &str) -> Option<&'a str> {
    messages.iter().filter_map(|m| m.tool_calls.as_ref()).flatten().find(|c| c["id"] == id).and_then(|c| c["function"]["name"].as_str())
}

/// One call from a JSON value `{"name": <a tool of `tools`>, "arguments": {…}}`.
fn call_of(v: &Value, tools: &[Tool]) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?;
    let args = v.get("arguments").filter(|a| a.is_object())?;
    tools.iter().any(|t| t.name == name).then(|| ToolCall { name: name.to_string(), arguments: args.to_string() })
}

/// The calls in a finished answer, and the text that remains (`None` where nothing does;
/// trimmed around calls; without calls the answer as it is, which a stream sent unchanged).
/// Text that looks like a call but does not parse as one of a tool of `tools` stays text.
/// Besides Hermes' tags, a call (or a list of them) may be the whole answer or sit in a code
/// fence (```` ```json ````), whose closing fence may be missing (the held call closed the
/// answer).
pub fn parse(text: &str, answer: Answer, tools: &[Tool]) -> (Option<String>, Vec<ToolCall>) {
    let whole = |t: &str| -> Option<Vec<ToolCall>> {
        match serde_json::from_str::<Value>(t.trim()).ok()? {
            Value::Array(a) if !a.is_empty() => a.iter().map(|v| call_of(v, tools)).collect(),
            v => call_of(&v, tools).map(|c| vec![c]),
        }
    };
    let rest = |t: &str| Some(t.trim().to_string()).filter(|t| !t.is_empty());
    // No tags: the whole answer is the calls, or its code fences that hold calls are.
    let untagged = |t: &str| -> (Option<String>, Vec<ToolCall>) {
        if let Some(calls) = whole(t) {
            return (None, calls);
        }
        match blocks(t, FENCE, "json", FENCE, &whole) {
            (_, calls) if calls.is_empty() => (Some(t.to_string()).filter(|t| !t.trim().is_empty()), vec![]),
            (kept, calls) => (rest(&kept), calls),
        }
    };
    match answer {
        Answer::Bare | Answer::Free(Format::Json) => untagged(text),
        Answer::Free(Format::Hermes) => match blocks(text, OPEN, "", CLOSE, &|b| whole(b).filter(|c| c.len() == 1)) {
            // Small models often write the call's JSON without the tags.
            (_, calls) if calls.is_empty() => untagged(text),
            (kept, calls) => (rest(&kept), calls),
        },
    }
}

/// The calls in the blocks of `t` that open with `open` (`label` may follow it) and close with
/// `close` — the last one may run to the text's end (an answer that ended right after a held
/// call) — each block whose body `calls_in` reads as calls; and the text without those blocks.
fn blocks(t: &str, open: &str, label: &str, close: &str, calls_in: &dyn Fn(&str) -> Option<Vec<ToolCall>>) -> (String, Vec<ToolCall>) {
    let (mut kept, mut calls, mut at) = (String::new(), Vec::new(), 0);
    while let Some(start) = t[at..].find(open).map(|i| at + i) {
        let body = start + open.len() + if t[start + open.len()..].starts_with(label) { label.len() } else { 0 };
        let end = t[body..].find(close).map_or(t.len(), |i| body + i);
        let after = (end + close.len()).min(t.len());
        match calls_in(&t[body..end]) {
            Some(mut c) => {
                kept.push_str(&t[at..start]);
                calls.append(&mut c);
            }
            None => kept.push_str(&t[at..after]),
        }
        at = after;
    }
    kept.push_str(&t[at..]);
    (kept, calls)
}

/// Hermes' tags around a call.
pub const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// A code fence, which may hold a call.
const FENCE: &str = "```";

/// How many leading bytes of an answer still being written in `format` are surely text, not
/// part of a call (a stream sends those and holds the rest until the answer ends): nothing if
/// the answer opens with `{`, `[` or a code fence (a call's JSON, which Hermes models also
/// write without tags); else `Json` all, Hermes up to its first `<tool_call>` or code fence
/// (or the partial beginning of one at the end).
pub fn plain_prefix(text: &str, format: Format) -> usize {
    let t = text.trim_start().as_bytes();
    if t.is_empty() || t[0] == b'{' || t[0] == b'[' || FENCE.as_bytes().starts_with(&t[..t.len().min(FENCE.len())]) {
        return 0;
    }
    match format {
        Format::Json => text.len(),
        Format::Hermes => {
            if let Some(i) = [OPEN, FENCE].iter().filter_map(|m| text.find(m)).min() {
                return i;
            }
            // A tail that could be a tag's or fence's beginning.
            let starts = |n: usize| [OPEN, FENCE].iter().any(|m| m.len() > n && m.starts_with(&text[text.len() - n..]));
            let tail = (1..OPEN.len()).rev().find(|&n| text.len() >= n && text.is_char_boundary(text.len() - n) && starts(n));
            text.len() - tail.unwrap_or(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool::from_openai(
            &json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}),
            "tools[0]",
        )
        .unwrap()
    }

    fn time() -> Tool {
        Tool::from_openai(&json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"$ref": "#/$defs/Zone"}}, "required": ["zone"], "$defs": {"Zone": {"type": "string", "maxLength": 8}}}}}), "t").unwrap()
    }

    #[test]
    fn tools_are_checked() {
        assert_eq!(weather().name, "get_weather");
        assert_eq!(Tool::from_openai(&json!({"type": "function", "function": {"name": "f"}}), "t").unwrap().parameters["type"], "object");
        for (v, says) in [
            (json!({"type": "retrieval"}), "type \"function\""),
            (json!({"type": "function"}), "\"function\" object"),
            (json!({"type": "function", "function": {"name": "a b"}}), "function.name"),
            (json!({"type": "function", "function": {"name": "f", "parameters": 3}}), "parameters"),
        ] {
            let e = Tool::from_openai(&v, "tools[1]").unwrap_err().to_string();
            assert!(e.contains("tools[1]") && e.contains(says), "{e}");
        }
    }

    /// A forced call is held to one of the tools' call schemas: the name chooses the
    /// arguments' schema, a `$defs` reference in them resolves.
    #[test]
    fn forced_calls_are_held_to_the_tools() {
        let tools = [weather(), time()];
        let s = call_schema(&tools, &Choice::Required).unwrap().unwrap();
        let ok = |t: &str| {
            let mut m = crate::json::JsonState::at_root(&s, 0);
            let mut n = crate::json::JsonState::at_root(&s, 1);
            let (a, b) = (m.feed_all(&s, t.as_bytes()), n.feed_all(&s, t.as_bytes()));
            (a && m.is_complete()) || (b && n.is_complete())
        };
        assert!(ok(r#"{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}"#));
        assert!(ok(r#"{"name": "get_time", "arguments": {"zone": "UTC"}}"#));
        assert!(!ok(r#"{"name": "get_time", "arguments": {"city": "Oslo"}}"#), "the other tool's arguments");
        assert!(!ok(r#"{"name": "get_time", "arguments": {"zone": "Europe/Oslo"}}"#), "maxLength through $defs");
        assert!(!ok(r#"{"name": "get_news", "arguments": {}}"#));
        let named = call_schema(&tools, &Choice::Named("get_time".into())).unwrap().unwrap();
        assert_eq!(named.alternatives(), 1);
        assert!(call_schema(&tools, &Choice::Auto).unwrap().is_none());
        assert!(call_schema(&tools, &Choice::Named("x".into())).unwrap_err().to_string().contains("not among the tools"));
        assert!(call_schema(&[], &Choice::Required).is_err());
    }

    #[test]
    fn calls_are_read_back() {
        let tools = [weather(), time()];
        let call = |n: &str, a: &str| ToolCall { name: n.into(), arguments: a.into() };
        let hermes = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
        assert_eq!(
            parse(hermes, Answer::Free(Format::Hermes), &tools),
            (Some("Let me check.".into()), vec![call("get_weather", r#"{"city":"Oslo"}"#), call("get_time", r#"{"zone":"CET"}"#)])
        );
        // An unknown tool, or a call cut off, stays text.
        let odd = "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call> and <tool_call>{\"name\": \"get_time\"";
        assert_eq!(parse(odd, Answer::Free(Format::Hermes), &tools), (Some(odd.into()), vec![]));
        assert_eq!(parse("{\"name\": \"get_time\", \"arguments\": {}}", Answer::Free(Format::Hermes), &tools), (None, vec![call("get_time", "{}")]));
        assert_eq!(parse(" {\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n", Answer::Bare, &tools), (None, vec![call("get_time", r#"{"zone":"UTC"}"#)]));
        assert_eq!(parse("[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {}}]", Answer::Free(Format::Json), &tools).1.len(), 2);
        assert_eq!(parse(" It is sunny.\n", Answer::Free(Format::Json), &tools), (Some(" It is sunny.\n".into()), vec![]));
        assert_eq!(parse(" \n", Answer::Free(Format::Hermes), &tools), (None, vec![]));
        // Calls in a code fence, closed or not, alone or after text.
        let fenced = "```json\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n```";
        for format in [Format::Hermes, Format::Json] {
            assert_eq!(parse(fenced, Answer::Free(format), &tools), (None, vec![call("get_time", r#"{"zone":"CET"}"#)]));
            assert_eq!(parse(&fenced[..fenced.len() - 4], Answer::Free(format), &tools), (None, vec![call("get_time", r#"{"zone":"CET"}"#)]));
            let around = format!("Sure:\n{fenced}\nDone.");
            assert_eq!(parse(&around, Answer::Free(format), &tools), (Some("Sure:\n\nDone.".into()), vec![call("get_time", r#"{"zone":"CET"}"#)]));
        }
        let code = "```json\n{\"a\": 1}\n```";
        assert_eq!(parse(code, Answer::Free(Format::Hermes), &tools), (Some(code.into()), vec![]));
        // Several fences: those holding calls are calls, the others stay text.
        let two = format!("{code}\nA:\n{fenced}\nB:\n{}", fenced.replace("CET", "UTC"));
        let (text, calls) = parse(&two, Answer::Free(Format::Hermes), &tools);
        assert_eq!(text.as_deref(), Some(format!("{code}\nA:\n\nB:").as_str()));
        assert_eq!(calls, vec![call("get_time", r#"{"zone":"CET"}"#), call("get_time", r#"{"zone":"UTC"}"#)]);
        // A last call ended before its closing tag.
        let open_end = "Sure.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}";
        assert_eq!(parse(open_end, Answer::Free(Format::Hermes), &tools), (Some("Sure.".into()), vec![call("get_time", r#"{"zone":"CET"}"#)]));
        assert_eq!(parse("{\"a\": 1}", Answer::Free(Format::Json), &tools), (Some("{\"a\": 1}".into()), vec![]));
    }

    #[test]
    fn streams_hold_back_what_may_be_a_call() {
        assert_eq!(plain_prefix("Hello", Format::Hermes), 5);
        assert_eq!(plain_prefix(" {\"name\"", Format::Hermes), 0);
        assert_eq!(plain_prefix("Hello <tool", Format::Hermes), 6);
        assert_eq!(plain_prefix("Hello <tool_call>{", Format::Hermes), 6);
        assert_eq!(plain_prefix("a < b", Format::Hermes), 5);
        assert_eq!(plain_prefix("é<", Format::Hermes), "é".len());
        assert_eq!(plain_prefix("``", Format::Json), 0);
        assert_eq!(plain_prefix("Here:\n```json\n{", Format::Hermes), 6);
        assert_eq!(plain_prefix("Here:\n`", Format::Hermes), 6);
        assert_eq!(plain_prefix("Here: `x` and", Format::Hermes), 13);
        assert_eq!(plain_prefix("  {\"name\"", Format::Json), 0);
        assert_eq!(plain_prefix("Sure", Format::Json), 4);
        assert_eq!(plain_prefix("", Format::Json), 0);
    }

    /// Json-format templates get the tools in the system message and earlier calls and results
    /// as plain turns; Hermes templates the messages as they are.
    #[test]
    fn messages_for_templates() {
        let mut asked = Message::new("assistant", "");
        asked.tool_calls = Some(vec![json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}})]);
        let mut result = Message::new("tool", "12 C");
        result.tool_call_id = Some("call_1".into());
        let msgs = vec![Message::new("system", "Be brief."), Message::new("user", "Weather?"), asked, result];
        let out = for_template(&msgs, &[weather()], Format::Json);
        assert_eq!(out.len(), 4);
        assert!(out[0].content.starts_with("Be brief.\n\nYou can call these tools") && out[0].content.contains("\"get_weather\""), "{}", out[0].content);
        assert_eq!(out[2].content, r#"{"name":"get_weather","arguments":{"city":"Oslo"}}"#);
        assert_eq!((out[3].role.as_str(), out[3].content.as_str()), ("user", "Result of get_weather: 12 C"));
        assert_eq!(for_template(&msgs, &[weather()], Format::Hermes), msgs);
        let plain = for_template(&msgs[1..2], &[weather()], Format::Json);
        assert_eq!((plain[0].role.as_str(), plain.len()), ("system", 2));
        // No tools offered (tool_choice none): earlier calls and results still become turns.
        let none = for_template(&msgs, &[], Format::Json);
        assert_eq!((none[0].content.as_str(), none.len(), none[3].role.as_str()), ("Be brief.", 4, "user"));
    }
}
