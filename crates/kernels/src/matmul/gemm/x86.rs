//! AVX-512 VNNI (256-bit, AVX512VL) twin of `gemm::panel_portable`: lanes are the panel's 8
//! columns; `vpdpbusd` adds 4 u8×i8 products per lane; four activation rows share every
//! loaded weight vector. Bit-identical to the portable kernel (exact integer sums, the same
//! float operations per lane in the same order).

#![allow(clippy::missing_safety_doc)]

use super::panel::{act_block_with, Act, PACKED_BLOCK, PANEL};
use crate::simd::x86::h2f;
use std::arch::x86_64::*;

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
pub fn panel(
    panel: &[u8],
    nb: usize,
    o: i32,
    act: Act,
    split: bool,
    x: &[u8],
    xrb: usize,
    ysum: &[i32],
    rows: usize,
    mut store: impl FnMut(usize, &[f32; PANEL]),
) {
    assert!(panel.len() >= nb * PACKED_BLOCK && x.len() >= rows * xrb);
    let mut r = 0;
    // Split and unsplit kernels are separate instances: the unsplit one keeps one set of
    // integer accumulators (the second set is constant zero and folds away).
    while r + 4 <= rows {
        if split {
            rows_block::<4, true>(panel, nb, o, act, x, xrb, ysum, r, &mut store);
        } else {
            rows_block::<4, false>(panel, nb, o, act, x, xrb, ysum, r, &mut store);
        }
        r += 4;
    }
    while r < rows {
        if split {
            rows_block::<1, true>(panel, nb, o, act, x, xrb, ysum, r, &mut store);
        } else {
            rows_block::<1, false>(panel, nb, o, act, x, xrb, ysum, r, &mut store);
        }
        r += 1;
    }
}

#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
fn rows_block<const R: usize, const SPLIT: bool>(
    panel: &[u8],
    nb: usize,
    o: i32,
    act: Act,
    x: &[u8],
    xrb: usize,
    ysum: &[i32],
    r0: usize,
    store: &mut impl FnMut(usize, &[f32; PANEL]),
) {
    let mut accf = [_mm256_setzero_ps(); R];
    let rows: [&[u8]; R] = std::array::from_fn(|j| &x[(r0 + j) * xrb..(r0 + j + 1) * xrb]);
    for b in 0..nb {
        let blk = &panel[b * PACKED_BLOCK..(b + 1) * PACKED_BLOCK];
        // A plain loop, not `array::from_fn`: its closure was not inlined here (9% of the time).
        let mut acts: [(f32, f32, &[i8; 32]); R] = [(0.0, 0.0, &[0; 32]); R];
        for (a, row) in acts.iter_mut().zip(rows) {
            *a = act_block_with(row, b, act, |h| h2f(h));
        }
        // Integer sums of the two 16-element halves (groups 0..4, 4..8) kept apart.
        let mut acci = [[_mm256_setzero_si256(); R]; 2];
        for g in 0..8 {
            // SAFETY: blk has PACKED_BLOCK ≥ 256 bytes; g * 32 + 32 ≤ 256.
            let wv = unsafe { _mm256_loadu_si256(blk.as_ptr().add(g * 32) as *const __m256i) };
            for j in 0..R {
                let y = acts[j].2;
                let y4 = i32::from_le_bytes([y[g * 4] as u8, y[g * 4 + 1] as u8, y[g * 4 + 2] as u8, y[g * 4 + 3] as u8]);
                let h = if SPLIT { g / 4 } else { 0 };
                acci[h][j] = _mm256_dpbusd_epi32(acci[h][j], wv, _mm256_set1_epi32(y4));
            }
        }
        // SAFETY: scales at bytes 256..288 and mins at 288..320 of the block.
        let (dw, mw) = unsafe {
            (_mm256_loadu_ps(blk.as_ptr().add(256) as *const f32), _mm256_loadu_ps(blk.as_ptr().add(288) as *const f32))
        };
        for j in 0..R {
            let ys = &ysum[((r0 + j) * nb + b) * 2..((r0 + j) * nb + b) * 2 + 2];
            let (dx, sx, _) = acts[j];
            let dxv = _mm256_set1_ps(dx);
            if SPLIT {
                let lo = _mm256_sub_epi32(acci[0][j], _mm256_set1_epi32(o * ys[0]));
                let hi = _mm256_sub_epi32(acci[1][j], _mm256_set1_epi32(o * ys[1]));
                accf[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(dw, dxv), accf[j]);
                accf[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(mw, dxv), accf[j]);
                continue;
            }
            let mut s = _mm256_add_epi32(acci[0][j], acci[1][j]);
            if o != 0 {
                s = _mm256_sub_epi32(s, _mm256_set1_epi32(o * (ys[0] + ys[1])));
            }
            accf[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, dxv), accf[j]);
            if act != Act::Q8_0 {
                accf[j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx), accf[j]);
            }
        }
    }
    for j in 0..R {
        let mut out = [0f32; PANEL];
        // SAFETY: 8 f32 of stack memory.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), accf[j]) };
        store(r0 + j, &out);
    }
}
