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
