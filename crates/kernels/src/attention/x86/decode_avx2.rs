//! The two-phase decode attention of [`super::decode`] with AVX2, for CPUs without
//! AVX-512: the same driver and softmax steps, 8-lane phases. Phase 1 widens each key row once
//! into an f32 row and dots it with every head in ggml's order — its four 16-lane accumulators
//! as eight 8-lane halves, folded and reduced in registers; phase 2 takes the exponentials from
//! `exp::x86::expf8` and updates the F16-rounded accumulators in memory with each value row
//! widened once for all heads — for head dimension 64, head by head with the accumulators in
//! registers instead ([`accumulate_head64`]). Bit-identical per head to
//! `attention::portable::attend_reference`.
#![allow(clippy::missing_safety_doc)]

use crate::attention::chunks::{ask_share, drive};
use crate::attention::portable::softmax_steps;
use crate::attention::types::{Cells, DecodeBuffers, DECODE_CHUNK};
use crate::exp::x86::expf_slice_avx2;
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;
use std::arch::x86_64::*;

/// Attention of the `q.len() / head_dim` query heads of one KV head over the visible cells
/// `c < n_cells` of an F16 cache (`chunks::supports(head_dim)`).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn attend_decode_group_avx2(
    q: &[f32],
    cells: Cells,
    scale: f32,
    split: usize,
    bufs: DecodeBuffers,
    out: &mut [f32],
) {
    let Cells { kv, .. } = cells;
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    drive(q, cells, split, bufs, out, |rows, b| {
        let (kr, vr) = (rows.k, rows.v);
        for (i, &kp) in kr.iter().enumerate() {
            // Value row i into L1 for phase 2 (asked for into L2 a chunk earlier); the rows
            // read after this chunk into L2.
            prefetch_lines(vr[i] as *const u8, 2 * hd, CacheLevel::L1);
            ask_share(rows.ahead_k, 2 * hd, i, kr.len());
            ask_share(rows.ahead_v, 2 * hd, i, kr.len());
            // SAFETY: `kp` starts a row of `hd` F16 values; k32 holds `hd` (checked by `drive`).
            unsafe { widen(kp, &mut b.k32[..hd]) };
            for h in 0..heads {
                let s = dot(&b.k32[..hd], &b.qf[h * hd..(h + 1) * hd]);
                b.scores[h * DECODE_CHUNK + i] = s * scale;
            }
        }
        softmax_steps(b.scores, b.grow, &mut b.state[..heads], vr.len(), |x| expf_slice_avx2(x));
        if hd == 64 {
            for (h, st) in b.state[..heads].iter_mut().enumerate() {
                // SAFETY: every `vr` pointer starts a row of 64 F16 values; the head's scores
                // cover the chunk's cells and its accumulator holds 64 values.
                unsafe { accumulate_head64(vr, &b.scores[h * DECODE_CHUNK..(h + 1) * DECODE_CHUNK], b.grow[h], &mut b.acc[h * 64..(h + 1) * 64], &mut st[1]) };
            }
            return;
        }
        for (i, &vp) in vr.iter().enumerate() {
            // SAFETY: as for the keys.
            unsafe { widen(vp, &mut b.v32[..hd]) };
            for (h, st) in b.state[..heads].iter_mut().enumerate() {
                let e = b.scores[h * DECODE_CHUNK + i];
                let (ms, vs) = if b.grow[h] & (1 << i) != 0 { (e, 1f32) } else { (1f32, e) };
                accumulate(&mut b.acc[h * hd..(h + 1) * hd], &b.v32[..hd], ms, vs);
                st[1] = st[1].mul_add(ms, vs);
            }
        }
    });
}

/// Phase 2 of one head of dimension 64 over the chunk's value rows `vr`: its eight
/// accumulator vectors stay in registers from the first cell to the last, where the general
/// loop below loads and stores them for every cell (each cell then waits on the previous one's
/// store). Each value row is widened again per head (one conversion per 8 lanes, as a load of
/// a widened copy would cost); the chunk's rows stay in L1 across its heads. The same
/// operations per lane in the same cell order as [`accumulate`], so the same bits.
///
/// # Safety
/// Every `vr` pointer starts a row of 64 F16 values; `e` holds an exponential per cell of `vr`;
/// `acc` holds 64 values; AVX2, FMA and F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate_head64(vr: &[*const f16], e: &[f32], grow: u64, acc: &mut [f32], sum: &mut f32) {
    let round = |x: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    assert!(acc.len() >= 64 && e.len() >= vr.len());
    let mut r = [_mm256_setzero_ps(); 8];
    for (j, rj) in r.iter_mut().enumerate() {
        // SAFETY: 8j + 8 <= 64 <= acc.len(); unaligned load.
        *rj = unsafe { _mm256_loadu_ps(acc.as_ptr().add(8 * j)) };
    }
    let mut s = *sum;
    for (i, &vp) in vr.iter().enumerate() {
        let (ms, vs) = if grow & (1 << i) != 0 { (e[i], 1f32) } else { (1f32, e[i]) };
        // Skipping the rescale when `ms` is 1 changes no bits (an F16 value times 1 is itself).
        if ms != 1.0 {
            let msv = _mm256_set1_ps(ms);
            for rj in r.iter_mut() {
                *rj = round(_mm256_mul_ps(*rj, msv));
            }
        }
        let vsv = _mm256_set1_ps(vs);
        for (j, rj) in r.iter_mut().enumerate() {
            // SAFETY (caller): `vp` starts a row of 64 F16 values; unaligned load.
            let v = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(vp.add(8 * j) as *const __m128i)) };
            *rj = round(_mm256_fmadd_ps(v, vsv, *rj));
        }
        s = s.mul_add(ms, vs);
    }
    *sum = s;
    for (j, &rj) in r.iter().enumerate() {
        // SAFETY: as the loads above.
        unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * j), rj) };
    }
}

/// `dst = src` widened; `dst.len()` values (a multiple of 8) at `src`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen(src: *const f16, dst: &mut [f32]) {
    for d in (0..dst.len()).step_by(8) {
        // SAFETY (caller): `dst.len()` F16 values readable at `src`; unaligned accesses.
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(d), _mm256_cvtph_ps(_mm_loadu_si128(src.add(d) as *const __m128i))) };
    }
}

/// `k · q` in ggml's order for a multiple of 64 values: accumulator halves j = 0..8 over the
/// 64-value steps, `(0+4)+(2+6)` and `(1+5)+(3+7)` (ggml's 0+2, 1+3, then 0+1 on 16 lanes),
/// then GCC's `_mm512_reduce_add_ps` order on the 16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot(k: &[f32], q: &[f32]) -> f32 {
    let n = k.len().min(q.len());
    let mut acc = [_mm256_setzero_ps(); 8];
    for i in (0..n).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8j + 8 <= n (n is a multiple of 64); unaligned loads.
            unsafe { *a = _mm256_fmadd_ps(_mm256_loadu_ps(k.as_ptr().add(i + 8 * j)), _mm256_loadu_ps(q.as_ptr().add(i + 8 * j)), *a) };
        }
    }
    let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    let t3 = _mm256_add_ps(hi, lo);
    let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
    let u = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
    _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)))
}

/// One head's accumulator step: `a = f16(f16(a · ms) + v · vs)` lane by lane (the rescale
/// skipped when `ms` is exactly 1: an F16 value times 1 is itself).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate(a: &mut [f32], v: &[f32], ms: f32, vs: f32) {
    let round = |x: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    let n = a.len().min(v.len());
    let (msv, vsv) = (_mm256_set1_ps(ms), _mm256_set1_ps(vs));
    for d in (0..n).step_by(8) {
        // SAFETY: d + 8 <= n (a multiple of 8); unaligned loads and stores.
        unsafe {
            let p = a.as_mut_ptr().add(d);
            let mut x = _mm256_loadu_ps(p);
            if ms != 1.0 {
                x = round(_mm256_mul_ps(x, msv));
            }
            _mm256_storeu_ps(p, round(_mm256_fmadd_ps(_mm256_loadu_ps(v.as_ptr().add(d)), vsv, x)));
        }
    }
}
