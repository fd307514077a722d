//! `llama-bench`-style measurements: prompt processing (pp) and generation (tg) tokens/s over
//! repetitions, plus the memory bandwidth of this machine and the decode roofline it implies
//! (tokens/s ≤ bandwidth ÷ bytes read per token).

use crate::{Batch, Engine, Error};
use corelm_core::{PoolConfig, Profile, ThreadPool, Worker};
use std::time::Instant;

/// One measured test, with llama-bench's field names.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchResult {
    pub model_filename: String,
    pub model_type: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Tokens already in the context when the test starts (llama-bench's `-d`).
    pub n_depth: usize,
    pub n_threads: usize,
    pub n_batch: usize,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ts: Vec<f64>,
    pub samples_ns: Vec<u64>,
    /// The kernel table that ran (`portable`, `avx2`, `avx512`); not a llama-bench field.
    pub kernels: String,
    /// What the table chose inside its level (`Kernels::variant`: AVX-VNNI or `maddubs`, the
    /// AVX-512 panel tile); empty where it chooses nothing. Not a llama-bench field.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub kernel_variant: String,
    /// Decode tests: the memory roofline, measured read bandwidth ÷ bytes read per token (weights
    /// and the KV cache at the test's mean context); not a llama-bench field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roofline_ts: Option<f64>,
}

/// Deterministic pseudo-random token ids (llama-bench also times random tokens).
fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n_vocab as u64) as u32
        })
        .collect()
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let m = xs.iter().sum::<f64>() / xs.len() as f64;
    let v = if xs.len() > 1 { xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64 } else { 0.0 };
    (m, v.sqrt())
}

/// The test of one repetition: with `n_prompt > 0`, tokens `depth..depth + n_prompt` of `toks`
/// prefilled after the `depth` tokens already in the context; else `n_gen` of them decoded one at
/// a time at positions `depth..`.
fn one_pass(engine: &mut Engine, toks: &[u32], depth: usize, n_prompt: usize, n_gen: usize, batch: &mut Batch) -> Result<(), Error> {
    if n_prompt > 0 {
        engine.feed(0, &toks[depth..depth + n_prompt], false, |_| {})?;
        return Ok(());
    }
    for (i, &t) in toks[depth..depth + n_gen].iter().enumerate() {
        batch.clear();
        batch.add(t, (depth + i) as i32, 0, true);
        engine.decode(batch)?;
    }
    Ok(())
}

/// An empty context, then the first `depth` tokens of `toks` prefilled (untimed).
fn prepare(engine: &mut Engine, toks: &[u32], depth: usize) -> Result<(), Error> {
    engine.clear_all();
    if depth > 0 {
        engine.feed(0, &toks[..depth], false, |_| {})?;
    }
    Ok(())
}

/// Time `n_prompt` tokens of prefill (or, with `n_prompt == 0`, `n_gen` single-token decodes)
/// after `depth` tokens of context, `reps` times after one warm-up run.
pub fn run_test(
    engine: &mut Engine,
    depth: usize,
    n_prompt: usize,
    n_gen: usize,
    reps: usize,
) -> Result<(f64, f64, Vec<f64>, Vec<u64>), Error> {
    let n_vocab = engine.hyper().n_vocab;
    let mut batch = Batch::with_capacity(1);
    let mut samples = Vec::with_capacity(reps);
    let mut ns = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let toks = tokens(depth + n_prompt.max(n_gen), n_vocab, 0x5EED + rep as u64);
        prepare(engine, &toks, depth)?;
        let t0 = Instant::now();
        one_pass(engine, &toks, depth, n_prompt, n_gen, &mut batch)?;
        let dt = t0.elapsed();
        if rep > 0 {
            ns.push(dt.as_nanos() as u64);
            let n_tokens = if n_prompt > 0 { n_prompt } else { n_gen };
            samples.push(n_tokens as f64 / dt.as_secs_f64());
        }
    }
    engine.clear_all();
    let (m, sd) = mean_sd(&samples);
    Ok((m, sd, samples, ns))
}

/// Read bandwidth of main memory with `n_threads` threads, in bytes/s (the roofline profiler's
/// probe, `corelm_plan::profile::read_bandwidth`).
pub fn memory_bandwidth(n_threads: usize, bytes: usize, reps: usize) -> f64 {
    corelm_plan::profile::read_bandwidth(n_threads, bytes, reps)
}

/// Cost of one pool barrier (what every graph node ends with) with `n_threads` pinned workers,
/// in nanoseconds: the mean over `rounds` back-to-back barriers after a warm-up.
pub fn barrier_ns(n_threads: usize, rounds: usize) -> f64 {
    let cpus = corelm_core::placement::physical_cores();
    let pool = ThreadPool::new(PoolConfig { n_threads, cpus });
    let spin = |n: usize| {
        pool.run(&|w: &Worker| {
            for _ in 0..n {
                w.barrier();
            }
        })
    };
    spin(rounds / 10 + 1);
    let t0 = Instant::now();
    spin(rounds);
    t0.elapsed().as_nanos() as f64 / rounds.max(1) as f64
}

/// One profiled pass of a test (as [`run_test`]: after `depth` tokens of context, `n_prompt`
/// tokens of prefill, or `n_gen` single-token decodes): the time per op kind, summed over nodes,
/// as seen by worker 0 (its own work plus its wait at each node's barrier). Returns the profile
/// and the wall time.
pub fn profile_test(engine: &mut Engine, depth: usize, n_prompt: usize, n_gen: usize) -> Result<(Profile, f64), Error> {
    let toks = tokens(depth + n_prompt.max(n_gen), engine.hyper().n_vocab, 0x5EED);
    prepare(engine, &toks, depth)?;
    engine.profile = Some(Profile::default());
    let t0 = Instant::now();
    let r = one_pass(engine, &toks, depth, n_prompt, n_gen, &mut Batch::with_capacity(1));
    let secs = t0.elapsed().as_secs_f64();
    let p = engine.profile.take().unwrap_or_default();
    engine.clear_all();
    r.map(|_| (p, secs))
}

/// Bytes of weights one decoded token reads: every tensor except the token embedding, of which
/// one row is read — unless the embedding is also the output matrix (tied), then all of it —
/// and of a mixture's stacked experts (`*_exps.weight`) the `expert_used_count` of
/// `expert_count` it is routed to.
pub fn bytes_per_token(engine: &Engine) -> u64 {
    let g = engine.gguf();
    let tied = g.tensor("output.weight").is_none();
    let routed = routed(g);
    g.tensors
        .iter()
        .map(|t| if t.name == "token_embd.weight" && !tied { t.n_bytes / t.shape[1].max(1) } else { per_token(&t.name, t.n_bytes, routed) })
        .sum()
}

/// A mixture's (experts used per token, experts), if the model is one.
fn routed(g: &corelm_gguf::Gguf) -> Option<(u64, u64)> {
    let arch = g.str("general.architecture").unwrap_or_default();
    let n_used = g.opt_u64(&format!("{arch}.expert_used_count")).ok().flatten().unwrap_or(0);
    let n_expert = crate::engine::expert_count(g) as u64;
    (n_used > 0 && n_used <= n_expert).then_some((n_used, n_expert))
}

/// Of `n` (bytes or elements) of tensor `name`, what one token reads: all, or of stacked
/// experts (`*_exps.weight`) the share it is routed to.
fn per_token(name: &str, n: u64, routed: Option<(u64, u64)>) -> u64 {
    match routed {
        Some((used, experts)) if name.ends_with("_exps.weight") => n / experts * used,
        _ => n,
    }
}

/// Bytes of KV cache one decoded token reads at `context` cached tokens: every layer's K and V
/// rows of every cached cell. An upper bound for sliding-window layers, which read at most their
/// window.
pub fn kv_bytes_per_token(engine: &Engine, context: usize) -> u64 {
    (engine.kv_bytes_per_cell() * context) as u64
}

/// One `llama-batched-bench` test: `npl` sequences, each with its own `npp`-token prompt, then
/// `ntg` decode steps of one token for every sequence (each step one forward pass of `npl`
/// rows). Times are the best of the repetitions, as llama-batched-bench reports one pass.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BatchedResult {
    /// Prompt tokens per sequence, generated tokens per sequence, sequences in parallel.
    pub npp: usize,
    pub ntg: usize,
    pub npl: usize,
    /// Cells of KV cache in use at the end: `npl · (npp + ntg)`.
    pub n_kv: usize,
    /// Seconds for all prompts, and for all decode steps.
    pub t_pp: f64,
    pub t_tg: f64,
}

impl BatchedResult {
    /// Prompt tokens per second over all sequences (llama-batched-bench's S_PP).
    pub fn s_pp(&self) -> f64 {
        (self.npl * self.npp) as f64 / self.t_pp
    }
    /// Generated tokens per second over all sequences (S_TG): the aggregate decode rate.
    pub fn s_tg(&self) -> f64 {
        (self.npl * self.ntg) as f64 / self.t_tg
    }
    /// All tokens over the whole test (S).
    pub fn s(&self) -> f64 {
        self.n_kv as f64 / (self.t_pp + self.t_tg)
    }
}

/// The `npl` prompts of one batched repetition (each `npp + ntg` tokens: prompt, then the
/// tokens decoded after it).
fn batched_prompts(n_vocab: usize, npp: usize, ntg: usize, npl: usize, rep: usize) -> Vec<Vec<u32>> {
    (0..npl).map(|s| tokens(npp + ntg, n_vocab, 0x5EED + (rep * npl + s) as u64)).collect()
}

/// Every prompt's first `npp` tokens in passes of up to `n_batch` tokens, sequence after sequence
/// (as llama-batched-bench fills its batch), each prompt's last token producing logits.
fn batched_prefill(engine: &mut Engine, prompts: &[Vec<u32>], npp: usize, batch: &mut Batch) -> Result<(), Error> {
    let nb = engine.config().n_batch;
    batch.clear();
    for (s, p) in prompts.iter().enumerate() {
        for (i, &t) in p[..npp].iter().enumerate() {
            batch.add(t, i as i32, s as i32, i + 1 == npp);
            if batch.len() == nb {
                engine.decode(batch)?;
                batch.clear();
            }
        }
    }
    if !batch.is_empty() {
        engine.decode(batch)?;
    }
    Ok(())
}

/// `ntg` decode steps after the prompts: each one forward pass with one token of every
/// sequence, all flagged for logits (as a server's decode step is).
fn batched_decode(engine: &mut Engine, prompts: &[Vec<u32>], npp: usize, ntg: usize, batch: &mut Batch) -> Result<(), Error> {
    for i in npp..npp + ntg {
        batch.clear();
        for (s, p) in prompts.iter().enumerate() {
            batch.add(p[i], i as i32, s as i32, true);
        }
        engine.decode(batch)?;
    }
    Ok(())
}

/// [`BatchedResult`] for `npl` sequences, best of `reps` repetitions after a warm-up. The
/// engine needs `n_seq_max ≥ npl`, `n_batch ≥ npl` and room for `npl · (npp + ntg)` cells.
pub fn run_batched(engine: &mut Engine, npp: usize, ntg: usize, npl: usize, reps: usize) -> Result<BatchedResult, Error> {
    Ok(run_batched_counts(engine, npp, ntg, &[npl], reps)?.remove(0))
}

/// [`run_batched`] for each sequence count of `counts`, in rounds: the warm-up and then every
/// repetition runs each count once, in order, so that the counts' best times come from the
/// same minutes of a machine whose speed drifts (a shared VM's bandwidth moves by a quarter
/// between minutes), and the ratios between counts — aggregate decode at B against B=1 —
/// are not a comparison of two phases. One result per count, in `counts`' order.
pub fn run_batched_counts(engine: &mut Engine, npp: usize, ntg: usize, counts: &[usize], reps: usize) -> Result<Vec<BatchedResult>, Error> {
    let n_vocab = engine.hyper().n_vocab;
    let widest = counts.iter().copied().max().unwrap_or(1);
    let mut batch = Batch::with_capacity(engine.config().n_batch.max(widest));
    let mut best = vec![(f64::INFINITY, f64::INFINITY); counts.len()];
    for rep in 0..=reps {
        for (&npl, best) in counts.iter().zip(best.iter_mut()) {
            engine.clear_all();
            let prompts = batched_prompts(n_vocab, npp, ntg, npl, rep);
            let t0 = Instant::now();
            batched_prefill(engine, &prompts, npp, &mut batch)?;
            let pp = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            batched_decode(engine, &prompts, npp, ntg, &mut batch)?;
            let tg = t1.elapsed().as_secs_f64();
            if rep > 0 || reps == 0 {
                *best = (best.0.min(pp), best.1.min(tg));
            }
        }
    }
    engine.clear_all();
    Ok(counts.iter().zip(best).map(|(&npl, (t_pp, t_tg))| BatchedResult { npp, ntg, npl, n_kv: npl * (npp + ntg), t_pp, t_tg }).collect())
}

/// One profiled batched decode phase (as [`run_batched`], prompts untimed): the time per op
/// kind over the `ntg` steps, and their wall time.
pub fn profile_batched(engine: &mut Engine, npp: usize, ntg: usize, npl: usize) -> Result<(Profile, f64), Error> {
    let prompts = batched_prompts(engine.hyper().n_vocab, npp, ntg, npl, 0);
    let mut batch = Batch::with_capacity(engine.config().n_batch.max(npl));
    engine.clear_all();
    batched_prefill(engine, &prompts, npp, &mut batch)?;
    engine.profile = Some(Profile::default());
    let t0 = Instant::now();
    let r = batched_decode(engine, &prompts, npp, ntg, &mut batch);
    let secs = t0.elapsed().as_secs_f64();
    let p = engine.profile.take().unwrap_or_default();
    engine.clear_all();
    r.map(|_| (p, secs))
}

/// What one forward pass of this engine's model costs, for Sandwich's latency model
/// (`corelm_topo::sandwich::model`): weight bytes read per pass ([`bytes_per_token`]), 2 FLOPs per
/// weight element of every matrix that a token multiplies (all but the embedding, unless tied;
/// of a mixture's stacked experts the share a token is routed to, as the bytes),
/// the K/V projections' bytes, and graph nodes per layer from the planned one-token graph.
pub fn workload(engine: &Engine) -> corelm_topo::sandwich::Workload {
    let h = engine.hyper();
    let g = engine.gguf();
    let tied = g.tensor("output.weight").is_none();
    let matrices = g.tensors.iter().filter(|t| t.shape[1] > 1 && (tied || t.name != "token_embd.weight"));
    let routed = routed(g);
    let elements: u64 = matrices.map(|t| per_token(&t.name, t.shape.iter().product::<u64>(), routed)).sum();
    let kv_bytes: u64 = g.tensors.iter().filter(|t| t.name.ends_with("attn_k.weight") || t.name.ends_with("attn_v.weight")).map(|t| t.n_bytes).sum();
    let layers = h.n_layer.max(1);
    let (group, global) = engine.barriers(1).unwrap_or((0, 0));
    corelm_topo::sandwich::Workload {
        weight_bytes: bytes_per_token(engine) as f64,
        flops_per_token: 2.0 * elements as f64,
        layers,
        n_head: h.n_head,
        n_kv_head: h.n_kv_head,
        kv_bytes: kv_bytes as f64,
        d_model: h.n_embd,
        nodes_per_layer: (group + global).div_ceil(layers),
        // Under tensor parallelism: one after attention, one after the feed-forward.
        gathers_per_layer: 2,
    }
}
