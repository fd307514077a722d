//! The column-key attention algorithm, defined by its portable form: what every SIMD and
//! matrix-unit version computes, bit for bit.
//!
//! Per query vector (a head of a row), over the blocks of [`C`] cells that it sees any cell of
//! (a block it sees none of is skipped, not computed):
//!
//! ```text
//! s[j]  = (Σ_d q[d]·k[d][j], one fused multiply-add per d in order, from 0) · scale
//! m'    = max(m, max over visible j of s[j])          c = expf(m − m')   (0 on the first block)
//! p[j]  = visible j ? expf(s[j] − m') : 0              l[j] = fma(l[j], c, p[j])
//! w[d]  = Σ_j p[j]·v[j][d] over j with p[j] ≠ 0, one fused multiply-add per j in order, from 0
//! a[d]  = fma(a[d], c, w[d])                           m = m'
//! out   = a / Σ l (the 16 sums reduced as `simd::reduce_add_16`), zeros if nothing is visible
//! ```
//!
//! With an attention sink `z` (gpt-oss) the last line counts it as ggml does: where `z > m`,
//! `a · expf(m − z)` over `Σ l · expf(m − z) + 1`, else `a` over `Σ l + expf(z − m)` (libm's
//! `expf`; `tiles::sink_step`).
//!
//! `expf` is ggml's (`exp::expf_ggml`), keys and values are F16 widened exactly (Q8_0 and
//! Q4_0 keys and values first become F16 per block, `widen.rs`), the query stays f32. The
//! products of a block are chains of fused multiply-adds over one index in order — exactly what an outer-product unit computes (`FMOPA`: one `d` per instruction
//! for the scores, one cell per instruction for the values, rows predicated by `p ≠ 0`) and
//! what a vector FMA computes with lanes over cells (scores) or dimensions (values). This is
//! not one of ggml's algorithms, so it does not give llama.cpp's bits: it is chosen with the
//! cache's layout (`--kv-layout columns`), never by default.

use crate::attention::types::{KvRows, MatrixScratch, KEY_COLUMNS};
use crate::exp::expf_ggml;
use crate::simd::reduce_add_16;
use crate::DType;
use half::f16;
use super::widen::{self, Widen};

/// Cells per key block.
pub(crate) const C: usize = KEY_COLUMNS;

/// The cells of block `t` that a vector seeing the logical cells `span` sees (bit `j`: cell
/// `C·t + j`).
#[inline]
pub(crate) fn span_mask(t: usize, span: &std::ops::Range<usize>) -> u16 {
    let c0 = t * C;
    let lo = span.start.clamp(c0, c0 + C) - c0;
    let hi = span.end.clamp(c0, c0 + C) - c0;
    if lo >= hi {
        return 0;
    }
    (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16
}

/// The factor `expf(m − m')` that rescales what was accumulated when the maximum goes from `m`
/// to `m_new`: 1 without calling `expf` when a finite maximum stays (ggml's `expf` of 0 is
/// exactly 1, so the bits are the same; past the first blocks the maximum rarely moves).
#[inline(always)]
pub(crate) fn rescale_factor(m: f32, m_new: f32) -> f32 {
    if m_new == m && m.is_finite() {
        1.0
    } else {
        expf_ggml(m - m_new)
    }
}

/// Start `heads` vectors: no maximum yet, zero sums and accumulators.
pub(crate) fn begin(ms: &mut MatrixScratch, heads: usize, hd: usize) {
    ms.m[..heads].fill(f32::NEG_INFINITY);
    ms.l[..heads].fill([0.0; C]);
    ms.acc[..heads * hd].fill(0.0);
}

/// The softmax step of one vector on one block: `p` holds the raw scores (the sums) and gets
/// the probabilities; updates the maximum `m` and the sums `l`; returns the factor `c` that
/// rescales what was accumulated before.
#[inline]
pub(crate) fn softmax_step(p: &mut [f32; C], vis: u16, scale: f32, m: &mut f32, l: &mut [f32; C]) -> f32 {
    let mut mt = f32::NEG_INFINITY;
    for (j, s) in p.iter_mut().enumerate() {
        *s *= scale;
        if vis >> j & 1 != 0 {
            mt = mt.max(*s);
        }
    }
    let m_new = m.max(mt);
    let corr = rescale_factor(*m, m_new);
    for (j, (s, lj)) in p.iter_mut().zip(l.iter_mut()).enumerate() {
        *s = if vis >> j & 1 != 0 { expf_ggml(*s - m_new) } else { 0.0 };
        *lj = lj.mul_add(corr, *s);
    }
    *m = m_new;
    corr
}

/// `acc = fma(acc, corr, part)` for one vector.
#[inline]
pub(crate) fn rescale_add(acc: &mut [f32], corr: f32, part: &[f32]) {
    for (a, w) in acc.iter_mut().zip(part) {
        *a = a.mul_add(corr, *w);
    }
}

/// Write the results of the `heads` vectors from vector `first`: accumulators over the reduced
/// sums, each vector's sink counted first where the call has sinks (`ms.sinks`).
pub(crate) fn finish(ms: &MatrixScratch, first: usize, heads: usize, hd: usize, out: &mut [f32]) {
    for (o, h) in (first..first + heads).enumerate() {
        let mut l = reduce_add_16(&ms.l[h]);
        let (a, o) = (&ms.acc[h * hd..(h + 1) * hd], &mut out[o * hd..(o + 1) * hd]);
        if let Some(sinks) = &ms.sinks {
            o.copy_from_slice(a);
            let mut st = [ms.m[h], l];
            crate::attention::tiles::sink_step(&mut st, sinks[h], o);
            l = st[1];
            o.iter_mut().for_each(|x| *x /= l);
            continue;
        }
        if l == 0.0 {
            o.fill(0.0);
        } else {
            for (o, a) in o.iter_mut().zip(a) {
                *o = a / l;
            }
        }
    }
}

/// The portable form: the `q.len() / head_dim` heads of one row (all reading `kv`'s KV head)
/// over the blocks `t < n_blocks`, cell `j` of block `t` visible where bit `j` of `mask(t)` is
/// set (only cells that hold keys may be visible).
pub(crate) fn attend_group(q: &[f32], kv: &KvRows, n_blocks: usize, mask: &dyn Fn(usize) -> u16, scale: f32, ms: &mut MatrixScratch, out: &mut [f32]) {
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    begin(ms, heads, hd);
    for t in 0..n_blocks {
        let vis = mask(t);
        if vis == 0 {
            continue;
        }
        let kt: &[f16] = if kv.k_type == DType::F16 {
            kv.k_columns(t)
        } else {
            widen::block(Widen::Portable, kv.k_type, true, kv.block(t).0, hd, &mut ms.kw);
            &ms.kw
        };
        if kv.v_type != DType::F16 {
            widen::block(Widen::Portable, kv.v_type, false, kv.block(t).1, hd, &mut ms.vw);
        }
        for h in 0..heads {
            let qh = &q[h * hd..(h + 1) * hd];
            let p = &mut ms.p[h];
            for (j, s) in p.iter_mut().enumerate() {
                *s = qh.iter().enumerate().fold(0.0f32, |s, (d, &x)| x.mul_add(kt[d * C + j].to_f32(), s));
            }
            let corr = softmax_step(p, vis, scale, &mut ms.m[h], &mut ms.l[h]);
            let w = &mut ms.part[..hd];
            w.fill(0.0);
            for (j, &pj) in p.iter().enumerate() {
                if pj != 0.0 {
                    let v = if kv.v_type != DType::F16 { &ms.vw[j * hd..(j + 1) * hd] } else { kv.v(t * C + j) };
                    for (w, v) in w.iter_mut().zip(v) {
                        *w = pj.mul_add(v.to_f32(), *w);
                    }
                }
            }
            rescale_add(&mut ms.acc[h * hd..(h + 1) * hd], corr, &ms.part[..hd]);
        }
    }
    finish(ms, 0, heads, hd, out);
}
