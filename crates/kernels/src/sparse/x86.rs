//! Sparse feed-forward kernels on 8 (AVX2) and 16 (AVX-512) lanes, bit-identical to the
//! portable twins: every lane computes `fma(h, w, y)` with `w` the type's `to_float` value,
//! which for Q8_0, Q5_0 and Q4_0 is the exact product `q · d`.
#![allow(clippy::missing_safety_doc)]

use super::portable;
use crate::quant::blocks::{as_blocks, BlockQ4_0, BlockQ5_0, BlockQ8_0};
use crate::simd::x86::h2f;
use crate::DType;
use std::arch::x86_64::*;

/// `y[j] = fma(h, w[j], y[j])` on eight lanes.
#[target_feature(enable = "avx2,fma")]
pub fn axpy_f32_avx2(h: f32, w: &[f32], y: &mut [f32]) {
    let n = w.len().min(y.len());
    let body = n & !7;
    let hv = _mm256_set1_ps(h);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= n ≤ both lengths; unaligned loads and store.
        unsafe {
            let yv = _mm256_loadu_ps(y.as_ptr().add(i));
            let r = _mm256_fmadd_ps(hv, _mm256_loadu_ps(w.as_ptr().add(i)), yv);
            _mm256_storeu_ps(y.as_mut_ptr().add(i), r);
        }
        i += 8;
    }
    portable::axpy_f32(h, &w[body..n], &mut y[body..n]);
}

/// [`axpy_f32_avx2`] on sixteen lanes.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub fn axpy_f32_avx512(h: f32, w: &[f32], y: &mut [f32]) {
    let n = w.len().min(y.len());
    let body = n & !15;
    let hv = _mm512_set1_ps(h);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 16 <= n ≤ both lengths; unaligned loads and store.
        unsafe {
            let yv = _mm512_loadu_ps(y.as_ptr().add(i));
            let r = _mm512_fmadd_ps(hv, _mm512_loadu_ps(w.as_ptr().add(i)), yv);
            _mm512_storeu_ps(y.as_mut_ptr().add(i), r);
        }
        i += 16;
    }
    axpy_f32_avx2(h, &w[body..n], &mut y[body..n]);
}

/// The 32 signed values of one block as two halves of sixteen i32 lanes: Q8_0's bytes, Q4_0's
/// nibbles less 8, Q5_0's nibbles with their fifth bits less 16.
#[inline(always)]
unsafe fn values16(t: DType, b: &[u8]) -> ([__m512i; 2], f32) {
    // SAFETY (whole function): `b` is one block of `t` (checked by the caller's chunking);
    // the loads stay inside it.
    unsafe {
        match t {
            DType::Q8_0 => {
                let blk = &as_blocks::<BlockQ8_0>(b)[0];
                let p = blk.qs.as_ptr() as *const __m128i;
                ([_mm512_cvtepi8_epi32(_mm_loadu_si128(p)), _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(1)))], h2f(blk.d))
            }
            DType::Q4_0 => {
                let blk = &as_blocks::<BlockQ4_0>(b)[0];
                let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.qs.as_ptr() as *const __m128i));
                let (m, e) = (_mm512_set1_epi32(0xF), _mm512_set1_epi32(8));
                let lo = _mm512_sub_epi32(_mm512_and_si512(q, m), e);
                let hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), e);
                ([lo, hi], h2f(blk.d))
            }
            _ => {
                let blk = &as_blocks::<BlockQ5_0>(b)[0];
                let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.qs.as_ptr() as *const __m128i));
                let qh = _mm512_set1_epi32(u32::from_le_bytes(blk.qh) as i32);
                let idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                let one = _mm512_set1_epi32(1);
                let bit = |shift: __m512i| _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(qh, shift), one), 4);
                let (m, e) = (_mm512_set1_epi32(0xF), _mm512_set1_epi32(16));
                let lo = _mm512_or_si512(_mm512_and_si512(q, m), bit(idx));
                let hi = _mm512_or_si512(_mm512_srli_epi32(q, 4), bit(_mm512_add_epi32(idx, _mm512_set1_epi32(16))));
                ([_mm512_sub_epi32(lo, e), _mm512_sub_epi32(hi, e)], h2f(blk.d))
            }
        }
    }
}

/// The 32 signed values of one block as four groups of eight i32 lanes (as [`values16`]).
#[inline(always)]
unsafe fn values8(t: DType, b: &[u8]) -> ([__m256i; 4], f32) {
    // SAFETY (whole function): `b` is one block of `t`; the loads stay inside it.
    unsafe {
        let (bytes, d): (__m128i, f32) = match t {
            DType::Q8_0 => {
                let blk = &as_blocks::<BlockQ8_0>(b)[0];
                let p = blk.qs.as_ptr() as *const __m128i;
                let (a, c) = (_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)));
                let v = [
                    _mm256_cvtepi8_epi32(a),
                    _mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)),
                    _mm256_cvtepi8_epi32(c),
                    _mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)),
                ];
                return (v, h2f(blk.d));
            }
            DType::Q4_0 => {
                let blk = &as_blocks::<BlockQ4_0>(b)[0];
                (_mm_loadu_si128(blk.qs.as_ptr() as *const __m128i), h2f(blk.d))
            }
            _ => {
                let blk = &as_blocks::<BlockQ5_0>(b)[0];
                (_mm_loadu_si128(blk.qs.as_ptr() as *const __m128i), h2f(blk.d))
            }
        };
        let m = _mm256_set1_epi32(0xF);
        let (q0, q1) = (_mm256_cvtepu8_epi32(bytes), _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
        let mut v = [_mm256_and_si256(q0, m), _mm256_and_si256(q1, m), _mm256_srli_epi32(q0, 4), _mm256_srli_epi32(q1, 4)];
        if t == DType::Q4_0 {
            let e = _mm256_set1_epi32(8);
            // (A loop, not `map`, whose closure may be left out of line without AVX2.)
            for x in v.iter_mut() {
                *x = _mm256_sub_epi32(*x, e);
            }
        } else {
            let blk = &as_blocks::<BlockQ5_0>(b)[0];
            let qh = _mm256_set1_epi32(u32::from_le_bytes(blk.qh) as i32);
            let (one, e) = (_mm256_set1_epi32(1), _mm256_set1_epi32(16));
            for (g, x) in v.iter_mut().enumerate() {
                let base = 8 * g as i32;
                let idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(base));
                let bit = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qh, idx), one), 4);
                *x = _mm256_sub_epi32(_mm256_or_si256(*x, bit), e);
            }
        }
        (v, d)
    }
}

/// `y[j] = fma(h, q[j] · d, y[j])` over the blocks of a Q8_0, Q5_0 or Q4_0 row; `avx512`
/// selects sixteen lanes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_row(t: DType, row: &[u8], h: f32, y: &mut [f32], avx512: bool) {
    assert!(matches!(t, DType::Q8_0 | DType::Q5_0 | DType::Q4_0));
    if avx512 {
        // SAFETY: the caller detected AVX-512 for `avx512`.
        return unsafe { axpy_row_avx512(t, row, h, y) };
    }
    let ts = t.type_size();
    let hv = _mm256_set1_ps(h);
    for (b, ys) in row.chunks_exact(ts).zip(y.chunks_exact_mut(32)) {
        // SAFETY: `b` is one whole block; `ys` holds its 32 outputs.
        unsafe {
            let (v, d) = values8(t, b);
            let dv = _mm256_set1_ps(d);
            for (g, q) in v.into_iter().enumerate() {
                let w = _mm256_mul_ps(_mm256_cvtepi32_ps(q), dv);
                let p = ys.as_mut_ptr().add(8 * g);
                _mm256_storeu_ps(p, _mm256_fmadd_ps(hv, w, _mm256_loadu_ps(p)));
            }
        }
    }
}

/// Neurons ahead of the one being added whose panel pieces are asked for.
const PANEL_AHEAD: usize = 16;

/// [`super::axpy_panel`] on sixteen lanes: the `2 · NB` output registers stay live across
/// every firing neuron of the panel.
///
/// # Safety
/// AVX-512 F/VL/BW, AVX2, FMA and F16C; `t` is Q8_0, Q5_0 or Q4_0; `y.len() == 32 · NB`;
/// every firing neuron's `NB` blocks at `i · stride` lie in `panel` and `i < h.len()`.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx2,fma,f16c")]
pub unsafe fn axpy_panel_avx512<const NB: usize>(t: DType, panel: &[u8], stride: usize, firing: &[u32], h: &[f32], y: &mut [f32]) {
    // One copy of the loop per type, so the block decoding is straight-line code.
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match t {
            DType::Q8_0 => panel512::<NB>(DType::Q8_0, panel, stride, firing, h, y),
            DType::Q5_0 => panel512::<NB>(DType::Q5_0, panel, stride, firing, h, y),
            _ => panel512::<NB>(DType::Q4_0, panel, stride, firing, h, y),
        }
    }
}

#[inline(always)]
unsafe fn panel512<const NB: usize>(t: DType, panel: &[u8], stride: usize, firing: &[u32], h: &[f32], y: &mut [f32]) {
    let ts = t.type_size();
    // SAFETY (loads, stores): `y` holds 32 · NB values; the pieces and `h` values read are
    // inside their slices (the caller's contract).
    unsafe {
        let mut acc: [[__m512; 2]; NB] = std::array::from_fn(|b| [_mm512_loadu_ps(y.as_ptr().add(32 * b)), _mm512_loadu_ps(y.as_ptr().add(32 * b + 16))]);
        for (n, &i) in firing.iter().enumerate() {
            if let Some(&next) = firing.get(n + PANEL_AHEAD) {
                crate::simd::prefetch_lines(panel.as_ptr().wrapping_add(next as usize * stride), NB * ts, crate::simd::CacheLevel::L1);
            }
            let piece = panel.as_ptr().add(i as usize * stride);
            let hv = _mm512_set1_ps(*h.get_unchecked(i as usize));
            for (b, a) in acc.iter_mut().enumerate() {
                let (v, d) = values16(t, std::slice::from_raw_parts(piece.add(b * ts), ts));
                let dv = _mm512_set1_ps(d);
                a[0] = _mm512_fmadd_ps(hv, _mm512_mul_ps(_mm512_cvtepi32_ps(v[0]), dv), a[0]);
                a[1] = _mm512_fmadd_ps(hv, _mm512_mul_ps(_mm512_cvtepi32_ps(v[1]), dv), a[1]);
            }
        }
        for (b, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(y.as_mut_ptr().add(32 * b), a[0]);
            _mm512_storeu_ps(y.as_mut_ptr().add(32 * b + 16), a[1]);
        }
    }
}

/// [`axpy_panel_avx512`] on eight lanes (`4 · NB` output registers).
///
/// # Safety
/// AVX2, FMA and F16C; otherwise as [`axpy_panel_avx512`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_panel_avx2<const NB: usize>(t: DType, panel: &[u8], stride: usize, firing: &[u32], h: &[f32], y: &mut [f32]) {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match t {
            DType::Q8_0 => panel256::<NB>(DType::Q8_0, panel, stride, firing, h, y),
            DType::Q5_0 => panel256::<NB>(DType::Q5_0, panel, stride, firing, h, y),
            _ => panel256::<NB>(DType::Q4_0, panel, stride, firing, h, y),
        }
    }
}

#[inline(always)]
unsafe fn panel256<const NB: usize>(t: DType, panel: &[u8], stride: usize, firing: &[u32], h: &[f32], y: &mut [f32]) {
    let ts = t.type_size();
    // SAFETY: as in `panel512`.
    unsafe {
        let mut acc: [[__m256; 4]; NB] = std::array::from_fn(|b| std::array::from_fn(|g| _mm256_loadu_ps(y.as_ptr().add(32 * b + 8 * g))));
        for (n, &i) in firing.iter().enumerate() {
            if let Some(&next) = firing.get(n + PANEL_AHEAD) {
                crate::simd::prefetch_lines(panel.as_ptr().wrapping_add(next as usize * stride), NB * ts, crate::simd::CacheLevel::L1);
            }
            let piece = panel.as_ptr().add(i as usize * stride);
            let hv = _mm256_set1_ps(*h.get_unchecked(i as usize));
            for (b, a) in acc.iter_mut().enumerate() {
                let (v, d) = values8(t, std::slice::from_raw_parts(piece.add(b * ts), ts));
                let dv = _mm256_set1_ps(d);
                for g in 0..4 {
                    a[g] = _mm256_fmadd_ps(hv, _mm256_mul_ps(_mm256_cvtepi32_ps(v[g]), dv), a[g]);
                }
            }
        }
        for (b, a) in acc.iter().enumerate() {
            for (g, v) in a.iter().enumerate() {
                _mm256_storeu_ps(y.as_mut_ptr().add(32 * b + 8 * g), *v);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx2,fma,f16c")]
unsafe fn axpy_row_avx512(t: DType, row: &[u8], h: f32, y: &mut [f32]) {
    let ts = t.type_size();
    let hv = _mm512_set1_ps(h);
    for (b, ys) in row.chunks_exact(ts).zip(y.chunks_exact_mut(32)) {
        // SAFETY: `b` is one whole block; `ys` holds its 32 outputs.
        unsafe {
            let (v, d) = values16(t, b);
            let dv = _mm512_set1_ps(d);
            for (g, q) in v.into_iter().enumerate() {
                let w = _mm512_mul_ps(_mm512_cvtepi32_ps(q), dv);
                let p = ys.as_mut_ptr().add(16 * g);
                _mm512_storeu_ps(p, _mm512_fmadd_ps(hv, w, _mm512_loadu_ps(p)));
            }
        }
    }
}

/// [`super::down_block`] for 1 to 8 token rows: AVX-512 (each token's 32 outputs in two
/// registers, the firing test a lane mask of a masked FMA) or AVX2 (four registers, the FMA's
/// result blended in where the neuron fires).
///
/// # Safety
/// The CPU has AVX2 and FMA (AVX-512 F/VL with `avx512`); `h.len() == y.len() <= 8`, every
/// `h` row holds `w.len() / 32` values.
pub unsafe fn down_block(h: &[&[f32]], w: &[f32], y: &mut [[f32; super::DOWN_COLS]], avx512: bool) {
    // SAFETY (all arms): the caller's contract.
    unsafe {
        match (h.len(), avx512) {
            (0, _) => {}
            (8, true) => down_tile512::<8>(h, w, y),
            (4..=7, true) => {
                down_tile512::<4>(&h[..4], w, &mut y[..4]);
                down_block(&h[4..], w, &mut y[4..], true)
            }
            (_, true) => {
                down_tile512::<1>(&h[..1], w, &mut y[..1]);
                down_block(&h[1..], w, &mut y[1..], true)
            }
            (1, false) => down_tile256::<1>(h, w, y),
            (_, false) => {
                down_tile256::<2>(&h[..2], w, &mut y[..2]);
                down_block(&h[2..], w, &mut y[2..], false)
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn down_tile512<const T: usize>(h: &[&[f32]], w: &[f32], y: &mut [[f32; super::DOWN_COLS]]) {
    let n_ff = w.len() / super::DOWN_COLS;
    let zero = _mm512_setzero_ps();
    // SAFETY (loads and stores): `y` rows hold 32 f32; `w` holds n_ff rows of 32; `h` rows
    // hold n_ff values (the caller's contract).
    unsafe {
        let mut acc: [[__m512; 2]; T] = std::array::from_fn(|t| [_mm512_loadu_ps(y[t].as_ptr()), _mm512_loadu_ps(y[t].as_ptr().add(16))]);
        let hp: [*const f32; T] = std::array::from_fn(|t| h[t].as_ptr());
        for i in 0..n_ff {
            let wp = w.as_ptr().add(i * super::DOWN_COLS);
            let (w0, w1) = (_mm512_loadu_ps(wp), _mm512_loadu_ps(wp.add(16)));
            for t in 0..T {
                let hv = _mm512_set1_ps(*hp[t].add(i));
                let fires = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(hv, zero);
                acc[t][0] = _mm512_mask3_fmadd_ps(hv, w0, acc[t][0], fires);
                acc[t][1] = _mm512_mask3_fmadd_ps(hv, w1, acc[t][1], fires);
            }
        }
        for t in 0..T {
            _mm512_storeu_ps(y[t].as_mut_ptr(), acc[t][0]);
            _mm512_storeu_ps(y[t].as_mut_ptr().add(16), acc[t][1]);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn down_tile256<const T: usize>(h: &[&[f32]], w: &[f32], y: &mut [[f32; super::DOWN_COLS]]) {
    let n_ff = w.len() / super::DOWN_COLS;
    let zero = _mm256_setzero_ps();
    // SAFETY: as `down_tile512`.
    unsafe {
        let mut acc: [[__m256; 4]; T] = std::array::from_fn(|t| std::array::from_fn(|v| _mm256_loadu_ps(y[t].as_ptr().add(8 * v))));
        let hp: [*const f32; T] = std::array::from_fn(|t| h[t].as_ptr());
        for i in 0..n_ff {
            let wp = w.as_ptr().add(i * super::DOWN_COLS);
            let wv: [__m256; 4] = std::array::from_fn(|v| _mm256_loadu_ps(wp.add(8 * v)));
            for t in 0..T {
                let hv = _mm256_set1_ps(*hp[t].add(i));
                let fires = _mm256_cmp_ps::<_CMP_NEQ_UQ>(hv, zero);
                for v in 0..4 {
                    acc[t][v] = _mm256_blendv_ps(acc[t][v], _mm256_fmadd_ps(hv, wv[v], acc[t][v]), fires);
                }
            }
        }
        for (yt, at) in y.iter_mut().zip(&acc) {
            for (v, a) in at.iter().enumerate() {
                _mm256_storeu_ps(yt.as_mut_ptr().add(8 * v), *a);
            }
        }
    }
}
