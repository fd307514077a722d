//! Attention over keys stored in columns (`attention::matrix`): every table's version against
//! the portable form bit for bit (decode and prefill rows, causal, sliding window, a row that
//! sees nothing, ragged last blocks, GQA groups, head dimensions with and without the SIMD
//! version), and the algorithm against ggml's (`AttnKernel::Reference` on the same keys as
//! rows) within a bound; prefill attention as a pipeline (`matrix::attend_pipelined`) against
//! the fused kernel, bit for bit, on 1–3 workers of every role.

mod common;

use common::{tables, Rng};
use corelm_kernels::attention::{attend_heads, attend_row, attend_rows, matrix, AttnKernel, ROWS_MAX_VECTORS, AttnScratch, Cells, KeyLayout, KvRows, KEY_COLUMNS};
use corelm_kernels::Kernels;
use half::f16;

/// A paged cache of `cells` random cells over shuffled blocks of 16: keys as rows and as
/// columns (written by `matrix::store_key`), values as rows.
struct Cache {
    hd: usize,
    table: Vec<u32>,
    k_rows: Vec<f16>,
    k_cols: Vec<u8>,
    v: Vec<f16>,
}

impl Cache {
    fn new(hd: usize, cells: usize, rng: &mut Rng) -> Cache {
        let n_blocks = cells.div_ceil(KEY_COLUMNS);
        let table: Vec<u32> = (1..=n_blocks as u32).rev().collect();
        let slots = (n_blocks + 1) * KEY_COLUMNS;
        // Stale NaNs where no cell was written: a kernel must never read them.
        let (mut k_rows, mut v) = (vec![f16::NAN; slots * hd], vec![f16::NAN; slots * hd]);
        let mut k_cols = vec![0xFFu8; slots * hd * 2];
        let shift = KEY_COLUMNS.trailing_zeros();
        for c in 0..cells {
            let row = ((table[c >> shift] as usize) << shift) | (c & (KEY_COLUMNS - 1));
            let key: Vec<f32> = (0..hd).map(|_| rng.f32() * 3.0).collect();
            for d in 0..hd {
                k_rows[row * hd + d] = f16::from_f32(key[d]);
                v[row * hd + d] = f16::from_f32(rng.f32() * 50.0);
            }
            let b = (row / KEY_COLUMNS) * KEY_COLUMNS * hd * 2;
            matrix::store_key(&mut k_cols[b..b + KEY_COLUMNS * hd * 2], row % KEY_COLUMNS, &key);
        }
        Cache { hd, table, k_rows, k_cols, v }
    }

    fn rows(&self) -> KvRows<'_> {
        KvRows { table: &self.table, shift: KEY_COLUMNS.trailing_zeros(), ..KvRows::contiguous(&self.k_rows, &self.v, self.hd, &[]) }
    }

    fn columns(&self) -> KvRows<'_> {
        KvRows { k: &self.k_cols, k_layout: KeyLayout::Columns, ..self.rows() }
    }
}

fn same(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

const SHAPES: [(usize, usize, usize, usize); 8] = [(64, 3, 5, 150), (64, 7, 2, 200), (256, 4, 4, 131), (72, 2, 3, 70), (96, 1, 16, 90), (40, 4, 3, 9), (64, 3, 21, 300), (64, 1, 64, 100)];

#[test]
fn every_table_gives_the_portable_bits() {
    // Where a SIMD or matrix-unit version exists it is the one that runs: AVX-512 on x86; SME
    // (past its start-up self-test) where the SME table is granted, which the emulated runs of
    // `scripts/test_arm.sh` with `CORELM_EXPECT_SME=1` require.
    for k in tables() {
        let want = k.isa() != corelm_kernels::Isa::Portable;
        assert_eq!(matrix::has_simd(&k, 64), want, "{:?}", k.isa());
    }
    if std::env::var("CORELM_EXPECT_SME").is_ok_and(|v| v == "1") {
        assert!(tables().iter().any(|k| k.isa() == corelm_kernels::Isa::Sme), "CORELM_EXPECT_SME=1 without the SME table");
    }
    let mut rng = Rng(77);
    for (hd, heads, rows, cells) in SHAPES {
        let cache = Cache::new(hd, cells, &mut rng);
        let kv = cache.columns();
        let q: Vec<f32> = (0..rows * heads * hd).map(|_| rng.f32() * 4.0).collect();
        let causal: Vec<_> = (0..rows).map(|r| 0..cells - rows + 1 + r).collect();
        let window: Vec<_> = (0..rows).map(|r| (cells * (r + 1) / rows).saturating_sub(70)..cells * (r + 1) / rows).collect();
        let mut empty = causal.clone();
        empty[rows / 2] = 5..5;
        for k in tables() {
            for spans in [&causal, &window, &empty] {
                let mut s = AttnScratch::with_heads(hd, heads);
                let mut out = vec![0f32; rows * heads * hd];
                let qs: Vec<&[f32]> = q.chunks_exact(heads * hd).collect();
                let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(heads * hd).collect();
                attend_rows(AttnKernel::Tiled, &k, &qs, heads, spans, &kv, 0.125, &mut s, &mut outs);
                for (r, span) in spans.iter().enumerate() {
                    let o = r * heads * hd..(r + 1) * heads * hd;
                    let mut want = vec![0f32; heads * hd];
                    let lo = span.start;
                    matrix::attend_heads_portable(&q[o.clone()], Cells { kv: &kv, n: span.end, visible: &|c| c >= lo }, 0.125, &mut s, &mut want);
                    assert!(same(&out[o.clone()], &want), "{:?} rows: hd {hd} heads {heads} row {r} span {span:?}", k.isa());
                    // Decode's entry points: the heads together, and one head alone.
                    let mut dec = vec![0f32; heads * hd];
                    attend_heads(AttnKernel::Reference, &k, &q[o.clone()], Cells { kv: &kv, n: span.end, visible: &|c| c >= lo }, 0.125, &mut s, &mut dec);
                    assert!(same(&dec, &want), "{:?} heads: hd {hd} heads {heads} row {r} span {span:?}", k.isa());
                    let mut one = vec![0f32; hd];
                    attend_row(AttnKernel::Reference, &k, &q[o.start..o.start + hd], Cells { kv: &kv, n: span.end, visible: &|c| c >= lo }, 0.125, &mut s, &mut one);
                    assert!(same(&one, &want[..hd]), "{:?} row: hd {hd} row {r} span {span:?}", k.isa());
                }
            }
        }
    }
}

/// The algorithm is attention: within a bound of ggml's one-chunk kernel (which rounds the
/// query to F16 and keeps its accumulator in F16) on the same keys stored as rows, and with all
/// keys equal, the mean of the visible values.
#[test]
fn agrees_with_ggml_within_a_bound() {
    let mut rng = Rng(78);
    let port = Kernels::portable();
    for (hd, heads, _, cells) in SHAPES {
        let cache = Cache::new(hd, cells, &mut rng);
        let q: Vec<f32> = (0..heads * hd).map(|_| rng.f32() * 4.0).collect();
        let mut s = AttnScratch::with_heads(hd, heads);
        let (mut got, mut want) = (vec![0f32; heads * hd], vec![0f32; heads * hd]);
        let lo = cells / 3;
        let vis = |c: usize| c >= lo;
        attend_heads(AttnKernel::Reference, &port, &q, Cells { kv: &cache.columns(), n: cells, visible: &vis }, 0.125, &mut s, &mut got);
        attend_heads(AttnKernel::Reference, &port, &q, Cells { kv: &cache.rows(), n: cells, visible: &vis }, 0.125, &mut s, &mut want);
        // Values are up to 50: ggml's F16 accumulator alone is off by up to 50 · 2⁻¹¹.
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < 0.1, "hd {hd} heads {heads}: max difference {err}");
    }
    // Equal keys: a uniform softmax, so the output is the mean of the visible values.
    let hd = 64;
    let mut cache = Cache::new(hd, 40, &mut rng);
    let key: Vec<f32> = (0..hd).map(|d| d as f32 / 64.0).collect();
    for b in 0..cache.table.len() + 1 {
        for j in 0..KEY_COLUMNS {
            let at = b * KEY_COLUMNS * hd * 2;
            matrix::store_key(&mut cache.k_cols[at..at + KEY_COLUMNS * hd * 2], j, &key);
        }
    }
    let kv = cache.columns();
    let q: Vec<f32> = (0..hd).map(|_| rng.f32()).collect();
    let mut out = vec![0f32; hd];
    attend_row(AttnKernel::Reference, &port, &q, Cells { kv: &kv, n: 40, visible: &|c| c >= 7 }, 0.3, &mut AttnScratch::new(hd), &mut out);
    for (d, o) in out.iter().enumerate() {
        let mean = (7..40).map(|c| kv.v(c)[d].to_f32() as f64).sum::<f64>() / 33.0;
        assert!((*o as f64 - mean).abs() < 1e-4 * mean.abs().max(1.0), "dimension {d}: {o} against the mean {mean}");
    }
}

/// Prefill attention as a pipeline: every table, 1–3 workers with every mix of roles, two nodes
/// in a row on one `Pipeline` (its counts reset between them): the fused column-key kernel's
/// bits on every row, and only the key blocks some row of an item sees scored.
#[test]
fn the_pipeline_gives_the_fused_bits() {
    use matrix::{attend_pipelined, PipeItem, Pipeline, Role};
    let mut rng = Rng(91);
    // (head_dim, query heads per KV head, KV heads, rows, cells before the first row, window)
    for (hd, group, n_kv, rows, ctx0, window) in [(64, 3, 2, 100, 40, None), (64, 7, 1, 30, 0, None), (128, 1, 2, 70, 200, Some(50)), (256, 4, 1, 20, 5, None), (64, 2, 1, 3, 0, None), (64, 3, 1, 40, 400, None)] {
        let cells = ctx0 + rows;
        let caches: Vec<Cache> = (0..n_kv).map(|_| Cache::new(hd, cells, &mut rng)).collect();
        let heads = group * n_kv;
        let q: Vec<f32> = (0..rows * heads * hd).map(|_| rng.f32() * 4.0).collect();
        let spans: Vec<_> = (0..rows).map(|r| window.map_or(0, |w: usize| (ctx0 + r + 1).saturating_sub(w))..ctx0 + r + 1).collect();
        let per = (ROWS_MAX_VECTORS / group).max(1);
        let n_items = rows.div_ceil(per) * n_kv;
        // Item i: rows (i / n_kv)·per.., the query heads of KV head i % n_kv.
        let item_rows = |i: usize| (i / n_kv) * per..((i / n_kv + 1) * per).min(rows);
        let q_of = |r: usize, j: usize| &q[r * heads * hd + j * group * hd..r * heads * hd + (j + 1) * group * hd];
        // Blocks some row of an item sees, over all items.
        let seen: u64 = (0..n_items)
            .map(|i| {
                let rs = item_rows(i);
                (0..cells.div_ceil(KEY_COLUMNS)).filter(|b| rs.clone().any(|r| spans[r].start < (b + 1) * KEY_COLUMNS && spans[r].end > b * KEY_COLUMNS)).count() as u64
            })
            .sum();
        for k in tables() {
            let mut want = vec![0f32; rows * heads * hd];
            let mut s = AttnScratch::with_heads(hd, group);
            for i in 0..n_items {
                let (rs, j) = (item_rows(i), i % n_kv);
                let qs: Vec<&[f32]> = rs.clone().map(|r| q_of(r, j)).collect();
                let mut outs: Vec<&mut [f32]> = want.chunks_exact_mut(heads * hd).skip(rs.start).take(rs.len()).map(|o| &mut o[j * group * hd..(j + 1) * group * hd]).collect();
                attend_rows(AttnKernel::Tiled, &k, &qs, group, &spans[rs], &caches[j].columns(), 0.125, &mut s, &mut outs);
            }
            for nth in 1..=3usize {
                for roles in [[Role::Any; 3], [Role::Matrix, Role::Vector, Role::Vector], [Role::Vector, Role::Matrix, Role::Any]] {
                    let pipe = Pipeline::new(hd, 2 * nth + 1);
                    for node in 0..2 {
                        let mut got = vec![f32::NAN; rows * heads * hd];
                        let base = got.as_mut_ptr() as usize;
                        let span_of = |r: usize| spans[r].clone();
                        let item = |i: usize| {
                            let (rs, j) = (item_rows(i), i % n_kv);
                            let at = rs.start * heads * hd + j * group * hd;
                            PipeItem { kv: caches[j].columns(), heads: group, rows: rs.len(), q: &q[at..], out: (base as *mut f32).wrapping_add(at), stride: heads * hd, row0: rs.start, span_of: &span_of }
                        };
                        let (k, pipe, item) = (&k, &pipe, &item);
                        std::thread::scope(|sc| {
                            for (ith, &role) in roles.iter().enumerate().take(nth) {
                                // SAFETY: every worker calls it once with the same items; each
                                // item's outputs are its rows' heads of its KV head, disjoint.
                                sc.spawn(move || unsafe { attend_pipelined(k, pipe, role, ith, nth, n_items, item, 0.125, &mut AttnScratch::with_heads(hd, group)) });
                            }
                        });
                        assert!(same(&got, &want), "{:?}: hd {hd} group {group} rows {rows} nth {nth} roles {roles:?} node {node}", k.isa());
                    }
                    assert_eq!(pipe.blocks_scored(), 2 * seen, "hd {hd} group {group} rows {rows}: blocks scored");
                }
            }
        }
    }
}
