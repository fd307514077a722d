//! AVX-512 (BW, VL, VNNI on 256-bit vectors) instances of dot products where the extra
//! instructions remove work, not just widen it. Same integer sums and the same float steps per
//! block as the AVX2 kernels, so the results are bit-identical (tests/parity/).
//!
//! Q5_0: the fifth bits become a mask register (`kmovd`) under which one masked add puts 16 into
//! the nibbles, and the signed product sum is `Σ (q + 16)·y − 16·Σ y`, two `vpdpbusd` on the
//! unsigned values, where AVX2 builds signed bytes (five instructions) and needs two `vpsignb`,
//! `maddubs` and `madd`. The identity is exact in integers and AVX2's 16-bit pair sums never
//! saturate here (|q| ≤ 16, |y| ≤ 127), so every lane holds the AVX2 kernel's value.
//!
//! Prefill tiles ([`tiles_offset`], Q5_0 and Q8_0 weights): four weight rows × four activation
//! rows per pass, the same identity with the offset term computed once per activation block
//! and the weight decode once per weight block, so one pair is one `vpdpbusd`, a convert, the
//! scale product and the FMA (2.4–2.6 cycles with hot caches, against 4.2–4.4 for AVX2's
//! one-weight-row, four-activation-row kernel).
#![allow(clippy::missing_safety_doc)]

use super::common::{head, heads4, load32};
use crate::quant::blocks::*;
use crate::simd::x86::{h2f, hsum_f32x8};
use crate::simd::{prefetch_lines, CacheLevel};
use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn dot_q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (as_blocks::<BlockQ5_0>(x), as_blocks::<BlockQ8_0>(y));
    let mut acc = _mm256_setzero_ps();
    let sixteen = _mm256_set1_epi8(16);
    for (a, b) in x.iter().zip(y) {
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        // SAFETY: this function's features include the ones `unsigned` needs.
        let u = unsafe { a.unsigned() };
        let qy = load32(&b.qs);
        let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, qy);
        let off = _mm256_dpbusd_epi32(_mm256_setzero_si256(), sixteen, qy);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, off)), acc);
    }
    hsum_f32x8(acc)
}

/// A weight block whose values, plus a fixed offset, are unsigned bytes: the form `vpdpbusd`
/// (u8 × i8) wants. `Σ q·y = Σ (q + off)·y − off·Σ y`, exact in integers.
pub trait OffsetBlock: Block {
    /// The offset, as the u8 that `vpdpbusd` multiplies each activation byte by.
    const OFFSET: u8;
    fn scale(&self) -> half::f16;
    /// The block's 32 values plus [`Self::OFFSET`], as unsigned bytes.
    ///
    /// # Safety
    /// The CPU has AVX2, AVX-512 F/BW/VL.
    unsafe fn unsigned(&self) -> __m256i;
}

impl OffsetBlock for BlockQ5_0 {
    const OFFSET: u8 = 16;
    fn scale(&self) -> half::f16 {
        self.d
    }
    /// The nibbles ([`nibble_halves`]), the fifth bits as a mask that selects 16, one
    /// `vpternlogd` for `(v & 0x0F) | hi`.
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    unsafe fn unsigned(&self) -> __m256i {
        let hi = _mm256_maskz_mov_epi8(u32::from_le_bytes(self.qh), _mm256_set1_epi8(16));
        _mm256_ternarylogic_epi32::<0xEA>(nibble_halves(&self.qs), _mm256_set1_epi8(0x0F), hi)
    }
}

impl OffsetBlock for BlockQ8_0 {
    const OFFSET: u8 = 128;
    fn scale(&self) -> half::f16 {
        self.d
    }
    /// `q + 128` is `q` with its sign bit flipped.
    #[inline]
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    unsafe fn unsigned(&self) -> __m256i {
        _mm256_xor_si256(load32(&self.qs), _mm256_set1_epi8(-128))
    }
}

/// `4·m` weight rows (`x`, rows `xrb` bytes apart) against four Q8_0 activation rows, four
/// weight rows per pass: `out[c][j]` equals bit for bit the AVX2 single-row dot of weight row
/// c and activation row j (each accumulator sees that kernel's integer sum per lane, computed
/// as `Σ (q + off)·y − off·Σ y`, and its float steps, block by block). Each weight block is
/// decoded once for four activation rows and each activation block's `off·Σ y` once for four
/// weight rows, so a pair costs one `vpdpbusd`, a convert, the scale product and the FMA.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_offset<B: OffsetBlock>(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    let nb = xrb / std::mem::size_of::<B>();
    let b = rows4::<BlockQ8_0>(y, nb);
    for (c, o) in out.chunks_exact_mut(4).enumerate() {
        let a = pass_rows::<B, 4>(x, xrb, c, nb);
        store_tile(&tile_offset(a, b), o);
    }
}

/// The sums of a pass's 4×4 accumulators: `out[r][j]` = all lanes of `acc[r][j]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn store_tile(acc: &[[__m256; 4]; 4], out: &mut [[f32; 4]]) {
    for r in 0..4 {
        for j in 0..4 {
            out[r][j] = hsum_f32x8(acc[r][j]);
        }
    }
}

/// Decode's GEMV for Q5_0 / Q8_0 weights: `out[c]` equals bit for bit the single-row dot of
/// weight row c (rows `xrb` bytes apart) with the activation row `y`. Four rows advance
/// together — four independent FMA chains where one row alone waits on its own (the float
/// order within a row is fixed) — sharing each activation block's load, offset term and scale.
/// Reading four rows block by block interleaves four streams, which the hardware prefetcher
/// does not follow (twice slower from DRAM), so the kernel prefetches the rows at least 8 KiB
/// ahead itself. A last group of fewer than four rows uses `single`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn rows_offset<B: OffsetBlock>(x: &[u8], xrb: usize, y: &[u8], out: &mut [f32], single: fn(&[u8], &[u8]) -> f32) {
    let bs = std::mem::size_of::<B>();
    let nb = xrb / bs;
    let b = &as_blocks::<BlockQ8_0>(y)[..nb];
    let off = _mm256_set1_epi8(B::OFFSET as i8);
    let ahead = prefetch_distance(xrb);
    let full = out.len() / 4 * 4;
    for (c, o) in out[..full].chunks_exact_mut(4).enumerate() {
        let a = pass_rows::<B, 4>(x, xrb, c, nb);
        let next = x.as_ptr().wrapping_add(4 * c * xrb + ahead);
        let mut acc = [_mm256_setzero_ps(); 4];
        for (i, blk) in b.iter().enumerate() {
            prefetch_step(next, 4 * i * bs);
            let qy = load32(&blk.qs);
            let dy = bcast_h(blk.d);
            let neg = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), off, qy));
            for r in 0..4 {
                // SAFETY: this function's features include the ones `unsigned` needs.
                let u = unsafe { a[r][i].unsigned() };
                let s = _mm256_dpbusd_epi32(neg, u, qy);
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(bcast_h(a[r][i].scale()), dy), _mm256_cvtepi32_ps(s), acc[r]);
            }
        }
        for (v, a) in o.iter_mut().zip(&acc) {
            *v = hsum_f32x8(*a);
        }
    }
    for (c, v) in out.iter_mut().enumerate().skip(full) {
        *v = single(&x[c * xrb..(c + 1) * xrb], y);
    }
}

/// How far ahead of a group of four rows (`xrb` bytes each) the GEMVs prefetch: whole groups,
/// at least 8 KiB.
#[inline(always)]
fn prefetch_distance(xrb: usize) -> usize {
    let group = 4 * xrb;
    group * 8192usize.div_ceil(group)
}

/// The two cache lines at `next + off`, into L1 (`simd::prefetch_lines`: the addresses are only
/// computed, never read).
#[inline(always)]
fn prefetch_step(next: *const u8, off: usize) {
    prefetch_lines(next.wrapping_add(off), 128, CacheLevel::L1);
}

/// [`rows_offset`] for Q4_1 weights (Q8_1 activations): `out[c]` equals bit for bit
/// `avx2::dot_q4_1_q8_1` of row c, whose `Σ m·s` runs in lanes 2r + 1 of one vector (lane pairs
/// [d·d_y, m·s] per row, as that kernel's one multiply per block).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn rows_q4_1(x: &[u8], xrb: usize, y: &[u8], out: &mut [f32]) {
    let bs = std::mem::size_of::<BlockQ4_1>();
    let nb = xrb / bs;
    let b = &as_blocks::<BlockQ8_1>(y)[..nb];
    let ahead = prefetch_distance(xrb);
    let full = out.len() / 4 * 4;
    let m4 = _mm256_set1_epi8(0x0F);
    for (c, o) in out[..full].chunks_exact_mut(4).enumerate() {
        let a = pass_rows::<BlockQ4_1, 4>(x, xrb, c, nb);
        let next = x.as_ptr().wrapping_add(4 * c * xrb + ahead);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut summs = _mm256_setzero_ps();
        for (i, blk) in b.iter().enumerate() {
            prefetch_step(next, 4 * i * bs);
            let qy = load32(&blk.qs);
            // [d_r·d_y, m_r·s_y] in lanes 2r, 2r + 1.
            let p = _mm256_mul_ps(heads4([&a[0][i], &a[1][i], &a[2][i], &a[3][i]]), _mm256_cvtph_ps(_mm_set1_epi32(head(blk))));
            summs = _mm256_add_ps(summs, p);
            for r in 0..4 {
                let d = _mm256_permutevar8x32_ps(p, _mm256_set1_epi32(2 * r as i32));
                let u = _mm256_and_si256(nibble_halves(&a[r][i].qs), m4);
                let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, qy);
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[r]);
            }
        }
        let mut sm = [0f32; 8];
        // SAFETY: 8 f32 of stack memory.
        unsafe { _mm256_storeu_ps(sm.as_mut_ptr(), summs) };
        for (r, (v, a)) in o.iter_mut().zip(&acc).enumerate() {
            *v = hsum_f32x8(*a) + sm[2 * r + 1];
        }
    }
    for (c, v) in out.iter_mut().enumerate().skip(full) {
        *v = super::avx2::dot_q4_1_q8_1(&x[c * xrb..(c + 1) * xrb], y);
    }
}

/// Four rows as slices of exactly `nb` blocks (so the kernels' loops carry no bounds checks).
#[inline(always)]
pub(super) fn rows4<B: Block>(y: [&[u8]; 4], nb: usize) -> [&[B]; 4] {
    [&as_blocks::<B>(y[0])[..nb], &as_blocks::<B>(y[1])[..nb], &as_blocks::<B>(y[2])[..nb], &as_blocks::<B>(y[3])[..nb]]
}

/// Weight rows `N·c .. N·(c + 1)` of `x` (rows `xrb` bytes apart) as slices of exactly `nb`
/// blocks: the rows of a tile kernel's pass `c`.
#[inline(always)]
pub(super) fn pass_rows<B: Block, const N: usize>(x: &[u8], xrb: usize, c: usize, nb: usize) -> [&[B]; N] {
    let w = &x[N * c * xrb..N * (c + 1) * xrb];
    let mut a: [&[B]; N] = [&[]; N];
    for (r, a) in a.iter_mut().enumerate() {
        *a = &as_blocks::<B>(&w[r * xrb..(r + 1) * xrb])[..nb];
    }
    a
}

/// The 16 bytes of a 4-bit block broadcast to both halves of a register, the upper half shifted
/// right by 4 (`vbroadcasti128` + `vpsrlvw`): the low nibbles of its bytes are values 0..16,
/// then 16..32; the high bits are still to be masked.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn nibble_halves(qs: &[u8; 16]) -> __m256i {
    // SAFETY: qs is 16 readable bytes; no alignment requirement.
    let raw = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) });
    _mm256_srlv_epi16(raw, _mm256_setr_epi64x(0, 0, 0x0004_0004_0004_0004, 0x0004_0004_0004_0004))
}

/// The 4×4 accumulators of [`tiles_offset`] (`acc[r][j]`: weight row r, activation row j).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_offset<B: OffsetBlock>(a: [&[B]; 4], b: [&[BlockQ8_0]; 4]) -> [[__m256; 4]; 4] {
    let mut acc = [[_mm256_setzero_ps(); 4]; 4];
    let off = _mm256_set1_epi8(B::OFFSET as i8);
    for i in 0..a[0].len() {
        let mut u = [_mm256_setzero_si256(); 4];
        let mut dw = [_mm256_setzero_ps(); 4];
        for r in 0..4 {
            // SAFETY: this function's features include the ones `unsigned` needs.
            u[r] = unsafe { a[r][i].unsigned() };
            dw[r] = bcast_h(a[r][i].scale());
        }
        tile_block(&u, &dw, b, i, off, &mut acc);
    }
    acc
}

/// One weight block of four rows (unsigned codes `u`, scales `dw`) against block `i` of the
/// four activation rows, into the 4×4 accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_block(u: &[__m256i; 4], dw: &[__m256; 4], b: [&[BlockQ8_0]; 4], i: usize, off: __m256i, acc: &mut [[__m256; 4]; 4]) {
    for j in 0..4 {
        let blk = &b[j][i];
        let qy = load32(&blk.qs);
        let dy = bcast_h(blk.d);
        let neg = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), off, qy));
        for r in 0..4 {
            let s = _mm256_dpbusd_epi32(neg, u[r], qy);
            acc[r][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dy), _mm256_cvtepi32_ps(s), acc[r][j]);
        }
    }
}

/// Bytes of one (four-row pass, block) group once packed by [`pack_offset`]: four rows' 32
/// unsigned codes, then their four f32 scales.
const PACKED_GROUP: usize = 4 * 32 + 4 * 4;

/// Bytes per weight row once packed by [`pack_offset`] (rows of `xrb` bytes): 36 per block.
pub fn packed_row_bytes<B: OffsetBlock>(xrb: usize) -> usize {
    xrb / std::mem::size_of::<B>() * PACKED_GROUP / 4
}

/// The weight rows of `x` (a multiple of four, `xrb` bytes apart) decoded once for
/// [`tiles_packed`]: per four-row pass and block, the codes plus [`OffsetBlock::OFFSET`] as
/// bytes (what [`tiles_offset`] decodes on every pass) and the scales as f32. A matmul packs a
/// run of weight rows once and runs every group of activation rows against it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn pack_offset<B: OffsetBlock>(x: &[u8], xrb: usize, out: &mut [u8]) {
    let nb = xrb / std::mem::size_of::<B>();
    let passes = x.len() / xrb / 4;
    assert!(out.len() >= passes * nb * PACKED_GROUP);
    for p in 0..passes {
        let a = pass_rows::<B, 4>(x, xrb, p, nb);
        for i in 0..nb {
            let g = &mut out[(p * nb + i) * PACKED_GROUP..(p * nb + i + 1) * PACKED_GROUP];
            for r in 0..4 {
                // SAFETY: this function's features include the ones `unsigned` needs; the store
                // writes bytes 32r..32r + 32 of the 144-byte group.
                unsafe { _mm256_storeu_si256(g.as_mut_ptr().add(32 * r) as *mut __m256i, a[r][i].unsigned()) };
                g[128 + 4 * r..132 + 4 * r].copy_from_slice(&h2f(a[r][i].scale()).to_le_bytes());
            }
        }
    }
}

/// [`tiles_offset`] on rows packed by [`pack_offset`] (`xrb`: the rows' original bytes):
/// the same values bit for bit, without decoding the weights again for every four
/// activation rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_packed<B: OffsetBlock>(packed: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    let nb = xrb / std::mem::size_of::<B>();
    let b = rows4::<BlockQ8_0>(y, nb);
    let off = _mm256_set1_epi8(B::OFFSET as i8);
    for (p, o) in out.chunks_exact_mut(4).enumerate() {
        let pk = &packed[p * nb * PACKED_GROUP..(p + 1) * nb * PACKED_GROUP];
        let mut acc = [[_mm256_setzero_ps(); 4]; 4];
        for (i, g) in pk.chunks_exact(PACKED_GROUP).enumerate() {
            let mut u = [_mm256_setzero_si256(); 4];
            let mut dw = [_mm256_setzero_ps(); 4];
            for r in 0..4 {
                // SAFETY: bytes 32r..32r + 32 and 128 + 4r..132 + 4r of the 144-byte group.
                unsafe {
                    u[r] = _mm256_loadu_si256(g.as_ptr().add(32 * r) as *const __m256i);
                    dw[r] = _mm256_set1_ps(std::ptr::read_unaligned(g.as_ptr().add(128 + 4 * r) as *const f32));
                }
            }
            tile_block(&u, &dw, b, i, off, &mut acc);
        }
        store_tile(&acc, o);
    }
}

/// The Q4_1 twin of [`tiles_offset`] (Q8_1 activations): nibbles are already unsigned, so a
/// pair's integer sum is one `vpdpbusd`; the `m·s` terms of the 16 pairs of a pass are
/// multiplied and accumulated two vectors at a time (lane = pair), each in the single-row
/// kernel's order.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_q4_1_q8_1(x: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    let nb = xrb / std::mem::size_of::<BlockQ4_1>();
    let b = rows4::<BlockQ8_1>(y, nb);
    for (c, o) in out.chunks_exact_mut(4).enumerate() {
        let a = pass_rows::<BlockQ4_1, 4>(x, xrb, c, nb);
        tile_q4_1(a, b, o.try_into().expect("chunks of four"));
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_q4_1(a: [&[BlockQ4_1]; 4], b: [&[BlockQ8_1]; 4], out: &mut [[f32; 4]; 4]) {
    let mut acc = [[_mm256_setzero_ps(); 4]; 4];
    // Lane 4(r % 2) + j of summs[r / 2]: Σ m_r·s_j.
    let mut summs = [_mm256_setzero_ps(); 2];
    for i in 0..a[0].len() {
        let mut u = [_mm256_setzero_si256(); 4];
        let mut dw = [_mm256_setzero_ps(); 4];
        for r in 0..4 {
            let blk = &a[r][i];
            u[r] = _mm256_and_si256(nibble_halves(&blk.qs), _mm256_set1_epi8(0x0F));
            dw[r] = bcast_h(blk.d);
        }
        let xm = heads4([&a[0][i], &a[1][i], &a[2][i], &a[3][i]]);
        q4_1_block(&u, &dw, xm, b, i, &mut acc, &mut summs);
    }
    q4_1_store(&acc, &summs, out);
}

/// One block of four Q4_1 rows (nibbles `u`, scales `dw`, `xm` = [d0, m0, …, d3, m3]) against
/// block `i` of the four activation rows: the `m·s` terms into `summs`, the pairs into `acc`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4_1_block(u: &[__m256i; 4], dw: &[__m256; 4], xm: __m256, b: [&[BlockQ8_1]; 4], i: usize, acc: &mut [[__m256; 4]; 4], summs: &mut [__m256; 2]) {
    // From [d0, m0, d1, m1, d2, m2, d3, m3]: m0 ×4, m1 ×4 / m2 ×4, m3 ×4; from the activations'
    // [d0, s0, d1, s1, ...]: s0, s1, s2, s3 twice.
    let (m01, m23) = (_mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3), _mm256_setr_epi32(5, 5, 5, 5, 7, 7, 7, 7));
    let s_idx = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    let ys = _mm256_permutevar8x32_ps(heads4([&b[0][i], &b[1][i], &b[2][i], &b[3][i]]), s_idx);
    summs[0] = _mm256_add_ps(summs[0], _mm256_mul_ps(_mm256_permutevar8x32_ps(xm, m01), ys));
    summs[1] = _mm256_add_ps(summs[1], _mm256_mul_ps(_mm256_permutevar8x32_ps(xm, m23), ys));
    for j in 0..4 {
        let blk = &b[j][i];
        let qy = load32(&blk.qs);
        let dy = bcast_h(blk.d);
        for r in 0..4 {
            let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u[r], qy);
            acc[r][j] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dy), _mm256_cvtepi32_ps(s), acc[r][j]);
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn q4_1_store(acc: &[[__m256; 4]; 4], summs: &[__m256; 2], out: &mut [[f32; 4]]) {
    let mut sm = [[0f32; 8]; 2];
    for h in 0..2 {
        // SAFETY: 8 f32 of stack memory.
        unsafe { _mm256_storeu_ps(sm[h].as_mut_ptr(), summs[h]) };
    }
    for r in 0..4 {
        for j in 0..4 {
            out[r][j] = hsum_f32x8(acc[r][j]) + sm[r / 2][4 * (r % 2) + j];
        }
    }
}

/// Bytes of one (four-row pass, block) once packed by [`pack_q4_1`]: four rows' 32 nibble
/// values as bytes, then [d0, m0, …, d3, m3] as f32.
const Q4_1_PACKED: usize = 4 * 32 + 8 * 4;

/// Bytes per weight row once packed by [`pack_q4_1`] (rows of `xrb` bytes): 40 per block.
pub fn packed_row_bytes_q4_1(xrb: usize) -> usize {
    xrb / std::mem::size_of::<BlockQ4_1>() * Q4_1_PACKED / 4
}

/// Q4_1 weight rows (a multiple of four) decoded once for [`tiles_q4_1_packed`]: the nibbles
/// as bytes and the scales and mins as f32, per four-row pass and block.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn pack_q4_1(x: &[u8], xrb: usize, out: &mut [u8]) {
    let nb = xrb / std::mem::size_of::<BlockQ4_1>();
    let passes = x.len() / xrb / 4;
    assert!(out.len() >= passes * nb * Q4_1_PACKED);
    for p in 0..passes {
        let a = pass_rows::<BlockQ4_1, 4>(x, xrb, p, nb);
        for i in 0..nb {
            let g = &mut out[(p * nb + i) * Q4_1_PACKED..(p * nb + i + 1) * Q4_1_PACKED];
            // SAFETY: four 32-byte stores at 32r and one at 128 inside the 160-byte group.
            unsafe {
                for r in 0..4 {
                    let u = _mm256_and_si256(nibble_halves(&a[r][i].qs), _mm256_set1_epi8(0x0F));
                    _mm256_storeu_si256(g.as_mut_ptr().add(32 * r) as *mut __m256i, u);
                }
                _mm256_storeu_ps(g.as_mut_ptr().add(128) as *mut f32, heads4([&a[0][i], &a[1][i], &a[2][i], &a[3][i]]));
            }
        }
    }
}

/// [`tiles_q4_1_q8_1`] on rows packed by [`pack_q4_1`] (`xrb`: the rows' original bytes): the
/// same values bit for bit.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn tiles_q4_1_packed(packed: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]]) {
    let nb = xrb / std::mem::size_of::<BlockQ4_1>();
    let b = rows4::<BlockQ8_1>(y, nb);
    for (p, o) in out.chunks_exact_mut(4).enumerate() {
        let pk = &packed[p * nb * Q4_1_PACKED..(p + 1) * nb * Q4_1_PACKED];
        let mut acc = [[_mm256_setzero_ps(); 4]; 4];
        let mut summs = [_mm256_setzero_ps(); 2];
        for (i, g) in pk.chunks_exact(Q4_1_PACKED).enumerate() {
            let mut u = [_mm256_setzero_si256(); 4];
            let mut dw = [_mm256_setzero_ps(); 4];
            // SAFETY: 32-byte loads at 32r and 128, and f32 reads at 128 + 8r, inside the
            // 160-byte group.
            let xm = unsafe {
                for r in 0..4 {
                    u[r] = _mm256_loadu_si256(g.as_ptr().add(32 * r) as *const __m256i);
                    dw[r] = _mm256_set1_ps(std::ptr::read_unaligned(g.as_ptr().add(128 + 8 * r) as *const f32));
                }
                _mm256_loadu_ps(g.as_ptr().add(128) as *const f32)
            };
            q4_1_block(&u, &dw, xm, b, i, &mut acc, &mut summs);
        }
        q4_1_store(&acc, &summs, o);
    }
}

/// An F16 scale converted and broadcast to eight lanes: `vpbroadcastw` from memory and one
/// `vcvtph2ps`, both writing whole registers (no false dependency, unlike a one-lane insert).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn bcast_h(h: half::f16) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(h.to_bits() as i16))
}


