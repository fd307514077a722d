//! What every attention kernel shares: the choice of ggml's algorithm ([`AttnKernel`]), the
//! paged KV rows of one KV head ([`KvRows`]), and per-worker scratch sized once
//! ([`AttnScratch`]), with the views the SIMD kernels borrow from it.

use crate::quant::blocks::{as_blocks, bytes_of};
use crate::DType;
use half::f16;

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
    /// `ggml_flash_attn_ext_reduce_partials` does (`attention::portable::fold`). A quantized cache is
    /// never split (as in ggml): there it is `Reference`.
    Split(usize),
    /// `Reference` with each head's V accumulator kept in F32 instead of rounded to F16 after
    /// every cell (as ggml keeps it for a V cache that is not F16): the same scores and softmax
    /// steps, one F16 rounding pair less per value and cell (AVX2 phase 2 then waits on an
    /// FMA's latency, not an FMA's and two conversions'). Not llama.cpp's bits over an F16
    /// cache; `--fast-prefill` outside batch-invariant serving takes it for decode steps of
    /// several sequences and short prompts. A quantized cache takes `Reference`.
    Wide,
}

/// Visible cells per phase of the two-phase decode kernels (`x86::decode*`,
/// `attend_quant_group`); their grow masks are `u64`.
pub const DECODE_CHUNK: usize = 64;

/// How a query's dot product with a key becomes its score: `dot · mul`, then where `softcap`
/// is not 0, `softcap · tanh(dot · mul)` — Gemma 2's soft-capped attention logits, as ggml's
/// flash attention computes them (the layer's scale divided by the cap is `mul`; the tanh is
/// the C library's `tanhf`, which `f32::tanh` calls). Hidden cells stay −∞ whatever the cap.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    pub mul: f32,
    pub softcap: f32,
}

impl Scale {
    /// q·k times `scale`, soft-capped at `softcap` where it is not 0.
    pub fn new(scale: f32, softcap: f32) -> Self {
        Scale { mul: if softcap != 0.0 { scale / softcap } else { scale }, softcap }
    }

    /// The score of one dot product.
    #[inline(always)]
    pub fn score(self, dot: f32) -> f32 {
        self.cap_one(dot * self.mul)
    }

    /// The multiplier of a scale that has no cap: for kernels that cannot cap (the column-key
    /// ones; the engine refuses that pairing before any pass).
    pub fn uncapped(self) -> f32 {
        assert_eq!(self.softcap, 0.0, "soft-capped attention over keys in columns");
        self.mul
    }

    /// A score already multiplied by `mul`, capped (−∞ left as it is).
    #[inline(always)]
    pub fn cap_one(self, s: f32) -> f32 {
        if self.softcap != 0.0 && s != f32::NEG_INFINITY {
            self.softcap * s.tanh()
        } else {
            s
        }
    }

    /// [`Scale::cap_one`] over scores a SIMD kernel multiplied by `mul` (and set to −∞ where
    /// hidden); nothing without a cap.
    #[inline]
    pub fn cap(self, scores: &mut [f32]) {
        if self.softcap != 0.0 {
            scores.iter_mut().for_each(|s| *s = self.cap_one(*s));
        }
    }
}

impl From<f32> for Scale {
    /// A plain scale, no cap.
    fn from(mul: f32) -> Self {
        Scale { mul, softcap: 0.0 }
    }
}

/// Key rows the AVX-512 decode kernel scores together (`x86::decode`): widened once, their dot
/// products reduced across registers.
pub const DECODE_KEYS: usize = 16;

/// Query rows from which ggml switches to the tiled kernel.
pub const TILED_MIN_ROWS: usize = 64;
/// KV cells per tile of the tiled kernel.
pub const KV_TILE: usize = 64;

/// Scratch for one attention row, allocated once per worker.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // buffers of the SIMD kernels
pub struct AttnScratch {
    /// The query in the key type's `vec_dot_type` (quantized caches).
    pub(crate) qq: Vec<u8>,
    /// One value row converted to f32 (quantized caches).
    pub(crate) v32: Vec<f32>,
    pub(crate) q16: Vec<f16>,
    pub(crate) acc16: Vec<f16>,
    pub(crate) acc: Vec<f32>,
    pub(crate) scores: [f32; KV_TILE],
    /// Grouped tiled kernel: `[heads][KV_TILE]` probabilities of the current tile.
    pub(crate) gscores: Vec<f32>,
    /// Grouped tiled kernel: `[heads][head_dim]` f32 accumulators.
    pub(crate) gacc: Vec<f32>,
    /// Grouped tiled kernel: running maximum and sum per head.
    pub(crate) gstate: Vec<[f32; 2]>,
    /// Grouped reference kernel: `[heads][head_dim]` F16 accumulators.
    pub(crate) gacc16: Vec<f16>,
    /// One key row in f32.
    pub(crate) k32: Vec<f32>,
    /// Decode kernels: `[heads][head_dim]` f32 accumulators.
    pub(crate) dacc: Vec<f32>,
    /// Grouped quantized-cache kernel: `[heads]` queries in the key type's `vec_dot_type`.
    pub(crate) gqq: Vec<u8>,
    /// AVX-512 decode kernel: per head, the cells of a chunk that raise its maximum.
    pub(crate) dgrow: Vec<u64>,
    /// Per head, the (maximum, sum) of the split-KV chunks combined so far.
    pub(crate) dfin: Vec<[f32; 2]>,
    /// `[DECODE_KEYS][head_dim]` key rows widened to f32 (the AVX-512 decode kernel's phase 1).
    pub(crate) dkeys: Vec<f32>,
    /// Buffers of the multi-row kernel ([`attend_rows`]).
    pub(crate) rows: RowsScratch,
    /// What the worker reads after its current call ([`AttnScratch::read_next`]).
    pub(crate) next: NextRows,
    /// Buffers of the column-key kernels (`attention::matrix`).
    pub(crate) matrix: MatrixScratch,
}

/// Buffers of the column-key kernels (`attention::matrix`) for up to [`ROWS_MAX_VECTORS`]
/// query vectors.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub struct MatrixScratch {
    /// Per vector: running maximum.
    pub(crate) m: Vec<f32>,
    /// Per vector: running sums, one per cell position of a block (reduced at the end).
    pub(crate) l: Vec<[f32; KEY_COLUMNS]>,
    /// Per vector: scores, then probabilities, of the current block.
    pub(crate) p: Vec<[f32; KEY_COLUMNS]>,
    /// Per vector: the rescale factor of the current block.
    pub(crate) corr: Vec<f32>,
    /// `[vector][head_dim]` accumulators.
    pub(crate) acc: Vec<f32>,
    /// Per vector: its attention sink (gpt-oss), counted in its softmax when it finishes;
    /// `None` without sinks. Set by the call that runs the vectors (`matrix::run`).
    pub(crate) sinks: Option<[f32; ROWS_MAX_VECTORS]>,
    /// `[head_dim]` one vector's products with the current block's values (the portable form).
    pub(crate) part: Vec<f32>,
    /// `[head_dim][lanes]` queries transposed, `[KEY_COLUMNS][lanes]` probabilities transposed
    /// (matrix unit: one vector of `lanes` rows per dimension or cell).
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(crate) qt: Vec<f32>,
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(crate) pt: Vec<f32>,
    /// `[head_dim][KEY_COLUMNS]` one block's Q8_0 or Q4_0 keys widened to F16 (`matrix::widen`).
    pub(crate) kw: Vec<f16>,
    /// `[KEY_COLUMNS][head_dim]` one block's Q8_0 or Q4_0 value rows widened to F16.
    pub(crate) vw: Vec<f16>,
    /// `[head_dim][KEY_COLUMNS]` keys and `[KEY_COLUMNS][head_dim]` values of one block as
    /// f32: the AVX-512 kernel widens each block once for all the vectors of a call.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) kf: Vec<f32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) vf: Vec<f32>,
}

impl MatrixScratch {
    fn new(head_dim: usize) -> Self {
        let n = ROWS_MAX_VECTORS;
        // The widest matrix unit's rows (a 2048-bit streaming vector: 64 f32); only SME uses
        // the transposed buffers.
        let lanes = if cfg!(target_arch = "aarch64") { 64 } else { 0 };
        MatrixScratch {
            m: vec![0.0; n],
            l: vec![[0.0; KEY_COLUMNS]; n],
            p: vec![[0.0; KEY_COLUMNS]; n],
            corr: vec![0.0; n],
            acc: vec![0.0; n * head_dim],
            sinks: None,
            part: vec![0.0; head_dim],
            qt: vec![0.0; head_dim * lanes],
            pt: vec![0.0; KEY_COLUMNS * lanes],
            kw: vec![f16::ZERO; head_dim * KEY_COLUMNS],
            vw: vec![f16::ZERO; head_dim * KEY_COLUMNS],
            kf: if cfg!(target_arch = "x86_64") { vec![0.0; head_dim * KEY_COLUMNS] } else { Vec::new() },
            vf: if cfg!(target_arch = "x86_64") { vec![0.0; head_dim * KEY_COLUMNS] } else { Vec::new() },
        }
    }
}

/// The key and value rows (addresses) of the first [`DECODE_CHUNK`] cells a worker reads after
/// its current attention call: a decode kernel asks for them while it computes its last chunk,
/// so the next call does not start on rows still in memory. A hint: stale or absent rows cost
/// speed, never results (asking for an address never faults).
#[derive(Clone)]
pub struct NextRows {
    k: [usize; DECODE_CHUNK],
    v: [usize; DECODE_CHUNK],
    n: usize,
}

impl NextRows {
    /// The rows into `k`, `v` (their count), taken: a second call gets none.
    pub(crate) fn take(&mut self, k: &mut [*const f16; DECODE_CHUNK], v: &mut [*const f16; DECODE_CHUNK]) -> usize {
        for i in 0..self.n {
            (k[i], v[i]) = (self.k[i] as *const f16, self.v[i] as *const f16);
        }
        std::mem::take(&mut self.n)
    }
}

/// Buffers of [`attend_rows`]' SIMD kernel (`x86::rows`) for up to
/// [`ROWS_MAX_VECTORS`] query vectors (rows × heads).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct RowsScratch {
    /// `[head_dim][16]` f32: the keys of one chunk (8 or 16 cells), transposed.
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
    /// `[vector]` queries in a quantized key type's `vec_dot_type` (`quant::attend_quant_rows`).
    pub(crate) qq: Vec<u8>,
    /// What the kernel has computed with these buffers so far.
    pub(crate) work: TileWork,
}

/// Work of the multi-row kernel, summed over its calls: the 8-cell chunks whose keys it
/// transposed and scored, and the [`KV_TILE`]-cell tiles whose values it accumulated. Chunks and
/// tiles that no row of a call sees (causal mask, sliding window) are in neither.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileWork {
    pub chunks_scored: usize,
    pub tiles_accumulated: usize,
}

/// Most query vectors (rows × heads) one [`attend_rows`] call takes.
pub const ROWS_MAX_VECTORS: usize = 64;

impl RowsScratch {
    pub(crate) fn new(head_dim: usize) -> Self {
        RowsScratch {
            kt: vec![0.0; head_dim * 16],
            scores: vec![0.0; ROWS_MAX_VECTORS * KV_TILE],
            acc: vec![0.0; ROWS_MAX_VECTORS * head_dim],
            state: vec![[0.0; 2]; ROWS_MAX_VECTORS],
            v32: vec![0.0; KV_TILE * head_dim],
            zero: vec![f16::ZERO; head_dim],
            // Enough for any activation type: F32 is the widest per element.
            qq: vec![0; ROWS_MAX_VECTORS * (head_dim * 4 + 64)],
            work: TileWork::default(),
        }
    }

    /// The work done with these buffers so far.
    pub fn work(&self) -> TileWork {
        self.work
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
    /// The multi-row kernel's work with these buffers so far ([`TileWork`]).
    pub fn tile_work(&self) -> TileWork {
        self.rows.work()
    }

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

    /// Buffers for the decode kernels (`x86::decode*`, `aarch64::decode`), `None` if sized for fewer
    /// heads.
    pub(crate) fn decode_buffers(&mut self, heads: usize) -> Option<DecodeBuffers<'_>> {
        let hd = self.acc.len();
        (heads <= self.gstate.len() && KV_TILE >= DECODE_CHUNK).then(|| DecodeBuffers {
            qf: &mut self.gacc[..heads * hd],
            acc: &mut self.dacc[..heads * hd],
            state: &mut self.gstate[..heads],
            scores: &mut self.gscores[..],
            grow: &mut self.dgrow[..heads],
            fin: &mut self.dfin[..heads],
            keys: &mut self.dkeys[..],
            v32: &mut self.rows.v32[..],
            next: &mut self.next,
            only: None,
        })
    }

    /// Per head, the (maximum, sum) a decode kernel left in `DecodeBuffers::fin` for the range
    /// it computed alone.
    pub(crate) fn range_states(&self, heads: usize) -> &[[f32; 2]] {
        &self.dfin[..heads]
    }

    /// The F16 query and accumulator buffers and one f32 value row (for SIMD twins of the
    /// reference kernel).
    pub fn f16_buffers(&mut self) -> (&mut [f16], &mut [f16], &mut [f32]) {
        (&mut self.q16, &mut self.acc16, &mut self.v32)
    }

    /// The cells `cells` of `kv` (up to the first [`DECODE_CHUNK`] of them) are what this
    /// worker's next attention call reads first; `None`: nothing known. The decode kernels ask
    /// for their rows while computing their last chunk ([`NextRows`]).
    pub fn read_next(&mut self, next: Option<(KvRows, std::ops::Range<usize>)>) {
        let nr = &mut self.next;
        nr.n = 0;
        if let Some((kv, cells)) = next {
            // Row bytes once (`k_bytes` divides by the block size per cell).
            let (kb, vb) = (crate::row_bytes(kv.k_type, kv.head_dim), crate::row_bytes(kv.v_type, kv.head_dim));
            for c in cells.take(DECODE_CHUNK) {
                let row = kv.row(c);
                (nr.k[nr.n], nr.v[nr.n]) = (kv.k[row * kb..].as_ptr() as usize, kv.v[row * vb..].as_ptr() as usize);
                nr.n += 1;
            }
        }
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
            dkeys: vec![0.0; DECODE_KEYS * head_dim],
            rows: RowsScratch::new(head_dim),
            next: NextRows { k: [0; DECODE_CHUNK], v: [0; DECODE_CHUNK], n: 0 },
            matrix: MatrixScratch::new(head_dim),
        }
    }
}

/// The cells one attention call reads: the logical cells `c < n` of `kv` that are
/// [`Visible`] (the causal limit, a sliding window, cells hidden from a sequence), in logical
/// order.
#[derive(Clone, Copy)]
pub struct Cells<'a> {
    pub kv: &'a KvRows<'a>,
    pub n: usize,
    pub visible: Visible<'a>,
}

impl Cells<'_> {
    /// The cells `first..n` a per-cell loop walks ([`Visible::clip`]).
    #[inline]
    pub fn span(&self) -> std::ops::Range<usize> {
        self.visible.clip(0..self.n)
    }
}

/// Which of a call's cells are visible: from a first cell on (what the engine's causal limit
/// and sliding windows give), or any mask. `From` is read without a call per cell, and decode's
/// gathering starts at its first cell instead of walking the hidden ones (a sliding window deep
/// in a long context hides most of them).
#[derive(Clone, Copy)]
pub enum Visible<'a> {
    /// The cells `c >= first` (0: all of them).
    From(usize),
    /// The cells for which the function holds.
    Mask(&'a dyn Fn(usize) -> bool),
}

impl Visible<'_> {
    /// Whether cell `c` is visible.
    #[inline(always)]
    pub fn at(&self, c: usize) -> bool {
        match *self {
            Visible::From(first) => c >= first,
            Visible::Mask(f) => f(c),
        }
    }

    /// Every cell below this one is hidden.
    #[inline]
    pub fn first(&self) -> usize {
        match *self {
            Visible::From(first) => first,
            Visible::Mask(_) => 0,
        }
    }

    /// `cells` less the hidden ones below [`Visible::first`]: what a per-cell loop walks (it
    /// still tests [`Visible::at`] for each, as a mask hides cells anywhere).
    #[inline]
    pub fn clip(&self, cells: std::ops::Range<usize>) -> std::ops::Range<usize> {
        self.first().max(cells.start).min(cells.end)..cells.end
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
    /// How the keys are laid out ([`KeyLayout`]); the values are always rows.
    pub k_layout: KeyLayout,
}

/// The layout of a KV cache's keys, chosen when the cache is made and written so by the node
/// that stores them: each layout has its own reader, and nothing converts one into the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyLayout {
    /// A row of `head_dim` elements per cell: ggml's layout, read by ggml's algorithms.
    Rows,
    /// Keys transposed per block of [`KEY_COLUMNS`] cells: one dimension of 16 cells is one
    /// contiguous vector, which is what a matrix unit's outer product (and a vector FMA over
    /// cells) reads. F16 keys: `[head_dim][KEY_COLUMNS]` F16. Q8_0 and Q4_0 keys: the same
    /// bytes as 16 rows of the type, values transposed, then `[head_dim / 32][KEY_COLUMNS]` F16
    /// scales (`attention::matrix::widen`). Read only by `attention::matrix`.
    Columns,
}

/// Key chunks of 8 cells transposed while attention ran (the tiled kernels transpose rows of
/// keys into columns for their lane-per-cell scores, per call): the per-token re-layouts of KV
/// that a cache with keys in [`KeyLayout::Columns`] does not make. Process-wide.
static KEY_TRANSPOSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Key chunks of 8 cells transposed by attention kernels so far in this process.
pub fn key_transposes() -> u64 {
    KEY_TRANSPOSES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Count `chunks` key chunks of 8 cells transposed ([`key_transposes`]).
pub(crate) fn note_key_transposes(chunks: usize) {
    KEY_TRANSPOSES.fetch_add(chunks as u64, std::sync::atomic::Ordering::Relaxed);
}

/// Cells per block of keys in the [`KeyLayout::Columns`] layout (the paged cache's block).
pub const KEY_COLUMNS: usize = 16;

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
            k_layout: KeyLayout::Rows,
        }
    }

    /// The keys of logical block `t` (cells `16t..16t + 16`) of an F16 cache in the
    /// [`KeyLayout::Columns`] layout: `[head_dim][KEY_COLUMNS]`.
    #[inline(always)]
    pub fn k_columns(&self, t: usize) -> &'a [f16] {
        debug_assert!(self.k_layout == KeyLayout::Columns && self.k_type == DType::F16 && 1 << self.shift == KEY_COLUMNS);
        let bytes = KEY_COLUMNS * 2 * self.head_dim;
        let b = self.table[t] as usize * bytes;
        as_blocks(&self.k[b..b + bytes])
    }

    /// Bytes of one block of 16 cells' keys (as rows or columns: the same size) and values.
    #[inline(always)]
    pub fn block_bytes(&self) -> (usize, usize) {
        (KEY_COLUMNS * crate::row_bytes(self.k_type, self.head_dim), KEY_COLUMNS * crate::row_bytes(self.v_type, self.head_dim))
    }

    /// The raw bytes of logical block `t`'s keys and values (cells `16t..16t + 16`; a cache in
    /// blocks of 16 cells).
    #[inline(always)]
    pub fn block(&self, t: usize) -> (&'a [u8], &'a [u8]) {
        debug_assert!(1 << self.shift == KEY_COLUMNS);
        let (kb, vb) = self.block_bytes();
        let b = self.table[t] as usize;
        (&self.k[b * kb..(b + 1) * kb], &self.v[b * vb..(b + 1) * vb])
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

/// The buffers of the decode kernels for `heads` heads.
pub struct DecodeBuffers<'a> {
    /// `[heads][head_dim]` widened F16-rounded queries.
    pub qf: &'a mut [f32],
    /// `[heads][head_dim]` f32 accumulators (F16 values).
    pub acc: &'a mut [f32],
    /// (maximum, sum) per head.
    pub state: &'a mut [[f32; 2]],
    /// `[heads][CHUNK]` scores, then exponentials.
    pub scores: &'a mut [f32],
    /// Per head, the chunk's cells that raise its maximum (bit mask).
    pub grow: &'a mut [u64],
    /// Per head, (maximum, sum) of the KV-split chunks combined so far (`attention::portable::fold`).
    pub fin: &'a mut [[f32; 2]],
    /// `[DECODE_KEYS][head_dim]`: a group of key rows widened to f32 (the AVX-512 kernel).
    pub keys: &'a mut [f32],
    /// `[DECODE_CHUNK][head_dim]`: a chunk's value rows in f32 (the AVX2 kernel; the multi-row
    /// kernel's tile of values, unused by decode).
    pub v32: &'a mut [f32],
    /// The rows the worker reads after this call.
    pub next: &'a mut NextRows,
    /// Split-KV decode's range computed alone (`attention::attend_split_range`): its partial
    /// left unnormalised in the output and its (maximum, sum) per head in `fin`; `None`: every
    /// range, folded.
    pub only: Option<usize>,
}
