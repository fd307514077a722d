//! Embeddings: one vector per input text, pooled from the final norm's output rows (the
//! hidden states the LM head would read; llama.cpp's `t_embd`), as llama.cpp's
//! `--embeddings` does.
//!
//! A pass of hidden states is an ordinary forward pass whose graph stops before the LM head
//! (`Engine::decode_hidden`), so embedding and generation share the model, the KV cache and
//! the thread pool. [`Pooling`] says which rows an input needs: every row (mean), the first
//! (CLS) or the last (the decoder-style embedding models, e.g. Qwen3-Embedding). Rows are added
//! in token order whatever the passes' sizes, so a vector does not depend on `n_batch` or on
//! what else shares its passes (with batch-invariant kernels). [`normalize`] is llama.cpp's
//! Euclidean normalization (`embd_normalize = 2`, its server's default).
//!
//! Invariant: an input's rows are pooled from a sequence that starts empty, except under
//! [`Pooling::Last`], where cached prefix blocks are reused (only the last row is read);
//! under [`Pooling::Cls`] with batch-invariant kernels only the first token goes through
//! (attention is causal).

use crate::{Batch, Engine, Error};
use corelm_gguf::Gguf;

/// How an input's hidden rows become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's row.
    Mean,
    /// The first token's row.
    Cls,
    /// The last token's row.
    Last,
}

impl Pooling {
    /// `mean`, `cls` or `last`.
    pub fn parse(s: &str) -> Result<Pooling, Error> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            _ => Err(Error::Config(format!("pooling {s:?} is not one of mean, cls, last"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// The model's own pooling (`<arch>.pooling_type`, llama.cpp's numbering), `None` when
    /// the file states none (a plain language model). A reranker's `rank` is refused: it
    /// scores a pair of texts, it does not embed one.
    pub fn from_gguf(g: &Gguf) -> Result<Option<Pooling>, Error> {
        let arch = g.opt_str("general.architecture")?.unwrap_or("");
        match g.opt_u64(&format!("{arch}.pooling_type"))? {
            None | Some(0) => Ok(None),
            Some(1) => Ok(Some(Pooling::Mean)),
            Some(2) => Ok(Some(Pooling::Cls)),
            Some(3) => Ok(Some(Pooling::Last)),
            Some(4) => Err(Error::Config("the model is a reranker (pooling type rank); embeddings need mean, cls or last pooling".into())),
            Some(t) => Err(Error::Config(format!("{arch}.pooling_type {t} is not a pooling type this engine knows"))),
        }
    }

    /// How many leading tokens of an input of `len` go through the model. Attention is causal
    /// in every architecture here, so the first row depends on the first token alone — and,
    /// with `batch_invariant` kernels, not on how many rows its pass has: CLS then feeds one
    /// token. Otherwise the whole input goes through, as llama.cpp computes it (its first
    /// row's bits depend on the pass's size).
    pub fn needed(self, len: usize, batch_invariant: bool) -> usize {
        match self {
            Pooling::Cls if batch_invariant => len.min(1),
            _ => len,
        }
    }

    /// Whether token `i` of an input of `len` tokens gives a row to the pool.
    pub fn wants(self, i: usize, len: usize) -> bool {
        match self {
            Pooling::Mean => true,
            Pooling::Cls => i == 0,
            Pooling::Last => i + 1 == len,
        }
    }
}

/// One input's vector as its rows arrive, in token order.
#[derive(Clone, Debug)]
pub struct Pooled {
    pooling: Pooling,
    rows: usize,
    acc: Vec<f32>,
}

impl Pooled {
    pub fn new(pooling: Pooling, n_embd: usize) -> Pooled {
        Pooled { pooling, rows: 0, acc: vec![0.0; n_embd] }
    }

    /// Add the next wanted row (`Pooling::wants`).
    pub fn add(&mut self, row: &[f32]) {
        match self.pooling {
            Pooling::Mean => self.acc.iter_mut().zip(row).for_each(|(a, &x)| *a += x),
            Pooling::Cls | Pooling::Last => self.acc.copy_from_slice(row),
        }
        self.rows += 1;
    }

    /// The vector, Euclidean-normalized when `normalize`.
    pub fn finish(mut self, normalize_it: bool) -> Vec<f32> {
        if self.pooling == Pooling::Mean && self.rows > 0 {
            let inv = 1.0 / self.rows as f32;
            self.acc.iter_mut().for_each(|a| *a *= inv);
        }
        if normalize_it {
            normalize(&mut self.acc);
        }
        self.acc
    }
}

/// Scale `v` to unit Euclidean length, as llama.cpp's `common_embd_normalize(…, 2)`: squares
/// summed in f64, one reciprocal, a zero vector left as it is.
pub fn normalize(v: &mut [f32]) {
    let sum: f64 = v.iter().map(|&x| (x * x) as f64).sum();
    let norm = sum.sqrt();
    let scale = if norm > 0.0 { (1.0 / norm) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= scale);
}

/// Cosine similarity of two vectors (1 for equal directions).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x * x) as f64).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x * x) as f64).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        (dot / (na * nb)) as f32
    }
}

impl Engine {
    /// The vector of `tokens` on the empty sequence `seq` (left empty again, its full blocks
    /// cached), unnormalized: passes of at most `n_batch` tokens.
    pub fn embed(&mut self, seq: i32, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>, Error> {
        if tokens.is_empty() {
            return Err(Error::Batch("nothing to embed: the input has no tokens".into()));
        }
        if self.seq_len(seq) != 0 {
            return Err(Error::Batch(format!("sequence {seq} is not empty")));
        }
        if tokens.len() > self.config().n_ctx {
            return Err(Error::PromptTooLong { prompt: tokens.len(), n_ctx: self.config().n_ctx });
        }
        let start = if pooling == Pooling::Last { self.attach_prefix(seq, tokens) } else { 0 };
        let mut pooled = Pooled::new(pooling, self.hyper().n_embd);
        let nb = self.config().n_batch;
        let mut batch = Batch::with_capacity(nb.min(tokens.len()));
        let result = (|| {
            for (ci, chunk) in tokens[start..pooling.needed(tokens.len(), self.config().batch_invariant)].chunks(nb).enumerate() {
                batch.clear();
                for (j, &t) in chunk.iter().enumerate() {
                    let i = start + ci * nb + j;
                    batch.add(t, i as i32, seq, pooling.wants(i, tokens.len()));
                }
                let rows = self.decode_hidden(&batch)?;
                (0..rows.rows()).for_each(|r| pooled.add(rows.row(r)));
            }
            Ok(())
        })();
        self.clear_seq(seq);
        result.map(|()| pooled.finish(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_and_normalizes() {
        let mut p = Pooled::new(Pooling::Mean, 2);
        p.add(&[1.0, 2.0]);
        p.add(&[3.0, 6.0]);
        assert_eq!(p.clone().finish(false), vec![2.0, 4.0]);
        let v = p.finish(true);
        assert!((v[0] - 1.0 / 5f32.sqrt()).abs() < 1e-7 && (v[1] - 2.0 / 5f32.sqrt()).abs() < 1e-7, "{v:?}");
        let mut last = Pooled::new(Pooling::Last, 2);
        last.add(&[5.0, 0.0]);
        assert_eq!(last.finish(true), vec![1.0, 0.0]);
        let mut zero = vec![0.0f32; 3];
        normalize(&mut zero);
        assert_eq!(zero, vec![0.0; 3]);
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-7);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 3.0]), 0.0);
    }

    #[test]
    fn wanted_rows_follow_the_pooling() {
        let wanted = |p: Pooling| (0..4).filter(|&i| p.wants(i, 4)).collect::<Vec<_>>();
        assert_eq!(wanted(Pooling::Mean), vec![0, 1, 2, 3]);
        assert_eq!(wanted(Pooling::Cls), vec![0]);
        assert_eq!(wanted(Pooling::Last), vec![3]);
        assert_eq!(Pooling::parse("last").unwrap(), Pooling::Last);
        assert!(Pooling::parse("max").unwrap_err().to_string().contains("mean, cls, last"));
    }
}
