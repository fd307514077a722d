//! Split-KV decode's partials, shared by the workers of one attention node
//! ([`Ctx::split_decode`](super::Ctx)): llama.cpp cuts a one-row decode over 512+ cells into one
//! range of cells per thread and folds the ranges' partials in order. Here the (KV head, range)
//! units are dealt to the workers, each worker writes its units' partials — per query head the
//! range's (maximum, sum) and unnormalised values — into their slots, and counts them per head
//! group; the worker that writes a group's last range folds the group's heads
//! (`attention::fold_ranges`, in range order, whoever wrote which range). No barrier inside the
//! node: the one after it orders the folds before the next node.
//!
//! Invariant: a group's count is back at 0 when a node ends (its folder resets it), and
//! [`SplitParts::reset`] zeroes every count before a graph runs.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The slots of every (range, query head) pair, and a count per head group.
pub(super) struct SplitParts {
    heads: usize,
    ranges: usize,
    head_dim: usize,
    /// `[range][head]` (maximum, sum).
    states: Box<[UnsafeCell<[f32; 2]>]>,
    /// `[range][head][d]` unnormalised values, `d` the node's head dimension (at most
    /// `head_dim`).
    values: Box<[UnsafeCell<f32>]>,
    /// Per group, named by its first query head: ranges written in this node.
    written: Box<[AtomicUsize]>,
}

// SAFETY: slots are written by one worker each per node and read only by the worker whose
// count completed the group, after an acquire of every writer's release (`written`); between
// nodes the barrier orders everything.
unsafe impl Sync for SplitParts {}

impl SplitParts {
    /// Slots for `heads` query heads (the model's), up to `ranges` ranges of heads of up to
    /// `head_dim` values.
    pub(super) fn new(heads: usize, ranges: usize, head_dim: usize) -> Self {
        SplitParts {
            heads,
            ranges,
            head_dim,
            states: (0..heads * ranges).map(|_| UnsafeCell::new([0.0; 2])).collect(),
            values: (0..heads * ranges * head_dim).map(|_| UnsafeCell::new(0.0)).collect(),
            written: (0..heads).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    /// Whether heads `heads` (the model's indices) of dimension `head_dim` cut into `ranges`
    /// ranges have slots.
    pub(super) fn fits(&self, heads: std::ops::Range<usize>, ranges: usize, head_dim: usize) -> bool {
        heads.end <= self.heads && ranges <= self.ranges && head_dim <= self.head_dim
    }

    /// Every count at 0 (a run cut short by a panic could leave one behind).
    pub(super) fn reset(&self) {
        self.written.iter().for_each(|w| w.store(0, Ordering::Relaxed));
    }

    /// Range `r`'s slots of heads `heads`: their states and their values (`head_dim` each).
    ///
    /// # Safety
    /// `fits(heads, r + 1, head_dim)`; no other reference to these slots lives (one writer per
    /// (range, head) in a node, no reader before [`SplitParts::written`] completes the group).
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn slots(&self, r: usize, heads: std::ops::Range<usize>, head_dim: usize) -> (&mut [[f32; 2]], &mut [f32]) {
        debug_assert!(self.fits(heads.clone(), r + 1, head_dim));
        let (at, n) = (r * self.heads + heads.start, heads.len());
        // SAFETY: `at .. at + n` and its values lie inside the slots (`fits`); `UnsafeCell<T>`
        // has `T`'s layout, so the cells are a run of plain values; exclusive (the contract).
        unsafe {
            (
                std::slice::from_raw_parts_mut(UnsafeCell::raw_get(self.states.as_ptr().add(at)), n),
                std::slice::from_raw_parts_mut(UnsafeCell::raw_get(self.values.as_ptr().add(at * head_dim)), n * head_dim),
            )
        }
    }

    /// Head `h`'s partial of range `r`: its state and its values.
    ///
    /// # Safety
    /// The slot was written in this node, ordered before this read ([`SplitParts::written`]
    /// returned true to this worker).
    pub(super) unsafe fn part(&self, r: usize, h: usize, head_dim: usize) -> ([f32; 2], &[f32]) {
        let at = r * self.heads + h;
        // SAFETY: inside the slots (the writer's `fits`); no writer now (the contract).
        unsafe { (*self.states[at].get(), std::slice::from_raw_parts(UnsafeCell::raw_get(self.values.as_ptr().add(at * head_dim)), head_dim)) }
    }

    /// One more range of the group whose first head is `h0` written, of `ranges`: true for the
    /// worker that wrote the last, which then folds the group (and its count starts again).
    pub(super) fn written(&self, h0: usize, ranges: usize) -> bool {
        // AcqRel: the last writer's increment acquires every earlier writer's release.
        let done = self.written[h0].fetch_add(1, Ordering::AcqRel) + 1 == ranges;
        if done {
            self.written[h0].store(0, Ordering::Relaxed);
        }
        done
    }
}
