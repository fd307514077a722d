//! Iteration-level continuous batching (the serving loop, without HTTP).
//!
//! A [`Batcher`] owns the engine and runs on one dedicated thread. Each [`Batcher::step`] is
//! one forward pass that mixes the next token of every running sequence with chunks of the
//! prompts still being prefilled, under a per-step token budget (`n_batch`): decode tokens
//! first, then prompt chunks in arrival order (chunked prefill). New requests join between
//! steps; a finished or cancelled sequence leaves at once and its blocks are released (full
//! ones stay cached for prefix reuse).
//!
//! With a TPOT target ([`Batcher::set_tpot_target`]), prompt chunks shrink while sequences
//! are decoding, so that a step — which every running sequence waits for — stays within the
//! target: a step's time is modelled as `fixed + per_token · tokens`, both learnt online
//! (exponential averages of measured steps). Without running decodes, prompts get the whole
//! budget (TTFT matters then).
//!
//! Admission reserves blocks for the worst case (prompt + `max_tokens`), minus the blocks a
//! cached prefix provides, so an admitted request never runs out of KV cache mid-way and no
//! preemption is needed; a request that does not fit waits (first come, first served). A
//! request whose prompt opens with full blocks that a running sequence is still prefilling
//! (the choices of one `n > 1` request, concurrent requests under one long system prompt)
//! waits for that prefill and then attaches those blocks instead of computing them again;
//! the requests behind it are admitted meanwhile.
//!
//! Results reach the caller through each request's [`Sink`]: a token event per generated
//! token (text held back while it could still become a stop string) and one final event. A
//! sink returning `false` means the client has gone: the sequence is cancelled.
//!
//! A scored prompt (`Request::prompt_logprobs`) keeps every prompt row's logits and reports
//! each prompt token's log-probability. With prompt lookup on ([`Batcher::set_lookup`]), a
//! decoding sequence feeds a draft of tokens copied from its own history beside its next
//! token and keeps those the model samples anyway ([`lookup`]); the rest are cut from the KV
//! cache after the step.
//!
//! Embedding requests ([`EmbedRequest`], [`embed`]) share the sequences and the KV cache:
//! their passes of hidden states alternate with generation steps while both have work, and
//! admission takes the two kinds in arrival order.
//!
//! Invariant: with `EngineConfig::batch_invariant`, a request's tokens do not depend on what
//! else is batched with it (a test compares 16 concurrent requests with each alone), nor on
//! prompt-lookup drafts (a test compares requests with and without).

mod cost;
mod embed;
use crate::draft::{DraftModel, DraftRequest};
use crate::lookup;
mod request;
mod shift;

pub use cost::StepCost;
pub use embed::{EmbedRequest, EmbedSink};
pub use request::{finish_now, token_logprob, Event, Finish, FinishReason, Request, Sink, SlotAction, SlotOp, SlotStat, Stats, TokenLogprob, Work};

use crate::generate::TextOut;
use crate::constraint::{Mask, Vocabs};
use crate::sample::Sampler;
use crate::{Batch, Engine, Error, Tokenizer};
use corelm_core::kv::BLOCK;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

struct Running {
    req: Request,
    /// Its serial number (`SlotStat::task`).
    task: u64,
    seq: i32,
    sampler: Sampler,
    /// The constraint's mask (`Request::constraint`).
    mask: Option<Mask>,
    /// Prompt tokens in the KV cache.
    fed: usize,
    cached: usize,
    /// Token sampled and not yet fed.
    next: Option<u32>,
    generated: usize,
    text: TextOut,
    /// Blocks reserved at admission (its table never grows past this).
    reserved: usize,
    /// Prompt and generated tokens, for prompt-lookup drafts (empty when they are off).
    history: Vec<u32>,
    /// Tokens its context shifts dropped (`Request::context_shift`).
    dropped: usize,
    /// How often its draft tokens are kept.
    accept: lookup::Acceptance,
    admitted: Instant,
    first: Option<Instant>,
    last: Instant,
}

pub struct Batcher {
    engine: Engine,
    tok: Arc<Tokenizer>,
    /// The vocabulary as the constraints see it (`Request::constraint`).
    vocabs: Vocabs,
    waiting: VecDeque<Request>,
    slots: Vec<Option<Running>>,
    batch: Batch,
    /// Each batch row with logits, in row order: its sequence and what it holds.
    rows: Vec<(i32, Row)>,
    /// Most draft tokens a decoding sequence feeds per step ([`lookup`]; 0: off), and whether
    /// fewer when they do not pay.
    lookup: usize,
    lookup_adaptive: bool,
    /// A sequence's draft (reused each step).
    draft: Vec<u32>,
    /// A draft model proposing the drafts instead ([`Batcher::set_draft_model`]); per slot,
    /// its proposal for this step (empty where the slot is not decoding; reused each step).
    model: Option<DraftModel>,
    proposals: Vec<Vec<u32>>,
    /// Sequences to cut back to their fed tokens after a step's drafts (reused each step).
    cuts: Vec<(i32, usize)>,
    /// Decode steps' time by their rows (how far drafting pays).
    row_cost: lookup::RowCost,
    /// Prefilling slots by admission time (reused each step).
    order: Vec<(Instant, usize)>,
    done: Vec<(i32, FinishReason)>,
    stats: Arc<Stats>,
    tpot_target: Option<f64>,
    cost: StepCost,
    embeds: embed::Embeds,
    /// The next step is an embedding pass if embeddings have work (they alternate).
    embed_turn: bool,
    /// Requests admitted so far.
    tasks: u64,
}

/// What a batch row with logits holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    /// A decode token, or a prompt's last: the next token is sampled from it.
    Next,
    /// Prompt position `p` of a scored prompt (`Request::prompt_logprobs`).
    Prompt(usize),
    /// A draft token ([`lookup`]), kept if the row before it samples it.
    Draft(u32),
}

impl Batcher {
    /// `engine`'s `n_seq_max` is the number of running sequences, its `n_batch` the per-step
    /// token budget.
    pub fn new(engine: Engine, tok: Arc<Tokenizer>) -> Batcher {
        let n_seq = engine.config().n_seq_max;
        let nb = engine.config().n_batch;
        let stats = Arc::new(Stats { slots: (0..n_seq).map(|_| SlotStat::default()).collect(), ..Stats::default() });
        stats.kv_blocks_total.store(engine.blocks().n_blocks(), Ordering::Relaxed);
        Batcher {
            engine,
            vocabs: Vocabs::default(),
            tok,
            waiting: VecDeque::new(),
            slots: (0..n_seq).map(|_| None).collect(),
            batch: Batch::with_capacity(nb),
            rows: Vec::with_capacity(nb),
            lookup: 0,
            lookup_adaptive: true,
            draft: Vec::with_capacity(nb),
            model: None,
            proposals: vec![Vec::new(); n_seq],
            cuts: Vec::with_capacity(n_seq),
            row_cost: lookup::RowCost::default(),
            order: Vec::with_capacity(n_seq),
            done: Vec::with_capacity(n_seq),
            stats,
            tpot_target: None,
            // A first guess (refined after a few steps): 5 ms per step plus 5 ms per token.
            cost: StepCost { fixed: 0.005, per_token: 0.005 },
            embeds: embed::Embeds::new(nb),
            embed_turn: false,
            tasks: 0,
        }
    }

    /// Keep steps that carry decode tokens within `secs` (None: prompt chunks always get the
    /// whole token budget).
    pub fn set_tpot_target(&mut self, secs: Option<f64>) {
        self.tpot_target = secs.filter(|s| *s > 0.0);
    }

    /// Prompt-lookup speculative decoding: each decoding sequence feeds up to `n` draft tokens
    /// per step ([`lookup`]), as many as pay by the timed step costs when `adaptive`, else
    /// always `n` where its history has them; 0 turns it off.
    pub fn set_lookup(&mut self, n: usize, adaptive: bool) {
        (self.lookup, self.lookup_adaptive) = (n, adaptive);
    }

    /// Speculative decoding with a draft model ([`crate::draft`]): each decoding sequence
    /// feeds the model's proposal beside its next token (in place of prompt lookup's).
    pub fn set_draft_model(&mut self, model: DraftModel) {
        let n = model.params().n_max;
        self.proposals.iter_mut().for_each(|p| p.reserve(n));
        self.model = Some(model);
    }

    pub fn draft_model(&self) -> Option<&DraftModel> {
        self.model.as_ref()
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Longest prompt + generation one request may have.
    pub fn max_context(&self) -> usize {
        self.engine.config().n_ctx.min(self.engine.blocks().n_blocks() * BLOCK)
    }

    /// Queue a request. Requests that can never fit are refused here, and handed back with
    /// the reason (so the caller can still answer on the request's sink).
    #[allow(clippy::result_large_err)]
    pub fn submit(&mut self, req: Request) -> Result<(), (Request, Error)> {
        let mut total = req.prompt.len() + req.max_tokens;
        // With context shift, an answer past the context keeps the sequence within it.
        if let Some(limit) = req.context_shift.map(|c| c.limit(self.engine.config().n_ctx)).filter(|&l| req.prompt.len() < l) {
            total = total.min(limit);
        }
        if req.prompt.is_empty() {
            return Err((req, Error::Batch("empty prompt".into())));
        }
        if total > self.max_context() {
            let n_ctx = self.max_context();
            return Err((req, Error::PromptTooLong { prompt: total, n_ctx }));
        }
        if let Err(e) = req.sampling.validate() {
            return Err((req, e));
        }
        self.waiting.push_back(req);
        self.publish();
        Ok(())
    }

    /// Queue an embedding request; one that can never run is handed back with the reason.
    #[allow(clippy::result_large_err)]
    pub fn submit_embed(&mut self, req: EmbedRequest) -> Result<(), (EmbedRequest, String)> {
        let (ctx, n_vocab) = (self.max_context(), self.engine.hyper().n_vocab);
        self.embeds.submit(req, ctx, n_vocab)?;
        self.publish();
        Ok(())
    }

    /// Nothing running and nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.slots.iter().all(Option::is_none) && self.embeds.is_empty()
    }

    /// Requests not yet started (generation and embedding).
    pub fn n_waiting(&self) -> usize {
        self.waiting.len() + self.embeds.n_waiting()
    }

    pub fn n_running(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    fn publish(&self) {
        let b = self.engine.blocks();
        self.stats.waiting.store(self.n_waiting(), Ordering::Relaxed);
        self.stats.running.store(self.n_running(), Ordering::Relaxed);
        self.stats.kv_blocks_used.store(b.used(), Ordering::Relaxed);
        self.stats.kv_blocks_cached.store(b.cached(), Ordering::Relaxed);
        for (slot, stat) in self.slots.iter().zip(self.stats.slots.iter()) {
            stat.busy.store(slot.is_some(), Ordering::Relaxed);
            if let Some(r) = slot {
                record(stat, r);
            }
        }
    }

    /// Blocks promised to running sequences and embedding lanes and not yet taken.
    fn outstanding(&self) -> usize {
        self.generation_outstanding() + self.embeds.outstanding(&self.engine)
    }

    fn generation_outstanding(&self) -> usize {
        self.slots.iter().flatten().map(|r| r.reserved - self.engine.blocks().table(r.seq as usize).len()).sum()
    }

    /// `budget` cut to the tokens a step may carry within the TPOT target, if one is set, but
    /// at least `floor` (so work always progresses).
    fn within_target(&self, budget: usize, floor: usize) -> usize {
        match self.tpot_target {
            Some(t) => budget.min(self.cost.tokens_within(t).max(floor)),
            None => budget,
        }
    }

    /// A sequence neither a generation nor an embedding lane holds.
    fn free_seq(&self) -> Option<usize> {
        free_seq(&self.slots, &self.embeds)
    }

    /// Start embedding inputs on free sequences while their blocks fit.
    fn start_embeds(&mut self) {
        let others = self.generation_outstanding();
        let slots = &self.slots;
        self.embeds.start(&mut self.engine, |e| free_seq(slots, e), others);
    }

    /// Whether `prompt` had better wait for a running sequence still prefilling its opening:
    /// their prompts share more full blocks than that sequence has in the cache yet. (Only
    /// full blocks are shared, and the last prompt token is always computed.)
    fn awaits_shared_prefill(&self, prompt: &[u32]) -> bool {
        let mine = &prompt[..prompt.len().saturating_sub(1)];
        self.slots.iter().flatten().filter(|r| r.req.prompt_logprobs.is_none()).any(|r| {
            let theirs = &r.req.prompt;
            r.fed < theirs.len() && theirs.iter().zip(mine).take_while(|(a, b)| a == b).count() / BLOCK > r.fed / BLOCK
        })
    }

    /// Move waiting requests into free slots while their worst case fits, passing over those
    /// that wait for a shared prefill ([`Self::awaits_shared_prefill`]); embedding inputs
    /// that arrived before the first waiting generation request start first.
    fn admit(&mut self) {
        if let Some(e) = self.embeds.first_waiting() {
            if self.waiting.front().is_none_or(|g| e <= g.arrived) {
                self.start_embeds();
            }
        }
        self.admit_generation();
        self.start_embeds();
    }

    fn admit_generation(&mut self) {
        let mut at = 0;
        while let Some(slot) = self.free_seq() {
            let Some(next) = self.waiting.get(at) else { break };
            // A scored prompt is computed whole: it neither waits for nor takes cached blocks.
            if next.prompt_logprobs.is_none() && self.awaits_shared_prefill(&next.prompt) {
                at += 1;
                continue;
            }
            // Other LoRA scales: switched to once nothing runs; until then nothing after it
            // is admitted (it keeps its place).
            if let Some(want) = next.lora.as_deref().filter(|&w| !self.engine.lora_scales_are(w)) {
                if self.slots.iter().any(Option::is_some) || self.embeds.has_lanes() {
                    break;
                }
                if let Err(e) = self.engine.set_lora_scales(want) {
                    finish_now(self.waiting.remove(at).expect("looked at above"), FinishReason::Error(e.to_string()));
                    continue;
                }
            }
            let req = self.waiting.remove(at).expect("looked at above");
            let seq = slot as i32;
            let cached = if req.prompt_logprobs.is_some() { 0 } else { self.engine.attach_prefix(seq, &req.prompt) };
            let have = self.engine.blocks().table(slot).len();
            // With context shift an answer may pass the context; its table never does.
            let n_ctx = self.engine.config().n_ctx;
            let limit = req.context_shift.map_or(n_ctx, |c| c.limit(n_ctx));
            let reserved = (req.prompt.len() + req.max_tokens).min(limit).div_ceil(BLOCK);
            let fresh = reserved - have;
            if fresh + self.outstanding() > self.engine.blocks().available() {
                self.engine.clear_seq(seq);
                self.waiting.insert(at, req);
                break;
            }
            let mut sampler = match Sampler::new(req.sampling.clone(), self.engine.hyper().n_vocab) {
                Ok(s) => s,
                Err(e) => {
                    self.engine.clear_seq(seq);
                    finish_now(req, FinishReason::Error(e.to_string()));
                    continue;
                }
            };
            for &t in &req.prompt {
                sampler.accept(t);
            }
            let now = Instant::now();
            let text = TextOut::new(req.stop.clone(), req.max_tokens.min(4096) * 8);
            let mut history = vec![];
            if self.lookup > 0 || self.model.is_some() {
                history.reserve_exact((req.prompt.len() + req.max_tokens).min(4 * self.engine.config().n_ctx));
                history.extend_from_slice(&req.prompt);
            }
            if let Some(c) = &req.constraint {
                self.vocabs.prepare(c, &self.tok);
            }
            self.tasks += 1;
            self.slots[slot] = Some(Running {
                mask: req.constraint.as_ref().map(Mask::new),
                req,
                task: self.tasks,
                seq,
                sampler,
                fed: cached,
                cached,
                next: None,
                generated: 0,
                text,
                reserved,
                history,
                dropped: 0,
                accept: lookup::Acceptance(lookup::Acceptance::PRIOR),
                admitted: now,
                first: None,
                last: now,
            });
        }
    }

    /// The draft model's proposals for this step's decoding sequences into `proposals[slot]`,
    /// each within its answer's room and the step's `room`.
    fn propose(&mut self, room: usize) {
        let Some(model) = self.model.as_mut() else { return };
        let slots = &self.slots;
        let req = |i: usize| match slots[i].as_ref().filter(|r| r.next.is_some()) {
            Some(r) => DraftRequest { seq: r.seq, history: &r.history, max: r.req.max_tokens.saturating_sub(r.generated + 1).min(room) },
            None => DraftRequest { seq: i as i32, history: &[], max: 0 },
        };
        model.draft(req, &mut self.proposals);
    }

    /// One iteration: admit, run one forward pass, sample, deliver events. Returns whether any
    /// work was done.
    pub fn step(&mut self) -> bool {
        self.admit();
        self.shift_full();
        let budget = self.engine.config().n_batch;
        let generating = self.slots.iter().any(Option::is_some);
        if self.embeds.has_lanes() && (self.embed_turn || !generating) {
            // An embedding pass, held to the TPOT budget while sequences decode.
            self.embed_turn = false;
            let budget = if generating { self.within_target(budget, 16) } else { budget };
            self.embeds.step(&mut self.engine, budget);
            self.stats.steps.fetch_add(1, Ordering::Relaxed);
            self.publish();
            return true;
        }
        self.embed_turn = self.embeds.has_lanes();
        self.batch.clear();
        self.rows.clear();
        // Decode tokens of running sequences first: they are latency-bound. Then each one's
        // draft, while the budget leaves room for every decode token.
        let mut left = self.slots.iter().flatten().filter(|r| r.next.is_some()).count();
        let (seqs, fit) = (left, self.row_cost.fit().filter(|_| self.lookup_adaptive));
        self.propose(budget.saturating_sub(left));
        for r in self.slots.iter_mut().flatten() {
            if self.batch.len() < budget {
                if let Some(t) = r.next.take() {
                    left -= 1;
                    let pos = self.engine.seq_len(r.seq);
                    self.batch.add(t, pos as i32, r.seq, true);
                    self.rows.push((r.seq, Row::Next));
                    // Drafts no longer than the answer's room (the reserved blocks) or the budget.
                    let room = budget.saturating_sub(self.batch.len() + left);
                    let n_ctx = self.engine.config().n_ctx;
                    // With context shift, one short of its limit: it shifts as without drafts.
                    let room = room.min(r.req.context_shift.map_or(n_ctx + 1, |c| c.limit(n_ctx)).saturating_sub(pos + 2));
                    let most = self.lookup.min(r.req.max_tokens.saturating_sub(r.generated + 1)).min(room);
                    if self.model.is_some() {
                        let p = &self.proposals[r.seq as usize];
                        self.draft.clear();
                        self.draft.extend_from_slice(&p[..p.len().min(room)]);
                    } else {
                        // Until steps of several sizes are timed, the longest drafts (to time them).
                        let len = fit.map_or(most, |c| lookup::best_len(r.accept.0, c, seqs, most));
                        lookup::draft(&r.history, len, &mut self.draft);
                    }
                    for (i, &d) in self.draft.iter().enumerate() {
                        self.batch.add(d, (pos + 1 + i) as i32, r.seq, true);
                        self.rows.push((r.seq, Row::Draft(d)));
                    }
                    self.stats.drafted.fetch_add(self.draft.len() as u64, Ordering::Relaxed);
                }
            }
        }
        // Then prompt chunks, oldest first; while sequences decode, only as many prompt tokens
        // as keep the step within the TPOT target (at least 16, so prompts always progress).
        let n_decode = self.batch.len();
        let budget = if n_decode > 0 { self.within_target(budget, n_decode + 16) } else { budget };
        self.order.clear();
        for (i, r) in self.slots.iter().enumerate() {
            if let Some(r) = r {
                if r.fed < r.req.prompt.len() {
                    self.order.push((r.admitted, i));
                }
            }
        }
        self.order.sort_unstable();
        for &(_, i) in &self.order {
            let room = budget.saturating_sub(self.batch.len());
            if room == 0 {
                break;
            }
            let r = self.slots[i].as_mut().expect("slot listed above");
            let end = (r.fed + room).min(r.req.prompt.len());
            let start_pos = self.engine.seq_len(r.seq);
            let scored = r.req.prompt_logprobs.is_some();
            for (j, &t) in r.req.prompt[r.fed..end].iter().enumerate() {
                let p = r.fed + j;
                let last = p + 1 == r.req.prompt.len();
                self.batch.add(t, (start_pos + j) as i32, r.seq, last || scored);
                if last || scored {
                    self.rows.push((r.seq, if scored { Row::Prompt(p) } else { Row::Next }));
                }
            }
            r.fed = end;
        }
        if self.batch.is_empty() {
            self.publish();
            return false;
        }
        let t0 = Instant::now();
        let result = self.engine.decode(&self.batch);
        let secs = t0.elapsed().as_secs_f64();
        self.cost.observe(self.batch.len(), secs);
        if self.batch.len() == n_decode {
            self.row_cost.observe(n_decode, secs);
        }
        self.done.clear();
        match result {
            Err(e) => {
                // Not expected (admission reserved the blocks): fail the sequences involved.
                let msg = e.to_string();
                for &s in self.batch.seq.iter() {
                    if !self.done.iter().any(|d| d.0 == s) {
                        self.done.push((s, FinishReason::Error(msg.clone())));
                    }
                }
            }
            Ok(logits) => {
                // Per sequence: drafts fed, drafts kept so far, and whether its run of them ended.
                let (mut fed, mut kept, mut cut) = (0usize, 0usize, false);
                for (row, &(seq, what)) in self.rows.iter().enumerate() {
                    let r = self.slots[seq as usize].as_mut().expect("row of a running sequence");
                    if self.done.iter().any(|d| d.0 == seq) {
                        continue; // finished at an earlier row of this step
                    }
                    let l = logits.row(row);
                    fed += usize::from(matches!(what, Row::Draft(_)));
                    let reason = match what {
                        Row::Prompt(p) if !score_prompt(r, p, l) => Some(FinishReason::Cancelled),
                        Row::Prompt(p) if p + 1 < r.req.prompt.len() => None,
                        Row::Draft(_) if cut => None,
                        // The token sampled at the row before was this draft token: it is fed.
                        Row::Draft(d) if r.next == Some(d) => {
                            r.next = None;
                            kept += 1;
                            sample_one(r, l, &self.tok, &self.vocabs)
                        }
                        Row::Draft(_) => {
                            cut = true;
                            None
                        }
                        // The prompt's last row, or a decode row: the next token.
                        _ if r.req.max_tokens == 0 => Some(FinishReason::Length),
                        _ => {
                            (fed, kept, cut) = (0, 0, false);
                            sample_one(r, l, &self.tok, &self.vocabs)
                        }
                    };
                    if let Some(reason) = reason {
                        // Its drafts kept so far count (its later rows are passed over).
                        self.stats.drafts_kept.fetch_add(if matches!(what, Row::Draft(_)) { kept as u64 } else { 0 }, Ordering::Relaxed);
                        self.done.push((seq, reason));
                    }
                    // After a sequence's last row: the rejected drafts leave the KV cache.
                    let ends = self.rows.get(row + 1).is_none_or(|n| n.0 != seq || !matches!(n.1, Row::Draft(_)));
                    if ends && !self.done.iter().any(|d| d.0 == seq) && matches!(what, Row::Next | Row::Draft(_)) {
                        self.stats.drafts_kept.fetch_add(kept as u64, Ordering::Relaxed);
                        r.accept.observe(fed, kept);
                        self.cuts.push((seq, r.req.prompt.len() + r.generated - 1 - r.dropped));
                    }
                }
            }
        }
        for &(seq, fed) in &self.cuts {
            if self.engine.seq_len(seq) > fed {
                self.engine.truncate_seq(seq, fed);
            }
        }
        self.cuts.clear();
        for i in 0..self.done.len() {
            let (seq, reason) = self.done[i].clone();
            self.end(seq, reason);
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.publish();
        true
    }

    /// Release `seq`'s running request and deliver its end.
    fn end(&mut self, seq: i32, reason: FinishReason) {
        if let Some(r) = self.slots[seq as usize].take() {
            self.engine.clear_seq(seq);
            if let Some(m) = self.model.as_mut() {
                m.forget(seq);
            }
            record(&self.stats.slots[seq as usize], &r);
            self.publish(); // before the client hears of the end
            finish(r, reason);
        }
    }

    /// Cancel everything (shutdown).
    pub fn cancel_all(&mut self) {
        while let Some(req) = self.waiting.pop_front() {
            finish_now(req, FinishReason::Cancelled);
        }
        self.embeds.cancel_all(&mut self.engine, "the server is shutting down");
        for s in 0..self.slots.len() {
            if let Some(r) = self.slots[s].take() {
                self.engine.clear_seq(r.seq);
                finish(r, FinishReason::Cancelled);
            }
        }
        self.publish();
    }
}

/// A running request's progress into its slot's counters.
fn record(stat: &SlotStat, r: &Running) {
    stat.task.store(r.task, Ordering::Relaxed);
    stat.n_prompt.store(r.req.prompt.len(), Ordering::Relaxed);
    stat.n_prompt_processed.store(r.fed.min(r.req.prompt.len()) - r.cached, Ordering::Relaxed);
    stat.n_prompt_cached.store(r.cached, Ordering::Relaxed);
    stat.n_decoded.store(r.generated, Ordering::Relaxed);
    stat.n_remain.store(r.req.max_tokens - r.generated, Ordering::Relaxed);
}

/// A sequence neither a generation (`slots`) nor an embedding lane holds.
fn free_seq(slots: &[Option<Running>], embeds: &embed::Embeds) -> Option<usize> {
    (0..slots.len()).find(|&s| slots[s].is_none() && !embeds.holds(s))
}

/// Deliver the prompt events of the row at prompt position `p` of a scored prompt (its logits
/// `logits` score token `p + 1`; position 0 also brings the first token); `false` when the
/// client has gone.
fn score_prompt(r: &mut Running, p: usize, logits: &[f32]) -> bool {
    let Request { prompt, sink, prompt_logprobs, .. } = &mut r.req;
    let n = prompt_logprobs.unwrap_or(0);
    if p == 0 && !sink(Event::Prompt { id: prompt[0], logprob: None }) {
        return false;
    }
    match prompt.get(p + 1) {
        Some(&t) => sink(Event::Prompt { id: t, logprob: Some(token_logprob(logits, t, n)) }),
        None => true,
    }
}

/// Sample the next token of `r` from its logits row and deliver it; `Some` when it finished.
fn sample_one(r: &mut Running, logits: &[f32], tok: &Tokenizer, vocabs: &Vocabs) -> Option<FinishReason> {
    let t = match &mut r.mask {
        None => r.sampler.sample(logits),
        Some(m) => match m.sample(vocabs, tok, &mut r.sampler, logits) {
            Ok(t) => t,
            Err(e) => return Some(FinishReason::Error(e.to_string())),
        },
    };
    let now = Instant::now();
    if r.first.is_none() {
        r.first = Some(now);
    }
    r.last = now;
    if tok.is_eog(t) && !r.req.ignore_eos {
        // A scored prompt's reader counts on one answer token's score (lm-evaluation-harness
        // drops the last), so the end token is reported there, without text.
        if let (Some(n), Some(_)) = (r.req.logprobs, r.req.prompt_logprobs) {
            let logprob = Some(token_logprob(logits, t, n));
            if !(r.req.sink)(Event::Token { id: t, text: String::new(), logprob }) {
                return Some(FinishReason::Cancelled);
            }
        }
        return Some(FinishReason::Stop);
    }
    r.sampler.accept(t);
    r.generated += 1;
    if r.history.capacity() > 0 {
        r.history.push(t);
    }
    let logprob = r.req.logprobs.map(|n| match r.req.chain_probs {
        false => token_logprob(logits, t, n),
        true => {
            let (p, top) = r.sampler.chain_probs(t, n);
            TokenLogprob { logprob: p.ln(), top: top.into_iter().map(|(id, q)| (id, q.ln())).collect() }
        }
    });
    let (piece, stopped) = r.text.push(tok.piece(t));
    let text = piece.to_string();
    if !(r.req.sink)(Event::Token { id: t, text, logprob }) {
        return Some(FinishReason::Cancelled);
    }
    // A JSON value just closed, or a grammar that can take nothing more, ends the answer.
    if stopped || r.mask.as_mut().is_some_and(|m| m.closes_with(vocabs, tok, t)) {
        return Some(FinishReason::Stop);
    }
    if r.generated >= r.req.max_tokens {
        return Some(FinishReason::Length);
    }
    r.next = Some(t);
    None
}

fn finish(mut r: Running, reason: FinishReason) {
    if matches!(reason, FinishReason::Stop | FinishReason::Length) {
        let rest = r.text.finish().to_string();
        if !rest.is_empty() {
            (r.req.sink)(Event::Text(rest));
        }
    }
    let arrived = r.req.arrived;
    let first = r.first.unwrap_or_else(Instant::now);
    let tpot = if r.generated > 1 { (r.last - first).as_secs_f64() / (r.generated - 1) as f64 } else { 0.0 };
    let f = Finish {
        reason,
        prompt_tokens: r.req.prompt.len(),
        cached_tokens: r.cached,
        completion_tokens: r.generated,
        stop_word: r.text.stop_word().map(str::to_string),
        queue_secs: (r.admitted - arrived).as_secs_f64(),
        ttft_secs: (first - arrived).as_secs_f64(),
        tpot_secs: tpot,
        dropped_tokens: r.dropped,
    };
    (r.req.sink)(Event::Done(f));
}

/// The engine thread: take requests from `rx` between steps, step while there is work, block
/// when idle. Returns when every sender is gone and all work is finished.
pub fn run(mut batcher: Batcher, rx: std::sync::mpsc::Receiver<Work>) {
    use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
    loop {
        if batcher.is_idle() {
            match rx.recv() {
                Ok(req) => batcher.take(req),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(req) => batcher.take(req),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        if !batcher.step() && !batcher.is_idle() {
            // Waiting for blocks that nobody is about to free: wait for news instead of spinning.
            match rx.recv_timeout(std::time::Duration::from_millis(5)) {
                Ok(req) => batcher.take(req),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    batcher.cancel_all();
                    return;
                }
            }
        }
    }
}

impl Batcher {
    /// [`Batcher::submit`], finishing the request with an error event when it is refused.
    pub fn submit_or_fail(&mut self, req: Request) {
        if let Err((req, e)) = self.submit(req) {
            finish_now(req, FinishReason::Error(e.to_string()));
        }
    }

    /// Queue `work`, answering at once what is refused.
    pub fn take(&mut self, work: Work) {
        match work {
            Work::Generate(req) => self.submit_or_fail(*req),
            Work::Embed(req) => {
                if let Err((req, e)) = self.submit_embed(req) {
                    req.sink.answer(Err(e));
                }
            }
            Work::Slot(a) => {
                let r = self.slot_action(a.slot, &a.op, &a.model);
                (a.reply)(r);
            }
        }
    }

    /// Save, restore or erase slot `slot`'s KV cache (`Engine::save_slot`): a running slot
    /// saves the whole blocks it holds so far; it cannot be erased while it runs.
    fn slot_action(&mut self, slot: usize, op: &SlotOp, model: &str) -> Result<crate::engine::SlotIo, Error> {
        let n = self.slots.len();
        if slot >= n {
            return Err(Error::Slot(format!("there are only {n} slots")));
        }
        let busy = self.slots[slot].is_some() || self.embeds.holds(slot);
        let r = match op {
            SlotOp::Save(path) => self.engine.save_slot(slot as i32, path, model),
            SlotOp::Restore(path) => self.engine.restore_slot(path, model),
            SlotOp::Erase if busy => Err(Error::Slot("it is processing a request".into())),
            SlotOp::Erase => Ok(crate::engine::SlotIo { n_tokens: self.engine.erase_slot(slot as i32), n_bytes: 0 }),
        };
        self.publish();
        r
    }
}
