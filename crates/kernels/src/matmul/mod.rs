//! Matrix products of weight rows with activation rows, per weight type, in the shapes the
//! scheduler asks for: one row against one (`vec_dot`, ggml's order), four activation rows
//! (`vec_dot4`), register tiles of 4×4 (`vec_tile`), decode's GEMV (`vec_dot_rows`), tiles and
//! GEMV on weights interleaved at load ([`layout`]), the dense types' batch dots, and the
//! panel GEMM of `--fast-prefill` ([`gemm`]). This module defines the entries of the per-type
//! table (`TypeOps`); `crate::dispatch` fills it from CPU detection.
//!
//! | file | holds |
//! |---|---|
//! | [`portable`] | the portable twin of every dot product (the reference the SIMD ones are tested against) |
//! | [`lanes`] | the x86 SIMD dots' float order (eight lanes per block) without SIMD: the reference of the AVX2, AVX-512 and NEON dots |
//! | [`layout`] | the load-time interleaved layout (`pack`/`unpack`) and its portable GEMV |
//! | [`gemm`] | the panel GEMM: driver, panel layout + portable micro-kernel, VNNI micro-kernel; `gemm/tile.rs` its matrix-unit form (row tiles, outer products) and their portable model |
//! | [`schedule`] | a prefill matmul's register tile, cache blocking and thread grid (`corelm tune`) |
//! | `x86/common.rs` | block decoders and integer sums shared by the x86 dots; the interleaved 32-blocks' decoding (`IlBlock`) |
//! | `x86/avx2.rs` | AVX2 dots of the golden models' types (Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, F16, F32), four-row dots |
//! | `x86/avx2_ext.rs` | AVX2 dots of the other types (Q4_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS, BF16) |
//! | `x86/avx2_iq.rs` | AVX2 dots of the 1- to 3-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and their 4-row forms, in ggml's AVX2 order |
//! | `x86/avx2_il.rs` | AVX2 GEMV and tiles on the interleaved layout: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (row pairs per 256-bit vector; Q5 column blocks decoded once per batch) |
//! | `x86/avx2_il_k.rs` | the same for Q4_K, Q6_K and IQ4_XS (Q6_K column blocks decoded once per batch) |
//! | `x86/avx512.rs` | AVX-512 VNNI on plain rows: Q5_0 dot, Q4_1/Q5_0/Q8_0 tiles and GEMVs |
//! | `x86/avx512_k.rs` | AVX-512 VNNI tiles of Q4_K and Q6_K on plain rows |
//! | `x86/avx512_il.rs` | AVX-512 VNNI GEMV and tiles on the interleaved layout: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL |
//! | `x86/avx512_il_k.rs` | the same for Q4_K, Q6_K and IQ4_XS |
//! | `aarch64/neon.rs` | NEON dots of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS in the x86 lane order, `sdot` (dotprod) or widening multiplies |
//! | `aarch64/neon_iq.rs` | NEON dots of the 1- to 3-bit i-quants and their 4-row forms, the x86 lane order (`sdot` or widening multiplies) |
//! | `aarch64/neon_dense.rs` | NEON dots of F32 and F16 (ggml's AVX-512 orders) and BF16 (ggml's AVX2 order); F32/F16 batch dots and tiles (tinyBLAS's AVX-512 order) |
//! | `aarch64/neon_il.rs` | NEON GEMV and tiles on the interleaved layout, all nine types (`sdot` or widening multiplies) |
//! | `aarch64/sme.rs` | Arm SME: the panel GEMM's integer outer-product tile kernel, an f32 GEMM on `FMOPA`, their start-up self-test |
//! | `x86/avx512_dense.rs` | F32/F16/BF16 in llama.cpp's AVX-512 orders (BF16 dot, tinyBLAS batch tiles) |

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
pub mod gemm;
pub mod lanes;
pub mod layout;
pub mod portable;
pub mod schedule;
#[cfg(target_arch = "x86_64")]
pub mod x86;

pub use crate::quant::{FromFloat, ToFloat};
use crate::DType;

/// Dot product of one weight row (`x`, type T) and one activation row (`y`, T's vec_dot_type).
pub type VecDot = fn(x: &[u8], y: &[u8]) -> f32;

/// One weight row against four activation rows: `out[j] = vec_dot_tile(x, y[j])`, bit for bit.
pub type VecDot4 = fn(x: &[u8], y: [&[u8]; 4], out: &mut [f32; 4]);

/// `out.len()` weight rows (a multiple of four; `x`, rows `xrb` bytes apart) against four
/// activation rows, in register-blocked 4×4 tiles: `out[c][j] = vec_dot_tile(x_c, y[j])`, bit
/// for bit.
pub type VecDotTile = fn(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]);

/// Weight rows decoded once into a tile kernel's own layout ([`TilePacking`]), so that a matmul
/// does not decode them again for every group of four activation rows.
#[derive(Clone, Copy)]
pub struct TilePacking {
    /// Packed bytes per weight row of the given original row bytes.
    pub row_bytes: fn(xrb: usize) -> usize,
    /// Pack the rows of `x` (a multiple of four, `xrb` bytes apart) into `out`.
    pub pack: fn(x: &[u8], xrb: usize, out: &mut [u8]),
    /// The tile kernel on packed rows: called with the packed buffer in place of the rows and
    /// the original row bytes as `xrb`; `out[c][j] = vec_dot_tile(x_c, y[j])`, bit for bit.
    pub tile: VecDotTile,
}

/// Decode's GEMV on interleaved rows: `out.len()` rows (a multiple of four; `g` their groups,
/// plain rows `xrb` bytes) against one activation row; `prep` is scratch.
pub type IlRows = fn(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]);

/// Prefill's tiles on interleaved rows: the same rows against `J` activation rows, `out[c][j]`:
/// `vec_dot_tile`'s values (`vec_dot`'s but for `tile_order` types).
pub type IlTile<const J: usize> = fn(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], prep: &mut [i32]);

/// Kernels on weights interleaved at load (`matmul::layout`): the same values, bit for bit,
/// as `vec_dot` on the plain rows. `prep`: scratch of `layout::scratch_len(k)` i32.
#[derive(Clone, Copy)]
pub struct InterleavedOps {
    pub rows: IlRows,
    /// Prefill's tiles.
    pub tiles: IlTiles,
}

/// Prefill's tiles on interleaved rows.
#[derive(Clone, Copy)]
pub struct IlTiles {
    pub tile: IlTile<4>,
    /// Eight activation rows (each weight block decoded once for eight).
    pub tile8: IlTile<8>,
    /// Two and three activation rows, where the table has them (AVX-512 and AVX2, every type
    /// but Q4_K): a batch of two or three rows, each block's weights decoded once for them.
    pub few: Option<IlFew>,
    /// Where decoding the layout is a large share of the tile work (AVX2's Q5_0, Q5_1, Q6_K;
    /// AVX-512's Q4_0, Q5_0, Q8_0, IQ4_NL): `tile8`'s values on a column block decoded once for
    /// all of a batch's rows.
    pub decoded: Option<DecodedTiles>,
}

/// [`IlTiles::few`]: the tiles for two and three activation rows (`tile`'s values per row).
#[derive(Clone, Copy)]
pub struct IlFew {
    pub tile2: IlTile<2>,
    pub tile3: IlTile<3>,
}

/// [`IlTiles::tile8`] on a column block of groups decoded once into the caller's scratch
/// ([`DecodedTiles::len`] bytes): the same values, bit for bit.
#[derive(Clone, Copy)]
#[allow(clippy::type_complexity)] // the kernels' own signatures, spelled out where they are stored
pub struct DecodedTiles {
    /// `decode(g, xrb, dec)`: the groups of `g` (plain rows of `xrb` bytes) into `dec`.
    pub decode: fn(g: &[u8], xrb: usize, dec: &mut [u8]),
    /// `tile8(g, dec, xrb, y, out, prep)`: as `IlTiles::tile8` on `g`, its values read from `dec`.
    pub tile8: fn(g: &[u8], dec: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]),
    /// Decoded bytes per 32 values of a row: 32 (a byte per value: AVX2), 80 (AVX-512: values,
    /// their lane sums and the spread scales), at most [`DECODED_MAX_PER_32`].
    pub bytes_per_32: usize,
    /// Batch rows from which decoding a column block once pays for itself (a multiple of the
    /// eight-row calls that read it): [`DECODED_MIN_ROWS_AVX2`], [`DECODED_MIN_ROWS_AVX512`].
    pub min_rows: usize,
}

/// AVX2's decoded forms pay from two eight-row calls: decoding in the tiles is ~11 of ~55
/// operations per step (Qwen2.5, 16-sequence decode steps, 2 threads: 147–151 t/s at 24, 161
/// at 16).
pub const DECODED_MIN_ROWS_AVX2: usize = 16;
/// AVX-512's decoded forms (the offset types' 2.5 bytes per value, Q6_K's one) take fewer
/// operations to skip, so two or three eight-row calls do not repay the writing: Qwen2.5,
/// 2 threads, decode steps of 16 sequences 210 t/s decoded against 242 not, of 24 sequences 226
/// against 240, pp24 303 against 312; at 32 rows either way within noise (pp32 318–322,
/// 32-sequence steps 238–244).
pub const DECODED_MIN_ROWS_AVX512: usize = 32;

/// The most any [`DecodedTiles`] writes per 32 values of a row (sizes the callers' scratch).
pub const DECODED_MAX_PER_32: usize = 80;

impl DecodedTiles {
    /// Bytes of `dec` for `rows` weight rows of `k` values.
    pub fn len(&self, rows: usize, k: usize) -> usize {
        rows * k / 32 * self.bytes_per_32
    }
}

/// A dense type's batch dot (`TypeOps::batch_dot`) and when llama.cpp uses it: for a matmul of
/// two or more activation rows whose inner dimension is a multiple of `step` and whose matrix
/// has a multiple of 4 rows; otherwise `vec_dot`.
#[derive(Clone, Copy)]
pub struct BatchDot {
    pub dot: VecDot,
    /// The same values for 4 weight rows × 4 activation rows at a time (rows of `step`s).
    pub tile: VecDotTile,
    /// `tile`'s values for a batch's last one to three activation rows, where the table has
    /// such tiles (else one `dot` per output, a latency-bound chain each).
    pub few: Option<VecDotFew>,
    /// Where set (F16, whose own tile is bound by its conversions): `tile`'s values through f32
    /// tiles on rows widened first.
    pub wide: Option<Widened>,
    pub step: usize,
}

/// A dense type's batch tiles on rows widened to f32 ([`BatchDot::wide`]).
#[derive(Clone, Copy)]
pub struct Widened {
    /// Rows of the type to f32, exactly.
    pub widen: ToFloat,
    /// `BatchDot::tile`'s values on weight and activation rows both widened (called with f32
    /// rows of `4·k` bytes).
    pub tile: VecDotTile,
    /// The same for one to three activation rows (`BatchDot::few`).
    pub few: Option<VecDotFew>,
}

/// A [`BatchDot`]'s tile for one to three activation rows (`y.len()`): `out[c][j]` for
/// `j < y.len()`, bit for bit the type's batch dot of weight row c and `y[j]`.
pub type VecDotFew = fn(x: &[u8], xrb: usize, y: &[&[u8]], out: &mut [[f32; 4]]);

/// Most packed bytes per weight row of `k` values any [`TilePacking`] uses (36 per 32 values
/// for Q5_0/Q8_0, 40 per 32 for Q4_1; Q4_K: 152 per 256).
pub fn max_packed_row_bytes(k: usize) -> usize {
    k.div_ceil(32) * 40
}

/// `out.len()` weight rows (`x`, rows `xrb` bytes apart) against one activation row (decode's
/// GEMV): `out[c] = vec_dot(x_c, y)`, bit for bit.
pub type VecDotRows = fn(x: &[u8], xrb: usize, y: &[u8], out: &mut [f32]);

#[derive(Clone, Copy)]
pub struct TypeOps {
    pub vec_dot_type: DType,
    pub vec_dot: VecDot,
    /// The dot product for batch rows that llama.cpp computes four at a time (rows below
    /// `n - n % 4` of a batch of `n ≥ 4`). Same value up to float order; kept separate so
    /// results match llama.cpp bit for bit. Equal to `vec_dot` for most types.
    pub vec_dot_tile: VecDot,
    /// `vec_dot_tile` has a float order of its own (differs from `vec_dot` in the last bits):
    /// batch-invariant runs must not use it, nor `vec_dot4`/`vec_tile`, which compute its values.
    pub tile_order: bool,
    /// Four activation rows at once (weights decoded once), where a SIMD version exists.
    pub vec_dot4: Option<VecDot4>,
    /// Four weight rows against four activation rows (register-blocked), where it exists.
    pub vec_tile: Option<VecDotTile>,
    /// `vec_tile` on weights packed once per run of rows, where it exists.
    pub packing: Option<TilePacking>,
    /// Many weight rows against one activation row, where it exists (`vec_dot`'s values).
    pub vec_dot_rows: Option<VecDotRows>,
    /// Kernels on the interleaved layout; where present, the engine repacks this type's
    /// matrices once at load (`matmul::layout`).
    pub interleaved: Option<InterleavedOps>,
    /// The value llama.cpp gives every row of a matmul of two or more activation rows, where
    /// it runs llamafile's tinyBLAS instead of `vec_dot` (dense types on AVX-512).
    pub batch_dot: Option<BatchDot>,
    pub to_float: ToFloat,
    pub from_float: Option<FromFloat>,
}

impl BatchDot {
    /// Whether a matmul of `rows` activation rows of `k` values on an `n_out`-row matrix uses
    /// this dot.
    pub fn applies(&self, rows: usize, k: usize, n_out: usize) -> bool {
        rows >= 2 && k.is_multiple_of(self.step) && n_out.is_multiple_of(4)
    }
}
