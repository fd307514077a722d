//! Attention over keys stored in columns ([`KeyLayout::Columns`](super::types::KeyLayout)):
//! the cache's keys are written transposed per block of 16 cells by the node that stores them,
//! so that the kernels here read, per dimension, the 16 cells' keys as one vector — the operand
//! a matrix unit's outer product takes (`sme.rs`: `FMOPA` for the scores and for the values,
//! past a start-up self-test), and a vector FMA with lanes over cells (`drive.rs`'s block loop
//! on `x86.rs`'s AVX-512, `avx2.rs`'s AVX2 or `neon.rs`'s NEON arithmetic) — with nothing
//! transposed while a token runs. The algorithm (`model.rs`) is an online softmax of its own, not ggml's: the
//! layout is opt-in (`--kv-layout columns`) and its results are compared with ggml's within a
//! bound, while the SIMD and matrix-unit versions equal the portable one bit for bit, so every
//! table gives the same logits. Head dimensions that are not a multiple of 16 have no SIMD
//! version (the engine refuses the layout for them); the portable form runs only where the
//! portable table was asked for. A Q8_0 or Q4_0 cache keeps its keys as columns of its type and
//! its values as rows; each block read is widened to F16 in the worker's scratch first
//! (`widen.rs`), so the kernels are the F16 cache's (also in the pipeline's phases; the matrix
//! unit takes F16 caches only: on an SME table a quantized cache runs the NEON version).

#[cfg(target_arch = "x86_64")]
mod avx2;
mod drive;
mod gather;
mod model;
mod pipe;
mod portable;
mod widen;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod sme;
#[cfg(target_arch = "x86_64")]
mod x86;

use super::types::{AttnScratch, Cells, KvRows, ROWS_MAX_VECTORS};
pub use pipe::{PipeItem, Pipeline, Role, TILE_BLOCKS};
use model::C;
pub use gather::{load_key_at, load_key_q4_at, load_key_q8_at};
pub use widen::{store_key_q4_at, store_key_q8_at};

/// Cell `j` of a Q4_0 column block (`block`: that KV head's `9 · head_dim` bytes) gets `key`,
/// a Q4_0 row of `head_dim` values (as the row writer quantizes it).
pub fn store_key_q4(block: &mut [u8], j: usize, key: &[u8]) {
    assert!(j < C && key.len().is_multiple_of(18) && block.len() >= key.len() / 18 * 32 * 9);
    // SAFETY: the block holds 9 · head_dim bytes (asserted) and is borrowed exclusively.
    unsafe { store_key_q4_at(block.as_mut_ptr(), j, key) }
}

/// Cell `j` of a Q8_0 column block (`block`: that KV head's `17 · head_dim` bytes) gets `key`,
/// a Q8_0 row of `head_dim` values (as the row writer quantizes it).
pub fn store_key_q8(block: &mut [u8], j: usize, key: &[u8]) {
    assert!(j < C && key.len().is_multiple_of(34) && block.len() >= key.len() / 34 * 32 * 17);
    // SAFETY: the block holds 17 · head_dim bytes (asserted) and is borrowed exclusively.
    unsafe { store_key_q8_at(block.as_mut_ptr(), j, key) }
}

/// The writer of the layout: cell `j` of a block (`block`: that KV head's `[head_dim][16]` F16
/// keys, as bytes) gets `key`, rounded to F16 as the row writer rounds (to nearest, ties to
/// even).
pub fn store_key(block: &mut [u8], j: usize, key: &[f32]) {
    assert!(j < C && block.len() >= key.len() * C * 2);
    let k16: Vec<u8> = key.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
    // SAFETY: the block holds `key.len()` dimensions of C cells (asserted).
    unsafe { store_key_at(block.as_mut_ptr(), j, &k16) }
}

/// One cell's key already in F16 (`key`: its `head_dim` F16 as bytes, as the row writer makes
/// them) into cell `j` of its block through a pointer, for writers that fill different cells of
/// one block at once (each writes only its own cell's elements, so no two overlap).
///
/// # Safety
/// `block` points to `key.len() / 2 · 16` writable F16 (any alignment) that no one else reads
/// or writes at cell `j` meanwhile; `j < 16`.
pub unsafe fn store_key_at(block: *mut u8, j: usize, key: &[u8]) {
    debug_assert!(j < C);
    for (d, x) in key.chunks_exact(2).enumerate() {
        // SAFETY: (d·16 + j)·2 + 2 ≤ key.len() · 16, inside the block (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(x.as_ptr(), block.add((d * C + j) * 2), 2) };
    }
}

/// Which version of the column-key kernels runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    Portable,
    /// AVX-512 (lanes over cells for the scores, over dimensions for the values).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2 (the same on two vectors of 8 lanes).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// NEON (the same on four vectors of 4 lanes).
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// The matrix unit (SME outer products).
    #[cfg(target_arch = "aarch64")]
    Sme,
}

fn version(kernels: &crate::Kernels, head_dim: usize) -> Version {
    #[cfg(target_arch = "x86_64")]
    if kernels.isa().avx512() && head_dim.is_multiple_of(16) {
        return Version::Avx512;
    }
    #[cfg(target_arch = "x86_64")]
    if kernels.isa() == crate::Isa::Avx2 && head_dim.is_multiple_of(16) {
        return Version::Avx2;
    }
    #[cfg(target_arch = "aarch64")]
    if kernels.isa() == crate::Isa::Sme && sme_passes() {
        return Version::Sme;
    }
    #[cfg(target_arch = "aarch64")]
    if matches!(kernels.isa(), crate::Isa::Neon | crate::Isa::Dotprod | crate::Isa::Sme) && head_dim.is_multiple_of(16) {
        return Version::Neon;
    }
    let _ = (kernels, head_dim);
    Version::Portable
}

/// Whether the SME version passed its start-up self-test (run once, on the first use).
#[cfg(target_arch = "aarch64")]
fn sme_passes() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: asked only with an Sme table, which is built after detecting SME.
    *OK.get_or_init(|| crate::simd::aarch64::sme_vector_bytes() >= 32 && unsafe { sme::self_test() })
}

/// Whether this table has a SIMD or matrix-unit version of the column-key kernels for rows of
/// `head_dim` (otherwise the portable one runs).
pub fn has_simd(kernels: &crate::Kernels, head_dim: usize) -> bool {
    version(kernels, head_dim) != Version::Portable
}

/// The `q.len() / head_dim` query heads of one row over `cells` (an F16 cache with keys in
/// columns): `out = Σ softmax(scale · q·k) v` as `model.rs` defines it.
pub(crate) fn attend_heads(kernels: &crate::Kernels, q: &[f32], cells: Cells, scale: f32, s: &mut AttnScratch, out: &mut [f32]) {
    attend_cells(version(kernels, cells.kv.head_dim), q, cells, scale, s, out)
}

/// [`attend_heads`] on version `v`: each block's visible cells from `cells`.
fn attend_cells(v: Version, q: &[f32], cells: Cells, scale: f32, s: &mut AttnScratch, out: &mut [f32]) {
    let Cells { kv, n, visible } = cells;
    let mask = |_: usize, t: usize| (0..C).filter(|&j| t * C + j < n && visible.at(t * C + j)).fold(0u16, |m, j| m | 1 << j);
    attend_heads_masked(v, q, q.len() / kv.head_dim, &mask, n.div_ceil(C), kv, scale, None, s, out);
}

/// Rows of one sequence (prefill): row `r`'s `heads` query heads (`q[r]`, `out[r]`) see the
/// logical cells `spans[r]`; `sinks` (gpt-oss): each of the `heads` heads' attention sink.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_rows(
    kernels: &crate::Kernels,
    q: &[&[f32]],
    heads: usize,
    spans: &[std::ops::Range<usize>],
    kv: &KvRows,
    scale: f32,
    sinks: Option<&[f32]>,
    s: &mut AttnScratch,
    out: &mut [&mut [f32]],
) {
    let mask = |r: usize, t: usize| model::span_mask(t, &spans[r]);
    let n_blocks = spans.iter().map(|s| s.end.div_ceil(C)).max().unwrap_or(0);
    let v = version(kernels, kv.head_dim);
    if q.len() * heads <= ROWS_MAX_VECTORS {
        run(v, q, heads, &mask, n_blocks, kv, scale, sinks, s, out);
    } else {
        for (r, (qr, or)) in q.iter().zip(out.iter_mut()).enumerate() {
            let mask = |_: usize, t: usize| model::span_mask(t, &spans[r]);
            attend_heads_masked(v, qr, heads, &mask, spans[r].end.div_ceil(C), kv, scale, sinks, s, or);
        }
    }
}

/// One row of `heads` heads (any number: [`ROWS_MAX_VECTORS`] at a time).
#[allow(clippy::too_many_arguments)]
fn attend_heads_masked(v: Version, q: &[f32], heads: usize, mask: &dyn Fn(usize, usize) -> u16, n_blocks: usize, kv: &KvRows, scale: f32, sinks: Option<&[f32]>, s: &mut AttnScratch, out: &mut [f32]) {
    let hd = kv.head_dim;
    let per = ROWS_MAX_VECTORS.min(heads).max(1);
    for (i, (qh, oh)) in q.chunks(per * hd).zip(out.chunks_mut(per * hd)).enumerate() {
        run(v, &[qh], qh.len() / hd, mask, n_blocks, kv, scale, sinks.map(|z| &z[i * per..]), s, &mut [oh]);
    }
}

/// `rows × heads ≤ ROWS_MAX_VECTORS` vectors on version `v`; `mask(r, t)`: the cells of block
/// `t` row `r` sees; `sinks[h]`: head `h`'s sink, every row's.
#[allow(clippy::too_many_arguments)]
fn run(v: Version, q: &[&[f32]], heads: usize, mask: &dyn Fn(usize, usize) -> u16, n_blocks: usize, kv: &KvRows, scale: f32, sinks: Option<&[f32]>, s: &mut AttnScratch, out: &mut [&mut [f32]]) {
    let ms = &mut s.matrix;
    ms.sinks = sinks.map(|z| std::array::from_fn(|i| if i < q.len() * heads { z[i % heads] } else { 0.0 }));
    // The matrix unit's kernels read F16 blocks in place; a quantized cache runs on NEON there.
    #[cfg(target_arch = "aarch64")]
    let v = if v == Version::Sme && !kv.is_f16() { Version::Neon } else { v };
    match v {
        #[cfg(target_arch = "aarch64")]
        // SAFETY: an Sme table is only built after detecting SME (and passing its self-test).
        Version::Sme => unsafe { sme::attend_rows(q, heads, mask, n_blocks, kv, scale, ms, out) },
        #[cfg(target_arch = "aarch64")]
        Version::Neon => neon::attend_rows(q, heads, mask, n_blocks, kv, scale, ms, &mut s.next, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an Avx512 table is only built after detecting AVX-512 F/BW/VL (and AVX2,
        // FMA, F16C); `version` checked the head dimension; `run`'s callers pass at most
        // ROWS_MAX_VECTORS vectors.
        Version::Avx512 => unsafe { x86::attend_rows(q, heads, mask, n_blocks, kv, scale, ms, &mut s.next, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C; as above.
        Version::Avx2 => unsafe { avx2::attend_rows(q, heads, mask, n_blocks, kv, scale, ms, &mut s.next, out) },
        Version::Portable => {
            for (r, (qr, or)) in q.iter().zip(out.iter_mut()).enumerate() {
                model::attend_group(&qr[..heads * kv.head_dim], kv, n_blocks, &|t| mask(r, t), scale, ms, or);
            }
        }
    }
}

/// The portable form whatever the table (for the parity tests): the `q.len() / head_dim`
/// heads of one row over `cells`.
pub fn attend_heads_portable(q: &[f32], cells: Cells, scale: f32, scratch: &mut AttnScratch, out: &mut [f32]) {
    attend_cells(Version::Portable, q, cells, scale, scratch, out)
}

/// Worker `ith` of `nth`'s share of one pipelined prefill attention node (`pipe.rs`): items
/// `0..n_items` (`item(k)`: rows of one sequence with the query heads of one KV head, keys in
/// columns), their phases run on this table's column-key arithmetic as they become ready,
/// `role`'s first. The results are [`attend_rows`]' bits (the column-key algorithm), whoever
/// ran which phase. On an SME table a worker that is not of the vector class runs the matrix
/// phases on the matrix unit (`sme.rs`), the softmax on NEON; a vector worker runs all on NEON.
///
/// # Safety
/// As [`Pipeline::run`]: every worker of the node calls it once with the same arguments but
/// `ith` and `role`; `item(k).out` rows are writable, this item's only.
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_pipelined<'a>(kernels: &crate::Kernels, pipe: &Pipeline, role: Role, ith: usize, nth: usize, n_items: usize, item: &dyn Fn(usize) -> PipeItem<'a>, scale: f32, scratch: &mut AttnScratch) {
    let v = version(kernels, pipe.head_dim());
    let ms = &mut scratch.matrix;
    let mut run_task = |t: &pipe::Task| -> usize {
        match v {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: an Avx512 table is only built after detecting AVX-512 F/BW/VL (and AVX2,
            // FMA, F16C); `version` checked the head dimension.
            Version::Avx512 => unsafe { x86::run_task(t, ms) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C; as above.
            Version::Avx2 => unsafe { avx2::run_task(t, ms) },
            #[cfg(target_arch = "aarch64")]
            Version::Neon => neon::run_task(t, ms),
            #[cfg(target_arch = "aarch64")]
            // SAFETY: an Sme table is only built after detecting SME (and its self-test passed).
            // The matrix unit reads F16 blocks in place; a quantized cache's run on NEON.
            Version::Sme if role != Role::Vector && t.phase != pipe::Phase::Softmax && t.f16_cache() => unsafe { sme::run_task(t, ms) },
            #[cfg(target_arch = "aarch64")]
            Version::Sme if pipe.head_dim().is_multiple_of(16) => neon::run_task(t, ms),
            _ => pipe::run_task(&portable::PortableOps, t, ms),
        }
    };
    // SAFETY: the caller's contract.
    unsafe { pipe.run(&mut run_task, role, ith, nth, n_items, item, scale) }
}
