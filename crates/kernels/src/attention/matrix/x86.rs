//! AVX-512 column-key attention: the scores of a block with lanes over its 16 cells (one
//! widened key vector per dimension, shared by the row's heads), the softmax step on those
//! lanes, and the values with lanes over dimensions (one widened value row per cell, shared by
//! up to four heads). Head counts and dimension passes are constants of each instance, so the
//! inner loops hold only loads, conversions and FMAs. Bit for bit `model::attend_group`.

use super::model::{begin, finish, C};
use crate::attention::types::{KvRows, MatrixScratch, NextRows, DECODE_CHUNK};
use crate::exp::expf_ggml;
use crate::exp::x86::expf_ggml16;
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;
use std::arch::x86_64::*;

/// Heads whose scores are summed at once (accumulators in registers).
const SCORE_HEADS: usize = 8;
/// Heads whose value products are summed at once.
const VALUE_HEADS: usize = 4;
/// Most vectors (rows × heads) of one call.
const MAX_VECTORS: usize = crate::attention::types::ROWS_MAX_VECTORS;
/// Blocks asked for ahead of the one computed.
const AHEAD: usize = 2;

/// `model::attend_group` on AVX-512 for the `rows × heads` vectors of `q` (vector `r·heads +
/// h`: row `r`'s head `h`, which sees the cells `mask(r, t)` of block `t`) together: each key
/// and value vector is loaded once for all of them.
///
/// # Safety
/// AVX-512 F/BW/VL, AVX2, FMA and F16C; `kv.head_dim` a multiple of 16; `q[r]` and `out[r]`
/// hold `heads · head_dim` values; `rows × heads` at most the scratch's vectors.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn attend_rows(q: &[&[f32]], heads: usize, mask: &dyn Fn(usize, usize) -> u16, n_blocks: usize, kv: &KvRows, scale: f32, ms: &mut MatrixScratch, next: &mut NextRows, out: &mut [&mut [f32]]) {
    let hd = kv.head_dim;
    let n = q.len() * heads;
    assert!(hd.is_multiple_of(16) && n <= ms.m.len() && n <= MAX_VECTORS && q.iter().all(|r| r.len() >= heads * hd) && out.iter().all(|r| r.len() >= heads * hd));
    // Each vector's query.
    let mut qp = [std::ptr::null::<f32>(); MAX_VECTORS];
    for (i, p) in qp.iter_mut().enumerate().take(n) {
        *p = q[i / heads][(i % heads) * hd..].as_ptr();
    }
    let heads_total = heads;
    let heads = n;
    assert!(kv.k.len() >= kv.table.iter().map(|&b| b as usize + 1).max().unwrap_or(0) * C * 2 * hd);
    assert!(kv.v.len() >= kv.table.iter().map(|&b| b as usize + 1).max().unwrap_or(0) * C * 2 * hd);
    begin(ms, n, hd);
    // Bytes of a block's keys (and of its values): 16 cells of `head_dim` F16.
    let bb = C * 2 * hd;
    let block = |t: usize| kv.table[t] as usize * bb;
    // Each block's keys and values are asked for AHEAD blocks before they are read, a line of
    // each per dimension while the scores are summed (a burst of all of them fills the miss
    // queue): the hardware prefetcher cannot follow the block table. Once there is no block
    // that far ahead, the first cells the worker reads next (`AttnScratch::read_next`).
    let rows = q.len();
    let any_row = |t: usize| (0..rows).fold(0u16, |a, r| a | mask(r, t));
    let first = (0..n_blocks).find(|&t| any_row(t) != 0).unwrap_or(n_blocks);
    for t in first..(first + AHEAD).min(n_blocks) {
        prefetch_lines(kv.k[block(t)..].as_ptr(), bb, CacheLevel::L2);
        prefetch_lines(kv.v[block(t)..].as_ptr(), bb, CacheLevel::L2);
    }
    let mut vis = [0u16; MAX_VECTORS];
    for t in first..n_blocks {
        for r in 0..rows {
            let m = mask(r, t);
            vis[r * heads_total..(r + 1) * heads_total].fill(m);
        }
        if vis[..n].iter().all(|&m| m == 0) {
            continue;
        }
        let ahead = (t + AHEAD < n_blocks).then(|| (kv.k[block(t + AHEAD)..].as_ptr(), kv.v[block(t + AHEAD)..].as_ptr()));
        if t + AHEAD == n_blocks {
            ask_next(next, 2 * hd);
        }
        // SAFETY: the block's keys and values lie inside `kv.k`, `kv.v` (asserted above).
        let (kt, vb) = unsafe { (kv.k.as_ptr().add(block(t)) as *const f16, kv.v.as_ptr().add(block(t)) as *const f16) };
        // Scores and the softmax step, SCORE_HEADS heads at a time.
        for h0 in (0..heads).step_by(SCORE_HEADS) {
            let qh = &qp[h0..];
            let ask = if h0 == 0 { ahead } else { None };
            // SAFETY: `qh` points to nh queries of hd values; `kt` a block of keys (above).
            let s = unsafe {
                match (heads - h0).min(SCORE_HEADS) {
                    1 => spill(scores::<1>(qh, hd, kt, ask)),
                    2 => spill(scores::<2>(qh, hd, kt, ask)),
                    3 => spill(scores::<3>(qh, hd, kt, ask)),
                    4 => spill(scores::<4>(qh, hd, kt, ask)),
                    5 => spill(scores::<5>(qh, hd, kt, ask)),
                    6 => spill(scores::<6>(qh, hd, kt, ask)),
                    7 => spill(scores::<7>(qh, hd, kt, ask)),
                    _ => spill(scores::<8>(qh, hd, kt, ask)),
                }
            };
            for (i, s) in s.iter().enumerate().take((heads - h0).min(SCORE_HEADS)) {
                softmax(ms, h0 + i, *s, vis[h0 + i], scale);
            }
        }
        // Values, VALUE_HEADS heads at a time.
        for h0 in (0..heads).step_by(VALUE_HEADS) {
            // SAFETY: `vb` a block of values (above); heads h0.. exist in the scratch.
            unsafe {
                match ((heads - h0).min(VALUE_HEADS), hd.is_multiple_of(64)) {
                    (1, true) => values::<1, 4>(ms, h0, hd, vb, &vis[h0..]),
                    (2, true) => values::<2, 4>(ms, h0, hd, vb, &vis[h0..]),
                    (3, true) => values::<3, 4>(ms, h0, hd, vb, &vis[h0..]),
                    (_, true) => values::<4, 4>(ms, h0, hd, vb, &vis[h0..]),
                    (1, false) => values::<1, 1>(ms, h0, hd, vb, &vis[h0..]),
                    (2, false) => values::<2, 1>(ms, h0, hd, vb, &vis[h0..]),
                    (3, false) => values::<3, 1>(ms, h0, hd, vb, &vis[h0..]),
                    (_, false) => values::<4, 1>(ms, h0, hd, vb, &vis[h0..]),
                }
            }
        }
    }
    for (r, o) in out.iter_mut().enumerate() {
        finish(ms, r * heads_total, heads_total, hd, o);
    }
}

/// Ask for the worker's next cells (at most a block of them), `row_bytes` of each key and value.
fn ask_next(next: &mut NextRows, row_bytes: usize) {
    let (mut k, mut v) = ([std::ptr::null::<f16>(); DECODE_CHUNK], [std::ptr::null::<f16>(); DECODE_CHUNK]);
    let n = next.take(&mut k, &mut v).min(C);
    for (&k, &v) in k[..n].iter().zip(&v[..n]) {
        prefetch_lines(k as *const u8, row_bytes, CacheLevel::L2);
        prefetch_lines(v as *const u8, row_bytes, CacheLevel::L2);
    }
}

/// Up to SCORE_HEADS score vectors in an array of the widest count.
#[inline(always)]
fn spill<const NH: usize>(s: [__m512; NH]) -> [__m512; SCORE_HEADS] {
    // SAFETY: all-zero bits are a valid __m512.
    let mut out = [unsafe { std::mem::zeroed::<__m512>() }; SCORE_HEADS];
    out[..NH].copy_from_slice(&s);
    out
}

/// The raw scores of NH vectors (`q`: their queries) over one block of keys `kt`
/// (`[hd][16]`): per dimension in order, one FMA per head. Asks for line `d` of the keys and
/// values `ask` points to while it goes (the first `16 · 2 · hd / 64` dimensions).
///
/// # Safety
/// AVX-512 F, F16C; `q` holds NH pointers to `hd` f32 each; `kt` points to `hd · 16` F16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scores<const NH: usize>(q: &[*const f32], hd: usize, kt: *const f16, ask: Option<(*const u8, *const u8)>) -> [__m512; NH] {
    assert!(q.len() >= NH);
    let mut s = [_mm512_setzero_ps(); NH];
    let lines = C * 2 * hd / 64;
    for d in 0..hd {
        if let Some((k, v)) = ask.filter(|_| d < lines) {
            prefetch_lines(k.wrapping_add(d * 64), 64, CacheLevel::L2);
            prefetch_lines(v.wrapping_add(d * 64), 64, CacheLevel::L2);
        }
        // SAFETY: d < hd: the 16 F16 of dimension d lie inside the block.
        let k = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(kt.add(d * C) as *const __m256i) });
        for (i, s) in s.iter_mut().enumerate() {
            // SAFETY: d < hd: inside vector i's query (the caller's contract).
            *s = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *q[i].add(d) }), k, *s);
        }
    }
    s
}

/// The softmax step of head `h` on raw scores `s` (`model::softmax_step` on 16 lanes): its
/// probabilities into `ms.p[h]`, its sums, maximum and rescale factor updated.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn softmax(ms: &mut MatrixScratch, h: usize, s: __m512, vis: u16, scale: f32) {
    if vis == 0 {
        // A block this vector does not see: its state stays as it is (`values` skips it too).
        ms.p[h] = [0.0; C];
        return;
    }
    let x = _mm512_mul_ps(s, _mm512_set1_ps(scale));
    let m_new = ms.m[h].max(_mm512_mask_reduce_max_ps(vis, x));
    let corr = expf_ggml(ms.m[h] - m_new);
    let p = _mm512_maskz_mov_ps(vis, expf_ggml16(_mm512_sub_ps(x, _mm512_set1_ps(m_new))));
    // SAFETY: `p[h]` and `l[h]` are 16 f32 each.
    unsafe {
        let l = _mm512_loadu_ps(ms.l[h].as_ptr());
        _mm512_storeu_ps(ms.l[h].as_mut_ptr(), _mm512_fmadd_ps(l, _mm512_set1_ps(corr), p));
        _mm512_storeu_ps(ms.p[h].as_mut_ptr(), p);
    }
    ms.m[h] = m_new;
    ms.corr[h] = corr;
}

/// Heads `h0..h0 + NH`: the products of their probabilities with the block's values (`vb`:
/// 16 rows of `hd` F16), cell by cell in order over the cells with `p ≠ 0`, NV · 16
/// dimensions per pass, then `acc = fma(acc, corr, part)` (not for a head that sees no cell
/// of the block: `vis`).
///
/// # Safety
/// AVX-512 F, F16C; `vb` points to `16 · hd` F16; `hd` a multiple of NV · 16; heads
/// `h0..h0 + NH` exist in `ms`.
#[inline]
#[allow(clippy::needless_range_loop)] // heads and vectors index several arrays at once
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn values<const NH: usize, const NV: usize>(ms: &mut MatrixScratch, h0: usize, hd: usize, vb: *const f16, vis: &[u16]) {
    assert!(h0 + NH <= ms.p.len() && (h0 + NH) * hd <= ms.acc.len() && hd.is_multiple_of(NV * 16));
    let mut nz = [0u16; NH];
    let mut p = [[0f32; C]; NH];
    for i in 0..NH {
        p[i] = ms.p[h0 + i];
        // SAFETY: 16 f32.
        nz[i] = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(unsafe { _mm512_loadu_ps(p[i].as_ptr()) }, _mm512_setzero_ps());
    }
    let any = nz.iter().fold(0u16, |a, z| a | z);
    for d0 in (0..hd).step_by(NV * 16) {
        let mut w = [[_mm512_setzero_ps(); NV]; NH];
        let mut cells = any;
        while cells != 0 {
            let j = cells.trailing_zeros() as usize;
            cells &= cells - 1;
            let mut v = [_mm512_setzero_ps(); NV];
            for (x, vx) in v.iter_mut().enumerate() {
                // SAFETY: row j < 16, d0 + 16x + 16 ≤ hd: inside the block.
                *vx = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(vb.add(j * hd + d0 + 16 * x) as *const __m256i) });
            }
            for i in 0..NH {
                let k = 0u16.wrapping_sub(nz[i] >> j & 1);
                let pj = _mm512_set1_ps(p[i][j]);
                for x in 0..NV {
                    w[i][x] = _mm512_mask3_fmadd_ps(pj, v[x], w[i][x], k);
                }
            }
        }
        for i in 0..NH {
            if vis[i] == 0 {
                continue;
            }
            let h = h0 + i;
            let c = _mm512_set1_ps(ms.corr[h]);
            for x in 0..NV {
                // SAFETY: h·hd + d0 + 16x + 16 ≤ (h0 + NH)·hd ≤ acc.len() (asserted).
                unsafe {
                    let a = ms.acc.as_mut_ptr().add(h * hd + d0 + 16 * x);
                    _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_loadu_ps(a), c, w[i][x]));
                }
            }
        }
    }
}
