//! NEON column-key attention ([`ColumnOps`] on 4 × 4 lanes): the AVX-512 version's steps with
//! a block's 16 cells in four vectors (scores) and 16 dimensions per pass in four (values);
//! lane masks from the visibility bits by `cmtst`, the `p ≠ 0` rule by a branch per vector and
//! cell. At most six vectors' scores at once (24 accumulators of 32 registers). Bit for bit
//! `model.rs`. NEON is the aarch64 baseline: no target features to enable.

use super::drive::{self, ColumnOps};
use super::widen::Widen;
use super::pipe;
use super::model::C;
use crate::attention::types::{KvRows, MatrixScratch, NextRows};
use crate::exp::aarch64::expf_ggml4;
use crate::simd::aarch64::load_f16x8;
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;
use std::arch::aarch64::*;

/// The NEON instance.
struct NeonOps;

/// `drive::attend_rows` on NEON.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_rows(q: &[&[f32]], heads: usize, mask: &dyn Fn(usize, usize) -> u16, n_blocks: usize, kv: &KvRows, scale: f32, ms: &mut MatrixScratch, next: &mut NextRows, out: &mut [&mut [f32]]) {
    drive::attend_rows(&NeonOps, q, heads, mask, n_blocks, kv, scale, ms, next, out)
}

/// A pipelined attention phase (`pipe.rs`) on NEON (a head dimension that is a multiple of 16).
pub(super) fn run_task(task: &pipe::Task, ms: &mut MatrixScratch) -> usize {
    pipe::run_task(&NeonOps, task, ms)
}

/// All-ones lanes where bit `i` of `bits` is set (lane `i`).
#[inline(always)]
fn lane_mask(bits: u16) -> uint32x4_t {
    const B: [u32; 4] = [1, 2, 4, 8];
    // SAFETY: NEON is the aarch64 baseline; `B` is 4 u32.
    unsafe { vtstq_u32(vdupq_n_u32(bits as u32), vld1q_u32(B.as_ptr())) }
}

impl ColumnOps for NeonOps {
    type Scores = [float32x4_t; 4];
    const SCORE_HEADS: usize = 6;
    const WIDEN: Widen = Widen::Neon;

    #[inline(always)]
    fn zero(&self) -> [float32x4_t; 4] {
        // SAFETY: NEON is the aarch64 baseline.
        unsafe { [vdupq_n_f32(0.0); 4] }
    }

    #[inline(always)]
    fn store(&self, s: [float32x4_t; 4], out: &mut [f32; C]) {
        // SAFETY: NEON (this instance exists only inside its entry points); 16 f32.
        unsafe {
            for (x, v) in s.iter().enumerate() {
                vst1q_f32(out.as_mut_ptr().add(4 * x), *v);
            }
        }
    }

    #[inline(always)]
    fn load(&self, p: &[f32; C]) -> [float32x4_t; 4] {
        // SAFETY: as `store`.
        unsafe { [vld1q_f32(p.as_ptr()), vld1q_f32(p.as_ptr().add(4)), vld1q_f32(p.as_ptr().add(8)), vld1q_f32(p.as_ptr().add(12))] }
    }

    #[inline(always)]
    fn scores<const NH: usize>(&self, q: &[*const f32], hd: usize, kt: *const f16, ask: Option<(*const u8, *const u8)>) -> [[float32x4_t; 4]; NH] {
        assert!(q.len() >= NH);
        // SAFETY: NEON; d < hd reads the 16 F16 of dimension d inside the block and element d
        // of each query (the trait's contract).
        unsafe {
            let mut s = [[vdupq_n_f32(0.0); 4]; NH];
            let lines = C * 2 * hd / 64;
            for d in 0..hd {
                if let Some((k, v)) = ask.filter(|_| d < lines) {
                    prefetch_lines(k.wrapping_add(d * 64), 64, CacheLevel::L2);
                    prefetch_lines(v.wrapping_add(d * 64), 64, CacheLevel::L2);
                }
                let [k0, k1] = load_f16x8(kt.add(d * C));
                let [k2, k3] = load_f16x8(kt.add(d * C + 8));
                let k = [k0, k1, k2, k3];
                for (i, s) in s.iter_mut().enumerate() {
                    let b = vdupq_n_f32(*q[i].add(d));
                    for x in 0..4 {
                        s[x] = vfmaq_f32(s[x], b, k[x]);
                    }
                }
            }
            s
        }
    }

    #[inline(always)]
    fn softmax(&self, s: [float32x4_t; 4], vis: u16, scale: f32, m: &mut f32, l: &mut [f32; C], p: &mut [f32; C]) -> f32 {
        if vis == 0 {
            *p = [0.0; C];
            return 1.0;
        }
        // SAFETY: NEON; `p` and `l` are 16 f32 each.
        unsafe {
            let sc = vdupq_n_f32(scale);
            let x = [vmulq_f32(s[0], sc), vmulq_f32(s[1], sc), vmulq_f32(s[2], sc), vmulq_f32(s[3], sc)];
            let mk = [lane_mask(vis), lane_mask(vis >> 4), lane_mask(vis >> 8), lane_mask(vis >> 12)];
            let ninf = vdupq_n_f32(f32::NEG_INFINITY);
            let mut xm = vbslq_f32(mk[0], x[0], ninf);
            for k in 1..4 {
                xm = vmaxq_f32(xm, vbslq_f32(mk[k], x[k], ninf));
            }
            let m_new = m.max(vmaxvq_f32(xm));
            let corr = super::model::rescale_factor(*m, m_new);
            let (mv, cv) = (vdupq_n_f32(m_new), vdupq_n_f32(corr));
            for k in 0..4 {
                let e = expf_ggml4(vsubq_f32(x[k], mv));
                let e = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), mk[k]));
                let sums = vld1q_f32(l.as_ptr().add(4 * k));
                vst1q_f32(l.as_mut_ptr().add(4 * k), vfmaq_f32(e, sums, cv));
                vst1q_f32(p.as_mut_ptr().add(4 * k), e);
            }
            *m = m_new;
            corr
        }
    }

    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // vectors and lanes index several arrays at once
    fn values<const NH: usize, const NV: usize>(&self, p: &[[f32; C]], corr: &[f32], vis: &[u16], acc: &mut [f32], hd: usize, vb: *const f16) {
        assert!(p.len() >= NH && corr.len() >= NH && NH * hd <= acc.len() && hd.is_multiple_of(16) && vis.len() >= NH);
        // SAFETY: NEON; rows j < 16 of `vb` hold `hd` F16 (the trait's contract); accumulator
        // indices stay below NH·hd (asserted).
        unsafe {
            let mut nz = [0u16; NH];
            for i in 0..NH {
                nz[i] = drive::nonzero(&p[i]);
            }
            let any = nz.iter().fold(0u16, |a, z| a | z);
            // 16 dimensions (four vectors) per pass: NH · 4 accumulators.
            for d0 in (0..hd).step_by(16) {
                let mut w = [[vdupq_n_f32(0.0); 4]; NH];
                let mut cells = any;
                while cells != 0 {
                    let j = cells.trailing_zeros() as usize;
                    cells &= cells - 1;
                    let r = vb.add(j * hd + d0);
                    let [v0, v1] = load_f16x8(r);
                    let [v2, v3] = load_f16x8(r.add(8));
                    let v = [v0, v1, v2, v3];
                    for i in 0..NH {
                        if nz[i] >> j & 1 != 0 {
                            let pj = vdupq_n_f32(p[i][j]);
                            for x in 0..4 {
                                w[i][x] = vfmaq_f32(w[i][x], pj, v[x]);
                            }
                        }
                    }
                }
                for i in 0..NH {
                    if vis[i] == 0 {
                        continue;
                    }
                    let c = vdupq_n_f32(corr[i]);
                    for x in 0..4 {
                        let a = acc.as_mut_ptr().add(i * hd + d0 + 4 * x);
                        vst1q_f32(a, vfmaq_f32(w[i][x], vld1q_f32(a), c));
                    }
                }
            }
        }
    }
}
