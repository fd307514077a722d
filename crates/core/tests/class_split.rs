//! SMEPilot's tile-level split, executed: a panel GEMM whose output a plan cut among worker
//! classes — each class's workers computing its range with that class's kernel level (on an SME
//! CPU the matrix unit's tiles and the vector cores' panel kernel; on x86 AVX-512 VNNI and
//! AVX2, or AVX2 and the portable twin) — writes every output once and gives the bits of one
//! class alone, cut by columns or by rows, with the workers' shares run one after another.

mod common;

use common::values;
use corelm_core::sched::matmul::{self, class_part, Mode, Operands, Path, WorkerClass};
use corelm_core::ClassSplit;
use corelm_kernels::matmul::gemm;
use corelm_kernels::quant::reference::quantizer;
use corelm_kernels::{row_bytes, DType, Isa, Kernels};


/// The levels this CPU runs, best first.
fn levels() -> Vec<Isa> {
    let mut v: Vec<Isa> = Isa::ALL.into_iter().filter(|&i| Kernels::for_isa(i).is_ok()).collect();
    v.reverse();
    v
}

/// Every output element is in exactly one worker's part, each part inside its class's range
/// and on whole units (8 columns, or 8 rows), for uneven class sizes and cuts.
#[test]
fn class_parts_cover_the_output_once() {
    let classes = [WorkerClass { isa: Isa::Portable, workers: 2 }, WorkerClass { isa: Isa::Portable, workers: 3 }];
    for (n_out, rows) in [(72usize, 40usize), (576, 13), (20, 100), (8, 8)] {
        for by_rows in [false, true] {
            let len = if by_rows { rows } else { n_out };
            for cut in [0, 8, len / 2 / 8 * 8, len] {
                let split = ClassSplit { by_rows, bounds: vec![0, cut, len] };
                let mut seen = vec![0u8; rows * n_out];
                for ith in 0..5 {
                    let (cols, rr, _) = class_part(&split, &classes, n_out, rows, ith, 5).expect("5 workers in the classes");
                    let class = usize::from(ith >= 2);
                    let (along, lo, hi) = if by_rows { (&rr, split.bounds[class], split.bounds[class + 1]) } else { (&cols, split.bounds[class], split.bounds[class + 1]) };
                    assert!(along.is_empty() || (along.start >= lo && along.end <= hi && (along.start - lo) % 8 == 0), "{n_out}×{rows} {by_rows} cut {cut}: worker {ith} {along:?}");
                    for r in rr.clone() {
                        for c in cols.clone() {
                            seen[r * n_out + c] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "{n_out}×{rows} by_rows {by_rows} cut {cut}");
            }
        }
        // Classes for another number of workers do not apply.
        assert!(class_part(&ClassSplit { by_rows: false, bounds: vec![0, 8, n_out] }, &classes, n_out, rows, 0, 4).is_none());
    }
}

#[test]
fn a_split_gemm_gives_the_bits_of_one_class() {
    let levels = levels();
    let best = Kernels::for_isa(levels[0]).unwrap();
    let mode = Mode { batch_invariant: false, panel_gemm: true };
    let mut checked = 0;
    for t in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q4K, DType::Q6K] {
        if !(gemm::simd(t, best.isa()) || best.isa() == Isa::Portable) {
            continue;
        }
        let k = if t.block_size() == 256 { 512 } else { 96 };
        let (n_out, rows) = (72, 40);
        let mut w = vec![0u8; n_out * row_bytes(t, k)];
        quantizer(t).unwrap()(&values(n_out * k, 7), &mut w);
        let vdt = best.ops(t).unwrap().vec_dot_type;
        let xrb = row_bytes(vdt, k);
        let mut x = vec![0u8; rows * xrb];
        for r in 0..rows {
            best.from_float(vdt).unwrap()(&values(k, 100 + r as u64), &mut x[r * xrb..(r + 1) * xrb]);
        }
        let mut scratch = matmul::MatmulScratch::new(k, k, rows, 1);
        let mut run = |split: Option<(&ClassSplit, &[WorkerClass])>, nth: usize| {
            let mut out = vec![f32::NAN; rows * n_out];
            let o = Operands { dtype: t, k, n_out, w: &w, il: None, x: &x, xrb, rows, xmap: None, out: out.as_mut_ptr(), ldo: n_out, split };
            assert_eq!(matmul::path(&best, t, false, true, rows, mode), Path::Panel);
            for ith in 0..nth {
                // SAFETY: out holds rows × n_out f32; the shares are disjoint and run one at a
                // time; every class's level runs on this CPU (`levels`).
                unsafe { matmul::run(&best, &o, mode, None, ith, nth, &mut scratch) };
            }
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let want = run(None, 1);
        for &other in &levels[1..] {
            for (a, b) in [(1, 1), (2, 1), (1, 2)] {
                let classes = [WorkerClass { isa: best.isa(), workers: a }, WorkerClass { isa: other, workers: b }];
                for split in [
                    ClassSplit { by_rows: false, bounds: vec![0, 40, n_out] },
                    ClassSplit { by_rows: false, bounds: vec![0, 0, n_out] },
                    ClassSplit { by_rows: true, bounds: vec![0, 24, rows] },
                ] {
                    let got = run(Some((&split, &classes)), a + b);
                    assert!(got == want, "{t}: {} × {a} and {} × {b}, {split:?}", best.isa().name(), other.name());
                }
            }
            checked += 1;
        }
    }
    eprintln!("levels {levels:?}: {checked} (type, second class) pairs checked");
    assert!(levels.len() < 2 || checked > 0);
}
