//! Every accelerator GEMV and tiled GEMM against the file's dequantized values (exact sums, the bound of
//! `gemv_bound`) and against the CPU's own kernel (which quantizes the activations to 8 bits
//! first, so within that quantization's error as well). Runs on whatever device `Gpu::open`
//! finds: in CI Mesa's lavapipe.

use corelm_accel::{gemv_bound, Gpu, Matrix};
use corelm_kernels::{quant::reference::quantizer, DType, Kernels};
use rand::{Rng, SeedableRng};

/// `rows × cols` values of `t` from `rng`: quantized from normal-ish floats, or for types
/// without a quantizer (Q5_K) random blocks with sane scales.
fn matrix(t: DType, rows: usize, cols: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<u8> {
    let rb = corelm_kernels::row_bytes(t, cols);
    let mut out = vec![0u8; rows * rb];
    match quantizer(t) {
        Some(q) => {
            let mut f = vec![0f32; cols];
            for row in out.chunks_exact_mut(rb) {
                for v in f.iter_mut() {
                    *v = (rng.random::<f32>() - 0.5) * 2.0 + (rng.random::<f32>() - 0.5);
                }
                q(&f, row);
            }
        }
        None => {
            assert_eq!(t, DType::Q5K);
            rng.fill(&mut out[..]);
            for b in out.chunks_exact_mut(t.type_size()) {
                b[0..2].copy_from_slice(&half::f16::from_f32(rng.random::<f32>() * 0.01).to_bits().to_le_bytes());
                b[2..4].copy_from_slice(&half::f16::from_f32(rng.random::<f32>() * 0.01).to_bits().to_le_bytes());
            }
        }
    }
    out
}

#[test]
fn gemv_matches_the_file_values_and_the_cpu_kernel() {
    let gpu = Gpu::open().expect("an accelerator (CI: Mesa lavapipe, apt mesa-vulkan-drivers)");
    eprintln!("device: {}", gpu.name());
    let cpu = Kernels::detect();
    let portable = Kernels::portable();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let types = [DType::F32, DType::F16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q5K, DType::Q6K];
    // Odd row counts (not whole 8-row workgroups), one row length of a single K-quant
    // super-block, one token and 11 (two 8-token workgroups, the second holding 3); and 70
    // tokens, the tiled GEMM's batch (two 64-token tiles, the second holding 6; 70 rows: a
    // whole 64-row tile and 6).
    const { assert!(70 >= corelm_accel::GEMM_MIN_TOKENS) };
    for (t, rows, cols, n_tok) in types.iter().flat_map(|&t| [(t, 37, 256, 1), (t, 70, 1024, 11), (t, 70, 512, 70)]) {
        let w = matrix(t, rows, cols, &mut rng);
        let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
        let m = Matrix::upload(&gpu, "w", t, rows, cols, &w).unwrap();
        let mut y = vec![0f32; n_tok * rows];
        m.gemv(&gpu, &x, &mut y).unwrap();
        let rb = corelm_kernels::row_bytes(t, cols);
        let to_float = portable.to_float(t).unwrap();
        let ops = cpu.ops(t).unwrap();
        let mut wf = vec![0f32; cols];
        let mut xq = vec![0u8; corelm_kernels::row_bytes(ops.vec_dot_type, cols)];
        let from_float = cpu.from_float(ops.vec_dot_type).unwrap();
        for tok in 0..n_tok {
            let xr = &x[tok * cols..(tok + 1) * cols];
            from_float(xr, &mut xq);
            // The CPU kernel's error from quantizing x: at most half a step of each block.
            let bs = ops.vec_dot_type.block_size();
            for r in 0..rows {
                let row = &w[r * rb..(r + 1) * rb];
                to_float(row, &mut wf);
                let exact: f64 = wf.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                let sum_abs: f64 = wf.iter().zip(xr).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let got = y[tok * rows + r] as f64;
                let bound = gemv_bound(cols, sum_abs) + 1e-30;
                assert!((got - exact).abs() <= bound, "{t} row {r} token {tok}: gpu {got} exact {exact} bound {bound}");
                let c = (ops.vec_dot)(row, &xq);
                let xerr: f64 = wf
                    .chunks(bs)
                    .zip(xr.chunks(bs))
                    .map(|(wb, xb)| {
                        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                        wb.iter().map(|v| v.abs() as f64).sum::<f64>() * amax / 254.0
                    })
                    .sum();
                let cpu_bound = xerr * 1.01 + 2.0 * bound + 1e-6 * sum_abs;
                assert!((got - c as f64).abs() <= cpu_bound, "{t} row {r}: gpu {got} cpu {c} bound {cpu_bound}");
            }
        }
    }
}

/// `SplitMatrices` (the device's rows of split matmuls): the first rows of each matrix, any
/// number of them per product, give what `Matrix::gemv` gives for those rows, value for value
/// (the same shader and sums), products of different matrices and batch sizes one after the
/// other through the shared buffers; a simulated loss fails one read back only.
#[test]
fn split_matrices_give_the_first_rows_of_the_gemv() {
    use corelm_accel::{FileMatrix, SplitMatrices};
    let gpu = std::sync::Arc::new(Gpu::open().expect("an accelerator (CI: Mesa lavapipe, apt mesa-vulkan-drivers)"));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let shapes = [(DType::Q4_1, 64, 256), (DType::Q8_0, 40, 512), (DType::Q6K, 24, 256)];
    let bytes: Vec<Vec<u8>> = shapes.iter().map(|&(t, rows, cols)| matrix(t, rows, cols, &mut rng)).collect();
    // The device holds 48, 40 and 12 rows of them.
    let held = [48, 40, 12];
    let mats: Vec<FileMatrix> = shapes.iter().zip(&bytes).zip(held).map(|((&(dtype, _, cols), b), rows)| FileMatrix { dtype, rows, cols, bytes: b }).collect();
    let split = SplitMatrices::new(gpu.clone(), &mats, 5).unwrap();
    assert_eq!((split.len(), split.rows(0), split.rows(2)), (3, 48, 12));
    for (i, rows, n_tok) in [(0, 48, 5), (1, 8, 1), (0, 20, 3), (2, 12, 2), (1, 40, 5)] {
        let (t, _, cols) = shapes[i];
        let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
        let m = Matrix::upload(&gpu, "w", t, rows, cols, &bytes[i][..rows * corelm_kernels::row_bytes(t, cols)]).unwrap();
        let mut want = vec![0f32; n_tok * rows];
        m.gemv(&gpu, &x, &mut want).unwrap();
        let mut got = vec![f32::NAN; n_tok * rows];
        split.begin(i, &x, rows);
        split.wait(i, &mut got).unwrap();
        assert_eq!(got, want, "matrix {i}: {rows} rows × {n_tok} tokens");
    }
    let x = vec![0.5f32; 256];
    split.simulate_device_loss();
    split.begin(2, &x, 12);
    assert!(split.wait(2, &mut [0f32; 12]).is_err());
    split.begin(2, &x, 12);
    assert!(split.wait(2, &mut [0f32; 12]).is_ok());
}

/// A product onto its output (`gemv_onto`: the device layers' residual added where it is
/// made, instead of an add of its own) and one with a bias (`gemv_bias`: Q's, K's and V's):
/// each output is the old value plus the plain product's, or the plain product's plus its
/// row's bias, bit for bit, through the GEMV (3 tokens) and the tiled GEMM (40). And a product
/// into its columns of a wider row (`gemv_at`, as Q, K and V share one buffer): the plain
/// product's bits there, nothing else written.
#[test]
fn products_add_a_residual_or_a_bias_as_the_adds_did() {
    let gpu = Gpu::open().expect("an accelerator (CI: Mesa lavapipe, apt mesa-vulkan-drivers)");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    const { assert!(40 >= corelm_accel::GEMM_MIN_TOKENS && 3 < corelm_accel::GEMM_MIN_TOKENS) };
    for (t, rows, cols, n_tok) in [(DType::Q4_1, 70, 256, 3), (DType::Q4_1, 70, 256, 40), (DType::Q6K, 24, 512, 40)] {
        let w = matrix(t, rows, cols, &mut rng);
        let m = Matrix::upload(&gpu, "w", t, rows, cols, &w).unwrap();
        let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
        let y0: Vec<f32> = (0..n_tok * rows).map(|_| rng.random::<f32>() * 8.0 - 4.0).collect();
        let mut plain = vec![0f32; n_tok * rows];
        m.gemv(&gpu, &x, &mut plain).unwrap();
        let mut got = y0.clone();
        m.gemv_onto(&gpu, &x, &mut got).unwrap();
        let want: Vec<u32> = y0.iter().zip(&plain).map(|(a, b)| (a + b).to_bits()).collect();
        assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().copied()), "{t}: {rows} rows × {n_tok} tokens onto y");
        let bias = &y0[..rows];
        let mut got = vec![f32::NAN; n_tok * rows];
        m.gemv_bias(&gpu, &x, bias, &mut got).unwrap();
        let want: Vec<u32> = plain.iter().enumerate().map(|(i, p)| (p + bias[i % rows]).to_bits()).collect();
        assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().copied()), "{t}: {rows} rows × {n_tok} tokens with a bias");
        // Into columns 9 .. 9 + rows of rows of rows + 13 values (Q, K and V's shared buffer):
        // the plain product's bits there, the other columns as they were.
        let stride = rows + 13;
        let before: Vec<f32> = (0..n_tok * stride).map(|i| i as f32).collect();
        let mut got = before.clone();
        m.gemv_at(&gpu, &x, &mut got, stride, 9).unwrap();
        for (i, (&g, &b)) in got.iter().zip(&before).enumerate() {
            let (tok, c) = (i / stride, i % stride);
            let want = if (9..9 + rows).contains(&c) { plain[tok * rows + c - 9] } else { b };
            assert_eq!(g.to_bits(), want.to_bits(), "{t}: {rows} rows × {n_tok} tokens at column 9 of {stride}: token {tok}, column {c}");
        }
    }
}

/// The accelerator as a roofline target (`corelm profile --accel`): every figure measured and
/// positive, the round trip under a second.
#[test]
fn the_device_profile_has_every_figure() {
    let gpu = Gpu::open().expect("an accelerator (CI: Mesa lavapipe, apt mesa-vulkan-drivers)");
    let d = corelm_accel::probe::measure(&gpu, 0.002).unwrap();
    let families: Vec<&str> = d.ceilings.iter().map(|c| c.0).collect();
    assert_eq!(families, ["int8_dot", "f16_fma", "f32_fma"]);
    assert!(d.ceilings.iter().all(|c| c.2 > 0.0 && c.2.is_finite()), "{d:?}");
    assert!(d.read_gbps > 0.0 && d.link_gbps > 0.0 && d.round_trip_us > 0.0 && d.round_trip_us < 1e6, "{d:?}");
    assert_eq!(d.software, gpu.is_software());
    assert!(corelm_accel::probe::int8_for(&gpu, 0.002).unwrap() > 0.0);
}

/// A product that RMS-norms its input as it reads it (`gemv_normed`: the device layers' Q, K,
/// V and gate and up products at decode, the norms' dispatches saved): against the exact sum
/// over x · scale · w computed here in f64, within the product's bound plus 8 units in the last
/// place (the scale's sum, square root and division; two products per value), for 3 tokens and
/// 11 (a second workgroup of tokens from token 8), rows of 608 values (not whole 64s).
#[test]
fn products_read_their_input_rms_normed() {
    let gpu = Gpu::open().expect("an accelerator (CI: Mesa lavapipe, apt mesa-vulkan-drivers)");
    let portable = Kernels::portable();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
    let (t, rows, eps) = (DType::Q8_0, 21, 1e-5f32);
    for (cols, n_tok) in [(608, 3), (576, 11)] {
        let w = matrix(t, rows, cols, &mut rng);
        let m = Matrix::upload(&gpu, "wq", t, rows, cols, &w).unwrap();
        let rb = corelm_kernels::row_bytes(t, cols);
        let mut wf = vec![0f32; cols];
        let norm: Vec<f32> = (0..cols).map(|_| rng.random::<f32>() * 2.0).collect();
        let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.random::<f32>() * 6.0 - 3.0).collect();
        let mut y = vec![f32::NAN; n_tok * rows];
        m.gemv_normed(&gpu, &x, &norm, eps, &mut y).unwrap();
        for tok in 0..n_tok {
            let xr = &x[tok * cols..(tok + 1) * cols];
            let mean = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
            let scale = 1.0 / (mean + eps as f64).sqrt();
            let xn: Vec<f64> = xr.iter().zip(&norm).map(|(&v, &g)| v as f64 * scale * g as f64).collect();
            for r in 0..rows {
                portable.to_float(t).unwrap()(&w[r * rb..(r + 1) * rb], &mut wf);
                let exact: f64 = wf.iter().zip(&xn).map(|(&a, &b)| a as f64 * b).sum();
                let sum_abs: f64 = wf.iter().zip(&xn).map(|(&a, &b)| (a as f64 * b).abs()).sum();
                let bound = gemv_bound(cols, sum_abs) + 8.0 * f64::from(f32::EPSILON) * sum_abs + 1e-30;
                let got = y[tok * rows + r] as f64;
                assert!((got - exact).abs() <= bound, "{cols} columns, {n_tok} tokens, row {r} token {tok}: gpu {got} exact {exact} bound {bound}");
            }
        }
    }
}

/// A one-token product (the copy of the GEMV compiled for one token, the decode steps) gives
/// bit for bit what the same token gets in a batch of 11, for every type, read plain and RMS
/// normed: the same lanes and the same order of sums, so a token's outputs do not depend on
/// its batch (what `--batch-invariant` keeps). Rows of 1,056 values: four-group steps and a
/// remainder.
#[test]
fn one_token_products_equal_their_row_in_a_batch() {
    let gpu = Gpu::open().expect("an accelerator (CI: Mesa lavapipe, apt mesa-vulkan-drivers)");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
    let types = [DType::F32, DType::F16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q5K, DType::Q6K];
    let (rows, n_tok, eps) = (19, 11, 1e-5f32);
    for t in types {
        let cols = if matches!(t, DType::Q4K | DType::Q5K | DType::Q6K) { 1280 } else { 1056 };
        let w = matrix(t, rows, cols, &mut rng);
        let m = Matrix::upload(&gpu, "w", t, rows, cols, &w).unwrap();
        let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
        let norm: Vec<f32> = (0..cols).map(|_| rng.random::<f32>() * 2.0).collect();
        for normed in [false, true] {
            let product = |x: &[f32], y: &mut [f32]| if normed { m.gemv_normed(&gpu, x, &norm, eps, y) } else { m.gemv(&gpu, x, y) };
            let mut batch = vec![f32::NAN; n_tok * rows];
            product(&x, &mut batch).unwrap();
            for tok in [0, 3, 10] {
                let mut one = vec![f32::NAN; rows];
                product(&x[tok * cols..(tok + 1) * cols], &mut one).unwrap();
                let same = one.iter().zip(&batch[tok * rows..(tok + 1) * rows]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{t}, normed {normed}: token {tok} alone differs from its row in the batch");
            }
        }
    }
}
