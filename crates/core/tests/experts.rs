//! The grouped expert matmul (`sched::experts`) runs each routed expert as an ordinary matmul
//! over its pairs' rows, written in position order: every output equals, bit for bit, the
//! dense matmul of that expert's rows over the same activation rows (and so, batch-invariant,
//! `vec_dot` of the one row), on every table this CPU runs, on plain rows and on the copy
//! interleaved at load, per-token and per-pair inputs, experts no token chose skipped, with
//! 1–3 workers' shares run one after another.

mod common;

use common::values;
use corelm_core::moe::{route, Route};
use corelm_core::sched::experts::Experts;
use corelm_core::sched::matmul::{self, Mode, Operands, WorkerClass};
use corelm_core::tensor::{ClassSplit, MoeGating, MoeParams};
use corelm_kernels::matmul::gemm;
use corelm_kernels::quant::reference::quantizer;
use corelm_kernels::{row_bytes, DType, Isa, Kernels};

const N_EXPERT: usize = 6;
const N_OUT: usize = 24;

/// A routing table for `n_tokens` tokens whose logits never pick expert 5 (so one expert is
/// skipped) and favour expert 0 (so one has many pairs).
fn table(n_tokens: usize, p: MoeParams) -> Vec<i32> {
    let mut logits = values(n_tokens * N_EXPERT, 33 + n_tokens as u64);
    for t in 0..n_tokens {
        logits[t * N_EXPERT] += 0.8;
        logits[t * N_EXPERT + 5] = -30.0;
    }
    let mut tab = vec![0; Route::len(n_tokens, p)];
    route(&logits, n_tokens, p, &mut tab);
    tab
}

/// The dense matmul of `rows` contiguous activation rows over one expert's weight rows, as
/// bits, one worker.
#[allow(clippy::too_many_arguments)]
fn dense(kernels: &Kernels, t: DType, w: &[u8], il: Option<&[u8]>, k: usize, x: &[u8], xrb: usize, rows: usize, mode: Mode) -> Vec<u32> {
    let mut out = vec![f32::NAN; rows * N_OUT];
    let o = Operands { dtype: t, k, n_out: N_OUT, w, il, x, xrb, rows, xmap: None, out: out.as_mut_ptr(), ldo: N_OUT, split: None };
    let mut s = matmul::MatmulScratch::new(k, k, rows, 1);
    // SAFETY: out holds rows × N_OUT f32; one worker.
    unsafe { matmul::run(kernels, &o, mode, None, 0, 1, &mut s) };
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn each_expert_is_the_dense_matmul_of_its_rows() {
    let p = MoeParams { n_expert: N_EXPERT, n_used: 2, norm_w: true, w_scale: 1.0, gating: MoeGating::Softmax };
    let mut checked = 0;
    for kernels in Isa::ALL.into_iter().filter_map(|i| Kernels::for_isa(i).ok()) {
        for t in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q4K, DType::Q6K, DType::F16] {
            let k = if t.block_size() == 256 { 256 } else { 96 };
            let wrb = row_bytes(t, k);
            let mut w = vec![0u8; N_EXPERT * N_OUT * wrb];
            quantizer(t).unwrap()(&values(N_EXPERT * N_OUT * k, 7), &mut w);
            let ops = kernels.ops(t).unwrap();
            let il = ops.interleaved.is_some().then(|| {
                let mut g = vec![0u8; w.len()];
                kernels.layout().pack(t, &w, wrb, &mut g);
                g
            });
            let vdt = ops.vec_dot_type;
            let xrb = row_bytes(vdt, k);
            for n_tokens in [1usize, 3, 13] {
                let tab = table(n_tokens, p);
                let n_pairs = n_tokens * p.n_used;
                assert_eq!(Route::positions_of(&tab, n_pairs, 5).len(), 0, "expert 5 chosen");
                for per_pair in [false, true] {
                    let n_x = if per_pair { n_pairs } else { n_tokens };
                    let mut x = vec![0u8; n_x * xrb];
                    for r in 0..n_x {
                        kernels.from_float(vdt).unwrap()(&values(k, 100 + r as u64), &mut x[r * xrb..(r + 1) * xrb]);
                    }
                    for copy in [None, il.as_deref()] {
                        for batch_invariant in [false, true] {
                            let mode = Mode { batch_invariant, panel_gemm: false };
                            // Expected: per expert, the dense matmul of its rows gathered.
                            let mut want = vec![0u32; n_pairs * N_OUT];
                            for e in 0..N_EXPERT {
                                let at = Route::positions_of(&tab, n_pairs, e);
                                let rows: Vec<u8> = Route::pairs_of(&tab, n_pairs, e)
                                    .iter()
                                    .zip(at.clone())
                                    .flat_map(|(&pair, pos)| {
                                        let r = if per_pair { pos } else { pair as usize / p.n_used };
                                        x[r * xrb..(r + 1) * xrb].to_vec()
                                    })
                                    .collect();
                                let span = e * N_OUT * wrb..(e + 1) * N_OUT * wrb;
                                let d = dense(&kernels, t, &w[span.clone()], copy.map(|g| &g[span]), k, &rows, xrb, at.len(), mode);
                                want[at.start * N_OUT..at.end * N_OUT].copy_from_slice(&d);
                                // Batch-invariant: each row as `vec_dot` gives it alone.
                                for (i, pos) in at.clone().enumerate() {
                                    for c in (0..N_OUT).filter(|_| batch_invariant) {
                                        let wr = &w[(e * N_OUT + c) * wrb..(e * N_OUT + c + 1) * wrb];
                                        let v = (ops.vec_dot)(wr, &rows[i * xrb..(i + 1) * xrb]);
                                        assert_eq!(want[pos * N_OUT + c], v.to_bits(), "{} {t:?}: vec_dot", kernels.isa());
                                    }
                                }
                            }
                            for nth in 1..=3 {
                                let mut out = vec![f32::NAN; n_pairs * N_OUT];
                                let m = Experts { dtype: t, k, plain: &w, il: copy, x: &x, xrb, per_pair, table: &tab, p, experts: 0..N_EXPERT, cuts: &[], classes: &[] };
                                let mut s = matmul::MatmulScratch::new(k, k, n_pairs, 1);
                                for ith in 0..nth {
                                    // SAFETY: out is [pairs][N_OUT] f32; shares disjoint, run in turn.
                                    unsafe { m.run(&kernels, mode, None, out.as_mut_ptr(), ith, nth, &mut s) };
                                }
                                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                                assert!(
                                    got == want,
                                    "{} {t:?} tokens {n_tokens} per_pair {per_pair} interleaved {} invariant {batch_invariant} workers {nth}",
                                    kernels.isa(),
                                    copy.is_some()
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked >= 7 * 3 * 2 * 2 * 3, "{checked} cases");
}

/// A shard's experts (tensor parallelism): the weights hold only `e0..e1`, every other
/// expert's positions are left alone, and the shard's rows equal the whole run's.
#[test]
fn a_shard_computes_only_its_experts() {
    let p = MoeParams { n_expert: N_EXPERT, n_used: 2, norm_w: false, w_scale: 1.0, gating: MoeGating::Softmax };
    let kernels = Kernels::for_isa(Isa::Portable).unwrap();
    let t = DType::Q8_0;
    let k = 64;
    let wrb = row_bytes(t, k);
    let mut w = vec![0u8; N_EXPERT * N_OUT * wrb];
    quantizer(t).unwrap()(&values(N_EXPERT * N_OUT * k, 9), &mut w);
    let xrb = row_bytes(DType::Q8_0, k);
    let n_tokens = 9;
    let mut x = vec![0u8; n_tokens * xrb];
    for r in 0..n_tokens {
        kernels.from_float(DType::Q8_0).unwrap()(&values(k, 50 + r as u64), &mut x[r * xrb..(r + 1) * xrb]);
    }
    let tab = table(n_tokens, p);
    let n_pairs = n_tokens * p.n_used;
    let mode = Mode::default();
    let run = |experts: std::ops::Range<usize>| {
        let plain = &w[experts.start * N_OUT * wrb..experts.end * N_OUT * wrb];
        let mut out = vec![f32::NAN; n_pairs * N_OUT];
        let m = Experts { dtype: t, k, plain, il: None, x: &x, xrb, per_pair: false, table: &tab, p, experts, cuts: &[], classes: &[] };
        let mut s = matmul::MatmulScratch::new(k, k, n_pairs, 1);
        // SAFETY: out is [pairs][N_OUT] f32; one worker.
        unsafe { m.run(&kernels, mode, None, out.as_mut_ptr(), 0, 1, &mut s) };
        out
    };
    let all = run(0..N_EXPERT);
    let shard = run(2..4);
    for e in 0..N_EXPERT {
        for pos in Route::positions_of(&tab, n_pairs, e) {
            let (a, b) = (&all[pos * N_OUT..(pos + 1) * N_OUT], &shard[pos * N_OUT..(pos + 1) * N_OUT]);
            if (2..4).contains(&e) {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "expert {e}");
            } else {
                assert!(b.iter().all(|v| v.is_nan()), "expert {e} written by the shard of 2..4");
            }
        }
    }
}

/// A plan's expert rule, executed (`--matrix-workers`): under `--fast-prefill` experts routed
/// 8 pairs or more run as a panel GEMM (their rows gathered in order), cut among two worker
/// classes of different kernel levels where the rule says; the bits are the uncut panel
/// GEMM's of the expert's rows (not the tiles'), whatever the cut.
#[test]
fn experts_cut_by_routed_pairs_give_the_panel_bits() {
    let levels: Vec<Isa> = Isa::ALL.into_iter().rev().filter(|&i| Kernels::for_isa(i).is_ok()).collect();
    let best = Kernels::for_isa(levels[0]).unwrap();
    let p = MoeParams { n_expert: N_EXPERT, n_used: 2, norm_w: true, w_scale: 1.0, gating: MoeGating::Softmax };
    let mode = Mode { batch_invariant: false, panel_gemm: true };
    let n_tokens = 29;
    let tab = table(n_tokens, p);
    let n_pairs = n_tokens * p.n_used;
    assert!((0..N_EXPERT).any(|e| Route::positions_of(&tab, n_pairs, e).len() >= 8), "no expert with 8 pairs");
    let mut checked = 0;
    for t in [DType::Q4_0, DType::Q8_0, DType::Q4K] {
        if !(gemm::simd(t, best.isa()) || best.isa() == Isa::Portable) {
            continue;
        }
        let k = if t.block_size() == 256 { 256 } else { 96 };
        let wrb = row_bytes(t, k);
        let mut w = vec![0u8; N_EXPERT * N_OUT * wrb];
        quantizer(t).unwrap()(&values(N_EXPERT * N_OUT * k, 7), &mut w);
        let vdt = best.ops(t).unwrap().vec_dot_type;
        let xrb = row_bytes(vdt, k);
        let mut x = vec![0u8; n_tokens * xrb];
        for r in 0..n_tokens {
            best.from_float(vdt).unwrap()(&values(k, 100 + r as u64), &mut x[r * xrb..(r + 1) * xrb]);
        }
        // Expected: each expert's rows gathered, the uncut matmul (the panel from 8 rows).
        let mut want = vec![0u32; n_pairs * N_OUT];
        for e in 0..N_EXPERT {
            let at = Route::positions_of(&tab, n_pairs, e);
            let rows: Vec<u8> = Route::pairs_of(&tab, n_pairs, e).iter().flat_map(|&pair| x[pair as usize / 2 * xrb..(pair as usize / 2 + 1) * xrb].to_vec()).collect();
            let d = dense(&best, t, &w[e * N_OUT * wrb..(e + 1) * N_OUT * wrb], None, k, &rows, xrb, at.len(), mode);
            want[at.start * N_OUT..at.end * N_OUT].copy_from_slice(&d);
        }
        let run_mode = |cuts: &[(usize, ClassSplit)], classes: &[WorkerClass], mode: Mode| {
            let nth = classes.iter().map(|c| c.workers).sum::<usize>().max(1);
            let mut out = vec![f32::NAN; n_pairs * N_OUT];
            let m = Experts { dtype: t, k, plain: &w, il: None, x: &x, xrb, per_pair: false, table: &tab, p, experts: 0..N_EXPERT, cuts, classes };
            let mut s = matmul::MatmulScratch::new(k, k, n_pairs, 1).with_gather(n_tokens * xrb);
            for ith in 0..nth {
                // SAFETY: out is [pairs][N_OUT] f32; shares disjoint, run in turn; every
                // class's level runs on this CPU.
                unsafe { m.run(&best, mode, None, out.as_mut_ptr(), ith, nth, &mut s) };
            }
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let run = |cuts: &[(usize, ClassSplit)], classes: &[WorkerClass]| run_mode(cuts, classes, mode);
        assert!(run(&[], &[]) == want, "{t}: the panel without a rule");
        assert!(run_mode(&[], &[], Mode::default()) != want, "{t}: the panel's bits are not the tiles'");
        for &other in &levels[1..] {
            for (a, b) in [(1, 1), (1, 2)] {
                let classes = [WorkerClass { isa: best.isa(), workers: a }, WorkerClass { isa: other, workers: b }];
                // Up to 7 pairs every column to the second class; from 8 a cut at 8 columns.
                let cuts = [(1, ClassSplit { by_rows: false, bounds: vec![0, 0, N_OUT] }), (8, ClassSplit { by_rows: false, bounds: vec![0, 8, N_OUT] })];
                assert!(run(&cuts, &classes) == want, "{t}: {} × {a} and {} × {b}", best.isa().name(), other.name());
                checked += 1;
            }
        }
    }
    assert!(levels.len() < 2 || checked > 0);
}
