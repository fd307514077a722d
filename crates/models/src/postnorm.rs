//! The post-norm families: the LLaMA block with its norms after attention and after the
//! feed-forward instead of before them (`post_attention_norm`, `post_ffw_norm`, each output
//! normed before its residual add), Q/K RMS norms, NeoX RoPE, as llama.cpp builds them.
//!
//! - OLMo 2 and OLMo 3 (`olmo2`): the Q/K norms over whole rows (every head at once, so
//!   `--tp` is refused). OLMo 3's files add sliding-window attention
//!   (`attention.sliding_window`) on all but every `attention.sliding_window_pattern`-th layer
//!   (4 unless the file gives one number), those layers rotating by the plain RoPE of the same
//!   base — no YaRN, no attention factor — while the others take the file's scaling.
//! - EXAONE 4 (`exaone4`): Q/K norms per head, Llama 3-style `rope_freqs` where the file has
//!   them. The 64-layer model (32B) windows three layers of four (window `sliding_window`,
//!   else 4096), which rotate; its global layers have no RoPE. Other depths (1.2B) have no
//!   window, every layer rotating. Next-token-prediction layers (`nextn_predict_layers`) are
//!   refused by name.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec, Swa, Tweaks};
use crate::{Loader, ModelError};
use corelm_core::RopeParams;
use corelm_gguf::Value;

/// llama.cpp's sliding-window pattern for OLMo 3 and EXAONE 4 where the file gives none (or
/// an array).
const DEFAULT_SWA_PATTERN: usize = 4;
/// EXAONE 4 32B's window where the file gives none.
const EXAONE4_WINDOW: u64 = 4096;
/// The depth at which llama.cpp windows EXAONE 4's layers (the 32B model).
const EXAONE4_SWA_LAYERS: usize = 64;

pub(crate) fn load_olmo2(l: &Loader) -> Result<PreNorm, ModelError> {
    let extras = Extras { qk_norm: true, row_qk_norm: true, post_norms: true, no_pre_norms: true, ..Extras::default() };
    let mut m = PreNorm::load(l, PreNormSpec { extras, neox: true, scale_q: false })?;
    // A window of 0 (or none) is no sliding window, as llama.cpp reads it.
    let window = l.g.opt_u64("olmo2.attention.sliding_window")?.unwrap_or(0);
    if window > 0 {
        let h = m.hyper_ref();
        let rope = RopeParams::plain(h.n_head, h.head_dim, h.n_rot, h.rope_base, 1.0, true);
        let swa = Swa { window: window_u32(l, window)?, pattern: pattern(l, DEFAULT_SWA_PATTERN)?, rope: Some(rope), global_rope: true };
        m.set_tweaks(Tweaks { swa: Some(swa), ..Tweaks::default() });
    }
    Ok(m)
}

pub(crate) fn load_exaone4(l: &Loader) -> Result<PreNorm, ModelError> {
    if l.g.opt_u64("exaone4.nextn_predict_layers")?.is_some_and(|n| n > 0) {
        return Err(ModelError::Unsupported("exaone4 with next-token-prediction layers (nextn_predict_layers)".into()));
    }
    let extras = Extras { qk_norm: true, post_norms: true, no_pre_norms: true, ..Extras::default() };
    let mut m = PreNorm::load(l, PreNormSpec { extras, neox: true, scale_q: false })?;
    if m.hyper_ref().n_layer == EXAONE4_SWA_LAYERS {
        let window = l.g.opt_u64("exaone4.attention.sliding_window")?.unwrap_or(EXAONE4_WINDOW);
        let swa = Swa { window: window_u32(l, window)?, pattern: pattern(l, DEFAULT_SWA_PATTERN)?, rope: None, global_rope: false };
        m.set_tweaks(Tweaks { swa: Some(swa), ..Tweaks::default() });
    }
    Ok(m)
}

pub(crate) fn window_u32(l: &Loader, window: u64) -> Result<u32, ModelError> {
    u32::try_from(window).map_err(|_| ModelError::BadHyper(format!("{}.attention.sliding_window = {window}", l.arch)))
}

/// `attention.sliding_window_pattern` as llama.cpp reads it: one number (0: every layer
/// windowed); absent or an array, the family's default.
pub(crate) fn pattern(l: &Loader, default: usize) -> Result<usize, ModelError> {
    let key = format!("{}.attention.sliding_window_pattern", l.arch);
    match l.g.get(&key) {
        None | Some(Value::Array(_)) => Ok(default),
        Some(_) => usize::try_from(l.g.u64(&key)?).map_err(|_| ModelError::BadHyper(key)),
    }
}
