//! Matmuls of dense weights (F32, F16, BF16) over a batch where llama.cpp runs llamafile's
//! tinyBLAS (`BatchDot::applies`): every output is tinyBLAS's value, one accumulator per
//! output, computed in 4 × 4 register tiles.
//!
//! F16 goes through f32 tiles: each chunk of [`ACT_CHUNK`] activation rows is widened to f32
//! once, and for each chunk each 16-row column block of weights (F16 → f32 is exact, so the
//! products and sums are the same). The F16 tile converts both operands in its inner loop and
//! is bound by the conversions (21 of the 32 FLOP per cycle one core can do here); on f32 rows
//! it reaches 27. Re-widening a weight block once per chunk costs one conversion per
//! `ACT_CHUNK` multiply-adds. A batch's last one to three rows take the table's tiles for so
//! few rows (`BatchDot::few`: one accumulator per output still, several outputs side by side)
//! rather than one latency-bound dot per output.

use super::matmul::{matmul_part, store_cols, COL_BLOCK};
use super::{Ctx, Scratch};
use crate::tensor::{Tensor, TensorId};
use corelm_kernels::BatchDot;

/// Activation rows widened at once (F16): 64 rows of 1536 values are 384 KiB, in L2 with a
/// widened weight block.
pub(super) const ACT_CHUNK: usize = 64;

/// Fewest rows of a batch whose weight blocks are widened first (F16).
pub(super) const WIDE_MIN_ROWS: usize = 8;

/// The bytes of an f32 slice (the tiles take rows as bytes).
fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialised bytes; u8 has alignment 1; the length covers the slice.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

impl Ctx<'_> {
    /// [`Ctx::matmul`] for a dense type whose batch dot applies: worker `ith`'s outputs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_dense(&self, t: &Tensor, wid: TensorId, x: TensorId, b: BatchDot, ith: usize, nth: usize, scratch: &mut Scratch) {
        let wt = self.t(wid);
        let [k, n_out] = wt.ne;
        let rows = t.ne[1];
        let (wrb, xrb) = (wt.row_bytes(), self.t(x).row_bytes());
        let (wb, xb) = (self.bytes(wid), self.bytes(x));
        let (cols, row_range) = matmul_part(n_out, rows, ith, nth, 1);
        if cols.is_empty() {
            return;
        }
        let (base, ld) = (self.base(t) as *mut f32, self.row_stride(t));
        // Fewer than `WIDE_MIN_ROWS` rows take the type's own tiles: a widened weight block is
        // worth its conversions and stores only where several groups of four rows reuse it.
        let wide = b.wide.filter(|_| row_range.len() >= WIDE_MIN_ROWS && scratch.wide.len() >= COL_BLOCK * k && scratch.wide_act.len() >= ACT_CHUNK * k);
        let chunk = if wide.is_some() { ACT_CHUNK } else { row_range.len().max(1) };
        let xrow = |r: usize| &xb[r * xrb..(r + 1) * xrb];
        for r0 in row_range.clone().step_by(chunk) {
            let r1 = (r0 + chunk).min(row_range.end);
            let groups_end = r0 + (r1 - r0) / 4 * 4;
            // The last one to three rows: the table's tile for so few, where it has one.
            let few = match wide {
                Some(wd) => wd.few,
                None => b.few,
            };
            let few = few.filter(|_| groups_end < r1);
            let widened_end = if few.is_some() { r1 } else { groups_end };
            if let Some(wd) = wide {
                (wd.widen)(&xb[r0 * xrb..widened_end * xrb], &mut scratch.wide_act[..(widened_end - r0) * k]);
            }
            let mut c0 = cols.start;
            while c0 < cols.end {
                let c1 = (c0 + COL_BLOCK).min(cols.end);
                let n_tile = (c1 - c0) / 4 * 4;
                let w = &wb[c0 * wrb..c1 * wrb];
                if let Some(wd) = wide {
                    (wd.widen)(&w[..n_tile * wrb], &mut scratch.wide[..n_tile * k]);
                }
                for r in (r0..groups_end).step_by(4) {
                    let ys = [xrow(r), xrow(r + 1), xrow(r + 2), xrow(r + 3)];
                    let mut o = [[0f32; 4]; COL_BLOCK];
                    match wide {
                        Some(wd) => {
                            let a = f32_bytes(&scratch.wide_act[(r - r0) * k..(r - r0 + 4) * k]);
                            let ya = [&a[..4 * k], &a[4 * k..8 * k], &a[8 * k..12 * k], &a[12 * k..]];
                            (wd.tile)(f32_bytes(&scratch.wide[..n_tile * k]), 4 * k, ya, &mut o[..n_tile]);
                        }
                        None => (b.tile)(&w[..n_tile * wrb], wrb, ys, &mut o[..n_tile]),
                    }
                    // SAFETY: columns c0..c0 + n_tile of rows r..r + 4 are this worker's.
                    unsafe { store_cols(base, ld, r, c0, &o[..n_tile]) };
                    for c in c0 + n_tile..c1 {
                        for (j, y) in ys.iter().enumerate() {
                            // SAFETY: column c of these rows is written by this worker only.
                            unsafe { *base.add((r + j) * ld + c) = (b.dot)(&w[(c - c0) * wrb..(c - c0 + 1) * wrb], y) };
                        }
                    }
                }
                // Rows past the groups of four: the few-row tile over the block's columns in
                // whole groups of four where the table has one, one dot per output for the rest.
                let mut dot_from = c0;
                if let Some(few) = few {
                    let n = r1 - groups_end;
                    let mut o = [[0f32; 4]; COL_BLOCK];
                    match wide {
                        Some(_) => {
                            let a = f32_bytes(&scratch.wide_act[(groups_end - r0) * k..(r1 - r0) * k]);
                            let ya: [&[u8]; 3] = std::array::from_fn(|j| &a[(j % n) * 4 * k..(j % n + 1) * 4 * k]);
                            few(f32_bytes(&scratch.wide[..n_tile * k]), 4 * k, &ya[..n], &mut o[..n_tile]);
                        }
                        None => {
                            let ys: [&[u8]; 3] = std::array::from_fn(|j| xrow(groups_end + j % n));
                            few(&w[..n_tile * wrb], wrb, &ys[..n], &mut o[..n_tile]);
                        }
                    }
                    for (i, o) in o[..n_tile].iter().enumerate() {
                        for (j, &v) in o[..n].iter().enumerate() {
                            // SAFETY: column c0 + i of these rows is written by this worker only.
                            unsafe { *base.add((groups_end + j) * ld + c0 + i) = v };
                        }
                    }
                    dot_from = c0 + n_tile;
                }
                for r in groups_end..r1 {
                    for c in dot_from..c1 {
                        // SAFETY: column c of row r is written by this worker only.
                        unsafe { *base.add(r * ld + c) = (b.dot)(&w[(c - c0) * wrb..(c - c0 + 1) * wrb], xrow(r)) };
                    }
                }
                c0 = c1;
            }
        }
    }
}
