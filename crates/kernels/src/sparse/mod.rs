//! Kernels of the sparse feed-forward (CATS/TEAL-style activation sparsity, KAIROX's CPU
//! part): the down projection stored neuron-major (a row per FFN neuron, `n_embd` values), so
//! a neuron that did not fire is a row not read, and the output is the sum over the firing
//! neurons of `h_i · row_i`.
//!
//! Semantics, fixed so every path gives the same bits: `y[j] = fma(h, w[j], y[j])`, where `w`
//! is the row's dequantized value exactly as the type's `to_float` computes it. [`axpy_f32`]
//! does it on values already dequantized (prefill: one dequantization per row for a block of
//! tokens), [`axpy_row`] on the quantized row (decode), fused in SIMD for Q8_0, Q5_0 and Q4_0
//! (their `to_float` products `q · d` are exact in f32, so SIMD needs no rounding of its own);
//! every other type dequantizes a block at a time into a stack buffer and calls
//! [`axpy_f32`]. Portable twins in [`portable`], 8/16-lane versions in [`x86`], the panel and
//! block kernels on 4 lanes in [`aarch64`].

use crate::{DType, Isa, Kernels};

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
pub mod portable;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// Largest block (a K-quant super-block) [`axpy_row`] dequantizes at a time.
const MAX_BLOCK: usize = 256;

/// `y[j] = fma(h, w[j], y[j])` for every `j`.
pub fn axpy_f32(k: &Kernels, h: f32, w: &[f32], y: &mut [f32]) {
    assert_eq!(w.len(), y.len(), "axpy lengths");
    #[cfg(target_arch = "x86_64")]
    if k.isa().avx512() {
        // SAFETY: an Avx512 table is only built after detecting AVX-512 F/VL, AVX2 and FMA.
        return unsafe { x86::axpy_f32_avx512(h, w, y) };
    }
    #[cfg(target_arch = "x86_64")]
    if k.isa() >= Isa::Avx2 {
        // SAFETY: an Avx2 table is only built after detecting AVX2 and FMA.
        return unsafe { x86::axpy_f32_avx2(h, w, y) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (k, Isa::Avx2);
    portable::axpy_f32(h, w, y)
}

/// `y[j] = fma(h, w[j], y[j])` for the values `w` of `row` (whole blocks of `t`, `y.len()`
/// values).
pub fn axpy_row(k: &Kernels, t: DType, row: &[u8], h: f32, y: &mut [f32]) {
    assert_eq!(crate::row_bytes(t, y.len()), row.len(), "axpy row of {} values of {t}", y.len());
    #[cfg(target_arch = "x86_64")]
    if k.isa() >= Isa::Avx2 && matches!(t, DType::Q8_0 | DType::Q5_0 | DType::Q4_0) {
        let avx512 = k.isa().avx512();
        // SAFETY: the table's level was detected (AVX2 and FMA; AVX-512 F/VL/BW for `avx512`).
        return unsafe { x86::axpy_row(t, row, h, y, avx512) };
    }
    let to_float = k.to_float(t).expect("a type with a dequantizer");
    let (bs, ts) = (t.block_size(), t.type_size());
    assert!(bs <= MAX_BLOCK);
    let mut w = [0f32; MAX_BLOCK];
    for (b, ys) in row.chunks_exact(ts).zip(y.chunks_exact_mut(bs)) {
        to_float(b, &mut w[..bs]);
        axpy_f32(k, h, &w[..bs], ys);
    }
}

/// Blocks of 32 columns in one panel of the neuron-major down projection (64 columns).
pub const PANEL_BLOCKS: usize = 2;

/// Where the blocks of a neuron-major down projection lie: column panels of [`PANEL_BLOCKS`]
/// blocks (the last one narrower when the block count is odd), each holding every neuron's
/// blocks of the panel in neuron order — neuron `i`'s piece of panel `p` at
/// `p · PANEL_BLOCKS · neurons + i · width(p)` blocks. A worker that owns some columns reads
/// its panels front to back, skipping the pieces of neurons that did not fire (a stream the
/// hardware prefetcher follows, where whole rows read a firing neuron at a time were not), and
/// keeps the panel's outputs in registers across every neuron.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Panels {
    /// Rows: FFN neurons.
    pub neurons: usize,
    /// Blocks of 32 columns per neuron (`n_embd / 32`).
    pub blocks: usize,
    /// Bytes per block.
    pub type_size: usize,
}

impl Panels {
    /// Blocks of panel `p`.
    pub fn width(&self, p: usize) -> usize {
        PANEL_BLOCKS.min(self.blocks - p * PANEL_BLOCKS)
    }

    /// Byte offset of block `b` of neuron `i`.
    pub fn at(&self, i: usize, b: usize) -> usize {
        let p = b / PANEL_BLOCKS;
        ((p * PANEL_BLOCKS * self.neurons) + i * self.width(p) + b % PANEL_BLOCKS) * self.type_size
    }

    /// Bytes between neighbouring neurons' pieces of panel `p`.
    pub fn stride(&self, p: usize) -> usize {
        self.width(p) * self.type_size
    }

    /// The copy's length in bytes.
    pub fn len(&self) -> usize {
        self.neurons * self.blocks * self.type_size
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Blocks `0 .. blocks` of each of the `neurons` rows of `rows` (plain rows of
    /// `blocks · type_size` bytes) written into `dst` in panels.
    pub fn pack(&self, rows: &[u8], dst: &mut [u8]) {
        assert_eq!(rows.len(), self.len(), "panel copy of {} bytes", self.len());
        for (i, row) in rows.chunks_exact(self.blocks * self.type_size).enumerate() {
            self.pack_row(i, row, dst);
        }
    }

    /// Neuron `i`'s plain row (`blocks · type_size` bytes) written into its places in `dst`.
    pub fn pack_row(&self, i: usize, row: &[u8], dst: &mut [u8]) {
        let ts = self.type_size;
        assert!(i < self.neurons && row.len() == self.blocks * ts && dst.len() == self.len(), "row {i} of a panel copy of {} bytes", self.len());
        for (b, blk) in row.chunks_exact(ts).enumerate() {
            dst[self.at(i, b)..][..ts].copy_from_slice(blk);
        }
    }
}

/// `y[j] = fma(h[i], w_i[j], y[j])` for each neuron `i` of `firing` in turn, where `w_i` are
/// the values of `y.len() / 32` (1 to [`PANEL_BLOCKS`]) blocks of `t` at `panel[i · stride..]`:
/// [`axpy_row`] neuron by neuron, the same bits, the outputs held in registers across the
/// neurons where SIMD has a kernel (Q8_0, Q5_0, Q4_0 on x86 and NEON).
pub fn axpy_panel(k: &Kernels, t: DType, panel: &[u8], stride: usize, firing: &[u32], h: &[f32], y: &mut [f32]) {
    let nb = y.len() / 32;
    let ts = t.type_size();
    assert!(y.len() == nb * 32 && (1..=PANEL_BLOCKS).contains(&nb) && nb * ts <= stride, "panel of {} values, stride {stride}", y.len());
    let last = firing.iter().copied().max().map_or(0, |i| i as usize);
    assert!(firing.is_empty() || (last * stride + nb * ts <= panel.len() && last < h.len()), "firing neuron {last} outside the panel");
    #[cfg(target_arch = "x86_64")]
    if k.isa() >= Isa::Avx2 && matches!(t, DType::Q8_0 | DType::Q5_0 | DType::Q4_0) {
        // SAFETY: the table's level was detected (AVX2, FMA and F16C; AVX-512 F/VL/BW for
        // Avx512); every piece read lies in `panel` and every `h` index in `h` (asserted).
        return unsafe {
            match (k.isa().avx512(), nb) {
                (true, 1) => x86::axpy_panel_avx512::<1>(t, panel, stride, firing, h, y),
                (true, _) => x86::axpy_panel_avx512::<2>(t, panel, stride, firing, h, y),
                (false, 1) => x86::axpy_panel_avx2::<1>(t, panel, stride, firing, h, y),
                (false, _) => x86::axpy_panel_avx2::<2>(t, panel, stride, firing, h, y),
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    if k.isa() != Isa::Portable && matches!(t, DType::Q8_0 | DType::Q5_0 | DType::Q4_0) {
        // SAFETY: NEON is every aarch64 CPU's; every piece read lies in `panel` and every `h`
        // index in `h` (asserted).
        return unsafe {
            match nb {
                1 => aarch64::axpy_panel_neon::<1>(t, panel, stride, firing, h, y),
                _ => aarch64::axpy_panel_neon::<2>(t, panel, stride, firing, h, y),
            }
        };
    }
    for &i in firing {
        let i = i as usize;
        axpy_row(k, t, &panel[i * stride..i * stride + nb * ts], h[i], y);
    }
}

/// Columns of one [`down_block`]: a block of every neuron-major type.
pub const DOWN_COLS: usize = 32;
/// Most token rows one [`down_block`] call takes.
pub const DOWN_TOKENS: usize = 8;

/// A batch's sparse down projection on one block of 32 columns (prefill): `w` holds every
/// neuron's 32 values of that block, dequantized (`[n_ff][32]`), `h` up to [`DOWN_TOKENS`]
/// token rows of `n_ff` activations, `y` their 32 outputs; for each token and each neuron `i`
/// in order with `h[i] != 0`, `y[j] = fma(h[i], w[i][j], y[j])` — [`axpy_f32`] neuron by
/// neuron, the same bits, with the tokens' accumulators held in registers while the block's
/// rows stream past. (Dequantizing in registers instead, tile by tile, measured no faster at
/// 16 tokens and 16 % slower at 512 than dequantizing the block once for all the tokens.)
pub fn down_block(k: &Kernels, h: &[&[f32]], w: &[f32], y: &mut [[f32; DOWN_COLS]]) {
    let n_ff = w.len() / DOWN_COLS;
    assert!(h.len() == y.len() && h.len() <= DOWN_TOKENS, "down block of {} token rows", h.len());
    assert!(w.len() == n_ff * DOWN_COLS && h.iter().all(|r| r.len() >= n_ff), "down block shapes");
    #[cfg(target_arch = "x86_64")]
    if k.isa() >= Isa::Avx2 {
        let avx512 = k.isa().avx512();
        // SAFETY: the table's level was detected (AVX2 and FMA; AVX-512 F/VL for Avx512); the
        // shapes were checked above.
        return unsafe { x86::down_block(h, w, y, avx512) };
    }
    #[cfg(target_arch = "aarch64")]
    if k.isa() != Isa::Portable {
        // SAFETY: NEON is every aarch64 CPU's; the shapes were checked above.
        return unsafe { aarch64::down_block(h, w, y) };
    }
    let _ = k;
    portable::down_block(h, w, y)
}

/// Types the neuron-major down projection can be stored in: those with blocks of 32 (model
/// widths such as 576, 640 and 896 are not multiples of 256) and a reference quantizer.
pub const NEURON_MAJOR_TYPES: [DType; 5] = [DType::Q8_0, DType::Q5_1, DType::Q5_0, DType::Q4_1, DType::Q4_0];
