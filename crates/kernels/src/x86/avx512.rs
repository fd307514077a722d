//! AVX-512 (BW, VL, VNNI on 256-bit vectors) instances of dot products where the extra
//! instructions remove work, not just widen it. Same integer sums and the same float steps per
//! block as the AVX2 kernels, so the results are bit-identical (tests/parity.rs).
//!
//! Q5_0: the fifth bits become a mask register (`kmovd`) under which one masked add puts 16 into
//! the nibbles, and the signed product sum is `Σ (q + 16)·y − 16·Σ y`, two `vpdpbusd` on the
//! unsigned values, where AVX2 builds signed bytes (five instructions) and needs two `vpsignb`,
//! `maddubs` and `madd`. The identity is exact in integers and AVX2's 16-bit pair sums never
//! saturate here (|q| ≤ 16, |y| ≤ 127), so every lane holds the AVX2 kernel's value.

use super::avx2::{h2f, hsum_f32x8, load32, nibbles_32};
use crate::blocks::*;
use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = _mm256_setzero_ps();
    let sixteen = _mm256_set1_epi8(16);
    for (a, b) in x.iter().zip(y) {
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let nib = nibbles_32(&a.qs);
        // q + 16: add 16 where the fifth bit is set (the nibble is below 16, so add = or).
        let u = _mm256_mask_add_epi8(nib, u32::from_le_bytes(a.qh), nib, sixteen);
        let qy = load32(&b.qs);
        let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, qy);
        let off = _mm256_dpbusd_epi32(_mm256_setzero_si256(), sixteen, qy);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, off)), acc);
    }
    hsum_f32x8(acc)
}

/// `R` weight rows (`x`, rows `xrb` bytes apart) against `C` activation rows: R·C dot products
/// per pass, `out[r][j] == dot_q5_0_q8_0(x_r, y_j)` bit for bit (each accumulator sees the
/// single-row kernel's integer sum and float steps, block by block). Each weight block is
/// decoded once for `C` activation rows and each activation block's `16·Σy` is computed once for
/// `R` weight rows, so a pair costs one `vpdpbusd`, a convert, the scale product and the FMA.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tile_q5_0_q8_0<const R: usize, const C: usize>(x: &[u8], xrb: usize, y: [&[u8]; C], out: &mut [[f32; C]; R]) {
    let nb = xrb / std::mem::size_of::<BlockQ5_0>();
    // Equal lengths up front, so the loop below has no bounds checks.
    let a: [&[BlockQ5_0]; R] = std::array::from_fn(|r| &as_blocks::<BlockQ5_0>(&x[r * xrb..(r + 1) * xrb])[..nb]);
    let b: [&[BlockQ8_0]; C] = y.map(|y| &as_blocks::<BlockQ8_0>(y)[..nb]);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let sixteen = _mm256_set1_epi8(16);
    for i in 0..nb {
        let mut u = [_mm256_setzero_si256(); R];
        let mut dw = [_mm256_setzero_ps(); R];
        for r in 0..R {
            let blk = &a[r][i];
            u[r] = unsigned_q5(blk);
            dw[r] = bcast_h(blk.d);
        }
        for j in 0..C {
            let blk = &b[j][i];
            let qy = load32(&blk.qs);
            let dy = bcast_h(blk.d);
            let neg = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), sixteen, qy));
            for r in 0..R {
                let s = _mm256_dpbusd_epi32(neg, u[r], qy);
                acc[r][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dy), _mm256_cvtepi32_ps(s), acc[r][j]);
            }
        }
    }
    for r in 0..R {
        for j in 0..C {
            out[r][j] = hsum_f32x8(acc[r][j]);
        }
    }
}

/// An F16 scale converted and broadcast to eight lanes: `vpbroadcastw` from memory and one
/// `vcvtph2ps`, both writing whole registers (no false dependency, unlike a one-lane insert).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn bcast_h(h: half::f16) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(h.to_bits() as i16))
}

/// A Q5_0 block's 32 values plus 16 (0..=31, unsigned bytes): the 16 nibble bytes broadcast to
/// both halves and shifted by 0 / 4 per half in one `vpsrlvw`, the fifth bits as a mask that
/// selects 16, and one `vpternlogd` for `(v & 0x0F) | hi`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn unsigned_q5(b: &BlockQ5_0) -> __m256i {
    // SAFETY: qs is 16 readable bytes; no alignment requirement.
    let raw = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(b.qs.as_ptr() as *const __m128i) });
    let v = _mm256_srlv_epi16(raw, _mm256_setr_epi64x(0, 0, 0x0004_0004_0004_0004, 0x0004_0004_0004_0004));
    let hi = _mm256_maskz_mov_epi8(u32::from_le_bytes(b.qh), _mm256_set1_epi8(16));
    _mm256_ternarylogic_epi32::<0xEA>(v, _mm256_set1_epi8(0x0F), hi)
}
