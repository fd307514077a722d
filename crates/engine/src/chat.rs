//! Chat templates: the GGUF's `tokenizer.chat_template` rendered with minijinja (Python-jinja
//! compatible: trim_blocks, lstrip_blocks, pycompat methods, `raise_exception`, llama.cpp's
//! `strftime_now`), or — when the file has none — a built-in template for the family, as
//! llama.cpp does (Gemma's format folds the system text into the first user turn; otherwise
//! ChatML).

use crate::Error;
use corelm_gguf::Gguf;
use minijinja::{context, Environment};
use serde::Serialize;

/// One turn. `tool_calls` (an assistant's calls, OpenAI's form with `arguments` an object, as
/// templates read them) and `tool_call_id` (a `tool` turn's call) only with tools
/// (`crate::tools`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning apart from its content (`crate::reasoning`), for
    /// templates that render it (Qwen3's keeps the last turns').
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.to_string(), content: content.to_string(), tool_calls: None, tool_call_id: None, reasoning_content: None }
    }
}

enum Kind {
    Jinja(Box<Environment<'static>>),
    Gemma,
    ChatMl,
}

pub struct ChatTemplate {
    kind: Kind,
    /// The template renders `tools` and writes calls in `<tool_call>` tags.
    hermes: bool,
    /// The template writes reasoning blocks (`<think>`: `crate::reasoning`).
    thinking: bool,
    bos: String,
    eos: String,
}

/// The BOS and EOS tokens' text, as templates read `bos_token` and `eos_token`.
fn special_texts(tok: &crate::Tokenizer) -> (String, String) {
    let text = |t: Option<u32>| t.map(|b| tok.text(b).to_string()).unwrap_or_default();
    (text(tok.bos), text(tok.eos))
}

fn render_err(e: minijinja::Error) -> Error {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    Error::Template(msg)
}

impl ChatTemplate {
    pub fn from_gguf(g: &Gguf, tok: &crate::Tokenizer) -> Result<ChatTemplate, Error> {
        let (bos, eos) = special_texts(tok);
        match g.opt_str("tokenizer.chat_template")? {
            Some(src) => Self::from_jinja(src, &bos, &eos),
            None if g.str("general.architecture")?.starts_with("gemma") => Ok(Self::builtin(Kind::Gemma, bos, eos)),
            None => Ok(Self::builtin(Kind::ChatMl, bos, eos)),
        }
    }

    fn builtin(kind: Kind, bos: String, eos: String) -> ChatTemplate {
        ChatTemplate { kind, hermes: false, thinking: false, bos, eos }
    }

    /// A template from jinja source (for tests and user-supplied templates).
    pub fn from_jinja(src: &str, bos: &str, eos: &str) -> Result<ChatTemplate, Error> {
        let hermes = src.contains("tools") && src.contains(crate::tools::OPEN);
        let thinking = src.contains(crate::reasoning::OPEN);
        Ok(ChatTemplate { kind: Kind::Jinja(Box::new(Self::environment(src)?)), hermes, thinking, bos: bos.into(), eos: eos.into() })
    }

    /// A template given by name or source, as llama-server's `--chat-template` takes it: the
    /// built-in `chatml` or `gemma`, else jinja source; `tok`'s special tokens as the model's
    /// own template gets them.
    pub fn named(name_or_src: &str, tok: &crate::Tokenizer) -> Result<ChatTemplate, Error> {
        let (bos, eos) = special_texts(tok);
        match name_or_src {
            "chatml" => Ok(Self::builtin(Kind::ChatMl, bos, eos)),
            "gemma" => Ok(Self::builtin(Kind::Gemma, bos, eos)),
            src => Self::from_jinja(src, &bos, &eos),
        }
    }

    /// Whether `name_or_src` names a built-in format rather than giving jinja source.
    pub fn is_builtin_name(name_or_src: &str) -> bool {
        matches!(name_or_src, "chatml" | "gemma")
    }

    /// Whether the template's answers may hold reasoning blocks (`crate::reasoning`).
    pub fn thinks(&self) -> bool {
        self.thinking
    }

    /// How this template takes tools (`crate::tools::Format`).
    pub fn tool_format(&self) -> crate::tools::Format {
        if self.hermes {
            crate::tools::Format::Hermes
        } else {
            crate::tools::Format::Json
        }
    }

    fn environment(src: &str) -> Result<Environment<'static>, Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", src.to_string()).map_err(render_err)?;
        Ok(env)
    }

    /// Render a conversation; `add_generation_prompt` appends the assistant turn header.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, Error> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// [`render`](Self::render) with `tools` (OpenAI's form) offered to a template that reads
    /// them (none: `tools` undefined, as without).
    pub fn render_with_tools(&self, messages: &[Message], tools: &[serde_json::Value], add_generation_prompt: bool) -> Result<String, Error> {
        self.render_with(messages, tools, add_generation_prompt, &serde_json::Map::new())
    }

    /// [`render_with_tools`](Self::render_with_tools) with more variables for the template
    /// (llama-server's `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`); they cannot
    /// replace the messages, tools or special tokens. The built-in formats take none.
    pub fn render_with(&self, messages: &[Message], tools: &[serde_json::Value], add_generation_prompt: bool, kwargs: &serde_json::Map<String, serde_json::Value>) -> Result<String, Error> {
        match &self.kind {
            Kind::Jinja(env) => {
                let t = env.get_template("chat").map_err(render_err)?;
                let ctx = context! {
                    messages => messages,
                    add_generation_prompt => add_generation_prompt,
                    bos_token => self.bos,
                    eos_token => self.eos,
                    ..minijinja::Value::from_serialize(kwargs)
                };
                // `tools` only where there are some: templates test `tools is defined`.
                let ctx = if tools.is_empty() { ctx } else { context! { tools => tools, ..ctx } };
                t.render(ctx).map_err(render_err)
            }
            Kind::Gemma => Ok(gemma(messages, add_generation_prompt)),
            Kind::ChatMl => {
                let mut s = String::new();
                for m in messages {
                    s.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content));
                }
                if add_generation_prompt {
                    s.push_str("<|im_start|>assistant\n");
                }
                Ok(s)
            }
        }
    }
}

/// The `tojson` of Hugging Face's templates, Python's `json.dumps(v, ensure_ascii=False)`:
/// `", "` and `": "` between items, keys in their order; with `indent`, one item a line.
fn tojson(v: minijinja::Value, kwargs: minijinja::value::Kwargs) -> Result<String, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let fail = |e: serde_json::Error| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("tojson: {e}"));
    let v = serde_json::to_value(&v).map_err(fail)?;
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&pad));
            serde::Serialize::serialize(&v, &mut ser).map_err(fail)?;
        }
        None => serde::Serialize::serialize(&v, &mut serde_json::Serializer::with_formatter(&mut out, Spaced)).map_err(fail)?,
    }
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// llama.cpp's `strftime_now(format)`: the local time now, by C `strftime`'s specifiers. Llama
/// 3.x's templates date their system turn with it (where it is undefined they write a fixed
/// "26 Jul 2024").
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format))
        .map_err(|_| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("strftime_now: cannot format {format:?}")))?;
    Ok(out)
}

/// Python `json.dumps`'s default separators.
struct Spaced;

impl serde_json::ser::Formatter for Spaced {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// llama.cpp's built-in `gemma` format.
fn gemma(messages: &[Message], add_generation_prompt: bool) -> String {
    let mut s = String::new();
    let mut system = String::new();
    for m in messages {
        if m.role == "system" {
            system.push_str(m.content.trim());
            continue;
        }
        let role = if m.role == "assistant" { "model" } else { m.role.as_str() };
        s.push_str(&format!("<start_of_turn>{role}\n"));
        if !system.is_empty() && role != "model" {
            s.push_str(&system);
            s.push_str("\n\n");
            system.clear();
        }
        s.push_str(m.content.trim());
        s.push_str("<end_of_turn>\n");
    }
    if add_generation_prompt {
        s.push_str("<start_of_turn>model\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama 3.2's date line: today's date through `strftime_now`, as llama.cpp renders it, not
    /// the template's fallback; a format chrono cannot write is an error, not a panic.
    #[test]
    fn strftime_now_dates_the_system_turn() {
        let src = r#"{%- if strftime_now is defined %}{%- set date_string = strftime_now("%d %b %Y") %}{%- else %}{%- set date_string = "26 Jul 2024" %}{%- endif %}Today Date: {{ date_string }}"#;
        let t = ChatTemplate::from_jinja(src, "", "").unwrap();
        let before = chrono::Local::now().format("%d %b %Y").to_string();
        let got = t.render(&[Message::new("user", "hi")], false).unwrap();
        let after = chrono::Local::now().format("%d %b %Y").to_string();
        assert!(got == format!("Today Date: {before}") || got == format!("Today Date: {after}"), "{got}");
        assert_ne!(got, "Today Date: 26 Jul 2024");
        let bad = ChatTemplate::from_jinja(r#"{{ strftime_now("%Q") }}"#, "", "").unwrap();
        let e = bad.render(&[Message::new("user", "hi")], false).unwrap_err().to_string();
        assert!(e.contains("strftime_now"), "{e}");
    }
}
