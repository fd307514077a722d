//! Weights repacked once at load for the kernels that read them (SMEPilot's layout-aware
//! runtime): every matrix that a matmul node reads — stacked experts too, whose expert row
//! count is then the one that counts —, whose type has interleaved kernels in the
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
//! Tensor parallelism adds column slices ([`ColSlice`]: a shard's columns of Wo or down, whole
//! blocks of every row), which are not contiguous in the file: they are always copied here,
//! interleaved when the table has kernels for it, else as plain rows. Row slices (Wq, gate,
//! up...) are contiguous file ranges and are packed like whole matrices.
//!
//! The sparse feed-forward's down projection (`WeightForm::NeuronMajor`) is always copied
//! here: transposed, a row per neuron, requantized with ggml's reference quantizer of its
//! type, and laid out in column panels (`sparse::Panels`: every neuron's 64 columns of a panel
//! together), which decode streams panel by panel; a tensor-parallel shard's copy holds the
//! neurons of its column slice. The sparse up projection is an ordinary
//! `Rows` weight: small batches read its interleaved copy a run of groups of four at a time
//! (or, when few neurons fire, the file's plain rows), large ones compute it densely.
//! `WeightForm::PlainRows` (never interleaved) is what a predicted gate's rows are read in.
//!
//! An accelerator's neurons (`SparseFfn::offloaded`) leave the CPU the rest of each layer:
//! `WeightForm::ColdRows` and `ColdNeuronMajor` are copies of only those neurons' gate and up
//! rows (gate interleaved where the table has kernels) and down columns (neuron-major).
//!
//! Invariant: a weight tensor with `Storage::Weight { copy: Some(c), .. }` has its bytes at
//! `c.at .. c.at + n_bytes` of [`PackedWeights::bytes`]; interleaved, `matmul::layout::Layout::unpack`
//! of them gives back the file's rows (of its columns, for a slice).

use crate::graph::Graph;
use crate::memory::{AllocError, Buffer, Place};
use crate::tensor::{ColSlice, Op, Storage, WeightCopy, WeightForm};
use corelm_kernels::matmul::layout as interleave;
use corelm_kernels::sparse::Panels;
use corelm_kernels::{DType, Kernels};
use std::collections::HashMap;

/// A weight's identity: its file range, for a column slice which columns, its form, and under
/// `--numa tp` the part (shard) it is copied for — two shards reading the same rows (a KV
/// head both need, a block of Wo or down cut in two) each get a copy on their own node.
type Key = (usize, usize, Option<ColSlice>, WeightForm, usize);

/// One copy: where it is (in its part of the buffer, see `build`), its length, type, row
/// bytes, row count and layout.
#[derive(Clone, Copy)]
struct Entry {
    part: usize,
    at: usize,
    len: usize,
    dtype: DType,
    row_bytes: usize,
    rows: usize,
    interleaved: bool,
}

/// The copies of a model's matrices made at load.
pub struct PackedWeights {
    buf: Option<Buffer>,
    at: HashMap<Key, Entry>,
    /// Copies are made per shard (`--numa tp`): a tensor's part is its shard's.
    by_shard: bool,
}

/// The part of the copies' buffer a weight of shard `group` is copied into: 0 (serial
/// matrices, or every matrix without per-shard copies), `1 + s` for shard `s`'s.
fn part_of(group: Option<u16>, by_shard: bool) -> usize {
    match group {
        Some(s) if by_shard => 1 + s as usize,
        _ => 0,
    }
}

impl PackedWeights {
    /// Nothing packed (every matmul reads the file's rows).
    pub fn none() -> PackedWeights {
        PackedWeights { buf: None, at: HashMap::new(), by_shard: false }
    }

    /// Copy the matrices of `graphs`' matmuls (the largest batch's and a one-token decode's:
    /// a small batch may read a form of a weight the large one does not, such as the CPU's
    /// gate rows of an accelerator's layer as plain rows for a predicted gate) from the model
    /// file's bytes `file` into one
    /// buffer placed as `place` says: interleaved, with `repack`, every one the table has
    /// interleaved kernels for (row count a multiple of four); plain rows, every column slice
    /// that is not interleaved. With `shards` (`--numa tp`: the place of each tensor-parallel
    /// shard), every shard's matrices are copied (plain where not interleaved) into a part of
    /// the buffer of their own, placed on their shard's node.
    pub fn build(graphs: &[&Graph], file: &[u8], kernels: &Kernels, place: &Place, repack: bool, shards: &[Place]) -> Result<PackedWeights, AllocError> {
        let graph = graphs[0];
        let mut at = HashMap::new();
        // Bytes of each part: part 0 the serial matrices', part 1 + s shard s's.
        let mut part_len = vec![0usize; 1 + shards.len()];
        for (graph, &id) in graphs.iter().flat_map(|g| g.nodes.iter().map(move |id| (*g, id))) {
            // Rows per interleaved unit: a matrix's, or one expert's of stacked experts (so no
            // group of four rows spans two experts).
            let (w, unit_rows) = match graph.tensor(id).op {
                Op::MatMul { w, .. } | Op::SparseUp { w, .. } | Op::SparseGate { w, .. } | Op::SparseDown { w, .. } => (w, graph.tensor(w).ne[1]),
                Op::MatMulId { w, e0, e1, .. } => (w, graph.tensor(w).ne[1] / (e1 - e0) as usize),
                _ => continue,
            };
            let wt = graph.tensor(w);
            let Storage::Weight { offset, len, cols, form, .. } = wt.storage else { continue };
            let part = part_of(wt.group, !shards.is_empty());
            let key = (offset, len, cols, form, part);
            let has_kernels = kernels.ops(wt.dtype).is_some_and(|o| o.interleaved.is_some());
            let interleaved = repack
                && matches!(form, WeightForm::Rows | WeightForm::ColdRows { plain: false, .. })
                && has_kernels
                && interleave::supported(wt.dtype)
                && unit_rows % interleave::ROWS == 0;
            let always = !matches!(form, WeightForm::Rows | WeightForm::PlainRows);
            if !(interleaved || always || cols.is_some() || part > 0) || at.contains_key(&key) {
                continue;
            }
            let n = wt.n_bytes();
            let e = Entry { part, at: part_len[part], len: n, dtype: wt.dtype, row_bytes: wt.row_bytes(), rows: wt.ne[1], interleaved };
            at.insert(key, e);
            // Each copy starts a cache line.
            part_len[part] = (part_len[part] + n).next_multiple_of(64);
        }
        // Parts start at pages, so each can be placed on its own.
        let mut starts = Vec::with_capacity(part_len.len());
        let mut total = 0;
        for &l in &part_len {
            starts.push(total);
            total = (total + l).next_multiple_of(4096);
        }
        if at.is_empty() {
            return Ok(PackedWeights::none());
        }
        for e in at.values_mut() {
            e.at += starts[e.part];
        }
        let parts;
        let place = if shards.is_empty() {
            place
        } else {
            let mut p = vec![(0, place.clone())];
            p.extend(shards.iter().enumerate().map(|(s, sp)| (starts[1 + s], sp.clone())));
            parts = Place::Parts(p);
            &parts
        };
        crate::memory::ensure_available(total)?;
        // Every page is written just below: no need to fault them in first.
        let mut buf = Buffer::lazy(total, place)?;
        let out = buf.as_mut_slice();
        let mut rows = Vec::new();
        let cold = |form: WeightForm| {
            let (l, r) = form.cold_range()?;
            Some(graph.sparse.as_ref().expect("cold forms come with a sparse configuration").cold(l, r))
        };
        for (&(offset, len, cols, form, _), e) in &at {
            let dst = &mut out[e.at..e.at + e.len];
            let src = &file[offset..offset + len];
            if let WeightForm::NeuronMajor { from } | WeightForm::ColdNeuronMajor { from, .. } = form {
                let n_embd = e.row_bytes / e.dtype.type_size() * e.dtype.block_size();
                let n_ff = len / n_embd / from.type_size() * from.block_size();
                // A tensor-parallel shard's neurons are the columns of its slice.
                let neurons = cold(form).or_else(|| cols.map(|c| (c.c0 as u32..(c.c0 + e.rows) as u32).collect()));
                debug_assert!(neurons.iter().flatten().all(|&n| (n as usize) < n_ff));
                neuron_major(kernels, from, src, e.dtype, e.row_bytes, neurons.as_deref(), dst);
                continue;
            }
            let src = match (cols, cold(form)) {
                (None, Some(neurons)) => {
                    rows.clear();
                    for &n in &neurons {
                        rows.extend_from_slice(&src[n as usize * e.row_bytes..(n as usize + 1) * e.row_bytes]);
                    }
                    &rows[..]
                }
                (None, None) => src,
                (Some(c), _) => {
                    // Whole blocks `c0 ..` of every row, gathered into plain rows.
                    let full = corelm_kernels::row_bytes(e.dtype, c.row_len);
                    let skip = corelm_kernels::row_bytes(e.dtype, c.c0);
                    rows.clear();
                    for r in 0..e.rows {
                        let row = offset + r * full + skip;
                        rows.extend_from_slice(&file[row..row + e.row_bytes]);
                    }
                    &rows[..]
                }
            };
            if e.interleaved {
                kernels.layout().pack(e.dtype, src, e.row_bytes, dst);
            } else {
                dst.copy_from_slice(src);
            }
        }
        Ok(PackedWeights { buf: Some(buf), at, by_shard: !shards.is_empty() })
    }

    /// Point `graph`'s weight tensors at their copies.
    pub fn apply(&self, graph: &mut Graph) {
        for t in &mut graph.tensors {
            if let Storage::Weight { offset, len, cols, copy, form } = &mut t.storage {
                let key = (*offset, *len, *cols, *form, part_of(t.group, self.by_shard));
                *copy = self.at.get(&key).map(|e| WeightCopy { at: e.at, interleaved: e.interleaved });
            }
        }
    }

    /// The packed bytes (empty when nothing is packed).
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.as_slice())
    }

    /// Number of matrices copied (interleaved or as column slices).
    pub fn count(&self) -> usize {
        self.at.len()
    }

    /// Bytes copied.
    pub fn len(&self) -> usize {
        self.at.values().map(|e| e.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// File byte ranges `(offset, len)` of the copied matrices (a sliced matrix's whole range,
    /// once), which the kernels no longer read.
    pub fn file_ranges(&self) -> Vec<(usize, usize)> {
        let mut r: Vec<(usize, usize)> = self.at.keys().map(|&(o, l, ..)| (o, l)).collect();
        r.sort_unstable();
        r.dedup();
        r
    }
}

/// `src` (a file matrix of type `from`, a column per neuron) transposed into `dst`: row `i` =
/// column `neurons[i]` (all columns in order without `neurons`), quantized to `to` with ggml's
/// reference quantizer (`row_bytes` per row), its blocks laid out in column panels
/// (`sparse::Panels`).
fn neuron_major(kernels: &Kernels, from: corelm_kernels::DType, src: &[u8], to: corelm_kernels::DType, row_bytes: usize, neurons: Option<&[u32]>, dst: &mut [u8]) {
    let n_cols = row_bytes / to.type_size() * to.block_size(); // the file's rows
    let src_rb = src.len() / n_cols;
    let n_rows = src_rb / from.type_size() * from.block_size(); // neurons: the file's row length
    let to_float = kernels.to_float(from).expect("weight type checked at load");
    let quant = corelm_kernels::quant::reference::quantizer(to).expect("a neuron-major type has a quantizer");
    corelm_kernels::matmul::layout::note_repack(dst.len());
    let mut m = vec![0f32; n_rows * n_cols];
    for (j, row) in src.chunks_exact(src_rb).enumerate() {
        to_float(row, &mut m[j * n_rows..(j + 1) * n_rows]);
    }
    let mut col = vec![0f32; n_cols];
    let mut row = vec![0u8; row_bytes];
    let panels = Panels { neurons: dst.len() / row_bytes, blocks: n_cols / to.block_size(), type_size: to.type_size() };
    for k in 0..panels.neurons {
        let i = neurons.map_or(k, |n| n[k] as usize);
        for (j, c) in col.iter_mut().enumerate() {
            *c = m[j * n_rows + i];
        }
        quant(&col, &mut row);
        panels.pack_row(k, &row, dst);
    }
}
