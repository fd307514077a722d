//! What a request's text is held to — a JSON Schema ([`crate::json`]), a GBNF grammar
//! ([`crate::grammar`]), or either from a trigger on ([`lazy`]) — and the per-sequence mask
//! that holds it, behind one type for the batcher and `generate`.

pub mod lazy;

pub use lazy::{Lazy, LazyMask, Trigger};

use crate::grammar::{Grammar, GrammarMask, GrammarVocab};
use crate::json::{JsonMask, JsonVocab, Schema};
use crate::sample::Sampler;
use crate::tokenizer::Tokenizer;
use crate::Error;
use std::sync::{Arc, OnceLock};

/// A request's constraint.
#[derive(Clone, Debug)]
pub enum Constraint {
    /// JSON mode (`Schema::object()`) or a JSON Schema: the text is a JSON value of the schema
    /// and stops when it closes.
    Json(Arc<Schema>),
    /// A GBNF grammar: the text stays the prefix of one the grammar derives; an end token only
    /// where it is complete, and the text stops where nothing else could follow.
    Grammar(Arc<Grammar>),
    /// Free text until a trigger, then one of the above ([`lazy`]).
    Lazy(Arc<Lazy>),
}

impl Constraint {
    /// Check what depends on the vocabulary: the grammar's token elements and the trigger
    /// tokens are ids below `n_vocab`.
    pub fn check(&self, n_vocab: usize) -> Result<(), Error> {
        match self {
            Constraint::Json(_) => Ok(()),
            Constraint::Grammar(g) => g.check_tokens(n_vocab),
            Constraint::Lazy(l) => {
                l.check_triggers(n_vocab)?;
                l.then.check(n_vocab)
            }
        }
    }
}

/// The vocabulary as each constraint reads it, each built when first asked for (the grammar
/// trie of Gemma 3's 262,144 tokens takes 0.11–0.14 s).
#[derive(Debug, Default)]
pub struct Vocabs {
    json: OnceLock<JsonVocab>,
    grammar: OnceLock<GrammarVocab>,
}

impl Vocabs {
    pub fn json(&self, tok: &Tokenizer) -> &JsonVocab {
        self.json.get_or_init(|| JsonVocab::new(tok))
    }

    pub fn grammar(&self, tok: &Tokenizer) -> &GrammarVocab {
        self.grammar.get_or_init(|| GrammarVocab::new(tok))
    }

    /// Build the tables `c` reads now (so that its first token does not wait for them).
    pub fn prepare(&self, c: &Constraint, tok: &Tokenizer) {
        match c {
            Constraint::Json(_) => drop(self.json(tok)),
            Constraint::Grammar(_) => drop(self.grammar(tok)),
            Constraint::Lazy(l) => self.prepare(&l.then, tok),
        }
    }
}

/// A sequence's mask.
#[derive(Clone, Debug)]
pub enum Mask {
    Json(JsonMask),
    Grammar(GrammarMask),
    Lazy(LazyMask),
}

impl Mask {
    pub fn new(c: &Constraint) -> Mask {
        match c {
            Constraint::Json(s) => Mask::Json(JsonMask::new(s.clone())),
            Constraint::Grammar(g) => Mask::Grammar(GrammarMask::new(g.clone())),
            Constraint::Lazy(l) => Mask::Lazy(LazyMask::new(l.clone())),
        }
    }

    /// Draw the next token with `sampler` among those the constraint allows.
    pub fn sample(&mut self, vocabs: &Vocabs, tok: &Tokenizer, sampler: &mut Sampler, logits: &[f32]) -> Result<u32, Error> {
        match self {
            Mask::Json(m) => m.sample(vocabs.json(tok), tok, sampler, logits),
            Mask::Grammar(m) => m.sample(vocabs.grammar(tok), tok, sampler, logits),
            Mask::Lazy(m) => m.sample(vocabs, tok, sampler, logits),
        }
    }

    /// Take the sampled (non-end) token `id`; whether the text is finished with it.
    pub fn closes_with(&mut self, vocabs: &Vocabs, tok: &Tokenizer, id: u32) -> bool {
        match self {
            Mask::Json(m) => m.closes_with(vocabs.json(tok), tok, id),
            Mask::Grammar(m) => m.closes_with(vocabs.grammar(tok), tok, id),
            Mask::Lazy(m) => m.closes_with(vocabs, tok, id),
        }
    }

    /// Take `text` (a lazy constraint's text from its trigger); `false` if it does not fit.
    fn accept_text(&mut self, vocabs: &Vocabs, tok: &Tokenizer, text: &[u8]) -> bool {
        match self {
            Mask::Json(m) => m.accept_text(vocabs.json(tok), tok, text),
            Mask::Grammar(m) => m.accept_text(text),
            Mask::Lazy(_) => false,
        }
    }

    /// Is the text finished (a closed JSON value, a grammar that can take nothing more)?
    fn is_closed(&self) -> bool {
        match self {
            Mask::Json(m) => m.is_complete(),
            Mask::Grammar(m) => m.is_done(),
            Mask::Lazy(_) => false,
        }
    }
}
