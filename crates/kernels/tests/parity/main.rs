//! Every kernel of the detected table against the portable table, and both against an f32
//! reference (dequantized weights · f32 activations). Random blocks, several row lengths.
//!
//! One test binary in three files: the matrix kernels (dots, tiles, the panel GEMM, activation
//! quantizers, row converters) here, attention in `attention.rs`, the elementwise kernels
//! (norms, RoPE, activations, `expf`) in `elementwise.rs`.

use corelm_kernels::quant::blocks::*;
use corelm_kernels::{row_bytes, DType, Isa, Kernels};
use half::f16;

#[path = "../common/mod.rs"]
mod common;
mod attention;
mod elementwise;
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
    use corelm_kernels::quant::iq::IqType;
    type Dot = fn(&[u8], &[u8]) -> f32;
    let refs: [(DType, Dot, Dot); 20] = [
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
        (DType::IQ2XXS, |x, y| lanes::dot_iq_q8_k(IqType::IQ2XXS, x, y), |x, y| lanes::dot_iq_q8_k(IqType::IQ2XXS, x, y)),
        (DType::IQ2XS, |x, y| lanes::dot_iq_q8_k(IqType::IQ2XS, x, y), |x, y| lanes::dot_iq_q8_k(IqType::IQ2XS, x, y)),
        (DType::IQ2S, |x, y| lanes::dot_iq_q8_k(IqType::IQ2S, x, y), |x, y| lanes::dot_iq_q8_k(IqType::IQ2S, x, y)),
        (DType::IQ3XXS, |x, y| lanes::dot_iq_q8_k(IqType::IQ3XXS, x, y), |x, y| lanes::dot_iq_q8_k(IqType::IQ3XXS, x, y)),
        (DType::IQ3S, |x, y| lanes::dot_iq_q8_k(IqType::IQ3S, x, y), |x, y| lanes::dot_iq_q8_k(IqType::IQ3S, x, y)),
        (DType::IQ1S, |x, y| lanes::dot_iq_q8_k(IqType::IQ1S, x, y), |x, y| lanes::dot_iq_q8_k(IqType::IQ1S, x, y)),
        (DType::IQ1M, |x, y| lanes::dot_iq_q8_k(IqType::IQ1M, x, y), |x, y| lanes::dot_iq_q8_k(IqType::IQ1M, x, y)),
        (DType::MXFP4, lanes::dot_mxfp4_q8_0, lanes::dot_mxfp4_q8_0),
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
fn four_row_dots_equal_single_row_dots() {
    let k = Kernels::detect();
    let mut rng = Rng(5);
    let mut checked = 0;
    for t in corelm_kernels::dispatch::WEIGHT_TYPES {
        let ops = k.ops(t).unwrap();
        let Some(dot4) = ops.vec_dot4 else { continue };
        checked += 1;
        let n = t.block_size().max(32) * 9;
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
    eprintln!("{checked} types' 4-row dots checked on {}", k.isa());
}

/// Decode's many-rows kernels of the quantized types without tiles (MXFP4) give each row
/// `vec_dot`'s bits on every table: 1 to 9 blocks (odd counts leave the scalar tail), 12 rows
/// (three groups of four) and 7 (a short last group).
#[test]
fn rows_kernels_without_tiles_equal_row_dots() {
    let mut rng = Rng(0x0A55);
    let mut checked = 0;
    for k in tables() {
        for t in [DType::MXFP4] {
            let ops = k.ops(t).unwrap();
            let Some(rows) = ops.vec_dot_rows else { continue };
            for nb in 1..=9 {
                let n = t.block_size() * nb;
                let rb = row_bytes(t, n);
                let w: Vec<u8> = (0..12).flat_map(|_| random_row(t, n, &mut rng)).collect();
                let x: Vec<f32> = (0..n).map(|_| rng.f32() * 2.0).collect();
                let mut y = vec![0u8; row_bytes(ops.vec_dot_type, n)];
                k.from_float(ops.vec_dot_type).unwrap()(&x, &mut y);
                for n_rows in [12usize, 7] {
                    let mut g = vec![0f32; n_rows];
                    rows(&w[..n_rows * rb], rb, &y, &mut g);
                    for (r, &v) in g.iter().enumerate() {
                        let want = (ops.vec_dot)(&w[r * rb..(r + 1) * rb], &y);
                        assert_eq!(v.to_bits(), want.to_bits(), "{} {t} {nb} blocks, weight row {r} of {n_rows}", k.isa());
                    }
                }
                checked += 1;
            }
        }
    }
    eprintln!("{checked} rows kernels checked");
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
    use corelm_kernels::matmul::gemm::tile::{self, TileUnit};
    use corelm_kernels::matmul::gemm::{gemm, supported, GemmScratch};
    use corelm_kernels::matmul::schedule::{Schedule, PANEL_MR};
    let port = Kernels::portable();
    let mut rng = Rng(1234);
    for t in [DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::MXFP4, DType::Q4_1, DType::Q5_1, DType::Q4K, DType::Q5K, DType::Q6K] {
        assert!(supported(t));
        let shapes: &[(usize, usize, usize)] = if t.block_size() == 256 {
            &[(256, 3, 1), (512, 13, 7), (768, 16, 9), (256, 10, 21), (512, 40, 9)]
        } else {
            &[(32, 3, 1), (96, 13, 7), (256, 16, 9), (64, 10, 21), (96, 40, 9)]
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
                    unsafe { gemm(t, corelm_kernels::matmul::gemm::Weights::Rows(&w), k, cols, &x, xrb, rows, out.as_mut_ptr(), n_out, isa, sched, scratch) };
                }
                out
            };
            let p = run(Isa::Portable, &Schedule::PANEL_DEFAULT, &mut scratch);
            // Every register tile height, blocks of columns (two panels; one more than the
            // scratch holds, capped), rows and inner blocks (carried through the output): the
            // same bits on every table.
            let mut schedules = vec![Schedule::PANEL_DEFAULT, Schedule::PANEL_WIDE_DEFAULT, Schedule::PANEL_NARROW_DEFAULT, Schedule::AMX_DEFAULT];
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
                        let kernel = TileUnit::Panel(r, tile::panel_tile_portable);
                        // SAFETY: as `run`; the portable model runs anywhere.
                        unsafe { corelm_kernels::matmul::gemm::gemm_impl(t, corelm_kernels::matmul::gemm::Weights::Rows(&w), k, cols, (&x, xrb, rows), (s.as_mut_ptr(), n_out), Some(kernel), Isa::Portable, sched, &mut ts) };
                    }
                    assert!(p.iter().zip(&s).all(|(a, b)| a.to_bits() == b.to_bits()), "{t} k={k}: tile model r={r} {} vs portable", sched.describe());
                }
            }
            // AMX's form (row tiles of 16 packed by rows, two panels per call, the last of an
            // odd number with itself) through its portable model: the same bits again. Its
            // kernel is the `amx` table's, run above where this CPU has AMX.
            // Under every table this CPU runs (x86: the panels decoded and the row scalars
            // computed with AVX2/F16C, as the AMX table does).
            let mut ts = GemmScratch::with_tile_rows(k, rows, 2, tile::PAIR_ROWS);
            for isa in tables().iter().map(|k| k.isa()).filter(|&i| i == Isa::Portable || i >= Isa::Avx2) {
                for sched in &schedules {
                    let mut s = vec![f32::NAN; rows * n_out];
                    for cols in [0..n_out / 2, n_out / 2..n_out] {
                        // SAFETY: as `run`; the portable model runs anywhere, the decoders
                        // of `isa` on this CPU.
                        unsafe { corelm_kernels::matmul::gemm::gemm_impl(t, corelm_kernels::matmul::gemm::Weights::Rows(&w), k, cols, (&x, xrb, rows), (s.as_mut_ptr(), n_out), Some(TileUnit::Pair(tile::pair_tile_portable)), isa, sched, &mut ts) };
                    }
                    assert!(p.iter().zip(&s).all(|(a, b)| a.to_bits() == b.to_bits()), "{t} k={k}: AMX tile model under {isa} {} vs portable", sched.describe());
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
            let v: Vec<f32> = (0..n).map(|_| if rng.next().is_multiple_of(17) { 0.0 } else { rng.f32() * (1 << (rng.next() % 6)) as f32 }).collect();
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
            // The tiles for a batch's last one to three rows: the 4-row tile's values.
            if let Some(few) = b.few {
                for m in 1..4 {
                    let ys: Vec<&[u8]> = acts[..m].iter().map(|a| &a[..]).collect();
                    let mut o = vec![[f32::NAN; 4]; 16];
                    few(&w, x.len(), &ys, &mut o);
                    assert!(o.iter().zip(&out).all(|(a, b)| a[..m].iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits())), "{t} n={n}: tile of {m} rows differs");
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
                if let Some(few) = wd.few {
                    let ww = wide_rows(&w, 16);
                    for m in 1..4 {
                        let ys: Vec<&[u8]> = wa[..m].iter().map(|a| &a[..]).collect();
                        let mut o = vec![[f32::NAN; 4]; 16];
                        few(&ww, 4 * n, &ys, &mut o);
                        assert!(o.iter().zip(&out).all(|(a, b)| a[..m].iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits())), "{t} n={n}: wide tile of {m} rows differs");
                    }
                }
            }
        }
    }
}

/// What `bench` prints of a table's run-time choices (`Kernels::variant`) is what its panel
/// GEMM does: the AVX-512 table says 8-row tiles exactly when its default schedule has them,
/// the AVX2 table says `maddubs` exactly when Q6_K's default falls to 2-row tiles.
#[test]
fn variant_names_the_default_panel_tile() {
    use corelm_kernels::matmul::gemm::default_schedule;
    for k in tables() {
        let (isa, v) = (k.isa(), k.variant());
        eprintln!("{isa}: {v}");
        match isa {
            Isa::Avx512 => assert_eq!(v.contains("8-row"), default_schedule(isa, DType::Q4_1).mr == 8, "{v}"),
            Isa::Avx2 => assert_eq!(v.contains("maddubs"), default_schedule(isa, DType::Q6K).mr == 2, "{v}"),
            Isa::Amx => assert!(v.starts_with("AMX"), "{v}"),
            _ => assert!(v.is_empty(), "{isa}: {v}"),
        }
    }
}
