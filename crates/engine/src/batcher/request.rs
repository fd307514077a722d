//! What goes into the batcher and what comes out: requests, the events a request's sink
//! receives, the live counters.

use super::EmbedRequest;
use crate::constraint::Constraint;
use crate::sample::{keep_top, SamplingParams};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Instant;

/// What the engine thread is handed.
pub enum Work {
    Generate(Box<Request>),
    Embed(EmbedRequest),
    /// Save, restore or erase a slot's KV cache, between steps.
    Slot(SlotAction),
}

/// What to do with a slot's KV cache (`Engine::save_slot` and its siblings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotOp {
    Save(std::path::PathBuf),
    Restore(std::path::PathBuf),
    Erase,
}

/// A slot action and where its answer goes: the tokens and bytes moved (erase: the tokens
/// forgotten, no bytes).
pub struct SlotAction {
    pub slot: usize,
    pub op: SlotOp,
    /// The model's name, written in a saved file and checked on restore.
    pub model: String,
    pub reply: Box<dyn FnOnce(Result<crate::engine::SlotIo, crate::Error>) + Send>,
}

/// A generation request (tokens in, events out).
pub struct Request {
    pub prompt: Vec<u32>,
    /// At most this many tokens are generated; 0: the prompt is only computed (scored with
    /// `prompt_logprobs`, its full blocks left in the prefix cache).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Report log-probabilities: `Some(n)` with the `n` most likely alternatives per token.
    pub logprobs: Option<usize>,
    /// Report those under the sampling chain's distribution (after the cuts, the temperature
    /// and a constraint's mask; [`crate::sample::Sampler::chain_probs`]) rather than the
    /// model's: llama-server's `post_sampling_probs`. Generated tokens only.
    pub chain_probs: bool,
    /// Score the prompt (the legacy API's `echo` with `logprobs`): an [`Event::Prompt`] per
    /// prompt token, in order and before any generated one, with its log-probability given the
    /// tokens before it and the `n` most likely alternatives there (the first token has none).
    /// Such a prompt is computed whole: no prefix cache, every row's logits kept.
    pub prompt_logprobs: Option<usize>,
    /// JSON mode, a JSON Schema or a GBNF grammar: the text is constrained to one the
    /// constraint takes and stops when it closes ([`crate::constraint`]).
    pub constraint: Option<Constraint>,
    /// The LoRA adapters' scales to run under, one per adapter (`None`: whatever the engine
    /// has). Requests of other scales do not share steps: one waits until the running ones
    /// finish, then the engine switches ([`crate::Engine::set_lora_scales`]).
    pub lora: Option<Vec<f32>>,
    /// Context shift (`serve --context-shift`): when the sequence fills the context, tokens
    /// after the first kept ones are dropped and it goes on; `max_tokens` may then pass the
    /// context. `None`: it ends with `Length` there.
    pub context_shift: Option<crate::generate::ContextShift>,
    pub sink: Sink,
    /// When the request arrived (for queueing time and TTFT).
    pub arrived: Instant,
}

/// Receives a request's events; returns `false` when nobody listens any more (cancel).
pub type Sink = Box<dyn FnMut(Event) -> bool + Send>;

#[derive(Clone, Debug)]
pub enum Event {
    /// A prompt token and its log-probability (`Request::prompt_logprobs`; `None` for the first).
    Prompt { id: u32, logprob: Option<TokenLogprob> },
    /// One generated token and the text it releases (may be empty: held back or partial UTF-8).
    Token { id: u32, text: String, logprob: Option<TokenLogprob> },
    /// Held-back text released at the end (no token of its own).
    Text(String),
    Done(Finish),
}

#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// Most likely tokens with their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-generation token or stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    Cancelled,
    Error(String),
}

#[derive(Clone, Debug)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// The stop string that ended the answer (`reason` is then `Stop`), if one did.
    pub stop_word: Option<String>,
    /// Arrival to admission.
    pub queue_secs: f64,
    /// Arrival to first generated token.
    pub ttft_secs: f64,
    /// Mean time per generated token after the first.
    pub tpot_secs: f64,
    /// Tokens context shifts dropped (`Request::context_shift`; llama-server's `truncated`
    /// when not 0).
    pub dropped_tokens: usize,
}

/// Live counters for metrics (read from other threads).
#[derive(Default, Debug)]
pub struct Stats {
    pub waiting: AtomicUsize,
    pub running: AtomicUsize,
    pub kv_blocks_used: AtomicUsize,
    pub kv_blocks_cached: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    pub steps: AtomicU64,
    /// Prompt-lookup draft tokens fed, and kept (since the batcher was made).
    pub drafted: AtomicU64,
    pub drafts_kept: AtomicU64,
    /// Context shifts made (`Request::context_shift`).
    pub shifts: AtomicU64,
    /// One per sequence slot (llama-server's `/slots`).
    pub slots: Box<[SlotStat]>,
}

/// A sequence slot: whether a request runs in it, and that request's (or, when idle, the last
/// one's) progress. Written by the engine thread after each step.
#[derive(Default, Debug)]
pub struct SlotStat {
    pub busy: AtomicBool,
    /// The request's serial number in this batcher (0: none yet).
    pub task: AtomicU64,
    pub n_prompt: AtomicUsize,
    /// Prompt tokens computed so far (not taken from the prefix cache).
    pub n_prompt_processed: AtomicUsize,
    /// Prompt tokens taken from the prefix cache.
    pub n_prompt_cached: AtomicUsize,
    pub n_decoded: AtomicUsize,
    /// Tokens it may still generate.
    pub n_remain: AtomicUsize,
}

/// Finish a request that never ran.
pub fn finish_now(mut req: Request, reason: FinishReason) {
    let waited = req.arrived.elapsed().as_secs_f64();
    let f = Finish {
        reason,
        prompt_tokens: req.prompt.len(),
        cached_tokens: 0,
        completion_tokens: 0,
        stop_word: None,
        queue_secs: waited,
        ttft_secs: waited,
        tpot_secs: 0.0,
        dropped_tokens: 0,
    };
    (req.sink)(Event::Done(f));
}

/// Log-probability of `t` and the `n` most likely tokens under the model's distribution.
pub fn token_logprob(logits: &[f32], t: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let lse = max + logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    for (i, &l) in logits.iter().enumerate() {
        keep_top(&mut top, n, i as u32, l);
    }
    for x in top.iter_mut() {
        x.1 -= lse;
    }
    TokenLogprob { logprob: logits[t as usize] - lse, top }
}
