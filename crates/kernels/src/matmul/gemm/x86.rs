//! x86 twins of `gemm::panel_portable`: lanes are the panel's 8 columns; four activation rows
//! share every loaded weight vector. AVX-512 VNNI (256-bit, AVX512VL, [`panel`]): `vpdpbusd`
//! adds 4 u8×i8 products per lane. AVX2 ([`panel_avx2`]): `maddubs` of two groups added as i16
//! (each pair `u·y + u·y` ≤ 63·128·2, two of them ≤ 32 256: no saturation for codes up to 63,
//! so not Q8_0, whose codes reach 255), then `madd` with ones into the i32 lanes. Both are
//! bit-identical to the portable kernel (exact integer sums, the same float operations per
//! lane in the same order).

#![allow(clippy::missing_safety_doc)]

use super::panel::{act_block_with, Act, PanelJob, PACKED_BLOCK, PANEL};
use crate::simd::x86::h2f;
use std::arch::x86_64::*;

/// The panel kernel with AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub fn panel(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], store: impl FnMut(usize, &[f32; PANEL])) {
    // SAFETY: the features `panel_impl::<true>` uses are enabled here.
    unsafe { panel_impl::<true>(job, acc0, store) }
}

/// The panel kernel with AVX2 (codes up to 63: every supported type but Q8_0).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn panel_avx2(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], store: impl FnMut(usize, &[f32; PANEL])) {
    assert!(job.o <= 32, "Q8_0's codes (up to 255) would saturate the AVX2 panel's i16 sums");
    // SAFETY: the features `panel_impl::<false>` uses are enabled here.
    unsafe { panel_impl::<false>(job, acc0, store) }
}

/// # Safety
/// AVX2, FMA and F16C present, and with `VNNI` AVX-512 F/VL/VNNI.
#[inline(always)]
unsafe fn panel_impl<const VNNI: bool>(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], mut store: impl FnMut(usize, &[f32; PANEL])) {
    let PanelJob { panel, nb, b1, x, xrb, split, rows, mr, .. } = job;
    assert!(panel.len() >= nb * PACKED_BLOCK && b1 <= nb && x.len() >= rows * xrb);
    // Split and unsplit kernels are separate instances: the unsplit one keeps one set of
    // integer accumulators (the second set is constant zero and folds away). One instance per
    // register tile height of `schedule::PANEL_MR`; the rows left over go one at a time. (A
    // plain loop, not a closure: a closure would not inherit this function's target features,
    // and the intrinsics inlined into it would become calls.)
    let (acc0, store) = (&acc0, &mut store);
    let mut r = 0;
    while r < rows {
        let h = if r + mr.clamp(1, 8) <= rows { mr.clamp(1, 8) } else { 1 };
        // SAFETY (every arm): the caller's features.
        unsafe {
            match (h, split) {
                (8, false) => rows_block::<8, false, VNNI>(job, r, acc0, store),
                (8, true) => rows_block::<8, true, VNNI>(job, r, acc0, store),
                (6, false) => rows_block::<6, false, VNNI>(job, r, acc0, store),
                (6, true) => rows_block::<6, true, VNNI>(job, r, acc0, store),
                (4, false) => rows_block::<4, false, VNNI>(job, r, acc0, store),
                (4, true) => rows_block::<4, true, VNNI>(job, r, acc0, store),
                (2, false) => rows_block::<2, false, VNNI>(job, r, acc0, store),
                (2, true) => rows_block::<2, true, VNNI>(job, r, acc0, store),
                (_, false) => rows_block::<1, false, VNNI>(job, r, acc0, store),
                (_, true) => rows_block::<1, true, VNNI>(job, r, acc0, store),
            }
        }
        r += h;
    }
}

/// # Safety
/// As [`panel_impl`].
#[inline(always)]
unsafe fn rows_block<const R: usize, const SPLIT: bool, const VNNI: bool>(
    job: PanelJob,
    r0: usize,
    acc0: &impl Fn(usize) -> [f32; PANEL],
    store: &mut impl FnMut(usize, &[f32; PANEL]),
) {
    let PanelJob { panel, nb, b0, b1, o, act, x, xrb, ysum, .. } = job;
    let mut accf = [_mm256_setzero_ps(); R];
    for (j, a) in accf.iter_mut().enumerate() {
        // SAFETY: 8 f32 of stack memory.
        *a = unsafe { _mm256_loadu_ps(acc0(r0 + j).as_ptr()) };
    }
    let rows: [&[u8]; R] = std::array::from_fn(|j| &x[(r0 + j) * xrb..(r0 + j + 1) * xrb]);
    for b in b0..b1 {
        let blk = &panel[b * PACKED_BLOCK..(b + 1) * PACKED_BLOCK];
        // A plain loop, not `array::from_fn`: its closure was not inlined here (9% of the time).
        let mut acts: [(f32, f32, &[i8; 32]); R] = [(0.0, 0.0, &[0; 32]); R];
        for (a, row) in acts.iter_mut().zip(rows) {
            *a = act_block_with(row, b, act, |h| h2f(h));
        }
        // Integer sums of the two 16-element halves (groups 0..4, 4..8) kept apart.
        let mut acci = [[_mm256_setzero_si256(); R]; 2];
        let y4 = |j: usize, g: usize| {
            let y = acts[j].2;
            _mm256_set1_epi32(i32::from_le_bytes([y[g * 4] as u8, y[g * 4 + 1] as u8, y[g * 4 + 2] as u8, y[g * 4 + 3] as u8]))
        };
        // SAFETY (loads): blk has PACKED_BLOCK ≥ 256 bytes; g * 32 + 32 ≤ 256.
        let wv = |g: usize| unsafe { _mm256_loadu_si256(blk.as_ptr().add(g * 32) as *const __m256i) };
        if VNNI {
            for g in 0..8 {
                let w = wv(g);
                for j in 0..R {
                    let h = if SPLIT { g / 4 } else { 0 };
                    acci[h][j] = _mm256_dpbusd_epi32(acci[h][j], w, y4(j, g));
                }
            }
        } else {
            let ones = _mm256_set1_epi16(1);
            for g in (0..8).step_by(2) {
                let (w0, w1) = (wv(g), wv(g + 1));
                for j in 0..R {
                    let h = if SPLIT { g / 4 } else { 0 };
                    let s = _mm256_add_epi16(_mm256_maddubs_epi16(w0, y4(j, g)), _mm256_maddubs_epi16(w1, y4(j, g + 1)));
                    acci[h][j] = _mm256_add_epi32(acci[h][j], _mm256_madd_epi16(s, ones));
                }
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
