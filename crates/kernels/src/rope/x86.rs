//! RoPE rotation on 8 (AVX2) and 16 (AVX-512) lanes, bit-identical to `rope::rope_apply`'s
//! scalar loop: every pair `(x0, x1)` becomes `(fma(x0, c, -(x1·s)), fma(x0, s, x1·c))`, the
//! first product of each expression fused as ggml's FMA build does. `cache` holds the cosines
//! in `[..n_rot / 2]` and the sines in `[n_rot / 2..n_rot]` (`rope::rope_cache`).
//! - NeoX layout (pairs `(i, i + n_rot/2)`): both halves load as contiguous vectors.
//! - Adjacent pairs `(2i, 2i + 1)`: a vector holds 4 (8) whole pairs; the partner of each lane
//!   is the pair-swapped vector, cosines and sines are duplicated per pair, and the even and
//!   odd lanes' expressions are blended.
//!
//! Pairs past the last whole vector go through the scalar loop.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

/// One pair, as the scalar kernel (`rope::rope_apply`).
#[inline(always)]
fn pair(x: &mut [f32], a: usize, b: usize, c: f32, s: f32) {
    let (x0, x1) = (x[a], x[b]);
    x[a] = x0.mul_add(c, -(x1 * s));
    x[b] = x0.mul_add(s, x1 * c);
}

/// Rotate one head in place with AVX2 (see the module doc).
#[target_feature(enable = "avx2,fma")]
pub fn rope_avx2(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    let half = n_rot / 2;
    assert!(x.len() >= n_rot && cache.len() >= n_rot);
    let (cos, sin) = cache[..n_rot].split_at(half);
    let p = x.as_mut_ptr();
    let mut i = 0;
    if neox {
        while i + 8 <= half {
            // SAFETY: i + 8 <= half, so x[i..i+8], x[half+i..half+i+8], cos/sin[i..i+8] are in
            // bounds (asserted above); unaligned loads and stores.
            unsafe {
                let (x0, x1) = (_mm256_loadu_ps(p.add(i)), _mm256_loadu_ps(p.add(half + i)));
                let (c, s) = (_mm256_loadu_ps(cos.as_ptr().add(i)), _mm256_loadu_ps(sin.as_ptr().add(i)));
                _mm256_storeu_ps(p.add(i), _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(p.add(half + i), _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
            }
            i += 8;
        }
    } else {
        let dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
        while i + 4 <= half {
            // SAFETY: pairs i..i+4 are x[2i..2i+8] and cos/sin[i..i+4], in bounds (2i + 8 <=
            // n_rot); unaligned loads and stores.
            unsafe {
                let v = _mm256_loadu_ps(p.add(2 * i));
                let sw = _mm256_permute_ps::<0b1011_0001>(v);
                let c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cos.as_ptr().add(i))), dup);
                let s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sin.as_ptr().add(i))), dup);
                // Even lanes hold x0 (partner x1 = sw), odd lanes x1 (partner x0 = sw).
                let even = _mm256_fmsub_ps(v, c, _mm256_mul_ps(sw, s));
                let odd = _mm256_fmadd_ps(sw, s, _mm256_mul_ps(v, c));
                _mm256_storeu_ps(p.add(2 * i), _mm256_blend_ps::<0b1010_1010>(even, odd));
            }
            i += 4;
        }
    }
    rope_tail(x, cos, sin, half, i, neox);
}

/// Rotate one head in place with AVX-512 (see the module doc).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub fn rope_avx512(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    let half = n_rot / 2;
    assert!(x.len() >= n_rot && cache.len() >= n_rot);
    let (cos, sin) = cache[..n_rot].split_at(half);
    let p = x.as_mut_ptr();
    let mut i = 0;
    if neox {
        while i + 16 <= half {
            // SAFETY: as in `rope_avx2`, 16 lanes.
            unsafe {
                let (x0, x1) = (_mm512_loadu_ps(p.add(i)), _mm512_loadu_ps(p.add(half + i)));
                let (c, s) = (_mm512_loadu_ps(cos.as_ptr().add(i)), _mm512_loadu_ps(sin.as_ptr().add(i)));
                _mm512_storeu_ps(p.add(i), _mm512_fmsub_ps(x0, c, _mm512_mul_ps(x1, s)));
                _mm512_storeu_ps(p.add(half + i), _mm512_fmadd_ps(x0, s, _mm512_mul_ps(x1, c)));
            }
            i += 16;
        }
    } else {
        let dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        while i + 8 <= half {
            // SAFETY: as in `rope_avx2`, 8 pairs per pass.
            unsafe {
                let v = _mm512_loadu_ps(p.add(2 * i));
                let sw = _mm512_permute_ps::<0b1011_0001>(v);
                let c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cos.as_ptr().add(i))));
                let s = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(sin.as_ptr().add(i))));
                let even = _mm512_fmsub_ps(v, c, _mm512_mul_ps(sw, s));
                let odd = _mm512_fmadd_ps(sw, s, _mm512_mul_ps(v, c));
                _mm512_storeu_ps(p.add(2 * i), _mm512_mask_blend_ps(0xAAAA, even, odd));
            }
            i += 8;
        }
    }
    rope_tail(x, cos, sin, half, i, neox);
}

/// Pairs `from..half` one at a time (past the last whole vector).
#[inline(always)]
fn rope_tail(x: &mut [f32], cos: &[f32], sin: &[f32], half: usize, from: usize, neox: bool) {
    for j in from..half {
        if neox {
            pair(x, j, j + half, cos[j], sin[j]);
        } else {
            pair(x, 2 * j, 2 * j + 1, cos[j], sin[j]);
        }
    }
}
