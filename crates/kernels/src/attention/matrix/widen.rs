//! Q8_0 caches with keys in columns: a block's keys (the Q8_0 column block of
//! [`KeyLayout::Columns`](crate::attention::KeyLayout)) and its 16 value rows widened to the
//! F16 block the column-key kernels read, once per block and call, into the worker's scratch
//! (as ggml's tiled flash attention converts quantized K and V tiles to floats). Each element
//! becomes `f16(f32(d) · q)` — the Q8_0 value `d · q` is exact in f32 and rounded once to
//! nearest-even F16, an error 2⁻¹² of the value, a sixteenth of Q8_0's own step — so every
//! table's kernels see the same F16 numbers and give the same bits.
//!
//! A Q8_0 column block of `hd` dimensions holds the same bytes as 16 Q8_0 rows: `[hd][16]`
//! int8 values (one dimension of the 16 cells contiguous), then `[hd / 32][16]` F16 scales.

use crate::attention::types::KEY_COLUMNS as C;
use half::f16;

/// Bytes of a Q8_0 block (an F16 scale and 32 int8 values).
const Q8_BLOCK: usize = 34;

/// Cell `j`'s key (`key`: one Q8_0 row of `hd` values, as the row writer quantizes it) into
/// its column block at `block`: value `d` at byte `d · 16 + j`, scale `b` at `16·hd + (b·16 + j)·2`.
///
/// # Safety
/// `block` points to `17 · hd` writable bytes (`hd = key.len() / 34 · 32`) that no one else
/// reads or writes at cell `j` meanwhile; `j < 16`.
pub unsafe fn store_key_q8_at(block: *mut u8, j: usize, key: &[u8]) {
    debug_assert!(j < C && key.len().is_multiple_of(Q8_BLOCK));
    let hd = key.len() / Q8_BLOCK * 32;
    for (b, blk) in key.chunks_exact(Q8_BLOCK).enumerate() {
        // SAFETY: every offset is below 17·hd (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(blk.as_ptr(), block.add(hd * C + (b * C + j) * 2), 2);
            for (i, &q) in blk[2..].iter().enumerate() {
                *block.add((b * 32 + i) * C + j) = q;
            }
        }
    }
}

/// The portable widening of a Q8_0 column block (`src`, `17·hd` bytes) into `dst`
/// (`[hd][16]` F16).
pub(crate) fn keys_q8(src: &[u8], hd: usize, dst: &mut [f16]) {
    let (q, s) = src[..17 * hd].split_at(hd * C);
    for d in 0..hd {
        for j in 0..C {
            let at = ((d / 32) * C + j) * 2;
            let scale = f16::from_le_bytes([s[at], s[at + 1]]).to_f32();
            dst[d * C + j] = f16::from_f32(scale * q[d * C + j] as i8 as f32);
        }
    }
}

/// The portable widening of 16 Q8_0 value rows of `hd` (`src`, `17·hd` bytes) into `dst`
/// (`[16][hd]` F16).
pub(crate) fn rows_q8(src: &[u8], hd: usize, dst: &mut [f16]) {
    for (blk, out) in src[..17 * hd].chunks_exact(Q8_BLOCK).zip(dst.chunks_exact_mut(32)) {
        let scale = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        for (o, &q) in out.iter_mut().zip(&blk[2..]) {
            *o = f16::from_f32(scale * q as i8 as f32);
        }
    }
}

/// x86 (AVX2, F16C): eight elements per step, `vcvtps2ph` rounding to nearest even.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{C, Q8_BLOCK};
    use half::f16;
    use std::arch::x86_64::*;

    /// Eight int8 at `q` times eight f32 scales, rounded to F16 at `out`.
    ///
    /// # Safety
    /// AVX2 and F16C; 8 readable bytes at `q`, 16 writable at `out`.
    #[inline(always)]
    unsafe fn eight(q: *const u8, scale: __m256, out: *mut f16) {
        // SAFETY: the caller's contract.
        unsafe {
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q as *const __m128i)));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(scale, v));
            _mm_storeu_si128(out as *mut __m128i, h);
        }
    }

    /// [`super::keys_q8`], the same bits.
    ///
    /// # Safety
    /// AVX2 and F16C (the caller's target features); `src` holds `17·hd` bytes, `dst` `16·hd`
    /// F16; `hd` a multiple of 32.
    #[inline(always)]
    pub(crate) unsafe fn keys_q8(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; every offset stays inside the block and `dst`.
        unsafe {
            for b in 0..hd / 32 {
                let s = src.add(hd * C + b * C * 2);
                let (s0, s1) = (_mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i)), _mm256_cvtph_ps(_mm_loadu_si128(s.add(16) as *const __m128i)));
                for d in b * 32..b * 32 + 32 {
                    eight(src.add(d * C), s0, dst.add(d * C));
                    eight(src.add(d * C + 8), s1, dst.add(d * C + 8));
                }
            }
        }
    }

    /// [`super::rows_q8`], the same bits.
    ///
    /// # Safety
    /// As [`keys_q8`].
    #[inline(always)]
    pub(crate) unsafe fn rows_q8(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; 16 rows of hd / 32 blocks.
        unsafe {
            for b in 0..C * hd / 32 {
                let blk = src.add(b * Q8_BLOCK);
                let scale = _mm256_set1_ps(f16::from_le_bytes([*blk, *blk.add(1)]).to_f32());
                for i in (0..32).step_by(8) {
                    eight(blk.add(2 + i), scale, dst.add(b * 32 + i));
                }
            }
        }
    }
}

/// x86 AVX-512 (F, F16C): sixteen elements per step, `vcvtps2ph` rounding to nearest even.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_512 {
    use super::{C, Q8_BLOCK};
    use half::f16;
    use std::arch::x86_64::*;

    /// Sixteen int8 at `q` times sixteen f32 scales, rounded to F16 at `out`.
    ///
    /// # Safety
    /// AVX-512 F and F16C; 16 readable bytes at `q`, 32 writable at `out`.
    #[inline(always)]
    unsafe fn sixteen(q: *const u8, scale: __m512, out: *mut f16) {
        // SAFETY: the caller's contract.
        unsafe {
            let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q as *const __m128i)));
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_mul_ps(scale, v));
            _mm256_storeu_si256(out as *mut __m256i, h);
        }
    }

    /// [`super::keys_q8`], the same bits.
    ///
    /// # Safety
    /// AVX-512 F and F16C (the caller's target features); `src` holds `17·hd` bytes, `dst`
    /// `16·hd` F16; `hd` a multiple of 32.
    #[inline(always)]
    pub(crate) unsafe fn keys_q8(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; every offset stays inside the block and `dst`.
        unsafe {
            for b in 0..hd / 32 {
                let s = _mm512_cvtph_ps(_mm256_loadu_si256(src.add(hd * C + b * C * 2) as *const __m256i));
                for d in b * 32..b * 32 + 32 {
                    sixteen(src.add(d * C), s, dst.add(d * C));
                }
            }
        }
    }

    /// [`super::rows_q8`], the same bits.
    ///
    /// # Safety
    /// As [`keys_q8`].
    #[inline(always)]
    pub(crate) unsafe fn rows_q8(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; 16 rows of hd / 32 blocks.
        unsafe {
            for b in 0..C * hd / 32 {
                let blk = src.add(b * Q8_BLOCK);
                let scale = _mm512_set1_ps(f16::from_le_bytes([*blk, *blk.add(1)]).to_f32());
                sixteen(blk.add(2), scale, dst.add(b * 32));
                sixteen(blk.add(18), scale, dst.add(b * 32 + 16));
            }
        }
    }
}

/// NEON: four elements per step, `fcvtn` rounding to nearest even.
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon {
    use super::{C, Q8_BLOCK};
    use crate::simd::aarch64::to_f16_bits4;
    use half::f16;
    use std::arch::aarch64::*;

    /// Eight int8 at `q` times the scales `s0` (first four) and `s1`, rounded to F16 at `out`.
    ///
    /// # Safety
    /// 8 readable bytes at `q`, 16 writable at `out`.
    #[inline(always)]
    unsafe fn eight(q: *const u8, s0: float32x4_t, s1: float32x4_t, out: *mut f16) {
        // SAFETY: the caller's contract.
        unsafe {
            let w = vmovl_s8(vld1_s8(q as *const i8));
            let lo = vmulq_f32(s0, vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))));
            let hi = vmulq_f32(s1, vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))));
            vst1_u16(out as *mut u16, to_f16_bits4(lo));
            vst1_u16(out.add(4) as *mut u16, to_f16_bits4(hi));
        }
    }

    /// Four F16 scales at `s` as f32.
    #[inline(always)]
    fn scales4(s: &[u8]) -> [f32; 4] {
        std::array::from_fn(|i| f16::from_le_bytes([s[2 * i], s[2 * i + 1]]).to_f32())
    }

    /// [`super::keys_q8`], the same bits.
    ///
    /// # Safety
    /// `src` holds `17·hd` bytes, `dst` `16·hd` F16; `hd` a multiple of 32.
    #[inline(always)]
    pub(crate) unsafe fn keys_q8(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; every offset stays inside the block and `dst`.
        unsafe {
            for b in 0..hd / 32 {
                let s = std::slice::from_raw_parts(src.add(hd * C + b * C * 2), C * 2);
                let sc: [float32x4_t; 4] = std::array::from_fn(|i| vld1q_f32(scales4(&s[8 * i..]).as_ptr()));
                for d in b * 32..b * 32 + 32 {
                    eight(src.add(d * C), sc[0], sc[1], dst.add(d * C));
                    eight(src.add(d * C + 8), sc[2], sc[3], dst.add(d * C + 8));
                }
            }
        }
    }

    /// [`super::rows_q8`], the same bits.
    ///
    /// # Safety
    /// As [`keys_q8`].
    #[inline(always)]
    pub(crate) unsafe fn rows_q8(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; 16 rows of hd / 32 blocks.
        unsafe {
            for b in 0..C * hd / 32 {
                let blk = src.add(b * Q8_BLOCK);
                let scale = vdupq_n_f32(f16::from_le_bytes([*blk, *blk.add(1)]).to_f32());
                for i in (0..32).step_by(8) {
                    eight(blk.add(2 + i), scale, scale, dst.add(b * 32 + i));
                }
            }
        }
    }
}
