//! Context shift (llama.cpp's `--context-shift`): a sequence that has filled its context drops
//! `discard` tokens after its first `keep` and goes on. The rows after the dropped ones move
//! down by `discard` positions, their keys rotated back by `discard` positions (the caller's
//! `rotate`: keys are stored with their position's RoPE applied), and the blocks freed at the
//! end go back to the pool.
//!
//! Blocks the move writes are made the sequence's own first: a shared block (attached from the
//! prefix cache, or attached by another sequence since) is copied to a fresh one, a registered
//! one leaves the prefix map. The moved rows attended to the dropped tokens when they were
//! computed, so they are not what a prefill of the shifted tokens gives: the sequence fills no
//! registered block until it is released.
//!
//! Invariant: a shift writes only blocks that one sequence references and no key names.

use super::{cell_in, Blocks, KvCache, BLOCK, NIL};
use corelm_kernels::Kernels;

/// Why a context shift was refused; nothing is changed then.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ShiftError {
    #[error("a context shift keeps {keep} and drops {discard} of the sequence's {len} tokens: keep + drop must be at most its length, and the drop at least 1")]
    Range { keep: usize, discard: usize, len: usize },
    #[error("a context shift needs {needed} free blocks to copy shared blocks of the sequence, {free} are free")]
    NoRoom { needed: usize, free: usize },
}

/// The rows a shift moved, in the order it moved them (each row read before any move lands on
/// it): `(from, to)` cells, the first `copied` of them kept rows copied out of a shared block
/// (their keys not rotated), the rest the rows after the dropped tokens. Another cache indexed
/// by the same cells (the accelerator's layers) repeats them.
#[derive(Debug, Default, PartialEq)]
pub struct Moved {
    pub cells: Vec<(u32, u32)>,
    pub copied: usize,
}

impl Blocks {
    /// Whether `seq`'s context was shifted since it was last empty.
    pub fn is_shifted(&self, seq: usize) -> bool {
        self.shifted[seq]
    }

    /// Blocks a shift of `seq` keeping `keep` tokens takes from the pool for good: the shared
    /// ones from the block holding position `keep` on, which it copies or leaves to the
    /// sequences sharing them.
    pub fn shift_copies(&self, seq: usize, keep: usize) -> usize {
        self.tables[seq].iter().skip(keep / BLOCK).filter(|&&b| self.refs[b as usize] > 1).count()
    }

    /// The block-table side of a shift: from the block holding position `keep` on, `seq`'s
    /// blocks that stay are made its own (a shared block replaced by a fresh one, a registered
    /// one unregistered), the moved positions' tokens copied, the blocks past the new length
    /// dropped. Returns the old table (read from while the caller moves the rows) and the
    /// blocks whose reference is to be dropped once the rows are moved.
    fn shift_tables(&mut self, seq: usize, keep: usize, discard: usize) -> Result<(Vec<u32>, Vec<u32>), ShiftError> {
        let len = self.lens[seq];
        if discard == 0 || keep + discard > len {
            return Err(ShiftError::Range { keep, discard, len });
        }
        let new_len = len - discard;
        let (first, kept) = (keep / BLOCK, new_len.div_ceil(BLOCK));
        let old = self.tables[seq].clone();
        let shared = old[first..kept].iter().filter(|&&b| self.refs[b as usize] > 1).count();
        if shared > self.available() {
            return Err(ShiftError::NoRoom { needed: shared, free: self.available() });
        }
        // Fresh blocks first, while every block of `old` is still referenced: `take` may evict
        // a cached block, never one of these.
        let mut release = Vec::with_capacity(old.len() - first);
        for (i, &b) in old.iter().enumerate().take(kept).skip(first) {
            if self.refs[b as usize] > 1 {
                let fresh = self.take().expect("free blocks counted");
                self.refs[fresh as usize] = 1;
                self.tables[seq][i] = fresh;
                release.push(b);
            } else if self.key[b as usize].is_some() {
                self.unregister(b);
            }
        }
        release.extend_from_slice(&old[kept..]);
        self.tables[seq].truncate(kept);
        // Rows of a copied block before `keep` (the block holding it) keep their tokens.
        for p in first * BLOCK..keep {
            self.tokens[cell_in(&self.tables[seq], p)] = self.tokens[cell_in(&old, p)];
        }
        for p in keep..new_len {
            self.tokens[cell_in(&self.tables[seq], p)] = self.tokens[cell_in(&old, p + discard)];
        }
        self.lens[seq] = new_len;
        self.shifted[seq] = true;
        Ok((old, release))
    }
}

impl KvCache {
    /// Drop `seq`'s tokens `keep..keep + discard`: the rows after them move down by `discard`
    /// positions, each key (`head_dim` f32 of one KV head) passed through `rotate(layer, key)`
    /// on the way, which rotates it back by `discard` positions; values are copied as they are.
    /// Keys in F16 or quantized are converted to f32 and back, as llama.cpp's shift does.
    /// Rows move in `layers` only (the others' rows, of layers an accelerator runs with its own
    /// cache, are read by no one). Returns the moves made.
    pub fn shift(&mut self, kernels: &Kernels, seq: usize, keep: usize, discard: usize, layers: std::ops::Range<usize>, rotate: &mut dyn FnMut(usize, &mut [f32])) -> Result<Moved, ShiftError> {
        assert!(layers.end <= self.n_layer, "layers {layers:?} of {}", self.n_layer);
        let first = keep / BLOCK;
        let (old, release) = self.blocks.shift_tables(seq, keep, discard)?;
        let new_len = self.blocks.lens[seq];
        let table = &self.blocks.tables[seq];
        // (from, to) cells: the kept rows of a copied block, then the moved rows.
        let moves: Vec<(usize, usize)> = (first * BLOCK..keep)
            .filter(|&p| table[p / BLOCK] != old[p / BLOCK])
            .map(|p| (cell_in(&old, p), cell_in(table, p)))
            .chain((keep..new_len).map(|p| (cell_in(&old, p + discard), cell_in(table, p))))
            .collect();
        let n_kept = moves.len() - (new_len - keep);
        let (krb, vrb) = self.row_bytes();
        let to_f32 = kernels.to_float(self.k_type).expect("KV cache type checked at start-up");
        let (qk, _) = self.converters(kernels);
        let mut key = vec![0f32; self.head_dim];
        let mut bytes = vec![0u8; krb];
        for l in layers {
            let (kp, vp) = self.layer_ptrs(l);
            for h in 0..self.n_kv_head {
                let base = h * self.n_cells;
                // Ascending positions: a row is read before the move that lands on it (a
                // destination lies below its source, and a block of `old` kept in the table
                // is written only from positions after it).
                for (i, &(from, to)) in moves.iter().enumerate() {
                    let (from, to) = (base + from, base + to);
                    debug_assert!(from != to || i < n_kept);
                    // SAFETY: both rows lie inside layer l's storage (cells < n_cells, head <
                    // n_kv_head); `&mut self` makes this the only access to the cache; the key
                    // is read whole before it is written.
                    unsafe {
                        self.key_bytes(kp, from, &mut bytes);
                        if i >= n_kept {
                            to_f32(&bytes, &mut key);
                            rotate(l, &mut key);
                            qk(&key, &mut bytes);
                        }
                        self.put_key_bytes(kp, to, &bytes);
                        std::ptr::copy(vp.add(from * vrb), vp.add(to * vrb), vrb);
                    }
                }
            }
        }
        for &b in &release {
            self.blocks.unref(b);
        }
        debug_assert!(self.blocks.tables[seq].iter().all(|&b| b != NIL));
        Ok(Moved { cells: moves.iter().map(|&(f, t)| (f as u32, t as u32)).collect(), copied: n_kept })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shift_moves_tokens_copies_shared_blocks_and_registers_nothing_after() {
        let mut b = Blocks::new(8, 2);
        let toks: Vec<u32> = (0..3 * BLOCK as u32 + 4).collect();
        for &t in &toks {
            b.append(0, t);
        }
        // Sequence 1 shares the first two blocks.
        let prompt: Vec<u32> = toks[..2 * BLOCK + 1].to_vec();
        assert_eq!(b.attach_prefix(1, &prompt), 2 * BLOCK);
        let (t0, t1) = (b.table(0).to_vec(), b.table(1).to_vec());
        assert_eq!(&t0[..2], &t1[..2]);
        let (keep, discard) = (BLOCK + 3, BLOCK + 2);
        let (old, release) = b.shift_tables(0, keep, discard).unwrap();
        assert_eq!(old, t0);
        let new_len = toks.len() - discard;
        assert_eq!(b.len(0), new_len);
        // Block 0 (before keep) is still shared; block 1 (holding keep) was copied, block 3 cut.
        assert_eq!(b.table(0)[0], t0[0]);
        assert_ne!(b.table(0)[1], t0[1]);
        assert_eq!(b.table(0).len(), new_len.div_ceil(BLOCK));
        assert_eq!(release, vec![t0[1], t0[3]]);
        let expect: Vec<u32> = toks[..keep].iter().chain(&toks[keep + discard..]).copied().collect();
        let got: Vec<u32> = (0..new_len).map(|p| b.tokens[b.cell(0, p)]).collect();
        assert_eq!(got, expect);
        for &r in &release {
            b.unref(r);
        }
        // Sequence 1 still finds its prefix; the shifted sequence fills no registered block.
        assert!(b.is_shifted(0));
        let cached = b.map.len();
        for t in 100..100 + BLOCK as u32 {
            b.append(0, t);
        }
        assert_eq!(b.map.len(), cached);
        b.release(0);
        assert!(!b.is_shifted(0));
        b.release(1);
        assert_eq!(b.available(), 8);
        assert_eq!(
            b.shift_tables(1, 0, 1),
            Err(ShiftError::Range { keep: 0, discard: 1, len: 0 })
        );
    }

    #[test]
    fn a_shift_without_room_for_copies_changes_nothing() {
        let mut b = Blocks::new(3, 2);
        for t in 0..BLOCK as u32 * 2 {
            b.append(0, t);
        }
        let prompt: Vec<u32> = (0..BLOCK as u32 * 2 + 1).collect();
        b.attach_prefix(1, &prompt);
        b.append(1, 7);
        let table = b.table(0).to_vec();
        assert_eq!(b.shift_tables(0, 1, 4), Err(ShiftError::NoRoom { needed: 2, free: 0 }));
        assert_eq!((b.table(0), b.len(0), b.is_shifted(0)), (&table[..], 2 * BLOCK, false));
    }
}
