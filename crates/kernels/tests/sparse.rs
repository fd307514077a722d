//! The sparse feed-forward kernels: every table's `axpy_row` equals `fma(h, to_float(row), y)`
//! computed element by element, and `axpy_f32` on the dequantized row, bit for bit; decode's
//! panel kernel and prefill's block kernel equal them neuron by neuron.

mod common;
use common::{random_row, tables, Rng};
use corelm_kernels::sparse::{axpy_f32, axpy_panel, axpy_row, Panels, NEURON_MAJOR_TYPES, PANEL_BLOCKS};
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

/// The panel layout places every (neuron, block) once, inside the copy, and keeps each
/// neuron's blocks of a panel together in order.
#[test]
fn panels_cover_the_copy_once() {
    for (neurons, blocks) in [(37, 7), (8, 28), (3, 1), (5, 18)] {
        let p = Panels { neurons, blocks, type_size: 34 };
        let mut seen = vec![false; neurons * blocks];
        for i in 0..neurons {
            for b in 0..blocks {
                let at = p.at(i, b);
                assert_eq!(at % 34, 0);
                assert!(!std::mem::replace(&mut seen[at / 34], true), "{neurons}x{blocks}: ({i}, {b}) shares its place");
                if b % PANEL_BLOCKS > 0 {
                    assert_eq!(at, p.at(i, b - 1) + 34, "a neuron's blocks of a panel are contiguous");
                }
            }
        }
        assert!(seen.into_iter().all(|s| s));
    }
}

/// Decode's panel kernel: for every type and table, over whole panels, single blocks of a
/// panel and the narrow last panel, `axpy_panel` equals `axpy_row` run neuron by neuron over
/// the firing neurons, bit for bit.
#[test]
fn panel_axpy_equals_rows_neuron_by_neuron() {
    let mut rng = Rng(29);
    let (n_ff, blocks) = (53, 7);
    let port = Kernels::portable();
    for t in NEURON_MAJOR_TYPES {
        let ts = t.type_size();
        let rows: Vec<u8> = (0..n_ff).flat_map(|_| random_row(t, 32 * blocks, &mut rng)).collect();
        let p = Panels { neurons: n_ff, blocks, type_size: ts };
        let mut packed = vec![0u8; p.len()];
        p.pack(&rows, &mut packed);
        let h: Vec<f32> = (0..n_ff).map(|_| if rng.f32() < 0.4 { 0.0 } else { rng.f32() * 4.0 - 2.0 }).collect();
        let firing: Vec<u32> = (0..n_ff as u32).filter(|&i| h[i as usize] != 0.0).collect();
        let y0: Vec<f32> = (0..32 * blocks).map(|_| rng.f32()).collect();
        // (first block, blocks): every panel whole, then each block alone.
        let pieces = (0..blocks.div_ceil(PANEL_BLOCKS)).map(|q| (q * PANEL_BLOCKS, p.width(q))).chain((0..blocks).map(|b| (b, 1)));
        for (b0, nb) in pieces {
            let cols = 32 * b0..32 * (b0 + nb);
            let mut want = y0[cols.clone()].to_vec();
            for &i in &firing {
                let row = &rows[i as usize * blocks * ts..][b0 * ts..(b0 + nb) * ts];
                axpy_row(&port, t, row, h[i as usize], &mut want);
            }
            for k in tables() {
                let mut y = y0[cols.clone()].to_vec();
                axpy_panel(&k, t, &packed[p.at(0, b0)..], p.stride(b0 / PANEL_BLOCKS), &firing, &h, &mut y);
                assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{} {t} blocks {b0}+{nb}", k.isa());
            }
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
