//! Fused online-softmax attention over the (paged) KV cache, as ggml-cpu's two flash-attention
//! algorithms compute it: the one-chunk kernel (decode, and any batch over a quantized cache:
//! F16 query and dot products, F16 accumulator — f32 for quantized values — rescaled as the
//! maximum grows) and the tiled kernel (prefill batches of at least [`TILED_MIN_ROWS`] rows over
//! an F16 cache). Portable versions here; SIMD twins in `x86::attn*`, chosen from the kernel
//! table, bit-identical per head.

use crate::blocks::{as_blocks, bytes_of};
use crate::ops::expf_ggml;
use crate::DType;
use half::f16;

mod quant;
pub(crate) mod split;
use quant::{attend_quant, attend_quant_group};

/// Which of ggml-cpu's flash-attention algorithms to reproduce. They give different bits, and
/// on rows with massive activations the difference is visible in the logits, so the scheduler
/// picks the one llama.cpp would: `Tiled` for batches of at least [`TILED_MIN_ROWS`] query rows,
/// `Reference` otherwise (single-token decode included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnKernel {
    /// ggml's `one_chunk`: query rounded to F16, F16 dot products, the V accumulator kept in
    /// F16 and rescaled whenever the running maximum grows.
    Reference,
    /// ggml's tiled kernel: F32 query and keys, KV in tiles of [`KV_TILE`] cells, the softmax
    /// sum of each tile in double, an F32 accumulator.
    Tiled,
    /// ggml's split-KV decode (one query row over an F16 cache whose padded length is at least
    /// 512 cells): `Reference` over consecutive chunks of this many cells, each giving its
    /// (maximum, sum, unnormalised values), combined in order as
    /// `ggml_flash_attn_ext_reduce_partials` does (`attention/split.rs`). A quantized cache is
    /// never split (as in ggml): there it is `Reference`.
    Split(usize),
}

/// Visible cells per phase of the two-phase decode kernels (`x86::attn_decode*`,
/// `attend_quant_group`); their grow masks are `u64`.
pub const DECODE_CHUNK: usize = 64;

/// Per head, the running maximum over the chunk's `n` scores, which fixes every cell's
/// exponent — `max_old - score` where the maximum grows (`grow` bit set), `score - max`
/// elsewhere, exactly the scalar kernel's arguments — then all the exponentials at once
/// (`exps`, libm's `expf` lane for lane). `scores` become the exponentials.
pub fn softmax_steps(scores: &mut [f32], grow: &mut [u64], state: &mut [[f32; 2]], n: usize, exps: impl Fn(&mut [f32])) {
    for ((st, g), sc) in state.iter_mut().zip(grow.iter_mut()).zip(scores.chunks_exact_mut(DECODE_CHUNK)) {
        let mut m = st[0];
        *g = 0;
        for (i, s) in sc[..n].iter_mut().enumerate() {
            if *s > m {
                (*s, m) = (m - *s, *s);
                *g |= 1 << i;
            } else {
                *s -= m;
            }
        }
        st[0] = m;
        exps(&mut sc[..n]);
    }
}

/// `out[h] = acc[h] / sum_h` for every head of `head_dim` values, where `state[h]` is the
/// head's (maximum, sum); zeros for a head that saw no cell.
pub(crate) fn normalize_heads(acc: &[f32], state: &[[f32; 2]], head_dim: usize, out: &mut [f32]) {
    for ((st, a), o) in state.iter().zip(acc.chunks_exact(head_dim)).zip(out.chunks_exact_mut(head_dim)) {
        let inv = if st[1] == 0.0 { 0.0 } else { 1.0 / st[1] };
        for (o, &a) in o.iter_mut().zip(a) {
            *o = a * inv;
        }
    }
}

/// Query rows from which ggml switches to the tiled kernel.
pub const TILED_MIN_ROWS: usize = 64;
/// KV cells per tile of the tiled kernel.
pub const KV_TILE: usize = 64;

/// Scratch for one attention row, allocated once per worker.
pub struct AttnScratch {
    /// The query in the key type's `vec_dot_type` (quantized caches).
    qq: Vec<u8>,
    /// One value row converted to f32 (quantized caches).
    v32: Vec<f32>,
    q16: Vec<f16>,
    acc16: Vec<f16>,
    acc: Vec<f32>,
    scores: [f32; KV_TILE],
    /// Grouped tiled kernel: `[heads][KV_TILE]` probabilities of the current tile.
    gscores: Vec<f32>,
    /// Grouped tiled kernel: `[heads][head_dim]` f32 accumulators.
    gacc: Vec<f32>,
    /// Grouped tiled kernel: running maximum and sum per head.
    gstate: Vec<[f32; 2]>,
    /// Grouped reference kernel: `[heads][head_dim]` F16 accumulators.
    gacc16: Vec<f16>,
    /// One key row in f32.
    k32: Vec<f32>,
    /// Decode kernels: `[heads][head_dim]` f32 accumulators.
    dacc: Vec<f32>,
    /// Grouped quantized-cache kernel: `[heads]` queries in the key type's `vec_dot_type`.
    gqq: Vec<u8>,
    /// AVX-512 decode kernel: per head, the cells of a chunk that raise its maximum.
    dgrow: Vec<u64>,
    /// Per head, the (maximum, sum) of the split-KV chunks combined so far.
    pub(crate) dfin: Vec<[f32; 2]>,
    /// Buffers of the multi-row kernel ([`attend_rows`]).
    rows: RowsScratch,
}

/// Buffers of [`attend_rows`]' SIMD kernel (`x86::attn_rows`) for up to
/// [`ROWS_MAX_VECTORS`] query vectors (rows × heads).
pub struct RowsScratch {
    /// `[head_dim][8]` f32: the keys of one 8-cell chunk, transposed.
    pub(crate) kt: Vec<f32>,
    /// `[vector][KV_TILE]` scores, then probabilities, of the current tile.
    pub(crate) scores: Vec<f32>,
    /// `[vector][head_dim]` f32 accumulators.
    pub(crate) acc: Vec<f32>,
    /// Running (maximum, sum) per vector.
    pub(crate) state: Vec<[f32; 2]>,
    /// `[KV_TILE][head_dim]` f32: the values of the current tile.
    pub(crate) v32: Vec<f32>,
    /// `head_dim` zeros: the key row of a chunk's missing cells.
    pub(crate) zero: Vec<f16>,
}

/// Most query vectors (rows × heads) one [`attend_rows`] call takes.
pub const ROWS_MAX_VECTORS: usize = 16;

impl RowsScratch {
    fn new(head_dim: usize) -> Self {
        RowsScratch {
            kt: vec![0.0; head_dim * 8],
            scores: vec![0.0; ROWS_MAX_VECTORS * KV_TILE],
            acc: vec![0.0; ROWS_MAX_VECTORS * head_dim],
            state: vec![[0.0; 2]; ROWS_MAX_VECTORS],
            v32: vec![0.0; KV_TILE * head_dim],
            zero: vec![f16::ZERO; head_dim],
        }
    }
}

/// The buffers of the grouped reference kernel for `heads` heads: widened queries
/// `[heads][head_dim]`, F16 accumulators `[heads][head_dim]`, (maximum, sum) per head, one key
/// row and one value row in f32.
pub type ReferenceBuffers<'a> = (&'a mut [f32], &'a mut [f16], &'a mut [[f32; 2]], &'a mut [f32], &'a mut [f32]);

/// The buffers of the grouped tiled kernel for `heads` heads: probabilities `[heads][KV_TILE]`,
/// accumulators `[heads][head_dim]`, (maximum, sum) per head, one value row in f32.
pub type GroupBuffers<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [[f32; 2]], &'a mut [f32]);

impl AttnScratch {
    /// Buffers for [`attend_heads`]' grouped kernel, `None` if sized for fewer heads.
    pub fn group_buffers(&mut self, heads: usize) -> Option<GroupBuffers<'_>> {
        let hd = self.acc.len();
        (heads <= self.gstate.len()).then(|| {
            (
                &mut self.gscores[..heads * KV_TILE],
                &mut self.gacc[..heads * hd],
                &mut self.gstate[..heads],
                &mut self.v32[..],
            )
        })
    }


    /// Buffers for the grouped reference kernel, `None` if sized for fewer heads.
    pub fn reference_buffers(&mut self, heads: usize) -> Option<ReferenceBuffers<'_>> {
        let hd = self.acc.len();
        (heads <= self.gstate.len()).then(|| {
            (
                &mut self.gacc[..heads * hd],
                &mut self.gacc16[..heads * hd],
                &mut self.gstate[..heads],
                &mut self.k32[..],
                &mut self.v32[..],
            )
        })
    }

    /// Buffers for the AVX-512 decode kernel (`x86::attn_decode`), `None` if sized for fewer
    /// heads.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn decode_buffers(&mut self, heads: usize) -> Option<crate::x86::attn_decode::DecodeBuffers<'_>> {
        let hd = self.acc.len();
        (heads <= self.gstate.len() && KV_TILE >= DECODE_CHUNK).then(|| crate::x86::attn_decode::DecodeBuffers {
            qf: &mut self.gacc[..heads * hd],
            acc: &mut self.dacc[..heads * hd],
            state: &mut self.gstate[..heads],
            scores: &mut self.gscores[..],
            grow: &mut self.dgrow[..heads],
            fin: &mut self.dfin[..heads],
            k32: &mut self.k32[..],
            v32: &mut self.v32[..],
        })
    }

    /// The F16 query and accumulator buffers and one f32 value row (for SIMD twins of the
    /// reference kernel).
    pub fn f16_buffers(&mut self) -> (&mut [f16], &mut [f16], &mut [f32]) {
        (&mut self.q16, &mut self.acc16, &mut self.v32)
    }

    /// Scratch for one query head at a time.
    pub fn new(head_dim: usize) -> Self {
        Self::with_heads(head_dim, 1)
    }

    /// Scratch for up to `heads` query heads per [`attend_heads`] call.
    pub fn with_heads(head_dim: usize, heads: usize) -> Self {
        AttnScratch {
            // Enough for any activation type: F32 is the widest per element.
            qq: vec![0; head_dim * 4 + 64],
            v32: vec![0.0; head_dim],
            q16: vec![f16::ZERO; head_dim],
            acc16: vec![f16::ZERO; head_dim],
            acc: vec![0.0; head_dim],
            scores: [0.0; KV_TILE],
            gscores: vec![0.0; heads * KV_TILE],
            gacc: vec![0.0; heads * head_dim],
            gstate: vec![[0.0; 2]; heads],
            gacc16: vec![f16::ZERO; heads * head_dim],
            k32: vec![0.0; head_dim],
            dacc: vec![0.0; heads * head_dim],
            gqq: vec![0; heads * (head_dim * 4 + 64)],
            dgrow: vec![0; heads],
            dfin: vec![[0.0; 2]; heads],
            rows: RowsScratch::new(head_dim),
        }
    }
}

/// The K and V rows of one KV head in a paged cache. Logical cell `i` (the token at position
/// `i` of the sequence) lives in physical row `table[i >> shift] << shift | i & mask`: the cache
/// is cut into blocks of `1 << shift` rows and `table` lists the sequence's blocks in order.
/// Rows are `head_dim` elements of `k_type` / `v_type` (F16 by default; Q8_0 or Q4_0 blocks).
#[derive(Clone, Copy)]
pub struct KvRows<'a> {
    /// `[physical row][row bytes]` keys of this KV head.
    pub k: &'a [u8],
    /// `[physical row][row bytes]` values of this KV head.
    pub v: &'a [u8],
    pub k_type: DType,
    pub v_type: DType,
    pub head_dim: usize,
    /// Physical block of each logical block.
    pub table: &'a [u32],
    /// log2 of the rows per block.
    pub shift: u32,
}

impl<'a> KvRows<'a> {
    /// F16 rows `0..n` stored contiguously (an identity table over blocks of one row).
    pub fn contiguous(k: &'a [f16], v: &'a [f16], head_dim: usize, identity: &'a [u32]) -> Self {
        KvRows {
            k: bytes_of(k),
            v: bytes_of(v),
            k_type: DType::F16,
            v_type: DType::F16,
            head_dim,
            table: identity,
            shift: 0,
        }
    }

    #[inline(always)]
    pub fn row(&self, i: usize) -> usize {
        ((self.table[i >> self.shift] as usize) << self.shift) | (i & ((1 << self.shift) - 1))
    }

    #[inline(always)]
    pub fn k_bytes(&self, i: usize) -> &'a [u8] {
        let rb = crate::row_bytes(self.k_type, self.head_dim);
        let r = self.row(i) * rb;
        &self.k[r..r + rb]
    }

    #[inline(always)]
    pub fn v_bytes(&self, i: usize) -> &'a [u8] {
        let rb = crate::row_bytes(self.v_type, self.head_dim);
        let r = self.row(i) * rb;
        &self.v[r..r + rb]
    }

    /// Key row of an F16 cache.
    #[inline(always)]
    pub fn k(&self, i: usize) -> &'a [f16] {
        debug_assert_eq!(self.k_type, DType::F16);
        as_blocks(self.k_bytes(i))
    }

    /// Value row of an F16 cache.
    #[inline(always)]
    pub fn v(&self, i: usize) -> &'a [f16] {
        debug_assert_eq!(self.v_type, DType::F16);
        as_blocks(self.v_bytes(i))
    }

    pub fn is_f16(&self) -> bool {
        self.k_type == DType::F16 && self.v_type == DType::F16
    }
}

/// Fused attention for one query head over an F16 KV cache, with online softmax (one pass, no
/// score matrix): `out = Σ_c softmax(scale · q·k_c) v_c` over the logical cells `c < n_cells`
/// of `kv` for which `visible(c)` holds, in logical order. Writes zeros if no cell is visible.
#[allow(clippy::too_many_arguments)]
pub fn attend_row(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let isa = kernels.isa;
    if !kv.is_f16() {
        return attend_quant(kernels, q, kv, n_cells, scale, visible, scratch, out);
    }
    if let AttnKernel::Split(chunk) = kind {
        return split::attend_split(kernels, q, kv, n_cells, scale, &visible, chunk, scratch, out);
    }
    #[cfg(target_arch = "x86_64")]
    if kind == AttnKernel::Reference && attend_decode(kernels, q, kv, n_cells, scale, &visible, 0, scratch, out) {
        return;
    }
    match kind {
        #[cfg(target_arch = "x86_64")]
        AttnKernel::Reference if isa == crate::Isa::Avx2 => {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe { crate::x86::attn::attend_reference(q, kv, n_cells, scale, &visible, scratch, out) }
        }
        AttnKernel::Reference | AttnKernel::Split(_) => attend_reference(q, kv, n_cells, scale, visible, scratch, out),
        AttnKernel::Tiled => {
            if !tiled_group(kernels, q, kv, n_cells, scale, &visible, scratch, out) {
                attend_tiled(q, kv, n_cells, scale, visible, scratch, out)
            }
        }
    }
}

/// [`attend_row`] for consecutive query heads that read the same KV head (a GQA group or part of
/// one; `q` and `out` hold `heads × kv.head_dim` values). With the AVX2 table and an F16 cache
/// the heads go through the cells together: for the tiled kernel (`x86::attn::attend_tiled_group`)
/// each 8-cell block of keys is loaded and transposed once for all of them; for the reference
/// kernel, decode's (`x86::attn::attend_reference_group`), each key and value row is widened
/// once. Every head gets the bits of its own `attend_row` call.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    if kind == AttnKernel::Tiled && tiled_group(kernels, q, kv, n_cells, scale, &visible, scratch, out) {
        return;
    }
    let kind = match kind {
        AttnKernel::Split(chunk) if kv.is_f16() => return split::attend_split(kernels, q, kv, n_cells, scale, &visible, chunk, scratch, out),
        AttnKernel::Split(_) => AttnKernel::Reference,
        k => k,
    };
    let hd = kv.head_dim;
    #[cfg(target_arch = "x86_64")]
    if kind == AttnKernel::Reference && attend_decode(kernels, q, kv, n_cells, scale, &visible, 0, scratch, out) {
        return;
    }
    // A quantized cache always takes ggml's one-chunk path (`attend_row` ignores `kind` for it).
    if !kv.is_f16() && kv.v_type != DType::F16 && q.len() / hd <= scratch.gstate.len() {
        return attend_quant_group(kernels, q, kv, n_cells, scale, &visible, scratch, out);
    }
    #[cfg(target_arch = "x86_64")]
    if kind == AttnKernel::Reference && kernels.isa == crate::Isa::Avx2 && kv.is_f16() && hd.is_multiple_of(8) && q.len() > hd {
        if let Some(bufs) = scratch.reference_buffers(q.len() / hd) {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe { crate::x86::attn::attend_reference_group(q, kv, n_cells, scale, &visible, bufs, out) };
            return;
        }
    }
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        attend_row(kind, kernels, qh, kv, n_cells, scale, &visible, scratch, oh);
    }
}

/// The reference kernel for `q.len() / head_dim` heads with the two-phase decode kernel
/// (`x86::attn_decode` with AVX-512, `x86::attn_decode_avx2` with the AVX2 table), if the cache
/// is F16 and the head dimension one it takes; returns whether it ran. `split` > 0: ggml's
/// split-KV decode over chunks of `split` cells (`attention::split`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_decode(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    split: usize,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) -> bool {
    use crate::x86::attn_decode;
    if !(kernels.isa == crate::Isa::Avx2 && kv.is_f16() && attn_decode::supports(kv.head_dim)) {
        return false;
    }
    let Some(bufs) = scratch.decode_buffers(q.len() / kv.head_dim) else { return false };
    if kernels.avx512 {
        // SAFETY: `avx512` is only set by `Kernels::detect` after detecting AVX-512 F/BW/VL/VNNI
        // (and AVX2, FMA, F16C).
        unsafe { attn_decode::attend_decode_group(q, kv, n_cells, scale, visible, split, bufs, out) };
    } else {
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
        unsafe { crate::x86::attn_decode_avx2::attend_decode_group_avx2(q, kv, n_cells, scale, visible, split, bufs, out) };
    }
    true
}

/// Attention for a block of query rows of one sequence (prefill): row `r` holds `heads`
/// query heads that read the KV head `kv` (`q[r]`, `out[r]`: `heads × head_dim` values) and
/// sees the logical cells `spans[r]` (causal limit and sliding window). Every head of every row
/// gets the bits of its own [`attend_row`] call with `n_cells = spans[r].end` and `visible(c)
/// = c >= spans[r].start`. With the AVX2 table, an F16 cache, the tiled kernel and at most
/// [`ROWS_MAX_VECTORS`] rows × heads, the rows go through the cells together
/// (`x86::attn_rows`); otherwise row by row.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[&[f32]],
    heads: usize,
    spans: &[std::ops::Range<usize>],
    kv: &KvRows,
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [&mut [f32]],
) {
    #[cfg(target_arch = "x86_64")]
    if kind == AttnKernel::Tiled
        && kernels.isa == crate::Isa::Avx2
        && kv.is_f16()
        && kv.head_dim.is_multiple_of(8)
        && q.len() * heads <= ROWS_MAX_VECTORS
        && scratch.rows.zero.len() >= kv.head_dim
    {
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
        unsafe { crate::x86::attn_rows::attend_tiled_rows(q, heads, spans, kv, scale, &mut scratch.rows, out) };
        return;
    }
    for ((qr, or), span) in q.iter().zip(out.iter_mut()).zip(spans) {
        let lo = span.start;
        attend_heads(kind, kernels, qr, kv, span.end, scale, |c| c >= lo, scratch, or);
    }
}

/// The tiled kernel's SIMD version (`x86::attn::attend_tiled_group`) over the `q.len() /
/// head_dim` heads in `q`, if this table, cache and shape allow it; `false` if it did not run.
#[allow(clippy::too_many_arguments)]
fn tiled_group(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) -> bool {
    let hd = kv.head_dim;
    #[cfg(target_arch = "x86_64")]
    if kernels.isa == crate::Isa::Avx2
        && kv.is_f16()
        && hd.is_multiple_of(8)
        && q.len() / hd <= crate::x86::attn::MAX_GROUP
    {
        if let Some(bufs) = scratch.group_buffers(q.len() / hd) {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe { crate::x86::attn::attend_tiled_group(q, kv, n_cells, scale, visible, bufs, out) };
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kernels, q, hd, n_cells, scale, visible, scratch, out);
    false
}

/// ggml's `one_chunk` kernel over a quantized cache: the query quantized to the key type's
/// `vec_dot_type` and scored with the type's dot product; F16 values accumulated in F16 as in
/// [`AttnKernel::Reference`], quantized values converted to f32 and accumulated in f32.
#[allow(clippy::too_many_arguments)]
fn attend_reference(
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let [_, s] = reference_partial(q, kv, 0..n_cells, scale, &visible, scratch);
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for (o, a) in out.iter_mut().zip(&scratch.acc16) {
        *o = a.to_f32() * inv;
    }
}

/// ggml's `one_chunk` over the visible cells of `cells`: returns (maximum, sum) and leaves the
/// unnormalised F16 accumulator in `scratch.acc16`.
pub(crate) fn reference_partial(
    q: &[f32],
    kv: &KvRows,
    cells: std::ops::Range<usize>,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    scratch: &mut AttnScratch,
) -> [f32; 2] {
    for (d, &s) in scratch.q16.iter_mut().zip(q) {
        *d = f16::from_f32(s);
    }
    scratch.acc16.iter_mut().for_each(|a| *a = f16::ZERO);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    for c in cells {
        if !visible(c) {
            continue;
        }
        let score = dot_f16_ggml(kv.k(c), &scratch.q16) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if score > m {
            let old = m;
            m = score;
            ms = (old - m).exp();
            for a in scratch.acc16.iter_mut() {
                *a = f16::from_f32(a.to_f32() * ms);
            }
        } else {
            vs = (score - m).exp();
        }
        for (a, &vv) in scratch.acc16.iter_mut().zip(kv.v(c)) {
            *a = f16::from_f32(vv.to_f32().mul_add(vs, a.to_f32()));
        }
        s = s.mul_add(ms, vs);
    }
    [m, s]
}

/// ggml's tiled kernel, portable. The AVX2 version is `x86::attn::attend_tiled_group` (one or
/// more heads of a GQA group at once), bit-identical to this per head.
#[allow(clippy::too_many_arguments)]
fn attend_tiled(
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    scratch.acc.iter_mut().for_each(|a| *a = 0.0);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    let mut t0 = 0;
    while t0 < n_cells {
        let t1 = (t0 + KV_TILE).min(n_cells);
        let mut tile_max = f32::NEG_INFINITY;
        for c in t0..t1 {
            let sc = if visible(c) {
                kv.k(c).iter().zip(q).fold(0f32, |acc, (&kk, &qq)| kk.to_f32().mul_add(qq, acc)) * scale
            } else {
                f32::NEG_INFINITY
            };
            scratch.scores[c - t0] = sc;
            tile_max = tile_max.max(sc);
        }
        if tile_max == f32::NEG_INFINITY {
            t0 = t1;
            continue;
        }
        let m_new = m.max(tile_max);
        if m_new > m {
            let ms = (m - m_new).exp();
            scratch.acc.iter_mut().for_each(|a| *a *= ms);
            s *= ms;
        }
        m = m_new;
        // ggml_vec_soft_max_f32: its own expf, each group of 16 reduced in float (GCC's
        // `_mm512_reduce_add_ps` order), the groups summed in double, added to S in double.
        for p in scratch.scores[t1 - t0..].iter_mut() {
            *p = f32::NEG_INFINITY; // the padding of a short last tile
        }
        let mut sum = 0f64;
        for g in scratch.scores.chunks_exact_mut(16) {
            for p in g.iter_mut() {
                *p = expf_ggml(*p - m);
            }
            sum += reduce_add_16(&<[f32; 16]>::try_from(&*g).expect("16 lanes")) as f64;
        }
        s = (s as f64 + sum) as f32;
        for c in t0..t1 {
            let p = scratch.scores[c - t0];
            if p == 0.0 {
                continue;
            }
            for (a, &vv) in scratch.acc.iter_mut().zip(kv.v(c)) {
                *a = p.mul_add(vv.to_f32(), *a);
            }
        }
        t0 = t1;
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for (o, &a) in out.iter_mut().zip(&scratch.acc) {
        *o = a * inv;
    }
}

/// F16 dot product in exactly the order ggml-cpu's AVX-512 build sums it (`ggml_vec_dot_f16`
/// with `F32Cx16`): four 16-lane f32 accumulators over 64-element steps, fused multiply-adds,
/// the accumulators folded (0+2, 1+3, then 0+1), the 16 lanes reduced as GCC's
/// `_mm512_reduce_add_ps` does, the tail added in double. Attention scores of massive-activation
/// rows are sensitive to these bits.
pub fn dot_f16_ggml(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, al) in a.iter_mut().enumerate() {
                let k = i + j * 16 + l;
                *al = x[k].to_f32().mul_add(y[k].to_f32(), *al);
            }
        }
    }
    for l in 0..16 {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
    }
    for l in 0..16 {
        acc[0][l] += acc[1][l];
    }
    let mut sum = reduce_add_16(&acc[0]) as f64;
    for k in np..n {
        sum += (x[k].to_f32() * y[k].to_f32()) as f64;
    }
    sum as f32
}

/// Sum of 16 lanes in the order of GCC's `_mm512_reduce_add_ps`: halves, then [`hsum_8`].
#[inline]
pub fn reduce_add_16(a: &[f32; 16]) -> f32 {
    hsum_8(&std::array::from_fn(|i| a[8 + i] + a[i]))
}

/// Sum of 8 lanes in the order of `hsum_f32x8` (and the lower steps of `_mm512_reduce_add_ps`):
/// halves, then `[0] + [2]` and `[1] + [3]`, then those two.
#[inline]
pub fn hsum_8(a: &[f32; 8]) -> f32 {
    let h: [f32; 4] = std::array::from_fn(|i| a[4 + i] + a[i]);
    (h[0] + h[2]) + (h[1] + h[3])
}
