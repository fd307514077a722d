//! KV cache storage: preallocated per layer, F16, laid out as its reader wants it —
//! `[kv_head][cell][head_dim]`, so attention for one head scans contiguous memory — plus the
//! position and sequence of each cell. Which cells a batch writes is the engine's decision;
//! here is only the memory and its metadata.
//!
//! Invariant: sized once at creation; never reallocated per token.

use crate::memory::{AllocError, Buffer};
use half::f16;

pub const EMPTY: i32 = -1;

pub struct KvCache {
    pub n_layer: usize,
    pub n_cells: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    k: Vec<Buffer>,
    v: Vec<Buffer>,
    /// Position of the token stored in each cell, or [`EMPTY`].
    pub cell_pos: Vec<i32>,
    /// Sequence owning each cell, or [`EMPTY`].
    pub cell_seq: Vec<i32>,
    /// One past the highest cell in use (attention scans `0..used_end`).
    pub used_end: usize,
}

impl KvCache {
    pub fn new(
        n_layer: usize,
        n_cells: usize,
        n_kv_head: usize,
        head_dim: usize,
        node: Option<usize>,
    ) -> Result<Self, AllocError> {
        let bytes = n_kv_head
            .checked_mul(n_cells)
            .and_then(|b| b.checked_mul(head_dim * 2))
            .ok_or(AllocError { bytes: usize::MAX, gib: f64::INFINITY })?;
        let total = bytes as f64 * 2.0 * n_layer as f64;
        let alloc = |_| Buffer::new(bytes, node).map_err(|_| AllocError { bytes: total as usize, gib: total / (1u64 << 30) as f64 });
        Ok(KvCache {
            n_layer,
            n_cells,
            n_kv_head,
            head_dim,
            k: (0..n_layer).map(alloc).collect::<Result<_, _>>()?,
            v: (0..n_layer).map(alloc).collect::<Result<_, _>>()?,
            cell_pos: vec![EMPTY; n_cells],
            cell_seq: vec![EMPTY; n_cells],
            used_end: 0,
        })
    }

    /// Total bytes of K and V.
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(Buffer::len).sum()
    }

    /// Raw base pointers of layer `l`'s K and V (written by the scheduler's kv_store nodes).
    pub(crate) fn layer_ptrs(&self, l: usize) -> (*mut f16, *mut f16) {
        (self.k[l].as_ptr() as *mut f16, self.v[l].as_ptr() as *mut f16)
    }

    /// Recompute `used_end` after cells were freed.
    pub fn refresh_used_end(&mut self) {
        self.used_end = self.cell_seq.iter().rposition(|&s| s != EMPTY).map_or(0, |i| i + 1);
    }
}
