//! Decode attention with NEON: ggml's `one_chunk` F16 path (`attention::portable::attend_reference`)
//! for the query heads of one GQA group, two phases per chunk of [`CHUNK`] visible cells as in
//! `x86::decode`, bit-identical per head to the portable kernel:
//!
//! 1. **Scores.** ggml's F16 dot order (four 16-lane accumulators over 64-value steps, folded
//!    (0+2)+(1+3), the 16 lanes reduced as `simd::reduce_add_16`) taken one quarter at a time:
//!    quarter `l` of every accumulator is lanes `4l..4l + 4`, which only ever meet lanes of the
//!    same quarter until the final reduction. So per key row and quarter the `4·S` key vectors
//!    are widened once and every head's quarter sums are computed from them in registers.
//! 2. **Online softmax.** [`softmax_steps`] with libm's `expf` (`f32::exp`, what the portable
//!    kernel calls), then per cell the accumulators updated `acc = f16(v · vs + f16(acc · ms))`,
//!    the value row widened once per 64-value step for all heads, each accumulator rounded
//!    through `fcvtn`/`fcvtl` in registers — or, for `AttnKernel::Wide`, kept in F32.
#![allow(clippy::missing_safety_doc)]
// Register arrays are indexed in plain loops with constant bounds (fully unrolled).
#![allow(clippy::needless_range_loop)]

use crate::attention::Scale;
use crate::attention::chunks::{ask_share, drive, ChunkRows};
use crate::attention::portable::softmax_steps;
use crate::attention::types::{Cells, DecodeBuffers, DECODE_CHUNK as CHUNK};
use crate::simd::aarch64::{load_f16x4, load_f16x8, reduce_add_16x4, round_f16x4};
use half::f16;
use std::arch::aarch64::*;

/// Heads whose quarter sums phase 1 keeps at once (more are taken in groups).
const HEADS: usize = 16;

/// Attention of the `q.len() / head_dim` query heads of one KV head over the visible cells
/// `c < n_cells` of an F16 cache (`chunks::supports(head_dim)`); every head gets the bits of
/// `attention::portable::attend_reference`, or with `split` > 0 of ggml's split-KV decode.
/// `R`: each value accumulator rounded to F16 after every cell (ggml's `one_chunk`); else
/// kept in F32 (`AttnKernel::Wide`).
pub fn attend_decode_group<const R: bool>(
    q: &[f32],
    cells: Cells,
    scale: Scale,
    split: usize,
    bufs: DecodeBuffers,
    out: &mut [f32],
) {
    let Cells { kv, .. } = cells;
    let heads = q.len() / kv.head_dim;
    let steps = kv.head_dim / 64;
    drive(q, cells, split, bufs, out, |rows, b| {
        // SAFETY: every pointer starts a row of `head_dim` = 64·S F16 values of `kv`; `drive`
        // checked the head dimension (`supports`) and the buffers' sizes.
        unsafe {
            match steps {
                1 => chunk::<1, R>(rows, b, heads, scale),
                2 => chunk::<2, R>(rows, b, heads, scale),
                3 => chunk::<3, R>(rows, b, heads, scale),
                _ => chunk::<4, R>(rows, b, heads, scale),
            }
        }
    });
}

/// An accumulator's new value as the kernel keeps it: rounded to F16 (`R`, ggml's `one_chunk`)
/// or left in F32 (`AttnKernel::Wide`).
#[inline(always)]
fn keep<const R: bool>(x: float32x4_t) -> float32x4_t {
    if R {
        round_f16x4(x)
    } else {
        x
    }
}

/// Both phases over one chunk's key and value rows (head_dim = 64·S); the rows read after it
/// are asked for during phase 1.
#[inline]
unsafe fn chunk<const S: usize, const R: bool>(rows: &ChunkRows, b: &mut DecodeBuffers, heads: usize, scale: Scale) {
    let vr = rows.v;
    // SAFETY (caller): rows of 64·S F16 values; buffers for `heads` heads.
    unsafe { chunk_scores::<S>(rows, b.qf, heads, scale, b.scores) };
    softmax_steps(b.scores, b.grow, &mut b.state[..heads], vr.len(), |x| x.iter_mut().for_each(|e| *e = e.exp()));
    // SAFETY: as above.
    unsafe { chunk_accumulate::<S, R>(vr, b.scores, b.grow, heads, b.acc, b.state) };
}

/// Phase 1: `scores[h][i] = (q_h · k_i) · scale` for the chunk's key rows; the rows read
/// after the chunk are asked for meanwhile.
#[inline]
unsafe fn chunk_scores<const S: usize>(rows: &ChunkRows, qf: &[f32], heads: usize, scale: Scale, scores: &mut [f32]) {
    let (hd, kr) = (64 * S, rows.k);
    assert!(qf.len() >= heads * hd && scores.len() >= heads * CHUNK);
    let zero = vdupq_n_f32(0.0);
    // Per head of the group, the folded quarters `(a0 + a2) + (a1 + a3)`: 16 lanes.
    let mut t = [[zero; 4]; HEADS];
    for (i, &kp) in kr.iter().enumerate() {
        ask_share(rows.ahead_k, 2 * hd, i, kr.len());
        ask_share(rows.ahead_v, 2 * hd, i, kr.len());
        for h0 in (0..heads).step_by(HEADS) {
            let nh = (heads - h0).min(HEADS);
            for l in 0..4 {
                // Quarter l of accumulator j over step s reads values 64s + 16j + 4l.. + 4.
                let mut k = [[zero; 4]; S];
                for s in 0..S {
                    for j in 0..4 {
                        // SAFETY (caller): `kp` starts a row of 64·S F16 values.
                        k[s][j] = unsafe { load_f16x4(kp.add(64 * s + 16 * j + 4 * l)) };
                    }
                }
                for h in 0..nh {
                    let qh = qf[(h0 + h) * hd..(h0 + h + 1) * hd].as_ptr();
                    let mut a = [zero; 4];
                    for s in 0..S {
                        for j in 0..4 {
                            // SAFETY: 64s + 16j + 4l + 4 <= hd = the head's query length.
                            a[j] = unsafe { vfmaq_f32(a[j], k[s][j], vld1q_f32(qh.add(64 * s + 16 * j + 4 * l))) };
                        }
                    }
                    // SAFETY: register arithmetic.
                    t[h][l] = unsafe { vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3])) };
                }
            }
            for h in 0..nh {
                scores[(h0 + h) * CHUNK + i] = scale.score(reduce_add_16x4(t[h]));
            }
        }
    }
}

/// Phase 2: per value row of the chunk, in cell order, every head's accumulator update with
/// the exponentials of phase 1 (`scores`) and the cells that raise each maximum (`grow`).
#[inline]
unsafe fn chunk_accumulate<const S: usize, const R: bool>(vr: &[*const f16], scores: &[f32], grow: &[u64], heads: usize, acc: &mut [f32], state: &mut [[f32; 2]]) {
    let hd = 64 * S;
    assert!(acc.len() >= heads * hd && state.len() >= heads);
    let steps = |h: usize, i: usize| {
        let e = scores[h * CHUNK + i];
        if grow[h] & (1 << i) != 0 {
            (e, 1f32)
        } else {
            (1f32, e)
        }
    };
    for (i, &vp) in vr.iter().enumerate() {
        for s in 0..S {
            // SAFETY: register moves.
            let mut v = [unsafe { vdupq_n_f32(0.0) }; 16];
            for x in 0..8 {
                // SAFETY (caller): `vp` starts a row of 64·S F16 values.
                [v[2 * x], v[2 * x + 1]] = unsafe { load_f16x8(vp.add(64 * s + 8 * x)) };
            }
            for h in 0..heads {
                let (ms, vs) = steps(h, i);
                let a = acc[h * hd + 64 * s..h * hd + 64 * (s + 1)].as_mut_ptr();
                // SAFETY (block): 16 vectors of 4 f32 in the head's 64-value step; register
                // arithmetic otherwise.
                unsafe {
                    let vsv = vdupq_n_f32(vs);
                    // Skipping the rescale when `ms` is 1 changes no bits (an F16 value times 1
                    // is itself).
                    if ms != 1.0 {
                        let msv = vdupq_n_f32(ms);
                        for x in 0..16 {
                            let r = keep::<R>(vmulq_f32(vld1q_f32(a.add(4 * x)), msv));
                            vst1q_f32(a.add(4 * x), keep::<R>(vfmaq_f32(r, v[x], vsv)));
                        }
                    } else {
                        for x in 0..16 {
                            vst1q_f32(a.add(4 * x), keep::<R>(vfmaq_f32(vld1q_f32(a.add(4 * x)), v[x], vsv)));
                        }
                    }
                }
            }
        }
        for (h, st) in state[..heads].iter_mut().enumerate() {
            let (ms, vs) = steps(h, i);
            st[1] = st[1].mul_add(ms, vs);
        }
    }
}
