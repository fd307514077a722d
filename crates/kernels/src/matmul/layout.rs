//! Weights repacked once at load: four consecutive weight rows (output channels) interleaved
//! block by block, in the same number of bytes as the plain rows.
//!
//! A matrix of `n` rows (a multiple of four) of `nb` blocks becomes `n / 4` *groups*; group `g`
//! (rows `4g .. 4g + 4`) occupies the same `4·row_bytes` bytes as those rows did, as `nb`
//! group-blocks of four plain blocks' worth of bytes, block `i` of the four rows together:
//!
//! | type | group-block (bytes) |
//! |---|---|
//! | Q4_0, IQ4_NL (4 × 18) | `d0‥d3` (f16, 8) · `qs` of rows 0‥3 (4 × 16) |
//! | Q4_1 (4 × 20) | `[d0 m0 d1 m1 d2 m2 d3 m3]` (f16, 16) · `qs` of rows 0‥3 (4 × 16) |
//! | Q5_0 (4 × 22) | `d0‥d3` (f16, 8) · `hl` (u64) · `hh` (u64) · `qs` of rows 0‥3 (4 × 16) |
//! | Q5_1 (4 × 24) | `[d0 m0 … d3 m3]` (f16, 16) · `hl` · `hh` · `qs` of rows 0‥3 (4 × 16) |
//! | Q8_0 (4 × 34) | `d0‥d3` (f16, 8) · `qs[0..16]` of rows 0‥3 (64) · `qs[16..32]` of rows 0‥3 (64) |
//! | Q6_K (4 × 210) | `d0‥d3` (f16, 8) · `scales[0..8]` of rows 0‥3 (32) · `scales[8..16]` of rows 0‥3 (32) · for each 16 bytes `ql[16p..16p+16]` (p < 8), those of rows 0‥3 (8 × 64) · the same for `qh` (4 × 64) |
//! | Q4_K (4 × 144) | `d0‥d3 dmin0‥dmin3` (f16, 16) · `scales[4w..4w+4]` of rows 0‥3 for w = 0, 1, 2 (3 × 16) · for each 16 bytes `qs[16h..16h+16]` (h < 8), those of rows 0‥3 (8 × 64) |
//! | IQ4_XS (4 × 136) | `d0‥d3` (f16, 8) · `scales_h` of rows 0‥3 (u16, 8) · `scales_l` of rows 0‥3 (4 × 4) · for each sub-block's 16 bytes `qs[16b..16b+16]` (b < 8), those of rows 0‥3 (8 × 64) |
//!
//! The fifth bits of Q5_0 and Q5_1 are regrouped as the two 64-bit masks a 512-bit kernel wants: bit
//! `16r + e` of `hl` is row r's bit for element `e`, of `hh` for element `16 + e` (e < 16).
//!
//! Q4_K's 12 scale bytes stay packed (6-bit scales and mins); grouped as three 32-bit words per
//! row, the four rows' words sit side by side, so one 128-bit operation unpacks a word of all
//! four rows.
//!
//! Why: a 64-byte load then holds one half-block of all four rows — 128-bit lane `r` is row `r`
//! — so the kernels (`matmul::x86::avx512_il`) decode and multiply four rows with one instruction
//! where a plain row needs one per row (AVX2: a 32-byte load holds a row pair,
//! `matmul::x86::avx2_il`), convert the four rows' scales with one `vcvtph2ps`, and read each
//! matrix as one sequential stream (four plain rows read block by block are four
//! streams the hardware prefetcher does not follow). NEON (`matmul::aarch64::neon_il`) reads a
//! row's 16-byte run per load and widens the four rows' scales with one `fcvtl`. The same layout serves decode's GEMV and
//! prefill's 4×4 tiles, so nothing is packed per call (SMEPilot's layout-aware runtime: pack
//! off the critical path).
//!
//! Invariant: every kernel on this layout returns, bit for bit, the plain kernel's value for
//! the same row (`vec_dot`; `vec_dot_tile` is the same function for these types).
//! [`unpack`] is [`pack`]'s exact inverse; tests check both.

use crate::DType;
use std::sync::atomic::{AtomicU64, Ordering};

/// Weight re-layouts this process has made: calls and bytes (SMEPilot's layout state: each
/// is a copy of weights into another kernel's layout). Counted by [`pack`] (the interleaved
/// copies made at load), the panel GEMM's per-call panel decode, the tile packing of plain
/// rows, and the engine's neuron-major copies; not the activations' quantization, which is
/// compute. The per-token path makes none (an engine test checks it).
static REPACKS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Count one weight re-layout of `bytes` bytes ([`repacks`]).
pub fn note_repack(bytes: usize) {
    REPACKS[0].fetch_add(1, Ordering::Relaxed);
    REPACKS[1].fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Weight re-layouts made so far by this process: (calls, bytes).
pub fn repacks() -> (u64, u64) {
    (REPACKS[0].load(Ordering::Relaxed), REPACKS[1].load(Ordering::Relaxed))
}

/// Rows per group.
pub const ROWS: usize = 4;

/// i32 of scratch the interleaved kernels need for rows of `k` values: per activation block
/// eight lane sums and its scales (a cache line), for up to eight activation rows.
pub fn scratch_len(k: usize) -> usize {
    8 * k.div_ceil(32) * 16
}

/// Weight types with an interleaved layout.
pub fn supported(t: DType) -> bool {
    matches!(t, DType::Q4_0 | DType::IQ4NL | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q4K | DType::Q6K | DType::IQ4XS)
}

/// Bytes of the largest plain block of a supported type (Q6_K's 210).
const MAX_BS: usize = 210;

/// Repack `x` (whole rows of `xrb` bytes, a multiple of four of them) into groups in `out`
/// (same length). Panics if `t` has no interleaved layout or the lengths disagree (a bug in the
/// caller, which checks [`supported`] and the row count first).
pub fn pack(t: DType, x: &[u8], xrb: usize, out: &mut [u8]) {
    let bs = t.type_size();
    assert!(supported(t) && xrb % bs == 0 && x.len() % (ROWS * xrb) == 0 && out.len() == x.len());
    let nb = xrb / bs;
    note_repack(x.len());
    for (src, dst) in x.chunks_exact(ROWS * xrb).zip(out.chunks_exact_mut(ROWS * xrb)) {
        for (i, gb) in dst.chunks_exact_mut(ROWS * bs).enumerate() {
            let blk = |r: usize| &src[r * xrb + i * bs..r * xrb + (i + 1) * bs];
            pack_block(t, [blk(0), blk(1), blk(2), blk(3)], gb);
        }
        debug_assert_eq!(dst.len(), nb * ROWS * bs);
    }
}

/// The inverse of [`pack`]: groups back to plain rows.
pub fn unpack(t: DType, g: &[u8], xrb: usize, out: &mut [u8]) {
    let bs = t.type_size();
    assert!(supported(t) && xrb % bs == 0 && g.len() % (ROWS * xrb) == 0 && out.len() == g.len());
    for (src, dst) in g.chunks_exact(ROWS * xrb).zip(out.chunks_exact_mut(ROWS * xrb)) {
        for (i, gb) in src.chunks_exact(ROWS * bs).enumerate() {
            let mut blocks = [[0u8; MAX_BS]; ROWS];
            unpack_block(t, gb, &mut blocks);
            for (r, b) in blocks.iter().enumerate() {
                dst[r * xrb + i * bs..r * xrb + (i + 1) * bs].copy_from_slice(&b[..bs]);
            }
        }
    }
}

/// Row `r` (0..4) of group-block `gb`, as a plain block in `out[..type_size]`.
fn unpack_block(t: DType, gb: &[u8], out: &mut [[u8; MAX_BS]; ROWS]) {
    for (r, o) in out.iter_mut().enumerate() {
        match t {
            DType::Q4_0 | DType::IQ4NL => {
                o[..2].copy_from_slice(&gb[2 * r..2 * r + 2]);
                o[2..18].copy_from_slice(&gb[8 + 16 * r..24 + 16 * r]);
            }
            DType::Q4_1 => {
                o[..4].copy_from_slice(&gb[4 * r..4 * r + 4]);
                o[4..20].copy_from_slice(&gb[16 + 16 * r..32 + 16 * r]);
            }
            DType::Q5_0 | DType::Q5_1 => {
                // Q5_0: d, qh, qs (scales 8 bytes); Q5_1: d, m, qh, qs (16).
                let h = if t == DType::Q5_1 { 4 } else { 2 };
                o[..h].copy_from_slice(&gb[h * r..h * r + h]);
                let (hl, hh) = (u64_at(gb, 4 * h), u64_at(gb, 4 * h + 8));
                let qh = ((hl >> (16 * r)) & 0xFFFF) as u32 | (((hh >> (16 * r)) & 0xFFFF) as u32) << 16;
                o[h..h + 4].copy_from_slice(&qh.to_le_bytes());
                o[h + 4..h + 20].copy_from_slice(&gb[4 * h + 16 + 16 * r..4 * h + 32 + 16 * r]);
            }
            DType::Q8_0 => {
                o[..2].copy_from_slice(&gb[2 * r..2 * r + 2]);
                o[2..18].copy_from_slice(&gb[8 + 16 * r..24 + 16 * r]);
                o[18..34].copy_from_slice(&gb[72 + 16 * r..88 + 16 * r]);
            }
            DType::Q4K | DType::Q6K | DType::IQ4XS => {
                let (m, n) = k_places(t, r);
                for &(p, g, len) in &m[..n] {
                    o[p..p + len].copy_from_slice(&gb[g..g + len]);
                }
            }
            _ => unreachable!("checked by unpack"),
        }
    }
}

fn pack_block(t: DType, b: [&[u8]; ROWS], gb: &mut [u8]) {
    match t {
        DType::Q4_0 | DType::IQ4NL => {
            for r in 0..ROWS {
                gb[2 * r..2 * r + 2].copy_from_slice(&b[r][..2]);
                gb[8 + 16 * r..24 + 16 * r].copy_from_slice(&b[r][2..18]);
            }
        }
        DType::Q4_1 => {
            for r in 0..ROWS {
                gb[4 * r..4 * r + 4].copy_from_slice(&b[r][..4]);
                gb[16 + 16 * r..32 + 16 * r].copy_from_slice(&b[r][4..20]);
            }
        }
        DType::Q5_0 | DType::Q5_1 => {
            // The scales (d, and m for Q5_1: h bytes per row), then the two masks, then qs.
            let h = if t == DType::Q5_1 { 4 } else { 2 };
            let (mut hl, mut hh) = (0u64, 0u64);
            for r in 0..ROWS {
                gb[h * r..h * r + h].copy_from_slice(&b[r][..h]);
                let qh = u32::from_le_bytes([b[r][h], b[r][h + 1], b[r][h + 2], b[r][h + 3]]);
                hl |= ((qh & 0xFFFF) as u64) << (16 * r);
                hh |= ((qh >> 16) as u64) << (16 * r);
                gb[4 * h + 16 + 16 * r..4 * h + 32 + 16 * r].copy_from_slice(&b[r][h + 4..h + 20]);
            }
            gb[4 * h..4 * h + 8].copy_from_slice(&hl.to_le_bytes());
            gb[4 * h + 8..4 * h + 16].copy_from_slice(&hh.to_le_bytes());
        }
        DType::Q8_0 => {
            for r in 0..ROWS {
                gb[2 * r..2 * r + 2].copy_from_slice(&b[r][..2]);
                gb[8 + 16 * r..24 + 16 * r].copy_from_slice(&b[r][2..18]);
                gb[72 + 16 * r..88 + 16 * r].copy_from_slice(&b[r][18..34]);
            }
        }
        DType::Q4K | DType::Q6K | DType::IQ4XS => {
            for (r, b) in b.iter().enumerate() {
                let (m, n) = k_places(t, r);
                for &(p, g, len) in &m[..n] {
                    gb[g..g + len].copy_from_slice(&b[p..p + len]);
                }
            }
        }
        _ => unreachable!("checked by pack"),
    }
}

/// Where the bytes of row `r`'s plain super-block go in its group-block: (plain start, group
/// offset, length). Q4_K: `d`, `dmin`, the three scale words, the eight 16-byte pieces of `qs`
/// (13 moves). Q6_K: `d`, the two halves of `scales`, the eight pieces of `ql` and the four of
/// `qh` (15). IQ4_XS: `d`, `scales_h`, `scales_l`, the eight pieces of `qs` (11).
fn k_places(t: DType, r: usize) -> ([(usize, usize, usize); 15], usize) {
    let mut m = [(0, 0, 0); 15];
    let mut n = 0;
    let mut put = |plain: usize, group: usize, len: usize| {
        m[n] = (plain, group, len);
        n += 1;
    };
    if t == DType::Q4K {
        put(0, 2 * r, 2);
        put(2, 8 + 2 * r, 2);
        (0..3).for_each(|w| put(4 + 4 * w, 16 + 16 * w + 4 * r, 4));
        (0..8).for_each(|p| put(16 + 16 * p, 64 + 64 * p + 16 * r, 16));
    } else if t == DType::IQ4XS {
        put(0, 2 * r, 2);
        put(2, 8 + 2 * r, 2);
        put(4, 16 + 4 * r, 4);
        (0..8).for_each(|p| put(8 + 16 * p, 32 + 64 * p + 16 * r, 16));
    } else {
        put(208, 2 * r, 2);
        put(192, 8 + 8 * r, 8);
        put(200, 40 + 8 * r, 8);
        (0..8).for_each(|p| put(16 * p, 72 + 64 * p + 16 * r, 16));
        (0..4).for_each(|p| put(128 + 16 * p, 584 + 64 * p + 16 * r, 16));
    }
    (m, n)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The portable twin of the interleaved GEMV: each group unpacked block by block into plain
/// rows (in `row`, at least `4·xrb` bytes) and run through `vec_dot`. The reference the SIMD
/// kernels are tested against; the engine uses interleaved weights only where the table has
/// SIMD kernels for them.
pub fn rows_portable(t: DType, vec_dot: fn(&[u8], &[u8]) -> f32, g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], row: &mut [u8]) {
    let row = &mut row[..ROWS * xrb];
    for (grp, o) in g.chunks_exact(ROWS * xrb).zip(out.chunks_exact_mut(ROWS)) {
        unpack(t, grp, xrb, row);
        for (r, v) in o.iter_mut().enumerate() {
            *v = vec_dot(&row[r * xrb..(r + 1) * xrb], y);
        }
    }
}
