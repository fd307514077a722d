//! AVX-512 column-key attention ([`ColumnOps`] on 16 lanes): the scores of a block with lanes
//! over its 16 cells (one widened key vector per dimension, shared by the vectors summed at
//! once), the softmax step on those lanes, and the values with lanes over dimensions (one
//! widened value row per cell, shared by up to four vectors). Bit for bit `model.rs`.
//!
//! A prefill call holds up to 64 vectors (rows × heads), summed 8 at a time for the scores and
//! 4 at a time for the values, so each block's F16 keys and values would be widened 8 and 16
//! times; such a call widens each block to f32 once ([`Shared`]) and every group reads that.
//! The widening is exact, so the products are the same.

use super::drive::{self, ColumnOps};
use super::widen::Widen;
use super::pipe;
use super::model::C;
use crate::attention::types::{KvRows, MatrixScratch, NextRows};
use crate::exp::x86::expf_ggml16;
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// The AVX-512 instance; made only by [`attend_rows`] and [`run_task`], whose target features
/// its inlined methods compile with.
struct Avx512Ops {
    /// A call of several groups of vectors: the current block widened to f32 once.
    shared: Option<RefCell<Shared>>,
}

/// The current block's keys (`[hd][16]`) and values (`[16][hd]`) as f32.
struct Shared {
    k: Vec<f32>,
    v: Vec<f32>,
}

/// `dst.len()` F16 at `src` as f32 in `dst` (exact).
///
/// # Safety
/// AVX-512 F and F16C; `dst.len()` F16 readable at `src`, a multiple of 16 (asserted).
#[inline(always)]
unsafe fn widen(src: *const f16, dst: &mut [f32]) {
    assert!(dst.len().is_multiple_of(16));
    for i in (0..dst.len()).step_by(16) {
        // SAFETY: i + 16 ≤ dst.len(), readable at `src` (the caller's contract).
        unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(_mm256_loadu_si256(src.add(i) as *const __m256i))) };
    }
}

/// `drive::attend_rows` on AVX-512.
///
/// # Safety
/// AVX-512 F/BW/VL, AVX2, FMA and F16C; the driver's shapes (it asserts them).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn attend_rows(q: &[&[f32]], heads: usize, mask: &dyn Fn(usize, usize) -> u16, n_blocks: usize, kv: &KvRows, scale: f32, ms: &mut MatrixScratch, next: &mut NextRows, out: &mut [&mut [f32]]) {
    // One group of vectors (decode) widens each block once anyway, as it reads it.
    let share = q.len() * heads > drive::SCORE_HEADS && ms.kf.len() >= C * kv.head_dim && ms.vf.len() >= C * kv.head_dim;
    // The scratch's blocks are lent to the instance for the call (moved, not copied).
    let shared = share.then(|| RefCell::new(Shared { k: std::mem::take(&mut ms.kf), v: std::mem::take(&mut ms.vf) }));
    let ops = Avx512Ops { shared };
    drive::attend_rows(&ops, q, heads, mask, n_blocks, kv, scale, ms, next, out);
    if let Some(s) = ops.shared {
        let s = s.into_inner();
        (ms.kf, ms.vf) = (s.k, s.v);
    }
}

/// A pipelined attention phase (`pipe.rs`) on AVX-512.
///
/// # Safety
/// AVX-512 F/BW/VL, AVX2, FMA and F16C; a head dimension that is a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn run_task(task: &pipe::Task, ms: &mut MatrixScratch) -> usize {
    pipe::run_task(&Avx512Ops { shared: None }, task, ms)
}

impl Avx512Ops {
    /// The current block's keys as f32 (`block_read` widened them), if this call shares them.
    #[inline(always)]
    fn keys_f32(&self) -> Option<*const f32> {
        self.shared.as_ref().map(|s| s.borrow().k.as_ptr())
    }

    /// The current block's values as f32, if this call shares them.
    #[inline(always)]
    fn values_f32(&self) -> Option<*const f32> {
        self.shared.as_ref().map(|s| s.borrow().v.as_ptr())
    }
}

/// One dimension `d` of [`ColumnOps::scores`]: the keys of `d` (from `kf` as f32, else `kt` as
/// F16) times each query's element `d`, into its scores.
///
/// # Safety
/// AVX-512 F and F16C; `scores`' contract (`d < hd`).
#[inline(always)]
unsafe fn score_step<const NH: usize>(qs: &[*const f32; NH], kf: Option<*const f32>, kt: *const f16, d: usize, s: &mut [__m512; NH]) {
    // SAFETY: the caller's contract.
    unsafe {
        let k = match kf {
            Some(kf) => _mm512_loadu_ps(kf.add(d * C)),
            None => _mm512_cvtph_ps(_mm256_loadu_si256(kt.add(d * C) as *const __m256i)),
        };
        for (i, s) in s.iter_mut().enumerate() {
            *s = _mm512_fmadd_ps(_mm512_set1_ps(*qs[i].add(d)), k, *s);
        }
    }
}

impl ColumnOps for Avx512Ops {
    type Scores = __m512;
    const WIDEN: Widen = Widen::X86;

    #[inline(always)]
    fn block_read(&self, kt: *const f16, vb: *const f16, hd: usize) {
        if let Some(s) = &self.shared {
            let s = &mut *s.borrow_mut();
            // SAFETY: AVX-512 F and F16C (this instance exists only inside its entry points);
            // hd · 16 F16 at `kt` and at `vb` (the trait's contract), at most the blocks' room
            // (`attend_rows` shares only then).
            unsafe {
                widen(kt, &mut s.k[..hd * C]);
                widen(vb, &mut s.v[..hd * C]);
            }
        }
    }

    #[inline(always)]
    fn zero(&self) -> __m512 {
        // SAFETY: AVX-512 F (this instance exists only inside `attend_rows`).
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    fn store(&self, s: __m512, out: &mut [f32; C]) {
        // SAFETY: AVX-512 F (this instance exists only inside its entry points); 16 f32.
        unsafe {
            _mm512_storeu_ps(out.as_mut_ptr(), s)
        }
    }

    #[inline(always)]
    fn load(&self, p: &[f32; C]) -> __m512 {
        // SAFETY: as `store`.
        unsafe { _mm512_loadu_ps(p.as_ptr()) }
    }

    #[inline(always)]
    fn scores<const NH: usize>(&self, q: &[*const f32], hd: usize, kt: *const f16, ask: Option<(*const u8, *const u8)>) -> [__m512; NH] {
        assert!(q.len() >= NH);
        // SAFETY: AVX-512 F and F16C (this instance exists only inside `attend_rows`); d < hd
        // reads the 16 F16 of dimension d inside the block and element d of each query (the
        // trait's contract).
        unsafe {
            let mut s = [_mm512_setzero_ps(); NH];
            let qs: [*const f32; NH] = std::array::from_fn(|i| q[i]);
            let kf = self.keys_f32();
            // The dimensions that ask for a line of the block ahead's keys and values, then
            // the rest (two loops: no test per dimension).
            let lines = match ask {
                Some((k, v)) => {
                    let lines = (C * 2 * hd / 64).min(hd);
                    for d in 0..lines {
                        prefetch_lines(k.wrapping_add(d * 64), 64, CacheLevel::L2);
                        prefetch_lines(v.wrapping_add(d * 64), 64, CacheLevel::L2);
                        score_step(&qs, kf, kt, d, &mut s);
                    }
                    lines
                }
                None => 0,
            };
            for d in lines..hd {
                score_step(&qs, kf, kt, d, &mut s);
            }
            s
        }
    }

    #[inline(always)]
    fn softmax(&self, s: __m512, vis: u16, scale: f32, m: &mut f32, l: &mut [f32; C], p: &mut [f32; C]) -> f32 {
        if vis == 0 {
            *p = [0.0; C];
            return 1.0;
        }
        // SAFETY: AVX-512 F (this instance exists only inside `attend_rows`); `p` and `l`
        // are 16 f32 each.
        unsafe {
            let x = _mm512_mul_ps(s, _mm512_set1_ps(scale));
            let m_new = m.max(_mm512_mask_reduce_max_ps(vis, x));
            let corr = super::model::rescale_factor(*m, m_new);
            let e = _mm512_maskz_mov_ps(vis, expf_ggml16(_mm512_sub_ps(x, _mm512_set1_ps(m_new))));
            let sums = _mm512_loadu_ps(l.as_ptr());
            _mm512_storeu_ps(l.as_mut_ptr(), _mm512_fmadd_ps(sums, _mm512_set1_ps(corr), e));
            _mm512_storeu_ps(p.as_mut_ptr(), e);
            *m = m_new;
            corr
        }
    }

    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // vectors and lanes index several arrays at once
    fn values<const NH: usize, const NV: usize>(&self, p: &[[f32; C]], corr: &[f32], vis: &[u16], acc: &mut [f32], hd: usize, vb: *const f16) {
        assert!(p.len() >= NH && corr.len() >= NH && NH * hd <= acc.len() && hd.is_multiple_of(NV * 16) && vis.len() >= NH);
        // SAFETY: AVX-512 F and F16C (this instance exists only inside `attend_rows`); rows
        // j < 16 of `vb` hold `hd` F16 (the trait's contract); accumulator indices stay below
        // NH·hd (asserted).
        unsafe {
            let mut nz = [0u16; NH];
            for i in 0..NH {
                nz[i] = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(_mm512_loadu_ps(p[i].as_ptr()), _mm512_setzero_ps());
            }
            let any = nz.iter().fold(0u16, |a, z| a | z);
            // Where every vector has the same cells (a block all of them see whole, the usual
            // case), no product needs a mask: the same FMAs without the per-cell mask work.
            let same = nz.iter().all(|&z| z == any);
            let vf = self.values_f32();
            for d0 in (0..hd).step_by(NV * 16) {
                let mut w = [[_mm512_setzero_ps(); NV]; NH];
                let mut cells = any;
                while cells != 0 {
                    let j = cells.trailing_zeros() as usize;
                    cells &= cells - 1;
                    let mut v = [_mm512_setzero_ps(); NV];
                    for (x, vx) in v.iter_mut().enumerate() {
                        *vx = match vf {
                            Some(vf) => _mm512_loadu_ps(vf.add(j * hd + d0 + 16 * x)),
                            None => _mm512_cvtph_ps(_mm256_loadu_si256(vb.add(j * hd + d0 + 16 * x) as *const __m256i)),
                        };
                    }
                    if same {
                        for i in 0..NH {
                            let pj = _mm512_set1_ps(p[i][j]);
                            for x in 0..NV {
                                w[i][x] = _mm512_fmadd_ps(pj, v[x], w[i][x]);
                            }
                        }
                        continue;
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
                    let c = _mm512_set1_ps(corr[i]);
                    for x in 0..NV {
                        let a = acc.as_mut_ptr().add(i * hd + d0 + 16 * x);
                        _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_loadu_ps(a), c, w[i][x]));
                    }
                }
            }
        }
    }
}
