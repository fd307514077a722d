//! llama.cpp's `infill` stage (`llama_sampler_infill` at 4df29be), which code-completion
//! clients put in their chains (llama.vim sends `["top_k", "top_p", "infill"]`): when the
//! end-of-generation tokens hold enough of the mass, only they are kept; otherwise tokens whose
//! text begins another's give it their probability and leave, the unlikely ones (below 0.2,
//! then below 1 / (kept + 1)) leave, and the end-of-generation tokens always stay. When no text
//! token is left, the answer ends: the end-of-turn token alone.
//!
//! The probabilities only choose who stays, as in llama.cpp, whose later stages and draw
//! compute theirs again from the logits.

use super::stages;
use crate::Tokenizer;

/// What the stage reads of a vocabulary: each token's text (nothing for control tokens, as
/// llama.cpp renders them without `special`), which tokens end generation, and the one it
/// ends with.
pub struct InfillVocab {
    pieces: Vec<Box<[u8]>>,
    eog: Vec<u32>,
    eot: u32,
}

impl std::fmt::Debug for InfillVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InfillVocab({} tokens, end {})", self.pieces.len(), self.eot)
    }
}

impl InfillVocab {
    /// `None` for a vocabulary with neither an end-of-turn nor an end-of-sequence token.
    pub fn new(tok: &Tokenizer) -> Option<InfillVocab> {
        let eot = tok.eot.or(tok.eos)?;
        let pieces = (0..tok.n_vocab() as u32).map(|t| if tok.is_control(t) { Box::default() } else { tok.piece(t).into() }).collect();
        let eog = (0..tok.n_vocab() as u32).filter(|&t| tok.is_eog(t)).collect();
        Some(InfillVocab { pieces, eog, eot })
    }

    /// A vocabulary of these texts (for tests).
    pub fn from_parts(pieces: &[&str], eog: &[u32], eot: u32) -> InfillVocab {
        InfillVocab { pieces: pieces.iter().map(|p| p.as_bytes().into()).collect(), eog: eog.to_vec(), eot }
    }

    fn is_eog(&self, t: u32) -> bool {
        self.eog.contains(&t)
    }

    fn piece(&self, t: u32) -> &[u8] {
        self.pieces.get(t as usize).map_or(&[], |p| p)
    }
}

/// The stage on `cand` (sorted, highest logit first; it stays so), `probs` its scratch.
pub(crate) fn infill(cand: &mut Vec<(u32, f32)>, probs: &mut Vec<f32>, v: &InfillVocab) {
    stages::softmax(cand, probs);
    let (mut p_txt, mut p_eog) = (0f32, 0f32);
    for (c, &p) in cand.iter().zip(probs.iter()) {
        if v.is_eog(c.0) {
            p_eog += p;
        } else {
            p_txt += p;
        }
    }
    if 3.0 * p_eog * cand.len() as f32 > p_txt {
        cand.retain(|c| v.is_eog(c.0));
        return;
    }
    // A token whose text begins another's takes its probability, or gives it its own (to the
    // likelier of the two); the one that gives leaves.
    for i0 in 0..cand.len() {
        for i1 in 0..cand.len() {
            if cand[i0].1 == f32::NEG_INFINITY {
                break;
            }
            if i0 == i1 || cand[i1].1 == f32::NEG_INFINITY {
                continue;
            }
            let (a, b) = (v.piece(cand[i0].0), v.piece(cand[i1].0));
            if !a.is_empty() && b.starts_with(a) {
                let (dst, src) = if probs[i1] > probs[i0] { (i1, i0) } else { (i0, i1) };
                probs[dst] += probs[src];
                cand[src].1 = f32::NEG_INFINITY;
                probs[src] = 0.0;
            }
        }
    }
    // Twice: the unlikely text tokens leave, first below 0.2, then below 1 / (kept + 1) of
    // what is left.
    let mut text_kept = 0;
    for pass in 0..2 {
        let thold = if pass == 0 { 0.2 } else { 1.0 / (text_kept + 1) as f32 };
        let (mut keep, mut sum) = (0, 0f32);
        text_kept = 0;
        for i in 0..cand.len() {
            let eog = v.is_eog(cand[i].0);
            if probs[i] < thold && !eog {
                continue;
            }
            text_kept += usize::from(!eog);
            sum += probs[i];
            cand[keep] = cand[i];
            probs[keep] = probs[i];
            keep += 1;
        }
        cand.truncate(keep);
        probs.truncate(keep);
        probs.iter_mut().for_each(|p| *p /= sum);
        if pass == 0 && text_kept == 0 {
            cand.clear();
            cand.push((v.eot, 1.0));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cand: &[(u32, f32)], v: &InfillVocab) -> Vec<u32> {
        let mut c = cand.to_vec();
        infill(&mut c, &mut vec![], v);
        c.iter().map(|c| c.0).collect()
    }

    #[test]
    fn end_tokens_take_over_when_likely_enough() {
        let v = InfillVocab::from_parts(&["foo", "bar", "</s>"], &[2], 2);
        // p(end) ≈ 0.19 of three candidates: 3 · 0.19 · 3 > 0.81.
        assert_eq!(run(&[(0, 1.0), (1, 0.5), (2, 0.0)], &v), [2]);
        // p(end) ≈ 0.08: 3 · 0.08 · 3 < 0.92, the texts stay.
        assert_eq!(run(&[(0, 1.0), (1, 0.5), (2, -1.0)], &v), [0, 1, 2]);
    }

    #[test]
    fn prefixes_merge_into_the_likelier_and_small_ones_leave() {
        let v = InfillVocab::from_parts(&["ret", "return", "x", "y", "</s>"], &[4], 4);
        // "ret" gives its mass to the likelier "return"; "x" and "y" fall under the thresholds;
        // the end token stays however unlikely.
        let got = run(&[(1, 3.0), (0, 2.5), (2, 1.0), (3, 0.9), (4, -9.0)], &v);
        assert_eq!(got, [1, 4]);
    }

    #[test]
    fn no_text_left_ends_the_answer() {
        let v = InfillVocab::from_parts(&["a", "b", "c", "d", "e", "f", "</s>", "<eot>"], &[6, 7], 7);
        // Six equally likely texts (1/6 each, under 0.2) and an end token too unlikely to take
        // over.
        let got = run(&[(0, 0.0), (1, 0.0), (2, 0.0), (3, 0.0), (4, 0.0), (5, 0.0), (6, -30.0)], &v);
        assert_eq!(got, [7]);
    }
}
