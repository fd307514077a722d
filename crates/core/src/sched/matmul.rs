//! Matmuls of quantized weights, `out[rows][n_out] = x · Wᵀ`, as one worker's share: the
//! panel GEMM (`--fast-prefill`), the tiles and GEMV on matrices interleaved at load, and the
//! per-row dots on plain rows (dense types' tinyBLAS tiles: `dense.rs`). The operands come as
//! bytes ([`Operands`]), so the scheduler and `corelm tune`'s timing harness run the same code.
//!
//! A panel GEMM whose output a plan cut among worker classes ([`ClassSplit`]: a matrix unit's
//! workers and vector cores, or fast and slow cores) runs each class's range on that class's
//! workers with that class's kernel ([`WorkerClass`]); the integer sums are exact, so every
//! class's panel kernel gives the same bits and the cut changes none.
//!
//! A prefill matmul on the panel or tile path follows a [`Schedule`] (register tile, cache
//! blocks, thread grid): the one [`Schedules`] holds for its (path, weight type, shape) at the
//! nearest tuned length, else the path's fixed default. Schedules never change bits
//! (`corelm_kernels::matmul::schedule`).

use super::split;
use crate::tensor::ClassSplit;
use corelm_kernels::matmul::gemm::{self, GemmScratch};
use corelm_kernels::matmul::layout as interleave;
use corelm_kernels::matmul::schedule::Schedule;
use corelm_kernels::{DType, InterleavedOps, Isa, Kernels, TypeOps};
use std::ops::Range;

/// Weight rows per column block of the default matmul (tiles run over one block at a time).
pub(super) const COL_BLOCK: usize = 16;

/// Most weight rows per column block of the tiles on interleaved matrices (their output
/// buffers live on the stack). The default block is `Schedule::TILE_DEFAULT.nc` = 64: the
/// activation rows' preparation (`layout::scratch_len`) is made once per block, so wider
/// blocks amortise it (16 groups; a Q5_0 block of 4864-value rows is 200 KiB, in L2).
pub const IL_COL_MAX: usize = 256;

/// Bytes of a worker's scratch for column blocks decoded once for all batch rows
/// (`IlTiles::decoded`: one byte per weight value). A larger block takes the plain tiles.
pub const DECODED_MAX: usize = 1 << 20;

/// Batch rows from which a matmul over a panel-GEMM type uses the panel kernel
/// ([`gemm_min_rows`]: fewer for some).
pub const GEMM_MIN_ROWS: usize = 8;

/// [`GEMM_MIN_ROWS`] under the AVX-512 table for the matrices whose panels it decodes from
/// interleaved nibbles (Q4_0, Q4_1, Q5_0, Q5_1; AVX2: every type it decodes from the groups).
/// Zen 4, 2 threads, `--fast-prefill`, a decode
/// step of 4 sequences (`bench --npl 4 -p 128 --profile`, two alternations), tiles / panel:
/// SmolLM2's Q4_1 matmuls 4.45, 4.53 / 3.93, 3.90 ms; Qwen2.5's Q5_0 9.4, 10.2 / 7.7, 7.9 ms.
/// Its Q8_0, Q4_K and Q6_K matrices were as fast or slower on the panel there (Q8_0 4.7, 4.8
/// / 6.1, 5.1 ms); at 2 sequences the tiles win (SmolLM2's Q4_1: 2.7 / 3.8 ms). Also under
/// the AVX2 table for Q4_0 and Q4_1 (decoded from groups) since its kernel runs two panels
/// per pass: SmolLM2's Q4_1 matmuls at 4 sequences (`--isa avx2`, four alternations) 4.6–6.2
/// / 4.1–4.6 ms; and, since that table decodes them from the groups too, for Q5_0, Q5_1,
/// Q8_0, Q4_K and Q6_K: Qwen2.5 at 4 sequences, Q5_0 13.8, 12.5, 13.8 / 9.2, 9.0, 9.7 ms
/// (S_TG 135, 146, 130 / 155, 172, 157 t/s); then Q8_0 7.8, 7.7 / 6.7, 6.7, Q4_K 2.24, 2.16
/// / 1.86, 1.86, Q6_K 3.07, 2.93 / 2.90, 2.88 ms.
pub const GEMM_MIN_ROWS_NIBBLES: usize = 4;

/// The fewest batch rows from which a `dtype` matrix (`interleaved` at load or not) takes the
/// panel GEMM under `isa`'s table.
pub fn gemm_min_rows(isa: Isa, dtype: DType, interleaved: bool) -> usize {
    let nibbles = match isa {
        Isa::Avx512 => matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1),
        Isa::Avx2 => gemm::packs_groups(dtype, isa),
        _ => false,
    };
    if interleaved && nibbles {
        GEMM_MIN_ROWS_NIBBLES
    } else {
        GEMM_MIN_ROWS
    }
}

/// A matmul's kernel path; schedules are tuned and kept per path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// The panel GEMM (`--fast-prefill`, ggml's float order given up).
    Panel,
    /// Tiles on weights interleaved at load (bit-identical to llama.cpp).
    Tiles,
    /// Per-row dots and tiles on plain rows (no schedule).
    Plain,
}

/// One matmul's operands as bytes.
#[derive(Clone, Copy)]
pub struct Operands<'a> {
    pub dtype: DType,
    /// Inner dimension and output columns (weight rows).
    pub k: usize,
    pub n_out: usize,
    /// The plain weight rows (`row_bytes(dtype, k)` apart; what the panel GEMM decodes; empty
    /// for a tensor-parallel column slice, which has only its interleaved copy), and the
    /// interleaved groups where the matrix was repacked at load (the tiles' and GEMV's).
    pub w: &'a [u8],
    pub il: Option<&'a [u8]>,
    /// `rows` activation rows in the type's `vec_dot_type`, `xrb` bytes apart.
    pub x: &'a [u8],
    pub xrb: usize,
    pub rows: usize,
    /// Where the activation rows are not `x`'s first `rows` in order: row `r` is `x`'s row
    /// `map[r] / div` (an expert's tokens: its pairs divided by the experts per token). Such a
    /// matmul never takes the panel GEMM, whose kernels read rows in order.
    pub xmap: Option<(&'a [i32], usize)>,
    /// The `[rows][n_out]` f32 output, rows `ldo` f32 apart (`n_out`, or more for a shard's
    /// columns of a wider output).
    pub out: *mut f32,
    pub ldo: usize,
    /// The output cut among worker classes, and the classes (see [`WorkerClass`]).
    pub split: Option<(&'a ClassSplit, &'a [WorkerClass])>,
}

/// Consecutive workers that run a split matmul's share of their class with one kernel level:
/// the matrix unit's ([`Isa::Sme`]) or a vector table's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerClass {
    pub isa: Isa,
    pub workers: usize,
}

/// Worker `ith`'s (columns, rows, kernel level) of a split matmul over `classes`, whose worker
/// counts add up to `nth` (else `None`: the split does not apply to this many workers).
/// Within its class's range a worker takes an even part in whole units: `PANEL` columns, or
/// groups of 8 rows.
pub fn class_part(cut: &ClassSplit, classes: &[WorkerClass], n_out: usize, rows: usize, ith: usize, nth: usize) -> Option<(Range<usize>, Range<usize>, Isa)> {
    if classes.iter().map(|c| c.workers).sum::<usize>() != nth || cut.bounds.len() != classes.len() + 1 || ith >= nth {
        return None;
    }
    // Worker `ith`'s class `c` and the class's first worker.
    let (mut c, mut first) = (0, 0);
    while ith >= first + classes[c].workers {
        first += classes[c].workers;
        c += 1;
    }
    let class = classes[c];
    let (len, unit) = if cut.by_rows { (rows, 8) } else { (n_out, gemm::PANEL) };
    let (lo, hi) = (cut.bounds[c].min(len), cut.bounds[c + 1].min(len));
    let part = split((hi.saturating_sub(lo)).div_ceil(unit), ith - first, class.workers);
    let mine = (lo + part.start * unit).min(hi)..(lo + part.end * unit).min(hi);
    Some(if cut.by_rows { (0..n_out, mine, class.isa) } else { (mine, 0..rows, class.isa) })
}

// SAFETY: `out` is written only through `run`, whose contract gives each worker a disjoint
// share; everything else is shared read-only.
unsafe impl Sync for Operands<'_> {}

impl<'a> Operands<'a> {
    /// Activation row `r` (through `xmap` where there is one).
    #[inline(always)]
    pub fn xrow(&self, r: usize) -> &'a [u8] {
        let r = match self.xmap {
            Some((map, div)) => map[r] as usize / div,
            None => r,
        };
        &self.x[r * self.xrb..(r + 1) * self.xrb]
    }
}

/// Run-wide choices that select a path.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mode {
    /// Every row computed in the single-row order (`Executor::batch_invariant`).
    pub batch_invariant: bool,
    /// The panel GEMM for batches of [`gemm_min_rows`] or more (`Executor::panel_gemm`).
    pub panel_gemm: bool,
}

/// The path a matmul of `rows` rows on a `dtype` matrix (`interleaved` or not, with its plain
/// rows at hand or not) takes.
pub fn path(kernels: &Kernels, dtype: DType, interleaved: bool, plain: bool, rows: usize, mode: Mode) -> Path {
    // The panel where the table has a SIMD kernel for it, and everywhere on the portable
    // table (its twin still decodes each block once for every row).
    let isa = kernels.isa();
    let panel_type = gemm::simd(dtype, isa) || (gemm::supported(dtype) && isa == Isa::Portable);
    let has_il = kernels.ops(dtype).is_some_and(|o| o.interleaved.is_some());
    // The panels are decoded from the plain rows, or from the interleaved groups where the
    // table can (`gemm::packs_groups`; a tensor-parallel column slice has only those).
    let source = plain || (interleaved && gemm::packs_groups(dtype, isa));
    if mode.panel_gemm && !mode.batch_invariant && rows >= gemm_min_rows(isa, dtype, interleaved) && panel_type && source {
        Path::Panel
    } else if interleaved && has_il {
        Path::Tiles
    } else {
        Path::Plain
    }
}

/// Batch rows from which `--fast-prefill` without a plan runs the panel GEMM rather than the
/// interleaved tiles on x86 (`panel_over_tiles`). The panel decodes its weights for each call
/// (`gemm::pack`), so it pays only over enough rows. On Zen 4, one thread, Q4_1 k = 576 in
/// cache, ns per 128 products with the decoding, panel / AVX-512 tiles 1.79: 8 rows 2.1, 16
/// rows 1.52, 32 rows 1.25, 512 rows 1.00. In the engine the weights come from memory and the
/// crossing is later: SmolLM2 at 2 threads, t/s tiles / panel, pp16 1006–1089 / 876–1030,
/// pp24 923–995 / 1155–1248, pp32 965–1114 / 1334–1366, pp64 967–1119 / 1626–1722; a decode
/// step of 16 sequences 12.8–14.3 / 14.7–15.4 ms in the Q4_1 matmuls and 3.5 / 4.4 ms in the
/// Q8_0 LM head, whose 16 rows are all output rows.
pub const PANEL_OVER_TILES_ROWS: usize = 32;

/// [`PANEL_OVER_TILES_ROWS`] for the matrices whose panels an x86 table decodes from the
/// interleaved groups (`gemm::packs_groups`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K), a few
/// permutes per panel and block instead of the plain rows' transposes and scalar
/// scales: the panel pays from the first row count it takes. (AVX2's Q8_0, on its signed bytes,
/// took the panel from 16 rows while it decoded the plain rows: at 8 sequences its tiles won,
/// SmolLM2's LM head 2.83–2.94 / 3.38–3.55 ms; from the groups the panel wins there too, 2.85,
/// 2.94 / 2.38, 2.40 ms, and Gemma 3's Q8_0 matmuls 17.1, 17.7 / 13.7, 14.6 ms. AVX2's Q4_K
/// took it from 16 rows, decoded from the rows: Qwen2.5's Q4_K matmuls at 8 sequences, tiles /
/// panel from the groups, 3.73, 3.67 / 3.03, 3.06 ms; its Q5_0 matmuls 26.5, 26.7 / 16.2, 16.6 ms; its Q6_K matmuls 5.36, 5.40 /
/// 4.47, 4.56 ms.) Zen 4, SmolLM2 at 2 threads,
/// `--fast-prefill`, t/s tiles / panel from groups: pp8 757–975 / 946–974, pp24 1082–1096 /
/// 1467–1531, pp64 (panel from rows / from groups) 1562–1575 / 1813–1865; a 16-sequence decode
/// step's Q4_1 matmuls 12.95 / 9.76 ms and its Q8_0 LM head 3.48 / 3.13 ms (medians of 5). AVX2 table (`--isa avx2`,
/// same VM): pp8 562–638 / 582–682, pp24 828–830 / 959–1004, pp64 863–1061 / 1122–1158, the
/// decode step's Q4_1 matmuls 17.52 / 14.48 ms. Qwen2.5 (Q5_0, AVX-512): pp16 325–327 /
/// 387–401, pp24 336–338 / 440–449; its Q5_0 matmuls at 16 sequences 33.3 / 25.8 ms.
pub const PANEL_OVER_TILES_ROWS_GROUPS: usize = GEMM_MIN_ROWS;

/// [`PANEL_OVER_TILES_ROWS`] for the other types under the AVX2 table, whose panel kernel runs
/// two panels per pass (`x86::panel_pair_avx2`). Zen 4 with `--isa avx2`, `--fast-prefill`, t/s
/// with the panel from 32 / from 16 rows, interleaved runs: Qwen2.5 pp16 195–214 / 226–253,
/// pp24 192–228 / 274–292; Gemma 3 pp16 620–642 / 632–677, pp24 616–687 / 769–821.
pub const PANEL_OVER_TILES_ROWS_AVX2: usize = 16;

/// Whether `--fast-prefill` without a tuned plan runs the panel GEMM over `rows` batch rows on a
/// matrix that also has interleaved tiles under `isa`'s table. On x86 from
/// [`PANEL_OVER_TILES_ROWS`] rows: the panel kernels with their kind fixed at compile time and
/// two panels per pass are faster than the tiles there (Zen 4, 2 threads, pp512: docs/benchmarks.md);
/// below it the tiles are (before those kernels the panel ran on x86 only without tiles). On
/// aarch64 always: its panel kernels are the matrix instructions' (`usmmla`, SME's outer
/// products), not timed against the tiles on ARM hardware.
pub fn panel_over_tiles(isa: Isa, dtype: DType, rows: usize) -> bool {
    let from = if gemm::packs_groups(dtype, isa) {
        // The AVX-512 table's nibble types from fewer (`gemm_min_rows`).
        PANEL_OVER_TILES_ROWS_GROUPS.min(gemm_min_rows(isa, dtype, true))
    } else if isa == Isa::Avx2 {
        PANEL_OVER_TILES_ROWS_AVX2
    } else {
        PANEL_OVER_TILES_ROWS
    };
    !matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Amx) || rows >= from
}

/// One tuned schedule: for matmuls on `path` of a `dtype` matrix of `n_out` rows of `k` values,
/// from `rows` activation rows up to the next entry's, and the seconds it took at `rows` when
/// it was tuned (0: not known).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScheduleEntry {
    pub path: Path,
    pub dtype: DType,
    pub k: usize,
    pub n_out: usize,
    pub rows: usize,
    pub sched: Schedule,
    pub secs: f64,
}

/// The tuned schedules of one run (`corelm tune`), looked up per matmul node.
#[derive(Clone, Debug, Default)]
pub struct Schedules {
    entries: Vec<ScheduleEntry>,
}

impl Schedules {
    /// The entries, each schedule normalized for its path.
    pub fn new(mut entries: Vec<ScheduleEntry>) -> Schedules {
        for e in &mut entries {
            e.sched = e.sched.normalized(e.path == Path::Panel);
            e.sched.nc = e.sched.nc.min(IL_COL_MAX);
        }
        entries.sort_by_key(|e| e.rows);
        Schedules { entries }
    }

    pub fn entries(&self) -> &[ScheduleEntry] {
        &self.entries
    }

    /// The schedule tuned at the largest length `≤ rows` for this matrix (the smallest tuned
    /// length below that), if the matrix was tuned.
    pub fn get(&self, path: Path, dtype: DType, k: usize, n_out: usize, rows: usize) -> Option<Schedule> {
        self.entry(path, dtype, k, n_out, rows).map(|e| e.sched)
    }

    fn entry(&self, path: Path, dtype: DType, k: usize, n_out: usize, rows: usize) -> Option<&ScheduleEntry> {
        let mut found = None;
        for e in self.entries.iter().filter(|e| e.path == path && e.dtype == dtype && e.k == k && e.n_out == n_out) {
            if e.rows <= rows || found.is_none() {
                found = Some(e);
            }
        }
        found
    }

    /// The path of the two timed faster for this matrix at the largest tuned length `≤ rows`
    /// (the smallest above), where both were timed at that length; `None` otherwise.
    pub fn faster_path(&self, dtype: DType, k: usize, n_out: usize, rows: usize) -> Option<Path> {
        let tiles = self.entry(Path::Tiles, dtype, k, n_out, rows)?;
        let panel = self.entry(Path::Panel, dtype, k, n_out, rows)?;
        (tiles.rows == panel.rows && tiles.secs > 0.0 && panel.secs > 0.0).then_some(if tiles.secs < panel.secs { Path::Tiles } else { Path::Panel })
    }

    /// Most panels a panel-GEMM schedule decodes per column block (the scratch to hold; at
    /// least the two of `Schedule::PANEL_DEFAULT`).
    pub fn max_panels(&self) -> usize {
        self.entries.iter().filter(|e| e.path == Path::Panel).map(|e| e.sched.nc / gemm::PANEL).max().unwrap_or(1).max(2)
    }
}

/// One worker's matmul buffers, allocated once.
pub struct MatmulScratch {
    pub(super) gemm: GemmScratch,
    /// One column block of weight rows packed for the tile kernels (`TypeOps::packing`).
    pack: Vec<u8>,
    /// Activation rows prepared for the kernels on interleaved weights.
    prep: Vec<i32>,
    /// One column block of interleaved weights decoded (`IlTiles::decoded`): a default block
    /// (`Schedule::TILE_DEFAULT.nc` rows) of the widest matrix at the most bytes per value any
    /// decoded form writes, at most [`DECODED_MAX`].
    dec: Vec<u8>,
    /// `[IL_COL_MAX][8]` f32: one tile call's results before they are stored by rows.
    tiles: Vec<f32>,
    /// An expert's activation rows gathered in order for the panel GEMM (`sched::experts`;
    /// empty unless the graph has expert matmuls: [`MatmulScratch::with_gather`]).
    pub(super) gather: Vec<u8>,
}

impl MatmulScratch {
    /// For matrices of up to `max_k` columns; panel GEMMs of up to `max_k_gemm` columns,
    /// `max_rows` rows and `max_panels` panels per column block.
    pub fn new(max_k: usize, max_k_gemm: usize, max_rows: usize, max_panels: usize) -> MatmulScratch {
        MatmulScratch {
            gemm: GemmScratch::new(max_k_gemm, max_rows, max_panels),
            pack: vec![0; COL_BLOCK * corelm_kernels::max_packed_row_bytes(max_k)],
            prep: vec![0; interleave::scratch_len(max_k)],
            dec: vec![0; (Schedule::TILE_DEFAULT.nc * max_k / 32 * corelm_kernels::matmul::DECODED_MAX_PER_32).min(DECODED_MAX)],
            tiles: vec![0.0; IL_COL_MAX * 8],
            gather: Vec::new(),
        }
    }

    /// With room to gather `bytes` of activation rows (an expert's, for the panel GEMM).
    pub fn with_gather(mut self, bytes: usize) -> MatmulScratch {
        self.gather = vec![0; bytes];
        self
    }
}

/// Worker `ith` of `nth`'s share of the matmul `o`, on the path [`path`] gives, with the
/// schedule `schedules` holds for it (else the path's default).
///
/// # Safety
/// `o.out` addresses `o.rows` rows of `o.n_out` f32, `o.ldo` apart, that only the `nth` workers of this call write
/// during it, each its own share.
pub unsafe fn run(kernels: &Kernels, o: &Operands, mode: Mode, schedules: Option<&Schedules>, ith: usize, nth: usize, s: &mut MatmulScratch) {
    // A panel GEMM larger than the scratch (a graph other than the one the executor was sized
    // for) runs as if the panel were off.
    let mut mode = Mode { panel_gemm: mode.panel_gemm && o.xmap.is_none() && s.gemm.fits(o.k, o.rows), ..mode };
    // A matrix with interleaved tiles keeps them where they were timed faster (a plan tuned on
    // both paths), else where its table's panel is slower than its tiles.
    if mode.panel_gemm && o.il.is_some() {
        let faster = schedules.and_then(|t| t.faster_path(o.dtype, o.k, o.n_out, o.rows));
        mode.panel_gemm = faster.map_or(panel_over_tiles(kernels.isa(), o.dtype, o.rows), |p| p == Path::Panel);
    }
    let p = path(kernels, o.dtype, o.il.is_some(), !o.w.is_empty(), o.rows, mode);
    let sched = (p != Path::Plain && o.rows >= 2).then(|| schedules.and_then(|t| t.get(p, o.dtype, o.k, o.n_out, o.rows))).flatten();
    let ops = kernels.ops(o.dtype).expect("weight type checked at load");
    // SAFETY (all three): the caller's contract.
    match p {
        Path::Panel => unsafe { run_panel(kernels.isa(), o, sched.unwrap_or(gemm::default_schedule(kernels.isa(), o.dtype)), ith, nth, s) },
        Path::Tiles => {
            let il = ops.interleaved.expect("checked by path()");
            // Batch-invariant runs keep `vec_dot`'s values where the tiles' order differs.
            let grouped = !(mode.batch_invariant && ops.tile_order);
            unsafe { run_interleaved(o, il, grouped, sched.unwrap_or(Schedule::TILE_DEFAULT), ith, nth, s) }
        }
        _ => unsafe { run_plain(o, ops, mode, ith, nth, &mut s.pack) },
    }
}

/// Worker `ith`'s (columns, rows) under a schedule's thread grid: `row_parts` parts of whole
/// groups of 8 rows, columns among the `nth / row_parts` workers of each in multiples of
/// `unit`; without one (0), [`matmul_part`]'s.
fn sched_part(sched: &Schedule, n_out: usize, rows: usize, ith: usize, nth: usize, unit: usize) -> (Range<usize>, Range<usize>) {
    if sched.row_parts == 0 {
        return matmul_part(n_out, rows, ith, nth, unit);
    }
    let groups = rows.div_ceil(8);
    let pr = sched.row_parts.min(nth).min(groups).max(1);
    let pc = nth / pr;
    if ith >= pr * pc {
        return (0..0, 0..0);
    }
    let (ic, ir) = (ith % pc, ith / pc);
    let c = split(n_out.div_ceil(unit), ic, pc);
    let r = split(groups, ir, pr);
    ((c.start * unit).min(n_out)..(c.end * unit).min(n_out), (r.start * 8).min(rows)..(r.end * 8).min(rows))
}

/// The panel GEMM over this worker's part.
///
/// # Safety
/// As [`run`].
unsafe fn run_panel(isa: Isa, o: &Operands, sched: Schedule, ith: usize, nth: usize, s: &mut MatmulScratch) {
    // AMX's default grid: rows split so that each worker keeps enough columns.
    let sched = if isa == Isa::Amx && gemm::amx_runs(o.dtype) && sched.row_parts == 0 { Schedule { row_parts: corelm_kernels::matmul::schedule::amx_row_parts(o.n_out, nth), ..sched } } else { sched };
    // With the interleaved groups to decode from, workers take whole panels (a group is four
    // columns; `n_out` is a multiple of four).
    let groups = o.il.is_some() && gemm::packs_groups(o.dtype, isa);
    // A class split is the thread grid: each class its range, with its kernel.
    let (cols, rr, isa) = match o.split.and_then(|(cut, classes)| class_part(cut, classes, o.n_out, o.rows, ith, nth)) {
        Some(part) => part,
        None if sched.row_parts == 0 && groups => {
            let p = split(o.n_out.div_ceil(gemm::PANEL), ith, nth);
            ((p.start * gemm::PANEL).min(o.n_out)..(p.end * gemm::PANEL).min(o.n_out), 0..o.rows, isa)
        }
        None if sched.row_parts == 0 => (split(o.n_out, ith, nth), 0..o.rows, isa),
        None => {
            let (c, r) = sched_part(&sched, o.n_out, o.rows, ith, nth, gemm::PANEL);
            (c, r, isa)
        }
    };
    if cols.is_empty() || rr.is_empty() {
        return;
    }
    let x = &o.x[rr.start * o.xrb..rr.end * o.xrb];
    let w = match o.il {
        Some(g) if groups && cols.start.is_multiple_of(4) && cols.end.is_multiple_of(4) => gemm::Weights::Groups(g),
        _ => {
            assert!(!o.w.is_empty(), "a panel GEMM over columns {cols:?} of a matrix without plain rows");
            gemm::Weights::Rows(o.w)
        }
    };
    // SAFETY: rows rr of the output, columns `cols`: this worker's (the caller's contract).
    unsafe { gemm::gemm(o.dtype, w, o.k, cols, x, o.xrb, rr.len(), o.out.add(rr.start * o.ldo), o.ldo, isa, &sched, &mut s.gemm) };
}

/// Plain weight rows: output columns split across workers; each worker walks its columns in
/// blocks small enough to stay in cache while every batch row streams past them.
///
/// # Safety
/// As [`run`].
unsafe fn run_plain(o: &Operands, ops: &TypeOps, mode: Mode, ith: usize, nth: usize, pack: &mut [u8]) {
    let Operands { k, n_out, rows, ldo, .. } = *o;
    let wrb = corelm_kernels::row_bytes(o.dtype, k);
    // Rows in complete groups of four use the tile dot (llama.cpp's 4-row kernels' order).
    let tiled_rows = if rows >= 4 { rows - rows % 4 } else { 0 };
    // Tiles and 4-row kernels give `vec_dot_tile` values, which batch-invariant runs avoid
    // where its order differs.
    let grouped = !(mode.batch_invariant && ops.tile_order);
    let (cols, row_range) = matmul_part(n_out, rows, ith, nth, 1);
    let tiled_end = tiled_rows.min(row_range.end);
    let base = o.out;
    let xrow = |r: usize| o.xrow(r);
    // Blocks re-laid for the tiles (calls, bytes), counted once at the end (`note_repacks`).
    let mut packs = (0, 0);
    let mut c0 = cols.start;
    while c0 < cols.end {
        let c1 = (c0 + COL_BLOCK).min(cols.end);
        let n_tile = (c1 - c0) / 4 * 4;
        // The block's plain weight rows (`wb[(c - c0) · wrb ..]` is row c).
        let wb = &o.w[c0 * wrb..c1 * wrb];
        // With two or more groups of four activation rows, decode the block's weight rows
        // once into the tile kernel's layout instead of once per group.
        let packed = match ops.packing {
            Some(pk) if grouped && tiled_end.saturating_sub(row_range.start) >= 8 && n_tile * (pk.row_bytes)(wrb) <= pack.len() => {
                let buf = &mut pack[..n_tile * (pk.row_bytes)(wrb)];
                (pk.pack)(&wb[..n_tile * wrb], wrb, buf);
                packs = (packs.0 + 1, packs.1 + buf.len());
                Some((pk.tile, &*buf))
            }
            _ => None,
        };
        // Row parts start at multiples of four, so the groups of four are the same as with
        // all rows in one part (and so are the bits).
        let mut r = row_range.start;
        // Complete groups of four rows: register-blocked tiles where a tile kernel exists,
        // then one call per weight row (a 4-row kernel, or the tile dot four times).
        while grouped && r + 4 <= tiled_end && (ops.vec_tile.is_some() || ops.vec_dot4.is_some()) {
            let ys = [xrow(r), xrow(r + 1), xrow(r + 2), xrow(r + 3)];
            let mut c = c0;
            if let Some(tile) = ops.vec_tile {
                let mut out = [[0f32; 4]; COL_BLOCK];
                match packed {
                    Some((packed_tile, buf)) => packed_tile(buf, wrb, ys, &mut out[..n_tile]),
                    None => tile(&wb[..n_tile * wrb], wrb, ys, &mut out[..n_tile]),
                }
                // SAFETY: columns c0..c0 + n_tile of rows r..r + 4 are this worker's.
                unsafe { store_cols(base, ldo, r, c0, &out[..n_tile]) };
                c += n_tile;
            }
            for c in c..c1 {
                let w = &wb[(c - c0) * wrb..(c - c0 + 1) * wrb];
                let mut out = [0f32; 4];
                match ops.vec_dot4 {
                    Some(dot4) => dot4(w, ys, &mut out),
                    None => out = ys.map(|y| (ops.vec_dot_tile)(w, y)),
                }
                for (j, v) in out.into_iter().enumerate() {
                    // SAFETY: column c of these rows is written by this worker only.
                    unsafe { *base.add((r + j) * ldo + c) = v };
                }
            }
            r += 4;
        }
        for r in r..row_range.end {
            let xr = xrow(r);
            let tile_dot = r < tiled_rows && !mode.batch_invariant;
            // Many weight rows per call (decode's GEMV), where it gives this row's values.
            if let Some(rows_dot) = ops.vec_dot_rows.filter(|_| !(tile_dot && ops.tile_order)) {
                let mut out = [0f32; COL_BLOCK];
                rows_dot(wb, wrb, xr, &mut out[..c1 - c0]);
                for (i, &v) in out[..c1 - c0].iter().enumerate() {
                    // SAFETY: column c0 + i of row r is written by this worker only.
                    unsafe { *base.add(r * ldo + c0 + i) = v };
                }
                continue;
            }
            let vec_dot = if tile_dot { ops.vec_dot_tile } else { ops.vec_dot };
            for c in c0..c1 {
                let v = vec_dot(&wb[(c - c0) * wrb..(c - c0 + 1) * wrb], xr);
                // SAFETY: column c of row r is written by this worker only (columns split).
                unsafe { *base.add(r * ldo + c) = v };
            }
        }
        c0 = c1;
    }
    corelm_kernels::matmul::layout::note_repacks(packs.0, packs.1);
}

/// A matrix interleaved at load (`o.il`, groups of four weight rows): columns are split in
/// whole groups; complete groups of four batch rows go through the tiles — row blocks of
/// `sched.mc`, column blocks of `sched.nc`, `sched.mr` (8, then a last 4; or 4) rows per call
/// — the other rows through the GEMV: one row alone (decode) over the worker's whole column
/// range, rows of a batch column block by column block after the tiles (the block's weights
/// read from memory once).
/// Where the tiles have a decoded form, a column block met by at least `DecodedTiles::min_rows`
/// rows of eight-row calls is decoded once into `dec` for all of them. Values as `vec_dot`
/// gives them, bit for bit, whatever the schedule.
///
/// # Safety
/// As [`run`].
#[allow(clippy::too_many_arguments)]
unsafe fn run_interleaved(o: &Operands, il: InterleavedOps, grouped: bool, sched: Schedule, ith: usize, nth: usize, s: &mut MatmulScratch) {
    let (prep, dec, tiles) = (&mut s.prep[..], &mut s.dec[..], &mut s.tiles[..]);
    let Operands { n_out, rows, ldo, .. } = *o;
    let (g, wrb) = (o.il.expect("an interleaved matrix"), corelm_kernels::row_bytes(o.dtype, o.k));
    let xrow = |r: usize| o.xrow(r);
    let (cols, row_range) = sched_part(&sched, n_out, rows, ith, nth, interleave::ROWS);
    if cols.is_empty() {
        return;
    }
    let tiled_end = (rows - rows % 4).min(row_range.end);
    let base = o.out;
    let r = row_range.start;
    let nc = sched.nc.clamp(interleave::ROWS, IL_COL_MAX);
    let mc = if sched.mc == 0 { rows.max(1) } else { sched.mc };
    // Batch-invariant runs keep `vec_dot`'s values where the tiles' order differs
    // (`tile_order`, not `grouped`): every row through the GEMV.
    let tiled_end = if grouped && r + 4 <= tiled_end { tiled_end } else { r };
    // Rows the tiles leave (fewer than four, or all of them where the tiles' order differs) run
    // the GEMV. With other rows in the batch they run column block by column block, on the
    // weights the tiles (or the first of them) just read, instead of one pass over the worker's
    // columns per row, which streams the matrix from memory again for each.
    let rest = tiled_end..row_range.end;
    let rest_in_blocks = !rest.is_empty() && row_range.len() > 1;
    // Row blocks of `mc` tiled rows; one empty block where only the rows left walk the column
    // blocks; none for decode's one row (only the GEMV below).
    let row_blocks = if tiled_end > r { (tiled_end - r).div_ceil(mc) } else { usize::from(rest_in_blocks) };
    for b in 0..row_blocks {
        let rb = r + b * mc;
        let re = (rb + mc).min(tiled_end);
        let mut c0 = cols.start;
        while c0 < cols.end {
            let c1 = (c0 + nc).min(cols.end);
            let gb = &g[c0 * wrb..c1 * wrb];
            // Eight batch rows per tile call (with `mr` 8), then fours.
            let mut r8 = rb;
            // The block decoded once for all its eight-row calls, where the tiles have that form.
            let decoded = il.tiles.decoded.filter(|d| sched.mr >= 8 && re - rb >= d.min_rows && d.len(c1 - c0, o.k) <= dec.len()).map(|d| {
                let dec = &mut dec[..d.len(c1 - c0, o.k)];
                (d.decode)(gb, wrb, dec);
                (d.tile8, &*dec)
            });
            while sched.mr >= 8 && r8 + 8 <= re {
                let y = std::array::from_fn(|j| xrow(r8 + j));
                // SAFETY: columns c0..c1 of rows r8..r8 + 8 are this worker's.
                unsafe {
                    tile_store(tiles, base, ldo, r8, c0, c1 - c0, |out| match decoded {
                        Some((tile8, dec)) => tile8(gb, dec, wrb, y, out, prep),
                        None => (il.tiles.tile8)(gb, wrb, y, out, prep),
                    })
                };
                r8 += 8;
            }
            for r in (r8..re).step_by(4) {
                let y = std::array::from_fn(|j| xrow(r + j));
                // SAFETY: columns c0..c1 of rows r..r + 4 are this worker's.
                unsafe { tile_store(tiles, base, ldo, r, c0, c1 - c0, |out| (il.tiles.tile)(gb, wrb, y, out, prep)) };
            }
            if b + 1 == row_blocks && rest_in_blocks {
                let (r0, n) = (rest.start, rest.len());
                // A batch of two or three rows in one call, each block's weights decoded once
                // for them (SmolLM2 decode steps of 2 and 3 sequences +1-5 and +10-14 %). After
                // a group of four the two or three GEMVs measured faster (6 and 7 sequences:
                // 1-5 % slower through the tile).
                match il.tiles.few.filter(|_| grouped && tiled_end == r) {
                    Some(few) if n == 2 => {
                        let y = [xrow(r0), xrow(r0 + 1)];
                        // SAFETY: columns c0..c1 of these rows are this worker's.
                        unsafe { tile_store(tiles, base, ldo, r0, c0, c1 - c0, |out| (few.tile2)(gb, wrb, y, out, prep)) };
                    }
                    Some(few) if n == 3 => {
                        let y = [xrow(r0), xrow(r0 + 1), xrow(r0 + 2)];
                        // SAFETY: columns c0..c1 of these rows are this worker's.
                        unsafe { tile_store(tiles, base, ldo, r0, c0, c1 - c0, |out| (few.tile3)(gb, wrb, y, out, prep)) };
                    }
                    _ => {
                        for r in rest.clone() {
                            // SAFETY: row r's columns c0..c1 of the [rows][n_out] f32 output
                            // are this worker's.
                            let out = unsafe { std::slice::from_raw_parts_mut(base.add(r * ldo + c0), c1 - c0) };
                            (il.rows)(gb, wrb, xrow(r), out, prep);
                        }
                    }
                }
            }
            c0 = c1;
        }
    }
    if !rest_in_blocks {
        for r in rest {
            // SAFETY: row r's columns `cols` of the [rows][n_out] f32 output are this worker's.
            let out = unsafe { std::slice::from_raw_parts_mut(base.add(r * ldo + cols.start), cols.len()) };
            (il.rows)(&g[cols.start * wrb..cols.end * wrb], wrb, xrow(r), out, prep);
        }
    }
}

/// Worker `ith`'s part of a matmul's `[rows][n_out]` output: (columns, rows). With at least two
/// 16-column blocks per worker, or a batch of fewer than 8 rows (decode), all rows of a
/// contiguous column range, as before. Otherwise (many workers, narrow matrices: 64 workers on
/// a 128-column K projection would leave 56 idle) a 2-D grid of `pc` column parts (whole
/// blocks) × `pr` row parts (multiples of 4 rows, so the 4-row groups and their bits do not
/// change); the `nth - pc·pr` workers left over get nothing.
///
/// Column ranges start at multiples of `unit` (4 for matrices interleaved in groups of four rows,
/// whose `n_out` is then a multiple of 4).
pub fn matmul_part(n_out: usize, rows: usize, ith: usize, nth: usize, unit: usize) -> (Range<usize>, Range<usize>) {
    let blocks = n_out.div_ceil(COL_BLOCK);
    if nth == 1 || blocks >= 2 * nth || rows < 8 {
        let c = split(n_out.div_ceil(unit), ith, nth);
        return ((c.start * unit).min(n_out)..(c.end * unit).min(n_out), 0..rows);
    }
    let groups = rows.div_ceil(4);
    // The grid whose largest part (in blocks × groups of four rows) is smallest; on a tie the
    // one with fewer row parts (each row part decodes its column blocks again).
    let work = |pc: usize| {
        let pr = (nth / pc).min(groups);
        (blocks.div_ceil(pc) * groups.div_ceil(pr), pr)
    };
    let pc = (1..=blocks.min(nth)).min_by_key(|&pc| work(pc)).unwrap_or(1);
    let pr = work(pc).1;
    if ith >= pc * pr {
        return (0..0, 0..0);
    }
    let (ic, ir) = (ith % pc, ith / pc);
    let cb = split(blocks, ic, pc);
    let rg = split(groups, ir, pr);
    ((cb.start * COL_BLOCK).min(n_out)..(cb.end * COL_BLOCK).min(n_out), (rg.start * 4).min(rows)..(rg.end * 4).min(rows))
}

/// A tile call's `J` rows from `r` over `cols` columns from `c0`: `fill` writes them into the
/// worker's `buf` (`[column][row]`, at least `cols · J` values), then [`store_cols`] puts them
/// in the output.
///
/// # Safety
/// As [`store_cols`] for rows `r .. r + J` and columns `c0 .. c0 + cols` (`cols <= IL_COL_MAX`).
#[inline(always)]
unsafe fn tile_store<const J: usize>(buf: &mut [f32], base: *mut f32, ld: usize, r: usize, c0: usize, cols: usize, fill: impl FnOnce(&mut [[f32; J]])) {
    // The worker's buffer, not a fresh zeroed array per call (its 8 KiB of zeros were 3.7 % of
    // a prefill's time, in `memset`): every tile kernel assigns each of its outputs.
    let (out, _) = buf[..cols * J].as_chunks_mut::<J>();
    fill(out);
    // SAFETY: the caller's contract.
    unsafe { store_cols(base, ld, r, c0, out) };
}

/// Tile results `o[i][j]` (column `c0 + i`, batch row `r + j`) into an f32 output of rows `ld`
/// apart.
///
/// # Safety
/// `base` is that output; rows `r .. r + J` and columns `c0 .. c0 + o.len()` lie inside it and
/// no other worker writes them during the node.
pub(super) unsafe fn store_cols<const J: usize>(base: *mut f32, ld: usize, r: usize, c0: usize, o: &[[f32; J]]) {
    for (i, col) in o.iter().enumerate() {
        for (j, &v) in col.iter().enumerate() {
            // SAFETY: inside the output and this worker's (the function's contract).
            unsafe { *base.add((r + j) * ld + c0 + i) = v };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{matmul_part, COL_BLOCK};
    use crate::sched::split;

    /// Every output element of a matmul belongs to exactly one worker; row parts start at
    /// multiples of 4 and column parts at 16-column blocks or at multiples of `unit`; with few
    /// rows or wide matrices the partition is the old column split (in units); and a narrow
    /// matrix keeps most workers busy.
    #[test]
    fn matmul_parts_cover_the_output_once() {
        for (n_out, rows) in [(128usize, 512usize), (64, 64), (2048, 512), (576, 1), (192, 7), (50, 33), (16, 8), (896, 13), (36, 1), (20, 9)] {
            for unit in [1, 4].into_iter().filter(|u| n_out % u == 0) {
                for nth in 1..=64 {
                    let mut seen = vec![0u8; n_out * rows];
                    let mut busy = 0;
                    for ith in 0..nth {
                        let (cols, rr) = matmul_part(n_out, rows, ith, nth, unit);
                        if cols.is_empty() || rr.is_empty() {
                            continue;
                        }
                        busy += 1;
                        assert!(rr.start % 4 == 0 && (cols.start % COL_BLOCK == 0 || rr == (0..rows)));
                        assert!(cols.start % unit == 0 && cols.end % unit == 0, "n_out {n_out} nth {nth} unit {unit}: {cols:?}");
                        for r in rr {
                            for c in cols.clone() {
                                seen[r * n_out + c] += 1;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&n| n == 1), "n_out {n_out} rows {rows} nth {nth}");
                    let blocks = n_out.div_ceil(COL_BLOCK);
                    if rows < 8 || blocks >= 2 * nth {
                        let s = |i| split(n_out / unit, i, nth);
                        assert!((0..nth).all(|i| matmul_part(n_out, rows, i, nth, unit) == (s(i).start * unit..s(i).end * unit, 0..rows)));
                    } else {
                        let units = blocks * rows.div_ceil(4);
                        assert!(2 * busy >= nth.min(units), "n_out {n_out} rows {rows} nth {nth}: {busy} busy");
                    }
                }
            }
        }
    }
}
