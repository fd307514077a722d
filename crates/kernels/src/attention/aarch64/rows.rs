//! The tiled flash-attention kernel (`attention::portable::attend_tiled`) for a block of query
//! rows of one sequence at once, with NEON — `x86::rows` written with 4-lane vectors, an 8-cell
//! chunk as two of them:
//!
//! - per 8-cell chunk the keys are widened and transposed once into `kt` (`[head_dim][8]` f32,
//!   lane = cell), and every query vector's scores come from FMA chains over the dimensions in
//!   order (`vfmaq_laneq_f32`: four dimensions per query load), eight or four vectors per pass;
//! - ggml's softmax step on 4 lanes (`exp::aarch64::expf_ggml4`, each 16 summed in
//!   `simd::reduce_add_16`'s order, the groups in double) inside the shared
//!   `attention::tiles::tile_step`;
//! - per tile the values widened once into `v32`, the probability-weighted sum with the
//!   accumulators of two vectors × 32 dimensions in registers;
//! - the loop over tiles and vectors is the shared driver, `attention::tiles`.
//!
//! Bits: those of `x86::rows` (see there; the portable kernel skips cells of probability 0,
//! this one adds `0 · v`, which leaves a finite accumulator unchanged).
#![allow(clippy::missing_safety_doc)]
// Register arrays are indexed in plain loops with constant bounds (fully unrolled).
#![allow(clippy::needless_range_loop)]

use crate::attention::Scale;
use crate::attention::tiles::{self, TileOps};
use crate::attention::types::{KvRows, RowsScratch, KV_TILE, ROWS_MAX_VECTORS as MAX_VECTORS};
use crate::exp::aarch64::expf_ggml4;
use crate::simd::aarch64::{load_f16x8, reduce_add_16x4, transpose4};
use half::f16;
use std::arch::aarch64::*;
use std::ops::Range;

/// Eight lanes (cells `0..4`, `4..8` of a chunk) as two vectors.
type V8 = [float32x4_t; 2];

/// `acc += k · q[L]` on both halves.
#[inline(always)]
fn fma_lane<const L: i32>(acc: &mut V8, k: &V8, q: float32x4_t) {
    // SAFETY: register arithmetic.
    unsafe {
        acc[0] = vfmaq_laneq_f32::<L>(acc[0], k[0], q);
        acc[1] = vfmaq_laneq_f32::<L>(acc[1], k[1], q);
    }
}

/// Scores of one 8-cell chunk for `N` vectors: lane `j` of result `i` is
/// `Σ_d kt[d][j] · q_i[d]`, one FMA per dimension in order.
///
/// # Safety
/// `kt` holds `hd * 8` f32, every `q[i]` `hd` f32; `hd % 4 == 0`.
#[inline]
unsafe fn scores_n<const N: usize>(kt: *const f32, hd: usize, q: [*const f32; N]) -> [V8; N] {
    // SAFETY (whole body): the caller's contract on kt and q; d + 4 <= hd.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 2]; N];
        for d in (0..hd).step_by(4) {
            let k: [V8; 4] = std::array::from_fn(|l| [vld1q_f32(kt.add((d + l) * 8)), vld1q_f32(kt.add((d + l) * 8 + 4))]);
            for i in 0..N {
                let qv = vld1q_f32(q[i].add(d));
                fma_lane::<0>(&mut acc[i], &k[0], qv);
                fma_lane::<1>(&mut acc[i], &k[1], qv);
                fma_lane::<2>(&mut acc[i], &k[2], qv);
                fma_lane::<3>(&mut acc[i], &k[3], qv);
            }
        }
        acc
    }
}

/// Keys of cells `c0..c0 + w` (w ≤ 8; missing lanes zero) into `kt` as `[head_dim][8]` f32.
fn transpose_keys(kv: &KvRows, c0: usize, w: usize, zero: &[f16], kt: &mut [f32]) {
    let hd = kv.head_dim;
    let mut rows: [&[f16]; 8] = [zero; 8];
    for (j, r) in rows.iter_mut().enumerate().take(w) {
        *r = kv.k(c0 + j);
    }
    assert!(kt.len() >= hd * 8 && rows.iter().all(|r| r.len() >= hd) && hd.is_multiple_of(8));
    for d in (0..hd).step_by(8) {
        // SAFETY: d + 8 <= hd <= every row's length.
        let x: [[float32x4_t; 2]; 8] = std::array::from_fn(|j| unsafe { load_f16x8(rows[j].as_ptr().add(d)) });
        for half in 0..2 {
            for cells in 0..2 {
                let cols = transpose4(std::array::from_fn(|j| x[4 * cells + j][half]));
                for (l, col) in cols.iter().enumerate() {
                    // SAFETY: (d + 4·half + l) · 8 + 4·cells + 4 <= hd · 8 <= kt.len().
                    unsafe { vst1q_f32(kt.as_mut_ptr().add((d + 4 * half + l) * 8 + 4 * cells), *col) };
                }
            }
        }
    }
}

/// Scores of the chunk `c0..c0 + 8` for every vector (`ptrs[v]`: its `head_dim` query values)
/// into `scores[v][col..][..8]`: `q·k × scale` where row `v / heads` sees the cell, -∞
/// elsewhere.
#[allow(clippy::too_many_arguments)]
fn chunk_scores(ptrs: &[*const f32], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, c0: usize, w: usize, sc: &mut RowsScratch, col: usize) {
    let hd = kv.head_dim;
    let nv = ptrs.len();
    let any = tiles::chunk_seen(spans, c0, w, &mut sc.work);
    if any {
        transpose_keys(kv, c0, w, &sc.zero, &mut sc.kt);
    }
    // SAFETY (block): register arithmetic and 4-lane stores into the 8 scores of a vector.
    unsafe {
        let ninf = vdupq_n_f32(f32::NEG_INFINITY);
        let base = vaddq_u32(vdupq_n_u32(c0 as u32), vld1q_u32([0u32, 1, 2, 3].as_ptr()));
        let lanes = [base, vaddq_u32(base, vdupq_n_u32(4))];
        let mut v = 0;
        while v < nv {
            let (n, pick) = tiles::score_pass(ptrs, v);
            let mut out = [[ninf; 2]; 8];
            if any {
                // kt holds hd · 8 f32 (transposed above); every q vector holds hd f32.
                if n == 8 {
                    out = scores_n::<8>(sc.kt.as_ptr(), hd, pick);
                } else {
                    let r = scores_n::<4>(sc.kt.as_ptr(), hd, [pick[0], pick[1], pick[2], pick[3]]);
                    out[..4].copy_from_slice(&r);
                }
            }
            for (i, o) in out.iter().enumerate().take(n.min(nv - v)) {
                let s = &spans[(v + i) / heads];
                let (lo, hi) = (vdupq_n_u32(s.start as u32), vdupq_n_u32(s.end as u32));
                let dst = sc.scores[(v + i) * KV_TILE + col..][..8].as_mut_ptr();
                for half in 0..2 {
                    let vis = vandq_u32(vcgeq_u32(lanes[half], lo), vcltq_u32(lanes[half], hi));
                    let val = vbslq_f32(vis, vmulq_n_f32(o[half], scale.mul), ninf);
                    vst1q_f32(dst.add(4 * half), val);
                }
                scale.cap(&mut sc.scores[(v + i) * KV_TILE + col..][..8]);
            }
            v += n;
        }
    }
}

/// ggml's softmax step of the tiled kernel: `p = expf_ggml(p - m)` in place, each group of 16
/// summed in float as `simd::reduce_add_16`, the groups summed in double.
fn softmax_tile(scores: &mut [f32], m: f32) -> f64 {
    let mut sum = 0f64;
    for g in scores.chunks_exact_mut(16) {
        // SAFETY: 16 f32 in g; register arithmetic.
        unsafe {
            let p = g.as_mut_ptr();
            let mv = vdupq_n_f32(m);
            let e: [float32x4_t; 4] = std::array::from_fn(|i| expf_ggml4(vsubq_f32(vld1q_f32(p.add(4 * i)), mv)));
            for (i, &x) in e.iter().enumerate() {
                vst1q_f32(p.add(4 * i), x);
            }
            sum += reduce_add_16x4(e) as f64;
        }
    }
    sum
}

/// The largest of `x` (-∞ for none): four running maxima, then their maximum (max is exact,
/// so the order does not matter).
fn max_f32(x: &[f32]) -> f32 {
    let mut chunks = x.chunks_exact(4);
    // SAFETY: 4 f32 readable per chunk; register arithmetic.
    let m = unsafe {
        let mut m = vdupq_n_f32(f32::NEG_INFINITY);
        for c in &mut chunks {
            m = vmaxq_f32(m, vld1q_f32(c.as_ptr()));
        }
        vmaxvq_f32(m)
    };
    chunks.remainder().iter().fold(m, |m, &v| m.max(v))
}

/// `acc_k[..4·ND] += Σ_c p_k[c] · v[c][..4·ND]` for `NV` vectors over `cells` cells, cells in
/// order, each lane one FMA per cell.
///
/// # Safety
/// `acc[k]` holds `4·ND` f32, `p[k]` `cells` f32, `v` `(cells - 1) · stride + 4·ND` f32.
#[inline]
unsafe fn pv<const NV: usize, const ND: usize>(acc: [*mut f32; NV], p: [*const f32; NV], v: *const f32, stride: usize, cells: usize) {
    // SAFETY (whole body): the caller's contract on acc, p and v.
    unsafe {
        let mut a = [[vdupq_n_f32(0.0); ND]; NV];
        for k in 0..NV {
            for i in 0..ND {
                a[k][i] = vld1q_f32(acc[k].add(4 * i));
            }
        }
        for c in 0..cells {
            let mut vv = [vdupq_n_f32(0.0); ND];
            for i in 0..ND {
                vv[i] = vld1q_f32(v.add(c * stride + 4 * i));
            }
            for k in 0..NV {
                let pk = *p[k].add(c);
                for i in 0..ND {
                    a[k][i] = vfmaq_n_f32(a[k][i], vv[i], pk);
                }
            }
        }
        for k in 0..NV {
            for i in 0..ND {
                vst1q_f32(acc[k].add(4 * i), a[k][i]);
            }
        }
    }
}

/// The probability-weighted values of one tile (`cells` cells in `v32`) into the accumulators
/// of the `active` vectors: 32 dimensions × two vectors per register block, then 8 at a time.
fn accumulate(active: &[usize], cells: usize, hd: usize, sc: &mut RowsScratch) {
    assert!(sc.acc.len() >= MAX_VECTORS * hd && sc.scores.len() >= MAX_VECTORS * KV_TILE && sc.v32.len() >= cells * hd);
    let (acc, scores, v32) = (sc.acc.as_mut_ptr(), sc.scores.as_ptr(), sc.v32.as_ptr());
    // SAFETY (all uses below): active vectors are < MAX_VECTORS, so their accumulator rows
    // (hd f32) and score rows (KV_TILE ≥ cells f32) are inside `acc` and `scores`; d + 4·ND ≤
    // hd, and v32 holds `cells` rows of hd f32 (asserted above).
    let a = |v: usize, d: usize| unsafe { acc.add(v * hd + d) };
    let p = |v: usize| unsafe { scores.add(v * KV_TILE) };
    let mut d = 0;
    while d < hd {
        let wide = hd - d >= 32;
        let mut i = 0;
        while i < active.len() {
            let (v0, pair) = (active[i], i + 1 < active.len());
            let v1 = active[(i + 1).min(active.len() - 1)];
            // SAFETY: as above.
            unsafe {
                let vd = v32.add(d);
                match (wide, pair) {
                    (true, true) => pv::<2, 8>([a(v0, d), a(v1, d)], [p(v0), p(v1)], vd, hd, cells),
                    (true, false) => pv::<1, 8>([a(v0, d)], [p(v0)], vd, hd, cells),
                    (false, true) => pv::<2, 2>([a(v0, d), a(v1, d)], [p(v0), p(v1)], vd, hd, cells),
                    (false, false) => pv::<1, 2>([a(v0, d)], [p(v0)], vd, hd, cells),
                }
            }
            i += 2;
        }
        d += if wide { 32 } else { 8 };
    }
}

/// The NEON arithmetic of the shared driver (`attention::tiles`).
struct NeonOps;

impl TileOps for NeonOps {
    const CHUNK: usize = 8;

    fn chunk_scores(&self, ptrs: &[*const f32], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, c0: usize, w: usize, sc: &mut RowsScratch, col: usize) {
        chunk_scores(ptrs, heads, spans, kv, scale, c0, w, sc, col)
    }

    fn tile_step(&self, sh: &mut [f32], len: usize, st: &mut [f32; 2], acc: &mut [f32]) -> bool {
        tiles::tile_step(sh, len, st, acc, max_f32, softmax_tile)
    }

    fn widen_values(&self, kv: &KvRows, t0: usize, t1: usize, v32: &mut [f32]) {
        let hd = kv.head_dim;
        for (c, dst) in (t0..t1).zip(v32.chunks_exact_mut(hd)) {
            let src = kv.v(c);
            assert!(src.len() >= hd && hd.is_multiple_of(8));
            for d in (0..hd).step_by(8) {
                // SAFETY: d + 8 <= hd <= both rows' lengths.
                unsafe {
                    let [lo, hi] = load_f16x8(src.as_ptr().add(d));
                    vst1q_f32(dst.as_mut_ptr().add(d), lo);
                    vst1q_f32(dst.as_mut_ptr().add(d + 4), hi);
                }
            }
        }
    }

    fn accumulate(&self, active: &[usize], cells: usize, hd: usize, sc: &mut RowsScratch) {
        accumulate(active, cells, hd, sc)
    }
}

/// Attention of `q.len()` query rows of one sequence, each `heads × head_dim` values over the
/// cells `spans[r]` of `kv`: `out[r]` gets, per head, exactly what
/// `attention::portable::attend_tiled` gives that head alone (`attention::tiles` drives).
/// `q.len() · heads ≤ MAX_VECTORS`, `head_dim % 8 == 0`, F16 cache.
#[allow(clippy::too_many_arguments)]
pub fn attend_tiled_rows(q: &[&[f32]], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, sinks: Option<&[f32]>, sc: &mut RowsScratch, out: &mut [&mut [f32]]) {
    tiles::attend_tiled_rows(&NeonOps, q, heads, spans, kv, scale, sinks, sc, out)
}
