//! The panel GEMM on a matrix unit (Arm SME's outer products), and the portable model of what
//! its kernels compute, which they are tested against bit for bit.
//!
//! A matrix unit keeps a square tile of 32-bit accumulators (ZA; `r × r` for a streaming
//! vector of `4r` bytes) and adds to it, per instruction, the outer product of two vectors:
//! `SUMOPA` adds `Σₗ n[4i+l]·m[4j+l]` (signed bytes `n`, unsigned bytes `m`) to element
//! `(i, j)`; `FMOPA` adds `n[i]·m[j]` to it, fused ([`sumopa`], [`fmopa`]). The panel GEMM
//! maps rows to `i` and columns to `j`: a row tile's activations, packed once per tile
//! ([`pack_rows`]: for each 32-block, 8 groups of `r` rows × 4 values, so one group is one
//! vector), meet the panel's unsigned codes as they are (8 columns × 4 codes of a group: 32
//! bytes, the first 8 columns of the tile). Each block's two 16-element halves go to two tiles,
//! read out row by row and folded into f32 accumulators with the panel's float steps
//! ([`panel_tile_model`]): the same integers and the same fused operations in the same order as
//! [`super::panel_portable`], so the matrix-unit GEMM is bit-identical to the portable panel.
//!
//! The f32 GEMM ([`gemm_f32_model`]) is FMOPA's: each output a chain of fused multiply-adds
//! over `k` in order, starting from its value.
//!
//! Intel AMX multiplies whole tiles instead: `TDPBSUD` adds to each i32 element `(i, j)` of a
//! tile C the dot product of row `i` of a tile A (signed bytes) with the 4-byte groups `j` of
//! every row of a tile B (unsigned bytes, one row per 4 values of K) ([`tdpbsud`]). Its GEMM
//! reads a row tile of up to [`PAIR_ROWS`] activation rows in place (a block's 32 codes of a
//! row are a tile row, the rows `xrb` bytes apart: nothing is packed) against two panels at
//! once, whose code groups are already B tiles (8 rows of 8 columns × 4 codes): per block (per
//! half-block for the split types) one product per panel, then the same float steps per row
//! and column ([`pair_tile_model`]) with the rows' block scalars computed once per GEMM call
//! ([`row_scalars`]), so it too is bit-identical to the portable panel.

use super::panel::{act_block, act_block_with, codes_at, Act, PACKED_BLOCK, PANEL};
use half::f16;

/// Bytes of one row's scalars per block in a packed row tile: `o·Σy` of the two halves (i32;
/// one combined for types without a split), the activation scale `d_x` and sum term `s_x`
/// (f32), little-endian.
pub const ROW_SCALARS: usize = 16;

/// One matrix-unit panel call: a packed row tile (`act`: `nblk` blocks of 8 groups × `r` rows ×
/// 4 codes; `sc`: `nblk` blocks of `r` × [`ROW_SCALARS`]) against one packed panel (from its
/// first summed block), `rows ≤ r` of which are real.
#[derive(Clone, Copy)]
pub struct TileJob<'a> {
    pub act: &'a [i8],
    pub sc: &'a [u8],
    pub panel: &'a [u8],
    pub nblk: usize,
    pub r: usize,
    pub rows: usize,
    pub split: bool,
    pub has_min: bool,
}

/// A matrix-unit panel kernel: `acc[i] += ` row `i`'s products with the panel's columns, for
/// `i < job.rows`.
pub type TileKernel = unsafe fn(job: &TileJob, acc: &mut [[f32; PANEL]]);

/// Rows of the row tile of the two-panel kernels (AMX: a tile's 16 rows).
pub const PAIR_ROWS: usize = 16;

/// One two-panel matrix-unit call (AMX): `rows ≤` [`PAIR_ROWS`] activation rows read in place
/// (`x` from the first, `xrb` bytes apart, kind `act`: block `b`'s codes at
/// [`codes_at`](super::panel::codes_at)), blocks `b0..b1`, against two packed panels (from
/// their block 0; the second may be the first again). `sc` holds every row's block scalars
/// ([`row_scalars`]: `(b · n_rows + row0 + i) ·` [`ROW_SCALARS`] for the tile's row `i`).
#[derive(Clone, Copy)]
pub struct PairJob<'a> {
    pub x: &'a [u8],
    pub xrb: usize,
    pub act: Act,
    pub rows: usize,
    pub b0: usize,
    pub b1: usize,
    pub sc: &'a [u8],
    pub n_rows: usize,
    pub row0: usize,
    pub panels: [&'a [u8]; 2],
    pub split: bool,
    pub has_min: bool,
}

impl PairJob<'_> {
    /// Row `i`'s scalars of block `b`.
    #[inline(always)]
    pub fn scalars(&self, b: usize, i: usize) -> &[u8] {
        let at = (b * self.n_rows + self.row0 + i) * ROW_SCALARS;
        &self.sc[at..at + ROW_SCALARS]
    }
}

/// A two-panel matrix-unit kernel: `acc[i][..8] += ` row `i`'s products with the first
/// panel's columns and `acc[i][8..]` with the second's, for `i < job.rows`.
pub type PairKernel = unsafe fn(job: &PairJob, acc: &mut [[f32; 2 * PANEL]]);

/// How [`super::gemm_impl`] runs its row tiles on a matrix unit.
#[derive(Clone, Copy)]
pub enum TileUnit {
    /// One panel per call, row tiles of `r` rows packed by groups (SME's outer products).
    Panel(usize, TileKernel),
    /// Two panels per call, row tiles of [`PAIR_ROWS`] rows read in place (AMX's tiles).
    Pair(PairKernel),
}

impl TileUnit {
    /// Rows per row tile.
    pub fn rows(self) -> usize {
        match self {
            TileUnit::Panel(r, _) => r,
            TileUnit::Pair(_) => PAIR_ROWS,
        }
    }
}

/// Row `i`'s scalars of block `b` ([`ROW_SCALARS`] bytes): `o·Σy` of the two halves (one
/// combined without a split), `d_x`, `s_x` (F16 scales converted by `h2f`).
#[inline(always)]
fn block_scalars(row: &[u8], b: usize, act: Act, ys: &[i32], (o, split): (i32, bool), h2f: impl Fn(f16) -> f32) -> [u8; ROW_SCALARS] {
    let (dx, sx, _) = act_block_with(row, b, act, h2f);
    let (oy0, oy1) = if split { (o * ys[0], o * ys[1]) } else { (o * (ys[0] + ys[1]), 0) };
    let mut s = [0u8; ROW_SCALARS];
    s[0..4].copy_from_slice(&oy0.to_le_bytes());
    s[4..8].copy_from_slice(&oy1.to_le_bytes());
    s[8..12].copy_from_slice(&dx.to_le_bytes());
    s[12..16].copy_from_slice(&sx.to_le_bytes());
    s
}

/// Every row's block scalars, once per GEMM call, block-major (`out[(b · rows + r) ·`
/// [`ROW_SCALARS`]`..]`: a row tile's are contiguous per block). `ysum` as [`pack_rows`]';
/// F16 scales converted by `h2f` (the x86 caller passes F16C's: the same values).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn row_scalars_with(x: &[u8], xrb: usize, rows: usize, nb: usize, act: Act, ysum: &[i32], os: (i32, bool), out: &mut [u8], h2f: impl Fn(f16) -> f32 + Copy) {
    debug_assert!(out.len() >= nb * rows * ROW_SCALARS);
    for r in 0..rows {
        let row = &x[r * xrb..(r + 1) * xrb];
        for b in 0..nb {
            let at = (b * rows + r) * ROW_SCALARS;
            out[at..at + ROW_SCALARS].copy_from_slice(&block_scalars(row, b, act, &ysum[(r * nb + b) * 2..], os, h2f));
        }
    }
}

/// [`row_scalars_with`] with `half`'s conversion.
#[allow(clippy::too_many_arguments)]
pub fn row_scalars(x: &[u8], xrb: usize, rows: usize, nb: usize, act: Act, ysum: &[i32], os: (i32, bool), out: &mut [u8]) {
    row_scalars_with(x, xrb, rows, nb, act, ysum, os, out, f16::to_f32)
}

/// Pack rows `0..rows` (≤ `r`; the rest zero) of `x` (rows `xrb` bytes apart, activation type
/// `act`), blocks `b0..b1` of `nb`, into `codes` and `sc` ([`TileJob`]'s layout). `ysum`: the
/// rows' half-block sums (`[(i·nb + b)·2 + h]`), `o` the weight codes' offset, `split` as the
/// panel's.
#[allow(clippy::too_many_arguments)]
pub fn pack_rows(x: &[u8], xrb: usize, rows: usize, r: usize, (b0, b1, nb): (usize, usize, usize), act: Act, ysum: &[i32], o: i32, split: bool, codes: &mut [i8], sc: &mut [u8]) {
    debug_assert!(rows <= r && codes.len() >= (b1 - b0) * 32 * r && sc.len() >= (b1 - b0) * r * ROW_SCALARS);
    for (bi, b) in (b0..b1).enumerate() {
        let blk = &mut codes[bi * 32 * r..(bi + 1) * 32 * r];
        let scb = &mut sc[bi * r * ROW_SCALARS..(bi + 1) * r * ROW_SCALARS];
        for i in 0..r {
            let s = &mut scb[i * ROW_SCALARS..(i + 1) * ROW_SCALARS];
            if i >= rows {
                for g in 0..8 {
                    blk[g * 4 * r + i * 4..g * 4 * r + i * 4 + 4].fill(0);
                }
                s.fill(0);
                continue;
            }
            let row = &x[i * xrb..(i + 1) * xrb];
            let y = act_block(row, b, act).2;
            for g in 0..8 {
                blk[g * 4 * r + i * 4..g * 4 * r + i * 4 + 4].copy_from_slice(&y[g * 4..g * 4 + 4]);
            }
            s.copy_from_slice(&block_scalars(row, b, act, &ysum[(i * nb + b) * 2..], (o, split), f16::to_f32));
        }
    }
}

/// SUMOPA on an `r × r` tile of i32 (row-major): `za[i][j] += Σₗ zn[4i+l]·zm[4j+l]`, wrapping.
pub fn sumopa(za: &mut [i32], r: usize, zn: &[i8], zm: &[u8]) {
    for i in 0..r {
        for j in 0..r {
            let s: i32 = (0..4).map(|l| zn[4 * i + l] as i32 * zm[4 * j + l] as i32).sum();
            za[i * r + j] = za[i * r + j].wrapping_add(s);
        }
    }
}

/// FMOPA on an `r × r` tile of f32: `za[i][j] = fma(zn[i], zm[j], za[i][j])`.
pub fn fmopa(za: &mut [f32], r: usize, zn: &[f32], zm: &[f32]) {
    for i in 0..r {
        for j in 0..r {
            za[i * r + j] = zn[i].mul_add(zm[j], za[i * r + j]);
        }
    }
}

fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// What the matrix-unit panel kernel computes, step by step as it does: per block, the two
/// halves' outer products into two zeroed tiles (groups 0–3, 4–7; the panel's 32 code bytes are
/// the first 8 columns, the rest of the vector zero), then per real row the read-out and the
/// panel's float steps.
pub fn panel_tile_model(job: &TileJob, acc: &mut [[f32; PANEL]]) {
    let TileJob { act, sc, panel, nblk, r, rows, split, has_min } = *job;
    let mut za = [vec![0i32; r * r], vec![0i32; r * r]];
    let mut zm = vec![0u8; 4 * r];
    for b in 0..nblk {
        let blk = &panel[b * PACKED_BLOCK..(b + 1) * PACKED_BLOCK];
        za.iter_mut().for_each(|t| t.fill(0));
        for g in 0..8 {
            zm[..32].copy_from_slice(&blk[g * 32..g * 32 + 32]);
            let zn = &act[(b * 8 + g) * 4 * r..(b * 8 + g + 1) * 4 * r];
            sumopa(&mut za[g / 4], r, zn, &zm);
        }
        for (i, a) in acc.iter_mut().enumerate().take(rows) {
            let s = &sc[(b * r + i) * ROW_SCALARS..(b * r + i + 1) * ROW_SCALARS];
            let (oy0, oy1, dx, sx) = (i32_at(s, 0), i32_at(s, 4), f32_at(s, 8), f32_at(s, 12));
            for (j, v) in a.iter_mut().enumerate() {
                let (s0, s1) = (za[0][i * r + j], za[1][i * r + j]);
                let (dw, mw) = (f32_at(blk, 256 + 4 * j), f32_at(blk, 288 + 4 * j));
                if split {
                    *v = (s0.wrapping_sub(oy0) as f32).mul_add(dw * dx, *v);
                    *v = (s1.wrapping_sub(oy1) as f32).mul_add(mw * dx, *v);
                } else {
                    *v = (s0.wrapping_add(s1).wrapping_sub(oy0) as f32).mul_add(dw * dx, *v);
                    if has_min {
                        *v = mw.mul_add(sx, *v);
                    }
                }
            }
        }
    }
}

/// The matrix-unit panel kernel's model as a [`TileKernel`] (the portable stand-in the tests
/// drive the tiled GEMM with).
///
/// # Safety
/// None: safe code behind the kernel type's signature.
pub unsafe fn panel_tile_portable(job: &TileJob, acc: &mut [[f32; PANEL]]) {
    panel_tile_model(job, acc)
}

/// Random inputs of the matrix units' start-up self-tests (xorshift, fixed seed): raw words,
/// values in [−1, 1], rows' block scalars and packed panels in their layouts.
pub struct TestData(u64);

impl Default for TestData {
    fn default() -> Self {
        TestData(0x9E37_79B9_7F4A_7C15)
    }
}

impl TestData {
    pub fn word(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in [−1, 1] in steps of 1/1000.
    pub fn unit(&mut self) -> f32 {
        (self.word() % 2001) as f32 / 1000.0 - 1.0
    }

    /// `n` rows' block scalars ([`ROW_SCALARS`] bytes each): offsets in ±10000, `d_x` in
    /// ±1/64, `s_x` in ±1.
    pub fn scalars(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                let (oy0, oy1) = ((self.word() % 20000) as i32 - 10000, (self.word() % 20000) as i32 - 10000);
                let (dx, sx) = (self.unit() / 64.0, self.unit());
                [oy0.to_le_bytes(), oy1.to_le_bytes(), dx.to_le_bytes(), sx.to_le_bytes()].concat()
            })
            .collect()
    }

    /// A packed panel of `nblk` blocks: codes up to 255, scales and mins in ±1/32.
    pub fn panel(&mut self, nblk: usize) -> Vec<u8> {
        (0..nblk)
            .flat_map(|_| {
                let codes: Vec<u8> = (0..32 * PANEL).map(|_| self.word() as u8).collect();
                let scales: Vec<u8> = (0..2 * PANEL).flat_map(|_| (self.unit() / 32.0).to_le_bytes()).collect();
                [codes, scales].concat()
            })
            .collect()
    }
}

/// TDPBSUD on tiles of i32 `c` (`m` rows of `n` elements, row-major), signed bytes `a` (`m`
/// rows of `kb` bytes, `a_stride` apart) and unsigned bytes `b` (`kb / 4` rows of `4n` bytes,
/// `b_stride` apart): `c[i][j] += Σₖ Σₗ a[i][4k+l]·b[k][4j+l]`, wrapping.
#[allow(clippy::too_many_arguments)]
pub fn tdpbsud(c: &mut [i32], (m, n, kb): (usize, usize, usize), a: &[i8], a_stride: usize, b: &[u8], b_stride: usize) {
    for i in 0..m {
        for j in 0..n {
            let mut s = 0i32;
            for k in 0..kb / 4 {
                for l in 0..4 {
                    s = s.wrapping_add(a[i * a_stride + 4 * k + l] as i32 * b[k * b_stride + 4 * j + l] as i32);
                }
            }
            c[i * n + j] = c[i * n + j].wrapping_add(s);
        }
    }
}

/// What the AMX two-panel kernel computes, step by step as it does: per block (per half-block
/// for the split types: 16 codes of each row against the panels' groups 0–3, then 4–7), a
/// zeroed `rows` × 8 tile per panel, one [`tdpbsud`] each on the rows' codes in place, then per
/// row the read-out and the panel's float steps on the 16 columns (the first panel's 8, then
/// the second's).
pub fn pair_tile_model(job: &PairJob, acc: &mut [[f32; 2 * PANEL]]) {
    let PairJob { x, xrb, act, rows, b0, b1, panels, split, has_min, .. } = *job;
    if rows == 0 {
        return;
    }
    let (halves, kb) = if split { (2, 16) } else { (1, 32) };
    for b in b0..b1 {
        let blks = panels.map(|p| &p[b * PACKED_BLOCK..(b + 1) * PACKED_BLOCK]);
        // c[h][p]: half h's sums with panel p, `rows` rows × 8 columns.
        let mut c = [[[0i32; PAIR_ROWS * PANEL]; 2]; 2];
        for (h, ch) in c.iter_mut().enumerate().take(halves) {
            // The tile's codes as signed bytes (the activation rows' i8 values): `rows` rows of
            // `kb` bytes, `xrb` apart.
            let at = codes_at(act, b) + h * kb;
            let a: Vec<i8> = x[at..at + (rows - 1) * xrb + kb].iter().map(|&v| v as i8).collect();
            for (p, cp) in ch.iter_mut().enumerate() {
                tdpbsud(cp, (rows, PANEL, kb), &a, xrb, &blks[p][h * 4 * 32..], 32);
            }
        }
        for (i, a) in acc.iter_mut().enumerate().take(rows) {
            let s = job.scalars(b, i);
            let (oy0, oy1, dx, sx) = (i32_at(s, 0), i32_at(s, 4), f32_at(s, 8), f32_at(s, 12));
            for (jj, v) in a.iter_mut().enumerate() {
                let (p, j) = (jj / PANEL, jj % PANEL);
                let (dw, mw) = (f32_at(blks[p], 256 + 4 * j), f32_at(blks[p], 288 + 4 * j));
                let s0 = c[0][p][i * PANEL + j];
                if split {
                    let s1 = c[1][p][i * PANEL + j];
                    *v = (s0.wrapping_sub(oy0) as f32).mul_add(dw * dx, *v);
                    *v = (s1.wrapping_sub(oy1) as f32).mul_add(mw * dx, *v);
                } else {
                    *v = (s0.wrapping_sub(oy0) as f32).mul_add(dw * dx, *v);
                    if has_min {
                        *v = mw.mul_add(sx, *v);
                    }
                }
            }
        }
    }
}

/// The AMX kernel's model as a [`PairKernel`] (the portable stand-in the tests drive the tiled
/// GEMM with).
///
/// # Safety
/// None: safe code behind the kernel type's signature.
pub unsafe fn pair_tile_portable(job: &PairJob, acc: &mut [[f32; 2 * PANEL]]) {
    pair_tile_model(job, acc)
}

/// FMOPA's f32 GEMM: `c[i][j] = fma(a[i][k−1], b[j][k−1], … fma(a[i][0], b[j][0], c[i][j]))`
/// for `a` `m × k` and `b` `n × k` (row-major), `c` `m × n`.
pub fn gemm_f32_model(a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
    for i in 0..m {
        for j in 0..n {
            let mut v = c[i * n + j];
            for kk in 0..k {
                v = a[i * k + kk].mul_add(b[j * k + kk], v);
            }
            c[i * n + j] = v;
        }
    }
}
