//! Paged KV cache: the storage (preallocated, one buffer for every layer's keys and one for
//! their values so they get 2 MB pages; per layer laid out as its reader wants it —
//! `[kv_head][row][head_dim]`, so attention for one head reads contiguous rows; each row F16,
//! or Q8_0 / Q4_0 blocks when K or V is quantized; with `--kv-layout columns` each block's F16,
//! Q8_0 or Q4_0 keys transposed, `[head_dim][BLOCK]` (quantized: then the block's scales), for
//! the column-key kernels) and the [`Blocks`] that hand it out to sequences.
//!
//! Rows are grouped into blocks of [`BLOCK`] rows. Each sequence owns a block table; the token
//! at position `p` of a sequence lives in row `table[p / BLOCK] * BLOCK + p % BLOCK`, so a
//! sequence's positions are contiguous from 0 and its logical order is its position order
//! (what attention iterates). Blocks are reference counted: a full block is immutable and is
//! registered under a key chaining its tokens with its predecessor's key, so a later sequence
//! starting with the same tokens attaches the same block instead of recomputing it (prefix
//! caching). A registered block nobody references stays cached, on an LRU list, until a fresh
//! block is needed and no free block is left; a released sequence's blocks join the list last
//! block first, so eviction shortens a cached prefix from its tail and what is left of it
//! still attaches.
//!
//! Invariants: storage is sized once at creation and never reallocated; the block tables, the
//! key map and the LRU list are preallocated too, so appending tokens allocates nothing. A
//! block with a key is full and never written again.

use crate::memory::{AllocError, Buffer, Place};
use corelm_kernels::attention::{self, KeyLayout};
use corelm_kernels::quant::FromFloat;
use corelm_kernels::{DType, Kernels};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

mod shift;
pub use shift::{Moved, ShiftError};

/// log2 of the rows per block.
pub const BLOCK_SHIFT: u32 = 4;
/// Rows (tokens) per block.
pub const BLOCK: usize = 1 << BLOCK_SHIFT;
const NIL: u32 = u32::MAX;
/// Key of the empty prefix.
const ROOT: u64 = 0x9E37_79B9_7F4A_7C15;

/// Largest head dimension of a cache with keys in columns (the store converts a key on the
/// stack).
pub const COLUMNS_MAX_HEAD_DIM: usize = 1024;

/// Element types a KV cache row may have.
pub const KV_TYPES: [DType; 3] = [DType::F16, DType::Q8_0, DType::Q4_0];

pub struct KvCache {
    pub n_layer: usize,
    /// Rows per layer and KV head (`n_blocks * BLOCK`).
    pub n_cells: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub k_type: DType,
    pub v_type: DType,
    /// How the keys are laid out (`--kv-layout`): rows, or transposed per block
    /// for the column-key kernels ([`KvCache::set_key_layout`]).
    pub k_layout: KeyLayout,
    /// `[layer][kv_head][row][row bytes]` keys and values (keys in `k_layout`).
    k: Buffer,
    v: Buffer,
    /// Bytes of one layer's K and V.
    layer_bytes: (usize, usize),
    pub blocks: Blocks,
}

impl KvCache {
    /// Room for at least `n_cells` tokens (rounded up to whole blocks) shared by `n_seq`
    /// sequences.
    /// `types`: element types of K and V rows (from [`KV_TYPES`]; quantized types need
    /// `head_dim` to be a whole number of blocks, which the caller checks). `place` applies to
    /// every layer's K and V buffers; in a [`Place::Parts`] the offsets count KV heads (slots),
    /// so a tensor-parallel shard's rows can live on its node.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        n_layer: usize,
        n_cells: usize,
        n_kv_head: usize,
        head_dim: usize,
        types: (DType, DType),
        n_seq: usize,
        place: &Place,
    ) -> Result<Self, AllocError> {
        let n_blocks = n_cells.div_ceil(BLOCK);
        let n_cells = n_blocks * BLOCK;
        let too_big = || AllocError { gib: f64::INFINITY, ..AllocError::new(usize::MAX) };
        let layer_bytes = |t: DType| {
            n_kv_head.checked_mul(n_cells).and_then(|b| b.checked_mul(corelm_kernels::row_bytes(t, head_dim)))
        };
        let (kb, vb) = (layer_bytes(types.0).ok_or_else(too_big)?, layer_bytes(types.1).ok_or_else(too_big)?);
        if n_blocks >= NIL as usize {
            return Err(too_big());
        }
        let total = (kb + vb) as f64 * n_layer as f64;
        let err = |e: AllocError| AllocError { cause: e.cause, ..AllocError::new(total as usize) };
        // All layers together, before any is populated.
        crate::memory::ensure_available(total as usize).map_err(err)?;
        // Slot offsets of parts → byte offsets in the K (or V) buffer, layer after layer.
        let bytes_place = |t: DType, per_layer: usize| match place {
            Place::Parts(parts) => {
                let slot = n_cells * corelm_kernels::row_bytes(t, head_dim);
                let parts = (0..n_layer).flat_map(|l| parts.iter().map(move |(s, p)| (l * per_layer + s * slot, p.clone())));
                Place::Parts(parts.collect())
            }
            p => p.clone(),
        };
        let (kp, vp) = (bytes_place(types.0, kb), bytes_place(types.1, vb));
        // One buffer per kind for all layers: a layer's K or V alone (1.5 MB for SmolLM2 at 4096
        // cells) is too small for the kernel's 2 MB pages, and decode attention, reading rows
        // scattered over every layer's pages, missed the TLB on most of them.
        let (k_all, v_all) = (kb.checked_mul(n_layer).ok_or_else(too_big)?, vb.checked_mul(n_layer).ok_or_else(too_big)?);
        Ok(KvCache {
            n_layer,
            n_cells,
            n_kv_head,
            head_dim,
            k_type: types.0,
            v_type: types.1,
            k: Buffer::new(k_all, &kp).map_err(err)?,
            v: Buffer::new(v_all, &vp).map_err(err)?,
            layer_bytes: (kb, vb),
            k_layout: KeyLayout::Rows,
            blocks: Blocks::new(n_blocks, n_seq),
        })
    }

    /// Store keys in `layout` from now on (before any token is stored). The column layout
    /// takes F16, Q8_0 or Q4_0 keys and values; its blocks are the cache's.
    pub fn set_key_layout(&mut self, layout: KeyLayout) -> Result<(), String> {
        let columnar = |t: DType| matches!(t, DType::F16 | DType::Q8_0 | DType::Q4_0);
        if layout == KeyLayout::Columns && !(columnar(self.k_type) && columnar(self.v_type)) {
            return Err(format!("keys in columns take F16, Q8_0 or Q4_0 keys and values, the cache has {} keys and {} values", self.k_type, self.v_type));
        }
        if layout == KeyLayout::Columns && self.head_dim > COLUMNS_MAX_HEAD_DIM {
            return Err(format!("keys in columns take head dimensions up to {COLUMNS_MAX_HEAD_DIM}, the model's is {}", self.head_dim));
        }
        const _: () = assert!(BLOCK == corelm_kernels::attention::KEY_COLUMNS);
        self.k_layout = layout;
        Ok(())
    }

    /// Total bytes of K and V.
    pub fn bytes(&self) -> usize {
        self.k.len() + self.v.len()
    }

    /// Base pointers of layer `l`'s K and V storage (written by the scheduler's kv_store nodes).
    pub(crate) fn layer_ptrs(&self, l: usize) -> (*mut u8, *mut u8) {
        assert!(l < self.n_layer, "layer {l} of {}", self.n_layer);
        // SAFETY: layer l's bytes lie inside each buffer (n_layer × layer bytes, asserted l).
        unsafe { (self.k.as_ptr().add(l * self.layer_bytes.0), self.v.as_ptr().add(l * self.layer_bytes.1)) }
    }

    /// Bytes of one block's rows over every layer and KV head, keys and values.
    pub fn block_bytes(&self) -> usize {
        let (krb, vrb) = self.row_bytes();
        self.n_layer * self.n_kv_head * BLOCK * (krb + vrb)
    }

    /// Block `b`'s rows in any key layout (a head's rows of a block are contiguous in each):
    /// per layer, each head's keys, then each head's values. The inverse of
    /// [`KvCache::write_block`].
    pub fn read_block(&self, b: u32, out: &mut Vec<u8>) {
        self.block_spans(b, |bytes, at, n| {
            // SAFETY: the span lies inside the buffer (`block_spans`); `&self` excludes writers
            // through this cache.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(bytes.add(at), n) });
        });
    }

    /// Write block `b`'s rows from `data` as [`KvCache::read_block`] gives them (`data` is
    /// [`KvCache::block_bytes`] long).
    pub fn write_block(&mut self, b: u32, data: &[u8]) {
        assert_eq!(data.len(), self.block_bytes(), "a block's bytes");
        let mut from = 0;
        self.block_spans(b, |bytes, at, n| {
            // SAFETY: the span lies inside the buffer (`block_spans`); `&mut self` makes this
            // the only access to the cache.
            unsafe { std::ptr::copy_nonoverlapping(data[from..from + n].as_ptr(), bytes.add(at), n) };
            from += n;
        });
    }

    /// Each span of block `b`'s bytes in file order: (buffer base, offset, length).
    fn block_spans(&self, b: u32, mut f: impl FnMut(*mut u8, usize, usize)) {
        assert!((b as usize) < self.blocks.n_blocks, "block {b} of {}", self.blocks.n_blocks);
        let (krb, vrb) = self.row_bytes();
        for l in 0..self.n_layer {
            for (buf, rb, lb) in [(&self.k, krb, self.layer_bytes.0), (&self.v, vrb, self.layer_bytes.1)] {
                for h in 0..self.n_kv_head {
                    // Layer l, head h, cells b·BLOCK.. : inside the buffer (n_layer layers of
                    // n_kv_head · n_cells rows, b < n_blocks).
                    f(buf.as_ptr(), l * lb + (h * self.n_cells + b as usize * BLOCK) * rb, BLOCK * rb);
                }
            }
        }
    }

    /// Bytes of one K row and one V row.
    pub fn row_bytes(&self) -> (usize, usize) {
        (corelm_kernels::row_bytes(self.k_type, self.head_dim), corelm_kernels::row_bytes(self.v_type, self.head_dim))
    }

    /// The converters from f32 of the cache's key and value types.
    pub(crate) fn converters(&self, kernels: &Kernels) -> (FromFloat, FromFloat) {
        let quant = |t| kernels.from_float(t).expect("KV cache type checked at start-up");
        (quant(self.k_type), quant(self.v_type))
    }

    /// Write row `row` (`kv_head · n_cells + cell`) of `layer`: its key and/or value (`head_dim`
    /// f32 each) converted by `qk` / `qv` (`converters`), the key in `k_layout` (`key_row`:
    /// room for one converted key, `row_bytes().0` at least, for keys in columns).
    ///
    /// # Safety
    /// No other thread reads or writes that row of `layer` while this runs.
    pub(crate) unsafe fn store_row(&self, layer: usize, row: usize, k: Option<&[f32]>, v: Option<&[f32]>, (qk, qv): (FromFloat, FromFloat), key_row: &mut [u8]) {
        let (kp, vp) = self.layer_ptrs(layer);
        let (krb, vrb) = self.row_bytes();
        assert!(row < self.n_kv_head * self.n_cells, "row {row} of {} heads × {} cells", self.n_kv_head, self.n_cells);
        if let Some(k) = k {
            if self.k_layout == KeyLayout::Columns {
                // The row's F16, Q8_0 or Q4_0 from the row writer's converter, then scattered.
                let key = &mut key_row[..krb];
                qk(k, key);
                // SAFETY: the cell's block of this head (BLOCK rows' bytes) lies inside the
                // storage (cells is a whole number of blocks); the caller makes this thread the
                // row's only writer.
                unsafe { self.put_key_bytes(kp, row, key) };
            } else {
                // SAFETY: row < n_kv_head · n_cells (asserted), inside the layer's storage; the
                // caller makes this thread the row's only writer.
                qk(k, unsafe { std::slice::from_raw_parts_mut(kp.add(row * krb), krb) });
            }
        }
        if let Some(v) = v {
            // SAFETY: as for a key row.
            qv(v, unsafe { std::slice::from_raw_parts_mut(vp.add(row * vrb), vrb) });
        }
    }

    /// Store every KV head's key and value of each of `cells` in `layer` (`k`, `v`:
    /// `[cells.len(), n_kv_head, head_dim]` f32) as a pass's `kv_store` nodes would: rows
    /// computed elsewhere (the accelerator's layers of a prefill, `--accel-min-tokens`).
    pub fn store_cells(&mut self, kernels: &Kernels, layer: usize, cells: &[u32], k: &[f32], v: &[f32]) {
        let (hd, kvd) = (self.head_dim, self.n_kv_head * self.head_dim);
        assert!(k.len() == cells.len() * kvd && v.len() == k.len(), "{} cells of {} heads of {hd}", cells.len(), self.n_kv_head);
        let conv = self.converters(kernels);
        let mut key_row = [0u8; 2 * COLUMNS_MAX_HEAD_DIM];
        for (i, &cell) in cells.iter().enumerate() {
            let cell = cell as usize;
            assert!(cell < self.n_cells, "cell {cell} of {}", self.n_cells);
            for h in 0..self.n_kv_head {
                let r = i * kvd + h * hd..i * kvd + (h + 1) * hd;
                // SAFETY: `&mut self`: no other reference to the cache, so no other reader or writer.
                unsafe { self.store_row(layer, h * self.n_cells + cell, Some(&k[r.clone()]), Some(&v[r]), conv, &mut key_row) };
            }
        }
    }

    /// Every KV head's key and value of each of `cells` in `layer` as f32 (`k`, `v`:
    /// `[cells.len(), n_kv_head, head_dim]`), keys in either layout: what
    /// [`Self::store_cells`] stores, read back.
    pub fn load_cells(&self, kernels: &Kernels, layer: usize, cells: &[u32], k: &mut [f32], v: &mut [f32]) {
        let (hd, kvd) = (self.head_dim, self.n_kv_head * self.head_dim);
        assert!(k.len() == cells.len() * kvd && v.len() == k.len(), "{} cells of {} heads of {hd}", cells.len(), self.n_kv_head);
        let deq = |t| kernels.to_float(t).expect("KV cache type checked at start-up");
        let (dk, dv) = (deq(self.k_type), deq(self.v_type));
        let vb = &self.v.as_slice()[layer * self.layer_bytes.1..][..self.layer_bytes.1];
        let (krb, vrb) = self.row_bytes();
        let (kp, mut key) = (self.layer_ptrs(layer).0, [0u8; 2 * COLUMNS_MAX_HEAD_DIM]);
        assert!(krb <= key.len(), "keys read back up to a head dimension of {COLUMNS_MAX_HEAD_DIM}");
        let key = &mut key[..krb];
        for (i, &cell) in cells.iter().enumerate() {
            let cell = cell as usize;
            assert!(cell < self.n_cells, "cell {cell} of {}", self.n_cells);
            for h in 0..self.n_kv_head {
                let row = h * self.n_cells + cell;
                let out = i * kvd + h * hd..i * kvd + (h + 1) * hd;
                // SAFETY: the row lies in layer `layer` (cell < n_cells, h < n_kv_head); `&self`
                // excludes writers through this cache.
                unsafe { self.key_bytes(kp, row, key) };
                dk(key, &mut k[out.clone()]);
                dv(&vb[row * vrb..(row + 1) * vrb], &mut v[out]);
            }
        }
    }
}

impl KvCache {
    /// Row `row`'s key of the layer whose keys start at `kp`, as the row writer made it (F16,
    /// Q8_0 or Q4_0 bytes), in either key layout.
    ///
    /// # Safety
    /// `kp` is a layer's key storage ([`KvCache::layer_ptrs`]), `row < n_kv_head · n_cells`,
    /// `out` is `row_bytes().0` long, and no one writes the row meanwhile.
    unsafe fn key_bytes(&self, kp: *mut u8, row: usize, out: &mut [u8]) {
        let krb = out.len();
        // SAFETY: the row (or its cell of the column block) lies in the layer (the contract).
        unsafe {
            match self.k_layout {
                KeyLayout::Rows => std::ptr::copy_nonoverlapping(kp.add(row * krb), out.as_mut_ptr(), krb),
                KeyLayout::Columns => {
                    let (block, j) = (kp.add((row - row % BLOCK) * krb), row % BLOCK);
                    match self.k_type {
                        DType::Q8_0 => attention::matrix::load_key_q8_at(block, j, out),
                        DType::Q4_0 => attention::matrix::load_key_q4_at(block, j, out),
                        _ => attention::matrix::load_key_at(block, j, out),
                    }
                }
            }
        }
    }

    /// Write row `row`'s key bytes (as [`Self::key_bytes`] reads them).
    ///
    /// # Safety
    /// As [`Self::key_bytes`], and no one reads the row meanwhile.
    unsafe fn put_key_bytes(&self, kp: *mut u8, row: usize, key: &[u8]) {
        let krb = key.len();
        // SAFETY: as for `key_bytes`.
        unsafe {
            match self.k_layout {
                KeyLayout::Rows => std::ptr::copy_nonoverlapping(key.as_ptr(), kp.add(row * krb), krb),
                KeyLayout::Columns => {
                    let (block, j) = (kp.add((row - row % BLOCK) * krb), row % BLOCK);
                    match self.k_type {
                        DType::Q8_0 => attention::matrix::store_key_q8_at(block, j, key),
                        DType::Q4_0 => attention::matrix::store_key_q4_at(block, j, key),
                        _ => attention::matrix::store_key_at(block, j, key),
                    }
                }
            }
        }
    }
}

/// Block allocator, per-sequence block tables and the prefix cache.
pub struct Blocks {
    n_blocks: usize,
    /// Sequences referencing each block.
    refs: Vec<u32>,
    /// Prefix key of each registered (full, immutable) block.
    key: Vec<Option<u64>>,
    /// Key of each block's predecessor in its sequence (checked on lookup with the tokens).
    parent: Vec<u64>,
    /// Token stored in each row.
    tokens: Vec<u32>,
    /// Unreferenced blocks without a key.
    free: Vec<u32>,
    /// Unreferenced registered blocks, least recently released first (intrusive list).
    lru_prev: Vec<u32>,
    lru_next: Vec<u32>,
    lru_head: u32,
    lru_tail: u32,
    n_lru: usize,
    map: HashMap<u64, u32>,
    tables: Vec<Vec<u32>>,
    lens: Vec<usize>,
    /// Key of the last full block of each sequence.
    tips: Vec<u64>,
    /// Keys of the full blocks each sequence held when it was last released, in order (what
    /// a saved slot holds: [`Blocks::chain`]).
    last: Vec<Vec<u64>>,
    /// Sequences whose context was shifted ([`KvCache::shift`]) since they were last empty:
    /// their rows from the first shifted block on are not what a prefill of their tokens
    /// gives, so the blocks they fill are not registered for prefix caching.
    shifted: Vec<bool>,
    /// Tokens served from cached blocks, and blocks evicted, since creation.
    pub hits: u64,
    pub evictions: u64,
}

impl Blocks {
    fn new(n_blocks: usize, n_seq: usize) -> Blocks {
        Blocks {
            n_blocks,
            refs: vec![0; n_blocks],
            key: vec![None; n_blocks],
            parent: vec![ROOT; n_blocks],
            tokens: vec![0; n_blocks * BLOCK],
            free: (0..n_blocks as u32).rev().collect(),
            lru_prev: vec![NIL; n_blocks],
            lru_next: vec![NIL; n_blocks],
            lru_head: NIL,
            lru_tail: NIL,
            n_lru: 0,
            map: HashMap::with_capacity(n_blocks),
            tables: (0..n_seq).map(|_| Vec::with_capacity(n_blocks)).collect(),
            lens: vec![0; n_seq],
            tips: vec![ROOT; n_seq],
            last: (0..n_seq).map(|_| Vec::with_capacity(n_blocks)).collect(),
            shifted: vec![false; n_seq],
            hits: 0,
            evictions: 0,
        }
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    pub fn n_seq(&self) -> usize {
        self.lens.len()
    }

    /// Blocks a new token can get: free ones plus cached ones that may be evicted.
    pub fn available(&self) -> usize {
        self.free.len() + self.n_lru
    }

    /// Blocks referenced by at least one sequence.
    pub fn used(&self) -> usize {
        self.n_blocks - self.available()
    }

    /// Unreferenced blocks kept for their prefix.
    pub fn cached(&self) -> usize {
        self.n_lru
    }

    /// Tokens stored for `seq`.
    pub fn len(&self, seq: usize) -> usize {
        self.lens[seq]
    }

    /// Block table of `seq`, in position order.
    pub fn table(&self, seq: usize) -> &[u32] {
        &self.tables[seq]
    }

    /// Fresh blocks `seq` needs to store `n` more tokens.
    pub fn needed(&self, seq: usize, n: usize) -> usize {
        (self.lens[seq] + n).div_ceil(BLOCK) - self.tables[seq].len()
    }

    /// The cell (row of each head) holding position `pos` of `seq`.
    pub fn cell(&self, seq: usize, pos: usize) -> usize {
        cell_in(&self.tables[seq], pos)
    }

    /// Tokens `seq` could still append before running out of blocks.
    pub fn room(&self, seq: usize) -> usize {
        self.tables[seq].len() * BLOCK - self.lens[seq] + self.available() * BLOCK
    }

    /// Append `token` to `seq` and return the row it goes to. The caller checked [`Self::needed`]
    /// against [`Self::available`].
    pub fn append(&mut self, seq: usize, token: u32) -> usize {
        let len = self.lens[seq];
        if len.is_multiple_of(BLOCK) {
            let b = self.take().expect("caller checked available blocks");
            self.refs[b as usize] = 1;
            self.parent[b as usize] = self.tips[seq];
            self.tables[seq].push(b);
        }
        let b = self.tables[seq][len / BLOCK] as usize;
        let row = b * BLOCK + len % BLOCK;
        self.tokens[row] = token;
        self.lens[seq] = len + 1;
        if (len + 1).is_multiple_of(BLOCK) && !self.shifted[seq] {
            let k = chain(self.tips[seq], &self.tokens[b * BLOCK..(b + 1) * BLOCK]);
            self.tips[seq] = k;
            // A block with the same prefix may exist already (computed concurrently): keep it.
            if let std::collections::hash_map::Entry::Vacant(e) = self.map.entry(k) {
                e.insert(b as u32);
                self.key[b] = Some(k);
            }
        }
        row
    }

    /// Attach to the empty sequence `seq` the cached blocks that hold a prefix of `tokens`,
    /// leaving at least one token to compute (its logits are needed). Returns the tokens reused.
    pub fn attach_prefix(&mut self, seq: usize, tokens: &[u32]) -> usize {
        if self.lens[seq] != 0 || tokens.is_empty() {
            return 0;
        }
        let mut tip = ROOT;
        for chunk in tokens[..tokens.len() - 1].chunks_exact(BLOCK) {
            let k = chain(tip, chunk);
            let Some(&b) = self.map.get(&k) else { break };
            let bu = b as usize;
            if !self.holds(b, tip, chunk) {
                break; // a key collision: treat as a miss
            }
            if self.refs[bu] == 0 {
                self.lru_unlink(b);
            }
            self.refs[bu] += 1;
            self.tables[seq].push(b);
            self.lens[seq] += BLOCK;
            self.hits += BLOCK as u64;
            tip = k;
        }
        self.tips[seq] = tip;
        self.lens[seq]
    }

    /// Drop `seq`'s references; its blocks become free, or cached if registered.
    pub fn release(&mut self, seq: usize) {
        let mut last = std::mem::take(&mut self.last[seq]);
        last.clear();
        last.extend(self.table_keys(seq));
        self.last[seq] = last;
        let mut table = std::mem::take(&mut self.tables[seq]);
        // Last block first: a prefix is only found from its first block, so its tail goes
        // before its head when blocks are evicted (as vLLM frees them).
        for &b in table.iter().rev() {
            self.unref(b);
        }
        table.clear();
        self.tables[seq] = table;
        self.lens[seq] = 0;
        self.tips[seq] = ROOT;
        self.shifted[seq] = false;
    }

    /// Forget `seq`'s tokens from position `len` on (draft tokens a pass rejected). Blocks past
    /// it are dropped; the block `len` falls inside, if a full one was registered, leaves the
    /// prefix map, since its tail will be written again. Only blocks the sequence filled itself
    /// are cut: `len` is past every block it attached from the cache.
    pub fn truncate(&mut self, seq: usize, len: usize) {
        if len >= self.lens[seq] {
            return;
        }
        let keep = len.div_ceil(BLOCK);
        while self.tables[seq].len() > keep {
            let b = self.tables[seq].pop().expect("more blocks than kept");
            let bu = b as usize;
            self.refs[bu] -= 1;
            if self.refs[bu] == 0 {
                if self.key[bu].is_some_and(|k| self.map.get(&k) == Some(&b)) {
                    self.unregister(b);
                }
                self.key[bu] = None;
                self.free.push(b);
            }
        }
        self.lens[seq] = len;
        self.tips[seq] = match self.tables[seq].last() {
            None => ROOT,
            Some(&b) => {
                let bu = b as usize;
                if len.is_multiple_of(BLOCK) {
                    chain(self.parent[bu], &self.tokens[bu * BLOCK..(bu + 1) * BLOCK])
                } else {
                    debug_assert_eq!(self.refs[bu], 1, "a partly kept block is the sequence's own");
                    if self.key[bu].is_some() {
                        self.unregister(b);
                    }
                    self.parent[bu]
                }
            }
        };
    }

    /// Forget every cached prefix (blocks in use keep their contents but are no longer shared).
    pub fn clear_cache(&mut self) {
        while let Some(b) = self.lru_pop() {
            self.unregister(b);
            self.free.push(b);
        }
        for k in self.key.iter_mut() {
            *k = None;
        }
        self.map.clear();
    }

    /// The cached blocks holding `seq`'s tokens — those it holds, or, where it holds none,
    /// those it held when last released — from the first on, as far as they are still cached:
    /// what a saved slot writes. Partly filled blocks are never cached, so these are whole.
    pub fn chain(&self, seq: usize) -> Vec<u32> {
        let keys: Vec<u64> = if self.lens[seq] > 0 {
            self.table_keys(seq).collect()
        } else {
            self.last[seq].clone()
        };
        let mut parent = ROOT;
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            match self.map.get(&k) {
                Some(&b) if self.parent[b as usize] == parent => out.push(b),
                _ => break,
            }
            parent = k;
        }
        out
    }

    /// The tokens `seq` holds, in position order.
    pub fn seq_tokens(&self, seq: usize) -> impl Iterator<Item = u32> + '_ {
        (0..self.lens[seq]).map(move |p| self.tokens[self.cell(seq, p)])
    }

    /// Tokens of block `b`.
    pub fn block_tokens(&self, b: u32) -> &[u32] {
        &self.tokens[b as usize * BLOCK..(b as usize + 1) * BLOCK]
    }

    /// The prefix keys of `seq`'s full blocks, in order.
    fn table_keys(&self, seq: usize) -> impl Iterator<Item = u64> + '_ {
        self.tables[seq][..self.lens[seq] / BLOCK].iter().scan(ROOT, |tip, &b| {
            *tip = chain(*tip, self.block_tokens(b));
            Some(*tip)
        })
    }

    /// Whether block `b` (found under a key) holds `tokens` after the prefix keyed `parent`:
    /// not, on a key collision.
    fn holds(&self, b: u32, parent: u64, tokens: &[u32]) -> bool {
        self.parent[b as usize] == parent && self.block_tokens(b) == tokens
    }

    /// Forget what `seq` last held: its blocks that no sequence references leave the prefix
    /// cache. Returns the tokens it last held (0 while it holds some: nothing is done then).
    pub fn erase_last(&mut self, seq: usize) -> usize {
        if self.lens[seq] > 0 {
            return 0;
        }
        let chain = self.chain(seq);
        for &b in &chain {
            if self.refs[b as usize] == 0 {
                self.lru_unlink(b);
                self.unregister(b);
                self.free.push(b);
            }
        }
        let n = self.last[seq].len() * BLOCK;
        self.last[seq].clear();
        n
    }

    /// A full block of `tokens` after the prefix keyed `parent`, read back from a file into
    /// the prefix cache: `Some((block, key, true))` for a block taken for it, whose rows the
    /// caller then writes; `(…, false)` where the cache holds it already; `None` where no
    /// block can be taken without evicting one of `keep` (those restored before it), or the
    /// key is another prefix's.
    pub fn restore(&mut self, parent: u64, tokens: &[u32], keep: &[u32]) -> Option<(u32, u64, bool)> {
        assert_eq!(tokens.len(), BLOCK, "a restored block is full");
        let k = chain(parent, tokens);
        if let Some(&b) = self.map.get(&k) {
            return self.holds(b, parent, tokens).then_some((b, k, false));
        }
        if self.free.is_empty() && (self.lru_head == NIL || keep.contains(&self.lru_head)) {
            return None;
        }
        let b = self.take()?;
        let bu = b as usize;
        self.tokens[bu * BLOCK..(bu + 1) * BLOCK].copy_from_slice(tokens);
        self.parent[bu] = parent;
        self.key[bu] = Some(k);
        self.map.insert(k, b);
        self.lru_push(b);
        Some((b, k, true))
    }

    /// Make `chain`'s unreferenced blocks the most recently used, its last block first, so
    /// that eviction takes a restored prefix from its tail, as [`Blocks::release`] leaves one.
    pub fn touch_chain(&mut self, chain: &[u32]) {
        for &b in chain.iter().rev() {
            if self.refs[b as usize] == 0 && self.key[b as usize].is_some() {
                self.lru_unlink(b);
                self.lru_push(b);
            }
        }
    }

    /// The key of the empty prefix (a restored chain's first parent).
    pub fn root() -> u64 {
        ROOT
    }

    /// Drop one reference to block `b`: unreferenced, it is cached if registered, else free.
    fn unref(&mut self, b: u32) {
        let bu = b as usize;
        self.refs[bu] -= 1;
        if self.refs[bu] == 0 {
            if self.key[bu].is_some() {
                self.lru_push(b);
            } else {
                self.free.push(b);
            }
        }
    }

    fn take(&mut self) -> Option<u32> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        let b = self.lru_pop()?;
        self.unregister(b);
        self.evictions += 1;
        Some(b)
    }

    fn unregister(&mut self, b: u32) {
        if let Some(k) = self.key[b as usize].take() {
            self.map.remove(&k);
        }
    }

    fn lru_push(&mut self, b: u32) {
        self.lru_prev[b as usize] = self.lru_tail;
        self.lru_next[b as usize] = NIL;
        if self.lru_tail != NIL {
            self.lru_next[self.lru_tail as usize] = b;
        } else {
            self.lru_head = b;
        }
        self.lru_tail = b;
        self.n_lru += 1;
    }

    fn lru_unlink(&mut self, b: u32) {
        let (p, n) = (self.lru_prev[b as usize], self.lru_next[b as usize]);
        if p != NIL {
            self.lru_next[p as usize] = n;
        } else {
            self.lru_head = n;
        }
        if n != NIL {
            self.lru_prev[n as usize] = p;
        } else {
            self.lru_tail = p;
        }
        self.n_lru -= 1;
    }

    fn lru_pop(&mut self) -> Option<u32> {
        let b = self.lru_head;
        if b == NIL {
            return None;
        }
        self.lru_unlink(b);
        Some(b)
    }
}

/// The cell holding position `pos` of a sequence whose block table is `table`.
fn cell_in(table: &[u32], pos: usize) -> usize {
    table[pos / BLOCK] as usize * BLOCK + pos % BLOCK
}

/// Key of a block holding `tokens` after the prefix keyed `parent`.
fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests;
