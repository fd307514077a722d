//! The panel layout and the portable micro-kernel of the panel GEMM: [`PANEL`] weight rows
//! decoded into one interleaved block per 32 values (unsigned codes, four values of each of
//! the eight columns per 32-byte group, then the columns' scales and mins as f32), and the
//! activation blocks it meets (`Act`).

use crate::quant::blocks::*;
use half::f16;

/// Output columns per panel (lanes of one 256-bit vector of i32).
pub const PANEL: usize = 8;

/// Bytes of one packed block: 32 elements × 8 columns, plus 8 scales and 8 mins (f32).
pub const PACKED_BLOCK: usize = 32 * PANEL + 2 * 4 * PANEL;

/// Where a packer writes a panel's blocks, each ten 32-byte units (eight groups, the scales,
/// the mins): alone ([`PanelLayout::SINGLE`]: block b at `b · PACKED_BLOCK`, its units one
/// after the other, the layout every kernel but one reads), or as half `h` of a pair
/// ([`PanelLayout::pair`]): block b of both panels at `b · 2 · PACKED_BLOCK`, their units
/// alternating, so that unit u of the two panels is one 64-byte vector at `64u`, panel 0's
/// columns first — what the AVX-512 kernel of two panels (`x86::panel_pair`) reads: one load
/// per group where two halves were joined (Zen 5, one thread, Q4_1 576 × 1536 over 16 rows in
/// L2: 8–14 % less time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PanelLayout {
    /// Bytes from one block to the next.
    pub block: usize,
    /// Bytes from one unit to the next.
    pub unit: usize,
    /// Where the panel's units start within a block.
    pub half: usize,
}

impl PanelLayout {
    pub const SINGLE: PanelLayout = PanelLayout { block: PACKED_BLOCK, unit: 32, half: 0 };

    /// Half `h` (0 or 1) of a pair.
    pub const fn pair(h: usize) -> PanelLayout {
        PanelLayout { block: 2 * PACKED_BLOCK, unit: 64, half: 32 * h }
    }

    /// Where the panel's units of block `b` start (unit `u` of it `u · unit` further).
    pub const fn at(self, b: usize) -> usize {
        b * self.block + self.half
    }
}

/// Activation block layout of a weight type's `vec_dot_type`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Act {
    Q8_0,
    Q8_1,
    Q8K,
}

/// Activation scale and sum term of block `b` of a row (`s` is 0 for Q8_0).
#[inline]
pub fn act_block(row: &[u8], b: usize, act: Act) -> (f32, f32, &[i8; 32]) {
    act_block_with(row, b, act, f16::to_f32)
}

/// [`act_block`] with the F16 → f32 conversion given (the SIMD kernel passes F16C's).
#[inline(always)]
pub fn act_block_with(row: &[u8], b: usize, act: Act, h2f: impl Fn(f16) -> f32) -> (f32, f32, &[i8; 32]) {
    match act {
        Act::Q8_1 => {
            let x = &as_blocks::<BlockQ8_1>(row)[b];
            (h2f(x.d), h2f(x.s), &x.qs)
        }
        Act::Q8_0 => {
            let x = &as_blocks::<BlockQ8_0>(row)[b];
            (h2f(x.d), 0.0, &x.qs)
        }
        Act::Q8K => q8k_block(row, b),
    }
}

/// Byte offset, within an activation row of kind `act`, of block `b`'s 32 codes (what
/// [`act_block`] returns as values), for kernels that address the rows' codes in place.
#[inline]
pub fn codes_at(act: Act, b: usize) -> usize {
    use std::mem::{offset_of, size_of};
    match act {
        Act::Q8_0 => b * size_of::<BlockQ8_0>() + offset_of!(BlockQ8_0, qs),
        Act::Q8_1 => b * size_of::<BlockQ8_1>() + offset_of!(BlockQ8_1, qs),
        Act::Q8K => b / 8 * size_of::<BlockQ8K>() + offset_of!(BlockQ8K, qs) + b % 8 * 32,
    }
}

/// Block `b` (32 values) of a Q8_K row: scale, `d·Σy` from the two 16-sums, values.
#[inline]
pub fn q8k_block(row: &[u8], b: usize) -> (f32, f32, &[i8; 32]) {
    let x = &as_blocks::<BlockQ8K>(row)[b / 8];
    let j = b % 8;
    let sum = x.bsums[2 * j] as i32 + x.bsums[2 * j + 1] as i32;
    (x.d, x.d * sum as f32, x.qs[j * 32..j * 32 + 32].try_into().expect("32 values"))
}

/// One panel kernel call's inputs: the packed panel of `nb` blocks, of which blocks
/// `b0 .. b1` are summed, its weights' code offset `o` and largest code `umax` (15, 31, 63 or
/// 255: how many products the AVX2 kernel may add in i16), the activation type, whether the type
/// keeps two scales per block ([`super::split16`]), `rows` activation rows (`x`, `xrb` bytes
/// apart) with their half-block sums `ysum` and, for the x86 kernels, their block scalars `sc`
/// (`tile::row_scalars` of the call's `sc_rows` rows, from this job's first, made with the
/// offset `−o`: its row r's block b at `(b · sc_rows + r) · ROW_SCALARS`; empty: read from the
/// rows), the rows per
/// register tile `mr`
/// ([`crate::matmul::schedule::PANEL_MR`]; the portable twin ignores it), and `ahead`: weight
/// bytes of a later column block that the x86 kernels ask for into L2 a few lines per step of
/// their loops (the others ignore it; empty: none).
#[derive(Clone, Copy)]
pub struct PanelJob<'a> {
    pub panel: &'a [u8],
    pub nb: usize,
    pub b0: usize,
    pub b1: usize,
    pub mr: usize,
    pub o: i32,
    pub umax: i32,
    pub act: Act,
    pub split: bool,
    pub x: &'a [u8],
    pub xrb: usize,
    pub ysum: &'a [i32],
    pub sc: &'a [u8],
    pub sc_rows: usize,
    pub rows: usize,
    pub ahead: &'a [u8],
}

/// Scalar micro-kernel over one packed panel: the twin of the SIMD kernels, bit for bit. Row
/// `r`'s accumulators start at `acc0(r)` (zeros for the first inner block range, the partial
/// sums so far for the next) and end in `store(r, ..)`.
pub fn panel_portable(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], mut store: impl FnMut(usize, &[f32; PANEL])) {
    let PanelJob { panel, nb, b0, b1, o, act, split, x, xrb, ysum, rows, .. } = job;
    let has_min = act != Act::Q8_0 && !split;
    for r in 0..rows {
        let row = &x[r * xrb..(r + 1) * xrb];
        let mut acc = acc0(r);
        for b in b0..b1 {
            let blk = &panel[b * PACKED_BLOCK..(b + 1) * PACKED_BLOCK];
            let (dx, sx, y) = act_block(row, b, act);
            for (col, a) in acc.iter_mut().enumerate() {
                // Integer sums of the two 16-element halves (groups 0..4 and 4..8).
                let mut s = [0i32; 2];
                for g in 0..8 {
                    for i in 0..4 {
                        s[g / 4] += blk[g * 32 + col * 4 + i] as i32 * y[g * 4 + i] as i32;
                    }
                }
                let ys = &ysum[(r * nb + b) * 2..(r * nb + b) * 2 + 2];
                let dw = f32::from_le_bytes(blk[256 + col * 4..256 + col * 4 + 4].try_into().unwrap());
                let mw = f32::from_le_bytes(blk[288 + col * 4..288 + col * 4 + 4].try_into().unwrap());
                if split {
                    *a = ((s[0] - o * ys[0]) as f32).mul_add(dw * dx, *a);
                    *a = ((s[1] - o * ys[1]) as f32).mul_add(mw * dx, *a);
                    continue;
                }
                *a = ((s[0] + s[1] - o * (ys[0] + ys[1])) as f32).mul_add(dw * dx, *a);
                if has_min {
                    *a = mw.mul_add(sx, *a);
                }
            }
        }
        store(r, &acc);
    }
}
