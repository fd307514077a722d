//! Attention over keys stored in columns (`attention::matrix`): every table's version against
//! the portable form bit for bit (decode and prefill rows, causal, sliding window, a row that
//! sees nothing, ragged last blocks, GQA groups, head dimensions with and without the SIMD
//! version), and the algorithm against ggml's (`AttnKernel::Reference` on the same keys as
//! rows) within a bound; prefill attention as a pipeline (`matrix::attend_pipelined`) against
//! the fused kernel, bit for bit, on 1–3 workers of every role. Q8_0 and Q4_0 caches (keys as
//! columns of their type, values as F16 or quantized rows): every table against the portable
//! form bit for bit, and within a bound of f64 attention over the same quantized cells.

mod common;

use common::{tables, Rng};
use corelm_kernels::attention::{attend_heads, attend_row, attend_rows, matrix, AttnKernel, ROWS_MAX_VECTORS, AttnScratch, Cells, KeyLayout, KvRows, Visible, KEY_COLUMNS};
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
    /// The same cells quantized to Q8_0 and to Q4_0 (head dimensions that are multiples of 32).
    quant: Vec<Quant>,
}

/// A cache's cells in one quantized type: keys as rows and as columns
/// (`matrix::store_key_q8`/`store_key_q4`), values as rows.
struct Quant {
    t: DType,
    k_rows: Vec<u8>,
    k_cols: Vec<u8>,
    v: Vec<u8>,
}

/// The quantized types a cache with keys in columns takes.
const QUANT: [DType; 2] = [DType::Q8_0, DType::Q4_0];

/// `x` quantized to `t` (Q8_0 or Q4_0) into `y`, as the KV writers quantize.
fn quantize(t: DType, x: &[f32], y: &mut [u8]) {
    match t {
        DType::Q8_0 => corelm_kernels::quant::portable::quant_q8_0(x, y),
        _ => corelm_kernels::quant::reference::quant_q4_0(x, y),
    }
}

/// A row of type `t` (Q8_0 or Q4_0) as f32.
fn dequantize(t: DType, x: &[u8], y: &mut [f32]) {
    match t {
        DType::Q8_0 => corelm_kernels::quant::portable::dequant_q8_0(x, y),
        _ => corelm_kernels::quant::portable::dequant_q4_0(x, y),
    }
}

impl Cache {
    fn new(hd: usize, cells: usize, rng: &mut Rng) -> Cache {
        let n_blocks = cells.div_ceil(KEY_COLUMNS);
        let table: Vec<u32> = (1..=n_blocks as u32).rev().collect();
        let slots = (n_blocks + 1) * KEY_COLUMNS;
        // Stale NaNs where no cell was written: a kernel must never read them.
        let (mut k_rows, mut v) = (vec![f16::NAN; slots * hd], vec![f16::NAN; slots * hd]);
        let mut k_cols = vec![0xFFu8; slots * hd * 2];
        // Quantized copies (stale bytes decode as NaN scales).
        let mut quant: Vec<Quant> = if hd.is_multiple_of(32) {
            QUANT.iter().map(|&t| {
                let n = slots * corelm_kernels::row_bytes(t, hd);
                Quant { t, k_rows: vec![0xFF; n], k_cols: vec![0xFF; n], v: vec![0xFF; n] }
            }).collect()
        } else {
            vec![]
        };
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
            let vf: Vec<f32> = v[row * hd..(row + 1) * hd].iter().map(|x| x.to_f32()).collect();
            for qc in &mut quant {
                let rb = corelm_kernels::row_bytes(qc.t, hd);
                let r = row * rb..(row + 1) * rb;
                quantize(qc.t, &key, &mut qc.k_rows[r.clone()]);
                quantize(qc.t, &vf, &mut qc.v[r.clone()]);
                let (b, j) = ((row / KEY_COLUMNS) * KEY_COLUMNS * rb, row % KEY_COLUMNS);
                let block = &mut qc.k_cols[b..b + KEY_COLUMNS * rb];
                match qc.t {
                    DType::Q8_0 => matrix::store_key_q8(block, j, &qc.k_rows[r]),
                    _ => matrix::store_key_q4(block, j, &qc.k_rows[r]),
                }
            }
        }
        Cache { hd, table, k_rows, k_cols, v, quant }
    }

    /// Keys of type `t` as rows (ggml's layout) with values of that type (`vq`) or F16.
    fn rows_q(&self, t: DType, vq: bool) -> KvRows<'_> {
        let r = self.rows();
        let qc = self.quant.iter().find(|q| q.t == t).expect("a quantized copy");
        let (v, v_type) = if vq { (&qc.v[..], t) } else { (r.v, DType::F16) };
        KvRows { k: &qc.k_rows, k_type: t, v, v_type, ..r }
    }

    /// Keys of type `t` in columns with values of that type (`vq`) or F16.
    fn columns_q(&self, t: DType, vq: bool) -> KvRows<'_> {
        let qc = self.quant.iter().find(|q| q.t == t).expect("a quantized copy");
        KvRows { k: &qc.k_cols, k_layout: KeyLayout::Columns, ..self.rows_q(t, vq) }
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
    attend_rows(AttnKernel::Tiled, k, &qs, heads, spans, kv, 0.125, None, s, &mut outs);
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
                    matrix::attend_heads_portable(&q[o.clone()], Cells { kv: &kv, n: span.end, visible: Visible::Mask(&|c| c >= lo) }, 0.125, &mut s, &mut want);
                    assert!(same(&out[o.clone()], &want), "{:?} rows: hd {hd} heads {heads} row {r} span {span:?}", k.isa());
                    // Decode's entry points: the heads together, and one head alone.
                    let mut dec = vec![0f32; heads * hd];
                    attend_heads(AttnKernel::Reference, &k, &q[o.clone()], Cells { kv: &kv, n: span.end, visible: Visible::Mask(&|c| c >= lo) }, 0.125, &mut s, &mut dec);
                    assert!(same(&dec, &want), "{:?} heads: hd {hd} heads {heads} row {r} span {span:?}", k.isa());
                    let mut one = vec![0f32; hd];
                    attend_row(AttnKernel::Reference, &k, &q[o.start..o.start + hd], Cells { kv: &kv, n: span.end, visible: Visible::Mask(&|c| c >= lo) }, 0.125, &mut s, &mut one);
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
        attend_heads(AttnKernel::Reference, &port, &q, Cells { kv: &cache.columns(), n: cells, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut got);
        attend_heads(AttnKernel::Reference, &port, &q, Cells { kv: &cache.rows(), n: cells, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut want);
        // Values are up to 50: ggml's F16 accumulator alone is off by up to 50 · 2⁻¹¹.
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, |m, d| if m.is_nan() || d.is_nan() { f32::NAN } else { m.max(d) });
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
    attend_row(AttnKernel::Reference, &port, &q, Cells { kv: &kv, n: 40, visible: Visible::Mask(&|c| c >= 7) }, 0.3, &mut AttnScratch::new(hd), &mut out);
    for (d, o) in out.iter().enumerate() {
        let mean = (7..40).map(|c| kv.v(c)[d].to_f32() as f64).sum::<f64>() / 33.0;
        assert!((*o as f64 - mean).abs() < 1e-4 * mean.abs().max(1.0), "dimension {d}: {o} against the mean {mean}");
    }
}

/// Prefill attention as a pipeline: every table, 1–3 workers with every mix of roles, two nodes
/// in a row on one `Pipeline` (its counts reset between them): the fused column-key kernel's
/// bits on every row, and only the key blocks some row of an item sees scored. F16 caches, and
/// on a last small shape Q8_0 keys with F16 values and Q4_0 keys and values (each phase
/// widening the blocks it reads).
#[test]
fn the_pipeline_gives_the_fused_bits() {
    use matrix::{attend_pipelined, PipeItem, Pipeline, Role};
    let mut rng = Rng(91);
    // (head_dim, query heads per KV head, KV heads, rows, cells before the first row, window)
    let shapes = [(64, 3, 2, 100, 40, None), (64, 7, 1, 30, 0, None), (128, 1, 2, 70, 200, Some(50)), (256, 4, 1, 20, 5, None), (64, 2, 1, 3, 0, None), (64, 3, 1, 40, 400, None), (64, 2, 2, 12, 20, None)];
    for (si, (hd, group, n_kv, rows, ctx0, window)) in shapes.into_iter().enumerate() {
        let cells = ctx0 + rows;
        let caches: Vec<Cache> = (0..n_kv).map(|_| Cache::new(hd, cells, &mut rng)).collect();
        // The quantized caches on the last, small shape (this test also runs under emulation).
        let types: &[Option<(DType, bool)>] = if si + 1 == shapes.len() { &[Some((DType::Q8_0, false)), Some((DType::Q4_0, true))] } else { &[None] };
        for &cache_type in types {
            let view = |j: usize| cache_type.map_or_else(|| caches[j].columns(), |(t, vq)| caches[j].columns_q(t, vq));
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
                    attend_rows(AttnKernel::Tiled, &k, &qs, group, &spans[rs], &view(j), 0.125, None, &mut s, &mut outs);
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
                                PipeItem { kv: view(j), heads: group, rows: rs.len(), q: &q[at..], out: (base as *mut f32).wrapping_add(at), stride: heads * hd, row0: rs.start, span_of: &span_of }
                            };
                            let (k, pipe, item) = (&k, &pipe, &item);
                            std::thread::scope(|sc| {
                                for (ith, &role) in roles.iter().enumerate().take(nth) {
                                    // SAFETY: every worker calls it once with the same items; each
                                    // item's outputs are its rows' heads of its KV head, disjoint.
                                    sc.spawn(move || unsafe { attend_pipelined(k, pipe, role, ith, nth, n_items, item, 0.125, &mut AttnScratch::with_heads(hd, group)) });
                                }
                            });
                            assert!(same(&got, &want), "{:?} {cache_type:?}: hd {hd} group {group} rows {rows} nth {nth} roles {roles:?} node {node}", k.isa());
                        }
                        assert_eq!(pipe.blocks_scored(), 2 * seen, "hd {hd} group {group} rows {rows}: blocks scored");
                    }
                }
            }
        }
    }
}

/// Q8_0 and Q4_0 caches: keys in columns with F16 or quantized values, on every table the
/// portable form's bits (prefill rows and decode heads, causal, window, a row that sees
/// nothing), and within a bound of f64 attention over the same quantized cells (ggml's
/// one-chunk kernel on them as rows quantizes the query too: reported).
#[test]
fn quantized_caches_every_table_gives_the_portable_bits() {
    let mut rng = Rng(79);
    let port = Kernels::portable();
    for (hd, heads, rows, cells) in SHAPES.into_iter().filter(|s| s.0 % 32 == 0) {
        let cache = Cache::new(hd, cells, &mut rng);
        let q: Vec<f32> = (0..rows * heads * hd).map(|_| rng.f32() * 4.0).collect();
        let [causal, window, empty] = spans(rows, cells);
        for (t, vq) in QUANT.iter().flat_map(|&t| [(t, false), (t, true)]) {
            let kv = cache.columns_q(t, vq);
            let mut s = AttnScratch::with_heads(hd, heads);
            for spans in [&causal, &window, &empty] {
                // The portable form, row by row.
                let want: Vec<Vec<f32>> = spans
                    .iter()
                    .enumerate()
                    .map(|(r, span)| {
                        let mut w = vec![0f32; heads * hd];
                        let lo = span.start;
                        matrix::attend_heads_portable(&q[r * heads * hd..(r + 1) * heads * hd], Cells { kv: &kv, n: span.end, visible: Visible::Mask(&|c| c >= lo) }, 0.125, &mut s, &mut w);
                        w
                    })
                    .collect();
                for k in tables() {
                    let out = prefill(&k, &q, heads, spans, &kv, &mut s);
                    for (r, span) in spans.iter().enumerate() {
                        let o = r * heads * hd..(r + 1) * heads * hd;
                        assert!(same(&out[o.clone()], &want[r]), "{:?} rows: {t} keys, quantized values {vq}, hd {hd} heads {heads} row {r} span {span:?}", k.isa());
                        let mut dec = vec![0f32; heads * hd];
                        let lo = span.start;
                        attend_heads(AttnKernel::Reference, &k, &q[o], Cells { kv: &kv, n: span.end, visible: Visible::Mask(&|c| c >= lo) }, 0.125, &mut s, &mut dec);
                        assert!(same(&dec, &want[r]), "{:?} heads: {t} keys, quantized values {vq}, hd {hd} heads {heads} row {r} span {span:?}", k.isa());
                    }
                }
            }
            let lo = cells / 3;
            let vis = |c: usize| c >= lo;
            let mut got = vec![0f32; heads * hd];
            attend_heads(AttnKernel::Reference, &port, &q[..heads * hd], Cells { kv: &kv, n: cells, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut got);
            let exact = exact_q(&cache, t, &q[..heads * hd], vq, lo..cells, 0.125);
            let err = got.iter().zip(&exact).map(|(a, b)| (*a as f64 - b).abs()).fold(0f64, f64::max);
            assert!(err < 0.1, "{t} keys, quantized values {vq}, hd {hd} heads {heads}: max difference {err} from exact attention");
            let mut ggml = vec![0f32; heads * hd];
            attend_heads(AttnKernel::Reference, &port, &q[..heads * hd], Cells { kv: &cache.rows_q(t, vq), n: cells, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut ggml);
            let err_ggml = ggml.iter().zip(&exact).map(|(a, b)| (*a as f64 - b).abs()).fold(0f64, f64::max);
            eprintln!("{t} keys, quantized values {vq}, hd {hd} heads {heads}: max |Δ| from exact: columns {err:.2e}, ggml's rows {err_ggml:.2e}");
        }
    }
}

/// Attention in f64 over the cells `span` of `cache` in type `t` (dequantized keys, and values
/// of that type (`vq`) or F16), each head of `q` alone.
fn exact_q(cache: &Cache, t: DType, q: &[f32], vq: bool, span: std::ops::Range<usize>, scale: f64) -> Vec<f64> {
    let hd = cache.hd;
    let rb = corelm_kernels::row_bytes(t, hd);
    let qc = cache.quant.iter().find(|c| c.t == t).expect("a quantized copy");
    let kv = cache.rows();
    let deq = |bytes: &[u8]| {
        let mut x = vec![0f32; hd];
        dequantize(t, bytes, &mut x);
        x
    };
    let mut out = vec![0f64; q.len()];
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        let rows: Vec<usize> = span.clone().map(|c| kv.row(c)).collect();
        let scores: Vec<f64> = rows.iter().map(|&r| deq(&qc.k_rows[r * rb..(r + 1) * rb]).iter().zip(qh).map(|(k, q)| *k as f64 * *q as f64).sum::<f64>() * scale).collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let total: f64 = p.iter().sum();
        for (&r, p) in rows.iter().zip(&p) {
            let v: Vec<f32> = if vq { deq(&qc.v[r * rb..(r + 1) * rb]) } else { cache.v[r * hd..(r + 1) * hd].iter().map(|x| x.to_f32()).collect() };
            for (o, v) in oh.iter_mut().zip(&v) {
                *o += p / total * *v as f64;
            }
        }
    }
    out
}
