//! Lazy constraints: the text is free until a trigger appears in it, and held from there on —
//! llama.cpp's lazy grammars (llama-server's `grammar_lazy` with `grammar_triggers`), and tool
//! calls under `tool_choice: auto` (the prose free, each call held to the tools' schemas).
//!
//! Triggers are llama.cpp's four kinds ([`Trigger`]), tried in order after each free token; the
//! first that matches wins. The held text starts where llama.cpp starts it: at a token
//! trigger's piece, at a word, at a pattern's match, at a full pattern's first non-empty capture
//! group (else the start: a full pattern says where the held text starts by a group).
//! The text from there to the end of the token that completed the trigger is fed to the
//! constraint at once; the tokens after it are sampled under the constraint's mask.
//!
//! The text searched is what was generated since the start (or since the last held text
//! closed), not the prompt. Patterns run over all of it after each free token, as llama.cpp's
//! do: the three full patterns of a Hermes tool answer take 28 µs a token at 8 KB of text. A
//! token whose text after the trigger the constraint refuses (it was sampled freely) ends the
//! answer there; llama.cpp fails the request.
//!
//! When the held text closes, the answer ends ([`Lazy::again`] false, as llama.cpp: only an
//! end token may follow a complete grammar) or the text is free again and the next trigger is
//! looked for in what follows.

use super::{Constraint, Mask, Vocabs};
use crate::sample::Sampler;
use crate::tokenizer::Tokenizer;
use crate::Error;
use regex::bytes::Regex;
use std::sync::Arc;

/// What starts the held text (llama.cpp's `common_grammar_trigger` types 0–3).
#[derive(Clone, Debug)]
pub enum Trigger {
    /// This token is sampled: held from its piece.
    Token(u32),
    /// This text appears: held from it.
    Word(String),
    /// This regular expression matches somewhere in the text: held from the (leftmost) match.
    Pattern(Regex),
    /// This regular expression matches the whole text (anchored at both ends when built by
    /// [`Trigger::full`]): held from its first non-empty capture group, else from the start.
    Full(Regex),
}

impl Trigger {
    /// A [`Trigger::Pattern`]; the error names the expression.
    pub fn pattern(re: &str) -> Result<Trigger, Error> {
        Regex::new(re).map(Trigger::Pattern).map_err(|e| Error::Grammar(format!("trigger pattern {re:?}: {e}")))
    }

    /// A [`Trigger::Full`]: `re` anchored at the start and end of the text (an empty `re`
    /// matches only empty text).
    pub fn full(re: &str) -> Result<Trigger, Error> {
        Regex::new(&format!("^(?:{re})$")).map(Trigger::Full).map_err(|e| Error::Grammar(format!("trigger pattern {re:?}: {e}")))
    }

    /// Where the held text starts, if this trigger matches `text`, whose bytes from `new` on
    /// are token `id`'s piece (earlier text was searched before: a word is only looked for
    /// where it would end in the new bytes).
    fn find(&self, text: &[u8], new: usize, id: u32) -> Option<usize> {
        let group = |c: regex::bytes::Captures| c.iter().skip(1).flatten().find(|m| !m.is_empty()).map(|m| m.start());
        match self {
            Trigger::Token(t) => (*t == id).then_some(new),
            Trigger::Word(w) => {
                let w = w.as_bytes();
                let from = new.saturating_sub(w.len().saturating_sub(1));
                text[from..].windows(w.len().max(1)).position(|s| s == w).map(|at| from + at)
            }
            Trigger::Pattern(re) => re.find(text).map(|m| m.start()),
            Trigger::Full(re) => re.captures(text).map(|c| group(c).unwrap_or(0)),
        }
    }
}

/// A lazy constraint: free text until one of `triggers`, then `then`.
#[derive(Clone, Debug)]
pub struct Lazy {
    pub triggers: Vec<Trigger>,
    /// What the text is held to from the trigger on (not itself lazy).
    pub then: Constraint,
    /// When `then` closes, free again until the next trigger (rather than the answer's end).
    pub again: bool,
}

impl Lazy {
    /// Checked: at least one trigger, every word non-empty, `then` not lazy.
    pub fn new(triggers: Vec<Trigger>, then: Constraint, again: bool) -> Result<Lazy, Error> {
        if triggers.is_empty() {
            return Err(Error::Grammar("a lazy grammar needs at least one trigger".into()));
        }
        if triggers.iter().any(|t| matches!(t, Trigger::Word(w) if w.is_empty())) {
            return Err(Error::Grammar("a trigger word is empty".into()));
        }
        if matches!(then, Constraint::Lazy(_)) {
            return Err(Error::Grammar("a lazy constraint cannot hold a lazy one".into()));
        }
        Ok(Lazy { triggers, then, again })
    }

    /// The trigger tokens are ids below `n_vocab`.
    pub fn check_triggers(&self, n_vocab: usize) -> Result<(), Error> {
        match self.triggers.iter().find(|t| matches!(t, Trigger::Token(id) if *id as usize >= n_vocab)) {
            Some(Trigger::Token(id)) => Err(Error::Grammar(format!("trigger token {id} is outside the vocabulary of {n_vocab}"))),
            _ => Ok(()),
        }
    }
}

/// A sequence's lazy mask: the free text searched for triggers, or the held text's mask.
#[derive(Clone, Debug)]
pub struct LazyMask {
    lazy: Arc<Lazy>,
    text: Vec<u8>,
    held: Option<Box<Mask>>,
}

impl LazyMask {
    pub fn new(lazy: Arc<Lazy>) -> LazyMask {
        LazyMask { lazy, text: Vec::new(), held: None }
    }

    /// Draw the next token: freely, or among those the held constraint allows.
    pub fn sample(&mut self, vocabs: &Vocabs, tok: &Tokenizer, sampler: &mut Sampler, logits: &[f32]) -> Result<u32, Error> {
        match &mut self.held {
            Some(m) => m.sample(vocabs, tok, sampler, logits),
            None => Ok(sampler.sample(logits)),
        }
    }

    /// Take the sampled (non-end) token `id`; whether the answer ends with it.
    pub fn closes_with(&mut self, vocabs: &Vocabs, tok: &Tokenizer, id: u32) -> bool {
        if let Some(m) = &mut self.held {
            return m.closes_with(vocabs, tok, id) && self.closed();
        }
        let new = self.text.len();
        self.text.extend_from_slice(tok.piece(id));
        let Some(from) = self.lazy.triggers.iter().find_map(|t| t.find(&self.text, new, id)) else { return false };
        let mut m = Mask::new(&self.lazy.then);
        let fits = m.accept_text(vocabs, tok, &self.text[from..]);
        self.text.clear();
        if !fits {
            return true;
        }
        let done = m.is_closed();
        self.held = Some(Box::new(m));
        done && self.closed()
    }

    /// The held text closed: whether the answer ends (else free again).
    fn closed(&mut self) -> bool {
        if !self.lazy.again {
            return true;
        }
        self.held = None;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::Schema;

    #[test]
    fn triggers_find_where_llama_cpp_starts_the_held_text() {
        // A word cut across tokens: found once its last byte arrives, from its first.
        let w = Trigger::Word("<tool_call>".into());
        assert_eq!(w.find(b"ok <tool_", 3, 0), None);
        assert_eq!(w.find(b"ok <tool_call>\n", 9, 0), Some(3));
        // Only where it would end in the new bytes (earlier text was searched before).
        assert_eq!(Trigger::Word("ab".into()).find(b"ab cd", 3, 0), None);
        assert_eq!(Trigger::Token(7).find(b"xyz", 1, 7), Some(1));
        assert_eq!(Trigger::Token(7).find(b"xyz", 1, 8), None);
        // A pattern: from the match (llama.cpp's wrapping group is the whole pattern).
        let p = Trigger::pattern(r"ANSWER(:)").unwrap();
        assert_eq!(p.find(b"so ANSWER: 4", 10, 0), Some(3));
        // A full pattern: the whole text, from its first non-empty group, else the start.
        let f = Trigger::full(r#"[\s\S]*?```(?:json)?\s*(\{\s*"name"\s*:)[\s\S]*"#).unwrap();
        assert_eq!(f.find(b"Sure:\n```json\n{\"name\": \"x\"", 20, 0), Some(14));
        assert_eq!(f.find(b"Sure:\n```json\n{\"a\": 1", 20, 0), None);
        assert_eq!(Trigger::full(r"\s*(x?)[\s\S]*").unwrap().find(b"  y", 2, 0), Some(0));
        assert_eq!(Trigger::full("").unwrap().find(b"a", 0, 0), None);
        assert!(Trigger::pattern("(").unwrap_err().to_string().contains("trigger pattern"));
    }

    #[test]
    fn lazy_constraints_are_checked() {
        let then = Constraint::Json(Arc::new(Schema::object()));
        assert!(Lazy::new(vec![], then.clone(), false).unwrap_err().to_string().contains("at least one trigger"));
        assert!(Lazy::new(vec![Trigger::Word(String::new())], then.clone(), false).is_err());
        let lazy = Constraint::Lazy(Arc::new(Lazy::new(vec![Trigger::Token(9)], then.clone(), false).unwrap()));
        assert!(Lazy::new(vec![Trigger::Token(1)], lazy.clone(), false).is_err());
        assert!(lazy.check(10).is_ok());
        assert!(lazy.check(9).unwrap_err().to_string().contains("trigger token 9"));
    }
}
