//! Intel AMX kernel of the panel GEMM ([`panel_pair`]) and its start-up self-test.
//!
//! AMX keeps eight tile registers of up to 16 rows × 64 bytes, shaped by a 64-byte
//! configuration (`LDTILECFG`), and a tile unit per core whose `TDPBSUD` adds to an i32 tile C
//! the products of a signed-byte tile A (rows × K bytes) with an unsigned-byte tile B (K/4 rows
//! of 4-byte groups): the semantics written out in [`tile::tdpbsud`](super::tile::tdpbsud).
//! A panel's 8 code groups of a block (8 columns × 4 codes, 32 bytes each, one after the other)
//! are a B tile as they lie, and the activation rows' codes of a block (32 bytes in each row,
//! the rows `xrb` bytes apart) are an A tile where they lie, so nothing is packed or rearranged
//! per product; the rows' block scalars are computed once per GEMM call. Per block (per half-block for Q6_K's two
//! scales) two products — the row tile with each of two panels — go to two 16 × 8 tiles C,
//! stored side by side as 16 rows of 16 sums; the block's scales then meet them on 16-lane
//! AVX-512 vectors, one per row, with the portable panel's float steps
//! ([`tile::pair_tile_model`](super::tile::pair_tile_model)), so the AMX GEMM is bit-identical
//! to it and to the AVX-512 VNNI panel kernel.
//!
//! The tile instructions are written with `asm!`: Rust's AMX intrinsics are unstable and
//! Rust's inline assembly has no tile register class. Rust never allocates tile registers, so
//! the tiles a block of `asm!` loads stay untouched until the next; each block names every
//! pointer it reads and writes, and memory is not marked untouched. A thread's tiles stay
//! configured from call to call (reloaded when a call needs other shapes), and the blocks are
//! software-pipelined: block b's products are issued before block b − 1's sums are scaled, from
//! the other of two sum buffers, so the tile unit and the vector units work at once.
//!
//! # Safety
//! Every function here needs a CPU with AMX-TILE, AMX-INT8 and [`Isa::Avx512`]'s features and
//! a process granted the tile data ([`crate::simd::x86::amx_permitted`]): [`Isa::Amx`]'s
//! features, which `dispatch` checks before any table of that level exists.
//!
//! [`Isa::Avx512`]: crate::simd::Isa::Avx512
//! [`Isa::Amx`]: crate::simd::Isa::Amx

use super::panel::{codes_at, Act, PACKED_BLOCK, PANEL};
use super::tile::{pair_tile_model, PairJob, TestData, PAIR_ROWS, ROW_SCALARS};
use std::arch::asm;
use std::arch::x86_64::*;

/// The 64-byte tile configuration `LDTILECFG` reads: palette 1, then the bytes per row of
/// tiles 0–15 (u16 each) and their rows (u8 each).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<TileConfig>() == 64);

/// Tiles 0 and 1: the two panels' sums (`rows` rows × 8 i32); tile 2: the rows' codes (`rows`
/// rows × `kb` bytes); tiles 3 and 4: the two panels' codes (`kb`/4 groups × 32 bytes). `kb`
/// is 32 (a block), or 16 (a half-block, for the split types).
fn config(kb: usize, rows: usize) -> TileConfig {
    let mut c = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    for (t, (colsb, rows)) in [(32, rows), (32, rows), (kb, rows), (32, kb / 4), (32, kb / 4)].into_iter().enumerate() {
        (c.colsb[t], c.rows[t]) = (colsb as u16, rows as u8);
    }
    c
}

/// One block's (or half-block's) i32 sums: 16 rows of the first panel's 8 columns then the
/// second's, 64 bytes per row (the tile stores' stride).
#[repr(C, align(64))]
struct Sums([[i32; 2 * PANEL]; PAIR_ROWS]);

/// The AMX [`PairKernel`](super::tile::PairKernel): `acc[i]` (16 columns: the first panel's 8,
/// then the second's) `+=` row `i`'s products, for `i < job.rows`.
///
/// # Safety
/// [`Isa::Amx`](crate::simd::Isa::Amx)'s features (module doc). The buffers are checked here.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn panel_pair(job: &PairJob, acc: &mut [[f32; 2 * PANEL]]) {
    match (job.split, job.has_min) {
        // SAFETY (all): the caller's.
        (true, _) => unsafe { pair_kind::<true, false>(job, acc) },
        (false, true) => unsafe { pair_kind::<false, true>(job, acc) },
        (false, false) => unsafe { pair_kind::<false, false>(job, acc) },
    }
}

/// Loads `cfg` unless it is the configuration this thread's tiles already have. The tiles stay
/// configured between calls (as ggml's AMX kernels leave them): `LDTILECFG` per call, with the
/// `TILERELEASE` that went with it, cost more than a call's products at short rows.
///
/// # Safety
/// AMX's features and the tile data (module doc).
#[inline(always)]
unsafe fn configure(kb: usize, rows: usize) {
    thread_local! {
        /// The (kb, rows) this thread's tiles are configured for; (0, 0): none yet.
        static LOADED: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
    }
    if LOADED.get() != (kb, rows) {
        let cfg = config(kb, rows);
        // SAFETY: a 64-byte configuration of palette 1 with valid shapes (16 rows at most, 64
        // bytes per row at most, B's rows a quarter of A's bytes per row, C's bytes per row
        // B's); the caller's AMX.
        unsafe { asm!("ldtilecfg [{cfg}]", cfg = in(reg) &cfg as *const TileConfig, options(nostack, readonly)) };
        LOADED.set((kb, rows));
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_kind<const SPLIT: bool, const MIN: bool>(job: &PairJob, acc: &mut [[f32; 2 * PANEL]]) {
    let PairJob { x, xrb, act, rows, b0, b1, panels: [first, second], .. } = *job;
    if b0 >= b1 || rows == 0 {
        return;
    }
    // Every tile read and store below stays inside these (the last row's last block's codes,
    // the panels' last block, the rows' scalars of the last block).
    assert!(rows <= PAIR_ROWS && acc.len() >= rows, "a row tile of {PAIR_ROWS} rows at most");
    assert!(x.len() >= (rows - 1) * xrb + codes_at(act, b1 - 1) + 32 && first.len() >= b1 * PACKED_BLOCK && second.len() >= b1 * PACKED_BLOCK);
    let _ = job.scalars(b1 - 1, rows - 1);
    let kb = if SPLIT { 16 } else { 32 };
    // SAFETY: the caller's AMX.
    unsafe { configure(kb, rows) };
    // sums[b % 2][h]: block b's half h, so that block b's products run on the tile unit while
    // block b − 1's sums are scaled on the vector units.
    let mut sums: [[Sums; 2]; 2] = std::array::from_fn(|_| std::array::from_fn(|_| Sums([[0; 2 * PANEL]; PAIR_ROWS])));
    let mut a = [_mm512_setzero_ps(); PAIR_ROWS];
    for (v, row) in a.iter_mut().zip(acc.iter()).take(rows) {
        // SAFETY: a row of 16 f32.
        *v = unsafe { _mm512_loadu_ps(row.as_ptr()) };
    }
    for b in b0..=b1 {
        if b < b1 {
            for (h, sh) in sums[b % 2].iter_mut().enumerate().take(if SPLIT { 2 } else { 1 }) {
                let c = sh.0.as_mut_ptr() as *mut u8;
                // SAFETY: A reads `rows` rows × `kb` bytes at block b's codes (half h), `xrb`
                // apart, inside `x` (asserted); each B reads `kb`/4 groups × 32 bytes from its
                // panel's block b (half h: groups 4h..), inside the panels (asserted); the C
                // stores write `rows` rows × 32 bytes, 64 apart, into `sums[b % 2][h]` (16 × 64
                // bytes) at byte 0 and 32. The tiles are configured for these shapes.
                unsafe {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tileloadd tmm2, [{a} + {sa}*1]",
                        "tileloadd tmm3, [{b0} + {s32}*1]",
                        "tileloadd tmm4, [{b1} + {s32}*1]",
                        "tdpbsud tmm0, tmm2, tmm3",
                        "tdpbsud tmm1, tmm2, tmm4",
                        "tilestored [{c0} + {s64}*1], tmm0",
                        "tilestored [{c1} + {s64}*1], tmm1",
                        a = in(reg) x.as_ptr().add(codes_at(act, b) + h * 16),
                        sa = in(reg) xrb,
                        b0 = in(reg) first.as_ptr().add(b * PACKED_BLOCK + h * 128),
                        b1 = in(reg) second.as_ptr().add(b * PACKED_BLOCK + h * 128),
                        c0 = in(reg) c,
                        c1 = in(reg) c.add(32),
                        s32 = in(reg) 32usize,
                        s64 = in(reg) 64usize,
                        options(nostack),
                    );
                }
            }
        }
        if b == b0 {
            continue;
        }
        // The previous block's sums, scaled.
        let pb = b - 1;
        // SAFETY: the panels' block pb holds 8 scales at byte 256 and 8 mins at byte 288, and
        // the rows' scalars of block pb are `rows` × ROW_SCALARS bytes from `sp` (all inside,
        // asserted above).
        unsafe {
            let (p, q) = (first.as_ptr().add(pb * PACKED_BLOCK), second.as_ptr().add(pb * PACKED_BLOCK));
            let join = |lo: *const u8, hi: *const u8| {
                let lo = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(lo as *const f32)));
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(_mm256_loadu_ps(hi as *const f32))))
            };
            let (dw, mw) = (join(p.add(256), q.add(256)), join(p.add(288), q.add(288)));
            let sp = job.sc.as_ptr().add((pb * job.n_rows + job.row0) * ROW_SCALARS);
            let s = &sums[pb % 2];
            for (i, v) in a.iter_mut().enumerate() {
                if i >= rows {
                    break;
                }
                let r = sp.add(i * ROW_SCALARS);
                let dx = _mm512_set1_ps((r.add(8) as *const f32).read_unaligned());
                let s0 = _mm512_loadu_si512(s[0].0[i].as_ptr() as *const _);
                let oy0 = _mm512_set1_epi32((r as *const i32).read_unaligned());
                *v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s0, oy0)), _mm512_mul_ps(dw, dx), *v);
                if SPLIT {
                    let s1 = _mm512_loadu_si512(s[1].0[i].as_ptr() as *const _);
                    let oy1 = _mm512_set1_epi32((r.add(4) as *const i32).read_unaligned());
                    *v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s1, oy1)), _mm512_mul_ps(mw, dx), *v);
                } else if MIN {
                    *v = _mm512_fmadd_ps(mw, _mm512_set1_ps((r.add(12) as *const f32).read_unaligned()), *v);
                }
            }
        }
    }
    for (v, row) in a.iter().zip(acc.iter_mut()).take(rows) {
        // SAFETY: a row of 16 f32.
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), *v) };
    }
}

/// Whether [`panel_pair`] gives its model's bits on this CPU: Q8_0 activation rows of three
/// blocks read in place (15 rows, an odd row length), codes up to 255 in two different panels,
/// rows' scalars at an offset in a larger table, every float path (min, no min, split) and a
/// short tile of 3 rows.
///
/// # Safety
/// [`Isa::Amx`](crate::simd::Isa::Amx)'s features (module doc).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn self_test() -> bool {
    let mut d = TestData::default();
    let (nblk, n_rows, row0) = (3, 20, 4);
    // Rows of 3 Q8_0 blocks (34 bytes each) and 2 bytes more, so rows are not 32-aligned.
    let xrb = nblk * 34 + 2;
    let x: Vec<u8> = (0..n_rows * xrb).map(|_| d.word() as u8).collect();
    let sc = d.scalars(nblk * n_rows);
    let (first, second) = (d.panel(nblk), d.panel(nblk));
    let mut ok = true;
    for (split, has_min, rows, b0) in [(false, true, 15, 0), (false, false, 16, 1), (true, false, 15, 0), (false, true, 3, 2)] {
        let job = PairJob { x: &x[row0 * xrb..], xrb, act: Act::Q8_0, rows, b0, b1: nblk, sc: &sc, n_rows, row0, panels: [&first, &second], split, has_min };
        let start: Vec<[f32; 2 * PANEL]> = (0..rows).map(|_| std::array::from_fn(|_| d.unit())).collect();
        let (mut got, mut want) = (start.clone(), start);
        // SAFETY: the caller's AMX; the job's buffers are sized as `PairJob` says.
        unsafe { panel_pair(&job, &mut got) };
        pair_tile_model(&job, &mut want);
        ok &= got.iter().flatten().zip(want.iter().flatten()).all(|(x, y)| x.to_bits() == y.to_bits());
    }
    ok
}
