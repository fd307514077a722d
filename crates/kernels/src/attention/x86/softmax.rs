//! ggml's softmax step of the tiled kernel (`ggml_vec_soft_max_f32`: its own `expf`, each 16
//! lanes reduced as `_mm512_reduce_add_ps`, the groups summed in double): on 8 lanes, shared
//! by the per-head kernel (`reference`) and the multi-row kernel (`rows`), and on 16 lanes for
//! `rows512`, the same bits.
#![allow(clippy::missing_safety_doc)]

use crate::attention::tiles::tile_step;
use crate::exp::x86::{expf_ggml16, expf_ggml8};
use crate::simd::x86::{hsum_f32x8, max_f32, reduce_add_ps16};
use std::arch::x86_64::*;

/// The softmax step of the tiled kernel: `p = expf_ggml(p - m)` in place, each group of 16
/// summed in float as `simd::reduce_add_16`, the groups summed in double (ggml's
/// `ggml_vec_soft_max_f32`). Bit-identical to the scalar loop in `attention::portable::attend_tiled`.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn softmax_tile(scores: &mut [f32], m: f32) -> f64 {
    let mv = _mm256_set1_ps(m);
    let mut sum = 0f64;
    for g in scores.chunks_exact_mut(16) {
        // SAFETY: 16 f32 in g; unaligned loads and stores.
        unsafe {
            let p = g.as_mut_ptr();
            let lo = expf_ggml8(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
            let hi = expf_ggml8(_mm256_sub_ps(_mm256_loadu_ps(p.add(8)), mv));
            _mm256_storeu_ps(p, lo);
            _mm256_storeu_ps(p.add(8), hi);
            sum += hsum_f32x8(_mm256_add_ps(hi, lo)) as f64;
        }
    }
    sum
}

/// One head's online-softmax step over a tile (`attention::tiles::tile_step`) with the AVX2
/// maximum and [`softmax_tile`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn tile_softmax(sh: &mut [f32], len: usize, st: &mut [f32; 2], acc: &mut [f32]) -> bool {
    // The closures inherit this function's features, which `max_f32` and `softmax_tile` need.
    tile_step(sh, len, st, acc, |x| max_f32(x), |p, m| softmax_tile(p, m))
}

/// ggml's AVX-512 softmax step (`ggml_vec_soft_max_f32`): `p = expf(p - m)` in place, each 16
/// lanes summed in float as `_mm512_reduce_add_ps`, the sums added in double.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(crate) fn softmax_tile16(scores: &mut [f32], m: f32) -> f64 {
    let mv = _mm512_set1_ps(m);
    let mut sum = 0f64;
    for g in scores.chunks_exact_mut(16) {
        // SAFETY: 16 f32 in g; unaligned load and store.
        unsafe {
            let e = expf_ggml16(_mm512_sub_ps(_mm512_loadu_ps(g.as_ptr()), mv));
            _mm512_storeu_ps(g.as_mut_ptr(), e);
            sum += reduce_add_ps16(e) as f64;
        }
    }
    sum
}

/// One vector's online-softmax step over a tile (`attention::tiles::tile_step`) with the
/// AVX2 maximum (exact in any order) and [`softmax_tile16`].
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(crate) fn tile_softmax16(sh: &mut [f32], len: usize, st: &mut [f32; 2], acc: &mut [f32]) -> bool {
    // The closures inherit this function's features, which `max_f32` and `softmax_tile16` need.
    tile_step(sh, len, st, acc, |x| max_f32(x), |p, m| softmax_tile16(p, m))
}
