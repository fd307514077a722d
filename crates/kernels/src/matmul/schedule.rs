//! A prefill matmul's schedule (Sandwich §6): how `out[rows][n_out] = x · Wᵀ` is cut into
//! register tiles, cache blocks and thread parts. Two paths take one:
//!
//! - the panel GEMM (`--fast-prefill`, [`super::gemm`]): `mr` activation rows × 8 columns per
//!   micro-kernel call ([`PANEL_MR`]), `nc` columns decoded into panels once per cache block,
//!   `mc` rows streamed past them per block, `kc` 32-value blocks of the inner dimension per
//!   pass over the rows;
//! - the tiles on interleaved weights (the default, bit-identical to llama.cpp): `mr` 4 or 8
//!   rows per tile call ([`TILE_MR`]), `nc` columns per block, `mc` rows per block (`kc` unused:
//!   a tile computes whole dot products).
//!
//! Every field keeps each output's summation order: integer sums are exact and each output's
//! float accumulation runs over the inner blocks in order whatever the blocking (a `kc` cut
//! carries the accumulator through the output), tiles of 4 and 8 rows give the same values,
//! and row parts start at multiples of 8. So a schedule changes speed only, never bits
//! (tested in `tests/parity/` and `corelm-core`'s scheduler tests).

/// Register tile heights of the panel GEMM's micro-kernels, in order (the search's window
/// slides along this list).
pub const PANEL_MR: [usize; 5] = [1, 2, 4, 6, 8];

/// Register tile heights of the tiles on interleaved weights.
pub const TILE_MR: [usize; 2] = [4, 8];

/// One matmul's schedule. `0` in `mc`, `kc` or `row_parts` means "all" / "the scheduler's own
/// choice".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// Activation rows per micro-kernel call (register tile height).
    pub mr: usize,
    /// Output columns per cache block (bN): a multiple of 8 for the panel GEMM, of 4 for tiles.
    pub nc: usize,
    /// Activation rows per cache block (bM); 0: all of the worker's rows.
    pub mc: usize,
    /// 32-value blocks of the inner dimension per cache block (bK, panel GEMM); 0: all.
    pub kc: usize,
    /// Row parts of the thread grid (rows split this many ways, columns among the workers of
    /// each part); 0: the scheduler's own grid.
    pub row_parts: usize,
}

impl Schedule {
    /// The panel GEMM's fixed schedule before tuning: 4-row tiles, two panels per block (the
    /// AVX-512 kernel runs them in one pass), every row and the whole inner dimension per block.
    pub const PANEL_DEFAULT: Schedule = Schedule { mr: 4, nc: 16, mc: 0, kc: 0, row_parts: 0 };

    /// [`PANEL_DEFAULT`](Self::PANEL_DEFAULT) with 8-row tiles: the AVX-512 table's default on
    /// a CPU that issues 512-bit `vpdpbusd` at full rate (`simd::x86::vnni512_full_rate`).
    pub const PANEL_WIDE_DEFAULT: Schedule = Schedule { mr: 8, ..Schedule::PANEL_DEFAULT };

    /// [`PANEL_DEFAULT`](Self::PANEL_DEFAULT) with 2-row tiles: the AVX2 table's default for
    /// Q6_K on a CPU without AVX-VNNI (`gemm::default_schedule`).
    pub const PANEL_NARROW_DEFAULT: Schedule = Schedule { mr: 2, ..Schedule::PANEL_DEFAULT };

    /// The panel GEMM's fixed schedule on AMX's tiles ([`Isa::Amx`](crate::Isa::Amx); where
    /// it applies: `gemm::default_schedule`): eight
    /// panels per column block and 32 blocks of the inner dimension per pass, so a 16-row tile's
    /// codes of a pass (16 KiB) stay in L1 for the four two-panel calls that read them; the
    /// rows split among workers so that each has at least [`AMX_MIN_COLS`] columns
    /// ([`amx_row_parts`]). Measured on a 16-core Xeon with AMX: docs/benchmarks.md.
    pub const AMX_DEFAULT: Schedule = Schedule { mr: 4, nc: 64, mc: 0, kc: 32, row_parts: 0 };

    /// The interleaved tiles' fixed schedule before tuning: 8-row tiles over 64-column blocks.
    pub const TILE_DEFAULT: Schedule = Schedule { mr: 8, nc: 64, mc: 0, kc: 0, row_parts: 0 };

    /// The nearest valid schedule for a path (`panel`: the panel GEMM; else the tiles): `mr`
    /// one of its heights, `nc` a positive multiple of its width, `mc` a multiple of 8, `kc`
    /// 0 for tiles.
    pub fn normalized(self, panel: bool) -> Schedule {
        let heights: &[usize] = if panel { &PANEL_MR } else { &TILE_MR };
        let mr = *heights.iter().min_by_key(|&&h| h.abs_diff(self.mr)).expect("heights");
        let unit = if panel { 8 } else { 4 };
        Schedule {
            mr,
            nc: self.nc.max(unit).div_ceil(unit) * unit,
            mc: self.mc.div_ceil(8) * 8,
            kc: if panel { self.kc } else { 0 },
            row_parts: self.row_parts,
        }
    }

    /// `"mr4 nc64 mc128 kc0 grid2"`: the schedule in one word per field.
    pub fn describe(&self) -> String {
        let or_all = |v: usize| if v == 0 { "all".to_string() } else { v.to_string() };
        let grid = if self.row_parts == 0 { "auto".to_string() } else { format!("{}×n", self.row_parts) };
        format!("mr{} nc{} mc{} kc{} rows{}", self.mr, self.nc, or_all(self.mc), or_all(self.kc), grid)
    }
}

/// Columns a worker takes at least under [`Schedule::AMX_DEFAULT`]'s grid: with fewer, the
/// work each worker repeats over all its rows (their block scalars and sums) outweighs its
/// share of the products.
pub const AMX_MIN_COLS: usize = 128;

/// Row parts of [`Schedule::AMX_DEFAULT`]'s grid for `n_out` columns on `nth` workers: the
/// fewest that divide `nth` and leave each worker [`AMX_MIN_COLS`] columns (all `nth` where
/// none does), so every worker has a part.
pub fn amx_row_parts(n_out: usize, nth: usize) -> usize {
    let nth = nth.max(1);
    (1..=nth).filter(|pr| nth.is_multiple_of(*pr)).find(|&pr| n_out / (nth / pr) >= AMX_MIN_COLS).unwrap_or(nth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_schedules_are_valid_for_their_path() {
        let s = Schedule { mr: 5, nc: 13, mc: 12, kc: 7, row_parts: 2 };
        assert_eq!(s.normalized(true), Schedule { mr: 4, nc: 16, mc: 16, kc: 7, row_parts: 2 });
        assert_eq!(s.normalized(false), Schedule { mr: 4, nc: 16, mc: 16, kc: 0, row_parts: 2 });
        assert_eq!(Schedule::PANEL_DEFAULT.normalized(true), Schedule::PANEL_DEFAULT);
        assert_eq!(Schedule::TILE_DEFAULT.normalized(false), Schedule::TILE_DEFAULT);
        assert_eq!(Schedule::AMX_DEFAULT.normalized(true), Schedule::AMX_DEFAULT);
        // 16 workers: Qwen2.5's 896 columns in 4 × 4 (224 each), its 128 K/V columns by rows
        // alone, 4864 by columns alone; 3 workers over 192 columns: 3 row parts.
        assert_eq!([896, 128, 4864, 1536].map(|n| amx_row_parts(n, 16)), [4, 16, 1, 2]);
        assert_eq!(amx_row_parts(192, 3), 3);
        assert_eq!(amx_row_parts(4864, 1), 1);
        assert_eq!(Schedule { nc: 0, ..Schedule::TILE_DEFAULT }.normalized(false).nc, 4);
    }
}
