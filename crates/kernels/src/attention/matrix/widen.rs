//! Q8_0 and Q4_0 caches with keys in columns: a block's keys (the column block of
//! [`KeyLayout::Columns`](crate::attention::KeyLayout)) and its 16 value rows widened to the
//! F16 block the column-key kernels read, once per block and call, into the worker's scratch
//! (as ggml's tiled flash attention converts quantized K and V tiles to floats). Each element
//! becomes `f16(f32(d) · q)` — the value `d · q` is exact in f32 and rounded once to
//! nearest-even F16, an error 2⁻¹² of the value, a sixteenth of Q8_0's own step — so every
//! table's kernels see the same F16 numbers and give the same bits.
//!
//! A column block of `hd` dimensions holds the same bytes as 16 rows of its type. Q8_0:
//! `[hd][16]` int8 values (one dimension of the 16 cells contiguous), then `[hd / 32][16]` F16
//! scales. Q4_0: `[hd / 2][16]` bytes, byte `p·16 + j` holding cell `j`'s dimension `2p` in its
//! low nibble and `2p + 1` in its high one (stored `q + 8`, as Q4_0 rows store them; each
//! cell's bytes are its own, so writers of different cells never share a byte), then
//! `[hd / 32][16]` F16 scales.

use crate::attention::types::KEY_COLUMNS as C;
use crate::DType;
use crate::quant::blocks::{BlockQ4_0, BlockQ8_0};
use half::f16;

/// The versions of the widening.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Widen {
    Portable,
    /// AVX2 and F16C: only for callers inside entry points with those features (the AVX-512
    /// entry points enable them too).
    #[cfg(target_arch = "x86_64")]
    X86,
    /// NEON (baseline on aarch64).
    #[cfg(target_arch = "aarch64")]
    Neon,
}

/// A Q8_0 or Q4_0 (`t`) block widened to F16 on version `w`: the keys of a column block
/// (`keys`, into `[hd][16]`) or 16 value rows (into `[16][hd]`). `hd` a multiple of 32.
#[inline(always)]
pub(crate) fn block(w: Widen, t: DType, keys: bool, src: &[u8], hd: usize, dst: &mut [f16]) {
    assert!(hd.is_multiple_of(32) && src.len() >= C * crate::row_bytes(t, hd) && dst.len() >= C * hd);
    let q8 = match t {
        DType::Q8_0 => true,
        DType::Q4_0 => false,
        _ => panic!("no widening of {t} blocks"),
    };
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    match (w, keys, q8) {
        (Widen::Portable, true, true) => keys_q8(src, hd, dst),
        (Widen::Portable, false, true) => rows_q8(src, hd, dst),
        (Widen::Portable, true, false) => keys_q4(src, hd, dst),
        (Widen::Portable, false, false) => rows_q4(src, hd, dst),
        // SAFETY (x86 arms): `Widen::X86` is passed only from entry points that enable AVX2
        // and F16C, where this inlines; sizes asserted.
        #[cfg(target_arch = "x86_64")]
        (Widen::X86, true, true) => unsafe { x86::keys_q8(s, hd, d) },
        #[cfg(target_arch = "x86_64")]
        (Widen::X86, false, true) => unsafe { x86::rows_q8(s, hd, d) },
        #[cfg(target_arch = "x86_64")]
        (Widen::X86, true, false) => unsafe { x86::keys_q4(s, hd, d) },
        #[cfg(target_arch = "x86_64")]
        (Widen::X86, false, false) => unsafe { x86::rows_q4(s, hd, d) },
        // SAFETY (NEON arms): NEON is baseline on aarch64; sizes asserted.
        #[cfg(target_arch = "aarch64")]
        (Widen::Neon, true, true) => unsafe { neon::keys_q8(s, hd, d) },
        #[cfg(target_arch = "aarch64")]
        (Widen::Neon, false, true) => unsafe { neon::rows_q8(s, hd, d) },
        #[cfg(target_arch = "aarch64")]
        (Widen::Neon, true, false) => unsafe { neon::keys_q4(s, hd, d) },
        #[cfg(target_arch = "aarch64")]
        (Widen::Neon, false, false) => unsafe { neon::rows_q4(s, hd, d) },
    }
}

/// Bytes of a Q8_0 block (an F16 scale and 32 int8 values).
pub(super) const Q8_BLOCK: usize = size_of::<BlockQ8_0>();
/// Bytes of a Q4_0 block (an F16 scale and 32 nibbles).
pub(super) const Q4_BLOCK: usize = size_of::<BlockQ4_0>();

/// Cell `j`'s key (`key`: one Q4_0 row, as the row writer quantizes it) into its Q4_0 column
/// block at `block` (`9 · hd` bytes).
///
/// # Safety
/// As [`store_key_q8_at`], for `9 · hd` bytes (`hd = key.len() / 18 · 32`).
pub unsafe fn store_key_q4_at(block: *mut u8, j: usize, key: &[u8]) {
    debug_assert!(j < C && key.len().is_multiple_of(Q4_BLOCK));
    let hd = key.len() / Q4_BLOCK * 32;
    for (b, blk) in key.chunks_exact(Q4_BLOCK).enumerate() {
        let nib = |e: usize| if e < 16 { blk[2 + e] & 0x0F } else { blk[2 + e - 16] >> 4 };
        // SAFETY: every offset is below 9·hd (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(blk.as_ptr(), block.add(hd * C / 2 + (b * C + j) * 2), 2);
            for e in (0..32).step_by(2) {
                *block.add(((b * 32 + e) / 2) * C + j) = nib(e) | nib(e + 1) << 4;
            }
        }
    }
}

/// The portable widening of a Q4_0 column block (`src`, `9·hd` bytes) into `dst`
/// (`[hd][16]` F16).
fn keys_q4(src: &[u8], hd: usize, dst: &mut [f16]) {
    let (q, s) = src[..9 * hd].split_at(hd * C / 2);
    for d in 0..hd {
        for j in 0..C {
            let at = ((d / 32) * C + j) * 2;
            let scale = f16::from_le_bytes([s[at], s[at + 1]]).to_f32();
            let byte = q[(d / 2) * C + j];
            let nib = if d % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            dst[d * C + j] = f16::from_f32(scale * (nib as i32 - 8) as f32);
        }
    }
}

/// The portable widening of 16 Q4_0 value rows of `hd` (`src`, `9·hd` bytes) into `dst`.
fn rows_q4(src: &[u8], hd: usize, dst: &mut [f16]) {
    for (blk, out) in src[..9 * hd].chunks_exact(Q4_BLOCK).zip(dst.chunks_exact_mut(32)) {
        let scale = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        for (e, &x) in blk[2..].iter().enumerate() {
            out[e] = f16::from_f32(scale * ((x & 0x0F) as i32 - 8) as f32);
            out[e + 16] = f16::from_f32(scale * ((x >> 4) as i32 - 8) as f32);
        }
    }
}

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
fn keys_q8(src: &[u8], hd: usize, dst: &mut [f16]) {
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
fn rows_q8(src: &[u8], hd: usize, dst: &mut [f16]) {
    for (blk, out) in src[..17 * hd].chunks_exact(Q8_BLOCK).zip(dst.chunks_exact_mut(32)) {
        let scale = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        for (o, &q) in out.iter_mut().zip(&blk[2..]) {
            *o = f16::from_f32(scale * q as i8 as f32);
        }
    }
}

/// x86: the sixteen bytes at `x` as two vectors of signed values: low nibbles − 8, high − 8.
///
/// # Safety
/// SSE2 (AVX2 implies it); 16 readable bytes at `x`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn nibbles_x86(x: *const u8) -> (std::arch::x86_64::__m128i, std::arch::x86_64::__m128i) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let x = _mm_loadu_si128(x as *const __m128i);
        let (m, eight) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(8));
        (_mm_sub_epi8(_mm_and_si128(x, m), eight), _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m), eight))
    }
}

/// x86 (AVX2, F16C): eight elements per step, `vcvtps2ph` rounding to nearest even.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{nibbles_x86 as nibbles, C, Q4_BLOCK, Q8_BLOCK};
    use half::f16;
    use std::arch::x86_64::*;

    /// Eight int8 at `q` times eight f32 scales, rounded to F16 at `out`.
    ///
    /// # Safety
    /// AVX2 and F16C; 8 readable bytes at `q`, 16 writable at `out`.
    #[inline(always)]
    unsafe fn eight(q: *const u8, scale: __m256, out: *mut f16) {
        // SAFETY: the caller's contract.
        unsafe { eight_of(_mm_loadl_epi64(q as *const __m128i), scale, out) }
    }

    /// The low eight int8 of `v` times eight f32 scales, rounded to F16 at `out`.
    ///
    /// # Safety
    /// AVX2 and F16C; 16 writable bytes at `out`.
    #[inline(always)]
    unsafe fn eight_of(v: __m128i, scale: __m256, out: *mut f16) {
        // SAFETY: the caller's contract.
        unsafe {
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(scale, v));
            _mm_storeu_si128(out as *mut __m128i, h);
        }
    }

    /// [`super::keys_q4`], the same bits.
    ///
    /// # Safety
    /// AVX2 and F16C; `src` holds `9·hd` bytes, `dst` `16·hd` F16; `hd` a multiple of 32.
    #[inline(always)]
    pub(crate) unsafe fn keys_q4(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; every offset stays inside the block and `dst`.
        unsafe {
            for b in 0..hd / 32 {
                let s = src.add(hd * C / 2 + b * C * 2);
                let (s0, s1) = (_mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i)), _mm256_cvtph_ps(_mm_loadu_si128(s.add(16) as *const __m128i)));
                for p in b * 16..b * 16 + 16 {
                    let (lo, hi) = nibbles(src.add(p * C));
                    let (d0, d1) = (dst.add(2 * p * C), dst.add((2 * p + 1) * C));
                    eight_of(lo, s0, d0);
                    eight_of(_mm_srli_si128::<8>(lo), s1, d0.add(8));
                    eight_of(hi, s0, d1);
                    eight_of(_mm_srli_si128::<8>(hi), s1, d1.add(8));
                }
            }
        }
    }

    /// [`super::rows_q4`], the same bits.
    ///
    /// # Safety
    /// As [`keys_q4`].
    #[inline(always)]
    pub(crate) unsafe fn rows_q4(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; 16 rows of hd / 32 blocks.
        unsafe {
            for b in 0..C * hd / 32 {
                let blk = src.add(b * Q4_BLOCK);
                let scale = _mm256_set1_ps(f16::from_le_bytes([*blk, *blk.add(1)]).to_f32());
                let (lo, hi) = nibbles(blk.add(2));
                let o = dst.add(b * 32);
                eight_of(lo, scale, o);
                eight_of(_mm_srli_si128::<8>(lo), scale, o.add(8));
                eight_of(hi, scale, o.add(16));
                eight_of(_mm_srli_si128::<8>(hi), scale, o.add(24));
            }
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

/// NEON: four elements per step, `fcvtn` rounding to nearest even.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{C, Q4_BLOCK, Q8_BLOCK};
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
        unsafe { eight_of(vld1_s8(q as *const i8), s0, s1, out) }
    }

    /// The sixteen bytes at `x` as two vectors of signed values: low nibbles − 8, high − 8.
    ///
    /// # Safety
    /// 16 readable bytes at `x`.
    #[inline(always)]
    unsafe fn nibbles(x: *const u8) -> (int8x16_t, int8x16_t) {
        // SAFETY: the caller's contract.
        unsafe {
            let x = vld1q_u8(x);
            let eight = vdupq_n_s8(8);
            (vsubq_s8(vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0F))), eight), vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(x)), eight))
        }
    }

    /// [`super::keys_q4`], the same bits.
    ///
    /// # Safety
    /// `src` holds `9·hd` bytes, `dst` `16·hd` F16; `hd` a multiple of 32.
    #[inline(always)]
    pub(crate) unsafe fn keys_q4(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; every offset stays inside the block and `dst`.
        unsafe {
            for b in 0..hd / 32 {
                let s = std::slice::from_raw_parts(src.add(hd * C / 2 + b * C * 2), C * 2);
                let sc: [float32x4_t; 4] = std::array::from_fn(|i| vld1q_f32(scales4(&s[8 * i..]).as_ptr()));
                for p in b * 16..b * 16 + 16 {
                    let (lo, hi) = nibbles(src.add(p * C));
                    let (d0, d1) = (dst.add(2 * p * C), dst.add((2 * p + 1) * C));
                    eight_of(vget_low_s8(lo), sc[0], sc[1], d0);
                    eight_of(vget_high_s8(lo), sc[2], sc[3], d0.add(8));
                    eight_of(vget_low_s8(hi), sc[0], sc[1], d1);
                    eight_of(vget_high_s8(hi), sc[2], sc[3], d1.add(8));
                }
            }
        }
    }

    /// [`super::rows_q4`], the same bits.
    ///
    /// # Safety
    /// As [`keys_q4`].
    #[inline(always)]
    pub(crate) unsafe fn rows_q4(src: *const u8, hd: usize, dst: *mut f16) {
        // SAFETY: the caller's contract; 16 rows of hd / 32 blocks.
        unsafe {
            for b in 0..C * hd / 32 {
                let blk = src.add(b * Q4_BLOCK);
                let scale = vdupq_n_f32(f16::from_le_bytes([*blk, *blk.add(1)]).to_f32());
                let (lo, hi) = nibbles(blk.add(2));
                let o = dst.add(b * 32);
                eight_of(vget_low_s8(lo), scale, scale, o);
                eight_of(vget_high_s8(lo), scale, scale, o.add(8));
                eight_of(vget_low_s8(hi), scale, scale, o.add(16));
                eight_of(vget_high_s8(hi), scale, scale, o.add(24));
            }
        }
    }

    /// The eight int8 of `v` times the scales `s0` (first four) and `s1`, rounded to F16 at
    /// `out`.
    ///
    /// # Safety
    /// 16 writable bytes at `out`.
    #[inline(always)]
    unsafe fn eight_of(v: int8x8_t, s0: float32x4_t, s1: float32x4_t, out: *mut f16) {
        // SAFETY: the caller's contract.
        unsafe {
            let w = vmovl_s8(v);
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
