//! Sparse feed-forward kernels on 8 (AVX2) and 16 (AVX-512) lanes, bit-identical to the
//! portable twins: every lane computes `fma(h, w, y)` with `w` the type's `to_float` value,
//! which for Q8_0, Q5_0 and Q4_0 is the exact product `q · d`.
#![allow(clippy::missing_safety_doc)]

use super::portable;
use crate::quant::blocks::{as_blocks, BlockQ4_0, BlockQ5_0, BlockQ8_0};
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
                ([_mm512_cvtepi8_epi32(_mm_loadu_si128(p)), _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(1)))], blk.d.to_f32())
            }
            DType::Q4_0 => {
                let blk = &as_blocks::<BlockQ4_0>(b)[0];
                let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.qs.as_ptr() as *const __m128i));
                let (m, e) = (_mm512_set1_epi32(0xF), _mm512_set1_epi32(8));
                let lo = _mm512_sub_epi32(_mm512_and_si512(q, m), e);
                let hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), e);
                ([lo, hi], blk.d.to_f32())
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
                ([_mm512_sub_epi32(lo, e), _mm512_sub_epi32(hi, e)], blk.d.to_f32())
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
                return (v, blk.d.to_f32());
            }
            DType::Q4_0 => {
                let blk = &as_blocks::<BlockQ4_0>(b)[0];
                (_mm_loadu_si128(blk.qs.as_ptr() as *const __m128i), blk.d.to_f32())
            }
            _ => {
                let blk = &as_blocks::<BlockQ5_0>(b)[0];
                (_mm_loadu_si128(blk.qs.as_ptr() as *const __m128i), blk.d.to_f32())
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
#[target_feature(enable = "avx2,fma")]
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

/// `y[j] = fma(h[n], w_n[j], y[j])` for the rows `n = 0, 1, 2, 3` in turn (four Q8_0, Q5_0 or
/// Q4_0 rows of `y.len()` values): the same bits as four [`axpy_row`] calls, with `y` loaded
/// and stored once per block instead of four times.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub unsafe fn axpy_row4_avx512(t: DType, rows: [&[u8]; 4], h: [f32; 4], y: &mut [f32]) {
    assert!(matches!(t, DType::Q8_0 | DType::Q5_0 | DType::Q4_0));
    let ts = t.type_size();
    let nb = y.len() / 32;
    assert!(rows.iter().all(|r| r.len() == nb * ts) && y.len() == nb * 32);
    let hv = [_mm512_set1_ps(h[0]), _mm512_set1_ps(h[1]), _mm512_set1_ps(h[2]), _mm512_set1_ps(h[3])];
    for b in 0..nb {
        // SAFETY: block b of every row lies inside it (lengths asserted); `y` holds 32 · nb values.
        unsafe {
            let p = y.as_mut_ptr().add(32 * b);
            let (mut y0, mut y1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            for n in 0..4 {
                let (v, d) = values16(t, &rows[n][b * ts..(b + 1) * ts]);
                let dv = _mm512_set1_ps(d);
                y0 = _mm512_fmadd_ps(hv[n], _mm512_mul_ps(_mm512_cvtepi32_ps(v[0]), dv), y0);
                y1 = _mm512_fmadd_ps(hv[n], _mm512_mul_ps(_mm512_cvtepi32_ps(v[1]), dv), y1);
            }
            _mm512_storeu_ps(p, y0);
            _mm512_storeu_ps(p.add(16), y1);
        }
    }
}

/// [`axpy_row4_avx512`] on eight lanes.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn axpy_row4_avx2(t: DType, rows: [&[u8]; 4], h: [f32; 4], y: &mut [f32]) {
    assert!(matches!(t, DType::Q8_0 | DType::Q5_0 | DType::Q4_0));
    let ts = t.type_size();
    let nb = y.len() / 32;
    assert!(rows.iter().all(|r| r.len() == nb * ts) && y.len() == nb * 32);
    let hv = [_mm256_set1_ps(h[0]), _mm256_set1_ps(h[1]), _mm256_set1_ps(h[2]), _mm256_set1_ps(h[3])];
    for b in 0..nb {
        // SAFETY: as in `axpy_row4_avx512`.
        unsafe {
            let p = y.as_mut_ptr().add(32 * b);
            let mut acc = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
            for n in 0..4 {
                let (v, d) = values8(t, &rows[n][b * ts..(b + 1) * ts]);
                let dv = _mm256_set1_ps(d);
                for g in 0..4 {
                    acc[g] = _mm256_fmadd_ps(hv[n], _mm256_mul_ps(_mm256_cvtepi32_ps(v[g]), dv), acc[g]);
                }
            }
            for (g, a) in acc.into_iter().enumerate() {
                _mm256_storeu_ps(p.add(8 * g), a);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
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
