//! Our dequantizers against ggml's own, bit for bit, on `fixtures/quants.gguf` (written by
//! `scripts/make_fixtures.py quants` from llama.cpp's `ggml_quantize_chunk` and `to_float`).
//! This is the independent check of every block layout: the parity tests only compare our own
//! kernels with each other and with our own dequantization.

use corelm_gguf::Gguf;
use corelm_kernels::quant::blocks::as_blocks;
use corelm_kernels::{DType, Kernels};

fn fixture() -> Gguf {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/quants.gguf");
    Gguf::open(path).expect("fixtures/quants.gguf (see scripts/make_fixtures.py)")
}

/// Names in the fixture and our types.
pub const TYPES: [(&str, DType); 22] = [
    ("Q4_0", DType::Q4_0),
    ("Q4_1", DType::Q4_1),
    ("Q5_0", DType::Q5_0),
    ("Q5_1", DType::Q5_1),
    ("Q8_0", DType::Q8_0),
    ("Q2_K", DType::Q2K),
    ("Q3_K", DType::Q3K),
    ("Q4_K", DType::Q4K),
    ("Q5_K", DType::Q5K),
    ("Q6_K", DType::Q6K),
    ("IQ4_NL", DType::IQ4NL),
    ("IQ4_XS", DType::IQ4XS),
    ("F16", DType::F16),
    ("BF16", DType::BF16),
    ("IQ2_XXS", DType::IQ2XXS),
    ("IQ2_XS", DType::IQ2XS),
    ("IQ2_S", DType::IQ2S),
    ("IQ3_XXS", DType::IQ3XXS),
    ("IQ3_S", DType::IQ3S),
    ("IQ1_S", DType::IQ1S),
    ("IQ1_M", DType::IQ1M),
    ("MXFP4", DType::MXFP4),
];

#[test]
fn dequantize_matches_ggml_bit_for_bit() {
    let g = fixture();
    let k = Kernels::portable();
    for (name, t) in TYPES {
        let q = g.tensor(&format!("{name}.q")).unwrap();
        assert_eq!(q.dtype, t, "{name}");
        let want: &[f32] = as_blocks(g.tensor_data(g.tensor(&format!("{name}.deq")).unwrap()));
        let mut got = vec![0f32; want.len()];
        (k.to_float(t).unwrap())(g.tensor_data(q), &mut got);
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}: element {i}: ours {a}, ggml {b}");
        }
    }
}

/// The dot product of a ggml-quantized row with quantized activations, against the f32 dot of
/// ggml's dequantization: a per-type bound, relative to the sum of |w·x|.
#[test]
fn dot_products_of_ggml_rows_within_bounds() {
    let g = fixture();
    let (fast, port) = (Kernels::detect(), Kernels::portable());
    let input: &[f32] = as_blocks(g.tensor_data(g.tensor("input").unwrap()));
    let cols = g.tensor("input").unwrap().shape[0] as usize;
    for (name, t) in TYPES {
        let q = g.tensor_data(g.tensor(&format!("{name}.q")).unwrap());
        let deq: &[f32] = as_blocks(g.tensor_data(g.tensor(&format!("{name}.deq")).unwrap()));
        let rb = corelm_kernels::row_bytes(t, cols);
        let ops = port.ops(t).unwrap();
        let vdt = ops.vec_dot_type;
        // Activations: the input rows reversed, so weights and activations differ.
        for r in 0..input.len() / cols {
            let x: Vec<f32> = input[r * cols..(r + 1) * cols].iter().rev().map(|v| v * 10.0).collect();
            let mut xq = vec![0u8; corelm_kernels::row_bytes(vdt, cols)];
            port.from_float(vdt).unwrap()(&x, &mut xq);
            let w = &q[r * rb..(r + 1) * rb];
            let wf = &deq[r * cols..(r + 1) * cols];
            let exact: f64 = wf.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = wf.iter().zip(&x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let bound = match vdt {
                DType::F16 => 1e-3,
                DType::BF16 => 1e-2,
                _ => 2e-2,
            } * mag
                + 1e-6;
            for (isa, k) in [("portable", &port), ("detected", &fast)] {
                let got = (k.ops(t).unwrap().vec_dot)(w, &xq) as f64;
                assert!((got - exact).abs() <= bound, "{name} row {r} {isa}: {got} vs {exact} (bound {bound})");
            }
        }
    }
}

/// Our reference quantizers (what `corelm quantize` writes) against ggml's own
/// `ggml_quantize_chunk` on the same input: identical bytes.
#[test]
fn quantize_matches_ggml_bit_for_bit() {
    let g = fixture();
    let input: &[f32] = as_blocks(g.tensor_data(g.tensor("input").unwrap()));
    for (name, t) in TYPES {
        let Some(q) = corelm_kernels::quant::reference::quantizer(t) else { continue };
        let want = g.tensor_data(g.tensor(&format!("{name}.q")).unwrap());
        let mut got = vec![0u8; want.len()];
        q(input, &mut got);
        let rb = want.len() / 4;
        for r in 0..4 {
            let (a, b) = (&got[r * rb..(r + 1) * rb], &want[r * rb..(r + 1) * rb]);
            let first = a.iter().zip(b).position(|(x, y)| x != y);
            assert!(first.is_none(), "{name} row {r}: first differing byte {first:?} of {rb}");
        }
    }
}

/// Each type against the f32 input it was quantized from: the RMS error of our dequantization
/// of ggml's blocks, relative to the row's RMS, within a per-type bound (roughly the type's
/// bits: 2-bit ~ 0.3, 4-bit ~ 0.1, 8-bit ~ 0.01).
#[test]
fn quantization_error_within_per_type_bounds() {
    let g = fixture();
    let k = Kernels::portable();
    let input: &[f32] = as_blocks(g.tensor_data(g.tensor("input").unwrap()));
    let cols = g.tensor("input").unwrap().shape[0] as usize;
    // Measured worst rows (the one with outliers): Q2_K 0.29, Q3_K 0.15, Q4_0 0.12, Q4_1 0.13,
    // IQ4_NL/XS 0.11, Q4_K 0.087, Q5_0 0.082, Q5_1 0.055, Q5_K 0.050, Q6_K 0.037, Q8_0 0.012,
    // BF16 0.0017, F16 0.0002; bounds leave ~25% headroom. The i-quants (a flat importance
    // matrix; their worst row is the one with outliers, which their grids fit badly): IQ2_XXS
    // 0.86, IQ2_XS 0.65, IQ2_S 0.66, IQ3_XXS 0.37, IQ3_S 0.29, IQ1_S 0.75, IQ1_M 0.62; MXFP4 0.149 (a power-of-two scale, no fitting).
    let bound = |t: DType| match t {
        DType::Q2K => 0.37,
        DType::Q3K => 0.19,
        DType::Q4_0 | DType::Q4_1 => 0.16,
        DType::IQ4NL | DType::IQ4XS => 0.14,
        DType::Q4K | DType::Q5_0 => 0.11,
        DType::Q5_1 | DType::Q5K => 0.07,
        DType::Q6K => 0.047,
        DType::Q8_0 => 0.016,
        DType::BF16 => 0.0025,
        DType::F16 => 0.0003,
        DType::IQ2XXS => 1.08,
        DType::IQ2XS => 0.81,
        DType::IQ2S => 0.83,
        DType::IQ3XXS => 0.47,
        DType::IQ3S => 0.37,
        DType::IQ1S => 0.94,
        DType::IQ1M => 0.78,
        DType::MXFP4 => 0.19,
        _ => unreachable!(),
    };
    for (name, t) in TYPES {
        let q = g.tensor_data(g.tensor(&format!("{name}.q")).unwrap());
        let mut y = vec![0f32; input.len()];
        (k.to_float(t).unwrap())(q, &mut y);
        for (r, (xr, yr)) in input.chunks(cols).zip(y.chunks(cols)).enumerate() {
            let rms = (xr.iter().map(|v| (v * v) as f64).sum::<f64>() / cols as f64).sqrt();
            let err = (xr.iter().zip(yr).map(|(a, b)| ((a - b) * (a - b)) as f64).sum::<f64>() / cols as f64).sqrt();
            assert!(err <= bound(t) * rms, "{name} row {r}: relative RMS error {:.4} above {}", err / rms, bound(t));
        }
    }
}

/// The 1- to 3-bit i-quants and MXFP4 against ggml-cpu's own `vec_dot` (an AVX2 build) on
/// rows of 4096 values: our activations (Q8_K; MXFP4's Q8_0) equal ggml's bytes, and the
/// lane-order dot (`matmul::lanes`, what every SIMD table computes) and the detected table's
/// dot and 4-row dot equal ggml's result bit for bit.
#[test]
fn iquant_dots_equal_ggml_avx2_bit_for_bit() {
    use corelm_kernels::matmul::lanes;
    use corelm_kernels::quant::iq::IqType;
    let g = fixture();
    let (fast, port) = (Kernels::detect(), Kernels::portable());
    let input: &[f32] = as_blocks(g.tensor_data(g.tensor("dot_x").unwrap()));
    let cols = g.tensor("dot_x").unwrap().shape[0] as usize;
    let mut checked = 0;
    for (name, t) in TYPES.into_iter().filter(|(n, _)| g.tensor(&format!("{n}.dot")).is_some()) {
        let q = g.tensor_data(g.tensor(&format!("{name}.dw")).unwrap());
        let act = g.tensor_data(g.tensor(&format!("{name}.act")).unwrap());
        let want: &[f32] = as_blocks(g.tensor_data(g.tensor(&format!("{name}.dot")).unwrap()));
        let (rb, ab) = (q.len() / want.len(), act.len() / want.len());
        let mut xq = vec![0u8; ab];
        for (r, &w) in want.iter().enumerate() {
            let vdt = port.ops(t).unwrap().vec_dot_type;
            port.from_float(vdt).unwrap()(&input[r * cols..(r + 1) * cols], &mut xq);
            assert_eq!(xq, &act[r * ab..(r + 1) * ab], "{name} row {r}: {vdt} activations differ from ggml's");
            let wr = &q[r * rb..(r + 1) * rb];
            let ours = match IqType::of(t) {
                Some(iq) => lanes::dot_iq_q8_k(iq, wr, &xq),
                None => lanes::dot_mxfp4_q8_0(wr, &xq),
            };
            assert_eq!(ours.to_bits(), w.to_bits(), "{name} row {r}: lane order {ours} vs ggml {w}");
            let ops = fast.ops(t).unwrap();
            let simd = (ops.vec_dot)(wr, &xq);
            assert_eq!(simd.to_bits(), w.to_bits(), "{name} row {r} ({}): {simd} vs ggml {w}", fast.isa());
            if let Some(dot4) = ops.vec_dot4 {
                let mut o = [0f32; 4];
                dot4(wr, [&xq, &xq, &xq, &xq], &mut o);
                assert!(o.iter().all(|v| v.to_bits() == w.to_bits()), "{name} row {r}: 4-row dot {o:?} vs ggml {w}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 32, "7 i-quants and MXFP4 × 4 rows");
}
