//! Weights repacked once at load for the kernels that read them (SMEPilot's layout-aware
//! runtime): every matrix that a matmul node reads, whose type has interleaved kernels in the
//! detected table (`TypeOps::interleaved`) and whose row count is a multiple of four, is copied
//! once into `corelm_kernels::interleave`'s layout — four rows interleaved block by block, the
//! same number of bytes — in one buffer tagged with its NUMA node. Decode's GEMV and prefill's
//! tiles both read that copy; nothing is packed per call.
//!
//! The model file's mapping stays as it was: any consumer other than those two kernels (an
//! embedding lookup in a tied output matrix, the opt-in panel GEMM) reads the plain rows
//! there. After packing, the file pages of packed matrices can be dropped from this process
//! ([`PackedWeights::file_ranges`]); they come back from the page cache if something reads them.
//!
//! Invariant: a weight tensor with `Storage::Weight { packed: Some(p), .. }` has its groups at
//! `p .. p + len` of [`PackedWeights::bytes`], and `matmul::layout::unpack` of them gives back the
//! file's bytes at `offset .. offset + len`.

use crate::graph::Graph;
use crate::memory::{AllocError, Buffer, Place};
use crate::tensor::{Op, Storage};
use corelm_kernels::matmul::layout as interleave;
use corelm_kernels::{DType, Kernels};
use std::collections::HashMap;

/// The repacked copies of a model's matrices.
pub struct PackedWeights {
    buf: Option<Buffer>,
    /// File offset of a packed matrix → (its offset in `buf`, its length, its type, row bytes).
    at: HashMap<usize, (usize, usize, DType, usize)>,
}

impl PackedWeights {
    /// Nothing packed (every matmul reads the file's rows).
    pub fn none() -> PackedWeights {
        PackedWeights { buf: None, at: HashMap::new() }
    }

    /// Pack every matrix of `graph`'s matmuls that the table has interleaved kernels for, from
    /// the model file's bytes `file`, into one buffer placed as `place` says.
    pub fn build(graph: &Graph, file: &[u8], kernels: &Kernels, place: &Place) -> Result<PackedWeights, AllocError> {
        let mut at = HashMap::new();
        let mut total = 0;
        for &id in &graph.nodes {
            let Op::MatMul { w, .. } = graph.tensor(id).op else { continue };
            let wt = graph.tensor(w);
            let Storage::Weight { offset, len, .. } = wt.storage else { continue };
            let has_kernels = kernels.ops(wt.dtype).is_some_and(|o| o.interleaved.is_some());
            if !has_kernels || !interleave::supported(wt.dtype) || wt.ne[1] % interleave::ROWS != 0 || at.contains_key(&offset) {
                continue;
            }
            at.insert(offset, (total, len, wt.dtype, wt.row_bytes()));
            total += len;
        }
        if total == 0 {
            return Ok(PackedWeights::none());
        }
        crate::memory::ensure_available(total)?;
        // Every page is written just below: no need to fault them in first.
        let mut buf = Buffer::lazy(total, place)?;
        let out = buf.as_mut_slice();
        for (&offset, &(p, len, t, rb)) in &at {
            interleave::pack(t, &file[offset..offset + len], rb, &mut out[p..p + len]);
        }
        Ok(PackedWeights { buf: Some(buf), at })
    }

    /// Point `graph`'s weight tensors at their packed copies.
    pub fn apply(&self, graph: &mut Graph) {
        for t in &mut graph.tensors {
            if let Storage::Weight { offset, len, packed } = &mut t.storage {
                *packed = self.at.get(offset).filter(|e| e.1 == *len).map(|e| e.0);
            }
        }
    }

    /// The packed bytes (empty when nothing is packed).
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.as_slice())
    }

    /// Number of matrices packed.
    pub fn count(&self) -> usize {
        self.at.len()
    }

    /// Bytes packed.
    pub fn len(&self) -> usize {
        self.at.values().map(|e| e.1).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// File byte ranges `(offset, len)` of the packed matrices.
    pub fn file_ranges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.at.iter().map(|(&o, e)| (o, e.1))
    }
}
