//! Context shift while serving (`Request::context_shift`, `serve --context-shift`): before a
//! step, a decoding sequence whose next token would fill the context drops tokens after its first kept
//! ones ([`crate::Engine::shift_seq`], llama-server's cut: [`crate::shift_cut`]) and decodes
//! on. Its table shrinks, so the blocks it may still take grow back to its reservation; the
//! shared blocks the shift copies or leaves behind come out of the free blocks no admitted
//! request is owed, and where those do not cover them the answer ends with `Length`, as it
//! would without a shift. Drafts follow: the sequence's history and a draft model's cache
//! drop the same tokens.

use super::{Batcher, FinishReason};
use crate::engine::drop_shifted;
use crate::shift_cut;

impl Batcher {
    /// Shift each decoding sequence whose context is full and whose request asks for it.
    pub(super) fn shift_full(&mut self) {
        let n_ctx = self.engine.config().n_ctx;
        for s in 0..self.slots.len() {
            let Some(r) = self.slots[s].as_ref() else { continue };
            let len = self.engine.seq_len(r.seq);
            let Some(c) = r.req.context_shift.filter(|c| r.next.is_some() && c.is_due(len, n_ctx)) else { continue };
            let n_ctx = c.limit(n_ctx);
            let (seq, n_prompt) = (r.seq, r.req.prompt.len());
            let (keep, discard) = shift_cut(len, n_prompt, c.n_keep, c.n_discard, self.tok.add_bos, n_ctx);
            let slack = self.engine.blocks().available().saturating_sub(self.outstanding());
            let blocks = self.engine.blocks().shift_copies(s, keep);
            if discard == 0 || blocks > slack {
                self.end(seq, FinishReason::Length);
                continue;
            }
            match self.engine.shift_seq(seq, keep, discard) {
                Ok(()) => {
                    let r = self.slots[s].as_mut().expect("running");
                    r.dropped += discard;
                    // The drafts' history (its last token, `next`, goes to `len`) and the
                    // draft model's cache drop the same tokens.
                    drop_shifted(&mut r.history, len, keep, discard);
                    if let Some(m) = self.model.as_mut() {
                        m.shift(seq, keep, discard);
                    }
                    self.stats.shifts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => self.end(seq, FinishReason::Error(e.to_string())),
            }
        }
    }
}
