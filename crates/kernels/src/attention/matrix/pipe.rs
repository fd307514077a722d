//! Prefill attention as a pipeline (SMEPilot's attention): the column-key algorithm
//! (`model.rs`) cut into three phases per tile of [`TILE_BLOCKS`] key blocks — the **scores**
//! (`QKᵀ`, a matrix phase), the **softmax** step (mask, maximum, exponentials, sums: the vector
//! phase) and the **values** (`PV` and the rescale, a matrix phase) — so that different tiles
//! are in flight at once on different workers: while one worker sums a tile's values, another
//! runs the next tile's softmax and a third scores the tile after it, of the same item or of
//! others. A matrix-unit worker ([`Role::Matrix`]) takes the matrix phases first and a vector
//! worker ([`Role::Vector`]) the softmax first; either takes whatever is ready rather than
//! wait, so no worker idles while work is ready.
//!
//! An item is a block of rows of one sequence with the query heads of one KV head (as the
//! fused kernels' items); its phases over tile `t` depend on each other as
//! `scores(t) → softmax(t) → values(t)`, `softmax(t−1) → softmax(t)` (the running maximum and
//! sums), `values(t−1) → values(t)` (the accumulators), and `values(t − RING) → scores(t)` (the
//! ring of tile buffers). Only the blocks some row of the item sees are tiled (the causal mask
//! ends an item's range at its last row, a window starts it at its first row's window), and a
//! block inside that range no row sees is neither scored nor summed.
//!
//! Every phase computes exactly what `model.rs` computes for its block, so the results are the
//! fused column-key kernels' bits whichever worker ran which phase, on which table.
//!
//! The state lives in a fixed set of slots allocated once ([`Pipeline::new`]); a slot holds one
//! item in flight. Claims are flags per (slot, phase); progress is a count of tiles per
//! (slot, phase), published with release stores and read with acquire loads, so a phase sees
//! everything the phases it depends on wrote. A slot is refilled only by a worker holding all
//! three of its flags, so a worker holding one sees the slot's item and counts unchanged.

use super::drive::{self, ColumnOps};
use super::model::{span_mask, C};
use crate::attention::types::{KvRows, MatrixScratch, ROWS_MAX_VECTORS as V};
use crate::DType;
use crate::simd::reduce_add_16;
use half::f16;
use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

/// Key blocks (of 16 cells) per tile: the unit of one phase task.
pub const TILE_BLOCKS: usize = 8;
/// Tiles of one item between its scores and its values (the ring of tile buffers).
const RING: usize = 3;
/// Entries of one tile buffer: a block's vectors, block by block.
const ENTRY: usize = TILE_BLOCKS * V;

/// Which phases a worker takes first.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// One kind of core: the phases of the items it started (values, softmax, scores: the
    /// furthest along first), then a new item, then others' phases that are ready — an item's
    /// buffers move between cores only when that keeps a worker from idling.
    Any,
    /// A matrix-unit worker: values, scores, a new item, then the softmax.
    Matrix,
    /// A vector worker: the softmax, then the others.
    Vector,
}

/// One item: `rows` rows of one sequence, each with the `heads` query heads of one KV head.
#[derive(Clone, Copy)]
pub struct PipeItem<'a> {
    /// The KV head's rows (keys in columns).
    pub kv: KvRows<'a>,
    pub heads: usize,
    pub rows: usize,
    /// Row `r`'s queries: `heads · head_dim` f32 from `q[r · stride]`.
    pub q: &'a [f32],
    /// Row `r`'s output: `heads · head_dim` f32 from `out + r · stride`.
    pub out: *mut f32,
    pub stride: usize,
    /// The logical cells row `r` sees: `span_of(row0 + r)`.
    pub row0: usize,
    pub span_of: &'a dyn Fn(usize) -> Range<usize>,
}

impl PipeItem<'_> {
    /// The logical cells row `r` of the item sees.
    fn span(&self, r: usize) -> Range<usize> {
        (self.span_of)(self.row0 + r)
    }
}

/// A phase of a tile.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Phase {
    Scores = 0,
    Softmax = 1,
    Values = 2,
}

/// An item's shape, set when it enters a slot.
#[derive(Clone, Copy, Default)]
pub(super) struct Meta {
    /// Vectors (rows × heads).
    n: usize,
    /// The key blocks some row sees: `first..end`, in `tiles` tiles.
    first: usize,
    end: usize,
    tiles: usize,
}

/// One item in flight.
pub(super) struct Slot {
    /// The item's index + 1; 0: free.
    item: AtomicUsize,
    /// The worker that started it.
    owner: AtomicUsize,
    /// Claims per phase.
    busy: [AtomicBool; 3],
    /// Tiles through each phase.
    done: [AtomicUsize; 3],
    meta: UnsafeCell<Meta>,
    /// Per row: the logical cells it sees (set with `meta`).
    spans: UnsafeCell<[(u32, u32); V]>,
    /// Per vector: running maximum and sums (the softmax phase's).
    m: Box<[UnsafeCell<f32>]>,
    l: Box<[UnsafeCell<[f32; C]>]>,
    /// `[vector][head_dim]` accumulators (the values phase's).
    acc: Box<[UnsafeCell<f32>]>,
    /// RING tile buffers of ENTRY entries (entry `b·V + i`: vector `i` over the tile's block
    /// `b`): scores, then probabilities; their rescale factors and visible cells.
    p: Box<[UnsafeCell<Line>]>,
    corr: Box<[UnsafeCell<f32>]>,
    vis: Box<[UnsafeCell<u16>]>,
}

/// One vector's 16 scores or probabilities on a cache line of its own (a store or load of
/// them never splits across two lines).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; C]);
const _: () = assert!(std::mem::size_of::<Line>() == 4 * C);

/// Lines `a..a + len` of `b` as 16-float arrays.
///
/// # Safety
/// As [`cells`].
#[allow(clippy::mut_from_ref)]
unsafe fn lines(b: &[UnsafeCell<Line>], a: usize, len: usize) -> &mut [[f32; C]] {
    assert!(a + len <= b.len());
    // SAFETY: in bounds (asserted); a `Line` is 16 f32 (`repr(C)`, size 64), so `len` of them
    // are `len` arrays of 16 f32, suitably aligned; exclusive by the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(b.as_ptr().add(a)) as *mut [f32; C], len) }
}

/// Cells `a..a + len` of `b` as a slice.
///
/// # Safety
/// Nobody else reads or writes those cells while the slice lives (the pipeline's claims).
#[allow(clippy::mut_from_ref)]
unsafe fn cells<T>(b: &[UnsafeCell<T>], a: usize, len: usize) -> &mut [T] {
    assert!(a + len <= b.len());
    // SAFETY: in bounds (asserted); `UnsafeCell<T>` has `T`'s layout; the pointer comes from
    // the whole slice; exclusive by the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(b.as_ptr().add(a)), len) }
}

fn boxed<T: Copy>(x: T, n: usize) -> Box<[UnsafeCell<T>]> {
    (0..n).map(|_| UnsafeCell::new(x)).collect()
}

impl Slot {
    fn new(head_dim: usize) -> Self {
        Slot {
            item: AtomicUsize::new(0),
            owner: AtomicUsize::new(usize::MAX),
            busy: Default::default(),
            done: Default::default(),
            meta: UnsafeCell::new(Meta::default()),
            spans: UnsafeCell::new([(0, 0); V]),
            m: boxed(0.0, V),
            l: boxed([0.0; C], V),
            acc: boxed(0.0, V * head_dim),
            p: boxed(Line([0.0; C]), RING * ENTRY),
            corr: boxed(0.0, RING * ENTRY),
            vis: boxed(0, RING * ENTRY),
        }
    }

    fn claim(&self, ph: usize) -> bool {
        self.busy[ph].compare_exchange(false, true, Acquire, Relaxed).is_ok()
    }

    fn release(&self, ph: usize) {
        self.busy[ph].store(false, Release);
    }

    /// Whether phase `ph` of tile `done[ph]` can run (the caller holds its claim).
    fn ready(&self, ph: usize, tiles: usize) -> bool {
        let d = |p: usize| self.done[p].load(Acquire);
        match ph {
            0 => d(0) < tiles && d(0) < d(2) + RING,
            1 => d(1) < d(0),
            _ => d(2) < d(1),
        }
    }
}

/// The shared state of pipelined attention nodes: slots for the items in flight, allocated
/// once for one head dimension, reused by every node and token.
pub struct Pipeline {
    slots: Box<[Slot]>,
    head_dim: usize,
    /// Items started, items finished, workers done with the current node.
    next: AtomicUsize,
    finished: AtomicUsize,
    leavers: AtomicUsize,
    /// Key blocks scored since creation (each block of each item some row sees, once).
    blocks: AtomicU64,
}

// SAFETY: the slots' cells are only touched under the claims described in the module doc.
unsafe impl Sync for Pipeline {}
// SAFETY: as above; nothing in it is tied to a thread.
unsafe impl Send for Pipeline {}

/// One phase task: what `run_task` computes.
pub(super) struct Task<'a> {
    pub(super) phase: Phase,
    slot: &'a Slot,
    meta: Meta,
    item: &'a PipeItem<'a>,
    scale: f32,
    /// The tile.
    t: usize,
}

impl Pipeline {
    /// Slots for `n_slots` items in flight of rows of `head_dim` (at least 1).
    pub fn new(head_dim: usize, n_slots: usize) -> Self {
        Pipeline {
            slots: (0..n_slots.max(1)).map(|_| Slot::new(head_dim)).collect(),
            head_dim,
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            leavers: AtomicUsize::new(0),
            blocks: AtomicU64::new(0),
        }
    }

    /// The head dimension of the rows it holds.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Key blocks scored since creation: what the mask left to compute.
    pub fn blocks_scored(&self) -> u64 {
        self.blocks.load(Relaxed)
    }

    /// Worker `ith` of `nth`'s share of one node: items `0..n_items` (`item(k)`), phases run as
    /// they become ready, preferring `role`'s; returns when every item is finished.
    ///
    /// # Safety
    /// All `nth` workers of the node call it, each once, with the same `n_items`, `item` (the
    /// same items whenever called), `scale` and `nth`; no other node uses the pipeline
    /// meanwhile; `item(k).out` row `r < rows` holds `heads · head_dim` writable f32 that
    /// nothing else reads or writes during the node, disjoint between items; rows ≤ 64 / heads
    /// and the pipeline's head dimension is the items'.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn run<'a>(&self, run_task: &mut dyn FnMut(&Task) -> usize, role: Role, ith: usize, nth: usize, n_items: usize, item: &dyn Fn(usize) -> PipeItem<'a>, scale: f32) {
        // (phase, own items only): 0 scores, 1 softmax, 2 values, 3 start an item.
        const ANY: [(usize, bool); 7] = [(2, true), (1, true), (0, true), (3, false), (2, false), (1, false), (0, false)];
        const MATRIX: [(usize, bool); 4] = [(2, false), (0, false), (3, false), (1, false)];
        const VECTOR: [(usize, bool); 4] = [(1, false), (2, false), (0, false), (3, false)];
        let order: &[(usize, bool)] = match role {
            Role::Any => &ANY,
            Role::Matrix => &MATRIX,
            Role::Vector => &VECTOR,
        };
        let w = self.slots.len();
        while self.finished.load(Acquire) < n_items {
            let mut ran = false;
            'find: for &(ph, own) in order {
                if ph == 3 {
                    if self.start(ith, n_items, item) {
                        ran = true;
                        break 'find;
                    }
                    continue;
                }
                for j in 0..w {
                    let slot = &self.slots[(ith + j) % w];
                    let k = slot.item.load(Acquire);
                    if k == 0 || (own && slot.owner.load(Relaxed) != ith) || slot.busy[ph].load(Relaxed) || !slot.claim(ph) {
                        continue;
                    }
                    // SAFETY: the claim: the slot is not refilled while it is held.
                    let meta = unsafe { *slot.meta.get() };
                    if slot.item.load(Acquire) != k || !slot.ready(ph, meta.tiles) {
                        slot.release(ph);
                        continue;
                    }
                    let t = slot.done[ph].load(Acquire);
                    let it = item(k - 1);
                    let phase = [Phase::Scores, Phase::Softmax, Phase::Values][ph];
                    let scored = run_task(&Task { phase, slot, meta, item: &it, scale, t });
                    if phase == Phase::Scores {
                        self.blocks.fetch_add(scored as u64, Relaxed);
                    }
                    if phase == Phase::Values && t + 1 == meta.tiles {
                        // SAFETY: every phase of the item is done (its counts, acquired in
                        // `ready`); the values' claim is held; the outputs are this item's.
                        unsafe { self.finish(slot, meta, &it) };
                        slot.item.store(0, Release);
                        self.finished.fetch_add(1, Release);
                    } else {
                        slot.done[ph].store(t + 1, Release);
                    }
                    slot.release(ph);
                    ran = true;
                    break 'find;
                }
            }
            if !ran {
                std::hint::spin_loop();
            }
        }
        // The last worker out resets the counts for the next node (the others are past the
        // loop, and the next node starts after a barrier the last one reaches too).
        if self.leavers.fetch_add(1, AcqRel) + 1 == nth {
            self.next.store(0, Relaxed);
            self.finished.store(0, Relaxed);
            self.leavers.store(0, Release);
        }
    }

    /// Put the next item into a free slot, if there is one of each; whether it did.
    fn start<'a>(&self, ith: usize, n_items: usize, item: &dyn Fn(usize) -> PipeItem<'a>) -> bool {
        if self.next.load(Relaxed) >= n_items {
            return false;
        }
        for slot in self.slots.iter() {
            if slot.item.load(Acquire) != 0 {
                continue;
            }
            if !slot.claim(0) {
                continue;
            }
            if !slot.claim(1) {
                slot.release(0);
                continue;
            }
            if !slot.claim(2) {
                slot.release(1);
                slot.release(0);
                continue;
            }
            let free = slot.item.load(Acquire) == 0;
            // Items start from the last: later rows see more cells, so the longest go first
            // and the node does not end on one long item with the other workers idle.
            let ticket = if free { self.next.fetch_add(1, Relaxed) } else { n_items };
            let k = if ticket < n_items { n_items - 1 - ticket } else { n_items };
            if k < n_items {
                let it = item(k);
                let n = it.rows * it.heads;
                assert!(it.q.len() >= (it.rows.max(1) - 1) * it.stride + it.heads * it.kv.head_dim, "a pipelined item's queries");
                assert!(n <= V && it.kv.head_dim == self.head_dim, "a pipelined item of {n} vectors of {} dimensions", it.kv.head_dim);
                // SAFETY: all three claims are held and the slot is free: nobody else touches it.
                unsafe {
                    let spans = &mut (&mut *slot.spans.get())[..it.rows];
                    for (r, s) in spans.iter_mut().enumerate() {
                        let span = it.span(r);
                        *s = (span.start as u32, span.end as u32);
                    }
                    let first = spans.iter().map(|s| s.0 as usize / C).min().unwrap_or(0);
                    let end = spans.iter().map(|s| (s.1 as usize).div_ceil(C)).max().unwrap_or(0).max(first);
                    // An item whose rows see nothing still passes one (empty) tile, which writes zeros.
                    let tiles = (end - first).div_ceil(TILE_BLOCKS).max(1);
                    *slot.meta.get() = Meta { n, first, end, tiles };
                    cells(&slot.m, 0, n).fill(f32::NEG_INFINITY);
                    cells(&slot.l, 0, n).fill([0.0; C]);
                    cells(&slot.acc, 0, n * self.head_dim).fill(0.0);
                }
                for d in &slot.done {
                    d.store(0, Relaxed);
                }
                slot.owner.store(ith, Relaxed);
                slot.item.store(k + 1, Release);
            }
            for ph in [2, 1, 0] {
                slot.release(ph);
            }
            return k < n_items;
        }
        false
    }

    /// The item's outputs: accumulators over the reduced sums, zeros where nothing was seen.
    ///
    /// # Safety
    /// Every phase of the item in `slot` is done and the caller holds its values' claim.
    unsafe fn finish(&self, slot: &Slot, meta: Meta, it: &PipeItem) {
        let hd = self.head_dim;
        // SAFETY: the caller's contract: the softmax phase is done with `m`, `l`.
        let (l, acc) = unsafe { (cells(&slot.l, 0, meta.n), cells(&slot.acc, 0, meta.n * hd)) };
        for r in 0..it.rows {
            // SAFETY: row r's output holds heads · hd f32, this item's only (`run`'s contract).
            let out = unsafe { std::slice::from_raw_parts_mut(it.out.wrapping_add(r * it.stride), it.heads * hd) };
            for (h, o) in out.chunks_exact_mut(hd).enumerate() {
                let i = r * it.heads + h;
                let s = reduce_add_16(&l[i]);
                if s == 0.0 {
                    o.fill(0.0);
                } else {
                    for (o, a) in o.iter_mut().zip(&acc[i * hd..(i + 1) * hd]) {
                        *o = a / s;
                    }
                }
            }
        }
    }
}

impl Task<'_> {
    /// The key blocks of the task's tile.
    pub(super) fn blocks(&self) -> Range<usize> {
        let b0 = self.meta.first + self.t * TILE_BLOCKS;
        b0..(b0 + TILE_BLOCKS).min(self.meta.end)
    }

    /// Whether the item's keys and values are F16 (else Q8_0 or Q4_0, widened as read).
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(super) fn f16_cache(&self) -> bool {
        self.item.kv.k_type == DType::F16 && self.item.kv.v_type == DType::F16
    }

    /// Vectors (rows × heads) of the item.
    pub(super) fn n(&self) -> usize {
        self.meta.n
    }

    /// The item's KV rows.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(super) fn item_kv(&self) -> &KvRows<'_> {
        &self.item.kv
    }

    /// Vector `i`'s query (`head_dim` f32).
    pub(super) fn query(&self, i: usize) -> &[f32] {
        let (hd, heads) = (self.item.kv.head_dim, self.item.heads);
        let at = (i / heads) * self.item.stride + (i % heads) * hd;
        &self.item.q[at..at + hd]
    }

    /// The tile's ring entry: probabilities (scores before the softmax), visible cells and
    /// rescale factors, entry `b·V + i` for vector `i` over the tile's block `b`.
    ///
    /// # Safety
    /// Only from the phase running this task (its claim and the counts make the entry its own).
    // The slot's cells are `UnsafeCell`s shared by the node's workers; which worker may write
    // an entry is the claims' business, so the exclusive borrow is the caller's contract.
    #[allow(clippy::type_complexity, clippy::mut_from_ref)]
    pub(super) unsafe fn entry(&self) -> (&mut [[f32; C]], &mut [u16], &mut [f32]) {
        let base = (self.t % RING) * ENTRY;
        // SAFETY: the caller's contract.
        unsafe { (lines(&self.slot.p, base, ENTRY), cells(&self.slot.vis, base, ENTRY), cells(&self.slot.corr, base, ENTRY)) }
    }

    /// The item's accumulators (`[vector][head_dim]`).
    ///
    /// # Safety
    /// Only from the values phase running this task.
    #[allow(clippy::mut_from_ref)] // as `entry`: `UnsafeCell`s, exclusive by the caller's contract
    pub(super) unsafe fn acc(&self) -> &mut [f32] {
        // SAFETY: the caller's contract.
        unsafe { cells(&self.slot.acc, 0, self.meta.n * self.item.kv.head_dim) }
    }

    /// Which cells of block `b` (the tile's `bi`-th) each vector sees, into `vis[bi·V..]`;
    /// whether any vector sees one.
    #[inline]
    pub(super) fn block_vis(&self, bi: usize, b: usize, vis: &mut [u16]) -> bool {
        let heads = self.item.heads;
        // SAFETY: written when the item entered the slot, under all three claims; read-only
        // while the item is in it.
        let spans = unsafe { &*self.slot.spans.get() };
        let mut any = 0;
        for (v, &(s, e)) in vis[bi * V..bi * V + self.meta.n].chunks_exact_mut(heads).zip(spans) {
            let m = span_mask(b, &(s as usize..e as usize));
            v.fill(m);
            any |= m;
        }
        any != 0
    }

    /// Block `b`'s 16 value rows (`16 · head_dim` F16; an F16 cache's: the matrix unit's).
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(super) fn values_of(&self, b: usize) -> *const f16 {
        debug_assert!(self.item.kv.v_type == DType::F16);
        let bb = C * 2 * self.item.kv.head_dim;
        let a = self.item.kv.table[b] as usize * bb;
        self.item.kv.v[a..a + bb].as_ptr() as *const f16
    }
}

/// Run one phase task on `ops`; returns the blocks it scored (the scores phase; else 0). A
/// Q8_0 or Q4_0 cache's blocks are widened to F16 into `ms`'s buffers as they are read (as the
/// fused kernels widen them, so the same bits).
#[inline(always)]
pub(super) fn run_task<O: ColumnOps>(ops: &O, task: &Task, ms: &mut MatrixScratch) -> usize {
    let (n, hd) = (task.n(), task.item.kv.head_dim);
    let kv = &task.item.kv;
    // SAFETY (each `entry`, `acc`, `cells`): this is the phase running `task`; `m`, `l` are
    // the softmax phase's.
    match task.phase {
        Phase::Scores => {
            let (p, vis, _) = unsafe { task.entry() };
            let mut qp = [std::ptr::null::<f32>(); V];
            for (i, q) in qp.iter_mut().enumerate().take(n) {
                *q = task.query(i).as_ptr();
            }
            let mut scored = 0;
            for (bi, b) in task.blocks().enumerate() {
                if !task.block_vis(bi, b, vis) {
                    continue;
                }
                scored += 1;
                let kt = drive::keys_f16(ops, kv, b, &mut ms.kw);
                let ahead = (b + 2 < task.meta.end).then(|| {
                    let (k, v) = kv.block(b + 2);
                    (k.as_ptr(), v.as_ptr())
                });
                for h0 in (0..n).step_by(O::SCORE_HEADS) {
                    let nh = (n - h0).min(O::SCORE_HEADS);
                    let out = &mut p[bi * V + h0..bi * V + h0 + nh];
                    drive::scores_into(ops, &qp[h0..h0 + nh], hd, kt, if h0 == 0 { ahead } else { None }, out);
                }
            }
            scored
        }
        Phase::Softmax => {
            let (p, vis, corr) = unsafe { task.entry() };
            let (m, l) = unsafe { (cells(&task.slot.m, 0, n), cells(&task.slot.l, 0, n)) };
            for bi in 0..task.blocks().len() {
                for i in 0..n {
                    let e = bi * V + i;
                    let s = ops.load(&p[e]);
                    corr[e] = ops.softmax(s, vis[e], task.scale, &mut m[i], &mut l[i], &mut p[e]);
                }
            }
            0
        }
        Phase::Values => {
            let (p, vis, corr) = unsafe { task.entry() };
            let acc = unsafe { task.acc() };
            for (bi, b) in task.blocks().enumerate() {
                let e = bi * V..bi * V + n;
                if vis[e.clone()].iter().any(|&m| m != 0) {
                    let vb = drive::values_f16(ops, kv, b, &mut ms.vw);
                    drive::values(ops, &p[e.clone()], &corr[e.clone()], &vis[e], acc, hd, vb);
                }
            }
            0
        }
    }
}
