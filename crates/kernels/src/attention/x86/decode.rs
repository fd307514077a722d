//! Decode attention with AVX-512: ggml's `one_chunk` F16 path (the reference kernel of
//! `attention::portable::attend_reference`) for the query heads of one GQA group, in two phases per chunk of
//! [`CHUNK`] visible cells, bit-identical per head to the portable kernel:
//!
//! 1. **Scores.** Each key row is widened once into registers (head_dim = 64·S: 4·S zmm) and
//!    dotted with every head's F16-rounded query in ggml's order — four 16-lane accumulators
//!    over 64-value steps, folded (0+2)+(1+3), the 16 lanes reduced as GCC's
//!    `_mm512_reduce_add_ps` does — in registers.
//! 2. **Online softmax.** Per head the running maximum over the chunk and all its exponentials
//!    at once (`softmax_steps` with glibc's `expf` on 16 lanes, `exp::x86`), then per
//!    cell the accumulator updated `acc = f16(v · vs + f16(acc · ms))` exactly as ggml's
//!    `VKQ16`; the accumulator lives as f32 values that F16 represents exactly, rounded through
//!    `vcvtps2ph`/`vcvtph2ps` in registers instead of being stored as F16 and converted back.
//!    That rounding pair (2.4 cycles per 16 lanes on Zen 4) is most of what is left per cell.
//!
//! Heads are independent, so running them cell by cell instead of head by head changes no
//! bits; the scores of a chunk do not depend on the softmax state, so computing them first
//! changes none either. `drive` (gathering a chunk's rows, normalising the outputs) is shared
//! with the AVX2 twin, `super::decode_avx2`, and NEON's (`attention::chunks`).
#![allow(clippy::missing_safety_doc)]

use crate::attention::chunks::{ask_share, drive, ChunkRows};
use crate::attention::portable::softmax_steps;
use crate::attention::types::{Cells, DecodeBuffers, DECODE_CHUNK as CHUNK};
use crate::exp::x86::expf_slice;
use crate::simd::x86::reduce_add_ps16;
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;
use std::arch::x86_64::*;

/// Attention of the `q.len() / head_dim` query heads of one KV head over the visible cells
/// `c < n_cells` of an F16 cache (`supports(head_dim)`); every head gets the bits of
/// `attention::portable::attend_reference`, or with `split` > 0 of ggml's split-KV decode over chunks of
/// `split` cells (`attention::portable::fold`).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub fn attend_decode_group(
    q: &[f32],
    cells: Cells,
    scale: f32,
    split: usize,
    bufs: DecodeBuffers,
    out: &mut [f32],
) {
    let Cells { kv, .. } = cells;
    let heads = q.len() / kv.head_dim;
    let steps = kv.head_dim / 64;
    drive(q, cells, split, bufs, out, |rows, b| {
        // SAFETY: every pointer starts a row of `head_dim` F16 values of `kv`; `drive` checked
        // the head dimension (`supports`) and the buffers' sizes; the caller of
        // `attend_decode_group` checked the CPU features.
        unsafe {
            match steps {
                1 => chunk::<1>(rows, b, heads, scale),
                2 => chunk::<2>(rows, b, heads, scale),
                3 => chunk::<3>(rows, b, heads, scale),
                _ => chunk::<4>(rows, b, heads, scale),
            }
        }
    });
}

/// Both phases over one chunk's key and value rows (head_dim = 64·S); the rows read after it
/// are asked for meanwhile, keys in phase 1, values in phase 2.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn chunk<const S: usize>(rows: &ChunkRows, b: &mut DecodeBuffers, heads: usize, scale: f32) {
    // SAFETY (caller): rows of 64·S F16 values; buffers for `heads` heads.
    unsafe {
        chunk_scores::<S>(rows, b.qf, heads, scale, b.scores);
        chunk_accumulate::<S>(rows.v, rows.ahead_v, b.scores, b.grow, heads, b.acc, b.state);
    }
}

/// 16 F16 values at `p`, widened.
#[inline(always)]
unsafe fn load_ph16(p: *const f16) -> __m512 {
    // SAFETY (caller): 16 F16 values readable at `p`; unaligned load.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

/// Each lane rounded to the nearest F16 (ties to even), as `f16::from_f32`, and widened back.
#[inline(always)]
unsafe fn round_f16(x: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x))
}

/// The 2·S cache lines of a row of 64·S F16 values into L1: phase 1 fetches the chunk's value
/// rows for phase 2 (value rows of a cache page follow its key rows' page elsewhere in memory).
#[inline(always)]
fn prefetch_row<const S: usize>(p: *const f16) {
    prefetch_lines(p as *const u8, 128 * S, CacheLevel::L1);
}

/// Phase 1: `scores[h][i] = (q_h · k_i) · scale` for the chunk's key rows; its value rows
/// (phase 2) are asked for into L1 and the key rows read after it into L2 meanwhile.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn chunk_scores<const S: usize>(rows: &ChunkRows, qf: &[f32], heads: usize, scale: f32, scores: &mut [f32]) {
    let (kr, vr) = (rows.k, rows.v);
    for (i, &kp) in kr.iter().enumerate() {
        prefetch_row::<S>(vr[i]);
        ask_share(rows.ahead_k, 128 * S, i, kr.len());
        let mut k = [[_mm512_setzero_ps(); 4]; S];
        for (s, ks) in k.iter_mut().enumerate() {
            for (j, kj) in ks.iter_mut().enumerate() {
                // SAFETY (caller): `kp` starts a row of 64·S F16 values.
                *kj = unsafe { load_ph16(kp.add(64 * s + 16 * j)) };
            }
        }
        for h in 0..heads {
            let qh = &qf[h * 64 * S..(h + 1) * 64 * S];
            let mut a = [_mm512_setzero_ps(); 4];
            for (s, ks) in k.iter().enumerate() {
                for (j, aj) in a.iter_mut().enumerate() {
                    // SAFETY: 64·s + 16·j + 16 <= 64·S = qh.len(); unaligned load.
                    let qv = unsafe { _mm512_loadu_ps(qh.as_ptr().add(64 * s + 16 * j)) };
                    *aj = _mm512_fmadd_ps(ks[j], qv, *aj);
                }
            }
            let t = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
            scores[h * CHUNK + i] = reduce_add_ps16(t) * scale;
        }
    }
}

/// Phase 2: the online-softmax step of every head for each of the chunk's value rows `vr`,
/// in cell order, with the scores of phase 1 (consumed): [`softmax_steps`] with
/// `exp::x86::expf16`, then cell by cell the accumulators.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn chunk_accumulate<const S: usize>(
    vr: &[*const f16],
    ahead: &[*const f16],
    scores: &mut [f32],
    grow: &mut [u64],
    heads: usize,
    acc: &mut [f32],
    state: &mut [[f32; 2]],
) {
    softmax_steps(scores, grow, &mut state[..heads], vr.len(), |x| expf_slice(x));
    // Heads in groups whose accumulators stay in registers for the whole chunk: with one
    // head at a time each cell would wait on the previous one's rounding (a chain of FMA and
    // two conversions); through memory, on store-to-load forwarding.
    if S > 2 {
        // SAFETY: as this function's contract.
        return unsafe { accumulate_rows::<S>(vr, ahead, scores, grow, heads, acc, state) };
    }
    let mut h = 0;
    while h < heads {
        let left = heads - h;
        // The rows read after this chunk are asked for on the first pass over its cells.
        let ahead = if h == 0 { ahead } else { &[] };
        // SAFETY (all): as this function's contract; h + H <= heads.
        h += match S {
            1 if left >= 4 => unsafe { accumulate_heads::<S, 4>(vr, ahead, scores, grow, h, acc, state) },
            1 | 2 if left >= 3 => unsafe { accumulate_heads::<S, 3>(vr, ahead, scores, grow, h, acc, state) },
            1 | 2 if left >= 2 => unsafe { accumulate_heads::<S, 2>(vr, ahead, scores, grow, h, acc, state) },
            _ => unsafe { accumulate_heads::<S, 1>(vr, ahead, scores, grow, h, acc, state) },
        };
    }
}

/// A row of 64·S F16 values at `vp`, widened.
#[inline(always)]
unsafe fn widen_row<const S: usize>(vp: *const f16) -> [[__m512; 4]; S] {
    let mut v = [[_mm512_setzero_ps(); 4]; S];
    for (s, vs) in v.iter_mut().enumerate() {
        for (j, vj) in vs.iter_mut().enumerate() {
            // SAFETY (caller): `vp` starts a row of 64·S F16 values.
            *vj = unsafe { load_ph16(vp.add(64 * s + 16 * j)) };
        }
    }
    v
}

/// The accumulator updates of every head with the accumulators in memory, cell by cell: for
/// head dimensions whose accumulators and value row do not fit in registers together (a head
/// alone would widen each value row again).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn accumulate_rows<const S: usize>(
    vr: &[*const f16],
    ahead: &[*const f16],
    scores: &[f32],
    grow: &[u64],
    heads: usize,
    acc: &mut [f32],
    state: &mut [[f32; 2]],
) {
    for (i, &vp) in vr.iter().enumerate() {
        ask_share(ahead, 128 * S, i, vr.len());
        // SAFETY (caller): `vp` starts a row of 64·S F16 values.
        let v = unsafe { widen_row::<S>(vp) };
        for (h, st) in state[..heads].iter_mut().enumerate() {
            let e = scores[h * CHUNK + i];
            let (ms, vs) = if grow[h] & (1 << i) != 0 { (e, 1f32) } else { (1f32, e) };
            let a = &mut acc[h * 64 * S..(h + 1) * 64 * S];
            if ms != 1.0 {
                let msv = _mm512_set1_ps(ms);
                for x in 0..4 * S {
                    let p = a.as_mut_ptr().wrapping_add(16 * x);
                    // SAFETY: 16·x + 16 <= a.len(); unaligned load and store.
                    unsafe { _mm512_storeu_ps(p, round_f16(_mm512_mul_ps(_mm512_loadu_ps(p), msv))) };
                }
            }
            let vsv = _mm512_set1_ps(vs);
            for (s, vv) in v.iter().enumerate() {
                for (j, &vj) in vv.iter().enumerate() {
                    let p = a.as_mut_ptr().wrapping_add(64 * s + 16 * j);
                    // SAFETY: 64·s + 16·j + 16 <= a.len(); unaligned load and store.
                    unsafe { _mm512_storeu_ps(p, round_f16(_mm512_fmadd_ps(vj, vsv, _mm512_loadu_ps(p)))) };
                }
            }
            st[1] = st[1].mul_add(ms, vs);
        }
    }
}

/// The accumulator updates of heads `h0..h0 + H` over the chunk's value rows `vr`, given
/// their exponentials (`scores`) and `grow` masks; returns `H`.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn accumulate_heads<const S: usize, const H: usize>(
    vr: &[*const f16],
    ahead: &[*const f16],
    scores: &[f32],
    grow: &[u64],
    h0: usize,
    acc: &mut [f32],
    state: &mut [[f32; 2]],
) -> usize {
    let hd = 64 * S;
    let a = &mut acc[h0 * hd..(h0 + H) * hd];
    // `[H][S][4]` accumulators in registers.
    let mut r = [[[_mm512_setzero_ps(); 4]; S]; H];
    for (h, rh) in r.iter_mut().enumerate() {
        for (s, rs) in rh.iter_mut().enumerate() {
            for (j, rj) in rs.iter_mut().enumerate() {
                // SAFETY: h·hd + 64·s + 16·j + 16 <= H·hd = a.len().
                *rj = unsafe { _mm512_loadu_ps(a.as_ptr().add(h * hd + 64 * s + 16 * j)) };
            }
        }
    }
    let mut sums = [0f32; H];
    for (h, sum) in sums.iter_mut().enumerate() {
        *sum = state[h0 + h][1];
    }
    for (i, &vp) in vr.iter().enumerate() {
        ask_share(ahead, 128 * S, i, vr.len());
        // SAFETY (caller): `vp` starts a row of 64·S F16 values.
        let v = unsafe { widen_row::<S>(vp) };
        #[allow(clippy::needless_range_loop)] // constant bounds: fully unrolled, in registers
        for h in 0..H {
            let e = scores[(h0 + h) * CHUNK + i];
            let (ms, vs) = if grow[h0 + h] & (1 << i) != 0 { (e, 1f32) } else { (1f32, e) };
            // Skipping the rescale when `ms` is 1 changes no bits (an F16 value times 1 is itself).
            if ms != 1.0 {
                let msv = _mm512_set1_ps(ms);
                for s in 0..S {
                    for j in 0..4 {
                        // SAFETY: register arithmetic.
                        r[h][s][j] = unsafe { round_f16(_mm512_mul_ps(r[h][s][j], msv)) };
                    }
                }
            }
            let vsv = _mm512_set1_ps(vs);
            for s in 0..S {
                for j in 0..4 {
                    // SAFETY: register arithmetic.
                    r[h][s][j] = unsafe { round_f16(_mm512_fmadd_ps(v[s][j], vsv, r[h][s][j])) };
                }
            }
            sums[h] = sums[h].mul_add(ms, vs);
        }
    }
    for (h, rh) in r.iter().enumerate() {
        state[h0 + h][1] = sums[h];
        for (s, rs) in rh.iter().enumerate() {
            for (j, &rj) in rs.iter().enumerate() {
                // SAFETY: as the loads above.
                unsafe { _mm512_storeu_ps(a.as_mut_ptr().add(h * hd + 64 * s + 16 * j), rj) };
            }
        }
    }
    H
}
