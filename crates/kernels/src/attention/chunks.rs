//! The chunk driver every decode kernel shares (`x86::decode` with AVX-512, `x86::decode_avx2`,
//! `aarch64::decode` with NEON): the queries rounded to F16, the visible cells gathered
//! [`CHUNK`] at a time as key and value row pointers — each chunk's before the previous one is
//! computed, so the kernel asks for its rows while it computes ([`ask_share`]), and after the
//! last chunk the worker's next item's first rows —, the outputs normalised, or with ggml's
//! split-KV decode each range's partial folded as ggml combines them.
#![allow(clippy::missing_safety_doc)]

use crate::attention::portable::{finish, fold, normalize_heads};
use crate::attention::types::{Cells, DecodeBuffers, KvRows, Visible, DECODE_CHUNK as CHUNK};
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;

/// How many cells ahead of the one gathered its key and value rows are asked for.
const AHEAD: usize = CHUNK;

/// At cell `c` of the range `start..end` the quantized-cache kernel (`attention::quant`)
/// gathers: ask for the key and value rows (into L2) of the cell a chunk ahead, or in the
/// range's first chunk of `c` itself (nothing asked for it earlier). The rows of a chunk's cells
/// are scattered (cache pages, other heads' rows between them): asked for a chunk ahead, they
/// arrive while this chunk is computed, instead of one miss per row in the kernel (a Q8_0 cache,
/// Zen 5 at 2048 cells, 1 thread: 13.0 -> 6.8 ms per token; two chunks ahead no better).
#[inline(always)]
pub(crate) fn prefetch_ahead(kv: &KvRows, c: usize, start: usize, end: usize) {
    let cell = if c + AHEAD < end { c + AHEAD } else if c < start + AHEAD { c } else { return };
    let (k, v) = (kv.k_bytes(cell), kv.v_bytes(cell));
    prefetch_lines(k.as_ptr(), k.len(), CacheLevel::L2);
    prefetch_lines(v.as_ptr(), v.len(), CacheLevel::L2);
}

/// One chunk's row pointers, and the rows to ask for while it is computed.
pub(crate) struct ChunkRows<'r> {
    /// `[n]` key and value rows of the chunk's visible cells.
    pub k: &'r [*const f16],
    pub v: &'r [*const f16],
    /// Key and value rows read after this chunk: the next chunk's, or after the call's last
    /// chunk, the first chunk of what the worker reads next (`AttnScratch::read_next`).
    pub ahead_k: &'r [*const f16],
    pub ahead_v: &'r [*const f16],
}

/// Ask (into L2) for cell `i`'s share of `rows`, rows of `bytes` bytes read after a chunk of
/// `n` cells: over the chunk's cells, each of them once. A kernel asks as it computes, a few
/// lines per cell, so the rows arrive while the chunk is computed without a burst of requests
/// that fills the miss queue and stalls it (asking a whole chunk at once, before computing it,
/// left the rows' transfer and the arithmetic one after the other: B=16 SmolLM2 decode,
/// attention 4.1 ms per step, of which 1.7 ms with no arithmetic at all).
///
/// The share's bounds `i·a / n` are a multiplication by `⌈2²⁴ / n⌉` and a shift, which the
/// compiler hoists out of the caller's loop with the reciprocal, instead of two divisions per
/// cell (the AVX-512 kernel, three heads, one timing on Zen 4: 11.3 -> 10.7 ns per (head,
/// cell), within that VM's run-to-run spread). Exact for
/// `i·a <= 4096` (at most [`CHUNK`] cells and rows): the error, under `4096 / 2²⁴`, stays
/// below the `1 / n` the fraction of `i·a / n` is away from the next integer.
#[inline(always)]
pub(crate) fn ask_share(rows: &[*const f16], bytes: usize, i: usize, n: usize) {
    let a = rows.len();
    debug_assert!(a <= CHUNK && i < n && n <= CHUNK);
    let r = (1usize << 24).div_ceil(n);
    for &p in &rows[(i * a * r) >> 24..((i + 1) * a * r) >> 24] {
        prefetch_lines(p as *const u8, bytes, CacheLevel::L2);
    }
}

/// The visible cells of a cache, [`CHUNK`] at a time, range by range (split-KV decode: ranges of
/// `range` cells; otherwise one).
struct Gather<'a, 'k> {
    kv: &'a KvRows<'k>,
    visible: Visible<'a>,
    n_cells: usize,
    range: usize,
    /// The next cell to look at.
    c: usize,
    /// Bytes of a key row and of a value row, computed once: `KvRows::k` per cell divides by
    /// the type's block size, two divisions per cell that cost the gathering a sixth of the
    /// kernel's time at 2048 cells.
    row_bytes: (usize, usize),
}

impl Gather<'_, '_> {
    /// The next chunk's rows into `k`, `v`: its range and its number of visible cells (up to
    /// `CHUNK`, ending at its range's end; 0 for a range nothing in is visible), `None` past
    /// the last cell.
    fn next(&mut self, k: &mut [*const f16; CHUNK], v: &mut [*const f16; CHUNK]) -> Option<(usize, usize)> {
        if self.c >= self.n_cells {
            return None;
        }
        let r = self.c / self.range;
        let end = ((r + 1) * self.range).min(self.n_cells);
        let mut n = 0;
        if let Visible::From(first) = self.visible {
            // Every cell from `first` on (what the engine passes): the hidden ones skipped at
            // once, then run by run within a block of the cache, whose rows follow each other,
            // one lookup and one bounds check per run instead of per cell.
            self.c = self.c.max(first).min(end);
            let (kb, vb) = self.row_bytes;
            while self.c < end && n < CHUNK {
                let block_end = ((self.c >> self.kv.shift) + 1) << self.kv.shift;
                let run = (end.min(block_end) - self.c).min(CHUNK - n);
                let row = self.kv.row(self.c);
                let (kr, vr) = (&self.kv.k[row * kb..(row + run) * kb], &self.kv.v[row * vb..(row + run) * vb]);
                for (i, (kp, vp)) in k[n..n + run].iter_mut().zip(&mut v[n..n + run]).enumerate() {
                    // Row i of the run: inside `kr` and `vr` (i < run), checked above.
                    (*kp, *vp) = (kr.as_ptr().wrapping_add(i * kb) as *const f16, vr.as_ptr().wrapping_add(i * vb) as *const f16);
                }
                n += run;
                self.c += run;
            }
            return Some((r, n));
        }
        while self.c < end && n < CHUNK {
            if self.visible.at(self.c) {
                let (row, (kb, vb)) = (self.kv.row(self.c), self.row_bytes);
                let (kr, vr) = (&self.kv.k[row * kb..(row + 1) * kb], &self.kv.v[row * vb..(row + 1) * vb]);
                (k[n], v[n]) = (kr.as_ptr() as *const f16, vr.as_ptr() as *const f16);
                n += 1;
            }
            self.c += 1;
        }
        Some((r, n))
    }
}

/// Largest head dimension (in 64-value steps) the kernels take.
pub const MAX_STEPS: usize = 4;

/// Whether [`attend_decode_group`] takes this head dimension.
pub fn supports(head_dim: usize) -> bool {
    head_dim.is_multiple_of(64) && (1..=MAX_STEPS).contains(&(head_dim / 64))
}

/// What every decode kernel shares: the queries rounded to F16, the state reset, the visible
/// cells gathered `CHUNK` at a time (key and value row pointers) for `chunk`, with the rows to
/// ask for meanwhile (the next chunk's, gathered before this one is computed; after the last,
/// `bufs.next`, taken), the outputs normalised. The first chunk's rows are asked for at once: only a
/// previous call's `next` could have asked earlier. With `split` > 0, all that per range of
/// `split` cells, each range's partial folded into the outputs as ggml combines them
/// (`attention::portable::fold`), or with `bufs.only` only that range's, left unnormalised in
/// the outputs with its (maximum, sum) per head in `bufs.fin`.
pub(crate) fn drive(
    q: &[f32],
    cells: Cells,
    split: usize,
    mut bufs: DecodeBuffers,
    out: &mut [f32],
    mut chunk: impl FnMut(&ChunkRows, &mut DecodeBuffers),
) {
    let Cells { kv, n: n_cells, visible } = cells;
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    let b = &mut bufs;
    assert!(supports(hd) && kv.is_f16() && out.len() >= heads * hd);
    assert!(b.qf.len() >= heads * hd && b.acc.len() >= heads * hd && b.state.len() >= heads && b.fin.len() >= heads);
    assert!(b.scores.len() >= heads * CHUNK && b.grow.len() >= heads && b.v32.len() >= hd);
    crate::simd::round_f16_row(&q[..heads * hd], &mut b.qf[..heads * hd]);
    let range = if split == 0 { n_cells.max(1) } else { split };
    // The ranges computed: all, or with `b.only` one (split-KV decode's ranges run apart).
    let only = b.only.filter(|_| split > 0);
    let ranges = only.map_or(0..n_cells.max(1).div_ceil(range), |r| r..r + 1);
    if split > 0 && only.is_none() {
        out[..heads * hd].fill(0.0);
        b.fin[..heads].fill([f32::NEG_INFINITY, 0.0]);
    }
    let row_bytes = (2 * hd, 2 * hd);
    // Decode's cells start at the visible ones: the hidden cells before them (a sliding
    // window's) yield no chunk, walked or not.
    let (first, n_end) = (visible.first().max(ranges.start * range), n_cells.min(ranges.end * range));
    let mut gather = Gather { kv, visible, n_cells: n_end, range, c: first, row_bytes };
    // Row pointers `[CHUNK]` of the chunk computed and of the one after it.
    let (mut k, mut v) = ([std::ptr::null::<f16>(); CHUNK], [std::ptr::null::<f16>(); CHUNK]);
    let (mut nk, mut nv) = (k, v);
    let mut cur = gather.next(&mut k, &mut v);
    if let Some((_, n)) = cur {
        for (&kp, &vp) in k[..n].iter().zip(&v[..n]) {
            prefetch_lines(kp as *const u8, 2 * hd, CacheLevel::L2);
            prefetch_lines(vp as *const u8, 2 * hd, CacheLevel::L2);
        }
    }
    for r in ranges {
        b.acc[..heads * hd].fill(0.0);
        b.state[..heads].fill([f32::NEG_INFINITY, 0.0]);
        while let Some((_, n)) = cur.filter(|&(cr, _)| cr == r) {
            let next = gather.next(&mut nk, &mut nv);
            let ahead = match next {
                Some((_, m)) => m,
                None => b.next.take(&mut nk, &mut nv),
            };
            if n > 0 {
                let rows = ChunkRows { k: &k[..n], v: &v[..n], ahead_k: &nk[..ahead], ahead_v: &nv[..ahead] };
                chunk(&rows, b);
            }
            (k, v, cur) = (nk, nv, next);
        }
        if split == 0 {
            return normalize_heads(&b.acc[..heads * hd], &b.state[..heads], hd, out);
        }
        if only.is_some() {
            out[..heads * hd].copy_from_slice(&b.acc[..heads * hd]);
            b.fin[..heads].copy_from_slice(&b.state[..heads]);
            return;
        }
        for h in 0..heads {
            fold(&mut b.fin[h], &mut out[h * hd..(h + 1) * hd], b.state[h], &b.acc[h * hd..(h + 1) * hd]);
        }
    }
    for h in 0..heads {
        finish(b.fin[h], &mut out[h * hd..(h + 1) * hd]);
    }
}
