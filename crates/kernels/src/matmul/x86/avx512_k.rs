//! Prefill tiles for K-quant weights (AVX-512 VL + VNNI on 256-bit vectors).
//!
//! Q4_K: eight weight rows × four activation rows per pass with **lanes = weight rows**, the
//! float order of ggml's repacked `q4_K_8x8` GEMM (and of `dot_q4_k_q8_k_tile`): per 64 values
//! one `fma(sumi, d·d_y, acc)` and one `fma(summ, dmin·d_y, acc_min)` per pair, here eight pairs
//! per instruction. The integer sums are exact whatever the method: the raw bytes of eight rows
//! are transposed in 4-byte groups (an 8×8 dword transpose per 64 values, shared by the four
//! activation rows), so one `vpdpbusd` against a broadcast group of four activation bytes adds
//! four products to each of the eight rows. Scales and mins of the eight rows are unpacked
//! side by side with ggml's `utmp` masks.
#![allow(clippy::missing_safety_doc)]

use super::avx2::dot_q4_k_q8_k_tile;
use super::avx512::{pass_rows, rows4, store_tile};
use super::common::{q6_group, q6_scales};
use crate::quant::blocks::*;
use crate::simd::x86::h2f;
use std::arch::x86_64::*;

/// `out.len()` weight rows (a multiple of four; `x`, rows `xrb` bytes apart) against four Q8_K
/// activation rows: `out[c][j]` equals `dot_q4_k_q8_k_tile(x_c, y_j)` bit for bit. Eight weight
/// rows per pass; a last group of four goes through the tile dot itself.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_q4_k_q8_k(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    let nb = xrb / std::mem::size_of::<BlockQ4K>();
    let b = rows4::<BlockQ8K>(y, nb);
    let full = out.len() / 8 * 8;
    for (c, o) in out[..full].chunks_exact_mut(8).enumerate() {
        let a = pass_rows::<BlockQ4K, 8>(x, xrb, c, nb);
        tile_q4_k(a, b, o);
    }
    for (c, o) in out.iter_mut().enumerate().skip(full) {
        for j in 0..4 {
            o[j] = dot_q4_k_q8_k_tile(&x[c * xrb..(c + 1) * xrb], y[j]);
        }
    }
}

/// The `u32` at byte `off` of block `i` of each of eight rows, lane r = row r.
#[inline]
#[target_feature(enable = "avx2")]
fn words8(a: &[&[BlockQ4K]; 8], i: usize, off: usize) -> __m256i {
    let w = |r: usize| {
        let p = &a[r][i] as *const BlockQ4K as *const u8;
        // SAFETY: off + 4 ≤ 16 < size_of::<BlockQ4K>() at every call site; unaligned read.
        unsafe { (p.add(off) as *const i32).read_unaligned() }
    };
    _mm256_setr_epi32(w(0), w(1), w(2), w(3), w(4), w(5), w(6), w(7))
}

/// The f16 in the low half of each dword lane, converted.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl")]
fn f16_lanes(v: __m256i) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v))
}

/// Dword transpose: lane r of result k is dword k of `v[r]`.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(v: [__m256i; 8]) -> [__m256i; 8] {
    let t = [
        _mm256_unpacklo_epi32(v[0], v[1]),
        _mm256_unpackhi_epi32(v[0], v[1]),
        _mm256_unpacklo_epi32(v[2], v[3]),
        _mm256_unpackhi_epi32(v[2], v[3]),
        _mm256_unpacklo_epi32(v[4], v[5]),
        _mm256_unpackhi_epi32(v[4], v[5]),
        _mm256_unpacklo_epi32(v[6], v[7]),
        _mm256_unpackhi_epi32(v[6], v[7]),
    ];
    // u[k] / u[4 + k]: dwords k and k + 4 of rows 0..4 / rows 4..8 (one per 128-bit half).
    let u = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    [
        _mm256_permute2x128_si256::<0x20>(u[0], u[4]),
        _mm256_permute2x128_si256::<0x20>(u[1], u[5]),
        _mm256_permute2x128_si256::<0x20>(u[2], u[6]),
        _mm256_permute2x128_si256::<0x20>(u[3], u[7]),
        _mm256_permute2x128_si256::<0x31>(u[0], u[4]),
        _mm256_permute2x128_si256::<0x31>(u[1], u[5]),
        _mm256_permute2x128_si256::<0x31>(u[2], u[6]),
        _mm256_permute2x128_si256::<0x31>(u[3], u[7]),
    ]
}

/// Byte `s` of every dword lane, zero-extended.
#[inline]
#[target_feature(enable = "avx2")]
fn byte_lanes(v: __m256i, s: usize) -> __m256i {
    _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_set1_epi32(8 * s as i32)), _mm256_set1_epi32(0xFF))
}

/// Scales, mins and their multipliers of one super-block of eight rows (lane = row): `d`,
/// `dmin` and the raw 6-bit scale words unpacked with ggml's `utmp` masks (`sc[h]` bytes: the
/// scales of sub-blocks 4h..4h + 4; `mn[h]`: the mins).
#[derive(Clone, Copy)]
struct Q4KHead {
    d: __m256,
    dmin: __m256,
    sc: [__m256i; 2],
    mn: [__m256i; 2],
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4k_head(a: &[&[BlockQ4K]; 8], i: usize) -> Q4KHead {
    let (k1, k2, k3) = (_mm256_set1_epi32(0x3f3f3f3f), _mm256_set1_epi32(0x0f0f0f0f), _mm256_set1_epi32(0x03030303));
    // [d | dmin << 16] per row, then the 12 scale bytes as three words (ggml's utmp).
    let head = words8(a, i, 0);
    let (u0, u1, u2) = (words8(a, i, 4), words8(a, i, 8), words8(a, i, 12));
    Q4KHead {
        d: f16_lanes(head),
        dmin: f16_lanes(_mm256_srli_epi32(head, 16)),
        sc: [
            _mm256_and_si256(u0, k1),
            _mm256_or_si256(_mm256_and_si256(u2, k2), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k3), 4)),
        ],
        mn: [
            _mm256_and_si256(u1, k1),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi32(u2, 4), k2),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k3), 4),
            ),
        ],
    }
}

/// The 64 values `64·ch..64·ch + 64` of super-block `i` (eight rows' bytes dword-transposed,
/// `t`) against the four activation rows, into the accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4k_chunk(h: &Q4KHead, t: &[__m256i; 8], b: [&[BlockQ8K]; 4], i: usize, ch: usize, acc: &mut [__m256; 4], acc_min: &mut [__m256; 4]) {
    let m4 = _mm256_set1_epi8(0xF);
    // Sub-blocks 2ch (low nibbles) and 2ch + 1 (high nibbles).
    let (s0, s1) = (byte_lanes(h.sc[ch / 2], 2 * (ch % 2)), byte_lanes(h.sc[ch / 2], 2 * (ch % 2) + 1));
    let (m0, m1) = (byte_lanes(h.mn[ch / 2], 2 * (ch % 2)), byte_lanes(h.mn[ch / 2], 2 * (ch % 2) + 1));
    let mut lo = [_mm256_setzero_si256(); 8];
    let mut hi = [_mm256_setzero_si256(); 8];
    for k in 0..8 {
        lo[k] = _mm256_and_si256(t[k], m4);
        hi[k] = _mm256_and_si256(_mm256_srli_epi16(t[k], 4), m4);
    }
    for j in 0..4 {
        let by = &b[j][i];
        let q = &by.qs[64 * ch..64 * ch + 64];
        let group = |k: usize| {
            // SAFETY: k < 16, so 4 bytes inside the 64-byte slice; unaligned read.
            _mm256_set1_epi32(unsafe { (q.as_ptr().add(4 * k) as *const i32).read_unaligned() })
        };
        let (mut sl, mut sh) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for k in 0..8 {
            sl = _mm256_dpbusd_epi32(sl, lo[k], group(k));
            sh = _mm256_dpbusd_epi32(sh, hi[k], group(8 + k));
        }
        let sumi = _mm256_add_epi32(_mm256_mullo_epi32(s0, sl), _mm256_mullo_epi32(s1, sh));
        let bs = &by.bsums[4 * ch..4 * ch + 4];
        let summ = _mm256_add_epi32(
            _mm256_mullo_epi32(m0, _mm256_set1_epi32(bs[0] as i32 + bs[1] as i32)),
            _mm256_mullo_epi32(m1, _mm256_set1_epi32(bs[2] as i32 + bs[3] as i32)),
        );
        let dy = _mm256_set1_ps(by.d);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(h.d, dy), acc[j]);
        acc_min[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(h.dmin, dy), acc_min[j]);
    }
}

/// Bytes 32·ch..32·ch + 32 of the quants of super-block `i` of the eight rows, dword-transposed.
#[inline]
#[target_feature(enable = "avx2")]
fn q4k_transposed(a: &[&[BlockQ4K]; 8], i: usize, ch: usize) -> [__m256i; 8] {
    let mut raw = [_mm256_setzero_si256(); 8];
    for (r, v) in raw.iter_mut().enumerate() {
        // SAFETY: 32 readable bytes of qs (ch < 4); unaligned load.
        *v = unsafe { _mm256_loadu_si256(a[r][i].qs.as_ptr().add(32 * ch) as *const __m256i) };
    }
    transpose8(raw)
}

/// The eight rows' results from the accumulators: `out[r][j]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn q4k_store(acc: &[__m256; 4], acc_min: &[__m256; 4], out: &mut [[f32; 4]]) {
    for j in 0..4 {
        let mut v = [0f32; 8];
        // SAFETY: 8 f32 of stack memory.
        unsafe { _mm256_storeu_ps(v.as_mut_ptr(), _mm256_sub_ps(acc[j], acc_min[j])) };
        for r in 0..8 {
            out[r][j] = v[r];
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_q4_k(a: [&[BlockQ4K]; 8], b: [&[BlockQ8K]; 4], out: &mut [[f32; 4]]) {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut acc_min = [_mm256_setzero_ps(); 4];
    for i in 0..a[0].len() {
        let h = q4k_head(&a, i);
        for ch in 0..QK_K / 64 {
            let t = q4k_transposed(&a, i, ch);
            q4k_chunk(&h, &t, b, i, ch, &mut acc, &mut acc_min);
        }
    }
    q4k_store(&acc, &acc_min, out);
}

/// Bytes of one (eight-row pass, super-block) once packed by [`pack_q4_k`]: the head (`d`,
/// `dmin`, two scale and two min words: 6 vectors) and the four 64-value chunks transposed
/// (32 vectors).
const Q4K_PACKED: usize = (6 + 32) * 32;

/// Bytes per weight row once packed by [`pack_q4_k`] (rows of `xrb` bytes).
pub fn packed_row_bytes_q4_k(xrb: usize) -> usize {
    xrb / std::mem::size_of::<BlockQ4K>() * Q4K_PACKED / 8
}

/// The Q4_K weight rows of `x` (a multiple of four) prepared once for [`tiles_q4_k_packed`]:
/// per eight-row pass and super-block, the unpacked head and the transposed quants that
/// [`tiles_q4_k_q8_k`] recomputes for every four activation rows; a last group of four rows is
/// copied as it is.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn pack_q4_k(x: &[u8], xrb: usize, out: &mut [u8]) {
    let nb = xrb / std::mem::size_of::<BlockQ4K>();
    let rows = x.len() / xrb;
    let passes = rows / 8;
    assert!(out.len() >= passes * nb * Q4K_PACKED + (rows - 8 * passes) * xrb);
    for c in 0..passes {
        let a = pass_rows::<BlockQ4K, 8>(x, xrb, c, nb);
        for i in 0..nb {
            let h = q4k_head(&a, i);
            let g = &mut out[(c * nb + i) * Q4K_PACKED..(c * nb + i + 1) * Q4K_PACKED];
            let p = g.as_mut_ptr() as *mut __m256i;
            // SAFETY: 38 vectors of 32 bytes = Q4K_PACKED bytes in g; unaligned stores.
            unsafe {
                _mm256_storeu_ps(p as *mut f32, h.d);
                _mm256_storeu_ps(p.add(1) as *mut f32, h.dmin);
                for k in 0..2 {
                    _mm256_storeu_si256(p.add(2 + k), h.sc[k]);
                    _mm256_storeu_si256(p.add(4 + k), h.mn[k]);
                }
                for ch in 0..QK_K / 64 {
                    for (k, v) in q4k_transposed(&a, i, ch).iter().enumerate() {
                        _mm256_storeu_si256(p.add(6 + 8 * ch + k), *v);
                    }
                }
            }
        }
    }
    let tail = passes * nb * Q4K_PACKED;
    out[tail..tail + (rows - 8 * passes) * xrb].copy_from_slice(&x[8 * passes * xrb..]);
}

/// [`tiles_q4_k_q8_k`] on rows packed by [`pack_q4_k`] (`xrb`: the rows' original bytes): the
/// same values bit for bit.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_q4_k_packed(packed: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    let nb = xrb / std::mem::size_of::<BlockQ4K>();
    let b = rows4::<BlockQ8K>(y, nb);
    let passes = out.len() / 8;
    for (c, o) in out[..8 * passes].chunks_exact_mut(8).enumerate() {
        let pk = &packed[c * nb * Q4K_PACKED..(c + 1) * nb * Q4K_PACKED];
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut acc_min = [_mm256_setzero_ps(); 4];
        for (i, g) in pk.chunks_exact(Q4K_PACKED).enumerate() {
            let p = g.as_ptr() as *const __m256i;
            // SAFETY: 38 vectors of 32 bytes = Q4K_PACKED bytes in g; unaligned loads.
            let (h, t) = unsafe {
                let h = Q4KHead {
                    d: _mm256_loadu_ps(p as *const f32),
                    dmin: _mm256_loadu_ps(p.add(1) as *const f32),
                    sc: [_mm256_loadu_si256(p.add(2)), _mm256_loadu_si256(p.add(3))],
                    mn: [_mm256_loadu_si256(p.add(4)), _mm256_loadu_si256(p.add(5))],
                };
                (h, p.add(6))
            };
            for ch in 0..QK_K / 64 {
                let mut tv = [_mm256_setzero_si256(); 8];
                for (k, v) in tv.iter_mut().enumerate() {
                    // SAFETY: vector 6 + 8ch + k < 38 of the group.
                    *v = unsafe { _mm256_loadu_si256(t.add(8 * ch + k)) };
                }
                q4k_chunk(&h, &tv, b, i, ch, &mut acc, &mut acc_min);
            }
        }
        q4k_store(&acc, &acc_min, o);
    }
    let raw = &packed[passes * nb * Q4K_PACKED..];
    for (c, o) in out[8 * passes..].iter_mut().enumerate() {
        for j in 0..4 {
            o[j] = dot_q4_k_q8_k_tile(&raw[c * xrb..(c + 1) * xrb], y[j]);
        }
    }
}

/// Four Q6_K weight rows against four Q8_K activation rows per pass: `out[c][j]` equals
/// `avx2::dot_q6_k_q8_k(x_c, y_j)` bit for bit. That kernel's eight float lanes per pair are
/// kept: each lane's integer sum is accumulated with `vpdpwssd` (scale × `maddubs` pair sums,
/// one instruction for AVX2's `madd` + `add`), the 6-bit values of a 32-value group are decoded
/// once for four activation rows, and the `−32` offset and the float step come once per
/// super-block per pair, as in the single-row kernel.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_q6_k_q8_k(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    let nb = xrb / std::mem::size_of::<BlockQ6K>();
    let b = rows4::<BlockQ8K>(y, nb);
    for (c, o) in out.chunks_exact_mut(4).enumerate() {
        let a = pass_rows::<BlockQ6K, 4>(x, xrb, c, nb);
        tile_q6_k(a, b, o.try_into().expect("chunks of four"));
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_q6_k(a: [&[BlockQ6K]; 4], b: [&[BlockQ8K]; 4], out: &mut [[f32; 4]; 4]) {
    let mut acc = [[_mm256_setzero_ps(); 4]; 4];
    for i in 0..a[0].len() {
        let mut scales = [_mm_setzero_si128(); 4];
        for r in 0..4 {
            // SAFETY: scales is 16 bytes; unaligned load.
            scales[r] = unsafe { _mm_loadu_si128(a[r][i].scales.as_ptr() as *const __m128i) };
        }
        let mut sumi = [[_mm256_setzero_si256(); 4]; 4];
        for n in 0..QK_K / 128 {
            for k in 0..4 {
                let mut q = [_mm256_setzero_si256(); 4];
                let mut sc = [_mm256_setzero_si256(); 4];
                for r in 0..4 {
                    q[r] = q6_group(&a[r][i], n, k);
                    sc[r] = q6_scales(scales[r], n * 8 + k * 2);
                }
                for j in 0..4 {
                    // SAFETY: n * 128 + k * 32 + 32 ≤ 256 bytes of qs; unaligned load.
                    let q8 = unsafe { _mm256_loadu_si256(b[j][i].qs.as_ptr().add(n * 128 + k * 32) as *const __m256i) };
                    for r in 0..4 {
                        sumi[r][j] = _mm256_dpwssd_epi32(sumi[r][j], sc[r], _mm256_maddubs_epi16(q[r], q8));
                    }
                }
            }
        }
        for j in 0..4 {
            // SAFETY: bsums is 16 i16 (32 bytes); unaligned load.
            let q8sums = unsafe { _mm256_loadu_si256(b[j][i].bsums.as_ptr() as *const __m256i) };
            for r in 0..4 {
                let sub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, _mm256_cvtepi8_epi16(scales[r])), 5);
                let d = _mm256_set1_ps(b[j][i].d * h2f(a[r][i].d));
                acc[r][j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[r][j], sub)), acc[r][j]);
            }
        }
    }
    store_tile(&acc, out);
}
