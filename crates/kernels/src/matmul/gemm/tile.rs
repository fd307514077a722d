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

use super::panel::{act_block, Act, PACKED_BLOCK, PANEL};

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
            let (dx, sx, y) = act_block(&x[i * xrb..(i + 1) * xrb], b, act);
            for g in 0..8 {
                blk[g * 4 * r + i * 4..g * 4 * r + i * 4 + 4].copy_from_slice(&y[g * 4..g * 4 + 4]);
            }
            let ys = &ysum[(i * nb + b) * 2..(i * nb + b) * 2 + 2];
            let (oy0, oy1) = if split { (o * ys[0], o * ys[1]) } else { (o * (ys[0] + ys[1]), 0) };
            s[0..4].copy_from_slice(&oy0.to_le_bytes());
            s[4..8].copy_from_slice(&oy1.to_le_bytes());
            s[8..12].copy_from_slice(&dx.to_le_bytes());
            s[12..16].copy_from_slice(&sx.to_le_bytes());
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
