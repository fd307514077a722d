//! Decode attention with AVX-512: ggml's `one_chunk` F16 path (the reference kernel of
//! `attention::portable::attend_reference`) for the query heads of one GQA group, in two phases per chunk of
//! [`CHUNK`] visible cells, bit-identical per head to the portable kernel:
//!
//! 1. **Scores.** Head dimension 64: `KEYS` key rows at a time are widened once into an
//!    f32 buffer and dotted with every head's F16-rounded query in ggml's order — four 16-lane
//!    accumulators, folded (0+2)+(1+3) —, then the 16 keys' lanes reduced together across
//!    registers (`reduce16`), each key's sum the additions of GCC's `_mm512_reduce_add_ps` in
//!    its order. Head dimensions of 128 and more (64·S): each key row widened into registers
//!    and every head's sum reduced on its own (`chunk_scores_rows`).
//! 2. **Online softmax.** Per head the running maximum before each cell of the chunk as a
//!    16-lane prefix scan and all its exponentials at once (`softmax_step16`, glibc's `expf`
//!    on 16 lanes, `exp::x86`), then per cell the accumulator updated
//!    `acc = f16(v · vs + f16(acc · ms))` exactly as ggml's `VKQ16`; the accumulator lives as
//!    f32 values that F16 represents exactly, rounded through `vcvtps2ph`/`vcvtph2ps` in
//!    registers instead of being stored as F16 and converted back. That rounding pair with its
//!    FMA (3.3 cycles per 16 lanes on Zen 4) is most of what is left per cell.
//!    `AttnKernel::Wide` (const `R` false) leaves the pair out: `acc = v · vs + acc · ms` in
//!    F32. Zen 4, SmolLM2's 3 heads, 144 cells, one thread, best of six: 7.0 → 5.3 ns per
//!    (head, cell) in L2, 10.2 → 8.2 from memory; Gemma 3's 4 heads of 256 (accumulators in
//!    memory) 25.9 → 24.8.
//!
//! Per (head, cell) on Zen 4 (SmolLM2's 3 heads per KV head, 512 cells in L2, one thread),
//! each part timed alone: gathering 4, scores 12, softmax 3 (11 as a scalar loop),
//! accumulators 18 cycles. Together they overlap (the scalar loop ran beside the
//! accumulators' conversions): the kernel takes 39 cycles, 40 with per-key reductions and
//! the scalar loop.
//!
//! Heads are independent, so running them cell by cell instead of head by head changes no
//! bits; the scores of a chunk do not depend on the softmax state, so computing them first
//! changes none either. `drive` (gathering a chunk's rows, normalising the outputs) is shared
//! with the AVX2 twin, `super::decode_avx2`, and NEON's (`attention::chunks`).
#![allow(clippy::missing_safety_doc)]

use crate::attention::Scale;
use crate::attention::chunks::{ask_share, drive, ChunkRows};
use crate::attention::types::{Cells, DecodeBuffers, DECODE_CHUNK as CHUNK, DECODE_KEYS as KEYS};
use crate::exp::x86::expf16;
use crate::simd::x86::reduce_add_ps16;
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;
use std::arch::x86_64::*;

/// Attention of the `q.len() / head_dim` query heads of one KV head over the visible cells
/// `c < n_cells` of an F16 cache (`supports(head_dim)`); every head gets the bits of
/// `attention::portable::attend_reference`, or with `split` > 0 of ggml's split-KV decode over chunks of
/// `split` cells (`attention::portable::fold`).
/// `R`: each value accumulator rounded to F16 after every cell (ggml's `one_chunk`); else
/// kept in F32 (`AttnKernel::Wide`).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
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
        // SAFETY: every pointer starts a row of `head_dim` F16 values of `kv`; `drive` checked
        // the head dimension (`supports`) and the buffers' sizes; the caller of
        // `attend_decode_group` checked the CPU features.
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

/// Both phases over one chunk's key and value rows (head_dim = 64·S); the rows read after it
/// are asked for meanwhile, keys in phase 1, values in phase 2.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn chunk<const S: usize, const R: bool>(rows: &ChunkRows, b: &mut DecodeBuffers, heads: usize, scale: Scale) {
    // SAFETY (caller): rows of 64·S F16 values; buffers for `heads` heads.
    unsafe {
        if S == 1 {
            chunk_scores::<S>(rows, b.qf, heads, scale, b.keys, b.scores);
        } else {
            chunk_scores_rows::<S>(rows, b.qf, heads, scale, b.scores);
        }
        chunk_accumulate::<S, R>(rows.v, rows.ahead_v, b.scores, b.grow, heads, b.acc, b.state);
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

/// An accumulator's new value as the kernel keeps it: rounded to F16 (`R`, ggml's `one_chunk`)
/// or left in F32 (`AttnKernel::Wide`).
#[inline(always)]
unsafe fn keep<const R: bool>(x: __m512) -> __m512 {
    if R {
        // SAFETY (caller): AVX-512 F present.
        unsafe { round_f16(x) }
    } else {
        x
    }
}

/// The 2·S cache lines of a row of 64·S F16 values into L1: phase 1 fetches the chunk's value
/// rows for phase 2 (value rows of a cache page follow its key rows' page elsewhere in memory).
#[inline(always)]
fn prefetch_row<const S: usize>(p: *const f16) {
    prefetch_lines(p as *const u8, 128 * S, CacheLevel::L1);
}

/// Position `p` of [`reduce16`]'s inputs holds key `ORDER[p]` of the group, so that its output
/// lanes come in key order (the reduction leaves input `c + 4l` in lane `4c + l`).
const ORDER: [usize; KEYS] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// Phase 1: `scores[h][i] = (q_h · k_i) · scale` for the chunk's key rows, [`KEYS`] at a time:
/// the group's rows widened once into `keys`, then per head their 16 dot products reduced
/// together ([`reduce16`]: three additions and two shuffles per key fewer than a horizontal
/// sum each). Its value rows (phase 2) are asked for into L1 and the key rows read after it
/// into L2 meanwhile.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn chunk_scores<const S: usize>(rows: &ChunkRows, qf: &[f32], heads: usize, scale: Scale, keys: &mut [f32], scores: &mut [f32]) {
    let (kr, vr) = (rows.k, rows.v);
    let (n, hd) = (kr.len(), 64 * S);
    assert!(keys.len() >= KEYS * hd && qf.len() >= heads * hd && scores.len() >= heads * CHUNK && n <= CHUNK);
    let sv = _mm512_set1_ps(scale.mul);
    for g in (0..n).step_by(KEYS) {
        let m = (n - g).min(KEYS);
        for (i, &kp) in kr[g..g + m].iter().enumerate() {
            prefetch_row::<S>(vr[g + i]);
            ask_share(rows.ahead_k, 128 * S, g + i, n);
            for x in 0..4 * S {
                // SAFETY: `kp` starts a row of 64·S F16 values (caller); (i + 1)·hd <= keys.len().
                unsafe { _mm512_storeu_ps(keys.as_mut_ptr().add(i * hd + 16 * x), load_ph16(kp.add(16 * x))) };
            }
        }
        for h in 0..heads {
            let mut q = [[_mm512_setzero_ps(); 4]; S];
            for (s, qs) in q.iter_mut().enumerate() {
                for (j, qj) in qs.iter_mut().enumerate() {
                    // SAFETY: h·hd + 64·s + 16·j + 16 <= heads·hd <= qf.len() (asserted).
                    *qj = unsafe { _mm512_loadu_ps(qf.as_ptr().add(h * hd + 64 * s + 16 * j)) };
                }
            }
            // SAFETY: rows `ORDER[p] < m` of `keys` were written above.
            let t = |p: usize| if ORDER[p] < m { unsafe { dot_lanes::<S>(keys.as_ptr().add(ORDER[p] * hd), &q) } } else { _mm512_setzero_ps() };
            let f = _mm512_mul_ps(reduce16(t), sv);
            // SAFETY: h·CHUNK + g + m <= heads·CHUNK <= scores.len() (asserted); masked store.
            unsafe { _mm512_mask_storeu_ps(scores.as_mut_ptr().add(h * CHUNK + g), first_lanes(m), f) };
            scale.cap(&mut scores[h * CHUNK + g..h * CHUNK + g + m]);
        }
    }
}

/// Phase 1 for head dimensions of 128 and more (S >= 2): each key row widened once into
/// registers and dotted with every head, each sum reduced on its own. There a key's dot
/// product outweighs its reduction, and the 16-key buffer of [`chunk_scores`] (64·S floats
/// per key) would cost more than the reductions it saves, competing in L1 with the value rows
/// asked for (Zen 4, 512 cells in L2, one thread: head dimension 128 with 2 heads 19.3 against
/// 21.1 ns per (head, cell), 256 with 4 heads 26.6 against 35.3).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn chunk_scores_rows<const S: usize>(rows: &ChunkRows, qf: &[f32], heads: usize, scale: Scale, scores: &mut [f32]) {
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
            scores[h * CHUNK + i] = scale.score(reduce_add_ps16(t));
        }
    }
}

/// The 16 lanes of `k · q` before their horizontal sum, in ggml's order: four accumulators over
/// the 64-value steps, folded `(0+2) + (1+3)`.
#[inline(always)]
unsafe fn dot_lanes<const S: usize>(k: *const f32, q: &[[__m512; 4]; S]) -> __m512 {
    let mut a = [_mm512_setzero_ps(); 4];
    for (s, qs) in q.iter().enumerate() {
        for (j, aj) in a.iter_mut().enumerate() {
            // SAFETY (caller): 64·S f32 readable at `k`; unaligned load.
            *aj = _mm512_fmadd_ps(unsafe { _mm512_loadu_ps(k.add(64 * s + 16 * j)) }, qs[j], *aj);
        }
    }
    _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]))
}

/// Sixteen horizontal sums at once: lane `4c + l` of the result is `t(c + 4l)` summed as
/// `reduce_add_ps16` sums it (high half + low half, then high quarter + low quarter, then lanes
/// `(0+2) + (1+3)`), the same additions of the same operands in the same order.
#[inline(always)]
unsafe fn reduce16(t: impl Fn(usize) -> __m512) -> __m512 {
    // Halves: lanes 0..8 of `u[p]` are input 2p's, 8..16 input 2p + 1's, each `hi + lo`.
    let halves = |a: __m512, b: __m512| {
        _mm512_add_ps(_mm512_shuffle_f32x4::<0xEE>(a, b), _mm512_shuffle_f32x4::<0x44>(a, b))
    };
    let u: [__m512; 8] = std::array::from_fn(|p| halves(t(2 * p), t(2 * p + 1)));
    // Quarters: 128-bit chunk c of `w[r]` is input 4r + c's four sums `hi + lo`.
    let quarters = |a: __m512, b: __m512| {
        _mm512_add_ps(_mm512_shuffle_f32x4::<0xDD>(a, b), _mm512_shuffle_f32x4::<0x88>(a, b))
    };
    let w = [quarters(u[0], u[1]), quarters(u[2], u[3]), quarters(u[4], u[5]), quarters(u[6], u[7])];
    // Lanes (0+2), (1+3): chunk c of `z[r]` holds inputs 8r + c and 8r + 4 + c, two lanes each.
    let pairs = |a: __m512, b: __m512| _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xEE>(a, b));
    let z = [pairs(w[0], w[1]), pairs(w[2], w[3])];
    // Then (0+2) + (1+3): chunk c holds inputs c, 4 + c, 8 + c, 12 + c.
    _mm512_add_ps(_mm512_shuffle_ps::<0x88>(z[0], z[1]), _mm512_shuffle_ps::<0xDD>(z[0], z[1]))
}

/// Phase 2: the online-softmax step of every head for each of the chunk's value rows `vr`,
/// in cell order, with the scores of phase 1 (consumed): [`softmax_step16`] per head, then
/// cell by cell the accumulators.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn chunk_accumulate<const S: usize, const R: bool>(
    vr: &[*const f16],
    ahead: &[*const f16],
    scores: &mut [f32],
    grow: &mut [u64],
    heads: usize,
    acc: &mut [f32],
    state: &mut [[f32; 2]],
) {
    for ((st, g), sc) in state[..heads].iter_mut().zip(grow.iter_mut()).zip(scores.chunks_exact_mut(CHUNK)) {
        // SAFETY: the caller checked the CPU features.
        *g = unsafe { softmax_step16(&mut sc[..vr.len()], st) };
    }
    // Heads in groups whose accumulators stay in registers for the whole chunk: with one
    // head at a time each cell would wait on the previous one's rounding (a chain of FMA and
    // two conversions); through memory, on store-to-load forwarding.
    if S > 2 {
        // SAFETY: as this function's contract.
        return unsafe { accumulate_rows::<S, R>(vr, ahead, scores, grow, heads, acc, state) };
    }
    let mut h = 0;
    while h < heads {
        let left = heads - h;
        // The rows read after this chunk are asked for on the first pass over its cells.
        let ahead = if h == 0 { ahead } else { &[] };
        // SAFETY (all): as this function's contract; h + H <= heads.
        h += match S {
            1 if left >= 4 => unsafe { accumulate_heads::<S, 4, R>(vr, ahead, scores, grow, h, acc, state) },
            1 | 2 if left >= 3 => unsafe { accumulate_heads::<S, 3, R>(vr, ahead, scores, grow, h, acc, state) },
            1 | 2 if left >= 2 => unsafe { accumulate_heads::<S, 2, R>(vr, ahead, scores, grow, h, acc, state) },
            _ => unsafe { accumulate_heads::<S, 1, R>(vr, ahead, scores, grow, h, acc, state) },
        };
    }
}

/// One head's online-softmax step over a chunk's scores (`attention::portable::softmax_step`,
/// the same values): the running maximum before each cell as a 16-lane prefix scan, a lane
/// replacing the maximum only where strictly greater, as the scalar loop does, so every lane
/// sees the maximum the loop would (ties keep the earlier value, its zero sign included);
/// then `m - s` where a cell raises it and `s - m` elsewhere, and `expf` (glibc's) of each.
/// Returns the grow mask. A NaN score (which the scan, unlike the loop, may carry as the
/// maximum) makes its exponential NaN in both, and with it the head's accumulator and sum
/// for good, so the outputs agree: NaN.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn softmax_step16(sc: &mut [f32], st: &mut [f32; 2]) -> u64 {
    let n = sc.len();
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut m = _mm512_set1_ps(st[0]);
    let mut g = 0u64;
    for b in (0..n).step_by(16) {
        let k = (n - b).min(16);
        let mask = first_lanes(k);
        // SAFETY: lanes b..b + k of `sc` (masked load; the rest -∞, which raises no maximum).
        let s = unsafe { _mm512_mask_loadu_ps(ninf, mask, sc.as_ptr().add(b)) };
        // Inclusive prefix maximum: `max_ps(later, earlier)` keeps the earlier unless the later
        // is strictly greater, which makes the scan associative.
        let mut p = s;
        p = _mm512_max_ps(p, _mm512_castsi512_ps(_mm512_alignr_epi32::<15>(_mm512_castps_si512(p), _mm512_castps_si512(ninf))));
        p = _mm512_max_ps(p, _mm512_castsi512_ps(_mm512_alignr_epi32::<14>(_mm512_castps_si512(p), _mm512_castps_si512(ninf))));
        p = _mm512_max_ps(p, _mm512_castsi512_ps(_mm512_alignr_epi32::<12>(_mm512_castps_si512(p), _mm512_castps_si512(ninf))));
        p = _mm512_max_ps(p, _mm512_castsi512_ps(_mm512_alignr_epi32::<8>(_mm512_castps_si512(p), _mm512_castps_si512(ninf))));
        let pm = _mm512_max_ps(p, m);
        // The maximum before each lane: the carry for lane 0, the prefix up to the lane before.
        let before = _mm512_castsi512_ps(_mm512_alignr_epi32::<15>(_mm512_castps_si512(pm), _mm512_castps_si512(m)));
        let up = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(s, before) & mask;
        // Lanes past the chunk exponentiate 0, not -∞ (glibc's slow path).
        let x = _mm512_maskz_mov_ps(mask, _mm512_mask_sub_ps(_mm512_sub_ps(s, before), up, before, s));
        // SAFETY: as the load.
        unsafe { _mm512_mask_storeu_ps(sc.as_mut_ptr().add(b), mask, expf16(x)) };
        g |= (up as u64) << b;
        m = _mm512_permutexvar_ps(_mm512_set1_epi32(15), pm);
    }
    st[0] = _mm512_cvtss_f32(m);
    g
}

/// The mask of the first `k` (at most 16) lanes.
#[inline(always)]
fn first_lanes(k: usize) -> __mmask16 {
    ((1u32 << k) - 1) as __mmask16
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
unsafe fn accumulate_rows<const S: usize, const R: bool>(
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
                    unsafe { _mm512_storeu_ps(p, keep::<R>(_mm512_mul_ps(_mm512_loadu_ps(p), msv))) };
                }
            }
            let vsv = _mm512_set1_ps(vs);
            for (s, vv) in v.iter().enumerate() {
                for (j, &vj) in vv.iter().enumerate() {
                    let p = a.as_mut_ptr().wrapping_add(64 * s + 16 * j);
                    // SAFETY: 64·s + 16·j + 16 <= a.len(); unaligned load and store.
                    unsafe { _mm512_storeu_ps(p, keep::<R>(_mm512_fmadd_ps(vj, vsv, _mm512_loadu_ps(p)))) };
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
unsafe fn accumulate_heads<const S: usize, const H: usize, const R: bool>(
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
                        r[h][s][j] = unsafe { keep::<R>(_mm512_mul_ps(r[h][s][j], msv)) };
                    }
                }
            }
            let vsv = _mm512_set1_ps(vs);
            for s in 0..S {
                for j in 0..4 {
                    // SAFETY: register arithmetic.
                    r[h][s][j] = unsafe { keep::<R>(_mm512_fmadd_ps(v[s][j], vsv, r[h][s][j])) };
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
