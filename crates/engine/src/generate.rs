//! Generation: prefill a prompt (in batches of the engine's batch size), then sample token by
//! token, streaming text that never splits a UTF-8 character, until an end-of-generation
//! token, a stop string, the token limit or a full context; under JSON mode, a JSON Schema or a
//! GBNF grammar (`GenerateParams::constraint`) only tokens that keep the text the prefix of one
//! the constraint takes, until it closes. With prompt lookup (`GenerateParams::lookup`) a
//! step feeds a draft beside its token and keeps the draft tokens the model samples anyway; a
//! draft model ([`generate_drafted`]) proposes them instead.

use crate::constraint::{Constraint, Mask, Vocabs};
use crate::draft::{DraftModel, DraftRequest};
use crate::lookup::{self, Acceptance, RowCost};
use crate::sample::{Sampler, SamplingParams};
use crate::{Batch, Engine, Error, Tokenizer, Utf8Stream};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Sequence to use; its KV contents so far are the context (a chat session continues it).
    pub seq: i32,
    /// Do not stop at end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
    /// JSON mode, a JSON Schema or a GBNF grammar ([`Constraint`]): the text is one the
    /// constraint takes, and generation stops when it closes.
    pub constraint: Option<Constraint>,
    /// Prompt-lookup speculative decoding ([`crate::lookup`]): at most this many draft tokens
    /// fed beside each token (0: off). The answer is the one without drafts (bit for bit under
    /// `batch_invariant`, where a row's logits do not depend on the rows beside it).
    pub lookup: usize,
    /// Context shift (`--context-shift`): when the sequence fills its context, drop tokens
    /// after the first kept ones and go on ([`Engine::shift_seq`]) instead of stopping.
    pub context_shift: Option<ContextShift>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams { max_tokens: 128, sampling: SamplingParams::default(), stop: vec![], seq: 0, ignore_eos: false, constraint: None, lookup: 0, context_shift: None }
    }
}

/// Where a context shift cuts (llama.cpp's `--keep` and `n_discard`; [`crate::shift_cut`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextShift {
    /// Tokens of the prompt kept (besides a BOS); negative: the whole prompt.
    pub n_keep: i64,
    /// Tokens dropped after them (0: half of the rest).
    pub n_discard: usize,
    /// The context a sequence fills before it shifts (a server's per-request context; 0: the
    /// engine's).
    pub n_ctx: usize,
}

impl ContextShift {
    /// The context a sequence fills before it shifts, in an engine of context `engine_ctx`.
    pub fn limit(&self, engine_ctx: usize) -> usize {
        if self.n_ctx == 0 { engine_ctx } else { self.n_ctx.min(engine_ctx) }
    }

    /// Whether a sequence of `len` tokens shifts before its next token, llama.cpp's rule: when
    /// that token would take the context's last cell.
    pub fn is_due(&self, len: usize, engine_ctx: usize) -> bool {
        len + 1 >= self.limit(engine_ctx)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token was sampled (it is not part of the text).
    Eog,
    MaxTokens,
    StopString,
    ContextFull,
    /// The callback asked to stop.
    Cancelled,
    /// JSON mode or a JSON Schema: the value closed; a grammar: nothing more could follow.
    Closed,
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reason: StopReason,
    pub n_prompt: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    /// Of `decode_secs`, the time the constraint's mask took (sampling under it and taking
    /// each token; 0 without one).
    pub mask_secs: f64,
    /// Prompt-lookup draft tokens fed, and kept (`GenerateParams::lookup`).
    pub drafted: usize,
    pub kept: usize,
    /// Context shifts made (`GenerateParams::context_shift`), and their time (part of
    /// `decode_secs`).
    pub shifts: usize,
    pub shift_secs: f64,
}

/// Feed `tokens` to sequence `seq` starting at its current length; returns the logits row of
/// the last token (copied into `last`).
pub fn prefill(engine: &mut Engine, seq: i32, tokens: &[u32], last: &mut Vec<f32>) -> Result<(), Error> {
    if tokens.is_empty() {
        return Err(Error::Batch("empty prompt".into()));
    }
    let start = engine.seq_len(seq);
    if tokens.len() > engine.room(seq) {
        return Err(Error::PromptTooLong { prompt: start + tokens.len(), n_ctx: engine.config().n_ctx });
    }
    engine.feed(seq, tokens, false, |l| {
        last.clear();
        last.extend_from_slice(l.row(0));
    })
}

/// Shift `seq`'s context by llama-completion's cut, its first `n_context` tokens being the
/// prompt, and a draft model's cache with it; the cut `(keep, discard)`, `None` where it drops
/// nothing.
fn shift(engine: &mut Engine, draft: Option<&mut DraftModel>, tok: &Tokenizer, seq: i32, c: ContextShift, n_context: usize) -> Result<Option<(usize, usize)>, Error> {
    let (len, n_ctx) = (engine.seq_len(seq), c.limit(engine.config().n_ctx));
    // `--keep` past the prompt, or -1: the prompt, BOS included; else a BOS besides.
    let whole = c.n_keep < 0 || c.n_keep as usize > n_context;
    let n_keep = if whole { -1 } else { c.n_keep };
    let (keep, discard) = crate::shift_cut(len, n_context, n_keep, c.n_discard, tok.add_bos && !whole, n_ctx);
    if discard == 0 {
        return Ok(None);
    }
    engine.shift_seq(seq, keep, discard)?;
    if let Some(m) = draft {
        m.shift(seq, keep, discard);
    }
    Ok(Some((keep, discard)))
}

/// After a step that fed `rows` rows (its token and a draft) to `seq`, of which the model took
/// the rows up to `row`: the rest leave the KV cache. The draft tokens kept.
fn cut_draft(engine: &mut Engine, seq: i32, rows: usize, row: usize) -> usize {
    if rows > row + 1 {
        engine.truncate_seq(seq, engine.seq_len(seq) - (rows - 1 - row));
    }
    row
}

/// Incremental detokenizer with stop strings: pieces go in, text that can no longer become
/// part of a stop string comes out (never splitting a UTF-8 character). Shared by
/// [`generate`] and the serving batcher.
pub struct TextOut {
    stream: Utf8Stream,
    /// All text so far (cut at a stop string once one is seen).
    pub text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
    stop: Vec<String>,
    max_stop: usize,
    /// The stop string that cut the text, once one did (its index in `stop`).
    stopped: Option<usize>,
}

impl TextOut {
    pub fn new(stop: Vec<String>, capacity: usize) -> TextOut {
        let max_stop = stop.iter().map(|s| s.len()).max().unwrap_or(0);
        TextOut { stream: Utf8Stream::default(), text: String::with_capacity(capacity), emitted: 0, stop, max_stop, stopped: None }
    }

    /// Add a token's bytes. Returns the newly safe text and whether a stop string was found
    /// (the text is then cut before it, and the returned piece is final).
    pub fn push(&mut self, piece: &[u8]) -> (&str, bool) {
        self.stream.push_to(piece, &mut self.text);
        let from = self.emitted;
        // A stop string can only start in text not handed out yet: at most `max_stop - 1`
        // bytes are held back, so one starting earlier would have been complete, and found,
        // before. Search from there instead of the whole text on every token.
        let rest = &self.text[from..];
        // The earliest match; at one place, the first listed.
        let hit = self.stop.iter().enumerate().filter(|(_, s)| !s.is_empty()).filter_map(|(i, s)| Some((rest.find(s.as_str())?, i))).min();
        if let Some((pos, i)) = hit {
            self.text.truncate(from + pos);
            self.stopped = Some(i);
            self.emitted = self.text.len();
            return (&self.text[from..], true);
        }
        // Hold back what could still be the start of a stop string.
        let mut safe = self.text.len().saturating_sub(self.max_stop.saturating_sub(1));
        while !self.text.is_char_boundary(safe) {
            safe -= 1;
        }
        self.emitted = safe.max(from);
        (&self.text[from..self.emitted], false)
    }

    /// The stop string that ended the text, if one did.
    pub fn stop_word(&self) -> Option<&str> {
        self.stopped.map(|i| self.stop[i].as_str())
    }

    /// End of generation: flush held-back text and incomplete characters (nothing after a
    /// stop string).
    pub fn finish(&mut self) -> &str {
        if self.stopped.is_some() {
            return "";
        }
        self.text.push_str(&self.stream.finish());
        let from = self.emitted.min(self.text.len());
        self.emitted = self.text.len();
        &self.text[from..]
    }
}

/// Generate after `prompt` (already tokenized) in `params.seq`. `on_text` receives each piece
/// of decoded text; returning `false` cancels.
pub fn generate(
    engine: &mut Engine,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
    on_text: impl FnMut(&str) -> bool,
) -> Result<Generation, Error> {
    generate_drafted(engine, None, tok, prompt, params, on_text)
}

/// [`generate`], with a draft model's proposals fed beside each token where one is given
/// ([`crate::draft`]; in place of `params.lookup`'s). The answer is the one without.
pub fn generate_drafted(
    engine: &mut Engine,
    mut model: Option<&mut DraftModel>,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Generation, Error> {
    let mut sampler = Sampler::new(params.sampling.clone(), tok.n_vocab())?;
    if let Some(c) = &params.constraint {
        c.check(tok.n_vocab())?;
    }
    for &t in prompt {
        sampler.accept(t);
    }
    let (seq, n_vocab) = (params.seq, engine.hyper().n_vocab);
    let t0 = Instant::now();
    let mut logits = Vec::with_capacity(engine.hyper().n_vocab);
    let n_context = engine.seq_len(seq) + prompt.len();
    if params.context_shift.is_some() {
        engine.can_shift()?;
    }
    let (mut shifts, mut shift_secs) = (0, 0.0);
    // A session's next prompt that does not fit: what the sequence holds is shifted first (its
    // kept part counted from what it held).
    if let Some(c) = params.context_shift {
        let ts = Instant::now();
        let held = engine.seq_len(seq);
        while engine.seq_len(seq) > 0 && engine.seq_len(seq) + prompt.len() + 1 > c.limit(engine.config().n_ctx) && shift(engine, model.as_deref_mut(), tok, seq, c, held)?.is_some() {
            shifts += 1;
        }
        shift_secs += ts.elapsed().as_secs_f64();
    }
    // Drafts (prompt lookup's or a draft model's) see the sequence's tokens: those it holds
    // (a chat session's earlier turns, a prompt cache's blocks), then the prompt.
    let spec = params.lookup > 0 || model.is_some();
    let mut history = vec![];
    if spec {
        history = engine.seq_tokens(seq);
        history.extend_from_slice(prompt);
    }
    prefill(engine, params.seq, prompt, &mut logits)?;
    let prefill_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut tokens = Vec::with_capacity(params.max_tokens);
    let mut reason = StopReason::MaxTokens;
    let mut out = TextOut::new(params.stop.clone(), params.max_tokens.min(1 << 16) * 8);
    let mut batch = Batch::new();
    let vocabs = params.constraint.as_ref().map(|c| {
        let v = Vocabs::default();
        v.prepare(c, tok);
        v
    });
    let mut mask = params.constraint.as_ref().map(Mask::new);
    let mut mask_secs = 0.0;
    // Drafts: `draft` was fed after the step's first token, so the step left `rows` logits
    // rows; `row` is the one sampled next.
    let (mut draft, mut row, mut rows) = (Vec::new(), 0, 1);
    let (mut cost, mut accept) = (RowCost::default(), Acceptance(Acceptance::PRIOR));
    let (mut drafted, mut kept) = (0, 0);
    while tokens.len() < params.max_tokens {
        let lg = &logits[row * n_vocab..(row + 1) * n_vocab];
        let tm = Instant::now();
        let t = match (&mut mask, &vocabs) {
            (Some(m), Some(v)) => m.sample(v, tok, &mut sampler, lg)?,
            _ => sampler.sample(lg),
        };
        if mask.is_some() {
            mask_secs += tm.elapsed().as_secs_f64();
        }
        if tok.is_eog(t) && !params.ignore_eos {
            reason = StopReason::Eog;
            break;
        }
        sampler.accept(t);
        tokens.push(t);
        if spec {
            history.push(t);
        }
        let (piece, stopped) = out.push(tok.piece(t));
        if !piece.is_empty() && !on_text(piece) {
            reason = StopReason::Cancelled;
            break;
        }
        if stopped {
            reason = StopReason::StopString;
            break;
        }
        if let (Some(m), Some(v)) = (mask.as_mut(), vocabs.as_ref()) {
            let tm = Instant::now();
            let closed = m.closes_with(v, tok, t);
            mask_secs += tm.elapsed().as_secs_f64();
            if closed {
                reason = StopReason::Closed;
                break;
            }
        }
        if tokens.len() == params.max_tokens {
            break;
        }
        // A draft token the model sampled anyway is in the cache already; its row is next.
        if row + 1 < rows && draft[row] == t {
            row += 1;
            continue;
        }
        if params.lookup > 0 {
            // (A step without drafts lets the acceptance drift back, so drafting is retried.)
            accept.observe(rows - 1, row);
        }
        kept += cut_draft(engine, seq, rows, row);
        (row, rows) = (0, 1);
        let full = |e: &Engine| e.room(seq) == 0 || params.context_shift.is_some_and(|c| c.is_due(e.seq_len(seq), e.config().n_ctx));
        if full(engine) {
            if let Some(c) = params.context_shift {
                let (ts, next) = (Instant::now(), engine.seq_len(seq));
                if let Some((keep, discard)) = shift(engine, model.as_deref_mut(), tok, seq, c, n_context)? {
                    // The drafts' history (`t` goes to `next`) drops the same tokens.
                    crate::engine::drop_shifted(&mut history, next, keep, discard);
                    shift_secs += ts.elapsed().as_secs_f64();
                    shifts += 1;
                }
            }
            if full(engine) {
                reason = StopReason::ContextFull;
                break;
            }
        }
        // This step's draft: within the context, the batch and the answer's limit; a lookup
        // draft only as long as pays by the timed steps (the longest until steps of several
        // sizes are timed), a draft model's as its parameters say.
        let n = model.as_ref().map_or(params.lookup, |m| m.params().n_max);
        // With context shift, a step ends at most one token short of the limit, so the shift
        // comes at the length it would without drafts (and cuts the same tokens).
        let limit = params.context_shift.map_or(usize::MAX, |c| c.limit(engine.config().n_ctx) - 1 - engine.seq_len(seq));
        let most = n.min(engine.room(seq).min(limit) - 1).min(engine.config().n_batch - 1).min(params.max_tokens - tokens.len() - 1);
        match model.as_deref_mut() {
            Some(m) => m.draft(|_| DraftRequest { seq, history: &history, max: most }, std::slice::from_mut(&mut draft)),
            None => {
                let len = cost.fit().map_or(most, |c| lookup::best_len(accept.0, c, 1, most));
                lookup::draft(&history, len, &mut draft);
            }
        }
        batch.clear();
        let pos = engine.seq_len(seq);
        batch.add(t, pos as i32, seq, true);
        for (i, &d) in draft.iter().enumerate() {
            batch.add(d, (pos + 1 + i) as i32, seq, true);
        }
        let ts = Instant::now();
        let l = engine.decode(&batch)?;
        logits.clear();
        for r in 0..batch.len() {
            logits.extend_from_slice(l.row(r));
        }
        if params.lookup > 0 {
            cost.observe(batch.len(), ts.elapsed().as_secs_f64());
        }
        (row, rows, drafted) = (0, batch.len(), drafted + draft.len());
    }
    // A session goes on from the last token taken.
    kept += cut_draft(engine, seq, rows, row);
    if !matches!(reason, StopReason::StopString | StopReason::Cancelled) {
        let rest = out.finish();
        if !rest.is_empty() {
            on_text(rest);
        }
    }
    Ok(Generation {
        tokens,
        text: out.text,
        reason,
        n_prompt: prompt.len(),
        prefill_secs,
        decode_secs: t1.elapsed().as_secs_f64(),
        mask_secs,
        drafted,
        kept,
        shifts,
        shift_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::TextOut;

    #[test]
    fn stop_strings_spanning_pieces_cut_the_text_and_nothing_is_emitted_twice() {
        let mut t = TextOut::new(vec!["o W".into(), "xyz".into()], 64);
        let mut out = String::new();
        for piece in ["He", "llo", " ", "Wor", "ld"] {
            let (s, stopped) = t.push(piece.as_bytes());
            out.push_str(s);
            if stopped {
                break;
            }
        }
        assert_eq!(t.finish(), "");
        assert_eq!((out.as_str(), t.text.as_str()), ("Hell", "Hell"));
        // Without a match everything comes out once, held-back text at the end.
        let mut t = TextOut::new(vec!["zz".into()], 64);
        let mut out = String::new();
        for piece in ["ab", "cz", "d", "z"] {
            out.push_str(t.push(piece.as_bytes()).0);
        }
        out.push_str(t.finish());
        assert_eq!(out, "abczdz");
    }
}
