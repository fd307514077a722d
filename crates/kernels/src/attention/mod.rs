//! Fused online-softmax attention over the (paged) KV cache, as ggml-cpu's two flash-attention
//! algorithms compute it: the one-chunk kernel (decode, and any batch over a quantized cache:
//! F16 query and dot products, F16 accumulator — f32 for quantized values — rescaled as the
//! maximum grows) and the tiled kernel (prefill batches of at least [`TILED_MIN_ROWS`] rows over
//! an F16 cache). Portable versions here; SIMD twins in [`x86`] (AVX2, AVX-512) and
//! [`aarch64`] (NEON), chosen from the kernel table ([`has_simd`]), bit-identical per head.
//! [`AttnKernel::Wide`] is the one-chunk kernel with an F32 value accumulator over an F16
//! cache (not llama.cpp's bits: `--fast-prefill`'s decode steps), on the same drivers.
//! Every kernel takes what a query reads as one [`Cells`]: the KV head's rows, how many
//! logical cells, and which of them are visible; and how a dot product becomes a score as one
//! [`Scale`] (a multiplier, and Gemma 2's soft cap `c · tanh(s / c)`, which each kernel applies
//! to its scores before the softmax, scalar, as ggml does). A cache whose keys are stored in
//! columns ([`KeyLayout::Columns`], opt-in) is read only by [`matrix`]'s kernels, whatever the
//! algorithm asked for; they have no soft cap.

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
mod chunks;
pub mod matrix;
pub mod portable;
mod quant;
mod tiles;
mod types;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use portable::softmax_steps;
use portable::{attend_reference, attend_tiled};
use quant::{attend_quant, attend_quant_group};
pub use types::{key_transposes, AttnKernel, Scale, AttnScratch, Cells, GroupBuffers, KeyLayout, KvRows, KEY_COLUMNS, ReferenceBuffers, RowsScratch, TileWork, DECODE_CHUNK, KV_TILE, ROWS_MAX_VECTORS, TILED_MIN_ROWS, Visible};

/// Fused attention for one query head over an F16 KV cache, with online softmax (one pass, no
/// score matrix): `out = Σ_c softmax(scale · q·k_c) v_c` over the logical cells `c < n_cells`
/// of `kv` for which `visible(c)` holds, in logical order. Writes zeros if no cell is visible.
pub fn attend_row(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: impl Into<Scale>,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let scale: Scale = scale.into();
    let Cells { kv, .. } = cells;
    if kv.k_layout == KeyLayout::Columns {
        return matrix::attend_heads(kernels, q, cells, scale.uncapped(), scratch, out);
    }
    if !kv.is_f16() {
        return attend_quant(kernels, q, cells, scale, scratch, out);
    }
    if let AttnKernel::Split(chunk) = kind {
        return attend_split(kernels, q, cells, scale, chunk, scratch, out);
    }
    if matches!(kind, AttnKernel::Reference | AttnKernel::Wide) && attend_decode(kernels, q, cells, scale, 0, None, kind == AttnKernel::Reference, scratch, out) {
        return;
    }
    match kind {
        #[cfg(target_arch = "x86_64")]
        AttnKernel::Reference if kernels.isa() >= crate::Isa::Avx2 => {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe { x86::reference::attend_reference(q, cells, scale, scratch, out) }
        }
        AttnKernel::Reference | AttnKernel::Split(_) => attend_reference(q, cells, scale, false, scratch, out),
        AttnKernel::Wide => attend_reference(q, cells, scale, true, scratch, out),
        AttnKernel::Tiled => {
            if !tiled_group(kernels, q, cells, scale, scratch, out) {
                attend_tiled(q, cells, scale, scratch, out)
            }
        }
    }
}

/// [`attend_row`] for consecutive query heads that read the same KV head (a GQA group or part of
/// one; `q` and `out` hold `heads × kv.head_dim` values). With the AVX2 table and an F16 cache
/// the heads go through the cells together: for the tiled kernel (`x86::reference::attend_tiled_group`)
/// each 8-cell block of keys is loaded and transposed once for all of them; for the reference
/// kernel, decode's (`x86::reference::attend_reference_group`), each key and value row is widened
/// once. Every head gets the bits of its own `attend_row` call.
pub fn attend_heads(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: impl Into<Scale>,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let scale: Scale = scale.into();
    attend_heads_from(kind, kernels, q, cells, scale, scratch, out, Rows::Memory)
}

/// Where the KV rows a call reads are expected: in memory (a decode step: the quantized-cache
/// kernel asks for them a chunk ahead), or in cache (the rows of a prefill block read the same
/// cells one after another, and asking for them again only costs instructions).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    Memory,
    Cached,
}

/// [`attend_heads`], told where the KV rows are ([`Rows`]).
#[allow(clippy::too_many_arguments)]
fn attend_heads_from(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
    rows: Rows,
) {
    let Cells { kv, .. } = cells;
    if kv.k_layout == KeyLayout::Columns {
        return matrix::attend_heads(kernels, q, cells, scale.uncapped(), scratch, out);
    }
    if kind == AttnKernel::Tiled && tiled_group(kernels, q, cells, scale, scratch, out) {
        return;
    }
    let kind = match kind {
        AttnKernel::Split(chunk) if kv.is_f16() => return attend_split(kernels, q, cells, scale, chunk, scratch, out),
        AttnKernel::Split(_) => AttnKernel::Reference,
        k => k,
    };
    let hd = kv.head_dim;
    if matches!(kind, AttnKernel::Reference | AttnKernel::Wide) && attend_decode(kernels, q, cells, scale, 0, None, kind == AttnKernel::Reference, scratch, out) {
        return;
    }
    // A quantized cache always takes ggml's one-chunk path (`attend_row` ignores `kind` for it),
    // all the heads of the group at once.
    if !kv.is_f16() && q.len() / hd <= scratch.gstate.len() {
        return attend_quant_group(kernels, q, cells, scale, scratch, out, rows == Rows::Memory, None);
    }
    #[cfg(target_arch = "x86_64")]
    if kind == AttnKernel::Reference && kernels.isa() >= crate::Isa::Avx2 && kv.is_f16() && hd.is_multiple_of(8) && q.len() > hd {
        if let Some(bufs) = scratch.reference_buffers(q.len() / hd) {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe { x86::reference::attend_reference_group(q, cells, scale, bufs, out) };
            return;
        }
    }
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        attend_row(kind, kernels, qh, cells, scale, scratch, oh);
    }
}

/// Whether this table runs SIMD twins of the attention kernels (`x86` with AVX2 or AVX-512,
/// `aarch64` with NEON: the two-phase decode kernel and the multi-row tiled kernel) rather
/// than only the portable ones.
pub fn has_simd(kernels: &crate::Kernels) -> bool {
    cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) && kernels.isa() != crate::Isa::Portable
}

/// The reference kernel for `q.len() / head_dim` heads with the two-phase decode kernel
/// (`x86::decode` with AVX-512, `x86::decode_avx2` with the AVX2 table, `aarch64::decode`
/// with NEON), if the cache is F16 and the head dimension one it takes; returns whether it
/// ran. `split` > 0: ggml's split-KV decode over chunks of `split` cells
/// (`attention::portable::fold`), with `only` its one range alone ([`attend_split_range`]).
/// `f16_acc`: the V accumulators rounded to F16 after every
/// step (`Reference`); else kept in F32 ([`AttnKernel::Wide`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_decode(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    split: usize,
    only: Option<usize>,
    f16_acc: bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) -> bool {
    let kv = cells.kv;
    if !(has_simd(kernels) && kv.is_f16() && chunks::supports(kv.head_dim)) {
        return false;
    }
    let Some(mut bufs) = scratch.decode_buffers(q.len() / kv.head_dim) else { return false };
    bufs.only = only;
    #[cfg(target_arch = "x86_64")]
    {
        if kernels.isa().avx512() {
            // SAFETY: an Avx512 table is only built after detecting AVX-512 F/BW/VL/VNNI (and
            // AVX2, FMA, F16C).
            unsafe {
                if f16_acc {
                    x86::decode::attend_decode_group::<true>(q, cells, scale, split, bufs, out)
                } else {
                    x86::decode::attend_decode_group::<false>(q, cells, scale, split, bufs, out)
                }
            }
        } else {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe {
                if f16_acc {
                    x86::decode_avx2::attend_decode_group_avx2::<true>(q, cells, scale, split, bufs, out)
                } else {
                    x86::decode_avx2::attend_decode_group_avx2::<false>(q, cells, scale, split, bufs, out)
                }
            }
        }
        true
    }
    #[cfg(target_arch = "aarch64")]
    {
        if f16_acc {
            aarch64::decode::attend_decode_group::<true>(q, cells, scale, split, bufs, out);
        } else {
            aarch64::decode::attend_decode_group::<false>(q, cells, scale, split, bufs, out);
        }
        true
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        // `has_simd` is false here: never reached.
        let _ = (cells, scale, split, f16_acc, bufs, out);
        false
    }
}

/// Attention for a block of query rows of one sequence (prefill): row `r` holds `heads`
/// query heads that read the KV head `kv` (`q[r]`, `out[r]`: `heads × head_dim` values) and
/// sees the logical cells `spans[r]` (causal limit and sliding window). Every head of every row
/// gets the bits of its own [`attend_row`] call with `n_cells = spans[r].end` and `visible(c)
/// = c >= spans[r].start`. With a SIMD table ([`has_simd`]), an F16 cache, the tiled kernel
/// and at most [`ROWS_MAX_VECTORS`] rows × heads, the rows go through the cells together
/// (`x86::rows`, `x86::rows512` with AVX-512, `aarch64::rows`); otherwise row by row.
/// `sinks` (gpt-oss, one per head): each head's attention sink counted in its softmax as ggml
/// counts it — by the multi-row tiled kernels where they run, else row by row by the one-chunk
/// kernel ([`attend_with_sinks`]); over a quantized cache, after the last cell of ggml's
/// one-chunk kernel; over keys in columns, by the column kernels' last step (`matrix::model`).
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[&[f32]],
    heads: usize,
    spans: &[std::ops::Range<usize>],
    kv: &KvRows,
    scale: impl Into<Scale>,
    sinks: Option<&[f32]>,
    scratch: &mut AttnScratch,
    out: &mut [&mut [f32]],
) {
    let scale: Scale = scale.into();
    let tiled = kind == AttnKernel::Tiled
        && has_simd(kernels)
        && kv.is_f16()
        && kv.head_dim.is_multiple_of(8)
        && q.len() * heads <= ROWS_MAX_VECTORS
        && scratch.rows.zero.len() >= kv.head_dim;
    if let (Some(sinks), false, KeyLayout::Rows) = (sinks, tiled, kv.k_layout) {
        assert!(heads <= MAX_SINK_HEADS, "{heads} query heads per KV head with attention sinks");
        if !kv.is_f16() {
            // A quantized cache: ggml's one-chunk kernel, each head's sink counted after its
            // last cell — a prefill block's rows at once, or row by row (decode's grouped
            // kernel, which asks for its rows ahead).
            if q.len() > 1 && q.len() * heads <= ROWS_MAX_VECTORS && scratch.rows.v32.len() >= DECODE_CHUNK * kv.head_dim {
                return quant::attend_quant_rows(kernels, q, heads, spans, kv, scale, Some(sinks), scratch, out);
            }
            assert!(heads <= scratch.gstate.len(), "{heads} query heads per KV head over a quantized cache with attention sinks");
            for (i, ((qr, or), span)) in q.iter().zip(out.iter_mut()).zip(spans).enumerate() {
                let cells = Cells { kv, n: span.end, visible: Visible::From(span.start) };
                attend_quant_group(kernels, qr, cells, scale, scratch, or, i == 0, Some(sinks));
            }
            return;
        }
        let mut state = [[0f32; 2]; MAX_SINK_HEADS];
        for ((qr, or), span) in q.iter().zip(out.iter_mut()).zip(spans) {
            let cells = Cells { kv, n: span.end, visible: Visible::From(span.start) };
            attend_with_sinks(kernels, qr, cells, scale, sinks, scratch, &mut state, or);
        }
        return;
    }
    if kv.k_layout == KeyLayout::Columns {
        return matrix::attend_rows(kernels, q, heads, spans, kv, scale.uncapped(), sinks, scratch, out);
    }
    if tiled {
        let before = scratch.rows.work.chunks_scored;
        #[cfg(target_arch = "x86_64")]
        if kernels.isa().avx512() {
            // SAFETY: an Avx512 table is only built after detecting AVX-512 F/BW/VL/VNNI (and
            // AVX2, FMA, F16C).
            unsafe { x86::rows512::attend_tiled_rows(q, heads, spans, kv, scale, sinks, &mut scratch.rows, out) };
        } else {
            // SAFETY: an x86 SIMD table (Avx2 and above) is only built after detecting AVX2,
            // FMA and F16C.
            unsafe { x86::rows::attend_tiled_rows(q, heads, spans, kv, scale, sinks, &mut scratch.rows, out) };
        }
        #[cfg(target_arch = "aarch64")]
        aarch64::rows::attend_tiled_rows(q, heads, spans, kv, scale, sinks, &mut scratch.rows, out);
        types::note_key_transposes(scratch.rows.work.chunks_scored - before);
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        return;
    }
    // A quantized cache: ggml's one-chunk kernel for all the rows of a prefill block at once
    // (a single row, decode's, takes the grouped kernel, which asks for its rows ahead).
    if !kv.is_f16() && q.len() > 1 && q.len() * heads <= ROWS_MAX_VECTORS && scratch.rows.v32.len() >= DECODE_CHUNK * kv.head_dim {
        return quant::attend_quant_rows(kernels, q, heads, spans, kv, scale, None, scratch, out);
    }
    // The first row reads the cells from memory, the others (of the same sequence, mostly the
    // same cells) from cache.
    for (i, ((qr, or), span)) in q.iter().zip(out.iter_mut()).zip(spans).enumerate() {
        let lo = span.start;
        let rows = if i == 0 { Rows::Memory } else { Rows::Cached };
        attend_heads_from(kind, kernels, qr, Cells { kv, n: span.end, visible: Visible::From(lo) }, scale, scratch, or, rows);
    }
}

/// The tiled kernel's SIMD version (`x86::reference::attend_tiled_group`) over the `q.len() /
/// head_dim` heads in `q`, if this table, cache and shape allow it; `false` if it did not run.
fn tiled_group(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) -> bool {
    let (kv, hd) = (cells.kv, cells.kv.head_dim);
    #[cfg(target_arch = "x86_64")]
    if kernels.isa() >= crate::Isa::Avx2
        && kv.is_f16()
        && hd.is_multiple_of(8)
        && q.len() / hd <= x86::reference::MAX_GROUP
    {
        if let Some(bufs) = scratch.group_buffers(q.len() / hd) {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe { x86::reference::attend_tiled_group(q, cells, scale, bufs, out) };
            types::note_key_transposes(cells.n.div_ceil(8));
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kernels, q, kv, hd, cells, scale, scratch, out);
    false
}

/// Ranges of `chunk` cells that split-KV decode (`AttnKernel::Split(chunk)`) cuts `n_cells`
/// into (at least one).
pub fn split_ranges(n_cells: usize, chunk: usize) -> usize {
    n_cells.max(1).div_ceil(chunk.max(1))
}

/// Range `r` of split-KV decode (`AttnKernel::Split(chunk)`: cells `r·chunk ..`) alone, for
/// the `q.len() / head_dim` query heads in `q` (of one KV head): each head's partial — its
/// (maximum, sum) in `state[h]`, its unnormalised values (F16 accumulators, as f32) in
/// `acc[h·hd ..]` —, which [`fold_ranges`] combines, in range order, into the bits of
/// [`attend_heads`] with `AttnKernel::Split(chunk)`. The ranges of one query may run on
/// different workers (the engine's one-row decode does: `core::sched::attend`).
#[allow(clippy::too_many_arguments)]
pub fn attend_split_range(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: impl Into<Scale>,
    chunk: usize,
    r: usize,
    scratch: &mut AttnScratch,
    state: &mut [[f32; 2]],
    acc: &mut [f32],
) {
    let scale: Scale = scale.into();
    let (hd, chunk) = (cells.kv.head_dim, chunk.max(1));
    let heads = q.len() / hd;
    assert!(cells.kv.is_f16() && cells.kv.k_layout == KeyLayout::Rows, "split-KV decode reads an F16 cache of key rows");
    assert!(state.len() >= heads && acc.len() >= heads * hd && r < split_ranges(cells.n, chunk));
    if attend_decode(kernels, q, cells, scale, chunk, Some(r), true, scratch, acc) {
        state[..heads].copy_from_slice(scratch.range_states(heads));
        return;
    }
    portable::attend_split_range(q, cells, scale, chunk, r, scratch, state, acc)
}

/// Most query heads per KV head the attention-sink paths take (gpt-oss: 8).
pub const MAX_SINK_HEADS: usize = 64;

/// One query head's attention with an attention sink (gpt-oss): its partial over the visible
/// cells of an F16 cache of key rows — [`attend_split_range`] with one range of all of them,
/// the decode kernels — and the sink logit counted in the softmax as ggml counts it
/// (`portable::sink_finish`). `q`, `out`: the heads of one KV head (`heads × head_dim`);
/// `sinks[h]` is head `h`'s; `state` at least `heads` long.
#[allow(clippy::too_many_arguments)]
pub fn attend_with_sinks(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: impl Into<Scale>,
    sinks: &[f32],
    scratch: &mut AttnScratch,
    state: &mut [[f32; 2]],
    out: &mut [f32],
) {
    let hd = cells.kv.head_dim;
    attend_split_range(kernels, q, cells, scale, cells.n.max(1), 0, scratch, state, out);
    for ((o, &st), &sink) in out.chunks_exact_mut(hd).zip(state.iter()).zip(sinks) {
        portable::sink_finish(st, sink, o);
    }
}

/// Split-KV decode's partials of one head, given in range order as (maximum, sum) and
/// unnormalised values ([`attend_split_range`]), combined into its output as
/// `ggml_flash_attn_ext_reduce_partials` combines them.
pub fn fold_ranges<'p>(parts: impl IntoIterator<Item = ([f32; 2], &'p [f32])>, out: &mut [f32]) {
    let mut fin = [f32::NEG_INFINITY, 0.0];
    out.fill(0.0);
    for (st, acc) in parts {
        portable::fold(&mut fin, out, st, acc);
    }
    portable::finish(fin, out);
}

/// Split-KV attention of the `q.len() / head_dim` query heads in `q` over the visible cells
/// `c < n_cells` of an F16 cache, in chunks of `chunk` cells: the decode kernels where they
/// apply, otherwise the portable reference per head and chunk.
fn attend_split(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    chunk: usize,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let chunk = chunk.max(1);
    if attend_decode(kernels, q, cells, scale, chunk, None, true, scratch, out) {
        return;
    }
    portable::attend_split(q, cells, scale, chunk, scratch, out)
}
