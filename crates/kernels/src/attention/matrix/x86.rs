//! AVX-512 column-key attention ([`ColumnOps`] on 16 lanes): the scores of a block with lanes
//! over its 16 cells (one widened key vector per dimension, shared by the vectors summed at
//! once), the softmax step on those lanes, and the values with lanes over dimensions (one
//! widened value row per cell, shared by up to four vectors). Bit for bit `model.rs`.

use super::drive::{self, ColumnOps};
use super::model::C;
use crate::attention::types::{KvRows, MatrixScratch, NextRows};
use crate::exp::expf_ggml;
use crate::exp::x86::expf_ggml16;
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;
use std::arch::x86_64::*;

/// The AVX-512 instance; made only by [`attend_rows`], whose target features its inlined
/// methods compile with.
struct Avx512Ops(());

/// `drive::attend_rows` on AVX-512.
///
/// # Safety
/// AVX-512 F/BW/VL, AVX2, FMA and F16C; the driver's shapes (it asserts them).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn attend_rows(q: &[&[f32]], heads: usize, mask: &dyn Fn(usize, usize) -> u16, n_blocks: usize, kv: &KvRows, scale: f32, ms: &mut MatrixScratch, next: &mut NextRows, out: &mut [&mut [f32]]) {
    drive::attend_rows(&Avx512Ops(()), q, heads, mask, n_blocks, kv, scale, ms, next, out)
}

impl ColumnOps for Avx512Ops {
    type Scores = __m512;

    #[inline(always)]
    fn zero(&self) -> __m512 {
        // SAFETY: AVX-512 F (this instance exists only inside `attend_rows`).
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    fn scores<const NH: usize>(&self, q: &[*const f32], hd: usize, kt: *const f16, ask: Option<(*const u8, *const u8)>) -> [__m512; NH] {
        assert!(q.len() >= NH);
        // SAFETY: AVX-512 F and F16C (this instance exists only inside `attend_rows`); d < hd
        // reads the 16 F16 of dimension d inside the block and element d of each query (the
        // trait's contract).
        unsafe {
            let mut s = [_mm512_setzero_ps(); NH];
            let lines = C * 2 * hd / 64;
            for d in 0..hd {
                if let Some((k, v)) = ask.filter(|_| d < lines) {
                    prefetch_lines(k.wrapping_add(d * 64), 64, CacheLevel::L2);
                    prefetch_lines(v.wrapping_add(d * 64), 64, CacheLevel::L2);
                }
                let k = _mm512_cvtph_ps(_mm256_loadu_si256(kt.add(d * C) as *const __m256i));
                for (i, s) in s.iter_mut().enumerate() {
                    *s = _mm512_fmadd_ps(_mm512_set1_ps(*q[i].add(d)), k, *s);
                }
            }
            s
        }
    }

    #[inline(always)]
    fn softmax(&self, ms: &mut MatrixScratch, h: usize, s: __m512, vis: u16, scale: f32) {
        if vis == 0 {
            ms.p[h] = [0.0; C];
            return;
        }
        // SAFETY: AVX-512 F (this instance exists only inside `attend_rows`); `p[h]` and
        // `l[h]` are 16 f32 each.
        unsafe {
            let x = _mm512_mul_ps(s, _mm512_set1_ps(scale));
            let m_new = ms.m[h].max(_mm512_mask_reduce_max_ps(vis, x));
            let corr = expf_ggml(ms.m[h] - m_new);
            let p = _mm512_maskz_mov_ps(vis, expf_ggml16(_mm512_sub_ps(x, _mm512_set1_ps(m_new))));
            let l = _mm512_loadu_ps(ms.l[h].as_ptr());
            _mm512_storeu_ps(ms.l[h].as_mut_ptr(), _mm512_fmadd_ps(l, _mm512_set1_ps(corr), p));
            _mm512_storeu_ps(ms.p[h].as_mut_ptr(), p);
            ms.m[h] = m_new;
            ms.corr[h] = corr;
        }
    }

    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // vectors and lanes index several arrays at once
    fn values<const NH: usize, const NV: usize>(&self, ms: &mut MatrixScratch, h0: usize, hd: usize, vb: *const f16, vis: &[u16]) {
        assert!(h0 + NH <= ms.p.len() && (h0 + NH) * hd <= ms.acc.len() && hd.is_multiple_of(NV * 16) && vis.len() >= NH);
        // SAFETY: AVX-512 F and F16C (this instance exists only inside `attend_rows`); rows
        // j < 16 of `vb` hold `hd` F16 (the trait's contract); accumulator indices stay below
        // (h0 + NH)·hd (asserted).
        unsafe {
            let mut nz = [0u16; NH];
            let mut p = [[0f32; C]; NH];
            for i in 0..NH {
                p[i] = ms.p[h0 + i];
                nz[i] = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(_mm512_loadu_ps(p[i].as_ptr()), _mm512_setzero_ps());
            }
            let any = nz.iter().fold(0u16, |a, z| a | z);
            for d0 in (0..hd).step_by(NV * 16) {
                let mut w = [[_mm512_setzero_ps(); NV]; NH];
                let mut cells = any;
                while cells != 0 {
                    let j = cells.trailing_zeros() as usize;
                    cells &= cells - 1;
                    let mut v = [_mm512_setzero_ps(); NV];
                    for (x, vx) in v.iter_mut().enumerate() {
                        *vx = _mm512_cvtph_ps(_mm256_loadu_si256(vb.add(j * hd + d0 + 16 * x) as *const __m256i));
                    }
                    for i in 0..NH {
                        let k = 0u16.wrapping_sub(nz[i] >> j & 1);
                        let pj = _mm512_set1_ps(p[i][j]);
                        for x in 0..NV {
                            w[i][x] = _mm512_mask3_fmadd_ps(pj, v[x], w[i][x], k);
                        }
                    }
                }
                for i in 0..NH {
                    if vis[i] == 0 {
                        continue;
                    }
                    let h = h0 + i;
                    let c = _mm512_set1_ps(ms.corr[h]);
                    for x in 0..NV {
                        let a = ms.acc.as_mut_ptr().add(h * hd + d0 + 16 * x);
                        _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_loadu_ps(a), c, w[i][x]));
                    }
                }
            }
        }
    }
}
