//! Golden-case evaluation: runs a case file of `../shared/golden` (its `prompt`, `add_bos` and
//! the length of `greedy_ids`) and produces the same output fields as llama.cpp's reference:
//! `prompt_token_ids`, `prompt_top10`, `greedy_ids`, `greedy_top10`. Teacher-forced mode feeds
//! the case's `prompt_token_ids + greedy_ids[:-1]` so every step is comparable.

use crate::sample::argmax;
use crate::{Batch, Engine, Error, Tokenizer};
use serde::{Deserialize, Serialize};

/// The fields of a golden case this evaluation reads.
#[derive(Clone, Debug, Deserialize)]
pub struct Case {
    pub prompt: String,
    pub add_bos: bool,
    pub prompt_token_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    #[serde(default)]
    pub case_id: String,
}

/// Output in the golden files' field names.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EvalOutput {
    pub prompt_token_ids: Vec<u32>,
    pub prompt_top10: Vec<Vec<(u32, f32)>>,
    pub greedy_ids: Vec<u32>,
    pub greedy_top10: Vec<Vec<(u32, f32)>>,
}

/// The `k` largest logits, descending, ties to the lower id.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &v) in logits.iter().enumerate() {
        if top.len() == k && v <= top[k - 1].1 {
            continue;
        }
        let at = top.iter().position(|&(_, w)| v > w).unwrap_or(top.len());
        top.insert(at, (i as u32, v));
        top.truncate(k);
    }
    top
}

/// Run one case on sequence 0 of a cleared engine.
pub fn run_case(engine: &mut Engine, tok: &Tokenizer, case: &Case, teacher_forced: bool) -> Result<EvalOutput, Error> {
    let ours = tok.encode(&case.prompt, case.add_bos, true)?;
    let prompt = if teacher_forced { case.prompt_token_ids.clone() } else { ours.clone() };
    let n_greedy = case.greedy_ids.len();
    if prompt.is_empty() {
        return Err(Error::Case("the prompt tokenizes to nothing".into()));
    }
    if prompt.len() + n_greedy > engine.config().n_ctx {
        return Err(Error::PromptTooLong { prompt: prompt.len() + n_greedy, n_ctx: engine.config().n_ctx });
    }
    engine.clear_all();
    let mut out = EvalOutput { prompt_token_ids: ours, prompt_top10: vec![], greedy_ids: vec![], greedy_top10: vec![] };
    let mut batch = Batch::new();
    let mut last = Vec::new();
    engine.feed(0, &prompt, true, |logits| {
        for r in 0..logits.rows() {
            out.prompt_top10.push(top_k(logits.row(r), 10));
        }
        last = logits.row(logits.rows() - 1).to_vec();
    })?;
    for (k, pos) in (0..n_greedy).zip(prompt.len() as i32..) {
        out.greedy_top10.push(top_k(&last, 10));
        let chosen = argmax(&last);
        out.greedy_ids.push(chosen);
        if k + 1 == n_greedy {
            break;
        }
        let next = if teacher_forced { case.greedy_ids[k] } else { chosen };
        batch.clear();
        batch.add(next, pos, 0, true);
        let logits = engine.decode(&batch)?;
        last.clear();
        last.extend_from_slice(logits.row(0));
    }
    engine.clear_all();
    Ok(out)
}
