//! What the SIMD versions of ggml's tiled kernel share, ISA by ISA (`x86::rows`,
//! `x86::reference`, `aarch64::rows`): one vector's online-softmax step over a tile
//! ([`tile_step`]) and the multi-row driver ([`attend_tiled_rows`]) — the tiles of the rows'
//! spans, scored a chunk of 8 or 16 cells at a time, softmax per vector, values widened and accumulated once
//! per tile for the vectors that saw anything, outputs normalised. The arithmetic (scores,
//! exponentials, products) is each ISA's [`TileOps`]; the order of every operation is the
//! portable `attention::portable::attend_tiled`'s, per vector. Attention sinks (gpt-oss) are
//! counted by [`sink_step`] before the outputs are normalised, here and after the one-chunk
//! kernel (`portable::sink_finish`).

use crate::attention::Scale;
use super::types::{KvRows, RowsScratch, TileWork, KV_TILE, ROWS_MAX_VECTORS as MAX_VECTORS};
use std::ops::Range;

/// One query vector's online-softmax step over a tile whose first `len` scores are set (`sh`
/// holds [`KV_TILE`] of them): the running (maximum, sum) `st` and the accumulator `acc`
/// rescaled if the maximum grows, the scores turned into probabilities in place by
/// `softmax(scores, max)` (ggml's `ggml_vec_soft_max_f32`, returning the tile's sum in double).
/// `max(scores)` is the largest of the first `len` scores. A tile with nothing visible leaves
/// `st` and `acc` alone and zeroes `sh`; returns whether anything was visible. Inlined, so it
/// compiles with its SIMD caller's target features.
#[inline(always)]
pub(crate) fn tile_step(
    sh: &mut [f32],
    len: usize,
    st: &mut [f32; 2],
    acc: &mut [f32],
    max: impl FnOnce(&[f32]) -> f32,
    softmax: impl FnOnce(&mut [f32], f32) -> f64,
) -> bool {
    let tile_max = max(&sh[..len]);
    if tile_max == f32::NEG_INFINITY {
        sh.fill(0.0);
        return false;
    }
    let [m, s] = st;
    let m_new = m.max(tile_max);
    if m_new > *m {
        let ms = (*m - m_new).exp();
        acc.iter_mut().for_each(|a| *a *= ms);
        *s *= ms;
    }
    *m = m_new;
    sh[len..].fill(f32::NEG_INFINITY);
    let sum = softmax(sh, *m);
    *s = (*s as f64 + sum) as f32;
    true
}

/// Whether some row sees a cell of the chunk `c0..c0 + w` (its span `spans[r]`); counts in
/// `work` each 8 cells of the chunk that some row sees (the 8-lane kernels' chunks), so the
/// counts do not depend on the chunk width.
pub(crate) fn chunk_seen(spans: &[Range<usize>], c0: usize, w: usize, work: &mut TileWork) -> bool {
    let mut any = false;
    for a in (c0..c0 + w).step_by(8) {
        let b = (a + 8).min(c0 + w);
        if spans.iter().any(|s| s.start < b && s.end > a && s.start < s.end) {
            work.chunks_scored += 1;
            any = true;
        }
    }
    any
}

/// The sink's step alone: `st` = (maximum, sum) and the unnormalised `acc` rescaled to a sink
/// above the maximum, the sink's `exp(sink − max)` added to the sum otherwise (ggml's
/// `ms`/`vs`, one `S·ms + vs`).
pub(crate) fn sink_step(st: &mut [f32; 2], sink: f32, acc: &mut [f32]) {
    let [m, s] = *st;
    let (ms, vs) = if sink > m {
        let ms = (m - sink).exp();
        acc.iter_mut().for_each(|v| *v *= ms);
        st[0] = sink;
        (ms, 1.0)
    } else {
        (1.0, (sink - m).exp())
    };
    st[1] = s * ms + vs;
}

/// The next pass of the score phase from vector `v` of `ptrs`: eight vectors where eight are
/// left, else four (past the last, the last again); the pass's width and its query pointers.
#[inline(always)]
pub(crate) fn score_pass(ptrs: &[*const f32], v: usize) -> (usize, [*const f32; 8]) {
    let n = if ptrs.len() - v >= 8 { 8 } else { 4 };
    let mut pick = [ptrs[v]; 8];
    for (i, p) in pick.iter_mut().enumerate().take(n) {
        *p = ptrs[(v + i).min(ptrs.len() - 1)];
    }
    (n, pick)
}

/// One ISA's arithmetic of the multi-row tiled kernel.
pub(crate) trait TileOps {
    /// Cells per chunk of scores (one vector of lanes: 8 or 16; divides [`KV_TILE`]).
    const CHUNK: usize;
    /// Scores of the chunk `c0..c0 + w` (w ≤ `CHUNK`) for every vector (`ptrs[v]`: its
    /// `head_dim` query values) into `sc.scores[v][col..][..CHUNK]`: `q·k × scale` (one FMA chain
    /// per lane over the dimensions in order) where row `v / heads` sees the cell, -∞
    /// elsewhere; counts in `sc.work` each 8 cells of it that some row sees.
    #[allow(clippy::too_many_arguments)]
    fn chunk_scores(&self, ptrs: &[*const f32], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, c0: usize, w: usize, sc: &mut RowsScratch, col: usize);
    /// [`tile_step`] for one vector.
    fn tile_step(&self, sh: &mut [f32], len: usize, st: &mut [f32; 2], acc: &mut [f32]) -> bool;
    /// The value rows of cells `t0..t1` widened into `v32` (`[t1 - t0][head_dim]` f32).
    fn widen_values(&self, kv: &KvRows, t0: usize, t1: usize, v32: &mut [f32]);
    /// The probability-weighted values of one tile (`cells` cells in `sc.v32`) into the
    /// accumulators of the `active` vectors, each lane `fma(p, v, acc)` over the cells in order.
    fn accumulate(&self, active: &[usize], cells: usize, hd: usize, sc: &mut RowsScratch);
}

/// Attention of `q.len()` query rows of one sequence, each `heads × head_dim` values over the
/// cells `spans[r]` of `kv`: `out[r]` gets, per head, exactly what
/// `attention::portable::attend_tiled` gives that head alone, given `ops` that keep its order.
/// `q.len() · heads ≤ MAX_VECTORS`, `head_dim % 8 == 0`, F16 cache. `sinks` (one per head):
/// each head's attention sink counted in its softmax before the outputs are normalised, as
/// ggml's tiled kernel counts it ([`sink_step`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_tiled_rows<O: TileOps>(ops: &O, q: &[&[f32]], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, sinks: Option<&[f32]>, sc: &mut RowsScratch, out: &mut [&mut [f32]]) {
    let hd = kv.head_dim;
    let nv = q.len() * heads;
    assert!(nv <= MAX_VECTORS && hd.is_multiple_of(8) && spans.len() == q.len() && out.len() == q.len());
    assert!(sc.acc.len() >= nv * hd && sc.v32.len() >= KV_TILE * hd && sc.zero.len() >= hd);
    sc.acc[..nv * hd].fill(0.0);
    sc.state[..nv].fill([f32::NEG_INFINITY, 0.0]);
    // Vector v = head v % heads of row v / heads.
    let mut ptrs = [std::ptr::null::<f32>(); MAX_VECTORS];
    for (v, p) in ptrs.iter_mut().enumerate().take(nv) {
        *p = q[v / heads][v % heads * hd..(v % heads + 1) * hd].as_ptr();
    }
    let n_max = spans.iter().map(|s| s.end).max().unwrap_or(0);
    let mut t0 = spans.iter().map(|s| s.start).min().unwrap_or(0) / KV_TILE * KV_TILE;
    while t0 < n_max {
        let t1 = (t0 + KV_TILE).min(n_max);
        for c0 in (t0..t1).step_by(O::CHUNK) {
            ops.chunk_scores(&ptrs[..nv], heads, spans, kv, scale, c0, (t1 - c0).min(O::CHUNK), sc, c0 - t0);
        }
        let mut active = [0usize; MAX_VECTORS];
        let mut na = 0;
        for v in 0..nv {
            let sh = &mut sc.scores[v * KV_TILE..(v + 1) * KV_TILE];
            if ops.tile_step(sh, t1 - t0, &mut sc.state[v], &mut sc.acc[v * hd..(v + 1) * hd]) {
                active[na] = v;
                na += 1;
            }
        }
        if na > 0 {
            sc.work.tiles_accumulated += 1;
            ops.widen_values(kv, t0, t1, &mut sc.v32[..(t1 - t0) * hd]);
            ops.accumulate(&active[..na], t1 - t0, hd, sc);
        }
        t0 = t1;
    }
    for v in 0..nv {
        if let Some(sinks) = sinks {
            sink_step(&mut sc.state[v], sinks[v % heads], &mut sc.acc[v * hd..(v + 1) * hd]);
        }
        let [_, s] = sc.state[v];
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        let o = &mut out[v / heads][v % heads * hd..(v % heads + 1) * hd];
        for (o, &a) in o.iter_mut().zip(&sc.acc[v * hd..(v + 1) * hd]) {
            *o = a * inv;
        }
    }
}
