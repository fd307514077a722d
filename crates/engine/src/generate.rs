//! Generation: prefill a prompt (in batches of the engine's batch size), then sample token by
//! token, streaming text that never splits a UTF-8 character, until an end-of-generation
//! token, a stop string, the token limit or a full context.

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
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams { max_tokens: 128, sampling: SamplingParams::default(), stop: vec![], seq: 0, ignore_eos: false }
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
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reason: StopReason,
    pub n_prompt: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
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

/// Generate after `prompt` (already tokenized) in `params.seq`. `on_text` receives each piece
/// of decoded text; returning `false` cancels.
pub fn generate(
    engine: &mut Engine,
    tok: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Generation, Error> {
    let mut sampler = Sampler::new(params.sampling.clone(), tok.n_vocab())?;
    for &t in prompt {
        sampler.accept(t);
    }
    let t0 = Instant::now();
    let mut logits = Vec::with_capacity(engine.hyper().n_vocab);
    prefill(engine, params.seq, prompt, &mut logits)?;
    let prefill_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut out = Generation {
        tokens: Vec::with_capacity(params.max_tokens),
        text: String::new(),
        reason: StopReason::MaxTokens,
        n_prompt: prompt.len(),
        prefill_secs,
        decode_secs: 0.0,
    };
    let mut stream = Utf8Stream::default();
    out.text.reserve(params.max_tokens.min(1 << 16) * 8);
    let mut emitted = 0; // bytes of out.text already handed to on_text
    let max_stop = params.stop.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut batch = Batch::new();
    while out.tokens.len() < params.max_tokens {
        let t = sampler.sample(&logits);
        if tok.is_eog(t) && !params.ignore_eos {
            out.reason = StopReason::Eog;
            break;
        }
        sampler.accept(t);
        out.tokens.push(t);
        stream.push_to(tok.piece(t), &mut out.text);
        // Stop strings: cut the text at the first match; hold back a possible partial match.
        if let Some(pos) = params.stop.iter().filter_map(|s| out.text.find(s.as_str())).min() {
            out.text.truncate(pos);
            out.reason = StopReason::StopString;
            break;
        }
        let mut safe = out.text.len().saturating_sub(max_stop.saturating_sub(1));
        while !out.text.is_char_boundary(safe) {
            safe -= 1;
        }
        if safe > emitted {
            if !on_text(&out.text[emitted..safe]) {
                out.reason = StopReason::Cancelled;
                emitted = safe;
                break;
            }
            emitted = safe;
        }
        if out.tokens.len() == params.max_tokens {
            break;
        }
        let pos = engine.seq_len(params.seq) as i32;
        if engine.room(params.seq) == 0 {
            out.reason = StopReason::ContextFull;
            break;
        }
        batch.clear();
        batch.add(t, pos, params.seq, true);
        let l = engine.decode(&batch)?;
        logits.clear();
        logits.extend_from_slice(l.row(0));
    }
    if out.reason != StopReason::StopString {
        out.text.push_str(&stream.finish());
    }
    if out.text.len() > emitted && out.reason != StopReason::Cancelled {
        on_text(&out.text[emitted..]);
    }
    out.decode_secs = t1.elapsed().as_secs_f64();
    Ok(out)
}
