//! Fill in the middle: the prompt a code model (Qwen2.5-Coder, CodeLlama, DeepSeek-Coder, …)
//! completes the hole between a prefix and a suffix from, in its FIM tokens
//! ([`crate::tokenizer::Fim`]).
//!
//! Design: one file is `[PRE]prefix prompt [SUF]suffix [MID]` (BOS first where the model adds
//! one), as Qwen2.5-Coder's card writes it. With files of context it is llama-server's
//! `/infill` layout (`format_prompt_infill`, repository level as Qwen2.5-Coder was trained,
//! arXiv 2409.12186), token for token:
//!
//! ```text
//! [REP]myproject\n [SEP]file0\n text0 … [SEP]filename\n  BOS [PRE]prefix prompt [SUF]suffix [MID]
//! ```
//!
//! — the repository line and each file's name only where the model has those tokens (else each
//! file after a `\n\n--- snippet ---\n\n` line).
//! Where it all does not fit in the budget (the context less the answer's room), the prefix
//! keeps its end and the suffix its start, 3 : 1 where both are long (llama-server's split, of
//! its batch there), and the context files fill what is left, their end kept.

use crate::tokenizer::Tokenizer;
use crate::Error;

/// One file of context: its name and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub filename: String,
    pub text: String,
}

/// The tokens of a fill-in-the-middle prompt: `prefix` and `suffix` around the hole, `extra`
/// files of context before them, and `prompt` after the prefix (the start of the middle, as
/// llama-server's `prompt` field is), in at most `budget` tokens (BOS and FIM tokens counted).
pub fn prompt(tok: &Tokenizer, prefix: &str, suffix: &str, extra: &[Chunk], prompt: &str, budget: usize) -> Result<Vec<u32>, Error> {
    let fim = tok.fim.ok_or_else(|| Error::Tokenizer("this model has no fill-in-the-middle tokens (prefix, suffix and middle)".into()))?;
    let text = |s: &str| tok.encode(s, false, false);
    let mut extra_tokens = Vec::new();
    if let (Some(rep), false) = (fim.rep, extra.is_empty()) {
        extra_tokens.push(rep);
        extra_tokens.extend(text("myproject\n")?);
    }
    for c in extra {
        match fim.sep {
            Some(sep) => {
                extra_tokens.push(sep);
                extra_tokens.extend(text(&format!("{}\n", c.filename))?);
            }
            None => extra_tokens.extend(text("\n\n--- snippet ---\n\n")?),
        }
        extra_tokens.extend(text(&c.text)?);
    }
    if let (Some(sep), false) = (fim.sep, extra.is_empty()) {
        extra_tokens.push(sep);
        extra_tokens.extend(text("filename\n")?);
    }
    let (prefix, suffix, after) = (text(prefix)?, text(suffix)?, text(prompt)?);
    let bos = usize::from(tok.add_bos && tok.bos.is_some());
    // The fixed part: BOS, the three FIM tokens and the prompt after the prefix.
    let fixed = bos + 3 + after.len();
    if fixed > budget {
        return Err(Error::PromptTooLong { prompt: fixed, n_ctx: budget });
    }
    let room = budget - fixed;
    // 3 : 1 where both are long; either takes what the other leaves.
    let suffix_take = suffix.len().min(room - prefix.len().min(3 * room / 4));
    let prefix_take = prefix.len().min(room - suffix_take);
    let extra_take = extra_tokens.len().min(room - prefix_take - suffix_take);
    let mut out = Vec::with_capacity(fixed + prefix_take + suffix_take + extra_take);
    out.extend_from_slice(&extra_tokens[extra_tokens.len() - extra_take..]);
    if bos == 1 {
        out.extend(tok.bos);
    }
    out.push(fim.pre);
    out.extend_from_slice(&prefix[prefix.len() - prefix_take..]);
    out.extend_from_slice(&after);
    out.push(fim.suf);
    out.extend_from_slice(&suffix[..suffix_take]);
    out.push(fim.mid);
    Ok(out)
}
