//! AVX2 column-key attention ([`ColumnOps`] on 2 × 8 lanes): the AVX-512 version's steps with
//! a block's 16 cells in two vectors (scores) and 16 dimensions per pass in two (values); lane
//! masks from the visibility bits by compare, the `p ≠ 0` rule by a branch per vector and cell.
//! At most six vectors' scores at once (twelve accumulators of sixteen registers). Bit for bit
//! `model.rs`.

use super::drive::{self, ColumnOps};
use super::widen::Widen;
use super::pipe;
use super::model::C;
use crate::attention::types::{KvRows, MatrixScratch, NextRows};
use crate::exp::x86::expf_ggml8;
use crate::simd::x86::hmax_f32x8;
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;
use std::arch::x86_64::*;

/// The AVX2 instance; made only by [`attend_rows`], whose target features its inlined methods
/// compile with.
struct Avx2Ops(());

/// `drive::attend_rows` on AVX2.
///
/// # Safety
/// AVX2, FMA and F16C; the driver's shapes (it asserts them).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_rows(q: &[&[f32]], heads: usize, mask: &dyn Fn(usize, usize) -> u16, n_blocks: usize, kv: &KvRows, scale: f32, ms: &mut MatrixScratch, next: &mut NextRows, out: &mut [&mut [f32]]) {
    drive::attend_rows(&Avx2Ops(()), q, heads, mask, n_blocks, kv, scale, ms, next, out)
}

/// A pipelined attention phase (`pipe.rs`) on AVX2.
///
/// # Safety
/// AVX2, FMA and F16C; a head dimension that is a multiple of 16.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run_task(task: &pipe::Task, ms: &mut MatrixScratch) -> usize {
    pipe::run_task(&Avx2Ops(()), task, ms)
}

/// All-ones lanes where bit `i` of `bits` is set (lane `i`).
#[inline(always)]
fn lane_mask(bits: u16) -> __m256 {
    // SAFETY: AVX2 (called only from `Avx2Ops`' methods).
    unsafe {
        let b = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits as i32), b), b))
    }
}

impl ColumnOps for Avx2Ops {
    type Scores = [__m256; 2];
    const SCORE_HEADS: usize = 6;
    const WIDEN: Widen = Widen::X86;

    #[inline(always)]
    fn zero(&self) -> [__m256; 2] {
        // SAFETY: AVX (this instance exists only inside `attend_rows`).
        unsafe { [_mm256_setzero_ps(); 2] }
    }

    #[inline(always)]
    fn store(&self, s: [__m256; 2], out: &mut [f32; C]) {
        // SAFETY: AVX (this instance exists only inside its entry points); 16 f32.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), s[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), s[1])
        }
    }

    #[inline(always)]
    fn load(&self, p: &[f32; C]) -> [__m256; 2] {
        // SAFETY: as `store`.
        unsafe { [_mm256_loadu_ps(p.as_ptr()), _mm256_loadu_ps(p.as_ptr().add(8))] }
    }

    #[inline(always)]
    fn scores<const NH: usize>(&self, q: &[*const f32], hd: usize, kt: *const f16, ask: Option<(*const u8, *const u8)>) -> [[__m256; 2]; NH] {
        assert!(q.len() >= NH);
        // SAFETY: AVX2, FMA, F16C (this instance exists only inside `attend_rows`); d < hd
        // reads the 16 F16 of dimension d inside the block and element d of each query (the
        // trait's contract).
        unsafe {
            let mut s = [[_mm256_setzero_ps(); 2]; NH];
            let lines = C * 2 * hd / 64;
            for d in 0..hd {
                if let Some((k, v)) = ask.filter(|_| d < lines) {
                    prefetch_lines(k.wrapping_add(d * 64), 64, CacheLevel::L2);
                    prefetch_lines(v.wrapping_add(d * 64), 64, CacheLevel::L2);
                }
                let lo = _mm256_cvtph_ps(_mm_loadu_si128(kt.add(d * C) as *const __m128i));
                let hi = _mm256_cvtph_ps(_mm_loadu_si128(kt.add(d * C + 8) as *const __m128i));
                for (i, s) in s.iter_mut().enumerate() {
                    let b = _mm256_set1_ps(*q[i].add(d));
                    s[0] = _mm256_fmadd_ps(b, lo, s[0]);
                    s[1] = _mm256_fmadd_ps(b, hi, s[1]);
                }
            }
            s
        }
    }

    #[inline(always)]
    fn softmax(&self, s: [__m256; 2], vis: u16, scale: f32, m: &mut f32, l: &mut [f32; C], p: &mut [f32; C]) -> f32 {
        if vis == 0 {
            *p = [0.0; C];
            return 1.0;
        }
        // SAFETY: AVX2, FMA (this instance exists only inside `attend_rows`); `p` and `l` are
        // 16 f32 each.
        unsafe {
            let sc = _mm256_set1_ps(scale);
            let x = [_mm256_mul_ps(s[0], sc), _mm256_mul_ps(s[1], sc)];
            let mk = [lane_mask(vis & 0xFF), lane_mask(vis >> 8)];
            let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
            let xm = _mm256_max_ps(_mm256_blendv_ps(ninf, x[0], mk[0]), _mm256_blendv_ps(ninf, x[1], mk[1]));
            let m_new = m.max(hmax_f32x8(xm));
            let corr = super::model::rescale_factor(*m, m_new);
            let (mv, cv) = (_mm256_set1_ps(m_new), _mm256_set1_ps(corr));
            for k in 0..2 {
                let e = _mm256_and_ps(expf_ggml8(_mm256_sub_ps(x[k], mv)), mk[k]);
                let sums = _mm256_loadu_ps(l.as_ptr().add(8 * k));
                _mm256_storeu_ps(l.as_mut_ptr().add(8 * k), _mm256_fmadd_ps(sums, cv, e));
                _mm256_storeu_ps(p.as_mut_ptr().add(8 * k), e);
            }
            *m = m_new;
            corr
        }
    }

    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // vectors and lanes index several arrays at once
    fn values<const NH: usize, const NV: usize>(&self, p: &[[f32; C]], corr: &[f32], vis: &[u16], acc: &mut [f32], hd: usize, vb: *const f16) {
        assert!(p.len() >= NH && corr.len() >= NH && NH * hd <= acc.len() && hd.is_multiple_of(16) && vis.len() >= NH);
        // SAFETY: AVX2, FMA, F16C (this instance exists only inside `attend_rows`); rows j < 16
        // of `vb` hold `hd` F16 (the trait's contract); accumulator indices stay below
        // NH·hd (asserted).
        unsafe {
            let mut nz = [0u16; NH];
            for i in 0..NH {
                nz[i] = drive::nonzero(&p[i]);
            }
            let any = nz.iter().fold(0u16, |a, z| a | z);
            // 16 dimensions (two vectors) per pass: NH · 2 accumulators.
            for d0 in (0..hd).step_by(16) {
                let mut w = [[_mm256_setzero_ps(); 2]; NH];
                let mut cells = any;
                while cells != 0 {
                    let j = cells.trailing_zeros() as usize;
                    cells &= cells - 1;
                    let r = vb.add(j * hd + d0);
                    let v = [_mm256_cvtph_ps(_mm_loadu_si128(r as *const __m128i)), _mm256_cvtph_ps(_mm_loadu_si128(r.add(8) as *const __m128i))];
                    for i in 0..NH {
                        if nz[i] >> j & 1 != 0 {
                            let pj = _mm256_set1_ps(p[i][j]);
                            w[i][0] = _mm256_fmadd_ps(pj, v[0], w[i][0]);
                            w[i][1] = _mm256_fmadd_ps(pj, v[1], w[i][1]);
                        }
                    }
                }
                for i in 0..NH {
                    if vis[i] == 0 {
                        continue;
                    }
                    let c = _mm256_set1_ps(corr[i]);
                    for x in 0..2 {
                        let a = acc.as_mut_ptr().add(i * hd + d0 + 8 * x);
                        _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_loadu_ps(a), c, w[i][x]));
                    }
                }
            }
        }
    }
}
