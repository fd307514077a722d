//! The per-type kernel table (ggml's `type_traits_cpu`): for each weight type, the activation
//! type its dot product wants (`vec_dot_type`), the dot product, and the row converters. Filled
//! once at start-up from runtime CPU feature detection; [`Kernels::portable`] is the same table
//! with only the portable twins, used by the parity tests.

use crate::matmul::layout::{Layout, Q5Bits, Q6Form};
use crate::matmul::portable as pd;
use crate::matmul::{FromFloat, ToFloat, TypeOps, VecDot};
#[cfg(target_arch = "x86_64")]
use crate::matmul::TilePacking;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::matmul::{BatchDot, IlTiles, InterleavedOps, Widened};
#[cfg(target_arch = "x86_64")]
use crate::matmul::{DecodedTiles, IlFew, VecDotFew};
use crate::quant::iq;
use crate::quant::portable as pq;
use crate::DType;

/// The AVX-512 interleaved kernels of type `T` (`matmul::x86::avx512_il`). Only for tables of
/// CPUs with AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C: the returned functions call them without
/// checking.
#[cfg(target_arch = "x86_64")]
fn interleaved_avx512<T: crate::matmul::x86::common::IlBlock>() -> InterleavedOps {
    use crate::matmul::x86::avx512_il::{decode, rows, tiles, tiles_decoded};
    // SAFETY (all): `Kernels::build` puts these in a table only for `Isa::Avx512`, whose
    // features it checked.
    InterleavedOps {
        rows: |g, xrb, y, o, p| unsafe { rows::<T>(g, xrb, y, o, p) },
        tiles: IlTiles {
            few: Some(IlFew { tile2: |g, xrb, y, o, p| unsafe { tiles::<T, 2>(g, xrb, y, o, p) }, tile3: |g, xrb, y, o, p| unsafe { tiles::<T, 3>(g, xrb, y, o, p) } }),
            tile: |g, xrb, y, o, p| unsafe { tiles::<T, 4>(g, xrb, y, o, p) },
            tile8: |g, xrb, y, o, p| unsafe { tiles::<T, 8>(g, xrb, y, o, p) },
            // Types with an offset: signed values decoded once per column block.
            decoded: (T::OFFSET != 0).then_some(DecodedTiles {
                decode: |g, xrb, d| unsafe { decode::<T>(g, xrb, d) },
                tile8: |g, d, xrb, y, o, p| unsafe { tiles_decoded::<T>(g, d, xrb, y, o, p) },
                bytes_per_32: crate::matmul::x86::avx512_il::DECODED_PER_BLOCK / 4,
                min_rows: crate::matmul::DECODED_MIN_ROWS_AVX512,
            }),
        },
    }
}

/// The NEON interleaved kernels of kind `R` (GEMV) and `T` (tiles: the tile dot's kind),
/// with `sdot` where `dotprod` (`matmul::aarch64::neon_il`). With `dotprod` only for tables of
/// CPUs that have it (`Isa::Dotprod` and above).
#[cfg(target_arch = "aarch64")]
fn interleaved_neon<const R: u8, const T: u8>(dotprod: bool) -> InterleavedOps {
    use crate::matmul::aarch64::neon_il as il;
    if !dotprod {
        return InterleavedOps { rows: il::rows::<R>, tiles: IlTiles { tile: il::tiles::<T>, tile8: il::tiles8::<T>, few: None, decoded: None } };
    }
    // SAFETY (each closure): `Kernels::aarch64` asks for these only for a level with `dotprod`,
    // built only on a CPU that has it.
    InterleavedOps {
        rows: |g, xrb, y, o, p| unsafe { il::rows_dotprod::<R>(g, xrb, y, o, p) },
        tiles: IlTiles {
            few: None,
            tile: |g, xrb, y, o, p| unsafe { il::tiles_dotprod::<T>(g, xrb, y, o, p) },
            tile8: |g, xrb, y, o, p| unsafe { il::tiles8_dotprod::<T>(g, xrb, y, o, p) },
            decoded: None,
        },
    }
}

/// The AVX2 interleaved kernels of type `T` (`matmul::x86::avx2_il`), with AVX-VNNI's
/// `vpdpbusd` where the CPU has it (the same bits). Only for tables of CPUs with AVX2, FMA and
/// F16C.
#[cfg(target_arch = "x86_64")]
fn interleaved_avx2<T: crate::matmul::x86::common::IlBlock>() -> InterleavedOps {
    use crate::matmul::x86::avx2_il::{decode, gains_from_decoding, rows, rows_vnni, tiles, tiles8, tiles8_decoded, tiles8_decoded_vnni, tiles8_vnni, tiles_few, tiles_few_vnni, tiles_vnni};
    // SAFETY (all closures): `Kernels::build` puts these in a table only for `Isa::Avx2` or
    // above, whose features it checked; the `_vnni` ones only where AVX-VNNI was detected.
    let decode: fn(&[u8], usize, &mut [u8]) = |g, xrb, d| unsafe { decode::<T>(g, xrb, d) };
    if crate::simd::x86::avx_vnni() {
        return InterleavedOps {
            rows: |g, xrb, y, o, p| unsafe { rows_vnni::<T>(g, xrb, y, o, p) },
            tiles: IlTiles {
                few: Some(IlFew { tile2: |g, xrb, y, o, p| unsafe { tiles_few_vnni::<T, 2>(g, xrb, y, o, p) }, tile3: |g, xrb, y, o, p| unsafe { tiles_few_vnni::<T, 3>(g, xrb, y, o, p) } }),
                tile: |g, xrb, y, o, p| unsafe { tiles_vnni::<T>(g, xrb, y, o, p) },
                tile8: |g, xrb, y, o, p| unsafe { tiles8_vnni::<T>(g, xrb, y, o, p) },
                decoded: gains_from_decoding::<T>().then_some(DecodedTiles { decode, tile8: |g, d, xrb, y, o, p| unsafe { tiles8_decoded_vnni::<T>(g, d, xrb, y, o, p) }, bytes_per_32: 32, min_rows: crate::matmul::DECODED_MIN_ROWS_AVX2 }),
            },
        };
    }
    InterleavedOps {
        rows: |g, xrb, y, o, p| unsafe { rows::<T>(g, xrb, y, o, p) },
        tiles: IlTiles {
            few: Some(IlFew { tile2: |g, xrb, y, o, p| unsafe { tiles_few::<T, 2>(g, xrb, y, o, p) }, tile3: |g, xrb, y, o, p| unsafe { tiles_few::<T, 3>(g, xrb, y, o, p) } }),
            tile: |g, xrb, y, o, p| unsafe { tiles::<T>(g, xrb, y, o, p) },
            tile8: |g, xrb, y, o, p| unsafe { tiles8::<T>(g, xrb, y, o, p) },
            decoded: gains_from_decoding::<T>().then_some(DecodedTiles { decode, tile8: |g, d, xrb, y, o, p| unsafe { tiles8_decoded::<T>(g, d, xrb, y, o, p) }, bytes_per_32: 32, min_rows: crate::matmul::DECODED_MIN_ROWS_AVX2 }),
        },
    }
}

pub use crate::simd::{Isa, IsaError};

#[derive(Clone)]
pub struct Kernels {
    /// The level this table was built for ([`Kernels::isa`]). Private: the SIMD kernels it
    /// selects are sound only on a CPU that has it, which the constructors check.
    isa: Isa,
    /// Activation quantizers to Q8_0 / Q8_1 / Q8_K (SIMD where detected; same bytes as portable).
    q8_0: FromFloat,
    q8_1: FromFloat,
    q8_k: FromFloat,
    /// f32 → F16 rows (F16 KV cache stores, F16 activations).
    f16: FromFloat,
    /// The interleaved layout this table's kernels read ([`Kernels::layout`]).
    layout: Layout,
    ops: [TypeOps; WEIGHT_TYPES.len()],
}

/// Weight types this build computes with.
pub const WEIGHT_TYPES: [DType; 23] = [
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
    DType::IQ2XXS,
    DType::IQ2XS,
    DType::IQ2S,
    DType::IQ3XXS,
    DType::IQ3S,
    DType::IQ1S,
    DType::IQ1M,
    DType::MXFP4,
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
            layout: Layout { q5: Q5Bits::Folded, q6: Q6Form::Split },
            q8_0: pq::quant_q8_0,
            q8_1: pq::quant_q8_1,
            q8_k: pq::quant_q8_k,
            f16: pq::quant_f16,
            ops: [
                op(DType::F32, pd::dot_f32, pq::dequant_f32, Some(pq::quant_f32)),
                op(DType::F16, pd::dot_f16, pq::dequant_f16, Some(pq::quant_f16)),
                op(DType::Q8_1, pd::dot_q4_1_q8_1, pq::dequant_q4_1, None),
                op(DType::Q8_0, pd::dot_q5_0_q8_0, pq::dequant_q5_0, None),
                op(DType::Q8_0, pd::dot_q8_0_q8_0, pq::dequant_q8_0, Some(pq::quant_q8_0)),
                TypeOps { vec_dot_tile: pd::dot_q4_k_q8_k_tile, tile_order: true, ..op(DType::Q8K, pd::dot_q4_k_q8_k, pq::dequant_q4_k, None) },
                op(DType::Q8K, pd::dot_q6_k_q8_k, pq::dequant_q6_k, None),
                op(DType::Q8_0, pd::dot_q4_0_q8_0, pq::dequant_q4_0, Some(crate::quant::reference::quant_q4_0)),
                op(DType::Q8_1, pd::dot_q5_1_q8_1, pq::dequant_q5_1, None),
                op(DType::Q8K, pd::dot_q2_k_q8_k, pq::dequant_q2_k, None),
                op(DType::Q8K, pd::dot_q3_k_q8_k, pq::dequant_q3_k, None),
                op(DType::Q8K, pd::dot_q5_k_q8_k, pq::dequant_q5_k, None),
                op(DType::Q8_0, pd::dot_iq4_nl_q8_0, pq::dequant_iq4_nl, None),
                op(DType::Q8K, pd::dot_iq4_xs_q8_k, pq::dequant_iq4_xs, None),
                op(DType::BF16, pd::dot_bf16, pq::dequant_bf16, Some(pq::quant_bf16)),
                op(DType::Q8K, |x, y| pd::dot_iq_q8_k(iq::IqType::IQ2XXS, x, y), |x, y| iq::dequant(iq::IqType::IQ2XXS, x, y), None),
                op(DType::Q8K, |x, y| pd::dot_iq_q8_k(iq::IqType::IQ2XS, x, y), |x, y| iq::dequant(iq::IqType::IQ2XS, x, y), None),
                op(DType::Q8K, |x, y| pd::dot_iq_q8_k(iq::IqType::IQ2S, x, y), |x, y| iq::dequant(iq::IqType::IQ2S, x, y), None),
                op(DType::Q8K, |x, y| pd::dot_iq_q8_k(iq::IqType::IQ3XXS, x, y), |x, y| iq::dequant(iq::IqType::IQ3XXS, x, y), None),
                op(DType::Q8K, |x, y| pd::dot_iq_q8_k(iq::IqType::IQ3S, x, y), |x, y| iq::dequant(iq::IqType::IQ3S, x, y), None),
                op(DType::Q8K, |x, y| pd::dot_iq_q8_k(iq::IqType::IQ1S, x, y), |x, y| iq::dequant(iq::IqType::IQ1S, x, y), None),
                op(DType::Q8K, |x, y| pd::dot_iq_q8_k(iq::IqType::IQ1M, x, y), |x, y| iq::dequant(iq::IqType::IQ1M, x, y), None),
                op(DType::Q8_0, pd::dot_mxfp4_q8_0, pq::dequant_mxfp4, None),
            ],
        }
    }

    /// The best table for this CPU ([`best_isa`]).
    pub fn detect() -> Kernels {
        Kernels::build(best_isa())
    }

    /// The table of `isa`, or an error naming the features this CPU lacks for it.
    pub fn for_isa(isa: Isa) -> Result<Kernels, IsaError> {
        Ok(Kernels::build(check(isa)?))
    }

    /// The table of `isa`, which this CPU runs (checked by the callers).
    fn build(isa: Isa) -> Kernels {
        match isa {
            Isa::Portable => Kernels::portable(),
            Isa::Neon | Isa::Dotprod | Isa::Sme => Kernels::aarch64(isa),
            Isa::Avx2 => Kernels::avx2(),
            Isa::Avx512 => Kernels::avx512(),
            Isa::Amx => Kernels { isa: Isa::Amx, ..Kernels::avx512() },
        }
    }

    /// The AVX2 table with AVX-512 instances where they are measured faster (bit-identical to
    /// the AVX2 ones, except the BF16 dot with AVX-512 BF16, which like ggml's has an order of
    /// its own). Only for a CPU with [`Isa::Avx512`].
    fn avx512() -> Kernels {
        // The panel GEMM's default tile height depends on it (`gemm::default_schedule`): timed
        // here, once, rather than in the first matmul of a pass.
        #[cfg(target_arch = "x86_64")]
        crate::simd::x86::vnni512_full_rate();
        #[allow(unused_mut)]
        let mut k = Kernels::avx2();
        #[cfg(target_arch = "x86_64")]
        {
            use crate::matmul::x86::{avx512, avx512_k as tiles_k};
            use crate::quant::blocks::{BlockQ5_0, BlockQ8_0};
            debug_assert!(Isa::Avx512.missing().is_empty());
            k.isa = Isa::Avx512;
            k.layout = Layout { q5: Q5Bits::Masks, q6: Q6Form::Split };
            // SAFETY: `build` runs this only for a CPU with AVX2/FMA/F16C and AVX-512
            // F/BW/VL/VNNI (`Isa::Avx512` checked).
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
                Some(|x, xrb, y, out| unsafe { avx512::rows_offset::<BlockQ8_0>(x, xrb, y, out, |a, b| crate::matmul::x86::avx2::dot_q8_0_q8_0(a, b)) });
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
            use crate::matmul::x86::avx512_dense as dense;
            let few_f32: VecDotFew = |x, xrb, y, o| unsafe { dense::few_f32(x, xrb, y, o) };
            k.ops[slot(DType::F32).unwrap()].batch_dot = Some(BatchDot {
                dot: |x, y| unsafe { dense::batch_f32(x, y) },
                tile: |x, xrb, y, o| unsafe { dense::tiles_f32(x, xrb, y, o) },
                few: Some(few_f32),
                wide: None,
                step: 16,
            });
            // ggml's AVX-512 `ggml_vec_dot_f32` order (routers, LoRA adapters).
            let f32_ggml: VecDot = |x, y| unsafe { dense::dot_f32_ggml(x, y) };
            let o = &mut k.ops[slot(DType::F32).unwrap()];
            (o.vec_dot, o.vec_dot_tile) = (f32_ggml, f32_ggml);
            o.vec_dot_rows = Some(|x, xrb, y, out| unsafe { dense::rows_f32_ggml(x, xrb, y, out) });
            let o = &mut k.ops[slot(DType::F16).unwrap()];
            o.batch_dot = Some(BatchDot {
                dot: |x, y| unsafe { dense::batch_f16(x, y) },
                tile: |x, xrb, y, o| unsafe { dense::tiles_f16(x, xrb, y, o) },
                few: Some(|x, xrb, y, o| unsafe { dense::few_f16(x, xrb, y, o) }),
                wide: Some(Widened {
                    widen: |x, o| unsafe { dense::widen_f16(x, o) },
                    tile: |x, xrb, y, o| unsafe { dense::tiles_f32(x, xrb, y, o) },
                    few: Some(few_f32),
                }),
                step: 16,
            });
            // ggml's AVX-512 `ggml_vec_dot_f16` order (the attention kernels' F16 dot).
            let f: VecDot = |x, y| unsafe { crate::matmul::x86::avx2::dot_f16_ggml(crate::quant::blocks::as_blocks(x), crate::quant::blocks::as_blocks(y)) };
            (o.vec_dot, o.vec_dot_tile) = (f, f);
            if std::is_x86_feature_detected!("avx512bf16") {
                // SAFETY: AVX-512 BF16 detected just above (F and AVX2 before).
                let f: VecDot = |x, y| unsafe { dense::dot_bf16(x, y) };
                let o = &mut k.ops[slot(DType::BF16).unwrap()];
                (o.vec_dot, o.vec_dot_tile) = (f, f);
                o.batch_dot = Some(BatchDot {
                    dot: |x, y| unsafe { dense::batch_bf16(x, y) },
                    tile: |x, xrb, y, o| unsafe { dense::tiles_bf16(x, xrb, y, o) },
                    few: Some(|x, xrb, y, o| unsafe { dense::few_bf16(x, xrb, y, o) }),
                    wide: None,
                    step: 32,
                });
            }
            use crate::matmul::x86::common as il;
            for (t, o) in [
                (DType::Q4_0, interleaved_avx512::<il::Q4_0>()),
                (DType::Q4_1, interleaved_avx512::<il::Q4_1>()),
                (DType::Q5_0, interleaved_avx512::<il::Q5_0>()),
                (DType::Q5_1, interleaved_avx512::<il::Q5_1>()),
                (DType::Q8_0, interleaved_avx512::<il::Q8_0>()),
                (DType::IQ4NL, interleaved_avx512::<il::IQ4NL>()),
            ] {
                k.ops[slot(t).unwrap()].interleaved = Some(o);
            }
            k.ops[slot(DType::Q4K).unwrap()].interleaved = Some(InterleavedOps {
                rows: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::rows_q4_k(g, xrb, y, o, p) },
                tiles: IlTiles {
                    few: None,
                    tile: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles_q4_k(g, xrb, y, o, p) },
                    tile8: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles8_q4_k(g, xrb, y, o, p) },
                    decoded: None,
                },
            });
            k.ops[slot(DType::Q6K).unwrap()].interleaved = Some(InterleavedOps {
                rows: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::rows_q6_k(g, xrb, y, o, p) },
                tiles: IlTiles {
                    few: Some(IlFew { tile2: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles_few_q6_k::<2>(g, xrb, y, o, p) }, tile3: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles_few_q6_k::<3>(g, xrb, y, o, p) } }),
                    tile: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles_q6_k(g, xrb, y, o, p) },
                    tile8: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles8_q6_k(g, xrb, y, o, p) },
                    decoded: Some(DecodedTiles {
                        decode: |g, xrb, d| unsafe { crate::matmul::x86::avx512_il_k::decode_q6_k(g, xrb, d) },
                        tile8: |g, d, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles8_q6_k_decoded(g, d, xrb, y, o, p) },
                        bytes_per_32: 32,
                        min_rows: crate::matmul::DECODED_MIN_ROWS_AVX512,
                    }),
                },
            });
            k.ops[slot(DType::IQ4XS).unwrap()].interleaved = Some(InterleavedOps {
                rows: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::rows_iq4_xs(g, xrb, y, o, p) },
                tiles: IlTiles {
                    few: Some(IlFew { tile2: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles_few_iq4_xs::<2>(g, xrb, y, o, p) }, tile3: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles_few_iq4_xs::<3>(g, xrb, y, o, p) } }),
                    tile: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles_iq4_xs(g, xrb, y, o, p) },
                    tile8: |g, xrb, y, o, p| unsafe { crate::matmul::x86::avx512_il_k::tiles8_iq4_xs(g, xrb, y, o, p) },
                    decoded: None,
                },
            });
        }
        k
    }

    /// The best table at most [`Isa::Avx2`] for this CPU: the reference the AVX-512 instances
    /// are tested against, and what [`Kernels::detect`] gives on a CPU without AVX-512.
    pub fn detect_avx2() -> Kernels {
        Kernels::build(best_isa().min(Isa::Avx2))
    }

    /// The AVX2 table. Only for a CPU with [`Isa::Avx2`].
    fn avx2() -> Kernels {
        #[allow(unused_mut)]
        let mut k = Kernels::portable();
        #[cfg(target_arch = "x86_64")]
        {
            use crate::matmul::x86::avx2;
            debug_assert!(Isa::Avx2.missing().is_empty());
            k.isa = Isa::Avx2;
            // Q6_K's values folded three bytes per four for `avx2_il_k` (`matmul::layout`).
            k.layout.q6 = Q6Form::Folded;
            k.q8_0 = |x, y| unsafe { crate::quant::x86::quant_q8_0(x, y) };
            k.q8_1 = |x, y| unsafe { crate::quant::x86::quant_q8_1(x, y) };
            k.q8_k = |x, y| unsafe { crate::quant::x86::quant_q8_k(x, y) };
            k.f16 = |x, y| unsafe { crate::quant::x86::quant_f16(x, y) };
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
            use crate::matmul::x86::avx2_ext as ext;
            set(&mut k, DType::Q4_0, |x, y| unsafe { ext::dot_q4_0_q8_0(x, y) });
            set(&mut k, DType::Q5_1, |x, y| unsafe { ext::dot_q5_1_q8_1(x, y) });
            set(&mut k, DType::IQ4NL, |x, y| unsafe { ext::dot_iq4_nl_q8_0(x, y) });
            set(&mut k, DType::MXFP4, |x, y| unsafe { ext::dot_mxfp4_q8_0(x, y) });
            k.ops[slot(DType::MXFP4).unwrap()].vec_dot4 = Some(|x, y, o| unsafe { ext::dot4_mxfp4_q8_0(x, y, o) });
            k.ops[slot(DType::MXFP4).unwrap()].vec_dot_rows = Some(|x, xrb, y, o| unsafe { ext::rows_mxfp4_q8_0(x, xrb, y, o) });
            set(&mut k, DType::Q2K, |x, y| unsafe { ext::dot_q2_k_q8_k(x, y) });
            set(&mut k, DType::Q3K, |x, y| unsafe { ext::dot_q3_k_q8_k(x, y) });
            set(&mut k, DType::Q5K, |x, y| unsafe { ext::dot_q5_k_q8_k(x, y) });
            set(&mut k, DType::IQ4XS, |x, y| unsafe { ext::dot_iq4_xs_q8_k(x, y) });
            set(&mut k, DType::BF16, |x, y| unsafe { ext::dot_bf16(x, y) });
            use crate::matmul::x86::avx2_iq as iqk;
            use iq::IqType as T;
            for (t, f, f4) in [
                (DType::IQ2XXS, (|x, y| unsafe { iqk::dot::<{ T::IQ2XXS as usize }>(x, y) }) as VecDot, (|x, y, o| unsafe { iqk::dot4::<{ T::IQ2XXS as usize }>(x, y, o) }) as crate::matmul::VecDot4),
                (DType::IQ2XS, |x, y| unsafe { iqk::dot::<{ T::IQ2XS as usize }>(x, y) }, |x, y, o| unsafe { iqk::dot4::<{ T::IQ2XS as usize }>(x, y, o) }),
                (DType::IQ2S, |x, y| unsafe { iqk::dot::<{ T::IQ2S as usize }>(x, y) }, |x, y, o| unsafe { iqk::dot4::<{ T::IQ2S as usize }>(x, y, o) }),
                (DType::IQ3XXS, |x, y| unsafe { iqk::dot::<{ T::IQ3XXS as usize }>(x, y) }, |x, y, o| unsafe { iqk::dot4::<{ T::IQ3XXS as usize }>(x, y, o) }),
                (DType::IQ3S, |x, y| unsafe { iqk::dot::<{ T::IQ3S as usize }>(x, y) }, |x, y, o| unsafe { iqk::dot4::<{ T::IQ3S as usize }>(x, y, o) }),
                (DType::IQ1S, |x, y| unsafe { iqk::dot::<{ T::IQ1S as usize }>(x, y) }, |x, y, o| unsafe { iqk::dot4::<{ T::IQ1S as usize }>(x, y, o) }),
                (DType::IQ1M, |x, y| unsafe { iqk::dot::<{ T::IQ1M as usize }>(x, y) }, |x, y, o| unsafe { iqk::dot4::<{ T::IQ1M as usize }>(x, y, o) }),
            ] {
                set(&mut k, t, f);
                k.ops[slot(t).unwrap()].vec_dot4 = Some(f4);
            }
            k.ops[slot(DType::Q8_0).unwrap()].to_float = |x, y| unsafe { crate::quant::x86::dequant_q8_0(x, y) };
            k.ops[slot(DType::F16).unwrap()].to_float = |x, y| unsafe { crate::quant::x86::dequant_f16(x, y) };
            // Matrices of these types are repacked at load (`matmul::layout`) for these kernels.
            use crate::matmul::x86::common as il;
            for (t, o) in [
                (DType::Q4_0, interleaved_avx2::<il::Q4_0>()),
                (DType::Q4_1, interleaved_avx2::<il::Q4_1>()),
                (DType::Q5_0, interleaved_avx2::<il::Q5_0>()),
                (DType::Q5_1, interleaved_avx2::<il::Q5_1>()),
                (DType::Q8_0, interleaved_avx2::<il::Q8_0>()),
                (DType::IQ4NL, interleaved_avx2::<il::IQ4NL>()),
            ] {
                k.ops[slot(t).unwrap()].interleaved = Some(o);
            }
            use crate::matmul::x86::avx2_il_k as ilk;
            k.ops[slot(DType::Q4K).unwrap()].interleaved = Some(InterleavedOps {
                rows: |g, xrb, y, o, p| unsafe { ilk::rows_q4_k(g, xrb, y, o, p) },
                tiles: IlTiles {
                    few: None,
                    tile: |g, xrb, y, o, p| unsafe { ilk::tiles_q4_k(g, xrb, y, o, p) },
                    tile8: |g, xrb, y, o, p| unsafe { ilk::tiles8_q4_k(g, xrb, y, o, p) },
                    decoded: None,
                },
            });
            k.ops[slot(DType::Q6K).unwrap()].interleaved = Some(InterleavedOps {
                rows: |g, xrb, y, o, p| unsafe { ilk::rows_q6_k(g, xrb, y, o, p) },
                tiles: IlTiles {
                    few: Some(IlFew { tile2: |g, xrb, y, o, p| unsafe { ilk::tiles_few_q6_k::<2>(g, xrb, y, o, p) }, tile3: |g, xrb, y, o, p| unsafe { ilk::tiles_few_q6_k::<3>(g, xrb, y, o, p) } }),
                    tile: |g, xrb, y, o, p| unsafe { ilk::tiles_q6_k(g, xrb, y, o, p) },
                    tile8: |g, xrb, y, o, p| unsafe { ilk::tiles8_q6_k(g, xrb, y, o, p) },
                    decoded: Some(DecodedTiles { decode: |g, xrb, d| unsafe { ilk::decode_q6_k(g, xrb, d) }, tile8: |g, d, xrb, y, o, p| unsafe { ilk::tiles8_q6_k_decoded(g, d, xrb, y, o, p) }, bytes_per_32: 32, min_rows: crate::matmul::DECODED_MIN_ROWS_AVX2 }),
                },
            });
            k.ops[slot(DType::IQ4XS).unwrap()].interleaved = Some(InterleavedOps {
                rows: |g, xrb, y, o, p| unsafe { ilk::rows_iq4_xs(g, xrb, y, o, p) },
                tiles: IlTiles {
                    few: Some(IlFew { tile2: |g, xrb, y, o, p| unsafe { ilk::tiles_few_iq4_xs::<2>(g, xrb, y, o, p) }, tile3: |g, xrb, y, o, p| unsafe { ilk::tiles_few_iq4_xs::<3>(g, xrb, y, o, p) } }),
                    tile: |g, xrb, y, o, p| unsafe { ilk::tiles_iq4_xs(g, xrb, y, o, p) },
                    tile8: |g, xrb, y, o, p| unsafe { ilk::tiles8_iq4_xs(g, xrb, y, o, p) },
                    decoded: None,
                },
            });
        }
        k
    }

    /// The aarch64 tables: NEON dots of the golden models' types in the x86 lane order
    /// (`matmul::aarch64::neon`; the dense types' in x86 tables' orders, `neon_dense`), with
    /// `sdot` for [`Isa::Dotprod`] and [`Isa::Sme`] (whose
    /// panel GEMM runs on the matrix unit: `matmul::gemm`). Only for a CPU with `isa`.
    fn aarch64(isa: Isa) -> Kernels {
        #[allow(unused_mut)]
        let mut k = Kernels::portable();
        #[cfg(target_arch = "aarch64")]
        {
            use crate::matmul::aarch64::neon::{dotprod, kind, neon};
            use crate::matmul::aarch64::neon_dense as dense;
            debug_assert!(isa.missing().is_empty());
            k.isa = isa;
            let dot = isa >= Isa::Dotprod;
            k.q8_0 = crate::quant::aarch64::quant_q8_0;
            k.q8_1 = crate::quant::aarch64::quant_q8_1;
            k.q8_k = crate::quant::aarch64::quant_q8_k;
            k.f16 = crate::quant::aarch64::quant_f16;
            // SAFETY (the `dotprod` closures): `build` runs this for `Isa::Dotprod` or `Isa::Sme`
            // only on a CPU with it (checked); the NEON ones need only the aarch64 baseline.
            let pick = |n: VecDot, d: VecDot| if dot { d } else { n };
            for (t, f) in [
                (DType::Q4_0, pick(neon::<{ kind::Q4_0 }>, |x, y| unsafe { dotprod::<{ kind::Q4_0 }>(x, y) })),
                (DType::Q4_1, pick(neon::<{ kind::Q4_1 }>, |x, y| unsafe { dotprod::<{ kind::Q4_1 }>(x, y) })),
                (DType::Q5_0, pick(neon::<{ kind::Q5_0 }>, |x, y| unsafe { dotprod::<{ kind::Q5_0 }>(x, y) })),
                (DType::Q5_1, pick(neon::<{ kind::Q5_1 }>, |x, y| unsafe { dotprod::<{ kind::Q5_1 }>(x, y) })),
                (DType::Q8_0, pick(neon::<{ kind::Q8_0 }>, |x, y| unsafe { dotprod::<{ kind::Q8_0 }>(x, y) })),
                (DType::Q4K, pick(neon::<{ kind::Q4_K }>, |x, y| unsafe { dotprod::<{ kind::Q4_K }>(x, y) })),
                (DType::Q6K, pick(neon::<{ kind::Q6_K }>, |x, y| unsafe { dotprod::<{ kind::Q6_K }>(x, y) })),
                (DType::IQ4NL, pick(neon::<{ kind::IQ4_NL }>, |x, y| unsafe { dotprod::<{ kind::IQ4_NL }>(x, y) })),
                (DType::IQ4XS, pick(neon::<{ kind::IQ4_XS }>, |x, y| unsafe { dotprod::<{ kind::IQ4_XS }>(x, y) })),
                (DType::Q5K, pick(neon::<{ kind::Q5_K }>, |x, y| unsafe { dotprod::<{ kind::Q5_K }>(x, y) })),
                (DType::Q2K, pick(neon::<{ kind::Q2_K }>, |x, y| unsafe { dotprod::<{ kind::Q2_K }>(x, y) })),
                (DType::Q3K, pick(neon::<{ kind::Q3_K }>, |x, y| unsafe { dotprod::<{ kind::Q3_K }>(x, y) })),
                // The dense types (`matmul::aarch64::neon_dense`): baseline NEON, x86 tables' orders.
                (DType::F32, dense::dot_f32_ggml),
                (DType::F16, dense::dot_f16),
                (DType::BF16, dense::dot_bf16),
            ] {
                let o = &mut k.ops[slot(t).unwrap()];
                o.vec_dot = f;
                // Q4_K's tile order is set below; the others' tile dot is their dot.
                o.vec_dot_tile = f;
            }
            k.ops[slot(DType::F32).unwrap()].batch_dot = Some(BatchDot { dot: dense::batch_f32, tile: dense::tiles_f32, few: None, wide: None, step: 16 });
            k.ops[slot(DType::F16).unwrap()].batch_dot = Some(BatchDot {
                dot: dense::batch_f16,
                tile: dense::tiles_f16,
                few: None,
                wide: Some(Widened { widen: dense::widen_f16, tile: dense::tiles_f32, few: None }),
                step: 16,
            });
            // The i-quants (`matmul::aarch64::neon_iq`), their 4-row forms too.
            {
                use crate::matmul::aarch64::neon_iq as niq;
                use crate::matmul::VecDot4;
                use iq::IqType as T;
                let pick4 = |n: VecDot4, d: VecDot4| if dot { d } else { n };
                for (t, f, f4) in [
                    (DType::IQ2XXS, pick(niq::neon::<{ T::IQ2XXS as usize }>, |x, y| unsafe { niq::dotprod::<{ T::IQ2XXS as usize }>(x, y) }), pick4(niq::neon4::<{ T::IQ2XXS as usize }>, |x, y, o| unsafe { niq::dotprod4::<{ T::IQ2XXS as usize }>(x, y, o) })),
                    (DType::IQ2XS, pick(niq::neon::<{ T::IQ2XS as usize }>, |x, y| unsafe { niq::dotprod::<{ T::IQ2XS as usize }>(x, y) }), pick4(niq::neon4::<{ T::IQ2XS as usize }>, |x, y, o| unsafe { niq::dotprod4::<{ T::IQ2XS as usize }>(x, y, o) })),
                    (DType::IQ2S, pick(niq::neon::<{ T::IQ2S as usize }>, |x, y| unsafe { niq::dotprod::<{ T::IQ2S as usize }>(x, y) }), pick4(niq::neon4::<{ T::IQ2S as usize }>, |x, y, o| unsafe { niq::dotprod4::<{ T::IQ2S as usize }>(x, y, o) })),
                    (DType::IQ3XXS, pick(niq::neon::<{ T::IQ3XXS as usize }>, |x, y| unsafe { niq::dotprod::<{ T::IQ3XXS as usize }>(x, y) }), pick4(niq::neon4::<{ T::IQ3XXS as usize }>, |x, y, o| unsafe { niq::dotprod4::<{ T::IQ3XXS as usize }>(x, y, o) })),
                    (DType::IQ3S, pick(niq::neon::<{ T::IQ3S as usize }>, |x, y| unsafe { niq::dotprod::<{ T::IQ3S as usize }>(x, y) }), pick4(niq::neon4::<{ T::IQ3S as usize }>, |x, y, o| unsafe { niq::dotprod4::<{ T::IQ3S as usize }>(x, y, o) })),
                    (DType::IQ1S, pick(niq::neon::<{ T::IQ1S as usize }>, |x, y| unsafe { niq::dotprod::<{ T::IQ1S as usize }>(x, y) }), pick4(niq::neon4::<{ T::IQ1S as usize }>, |x, y, o| unsafe { niq::dotprod4::<{ T::IQ1S as usize }>(x, y, o) })),
                    (DType::IQ1M, pick(niq::neon::<{ T::IQ1M as usize }>, |x, y| unsafe { niq::dotprod::<{ T::IQ1M as usize }>(x, y) }), pick4(niq::neon4::<{ T::IQ1M as usize }>, |x, y, o| unsafe { niq::dotprod4::<{ T::IQ1M as usize }>(x, y, o) })),
                ] {
                    let o = &mut k.ops[slot(t).unwrap()];
                    (o.vec_dot, o.vec_dot_tile, o.vec_dot4) = (f, f, Some(f4));
                }
            }
            // MXFP4 (`matmul::aarch64::neon_mxfp4`): the x86 tables' order, one activation row,
            // four, and decode's many weight rows.
            {
                use crate::matmul::aarch64::neon_mxfp4 as mx;
                let o = &mut k.ops[slot(DType::MXFP4).unwrap()];
                let f = pick(mx::neon, |x, y| unsafe { mx::dotprod(x, y) });
                (o.vec_dot, o.vec_dot_tile) = (f, f);
                let f4: crate::matmul::VecDot4 = if dot { |x, y, o| unsafe { mx::dotprod4(x, y, o) } } else { mx::neon4 };
                let rows: crate::matmul::VecDotRows = if dot { |x, xrb, y, o| unsafe { mx::dotprod_rows(x, xrb, y, o) } } else { mx::neon_rows };
                (o.vec_dot4, o.vec_dot_rows) = (Some(f4), Some(rows));
            }
            k.ops[slot(DType::Q4K).unwrap()].vec_dot_tile = pick(neon::<{ kind::Q4_K_TILE }>, |x, y| unsafe { dotprod::<{ kind::Q4_K_TILE }>(x, y) });
            // Interleaved kernels (`matmul::aarch64::neon_il`): Q4_K's tiles in its tile order.
            for (t, il) in [
                (DType::Q4_0, interleaved_neon::<{ kind::Q4_0 }, { kind::Q4_0 }>(dot)),
                (DType::Q4_1, interleaved_neon::<{ kind::Q4_1 }, { kind::Q4_1 }>(dot)),
                (DType::Q5_0, interleaved_neon::<{ kind::Q5_0 }, { kind::Q5_0 }>(dot)),
                (DType::Q5_1, interleaved_neon::<{ kind::Q5_1 }, { kind::Q5_1 }>(dot)),
                (DType::Q8_0, interleaved_neon::<{ kind::Q8_0 }, { kind::Q8_0 }>(dot)),
                (DType::Q4K, interleaved_neon::<{ kind::Q4_K }, { kind::Q4_K_TILE }>(dot)),
                (DType::Q6K, interleaved_neon::<{ kind::Q6_K }, { kind::Q6_K }>(dot)),
                (DType::IQ4NL, interleaved_neon::<{ kind::IQ4_NL }, { kind::IQ4_NL }>(dot)),
                (DType::IQ4XS, interleaved_neon::<{ kind::IQ4_XS }, { kind::IQ4_XS }>(dot)),
            ] {
                k.ops[slot(t).unwrap()].interleaved = Some(il);
            }
        }
        let _ = isa;
        k
    }

    /// The interleaved layout to pack weights in for this table's kernels (Q5_0/Q5_1's fifth
    /// bits differ between tables; weights are read only by the table they were packed for).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The level this table was built for: its matmul kernels, and the attention, norm, RoPE
    /// and activation kernels that take it.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Whether the panel GEMM (`--fast-prefill`) runs its AVX-512 VNNI micro-kernel: with the
    /// AVX-512 table (or AMX's, which is AVX-512's), whose level includes AVX-512 F/VL/VNNI.
    pub fn vnni(&self) -> bool {
        self.isa.avx512()
    }

    /// What this table chose at run time inside its level, in words, for `bench` to print
    /// beside [`Kernels::isa`] (and in its JSON as `kernel_variant`): on the AVX2 table whether its integer kernels take
    /// AVX-VNNI or `maddubs`; on the AVX-512 (and AMX) table what the start-up probe of
    /// 512-bit `vpdpbusd` answered, which sets the panel GEMM's default register tile
    /// (`gemm::default_schedule`). Empty where nothing is chosen (portable, aarch64).
    /// Zen 4 answers half rate (the probe's 512-bit loop took 1.98–1.99× the 256-bit one's
    /// time in six runs), Zen 5 server full rate (0.97–1.03).
    pub fn variant(&self) -> String {
        #[cfg(target_arch = "x86_64")]
        {
            if self.isa.avx512() {
                // The tile height as the schedule gives it, not restated here.
                let rows = crate::matmul::gemm::default_schedule(Isa::Avx512, crate::DType::Q4_1).mr;
                let rate = if crate::simd::x86::vnni512_full_rate() { "full" } else { "half" };
                let probe = format!("512-bit vpdpbusd at {rate} rate: {rows}-row panel tiles");
                return if self.isa == Isa::Amx { format!("AMX tiles where they run, else {probe}") } else { probe };
            }
            if self.isa == Isa::Avx2 {
                return if crate::simd::x86::avx_vnni() { "AVX-VNNI".into() } else { "maddubs, no AVX-VNNI".into() };
            }
        }
        String::new()
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

/// The process-wide table: the level given to [`set_default_isa`], else `CORELM_ISA`
/// (`portable`, `avx2`, `avx512`), else the best this CPU runs; fixed on first use.
///
/// # Panics
/// If `CORELM_ISA` names an unknown level or one this CPU cannot run (the CLI checks it first
/// and reports it as an error).
pub fn kernels() -> &'static Kernels {
    let isa = *DEFAULT_ISA.get_or_init(|| match std::env::var("CORELM_ISA") {
        Ok(v) if !v.trim().is_empty() => v.parse::<Isa>().and_then(check).unwrap_or_else(|e| panic!("CORELM_ISA: {e}")),
        _ => default_isa(),
    });
    table(isa)
}

/// The level a process runs without `--isa` or `CORELM_ISA`: [`best_isa`], except that the AMX
/// table is asked for by name (`--isa amx`). It differs from AVX-512's only in the panel GEMM
/// (`--fast-prefill`), which measured 0.73–1.32× AVX-512's prefill on a 16-core Xeon
/// (docs/benchmarks.md), so AVX-512's stays the default there.
pub fn default_isa() -> Isa {
    match best_isa() {
        Isa::Amx => Isa::Avx512,
        isa => isa,
    }
}

static DEFAULT_ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();

/// Fix the level [`kernels`] uses (the CLI's `--isa`), before its first use. Fails if this CPU
/// cannot run it, or if the process already chose another level.
pub fn set_default_isa(isa: Isa) -> Result<(), IsaError> {
    check(isa)?;
    let chosen = *DEFAULT_ISA.get_or_init(|| isa);
    if chosen == isa {
        Ok(())
    } else {
        Err(IsaError::AlreadyChosen { isa, chosen })
    }
}

/// The table of a level, built once per process; an error names the features this CPU lacks.
pub fn kernels_for(isa: Isa) -> Result<&'static Kernels, IsaError> {
    Ok(table(check(isa)?))
}

/// The highest level this CPU runs: [`Isa::detected`], stepped down from [`Isa::Sme`] to
/// [`Isa::Dotprod`] and from [`Isa::Amx`] to [`Isa::Avx512`] where the matrix unit's kernels
/// fail their start-up self-test (run once).
pub fn best_isa() -> Isa {
    match Isa::detected() {
        Isa::Sme if !self_test_passes(Isa::Sme) => Isa::Dotprod,
        Isa::Amx if !self_test_passes(Isa::Amx) => Isa::Avx512,
        isa => isa,
    }
}

/// [`Isa::check`], and for [`Isa::Sme`] and [`Isa::Amx`] their kernels' self-test.
pub fn check(isa: Isa) -> Result<Isa, IsaError> {
    let isa = isa.check()?;
    if !self_test_passes(isa) {
        return Err(IsaError::SelfTest { isa, best: best_isa() });
    }
    Ok(isa)
}

/// Whether `isa`'s matrix-unit kernels passed their start-up self-test (levels without one:
/// yes).
fn self_test_passes(isa: Isa) -> bool {
    match isa {
        Isa::Sme => sme_self_test(),
        Isa::Amx => amx_self_test(),
        _ => true,
    }
}

/// Whether the AMX panel kernel agrees with its portable model on this CPU, bit for bit (run
/// once; `false` where AMX's features or the kernel's leave are missing).
pub fn amx_self_test() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if Isa::Amx.missing().is_empty() {
            // SAFETY: the CPU has AMX-TILE/INT8 and AVX-512, and the process has the tile data
            // (checked just above).
            return unsafe { crate::matmul::gemm::amx::self_test() };
        }
        false
    })
}

/// Whether the SME kernels agree with their portable models on this CPU, bit for bit (run
/// once; `false` where SME's features are missing).
pub fn sme_self_test() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(target_arch = "aarch64")]
        if Isa::Sme.missing().is_empty() {
            // SAFETY: the CPU has SME's features (checked just above).
            return unsafe { crate::matmul::aarch64::sme::self_test() };
        }
        false
    })
}

/// The table of a level this CPU runs (checked by the callers), built on first use.
fn table(isa: Isa) -> &'static Kernels {
    static TABLES: [std::sync::OnceLock<Kernels>; Isa::ALL.len()] = [const { std::sync::OnceLock::new() }; Isa::ALL.len()];
    TABLES[isa as usize].get_or_init(|| Kernels::build(isa))
}
