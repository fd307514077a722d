//! The sparse feed-forward kernels: every table's `axpy_row` equals `fma(h, to_float(row), y)`
//! computed element by element, and `axpy_f32` on the dequantized row, bit for bit.

mod common;
use common::{random_row, tables, Rng};
use corelm_kernels::sparse::{axpy_f32, axpy_row, NEURON_MAJOR_TYPES};
use corelm_kernels::{DType, Kernels};

#[test]
fn axpy_rows_equal_the_scalar_fma_of_dequantized_values() {
    let mut rng = Rng(23);
    let port = Kernels::portable();
    // Ragged tails for the f32 kernels, 32-blocks and K-quant super-blocks for the rows.
    for t in NEURON_MAJOR_TYPES.iter().copied().chain([DType::Q4K, DType::Q6K, DType::F16]) {
        let n = if t.block_size() == 256 { 512 } else { 896 };
        let row = random_row(t, n, &mut rng);
        let mut w = vec![0f32; n];
        (port.to_float(t).unwrap())(&row, &mut w);
        let y0: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
        let h = rng.f32() * 5.0;
        let want: Vec<u32> = y0.iter().zip(&w).map(|(&y, &w)| h.mul_add(w, y).to_bits()).collect();
        for k in tables() {
            let mut y = y0.clone();
            axpy_row(&k, t, &row, h, &mut y);
            assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "{} {t}", k.isa());
            for len in [n, n - 1, 13] {
                let mut y = y0[..len].to_vec();
                axpy_f32(&k, h, &w[..len], &mut y);
                assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want[..len], "{} f32 {len}", k.isa());
            }
        }
    }
}

#[test]
fn four_row_axpy_equals_four_single_rows() {
    let mut rng = Rng(29);
    for t in NEURON_MAJOR_TYPES {
        let n = 448;
        let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(t, n, &mut rng)).collect();
        let h = [rng.f32(), rng.f32() * 3.0, 0.0, -rng.f32()];
        let y0: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        for k in tables() {
            let mut want = y0.clone();
            for q in 0..4 {
                axpy_row(&k, t, &rows[q], h[q], &mut want);
            }
            let mut y = y0.clone();
            corelm_kernels::sparse::axpy_row4(&k, t, [&rows[0], &rows[1], &rows[2], &rows[3]], h, &mut y);
            assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{} {t}", k.isa());
        }
    }
}

/// Prefill's block kernel: for 1 to 8 token rows with a third of their activations zero, every
/// table's `down_block` equals `axpy_f32` run neuron by neuron over the firing ones, bit for bit.
#[test]
fn down_block_equals_axpy_neuron_by_neuron() {
    use corelm_kernels::sparse::{down_block, DOWN_COLS};
    let mut rng = Rng(31);
    let n_ff = 203;
    let w: Vec<f32> = (0..n_ff * DOWN_COLS).map(|_| rng.f32() * 2.0 - 1.0).collect();
    for tokens in 1..=8 {
        let h: Vec<Vec<f32>> = (0..tokens).map(|_| (0..n_ff).map(|_| if rng.f32() < 0.33 { 0.0 } else { rng.f32() * 4.0 - 2.0 }).collect()).collect();
        let y0: Vec<[f32; DOWN_COLS]> = (0..tokens).map(|_| std::array::from_fn(|_| rng.f32())).collect();
        let port = Kernels::portable();
        let mut want = y0.clone();
        for (hr, yr) in h.iter().zip(want.iter_mut()) {
            for (i, &hv) in hr.iter().enumerate() {
                if hv != 0.0 {
                    axpy_f32(&port, hv, &w[i * DOWN_COLS..(i + 1) * DOWN_COLS], yr);
                }
            }
        }
        let hs: Vec<&[f32]> = h.iter().map(|r| &r[..]).collect();
        for k in tables() {
            let mut y = y0.clone();
            down_block(&k, &hs, &w, &mut y);
            let bits = |v: &[[f32; DOWN_COLS]]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&want), "{} {tokens} tokens", k.isa());
        }
    }
}
