//! AVX2 + F16C twins of the two flash-attention kernels of `ops`. Same arithmetic, lane for
//! lane, so results are bit-identical to the portable kernels:
//! - the reference kernel (`attend_reference`): the F16 dot keeps ggml's four 16-lane
//!   accumulators (each as two 8-lane halves), the F16 accumulator is rounded with the hardware
//!   converter (round to nearest even, as the portable twin);
//! - the tiled kernel (`attend_tiled_group`), for one head or all heads of a GQA group at once:
//!   scores of 8 cells per lane-parallel FMA chain over the dimensions (ggml's `simd_gemm`
//!   order), ggml's softmax step on 8 lanes (`softmax_tile`).
#![allow(clippy::missing_safety_doc)]

use crate::attention::Scale;
use super::softmax::tile_softmax;
use crate::attention::types::{AttnScratch, Cells, GroupBuffers, KvRows, ReferenceBuffers, KV_TILE};
use crate::matmul::x86::avx2::dot_f16_ggml;
use crate::simd::x86::{fold_ggml, h2f, load_ph, transpose8, widen};
use half::f16;
use std::arch::x86_64::*;

/// The reference kernel with F16C: see `attention::portable::attend_reference` for the algorithm.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn attend_reference(
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let Cells { kv, visible, .. } = cells;
    let hd = q.len();
    let body = hd & !7;
    let (q16, acc16, v32) = scratch.f16_buffers();
    for (d, &s) in q16.iter_mut().zip(q) {
        *d = f16::from_f32(s);
    }
    acc16.iter_mut().for_each(|a| *a = f16::ZERO);
    let mut st = [f32::NEG_INFINITY, 0f32];
    for c in cells.span() {
        if !visible.at(c) {
            continue;
        }
        let score = scale.score(dot_f16_ggml(kv.k(c), q16));
        let vc = kv.v(c);
        widen(&vc[..body], &mut v32[..body]);
        let (ms, vs) = reference_cell(score, &mut st, &mut acc16[..body], &v32[..body]);
        // The dimensions past the last multiple of 8, one at a time: rescaled and rounded to
        // F16 (`ms` is 1 unless the maximum grew, and F16 × 1 is exact), then accumulated.
        for (a, &vv) in acc16[body..].iter_mut().zip(&vc[body..]) {
            let r = h2f(f16::from_f32(h2f(*a) * ms));
            *a = f16::from_f32(h2f(vv).mul_add(vs, r));
        }
    }
    let s = st[1];
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for (o, a) in out.iter_mut().zip(acc16.iter()) {
        *o = h2f(*a) * inv;
    }
}

/// One visible cell of the reference kernel for one head: the running (maximum, sum) `st`
/// updated with `score`, the F16 accumulator `a16` rescaled (`× ms`) if the maximum grew and
/// `v · vs` added, rounded to F16 at each step as ggml's `VKQ16`. `a16` and the f32 value row
/// `v` hold a multiple of 8 values; returns `(ms, vs)` for a caller with a tail.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reference_cell(score: f32, st: &mut [f32; 2], a16: &mut [f16], v: &[f32]) -> (f32, f32) {
    let [m, s] = st;
    let n = a16.len();
    assert!(n.is_multiple_of(8) && v.len() >= n);
    let (mut ms, mut vs) = (1f32, 1f32);
    if score > *m {
        let old = *m;
        *m = score;
        ms = (old - *m).exp();
        let msv = _mm256_set1_ps(ms);
        let mut d = 0;
        while d < n {
            let a = load_ph(&a16[d..]);
            store_ph(&mut a16[d..], _mm256_mul_ps(a, msv));
            d += 8;
        }
    } else {
        vs = (score - *m).exp();
    }
    let vsv = _mm256_set1_ps(vs);
    let mut d = 0;
    while d < n {
        let a = load_ph(&a16[d..]);
        // SAFETY: d + 8 <= n <= v.len(); unaligned load.
        let vv = unsafe { _mm256_loadu_ps(v.as_ptr().add(d)) };
        store_ph(&mut a16[d..], _mm256_fmadd_ps(vv, vsv, a));
        d += 8;
    }
    *s = s.mul_add(ms, vs);
    (ms, vs)
}

/// `dot_f16_ggml` on rows already widened to f32 (the same products, exactly: F16 → f32 is
/// exact), in the same order, its tail in double — not the F32 matmuls' `dot_f32_ggml`, whose
/// tail is one FMA per value.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_widened_f16_ggml(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut i = 0;
    while i < np {
        for (h, a) in acc.iter_mut().enumerate() {
            let o = i + h * 8;
            // SAFETY: o + 8 <= np <= n; unaligned loads.
            unsafe { *a = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr().add(o)), _mm256_loadu_ps(y.as_ptr().add(o)), *a) };
        }
        i += 64;
    }
    let mut sum = fold_ggml(&acc);
    for k in np..n {
        sum += (x[k] * y[k]) as f64;
    }
    sum as f32
}

/// The reference kernel for the query heads of a GQA group at once (`q`: heads × head_dim):
/// each key and value row is converted once for all heads and the F16-rounded queries are
/// widened once; per head every operation is `attend_reference`'s, in the same order, so the
/// bits are equal. `head_dim % 8 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn attend_reference_group(
    q: &[f32],
    cells: Cells,
    scale: Scale,
    bufs: ReferenceBuffers,
    out: &mut [f32],
) {
    let Cells { kv, visible, .. } = cells;
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    let (qf, acc16, state, k32, v32) = bufs;
    assert!(hd.is_multiple_of(8) && qf.len() >= heads * hd && acc16.len() >= heads * hd && state.len() >= heads);
    crate::simd::round_f16_row(&q[..heads * hd], &mut qf[..heads * hd]);
    acc16[..heads * hd].fill(f16::ZERO);
    state[..heads].fill([f32::NEG_INFINITY, 0.0]);
    for c in cells.span() {
        if !visible.at(c) {
            continue;
        }
        widen(kv.k(c), k32);
        widen(kv.v(c), v32);
        for (h, st) in state[..heads].iter_mut().enumerate() {
            let score = scale.score(dot_widened_f16_ggml(k32, &qf[h * hd..(h + 1) * hd]));
            reference_cell(score, st, &mut acc16[h * hd..(h + 1) * hd], v32);
        }
    }
    for (h, st) in state[..heads].iter().enumerate() {
        let inv = if st[1] == 0.0 { 0.0 } else { 1.0 / st[1] };
        for (o, a) in out[h * hd..(h + 1) * hd].iter_mut().zip(&acc16[h * hd..(h + 1) * hd]) {
            *o = h2f(*a) * inv;
        }
    }
}

/// Most query heads `attend_tiled_group` takes at once.
pub const MAX_GROUP: usize = 16;

/// Scores `q·k_c` of 8 consecutive logical cells for each of the `q.len() / head_dim` heads:
/// lane = cell, a sequential FMA chain over the dimensions in order, exactly as ggml's
/// `simd_gemm` computes them; each 8×8 block of keys is loaded and transposed once for all
/// heads. Head `h`'s scores go to `out[h * stride..][..8]`.
#[target_feature(enable = "avx2,fma,f16c")]
fn scores8_heads(q: &[f32], kv: &KvRows, c0: usize, out: &mut [f32], stride: usize) {
    const MAX_HEADS: usize = MAX_GROUP;
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    assert!(heads <= MAX_HEADS && hd.is_multiple_of(8));
    let krows: [&[f16]; 8] = std::array::from_fn(|j| kv.k(c0 + j));
    let mut acc = [_mm256_setzero_ps(); MAX_HEADS];
    let mut d = 0;
    while d < hd {
        // (A loop, not `array::from_fn`, whose closure may be left out of line without F16C.)
        let mut rows = [_mm256_setzero_ps(); 8];
        for (r, k) in rows.iter_mut().zip(&krows) {
            *r = load_ph(&k[d..]);
        }
        let cols = transpose8(rows);
        for (h, a) in acc[..heads].iter_mut().enumerate() {
            let qh = &q[h * hd + d..h * hd + d + 8];
            for (j, col) in cols.iter().enumerate() {
                *a = _mm256_fmadd_ps(*col, _mm256_set1_ps(qh[j]), *a);
            }
        }
        d += 8;
    }
    for (h, a) in acc[..heads].iter().enumerate() {
        let o = &mut out[h * stride..h * stride + 8];
        // SAFETY: 8 f32 writable.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
    }
}

/// The tiled kernel (`attention::portable::attend_tiled`) for one head or the heads of a GQA group at
/// once: keys transposed once per 8-cell block and values converted once per cell for all
/// heads; per head, every operation is the single-head kernel's, in the same order, so the
/// bits are equal. `head_dim % 8 == 0`; at most 16 heads.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn attend_tiled_group(
    q: &[f32],
    cells: Cells,
    scale: Scale,
    bufs: GroupBuffers,
    out: &mut [f32],
) {
    let Cells { kv, n: n_cells, visible } = cells;
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    let (scores, acc, state, v32) = bufs;
    acc.fill(0.0);
    state.fill([f32::NEG_INFINITY, 0.0]);
    let mut t0 = 0;
    while t0 < n_cells {
        let t1 = (t0 + KV_TILE).min(n_cells);
        let mut c = t0;
        while c < t1 {
            if c + 8 <= t1 && (c..c + 8).any(|c| visible.at(c)) {
                scores8_heads(q, kv, c, &mut scores[c - t0..], KV_TILE);
                for j in 0..8 {
                    let vis = visible.at(c + j);
                    for h in 0..heads {
                        let p = &mut scores[h * KV_TILE + c + j - t0];
                        *p = if vis { scale.score(*p) } else { f32::NEG_INFINITY };
                    }
                }
                c += 8;
                continue;
            }
            let vis = visible.at(c);
            for h in 0..heads {
                let qh = &q[h * hd..(h + 1) * hd];
                scores[h * KV_TILE + c - t0] = if vis {
                    scale.score(kv.k(c).iter().zip(qh).fold(0f32, |a, (&kk, &qq)| h2f(kk).mul_add(qq, a)))
                } else {
                    f32::NEG_INFINITY
                };
            }
            c += 1;
        }
        for (h, st) in state.iter_mut().enumerate() {
            let sh = &mut scores[h * KV_TILE..(h + 1) * KV_TILE];
            tile_softmax(sh, t1 - t0, st, &mut acc[h * hd..(h + 1) * hd]);
        }
        for c in t0..t1 {
            if (0..heads).all(|h| scores[h * KV_TILE + c - t0] == 0.0) {
                continue;
            }
            widen(kv.v(c), v32);
            for h in 0..heads {
                let p = scores[h * KV_TILE + c - t0];
                if p == 0.0 {
                    continue;
                }
                let pv = _mm256_set1_ps(p);
                let a = &mut acc[h * hd..(h + 1) * hd];
                let mut d = 0;
                while d + 8 <= hd {
                    // SAFETY: d + 8 <= hd = a.len() = v32.len(); unaligned loads and stores.
                    unsafe {
                        let av = _mm256_loadu_ps(a.as_ptr().add(d));
                        _mm256_storeu_ps(a.as_mut_ptr().add(d), _mm256_fmadd_ps(pv, _mm256_loadu_ps(v32.as_ptr().add(d)), av));
                    }
                    d += 8;
                }
            }
        }
        t0 = t1;
    }
    for (h, st) in state.iter().enumerate() {
        let inv = if st[1] == 0.0 { 0.0 } else { 1.0 / st[1] };
        for (o, &a) in out[h * hd..(h + 1) * hd].iter_mut().zip(&acc[h * hd..(h + 1) * hd]) {
            *o = a * inv;
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_ph(p: &mut [f16], v: __m256) {
    assert!(p.len() >= 8);
    // SAFETY: at least 8 f16 writable; unaligned store.
    unsafe { _mm_storeu_si128(p.as_mut_ptr() as *mut __m128i, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)) }
}
