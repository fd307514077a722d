//! The sequences in the paged KV cache: lengths, room, prefixes attached, sequences cut back
//! or forgotten. A sequence id names one of `n_seq_max` block tables.

use super::Engine;
use corelm_core::kv::BLOCK;

impl Engine {
    /// `seq` as an index, if it names one of the `n_seq_max` sequences.
    pub(super) fn seq_index(&self, seq: i32) -> Option<usize> {
        usize::try_from(seq).ok().filter(|&s| s < self.cfg.n_seq_max)
    }

    /// Tokens stored for a sequence (its next position).
    pub fn seq_len(&self, seq: i32) -> usize {
        self.seq_index(seq).map_or(0, |s| self.kv.blocks.len(s))
    }

    /// The tokens sequence `seq` holds, in position order (after a context shift, the ones
    /// it kept).
    pub fn seq_tokens(&self, seq: i32) -> Vec<u32> {
        self.seq_index(seq).map_or(vec![], |s| self.kv.blocks.seq_tokens(s).collect())
    }

    /// Cells in blocks no sequence holds (free or cached-evictable).
    pub fn free_cells(&self) -> usize {
        self.kv.blocks.available() * BLOCK
    }

    /// Tokens `seq` can still append: the rest of its last block plus the available blocks,
    /// capped by `n_ctx`.
    pub fn room(&self, seq: i32) -> usize {
        self.seq_index(seq)
            .map_or(0, |s| self.kv.blocks.room(s).min(self.cfg.n_ctx.saturating_sub(self.kv.blocks.len(s))))
    }

    /// The paged KV cache's block accounting (tables, prefix cache, counters).
    pub fn blocks(&self) -> &corelm_core::kv::Blocks {
        &self.kv.blocks
    }

    /// Start the empty sequence `seq` on cached blocks holding a prefix of `tokens`; returns
    /// how many leading tokens are already in the cache (a multiple of the block size, and
    /// always less than `tokens.len()`). Feed the rest.
    pub fn attach_prefix(&mut self, seq: i32, tokens: &[u32]) -> usize {
        self.seq_index(seq).map_or(0, |s| self.kv.blocks.attach_prefix(s, tokens))
    }

    /// Forget a sequence: release its blocks (full ones stay cached for prefix reuse).
    pub fn clear_seq(&mut self, seq: i32) {
        if let Some(s) = self.seq_index(seq) {
            self.kv.blocks.release(s);
        }
    }

    /// Cut sequence `seq` back to its first `len` tokens (draft tokens a pass rejected); the
    /// next token goes to position `len`. Layers on the device need nothing more: their cache
    /// is indexed by the same block tables, and the next pass writes those positions' rows.
    pub fn truncate_seq(&mut self, seq: i32, len: usize) {
        if let Some(s) = self.seq_index(seq) {
            self.kv.blocks.truncate(s, len);
        }
    }

    /// Forget every sequence and every cached prefix.
    pub fn clear_all(&mut self) {
        for s in 0..self.cfg.n_seq_max as i32 {
            self.clear_seq(s);
        }
        self.kv.blocks.clear_cache();
    }
}
