//! Tuned matmul schedules change speed, never bits: on the tiles over interleaved weights (the
//! default, llama.cpp's values) and on the panel GEMM, every register tile height, cache
//! blocking and thread grid gives the same outputs as the path's default schedule, for every
//! table this CPU runs, on ragged lengths, with the workers' shares run one after another.

mod common;

use common::values;
use corelm_core::sched::matmul::{self, Mode, Operands, Path, ScheduleEntry, Schedules};
use corelm_kernels::matmul::layout as interleave;
use corelm_kernels::matmul::schedule::{Schedule, PANEL_MR, TILE_MR};
use corelm_kernels::quant::reference::quantizer;
use corelm_kernels::{row_bytes, DType, Isa, Kernels};


fn tables() -> Vec<Kernels> {
    Isa::ALL.into_iter().filter_map(|i| Kernels::for_isa(i).ok()).collect()
}

/// Outputs of the matmul `x · Wᵀ` with `nth` workers' shares run in turn under `sched`.
#[allow(clippy::too_many_arguments)]
fn run(kernels: &Kernels, path: Path, t: DType, w: &[u8], g: Option<&[u8]>, k: usize, n_out: usize, x: &[u8], rows: usize, sched: Option<Schedule>, nth: usize) -> Vec<u32> {
    run_mode(kernels, path, t, w, g, k, n_out, x, rows, sched, nth, false)
}

/// [`run`], batch-invariant or not.
#[allow(clippy::too_many_arguments)]
fn run_mode(kernels: &Kernels, path: Path, t: DType, w: &[u8], g: Option<&[u8]>, k: usize, n_out: usize, x: &[u8], rows: usize, sched: Option<Schedule>, nth: usize, batch_invariant: bool) -> Vec<u32> {
    let mode = Mode { batch_invariant, panel_gemm: path == Path::Panel };
    let schedules = sched.map(|s| Schedules::new(vec![ScheduleEntry { path, dtype: t, k, n_out, rows: 1, sched: s, secs: 0.0 }]));
    let panels = schedules.as_ref().map_or(1, |s| s.max_panels());
    let mut scratch = matmul::MatmulScratch::new(k, k, rows, panels);
    let mut out = vec![f32::NAN; rows * n_out];
    let vdt = kernels.ops(t).unwrap().vec_dot_type;
    let o = Operands { dtype: t, k, n_out, w, il: g, x, xrb: row_bytes(vdt, k), rows, xmap: None, out: out.as_mut_ptr(), ldo: n_out, split: None };
    assert_eq!(matmul::path(kernels, t, o.il.is_some(), true, rows, mode), path);
    for ith in 0..nth {
        // SAFETY: out holds rows × n_out f32; the shares are disjoint and run one at a time.
        unsafe { matmul::run(kernels, &o, mode, schedules.as_ref(), ith, nth, &mut scratch) };
    }
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn schedules_keep_every_output_bit_for_bit() {
    let mut checked = 0;
    for kernels in tables() {
        for t in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q4K, DType::Q6K] {
            let k = if t.block_size() == 256 { 512 } else { 96 };
            let n_out = 72;
            let mut w = vec![0u8; n_out * row_bytes(t, k)];
            quantizer(t).unwrap()(&values(n_out * k, 7), &mut w);
            let vdt = kernels.ops(t).unwrap().vec_dot_type;
            for rows in [13usize, 40] {
                let mut x = vec![0u8; rows * row_bytes(vdt, k)];
                for r in 0..rows {
                    let xr = &mut x[r * row_bytes(vdt, k)..(r + 1) * row_bytes(vdt, k)];
                    kernels.from_float(vdt).unwrap()(&values(k, 100 + r as u64), xr);
                }
                let panel = corelm_kernels::matmul::gemm::simd(t, kernels.isa()) || kernels.isa() == Isa::Portable;
                if panel {
                    let want = run(&kernels, Path::Panel, t, &w, None, k, n_out, &x, rows, None, 2);
                    for mr in PANEL_MR {
                        for (nc, mc, kc, row_parts) in [(8, 0, 0, 0), (24, 8, 1, 2), (64, 16, 2, 1), (16, 0, 0, 3)] {
                            let s = Schedule { mr, nc, mc, kc, row_parts };
                            for nth in [1, 2, 3] {
                                assert!(run(&kernels, Path::Panel, t, &w, None, k, n_out, &x, rows, Some(s), nth) == want, "{} {t} rows {rows} panel {}", kernels.isa(), s.describe());
                            }
                        }
                    }
                    checked += 1;
                }
                if interleave::supported(t) && kernels.ops(t).unwrap().interleaved.is_some() {
                    let rb = row_bytes(t, k);
                    let mut g = vec![0u8; w.len()];
                    kernels.layout().pack(t, &w, rb, &mut g);
                    let want = run(&kernels, Path::Tiles, t, &w, Some(&g), k, n_out, &x, rows, None, 2);
                    for mr in TILE_MR {
                        for (nc, mc, row_parts) in [(4, 0, 0), (12, 8, 2), (256, 16, 1), (32, 0, 3)] {
                            let s = Schedule { mr, nc, mc, kc: 0, row_parts };
                            for nth in [1, 2, 3] {
                                assert!(run(&kernels, Path::Tiles, t, &w, Some(&g), k, n_out, &x, rows, Some(s), nth) == want, "{} {t} rows {rows} tiles {}", kernels.isa(), s.describe());
                            }
                        }
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 12, "{checked} (table, type, length) cases");
}

/// Short batches (a decode step of a few sequences): the rows the tiles leave run the GEMV
/// column block by column block, and each row's outputs are those of the row alone (decode's
/// GEMV over every column), for the rows past the last group of four, and for every row where
/// the tiles keep `vec_dot`'s order or the run is batch-invariant.
#[test]
fn rows_left_by_the_tiles_get_the_gemv_bits() {
    let mut checked = 0;
    for kernels in tables() {
        for t in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q4K, DType::Q6K] {
            if !interleave::supported(t) || kernels.ops(t).unwrap().interleaved.is_none() {
                continue;
            }
            let k = if t.block_size() == 256 { 512 } else { 96 };
            let n_out = 200;
            let (rb, vdt) = (row_bytes(t, k), kernels.ops(t).unwrap().vec_dot_type);
            let xrb = row_bytes(vdt, k);
            let mut w = vec![0u8; n_out * rb];
            quantizer(t).unwrap()(&values(n_out * k, 9), &mut w);
            let mut g = vec![0u8; w.len()];
            kernels.layout().pack(t, &w, rb, &mut g);
            let rows = 7;
            let mut x = vec![0u8; rows * xrb];
            for r in 0..rows {
                kernels.from_float(vdt).unwrap()(&values(k, 300 + r as u64), &mut x[r * xrb..(r + 1) * xrb]);
            }
            let alone: Vec<Vec<u32>> = (0..rows).map(|r| run(&kernels, Path::Tiles, t, &w, Some(&g), k, n_out, &x[r * xrb..(r + 1) * xrb], 1, None, 2)).collect();
            for n in [2, 3, 5, 6, 7] {
                for invariant in [false, true] {
                    for nth in [1, 2, 3] {
                        let out = run_mode(&kernels, Path::Tiles, t, &w, Some(&g), k, n_out, &x[..n * xrb], n, None, nth, invariant);
                        let gemv_rows = if invariant || !kernels.ops(t).unwrap().tile_order { 0 } else { n - n % 4 };
                        for (r, alone) in alone.iter().enumerate().take(n).skip(gemv_rows) {
                            assert!(out[r * n_out..(r + 1) * n_out] == alone[..], "{} {t} row {r} of {n}, {nth} workers, invariant {invariant}", kernels.isa());
                        }
                    }
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 4, "{checked} (table, type) cases");
}

#[test]
fn the_schedule_of_the_nearest_shorter_tuned_length_applies() {
    let at = |rows, mr| ScheduleEntry { path: Path::Tiles, dtype: DType::Q4_0, k: 64, n_out: 8, rows, sched: Schedule { mr, ..Schedule::TILE_DEFAULT }, secs: 0.0 };
    let s = Schedules::new(vec![at(64, 8), at(8, 4), ScheduleEntry { path: Path::Panel, ..at(8, 8) }]);
    let get = |rows| s.get(Path::Tiles, DType::Q4_0, 64, 8, rows).map(|s| s.mr);
    assert_eq!((get(2), get(8), get(63), get(64), get(512)), (Some(4), Some(4), Some(4), Some(8), Some(8)));
    assert_eq!(s.get(Path::Tiles, DType::Q4_0, 64, 16, 8), None);
    assert_eq!(s.get(Path::Panel, DType::Q4_0, 64, 8, 100).map(|s| s.mr), Some(8));
}

#[test]
fn fast_prefill_takes_the_path_the_plan_timed_faster_else_the_tables() {
    let (t, k, n_out) = (DType::Q4_0, 96, 72);
    let e = |path, rows, secs| ScheduleEntry { path, dtype: t, k, n_out, rows, sched: Schedule::TILE_DEFAULT, secs };
    // Tiles faster from 8 rows, the panel from 64; a length tuned on one path only, or without
    // times, decides nothing.
    let s = Schedules::new(vec![e(Path::Tiles, 8, 1.0), e(Path::Panel, 8, 2.0), e(Path::Tiles, 64, 3.0), e(Path::Panel, 64, 2.0)]);
    let tiles = Some(Path::Tiles);
    assert!(s.faster_path(t, k, n_out, 8) == tiles && s.faster_path(t, k, n_out, 63) == tiles);
    assert!(s.faster_path(t, k, n_out, 64) == Some(Path::Panel) && s.faster_path(t, k, n_out, 512) == Some(Path::Panel));
    assert_eq!(s.faster_path(t, k, 16, 8), None, "another matrix");
    assert_eq!(Schedules::new(vec![e(Path::Tiles, 8, 1.0)]).faster_path(t, k, n_out, 8), None);
    assert_eq!(Schedules::new(vec![e(Path::Tiles, 8, 0.0), e(Path::Panel, 8, 2.0)]).faster_path(t, k, n_out, 8), None);

    // Executed: under `--fast-prefill` a matrix whose tiles were timed faster gives the tiles'
    // bits, one whose panel was gives the panel's; untimed, its table decides (x86: the tiles
    // below `PANEL_OVER_TILES_ROWS` rows, the panel from there — AVX2 from
    // `PANEL_OVER_TILES_ROWS_AVX2`; for the types an x86 table packs from the interleaved
    // groups — Q8_0 too —, from `PANEL_OVER_TILES_ROWS_GROUPS`).
    let over = |isa, t, rows| matmul::panel_over_tiles(isa, t, rows);
    assert!(!over(Isa::Avx512, DType::IQ4NL, 16) && over(Isa::Avx512, DType::IQ4NL, 40) && over(Isa::Dotprod, DType::IQ4NL, 16));
    let avx2 = matmul::PANEL_OVER_TILES_ROWS_AVX2;
    assert!(avx2 < matmul::PANEL_OVER_TILES_ROWS && !over(Isa::Avx2, DType::Q5K, avx2 - 1) && over(Isa::Avx2, DType::Q5K, avx2) && over(Isa::Avx2, DType::Q5K, 40));
    // AVX2's Q5_0, Q4_K and Q6_K, decoded from the groups, from `GEMM_MIN_ROWS_NIBBLES` rows
    // as its Q4 types; AVX-512's Q4_K and Q6_K from `GEMM_MIN_ROWS`.
    let from = matmul::GEMM_MIN_ROWS_NIBBLES;
    for t in [DType::Q5_0, DType::Q4K, DType::Q6K, DType::Q8_0] {
        assert!(!over(Isa::Avx2, t, from - 1) && over(Isa::Avx2, t, from), "{t}");
    }
    assert!(!over(Isa::Avx512, DType::Q4K, matmul::GEMM_MIN_ROWS - 1) && over(Isa::Avx512, DType::Q4K, matmul::GEMM_MIN_ROWS));
    for isa in [Isa::Avx512, Isa::Avx2] {
        // The x86 tables' nibble types (Q4_0 here) from `GEMM_MIN_ROWS_NIBBLES`.
        let from = matmul::GEMM_MIN_ROWS_NIBBLES;
        assert!(over(isa, t, from) && !over(isa, t, from - 1));
        assert_eq!(matmul::gemm_min_rows(isa, t, true), from.min(matmul::GEMM_MIN_ROWS));
    }
    // Not the AVX-512 table's other grouped types, nor plain rows.
    assert!(!over(Isa::Avx512, DType::Q8_0, 7) && over(Isa::Avx512, DType::Q8_0, 8) && !over(Isa::Avx512, DType::Q6K, 7));
    assert_eq!(matmul::gemm_min_rows(Isa::Avx512, t, false), matmul::GEMM_MIN_ROWS);
    let mut w = vec![0u8; n_out * row_bytes(t, k)];
    quantizer(t).unwrap()(&values(n_out * k, 7), &mut w);
    let mut checked = 0;
    for kernels in tables() {
        let simd_panel = corelm_kernels::matmul::gemm::simd(t, kernels.isa());
        if !simd_panel || kernels.ops(t).unwrap().interleaved.is_none() {
            continue;
        }
        let mut g = vec![0u8; w.len()];
        kernels.layout().pack(t, &w, row_bytes(t, k), &mut g);
        // Below and above the rows from which x86 prefers the panel without a plan.
        for rows in [4, 16, 40] {
            // Four rows: the x86 tables' nibble types only (`gemm_min_rows`).
            if rows < matmul::gemm_min_rows(kernels.isa(), t, true) {
                continue;
            }
            let vdt = kernels.ops(t).unwrap().vec_dot_type;
            let xrb = row_bytes(vdt, k);
            let mut x = vec![0u8; rows * xrb];
            for r in 0..rows {
                kernels.from_float(vdt).unwrap()(&values(k, 100 + r as u64), &mut x[r * xrb..(r + 1) * xrb]);
            }
            let tiles = run(&kernels, Path::Tiles, t, &w, Some(&g), k, n_out, &x, rows, None, 2);
            // From the plain rows, or (below `GEMM_MIN_ROWS`) the groups: the same bytes.
            let panel = run(&kernels, Path::Panel, t, &w, (rows < matmul::GEMM_MIN_ROWS).then_some(&g[..]), k, n_out, &x, rows, None, 2);
            assert_ne!(tiles, panel, "{}: the two paths' float orders differ", kernels.isa());
            // Without a plan (or one that timed a single path), the table's rule.
            let default = if matmul::panel_over_tiles(kernels.isa(), t, rows) { &panel } else { &tiles };
            for (plan, want) in [
                (vec![e(Path::Tiles, 8, 1.0), e(Path::Panel, 8, 2.0)], &tiles),
                (vec![e(Path::Tiles, 8, 2.0), e(Path::Panel, 8, 1.0)], &panel),
                (vec![e(Path::Panel, 8, 1.0)], default),
                (vec![], default),
            ] {
                let schedules = Schedules::new(plan);
                let mut scratch = matmul::MatmulScratch::new(k, k, rows, schedules.max_panels());
                let mut out = vec![f32::NAN; rows * n_out];
                let o = Operands { dtype: t, k, n_out, w: &w, il: Some(&g), x: &x, xrb, rows, xmap: None, out: out.as_mut_ptr(), ldo: n_out, split: None };
                for ith in 0..2 {
                    // SAFETY: out holds rows × n_out f32; the shares are disjoint and run one at a time.
                    unsafe { matmul::run(&kernels, &o, Mode { batch_invariant: false, panel_gemm: true }, Some(&schedules), ith, 2, &mut scratch) };
                }
                assert!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>() == *want, "{}", kernels.isa());
            }
        }
        checked += 1;
    }
    // AVX2 and AVX-512 have both for Q4_0.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        assert!(checked > 0, "no table with both paths for Q4_0");
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = checked;
}

/// An x86 table decodes the panels of Q4_0, Q4_1 (and AVX-512's Q5_0, Q5_1, Q8_0, Q4_K, Q6_K)
/// from the interleaved groups (`gemm::Weights::Groups`; all a tensor-parallel column slice
/// has) into the bytes the plain rows give: the same outputs, bit for bit, for several row and worker counts and a last
/// panel of four columns.
#[test]
fn panels_from_interleaved_groups_equal_panels_from_rows() {
    for kernels in tables() {
        for t in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q6K] {
            if !corelm_kernels::matmul::gemm::packs_groups(t, kernels.isa()) {
                continue;
            }
            let (k, n_out) = (if t.block_size() == 256 { 512 } else { 96 }, 76);
            let mut w = vec![0u8; n_out * row_bytes(t, k)];
            quantizer(t).unwrap()(&values(n_out * k, 11), &mut w);
            let mut g = vec![0u8; w.len()];
            kernels.layout().pack(t, &w, row_bytes(t, k), &mut g);
            let vdt = kernels.ops(t).unwrap().vec_dot_type;
            let xrb = row_bytes(vdt, k);
            for rows in [8usize, 16, 37] {
                let mut x = vec![0u8; rows * xrb];
                for r in 0..rows {
                    kernels.from_float(vdt).unwrap()(&values(k, 300 + r as u64), &mut x[r * xrb..(r + 1) * xrb]);
                }
                for nth in [1, 2, 3] {
                    let from_rows = run(&kernels, Path::Panel, t, &w, None, k, n_out, &x, rows, None, nth);
                    let from_groups = run(&kernels, Path::Panel, t, &[], Some(&g), k, n_out, &x, rows, None, nth);
                    assert!(from_rows == from_groups, "{} {t}: {rows} rows, {nth} workers", kernels.isa());
                }
            }
        }
    }
}
