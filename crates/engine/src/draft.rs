//! Speculative decoding with a draft model (llama.cpp's `--spec-draft-model`): a smaller model
//! of the same vocabulary proposes each sequence's next tokens, greedily, and the target feeds
//! them beside its token in one pass, keeping those it samples anyway (the verification is
//! prompt lookup's: [`crate::lookup`], [`crate::generate`], the batcher). The answer is the
//! target's alone, whatever the draft proposes.
//!
//! * **One pool.** The draft's engine runs on its target's workers ([`Engine::from_gguf_on`]):
//!   the two models take turns, never compete for cores. Under `--tp` the draft is not cut:
//!   it runs on a view of the pool that joins the shard groups into one.
//! * **Its cache follows the target's tokens.** Per sequence the draft keeps the tokens it was
//!   fed; each call is given the sequence's whole history (prompt, answer, and the token about
//!   to be fed) and keeps the longest common prefix, cutting the rest (rejected draft tokens,
//!   or another request's tokens in a reused slot), or starting again from the draft's own
//!   prefix cache where the cut would fall inside blocks it shares.
//! * **All sequences draft together**: a pass feeds every sequence's missing tokens, then each
//!   round feeds every still-drafting sequence's last proposal, so a step of 16 sequences costs
//!   `n_max` draft passes, not `16 · n_max`.
//! * **llama.cpp's rule for a proposal** (`common/speculative.cpp`, 4df29be): the draft's most
//!   likely token, taken while its probability among the ten most likely (the draft sampler's
//!   `top_k(10)`) is at least `p_min`, up to `n_max` tokens; a draft shorter than `n_min` is
//!   dropped (llama-server's rule). Defaults: `n_max` 3, `n_min` 0, `p_min` 0.
//! * **Vocabularies must match** as llama.cpp checks them: the same tokenizer kind, BOS/EOS
//!   use and ids, sizes within 128 tokens, and the same text for every token from id 5 on.
//!
//! * **Context shift** ([`DraftModel::shift`]): where the target drops tokens from a
//!   sequence, the draft's cache drops the same ones (its own RoPE rotates its keys), so the
//!   draft goes on from where it was instead of feeding the context again.
//!
//! A draft that fails (its cache full) proposes nothing for that step: drafts never decide an
//! answer, only how many tokens a pass gives.

use crate::{Batch, Engine, EngineConfig, Error, Tokenizer};
use corelm_gguf::Gguf;
use std::path::Path;
use std::sync::Arc;

/// llama.cpp's `SPEC_VOCAB_MAX_SIZE_DIFFERENCE` and `SPEC_VOCAB_CHECK_START_TOKEN_ID`.
const VOCAB_MAX_DIFFERENCE: usize = 128;
const VOCAB_CHECK_FROM: u32 = 5;

/// How far a draft model proposes (`--spec-draft-n-max`, `--spec-draft-n-min`,
/// `--spec-draft-p-min`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftParams {
    /// Most tokens proposed per step.
    pub n_max: usize,
    /// Drafts shorter than this are not fed.
    pub n_min: usize,
    /// A proposal stops before a token less likely than this among the draft's ten best.
    pub p_min: f32,
}

impl Default for DraftParams {
    fn default() -> Self {
        DraftParams { n_max: 3, n_min: 0, p_min: 0.0 }
    }
}

/// One sequence's call: its whole history (the last token is the one the target feeds next)
/// and the most tokens its step can take.
pub struct DraftRequest<'a> {
    pub seq: i32,
    pub history: &'a [u32],
    pub max: usize,
}

/// A loaded draft model and what its cache holds per sequence.
pub struct DraftModel {
    engine: Engine,
    params: DraftParams,
    /// The target's vocabulary size (proposals past it end a draft).
    n_vocab: usize,
    /// Per sequence: the tokens in the draft's cache, in position order, and how many of them
    /// came from its prefix cache (a cut may not fall inside those).
    cached: Vec<Vec<u32>>,
    attached: Vec<usize>,
    // Reused per call: the batch, per request its next token to feed (an index into history
    // then draft) and whether it still drafts, the batch rows with logits by request.
    batch: Batch,
    next: Vec<usize>,
    drafting: Vec<bool>,
    rows: Vec<(usize, usize)>,
    /// Calls whose draft passes failed (their drafts dropped).
    failed: usize,
}

impl DraftModel {
    /// Load `path` as `target`'s draft model: same context, sequences, batch, threads and
    /// kernel table, on `target`'s thread pool; refused where the vocabularies differ.
    pub fn load(path: &Path, target: &Engine, target_tok: &Tokenizer, params: DraftParams) -> Result<DraftModel, Error> {
        if params.n_max == 0 {
            return Err(Error::Config("--spec-draft-n-max must be at least 1 with a draft model".into()));
        }
        if !(0.0..=1.0).contains(&params.p_min) {
            return Err(Error::Config(format!("--spec-draft-p-min must be within 0..1, got {}", params.p_min)));
        }
        let gguf = Arc::new(Gguf::open(path).map_err(|e| Error::Config(format!("draft model {}: {e}", path.display())))?);
        let tok = Tokenizer::from_gguf(&gguf).map_err(|e| Error::Config(format!("draft model {}: {e}", path.display())))?;
        vocabularies_match(target_tok, &tok).map_err(|why| Error::Config(format!("draft model {}: its vocabulary is not the target's: {why}", path.display())))?;
        let t = target.config();
        let cfg = EngineConfig {
            n_ctx: t.n_ctx,
            n_batch: t.n_batch,
            n_seq_max: t.n_seq_max,
            n_threads: target.pool().n_threads(),
            pin: t.pin,
            isa: t.isa,
            batch_invariant: t.batch_invariant,
            fast_prefill: t.fast_prefill,
            repack: t.repack,
            ..EngineConfig::default()
        };
        let engine = Engine::from_gguf_on(gguf, cfg, Some(target.shared_pool())).map_err(|e| Error::Config(format!("draft model {}: {e}", path.display())))?;
        let n_seq = t.n_seq_max;
        Ok(DraftModel {
            engine,
            params,
            n_vocab: target_tok.n_vocab(),
            cached: vec![Vec::new(); n_seq],
            attached: vec![0; n_seq],
            batch: Batch::with_capacity(t.n_batch),
            next: Vec::with_capacity(n_seq),
            drafting: Vec::with_capacity(n_seq),
            rows: Vec::with_capacity(n_seq),
            failed: 0,
        })
    }

    pub fn params(&self) -> &DraftParams {
        &self.params
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Calls whose draft passes failed (a full cache): their drafts were dropped.
    pub fn failed(&self) -> usize {
        self.failed
    }

    /// The tokens the draft's cache holds for `seq`.
    pub fn cached(&self, seq: i32) -> &[u32] {
        usize::try_from(seq).ok().and_then(|s| self.cached.get(s)).map_or(&[], |c| c.as_slice())
    }

    /// `seq`'s request ended: its blocks go back (full ones to the draft's prefix cache).
    pub fn forget(&mut self, seq: i32) {
        self.engine.clear_seq(seq);
        if let Some(s) = usize::try_from(seq).ok().filter(|&s| s < self.cached.len()) {
            self.cached[s].clear();
            self.attached[s] = 0;
        }
    }

    /// The target dropped `seq`'s tokens `keep..keep + discard` (a context shift,
    /// [`Engine::shift_seq`]): the draft's cache drops the same ones, its later rows shifted
    /// where it holds them all and can, else cut back to the kept tokens (the next call feeds
    /// the rest).
    pub fn shift(&mut self, seq: i32, keep: usize, discard: usize) {
        let Some(s) = usize::try_from(seq).ok().filter(|&s| s < self.cached.len()) else { return };
        let held = self.cached[s].len();
        if held <= keep || discard == 0 {
            return;
        }
        if keep + discard <= held && self.engine.shift_seq(seq, keep, discard).is_ok() {
            self.cached[s].drain(keep..keep + discard);
            self.attached[s] = self.attached[s].min(keep);
        } else if keep >= self.attached[s] && keep > 0 {
            self.engine.truncate_seq(seq, keep);
            self.cached[s].truncate(keep);
        } else {
            self.forget(seq);
        }
    }

    /// Propose request `i`'s draft (`req(i)`, `i < outs.len()`) into `outs[i]` (emptied
    /// first). A draft the cache cannot hold is left empty, and that sequence starts afresh
    /// next time.
    pub fn draft<'a>(&mut self, req: impl Fn(usize) -> DraftRequest<'a>, outs: &mut [Vec<u32>]) {
        self.next.clear();
        self.drafting.clear();
        for (i, out) in outs.iter_mut().enumerate() {
            let r = req(i);
            out.clear();
            let max = r.max.min(self.params.n_max);
            let ok = max > 0 && max >= self.params.n_min && !r.history.is_empty() && self.sync(r.seq, r.history, max);
            self.next.push(self.cached(r.seq).len());
            self.drafting.push(ok);
        }
        if self.rounds(&req, outs).is_err() {
            // Drafts are only proposals: drop them and let the sequences start again.
            self.failed += 1;
            for (i, out) in outs.iter_mut().enumerate() {
                out.clear();
                self.forget(req(i).seq);
            }
            return;
        }
        for out in outs.iter_mut() {
            if out.len() < self.params.n_min {
                out.clear();
            }
        }
    }

    /// Cut `seq`'s cache to what it shares with `history` (keeping the last history token to
    /// feed); whether `history` and `max` proposals then fit.
    fn sync(&mut self, seq: i32, history: &[u32], max: usize) -> bool {
        let Some(s) = usize::try_from(seq).ok().filter(|&s| s < self.cached.len()) else { return false };
        let want = &history[..history.len() - 1];
        let common = self.cached[s].iter().zip(want).take_while(|(a, b)| a == b).count();
        if common < self.cached[s].len() || self.cached[s].is_empty() {
            if common >= self.attached[s] && !self.cached[s].is_empty() {
                self.engine.truncate_seq(seq, common);
                self.cached[s].truncate(common);
            } else {
                self.engine.clear_seq(seq);
                let n = self.engine.attach_prefix(seq, want);
                self.cached[s].clear();
                self.cached[s].extend_from_slice(&want[..n]);
                self.attached[s] = n;
            }
        }
        // The history's missing tokens and all proposals but the last are fed.
        history.len() - self.cached[s].len() + max - 1 <= self.engine.room(seq)
    }

    /// Feed every drafting request's missing tokens, then its proposals, until each stops.
    fn rounds<'a>(&mut self, req: &impl Fn(usize) -> DraftRequest<'a>, outs: &mut [Vec<u32>]) -> Result<(), Error> {
        let nb = self.engine.config().n_batch;
        while self.drafting.iter().any(|&d| d) {
            self.batch.clear();
            self.rows.clear();
            for (i, out) in outs.iter().enumerate() {
                if !self.drafting[i] {
                    continue;
                }
                let r = req(i);
                // Known tokens: the history, then the proposals so far.
                let known = r.history.len() + out.len();
                while self.next[i] < known && self.batch.len() < nb {
                    let p = self.next[i];
                    let t = if p < r.history.len() { r.history[p] } else { out[p - r.history.len()] };
                    let last = p + 1 == known;
                    self.batch.add(t, p as i32, r.seq, last);
                    self.cached[r.seq as usize].push(t);
                    self.next[i] += 1;
                    if last {
                        self.rows.push((i, self.rows.len()));
                    }
                }
            }
            let logits = self.engine.decode(&self.batch)?;
            for &(i, row) in &self.rows {
                let (id, p) = best_of_ten(logits.row(row));
                let max = req(i).max.min(self.params.n_max);
                if p < self.params.p_min || id as usize >= self.n_vocab {
                    self.drafting[i] = false;
                    continue;
                }
                outs[i].push(id);
                // The last proposal is not fed: the target feeds it.
                self.drafting[i] = outs[i].len() < max;
            }
        }
        Ok(())
    }
}

/// The most likely token and its probability among the ten most likely (llama.cpp's draft
/// sampler: `top_k(10)`, then the softmax of what is left).
fn best_of_ten(logits: &[f32]) -> (u32, f32) {
    let mut top = [f32::NEG_INFINITY; 10];
    let mut best = 0u32;
    for (i, &l) in logits.iter().enumerate() {
        if l > top[9] {
            // Insert keeping `top` descending; a tie keeps the earlier token first.
            let mut j = 9;
            while j > 0 && top[j - 1] < l {
                top[j] = top[j - 1];
                j -= 1;
            }
            top[j] = l;
            if j == 0 {
                best = i as u32;
            }
        }
    }
    let sum: f32 = top.iter().filter(|l| l.is_finite()).map(|&l| (l - top[0]).exp()).sum();
    (best, 1.0 / sum)
}

/// llama.cpp's `common_speculative_are_compatible`: why `draft` cannot draft for `target`.
pub fn vocabularies_match(target: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    if target.kind != draft.kind {
        return Err(format!("tokenizer {:?} against the target's {:?}", draft.kind, target.kind));
    }
    if target.add_bos != draft.add_bos || (target.add_bos && target.bos != draft.bos) {
        return Err(format!("BOS {:?} (added: {}) against the target's {:?} (added: {})", draft.bos, draft.add_bos, target.bos, target.add_bos));
    }
    if target.add_eos != draft.add_eos || (target.add_eos && target.eos != draft.eos) {
        return Err(format!("EOS {:?} (added: {}) against the target's {:?} (added: {})", draft.eos, draft.add_eos, target.eos, target.add_eos));
    }
    let (nt, nd) = (target.n_vocab(), draft.n_vocab());
    if nt.abs_diff(nd) > VOCAB_MAX_DIFFERENCE {
        return Err(format!("{nd} tokens against the target's {nt} (at most {VOCAB_MAX_DIFFERENCE} apart)"));
    }
    match (VOCAB_CHECK_FROM..nt.min(nd) as u32).find(|&i| target.text(i) != draft.text(i)) {
        Some(i) => Err(format!("token {i} is {:?}, the target's {:?}", draft.text(i), target.text(i))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::best_of_ten;

    #[test]
    fn the_best_token_and_its_share_of_the_ten_best() {
        // Twelve logits: the ten best are 11..2 (ids 0..9 reversed below), 0 and 1 left out.
        let mut l: Vec<f32> = (0..12).map(|i| i as f32).collect();
        l.reverse();
        let (id, p) = best_of_ten(&l);
        let want = 1.0 / (0..10).map(|k| (-(k as f32)).exp()).sum::<f32>();
        assert_eq!(id, 0);
        assert!((p - want).abs() < 1e-6, "{p} against {want}");
        // A tie keeps the first; fewer than ten logits count only themselves.
        assert_eq!(best_of_ten(&[1.0, 3.0, 3.0]).0, 1);
        assert!((best_of_ten(&[5.0]).1 - 1.0).abs() < 1e-7);
    }
}
