//! Attention over keys stored in columns (`attention::matrix`): every table's version against
//! the portable form bit for bit (decode and prefill rows, causal, sliding window, a row that
//! sees nothing, ragged last blocks, GQA groups, head dimensions with and without the SIMD
//! version), and the algorithm against ggml's (`AttnKernel::Reference` on the same keys as
//! rows) within a bound; prefill attention as a pipeline (`matrix::attend_pipelined`) against
//! the fused kernel, bit for bit, on 1–3 workers of every role. Q8_0 caches (keys as Q8_0
//! columns, values as F16 or Q8_0 rows): every table against the portable form bit for bit,
//! and within a bound of ggml's kernel on the same Q8_0 keys and values as rows.

mod common;

use common::{tables, Rng};
use corelm_kernels::attention::{attend_heads, attend_row, attend_rows, matrix, AttnKernel, ROWS_MAX_VECTORS, AttnScratch, Cells, KeyLayout, KvRows, KEY_COLUMNS};
use corelm_kernels::quant::portable::quant_q8_0;
use corelm_kernels::{DType, Kernels};
use half::f16;

/// A paged cache of `cells` random cells over shuffled blocks of 16: keys as rows and as
/// columns (written by `matrix::store_key`), values as rows.
struct Cache {
    hd: usize,
    table: Vec<u32>,
    k_rows: Vec<f16>,
    k_cols: Vec<u8>,
    v: Vec<f16>,
    /// The same cells quantized to Q8_0 (head dimensions that are multiples of 32): keys as
    /// rows and as columns (`matrix::store_key_q8`), values as rows.
    k_rows_q8: Vec<u8>,
    k_cols_q8: Vec<u8>,
    v_q8: Vec<u8>,
}

impl Cache {
    fn new(hd: usize, cells: usize, rng: &mut Rng) -> Cache {
        let n_blocks = cells.div_ceil(KEY_COLUMNS);
        let table: Vec<u32> = (1..=n_blocks as u32).rev().collect();
        let slots = (n_blocks + 1) * KEY_COLUMNS;
        // Stale NaNs where no cell was written: a kernel must never read them.
        let (mut k_rows, mut v) = (vec![f16::NAN; slots * hd], vec![f16::NAN; slots * hd]);
        let mut k_cols = vec![0xFFu8; slots * hd * 2];
        // Q8_0: 34 bytes per 32 values; stale bytes decode as NaN scales.
        let q8 = hd.is_multiple_of(32);
        let rb8 = if q8 { hd / 32 * 34 } else { 0 };
        let (mut k_rows_q8, mut k_cols_q8, mut v_q8) = (vec![0xFFu8; slots * rb8], vec![0xFFu8; slots * rb8], vec![0xFFu8; slots * rb8]);
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
            if q8 {
                let r = row * rb8..(row + 1) * rb8;
                quant_q8_0(&key, &mut k_rows_q8[r.clone()]);
                let vf: Vec<f32> = v[row * hd..(row + 1) * hd].iter().map(|x| x.to_f32()).collect();
                quant_q8_0(&vf, &mut v_q8[r.clone()]);
                let b = (row / KEY_COLUMNS) * KEY_COLUMNS * rb8;
                matrix::store_key_q8(&mut k_cols_q8[b..b + KEY_COLUMNS * rb8], row % KEY_COLUMNS, &k_rows_q8[r]);
            }
        }
        Cache { hd, table, k_rows, k_cols, v, k_rows_q8, k_cols_q8, v_q8 }
    }

    /// Q8_0 keys as rows (ggml's layout) with Q8_0 (`v8`) or F16 values.
    fn rows_q8(&self, v8: bool) -> KvRows<'_> {
        let r = self.rows();
        let (v, v_type) = if v8 { (&self.v_q8[..], DType::Q8_0) } else { (r.v, DType::F16) };
        KvRows { k: &self.k_rows_q8, k_type: DType::Q8_0, v, v_type, ..r }
    }

    /// Q8_0 keys in columns with Q8_0 (`v8`) or F16 values.
    fn columns_q8(&self, v8: bool) -> KvRows<'_> {
        KvRows { k: &self.k_cols_q8, k_layout: KeyLayout::Columns, ..self.rows_q8(v8) }
    }

    fn rows(&self) -> KvRows<'_> {
        KvRows { table: &self.table, shift: KEY_COLUMNS.trailing_zeros(), ..KvRows::contiguous(&self.k_rows, &self.v, self.hd, &[]) }
    }

    fn columns(&self) -> KvRows<'_> {
        KvRows { k: &self.k_cols, k_layout: KeyLayout::Columns, ..self.rows() }
    }
}

/// Each row's visible cells three ways: causal, a sliding window of 70, causal with one row
/// that sees nothing.
fn spans(rows: usize, cells: usize) -> [Vec<std::ops::Range<usize>>; 3] {
    let causal: Vec<_> = (0..rows).map(|r| 0..cells - rows + 1 + r).collect();
    let window: Vec<_> = (0..rows).map(|r| (cells * (r + 1) / rows).saturating_sub(70)..cells * (r + 1) / rows).collect();
    let mut empty = causal.clone();
    empty[rows / 2] = 5..5;
    [causal, window, empty]
}

/// Prefill attention (`attend_rows`) of the rows of `q` (`heads` heads each) seeing `spans`.
fn prefill(k: &Kernels, q: &[f32], heads: usize, spans: &[std::ops::Range<usize>], kv: &KvRows, s: &mut AttnScratch) -> Vec<f32> {
    let per = heads * kv.head_dim;
    let mut out = vec![0f32; q.len()];
    let qs: Vec<&[f32]> = q.chunks_exact(per).collect();
    let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(per).collect();
    attend_rows(AttnKernel::Tiled, k, &qs, heads, spans, kv, 0.125, s, &mut outs);
    out
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
        let [causal, window, empty] = spans(rows, cells);
        for k in tables() {
            for spans in [&causal, &window, &empty] {
                let mut s = AttnScratch::with_heads(hd, heads);
                let out = prefill(&k, &q, heads, spans, &kv, &mut s);
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

/// Q8_0 caches: keys in columns with F16 or Q8_0 values, on every table the portable form's
/// bits (prefill rows and decode heads, causal, window, a row that sees nothing), and within a
/// bound of ggml's one-chunk kernel on the same Q8_0 keys and values stored as rows.
#[test]
fn q8_0_caches_every_table_gives_the_portable_bits() {
    let mut rng = Rng(79);
    let port = Kernels::portable();
    for (hd, heads, rows, cells) in SHAPES.into_iter().filter(|s| s.0 % 32 == 0) {
        let cache = Cache::new(hd, cells, &mut rng);
        let q: Vec<f32> = (0..rows * heads * hd).map(|_| rng.f32() * 4.0).collect();
        let [causal, window, empty] = spans(rows, cells);
        for v8 in [false, true] {
            let kv = cache.columns_q8(v8);
            let mut s = AttnScratch::with_heads(hd, heads);
            for spans in [&causal, &window, &empty] {
                // The portable form, row by row.
                let want: Vec<Vec<f32>> = spans
                    .iter()
                    .enumerate()
                    .map(|(r, span)| {
                        let mut w = vec![0f32; heads * hd];
                        let lo = span.start;
                        matrix::attend_heads_portable(&q[r * heads * hd..(r + 1) * heads * hd], Cells { kv: &kv, n: span.end, visible: &|c| c >= lo }, 0.125, &mut s, &mut w);
                        w
                    })
                    .collect();
                for k in tables() {
                    let out = prefill(&k, &q, heads, spans, &kv, &mut s);
                    for (r, span) in spans.iter().enumerate() {
                        let o = r * heads * hd..(r + 1) * heads * hd;
                        assert!(same(&out[o.clone()], &want[r]), "{:?} rows: hd {hd} heads {heads} row {r} span {span:?} q8 values {v8}", k.isa());
                        let mut dec = vec![0f32; heads * hd];
                        let lo = span.start;
                        attend_heads(AttnKernel::Reference, &k, &q[o], Cells { kv: &kv, n: span.end, visible: &|c| c >= lo }, 0.125, &mut s, &mut dec);
                        assert!(same(&dec, &want[r]), "{:?} heads: hd {hd} heads {heads} row {r} span {span:?} q8 values {v8}", k.isa());
                    }
                }
            }
            // Attention in f64 over the cells' Q8_0 values (the query unquantized): the widening
            // to F16 and the f32 arithmetic stay within a small bound of it. ggml's kernel on
            // the same cells as rows (`rows_q8`) quantizes the query to Q8_0 too, so it is
            // further off (reported, not bounded tightly).
            let lo = cells / 3;
            let vis = |c: usize| c >= lo;
            let mut got = vec![0f32; heads * hd];
            attend_heads(AttnKernel::Reference, &port, &q[..heads * hd], Cells { kv: &kv, n: cells, visible: &vis }, 0.125, &mut s, &mut got);
            let exact = exact_q8(&cache, &q[..heads * hd], v8, lo..cells, 0.125);
            let err = got.iter().zip(&exact).map(|(a, b)| (*a as f64 - b).abs()).fold(0f64, f64::max);
            assert!(err < 0.1, "hd {hd} heads {heads} q8 values {v8}: max difference {err} from exact attention");
            let mut ggml = vec![0f32; heads * hd];
            attend_heads(AttnKernel::Reference, &port, &q[..heads * hd], Cells { kv: &cache.rows_q8(v8), n: cells, visible: &vis }, 0.125, &mut s, &mut ggml);
            let err_ggml = ggml.iter().zip(&exact).map(|(a, b)| (*a as f64 - b).abs()).fold(0f64, f64::max);
            assert!(err_ggml < 2.0, "ggml's kernel: {err_ggml}");
            eprintln!("hd {hd} heads {heads} q8 values {v8}: max |Δ| from exact: columns {err:.2e}, ggml's rows {err_ggml:.2e}");
        }
    }
}

/// Attention in f64 over the Q8_0 cells `span` of `cache` (dequantized keys, and values in
/// Q8_0 (`v8`) or F16), each head of `q` alone.
fn exact_q8(cache: &Cache, q: &[f32], v8: bool, span: std::ops::Range<usize>, scale: f64) -> Vec<f64> {
    use corelm_kernels::quant::portable::dequant_q8_0;
    let hd = cache.hd;
    let rb8 = hd / 32 * 34;
    let kv = cache.rows();
    let deq = |bytes: &[u8]| {
        let mut x = vec![0f32; hd];
        dequant_q8_0(bytes, &mut x);
        x
    };
    let mut out = vec![0f64; q.len()];
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        let rows: Vec<usize> = span.clone().map(|c| kv.row(c)).collect();
        let scores: Vec<f64> = rows.iter().map(|&r| deq(&cache.k_rows_q8[r * rb8..(r + 1) * rb8]).iter().zip(qh).map(|(k, q)| *k as f64 * *q as f64).sum::<f64>() * scale).collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let total: f64 = p.iter().sum();
        for (&r, p) in rows.iter().zip(&p) {
            let v: Vec<f32> = if v8 { deq(&cache.v_q8[r * rb8..(r + 1) * rb8]) } else { cache.v[r * hd..(r + 1) * hd].iter().map(|x| x.to_f32()).collect() };
            for (o, v) in oh.iter_mut().zip(&v) {
                *o += p / total * *v as f64;
            }
        }
    }
    out
}
