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
//! | Q5_0 (4 × 22) | `d0‥d3` (f16, 8) · fifth bits (16) · `qs` of rows 0‥3 (4 × 16) |
//! | Q5_1 (4 × 24) | `[d0 m0 … d3 m3]` (f16, 16) · fifth bits (16) · `qs` of rows 0‥3 (4 × 16) |
//! | Q8_0 (4 × 34) | `d0‥d3` (f16, 8) · `qs[0..16]` of rows 0‥3 (64) · `qs[16..32]` of rows 0‥3 (64) |
//! | Q6_K (4 × 210) | `d0‥d3` (f16, 8) · `scales[0..8]` of rows 0‥3 (32) · `scales[8..16]` of rows 0‥3 (32) · for each 16 bytes `ql[16p..16p+16]` (p < 8), those of rows 0‥3 (8 × 64) · the same for `qh` (4 × 64) |
//! | Q4_K (4 × 144) | `d0‥d3 dmin0‥dmin3` (f16, 16) · `scales[4w..4w+4]` of rows 0‥3 for w = 0, 1, 2 (3 × 16) · for each 16 bytes `qs[16h..16h+16]` (h < 8), those of rows 0‥3 (8 × 64) |
//! | IQ4_XS (4 × 136) | `d0‥d3` (f16, 8) · `scales_h` of rows 0‥3 (u16, 8) · `scales_l` of rows 0‥3 (4 × 4) · for each sub-block's 16 bytes `qs[16b..16b+16]` (b < 8), those of rows 0‥3 (8 × 64) |
//!
//! Q5_0's and Q5_1's fifth bits (the 16 bytes after the scales, and with `Folded` the rows'
//! 16-byte runs too) take the form the table's kernels read fastest ([`Q5Bits`]; with Q6_K's
//! [`Q6Form`], what a table's [`Layout`] chooses):
//! - [`Q5Bits::Masks`] (AVX-512): two 64-bit masks, `hl` then `hh`; bit `16r + j` of `hl` is row
//!   r's bit for value `j`, of `hh` for value `16 + j` (j < 16) — the kernel's byte masks as
//!   they are.
//! - [`Q5Bits::Folded`] (AVX2, NEON): the 5-bit values themselves moved into the 16 `qs` bytes of a
//!   row as far as they fit: byte `j` holds value `j` whole (bits 0‥4: its nibble and fifth
//!   bit) and value `16 + j`'s low three bits (bits 5‥7); the 16 bytes of the fifth-bit slot
//!   hold value `16 + j`'s bits 3 and 4 of row r at bits `2r`, `2r + 1` of byte `j`. Value `j`
//!   is then one mask (`& 0x1F`) and value `16 + j` a word shift, a per-lane shift of the
//!   repeated 16 bytes and two masks joined by an or: on AVX2 six operations per 2 × 32 values
//!   where the earlier transposed bits (bit r of byte j: row r's value j, bit 4 + r: its value
//!   16 + j) took nine, on NEON (byte shifts: no word shift to mask) five per 32 where it took
//!   eight. `Masks` needs a shuffle and a compare on AVX2; the AVX-512 kernel, with mask
//!   registers, reads it directly.
//!
//! Q6_K's values take one of two forms ([`Q6Form`]):
//! - [`Q6Form::Split`] (AVX-512, NEON): `ql` and `qh` as the plain block has them (the table
//!   above); a value is a nibble and two bits of a `qh` byte, shifted into place.
//! - [`Q6Form::Folded`] (AVX2): the four values ggml's order meets at one byte position
//!   (k = 0‥3: values `128n + 32k + l` of half n) in three bytes: bytes of runs 0, 1, 2 hold
//!   values k = 0, 1, 2 whole (bits 0‥5) and two bits each of value k = 3 (bits 6, 7), so three
//!   values are one mask each and the fourth three word shifts, three masks and two ors: 11
//!   operations per four 32-byte vectors where `Split` takes about 18. The 768 bytes after the
//!   scales are 12 runs of 64 (four rows × 16): run `3·(2n + h) + c`.
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
//! [`Layout::unpack`] is [`Layout::pack`]'s exact inverse; tests check both (each form).

use crate::DType;
use std::sync::atomic::{AtomicU64, Ordering};

/// Weight re-layouts this process has made: calls and bytes (SMEPilot's layout state: each
/// is a copy of weights into another kernel's layout). Counted by [`Layout::pack`] (the interleaved
/// copies made at load), the panel GEMM's per-call panel decode, the tile packing of plain
/// rows, and the engine's neuron-major copies; not the activations' quantization, which is
/// compute. The per-token path makes none (an engine test checks it).
static REPACKS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Count one weight re-layout of `bytes` bytes ([`repacks`]).
pub fn note_repack(bytes: usize) {
    note_repacks(1, bytes);
}

/// Count `calls` weight re-layouts of `bytes` bytes in all ([`repacks`]): kernels that
/// re-lay many pieces in one call count them once, at its end, rather than writing the
/// shared counters (one cache line for every worker) per piece.
pub fn note_repacks(calls: usize, bytes: usize) {
    if calls > 0 {
        REPACKS[0].fetch_add(calls as u64, Ordering::Relaxed);
        REPACKS[1].fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// Weight re-layouts made so far by this process: (calls, bytes).
pub fn repacks() -> (u64, u64) {
    (REPACKS[0].load(Ordering::Relaxed), REPACKS[1].load(Ordering::Relaxed))
}

/// Rows per group.
pub const ROWS: usize = 4;

/// How Q5_0/Q5_1 group-blocks hold their fifth bits (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q5Bits {
    /// Two 64-bit masks, row r's bits at `16r` (AVX-512's byte masks).
    Masks,
    /// Value j whole and value 16 + j's low three bits in `qs` byte j; bits 2r, 2r + 1 of byte
    /// j: row r's value 16 + j's bits 3 and 4 (AVX2, NEON).
    Folded,
}

/// How Q6_K group-blocks hold their 6-bit values (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q6Form {
    /// `ql` and `qh` as the plain block has them, in 16-byte pieces of the four rows (AVX-512,
    /// NEON).
    Split,
    /// Per 16 values of a (half, 16-value) position, three 16-byte runs holding values k = 0,
    /// 1, 2 whole and value k = 3's bits two by two (AVX2).
    Folded,
}

/// The interleaved layout a kernel table reads (`Kernels::layout`): weights packed for one
/// table are read only by that table's kernels. Types other than Q5_0/Q5_1 and Q6_K have one
/// form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub q5: Q5Bits,
    pub q6: Q6Form,
}

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

impl Layout {
    /// Repack `x` (whole rows of `xrb` bytes, a multiple of four of them) into groups in `out`
    /// (same length). Panics if `t` has no interleaved layout or the lengths disagree (a bug in the
    /// caller, which checks [`supported`] and the row count first).
    pub fn pack(self, t: DType, x: &[u8], xrb: usize, out: &mut [u8]) {
        let bs = t.type_size();
        assert!(supported(t) && xrb.is_multiple_of(bs) && x.len().is_multiple_of(ROWS * xrb) && out.len() == x.len());
        let nb = xrb / bs;
        note_repack(x.len());
        for (src, dst) in x.chunks_exact(ROWS * xrb).zip(out.chunks_exact_mut(ROWS * xrb)) {
            for (i, gb) in dst.chunks_exact_mut(ROWS * bs).enumerate() {
                let blk = |r: usize| &src[r * xrb + i * bs..r * xrb + (i + 1) * bs];
                pack_block(t, self, [blk(0), blk(1), blk(2), blk(3)], gb);
            }
            debug_assert_eq!(dst.len(), nb * ROWS * bs);
        }
    }

    /// The inverse of [`Layout::pack`]: groups back to plain rows.
    pub fn unpack(self, t: DType, g: &[u8], xrb: usize, out: &mut [u8]) {
        let bs = t.type_size();
        assert!(supported(t) && xrb.is_multiple_of(bs) && g.len().is_multiple_of(ROWS * xrb) && out.len() == g.len());
        for (src, dst) in g.chunks_exact(ROWS * xrb).zip(out.chunks_exact_mut(ROWS * xrb)) {
            for (i, gb) in src.chunks_exact(ROWS * bs).enumerate() {
                let mut blocks = [[0u8; MAX_BS]; ROWS];
                unpack_block(t, self, gb, &mut blocks);
                for (r, b) in blocks.iter().enumerate() {
                    dst[r * xrb + i * bs..r * xrb + (i + 1) * bs].copy_from_slice(&b[..bs]);
                }
            }
        }
    }

    /// The portable twin of the interleaved GEMV: each group unpacked block by block into plain
    /// rows (in `row`, at least `4·xrb` bytes) and run through `vec_dot`. The reference the SIMD
    /// kernels are tested against; the engine uses interleaved weights only where the table has
    /// SIMD kernels for them.
    #[allow(clippy::too_many_arguments)]
    pub fn rows_portable(self, t: DType, vec_dot: fn(&[u8], &[u8]) -> f32, g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], row: &mut [u8]) {
        let row = &mut row[..ROWS * xrb];
        for (grp, o) in g.chunks_exact(ROWS * xrb).zip(out.chunks_exact_mut(ROWS)) {
            self.unpack(t, grp, xrb, row);
            for (r, v) in o.iter_mut().enumerate() {
                *v = vec_dot(&row[r * xrb..(r + 1) * xrb], y);
            }
        }
    }
}

/// `Folded`: row `r`'s plain `qh` and `qs` from its 16 folded bytes `a` and the shared 16 bytes `b`.
fn folded_row(a: &[u8], b: &[u8], r: usize) -> (u32, [u8; 16]) {
    let (mut qh, mut qs) = (0u32, [0u8; 16]);
    for j in 0..16 {
        let hi = (a[j] >> 5) | (b[j] >> (2 * r) & 3) << 3;
        qs[j] = a[j] & 0x0F | (hi & 0x0F) << 4;
        qh |= (a[j] as u32 >> 4 & 1) << j | (hi as u32 >> 4) << (16 + j);
    }
    (qh, qs)
}

/// `Folded`: row `r`'s 16 folded bytes from its plain `qh` and `qs`, its bits of the shared 16
/// bytes or-ed into `b`.
fn fold_row(qh: u32, qs: &[u8], r: usize, a: &mut [u8], b: &mut [u8; 16]) {
    for j in 0..16 {
        let lo = qs[j] & 0x0F | ((qh >> j & 1) as u8) << 4;
        let hi = qs[j] >> 4 | ((qh >> (16 + j) & 1) as u8) << 4;
        a[j] = lo | (hi & 7) << 5;
        b[j] |= (hi >> 3) << (2 * r);
    }
}

/// Row `r` (0..4) of group-block `gb`, as a plain block in `out[..type_size]`.
fn unpack_block(t: DType, layout: Layout, gb: &[u8], out: &mut [[u8; MAX_BS]; ROWS]) {
    if t == DType::Q6K && layout.q6 == Q6Form::Folded {
        return unfold_q6_k(gb, out);
    }
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
                let (bits, qs) = (&gb[4 * h..4 * h + 16], &gb[4 * h + 16 + 16 * r..4 * h + 32 + 16 * r]);
                match layout.q5 {
                    // Row r's 16 bits of `hl` and of `hh` are whole bytes: 2r, 2r + 1 of each.
                    Q5Bits::Masks => {
                        o[h..h + 4].copy_from_slice(&[bits[2 * r], bits[2 * r + 1], bits[8 + 2 * r], bits[9 + 2 * r]]);
                        o[h + 4..h + 20].copy_from_slice(qs);
                    }
                    Q5Bits::Folded => {
                        let (qh, plain) = folded_row(qs, bits, r);
                        o[h..h + 4].copy_from_slice(&qh.to_le_bytes());
                        o[h + 4..h + 20].copy_from_slice(&plain);
                    }
                }
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

fn pack_block(t: DType, layout: Layout, b: [&[u8]; ROWS], gb: &mut [u8]) {
    if t == DType::Q6K && layout.q6 == Q6Form::Folded {
        return fold_q6_k(b, gb);
    }
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
            // The scales (d, and m for Q5_1: h bytes per row), then the fifth bits, then qs.
            let h = if t == DType::Q5_1 { 4 } else { 2 };
            let mut bits = [0u8; 16];
            for r in 0..ROWS {
                gb[h * r..h * r + h].copy_from_slice(&b[r][..h]);
                let qs = &mut gb[4 * h + 16 + 16 * r..4 * h + 32 + 16 * r];
                match layout.q5 {
                    // `qh`'s low half is bytes 2r, 2r + 1 of `hl`, its high half those of `hh`.
                    Q5Bits::Masks => {
                        bits[2 * r..2 * r + 2].copy_from_slice(&b[r][h..h + 2]);
                        bits[8 + 2 * r..10 + 2 * r].copy_from_slice(&b[r][h + 2..h + 4]);
                        qs.copy_from_slice(&b[r][h + 4..h + 20]);
                    }
                    Q5Bits::Folded => {
                        let qh = u32::from_le_bytes([b[r][h], b[r][h + 1], b[r][h + 2], b[r][h + 3]]);
                        fold_row(qh, &b[r][h + 4..h + 20], r, qs, &mut bits);
                    }
                }
            }
            gb[4 * h..4 * h + 16].copy_from_slice(&bits);
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

/// Q6_K `Folded`: the group-block offset of run `c` (0, 1, 2) of position (half `n`, 16-value
/// half `h`) for row `r`: 72 + 64·(3·(2n + h) + c) + 16r.
fn q6_run(n: usize, h: usize, c: usize, r: usize) -> usize {
    72 + 64 * (3 * (2 * n + h) + c) + 16 * r
}

/// Q6_K `Folded` from plain super-blocks: `d` and the scales as in `Split`; then for each half
/// n, 16-value half h and row r, bytes j of the three runs hold the 6-bit values k = 0, 1, 2 of
/// position l = 16h + j (value 128n + 32k + l) in bits 0‥5 and value k = 3's bits 2c, 2c + 1
/// in bits 6, 7 of run c.
fn fold_q6_k(b: [&[u8]; ROWS], gb: &mut [u8]) {
    for (r, b) in b.iter().enumerate() {
        let (m, _) = k_places(DType::Q6K, r);
        // d and the two scale halves: the first three places.
        for &(p, g, len) in &m[..3] {
            gb[g..g + len].copy_from_slice(&b[p..p + len]);
        }
        for n in 0..2 {
            for l in 0..32 {
                let (ql0, ql1, qh) = (b[64 * n + l], b[64 * n + 32 + l], b[128 + 32 * n + l]);
                let v = [ql0 & 15 | (qh & 3) << 4, ql1 & 15 | (qh >> 2 & 3) << 4, ql0 >> 4 | (qh >> 4 & 3) << 4, ql1 >> 4 | (qh >> 6 & 3) << 4];
                for c in 0..3 {
                    gb[q6_run(n, l / 16, c, r) + l % 16] = v[c] | (v[3] >> (2 * c) & 3) << 6;
                }
            }
        }
    }
}

/// The inverse of [`fold_q6_k`].
fn unfold_q6_k(gb: &[u8], out: &mut [[u8; MAX_BS]; ROWS]) {
    for (r, o) in out.iter_mut().enumerate() {
        let (m, _) = k_places(DType::Q6K, r);
        for &(p, g, len) in &m[..3] {
            o[p..p + len].copy_from_slice(&gb[g..g + len]);
        }
        for n in 0..2 {
            for l in 0..32 {
                let a: [u8; 3] = std::array::from_fn(|c| gb[q6_run(n, l / 16, c, r) + l % 16]);
                let v3 = a[0] >> 6 | (a[1] >> 6) << 2 | (a[2] >> 6) << 4;
                let v = [a[0] & 63, a[1] & 63, a[2] & 63, v3];
                o[64 * n + l] = v[0] & 15 | (v[2] & 15) << 4;
                o[64 * n + 32 + l] = v[1] & 15 | (v[3] & 15) << 4;
                o[128 + 32 * n + l] = v[0] >> 4 | (v[1] >> 4) << 2 | (v[2] >> 4) << 4 | (v[3] >> 4) << 6;
            }
        }
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
