//! NEON kernels on interleaved weights (`matmul::layout`): decode's GEMV ([`rows`]) and
//! prefill's tiles ([`tiles`], [`tiles8`]) for every type with that layout, `sdot` where the CPU
//! has the dot-product extension ([`Sdot`]), widening multiplies elsewhere ([`Widen`]).
//!
//! Values: each row's float steps are those of the plain NEON dot (`neon`, the x86 lane order),
//! so every result equals the plain row's `vec_dot` (tiles: `vec_dot_tile`) bit for bit.
//!
//! 32-value types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): a group-block holds the four rows'
//! 16-byte quant runs side by side and their four F16 scales in 8 bytes (with a min: 16), so
//! one sequential stream feeds four rows, one `fcvtl` widens their scales, and one product gives
//! the four `d_r·d_y` (and `m_r·s_y`). The GEMV keeps the four rows' eight accumulators and
//! loads each activation block once for them; the tiles keep a row pair against four activation
//! rows (sixteen accumulators of the 32 registers), so each weight block is decoded once for
//! four activation rows, and eight activation rows are two passes over a group still in L1.
//! `d_y` and `s_y` are widened once per call (`prep`), not once per group.
//!
//! Super-block types (Q4_K, Q6_K, IQ4_XS): one group against one Q8_K row is `neon_il_k`'s
//! (Q4_K's four rows side by side; Q6_K's and IQ4_XS's rows on the plain body with their
//! scales decoded together); the tiles run the group against each activation row while it is
//! in L1.
#![allow(clippy::missing_safety_doc)]

use super::neon::{block_loaded, hsum8, kind, nibbles, signed, Dot4, Sdot, Widen};
use super::neon_il_k::group_k;
use crate::matmul::layout::ROWS;
use crate::quant::blocks::*;
use crate::simd::aarch64::{load_f16x4, load_f16x8};
use std::arch::aarch64::*;

/// Plain block bytes of kind `K` (a group-block is four of them).
const fn block_bytes(k: u8) -> usize {
    use std::mem::size_of;
    match k {
        kind::Q4_0 => size_of::<BlockQ4_0>(),
        kind::IQ4_NL => size_of::<BlockIQ4NL>(),
        kind::Q4_1 => size_of::<BlockQ4_1>(),
        kind::Q5_0 => size_of::<BlockQ5_0>(),
        kind::Q5_1 => size_of::<BlockQ5_1>(),
        kind::Q8_0 => size_of::<BlockQ8_0>(),
        kind::Q4_K | kind::Q4_K_TILE => size_of::<BlockQ4K>(),
        kind::IQ4_XS => size_of::<BlockIQ4XS>(),
        _ => size_of::<BlockQ6K>(),
    }
}

/// Q8_1 activations and a `Σ m·s` term (Q4_1, Q5_1); otherwise Q8_0 (32-value types).
const fn has_min(k: u8) -> bool {
    matches!(k, kind::Q4_1 | kind::Q5_1)
}

/// Super-block types (Q8_K activations).
const fn super_block(k: u8) -> bool {
    matches!(k, kind::Q4_K | kind::Q4_K_TILE | kind::Q6_K | kind::IQ4_XS)
}

/// Bytes of an activation block of a 32-value type, and where its 32 quants start.
const fn act_block(k: u8) -> (usize, usize) {
    if has_min(k) {
        (std::mem::size_of::<BlockQ8_1>(), 4)
    } else {
        (std::mem::size_of::<BlockQ8_0>(), 2)
    }
}

/// Widen each activation block's `d_y` (and Q8_1's `s_y`) once: `prep[2i]`, `prep[2i + 1]`
/// (f32 bits) for block i of `y`.
fn prepare<const K: u8>(y: &[u8], nb: usize, prep: &mut [i32]) {
    let (abs, _) = act_block(K);
    assert!(y.len() >= nb * abs && prep.len() >= 2 * nb);
    for (i, p) in prep[..2 * nb].chunks_exact_mut(2).enumerate() {
        let f = |at: usize| half::f16::from_le_bytes([y[i * abs + at], y[i * abs + at + 1]]).to_f32().to_bits() as i32;
        p[0] = f(0);
        p[1] = if has_min(K) { f(2) } else { 0 };
    }
}

/// The scales of a 32-value group-block's four rows: `(d, m)` (m zero without a min).
///
/// # Safety
/// A whole group-block at `gb`.
#[inline(always)]
unsafe fn heads<const K: u8>(gb: *const u8) -> (float32x4_t, float32x4_t) {
    // SAFETY (caller): the group-block starts with 8 (with a min: 16) bytes of F16 scales,
    // 2-byte aligned as every block is.
    unsafe {
        if has_min(K) {
            let [a, b] = load_f16x8(gb as *const half::f16);
            (vuzp1q_f32(a, b), vuzp2q_f32(a, b))
        } else {
            (load_f16x4(gb as *const half::f16), vdupq_n_f32(0.0))
        }
    }
}

/// Row `r`'s 32 values of a 32-value group-block as the signed bytes the plain dot multiplies:
/// (values 0‥16, values 16‥32).
///
/// # Safety
/// A whole group-block at `gb`; `r < 4`.
#[inline(always)]
unsafe fn values<const K: u8>(gb: *const u8, r: usize, table: int8x16_t) -> (int8x16_t, int8x16_t) {
    // SAFETY (caller): every offset below lies inside the group-block (`matmul::layout`).
    unsafe {
        let run = |at: usize| &*(gb.add(at + 16 * r) as *const [u8; 16]);
        match K {
            kind::Q4_0 => signed(nibbles(run(8)), 8),
            kind::Q4_1 => signed(nibbles(run(16)), 0),
            kind::IQ4_NL => {
                let (lo, hi) = nibbles(run(8));
                (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi))
            }
            kind::Q8_0 => (vld1q_s8(gb.add(8 + 16 * r) as *const i8), vld1q_s8(gb.add(72 + 16 * r) as *const i8)),
            _ => {
                // Q5_0 / Q5_1 in the `Folded` form (`matmul::layout`): byte j of the row's run
                // holds value j whole and value 16 + j's bits 0‥2 at 5‥7; bits 2r, 2r + 1 of
                // byte j of the 16 shared bytes after the scales are its bits 3 and 4.
                let bits = if K == kind::Q5_1 { 16 } else { 8 };
                let w = vld1q_u8(gb.add(bits));
                let a = vld1q_u8(run(bits + 16).as_ptr());
                let top = vandq_u8(vshlq_u8(w, vdupq_n_s8(3 - 2 * r as i8)), vdupq_n_u8(0x18));
                signed((vandq_u8(a, vdupq_n_u8(0x1F)), vorrq_u8(vshrq_n_u8::<5>(a), top)), if K == kind::Q5_0 { 16 } else { 0 })
            }
        }
    }
}

/// Rows `r0 .. r0 + R` of the 32-value group at `g` (`nb` group-blocks) against `J` activation
/// rows (`prep[j]`: their widened scales): `out[e][j]` for row `r0 + e`.
///
/// # Safety
/// NEON (and what `D` names) present; a whole group at `g`; `J` activation rows of `nb` blocks
/// and their `2·nb` prepared values.
#[inline(always)]
unsafe fn group<D: Dot4, const K: u8, const R: usize, const J: usize>(g: *const u8, nb: usize, y: [*const u8; J], prep: [*const f32; J], r0: usize) -> [[f32; J]; R] {
    let (abs, q) = act_block(K);
    let gbs = ROWS * block_bytes(K);
    // SAFETY: the caller's contract; every pointer below stays in the group, a row or `prep`.
    unsafe {
        let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        let mut acc = [[[vdupq_n_f32(0.0); 2]; R]; J];
        // Lane r: row r's Σ m·s against activation row j (with a min).
        let mut summs = [vdupq_n_f32(0.0); J];
        for i in 0..nb {
            let gb = g.add(i * gbs);
            let (d4, m4) = heads::<K>(gb);
            let u: [(int8x16_t, int8x16_t); R] = std::array::from_fn(|e| values::<K>(gb, r0 + e, table));
            for j in 0..J {
                let yb = y[j].add(i * abs + q) as *const i8;
                let yv = (vld1q_s8(yb), vld1q_s8(yb.add(16)));
                if has_min(K) {
                    // The plain dot's `summs += m·s` (a product, then a sum), four rows at once.
                    summs[j] = vaddq_f32(summs[j], vmulq_n_f32(m4, *prep[j].add(2 * i + 1)));
                }
                // The four rows' `d_r·d_y`.
                let mut dd = [0f32; 4];
                vst1q_f32(dd.as_mut_ptr(), vmulq_n_f32(d4, *prep[j].add(2 * i)));
                for e in 0..R {
                    block_loaded::<D>(&mut acc[j][e], dd[r0 + e], u[e], yv);
                }
            }
        }
        let mut out = [[0f32; J]; R];
        for j in 0..J {
            let mut ms = [0f32; 4];
            vst1q_f32(ms.as_mut_ptr(), summs[j]);
            for e in 0..R {
                let v = hsum8(acc[j][e]);
                out[e][j] = if has_min(K) { v + ms[r0 + e] } else { v };
            }
        }
        out
    }
}

/// Decode's GEMV: `out[c]` = the plain `vec_dot` of weight row c (`g`: the groups of
/// `out.len()` rows, a multiple of four, plain rows `xrb` bytes) with activation row `y`.
///
/// # Safety
/// NEON (and what `D` names) present.
#[inline(always)]
unsafe fn rows_with<D: Dot4, const K: u8>(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    let nb = xrb / block_bytes(K);
    assert!(out.len() % ROWS == 0 && g.len() >= out.len() * xrb);
    if super_block(K) {
        let y = &as_blocks::<BlockQ8K>(y)[..nb];
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            // SAFETY: the caller's features; the group lies inside `g` (asserted).
            o.copy_from_slice(&unsafe { group_k::<D, K>(g.as_ptr().add(c * ROWS * xrb), nb, y) });
        }
        return;
    }
    prepare::<K>(y, nb, prep);
    for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
        // SAFETY: the caller's features; the group lies inside `g` (asserted), `prepare`
        // checked `y` and `prep`.
        let v = unsafe { group::<D, K, 4, 1>(g.as_ptr().add(c * ROWS * xrb), nb, [y.as_ptr()], [prep.as_ptr() as *const f32], 0) };
        for r in 0..ROWS {
            o[r] = v[r][0];
        }
    }
}

/// Prefill's tiles: `out[c][j]` = the plain `vec_dot_tile` of weight row c with activation row
/// `y[j]`, `J` (4 or 8) at a time.
///
/// # Safety
/// NEON (and what `D` names) present.
#[inline(always)]
unsafe fn tiles_with<D: Dot4, const K: u8, const J: usize>(g: &[u8], xrb: usize, y: [&[u8]; J], out: &mut [[f32; J]], prep: &mut [i32]) {
    let nb = xrb / block_bytes(K);
    assert!(out.len() % ROWS == 0 && g.len() >= out.len() * xrb);
    if super_block(K) {
        let ys = y.map(|y| &as_blocks::<BlockQ8K>(y)[..nb]);
        for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
            for (j, y) in ys.iter().enumerate() {
                // SAFETY: the caller's features; the group lies inside `g` (asserted).
                let v = unsafe { group_k::<D, K>(g.as_ptr().add(c * ROWS * xrb), nb, y) };
                for r in 0..ROWS {
                    o[r][j] = v[r];
                }
            }
        }
        return;
    }
    assert!(prep.len() >= 2 * nb * J);
    for (j, y) in y.iter().enumerate() {
        prepare::<K>(y, nb, &mut prep[2 * nb * j..2 * nb * (j + 1)]);
    }
    for (c, o) in out.chunks_exact_mut(ROWS).enumerate() {
        // SAFETY: the group lies inside `g` (asserted).
        let gp = unsafe { g.as_ptr().add(c * ROWS * xrb) };
        // Four activation rows per pass, a row pair at a time (sixteen accumulators).
        for pass in 0..J / 4 {
            let yp: [*const u8; 4] = std::array::from_fn(|j| y[4 * pass + j].as_ptr());
            let pp: [*const f32; 4] = std::array::from_fn(|j| prep[2 * nb * (4 * pass + j)..].as_ptr() as *const f32);
            for r0 in [0, 2] {
                // SAFETY: the caller's features; the group lies inside `g` (asserted), the rows
                // and `prep` were checked by `prepare`.
                let v = unsafe { group::<D, K, 2, 4>(gp, nb, yp, pp, r0) };
                for e in 0..2 {
                    o[r0 + e][4 * pass..4 * pass + 4].copy_from_slice(&v[e]);
                }
            }
        }
    }
}

/// The `Isa::Neon` table's GEMV (NEON is part of every aarch64 target).
pub fn rows<const K: u8>(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    // SAFETY: NEON is a baseline feature of aarch64.
    unsafe { rows_with::<Widen, K>(g, xrb, y, out, prep) }
}

/// The `Isa::Neon` table's tiles of four activation rows.
pub fn tiles<const K: u8>(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], prep: &mut [i32]) {
    // SAFETY: NEON is a baseline feature of aarch64.
    unsafe { tiles_with::<Widen, K, 4>(g, xrb, y, out, prep) }
}

/// The `Isa::Neon` table's tiles of eight activation rows.
pub fn tiles8<const K: u8>(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: NEON is a baseline feature of aarch64.
    unsafe { tiles_with::<Widen, K, 8>(g, xrb, y, out, prep) }
}

/// The `Isa::Dotprod` table's GEMV.
#[target_feature(enable = "dotprod")]
pub fn rows_dotprod<const K: u8>(g: &[u8], xrb: usize, y: &[u8], out: &mut [f32], prep: &mut [i32]) {
    // SAFETY: NEON is baseline; `dotprod` enabled above.
    unsafe { rows_with::<Sdot, K>(g, xrb, y, out, prep) }
}

/// The `Isa::Dotprod` table's tiles of four activation rows.
#[target_feature(enable = "dotprod")]
pub fn tiles_dotprod<const K: u8>(g: &[u8], xrb: usize, y: [&[u8]; 4], out: &mut [[f32; 4]], prep: &mut [i32]) {
    // SAFETY: NEON is baseline; `dotprod` enabled above.
    unsafe { tiles_with::<Sdot, K, 4>(g, xrb, y, out, prep) }
}

/// The `Isa::Dotprod` table's tiles of eight activation rows.
#[target_feature(enable = "dotprod")]
pub fn tiles8_dotprod<const K: u8>(g: &[u8], xrb: usize, y: [&[u8]; 8], out: &mut [[f32; 8]], prep: &mut [i32]) {
    // SAFETY: NEON is baseline; `dotprod` enabled above.
    unsafe { tiles_with::<Sdot, K, 8>(g, xrb, y, out, prep) }
}
