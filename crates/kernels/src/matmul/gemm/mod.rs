//! Panel GEMM for prefill: `out[r][c] = w[c] · x[r]` over many activation rows at once, for the
//! weight types with one scale (and min) per 32 elements: Q4_0, Q5_0, Q8_0, MXFP4 (Q8_0
//! activations; MXFP4's doubled E2M1 values `−12 ..= 12` as codes, half its E8M0 scale as the
//! block scale), Q4_1, Q5_1 (Q8_1) and the K-quants Q4_K, Q5_K (Q8_K; sub-block scale and min
//! folded to f32);
//! and Q6_K (Q8_K), whose scales cover 16 elements: its blocks carry two scales in place of a
//! scale and a min, and the integer sums of the two halves are kept apart ([`split16`]).
//!
//! Where the per-row dot product (`vec_dot`) decodes every weight block again for every
//! activation row and reduces each (row, column) pair horizontally, this kernel decodes a panel
//! of [`PANEL`] weight rows (output columns) once into an interleaved layout and streams all
//! activation rows past it: within a 32-element block, group `g` of 4 elements of all 8 columns
//! sits in one 32-byte vector, so one `vpdpbusd` (u8 × i8 → i32, 4 products per lane) advances
//! 8 columns at once, lanes being columns (no horizontal sums), and 4 rows share each loaded
//! weight vector. Weights are stored unsigned (`u = q + o`; `w = d·(u − o) + m`), the offset
//! removed per block with the activation block sum `Σy`.
//!
//! Arithmetic per (row, column): `acc = fma((Σ u·y − o·Σy) as f32, d_w·d_x, acc)`, then for
//! types with a min `acc = fma(m_w, s_x, acc)` (`s_x = d_x·Σy`: Q8_1's `s`, or computed from
//! Q8_K's `bsums`), blocks in order. The integer sums are exact, so the
//! portable twin ([`panel_portable`]) and the AVX-512 VNNI kernel are bit-identical; against
//! `vec_dot` (ggml's order) only the float summation order differs. Not used in
//! batch-invariant mode (its rows would depend on the batch size) — the scheduler decides.
//!
//! The panels are decoded from the plain rows ([`Weights::Rows`]) or, on the x86 tables for
//! Q4_0 and Q4_1 (AVX-512: and Q5_0, Q5_1, Q8_0, Q4_K, Q6_K), from the copy interleaved at
//! load ([`Weights::Groups`], `groups`): the same bytes at a fraction of the work, which lets
//! the panel pay from 8 rows (a batched decode step) and gives tensor-parallel column slices,
//! which have only that copy, the panel too.

use crate::quant::blocks::*;
use crate::quant::portable::{mxfp4_values, q4_0_values, q5_0_values, q5_1_values, q6_k_values};
use crate::matmul::schedule::Schedule;
use crate::simd::Isa;
use crate::DType;

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
pub mod groups;
pub mod panel;
pub mod tile;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use panel::{act_block, panel_portable, Act, PanelJob, PanelLayout, PACKED_BLOCK, PANEL};
use tile::{pack_rows, row_scalars, PairJob, TileJob, TileUnit, PAIR_ROWS, ROW_SCALARS};

/// Weight types the panel GEMM handles.
pub fn supported(t: DType) -> bool {
    matches!(t, DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::MXFP4 | DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K | DType::Q6K)
}

/// Whether the panel GEMM of `t` runs a SIMD kernel under `isa`'s table (AVX-512, AVX2, SME
/// and dotprod — `usmmla` with i8mm, else `sdot`, Q8_0 on its signed values —: every
/// supported type; elsewhere the portable twin).
pub fn simd(t: DType, isa: Isa) -> bool {
    supported(t) && match isa {
        Isa::Avx512 | Isa::Amx | Isa::Sme | Isa::Avx2 => true,
        Isa::Dotprod => true,
        Isa::Portable | Isa::Neon => false,
    }
}

/// Whether the AMX table runs `t`'s panel GEMM on the tile unit: the types with Q8_0 or Q8_1
/// activations. The K-quants (Q8_K activations) stay on the AVX-512 VNNI panel kernel: on
/// Qwen2.5's feed-forward down projections (Q4_K and Q6_K, k = 4864) the tiles took 1.3–1.6×
/// VNNI's time at 1 and 16 threads (docs/benchmarks.md).
pub fn amx_runs(t: DType) -> bool {
    supported(t) && act_of(t) != Act::Q8K
}

/// The panel GEMM's fixed schedule before tuning for a `t` matrix under `isa`'s table: AMX's
/// where its tiles run ([`amx_runs`]); the AVX-512 kernel's 8-row tiles where the CPU issues
/// 512-bit `vpdpbusd` at full rate (`simd::x86::vnni512_full_rate`: Zen 5 server, 16 rows of
/// Q4_0‥Q6_K in L2 5–24 % faster than 4-row tiles; on Zen 4 they lose); 2-row tiles for
/// Q6_K on the AVX2 table without AVX-VNNI (`simd::x86::avx_vnni`): its two scales a block
/// keep both halves' i32 sums apart beside the `maddubs` i16 sums and the float sums — 32
/// vectors for 4 rows of two panels, 16 for 2, of 16 registers — and 4-row tiles spill
/// (Zen 5 with `CORELM_AVX_VNNI=0`, one thread, Q6_K 4864 × 896: 4 rows 977–1001 µs, 2 rows
/// 754–774 at 16 rows; 3302 against 2591 at 64; 2048 × 640 at 512 rows 8073 against 6179;
/// with AVX-VNNI's single sums 4 rows stay faster, 660 against 846); else 4-row tiles.
pub fn default_schedule(isa: Isa, t: DType) -> Schedule {
    if isa == Isa::Amx && amx_runs(t) {
        return Schedule::AMX_DEFAULT;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() && crate::simd::x86::vnni512_full_rate() {
        return Schedule::PANEL_WIDE_DEFAULT;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && t == DType::Q6K && !crate::simd::x86::avx_vnni() {
        return Schedule::PANEL_NARROW_DEFAULT;
    }
    Schedule::PANEL_DEFAULT
}

/// Whether the dotprod table's panel kernel is `usmmla`'s ([`aarch64::panel_i8mm`]): on a
/// CPU with the 8-bit matrix multiply extension.
pub fn i8mm() -> bool {
    #[cfg(target_arch = "aarch64")]
    return crate::simd::aarch64::has_i8mm();
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// Rows of the matrix unit's tile this CPU has (SME: a quarter of the streaming vector's bytes,
/// when it runs [`Isa::Sme`]'s features; AMX: [`PAIR_ROWS`]); 0 without one.
pub fn matrix_tile_rows() -> usize {
    #[cfg(target_arch = "aarch64")]
    if Isa::Sme.missing().is_empty() {
        return crate::simd::aarch64::sme_vector_bytes() / 4;
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::Amx.missing().is_empty() {
        return PAIR_ROWS;
    }
    0
}

/// Where a panel GEMM's weights come from: the matrix's plain rows, or its copy interleaved at
/// load (`matmul::layout`), which the x86 tables decode for the types [`packs_groups`] names —
/// the same panels, so the same bits.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    /// Rows of `row_bytes(t, k)` bytes.
    Rows(&'a [u8]),
    /// Groups of four rows (`matmul::layout`).
    Groups(&'a [u8]),
}

impl<'a> Weights<'a> {
    fn bytes(self) -> &'a [u8] {
        match self {
            Weights::Rows(w) | Weights::Groups(w) => w,
        }
    }
}

/// Whether `isa`'s panel GEMM decodes `t`'s interleaved groups ([`Weights::Groups`]): the
/// AVX-512 tables (AMX's included) and the AVX2 table for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K
/// and Q6_K, each in its table's layout (AVX2: Q5 and Q6_K folded).
pub fn packs_groups(t: DType, isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return match isa {
        Isa::Avx512 | Isa::Amx | Isa::Avx2 => groups::packs_groups(t),
        _ => false,
    };
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (t, isa);
        false
    }
}

/// Types with a scale per 16 elements: a packed block holds the scales of its two halves (in
/// the scale and min slots), `Σy` is kept per half, and there is no min term.
pub fn split16(t: DType) -> bool {
    t == DType::Q6K
}

fn act_of(t: DType) -> Act {
    match t {
        DType::Q4_1 | DType::Q5_1 => Act::Q8_1,
        DType::Q4K | DType::Q5K | DType::Q6K => Act::Q8K,
        _ => Act::Q8_0,
    }
}

/// The offset `o` of a type's unsigned codes (`u = q + o`).
fn offset(t: DType) -> i32 {
    match t {
        DType::Q4_0 => 8,
        DType::Q5_0 => 16,
        DType::Q8_0 => 128,
        DType::MXFP4 => 12,
        DType::Q6K => 32,
        _ => 0,
    }
}

/// The largest unsigned code `u` of a type's packed panels (its values' bits; MXFP4's codes
/// reach 24, so they take the 5-bit types' kernels).
fn umax(t: DType) -> i32 {
    match t {
        DType::Q4_0 | DType::Q4_1 | DType::Q4K => 15,
        DType::Q5_0 | DType::Q5_1 | DType::Q5K | DType::MXFP4 => 31,
        DType::Q6K => 63,
        _ => 255,
    }
}

/// Column blocks ahead whose weights the x86 panel kernels ask for while they run one: at one,
/// the first lines of the next block were still on their way when its decoding began (a
/// 16-row Q4_1 GEMM of 576 × 1536 from memory took 165 µs with the next block asked for at
/// once, 141 µs spread at two or more blocks ahead, 127 µs with the matrix in L2).
const AHEAD: usize = 2;

/// Per-thread buffers, sized once: the packed panels of one column block (up to `max_panels`
/// panels of rows of up to `max_k` elements), the activation half-block sums of up to
/// `max_rows` rows, where a matrix unit runs the panels one packed row tile of its
/// `tile_rows` rows ([`tile::pack_rows`]), and on x86 (AMX's tiles, which read the rows in
/// place, and the x86 panel kernels) the block scalars of all rows ([`tile::row_scalars`]).
pub struct GemmScratch {
    panel: Vec<u8>,
    ysum: Vec<i32>,
    tile_rows: usize,
    tile_codes: Vec<i8>,
    tile_sc: Vec<u8>,
    row_sc: Vec<u8>,
}

impl GemmScratch {
    /// Sized for this CPU's matrix unit, if it has one ([`matrix_tile_rows`]).
    pub fn new(max_k: usize, max_rows: usize, max_panels: usize) -> Self {
        Self::with_tile_rows(max_k, max_rows, max_panels, matrix_tile_rows())
    }

    /// With room for a packed row tile of `tile_rows` rows (0: none).
    pub fn with_tile_rows(max_k: usize, max_rows: usize, max_panels: usize, tile_rows: usize) -> Self {
        let nb = max_k / 32;
        // AMX's tiles (16 rows) need every row's scalars; so does the AMX model, anywhere.
        GemmScratch {
            panel: vec![0; max_panels.max(1) * nb * PACKED_BLOCK],
            ysum: vec![0; max_rows * (max_k / 16)],
            tile_rows,
            tile_codes: vec![0; nb * 32 * tile_rows],
            tile_sc: vec![0; nb * tile_rows * ROW_SCALARS],
            // AMX's tiles (and its model, anywhere) and the x86 panel kernels read every row's.
            row_sc: vec![0; if tile_rows == PAIR_ROWS || cfg!(target_arch = "x86_64") { nb * max_rows * ROW_SCALARS } else { 0 }],
        }
    }

    pub fn fits(&self, k: usize, rows: usize) -> bool {
        self.panel.len() >= k / 32 * PACKED_BLOCK && self.ysum.len() >= rows * (k / 16) && self.tile_codes.len() >= k * self.tile_rows
    }

    /// Whether the block scalars of `rows` rows of `k` values fit ([`TileUnit::Pair`]).
    fn fits_row_scalars(&self, k: usize, rows: usize) -> bool {
        self.row_sc.len() >= k / 32 * rows * ROW_SCALARS
    }

    /// Panels of rows of `k` values one column block can hold.
    pub fn panels(&self, k: usize) -> usize {
        self.panel.len() / (k / 32 * PACKED_BLOCK).max(1)
    }
}

/// Q4_K/Q5_K block `b` (sub-block `j = b % 8` of super-block `b / 8`) of a plain row: `j`, its
/// scale and min folded to f32, and the super-block's `qs` and (Q5_K) `qh`. Its values are the
/// nibbles of `qs[32·(j/2)..]`, low for even j, high for odd, with (Q5_K) bit j of `qh[l]` as
/// the fifth.
#[allow(clippy::type_complexity)]
fn k_sub_block(t: DType, row: &[u8], b: usize) -> (usize, f32, f32, &[u8; QK_K / 2], Option<&[u8; QK_K / 8]>) {
    let (sb, j) = (b / 8, b % 8);
    let (dd, dmin, scales, qs, qh) = if t == DType::Q4K {
        let x = &as_blocks::<BlockQ4K>(row)[sb];
        (x.d, x.dmin, &x.scales, &x.qs, None)
    } else {
        let x = &as_blocks::<BlockQ5K>(row)[sb];
        (x.d, x.dmin, &x.scales, &x.qs, Some(&x.qh))
    };
    let (sc, mn) = scale_min_k4(j, scales);
    (j, dd.to_f32() * sc as f32, -(dmin.to_f32() * mn as f32), qs, qh)
}

/// Decode weight rows `c0 .. c0 + n` (n ≤ 8, missing columns zero) of `w` into `panel`.
fn pack(t: DType, w: &[u8], k: usize, c0: usize, n: usize, panel: &mut [u8]) {
    let nb = k / 32;
    let rb = crate::row_bytes(t, k);
    for b in 0..nb {
        let blk = &mut panel[b * PACKED_BLOCK..(b + 1) * PACKED_BLOCK];
        let (qs, sc) = blk.split_at_mut(32 * PANEL);
        let mut d = [0f32; PANEL];
        let mut m = [0f32; PANEL];
        for col in 0..PANEL {
            let mut u = [0u8; 32];
            if col < n {
                let row = &w[(c0 + col) * rb..(c0 + col + 1) * rb];
                match t {
                    DType::Q4_0 => {
                        let x = &as_blocks::<BlockQ4_0>(row)[b];
                        d[col] = x.d.to_f32();
                        u = q4_0_values(x).map(|v| (v + 8) as u8);
                    }
                    DType::Q5_0 => {
                        let x = &as_blocks::<BlockQ5_0>(row)[b];
                        d[col] = x.d.to_f32();
                        u = q5_0_values(x).map(|v| (v + 16) as u8);
                    }
                    DType::Q8_0 => {
                        let x = &as_blocks::<BlockQ8_0>(row)[b];
                        d[col] = x.d.to_f32();
                        u = x.qs.map(|v| (v as i32 + 128) as u8);
                    }
                    DType::MXFP4 => {
                        let x = &as_blocks::<BlockMXFP4>(row)[b];
                        d[col] = e8m0_half(x.e);
                        u = mxfp4_values(&x.qs).map(|v| (v + 12) as u8);
                    }
                    DType::Q4_1 => {
                        let x = &as_blocks::<BlockQ4_1>(row)[b];
                        (d[col], m[col]) = (x.d.to_f32(), x.m.to_f32());
                        for j in 0..16 {
                            u[j] = x.qs[j] & 0xF;
                            u[j + 16] = x.qs[j] >> 4;
                        }
                    }
                    DType::Q5_1 => {
                        let x = &as_blocks::<BlockQ5_1>(row)[b];
                        (d[col], m[col]) = (x.d.to_f32(), x.m.to_f32());
                        u = q5_1_values(x);
                    }
                    DType::Q4K | DType::Q5K => {
                        let (j, qs, qh);
                        (j, d[col], m[col], qs, qh) = k_sub_block(t, row, b);
                        for (l, v) in u.iter_mut().enumerate() {
                            let q = qs[(j / 2) * 32 + l];
                            *v = if j % 2 == 0 { q & 0xF } else { q >> 4 };
                            if let Some(qh) = qh {
                                *v |= ((qh[l] >> j) & 1) << 4;
                            }
                        }
                    }
                    DType::Q6K => {
                        let (sb, j) = (b / 8, b % 8);
                        let x = &as_blocks::<BlockQ6K>(row)[sb];
                        let dd = x.d.to_f32();
                        (d[col], m[col]) = (dd * x.scales[2 * j] as f32, dd * x.scales[2 * j + 1] as f32);
                        let q = q6_k_values(x);
                        for (v, &qv) in u.iter_mut().zip(&q[j * 32..j * 32 + 32]) {
                            *v = (qv as i32 + 32) as u8;
                        }
                    }
                    _ => unreachable!("checked by supported()"),
                }
            } else {
                // A padding column: codes at the offset, zero scale and min: contributes 0.
                u = [offset(t) as u8; 32];
            }
            for g in 0..8 {
                qs[g * 32 + col * 4..g * 32 + col * 4 + 4].copy_from_slice(&u[g * 4..g * 4 + 4]);
            }
        }
        for col in 0..PANEL {
            sc[col * 4..col * 4 + 4].copy_from_slice(&d[col].to_le_bytes());
            sc[32 + col * 4..32 + col * 4 + 4].copy_from_slice(&m[col].to_le_bytes());
        }
    }
}

/// `Σy` of both 16-element halves of every 32-block of every activation row, at
/// `out[(r · nb + b) · 2 + half]`.
fn block_sums(x: &[u8], xrb: usize, rows: usize, nb: usize, act: Act, out: &mut [i32]) {
    for r in 0..rows {
        let row = &x[r * xrb..(r + 1) * xrb];
        for b in 0..nb {
            let y = act_block(row, b, act).2;
            for (h, half) in y.chunks_exact(16).enumerate() {
                out[(r * nb + b) * 2 + h] = half.iter().map(|&v| v as i32).sum();
            }
        }
    }
}

/// `out[r * n_out + c] = w[c] · x[r]` for `c` in `cols`, all `rows` activation rows (`x`, rows
/// of `xrb` bytes in `t`'s `vec_dot_type`), blocked as `sched` says (its `nc` capped by what
/// `scratch` holds; [`Schedule`]: the bits do not depend on it). `isa`: the table's level,
/// which this CPU runs (the caller's); its SIMD kernel where [`simd`] says so (SME, AMX: the
/// matrix unit's, through [`gemm_impl`]'s row tiles), else the portable twin.
///
/// Loop nest, outermost first: column blocks of `nc` (their panels decoded once), inner blocks
/// of `kc` 32-value blocks, row blocks of `mc`, the block's panels, register tiles of `mr` rows.
///
/// # Safety
/// `out` must address `rows · n_out` f32 of which this call alone writes columns `cols`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(
    t: DType,
    w: Weights,
    k: usize,
    cols: std::ops::Range<usize>,
    x: &[u8],
    xrb: usize,
    rows: usize,
    out: *mut f32,
    n_out: usize,
    isa: Isa,
    sched: &Schedule,
    scratch: &mut GemmScratch,
) {
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Sme {
        let r = crate::simd::aarch64::sme_vector_bytes() / 4;
        // SAFETY: the caller's contract; `isa` (SME, checked by the caller's table) runs the
        // kernel on tiles of `r` rows.
        return unsafe { gemm_impl(t, w, k, cols, (x, xrb, rows), (out, n_out), Some(TileUnit::Panel(r, crate::matmul::aarch64::sme::panel_tile)), isa, sched, scratch) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx && amx_runs(t) {
        // SAFETY: the caller's contract; `isa` (AMX, checked by the caller's table, which also
        // means the process holds the tile data) runs the kernel.
        return unsafe { gemm_impl(t, w, k, cols, (x, xrb, rows), (out, n_out), Some(TileUnit::Pair(amx::panel_pair)), isa, sched, scratch) };
    }
    // SAFETY: the caller's contract.
    unsafe { gemm_impl(t, w, k, cols, (x, xrb, rows), (out, n_out), None, isa, sched, scratch) }
}

/// [`gemm`]'s loop nest, with the panels run by `tiles`' matrix-unit kernel where given: on
/// row tiles of its rows, packed once per tile and inner block range ([`tile::pack_rows`];
/// `scratch` must hold a tile of that many rows), one panel per call or two ([`TileUnit`]);
/// otherwise by `isa`'s panel kernel. With [`tile::panel_tile_portable`] this is the portable
/// model of the SME GEMM, with [`tile::pair_tile_portable`] of the AMX GEMM.
///
/// # Safety
/// As [`gemm`], and the kernel of `tiles` runs on this CPU.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_impl(
    t: DType,
    w: Weights,
    k: usize,
    cols: std::ops::Range<usize>,
    (x, xrb, rows): (&[u8], usize, usize),
    (out, n_out): (*mut f32, usize),
    tiles: Option<TileUnit>,
    isa: Isa,
    sched: &Schedule,
    scratch: &mut GemmScratch,
) {
    debug_assert!(supported(t) && k.is_multiple_of(32) && scratch.fits(k, rows));
    assert!(matches!(w, Weights::Rows(_)) || (cols.start.is_multiple_of(4) && cols.end.is_multiple_of(4)), "interleaved groups are packed four columns at a time");
    assert!(tiles.is_none_or(|u| (1..=64).contains(&u.rows()) && u.rows() <= scratch.tile_rows), "the scratch holds no row tile of this size");
    let nb = k / 32;
    let (o, act, split) = (offset(t), act_of(t), split16(t));
    let has_min = act != Act::Q8_0 && !split;
    let panels_max = scratch.panels(k).max(1);
    let pair = matches!(tiles, Some(TileUnit::Pair(_)));
    // The x86 panel kernels read the block scalars AMX's tiles read, converted once per call.
    let x86_sc = cfg!(target_arch = "x86_64") && tiles.is_none() && matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Amx) && simd(t, isa);
    assert!(!(pair || x86_sc) || scratch.fits_row_scalars(k, rows), "the scratch holds no row scalars for AMX's tiles or the x86 panel kernels");
    let GemmScratch { panel, ysum, tile_codes, tile_sc, row_sc, .. } = scratch;
    if o != 0 {
        block_sums(x, xrb, rows, nb, act, ysum);
    }
    if pair || x86_sc {
        // The x86 panel kernels start their sums at the offset terms with the sign turned
        // (`x86::start_offsets`): made with `−o`, the scalars hold `−o·Σy`; AMX's tiles
        // subtract `o·Σy`.
        let os = (if x86_sc { -o } else { o }, split);
        match isa {
            // SAFETY: the x86 tables' CPUs have AVX2 and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 | Isa::Amx => unsafe { x86::row_scalars(x, xrb, rows, nb, act, ysum, os, row_sc) },
            _ => row_scalars(x, xrb, rows, nb, act, ysum, os, row_sc),
        }
    }
    // The x86 panel kernels take two panels per pass (AVX2: where its kernel covers the type).
    let pairs = cfg!(target_arch = "x86_64") && (isa.avx512() || (isa == Isa::Avx2 && simd(t, isa)));
    // AVX-512's kernel of two panels reads them packed as a pair (`PanelLayout::pair`): panels
    // 2i and 2i + 1 of a column block, each unit of both one 512-bit load; a last odd panel,
    // AMX's tiles and every other kernel read panels alone.
    let joined = pairs && isa.avx512() && tiles.is_none();
    // The interleaved groups whose pairs are packed in one pass (`groups::pack_groups_pair`:
    // Zen 5, 16 rows of Q4_1 576 × 1536, 4–6 % less time in L2, 9–15 % from memory; Q4_K and
    // Q6_K 3–6 % less).
    #[cfg(target_arch = "x86_64")]
    let one_pass = match w {
        Weights::Groups(g) if joined && packs_groups(t, isa) => Some(g),
        _ => None,
    };
    // The AVX2 table's kernels with AVX-VNNI's `vpdpbusd` where the CPU has it (the same bits).
    #[cfg(target_arch = "x86_64")]
    let avx_vnni = isa == Isa::Avx2 && crate::simd::x86::avx_vnni();
    let nc = sched.nc.clamp(PANEL, panels_max * PANEL) / PANEL * PANEL;
    let kc = if sched.kc == 0 { nb } else { sched.kc.min(nb) };
    let mc = if sched.mc == 0 { rows.max(1) } else { sched.mc };
    let pb = nb * PACKED_BLOCK;
    let rb = crate::row_bytes(t, k);
    // Panels decoded by this call, counted once at its end: a shared counter bumped per panel
    // is a cache line every worker writes (a 16-sequence step decodes ~25 000 panels).
    let mut decoded = 0;
    let mut c0 = cols.start;
    while c0 < cols.end {
        let c1 = (c0 + nc).min(cols.end);
        let n_panels = (c1 - c0).div_ceil(PANEL);
        // Weight rows into L2 ahead of their column block's decoding: they come from memory,
        // a few lines per row at a time, which the hardware prefetcher follows poorly (a short
        // batch waits on them). The x86 panel kernels ask for the block [`AHEAD`] blocks on a
        // few lines per step of their loops (`PanelJob::ahead`: this column block's calls
        // share it); elsewhere the next block is asked for here, all at once.
        // (Four interleaved rows take the bytes of four plain rows: the same ranges.)
        let wb = w.bytes();
        let in_bytes = |r: std::ops::Range<usize>| &wb[(r.start * rb).min(wb.len())..(r.end * rb).min(wb.len())];
        let ahead = if x86_sc {
            // The first column block also asks for those between it and its block ahead.
            let from = if c0 == cols.start { c1 } else { c1 + (AHEAD - 1) * nc };
            in_bytes(from.min(cols.end)..(c1 + AHEAD * nc).min(cols.end))
        } else {
            crate::simd::prefetch(in_bytes(c1..(c1 + nc).min(cols.end)), crate::simd::CacheLevel::L2);
            &[]
        };
        // This column block's panel kernel calls, each given its share of `ahead`.
        let calls = (nb.div_ceil(kc) * rows.div_ceil(mc) * n_panels.div_ceil(if pairs { 2 } else { 1 })).max(1);
        let mut call = 0;
        let mut share = || {
            let part = &ahead[ahead.len() * call / calls..ahead.len() * (call + 1) / calls];
            call = (call + 1).min(calls - 1);
            part
        };
        for p in 0..n_panels {
            let pc = c0 + p * PANEL;
            // Where panel p goes: alone, or as half p % 2 of the pair it makes with its neighbour.
            let (panel, lay) = if joined && (p | 1) < n_panels {
                (&mut panel[(p & !1) * pb..((p & !1) + 2) * pb], PanelLayout::pair(p % 2))
            } else {
                (&mut panel[p * pb..(p + 1) * pb], PanelLayout::SINGLE)
            };
            decoded += 1;
            #[cfg(not(target_arch = "x86_64"))]
            let _ = lay; // the pairs' layout is the x86 packers'
            // A whole pair from the groups in one pass, at its first panel; its second is
            // then done.
            #[cfg(target_arch = "x86_64")]
            if let Some(g) = one_pass.filter(|_| lay != PanelLayout::SINGLE && c1 - (p & !1) * PANEL - c0 >= 2 * PANEL) {
                if p % 2 == 0 {
                    // SAFETY: `one_pass` holds groups only where `packs_groups` said so for an
                    // AVX-512 table: the caller's CPU runs it.
                    unsafe { groups::pack_groups_pair(t, g, k, pc, panel) };
                }
                continue;
            }
            match (w, isa) {
                // SAFETY (both): checked by `packs_groups`: the caller's CPU runs an AVX-512
                // table, or AVX2's, whose features these need.
                #[cfg(target_arch = "x86_64")]
                (Weights::Groups(g), _) if packs_groups(t, isa) && isa.avx512() => unsafe { groups::pack_groups(t, g, k, pc, (c1 - pc).min(PANEL), panel, lay) },
                #[cfg(target_arch = "x86_64")]
                (Weights::Groups(g), Isa::Avx2) if packs_groups(t, isa) => unsafe { groups::pack_groups_avx2(t, g, k, pc, (c1 - pc).min(PANEL), panel) },
                (Weights::Groups(_), _) => panic!("the {isa:?} table's panel GEMM does not decode {t}'s interleaved groups"),
                // SAFETY: the caller's CPU runs the x86 tables, whose features (AVX2, F16C)
                // this needs.
                #[cfg(target_arch = "x86_64")]
                (Weights::Rows(w), Isa::Avx2 | Isa::Avx512 | Isa::Amx) => unsafe { x86::pack(t, w, k, pc, (c1 - pc).min(PANEL), o, panel, lay) },
                (Weights::Rows(w), _) => pack(t, w, k, pc, (c1 - pc).min(PANEL), panel),
            }
        }
        for b0 in (0..nb).step_by(kc) {
            let b1 = (b0 + kc).min(nb);
            // Output row `row`'s accumulators for the panel at column `pc` (`n` real columns):
            // zeros for the first inner block range, the partial sums so far for the next.
            let load = |row: usize, pc: usize, n: usize| {
                let mut a = [0f32; PANEL];
                if b0 > 0 {
                    for (j, v) in a.iter_mut().enumerate().take(n) {
                        // SAFETY: row < rows and pc + j < cols.end ≤ n_out; this call wrote
                        // this element in the previous inner block range.
                        *v = unsafe { *out.add(row * n_out + pc + j) };
                    }
                }
                a
            };
            let save = |row: usize, pc: usize, n: usize, acc: &[f32; PANEL]| {
                for (j, &v) in acc.iter().enumerate().take(n) {
                    // SAFETY: as above; this call owns these columns.
                    unsafe { *out.add(row * n_out + pc + j) = v };
                }
            };
            for r0 in (0..rows).step_by(mc) {
                let r1 = (r0 + mc).min(rows);
                if let Some(TileUnit::Pair(kernel)) = tiles {
                    for t0 in (r0..r1).step_by(PAIR_ROWS) {
                        let tr = (r1 - t0).min(PAIR_ROWS);
                        for p in (0..n_panels).step_by(2) {
                            // The last of an odd number of panels goes with itself as the
                            // second, whose sums are not stored.
                            let q = (p + 1).min(n_panels - 1);
                            let (pc, qc) = (c0 + p * PANEL, c0 + q * PANEL);
                            let (n, m) = ((c1 - pc).min(PANEL), if q > p { (c1 - qc).min(PANEL) } else { 0 });
                            let mut acc = [[0f32; 2 * PANEL]; PAIR_ROWS];
                            for (i, a) in acc.iter_mut().enumerate().take(tr) {
                                a[..PANEL].copy_from_slice(&load(t0 + i, pc, n));
                                a[PANEL..].copy_from_slice(&load(t0 + i, qc, m));
                            }
                            let panels = [&panel[p * pb..(p + 1) * pb], &panel[q * pb..(q + 1) * pb]];
                            let job = PairJob { x: &x[t0 * xrb..], xrb, act, rows: tr, b0, b1, sc: row_sc, n_rows: rows, row0: t0, panels, split, has_min };
                            // SAFETY: the caller's: `kernel` runs on this CPU.
                            unsafe { kernel(&job, &mut acc[..tr]) };
                            for (i, a) in acc.iter().enumerate().take(tr) {
                                let (lo, hi) = a.split_at(PANEL);
                                save(t0 + i, pc, n, lo.try_into().expect("a panel"));
                                save(t0 + i, qc, m, hi.try_into().expect("a panel"));
                            }
                        }
                    }
                    continue;
                }
                if let Some(TileUnit::Panel(r, kernel)) = tiles {
                    for t0 in (r0..r1).step_by(r) {
                        let tr = (r1 - t0).min(r);
                        pack_rows(&x[t0 * xrb..], xrb, tr, r, (b0, b1, nb), act, &ysum[t0 * nb * 2..], o, split, tile_codes, tile_sc);
                        for p in 0..n_panels {
                            let pc = c0 + p * PANEL;
                            let n = (c1 - pc).min(PANEL);
                            let mut acc = [[0f32; PANEL]; 64];
                            for (i, a) in acc.iter_mut().enumerate().take(tr) {
                                *a = load(t0 + i, pc, n);
                            }
                            let job = TileJob { act: tile_codes, sc: tile_sc, panel: &panel[p * pb + b0 * PACKED_BLOCK..(p + 1) * pb], nblk: b1 - b0, r, rows: tr, split, has_min };
                            // SAFETY: the caller's: `kernel` runs on this CPU.
                            unsafe { kernel(&job, &mut acc[..tr]) };
                            for (i, a) in acc.iter().enumerate().take(tr) {
                                save(t0 + i, pc, n, a);
                            }
                        }
                    }
                    continue;
                }
                let mut p = 0;
                while p < n_panels {
                    let pc = c0 + p * PANEL;
                    let n = (c1 - pc).min(PANEL);
                    // Row r of this call is row r0 + r of the output.
                    let acc0 = |r: usize| load(r0 + r, pc, n);
                    let store = |r: usize, acc: &[f32; PANEL]| save(r0 + r, pc, n, acc);
                    let job = PanelJob {
                        panel: &panel[p * pb..(p + 1) * pb],
                        nb,
                        b0,
                        b1,
                        mr: sched.mr,
                        o,
                        umax: umax(t),
                        act,
                        split,
                        x: &x[r0 * xrb..r1 * xrb],
                        xrb,
                        ysum: &ysum[r0 * nb * 2..],
                        sc: if x86_sc { &row_sc[r0 * ROW_SCALARS..] } else { &[] },
                        sc_rows: rows,
                        rows: r1 - r0,
                        ahead: share(),
                    };
                    // x86: two panels per pass where there are two (each row's broadcasts and
                    // block scalars serve both); panel p + 1's outputs are `(r, 1)`.
                    #[cfg(target_arch = "x86_64")]
                    if pairs && p + 1 < n_panels {
                        let n2 = (c1 - pc - PANEL).min(PANEL);
                        let pcs = [(pc, n), (pc + PANEL, n2)];
                        let second = &panel[(p + 1) * pb..(p + 2) * pb];
                        let (acc0, store) = (|r, q: usize| load(r0 + r, pcs[q].0, pcs[q].1), |r, q: usize, acc: &[f32; PANEL]| save(r0 + r, pcs[q].0, pcs[q].1, acc));
                        if joined {
                            // SAFETY: the caller's CPU runs the AVX-512 table, whose features this
                            // needs; panels p and p + 1 were packed as a pair.
                            unsafe { x86::panel_pair(PanelJob { panel: &panel[p * pb..(p + 2) * pb], ..job }, acc0, store) };
                        } else if avx_vnni {
                            // SAFETY: the caller's CPU runs the AVX2 table, whose features this
                            // needs, and has AVX-VNNI (`avx_vnni`).
                            unsafe { x86::panel_pair_avx_vnni(job, second, acc0, store) };
                        } else {
                            // SAFETY: the caller's CPU runs the AVX2 table, whose features this needs.
                            unsafe { x86::panel_pair_avx2(job, second, acc0, store) };
                        }
                        p += 2;
                        continue;
                    }
                    p += 1;
                    match isa {
                        // SAFETY (all three): the caller's CPU runs `isa`'s table, whose features these
                        // need, and AVX-VNNI where `avx_vnni` says so.
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx512 | Isa::Amx => unsafe { x86::panel(job, acc0, store) },
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx2 if simd(t, isa) && avx_vnni => unsafe { x86::panel_avx_vnni(job, acc0, store) },
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx2 if simd(t, isa) => unsafe { x86::panel_avx2(job, acc0, store) },
                        // SAFETY (both): the dotprod table is built only on a CPU with
                        // `dotprod`; `i8mm()` detected the other.
                        #[cfg(target_arch = "aarch64")]
                        Isa::Dotprod if i8mm() => unsafe { aarch64::panel_i8mm(job, acc0, store) },
                        #[cfg(target_arch = "aarch64")]
                        Isa::Dotprod if simd(t, isa) => unsafe { aarch64::panel_dotprod(job, acc0, store) },
                        _ => panel_portable(job, acc0, store),
                    }
                }
            }
        }
        c0 = c1;
    }
    crate::matmul::layout::note_repacks(decoded, decoded * pb);
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
