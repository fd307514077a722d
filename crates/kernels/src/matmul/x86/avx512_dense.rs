//! AVX-512 dots of the dense float weight types (F32, F16, BF16) in the orders llama.cpp uses
//! on a CPU with AVX-512, so that F16/BF16 models give its logits bit for bit:
//!
//! - [`dot_f32_ggml`]: `ggml_vec_dot_f32` (decode's GEMV and matmuls whose `k` is not a
//!   multiple of 16: a LoRA adapter's `B`);
//! - [`dot_bf16`]: `ggml_vec_dot_bf16`'s `__AVX512BF16__` path (decode's GEMV and any matmul
//!   of one row): two `vdpbf16ps` accumulators per 64 values, each reduced into an f64 sum,
//!   the tail in f64;
//! - [`batch_bf16`], [`batch_f16`], [`batch_f32`]: llamafile's `tinyBLAS`, which ggml runs for
//!   matmuls of two or more activation rows when `k` is a multiple of the step (32 for BF16,
//!   16 otherwise) and the matrix has a multiple of 4 rows: one 16-lane accumulator per output
//!   (`vdpbf16ps`, or an FMA of the values widened to f32), reduced as `_mm512_reduce_add_ps`.
//!
//! `_mm512_reduce_add_ps` (GCC, which built the reference llama.cpp) adds the 256-bit halves,
//! then the 128-bit halves, then `[0] + [2]`, `[1] + [3]`, then those two: [`reduce`].
//! Portable twins: `matmul::portable::{dot_bf16_dp_order, batch_order}`.
#![allow(clippy::missing_safety_doc)]

use crate::matmul::portable::bf16_tail;
use crate::quant::blocks::as_blocks;
use crate::simd::x86::hsum_f32x8;
use crate::simd::{prefetch_lines, CacheLevel};
use std::arch::x86_64::*;

/// `_mm512_reduce_add_ps` as GCC computes it.
#[inline(always)]
unsafe fn reduce(c: __m512) -> f32 {
    // SAFETY: the caller's AVX-512 F.
    unsafe {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(c)));
        hsum_f32x8(_mm256_add_ps(hi, _mm512_castps512_ps256(c)))
    }
}

/// F32·F32 in ggml's AVX-512 `ggml_vec_dot_f32` order (twin: `matmul::portable::dot_f32_ggml`):
/// four 16-lane FMA accumulators over 64-value steps, folded 0+2, 1+3, 0+1, reduced as
/// GCC's `_mm512_reduce_add_ps`, the tail one fused multiply-add per value.
#[target_feature(enable = "avx2,fma,avx512f")]
pub fn dot_f32_ggml(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<f32>(x), as_blocks::<f32>(y));
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 64 <= np <= n for both slices.
            let (u, v) = unsafe { (_mm512_loadu_ps(x.as_ptr().add(i + 16 * j)), _mm512_loadu_ps(y.as_ptr().add(i + 16 * j))) };
            *a = _mm512_fmadd_ps(u, v, *a);
        }
        i += 64;
    }
    let lo = _mm512_add_ps(acc[0], acc[2]);
    let hi = _mm512_add_ps(acc[1], acc[3]);
    // SAFETY: features enabled above.
    let mut sum = unsafe { reduce(_mm512_add_ps(lo, hi)) };
    for k in np..n {
        sum = x[k].mul_add(y[k], sum);
    }
    sum
}

/// `r[i]` row `i` of a 16×16 block in, `r[j]` column `j` out: pairs of rows interleaved
/// (`unpack`), then quadruples (`shuffle_ps`), then the 128-bit quarters (`shuffle_f32x4`).
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: &mut [__m512; 16]) {
    // t[2g], t[2g + 1]: rows 2g, 2g + 1 interleaved, columns {0,1} and {2,3} of each quarter.
    let mut t = [_mm512_setzero_ps(); 16];
    for g in 0..8 {
        t[2 * g] = _mm512_unpacklo_ps(r[2 * g], r[2 * g + 1]);
        t[2 * g + 1] = _mm512_unpackhi_ps(r[2 * g], r[2 * g + 1]);
    }
    // u[4g + c]: rows 4g..4g + 4 at column c of each quarter (quarter q: column c + 4q).
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        for h in 0..2 {
            let (a, b) = (t[4 * g + h], t[4 * g + 2 + h]);
            u[4 * g + 2 * h] = _mm512_shuffle_ps::<0x44>(a, b);
            u[4 * g + 2 * h + 1] = _mm512_shuffle_ps::<0xEE>(a, b);
        }
    }
    for c in 0..4 {
        let (v0, w0) = (_mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]), _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]));
        let (v1, w1) = (_mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]), _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]));
        r[c] = _mm512_shuffle_f32x4::<0x88>(v0, w0);
        r[c + 8] = _mm512_shuffle_f32x4::<0xDD>(v0, w0);
        r[c + 4] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
        r[c + 12] = _mm512_shuffle_f32x4::<0xDD>(v1, w1);
    }
}

/// Decode's GEMV of F32 rows of `xrb` bytes in [`dot_f32_ggml`]'s order, `out[c]` row `c`'s.
/// Rows of under 64 values (a LoRA adapter's `B`, whose rows are its rank) are all tail there:
/// one chain of fused multiply-adds from zero per row, latency-bound alone, so sixteen rows run
/// their chains side by side in the lanes of one vector, sixteen values of each row loaded and
/// transposed at a time (the same operations, lane for lane). Longer rows take one dot each.
#[target_feature(enable = "avx2,fma,avx512f")]
pub fn rows_f32_ggml(x: &[u8], xrb: usize, y: &[u8], out: &mut [f32]) {
    let k = xrb / 4;
    let mut c = 0;
    if k < 64 {
        let (w, y) = (as_blocks::<f32>(&x[..out.len() * xrb]), as_blocks::<f32>(y));
        while c + 16 <= out.len() {
            let mut acc = _mm512_setzero_ps();
            for j0 in (0..k).step_by(16) {
                let m = (k - j0).min(16);
                let mut r = [_mm512_setzero_ps(); 16];
                for (l, rl) in r.iter_mut().enumerate() {
                    // SAFETY: values j0..j0 + m of row c + l lie in `w` (out.len() rows of k);
                    // the masked-off lanes are not read.
                    *rl = unsafe { _mm512_maskz_loadu_ps(((1u32 << m) - 1) as u16, w.as_ptr().add((c + l) * k + j0)) };
                }
                transpose16(&mut r);
                for (j, rj) in r[..m].iter().enumerate() {
                    acc = _mm512_fmadd_ps(*rj, _mm512_set1_ps(y[j0 + j]), acc);
                }
            }
            // SAFETY: out has c + 16 elements.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(c), acc) };
            c += 16;
        }
    }
    for (r, o) in out.iter_mut().enumerate().skip(c) {
        *o = dot_f32_ggml(&x[r * xrb..(r + 1) * xrb], y);
    }
}

/// 32 BF16 values at `p`.
#[inline(always)]
unsafe fn load_bf16(p: *const u16) -> __m512bh {
    // SAFETY: the caller passes 32 readable u16; __m512i and __m512bh are both 64 bytes of plain
    // bits.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p as *const _)) }
}

/// BF16·BF16 in ggml's `__AVX512BF16__` `ggml_vec_dot_bf16` order.
#[target_feature(enable = "avx2,avx512f,avx512bf16")]
pub fn dot_bf16(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<u16>(x), as_blocks::<u16>(y));
    let n = x.len().min(y.len());
    let (mut c1, mut c2) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: i + 64 <= n for both slices.
        unsafe {
            c1 = _mm512_dpbf16_ps(c1, load_bf16(x.as_ptr().add(i)), load_bf16(y.as_ptr().add(i)));
            c2 = _mm512_dpbf16_ps(c2, load_bf16(x.as_ptr().add(i + 32)), load_bf16(y.as_ptr().add(i + 32)));
        }
        i += 64;
    }
    // SAFETY: features enabled above.
    let sumf = unsafe { reduce(c1) as f64 + reduce(c2) as f64 };
    bf16_tail(sumf, &x[i..n], &y[i..n])
}

/// tinyBLAS's BF16 value: one `vdpbf16ps` accumulator over steps of 32 (`k` a multiple of 32).
#[target_feature(enable = "avx2,avx512f,avx512bf16")]
pub fn batch_bf16(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<u16>(x), as_blocks::<u16>(y));
    let n = x.len().min(y.len());
    assert!(n % 32 == 0, "tinyBLAS BF16 needs k % 32 == 0");
    let mut c = _mm512_setzero_ps();
    for i in (0..n).step_by(32) {
        // SAFETY: i + 32 <= n for both slices.
        c = unsafe { _mm512_dpbf16_ps(c, load_bf16(x.as_ptr().add(i)), load_bf16(y.as_ptr().add(i))) };
    }
    // SAFETY: features enabled above.
    unsafe { reduce(c) }
}

/// tinyBLAS's F16 value: one FMA accumulator of values widened to f32, steps of 16.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub fn batch_f16(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<u16>(x), as_blocks::<u16>(y));
    let n = x.len().min(y.len());
    assert!(n % 16 == 0, "tinyBLAS F16 needs k % 16 == 0");
    let mut c = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n for both slices.
        let (a, b) = unsafe { (load_ph(x.as_ptr().add(i) as *const u8), load_ph(y.as_ptr().add(i) as *const u8)) };
        c = _mm512_fmadd_ps(a, b, c);
    }
    // SAFETY: features enabled above.
    unsafe { reduce(c) }
}

/// tinyBLAS's F32 value: one FMA accumulator, steps of 16.
#[target_feature(enable = "avx2,fma,avx512f")]
pub fn batch_f32(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<f32>(x), as_blocks::<f32>(y));
    let n = x.len().min(y.len());
    assert!(n % 16 == 0, "tinyBLAS F32 needs k % 16 == 0");
    let mut c = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n for both slices.
        let (a, b) = unsafe { (_mm512_loadu_ps(x.as_ptr().add(i)), _mm512_loadu_ps(y.as_ptr().add(i))) };
        c = _mm512_fmadd_ps(a, b, c);
    }
    // SAFETY: features enabled above.
    unsafe { reduce(c) }
}

/// A dense type's tinyBLAS step: `STEP` values per vector, the bytes a step of weight (`A`)
/// and activation (`B`) rows takes, their loads, and the multiply-add.
trait Dense {
    type V: Copy;
    const A_STEP: usize;
    const B_STEP: usize;
    /// # Safety
    /// `A_STEP` readable bytes at `p`; the type's features present.
    unsafe fn load_a(p: *const u8) -> Self::V;
    /// # Safety
    /// `B_STEP` readable bytes at `p`; the type's features present.
    unsafe fn load_b(p: *const u8) -> Self::V;
    /// # Safety
    /// The type's features present.
    unsafe fn madd(a: Self::V, b: Self::V, c: __m512) -> __m512;
}

struct F32;
struct F16;
struct Bf16;

#[inline(always)]
unsafe fn load_ph(p: *const u8) -> __m512 {
    // SAFETY: the caller's contract (32 readable bytes, AVX-512 F).
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

impl Dense for F32 {
    type V = __m512;
    const A_STEP: usize = 64;
    const B_STEP: usize = 64;
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p as *const f32) }
    }
    #[inline(always)]
    unsafe fn load_b(p: *const u8) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p as *const f32) }
    }
    #[inline(always)]
    unsafe fn madd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
}

impl Dense for F16 {
    type V = __m512;
    const A_STEP: usize = 32;
    const B_STEP: usize = 32;
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { load_ph(p) }
    }
    #[inline(always)]
    unsafe fn load_b(p: *const u8) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { load_ph(p) }
    }
    #[inline(always)]
    unsafe fn madd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
}

impl Dense for Bf16 {
    type V = __m512bh;
    const A_STEP: usize = 64;
    const B_STEP: usize = 64;
    #[inline(always)]
    unsafe fn load_a(p: *const u8) -> __m512bh {
        // SAFETY: the caller's contract.
        unsafe { load_bf16(p as *const u16) }
    }
    #[inline(always)]
    unsafe fn load_b(p: *const u8) -> __m512bh {
        // SAFETY: the caller's contract.
        unsafe { load_bf16(p as *const u16) }
    }
    #[inline(always)]
    unsafe fn madd(a: __m512bh, b: __m512bh, c: __m512) -> __m512 {
        _mm512_dpbf16_ps(c, a, b)
    }
}

/// tinyBLAS's register tile: `out.len()` weight rows (a multiple of four, `arb` bytes apart) ×
/// `J` activation rows (`brb` bytes used of each; four, or fewer for a batch's last rows), one
/// accumulator per output, each weight and activation vector loaded once per step for the
/// tile's `4·J` multiply-adds. `out[c][j]` (`j < J`) equals the type's batch dot of row c and
/// `y[j]` bit for bit.
///
/// # Safety
/// The type's features present.
#[inline(always)]
unsafe fn tiles_body<D: Dense, const J: usize>(x: &[u8], arb: usize, y: [&[u8]; J], brb: usize, out: &mut [[f32; 4]]) {
    let steps = brb / D::B_STEP;
    assert!(brb.is_multiple_of(D::B_STEP) && arb >= steps * D::A_STEP && out.len().is_multiple_of(4) && x.len() >= out.len() * arb && y.iter().all(|y| y.len() >= brb));
    for (g, o) in out.chunks_exact_mut(4).enumerate() {
        let base = x.as_ptr().wrapping_add(4 * g * arb);
        let mut acc = [[_mm512_setzero_ps(); J]; 4];
        for s in 0..steps {
            // The group after next asked for in address order, four lines a line-step: four
            // rows read side by side are streams the hardware prefetcher follows too late
            // (one to three activation rows on a 56 MB F16 matrix, one core: 8 GB/s without,
            // 15–21 with; the rows' own dot 19).
            if (s * D::A_STEP).is_multiple_of(64) {
                let line = s * D::A_STEP / 64;
                prefetch_lines(base.wrapping_add(8 * arb + 4 * 64 * line), 4 * 64, CacheLevel::L1);
            }
            // SAFETY: step s is inside the four weight rows of this group and the activation
            // rows (asserted above); the caller's features.
            unsafe {
                let b: [D::V; J] = std::array::from_fn(|j| D::load_b(y[j].as_ptr().add(s * D::B_STEP)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = D::load_a(base.add(r * arb + s * D::A_STEP));
                    for j in 0..J {
                        acc[j] = D::madd(a, b[j], acc[j]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for j in 0..J {
                // SAFETY: the caller's AVX-512 F.
                o[r][j] = unsafe { reduce(acc[j]) };
            }
        }
    }
}

/// [`tiles_body`] for one to three activation rows (`y.len()`).
///
/// # Safety
/// The type's features present.
#[inline(always)]
unsafe fn few_body<D: Dense>(x: &[u8], xrb: usize, y: &[&[u8]], brb: usize, out: &mut [[f32; 4]]) {
    // SAFETY: the caller's features.
    unsafe {
        match *y {
            [a] => tiles_body::<D, 1>(x, xrb, [a], brb, out),
            [a, b] => tiles_body::<D, 2>(x, xrb, [a, b], brb, out),
            [a, b, c] => tiles_body::<D, 3>(x, xrb, [a, b, c], brb, out),
            _ => panic!("one to three activation rows, got {}", y.len()),
        }
    }
}

/// [`tiles_f32`] for one to three activation rows (`out[c][..y.len()]`).
#[target_feature(enable = "avx2,fma,avx512f")]
pub fn few_f32(x: &[u8], xrb: usize, y: &[&[u8]], out: &mut [[f32; 4]]) {
    // SAFETY: features enabled above.
    unsafe { few_body::<F32>(x, xrb, y, xrb, out) }
}

/// [`tiles_f16`] for one to three activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub fn few_f16(x: &[u8], xrb: usize, y: &[&[u8]], out: &mut [[f32; 4]]) {
    // SAFETY: features enabled above.
    unsafe { few_body::<F16>(x, xrb, y, xrb, out) }
}

/// [`tiles_bf16`] for one to three activation rows.
#[target_feature(enable = "avx2,avx512f,avx512bf16")]
pub fn few_bf16(x: &[u8], xrb: usize, y: &[&[u8]], out: &mut [[f32; 4]]) {
    // SAFETY: features enabled above.
    unsafe { few_body::<Bf16>(x, xrb, y, xrb, out) }
}

/// [`batch_f32`]'s values for four weight rows × four activation rows at a time.
#[target_feature(enable = "avx2,fma,avx512f")]
pub fn tiles_f32(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    // SAFETY: features enabled above.
    unsafe { tiles_body::<F32, 4>(x, xrb, y, xrb, out) }
}

/// [`batch_f16`]'s values for four weight rows × four activation rows at a time.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub fn tiles_f16(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    // SAFETY: features enabled above.
    unsafe { tiles_body::<F16, 4>(x, xrb, y, xrb, out) }
}

/// [`batch_bf16`]'s values for four weight rows × four activation rows at a time.
#[target_feature(enable = "avx2,avx512f,avx512bf16")]
pub fn tiles_bf16(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    // SAFETY: features enabled above.
    unsafe { tiles_body::<Bf16, 4>(x, xrb, y, xrb, out) }
}

/// F16 values widened to f32 (exact), 16 at a time; `out.len()` values.
#[target_feature(enable = "avx2,f16c,avx512f")]
pub fn widen_f16(x: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(x.len() >= 2 * n);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 32 bytes at 2i and 16 f32 at i are in bounds (asserted, loop bound).
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(i), load_ph(x.as_ptr().add(2 * i))) };
        i += 16;
    }
    for j in i..n {
        out[j] = half::f16::from_le_bytes([x[2 * j], x[2 * j + 1]]).to_f32();
    }
}
