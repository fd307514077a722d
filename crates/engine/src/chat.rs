//! Chat templates: the GGUF's `tokenizer.chat_template` rendered with minijinja (Python-jinja
//! compatible: trim_blocks, lstrip_blocks, pycompat methods, `raise_exception`), or — when the
//! file has none — a built-in template for the family, as llama.cpp does (Gemma's format folds
//! the system text into the first user turn; otherwise ChatML).

use crate::Error;
use corelm_gguf::Gguf;
use minijinja::{context, Environment};
use serde::Serialize;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.to_string(), content: content.to_string() }
    }
}

enum Kind {
    Jinja(Box<Environment<'static>>),
    Gemma,
    ChatMl,
}

pub struct ChatTemplate {
    kind: Kind,
    bos: String,
    eos: String,
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
        let bos = tok.bos.map(|b| tok.text(b).to_string()).unwrap_or_default();
        let eos = tok.eos.map(|b| tok.text(b).to_string()).unwrap_or_default();
        let kind = match g.opt_str("tokenizer.chat_template")? {
            Some(src) => Kind::Jinja(Box::new(Self::environment(src)?)),
            None if g.str("general.architecture")?.starts_with("gemma") => Kind::Gemma,
            None => Kind::ChatMl,
        };
        Ok(ChatTemplate { kind, bos, eos })
    }

    /// A template from jinja source (for tests and user-supplied templates).
    pub fn from_jinja(src: &str, bos: &str, eos: &str) -> Result<ChatTemplate, Error> {
        Ok(ChatTemplate { kind: Kind::Jinja(Box::new(Self::environment(src)?)), bos: bos.into(), eos: eos.into() })
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
        env.add_template_owned("chat", src.to_string()).map_err(render_err)?;
        Ok(env)
    }

    /// Render a conversation; `add_generation_prompt` appends the assistant turn header.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, Error> {
        match &self.kind {
            Kind::Jinja(env) => {
                let t = env.get_template("chat").map_err(render_err)?;
                t.render(context! {
                    messages => messages,
                    add_generation_prompt => add_generation_prompt,
                    bos_token => self.bos,
                    eos_token => self.eos,
                })
                .map_err(render_err)
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
