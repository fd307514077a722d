//! Every kernel of the detected table against the portable table, and both against an f32
//! reference (dequantized weights · f32 activations). Random blocks, several row lengths.

use corelm_kernels::quant::blocks::*;
use corelm_kernels::{row_bytes, DType, Isa, Kernels};
use half::f16;

mod common;
use common::{aligned, random_row, tables, Rng};

#[test]
fn dot_products_match_portable_and_f32_reference() {
    let (fast, port) = (Kernels::detect(), Kernels::portable());
    eprintln!("detected ISA: {:?}", fast.isa());
    let mut rng = Rng(0x9E3779B97F4A7C15);
    for t in corelm_kernels::dispatch::WEIGHT_TYPES {
        let ops_f = fast.ops(t).unwrap();
        let ops_p = port.ops(t).unwrap();
        let bs = t.block_size().max(32);
        for blocks in [1usize, 2, 3, 7, 18] {
            let n = if t.block_size() == 1 { bs * blocks + 5 } else { bs * blocks };
            let w = aligned(random_row(t, n, &mut rng));
            let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            let vdt = ops_p.vec_dot_type;
            let mut xq = aligned(vec![0u8; row_bytes(vdt, n)]);
            port.from_float(vdt).unwrap()(&x, &mut xq);
            let a = (ops_f.vec_dot)(&w, &xq);
            let b = (ops_p.vec_dot)(&w, &xq);
            // Fast vs portable: same integer sums, only float summation order differs.
            let tol = 1e-4 * (1.0 + b.abs());
            assert!((a - b).abs() <= tol, "{t} n={n}: simd {a} vs portable {b}");
            // Against dequantized weights · f32 activations: bounded by activation quantization.
            let mut wf = vec![0f32; n];
            (ops_p.to_float)(&w, &mut wf);
            let r: f64 = wf.iter().zip(&x).map(|(&p, &q)| p as f64 * q as f64).sum();
            let mag: f64 = wf.iter().map(|v| v.abs() as f64).sum();
            let bound = match vdt {
                DType::F32 => 1e-4 * (1.0 + mag),
                DType::F16 => 2e-3 * (1.0 + mag),
                DType::BF16 => 1e-2 * (1.0 + mag),
                _ => 0.01 * mag + 1e-3,
            };
            assert!((b as f64 - r).abs() <= bound, "{t} n={n}: portable {b} vs f32 ref {r} (bound {bound})");
        }
    }
}

/// Every SIMD table's dots of the lane-order types (x86 AVX2/AVX-512, aarch64 NEON with and
/// without `sdot`) equal the lane-order reference (`matmul::lanes`) bit for bit, and their Q4_K
/// dots (row and tile order) equal the portable ones: one set of values on every ISA.
#[test]
fn simd_dots_equal_the_lane_order_reference() {
    use corelm_kernels::matmul::{lanes, portable};
    let refs: [(DType, fn(&[u8], &[u8]) -> f32, fn(&[u8], &[u8]) -> f32); 12] = [
        (DType::Q4_0, lanes::dot_q4_0_q8_0, lanes::dot_q4_0_q8_0),
        (DType::Q4_1, lanes::dot_q4_1_q8_1, lanes::dot_q4_1_q8_1),
        (DType::Q5_0, lanes::dot_q5_0_q8_0, lanes::dot_q5_0_q8_0),
        (DType::Q5_1, lanes::dot_q5_1_q8_1, lanes::dot_q5_1_q8_1),
        (DType::Q8_0, lanes::dot_q8_0_q8_0, lanes::dot_q8_0_q8_0),
        (DType::Q4K, portable::dot_q4_k_q8_k, portable::dot_q4_k_q8_k_tile),
        (DType::Q6K, lanes::dot_q6_k_q8_k, lanes::dot_q6_k_q8_k),
        (DType::IQ4NL, lanes::dot_iq4_nl_q8_0, lanes::dot_iq4_nl_q8_0),
        (DType::IQ4XS, lanes::dot_iq4_xs_q8_k, lanes::dot_iq4_xs_q8_k),
        (DType::Q5K, lanes::dot_q5_k_q8_k, lanes::dot_q5_k_q8_k),
        (DType::Q2K, lanes::dot_q2_k_q8_k, lanes::dot_q2_k_q8_k),
        (DType::Q3K, lanes::dot_q3_k_q8_k, lanes::dot_q3_k_q8_k),
    ];
    let port = Kernels::portable();
    let mut rng = Rng(0x1A7E_5EED);
    let mut checked = 0;
    for k in tables().iter().filter(|k| k.isa() != Isa::Portable) {
        for &(t, dot, tile) in &refs {
            let ops = k.ops(t).unwrap();
            assert_ne!(ops.vec_dot as usize, port.ops(t).unwrap().vec_dot as usize, "{} {t}: the portable dot in a SIMD table", k.isa());
            for blocks in [1usize, 3, 8] {
                let n = t.block_size().max(32) * blocks;
                let w = aligned(random_row(t, n, &mut rng));
                let x: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
                let vdt = ops.vec_dot_type;
                let mut xq = aligned(vec![0u8; row_bytes(vdt, n)]);
                port.from_float(vdt).unwrap()(&x, &mut xq);
                let (a, b) = ((ops.vec_dot)(&w, &xq), dot(&w, &xq));
                assert_eq!(a.to_bits(), b.to_bits(), "{} {t} n={n}: dot {a} vs lane-order reference {b}", k.isa());
                let (a, b) = ((ops.vec_dot_tile)(&w, &xq), tile(&w, &xq));
                assert_eq!(a.to_bits(), b.to_bits(), "{} {t} n={n}: tile dot {a} vs reference {b}", k.isa());
                checked += 1;
            }
        }
    }
    eprintln!("{checked} dots checked against the lane-order reference");
}

#[test]
fn activation_quantizers_round_trip() {
    let k = Kernels::portable();
    let mut rng = Rng(42);
    for t in [DType::Q8_0, DType::Q8_1, DType::Q8K, DType::F16] {
        let n = 512;
        let x: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
        let mut q = vec![0u8; row_bytes(t, n)];
        k.from_float(t).unwrap()(&x, &mut q);
        let y: Vec<f32> = match t {
            DType::Q8_1 => as_blocks::<BlockQ8_1>(&q)
                .iter()
                .flat_map(|b| b.qs.iter().map(move |&v| v as f32 * b.d.to_f32()))
                .collect(),
            _ => {
                let mut y = vec![0f32; n];
                k.to_float(t).unwrap()(&q, &mut y);
                y
            }
        };
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 3.0 / 127.0 * 0.51 + 1e-3, "{t}: {a} -> {b}");
        }
        if t == DType::Q8K {
            for b in as_blocks::<BlockQ8K>(&q) {
                for (j, s) in b.bsums.iter().enumerate() {
                    let sum: i16 = b.qs[j * 16..j * 16 + 16].iter().map(|&v| v as i16).sum();
                    assert_eq!(*s, sum);
                }
            }
        }
        if t == DType::Q8_1 {
            for b in as_blocks::<BlockQ8_1>(&q) {
                let sum: i32 = b.qs.iter().map(|&v| v as i32).sum();
                assert!((b.s.to_f32() - sum as f32 * b.d.to_f32()).abs() <= 1e-2 * (1.0 + b.s.to_f32().abs()));
            }
        }
    }
}

#[test]
fn known_block_values() {
    // Q4_1: d=0.5, m=-1, nibble j=3 low, high=5 → elements 0..16 = 0.5, 16..32 = 1.5.
    let mut b = vec![0u8; 20];
    {
        let blk = &mut as_blocks_mut::<BlockQ4_1>(&mut b)[0];
        blk.d = f16::from_f32(0.5);
        blk.m = f16::from_f32(-1.0);
        blk.qs = [0x53; 16];
    }
    let mut y = vec![0f32; 32];
    Kernels::portable().to_float(DType::Q4_1).unwrap()(&b, &mut y);
    assert!(y[..16].iter().all(|&v| v == 0.5) && y[16..].iter().all(|&v| v == 1.5));
    // Q5_0 with every high bit set and nibble 0 → (16 - 16) * d = 0; nibble 15 → 15 * d.
    let mut b = vec![0u8; 22];
    {
        let blk = &mut as_blocks_mut::<BlockQ5_0>(&mut b)[0];
        blk.d = f16::from_f32(2.0);
        blk.qh = [0xFF; 4];
        blk.qs = [0xF0; 16];
    }
    Kernels::portable().to_float(DType::Q5_0).unwrap()(&b, &mut y);
    assert!(y[..16].iter().all(|&v| v == 0.0) && y[16..].iter().all(|&v| v == 30.0));
}

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
        attend_row(AttnKernel::Reference, &fast, &q, Cells { kv: &kvr, n: cells, visible: &vis }, 0.125, &mut s, &mut a);
        attend_row(AttnKernel::Reference, &port, &q, Cells { kv: &kvr, n: cells, visible: &vis }, 0.125, &mut s, &mut b);
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
        attend_row(AttnKernel::Tiled, &fast, &q, Cells { kv: &kvr, n: cells, visible: &vis }, 0.125, &mut s, &mut t);
        attend_row(AttnKernel::Tiled, &port, &q, Cells { kv: &kvr, n: cells, visible: &vis }, 0.125, &mut s, &mut b);
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
                attend_row(kind, ks, &q, Cells { kv: &paged, n: cells, visible: &vis }, 0.125, &mut s, &mut p);
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
        attend_row(AttnKernel::Reference, &fast, &q, Cells { kv: &rows, n: cells, visible: &|_| true }, 0.125, &mut s, &mut a);
        attend_row(AttnKernel::Reference, &port, &q, Cells { kv: &rows, n: cells, visible: &|_| true }, 0.125, &mut s, &mut b);
        for d in 0..hd {
            assert!((a[d] - b[d]).abs() < 1e-3 * (1.0 + a[d].abs()), "{kt}/{vt} dim {d}: simd {} portable {}", a[d], b[d]);
            assert!((a[d] as f64 - want[d]).abs() < tol, "{kt}/{vt} dim {d}: {} vs f64 {}", a[d], want[d]);
        }
    }
}

#[test]
fn four_row_dots_equal_single_row_dots() {
    let k = Kernels::detect();
    let mut rng = Rng(5);
    for t in [DType::Q4_1, DType::Q5_0, DType::Q8_0] {
        let ops = k.ops(t).unwrap();
        let Some(dot4) = ops.vec_dot4 else { continue };
        let n = 32 * 9;
        let w = random_row(t, n, &mut rng);
        let ys: Vec<Vec<u8>> = (0..4)
            .map(|_| {
                let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
                let mut q = vec![0u8; row_bytes(ops.vec_dot_type, n)];
                k.from_float(ops.vec_dot_type).unwrap()(&x, &mut q);
                q
            })
            .collect();
        let mut o = [0f32; 4];
        dot4(&w, [&ys[0], &ys[1], &ys[2], &ys[3]], &mut o);
        for j in 0..4 {
            assert_eq!(o[j], (ops.vec_dot_tile)(&w, &ys[j]), "{t} row {j}");
        }
    }
}

/// The 4×4 register-blocked tiles (default prefill) give each pair exactly the tile dot's
/// value, for row lengths of 1 to 9 blocks and extreme values (all fifth bits set or clear,
/// ±127 activations), packed once or decoded on every pass; decode's many-rows kernels give
/// each row `vec_dot`'s value.
#[test]
fn tile_dots_equal_row_dots() {
    let k = Kernels::detect();
    let mut rng = Rng(77);
    let mut tested = 0;
    for t in [DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q4K, DType::Q6K] {
        let ops = k.ops(t).unwrap();
        let Some(tile) = ops.vec_tile else { continue };
        for nb in 1..=9 {
            let n = t.block_size() * nb;
            let rb = row_bytes(t, n);
            let mut w: Vec<u8> = (0..12).flat_map(|_| random_row(t, n, &mut rng)).collect();
            if nb == 2 && t == DType::Q5_0 {
                // Row 0: every fifth bit set; row 1: none set.
                w[2..6].fill(0xFF);
                w[rb + 2..rb + 6].fill(0);
            }
            let ys: Vec<Vec<u8>> = (0..4)
                .map(|j| {
                    let x: Vec<f32> = (0..n).map(|i| if j == 3 { [1.0, -1.0][i % 2] } else { rng.f32() }).collect();
                    let mut q = vec![0u8; row_bytes(ops.vec_dot_type, n)];
                    k.from_float(ops.vec_dot_type).unwrap()(&x, &mut q);
                    q
                })
                .collect();
            // Twelve weight rows: three 4-row passes, or one 8-row pass and a 4-row rest.
            let mut o = [[0f32; 4]; 12];
            tile(&w, rb, [&ys[0], &ys[1], &ys[2], &ys[3]], &mut o[..]);
            for r in 0..12 {
                for j in 0..4 {
                    let want = (ops.vec_dot_tile)(&w[r * rb..(r + 1) * rb], &ys[j]);
                    assert_eq!(o[r][j], want, "{t} {nb} blocks, weight row {r}, activation row {j}");
                }
            }
            // Decode's GEMV: 12 rows (three groups of four), then 7 (a short last group).
            if let Some(rows) = ops.vec_dot_rows {
                for n_rows in [12usize, 7] {
                    for y in &ys {
                        let mut g = vec![0f32; n_rows];
                        rows(&w[..n_rows * rb], rb, y, &mut g);
                        for (r, &v) in g.iter().enumerate() {
                            let want = (ops.vec_dot)(&w[r * rb..(r + 1) * rb], y);
                            assert_eq!(v.to_bits(), want.to_bits(), "{t} {nb} blocks, rows kernel, weight row {r} of {n_rows}");
                        }
                    }
                }
            }
            // The same rows packed once (what a matmul does per column block) give the same bits.
            if let Some(pk) = ops.packing {
                let mut buf = vec![0u8; 12 * (pk.row_bytes)(rb)];
                (pk.pack)(&w, rb, &mut buf);
                let mut p = [[0f32; 4]; 12];
                (pk.tile)(&buf, rb, [&ys[0], &ys[1], &ys[2], &ys[3]], &mut p[..]);
                for r in 0..12 {
                    for j in 0..4 {
                        assert_eq!(p[r][j].to_bits(), o[r][j].to_bits(), "{t} {nb} blocks, packed, weight row {r}, activation row {j}");
                    }
                }
            }
            tested += 1;
        }
    }
    // Every AVX-512 VNNI machine has the tiles; elsewhere there is nothing to compare.
    if Kernels::detect().vnni() {
        assert!(tested > 0);
    }
}

/// The panel GEMM (prefill): the SIMD kernel of every table this CPU runs (AVX2, AVX-512 VNNI)
/// bit-identical to its portable twin, both equal to the per-row dot products up to float
/// summation order, on ragged shapes (columns not a multiple of the panel, rows not a multiple
/// of four).
#[test]
fn panel_gemm_matches_row_dots() {
    use corelm_kernels::matmul::gemm::{gemm, supported, GemmScratch};
    use corelm_kernels::matmul::schedule::{Schedule, PANEL_MR};
    let port = Kernels::portable();
    let mut rng = Rng(1234);
    for t in [DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_1, DType::Q5_1, DType::Q4K, DType::Q5K, DType::Q6K] {
        assert!(supported(t));
        let shapes: &[(usize, usize, usize)] = if t.block_size() == 256 {
            &[(256, 3, 1), (512, 13, 7), (768, 16, 9), (256, 10, 21)]
        } else {
            &[(32, 3, 1), (96, 13, 7), (256, 16, 9), (64, 10, 21)]
        };
        for &(k, n_out, rows) in shapes {
            let w: Vec<u8> = (0..n_out).flat_map(|_| random_row(t, k, &mut rng)).collect();
            let vdt = port.ops(t).unwrap().vec_dot_type;
            let xrb = row_bytes(vdt, k);
            let mut x = vec![0u8; rows * xrb];
            for r in 0..rows {
                let xf: Vec<f32> = (0..k).map(|_| rng.f32() * 2.0).collect();
                port.from_float(vdt).unwrap()(&xf, &mut x[r * xrb..(r + 1) * xrb]);
            }
            let mut scratch = GemmScratch::new(k, rows, 2);
            let run = |isa: Isa, sched: &Schedule, scratch: &mut GemmScratch| {
                let mut out = vec![f32::NAN; rows * n_out];
                // Two column ranges, as two workers would own them.
                let mid = n_out / 2;
                for cols in [0..mid, mid..n_out] {
                    // SAFETY: out holds rows × n_out f32; each call writes only its columns.
                    unsafe { gemm(t, &w, k, cols, &x, xrb, rows, out.as_mut_ptr(), n_out, isa, sched, scratch) };
                }
                out
            };
            let p = run(Isa::Portable, &Schedule::PANEL_DEFAULT, &mut scratch);
            // Every register tile height, blocks of columns (two panels; one more than the
            // scratch holds, capped), rows and inner blocks (carried through the output): the
            // same bits on every table.
            let mut schedules = vec![Schedule::PANEL_DEFAULT];
            for mr in PANEL_MR {
                schedules.push(Schedule { mr, nc: 16, mc: 8, kc: 1, row_parts: 0 });
                schedules.push(Schedule { mr, nc: 24, mc: 0, kc: 3, row_parts: 0 });
            }
            for isa in tables().iter().map(|k| k.isa()).filter(|&i| i == Isa::Portable || corelm_kernels::matmul::gemm::simd(t, i)) {
                for sched in &schedules {
                    let s = run(isa, sched, &mut scratch);
                    assert!(p.iter().zip(&s).all(|(a, b)| a.to_bits() == b.to_bits()), "{t} k={k}: {isa} {} vs portable", sched.describe());
                }
            }
            // The matrix-unit form (row tiles packed once, integer outer products in tiles)
            // through its portable model, at the tile sizes of 256-, 512- and 2048-bit
            // streaming vectors (the kernel needs 256 or more): the same bits again.
            for r in [8, 16, 64] {
                let mut ts = GemmScratch::with_tile_rows(k, rows, 2, r);
                for sched in &schedules {
                    let mut s = vec![f32::NAN; rows * n_out];
                    for cols in [0..n_out / 2, n_out / 2..n_out] {
                        let kernel = (r, corelm_kernels::matmul::gemm::tile::panel_tile_portable as corelm_kernels::matmul::gemm::tile::TileKernel);
                        // SAFETY: as `run`; the portable model runs anywhere.
                        unsafe { corelm_kernels::matmul::gemm::gemm_impl(t, &w, k, cols, (&x, xrb, rows), (s.as_mut_ptr(), n_out), Some(kernel), Isa::Portable, sched, &mut ts) };
                    }
                    assert!(p.iter().zip(&s).all(|(a, b)| a.to_bits() == b.to_bits()), "{t} k={k}: tile model r={r} {} vs portable", sched.describe());
                }
            }
            let rb = row_bytes(t, k);
            for r in 0..rows {
                for c in 0..n_out {
                    let want = (port.ops(t).unwrap().vec_dot)(&w[c * rb..(c + 1) * rb], &x[r * xrb..(r + 1) * xrb]);
                    let got = p[r * n_out + c];
                    assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{t} k={k} ({r},{c}): {got} vs {want}");
                }
            }
        }
    }
}

/// GeGLU (eight lanes through the F16 table, scalar tail) equals the portable `gelu_tanh` bit
/// for bit, over every f16 input, values outside (-10, 10) and values that are not f16.
#[test]
fn geglu_table_equals_portable() {
    use corelm_kernels::act::{geglu, gelu_tanh};
    let mut rng = Rng(11);
    let g: Vec<f32> = (0..=u16::MAX)
        .map(|b| f16::from_bits(b).to_f32())
        .filter(|v| v.is_finite())
        .chain([-12.0, 11.5, 9.999, -9.999])
        .chain((0..4099).map(|_| rng.f32() * 12.0)) // not f16 values: rounded first; ragged tail
        .collect();
    let u: Vec<f32> = (0..g.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
    for k in tables() {
        let mut y = vec![0f32; g.len()];
        geglu(&k, &g, &u, &mut y);
        for i in 0..g.len() {
            let want = gelu_tanh(g[i]) * u[i];
            assert_eq!(y[i].to_bits(), want.to_bits(), "{} x = {}", k.isa(), g[i]);
        }
    }
}

/// SIMD activation quantizers write the same bytes as the portable ones (ties to even, zero
/// blocks, a block whose amax sits at the end, Q8_K's sign from the first of equal magnitudes).
#[test]
fn activation_quantizers_simd_equal_portable() {
    let (fast, port) = (Kernels::detect(), Kernels::portable());
    let mut rng = Rng(77);
    let mut x: Vec<f32> = (0..32 * 40).map(|_| rng.f32() * 5.0).collect();
    x[32..64].iter_mut().for_each(|v| *v = 0.0);
    // amax 127 makes the scale exactly 1, so these are exact ties: 0.5 → 0, 1.5 → 2, ...
    for (i, v) in x[64..96].iter_mut().enumerate() {
        *v = if i == 0 { 127.0 } else { i as f32 - 15.5 };
    }
    x[127] = -100.0; // the largest magnitude last in its block
    // Q8_K: equal magnitudes of both signs; the first one (negative) sets the scale's sign.
    x[256..512].iter_mut().for_each(|v| *v *= 0.9);
    (x[300], x[400]) = (-4.9, 4.9);
    x[1279] = 200.0; // the largest magnitude last in its super-block
    for t in [DType::Q8_0, DType::Q8_1, DType::Q8K] {
        let n = row_bytes(t, x.len());
        let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
        fast.from_float(t).unwrap()(&x, &mut a);
        port.from_float(t).unwrap()(&x, &mut b);
        assert_eq!(a, b, "{t}");
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

/// `attend_heads` (the heads of a GQA group together) gives every head the bits of its own
/// `attend_row` call, for both kernels, over several tiles, with cells hidden individually and
/// whole tiles hidden (a sliding window), in the SIMD and the portable tables.
#[test]
fn grouped_attention_equals_per_head_attention() {
    use corelm_kernels::attention::{attend_heads, attend_row, AttnKernel, AttnScratch, Cells, KvRows};
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
                    let mut s = AttnScratch::with_heads(hd, heads);
                    let mut grouped = vec![0f32; heads * hd];
                    attend_heads(kind, &ks, &q, Cells { kv: &kvr, n: cells, visible: vis }, 0.125, &mut s, &mut grouped);
                    for h in 0..heads {
                        let mut one = vec![0f32; hd];
                        attend_row(kind, &ks, &q[h * hd..(h + 1) * hd], Cells { kv: &kvr, n: cells, visible: vis }, 0.125, &mut s, &mut one);
                        let g = &grouped[h * hd..(h + 1) * hd];
                        assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{kind:?} {:?} hd {hd} head {h}", ks.isa());
                    }
                }
            }
        }
    }
}

/// The AVX-512 instances in the detected table against the AVX2 kernels they replace: the same
/// bits, including extreme quants (every activation ±127; fifth bits all set or all clear).
#[test]
fn avx512_dots_equal_avx2_dots() {
    let (best, avx2) = (Kernels::detect(), Kernels::detect_avx2());
    let mut rng = Rng(17);
    for t in [DType::Q5_0] {
        let (ob, oa) = (best.ops(t).unwrap(), avx2.ops(t).unwrap());
        for blocks in [1usize, 5, 28] {
            let n = 32 * blocks;
            let mut ws = vec![aligned(random_row(t, n, &mut rng))];
            // All fifth bits set, then all clear (Q5_0: bytes 2..6 of each 22-byte block).
            for fill in [0xFFu8, 0x00] {
                let mut w = ws[0].clone();
                w.chunks_exact_mut(22).for_each(|b| b[2..6].fill(fill));
                ws.push(w);
            }
            for (i, w) in ws.iter().enumerate() {
                for j in 0..3 {
                    let x: Vec<f32> = (0..n).map(|e| if j == 2 { [1.0, -1.0][e % 2] } else { rng.f32() * 3.0 }).collect();
                    let mut y = aligned(vec![0u8; row_bytes(oa.vec_dot_type, n)]);
                    avx2.from_float(oa.vec_dot_type).unwrap()(&x, &mut y);
                    let (a, b) = ((ob.vec_dot)(w, &y), (oa.vec_dot)(w, &y));
                    assert_eq!(a.to_bits(), b.to_bits(), "{t} n={n} weights {i} acts {j}: {a} vs {b}");
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
            attend_rows(AttnKernel::Tiled, &fast, &qs, heads, &spans, &kvr, 0.125, &mut s, &mut outs);
            // The SIMD kernel ran (only it counts chunks), not the portable fallback.
            assert!(!attention::has_simd(&fast) || hd % 8 != 0 || s.tile_work().chunks_scored > before, "hd {hd}: no SIMD rows kernel");
            for (r, span) in spans.iter().enumerate() {
                for h in 0..heads {
                    let o = (r * heads + h) * hd;
                    let mut one = vec![0f32; hd];
                    let lo = span.start;
                    attend_row(AttnKernel::Tiled, &port, &q[o..o + hd], Cells { kv: &kvr, n: span.end, visible: &|c| c >= lo }, 0.125, &mut s, &mut one);
                    let got = &out[o..o + hd];
                    assert!(got.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{:?}: hd {hd} heads {heads} row {r} head {h} span {span:?}", fast.isa());
                }
            }
        }
    }
}

/// `rms_norm_groups` (eight groups' double sums advancing together) gives every group the bits
/// of `rms_norm` on it alone, for group sizes with and without the SIMD path and counts that
/// leave a tail of fewer than eight groups, with values spanning many magnitudes.
#[test]
fn grouped_rms_norm_equals_per_group() {
    use corelm_kernels::norm::{rms_norm, rms_norm_groups};
    let mut rng = Rng(99);
    for n in [4usize, 12, 64, 640, 100, 3] {
        for groups in [1usize, 7, 8, 9, 17, 70, 130] {
            let x: Vec<f32> = (0..groups * n).map(|i| rng.f32() * [1e-3, 1.0, 300.0][i % 3]).collect();
            let w: Vec<f32> = (0..n).map(|_| rng.f32() + 1.0).collect();
            for k in tables() {
                let mut y = vec![0f32; groups * n];
                rms_norm_groups(&k, &x, &w, 1e-6, &mut y);
                for g in 0..groups {
                    let mut one = vec![0f32; n];
                    rms_norm(&x[g * n..(g + 1) * n], &w, 1e-6, &mut one);
                    let got = &y[g * n..(g + 1) * n];
                    assert!(got.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{} n {n} groups {groups} group {g}", k.isa());
                }
            }
            // The double sums themselves (most order errors vanish in the f32 rounding above).
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            if n % 4 == 0 && corelm_kernels::attention::has_simd(&Kernels::detect()) {
                let mut sums = vec![0f64; groups];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a SIMD table on x86 means AVX2 and FMA were detected.
                unsafe {
                    corelm_kernels::norm::x86::sum_squares(&x, n, &mut sums)
                };
                #[cfg(target_arch = "aarch64")]
                corelm_kernels::norm::aarch64::sum_squares(&x, n, &mut sums);
                for (g, s) in sums.iter().enumerate() {
                    let want = x[g * n..(g + 1) * n].iter().fold(0f64, |a, &v| a + (v * v) as f64);
                    assert_eq!(s.to_bits(), want.to_bits(), "sum of squares n {n} groups {groups} group {g}");
                }
            }
        }
    }
}

/// The SIMD SwiGLU against the scalar one, bit for bit: inputs across the exponential's
/// ranges (underflow to 0, overflow to ∞, subnormal scaling), lengths with ragged tails.
#[test]
fn swiglu_simd_equals_scalar() {
    use corelm_kernels::act::{swiglu, swiglu_scalar};
    let mut rng = Rng(5);
    for n in [1usize, 7, 8, 9, 15, 16, 17, 64, 1000, 4099] {
        let g: Vec<f32> = (0..n).map(|i| rng.f32() * [1.0, 20.0, 95.0, 200.0, 1e-3][i % 5]).collect();
        let u: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
        let mut b = vec![0f32; n];
        swiglu_scalar(&g, &u, &mut b);
        // Every table this CPU runs: the 16-lane kernel (AVX-512), the 8-lane one (AVX2).
        for k in tables() {
            let mut a = vec![0f32; n];
            swiglu(&k, &g, &u, &mut a);
            for i in 0..n {
                assert_eq!(a[i].to_bits(), b[i].to_bits(), "{} n {n} i {i} g {}", k.isa(), g[i]);
            }
        }
    }
}

/// The AVX-512 `expf` (glibc's algorithm on 16 lanes, used by decode attention) against
/// `f32::exp` — libm's `expf` — on every negative float above -104 (the arguments attention
/// passes), and on the edges: ±0, ±∞, NaN, overflow, underflow, subnormals.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_expf_equals_libm_expf() {
    if Kernels::detect().isa() != corelm_kernels::Isa::Avx512 {
        return;
    }
    use corelm_kernels::exp::x86::expf_slice;
    let (start, end) = (0x8000_0000u32, (-104f32).to_bits());
    let mut xs = vec![0f32; 1 << 16];
    let mut ys = vec![0f32; 1 << 16];
    let mut bits = start;
    while bits <= end {
        let n = ((end - bits + 1) as usize).min(xs.len());
        for (i, x) in xs[..n].iter_mut().enumerate() {
            *x = f32::from_bits(bits + i as u32);
        }
        ys[..n].copy_from_slice(&xs[..n]);
        // SAFETY: AVX-512 F/VL (and FMA) were detected.
        unsafe { expf_slice(&mut ys[..n]) };
        for (x, y) in xs[..n].iter().zip(&ys[..n]) {
            assert_eq!(y.to_bits(), x.exp().to_bits(), "expf({x:e})");
        }
        // The AVX2 twin on every seventh value of the same range.
        let mut zs: Vec<f32> = xs[..n].iter().step_by(7).copied().collect();
        let want: Vec<u32> = zs.iter().map(|x| x.exp().to_bits()).collect();
        // SAFETY: AVX2 and FMA are implied by the AVX-512 table.
        unsafe { corelm_kernels::exp::x86::expf_slice_avx2(&mut zs) };
        assert!(zs.iter().zip(&want).all(|(z, w)| z.to_bits() == *w), "avx2 expf near {:e}", xs[0]);
        bits += n as u32;
    }
    let mut edges: Vec<f32> = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 88.0, 88.8, 100.0, -103.5, -103.99, -200.0];
    edges.extend([1e-40f32, -1e-40, 0.5, 1.0, 10.0, 87.9, f32::MAX, f32::MIN]);
    let mut ys = edges.clone();
    let mut zs = edges.clone();
    // SAFETY: as above.
    unsafe {
        expf_slice(&mut ys);
        corelm_kernels::exp::x86::expf_slice_avx2(&mut zs);
    }
    for ((x, y), z) in edges.iter().zip(&ys).zip(&zs) {
        let want = x.exp();
        for v in [y, z] {
            assert!(v.to_bits() == want.to_bits() || (v.is_nan() && want.is_nan()), "expf({x:e}) = {v:e}, libm {want:e}");
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
    for (hd, heads, cells) in [(64usize, 3usize, 64usize), (64, 7, 200), (64, 8, 65), (64, 12, 93), (64, 1, 130), (128, 5, 129), (192, 2, 70), (256, 4, 131), (256, 1, 1)] {
        let (q, k, v) = decode_case(&mut rng, hd, heads, cells);
        let ident: Vec<u32> = (0..cells as u32).collect();
        let kvr = KvRows::contiguous(&k, &v, hd, &ident);
        let masks: [&dyn Fn(usize) -> bool; 4] = [&|_| true, &|c| c % 5 != 3, &|c| c + 60 >= cells, &|_| false];
        for (vis, fast) in masks.into_iter().flat_map(|m| [(m, Kernels::detect()), (m, Kernels::detect_avx2())]) {
            let mut s = AttnScratch::with_heads(hd, heads);
            let mut grouped = vec![f32::NAN; heads * hd];
            attend_heads(AttnKernel::Reference, &fast, &q, Cells { kv: &kvr, n: cells, visible: vis }, 0.125, &mut s, &mut grouped);
            for h in 0..heads {
                let mut one = vec![0f32; hd];
                attend_row(AttnKernel::Reference, &port, &q[h * hd..(h + 1) * hd], Cells { kv: &kvr, n: cells, visible: vis }, 0.125, &mut s, &mut one);
                let g = &grouped[h * hd..(h + 1) * hd];
                assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "avx512 {} hd {hd} heads {heads} cells {cells} head {h}", fast.isa());
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
            attend_heads(AttnKernel::Split(chunk), &fast, &q, Cells { kv: &kvr, n: cells, visible: vis }, 0.125, &mut s, &mut grouped);
            for h in 0..heads {
                let (mut one, mut whole) = (vec![0f32; hd], vec![0f32; hd]);
                attend_row(AttnKernel::Split(chunk), &port, &q[h * hd..(h + 1) * hd], Cells { kv: &kvr, n: cells, visible: vis }, 0.125, &mut s, &mut one);
                attend_row(AttnKernel::Reference, &port, &q[h * hd..(h + 1) * hd], Cells { kv: &kvr, n: cells, visible: vis }, 0.125, &mut s, &mut whole);
                let g = &grouped[h * hd..(h + 1) * hd];
                assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "avx512 {} hd {hd} cells {cells} chunk {chunk} head {h}", fast.isa());
                let mag = whole.iter().fold(1f32, |m, x| m.max(x.abs()));
                assert!(one.iter().zip(&whole).all(|(a, b)| (a - b).abs() <= 2e-2 * mag), "hd {hd} cells {cells} chunk {chunk} head {h}: split far from unsplit");
            }
        }
    }
}

/// RoPE with the detected SIMD kernels (`rope::x86`, 8 or 16 lanes) against the scalar loop,
/// bit for bit, for both pair layouts, rotated widths with ragged tails, partial rotation
/// (`n_rot < head_dim`: the rest untouched) and several positions; and near an f64 rotation.
#[test]
fn rope_simd_equals_scalar() {
    use corelm_kernels::rope::{rope_apply, rope_apply_scalar, rope_cache};
    let mut rng = Rng(77);
    for (hd, n_rot) in [(64usize, 64usize), (128, 128), (256, 256), (80, 80), (96, 64), (64, 36), (6, 6), (2, 2)] {
        for neox in [false, true] {
            for pos in [0i32, 1, 17, 511, 4095] {
                let mut cache = vec![0f32; n_rot];
                rope_cache(pos, n_rot, 10000.0, 1.0, None, &mut cache);
                let x: Vec<f32> = (0..hd).map(|_| rng.f32() * 8.0).collect();
                let mut b = x.clone();
                rope_apply_scalar(&mut b, &cache, n_rot, neox);
                // Every table this CPU runs: 16 lanes (AVX-512), 8 (AVX2), the scalar loop.
                for k in tables() {
                    let mut a = x.clone();
                    rope_apply(&k, &mut a, &cache, n_rot, neox);
                    for d in 0..hd {
                        assert_eq!(a[d].to_bits(), b[d].to_bits(), "{} hd {hd} n_rot {n_rot} neox {neox} pos {pos} dim {d}", k.isa());
                    }
                }
                assert_eq!(&b[n_rot..], &x[n_rot..], "dimensions past n_rot");
                let half = n_rot / 2;
                for i in 0..half {
                    let (ia, ib) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
                    let th = pos as f64 * 10000f64.powf(-2.0 * i as f64 / n_rot as f64);
                    let (x0, x1) = (x[ia] as f64, x[ib] as f64);
                    let (r0, r1) = (x0 * th.cos() - x1 * th.sin(), x0 * th.sin() + x1 * th.cos());
                    // f32 angles lose ~pos·2^-24 radians, the iterated θ a few ulps more.
                    let tol = 1e-4 * (1.0 + pos as f64 / 64.0) * (x0.abs() + x1.abs() + 1.0);
                    assert!((b[ia] as f64 - r0).abs() < tol && (b[ib] as f64 - r1).abs() < tol, "hd {hd} pos {pos} pair {i}");
                }
            }
        }
    }
}

/// ggml's `expf` as the scalar (`exp::expf_ggml`, also the AVX2 lanes' model) computes it
/// against ggml's own AVX-512 code (`exp::x86::expf_ggml16`, whose `vscalefps` is the
/// reference for the single rounding): every float in [-140, -64] — the subnormal and
/// underflow range, where `n = -192` once produced -∞ — and in [64, 100], plus a sweep of
/// [-64, 64].
#[cfg(target_arch = "x86_64")]
#[test]
fn ggml_expf_scalar_equals_avx512() {
    if Kernels::detect().isa() != corelm_kernels::Isa::Avx512 {
        return;
    }
    use corelm_kernels::exp::expf_ggml;
    use std::arch::x86_64::*;
    let check = |xs: &[f32]| {
        for c in xs.chunks_exact(16) {
            let mut v = [0f32; 16];
            // SAFETY: AVX-512 F/VL detected; 16 f32 loads and stores.
            unsafe { _mm512_storeu_ps(v.as_mut_ptr(), corelm_kernels::exp::x86::expf_ggml16(_mm512_loadu_ps(c.as_ptr()))) };
            for (x, y) in c.iter().zip(&v) {
                assert_eq!(expf_ggml(*x).to_bits(), y.to_bits(), "expf_ggml({x:e})");
            }
        }
    };
    let ranges = [((-140f32).to_bits(), (-64f32).to_bits(), 1usize), (64f32.to_bits(), 100f32.to_bits(), 1), (0, 64f32.to_bits(), 97), (0x8000_0000, (-64f32).to_bits(), 97)];
    for (a, b, step) in ranges {
        let (lo, hi) = (a.min(b), a.max(b));
        let xs: Vec<f32> = (lo..=hi).step_by(step).map(f32::from_bits).collect();
        check(&xs[..xs.len() / 16 * 16]);
    }
}

/// Decode over a quantized KV cache (`--cache-type-k/-v q8_0|q4_0`) for the heads of a GQA
/// group at once gives every head the bits of its own single-head call, with each table, across
/// chunk boundaries and masks (including nothing visible).
#[test]
fn grouped_quantized_cache_attention_equals_per_head() {
    use corelm_kernels::attention::{attend_heads, attend_row, AttnKernel, AttnScratch, Cells, KeyLayout, KvRows};
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
                    let mut s = AttnScratch::with_heads(hd, heads);
                    let mut grouped = vec![f32::NAN; heads * hd];
                    attend_heads(kind, &ks, &q, Cells { kv: &rows, n: cells, visible: vis }, 0.125, &mut s, &mut grouped);
                    for h in 0..heads {
                        let mut one = vec![0f32; hd];
                        attend_row(kind, &ks, &q[h * hd..(h + 1) * hd], Cells { kv: &rows, n: cells, visible: vis }, 0.125, &mut s, &mut one);
                        let g = &grouped[h * hd..(h + 1) * hd];
                        assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{kt}/{vt} {:?} heads {heads} cells {cells} head {h}", ks.isa());
                    }
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
                    attend_rows(kind, &ks, &qs, heads, &spans, &kv, 0.125, &mut s, &mut outs);
                    for (r, span) in spans.iter().enumerate() {
                        for h in 0..heads {
                            let mut one = vec![0f32; hd];
                            let lo = span.start;
                            let vis = move |c: usize| c >= lo;
                            let qh = &q[(r * heads + h) * hd..(r * heads + h + 1) * hd];
                            attend_row(kind, &ks, qh, Cells { kv: &kv, n: span.end, visible: &vis }, 0.125, &mut s, &mut one);
                            let g = &got[(r * heads + h) * hd..(r * heads + h + 1) * hd];
                            assert!(g.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{kt}/{vt} {kind:?} {:?} rows {rows} heads {heads} row {r} head {h}", ks.isa());
                        }
                    }
                }
            }
        }
    }
}

/// Row-to-f32 converters of the SIMD table (Q8_0 with AVX2: quantized KV values) equal the
/// portable ones bit for bit on random blocks of every weight type.
#[test]
fn to_float_simd_equals_portable() {
    let (fast, port) = (Kernels::detect(), Kernels::portable());
    let mut rng = Rng(8);
    for t in [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q4K, DType::Q6K, DType::F16] {
        for n in [256usize, 512, 1024] {
            let x = random_row(t, n, &mut rng);
            let (mut a, mut b) = (vec![f32::NAN; n], vec![0f32; n]);
            fast.to_float(t).unwrap()(&x, &mut a);
            port.to_float(t).unwrap()(&x, &mut b);
            assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{t} n {n}");
        }
    }
}

/// The SIMD f32 → F16 row converter (F16 KV-cache stores) equals the portable one bit for bit:
/// random values across magnitudes, F16 subnormals, overflow to ±∞, ±0, ±∞, ragged tails (NaN
/// stays NaN).
#[test]
fn f16_rows_simd_equal_portable() {
    let (fast, port) = (Kernels::detect(), Kernels::portable());
    let mut rng = Rng(16);
    let mut x: Vec<f32> = (0..1000).map(|i| rng.f32() * [1e-7, 1e-3, 1.0, 300.0, 7e4][i % 5]).collect();
    x.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 65504.0, 65519.0, 65520.0, -65520.0, 5.96e-8, 2.98e-8, 2.99e-8, f32::NAN]);
    for n in [x.len(), 7, 8, 9, 17] {
        let (mut a, mut b) = (vec![0u8; 2 * n], vec![0u8; 2 * n]);
        fast.from_float(DType::F16).unwrap()(&x[..n], &mut a);
        port.from_float(DType::F16).unwrap()(&x[..n], &mut b);
        for i in 0..n {
            let (p, q) = (f16::from_le_bytes([a[2 * i], a[2 * i + 1]]), f16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
            assert!(p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()), "{}: {p} vs {q}", x[i]);
        }
    }
}

/// BF16 dots follow ggml's order for their instruction set bit for bit (ggml's BF16 dot differs
/// per ISA, and llama.cpp on the same CPU is what the logits are compared with): the AVX2
/// kernel its four-accumulator AVX2 path, the AVX-512 BF16 kernel its `vdpbf16ps` path. Ragged
/// lengths exercise the f64 tails.
#[test]
fn bf16_dots_follow_ggml_order_per_isa() {
    use corelm_kernels::matmul::portable::{dot_bf16_avx2_order, dot_bf16_dp_order};
    let mut rng = Rng(0xBF16_0001);
    let (avx2, best) = (Kernels::detect_avx2(), Kernels::detect());
    let simd = avx2.isa() == corelm_kernels::Isa::Avx2;
    #[cfg(target_arch = "x86_64")]
    let dp = std::is_x86_feature_detected!("avx512bf16") && best.isa() == corelm_kernels::Isa::Avx512;
    #[cfg(not(target_arch = "x86_64"))]
    let dp = false;
    eprintln!("AVX2 BF16 dot checked: {simd}; AVX-512 BF16 dot checked: {dp}");
    for n in [1usize, 31, 32, 63, 64, 100, 896, 4871] {
        // Values over several binades, a few exact zeros.
        let row = |rng: &mut Rng| -> Vec<u8> {
            let v: Vec<f32> = (0..n).map(|_| if rng.next() % 17 == 0 { 0.0 } else { rng.f32() * (1 << (rng.next() % 6)) as f32 }).collect();
            let mut b = aligned(vec![0u8; 2 * n]);
            corelm_kernels::quant::portable::quant_bf16(&v, &mut b);
            b
        };
        let (x, y) = (row(&mut rng), row(&mut rng));
        if simd {
            let (a, want) = ((avx2.ops(DType::BF16).unwrap().vec_dot)(&x, &y), dot_bf16_avx2_order(&x, &y));
            assert_eq!(a.to_bits(), want.to_bits(), "n={n}: AVX2 {a} vs its order {want}");
        }
        if dp {
            let (a, want) = ((best.ops(DType::BF16).unwrap().vec_dot)(&x, &y), dot_bf16_dp_order(&x, &y));
            assert_eq!(a.to_bits(), want.to_bits(), "n={n}: AVX-512 BF16 {a} vs its order {want}");
        }
    }
}

/// The dense types' batch dots (llamafile's tinyBLAS order, which llama.cpp uses for matmuls of
/// two or more rows) equal their portable twin bit for bit, and the f64 reference closely.
#[test]
fn dense_batch_dots_follow_tinyblas_order() {
    use corelm_kernels::matmul::portable::batch_order;
    let (best, port) = (Kernels::detect(), Kernels::portable());
    let mut rng = Rng(0x7B1A_5001);
    for t in [DType::F32, DType::F16, DType::BF16] {
        let Some(b) = best.ops(t).unwrap().batch_dot else {
            eprintln!("{t}: no batch dot on this CPU; skipped");
            continue;
        };
        assert!(b.applies(2, 64, 8) && !b.applies(1, 64, 8) && !b.applies(2, 64, 6) && !b.applies(2, b.step + 8, 8));
        for n in [b.step, 64, 576, 896, 4864] {
            let v = |rng: &mut Rng| -> Vec<f32> { (0..n).map(|_| rng.f32() * (1 << (rng.next() % 5)) as f32).collect() };
            let (xf, yf) = (v(&mut rng), v(&mut rng));
            let enc = |f: &[f32]| {
                let mut q = aligned(vec![0u8; row_bytes(t, n)]);
                port.from_float(t).unwrap()(f, &mut q);
                q
            };
            let (x, y) = (enc(&xf), enc(&yf));
            let (a, want) = ((b.dot)(&x, &y), batch_order(t, &x, &y));
            assert_eq!(a.to_bits(), want.to_bits(), "{t} n={n}: batch dot {a} vs tinyBLAS order {want}");
            let single = (port.ops(t).unwrap().vec_dot)(&x, &y);
            assert!((a - single).abs() <= 1e-4 * (1.0 + single.abs()), "{t} n={n}: batch {a} vs single-row {single}");
            // The tiles: sixteen weight rows (x and fifteen more: tiles of 6, 6 and 4 rows)
            // against y and three more.
            let rows: Vec<Vec<u8>> = (0..16).map(|i| if i == 0 { x.clone() } else { enc(&v(&mut rng)) }).collect();
            let w = aligned(rows.concat());
            let acts: Vec<Vec<u8>> = (0..4).map(|j| if j == 0 { y.clone() } else { enc(&v(&mut rng)) }).collect();
            let mut out = vec![[0f32; 4]; 16];
            (b.tile)(&w, x.len(), std::array::from_fn(|j| &acts[j][..]), &mut out);
            for (c, o) in out.iter().enumerate() {
                for (j, act) in acts.iter().enumerate() {
                    let want = (b.dot)(&rows[c], act);
                    assert_eq!(o[j].to_bits(), want.to_bits(), "{t} n={n} row {c} act {j}: tile {} vs batch dot {want}", o[j]);
                }
            }
            // F16: the f32 tile on weight and activation rows widened first.
            if let Some(wd) = b.wide {
                let wide_rows = |bytes: &[u8], rows: usize| {
                    let mut f = vec![0f32; rows * n];
                    (wd.widen)(bytes, &mut f);
                    aligned(f.iter().flat_map(|v| v.to_le_bytes()).collect())
                };
                let wa: Vec<Vec<u8>> = acts.iter().map(|a| wide_rows(a, 1)).collect();
                let mut wide = vec![[0f32; 4]; 16];
                (wd.tile)(&wide_rows(&w, 16), 4 * n, std::array::from_fn(|j| &wa[j][..]), &mut wide);
                assert!(wide.iter().zip(&out).all(|(a, b)| a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits())), "{t} n={n}: wide tile differs");
            }
        }
    }
}
