//! Embedding requests in the serving loop.
//!
//! An [`EmbedRequest`] carries one or more tokenized inputs. Each input, once started, is a
//! *lane*: it holds one of the batcher's sequences (the same ones generation uses) and the
//! KV blocks its tokens need, reserved when it starts. A pass of hidden states
//! (`Engine::decode_hidden`) takes lanes' next tokens in start order under the step's token
//! budget, so many short inputs share one pass and a long one spans several; an input's rows
//! are pooled in token order ([`crate::embed::Pooled`]) and its lane ends, releasing the
//! sequence, when its last token has been through. The request is answered once, when every
//! input has its vector, or with the first error.
//!
//! The batcher alternates: while both kinds have work, an embedding pass follows each
//! generation step, and it is held to the same TPOT budget as prompt chunks.
//!
//! Invariant: a lane's sequence is never a running generation's, and blocks a lane reserved
//! are counted by the batcher's admission like a generation's.

use crate::embed::{Pooled, Pooling};
use crate::{Batch, Engine};
use corelm_core::kv::BLOCK;
use std::collections::VecDeque;
use std::time::Instant;

/// Inputs (token ids) in, one vector per input out.
pub struct EmbedRequest {
    pub inputs: Vec<Vec<u32>>,
    pub pooling: Pooling,
    /// Scale each vector to unit length ([`crate::embed::normalize`]).
    pub normalize: bool,
    pub sink: Box<dyn EmbedSink>,
    pub arrived: Instant,
}

/// Where an embedding request's answer goes.
pub trait EmbedSink: Send {
    /// Whether anybody still waits for the answer (`false`: the request is dropped).
    fn waiting(&self) -> bool;
    /// The vectors in input order, or why there are none.
    fn answer(self: Box<Self>, result: Result<Vec<Vec<f32>>, String>);
}

struct Job {
    id: u64,
    req: EmbedRequest,
    out: Vec<Vec<f32>>,
    /// Inputs started (as lanes) and finished.
    started: usize,
    finished: usize,
}

struct Lane {
    job: u64,
    input: usize,
    seq: i32,
    /// Tokens in the KV cache (cached prefix included).
    fed: usize,
    pooled: Pooled,
    reserved: usize,
}

/// The batcher's embedding work: requests in arrival order, their inputs in flight.
pub(super) struct Embeds {
    jobs: VecDeque<Job>,
    lanes: Vec<Lane>,
    next_id: u64,
    batch: Batch,
    /// Lane of each output row of the pass, in row order.
    rows: Vec<usize>,
}

impl Embeds {
    pub fn new(n_batch: usize) -> Embeds {
        Embeds { jobs: VecDeque::new(), lanes: Vec::new(), next_id: 0, batch: Batch::with_capacity(n_batch), rows: Vec::with_capacity(n_batch) }
    }

    /// Queue `req`, or hand it back with why it can never run (`max_context`: the longest
    /// input a lane can hold).
    #[allow(clippy::result_large_err)]
    pub fn submit(&mut self, req: EmbedRequest, max_context: usize, n_vocab: usize) -> Result<(), (EmbedRequest, String)> {
        if req.inputs.is_empty() {
            return Err((req, "no input to embed".into()));
        }
        for (i, input) in req.inputs.iter().enumerate() {
            let why = if input.is_empty() {
                Some("has no tokens".to_string())
            } else if input.len() > max_context {
                Some(format!("has {} tokens; the context holds {max_context}", input.len()))
            } else {
                input.iter().find(|&&t| t as usize >= n_vocab).map(|t| format!("holds token id {t}, outside the vocabulary of {n_vocab}"))
            };
            if let Some(why) = why {
                return Err((req, format!("input {i} {why}")));
            }
        }
        let n = req.inputs.len();
        self.jobs.push_back(Job { id: self.next_id, req, out: vec![Vec::new(); n], started: 0, finished: 0 });
        self.next_id += 1;
        Ok(())
    }

    /// When the oldest request with inputs not yet started arrived.
    pub fn first_waiting(&self) -> Option<Instant> {
        self.jobs.iter().find(|j| j.started < j.req.inputs.len()).map(|j| j.req.arrived)
    }

    /// Requests none of whose inputs has started.
    pub fn n_waiting(&self) -> usize {
        self.jobs.iter().filter(|j| j.started == 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Inputs in flight (each holds a sequence).
    pub fn has_lanes(&self) -> bool {
        !self.lanes.is_empty()
    }

    pub fn holds(&self, seq: usize) -> bool {
        self.lanes.iter().any(|l| l.seq as usize == seq)
    }

    /// Blocks promised to lanes and not yet taken.
    pub fn outstanding(&self, engine: &Engine) -> usize {
        self.lanes.iter().map(|l| l.reserved - engine.blocks().table(l.seq as usize).len()).sum()
    }

    /// Start waiting inputs, in arrival order, on the sequences `free` offers while their
    /// blocks fit beside `others` (blocks promised to generation and not yet taken).
    pub fn start(&mut self, engine: &mut Engine, mut free: impl FnMut(&Embeds) -> Option<usize>, others: usize) {
        let n_embd = engine.hyper().n_embd;
        while let Some(j) = self.jobs.iter().position(|j| j.started < j.req.inputs.len()) {
            let Some(seq) = free(self) else { break };
            let job = &self.jobs[j];
            let input = &job.req.inputs[job.started];
            let pooling = job.req.pooling;
            // Only the last row is read under `Last`: a cached prefix can stand for the rest.
            let cached = if pooling == Pooling::Last { engine.attach_prefix(seq as i32, input) } else { 0 };
            let reserved = pooling.needed(input.len(), engine.config().batch_invariant).div_ceil(BLOCK);
            let fresh = reserved - engine.blocks().table(seq).len();
            if fresh + others + self.outstanding(engine) > engine.blocks().available() {
                engine.clear_seq(seq as i32);
                break;
            }
            let lane = Lane { job: job.id, input: job.started, seq: seq as i32, fed: cached, pooled: Pooled::new(pooling, n_embd), reserved };
            self.jobs[j].started += 1;
            self.lanes.push(lane);
        }
    }

    /// One pass over the lanes' next tokens, at most `budget` of them.
    pub fn step(&mut self, engine: &mut Engine, budget: usize) {
        self.drop_abandoned(engine);
        let invariant = engine.config().batch_invariant;
        self.batch.clear();
        self.rows.clear();
        for (li, lane) in self.lanes.iter_mut().enumerate() {
            let room = budget.saturating_sub(self.batch.len());
            if room == 0 {
                break;
            }
            let job = self.jobs.iter().find(|j| j.id == lane.job).expect("a lane's request is queued");
            let input = &job.req.inputs[lane.input];
            let end = (lane.fed + room).min(job.req.pooling.needed(input.len(), invariant));
            for (i, &t) in input.iter().enumerate().take(end).skip(lane.fed) {
                let wanted = job.req.pooling.wants(i, input.len());
                self.batch.add(t, i as i32, lane.seq, wanted);
                if wanted {
                    self.rows.push(li);
                }
            }
            lane.fed = end;
        }
        if self.batch.is_empty() {
            return;
        }
        match engine.decode_hidden(&self.batch) {
            Ok(hidden) => {
                for (r, &li) in self.rows.iter().enumerate() {
                    self.lanes[li].pooled.add(hidden.row(r));
                }
            }
            Err(e) => {
                // Not expected (the lanes reserved their blocks): fail the requests involved.
                let msg = e.to_string();
                let jobs: Vec<u64> = self.batch.seq.iter().filter_map(|&s| self.lanes.iter().find(|l| l.seq == s)).map(|l| l.job).collect();
                for id in jobs {
                    self.fail(engine, id, &msg);
                }
                return;
            }
        }
        // Lanes whose input has been through end; their requests answer when complete.
        let mut li = 0;
        while li < self.lanes.len() {
            let lane = &self.lanes[li];
            let j = self.jobs.iter().position(|j| j.id == lane.job).expect("a lane's request is queued");
            let req = &self.jobs[j].req;
            if lane.fed < req.pooling.needed(req.inputs[lane.input].len(), invariant) {
                li += 1;
                continue;
            }
            let lane = self.lanes.remove(li);
            engine.clear_seq(lane.seq);
            let job = &mut self.jobs[j];
            job.out[lane.input] = lane.pooled.finish(job.req.normalize);
            job.finished += 1;
            if job.finished == job.req.inputs.len() {
                let job = self.jobs.remove(j).expect("found above");
                job.req.sink.answer(Ok(job.out));
            }
        }
    }

    /// Requests nobody waits for any more leave, their lanes with them.
    fn drop_abandoned(&mut self, engine: &mut Engine) {
        while let Some(j) = self.jobs.iter().position(|j| !j.req.sink.waiting()) {
            let job = self.jobs.remove(j).expect("found above");
            self.end_lanes(engine, job.id);
        }
    }

    fn end_lanes(&mut self, engine: &mut Engine, job: u64) {
        self.lanes.retain(|l| {
            if l.job == job {
                engine.clear_seq(l.seq);
            }
            l.job != job
        });
    }

    fn fail(&mut self, engine: &mut Engine, job: u64, msg: &str) {
        self.end_lanes(engine, job);
        if let Some(j) = self.jobs.iter().position(|j| j.id == job) {
            let job = self.jobs.remove(j).expect("found above");
            job.req.sink.answer(Err(msg.to_string()));
        }
    }

    /// Answer every request with `msg` (shutdown).
    pub fn cancel_all(&mut self, engine: &mut Engine, msg: &str) {
        while let Some(job) = self.jobs.front().map(|j| j.id) {
            self.fail(engine, job, msg);
        }
    }
}
