//! Perplexity over a text, by the protocol of llama.cpp's `llama-perplexity` (so the numbers
//! compare): the tokenized text is cut into chunks of `n_ctx` tokens, each evaluated from an
//! empty context (its first token replaced by BOS when the model adds one), and only the second
//! half of each chunk is scored — every scored token has at least `n_ctx / 2` tokens of context.
//! PPL = exp(mean NLL); the uncertainty is llama.cpp's: `ppl · sqrt(var(NLL) / (count - 1))`.

use crate::{Engine, Error};

/// Result of a run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Perplexity {
    pub ppl: f64,
    /// One standard error of `ppl`.
    pub ppl_stderr: f64,
    /// Running estimate after each chunk (what llama.cpp prints as `[1]x,[2]y,...`).
    pub per_chunk: Vec<f64>,
    pub n_ctx: usize,
    pub n_chunks: usize,
    pub tokens_scored: usize,
    pub seconds: f64,
    /// The most likely token at every scored position (greedy agreement between two runs).
    #[serde(skip)]
    pub argmax: Vec<u32>,
}

/// `-log softmax(logits)[tok]` with an f64 sum, as llama.cpp's `log_softmax`.
pub fn nll(logits: &[f32], tok: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max).exp()) as f64).sum();
    -((logits[tok as usize] - max) as f64 - sum.ln())
}

/// Evaluate `tokens` (the whole text, tokenized with BOS if the model adds one) in chunks of
/// `n_ctx`; at most `max_chunks` chunks if given. `bos`: the token that replaces each chunk's
/// first token. Uses sequence 0, which it clears. `progress(chunk, running_ppl, engine)` after
/// each (the engine to read per-chunk statistics from, e.g. its balancer's).
pub fn perplexity(
    engine: &mut Engine,
    tokens: &[u32],
    bos: Option<u32>,
    n_ctx: usize,
    max_chunks: Option<usize>,
    mut progress: impl FnMut(usize, f64, &Engine),
) -> Result<Perplexity, Error> {
    if n_ctx < 8 {
        return Err(Error::Config(format!("perplexity context {n_ctx} is too small (at least 8)")));
    }
    if n_ctx > engine.config().n_ctx {
        return Err(Error::Config(format!(
            "perplexity context {n_ctx} exceeds the engine's KV cache of {} cells",
            engine.config().n_ctx
        )));
    }
    if tokens.len() < 2 * n_ctx {
        return Err(Error::Config(format!(
            "the text has {} tokens; a context of {n_ctx} needs at least {} (two chunks)",
            tokens.len(),
            2 * n_ctx
        )));
    }
    let n_chunks = (tokens.len() / n_ctx).min(max_chunks.unwrap_or(usize::MAX)).max(1);
    let first = n_ctx / 2;
    let t0 = std::time::Instant::now();
    let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
    let mut per_chunk = Vec::with_capacity(n_chunks);
    let mut chunk = Vec::with_capacity(n_ctx);
    let mut argmax = Vec::with_capacity(n_chunks * (n_ctx - first));
    engine.clear_seq(0);
    for c in 0..n_chunks {
        chunk.clear();
        chunk.extend_from_slice(&tokens[c * n_ctx..(c + 1) * n_ctx]);
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let mut pos = 0usize;
        engine.feed(0, &chunk, true, |l| {
            for r in 0..l.rows() {
                let p = pos + r;
                // Logits at p predict token p + 1; score the second half of the chunk.
                if p >= first && p + 1 < n_ctx {
                    let v = nll(l.row(r), tokens[c * n_ctx + p + 1]);
                    sum += v;
                    sum2 += v * v;
                    count += 1;
                    argmax.push(crate::sample::argmax(l.row(r)));
                }
            }
            pos += l.rows();
        })?;
        engine.clear_seq(0);
        let running = (sum / count as f64).exp();
        per_chunk.push(running);
        progress(c, running, engine);
    }
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let ppl_stderr = if var > 0.0 && count > 1 { (var / (count - 1) as f64).sqrt() * ppl } else { 0.0 };
    Ok(Perplexity {
        ppl,
        ppl_stderr,
        per_chunk,
        n_ctx,
        n_chunks,
        tokens_scored: count,
        seconds: t0.elapsed().as_secs_f64(),
        argmax,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn nll_of_uniform_logits_is_log_vocab() {
        let l = vec![0.5f32; 1000];
        assert!((super::nll(&l, 3) - (1000f64).ln()).abs() < 1e-9);
        let mut l = vec![0f32; 4];
        l[2] = 100.0;
        assert!(super::nll(&l, 2) < 1e-12);
    }
}
