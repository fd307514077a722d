//! Qwen3 and Qwen3-MoE: the Qwen2 block without biases, with an RMS norm on each query and key
//! head before RoPE (QK-norm), NeoX RoPE, and `head_dim` from `attention.key_length` (it need
//! not be `n_embd / n_head`).
//!
//! Qwen3-MoE (`qwen3moe`) replaces every feed-forward with `expert_count` SwiGLU experts of
//! `expert_feed_forward_length`: a softmax router picks `expert_used_count` per token and their
//! probabilities are renormalised to sum to one (llama.cpp hard-codes this for the family and
//! reads no `expert_weights_norm` key for it). No shared experts.
//!
//! Qwen3-VL (`qwen3vl`, `qwen3vlmoe`): the language model of the vision-language release on
//! text, which is what corelm feeds it. Its rotation is M-RoPE (sections of the rotary pairs
//! turned by a time, height, width and extra position); for text tokens llama.cpp gives the
//! first three positions the token's own and the fourth 0 (`llm_graph_input_pos`). Those
//! sections' angles then advance exactly as NeoX RoPE's do — ggml's `ggml_mrope_cache_init`
//! and `ggml_rope_cache_init` compute the same floats — and the pairs of the fourth never turn
//! ([`mrope_still`]: Qwen3-VL's interleaved layout gives it the pairs past three times each
//! section; Qwen2-VL's, those past the first three sections). So the block is Qwen3's (or
//! Qwen2's) with those pairs still. Qwen3-VL's deepstack layers add slices of an image's
//! embedding, zeros for text (`n_embd_inp` padding). A context shift, which llama.cpp refuses
//! for M-RoPE models, rotates text keys by that RoPE exactly.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec};
use crate::{Loader, ModelError};
use corelm_core::{MoeGating, MoeParams};

pub(crate) fn load(l: &Loader, moe: bool) -> Result<PreNorm, ModelError> {
    let moe = if moe { Some(moe_params(l, true)?) } else { None };
    let extras = Extras { qk_norm: true, moe, ..Extras::default() };
    PreNorm::load(l, PreNormSpec { extras, neox: true, scale_q: false })
}

/// Qwen3-VL's language model (`qwen3vl`; `qwen3vlmoe` with `moe`) on text: Qwen3's block,
/// its M-RoPE sections checked.
pub(crate) fn load_vl(l: &Loader, moe: bool) -> Result<PreNorm, ModelError> {
    let sections = mrope_sections(l)?;
    let moe = if moe { Some(moe_params(l, true)?) } else { None };
    let extras = Extras { qk_norm: true, moe, ..Extras::default() };
    let mut m = PreNorm::load(l, PreNormSpec { extras, neox: true, scale_q: false })?;
    m.set_still_pairs(mrope_still(sections, m.hyper_ref().n_rot / 2, true));
    Ok(m)
}

/// The rotary pairs of M-RoPE's fourth section, which never turn on text (its position is 0),
/// as ggml's `ggml_mrope_cache_init` assigns sections: pair i's sector is `i mod Σ sections`;
/// interleaved (Qwen3-VL) sector j takes the first, second or third position where
/// `j mod 3` is 0, 1 or 2 and j is below three times that section, else the fourth; in order
/// (Qwen2-VL) the fourth from the end of the third section.
pub(crate) fn mrope_still(s: [i64; 4], n_pairs: usize, interleaved: bool) -> u128 {
    let total = s.iter().sum::<i64>().max(1);
    (0..n_pairs.min(128)).filter(|&i| {
        let j = i as i64 % total;
        if interleaved {
            !(j % 3 == 1 && j < 3 * s[1] || j % 3 == 2 && j < 3 * s[2] || j % 3 == 0 && j < 3 * s[0])
        } else {
            j >= s[0] + s[1] + s[2]
        }
    }).fold(0u128, |m, i| m | 1 << i)
}

/// `<arch>.rope.dimension_sections`, which llama.cpp requires of its M-RoPE families: four
/// counts of rotary pairs, one of the first three positive, together at most the rotated
/// width (ggml asserts both). On text they say which pairs stand still (see the module doc).
pub(crate) fn mrope_sections(l: &Loader) -> Result<[i64; 4], ModelError> {
    let key = format!("{}.rope.dimension_sections", l.arch);
    let bad = |why: &str| ModelError::BadHyper(format!("{key}: {why}"));
    let v = l.g.opt_array(&key)?.ok_or_else(|| bad("missing (M-RoPE sections)"))?;
    let v = v.to_i64().ok_or_else(|| bad("not integers"))?;
    let s: [i64; 4] = v.as_slice().try_into().map_err(|_| bad(&format!("{} values, expected 4", v.len())))?;
    let n_rot = l.hyper()?.n_rot as i64;
    // (More than 128 rotary pairs: more than `Angles::still` marks; no such model.)
    if s.iter().any(|&x| x < 0) || s[..3].iter().all(|&x| x == 0) || s.iter().sum::<i64>() > n_rot || n_rot > 256 {
        return Err(bad(&format!("{s:?} for {n_rot} rotated values")));
    }
    Ok(s)
}

/// Expert counts from `<arch>.expert_*` keys; the weights renormalised or not as the family's
/// graph in llama.cpp hard-codes it (`norm_w`: Qwen3-MoE and Granite MoE yes, Qwen2-MoE no),
/// and not scaled: llama.cpp reads neither `expert_weights_norm` nor `expert_weights_scale`
/// for these families, so a file's keys change nothing there or here.
pub(crate) fn moe_params(l: &Loader, norm_w: bool) -> Result<MoeParams, ModelError> {
    let n_expert = l.u("expert_count")?;
    let n_used = l.u("expert_used_count")?;
    if n_used > n_expert || n_expert > corelm_core::moe::MAX_EXPERTS || n_used > corelm_core::moe::MAX_USED {
        return Err(ModelError::BadHyper(format!("{n_used} of {n_expert} experts per token")));
    }
    Ok(MoeParams { n_expert, n_used, norm_w, w_scale: 1.0, gating: MoeGating::Softmax })
}

#[cfg(test)]
mod tests {
    use super::mrope_still;

    #[test]
    fn mrope_still_pairs_of_the_released_sections() {
        // Qwen3-VL (head 128, sections 24/20/20/0, interleaved): pairs 61 and 62 take the
        // fourth position; Qwen2-VL and Qwen2.5-VL (16/24/24/0, in order): none.
        assert_eq!(mrope_still([24, 20, 20, 0], 64, true), 1 << 61 | 1 << 62);
        assert_eq!(mrope_still([16, 24, 24, 0], 64, false), 0);
        // The fixture's (16 pairs, 4/6/6/0 interleaved): pairs 12 and 15.
        assert_eq!(mrope_still([4, 6, 6, 0], 16, true), 1 << 12 | 1 << 15);
        // A fourth section in order: its pairs, and again after the sections wrap.
        assert_eq!(mrope_still([2, 1, 1, 2], 12, false), 0b110000_110000);
    }
}
