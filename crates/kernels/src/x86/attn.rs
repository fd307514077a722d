//! AVX2 + F16C twins of the two flash-attention kernels of `ops`. Same arithmetic, lane for
//! lane, so results are bit-identical to the portable kernels:
//! - the reference kernel (`attend_reference`): the F16 dot keeps ggml's four 16-lane
//!   accumulators (each as two 8-lane halves), the F16 accumulator is rounded with the hardware
//!   converter (round to nearest even, as the portable twin);
//! - the tiled kernel (`attend_tiled_group`), for one head or all heads of a GQA group at once:
//!   scores of 8 cells per lane-parallel FMA chain over the dimensions (ggml's `simd_gemm`
//!   order), ggml's softmax step on 8 lanes (`softmax_tile`).

use super::avx2::{h2f, hsum_f32x8};
use crate::ops::{reduce_add_16, AttnScratch, KvRows};
use half::f16;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_ph(p: &[f16]) -> __m256 {
    assert!(p.len() >= 8);
    // SAFETY: at least 8 f16 (16 bytes) readable; unaligned load.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.as_ptr() as *const __m128i)) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_ph(p: &mut [f16], v: __m256) {
    assert!(p.len() >= 8);
    // SAFETY: at least 8 f16 writable; unaligned store.
    unsafe { _mm_storeu_si128(p.as_mut_ptr() as *mut __m128i, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)) }
}

/// ggml's fold of its four 16-lane accumulators (here eight 8-lane halves: accumulator j =
/// `acc[2j], acc[2j + 1]`): 0+2 and 1+3, then 0+1, then the 16 lanes as `reduce_add_16`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fold_ggml(acc: &[__m256; 8]) -> f64 {
    let (a0, a1) = (_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[1], acc[5]));
    let (a2, a3) = (_mm256_add_ps(acc[2], acc[6]), _mm256_add_ps(acc[3], acc[7]));
    let (lo, hi) = (_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    let mut lanes = [0f32; 16];
    // SAFETY: 16 f32 of stack memory.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    }
    reduce_add_16(&lanes) as f64
}

/// `ops::dot_f16_ggml`, vectorised.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_f16_ggml(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [_mm256_setzero_ps(); 8]; // accumulator j = (acc[2j], acc[2j+1])
    let mut i = 0;
    while i < np {
        for (h, a) in acc.iter_mut().enumerate() {
            let o = i + h * 8;
            *a = _mm256_fmadd_ps(load_ph(&x[o..]), load_ph(&y[o..]), *a);
        }
        i += 64;
    }
    let mut sum = fold_ggml(&acc);
    for k in np..n {
        sum += (h2f(x[k]) * h2f(y[k])) as f64;
    }
    sum as f32
}

/// The reference kernel with F16C: see `ops::attend_reference` for the algorithm.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn attend_reference(
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let hd = q.len();
    let body = hd & !7;
    let (q16, acc16, v32) = scratch.f16_buffers();
    for (d, &s) in q16.iter_mut().zip(q) {
        *d = f16::from_f32(s);
    }
    acc16.iter_mut().for_each(|a| *a = f16::ZERO);
    let mut st = [f32::NEG_INFINITY, 0f32];
    for c in 0..n_cells {
        if !visible(c) {
            continue;
        }
        let score = dot_f16_ggml(kv.k(c), q16) * scale;
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
/// exact), in the same order.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_ggml(x: &[f32], y: &[f32]) -> f32 {
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
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn attend_reference_group(
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    bufs: crate::ops::ReferenceBuffers,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    let (qf, acc16, state, k32, v32) = bufs;
    assert!(hd.is_multiple_of(8) && qf.len() >= heads * hd && acc16.len() >= heads * hd && state.len() >= heads);
    for (d, &s) in qf.iter_mut().zip(q) {
        *d = h2f(f16::from_f32(s));
    }
    acc16[..heads * hd].fill(f16::ZERO);
    state[..heads].fill([f32::NEG_INFINITY, 0.0]);
    for c in 0..n_cells {
        if !visible(c) {
            continue;
        }
        widen(kv.k(c), k32);
        widen(kv.v(c), v32);
        for (h, st) in state[..heads].iter_mut().enumerate() {
            let score = dot_f32_ggml(k32, &qf[h * hd..(h + 1) * hd]) * scale;
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

/// 8×8 transpose of f32 rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// `ops::expf_ggml` on 8 lanes: the same operations in the same order (FMA for every
/// `mul_add`, the three `scalef` ranges selected per lane), so every lane is bit-identical to
/// the scalar function.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn expf_ggml8(x: __m256) -> __m256 {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let r = c(0x4B40_0000);
    let z = _mm256_fmadd_ps(x, c(0x3FB8_AA3B), r);
    let n = _mm256_sub_ps(z, r);
    // fma(-n, c, x) == fnmadd(n, c, x): negation is exact.
    let b = _mm256_fnmadd_ps(n, c(0x35BF_BE8E), _mm256_fnmadd_ps(n, c(0x3F31_7200), x));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3C07_2010), b, c(0x3D2B_9F17)),
            u,
            _mm256_fmadd_ps(c(0x3E2A_AF33), b, c(0x3EFF_FEDB)),
        ),
        u,
        _mm256_fmadd_ps(c(0x3F7F_FFF6), b, _mm256_set1_ps(1.0)),
    );
    // scalef(j, n): n is integral here (|n| ≤ 192 on the lanes that use it).
    let ni = _mm256_cvttps_epi32(n);
    let pow2 = |e: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(e, _mm256_set1_epi32(127))));
    let k = |v: i32| _mm256_set1_epi32(v);
    let normal = _mm256_mul_ps(j, pow2(ni));
    let low = _mm256_mul_ps(_mm256_mul_ps(j, pow2(_mm256_add_epi32(ni, k(100)))), pow2(k(-100)));
    let high = _mm256_mul_ps(_mm256_mul_ps(j, pow2(k(127))), pow2(_mm256_sub_epi32(ni, k(127))));
    let is_low = _mm256_castsi256_ps(_mm256_cmpgt_epi32(k(-126), ni));
    let is_high = _mm256_castsi256_ps(_mm256_cmpgt_epi32(ni, k(127)));
    let v = _mm256_blendv_ps(_mm256_blendv_ps(normal, low, is_low), high, is_high);
    // |n| > 192: 0 below, infinity above.
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let out_of_range = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    let sat = _mm256_blendv_ps(
        _mm256_set1_ps(f32::INFINITY),
        _mm256_setzero_ps(),
        _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps()),
    );
    _mm256_blendv_ps(v, sat, out_of_range)
}

/// The softmax step of the tiled kernel: `p = expf_ggml(p - m)` in place, each group of 16
/// summed in float as `ops::reduce_add_16`, the groups summed in double (ggml's
/// `ggml_vec_soft_max_f32`). Bit-identical to the scalar loop in `ops::attend_tiled`.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn softmax_tile(scores: &mut [f32], m: f32) -> f64 {
    let mv = _mm256_set1_ps(m);
    let mut sum = 0f64;
    for g in scores.chunks_exact_mut(16) {
        // SAFETY: 16 f32 in g; unaligned loads and stores.
        unsafe {
            let p = g.as_mut_ptr();
            let lo = expf_ggml8(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
            let hi = expf_ggml8(_mm256_sub_ps(_mm256_loadu_ps(p.add(8)), mv));
            _mm256_storeu_ps(p, lo);
            _mm256_storeu_ps(p.add(8), hi);
            sum += hsum_f32x8(_mm256_add_ps(hi, lo)) as f64;
        }
    }
    sum
}

/// One head's online-softmax step over a tile whose first `len` scores are set (`sh` holds
/// [`KV_TILE`](crate::ops::KV_TILE) of them): the running (maximum, sum) `st` and the
/// accumulator `acc` rescaled if the maximum grows, the scores turned into probabilities in
/// place (`softmax_tile`). A tile with nothing visible leaves `st` and `acc` alone and zeroes
/// `sh`; returns whether anything was visible.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn tile_softmax(sh: &mut [f32], len: usize, st: &mut [f32; 2], acc: &mut [f32]) -> bool {
    let tile_max = sh[..len].iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if tile_max == f32::NEG_INFINITY {
        sh.fill(0.0);
        return false;
    }
    let [m, s] = st;
    let m_new = m.max(tile_max);
    if m_new > *m {
        let ms = (*m - m_new).exp();
        acc.iter_mut().for_each(|a| *a *= ms);
        *s *= ms;
    }
    *m = m_new;
    sh[len..].fill(f32::NEG_INFINITY);
    let sum = softmax_tile(sh, *m);
    *s = (*s as f64 + sum) as f32;
    true
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
        let rows: [__m256; 8] = std::array::from_fn(|j| load_ph(&krows[j][d..]));
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

/// The tiled kernel (`ops::attend_tiled`) for one head or the heads of a GQA group at
/// once: keys transposed once per 8-cell block and values converted once per cell for all
/// heads; per head, every operation is the single-head kernel's, in the same order, so the
/// bits are equal. `head_dim % 8 == 0`; at most 16 heads.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn attend_tiled_group(
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    bufs: crate::ops::GroupBuffers,
    out: &mut [f32],
) {
    use crate::ops::KV_TILE;
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
            if c + 8 <= t1 && (c..c + 8).any(visible) {
                scores8_heads(q, kv, c, &mut scores[c - t0..], KV_TILE);
                for j in 0..8 {
                    let vis = visible(c + j);
                    for h in 0..heads {
                        let p = &mut scores[h * KV_TILE + c + j - t0];
                        *p = if vis { *p * scale } else { f32::NEG_INFINITY };
                    }
                }
                c += 8;
                continue;
            }
            let vis = visible(c);
            for h in 0..heads {
                let qh = &q[h * hd..(h + 1) * hd];
                scores[h * KV_TILE + c - t0] = if vis {
                    kv.k(c).iter().zip(qh).fold(0f32, |a, (&kk, &qq)| h2f(kk).mul_add(qq, a)) * scale
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

/// F16 → f32, 8 at a time (`dst.len() % 8 == 0`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn widen(src: &[f16], dst: &mut [f32]) {
    let mut d = 0;
    while d + 8 <= dst.len() {
        // SAFETY: d + 8 <= dst.len(); unaligned store.
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(d), load_ph(&src[d..])) };
        d += 8;
    }
}
