//! OLMo 2 and OLMo 3 (`olmo2`): the LLaMA block with its norms after attention and after the
//! feed-forward instead of before them (`post_attention_norm`, `post_ffw_norm`, each output
//! normed before its residual add), RMS norms over the whole Q and K rows (every head at once,
//! so `--tp` is refused), NeoX RoPE. OLMo 3's files add sliding-window attention
//! (`attention.sliding_window`) on all but every `attention.sliding_window_pattern`-th layer
//! (4 unless the file gives one number), those layers rotating by the plain RoPE of the same
//! base — no YaRN, no attention factor — while the others take the file's scaling, as
//! llama.cpp builds it.

use crate::common::Extras;
use crate::prenorm::{PreNorm, PreNormSpec, Swa, Tweaks};
use crate::{Loader, ModelError};
use corelm_core::RopeParams;
use corelm_gguf::{Gguf, Value};
use corelm_kernels::Kernels;

/// llama.cpp's sliding-window pattern for OLMo 3 where the file gives none (or an array).
const DEFAULT_SWA_PATTERN: usize = 4;

pub fn load(g: &Gguf, k: &Kernels) -> Result<PreNorm, ModelError> {
    let l = Loader::new(g, k)?;
    let extras = Extras { qk_norm: true, row_qk_norm: true, post_norms: true, no_pre_norms: true, ..Extras::default() };
    let mut m = PreNorm::load(&l, PreNormSpec { extras, neox: true, scale_q: false })?;
    // A window of 0 (or none) is no sliding window, as llama.cpp reads it.
    let window = g.opt_u64("olmo2.attention.sliding_window")?.unwrap_or(0);
    if window > 0 {
        let window = u32::try_from(window).map_err(|_| ModelError::BadHyper(format!("olmo2.attention.sliding_window = {window}")))?;
        // llama.cpp reads the pattern only as one number (0: every layer windowed); an array
        // leaves its default.
        let key = "olmo2.attention.sliding_window_pattern";
        let pattern = match g.get(key) {
            None | Some(Value::Array(_)) => DEFAULT_SWA_PATTERN,
            Some(_) => usize::try_from(g.u64(key)?).map_err(|_| ModelError::BadHyper(key.into()))?,
        };
        let h = m.hyper_ref();
        let rope = RopeParams::plain(h.n_head, h.head_dim, h.n_rot, h.rope_base, 1.0, true);
        m.set_tweaks(Tweaks { swa: Some(Swa { window, pattern, rope }), ..Tweaks::default() });
    }
    Ok(m)
}
