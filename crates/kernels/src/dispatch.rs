//! The per-type kernel table (ggml's `type_traits_cpu`): for each weight type, the activation
//! type its dot product wants (`vec_dot_type`), the dot product, and the row converters. Filled
//! once at start-up from runtime CPU feature detection; [`Kernels::portable`] is the same table
//! with only the portable twins, used by the parity tests.

use crate::portable::{dot as pd, quant as pq};
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

/// Kernels on weights interleaved at load (`crate::interleave`): the same values, bit for bit,
/// as `vec_dot` on the plain rows. `prep`: scratch of `interleave::scratch_len(k)` i32.
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
}

/// The interleaved kernels of type `T` (`x86::interleaved`). Only for tables of CPUs with
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C: the returned functions call them without checking.
#[cfg(target_arch = "x86_64")]
fn interleaved_ops<T: crate::x86::interleaved::Interleaved>() -> InterleavedOps {
    use crate::x86::interleaved::{rows, tiles};
    // SAFETY (all three): `Kernels::detect` puts these in a table only after detecting the
    // features the kernels are compiled for.
    InterleavedOps {
        rows: |g, xrb, y, o, p| unsafe { rows::<T>(g, xrb, y, o, p) },
        tiles: IlTiles {
            tile: |g, xrb, y, o, p| unsafe { tiles::<T, 4>(g, xrb, y, o, p) },
            tile8: |g, xrb, y, o, p| unsafe { tiles::<T, 8>(g, xrb, y, o, p) },
        },
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
}

impl BatchDot {
    /// Whether a matmul of `rows` activation rows of `k` values on an `n_out`-row matrix uses
    /// this dot.
    pub fn applies(&self, rows: usize, k: usize, n_out: usize) -> bool {
        rows >= 2 && k % self.step == 0 && n_out % 4 == 0
    }
}

/// Most packed bytes per weight row of `k` values any [`TilePacking`] uses (36 per 32 values
/// for Q5_0/Q8_0, 40 per 32 for Q4_1; Q4_K: 152 per 256).
pub fn max_packed_row_bytes(k: usize) -> usize {
    k.div_ceil(32) * 40
}

/// `out.len()` weight rows (`x`, rows `xrb` bytes apart) against one activation row (decode's
/// GEMV): `out[c] = vec_dot(x_c, y)`, bit for bit.
pub type VecDotRows = fn(x: &[u8], xrb: usize, y: &[u8], out: &mut [f32]);
/// Convert a row of blocks to f32.
pub type ToFloat = fn(x: &[u8], y: &mut [f32]);
/// Quantize an f32 row into blocks.
pub type FromFloat = fn(x: &[f32], y: &mut [u8]);

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
    /// matrices once at load (`crate::interleave`).
    pub interleaved: Option<InterleavedOps>,
    /// The value llama.cpp gives every row of a matmul of two or more activation rows, where
    /// it runs llamafile's tinyBLAS instead of `vec_dot` (dense types on AVX-512).
    pub batch_dot: Option<BatchDot>,
    pub to_float: ToFloat,
    pub from_float: Option<FromFloat>,
}

/// Which instruction set a table was built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Portable,
    Avx2,
}

#[derive(Clone)]
pub struct Kernels {
    pub isa: Isa,
    /// Activation quantizers to Q8_0 / Q8_1 / Q8_K (SIMD where detected; same bytes as portable).
    q8_0: FromFloat,
    q8_1: FromFloat,
    q8_k: FromFloat,
    /// f32 → F16 rows (F16 KV cache stores, F16 activations).
    f16: FromFloat,
    /// AVX-512 F/VL/VNNI present: the panel GEMM (`crate::gemm`) uses its VNNI kernel.
    pub vnni: bool,
    /// AVX-512 F/BW/VL/VNNI present and its kernels chosen (`detect`): decode attention uses
    /// `x86::attn_decode`.
    pub avx512: bool,
    ops: [TypeOps; WEIGHT_TYPES.len()],
}

/// Weight types this build computes with.
pub const WEIGHT_TYPES: [DType; 15] = [
    DType::F32,
    DType::F16,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4K,
    DType::Q6K,
    DType::Q4_0,
    DType::Q5_1,
    DType::Q2K,
    DType::Q3K,
    DType::Q5K,
    DType::IQ4NL,
    DType::IQ4XS,
    DType::BF16,
];

fn slot(t: DType) -> Option<usize> {
    WEIGHT_TYPES.iter().position(|&x| x == t)
}

impl Kernels {
    /// Portable table: the reference for every SIMD kernel.
    pub fn portable() -> Kernels {
        let op = |vdt, vd: VecDot, tf: ToFloat, ff: Option<FromFloat>| TypeOps {
            vec_dot_type: vdt,
            vec_dot: vd,
            vec_dot_tile: vd,
            tile_order: false,
            vec_dot4: None,
            vec_tile: None,
            packing: None,
            vec_dot_rows: None,
            interleaved: None,
            batch_dot: None,
            to_float: tf,
            from_float: ff,
        };
        Kernels {
            isa: Isa::Portable,
            q8_0: pq::quant_q8_0,
            q8_1: pq::quant_q8_1,
            q8_k: pq::quant_q8_k,
            f16: pq::quant_f16,
            vnni: false,
            avx512: false,
            ops: [
                op(DType::F32, pd::dot_f32, pq::dequant_f32, Some(pq::quant_f32)),
                op(DType::F16, pd::dot_f16, pq::dequant_f16, Some(pq::quant_f16)),
                op(DType::Q8_1, pd::dot_q4_1_q8_1, pq::dequant_q4_1, None),
                op(DType::Q8_0, pd::dot_q5_0_q8_0, pq::dequant_q5_0, None),
                op(DType::Q8_0, pd::dot_q8_0_q8_0, pq::dequant_q8_0, Some(pq::quant_q8_0)),
                TypeOps { vec_dot_tile: pd::dot_q4_k_q8_k_tile, tile_order: true, ..op(DType::Q8K, pd::dot_q4_k_q8_k, pq::dequant_q4_k, None) },
                op(DType::Q8K, pd::dot_q6_k_q8_k, pq::dequant_q6_k, None),
                op(DType::Q8_0, pd::dot_q4_0_q8_0, pq::dequant_q4_0, Some(crate::portable::quantize::quant_q4_0)),
                op(DType::Q8_1, pd::dot_q5_1_q8_1, pq::dequant_q5_1, None),
                op(DType::Q8K, pd::dot_q2_k_q8_k, pq::dequant_q2_k, None),
                op(DType::Q8K, pd::dot_q3_k_q8_k, pq::dequant_q3_k, None),
                op(DType::Q8K, pd::dot_q5_k_q8_k, pq::dequant_q5_k, None),
                op(DType::Q8_0, pd::dot_iq4_nl_q8_0, pq::dequant_iq4_nl, None),
                op(DType::Q8K, pd::dot_iq4_xs_q8_k, pq::dequant_iq4_xs, None),
                op(DType::BF16, pd::dot_bf16, pq::dequant_bf16, Some(pq::quant_bf16)),
            ],
        }
    }

    /// The best table for this CPU: the AVX2 kernels, with AVX-512 instances where the CPU has
    /// BW, VL and VNNI and they are measured faster (bit-identical to the AVX2 ones, except the
    /// BF16 dot with AVX-512 BF16, which like ggml's has an order of its own).
    pub fn detect() -> Kernels {
        #[allow(unused_mut)]
        let mut k = Kernels::detect_avx2();
        #[cfg(target_arch = "x86_64")]
        if k.vnni && std::is_x86_feature_detected!("avx512bw") {
            use crate::blocks::{BlockQ5_0, BlockQ8_0};
            use crate::x86::{avx512, tiles_k};
            k.avx512 = true;
            // SAFETY: AVX2/FMA/F16C (detect_avx2) and AVX512F/VL/VNNI (`vnni`) and BW were
            // detected on this CPU.
            let f: VecDot = |x, y| unsafe { avx512::dot_q5_0_q8_0(x, y) };
            let o = &mut k.ops[slot(DType::Q5_0).unwrap()];
            (o.vec_dot, o.vec_dot_tile) = (f, f);
            o.vec_tile = Some(|x, xrb, y, out| unsafe { avx512::tiles_offset::<BlockQ5_0>(x, xrb, y, out) });
            k.ops[slot(DType::Q4_1).unwrap()].vec_tile = Some(|x, xrb, y, out| unsafe { avx512::tiles_q4_1_q8_1(x, xrb, y, out) });
            k.ops[slot(DType::Q4K).unwrap()].vec_tile = Some(|x, xrb, y, out| unsafe { tiles_k::tiles_q4_k_q8_k(x, xrb, y, out) });
            k.ops[slot(DType::Q6K).unwrap()].vec_tile = Some(|x, xrb, y, out| unsafe { tiles_k::tiles_q6_k_q8_k(x, xrb, y, out) });
            k.ops[slot(DType::Q8_0).unwrap()].vec_tile =
                Some(|x, xrb, y, out| unsafe { avx512::tiles_offset::<BlockQ8_0>(x, xrb, y, out) });
            k.ops[slot(DType::Q5_0).unwrap()].vec_dot_rows =
                Some(|x, xrb, y, out| unsafe { avx512::rows_offset::<BlockQ5_0>(x, xrb, y, out, |a, b| avx512::dot_q5_0_q8_0(a, b)) });
            k.ops[slot(DType::Q4_1).unwrap()].vec_dot_rows = Some(|x, xrb, y, out| unsafe { avx512::rows_q4_1(x, xrb, y, out) });
            k.ops[slot(DType::Q8_0).unwrap()].vec_dot_rows =
                Some(|x, xrb, y, out| unsafe { avx512::rows_offset::<BlockQ8_0>(x, xrb, y, out, |a, b| crate::x86::avx2::dot_q8_0_q8_0(a, b)) });
            k.ops[slot(DType::Q4K).unwrap()].packing = Some(TilePacking {
                row_bytes: tiles_k::packed_row_bytes_q4_k,
                pack: |x, xrb, out| unsafe { tiles_k::pack_q4_k(x, xrb, out) },
                tile: |p, xrb, y, out| unsafe { tiles_k::tiles_q4_k_packed(p, xrb, y, out) },
            });
            k.ops[slot(DType::Q4_1).unwrap()].packing = Some(TilePacking {
                row_bytes: avx512::packed_row_bytes_q4_1,
                pack: |x, xrb, out| unsafe { avx512::pack_q4_1(x, xrb, out) },
                tile: |p, xrb, y, out| unsafe { avx512::tiles_q4_1_packed(p, xrb, y, out) },
            });
            k.ops[slot(DType::Q5_0).unwrap()].packing = Some(TilePacking {
                row_bytes: avx512::packed_row_bytes::<BlockQ5_0>,
                pack: |x, xrb, out| unsafe { avx512::pack_offset::<BlockQ5_0>(x, xrb, out) },
                tile: |p, xrb, y, out| unsafe { avx512::tiles_packed::<BlockQ5_0>(p, xrb, y, out) },
            });
            k.ops[slot(DType::Q8_0).unwrap()].packing = Some(TilePacking {
                row_bytes: avx512::packed_row_bytes::<BlockQ8_0>,
                pack: |x, xrb, out| unsafe { avx512::pack_offset::<BlockQ8_0>(x, xrb, out) },
                tile: |p, xrb, y, out| unsafe { avx512::tiles_packed::<BlockQ8_0>(p, xrb, y, out) },
            });
            use crate::x86::dense;
            k.ops[slot(DType::F32).unwrap()].batch_dot = Some(BatchDot {
                dot: |x, y| unsafe { dense::batch_f32(x, y) },
                tile: |x, xrb, y, o| unsafe { dense::tiles_f32(x, xrb, y, o) },
                wide: None,
                step: 16,
            });
            let o = &mut k.ops[slot(DType::F16).unwrap()];
            o.batch_dot = Some(BatchDot {
                dot: |x, y| unsafe { dense::batch_f16(x, y) },
                tile: |x, xrb, y, o| unsafe { dense::tiles_f16(x, xrb, y, o) },
                wide: Some(Widened {
                    widen: |x, o| unsafe { dense::widen_f16(x, o) },
                    tile: |x, xrb, y, o| unsafe { dense::tiles_f32(x, xrb, y, o) },
                }),
                step: 16,
            });
            // ggml's AVX-512 `ggml_vec_dot_f16` order (the attention kernels' F16 dot).
            let f: VecDot = |x, y| unsafe { crate::x86::attn::dot_f16_ggml(crate::blocks::as_blocks(x), crate::blocks::as_blocks(y)) };
            (o.vec_dot, o.vec_dot_tile) = (f, f);
            if std::is_x86_feature_detected!("avx512bf16") {
                // SAFETY: AVX-512 BF16 detected just above (F and AVX2 before).
                let f: VecDot = |x, y| unsafe { dense::dot_bf16(x, y) };
                let o = &mut k.ops[slot(DType::BF16).unwrap()];
                (o.vec_dot, o.vec_dot_tile) = (f, f);
                o.batch_dot = Some(BatchDot {
                    dot: |x, y| unsafe { dense::batch_bf16(x, y) },
                    tile: |x, xrb, y, o| unsafe { dense::tiles_bf16(x, xrb, y, o) },
                    wide: None,
                    step: 32,
                });
            }
            use crate::x86::interleaved as il;
            for (t, o) in [
                (DType::Q4_0, interleaved_ops::<il::Q4_0>()),
                (DType::Q4_1, interleaved_ops::<il::Q4_1>()),
                (DType::Q5_0, interleaved_ops::<il::Q5_0>()),
                (DType::Q5_1, interleaved_ops::<il::Q5_1>()),
                (DType::Q8_0, interleaved_ops::<il::Q8_0>()),
            ] {
                k.ops[slot(t).unwrap()].interleaved = Some(o);
            }
            k.ops[slot(DType::Q4K).unwrap()].interleaved = Some(InterleavedOps {
                rows: |g, xrb, y, o, p| unsafe { crate::x86::interleaved_k::rows_q4_k(g, xrb, y, o, p) },
                tiles: IlTiles {
                    tile: |g, xrb, y, o, p| unsafe { crate::x86::interleaved_k::tiles_q4_k(g, xrb, y, o, p) },
                    tile8: |g, xrb, y, o, p| unsafe { crate::x86::interleaved_k::tiles8_q4_k(g, xrb, y, o, p) },
                },
            });
            k.ops[slot(DType::Q6K).unwrap()].interleaved = Some(InterleavedOps {
                rows: |g, xrb, y, o, p| unsafe { crate::x86::interleaved_k::rows_q6_k(g, xrb, y, o, p) },
                tiles: IlTiles {
                    tile: |g, xrb, y, o, p| unsafe { crate::x86::interleaved_k::tiles_q6_k(g, xrb, y, o, p) },
                    tile8: |g, xrb, y, o, p| unsafe { crate::x86::interleaved_k::tiles8_q6_k(g, xrb, y, o, p) },
                },
            });
        }
        k
    }

    /// The AVX2 table without AVX-512 instances: the reference they are tested against, and
    /// what [`Kernels::detect`] gives on a CPU without AVX-512.
    pub fn detect_avx2() -> Kernels {
        #[allow(unused_mut)]
        let mut k = Kernels::portable();
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
        {
            use crate::x86::avx2;
            k.isa = Isa::Avx2;
            k.vnni = crate::gemm::has_vnni();
            k.q8_0 = |x, y| unsafe { crate::x86::avx2_ext::quant_q8_0(x, y) };
            k.q8_1 = |x, y| unsafe { crate::x86::avx2_ext::quant_q8_1(x, y) };
            k.q8_k = |x, y| unsafe { crate::x86::avx2_ext::quant_q8_k(x, y) };
            k.f16 = |x, y| unsafe { crate::x86::avx2_ext::quant_f16(x, y) };
            // SAFETY (all closures below): the features these functions are compiled for were
            // detected on this CPU just above.
            // Sets both dots; types whose tile dot differs (Q4_K) override it below.
            let set = |k: &mut Kernels, t: DType, f: VecDot| {
                let o = &mut k.ops[slot(t).unwrap()];
                o.vec_dot = f;
                o.vec_dot_tile = f;
            };
            set(&mut k, DType::F32, |x, y| unsafe { avx2::dot_f32(x, y) });
            set(&mut k, DType::F16, |x, y| unsafe { avx2::dot_f16(x, y) });
            set(&mut k, DType::Q4_1, |x, y| unsafe { avx2::dot_q4_1_q8_1(x, y) });
            set(&mut k, DType::Q5_0, |x, y| unsafe { avx2::dot_q5_0_q8_0(x, y) });
            set(&mut k, DType::Q8_0, |x, y| unsafe { avx2::dot_q8_0_q8_0(x, y) });
            set(&mut k, DType::Q4K, |x, y| unsafe { avx2::dot_q4_k_q8_k(x, y) });
            k.ops[slot(DType::Q4K).unwrap()].vec_dot_tile = |x, y| unsafe { avx2::dot_q4_k_q8_k_tile(x, y) };
            k.ops[slot(DType::Q8_0).unwrap()].vec_dot4 = Some(|x, y, o| unsafe { avx2::dot4_q8_0_q8_0(x, y, o) });
            k.ops[slot(DType::Q5_0).unwrap()].vec_dot4 = Some(|x, y, o| unsafe { avx2::dot4_q5_0_q8_0(x, y, o) });
            k.ops[slot(DType::Q4_1).unwrap()].vec_dot4 = Some(|x, y, o| unsafe { avx2::dot4_q4_1_q8_1(x, y, o) });
            set(&mut k, DType::Q6K, |x, y| unsafe { avx2::dot_q6_k_q8_k(x, y) });
            use crate::x86::avx2_ext as ext;
            set(&mut k, DType::Q4_0, |x, y| unsafe { ext::dot_q4_0_q8_0(x, y) });
            set(&mut k, DType::Q5_1, |x, y| unsafe { ext::dot_q5_1_q8_1(x, y) });
            set(&mut k, DType::IQ4NL, |x, y| unsafe { ext::dot_iq4_nl_q8_0(x, y) });
            set(&mut k, DType::Q2K, |x, y| unsafe { ext::dot_q2_k_q8_k(x, y) });
            set(&mut k, DType::Q3K, |x, y| unsafe { ext::dot_q3_k_q8_k(x, y) });
            set(&mut k, DType::Q5K, |x, y| unsafe { ext::dot_q5_k_q8_k(x, y) });
            set(&mut k, DType::IQ4XS, |x, y| unsafe { ext::dot_iq4_xs_q8_k(x, y) });
            set(&mut k, DType::BF16, |x, y| unsafe { ext::dot_bf16(x, y) });
            k.ops[slot(DType::Q8_0).unwrap()].to_float = |x, y| unsafe { ext::dequant_q8_0(x, y) };
        }
        k
    }

    /// Kernels for a weight type, `None` if this build cannot compute with it.
    pub fn ops(&self, t: DType) -> Option<&TypeOps> {
        Some(&self.ops[slot(t)?])
    }

    /// Quantizer for an activation type (the `vec_dot_type` of some weight type), or for a
    /// weight type that has one (KV cache rows, `corelm quantize`).
    pub fn from_float(&self, t: DType) -> Option<FromFloat> {
        match t {
            DType::F32 => Some(pq::quant_f32),
            DType::F16 => Some(self.f16),
            DType::BF16 => Some(pq::quant_bf16),
            DType::Q8_0 => Some(self.q8_0),
            DType::Q8_1 => Some(self.q8_1),
            DType::Q8K => Some(self.q8_k),
            _ => self.ops(t).and_then(|o| o.from_float),
        }
    }

    /// Row-to-f32 converter for any type this build knows (weights and activation types).
    pub fn to_float(&self, t: DType) -> Option<ToFloat> {
        match t {
            DType::Q8K => Some(pq::dequant_q8_k),
            DType::Q8_1 => None,
            _ => self.ops(t).map(|o| o.to_float),
        }
    }
}

/// The process-wide table, detected on first use.
pub fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        if std::env::var_os("CORELM_FORCE_PORTABLE").is_some() {
            Kernels::portable()
        } else {
            Kernels::detect()
        }
    })
}
