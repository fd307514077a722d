//! Attention kernels against their portable twins: one-chunk and tiled prefill, decode over a
//! GQA group, split-KV decode, quantized caches.

use crate::common::{tables, Rng};
use corelm_kernels::attention::{Cells, Visible};
use corelm_kernels::{row_bytes, DType, Kernels};
use half::f16;

#[test]
fn attention_simd_twin_is_bit_identical() {
    use corelm_kernels::attention::{attend_row, AttnKernel, AttnScratch, Cells, KvRows};
    let mut rng = Rng(99);
    let (fast, port) = (Kernels::detect(), Kernels::portable());
    for hd in [64usize, 72, 256, 36] {
        let cells = 37;
        let q: Vec<f32> = (0..hd).map(|_| rng.f32() * 4.0).collect();
        let k: Vec<f16> = (0..cells * hd).map(|_| f16::from_f32(rng.f32() * 3.0)).collect();
        let v: Vec<f16> = (0..cells * hd).map(|_| f16::from_f32(rng.f32() * 50.0)).collect();
        let vis = |c: usize| c % 5 != 3;
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
        let mut s = AttnScratch::new(hd);
        attend_row(AttnKernel::Reference, &fast, &q, Cells { kv: &kvr, n: cells, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut a);
        attend_row(AttnKernel::Reference, &port, &q, Cells { kv: &kvr, n: cells, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut b);
        assert_eq!(a, b, "head_dim {hd}");
        // Against an f64 softmax reference, within F16 accumulation error.
        let kf: Vec<f64> = k.iter().map(|x| x.to_f64()).collect();
        let scores: Vec<(usize, f64)> = (0..cells)
            .filter(|&c| vis(c))
            .map(|c| (c, (0..hd).map(|d| kf[c * hd + d] * half::f16::from_f32(q[d]).to_f64()).sum::<f64>() * 0.125))
            .collect();
        let mx = scores.iter().map(|s| s.1).fold(f64::MIN, f64::max);
        let z: f64 = scores.iter().map(|s| (s.1 - mx).exp()).sum();
        for d in 0..hd {
            let r: f64 = scores.iter().map(|&(c, sc)| (sc - mx).exp() / z * v[c * hd + d].to_f64()).sum();
            assert!((a[d] as f64 - r).abs() < 0.05 + 2e-3 * r.abs(), "hd {hd} dim {d}: {} vs {r}", a[d]);
        }
        // The tiled kernel: SIMD twin bit-identical to the portable one, both near the reference.
        let mut t = vec![0f32; hd];
        attend_row(AttnKernel::Tiled, &fast, &q, Cells { kv: &kvr, n: cells, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut t);
        attend_row(AttnKernel::Tiled, &port, &q, Cells { kv: &kvr, n: cells, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut b);
        assert_eq!(t, b, "tiled head_dim {hd}");
        for d in 0..hd {
            assert!((a[d] - b[d]).abs() < 0.05 + 2e-3 * a[d].abs(), "tiled hd {hd} dim {d}");
        }
        // Paged: the same rows scattered over shuffled blocks of 8 give the same bits.
        let n_blocks = cells.div_ceil(8);
        let table: Vec<u32> = (1..=n_blocks as u32).rev().collect();
        let (mut kp, mut vp) = (vec![f16::ZERO; (n_blocks + 1) * 8 * hd], vec![f16::ZERO; (n_blocks + 1) * 8 * hd]);
        let paged = KvRows { table: &table, shift: 3, ..KvRows::contiguous(&[], &[], hd, &[]) };
        for c in 0..cells {
            let r = paged.row(c) * hd;
            kp[r..r + hd].copy_from_slice(&k[c * hd..(c + 1) * hd]);
            vp[r..r + hd].copy_from_slice(&v[c * hd..(c + 1) * hd]);
        }
        let paged = KvRows { table: &table, shift: 3, ..KvRows::contiguous(&kp, &vp, hd, &[]) };
        for kind in [AttnKernel::Reference, AttnKernel::Tiled] {
            for ks in [&fast, &port] {
                let mut p = vec![0f32; hd];
                attend_row(kind, ks, &q, Cells { kv: &paged, n: cells, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut p);
                assert_eq!(&p, if kind == AttnKernel::Tiled { &t } else { &a }, "paged {kind:?} {:?} hd {hd}", ks.isa());
            }
        }
    }
}

/// `x`'s rows of `hd` values each as KV-cache rows of type `t`, converted by `ks`'s quantizer.
fn kv_rows_of(ks: &Kernels, t: DType, x: &[f32], hd: usize) -> Vec<u8> {
    let rb = row_bytes(t, hd);
    let mut out = vec![0u8; rb * (x.len() / hd)];
    for (row, o) in x.chunks_exact(hd).zip(out.chunks_exact_mut(rb)) {
        ks.from_float(t).unwrap()(row, o);
    }
    out
}

/// Quantized KV cache rows (Q8_0 / Q4_0 keys and values, as `--cache-type-k/-v`): the result
/// stays within the quantization error of an f64 softmax over the f32 rows, for every mix of
/// types, SIMD and portable tables agreeing.
#[test]
fn attention_over_quantized_cache() {
    use corelm_kernels::attention::{attend_row, AttnKernel, AttnScratch, Cells, KeyLayout, KvRows};
    let mut rng = Rng(7);
    let (fast, port) = (Kernels::detect(), Kernels::portable());
    let (hd, cells) = (64usize, 45usize);
    let q: Vec<f32> = (0..hd).map(|_| rng.f32() * 2.0).collect();
    let k: Vec<f32> = (0..cells * hd).map(|_| rng.f32() * 2.0).collect();
    let v: Vec<f32> = (0..cells * hd).map(|_| rng.f32() * 10.0).collect();
    let scores: Vec<f64> = (0..cells)
        .map(|c| (0..hd).map(|d| k[c * hd + d] as f64 * q[d] as f64).sum::<f64>() * 0.125)
        .collect();
    let mx = scores.iter().copied().fold(f64::MIN, f64::max);
    let z: f64 = scores.iter().map(|s| (s - mx).exp()).sum();
    let want: Vec<f64> =
        (0..hd).map(|d| (0..cells).map(|c| (scores[c] - mx).exp() / z * v[c * hd + d] as f64).sum()).collect();
    let ident: Vec<u32> = (0..cells as u32).collect();
    let enc = |t: DType, x: &[f32]| kv_rows_of(&port, t, x, hd);
    for (kt, vt, tol) in [
        (DType::Q8_0, DType::F16, 0.05),
        (DType::F16, DType::Q8_0, 0.1),
        (DType::Q8_0, DType::Q8_0, 0.1),
        (DType::Q4_0, DType::Q4_0, 1.0),
    ] {
        let (kb, vb) = (enc(kt, &k), enc(vt, &v));
        let rows = KvRows { k: &kb, v: &vb, k_type: kt, v_type: vt, head_dim: hd, table: &ident, shift: 0, k_layout: KeyLayout::Rows };
        let mut s = AttnScratch::new(hd);
        let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
        attend_row(AttnKernel::Reference, &fast, &q, Cells { kv: &rows, n: cells, visible: Visible::Mask(&|_| true) }, 0.125, &mut s, &mut a);
        attend_row(AttnKernel::Reference, &port, &q, Cells { kv: &rows, n: cells, visible: Visible::Mask(&|_| true) }, 0.125, &mut s, &mut b);
        for d in 0..hd {
            assert!((a[d] - b[d]).abs() < 1e-3 * (1.0 + a[d].abs()), "{kt}/{vt} dim {d}: simd {} portable {}", a[d], b[d]);
            assert!((a[d] as f64 - want[d]).abs() < tol, "{kt}/{vt} dim {d}: {} vs f64 {}", a[d], want[d]);
        }
    }
}

/// The tiled attention's softmax step with AVX2 (`attention::x86::softmax::softmax_tile`) against ggml's
/// scalar `expf_ggml` and 16-lane reduction: the same bits on every lane, including the
/// subnormal, overflow and saturated ranges and the -inf padding of short tiles.
#[cfg(target_arch = "x86_64")]
#[test]
fn softmax_tile_simd_is_bit_identical() {
    use corelm_kernels::exp::expf_ggml;
    use corelm_kernels::simd::reduce_add_16;
    if Kernels::detect().isa() < corelm_kernels::Isa::Avx2 {
        return;
    }
    let mut rng = Rng(5);
    let edges = [f32::NEG_INFINITY, -1e30, -200.0, -133.0, -103.9, -87.4, -87.0, -20.0, -1e-3, -0.0, 0.0, 1e-7, 60.0, 88.7, 100.0, 140.0];
    let mut inputs: Vec<f32> = edges.to_vec();
    inputs.extend((0..64 * 40).map(|i| rng.f32() * [1.0, 10.0, 60.0, 120.0][i % 4] - [0.0, 5.0, 40.0, 90.0][i % 4]));
    inputs.resize(inputs.len().next_multiple_of(64), f32::NEG_INFINITY);
    for (t, tile) in inputs.chunks_exact(64).enumerate() {
        let m = if t % 2 == 0 { 0.0 } else { 3.5 };
        let mut fast = tile.to_vec();
        // SAFETY: AVX2, FMA and F16C were detected above.
        let sum = unsafe { corelm_kernels::attention::x86::softmax::softmax_tile(&mut fast, m) };
        let mut want = 0f64;
        let mut slow = tile.to_vec();
        for g in slow.chunks_exact_mut(16) {
            g.iter_mut().for_each(|p| *p = expf_ggml(*p - m));
            want += reduce_add_16(&<[f32; 16]>::try_from(&*g).unwrap()) as f64;
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast), bits(&slow), "tile {t}");
        assert_eq!(sum.to_bits(), want.to_bits(), "tile {t} sum");
    }
    // And exp itself stays close to the true exponential.
    for &x in &[-80.0f32, -10.0, -1.0, -0.5, 0.0] {
        assert!((expf_ggml(x) as f64 / (x as f64).exp() - 1.0).abs() < 1e-6, "expf({x})");
    }
}

/// `attend_heads` over the heads of `q` (`hd` values each) gives every head the bits of its own
/// `attend_row` call over the same cells (`what` names the case in a failure).
fn assert_heads_equal_single(kind: corelm_kernels::attention::AttnKernel, ks: &Kernels, q: &[f32], hd: usize, cells: corelm_kernels::attention::Cells, what: &str) {
    use corelm_kernels::attention::{attend_heads, attend_row, AttnScratch};
    let heads = q.len() / hd;
    let mut s = AttnScratch::with_heads(hd, heads);
    let mut grouped = vec![f32::NAN; heads * hd];
    attend_heads(kind, ks, q, cells, 0.125, &mut s, &mut grouped);
    for h in 0..heads {
        let mut one = vec![0f32; hd];
        attend_row(kind, ks, &q[h * hd..(h + 1) * hd], cells, 0.125, &mut s, &mut one);
        let g = &grouped[h * hd..(h + 1) * hd];
        assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{what} {kind:?} {:?} head {h}", ks.isa());
    }
}

/// `attend_heads` (the heads of a GQA group together) gives every head the bits of its own
/// `attend_row` call, for both kernels, over several tiles, with cells hidden individually and
/// whole tiles hidden (a sliding window), in the SIMD and the portable tables.
#[test]
fn grouped_attention_equals_per_head_attention() {
    use corelm_kernels::attention::{AttnKernel, Cells, KvRows};
    let mut rng = Rng(123);
    for (hd, heads, cells) in [(64usize, 3usize, 37usize), (64, 7, 200), (256, 4, 131), (72, 2, 70)] {
        let q: Vec<f32> = (0..heads * hd).map(|_| rng.f32() * 4.0).collect();
        let k: Vec<f16> = (0..cells * hd).map(|_| f16::from_f32(rng.f32() * 3.0)).collect();
        let v: Vec<f16> = (0..cells * hd).map(|_| f16::from_f32(rng.f32() * 50.0)).collect();
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        let masks: [&dyn Fn(usize) -> bool; 2] = [&|c| c % 5 != 3, &|c| c + 60 >= cells];
        for vis in masks {
            for ks in [Kernels::detect(), Kernels::portable()] {
                for kind in [AttnKernel::Tiled, AttnKernel::Reference] {
                    assert_heads_equal_single(kind, &ks, &q, hd, Cells { kv: &kvr, n: cells, visible: Visible::Mask(vis) }, &format!("hd {hd}"));
                }
            }
        }
    }
}

/// `attend_rows` (a block of query rows through the cells together) gives every head of every
/// row the bits of the portable single-head tiled kernel with that row's span: causal spans
/// ending mid-tile, sliding windows that hide whole tiles, rows that see nothing, a paged cache,
/// head dimensions that are not a multiple of 32, 1–64 vectors (the engine's blocks: 21 rows × 3
/// heads, 9 × 7, 16 × 4) — with every table this CPU runs (x86: the 8-lane and the 16-lane
/// kernel).
#[test]
fn row_block_attention_equals_per_row_attention() {
    use corelm_kernels::attention;
    // Every x86-64 CPU this project runs on has AVX2; every aarch64 CPU has NEON.
    assert_eq!(attention::has_simd(&Kernels::detect()), cfg!(any(target_arch = "x86_64", target_arch = "aarch64")));
    for fast in tables() {
        row_block_attention_with(&fast);
    }
}

fn row_block_attention_with(fast: &Kernels) {
    use corelm_kernels::attention::{self, attend_row, attend_rows, AttnKernel, AttnScratch, Cells, KvRows};
    let port = Kernels::portable();
    let fast = fast.clone();
    let mut rng = Rng(321);
    for (hd, heads, rows, cells) in [(64usize, 3usize, 5usize, 150usize), (64, 7, 2, 200), (256, 4, 4, 131), (72, 2, 3, 70), (96, 1, 16, 90), (40, 4, 3, 9), (64, 3, 21, 300), (64, 7, 9, 200), (256, 4, 16, 131), (64, 1, 64, 100)] {
        let q: Vec<f32> = (0..rows * heads * hd).map(|_| rng.f32() * 4.0).collect();
        let k: Vec<f16> = (0..cells * hd).map(|_| f16::from_f32(rng.f32() * 3.0)).collect();
        let v: Vec<f16> = (0..cells * hd).map(|_| f16::from_f32(rng.f32() * 50.0)).collect();
        // Paged over shuffled blocks of 8 rows.
        let n_blocks = cells.div_ceil(8);
        let table: Vec<u32> = (1..=n_blocks as u32).rev().collect();
        let (mut kp, mut vp) = (vec![f16::ZERO; (n_blocks + 1) * 8 * hd], vec![f16::ZERO; (n_blocks + 1) * 8 * hd]);
        let layout = KvRows { table: &table, shift: 3, ..KvRows::contiguous(&[], &[], hd, &[]) };
        for c in 0..cells {
            let r = layout.row(c) * hd;
            kp[r..r + hd].copy_from_slice(&k[c * hd..(c + 1) * hd]);
            vp[r..r + hd].copy_from_slice(&v[c * hd..(c + 1) * hd]);
        }
        let kvr = KvRows { table: &table, shift: 3, ..KvRows::contiguous(&kp, &vp, hd, &[]) };
        // Causal rows ending at the last cells; then a sliding window of 70 over rows spread
        // through the cache; then one row that sees nothing.
        let causal: Vec<_> = (0..rows).map(|r| 0..cells - rows + 1 + r).collect();
        let window: Vec<_> = (0..rows).map(|r| (cells * (r + 1) / rows).saturating_sub(70)..cells * (r + 1) / rows).collect();
        let mut empty = causal.clone();
        empty[rows / 2] = 5..5;
        for spans in [causal, window, empty] {
            let mut s = AttnScratch::with_heads(hd, heads);
            let mut out = vec![0f32; rows * heads * hd];
            let qs: Vec<&[f32]> = q.chunks_exact(heads * hd).collect();
            let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(heads * hd).collect();
            let before = s.tile_work().chunks_scored;
            attend_rows(AttnKernel::Tiled, &fast, &qs, heads, &spans, &kvr, 0.125, None, &mut s, &mut outs);
            // The SIMD kernel ran (only it counts chunks), not the portable fallback.
            assert!(!attention::has_simd(&fast) || hd % 8 != 0 || s.tile_work().chunks_scored > before, "hd {hd}: no SIMD rows kernel");
            for (r, span) in spans.iter().enumerate() {
                for h in 0..heads {
                    let o = (r * heads + h) * hd;
                    let mut one = vec![0f32; hd];
                    let lo = span.start;
                    attend_row(AttnKernel::Tiled, &port, &q[o..o + hd], Cells { kv: &kvr, n: span.end, visible: Visible::Mask(&|c| c >= lo) }, 0.125, &mut s, &mut one);
                    let got = &out[o..o + hd];
                    assert!(got.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{:?}: hd {hd} heads {heads} row {r} head {h} span {span:?}", fast.isa());
                }
            }
        }
    }
}

/// Queries of `heads` heads and a KV cache of `cells` F16 rows for the decode tests; the last
/// three keys are large, so the running maximum grows late.
fn decode_case(rng: &mut Rng, hd: usize, heads: usize, cells: usize) -> (Vec<f32>, Vec<f16>, Vec<f16>) {
    let q: Vec<f32> = (0..heads * hd).map(|_| rng.f32() * 4.0).collect();
    let mut k: Vec<f16> = (0..cells * hd).map(|_| f16::from_f32(rng.f32() * 3.0)).collect();
    for x in &mut k[cells.saturating_sub(3) * hd..] {
        *x = f16::from_f32(x.to_f32() * 6.0);
    }
    let v: Vec<f16> = (0..cells * hd).map(|_| f16::from_f32(rng.f32() * 50.0)).collect();
    (q, k, v)
}

/// Decode attention over a GQA group with the detected table (the AVX-512 two-phase kernel
/// where the CPU has it) gives every head the bits of the portable per-head kernel: head
/// dimensions 64–256, 1–12 heads (every register grouping; more heads than one pass of the
/// score phase takes), cell counts around the 64-cell chunk and its 16-cell groups, cells
/// hidden one by one, a window, nothing visible, and scores that make the
/// maximum grow late (large keys at the end).
#[test]
fn decode_attention_equals_portable_per_head() {
    use corelm_kernels::attention::{attend_heads, attend_row, AttnKernel, AttnScratch, Cells, KvRows};
    let mut rng = Rng(2024);
    let port = Kernels::portable();
    for (hd, heads, cells) in [(64usize, 3usize, 64usize), (64, 7, 200), (64, 8, 65), (64, 12, 93), (64, 17, 40), (64, 1, 130), (128, 5, 129), (192, 2, 70), (256, 4, 131), (256, 1, 1)] {
        let (q, k, v) = decode_case(&mut rng, hd, heads, cells);
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        let masks: [&dyn Fn(usize) -> bool; 4] = [&|_| true, &|c| c % 5 != 3, &|c| c + 60 >= cells, &|_| false];
        for (vis, fast) in masks.into_iter().flat_map(|m| [(m, Kernels::detect()), (m, Kernels::detect_avx2())]) {
            let mut s = AttnScratch::with_heads(hd, heads);
            let mut grouped = vec![f32::NAN; heads * hd];
            attend_heads(AttnKernel::Reference, &fast, &q, Cells { kv: &kvr, n: cells, visible: Visible::Mask(vis) }, 0.125, &mut s, &mut grouped);
            for h in 0..heads {
                let mut one = vec![0f32; hd];
                attend_row(AttnKernel::Reference, &port, &q[h * hd..(h + 1) * hd], Cells { kv: &kvr, n: cells, visible: Visible::Mask(vis) }, 0.125, &mut s, &mut one);
                let g = &grouped[h * hd..(h + 1) * hd];
                assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "avx512 {} hd {hd} heads {heads} cells {cells} head {h}", fast.isa());
            }
        }
    }
}

/// `AttnKernel::Wide` (the value accumulators in F32): the decode kernels of each table give
/// every head of a GQA group the bits of the portable per-head kernel, over the shapes and masks
/// of `decode_attention_equals_portable_per_head` (a late-growing maximum, hidden cells, a
/// window, nothing visible); and it stays within F16 accumulation error of `Reference`, whose
/// scores and softmax steps it shares.
#[test]
fn wide_decode_attention_equals_portable_per_head() {
    use corelm_kernels::attention::{attend_heads, attend_row, AttnKernel, AttnScratch, KvRows};
    let mut rng = Rng(4242);
    let port = Kernels::portable();
    for (hd, heads, cells) in [(64usize, 3usize, 64usize), (64, 7, 200), (64, 12, 93), (64, 1, 130), (128, 5, 129), (192, 2, 70), (256, 4, 131), (256, 1, 1)] {
        let (q, k, v) = decode_case(&mut rng, hd, heads, cells);
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        let masks: [&dyn Fn(usize) -> bool; 4] = [&|_| true, &|c| c % 5 != 3, &|c| c + 60 >= cells, &|_| false];
        for (vis, ks) in masks.into_iter().flat_map(|m| [(m, Kernels::detect()), (m, Kernels::detect_avx2()), (m, Kernels::portable())]) {
            let mut s = AttnScratch::with_heads(hd, heads);
            let cells = Cells { kv: &kvr, n: cells, visible: Visible::Mask(vis) };
            let (mut wide, mut f16acc) = (vec![f32::NAN; heads * hd], vec![f32::NAN; heads * hd]);
            attend_heads(AttnKernel::Wide, &ks, &q, cells, 0.125, &mut s, &mut wide);
            attend_heads(AttnKernel::Reference, &ks, &q, cells, 0.125, &mut s, &mut f16acc);
            for h in 0..heads {
                let mut one = vec![0f32; hd];
                attend_row(AttnKernel::Wide, &port, &q[h * hd..(h + 1) * hd], cells, 0.125, &mut s, &mut one);
                let g = &wide[h * hd..(h + 1) * hd];
                assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{} hd {hd} heads {heads} cells {} head {h}", ks.isa(), cells.n);
            }
            // Values up to 50: F16 accumulators are within a few units of their last place.
            let worst = wide.iter().zip(&f16acc).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 0.25, "{} hd {hd} heads {heads}: Wide and Reference differ by {worst}", ks.isa());
        }
    }
}

/// Cells visible from a first one on (`Visible::From`, what the engine passes, where decode's
/// gathering and the per-cell loops start at that cell) give the bits of the same cells as a
/// mask, on every kernel: the decode kernels (AVX-512, AVX2, NEON), their split-KV form, the
/// tiled kernel and the portable ones, over F16 caches (contiguous, and paged in blocks of 16
/// rows as the engine's) and quantized ones (Q8_0, Q4_0: ggml's one-chunk loops); first cells
/// at 0, inside the first chunk, past it, at the last cell and past the end (nothing visible).
#[test]
fn visible_from_a_first_cell_equals_the_same_mask() {
    use corelm_kernels::attention::{KeyLayout, KvRows};
    let mut rng = Rng(515);
    for (hd, heads, cells) in [(64usize, 3usize, 200usize), (128, 2, 150)] {
        let (q, k, v) = decode_case(&mut rng, hd, heads, cells);
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        // Paged as the engine's cache: blocks of 16 rows in reverse order (runs of rows inside a
        // block, the gathering's unit, broken at every block and chunk boundary).
        let (_, kp, vp) = decode_case(&mut rng, hd, 0, cells.next_multiple_of(16));
        let table: Vec<u32> = (0..cells.div_ceil(16) as u32).rev().collect();
        let paged = KvRows { table: &table, shift: 4, ..KvRows::contiguous(&kp, &vp, hd, &[]) };
        for ks in [Kernels::detect(), Kernels::detect_avx2(), Kernels::portable()] {
            assert_from_equals_mask(&ks, &q, heads, Cells { kv: &kvr, n: cells, visible: Visible::From(0) }, "f16");
            assert_from_equals_mask(&ks, &q, heads, Cells { kv: &paged, n: cells, visible: Visible::From(0) }, "f16 paged");
            let enc = |t: DType, x: &[f16]| kv_rows_of(&ks, t, &x.iter().map(|h| h.to_f32()).collect::<Vec<_>>(), hd);
            for (kt, vt) in [(DType::Q8_0, DType::Q8_0), (DType::Q4_0, DType::F16)] {
                let (kb, vb) = (enc(kt, &k), enc(vt, &v));
                let rows = KvRows { k: &kb, v: &vb, k_type: kt, v_type: vt, head_dim: hd, table: &ident, shift: 0, k_layout: KeyLayout::Rows };
                assert_from_equals_mask(&ks, &q, heads, Cells { kv: &rows, n: cells, visible: Visible::From(0) }, &format!("{kt}/{vt}"));
            }
        }
    }
}

/// `Visible::From(first)` against the mask `c >= first` over `cells.kv`, for first cells at 0,
/// 5, 70, the last cell and past the end, with each attention kernel.
fn assert_from_equals_mask(ks: &Kernels, q: &[f32], heads: usize, cells: Cells, label: &str) {
    use corelm_kernels::attention::{attend_heads, AttnKernel, AttnScratch};
    let (hd, n) = (cells.kv.head_dim, cells.n);
    for first in [0, 5, 70, n - 1, n + 3] {
        let mask = move |c: usize| c >= first;
        for kind in [AttnKernel::Reference, AttnKernel::Split(48), AttnKernel::Tiled] {
            let run = |visible| {
                let mut s = AttnScratch::with_heads(hd, heads);
                let mut out = vec![f32::NAN; heads * hd];
                attend_heads(kind, ks, q, Cells { visible, ..cells }, 0.125, &mut s, &mut out);
                out
            };
            let (from, masked) = (run(Visible::From(first)), run(Visible::Mask(&mask)));
            assert!(from.iter().zip(&masked).all(|(a, b)| a.to_bits() == b.to_bits()), "{} {label} {kind:?} hd {hd} cells {n} first {first}", ks.isa());
        }
    }
}

/// A NaN score (a key row holding a NaN) in the middle of a chunk, where the AVX-512 kernel's
/// prefix-scan maximum and the portable loop's differ (the loop never keeps a NaN as its
/// maximum): every head's output is what the portable kernel gives, NaN when the cell is
/// visible, the same bits when it is hidden.
#[test]
fn decode_attention_with_a_nan_score_equals_portable() {
    use corelm_kernels::attention::{attend_heads, attend_row, AttnKernel, AttnScratch, Cells, KvRows};
    let mut rng = Rng(77);
    let port = Kernels::portable();
    for (hd, heads, cells, nan_cell) in [(64usize, 3usize, 100usize, 37usize), (64, 7, 64, 0), (128, 2, 80, 79), (64, 3, 300, 150)] {
        let (q, mut k, v) = decode_case(&mut rng, hd, heads, cells);
        k[nan_cell * hd + 5] = f16::NAN;
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        let masks: [&dyn Fn(usize) -> bool; 2] = [&|_| true, &|c| c != nan_cell];
        for (vis, fast) in masks.into_iter().flat_map(|m| [(m, Kernels::detect()), (m, Kernels::detect_avx2())]) {
            let mut s = AttnScratch::with_heads(hd, heads);
            let mut grouped = vec![0f32; heads * hd];
            attend_heads(AttnKernel::Reference, &fast, &q, Cells { kv: &kvr, n: cells, visible: Visible::Mask(vis) }, 0.125, &mut s, &mut grouped);
            for h in 0..heads {
                let mut one = vec![0f32; hd];
                attend_row(AttnKernel::Reference, &port, &q[h * hd..(h + 1) * hd], Cells { kv: &kvr, n: cells, visible: Visible::Mask(vis) }, 0.125, &mut s, &mut one);
                let g = &grouped[h * hd..(h + 1) * hd];
                let same = g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
                assert!(same, "{} hd {hd} heads {heads} cells {cells} NaN at {nan_cell} head {h}", fast.isa());
                assert_eq!(one.iter().any(|x| x.is_nan()), vis(nan_cell), "the NaN reaches the output only where its cell is visible");
            }
        }
    }
}

/// ggml's split-KV decode (`AttnKernel::Split`): the decode kernels (AVX-512 and AVX2) give
/// every head the bits of the portable per-head split, over chunk sizes that cut the cells
/// evenly, unevenly, inside the 64-cell phases and past the end, with a late-growing maximum,
/// hidden cells and a window (whole chunks invisible); and the split stays close to the
/// unsplit kernel (the partials are renormalised, not recomputed).
#[test]
fn split_kv_decode_equals_portable_and_stays_near_unsplit() {
    use corelm_kernels::attention::{attend_heads, attend_row, AttnKernel, AttnScratch, Cells, KvRows};
    let mut rng = Rng(5150);
    let port = Kernels::portable();
    for (hd, heads, cells, chunk) in [(64usize, 3usize, 300usize, 256usize), (64, 7, 513, 256), (128, 2, 700, 384), (64, 4, 260, 100), (256, 1, 129, 64), (64, 1, 5, 1000)] {
        let (q, k, v) = decode_case(&mut rng, hd, heads, cells);
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        let masks: [&dyn Fn(usize) -> bool; 3] = [&|_| true, &|c| c % 5 != 3, &|c| c + 120 >= cells];
        for (vis, fast) in masks.into_iter().flat_map(|m| [(m, Kernels::detect()), (m, Kernels::detect_avx2())]) {
            let mut s = AttnScratch::with_heads(hd, heads);
            let mut grouped = vec![f32::NAN; heads * hd];
            attend_heads(AttnKernel::Split(chunk), &fast, &q, Cells { kv: &kvr, n: cells, visible: Visible::Mask(vis) }, 0.125, &mut s, &mut grouped);
            for h in 0..heads {
                let (mut one, mut whole) = (vec![0f32; hd], vec![0f32; hd]);
                attend_row(AttnKernel::Split(chunk), &port, &q[h * hd..(h + 1) * hd], Cells { kv: &kvr, n: cells, visible: Visible::Mask(vis) }, 0.125, &mut s, &mut one);
                attend_row(AttnKernel::Reference, &port, &q[h * hd..(h + 1) * hd], Cells { kv: &kvr, n: cells, visible: Visible::Mask(vis) }, 0.125, &mut s, &mut whole);
                let g = &grouped[h * hd..(h + 1) * hd];
                assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "avx512 {} hd {hd} cells {cells} chunk {chunk} head {h}", fast.isa());
                let mag = whole.iter().fold(1f32, |m, x| m.max(x.abs()));
                assert!(one.iter().zip(&whole).all(|(a, b)| (a - b).abs() <= 2e-2 * mag), "hd {hd} cells {cells} chunk {chunk} head {h}: split far from unsplit");
            }
        }
    }
}

/// Split-KV decode's ranges run apart (`attend_split_range`, as the engine's one-row decode
/// deals them to workers) and folded in order (`fold_ranges`) give every head the bits of the
/// whole split (`attend_heads` with `AttnKernel::Split`), with each table: ranges cut evenly and
/// not, inside the 64-cell phases, ranges nothing in is visible (a window), hidden cells and a
/// late-growing maximum; the ranges computed in reverse order, each with its own scratch's
/// leftovers from the others.
#[test]
fn split_kv_ranges_apart_equal_the_whole_split() {
    use corelm_kernels::attention::{attend_heads, attend_split_range, fold_ranges, split_ranges, AttnKernel, AttnScratch, Cells, KvRows};
    let mut rng = Rng(8128);
    for (hd, heads, cells, chunk) in [(64usize, 3usize, 600usize, 256usize), (64, 7, 513, 171), (128, 2, 700, 384), (64, 4, 260, 100), (256, 1, 129, 64), (64, 2, 5, 1000), (192, 3, 300, 40)] {
        let (q, k, v) = decode_case(&mut rng, hd, heads, cells);
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        let masks: [&dyn Fn(usize) -> bool; 3] = [&|_| true, &|c| c % 5 != 3, &|c| c + 120 >= cells];
        for ks in tables() {
            for (m, vis) in masks.iter().enumerate() {
                let (ranges, mut s) = (split_ranges(cells, chunk), AttnScratch::with_heads(hd, heads));
                let visible = if m == 2 { Visible::From(cells.saturating_sub(120)) } else { Visible::Mask(*vis) };
                let cells_of = || Cells { kv: &kvr, n: cells, visible };
                let mut whole = vec![f32::NAN; heads * hd];
                attend_heads(AttnKernel::Split(chunk), &ks, &q, cells_of(), 0.125, &mut s, &mut whole);
                // Per range: each head's (maximum, sum) and its unnormalised values.
                let mut parts = vec![(vec![[f32::NAN; 2]; heads], vec![f32::NAN; heads * hd]); ranges];
                for (r, (st, acc)) in parts.iter_mut().enumerate().rev() {
                    attend_split_range(&ks, &q, cells_of(), 0.125, chunk, r, &mut s, st, acc);
                }
                for h in 0..heads {
                    let mut out = vec![f32::NAN; hd];
                    fold_ranges(parts.iter().map(|(st, acc)| (st[h], &acc[h * hd..(h + 1) * hd])), &mut out);
                    let w = &whole[h * hd..(h + 1) * hd];
                    assert!(out.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()), "{} hd {hd} cells {cells} chunk {chunk} mask {m} head {h}: {:?} vs {:?}", ks.isa(), &out[..4], &w[..4]);
                }
            }
        }
    }
}

/// Decode over a quantized KV cache (`--cache-type-k/-v q8_0|q4_0`) for the heads of a GQA
/// group at once gives every head the bits of its own single-head call, with each table, across
/// chunk boundaries and masks (including nothing visible).
#[test]
fn grouped_quantized_cache_attention_equals_per_head() {
    use corelm_kernels::attention::{AttnKernel, Cells, KeyLayout, KvRows};
    let mut rng = Rng(31);
    let hd = 64usize;
    for (heads, cells) in [(3usize, 45usize), (7, 130), (1, 64), (4, 65)] {
        let q: Vec<f32> = (0..heads * hd).map(|_| rng.f32() * 2.0).collect();
        let k: Vec<f32> = (0..cells * hd).map(|_| rng.f32() * 3.0).collect();
        let v: Vec<f32> = (0..cells * hd).map(|_| rng.f32() * 10.0).collect();
        let ident: Vec<u32> = (0..cells as u32).collect();
        for ks in [Kernels::detect(), Kernels::detect_avx2(), Kernels::portable()] {
            let enc = |t: DType, x: &[f32]| kv_rows_of(&ks, t, x, hd);
            for (kt, vt) in [(DType::Q8_0, DType::Q8_0), (DType::Q4_0, DType::Q4_0), (DType::F16, DType::Q8_0), (DType::Q8_0, DType::Q4_0), (DType::Q8_0, DType::F16), (DType::Q4_0, DType::F16)] {
                let (kb, vb) = (enc(kt, &k), enc(vt, &v));
                let rows = KvRows { k: &kb, v: &vb, k_type: kt, v_type: vt, head_dim: hd, table: &ident, shift: 0, k_layout: KeyLayout::Rows };
                let masks: [&dyn Fn(usize) -> bool; 3] = [&|_| true, &|c| c % 5 != 3, &|_| false];
                // Prefill rows (`Tiled`) take ggml's one-chunk path too on a quantized cache.
                for (vis, kind) in masks.into_iter().flat_map(|m| [(m, AttnKernel::Reference), (m, AttnKernel::Tiled)]) {
                    assert_heads_equal_single(kind, &ks, &q, hd, Cells { kv: &rows, n: cells, visible: Visible::Mask(vis) }, &format!("{kt}/{vt} heads {heads} cells {cells}"));
                }
            }
        }
    }
}

/// Prefill rows over a quantized KV cache (`attend_rows`: every row of a block with its heads
/// through each chunk of cells together) give every head of every row the bits of its own
/// one-chunk call, with each table, for causal spans with and without a sliding window, spans
/// that cross chunk boundaries, and every mix of cache types.
#[test]
fn quantized_cache_rows_equal_per_row() {
    use corelm_kernels::attention::{attend_row, attend_rows, AttnKernel, AttnScratch, Cells, KeyLayout, KvRows};
    let mut rng = Rng(41);
    let hd = 64usize;
    for (rows, heads, cells, window) in [(21usize, 3usize, 150usize, None), (5, 1, 70, Some(40usize)), (16, 4, 200, Some(100)), (1, 3, 64, None), (21, 3, 75, None), (12, 2, 140, Some(70))] {
        let q: Vec<f32> = (0..rows * heads * hd).map(|_| rng.f32() * 2.0).collect();
        let k: Vec<f32> = (0..cells * hd).map(|_| rng.f32() * 3.0).collect();
        let v: Vec<f32> = (0..cells * hd).map(|_| rng.f32() * 10.0).collect();
        let ident: Vec<u32> = (0..cells as u32).collect();
        // Row r at position cells - rows + r, as the last rows of a prompt.
        let spans: Vec<std::ops::Range<usize>> = (0..rows)
            .map(|r| {
                let end = cells - rows + r + 1;
                window.map_or(0, |w| end.saturating_sub(w))..end
            })
            .collect();
        for ks in [Kernels::detect(), Kernels::detect_avx2(), Kernels::portable()] {
            let enc = |t: DType, x: &[f32]| kv_rows_of(&ks, t, x, hd);
            for (kt, vt) in [(DType::Q8_0, DType::Q8_0), (DType::Q4_0, DType::Q4_0), (DType::Q8_0, DType::F16), (DType::F16, DType::Q8_0), (DType::Q4_0, DType::F16)] {
                let (kb, vb) = (enc(kt, &k), enc(vt, &v));
                let kv = KvRows { k: &kb, v: &vb, k_type: kt, v_type: vt, head_dim: hd, table: &ident, shift: 0, k_layout: KeyLayout::Rows };
                for kind in [AttnKernel::Tiled, AttnKernel::Reference] {
                    let mut s = AttnScratch::with_heads(hd, heads);
                    let qs: Vec<&[f32]> = q.chunks_exact(heads * hd).collect();
                    let mut got = vec![f32::NAN; rows * heads * hd];
                    let mut outs: Vec<&mut [f32]> = got.chunks_exact_mut(heads * hd).collect();
                    attend_rows(kind, &ks, &qs, heads, &spans, &kv, 0.125, None, &mut s, &mut outs);
                    for (r, span) in spans.iter().enumerate() {
                        for h in 0..heads {
                            let mut one = vec![0f32; hd];
                            let lo = span.start;
                            let vis = move |c: usize| c >= lo;
                            let qh = &q[(r * heads + h) * hd..(r * heads + h + 1) * hd];
                            attend_row(kind, &ks, qh, Cells { kv: &kv, n: span.end, visible: Visible::Mask(&vis) }, 0.125, &mut s, &mut one);
                            let g = &got[(r * heads + h) * hd..(r * heads + h + 1) * hd];
                            assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{kt}/{vt} {kind:?} {:?} rows {rows} heads {heads} row {r} head {h}", ks.isa());
                        }
                    }
                }
            }
        }
    }
}

/// Soft-capped scores (Gemma 2: `Scale::new(scale, cap)`, each score `cap · tanh(q·k · scale
/// / cap)`): with every table, decode over a GQA group (`Reference`, `Wide`, split-KV), the
/// tiled kernel per head and over a block of rows give each head the bits of the portable
/// per-head kernel with the same cap, a Q8_0 cache grouped and per row those of the table's
/// own per-head kernel; hidden cells stay
/// hidden. The portable one-chunk result is an f64 softmax over the capped scores within F16
/// accumulation error, and far from the uncapped one (a cap of 2.5 at scores up to ~20).
#[test]
fn soft_capped_scores_equal_portable() {
    use corelm_kernels::attention::{attend_heads, attend_row, attend_rows, AttnKernel, AttnScratch, KeyLayout, KvRows, Scale};
    let mut rng = Rng(1977);
    let port = Kernels::portable();
    let (scale, cap) = (0.125, 2.5);
    let sc = Scale::new(scale, cap);
    for (hd, heads, cells) in [(64usize, 3usize, 130usize), (128, 2, 70), (64, 1, 9), (256, 4, 40)] {
        let (q, k, v) = decode_case(&mut rng, hd, heads, cells);
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        let vis = |c: usize| c % 7 != 2;
        let (kf, vf): (Vec<f32>, Vec<f32>) = (k.iter().map(|x| x.to_f32()).collect(), v.iter().map(|x| x.to_f32()).collect());
        let (kb, vb) = (kv_rows_of(&port, DType::Q8_0, &kf, hd), kv_rows_of(&port, DType::Q8_0, &vf, hd));
        let q8 = KvRows { k: &kb, v: &vb, k_type: DType::Q8_0, v_type: DType::Q8_0, head_dim: hd, table: &ident, shift: 0, k_layout: KeyLayout::Rows };
        for fast in tables() {
            for (kv, kinds) in [(&kvr, &[AttnKernel::Reference, AttnKernel::Wide, AttnKernel::Tiled, AttnKernel::Split(32)][..]), (&q8, &[AttnKernel::Reference][..])] {
                // A quantized cache's dot products are the table's own (their bits differ
                // between tables): its single-head calls with the same table.
                let single = if kv.k_type == DType::F16 { &port } else { &fast };
                for &kind in kinds {
                    let mut s = AttnScratch::with_heads(hd, heads);
                    let mut grouped = vec![f32::NAN; heads * hd];
                    attend_heads(kind, &fast, &q, Cells { kv, n: cells, visible: Visible::Mask(&vis) }, sc, &mut s, &mut grouped);
                    for h in 0..heads {
                        let mut one = vec![0f32; hd];
                        attend_row(kind, single, &q[h * hd..(h + 1) * hd], Cells { kv, n: cells, visible: Visible::Mask(&vis) }, sc, &mut s, &mut one);
                        let g = &grouped[h * hd..(h + 1) * hd];
                        assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{} {kind:?} {} hd {hd} heads {heads} head {h}", fast.isa(), kv.k_type);
                    }
                }
                // A block of rows (prefill), each row's span causal up to its cell.
                let rows = 5.min(cells);
                let spans: Vec<_> = (0..rows).map(|r| 0..cells - rows + 1 + r).collect();
                let qs: Vec<&[f32]> = (0..rows).map(|_| &q[..]).collect();
                let mut out = vec![0f32; rows * heads * hd];
                let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(heads * hd).collect();
                let mut s = AttnScratch::with_heads(hd, heads);
                let kind = if kv.k_type == DType::F16 { AttnKernel::Tiled } else { AttnKernel::Reference };
                attend_rows(kind, &fast, &qs, heads, &spans, kv, sc, None, &mut s, &mut outs);
                for (r, span) in spans.iter().enumerate() {
                    for h in 0..heads {
                        let mut one = vec![0f32; hd];
                        attend_row(kind, single, &q[h * hd..(h + 1) * hd], Cells { kv, n: span.end, visible: Visible::From(0) }, sc, &mut s, &mut one);
                        let got = &out[(r * heads + h) * hd..][..hd];
                        assert!(got.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{} rows {} hd {hd} row {r} head {h}", fast.isa(), kv.k_type);
                    }
                }
            }
        }
        // Head 0 against f64 attention over the capped scores (the query rounded to F16 as
        // the one-chunk kernel rounds it), and away from the uncapped result.
        let mut s = AttnScratch::new(hd);
        let mut got = vec![0f32; hd];
        attend_row(AttnKernel::Reference, &port, &q[..hd], Cells { kv: &kvr, n: cells, visible: Visible::Mask(&vis) }, sc, &mut s, &mut got);
        let attend64 = |capped: bool| -> Vec<f64> {
            let sc: Vec<(usize, f64)> = (0..cells)
                .filter(|&c| vis(c))
                .map(|c| {
                    let d = (0..hd).map(|i| kf[c * hd + i] as f64 * f16::from_f32(q[i]).to_f64()).sum::<f64>() * scale as f64;
                    (c, if capped { cap as f64 * (d / cap as f64).tanh() } else { d })
                })
                .collect();
            let mx = sc.iter().map(|s| s.1).fold(f64::MIN, f64::max);
            let z: f64 = sc.iter().map(|s| (s.1 - mx).exp()).sum();
            (0..hd).map(|d| sc.iter().map(|&(c, x)| (x - mx).exp() / z * vf[c * hd + d] as f64).sum()).collect()
        };
        let (want, uncapped) = (attend64(true), attend64(false));
        for d in 0..hd {
            assert!((got[d] as f64 - want[d]).abs() < 0.05 + 2e-3 * want[d].abs(), "hd {hd} dim {d}: {} vs f64 {}", got[d], want[d]);
        }
        let apart = (0..hd).map(|d| (want[d] - uncapped[d]).abs()).fold(0f64, f64::max);
        assert!(apart > 1.0, "hd {hd}: the cap changes little ({apart})");
    }
}

/// Attention sinks (gpt-oss): every table's one-chunk path (`attend_with_sinks`) and tiled
/// path (`attend_rows` with the tiled kernel) against an f64 softmax whose denominator
/// counts each head's sink — sinks far below the scores (no effect), among them, and far above
/// (the values scaled down to the sink) — within F16 accumulation error.
#[test]
fn attention_sinks_count_in_the_softmax() {
    use corelm_kernels::attention::{attend_rows, attend_with_sinks, AttnKernel, AttnScratch, KvRows, MAX_SINK_HEADS};
    let mut rng = Rng(4242);
    let (hd, heads, cells) = (64usize, 4usize, 70usize);
    let (q, k, v) = decode_case(&mut rng, hd, heads, cells);
    let ident: Vec<u32> = (0..cells as u32).collect();
    let kvr = KvRows::contiguous(&k, &v, hd, &ident);
    for shift in [-60.0f32, 0.0, 40.0] {
        let sinks: Vec<f32> = (0..heads).map(|h| shift + h as f32 - 1.5).collect();
        // f64 reference per head over cells 0..cells, queries rounded to F16 as ggml's kernel.
        let reference = |h: usize| -> Vec<f64> {
            let qh = &q[h * hd..(h + 1) * hd];
            let sc: Vec<f64> = (0..cells).map(|c| (0..hd).map(|d| k[c * hd + d].to_f64() * f16::from_f32(qh[d]).to_f64()).sum::<f64>() * 0.125).collect();
            let mx = sc.iter().copied().fold(sinks[h] as f64, f64::max);
            let z: f64 = sc.iter().map(|s| (s - mx).exp()).sum::<f64>() + (sinks[h] as f64 - mx).exp();
            (0..hd).map(|d| (0..cells).map(|c| (sc[c] - mx).exp() / z * v[c * hd + d].to_f64()).sum()).collect()
        };
        for ks in tables() {
            let mut s = AttnScratch::with_heads(hd, heads);
            let mut state = [[0f32; 2]; MAX_SINK_HEADS];
            let mut one = vec![f32::NAN; heads * hd];
            attend_with_sinks(&ks, &q, Cells { kv: &kvr, n: cells, visible: Visible::From(0) }, 0.125, &sinks, &mut s, &mut state, &mut one);
            let mut tiled = vec![f32::NAN; heads * hd];
            attend_rows(AttnKernel::Tiled, &ks, &[&q], heads, std::slice::from_ref(&(0..cells)), &kvr, 0.125, Some(&sinks), &mut s, &mut [&mut tiled]);
            for h in 0..heads {
                let r = reference(h);
                let mag = r.iter().fold(1e-3f64, |m, x| m.max(x.abs()));
                for (what, got) in [("one-chunk", &one), ("tiled", &tiled)] {
                    let g = &got[h * hd..(h + 1) * hd];
                    let worst = g.iter().zip(&r).map(|(&a, &b)| (a as f64 - b).abs()).fold(0f64, f64::max);
                    assert!(worst <= 2e-2 * mag, "{} {what} sink shift {shift} head {h}: off by {worst} (magnitude {mag})", ks.isa());
                }
            }
        }
    }
}
