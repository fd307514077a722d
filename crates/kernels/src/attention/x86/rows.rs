//! The tiled flash-attention kernel (`attention::portable::attend_tiled`) for a block of query rows of one
//! sequence at once — prefill's shape: every (row, head) of the block is a query *vector*, up to
//! [`MAX_VECTORS`] of them, and they go through the KV cells together.
//!
//! Per 8-cell chunk the keys are converted and transposed once into `kt` (`[head_dim][8]` f32,
//! lane = cell) and every vector's scores come from independent FMA chains, eight or four
//! vectors per pass, so the chains overlap instead of waiting on each other's latency (the
//! grouped kernel of `attn` runs one chain per head). Per tile the values are widened once
//! into `v32` (`[KV_TILE][head_dim]` f32) and the probability-weighted sum runs with the
//! accumulators of two vectors × 32 dimensions in registers.
//!
//! Bits: per vector, every score is the single-row kernel's FMA chain over the dimensions in
//! order, then `× scale`; the softmax step is the same function (`attn::tile_softmax`); each
//! accumulator lane is `fma(p, v, acc)` over the cells in order. The single-row kernel skips
//! cells whose probability is 0, this one adds `0 · v`: for finite values that leaves the
//! accumulator unchanged (it never holds -0), so the results are bit-identical.
//! Visibility is a span of logical cells per row (`lo..n`: causal mask plus sliding window).
#![allow(clippy::missing_safety_doc)]

// Register arrays are indexed in plain loops: iterator adaptors over them may not inline in
// `target_feature` functions.
#![allow(clippy::needless_range_loop)]

use crate::attention::Scale;
use super::softmax::tile_softmax;
use crate::attention::tiles::{self, TileOps};
use crate::attention::types::{KvRows, RowsScratch, KV_TILE, ROWS_MAX_VECTORS};
use crate::simd::x86::{load_ph, transpose8, widen};
use std::arch::x86_64::*;
use std::ops::Range;

/// Most query vectors (rows × heads) per call.
pub const MAX_VECTORS: usize = ROWS_MAX_VECTORS;

/// Scores of one 8-cell chunk for `N` vectors: lane `j` of result `i` is
/// `Σ_d kt[d][j] · q_i[d]`, one FMA per dimension in order.
///
/// # Safety
/// `kt` holds `hd * 8` f32 and every `q[i]` `hd` f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_n<const N: usize>(kt: *const f32, hd: usize, q: [*const f32; N]) -> [__m256; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    for d in 0..hd {
        // SAFETY: d < hd; caller's contract on kt and q.
        unsafe {
            let k = _mm256_loadu_ps(kt.add(d * 8));
            for i in 0..N {
                acc[i] = _mm256_fmadd_ps(k, _mm256_set1_ps(*q[i].add(d)), acc[i]);
            }
        }
    }
    acc
}

/// `acc_k[d..d + 8·ND] += Σ_c p_k[c] · v32[c][d..d + 8·ND]` for `NV` vectors over `cells` cells,
/// cells in order, each lane one FMA per cell.
///
/// # Safety
/// `acc[k]` holds `8·ND` f32, `p[k]` `cells` f32, `v` `(cells - 1) · stride + 8·ND` f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pv<const NV: usize, const ND: usize>(acc: [*mut f32; NV], p: [*const f32; NV], v: *const f32, stride: usize, cells: usize) {
    let mut a = [[_mm256_setzero_ps(); ND]; NV];
    // SAFETY (whole body): caller's contract on acc, p and v.
    unsafe {
        for k in 0..NV {
            for i in 0..ND {
                a[k][i] = _mm256_loadu_ps(acc[k].add(8 * i));
            }
        }
        for c in 0..cells {
            let mut vv = [_mm256_setzero_ps(); ND];
            for i in 0..ND {
                vv[i] = _mm256_loadu_ps(v.add(c * stride + 8 * i));
            }
            for k in 0..NV {
                let pk = _mm256_set1_ps(*p[k].add(c));
                for i in 0..ND {
                    a[k][i] = _mm256_fmadd_ps(pk, vv[i], a[k][i]);
                }
            }
        }
        for k in 0..NV {
            for i in 0..ND {
                _mm256_storeu_ps(acc[k].add(8 * i), a[k][i]);
            }
        }
    }
}

/// Keys of cells `c0..c0 + w` (w ≤ 8; missing lanes zero) into `kt` as `[head_dim][8]` f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose_keys(kv: &KvRows, c0: usize, w: usize, zero: &[half::f16], kt: &mut [f32]) {
    let hd = kv.head_dim;
    let mut rows: [&[half::f16]; 8] = [zero; 8];
    for (j, r) in rows.iter_mut().enumerate().take(w) {
        *r = kv.k(c0 + j);
    }
    assert!(kt.len() >= hd * 8);
    let mut d = 0;
    while d < hd {
        let mut x = [_mm256_setzero_ps(); 8];
        for j in 0..8 {
            x[j] = load_ph(&rows[j][d..]);
        }
        let cols = transpose8(x);
        for (i, col) in cols.iter().enumerate() {
            // SAFETY: (d + i) * 8 + 8 <= hd * 8 <= kt.len().
            unsafe { _mm256_storeu_ps(kt.as_mut_ptr().add((d + i) * 8), *col) };
        }
        d += 8;
    }
}

/// Scores of the chunk `c0..c0 + 8` for every vector (`ptrs[v]`: its `head_dim` query values)
/// into `scores[v][c0 - t0..][..8]`: `q·k × scale` where row `v / heads` sees the cell, -∞
/// elsewhere.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn chunk_scores(ptrs: &[*const f32], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, c0: usize, w: usize, sc: &mut RowsScratch, col: usize) {
    let hd = kv.head_dim;
    let nv = ptrs.len();
    let lanes = _mm256_add_epi32(_mm256_set1_epi32(c0 as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let any = tiles::chunk_seen(spans, c0, w, &mut sc.work);
    if any {
        transpose_keys(kv, c0, w, &sc.zero, &mut sc.kt);
    }
    let mut v = 0;
    while v < nv {
        let (n, pick) = tiles::score_pass(ptrs, v);
        let mut out = [ninf; 8];
        if any {
            // SAFETY: kt holds hd * 8 f32 (transposed above); every q vector holds hd f32.
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
            let vis = _mm256_andnot_si256(
                _mm256_cmpgt_epi32(_mm256_set1_epi32(s.start as i32), lanes),
                _mm256_cmpgt_epi32(_mm256_set1_epi32(s.end as i32), lanes),
            );
            let val = _mm256_blendv_ps(ninf, _mm256_mul_ps(*o, _mm256_set1_ps(scale.mul)), _mm256_castsi256_ps(vis));
            let dst = &mut sc.scores[(v + i) * KV_TILE + col..][..8];
            // SAFETY: 8 f32 writable.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), val) };
            scale.cap(dst);
        }
        v += n;
    }
}

/// The AVX2 arithmetic of the shared driver (`attention::tiles`). Only built inside
/// [`attend_tiled_rows`], whose contract is a CPU with AVX2, FMA and F16C.
struct Avx2Ops(());

impl TileOps for Avx2Ops {
    const CHUNK: usize = 8;

    #[inline(always)]
    fn chunk_scores(&self, ptrs: &[*const f32], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, c0: usize, w: usize, sc: &mut RowsScratch, col: usize) {
        // SAFETY: an `Avx2Ops` exists only under `attend_tiled_rows`' contract (AVX2, FMA, F16C).
        unsafe { chunk_scores(ptrs, heads, spans, kv, scale, c0, w, sc, col) }
    }

    #[inline(always)]
    fn tile_step(&self, sh: &mut [f32], len: usize, st: &mut [f32; 2], acc: &mut [f32]) -> bool {
        // SAFETY: as above.
        unsafe { tile_softmax(sh, len, st, acc) }
    }

    #[inline(always)]
    fn widen_values(&self, kv: &KvRows, t0: usize, t1: usize, v32: &mut [f32]) {
        let hd = kv.head_dim;
        for (c, dst) in (t0..t1).zip(v32.chunks_exact_mut(hd)) {
            // SAFETY: as above.
            unsafe { widen(kv.v(c), dst) };
        }
    }

    #[inline(always)]
    fn accumulate(&self, active: &[usize], cells: usize, hd: usize, sc: &mut RowsScratch) {
        // SAFETY: as above.
        unsafe { accumulate(active, cells, hd, sc) }
    }
}

/// Attention of `q.len()` query rows of one sequence, each `heads × head_dim` values over the
/// cells `spans[r]` of `kv`: `out[r]` gets, per head, exactly what
/// `attention::portable::attend_tiled` gives that head alone (`attention::tiles` drives).
/// `q.len() · heads ≤ MAX_VECTORS`, `head_dim % 8 == 0`, F16 cache.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub fn attend_tiled_rows(q: &[&[f32]], heads: usize, spans: &[Range<usize>], kv: &KvRows, scale: Scale, sinks: Option<&[f32]>, sc: &mut RowsScratch, out: &mut [&mut [f32]]) {
    tiles::attend_tiled_rows(&Avx2Ops(()), q, heads, spans, kv, scale, sinks, sc, out)
}

/// The probability-weighted values of one tile (`cells` cells in `v32`) into the accumulators
/// of the `active` vectors: 32 dimensions × two vectors per register block, then the rest.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate(active: &[usize], cells: usize, hd: usize, sc: &mut RowsScratch) {
    let (acc, scores, v32) = (sc.acc.as_mut_ptr(), sc.scores.as_ptr(), sc.v32.as_ptr());
    // SAFETY (all calls below): active vectors are < MAX_VECTORS, so their accumulator rows
    // (hd f32) and score rows (KV_TILE ≥ cells f32) are inside `acc` and `scores`; d + 8·ND ≤
    // hd, and v32 holds `cells` rows of hd f32.
    let a = |v: usize, d: usize| unsafe { acc.add(v * hd + d) };
    let p = |v: usize| unsafe { scores.add(v * KV_TILE) };
    let mut d = 0;
    while d < hd {
        let wide = hd - d >= 32;
        let mut i = 0;
        while i < active.len() {
            let (v0, pair) = (active[i], i + 1 < active.len());
            unsafe {
                match (wide, pair) {
                    (true, true) => pv::<2, 4>([a(v0, d), a(active[i + 1], d)], [p(v0), p(active[i + 1])], v32.add(d), hd, cells),
                    (true, false) => pv::<1, 4>([a(v0, d)], [p(v0)], v32.add(d), hd, cells),
                    (false, true) => pv::<2, 1>([a(v0, d), a(active[i + 1], d)], [p(v0), p(active[i + 1])], v32.add(d), hd, cells),
                    (false, false) => pv::<1, 1>([a(v0, d)], [p(v0)], v32.add(d), hd, cells),
                }
            }
            i += 2;
        }
        d += if wide { 32 } else { 8 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::types::TileWork;
    use half::f16;

    /// One of the two multi-row kernels (`rows`, `rows512`).
    type Kernel = unsafe fn(&[&[f32]], usize, &[Range<usize>], &KvRows, Scale, Option<&[f32]>, &mut RowsScratch, &mut [&mut [f32]]);

    /// A 1024-cell prefill in blocks of 16 rows (one head of 64 dimensions) through `kernel`;
    /// each block's spans from `span(position)`. The work summed over the blocks of `blocks`.
    fn work(kernel: Kernel, blocks: Range<usize>, span: impl Fn(usize) -> Range<usize>) -> TileWork {
        let (hd, cells) = (64, 1024);
        let k: Vec<f16> = (0..cells * hd).map(|i| f16::from_f32(((i * 7919) % 13) as f32 / 13.0 - 0.5)).collect();
        let v: Vec<f16> = (0..cells * hd).map(|i| f16::from_f32(((i * 104729) % 17) as f32 / 17.0)).collect();
        let identity: Vec<u32> = (0..cells as u32).collect();
        let kv = KvRows::contiguous(&k, &v, hd, &identity);
        let q = vec![0.25f32; 16 * hd];
        let mut sc = RowsScratch::new(hd);
        let mut out = vec![0f32; 16 * hd];
        for b in blocks {
            let spans: Vec<_> = (16 * b..16 * b + 16).map(&span).collect();
            let qs: Vec<&[f32]> = q.chunks_exact(hd).collect();
            let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(hd).collect();
            // SAFETY: the caller checked that the CPU has what the kernel enables.
            unsafe { kernel(&qs, 1, &spans, &kv, Scale::from(0.125), None, &mut sc, &mut outs) };
        }
        sc.work
    }

    /// Tiles the causal mask or a sliding window hides are not computed: a causal 1024-token
    /// prefill scores half the chunks (and accumulates about half the tiles) of attention over
    /// the whole cache, and a 256-cell window only the chunks its rows see — by both kernels,
    /// the 16-cell chunks of `rows512` counted by their 8-cell halves. (1024 cells, not more:
    /// `scripts/test_avx2_cpu.sh` runs this under qemu, where 4096 took seven minutes.)
    #[test]
    fn hidden_tiles_are_skipped() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
            return;
        }
        let mut kernels: Vec<Kernel> = vec![attend_tiled_rows];
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") {
            kernels.push(super::super::rows512::attend_tiled_rows);
        }
        for kernel in kernels {
            let all = work(kernel, 0..64, |_| 0..1024);
            assert_eq!(all, TileWork { chunks_scored: 64 * 128, tiles_accumulated: 64 * 16 });
            // Block b's rows see 0..16b + 16 at most: 2b + 2 chunks, ceil((b + 1) / 4) tiles.
            let causal = work(kernel, 0..64, |p| 0..p + 1);
            let chunks: usize = (0..64).map(|b| 2 * b + 2).sum();
            let tiles: usize = (0..64).map(|b: usize| (b + 1).div_ceil(4)).sum();
            assert_eq!(causal, TileWork { chunks_scored: chunks, tiles_accumulated: tiles });
            assert_eq!((chunks, tiles), (4160, 544));
            // Window of 256 at positions 976..992: cells 721..992, chunks from 720 to 992,
            // the tiles from 704 on.
            let window = work(kernel, 61..62, |p| p - 255..p + 1);
            assert_eq!(window, TileWork { chunks_scored: 34, tiles_accumulated: 5 });
            // The first block: two chunks, one tile.
            assert_eq!(work(kernel, 0..1, |p| 0..p + 1), TileWork { chunks_scored: 2, tiles_accumulated: 1 });
        }
    }
}
