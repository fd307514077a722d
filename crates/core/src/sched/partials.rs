//! Split-KV decode's partials, shared by the workers of one attention node
//! ([`Ctx::decode_dealt`](super::Ctx)): llama.cpp cuts a one-row decode over 512+ cells into one
//! range of cells per thread and folds the ranges' partials in order. Here the (row, KV head,
//! range, query head) units of a decode step's split rows are dealt to the workers, each worker
//! writes its units' partials — per query head the range's (maximum, sum) and unnormalised
//! values — into their slots, one row of slots per split row (up to
//! [`SplitParts::rows_for`]), and counts them per row and head group; the worker that writes a
//! group's last unit folds the group's heads (`attention::fold_ranges`, in range order, whoever
//! wrote which range). No barrier inside the node: the one after it orders the folds before the
//! next node.
//!
//! Invariant: a group's count is back at 0 when a node ends (its folder resets it), and
//! [`SplitParts::reset`] zeroes every count before a graph runs.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes the slots may take, at most, beyond [`SplitParts::rows_for`]'s four rows.
const SLOT_BYTES: usize = 4 << 20;

/// The slots of every (row, range, query head), and a count per row and head group.
pub(super) struct SplitParts {
    rows: usize,
    heads: usize,
    ranges: usize,
    head_dim: usize,
    /// `[row][range][head]` (maximum, sum).
    states: Box<[UnsafeCell<[f32; 2]>]>,
    /// `[row][range][head][d]` unnormalised values, `d` the node's head dimension (at most
    /// `head_dim`).
    values: Box<[UnsafeCell<f32>]>,
    /// `[row][group]`, a group named by its first query head: (range, head) units written in
    /// this node.
    written: Box<[AtomicUsize]>,
}

// SAFETY: slots are written by one worker each per node and read only by the worker whose
// count completed the group, after an acquire of every writer's release (`written`); between
// nodes the barrier orders everything.
unsafe impl Sync for SplitParts {}

impl SplitParts {
    /// Split rows of one decode node whose partials the slots hold at once, for `heads` query
    /// heads of up to `head_dim` values cut into up to `ranges` ranges: as many as a decode
    /// node deals split (`rows_max`, `attend::SPLIT_ROWS`) within [`SLOT_BYTES`], and at least
    /// four (SmolLM2 at 2 threads: 4.6 kB a row; Qwen2.5 at 16: 57 kB; 64 heads of 128 at 64
    /// threads: 2 MB). A step with more runs each split row's ranges on one worker
    /// (`attention_items`).
    fn rows_for(rows_max: usize, heads: usize, ranges: usize, head_dim: usize) -> usize {
        let row = heads * ranges * (head_dim * size_of::<f32>() + size_of::<[f32; 2]>());
        (SLOT_BYTES / row.max(1)).clamp(4.min(rows_max), rows_max)
    }

    /// Slots for the split rows of decode nodes that deal up to `rows_max` of them
    /// ([`rows_for`](Self::rows_for) rows), of `heads` query heads (the model's), up to
    /// `ranges` ranges of heads of up to `head_dim` values.
    pub(super) fn new(rows_max: usize, heads: usize, ranges: usize, head_dim: usize) -> Self {
        let rows = Self::rows_for(rows_max, heads, ranges, head_dim);
        let n = rows * ranges * heads;
        SplitParts {
            rows,
            heads,
            ranges,
            head_dim,
            states: (0..n).map(|_| UnsafeCell::new([0.0; 2])).collect(),
            values: (0..n * head_dim).map(|_| UnsafeCell::new(0.0)).collect(),
            written: (0..rows * heads).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    /// Whether `rows` rows of heads `heads` (the model's indices) of dimension `head_dim` cut
    /// into `ranges` ranges have slots.
    pub(super) fn fits(&self, rows: usize, heads: std::ops::Range<usize>, ranges: usize, head_dim: usize) -> bool {
        rows <= self.rows && heads.end <= self.heads && ranges <= self.ranges && head_dim <= self.head_dim
    }

    /// Where row `row`'s range `r` of head `h` starts among the slots.
    fn at(&self, row: usize, r: usize, h: usize) -> usize {
        (row * self.ranges + r) * self.heads + h
    }

    /// Every count at 0 (a run cut short by a panic could leave one behind).
    pub(super) fn reset(&self) {
        self.written.iter().for_each(|w| w.store(0, Ordering::Relaxed));
    }

    /// Row `row`'s range `r` slots of heads `heads`: their states and their values
    /// (`head_dim` each).
    ///
    /// # Safety
    /// `fits(row + 1, heads, r + 1, head_dim)`; no other reference to these slots lives (one
    /// writer per (row, range, head) in a node, no reader before [`SplitParts::written`]
    /// completes the group).
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn slots(&self, row: usize, r: usize, heads: std::ops::Range<usize>, head_dim: usize) -> (&mut [[f32; 2]], &mut [f32]) {
        debug_assert!(self.fits(row + 1, heads.clone(), r + 1, head_dim));
        let (at, n) = (self.at(row, r, heads.start), heads.len());
        // SAFETY: `at .. at + n` and its values lie inside the slots (`fits`); `UnsafeCell<T>`
        // has `T`'s layout, so the cells are a run of plain values; exclusive (the contract).
        unsafe {
            (
                std::slice::from_raw_parts_mut(UnsafeCell::raw_get(self.states.as_ptr().add(at)), n),
                std::slice::from_raw_parts_mut(UnsafeCell::raw_get(self.values.as_ptr().add(at * head_dim)), n * head_dim),
            )
        }
    }

    /// Row `row`'s partial of head `h` over range `r`: its state and its values.
    ///
    /// # Safety
    /// The slot was written in this node, ordered before this read ([`SplitParts::written`]
    /// returned true to this worker).
    pub(super) unsafe fn part(&self, row: usize, r: usize, h: usize, head_dim: usize) -> ([f32; 2], &[f32]) {
        let at = self.at(row, r, h);
        // SAFETY: inside the slots (the writer's `fits`); no writer now (the contract).
        unsafe { (*self.states[at].get(), std::slice::from_raw_parts(UnsafeCell::raw_get(self.values.as_ptr().add(at * head_dim)), head_dim)) }
    }

    /// `n` more (range, head) units of row `row`'s group whose first head is `h0` written, of
    /// `units`: true for the worker that wrote the last, which then folds the group (and its
    /// count starts again).
    pub(super) fn written(&self, row: usize, h0: usize, n: usize, units: usize) -> bool {
        let count = &self.written[row * self.heads + h0];
        // AcqRel: the last writer's increment acquires every earlier writer's release.
        let done = count.fetch_add(n, Ordering::AcqRel) + n == units;
        if done {
            count.store(0, Ordering::Relaxed);
        }
        done
    }
}
