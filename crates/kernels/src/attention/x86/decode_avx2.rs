//! The two-phase decode attention of [`super::decode`] with AVX2, for CPUs without
//! AVX-512: the same driver and softmax steps, 8-lane phases. Phase 1 scores [`KEYS`] key rows
//! at a time in ggml's order — its four 16-lane accumulators as eight 8-lane halves, folded in
//! registers —, then reduces the eight keys' vectors together ([`reduce8`]: 21 shuffles and
//! additions where a horizontal sum per key took six and a scalar store). For head dimension
//! 64 each key row is widened into registers and dotted there with every head's query
//! ([`fold64`]); larger head dimensions widen the rows once into an f32 buffer and dot each
//! with every head from it ([`fold`]). Phase 2 takes the exponentials from
//! [`softmax_step8`] (a prefix-scan maximum, `exp::x86::expf8`) and, for head dimension 64, updates each head's F16-rounded
//! accumulators in registers over the chunk's value rows, widened once for all the group's
//! heads ([`accumulate_head64`]); other head dimensions update them in memory, each value row
//! widened once. Bit-identical per head to `attention::portable::attend_reference`.
//!
//! SmolLM2's 3 heads per KV head, one thread, 144–2048 cells in cache, on the 2-core AVX2 VM:
//! 51–52 ns per (head, cell) with a horizontal sum per key and each value row widened per
//! head; 48–50 with the keys reduced together; 42–44 with the values widened once too.
//! On Zen 4 (the `--isa avx2` table; `scripts/gemm_bench`'s `attn`, 3 heads, 150 cells, one
//! thread): 16.6–17.9 ns per (head, cell) in L2, 19.1 from memory, with the keys widened into
//! the buffer and read back per head (16 loads per head and key: phase 1 took 23 cycles per
//! (head, cell)); 12.4–12.7 and 14.8 with the row in registers ([`fold64`]). Of the 12.4 ns,
//! phase 2 takes 6 (22 cycles; 8 chains of an FMA and the F16 rounding pair, whose latency is
//! 14 cycles and throughput 1.15 per vector there) — running two or three heads' chains
//! interleaved on half rows instead measured no faster (12.7–13.9: the accumulators spill) —
//! the softmax with its exponentials 2, gathering the rows 1.4. `AttnKernel::Wide` (const `R`
//! false) drops the rounding pair, each chain an FMA's latency: 11.3–14.5 → 8.4 ns in L2,
//! 14.0–16.9 → 10.6–11.1 from memory (Zen 4, `--isa avx2`, 144 cells); 4 heads of 256 (in
//! memory) 45.2 → 42.5.
#![allow(clippy::missing_safety_doc)]

use crate::attention::Scale;
use crate::attention::chunks::{ask_share, drive};
use crate::attention::types::{Cells, DecodeBuffers, DECODE_CHUNK};
use crate::exp::x86::expf8;
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;
use std::arch::x86_64::*;

/// Key rows scored together: widened once into `DecodeBuffers::keys`, their sums reduced
/// across registers ([`reduce8`]).
const KEYS: usize = 8;
const _: () = assert!(KEYS <= crate::attention::types::DECODE_KEYS && DECODE_CHUNK.is_multiple_of(KEYS));

/// Attention of the `q.len() / head_dim` query heads of one KV head over the visible cells
/// `c < n_cells` of an F16 cache (`chunks::supports(head_dim)`).
/// `R`: each value accumulator rounded to F16 after every cell (ggml's `one_chunk`); else
/// kept in F32 (`AttnKernel::Wide`).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn attend_decode_group_avx2<const R: bool>(
    q: &[f32],
    cells: Cells,
    scale: Scale,
    split: usize,
    bufs: DecodeBuffers,
    out: &mut [f32],
) {
    let Cells { kv, .. } = cells;
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    assert!(bufs.keys.len() >= KEYS * hd, "room for {KEYS} widened key rows");
    assert!(hd != 64 || bufs.v32.len() >= DECODE_CHUNK * 64, "room for a chunk's value rows");
    // Head dimension 64: each key row widened into registers and dotted with every head there
    // ([`fold64`]); the folded vectors of up to `keys.len() / (KEYS · 8)` heads kept in `keys`.
    let in_registers = hd == 64 && heads * KEYS * 8 <= bufs.keys.len();
    drive(q, cells, split, bufs, out, |rows, b| {
        let (kr, vr) = (rows.k, rows.v);
        for g in (0..kr.len()).step_by(KEYS) {
            let m = (kr.len() - g).min(KEYS);
            if in_registers {
                for (i, &kp) in kr[g..g + m].iter().enumerate() {
                    // As below: the value row into L1, the rows read after this chunk into L2.
                    prefetch_lines(vr[g + i] as *const u8, 128, CacheLevel::L1);
                    ask_share(rows.ahead_k, 128, g + i, kr.len());
                    ask_share(rows.ahead_v, 128, g + i, kr.len());
                    // SAFETY: `kp` starts a row of 64 F16 values; `qf` holds `heads` rows of 64
                    // and `keys` room for `heads · KEYS` vectors (`in_registers`).
                    unsafe { fold64(kp, &b.qf[..heads * 64], i, &mut b.keys[..heads * KEYS * 8]) };
                }
                for h in 0..heads {
                    let t: &[f32] = &b.keys[h * KEYS * 8..(h + 1) * KEYS * 8];
                    // The keys past `m` are zeros, their scores not stored.
                    // SAFETY: 8i + 8 <= KEYS · 8 = t.len(); unaligned load.
                    let t: [__m256; KEYS] = std::array::from_fn(|i| if i < m { unsafe { _mm256_loadu_ps(t.as_ptr().add(8 * i)) } } else { _mm256_setzero_ps() });
                    store_scores(_mm256_mul_ps(reduce8(&t), _mm256_set1_ps(scale.mul)), &mut b.scores[h * DECODE_CHUNK + g..h * DECODE_CHUNK + g + m]);
                    scale.cap(&mut b.scores[h * DECODE_CHUNK + g..h * DECODE_CHUNK + g + m]);
                }
                continue;
            }
            for (i, &kp) in kr[g..g + m].iter().enumerate() {
                // Value row g + i into L1 for phase 2 (asked for into L2 a chunk earlier); the
                // rows read after this chunk into L2.
                prefetch_lines(vr[g + i] as *const u8, 2 * hd, CacheLevel::L1);
                ask_share(rows.ahead_k, 2 * hd, g + i, kr.len());
                ask_share(rows.ahead_v, 2 * hd, g + i, kr.len());
                // SAFETY: `kp` starts a row of `hd` F16 values; `keys` holds KEYS rows of `hd`
                // (asserted above).
                unsafe { widen(kp, &mut b.keys[i * hd..(i + 1) * hd]) };
            }
            for h in 0..heads {
                let qh = &b.qf[h * hd..(h + 1) * hd];
                // Each key's eight accumulators folded to one vector, the group's vectors then
                // reduced together; the keys past `m` are zeros, their scores not stored.
                let mut t = [_mm256_setzero_ps(); KEYS];
                for (i, ti) in t.iter_mut().enumerate().take(m) {
                    *ti = fold(&b.keys[i * hd..(i + 1) * hd], qh);
                }
                store_scores(_mm256_mul_ps(reduce8(&t), _mm256_set1_ps(scale.mul)), &mut b.scores[h * DECODE_CHUNK + g..h * DECODE_CHUNK + g + m]);
                    scale.cap(&mut b.scores[h * DECODE_CHUNK + g..h * DECODE_CHUNK + g + m]);
            }
        }
        for ((st, g), sc) in b.state[..heads].iter_mut().zip(b.grow.iter_mut()).zip(b.scores.chunks_exact_mut(DECODE_CHUNK)) {
            // SAFETY: this function's features.
            *g = unsafe { softmax_step8(&mut sc[..vr.len()], st) };
        }
        if hd == 64 {
            // With more than one head, the chunk's value rows widened once into `v32` for all
            // of them; one head converts as it reads.
            let wide = heads > 1;
            if wide {
                for (i, &vp) in vr.iter().enumerate() {
                    // SAFETY: `vp` starts a row of 64 F16 values; v32 holds a chunk's rows
                    // (asserted above).
                    unsafe { widen(vp, &mut b.v32[i * 64..(i + 1) * 64]) };
                }
            }
            for (h, st) in b.state[..heads].iter_mut().enumerate() {
                let (e, acc) = (&b.scores[h * DECODE_CHUNK..(h + 1) * DECODE_CHUNK], &mut b.acc[h * 64..(h + 1) * 64]);
                // SAFETY: every `vr` pointer starts a row of 64 F16 values, and with `wide`
                // v32 holds them widened; the head's scores cover the chunk's cells and its
                // accumulator holds 64 values.
                unsafe {
                    let v32 = b.v32.as_ptr();
                    let (from32, from16) = (|i, j| _mm256_loadu_ps(v32.add(64 * i + 8 * j)), |i: usize, j| _mm256_cvtph_ps(_mm_loadu_si128(vr[i].add(8 * j) as *const __m128i)));
                    if wide {
                        accumulate_head64::<R>(vr.len(), from32, e, b.grow[h], acc, &mut st[1])
                    } else {
                        accumulate_head64::<R>(vr.len(), from16, e, b.grow[h], acc, &mut st[1])
                    }
                }
            }
            return;
        }
        for (i, &vp) in vr.iter().enumerate() {
            // SAFETY: as for the keys.
            unsafe { widen(vp, &mut b.v32[..hd]) };
            for (h, st) in b.state[..heads].iter_mut().enumerate() {
                let e = b.scores[h * DECODE_CHUNK + i];
                let (ms, vs) = if b.grow[h] & (1 << i) != 0 { (e, 1f32) } else { (1f32, e) };
                accumulate::<R>(&mut b.acc[h * hd..(h + 1) * hd], &b.v32[..hd], ms, vs);
                st[1] = st[1].mul_add(ms, vs);
            }
        }
    });
}

/// `attention::portable::softmax_step` on 8 lanes (the same values, as
/// `decode::softmax_step16` on 16): the running maximum before each cell as an 8-lane prefix
/// scan, a lane replacing the maximum only where strictly greater, as the scalar loop does (ties
/// keep the earlier value, its zero sign included); then `m - s` where a cell raises it and
/// `s - m` elsewhere, and glibc's `expf` of each ([`expf8`]). Returns the grow mask. Where the
/// scalar loop carried the maximum from score to score (a compare, a select and a subtraction
/// in one chain per score: 13 % of SmolLM2's decode attention on this table), the chain is a
/// maximum and a permute per 8. A NaN score (which the scan, unlike the loop, may carry as the
/// maximum) makes its exponential NaN in both, and with it the head's accumulator and sum for
/// good, so the outputs agree: NaN.
///
/// # Safety
/// AVX2, FMA and F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_step8(sc: &mut [f32], st: &mut [f32; 2]) -> u64 {
    let n = sc.len();
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut m = _mm256_set1_ps(st[0]);
    let mut g = 0u64;
    for b in (0..n).step_by(8) {
        let k = (n - b).min(8) as i32;
        let lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        let keep = _mm256_castsi256_ps(lanes);
        // SAFETY: lanes b..b + k of `sc` (masked load; the rest -∞, which raises no maximum).
        let s = _mm256_blendv_ps(ninf, unsafe { _mm256_maskload_ps(sc.as_ptr().add(b), lanes) }, keep);
        // Inclusive prefix maximum: `max_ps(later, earlier)` keeps the earlier unless the later
        // is strictly greater, which makes the scan associative.
        let mut p = s;
        p = _mm256_max_ps(p, up::<1, 0b1>(p, ninf));
        p = _mm256_max_ps(p, up::<2, 0b11>(p, ninf));
        p = _mm256_max_ps(p, up::<4, 0b1111>(p, ninf));
        let pm = _mm256_max_ps(p, m);
        // The maximum before each lane: the carry for lane 0, the prefix up to the lane before.
        let before = up::<1, 0b1>(pm, m);
        let grew = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(s, before), keep);
        // Lanes past the chunk exponentiate 0, not -∞ (glibc's slow path).
        let x = _mm256_and_ps(keep, _mm256_blendv_ps(_mm256_sub_ps(s, before), _mm256_sub_ps(before, s), grew));
        // SAFETY: as the load.
        unsafe { _mm256_maskstore_ps(sc.as_mut_ptr().add(b), lanes, expf8(x)) };
        g |= (_mm256_movemask_ps(grew) as u64) << b;
        m = _mm256_permutevar8x32_ps(pm, _mm256_set1_epi32(7));
    }
    st[0] = _mm256_cvtss_f32(m);
    g
}

/// Lane i of `up::<K, B>(x, fill)`: x's lane i - K, or `fill`'s (a broadcast) below K; `B` is
/// the blend mask of the lanes below K.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn up<const K: i32, const B: i32>(x: __m256, fill: __m256) -> __m256 {
    let idx = _mm256_max_epi32(_mm256_setr_epi32(0, 1 - K, 2 - K, 3 - K, 4 - K, 5 - K, 6 - K, 7 - K), _mm256_setzero_si256());
    _mm256_blend_ps::<B>(_mm256_permutevar8x32_ps(x, idx), fill)
}

/// Phase 2 of one head of dimension 64 over the chunk's `n` value rows, lanes `8j..8j + 8`
/// of row `i` widened by `v(i, j)`: its eight accumulator vectors stay in registers from the
/// first cell to the last, where the general loop below loads and stores them for every cell
/// (each cell then waits on the previous one's store). The same operations per lane in the
/// same cell order as [`accumulate`], so the same bits.
///
/// # Safety
/// `v(i, j)` for `i < n`, `j < 8` reads inside a value row; `e` holds an exponential per
/// cell; `acc` holds 64 values; AVX2, FMA and F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate_head64<const R: bool>(n: usize, v: impl Fn(usize, usize) -> __m256, e: &[f32], grow: u64, acc: &mut [f32], sum: &mut f32) {
    // The F16 rounding pair (`R`, ggml's `one_chunk`), or the F32 value as it is (`Wide`).
    let round = |x: __m256| if R { _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) } else { x };
    assert!(acc.len() >= 64 && e.len() >= n);
    let mut r = [_mm256_setzero_ps(); 8];
    for (j, rj) in r.iter_mut().enumerate() {
        // SAFETY: 8j + 8 <= 64 <= acc.len(); unaligned load.
        *rj = unsafe { _mm256_loadu_ps(acc.as_ptr().add(8 * j)) };
    }
    let mut s = *sum;
    for i in 0..n {
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
            *rj = round(_mm256_fmadd_ps(v(i, j), vsv, *rj));
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

/// `k · q` in ggml's order for a multiple of 64 values, up to the last 8 lanes: accumulator
/// halves j = 0..8 over the 64-value steps, `(0+4)+(2+6)` and `(1+5)+(3+7)` (ggml's 0+2, 1+3,
/// then 0+1 on 16 lanes), then their sum — the 16-lane accumulator's halves added, the first
/// step of GCC's `_mm512_reduce_add_ps`, whose rest [`reduce8`] takes for eight keys at once.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fold(k: &[f32], q: &[f32]) -> __m256 {
    let n = k.len().min(q.len());
    let mut acc = [_mm256_setzero_ps(); 8];
    for i in (0..n).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8j + 8 <= n (n is a multiple of 64); unaligned loads.
            unsafe { *a = _mm256_fmadd_ps(_mm256_loadu_ps(k.as_ptr().add(i + 8 * j)), _mm256_loadu_ps(q.as_ptr().add(i + 8 * j)), *a) };
        }
    }
    fold_tree(&acc)
}

/// The addition tree that folds [`fold`]'s eight accumulators into one vector: ggml's 16-lane
/// accumulators `(0 + 2) + (1 + 3)` as 8-lane halves, so ((0 + 4) + (2 + 6)) + ((1 + 5) +
/// (3 + 7)), summed hi + lo.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fold_tree(a: &[__m256; 8]) -> __m256 {
    let lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    _mm256_add_ps(hi, lo)
}

/// [`fold`] of one key row of head dimension 64 with every head's query, the row widened once
/// into registers: `t[h · KEYS + i]` (8 lanes) = head `h`'s folded vector of key `i`. The same
/// products (`fma` with a zero accumulator) and additions ([`fold_tree`]) as [`fold`], so the
/// same bits; where `fold` per head read the row back from the widened buffer, this reads each
/// row once.
///
/// # Safety
/// `k` starts a row of 64 F16 values; `q.len()` is a multiple of 64 and `t` holds
/// `q.len() / 64 · KEYS · 8` values; `i < KEYS`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold64(k: *const f16, q: &[f32], i: usize, t: &mut [f32]) {
    let heads = q.len() / 64;
    assert!(i < KEYS && t.len() >= heads * KEYS * 8);
    // SAFETY (all below): 64 F16 values at `k`; `q` holds `heads` rows of 64; the store is
    // inside `t` (asserted).
    let kv: [__m256; 8] = std::array::from_fn(|j| unsafe { _mm256_cvtph_ps(_mm_loadu_si128(k.add(8 * j) as *const __m128i)) });
    let zero = _mm256_setzero_ps();
    for h in 0..heads {
        let qh = unsafe { q.as_ptr().add(64 * h) };
        let p: [__m256; 8] = std::array::from_fn(|j| _mm256_fmadd_ps(kv[j], unsafe { _mm256_loadu_ps(qh.add(8 * j)) }, zero));
        unsafe { _mm256_storeu_ps(t.as_mut_ptr().add((h * KEYS + i) * 8), fold_tree(&p)) };
    }
}

/// Eight keys' scores `s` into `at` (its first `at.len()` ≤ 8 lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_scores(s: __m256, at: &mut [f32]) {
    if at.len() == KEYS {
        // SAFETY: `at` holds KEYS = 8 values; unaligned store.
        unsafe { _mm256_storeu_ps(at.as_mut_ptr(), s) };
    } else {
        let mut all = [0f32; KEYS];
        // SAFETY: 8 f32 of stack memory.
        unsafe { _mm256_storeu_ps(all.as_mut_ptr(), s) };
        let n = at.len().min(KEYS);
        at[..n].copy_from_slice(&all[..n]);
    }
}

/// The sums of eight keys' [`fold`]ed vectors `t[c]`, key c in lane c, each by the additions
/// of a horizontal sum in the order of GCC's `_mm512_reduce_add_ps` after its first step:
/// `t6 = hi + lo` (the 128-bit halves), `u = t6[0..2] + t6[2..4]`, then `u[0] + u[1]` — here
/// as 21 shuffles and additions for the eight where each alone takes six and a store.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(t: &[__m256; KEYS]) -> __m256 {
    // Lanes [t6 of key c | t6 of key c + 4].
    let t6 = |c: usize| _mm256_add_ps(_mm256_permute2f128_ps::<0x31>(t[c], t[c + 4]), _mm256_permute2f128_ps::<0x20>(t[c], t[c + 4]));
    let (w0, w1, w2, w3) = (t6(0), t6(1), t6(2), t6(3));
    // Lanes [u of keys c, c + 1 | u of keys c + 4, c + 5].
    let u = |a: __m256, b: __m256| {
        let (a, b) = (_mm256_castps_pd(a), _mm256_castps_pd(b));
        _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)))
    };
    let (z01, z23) = (u(w0, w1), u(w2, w3));
    _mm256_add_ps(_mm256_shuffle_ps::<0b10_00_10_00>(z01, z23), _mm256_shuffle_ps::<0b11_01_11_01>(z01, z23))
}

/// One head's accumulator step: `a = f16(f16(a · ms) + v · vs)` lane by lane (the rescale
/// skipped when `ms` is exactly 1: an F16 value times 1 is itself).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate<const R: bool>(a: &mut [f32], v: &[f32], ms: f32, vs: f32) {
    // The F16 rounding pair (`R`, ggml's `one_chunk`), or the F32 value as it is (`Wide`).
    let round = |x: __m256| if R { _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) } else { x };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::portable::softmax_step;

    /// [`softmax_step8`] gives the scalar step's exponentials, grow mask and maximum bit for
    /// bit: every length 1..=64 (tails of every width), a carried maximum below, between and
    /// above the scores, ties (the earlier kept: ±0 included), -∞ (hidden cells) and large
    /// exponents.
    #[test]
    fn softmax_step8_equals_the_scalar_step() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
            return;
        }
        let edges = [f32::NEG_INFINITY, -0.0, 0.0, 0.0, -0.0, 1.5, 1.5, -3.25, 90.0, -120.0, 2.0, 2.0, 7.0, f32::NEG_INFINITY, 6.999, 7.0];
        // Spread scores in -20..20, rising and falling (odd cases).
        let spread = |n: usize, i: usize| ((i * 7919 + n * 104_729) % 4001) as f32 / 100.0 - 20.0;
        for n in 1..=64usize {
            for (case, start) in [f32::NEG_INFINITY, -1e3, 0.0, 5.0, 1e3].into_iter().enumerate() {
                let scores: Vec<f32> = (0..n).map(|i| if case % 2 == 0 { edges[(i * 7 + case) % edges.len()] } else { spread(n, i) }).collect();
                let (mut a, mut b) = (scores.clone(), scores);
                let (mut sa, mut sb) = ([start, 0.0], [start, 0.0]);
                // SAFETY (both): the features were checked above.
                let ga = softmax_step(&mut a, &mut sa, |e| unsafe { crate::exp::x86::expf_slice_avx2(e) });
                let gb = unsafe { softmax_step8(&mut b, &mut sb) };
                assert_eq!((ga, sa[0].to_bits()), (gb, sb[0].to_bits()), "n {n} start {start}");
                assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "n {n} start {start}: {a:?} {b:?}");
            }
        }
    }
}
