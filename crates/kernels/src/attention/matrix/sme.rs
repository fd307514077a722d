//! Column-key attention on Arm SME's matrix unit: per block of 16 cells, the scores of up to
//! `lanes` query vectors (the tile's rows) as `head_dim` outer products of the queries'
//! dimension `d` (a column of the transposed queries) with the keys' dimension `d` (one row of
//! the block's columns, read as stored) — [`scores_tile`]; the softmax step on the vector side
//! (`model::softmax_step`); then the values as 16 outer products of the probabilities of cell
//! `j` (rows predicated by `p ≠ 0`) with cell `j`'s value row — [`values_tile`]. The KV layout
//! is what makes the first product a matrix-unit operation: with keys as rows, each block would
//! be transposed first. Bit for bit `model::attend_group` (each tile element one fused
//! multiply-add chain in the model's order); a start-up self-test ([`self_test`]) checks that
//! before the engine uses it.
//!
//! Each kernel is one `asm!` block entering and leaving streaming mode (`smstart`/`smstop`),
//! naming every Z and P register (and `ffr`) clobbered, as `matmul::aarch64::sme` does.
//! Emulated (qemu) timings mean nothing.
//!
//! # Safety
//! Every function here needs SME with the f32 outer product and a streaming vector of at least
//! 32 bytes ([`Isa::Sme`](crate::simd::Isa::Sme)).

use super::model::{self, begin, finish, rescale_add, softmax_step, C};
use super::pipe;
use crate::attention::types::{KvRows, MatrixScratch, ROWS_MAX_VECTORS as V};
use crate::simd::aarch64::sme_vector_bytes;
use half::f16;
use std::arch::asm;

/// `s[i][j] = Σ_d qt[d][i] · kt[d][j]` for the `l × l` tile (`l` the streaming vector's f32
/// lanes; `cols ≤ l` key columns, the others left 0): one `FMOPA` per dimension, from zero.
/// `qt`: `hd` vectors of `l` f32; `kt`: `hd` rows of 16 F16, the tile's columns from the first;
/// `s`: `l` rows of `l` f32.
///
/// # Safety
/// SME as the module says; `qt.len() ≥ hd·l`, `kt` points to `hd · 16` F16 (the tile's first
/// column at its start, `cols` of them in every row), `s.len() ≥ l²`, `hd ≥ 1`.
unsafe fn scores_tile(qt: &[f32], kt: *const f16, hd: usize, cols: usize, s: &mut [f32]) {
    let l = sme_vector_bytes() / 4;
    assert!(hd >= 1 && cols >= 1 && cols <= l && qt.len() >= hd * l && s.len() >= l * l);
    // SAFETY: SME present (the caller's contract); loads read `hd` vectors of `qt` and `hd`
    // rows of `cols` F16 from `kt` (the caller's contract); stores write `l` rows of `l` f32
    // into `s` (checked above).
    unsafe {
        asm!(
            ".arch_extension sme",
            "smstart",
            "ptrue p0.s",
            "whilelo p1.s, xzr, {cols}",
            "zero {{za}}",
            "2:",
            "ld1w {{z0.s}}, p0/z, [{q}]",
            "ld1h {{z1.s}}, p1/z, [{k}]",
            "fcvt z1.s, p1/m, z1.h",
            "fmopa za0.s, p0/m, p1/m, z0.s, z1.s",
            "addvl {q}, {q}, #1",
            "add {k}, {k}, #32",
            "subs {d}, {d}, #1",
            "b.ne 2b",
            "mov w12, #0",
            "3:",
            "st1w {{za0h.s[w12, 0]}}, p0, [{s}]",
            "addvl {s}, {s}, #1",
            "add w12, w12, #1",
            "cmp w12, {l:w}",
            "b.lo 3b",
            "smstop",
            q = inout(reg) qt.as_ptr() => _,
            k = inout(reg) kt => _,
            d = inout(reg) hd => _,
            s = inout(reg) s.as_mut_ptr() => _,
            cols = in(reg) cols,
            l = in(reg) l,
            out("x12") _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _, out("v6") _, out("v7") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _, out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _, out("v21") _, out("v22") _, out("v23") _,
            out("v24") _, out("v25") _, out("v26") _, out("v27") _, out("v28") _, out("v29") _, out("v30") _, out("v31") _,
            out("p0") _, out("p1") _, out("p2") _, out("p3") _, out("p4") _, out("p5") _, out("p6") _, out("p7") _,
            out("p8") _, out("p9") _, out("p10") _, out("p11") _, out("p12") _, out("p13") _, out("p14") _, out("p15") _,
            out("ffr") _,
            options(nostack),
        );
    }
}

/// `w[i][e] = Σ_j pt[j][i] · v[j][e]` over the 16 cells `j` in order, row `i` taking cell `j`
/// only where `pt[j][i] ≠ 0` (`FMOPA` predicated by `FCMNE`), from zero, for `cols ≤ l`
/// value columns. `pt`: 16 vectors of `l` f32; `v`: 16 rows `row_bytes` apart, the tile's
/// first column at their start; `w`: `l` rows of `l` f32.
///
/// # Safety
/// SME as the module says; `pt.len() ≥ 16·l`; `v` points to 16 rows `row_bytes` apart with
/// `cols` F16 each; `w.len() ≥ l²`.
unsafe fn values_tile(pt: &[f32], v: *const f16, row_bytes: usize, cols: usize, w: &mut [f32]) {
    let l = sme_vector_bytes() / 4;
    assert!(cols >= 1 && cols <= l && pt.len() >= C * l && w.len() >= l * l);
    // SAFETY: SME present (the caller's contract); loads read 16 vectors of `pt` and 16 rows of
    // `cols` F16 at `v` (the caller's contract); stores write `l` rows of `l` f32 into `w`.
    unsafe {
        asm!(
            ".arch_extension sme",
            "smstart",
            "ptrue p0.s",
            "whilelo p1.s, xzr, {cols}",
            "zero {{za}}",
            "mov {j}, #16",
            "2:",
            "ld1w {{z0.s}}, p0/z, [{p}]",
            "fcmne p2.s, p0/z, z0.s, #0.0",
            "ld1h {{z1.s}}, p1/z, [{v}]",
            "fcvt z1.s, p1/m, z1.h",
            "fmopa za0.s, p2/m, p1/m, z0.s, z1.s",
            "addvl {p}, {p}, #1",
            "add {v}, {v}, {rb}",
            "subs {j}, {j}, #1",
            "b.ne 2b",
            "mov w12, #0",
            "3:",
            "st1w {{za0h.s[w12, 0]}}, p0, [{w}]",
            "addvl {w}, {w}, #1",
            "add w12, w12, #1",
            "cmp w12, {l:w}",
            "b.lo 3b",
            "smstop",
            p = inout(reg) pt.as_ptr() => _,
            v = inout(reg) v => _,
            w = inout(reg) w.as_mut_ptr() => _,
            j = out(reg) _,
            rb = in(reg) row_bytes,
            cols = in(reg) cols,
            l = in(reg) l,
            out("x12") _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _, out("v6") _, out("v7") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _, out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _, out("v21") _, out("v22") _, out("v23") _,
            out("v24") _, out("v25") _, out("v26") _, out("v27") _, out("v28") _, out("v29") _, out("v30") _, out("v31") _,
            out("p0") _, out("p1") _, out("p2") _, out("p3") _, out("p4") _, out("p5") _, out("p6") _, out("p7") _,
            out("p8") _, out("p9") _, out("p10") _, out("p11") _, out("p12") _, out("p13") _, out("p14") _, out("p15") _,
            out("ffr") _,
            options(nostack),
        );
    }
}

/// The queries of vectors `vecs` (`query(i)`: `hd` f32) transposed into `qt[d][i − vecs.start]`
/// (`l` per dimension, the others 0): the rows of a [`scores_tile`].
fn transpose_queries<'q>(qt: &mut [f32], l: usize, hd: usize, vecs: std::ops::Range<usize>, query: impl Fn(usize) -> &'q [f32]) {
    qt[..hd * l].fill(0.0);
    for i in vecs.clone() {
        for (d, &x) in query(i).iter().enumerate() {
            qt[d * l + i - vecs.start] = x;
        }
    }
}

/// The raw scores of up to `l` vectors (`qt`, transposed) over one block of keys `kt`
/// (`[hd][16]` F16) into their rows `p` (one per vector), `l` columns of the block per tile.
///
/// # Safety
/// SME as the module says; `kt` holds `hd · 16` F16; `p.len() ≤ l`.
unsafe fn block_scores(qt: &[f32], kt: &[f16], hd: usize, l: usize, tile: &mut [f32], p: &mut [[f32; C]]) {
    assert!(kt.len() >= C * hd && p.len() <= l);
    for c0 in (0..C).step_by(l) {
        let cols = (C - c0).min(l);
        // SAFETY: the caller's SME; `kt + c0` starts the tile's columns of the block (asserted).
        unsafe { scores_tile(qt, kt.as_ptr().add(c0), hd, cols, tile) };
        for (i, p) in p.iter_mut().enumerate() {
            p[c0..c0 + cols].copy_from_slice(&tile[i * l..i * l + cols]);
        }
    }
}

/// The value products of up to `l` vectors (probabilities `p`, rescale factors `corr`, cells
/// seen `vis`) with one block's 16 value rows at `v0`, `l` dimensions per tile, rescaled into
/// their accumulators `acc` (`[vector][hd]`) — not for a vector that sees none of the block.
/// The probabilities go through `pt` transposed (`pt[j][i]`; a vector that sees nothing has
/// zero probabilities).
///
/// # Safety
/// SME as the module says; `v0` points to 16 rows of `hd` F16; at most `l` vectors.
#[allow(clippy::too_many_arguments)]
unsafe fn block_values(pt: &mut [f32], v0: *const f16, hd: usize, l: usize, tile: &mut [f32], p: &[[f32; C]], corr: &[f32], vis: &[u16], acc: &mut [f32]) {
    assert!(p.len() <= l && corr.len() >= p.len() && vis.len() >= p.len() && acc.len() >= p.len() * hd);
    pt[..C * l].fill(0.0);
    for (i, p) in p.iter().enumerate() {
        for j in 0..C {
            pt[j * l + i] = p[j];
        }
    }
    for d0 in (0..hd).step_by(l) {
        let cols = (hd - d0).min(l);
        // SAFETY: the caller's SME; 16 rows of `hd` F16 at `v0`, the tile's columns from d0.
        unsafe { values_tile(pt, v0.add(d0), 2 * hd, cols, tile) };
        for i in (0..p.len()).filter(|&i| vis[i] != 0) {
            rescale_add(&mut acc[i * hd + d0..i * hd + d0 + cols], corr[i], &tile[i * l..i * l + cols]);
        }
    }
}

/// `model::attend_group` for the `rows × heads` vectors of `q` (vector `r·heads + h`: row `r`'s
/// head `h`, seeing the cells `mask(r, t)` of block `t`), `lanes` vectors per tile.
///
/// # Safety
/// SME as the module says; `rows × heads` at most the scratch's vectors.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_rows(q: &[&[f32]], heads: usize, mask: &dyn Fn(usize, usize) -> u16, n_blocks: usize, kv: &KvRows, scale: f32, ms: &mut MatrixScratch, out: &mut [&mut [f32]]) {
    let hd = kv.head_dim;
    let l = sme_vector_bytes() / 4;
    let n = q.len() * heads;
    assert!(n <= ms.m.len() && ms.qt.len() >= hd * l && ms.pt.len() >= C * l && l >= 4);
    let vb = 2 * hd;
    let mut tile = [0f32; 64 * 64];
    begin(ms, n, hd);
    for i0 in (0..n).step_by(l) {
        let i1 = (i0 + l).min(n);
        // The tile's queries transposed: qt[d][i − i0].
        transpose_queries(&mut ms.qt, l, hd, i0..i1, |i| &q[i / heads][(i % heads) * hd..(i % heads + 1) * hd]);
        for t in 0..n_blocks {
            let vis: [u16; 64] = std::array::from_fn(|i| if i0 + i < i1 { mask((i0 + i) / heads, t) } else { 0 });
            if vis.iter().all(|&m| m == 0) {
                continue;
            }
            // SAFETY: the caller's SME; the block holds `hd × 16` F16 (`k_columns`).
            unsafe { block_scores(&ms.qt, kv.k_columns(t), hd, l, &mut tile, &mut ms.p[i0..i1]) };
            for i in i0..i1 {
                let vi = vis[i - i0];
                if vi == 0 {
                    ms.p[i] = [0.0; C];
                    ms.corr[i] = 1.0;
                    continue;
                }
                ms.corr[i] = softmax_step(&mut ms.p[i], vi, scale, &mut ms.m[i], &mut ms.l[i]);
            }
            // Values: the block's 16 rows (its physical rows are consecutive).
            let v0 = kv.v[kv.table[t] as usize * C * vb..].as_ptr() as *const f16;
            // SAFETY: the caller's SME; 16 rows of `hd` F16 from the block's first.
            unsafe { block_values(&mut ms.pt, v0, hd, l, &mut tile, &ms.p[i0..i1], &ms.corr[i0..i1], &vis[..i1 - i0], &mut ms.acc[i0 * hd..i1 * hd]) };
        }
    }
    for (r, o) in out.iter_mut().enumerate() {
        finish(ms, r * heads, heads, hd, o);
    }
}

/// A matrix phase of pipelined attention (`pipe.rs`) on the matrix unit: the scores of the
/// tile's blocks as `scores_tile`s over groups of `lanes` vectors (their queries transposed once
/// per group), or its values as `values_tile`s rescaled into the accumulators — the steps of
/// [`attend_rows`], so the same bits. The softmax phase runs on NEON (`neon::run_task`).
///
/// # Safety
/// SME as the module says; a scores or values task.
pub(super) unsafe fn run_task(task: &pipe::Task, ms: &mut MatrixScratch) -> usize {
    let kv = &task.item_kv();
    let (hd, n) = (kv.head_dim, task.n());
    let l = sme_vector_bytes() / 4;
    assert!(ms.qt.len() >= hd * l && ms.pt.len() >= C * l && l >= 4 && l <= 64);
    let mut tile = [0f32; 64 * 64];
    // SAFETY (`entry`, `acc`): this is the phase running `task`.
    let (p, vis, corr) = unsafe { task.entry() };
    match task.phase {
        pipe::Phase::Scores => {
            let mut scored = 0;
            let mut any = [false; pipe::TILE_BLOCKS];
            for (bi, b) in task.blocks().enumerate() {
                any[bi] = task.block_vis(bi, b, vis);
                scored += any[bi] as usize;
            }
            for i0 in (0..n).step_by(l) {
                let i1 = (i0 + l).min(n);
                transpose_queries(&mut ms.qt, l, hd, i0..i1, |i| task.query(i));
                for (bi, b) in task.blocks().enumerate().filter(|&(bi, _)| any[bi]) {
                    // SAFETY: the caller's SME; the block holds `hd × 16` F16 (`k_columns`).
                    unsafe { block_scores(&ms.qt, kv.k_columns(b), hd, l, &mut tile, &mut p[bi * V + i0..bi * V + i1]) };
                }
            }
            scored
        }
        _ => {
            // SAFETY: as above.
            let acc = unsafe { task.acc() };
            for (bi, b) in task.blocks().enumerate() {
                let e = bi * V;
                if vis[e..e + n].iter().all(|&m| m == 0) {
                    continue;
                }
                for i0 in (0..n).step_by(l) {
                    let (i1, g) = ((i0 + l).min(n), e + i0..e + (i0 + l).min(n));
                    // SAFETY: the caller's SME; 16 rows of `hd` F16 from the block's first
                    // (`values_of`).
                    unsafe { block_values(&mut ms.pt, task.values_of(b), hd, l, &mut tile, &p[g.clone()], &corr[g.clone()], &vis[g], &mut acc[i0 * hd..i1 * hd]) };
                }
            }
            0
        }
    }
}

/// The start-up self-test: the SME version against the portable model on a ragged random case
/// (two rows of three heads, 45 cells over shuffled blocks, a window hiding the first cells,
/// NaN in the slots no cell was written to);
/// `true` when every bit agrees.
///
/// # Safety
/// SME as the module says.
pub unsafe fn self_test() -> bool {
    let (hd, heads, cells) = (24usize, 3usize, 45usize);
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 2001) as f32 / 1000.0 - 1.0
    };
    let n_blocks = cells.div_ceil(C);
    let table: Vec<u32> = (0..n_blocks as u32).rev().collect();
    // Cells never written hold NaN (F16 0x7E00): a product not predicated away shows.
    let nan = f16::NAN.to_le_bytes();
    let mut k: Vec<u8> = nan.repeat(n_blocks * C * hd);
    let mut v: Vec<u8> = nan.repeat(n_blocks * C * hd);
    for c in 0..cells {
        let b = table[c / C] as usize;
        let key: Vec<f32> = (0..hd).map(|_| 3.0 * next()).collect();
        super::store_key(&mut k[b * C * hd * 2..(b + 1) * C * hd * 2], c % C, &key);
        let row = (b * C + c % C) * hd * 2;
        for d in 0..hd {
            v[row + 2 * d..row + 2 * d + 2].copy_from_slice(&f16::from_f32(20.0 * next()).to_le_bytes());
        }
    }
    let kv = KvRows { k: &k, v: &v, k_type: crate::DType::F16, v_type: crate::DType::F16, head_dim: hd, table: &table, shift: C.trailing_zeros(), k_layout: crate::attention::types::KeyLayout::Columns };
    let q: Vec<f32> = (0..2 * heads * hd).map(|_| 2.0 * next()).collect();
    let spans = [3..30, 5..45];
    let mask = |r: usize, t: usize| model::span_mask(t, &spans[r]);
    let mut ms = crate::attention::types::AttnScratch::with_heads(hd, heads).matrix;
    let (mut got, mut want) = (vec![0f32; 2 * heads * hd], vec![0f32; 2 * heads * hd]);
    {
        let (g0, g1) = got.split_at_mut(heads * hd);
        // SAFETY: the caller's SME.
        unsafe { attend_rows(&[&q[..heads * hd], &q[heads * hd..]], heads, &mask, n_blocks, &kv, 0.2, &mut ms, &mut [g0, g1]) };
    }
    for r in 0..2 {
        let span = spans[r].clone();
        let o = r * heads * hd..(r + 1) * heads * hd;
        model::attend_group(&q[o.clone()], &kv, n_blocks, &|t| model::span_mask(t, &span), 0.2, &mut ms, &mut want[o]);
    }
    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits())
}
