//! The multi-row tiled kernel of [`super::rows`] with AVX-512: the same driver
//! (`attention::tiles`) and the same arithmetic per lane, on 16 lanes.
//!
//! - **Scores:** a chunk is 16 cells (lane = cell), its keys transposed into `kt` as
//!   `[head_dim][16]` f32 (two 8×8 transposes per 8 dimensions); each vector's score lane is one
//!   FMA chain over the dimensions in order, eight or four vectors per pass.
//! - **Softmax:** ggml's AVX-512 step itself (`super::softmax::tile_softmax16`), which the
//!   8-lane twin reproduces.
//! - **Values:** widened 16 at a time; the probability-weighted sum keeps four vectors × 64
//!   dimensions of accumulators in registers (16 zmm), each lane `fma(p, v, acc)` over the
//!   cells in order.
//!
//! So every head gets the bits of [`super::rows`] and of `attention::portable::attend_tiled`.
//! On Zen 5 (whole 512-bit FMA units) the FMA phases run at twice the width of the 8-lane
//! kernel; on Zen 4 (512-bit instructions in two halves) they issue half the instructions.
#![allow(clippy::missing_safety_doc)]
// Register arrays are indexed in plain loops: iterator adaptors over them may not inline in
// `target_feature` functions.
#![allow(clippy::needless_range_loop)]

use crate::attention::Scale;
use super::rows;
use super::softmax::tile_softmax16;
use crate::attention::tiles::{self, TileOps};
use crate::attention::types::{KvRows, RowsScratch, KV_TILE};
use crate::simd::x86::{load_ph, transpose8};
use std::arch::x86_64::*;
use std::ops::Range;

/// Cells per chunk: one 512-bit vector of scores.
const W: usize = 16;

/// Scores of one 16-cell chunk for `N` vectors: lane `j` of result `i` is
/// `Σ_d kt[d][j] · q_i[d]`, one FMA per dimension in order.
///
/// # Safety
/// `kt` holds `hd * 16` f32 and every `q[i]` `hd` f32.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn scores_n<const N: usize>(kt: *const f32, hd: usize, q: [*const f32; N]) -> [__m512; N] {
    let mut acc = [_mm512_setzero_ps(); N];
    for d in 0..hd {
        // SAFETY: d < hd; caller's contract on kt and q.
        unsafe {
            let k = _mm512_loadu_ps(kt.add(d * W));
            for i in 0..N {
                acc[i] = _mm512_fmadd_ps(k, _mm512_set1_ps(*q[i].add(d)), acc[i]);
            }
        }
    }
    acc
}

/// `acc_k[d..d + 16·ND] += Σ_c p_k[c] · v32[c][d..d + 16·ND]` for `NV` vectors over `cells`
/// cells, cells in order, each lane one FMA per cell.
///
/// # Safety
/// `acc[k]` holds `16·ND` f32, `p[k]` `cells` f32, `v` `(cells - 1) · stride + 16·ND` f32.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn pv<const NV: usize, const ND: usize>(acc: [*mut f32; NV], p: [*const f32; NV], v: *const f32, stride: usize, cells: usize) {
    let mut a = [[_mm512_setzero_ps(); ND]; NV];
    // SAFETY (whole body): caller's contract on acc, p and v.
    unsafe {
        for k in 0..NV {
            for i in 0..ND {
                a[k][i] = _mm512_loadu_ps(acc[k].add(16 * i));
            }
        }
        for c in 0..cells {
            let mut vv = [_mm512_setzero_ps(); ND];
            for i in 0..ND {
                vv[i] = _mm512_loadu_ps(v.add(c * stride + 16 * i));
            }
            for k in 0..NV {
                let pk = _mm512_set1_ps(*p[k].add(c));
                for i in 0..ND {
                    a[k][i] = _mm512_fmadd_ps(pk, vv[i], a[k][i]);
                }
            }
        }
        for k in 0..NV {
            for i in 0..ND {
                _mm512_storeu_ps(acc[k].add(16 * i), a[k][i]);
            }
        }
    }
}

/// Keys of cells `c0..c0 + w` (w ≤ 16; missing lanes zero) into `kt` as `[head_dim][16]` f32.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
fn transpose_keys(kv: &KvRows, c0: usize, w: usize, zero: &[half::f16], kt: &mut [f32]) {
    let hd = kv.head_dim;
    let mut rows: [&[half::f16]; W] = [zero; W];
    for (j, r) in rows.iter_mut().enumerate().take(w) {
        *r = kv.k(c0 + j);
    }
    assert!(kt.len() >= hd * W);
    let mut d = 0;
    while d < hd {
        for half in 0..2 {
            let mut x = [_mm256_setzero_ps(); 8];
            for j in 0..8 {
                x[j] = load_ph(&rows[8 * half + j][d..]);
            }
            let cols = transpose8(x);
            for (i, col) in cols.iter().enumerate() {
                // SAFETY: (d + i) * 16 + 8 * half + 8 <= hd * 16 <= kt.len().
                unsafe { _mm256_storeu_ps(kt.as_mut_ptr().add((d + i) * W + 8 * half), *col) };
            }
        }
        d += 8;
    }
}

/// Scores of the chunk `c0..c0 + w` (w ≤ 16) for every vector (`ptrs[v]`: its `head_dim`
/// query values) into `scores[v][col..][..16]`: `q·k × scale` where row `v / heads` sees the
/// cell, -∞ elsewhere. Counts each 8-cell half that some row sees in `sc.work`, as the 8-lane
/// kernel counts its chunks.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
fn chunk_scores(ptrs: &[*const f32], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, c0: usize, w: usize, sc: &mut RowsScratch, col: usize) {
    let hd = kv.head_dim;
    let nv = ptrs.len();
    let lanes = _mm512_add_epi32(_mm512_set1_epi32(c0 as i32), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let any = tiles::chunk_seen(spans, c0, w, &mut sc.work);
    if any {
        transpose_keys(kv, c0, w, &sc.zero, &mut sc.kt);
    }
    let mut v = 0;
    while v < nv {
        let (n, pick) = tiles::score_pass(ptrs, v);
        let mut out = [ninf; 8];
        if any {
            // SAFETY: kt holds hd * 16 f32 (transposed above); every q vector holds hd f32.
            unsafe {
                if n == 8 {
                    out = scores_n::<8>(sc.kt.as_ptr(), hd, pick);
                } else {
                    let r = scores_n::<4>(sc.kt.as_ptr(), hd, [pick[0], pick[1], pick[2], pick[3]]);
                    out[..4].copy_from_slice(&r);
                }
            }
        }
        for (i, o) in out.iter().enumerate().take(n.min(nv - v)) {
            let s = &spans[(v + i) / heads];
            let vis = _mm512_cmpge_epi32_mask(lanes, _mm512_set1_epi32(s.start as i32)) & _mm512_cmplt_epi32_mask(lanes, _mm512_set1_epi32(s.end as i32));
            let val = _mm512_mask_blend_ps(vis, ninf, _mm512_mul_ps(*o, _mm512_set1_ps(scale.mul)));
            let dst = &mut sc.scores[(v + i) * KV_TILE + col..][..W];
            // SAFETY: 16 f32 writable.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), val) };
            scale.cap(dst);
        }
        v += n;
    }
}

/// The probability-weighted values of one tile (`cells` cells in `v32`) into the accumulators
/// of the `active` vectors: 64 dimensions × four vectors per register block, then 16 at a
/// time, and a last 8 with the 8-lane kernel's block.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
fn accumulate(active: &[usize], cells: usize, hd: usize, sc: &mut RowsScratch) {
    let (acc, scores, v32) = (sc.acc.as_mut_ptr(), sc.scores.as_ptr(), sc.v32.as_ptr());
    // SAFETY (all calls below): active vectors are < MAX_VECTORS, so their accumulator rows
    // (hd f32) and score rows (KV_TILE ≥ cells f32) are inside `acc` and `scores`; d + width ≤
    // hd, and v32 holds `cells` rows of hd f32.
    let a = |v: usize, d: usize| unsafe { acc.add(v * hd + d) };
    let p = |v: usize| unsafe { scores.add(v * KV_TILE) };
    let mut d = 0;
    while d < hd {
        let width = match hd - d {
            64.. => 64,
            16.. => 16,
            _ => 8,
        };
        let mut i = 0;
        while i < active.len() {
            let left = active.len() - i;
            let vs = |n: usize| -> [usize; 4] { std::array::from_fn(|k| active[i + k.min(n - 1)]) };
            unsafe {
                let taken = match (width, left) {
                    (64, 4..) => {
                        let v = vs(4);
                        pv::<4, 4>(v.map(|v| a(v, d)), v.map(p), v32.add(d), hd, cells);
                        4
                    }
                    (64, 2..) => {
                        let v = vs(2);
                        pv::<2, 4>([a(v[0], d), a(v[1], d)], [p(v[0]), p(v[1])], v32.add(d), hd, cells);
                        2
                    }
                    (64, _) => {
                        pv::<1, 4>([a(active[i], d)], [p(active[i])], v32.add(d), hd, cells);
                        1
                    }
                    (16, 4..) => {
                        let v = vs(4);
                        pv::<4, 1>(v.map(|v| a(v, d)), v.map(p), v32.add(d), hd, cells);
                        4
                    }
                    (16, _) => {
                        pv::<1, 1>([a(active[i], d)], [p(active[i])], v32.add(d), hd, cells);
                        1
                    }
                    _ => {
                        rows::pv::<1, 1>([a(active[i], d)], [p(active[i])], v32.add(d), hd, cells);
                        1
                    }
                };
                i += taken;
            }
        }
        d += width;
    }
}

/// The AVX-512 arithmetic of the shared driver (`attention::tiles`). Only built inside
/// [`attend_tiled_rows`], whose contract is a CPU with AVX-512 F/VL, AVX2, FMA and F16C.
struct Avx512Ops(());

impl TileOps for Avx512Ops {
    const CHUNK: usize = W;

    #[inline(always)]
    fn chunk_scores(&self, ptrs: &[*const f32], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, c0: usize, w: usize, sc: &mut RowsScratch, col: usize) {
        // SAFETY: an `Avx512Ops` exists only under `attend_tiled_rows`' contract.
        unsafe { chunk_scores(ptrs, heads, spans, kv, scale, c0, w, sc, col) }
    }

    #[inline(always)]
    fn tile_step(&self, sh: &mut [f32], len: usize, st: &mut [f32; 2], acc: &mut [f32]) -> bool {
        // SAFETY: as above.
        unsafe { tile_softmax16(sh, len, st, acc) }
    }

    #[inline(always)]
    fn widen_values(&self, kv: &KvRows, t0: usize, t1: usize, v32: &mut [f32]) {
        let hd = kv.head_dim;
        for (c, dst) in (t0..t1).zip(v32.chunks_exact_mut(hd)) {
            // SAFETY: as above.
            unsafe { widen16(kv.v(c), dst) };
        }
    }

    #[inline(always)]
    fn accumulate(&self, active: &[usize], cells: usize, hd: usize, sc: &mut RowsScratch) {
        // SAFETY: as above.
        unsafe { accumulate(active, cells, hd, sc) }
    }
}

/// F16 → f32, 16 at a time, then 8 (`dst.len() % 8 == 0`, `src.len() >= dst.len()`).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
fn widen16(src: &[half::f16], dst: &mut [f32]) {
    assert!(src.len() >= dst.len());
    let mut d = 0;
    while d + 16 <= dst.len() {
        // SAFETY: d + 16 <= dst.len() <= src.len(); unaligned load and store.
        unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(d), _mm512_cvtph_ps(_mm256_loadu_si256(src.as_ptr().add(d) as *const __m256i))) };
        d += 16;
    }
    if d < dst.len() {
        // SAFETY: 8 values left (dst.len() % 8 == 0).
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(d), load_ph(&src[d..])) };
    }
}

/// [`super::rows::attend_tiled_rows`] with AVX-512: the same bits per head.
/// `q.len() · heads ≤ MAX_VECTORS`, `head_dim % 8 == 0`, F16 cache.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub fn attend_tiled_rows(q: &[&[f32]], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, sinks: Option<&[f32]>, sc: &mut RowsScratch, out: &mut [&mut [f32]]) {
    tiles::attend_tiled_rows(&Avx512Ops(()), q, heads, spans, kv, scale, sinks, sc, out)
}
