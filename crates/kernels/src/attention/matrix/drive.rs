//! The column-key kernels' driver, shared by the SIMD versions (`x86.rs`: AVX-512, `avx2.rs`: AVX2):
//! the block loop, which vectors see which cells, the keys and values asked for ahead, and the
//! dispatch to [`ColumnOps`] instances of constant head counts, so each version's inner loops
//! hold only loads, conversions and FMAs. Every operation and its order is `model.rs`'s.

use super::model::{begin, finish, C};
use super::widen::{self, Widen};
use crate::DType;
use crate::attention::types::{KvRows, MatrixScratch, NextRows, DECODE_CHUNK, ROWS_MAX_VECTORS};
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;

/// Most vectors whose scores are summed at once (accumulators in registers).
pub(crate) const SCORE_HEADS: usize = 8;
/// Vectors whose value products are summed at once.
const VALUE_HEADS: usize = 4;
/// Most vectors (rows × heads) of one call.
const MAX_VECTORS: usize = ROWS_MAX_VECTORS;
/// Blocks asked for ahead of the one computed.
const AHEAD: usize = 2;

/// One ISA's arithmetic of the column-key kernels (its methods inline into the ISA's entry
/// point, which carries the target features; instances are made only there).
pub(crate) trait ColumnOps {
    /// The 16 scores of one vector over a block.
    type Scores: Copy;
    /// Vectors whose scores are summed at once (at most [`SCORE_HEADS`]).
    const SCORE_HEADS: usize = SCORE_HEADS;
    /// Zero scores.
    fn zero(&self) -> Self::Scores;
    /// The raw scores of NH vectors (`q`: their queries) over one block of keys `kt`
    /// (`[hd][16]`): per dimension in order, one FMA per vector; asks for line `d` of the keys
    /// and values `ask` points to while it goes (the first `16 · 2 · hd / 64` dimensions).
    /// `q` holds NH pointers to `hd` f32 each; `kt` points to `hd · 16` F16.
    fn scores<const NH: usize>(&self, q: &[*const f32], hd: usize, kt: *const f16, ask: Option<(*const u8, *const u8)>) -> [Self::Scores; NH];
    /// One vector's scores into memory.
    fn store(&self, s: Self::Scores, out: &mut [f32; C]);
    /// One vector's scores from memory.
    fn load(&self, p: &[f32; C]) -> Self::Scores;
    /// `model::softmax_step` of one vector on raw scores `s`: its probabilities into `p`, its
    /// maximum `m` and sums `l` updated; returns the rescale factor. A vector that sees no
    /// cell (`vis == 0`) gets zero probabilities and keeps its state (returns 1).
    fn softmax(&self, s: Self::Scores, vis: u16, scale: f32, m: &mut f32, l: &mut [f32; C], p: &mut [f32; C]) -> f32;
    /// NH vectors: their probabilities' (`p`) products with the block's values (`vb`: 16 rows
    /// of `hd` F16), cell by cell in order over the cells with `p ≠ 0`, NV · 16 dimensions per
    /// pass, then `acc = fma(acc, corr, part)` (`acc`: NH rows of `hd`) — not for a vector
    /// that sees none of the block (`vis`). `hd` a multiple of NV · 16.
    fn values<const NH: usize, const NV: usize>(&self, p: &[[f32; C]], corr: &[f32], vis: &[u16], acc: &mut [f32], hd: usize, vb: *const f16);
    /// A block's keys `kt` (`hd · 16` F16) and values `vb` (16 rows of `hd` F16), once,
    /// before `scores` and `values` read them for every group of vectors: an instance may
    /// prepare them once for all the groups.
    #[inline(always)]
    fn block_read(&self, _kt: *const f16, _vb: *const f16, _hd: usize) {}
    /// Which version of `widen.rs` widens this instance's quantized blocks.
    const WIDEN: Widen = Widen::Portable;
    /// A Q8_0 or Q4_0 (`t`) column block of keys (`src`) widened to `[hd][16]` F16 in `dst`:
    /// `widen.rs`'s bits. `hd` a multiple of 32.
    #[inline(always)]
    fn widen_keys(&self, t: DType, src: &[u8], hd: usize, dst: &mut [f16]) {
        widen::block(Self::WIDEN, t, true, src, hd, dst)
    }
    /// 16 Q8_0 or Q4_0 (`t`) value rows (`src`) widened to `[16][hd]` F16 in `dst`.
    #[inline(always)]
    fn widen_rows(&self, t: DType, src: &[u8], hd: usize, dst: &mut [f16]) {
        widen::block(Self::WIDEN, t, false, src, hd, dst)
    }
}

/// `model::attend_group` for the `rows × heads` vectors of `q` (vector `r·heads + h`: row
/// `r`'s head `h`, which sees the cells `mask(r, t)` of block `t`) together, on `ops`: each key
/// and value vector is loaded once for all of them. `kv.head_dim` a multiple of 16; `q[r]` and
/// `out[r]` hold `heads · head_dim` values; at most the scratch's vectors (asserted).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_rows<O: ColumnOps>(ops: &O, q: &[&[f32]], heads: usize, mask: &dyn Fn(usize, usize) -> u16, n_blocks: usize, kv: &KvRows, scale: f32, ms: &mut MatrixScratch, next: &mut NextRows, out: &mut [&mut [f32]]) {
    let hd = kv.head_dim;
    let n = q.len() * heads;
    assert!(hd.is_multiple_of(16) && n <= ms.m.len() && n <= MAX_VECTORS && q.iter().all(|r| r.len() >= heads * hd) && out.iter().all(|r| r.len() >= heads * hd));
    // Each vector's query.
    let mut qp = [std::ptr::null::<f32>(); MAX_VECTORS];
    for (i, p) in qp.iter_mut().enumerate().take(n) {
        *p = q[i / heads][(i % heads) * hd..].as_ptr();
    }
    // Bytes of a block's keys and of its values: 16 cells of `head_dim` F16, Q8_0 or Q4_0
    // (quantized blocks widened to F16 as read, `widen.rs`). Every block read lies inside both
    // buffers (checked once, over the blocks this call may read).
    let (kbytes, vbytes) = kv.block_bytes();
    let end = kv.table[..n_blocks].iter().map(|&b| b as usize + 1).max().unwrap_or(0);
    assert!(kv.k.len() >= end * kbytes && kv.v.len() >= end * vbytes);
    begin(ms, n, hd);
    // Each block's keys and values are asked for AHEAD blocks before they are read, a line of
    // each per dimension while the scores are summed (a burst of all of them fills the miss
    // queue): the hardware prefetcher cannot follow the block table. Once there is no block
    // that far ahead, the first cells the worker reads next (`AttnScratch::read_next`).
    let rows = q.len();
    let any_row = |t: usize| (0..rows).fold(0u16, |a, r| a | mask(r, t));
    let first = (0..n_blocks).find(|&t| any_row(t) != 0).unwrap_or(n_blocks);
    for t in first..(first + AHEAD).min(n_blocks) {
        let (k, v) = kv.block(t);
        prefetch_lines(k.as_ptr(), kbytes, CacheLevel::L2);
        prefetch_lines(v.as_ptr(), vbytes, CacheLevel::L2);
    }
    let mut vis = [0u16; MAX_VECTORS];
    for t in first..n_blocks {
        for r in 0..rows {
            let m = mask(r, t);
            vis[r * heads..(r + 1) * heads].fill(m);
        }
        if vis[..n].iter().all(|&m| m == 0) {
            continue;
        }
        let ahead = (t + AHEAD < n_blocks).then(|| kv.block(t + AHEAD)).map(|(k, v)| (k.as_ptr(), v.as_ptr()));
        if t + AHEAD == n_blocks {
            ask_next(next, kbytes.max(vbytes) / C);
        }
        // The block's keys and values as F16 (in place, or widened into the scratch).
        let kt = keys_f16(ops, kv, t, &mut ms.kw);
        let vb = values_f16(ops, kv, t, &mut ms.vw);
        ops.block_read(kt, vb, hd);
        // Scores and the softmax step, O::SCORE_HEADS vectors at a time.
        for h0 in (0..n).step_by(O::SCORE_HEADS) {
            let qh = &qp[h0..];
            let ask = if h0 == 0 { ahead } else { None };
            // `qh` points to nh queries of hd values; `kt` a block of keys (above).
            let s = scores_n(ops, &qh[..(n - h0).min(O::SCORE_HEADS)], hd, kt, ask);
            for (i, s) in s.iter().enumerate().take((n - h0).min(O::SCORE_HEADS)) {
                let h = h0 + i;
                ms.corr[h] = ops.softmax(*s, vis[h], scale, &mut ms.m[h], &mut ms.l[h], &mut ms.p[h]);
            }
        }
        values(ops, &ms.p[..n], &ms.corr[..n], &vis[..n], &mut ms.acc[..n * hd], hd, vb);
    }
    for (r, o) in out.iter_mut().enumerate() {
        finish(ms, r * heads, heads, hd, o);
    }
}

/// Block `t`'s keys (`[hd][16]`) as F16: in place for an F16 cache, else widened into `kw`.
#[inline(always)]
pub(crate) fn keys_f16<O: ColumnOps>(ops: &O, kv: &KvRows, t: usize, kw: &mut [f16]) -> *const f16 {
    let raw = kv.block(t).0;
    if kv.k_type == DType::F16 {
        return raw.as_ptr() as *const f16;
    }
    ops.widen_keys(kv.k_type, raw, kv.head_dim, kw);
    kw.as_ptr()
}

/// Block `t`'s 16 value rows (`hd` each) as F16: in place for an F16 cache, else widened into
/// `vw`.
#[inline(always)]
pub(crate) fn values_f16<O: ColumnOps>(ops: &O, kv: &KvRows, t: usize, vw: &mut [f16]) -> *const f16 {
    let raw = kv.block(t).1;
    if kv.v_type == DType::F16 {
        return raw.as_ptr() as *const f16;
    }
    ops.widen_rows(kv.v_type, raw, kv.head_dim, vw);
    vw.as_ptr()
}

/// The value products of `p.len()` vectors over one block (`vb`), VALUE_HEADS at a time, into
/// their accumulators `acc` (`[vector][hd]`), each rescaled by its `corr` first.
#[inline(always)]
pub(crate) fn values<O: ColumnOps>(ops: &O, p: &[[f32; C]], corr: &[f32], vis: &[u16], acc: &mut [f32], hd: usize, vb: *const f16) {
    let n = p.len();
    for h0 in (0..n).step_by(VALUE_HEADS) {
        let (p, c, v, a) = (&p[h0..], &corr[h0..], &vis[h0..], &mut acc[h0 * hd..]);
        match ((n - h0).min(VALUE_HEADS), hd.is_multiple_of(64)) {
            (1, true) => ops.values::<1, 4>(p, c, v, a, hd, vb),
            (2, true) => ops.values::<2, 4>(p, c, v, a, hd, vb),
            (3, true) => ops.values::<3, 4>(p, c, v, a, hd, vb),
            (_, true) => ops.values::<4, 4>(p, c, v, a, hd, vb),
            (1, false) => ops.values::<1, 1>(p, c, v, a, hd, vb),
            (2, false) => ops.values::<2, 1>(p, c, v, a, hd, vb),
            (3, false) => ops.values::<3, 1>(p, c, v, a, hd, vb),
            (_, false) => ops.values::<4, 1>(p, c, v, a, hd, vb),
        }
    }
}

/// The cells whose probability is not 0 (bit `j`: cell `j`), the values' `p ≠ 0` rule.
#[inline(always)]
pub(crate) fn nonzero(p: &[f32; C]) -> u16 {
    p.iter().enumerate().fold(0u16, |m, (j, &x)| m | ((x != 0.0) as u16) << j)
}

/// Ask for the worker's next cells (at most a block of them), `row_bytes` of each key and value.
fn ask_next(next: &mut NextRows, row_bytes: usize) {
    let (mut k, mut v) = ([std::ptr::null::<f16>(); DECODE_CHUNK], [std::ptr::null::<f16>(); DECODE_CHUNK]);
    let n = next.take(&mut k, &mut v).min(C);
    for (&k, &v) in k[..n].iter().zip(&v[..n]) {
        prefetch_lines(k as *const u8, row_bytes, CacheLevel::L2);
        prefetch_lines(v as *const u8, row_bytes, CacheLevel::L2);
    }
}

/// The raw scores of the `q.len()` (at most SCORE_HEADS) vectors over one block of keys `kt`
/// (`ColumnOps::scores`), in an array of the widest count.
#[inline(always)]
fn scores_n<O: ColumnOps>(ops: &O, q: &[*const f32], hd: usize, kt: *const f16, ask: Option<(*const u8, *const u8)>) -> [O::Scores; SCORE_HEADS] {
    match q.len() {
        1 => spill(ops, ops.scores::<1>(q, hd, kt, ask)),
        2 => spill(ops, ops.scores::<2>(q, hd, kt, ask)),
        3 => spill(ops, ops.scores::<3>(q, hd, kt, ask)),
        4 => spill(ops, ops.scores::<4>(q, hd, kt, ask)),
        5 => spill(ops, ops.scores::<5>(q, hd, kt, ask)),
        6 => spill(ops, ops.scores::<6>(q, hd, kt, ask)),
        7 => spill(ops, ops.scores::<7>(q, hd, kt, ask)),
        _ => spill(ops, ops.scores::<8>(q, hd, kt, ask)),
    }
}

/// [`scores_n`] into memory: `out[i]` the raw scores of vector `q[i]`.
#[inline(always)]
pub(crate) fn scores_into<O: ColumnOps>(ops: &O, q: &[*const f32], hd: usize, kt: *const f16, ask: Option<(*const u8, *const u8)>, out: &mut [[f32; C]]) {
    assert!(q.len() <= O::SCORE_HEADS && out.len() >= q.len());
    let s = scores_n(ops, q, hd, kt, ask);
    for (o, s) in out.iter_mut().zip(&s[..q.len()]) {
        ops.store(*s, o);
    }
}

/// Up to SCORE_HEADS score vectors in an array of the widest count.
#[inline(always)]
fn spill<O: ColumnOps, const NH: usize>(ops: &O, s: [O::Scores; NH]) -> [O::Scores; SCORE_HEADS] {
    let mut out = [ops.zero(); SCORE_HEADS];
    out[..NH].copy_from_slice(&s);
    out
}
