//! Context shift (`--context-shift`, llama.cpp's): a sequence that has filled its context
//! drops `discard` tokens after its first `keep` and generates on. The cache moves the later
//! rows down (`KvCache::shift`); here each layer's keys are rotated back by `discard`
//! positions with the RoPE the model applied to them ([`corelm_models::Model::key_rope`]):
//! angles for position `-discard` from `rope_cache`, applied by the same `rope_apply` as a
//! pass, so a key stored in F16 comes out as llama.cpp's shift leaves it. Layers on the
//! accelerator (`--accel-layers`) repeat the moves in their cache.

use super::Engine;
use crate::Error;
use corelm_kernels::rope::{rope_apply, rope_cache, Angles};

/// Where a context shift cuts: llama-server's rule. `n_keep` tokens of the prompt are kept
/// (negative: the whole prompt), one more for a BOS token the tokenizer added, at most
/// `n_ctx - 4`; of the `len - keep` after them, `n_discard` are dropped (0: half), at least
/// one and all but one at most. Returns `(keep, discard)`.
pub fn shift_cut(len: usize, n_prompt: usize, n_keep: i64, n_discard: usize, add_bos: bool, n_ctx: usize) -> (usize, usize) {
    let keep = if n_keep < 0 { n_prompt } else { n_keep as usize } + usize::from(add_bos);
    let keep = keep.min(n_ctx.saturating_sub(4)).min(len);
    let left = len - keep;
    let discard = if n_discard == 0 { left / 2 } else { n_discard };
    (keep, discard.min(left.saturating_sub(1)))
}

/// A shift dropped positions `keep..keep + discard`: remove them from `history`, a sequence's
/// tokens whose last one goes to position `next` (so `history[0]` sits at `next + 1 -
/// history.len()`; a history starting later loses only what it holds of the range).
pub(crate) fn drop_shifted(history: &mut Vec<u32>, next: usize, keep: usize, discard: usize) {
    let first = (next + 1).saturating_sub(history.len());
    let at = |p: usize| p.saturating_sub(first).min(history.len());
    let (lo, hi) = (at(keep), at(keep + discard));
    history.drain(lo..hi);
}

impl Engine {
    /// Whether this engine can shift a sequence's context, or why not (checked before
    /// generating, so a refusal comes before any token): not with a model whose keys are not
    /// rotated by a plain RoPE, nor with layers on a device that cannot read its rows back.
    pub fn can_shift(&self) -> Result<(), Error> {
        if (0..self.hyper().n_layer).any(|il| self.model.key_rope(il).is_none()) {
            return Err(Error::Config(format!("context shift: the {} model's keys are not rotated by a plain RoPE", self.hyper().arch)));
        }
        self.device_layers.as_ref().map_or(Ok(()), |d| d.can_shift())
    }

    /// Drop tokens `keep..keep + discard` of sequence `seq`: the tokens after them move down
    /// to position `keep`, and the next token goes to `seq_len(seq)`. Their rows are not what
    /// a prefill of the remaining tokens gives (they saw the dropped ones), so the sequence
    /// adds nothing to the prefix cache until it is cleared. Refused, changing nothing, with
    /// layers on the device, a model whose keys are not rotated by a plain RoPE, or too few
    /// free blocks to copy the shared blocks the shift writes.
    pub fn shift_seq(&mut self, seq: i32, keep: usize, discard: usize) -> Result<(), Error> {
        self.can_shift()?;
        let Some(s) = self.seq_index(seq) else {
            return Err(Error::Config(format!("context shift: sequence id {seq} outside 0..{}", self.cfg.n_seq_max)));
        };
        let n_layer = self.hyper().n_layer;
        let mut caches = Vec::with_capacity(n_layer);
        // The divisors' weight, read once (every layer names the same one).
        let mut freqs: Option<(String, Vec<f32>)> = None;
        for il in 0..n_layer {
            let r = self.model.key_rope(il).expect("checked by can_shift");
            if let Some(w) = r.freqs.as_ref().filter(|w| freqs.as_ref().is_none_or(|f| f.0 != w.name)) {
                let t = self.gguf.tensor(&w.name).ok_or_else(|| Error::Config(format!("context shift: no tensor {}", w.name)))?;
                let v = self.gguf.tensor_data(t).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                freqs = Some((w.name.clone(), v));
            }
            let divisors = r.freqs.as_ref().and(freqs.as_ref()).map(|f| &f.1[..]);
            let mut cache = vec![0f32; r.rope.n_rot];
            // A rotation only: the attention factor (LongRoPE's and YaRN's `mscale`) is in the
            // stored keys already. (llama.cpp 4df29be's shift applies it again, so its keys grow
            // by the factor at every shift; corelm's keep the length a fresh prefill gives them.)
            rope_cache(-(discard as i32), r.rope.n_rot, &Angles { mscale: 1.0, ..r.rope.angles() }, divisors, &mut cache);
            caches.push((cache, r.rope.n_rot, r.rope.neox));
        }
        let kernels = self.kernels;
        let mut rotate = |l: usize, key: &mut [f32]| {
            let (cache, n_rot, neox) = &caches[l];
            // (A layer without RoPE, SmolLM3's every fourth, rotates nothing: llama.cpp 4df29be's
            // shift rotates those keys too.)
            if *n_rot > 0 {
                rope_apply(kernels, key, cache, *n_rot, *neox);
            }
        };
        // The device's layers (their rows indexed by the same cells) move the same rows, once
        // it holds those CPU passes wrote (`--accel-min-tokens`), read before the CPU's move.
        if let Some(d) = &self.device_layers {
            d.upload_stale(&self.kv, kernels);
        }
        // The CPU cache's rows of the device's layers are read only where CPU passes run them
        // too (`--accel-min-tokens`); elsewhere they are not moved.
        let cpu_layers = match &self.device_layers {
            Some(d) if !d.keeps_cpu_rows() => d.n_layers()..n_layer,
            _ => 0..n_layer,
        };
        let moved = self.kv.shift(kernels, s, keep, discard, cpu_layers, &mut rotate).map_err(|e| Error::Config(format!("context shift: {e}")))?;
        if let Some(d) = &self.device_layers {
            d.shift(&moved, &mut rotate);
        }
        Ok(())
    }
}

impl Engine {
    /// Layer `layer`'s key and value rows of position `pos` of sequence `seq`, as f32 (each
    /// `[kv_slots, head_dim]`), for inspecting the cache (a layer on the device: its rows
    /// there); `None` out of range or where the device cannot be read.
    pub fn kv_cell(&self, seq: i32, pos: usize, layer: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        let s = self.seq_index(seq)?;
        let kv = &self.kv;
        if pos >= kv.blocks.len(s) || layer >= kv.n_layer {
            return None;
        }
        let cell = kv.blocks.cell(s, pos) as u32;
        if let Some(d) = self.device_layers.as_ref().filter(|d| layer < d.n_layers()) {
            return d.cell(layer, cell).ok();
        }
        let n = kv.n_kv_head * kv.head_dim;
        let (mut k, mut v) = (vec![0f32; n], vec![0f32; n]);
        kv.load_cells(self.kernels, layer, &[cell], &mut k, &mut v);
        Some((k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::{drop_shifted, shift_cut};

    #[test]
    fn a_history_loses_the_dropped_positions() {
        // Positions 0..10, the last one (9) the next token: drop 2..5.
        let mut h: Vec<u32> = (0..10).collect();
        drop_shifted(&mut h, 9, 2, 3);
        assert_eq!(h, [0, 1, 5, 6, 7, 8, 9]);
        // A history from position 4 on (a session's later turn): it holds only 4 of 2..5.
        let mut h: Vec<u32> = (4..10).collect();
        drop_shifted(&mut h, 9, 2, 3);
        assert_eq!(h, [5, 6, 7, 8, 9]);
        // From past the range: nothing of it.
        let mut h: Vec<u32> = (7..10).collect();
        drop_shifted(&mut h, 9, 2, 3);
        assert_eq!(h, [7, 8, 9]);
    }

    #[test]
    fn the_cut_is_llama_servers() {
        // n_keep 0 with a BOS: keep 1, drop half of the rest.
        assert_eq!(shift_cut(2048, 10, 0, 0, true, 2048), (1, 1023));
        // The whole prompt kept; a stated drop, held to all but one of the rest.
        assert_eq!(shift_cut(512, 100, -1, 0, false, 512), (100, 206));
        assert_eq!(shift_cut(512, 100, -1, 1000, false, 512), (100, 411));
        // keep at most n_ctx - 4.
        assert_eq!(shift_cut(64, 64, -1, 0, false, 64), (60, 2));
    }
}
