//! The batch API's two types: a [`Batch`] of tokens going into `Engine::decode` (each with
//! its position, sequence and whether its logits are wanted, like `llama_batch`), and the
//! [`Logits`] coming out, a view of the output rows — or, for embeddings, the [`Hidden`] rows.

/// Tokens of one forward pass.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<i32>,
    pub seq: Vec<i32>,
    pub logits: Vec<bool>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// A batch that can hold `n` tokens without reallocating.
    pub fn with_capacity(n: usize) -> Self {
        Batch {
            tokens: Vec::with_capacity(n),
            pos: Vec::with_capacity(n),
            seq: Vec::with_capacity(n),
            logits: Vec::with_capacity(n),
        }
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.pos.clear();
        self.seq.clear();
        self.logits.clear();
    }

    pub fn add(&mut self, token: u32, pos: i32, seq: i32, logits: bool) -> &mut Self {
        self.tokens.push(token);
        self.pos.push(pos);
        self.seq.push(seq);
        self.logits.push(logits);
        self
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// The output rows of the last pass, in batch order: `width` f32 each.
pub struct Rows<'a> {
    pub(crate) data: &'a [f32],
    pub width: usize,
}

impl<'a> Rows<'a> {
    pub fn rows(&self) -> usize {
        self.data.len() / self.width
    }

    pub fn row(&self, i: usize) -> &'a [f32] {
        &self.data[i * self.width..(i + 1) * self.width]
    }
}

/// Logits of the output rows of the last `decode` (`[n_vocab]` each).
pub type Logits<'a> = Rows<'a>;

/// Hidden states of the output rows of the last `Engine::decode_hidden` (`[n_embd]` each).
pub type Hidden<'a> = Rows<'a>;

/// What a pass's output rows hold (one graph is planned per batch shape and kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outputs {
    /// The LM head's logits, `[n_vocab]` per row.
    Logits,
    /// The final norm's output, `[n_embd]` per row (embeddings are pooled from these).
    Hidden,
}
