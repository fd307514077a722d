//! x86 twins of `gemm::panel_portable`: lanes are the panel's 8 columns; the activation rows
//! of a register tile share every loaded weight vector, and each row's four values of a group
//! (one 32-bit broadcast) meet one panel ([`panel`], 256-bit) or two ([`panel_pair`]: one
//! 512-bit vector, half the broadcasts and block scalars per product, each group of both one
//! load from panels packed as a pair, `PanelLayout::pair`; [`panel_pair_avx2`]: two 256-bit
//! vectors, half the broadcasts). AVX-512 VNNI: `vpdpbusd` adds 4 u8×i8 products per
//! lane. AVX2 ([`panel_avx2`]): `maddubs` of `G` groups
//! added as i16, then one `madd` with ones into the i32 lanes. Each `maddubs` lane holds a pair
//! `u·y + u·y` ≤ 2·umax·128, so as many groups as stay within i16 are added: 8 for 4-bit codes
//! (8·2·15·128 = 30 720), 4 for 5-bit ones, 2 for Q6_K's 6 bits. The `madd`s, which compete
//! with `maddubs` for the vector multiplier, drop from one per two groups to one per eight
//! (Q4) or four (Q5). Q8_0's codes reach 255 and saturate even one pair, so its kernel
//! (`G` = 1) multiplies the signed bytes `q = u ^ 0x80` as the dot products do —
//! `maddubs(|q|, sign(y, q))`, pairs ≤ 2·128·127 — and removes no offset. All are
//! bit-identical to the portable kernel (exact integer sums, the same float operations per
//! lane in the same order). With AVX-VNNI ([`panel_avx_vnni`]; Intel since Alder Lake, AMD
//! since Zen 5: `simd::x86::avx_vnni`) one 256-bit `vpdpbusd` per group, row and panel takes
//! the place of `maddubs`, the i16 sums and their `madd`, and Q8_0 runs on its unsigned codes
//! with the offset term as the AVX-512 kernels do. [`pack`] decodes the weight rows into
//! panels with AVX2, the scalar decoder's bytes.
//!
//! The activation kind, the code offset and the scale split are const parameters
//! ([`by_kind`]), so nothing branches on them per row and block. Each row's block scale and
//! `s` come from the job's block scalars (`PanelJob::sc`: converted once per call, with
//! `−o·Σy`, where every panel converted them again: on the AVX2 VM pp128 322 → 381 t/s,
//! pp512 299 → 342 with `--fast-prefill`), or where a job has none from the row as
//! [`act_block`](super::act_block) reads them, with F16C.
//! Measured on Zen 4 (one thread, Q4_1, k = 576, 512 rows, `mr` 4, decoding included), ns per
//! 128 products: 2.04 before (kind matched at run time per row and block, `act_block` per row
//! and block, the scalar decoder), 1.11 with the kind fixed, 1.0 over pairs of panels in
//! 512-bit vectors with the AVX2 decoder; the interleaved tiles take 1.79, the core's peak is
//! 0.55. Splitting each row's chain of eight `vpdpbusd` in two gained nothing at 4 rows and
//! spilled at 8; converting the block scalars once per call instead of once per panel gained
//! nothing measurable.
//!
//! AVX2 on Zen 4 (measured there; the `--isa avx2` table): `maddubs`, `madd`, `sign`, `abs`,
//! `mul` and FMA share two of the four vector pipes (the multiplier pipes: a Q4 block's 96 of
//! them bound 4 rows × 2 panels at 42.7 products a cycle; it runs about 28, LLVM's tree of the
//! i16 sums spilling; what was tried against that: docs/benchmarks.md, 2026-12-01), a
//! broadcast from memory takes one of two load slots a cycle, so a row's four values broadcast
//! once per group feed one `maddubs` on one panel but two on a pair. Pairs, `mr` 4, 16 rows
//! of Q4_1 (576 × 1536) from memory, one thread: 189–193 → 171 µs; Q4_0 209–215 → 181,
//! Q5_1 277–313 → 249–256, Q8_0 (576 × 49152) 11.5 → 10.5 ms. (Q8_0's codes as two nibbles, two
//! 4-bit kernels, did not beat the signed bytes: their `maddubs` and i16 adds fill the pipes
//! the signs and `madd`s did.)
//!
//! AVX-VNNI, measured on Zen 5 (`--isa avx2` table; `scripts/gemm_bench`, one thread, 16 rows,
//! `mr` 4, µs per call, `CORELM_AVX_VNNI=0` against on): Q4_1 576 × 1536 131–135 → 115–122,
//! Q8_0 576 × 49152 7081–7144 → 3874–4056, and at 1024 × 4864 Q4_0 694–707 → 590–629, Q5_0
//! 758–779 → 625–635, Q4_K 763–827 → 694–767, Q6_K 1255–1327 → 868–909. `mr` 4 stays the
//! best tile (Q4_1: 2 rows 137, 6 rows 127, 8 rows 151 µs; 16 registers hold 4 rows' sums of
//! two panels, the weights and a broadcast).

#![allow(clippy::missing_safety_doc)]

use super::panel::{Act, PanelJob, PanelLayout, PACKED_BLOCK, PANEL};
use super::tile::ROW_SCALARS;
use crate::matmul::x86::common::{bits_32, mxfp4_grid, nibbles_32, q6_group};
use crate::quant::blocks::*;
use crate::simd::x86::h2f;
use crate::DType;
use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

/// `gemm::pack` with AVX2 and F16C, the same bytes: weight rows `c0 .. c0 + n` (n ≤ 8; the
/// missing columns' codes at the offset `o`, scale and min 0) of `w` (rows of `k` values) into
/// `panel`, block by block: each row's 32 unsigned codes decoded into one vector, the eight
/// vectors transposed as 8 × 8 four-byte groups (group g of every column together), the
/// scales and mins (Q6_K: its two scales) converted as the scalar decoder converts them. The
/// blocks go where `lay` says (alone, or as half of a pair).
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::too_many_arguments)]
pub fn pack(t: DType, w: &[u8], k: usize, c0: usize, n: usize, o: i32, panel: &mut [u8], lay: PanelLayout) {
    let nb = k / 32;
    let rb = crate::row_bytes(t, k);
    assert!(n <= PANEL && w.len() >= (c0 + n) * rb && panel.len() >= nb * lay.block);
    let pad = _mm256_set1_epi8(o as i8);
    for b in 0..nb {
        // Eight columns written out, not a loop over `n` of them: the codes stay in registers
        // and the scales are gathered there, not stored one by one and read back as a vector
        // (a failed store forwarding that cost about as much as the rest of the decoding).
        // SAFETY (each): the features `codes` needs are this function's.
        let col = |c: usize| unsafe { column(t, w, rb, c0, n, c, b, pad) };
        let c = [col(0), col(1), col(2), col(3), col(4), col(5), col(6), col(7)];
        let g = transpose8([c[0].0, c[1].0, c[2].0, c[3].0, c[4].0, c[5].0, c[6].0, c[7].0]);
        let d = _mm256_setr_ps(c[0].1, c[1].1, c[2].1, c[3].1, c[4].1, c[5].1, c[6].1, c[7].1);
        let m = _mm256_setr_ps(c[0].2, c[1].2, c[2].2, c[3].2, c[4].2, c[5].2, c[6].2, c[7].2);
        // SAFETY: block b's units are inside `panel` (asserted): eight 32-byte groups, then 8
        // scales and 8 mins.
        unsafe {
            let blk = panel.as_mut_ptr().add(lay.at(b));
            for (i, v) in g.iter().enumerate() {
                _mm256_storeu_si256(blk.add(i * lay.unit) as *mut __m256i, *v);
            }
            _mm256_storeu_ps(blk.add(8 * lay.unit) as *mut f32, d);
            _mm256_storeu_ps(blk.add(9 * lay.unit) as *mut f32, m);
        }
    }
}

/// Column `c` of [`pack`]'s panel: block `b` of row `c0 + c` ([`codes`]), or the padding past
/// the `n` columns.
///
/// # Safety
/// AVX2 and F16C present (inlined into [`pack`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn column(t: DType, w: &[u8], rb: usize, c0: usize, n: usize, c: usize, b: usize, pad: __m256i) -> (__m256i, f32, f32) {
    if c < n {
        // SAFETY: the caller's features.
        unsafe { codes(t, &w[(c0 + c) * rb..(c0 + c + 1) * rb], b) }
    } else {
        (pad, 0.0, 0.0)
    }
}

/// Block `b` of a plain row of `t`: its 32 unsigned codes `u = q + o` in order, its scale and
/// its min (Q6_K: its two half-block scales; `gemm::pack`'s values).
///
/// # Safety
/// AVX2 and F16C present (inlined into [`pack`]).
#[inline(always)]
unsafe fn codes(t: DType, row: &[u8], b: usize) -> (__m256i, f32, f32) {
    let f = h2f;
    match t {
        DType::Q4_0 => {
            let x = &as_blocks::<BlockQ4_0>(row)[b];
            (nibbles_32(&x.qs), f(x.d), 0.0)
        }
        DType::Q4_1 => {
            let x = &as_blocks::<BlockQ4_1>(row)[b];
            (nibbles_32(&x.qs), f(x.d), f(x.m))
        }
        DType::Q5_0 | DType::Q5_1 => {
            let (d, m, qs, qh) = if t == DType::Q5_0 {
                let x = &as_blocks::<BlockQ5_0>(row)[b];
                (f(x.d), 0.0, &x.qs, x.qh)
            } else {
                let x = &as_blocks::<BlockQ5_1>(row)[b];
                (f(x.d), f(x.m), &x.qs, x.qh)
            };
            // Value v's fifth bit is bit v of qh.
            (_mm256_or_si256(nibbles_32(qs), _mm256_and_si256(bits_32(qh), _mm256_set1_epi8(0x10))), d, m)
        }
        DType::Q8_0 => {
            let x = &as_blocks::<BlockQ8_0>(row)[b];
            // SAFETY: the block's 32 quants.
            let q = unsafe { _mm256_loadu_si256(x.qs.as_ptr() as *const __m256i) };
            (_mm256_xor_si256(q, _mm256_set1_epi8(-128)), f(x.d), 0.0)
        }
        DType::MXFP4 => {
            let x = &as_blocks::<BlockMXFP4>(row)[b];
            // The nibbles looked up in the doubled E2M1 values, plus the offset 12 (0 ..= 24).
            // SAFETY: the caller's AVX2.
            let v = _mm256_shuffle_epi8(unsafe { mxfp4_grid() }, nibbles_32(&x.qs));
            (_mm256_add_epi8(v, _mm256_set1_epi8(12)), e8m0_half(x.e), 0.0)
        }
        DType::Q4K | DType::Q5K => {
            let (j, d, m, qs, qh) = super::k_sub_block(t, row, b);
            // SAFETY: qs holds 128 bytes, 32·(j/2) + 32 ≤ 128; qh 32 bytes.
            let q = unsafe { _mm256_loadu_si256(qs.as_ptr().add(j / 2 * 32) as *const __m256i) };
            let q = if j % 2 == 0 { q } else { _mm256_srli_epi16(q, 4) };
            let mut u = _mm256_and_si256(q, _mm256_set1_epi8(0xF));
            if let Some(qh) = qh {
                let bit = _mm256_set1_epi8(1 << j);
                // SAFETY: qh holds 32 bytes.
                let h = unsafe { _mm256_loadu_si256(qh.as_ptr() as *const __m256i) };
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
                u = _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
            }
            (u, d, m)
        }
        DType::Q6K => {
            let (sb, j) = (b / 8, b % 8);
            let x = &as_blocks::<BlockQ6K>(row)[sb];
            let dd = x.d.to_f32();
            // Values 32j .. 32j + 32: group j % 4 of the 128-value half j / 4, as 0..=63.
            (q6_group(x, j / 4, j % 4), dd * x.scales[2 * j] as f32, dd * x.scales[2 * j + 1] as f32)
        }
        _ => unreachable!("gemm::supported types only"),
    }
}

/// The 8 × 8 four-byte groups of eight rows transposed: output g holds group g of row 0, of
/// row 1, … of row 7.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let t = |a: __m256i, b: __m256i| (_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    // Per 128-bit lane: (groups 0, 1 | 4, 5) and (2, 3 | 6, 7) of two rows interleaved.
    let (t0, t1) = t(r[0], r[1]);
    let (t2, t3) = t(r[2], r[3]);
    let (t4, t5) = t(r[4], r[5]);
    let (t6, t7) = t(r[6], r[7]);
    let l = |a: __m256i, b: __m256i| (_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
    // Groups (0 | 4), (1 | 5), (2 | 6), (3 | 7) of rows 0‥4, then of rows 4‥8.
    let (u0, u1) = l(t0, t2);
    let (u2, u3) = l(t1, t3);
    let (u4, u5) = l(t4, t6);
    let (u6, u7) = l(t5, t7);
    let lo = |a: __m256i, b: __m256i| _mm256_permute2x128_si256::<0x20>(a, b);
    let hi = |a: __m256i, b: __m256i| _mm256_permute2x128_si256::<0x31>(a, b);
    [lo(u0, u4), lo(u1, u5), lo(u2, u6), lo(u3, u7), hi(u0, u4), hi(u1, u5), hi(u2, u6), hi(u3, u7)]
}

/// The panel kernel with AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub fn panel(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], mut store: impl FnMut(usize, &[f32; PANEL])) {
    let panels = [job.panel];
    // SAFETY: the features `by_kind::<VNNI512, 1>` uses are enabled here.
    unsafe { by_kind::<VNNI512, 1>(job, panels, &|r, _| acc0(r), &mut |r, _, a| store(r, a)) }
}

/// [`panel`] over two panels at once, packed as a pair (`PanelLayout::pair`) into `job.panel`:
/// the first's outputs are `(r, 0)`, the second's `(r, 1)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub fn panel_pair(job: PanelJob, acc0: impl Fn(usize, usize) -> [f32; PANEL], mut store: impl FnMut(usize, usize, &[f32; PANEL])) {
    assert!(job.panel.len() >= job.nb * PanelLayout::pair(0).block, "a pair's blocks");
    let panels = [job.panel, job.panel];
    // SAFETY: the features `by_kind::<VNNI512, 2>` uses are enabled here.
    unsafe { by_kind::<VNNI512, 2>(job, panels, &acc0, &mut store) }
}

/// The panel kernel with AVX2 (every supported type; Q8_0 on its signed bytes).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn panel_avx2(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], mut store: impl FnMut(usize, &[f32; PANEL])) {
    let panels = [job.panel];
    // SAFETY: the features `by_kind::<MADDUBS, 1>` uses are enabled here.
    unsafe { by_kind::<MADDUBS, 1>(job, panels, &|r, _| acc0(r), &mut |r, _, a| store(r, a)) }
}

/// [`panel_avx2`] over two panels at once (each row's broadcasts and block scalars serve
/// both), as [`panel_pair`] gives them.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn panel_pair_avx2(job: PanelJob, second: &[u8], acc0: impl Fn(usize, usize) -> [f32; PANEL], mut store: impl FnMut(usize, usize, &[f32; PANEL])) {
    let panels = [job.panel, second];
    // SAFETY: the features `by_kind::<MADDUBS, 2>` uses are enabled here.
    unsafe { by_kind::<MADDUBS, 2>(job, panels, &acc0, &mut store) }
}

/// [`panel_avx2`] with AVX-VNNI (`simd::x86::avx_vnni`): one 256-bit `vpdpbusd` per group,
/// row and panel adds the four `u·y` products into the i32 lanes, where `maddubs`, the i16
/// sums and their `madd` took three; Q8_0 runs on its unsigned codes with the offset term, as
/// the AVX-512 kernels do (no `sign`/`abs`). The same exact integers, so the same bits.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn panel_avx_vnni(job: PanelJob, acc0: impl Fn(usize) -> [f32; PANEL], mut store: impl FnMut(usize, &[f32; PANEL])) {
    let panels = [job.panel];
    // SAFETY: the features `by_kind::<VNNI256, 1>` uses are enabled here.
    unsafe { by_kind::<VNNI256, 1>(job, panels, &|r, _| acc0(r), &mut |r, _, a| store(r, a)) }
}

/// [`panel_avx_vnni`] over two panels at once, as [`panel_pair_avx2`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub fn panel_pair_avx_vnni(job: PanelJob, second: &[u8], acc0: impl Fn(usize, usize) -> [f32; PANEL], mut store: impl FnMut(usize, usize, &[f32; PANEL])) {
    let panels = [job.panel, second];
    // SAFETY: the features `by_kind::<VNNI256, 2>` uses are enabled here.
    unsafe { by_kind::<VNNI256, 2>(job, panels, &acc0, &mut store) }
}

/// The integer dot instruction, a const parameter of the kernels: AVX2's `maddubs` (with
/// `madd` into i32), AVX-512 VNNI's `vpdpbusd` (EVEX; two panels as one 512-bit vector), or
/// AVX-VNNI's (VEX, 256 bits).
const MADDUBS: u8 = 0;
const VNNI512: u8 = 1;
const VNNI256: u8 = 2;

/// Activation kinds as const parameters of [`panel_kind`].
const Q8_0: u8 = 0;
const Q8_1: u8 = 1;
const Q8K: u8 = 2;

/// The kernel instance of the job's activation kind, code offset and scale split, and on AVX2
/// of the groups `G` whose `maddubs` add as i16 (1: Q8_0's signed bytes). Every supported
/// weight type is one of these (Q4_0/Q5_0/Q8_0/MXFP4; Q4_1/Q5_1; Q4_K/Q5_K; Q6_K); anything else
/// runs the portable twin, with the same bits.
///
/// # Safety
/// AVX2, FMA and F16C present, with `D` = [`VNNI512`] AVX-512 F/VL/VNNI, with [`VNNI256`]
/// AVX-VNNI.
#[inline(always)]
unsafe fn by_kind<const D: u8, const P: usize>(job: PanelJob, panels: [&[u8]; P], acc0: &impl Fn(usize, usize) -> [f32; PANEL], store: &mut impl FnMut(usize, usize, &[f32; PANEL])) {
    // SAFETY (every arm): the caller's features.
    unsafe {
        match (job.act, job.o != 0, job.split, if D != MADDUBS { 0 } else { job.umax }) {
            (Act::Q8_0, true, false, 0) => panel_kind::<Q8_0, true, false, D, P, 8>(job, panels, acc0, store),
            (Act::Q8_1, false, false, 0) => panel_kind::<Q8_1, false, false, D, P, 8>(job, panels, acc0, store),
            (Act::Q8K, false, false, 0) => panel_kind::<Q8K, false, false, D, P, 8>(job, panels, acc0, store),
            (Act::Q8K, true, true, 0) => panel_kind::<Q8K, true, true, D, P, 8>(job, panels, acc0, store),
            (Act::Q8_0, true, false, 15) => panel_kind::<Q8_0, true, false, MADDUBS, P, 8>(job, panels, acc0, store),
            (Act::Q8_0, true, false, 31) => panel_kind::<Q8_0, true, false, MADDUBS, P, 4>(job, panels, acc0, store),
            (Act::Q8_0, true, false, 255) => panel_kind::<Q8_0, false, false, MADDUBS, P, 1>(job, panels, acc0, store),
            (Act::Q8_1, false, false, 15) => panel_kind::<Q8_1, false, false, MADDUBS, P, 8>(job, panels, acc0, store),
            (Act::Q8_1, false, false, 31) => panel_kind::<Q8_1, false, false, MADDUBS, P, 4>(job, panels, acc0, store),
            (Act::Q8K, false, false, 15) => panel_kind::<Q8K, false, false, MADDUBS, P, 8>(job, panels, acc0, store),
            (Act::Q8K, false, false, 31) => panel_kind::<Q8K, false, false, MADDUBS, P, 4>(job, panels, acc0, store),
            (Act::Q8K, true, true, 63) => panel_kind::<Q8K, true, true, MADDUBS, P, 2>(job, panels, acc0, store),
            _ => {
                // (The pair layout has no portable reader; every type reaches an arm above.)
                assert!(!(D == VNNI512 && P == 2), "no AVX-512 kernel of two panels for this type");
                for (p, &panel) in panels.iter().enumerate() {
                    super::panel_portable(PanelJob { panel, ..job }, |r| acc0(r, p), |r, a| store(r, p, a));
                }
            }
        }
    }
}

/// The kernel for activation kind `A`, with (`OFF`) or without a code offset and with
/// (`SPLIT`) or without two scales per block, on one panel or two (`P` = 2: AVX-512 VNNI as
/// one 512-bit vector, the AVX2 table (`maddubs` or AVX-VNNI) as two 256-bit ones): register tiles of `mr` rows, the rows left
/// over in the tallest tiles under `mr` that fit.
///
/// # Safety
/// As [`by_kind`].
#[inline(always)]
unsafe fn panel_kind<const A: u8, const OFF: bool, const SPLIT: bool, const D: u8, const P: usize, const G: usize>(job: PanelJob, panels: [&[u8]; P], acc0: &impl Fn(usize, usize) -> [f32; PANEL], store: &mut impl FnMut(usize, usize, &[f32; PANEL])) {
    let PanelJob { nb, b1, x, xrb, rows, mr, ysum, .. } = job;
    // Bytes of an activation block (Q8_K: of a super-block of eight).
    let abs = act_bytes::<A>();
    assert!(panels.iter().all(|p| p.len() >= nb * PACKED_BLOCK) && b1 <= nb && x.len() >= rows * xrb);
    assert!(xrb >= if A == Q8K { nb / 8 * abs } else { nb * abs } && (!OFF || ysum.len() >= rows * nb * 2));
    assert!(job.sc.is_empty() || (rows <= job.sc_rows && job.sc.len() >= ((nb.max(1) - 1) * job.sc_rows + rows) * ROW_SCALARS), "block scalars for every row");
    let tile = mr.clamp(1, 8);
    let mut r = 0;
    while r < rows {
        // The rows left over under a tile's height in the tallest tiles that fit (12 rows at
        // `mr` 8: 8 + 4, not 8 + 1 + 1 + 1 + 1).
        let h = tile.min(rows - r);
        // SAFETY (every arm): the caller's features; rows r .. r + h exist (checked here).
        unsafe {
            match h {
                8 => rows_tile::<8, A, OFF, SPLIT, D, P, G>(&job, &panels, r, acc0, store),
                6 | 7 => rows_tile::<6, A, OFF, SPLIT, D, P, G>(&job, &panels, r, acc0, store),
                4 | 5 => rows_tile::<4, A, OFF, SPLIT, D, P, G>(&job, &panels, r, acc0, store),
                2 | 3 => rows_tile::<2, A, OFF, SPLIT, D, P, G>(&job, &panels, r, acc0, store),
                _ => rows_tile::<1, A, OFF, SPLIT, D, P, G>(&job, &panels, r, acc0, store),
            }
        }
        r += [1, 1, 2, 2, 4, 4, 6, 6, 8][h];
    }
}

/// Rows `r0 .. r0 + R` of [`panel_kind`]: on its panels in 256-bit vectors ([`rows_block`]),
/// or with AVX-512 VNNI on a pair as one 512-bit vector ([`rows_wide`]).
///
/// # Safety
/// As [`panel_kind`].
#[inline(always)]
unsafe fn rows_tile<const R: usize, const A: u8, const OFF: bool, const SPLIT: bool, const D: u8, const P: usize, const G: usize>(
    job: &PanelJob,
    panels: &[&[u8]; P],
    r0: usize,
    acc0: &impl Fn(usize, usize) -> [f32; PANEL],
    store: &mut impl FnMut(usize, usize, &[f32; PANEL]),
) {
    // SAFETY (both): the caller's features and bounds.
    unsafe {
        if P == 2 && D == VNNI512 {
            rows_wide::<R, A, OFF, SPLIT>(job, panels[0], r0, acc0, store)
        } else {
            rows_block::<R, A, OFF, SPLIT, D, P, G>(job, panels, r0, acc0, store)
        }
    }
}

/// Rows `r0 .. r0 + R` of [`panel_kind`] on `P` panels in 256-bit vectors (two: the AVX2
/// table, whose `maddubs` and AVX-VNNI `vpdpbusd` take 256 bits): per block, each panel's eight 32-byte groups, each met by
/// every row's four values of that group (broadcast from the row itself, once for the `P`
/// panels), then per row and panel the float steps of [`panel_portable`](super::panel_portable)
/// with the row's block scale and `s` as [`act_block`](super::act_block) gives them.
///
/// # Safety
/// As [`panel_kind`], whose asserts bound every access.
#[inline(always)]
unsafe fn rows_block<const R: usize, const A: u8, const OFF: bool, const SPLIT: bool, const D: u8, const P: usize, const G: usize>(
    job: &PanelJob,
    panels: &[&[u8]; P],
    r0: usize,
    acc0: &impl Fn(usize, usize) -> [f32; PANEL],
    store: &mut impl FnMut(usize, usize, &[f32; PANEL]),
) {
    let PanelJob { nb, b0, b1, o, x, xrb, ysum, sc, sc_rows, .. } = *job;
    let mut accf = [[_mm256_setzero_ps(); P]; R];
    for (j, a) in accf.iter_mut().enumerate() {
        for (p, a) in a.iter_mut().enumerate() {
            // SAFETY: 8 f32 of stack memory.
            *a = unsafe { _mm256_loadu_ps(acc0(r0 + j, p).as_ptr()) };
        }
    }
    // SAFETY (the loop): rows r0 .. r0 + R are inside `x`, blocks b0 .. b1 inside each row and
    // the panels (the caller's asserts); `ysum` holds two sums per row and block.
    unsafe {
        let xs: [*const u8; R] = std::array::from_fn(|j| x.as_ptr().add((r0 + j) * xrb));
        let ahead = Ahead::new(job, r0, R);
        for b in b0..b1 {
            ahead.step(b - b0);
            let blk: [*const u8; P] = std::array::from_fn(|p| panels[p].as_ptr().add(b * PACKED_BLOCK));
            let (head, q) = block_at::<A>(b);
            // Integer sums of the two 16-element halves (groups 0..4, 4..8), kept apart only
            // where the halves have scales of their own.
            let acci = if D != MADDUBS {
                let mut acci = [[[_mm256_setzero_si256(); P]; R]; 2];
                if OFF && !sc.is_empty() {
                    start_offsets(&mut acci, |j, h| [_mm256_set1_epi32((sc.as_ptr().add((b * sc_rows + r0 + j) * ROW_SCALARS + 4 * h) as *const i32).read_unaligned()); P]);
                }
                for g in 0..8 {
                    let w: [__m256i; P] = std::array::from_fn(|p| _mm256_loadu_si256(blk[p].add(g * 32) as *const __m256i));
                    for (j, a) in acci[if SPLIT { g / 4 } else { 0 }].iter_mut().enumerate() {
                        let y = _mm256_set1_epi32((xs[j].add(q + 4 * g) as *const i32).read_unaligned());
                        for p in 0..P {
                            a[p] = if D == VNNI256 { _mm256_dpbusd_avx_epi32(a[p], w[p], y) } else { _mm256_dpbusd_epi32(a[p], w[p], y) };
                        }
                    }
                }
                acci
            } else {
                // (Not started at the offsets without VNNI: its 16 registers hold the i16 sums
                // too, and the started sums spilled: AVX2 table, 16 rows of Q4_0, 192 → 200 µs.
                // It adds them after.)
                sums_avx2::<R, SPLIT, P, G>(&blk, &xs, q)
            };
            let dw: [__m256; P] = std::array::from_fn(|p| _mm256_loadu_ps(blk[p].add(256) as *const f32));
            let mw: [__m256; P] = std::array::from_fn(|p| _mm256_loadu_ps(blk[p].add(288) as *const f32));
            if !sc.is_empty() {
                for (j, acc) in accf.iter_mut().enumerate() {
                    // With VNNI the sums started at the offsets' negated terms, else they are
                    // added now.
                    let at = sc.as_ptr().add((b * sc_rows + r0 + j) * ROW_SCALARS);
                    let off = |h: usize| _mm256_set1_epi32((at.add(4 * h) as *const i32).read_unaligned());
                    let sum = |h: usize, p: usize| if OFF && D == MADDUBS { _mm256_add_epi32(acci[h][j][p], off(h)) } else { acci[h][j][p] };
                    let dx = _mm256_broadcast_ss(&*(at.add(8) as *const f32));
                    for (p, acc) in acc.iter_mut().enumerate() {
                        if SPLIT {
                            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum(0, p)), _mm256_mul_ps(dw[p], dx), *acc);
                            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum(1, p)), _mm256_mul_ps(mw[p], dx), *acc);
                            continue;
                        }
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum(0, p)), _mm256_mul_ps(dw[p], dx), *acc);
                        if A != Q8_0 {
                            *acc = _mm256_fmadd_ps(mw[p], _mm256_broadcast_ss(&*(at.add(12) as *const f32)), *acc);
                        }
                    }
                }
                continue;
            }
            for (j, acc) in accf.iter_mut().enumerate() {
                let (dx, sx) = scalars::<A>(xs[j].add(head), b);
                let dx = _mm256_set1_ps(dx);
                let ys = ysum.as_ptr().add(((r0 + j) * nb + b) * 2);
                for (p, acc) in acc.iter_mut().enumerate() {
                    if SPLIT {
                        let lo = _mm256_sub_epi32(acci[0][j][p], _mm256_set1_epi32(o * *ys));
                        let hi = _mm256_sub_epi32(acci[1][j][p], _mm256_set1_epi32(o * *ys.add(1)));
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(dw[p], dx), *acc);
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(mw[p], dx), *acc);
                        continue;
                    }
                    let mut s = acci[0][j][p];
                    if OFF {
                        s = _mm256_sub_epi32(s, _mm256_set1_epi32(o * (*ys + *ys.add(1))));
                    }
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[p], dx), *acc);
                    if A != Q8_0 {
                        *acc = _mm256_fmadd_ps(mw[p], _mm256_set1_ps(sx), *acc);
                    }
                }
            }
        }
    }
    for (j, a) in accf.iter().enumerate() {
        for (p, a) in a.iter().enumerate() {
            let mut out = [0f32; PANEL];
            // SAFETY: 8 f32 of stack memory.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), *a) };
            store(r0 + j, p, &out);
        }
    }
}

/// The integer sums of one block without VNNI, for rows `xs` (their codes at byte `q`) on the
/// panels' blocks `blk`: `maddubs` of `G` groups added as i16 (within i16: the module doc),
/// then `madd` with ones into i32 (G ≤ 4 where the halves are kept apart); Q8_0 (`G` = 1) on
/// its signed bytes, `madd` per group.
///
/// # Safety
/// AVX2 present (inlined into its callers); each `blk[p]` a packed block, each `xs[j] + q` a
/// block's 32 codes.
#[inline(always)]
unsafe fn sums_avx2<const R: usize, const SPLIT: bool, const P: usize, const G: usize>(blk: &[*const u8; P], xs: &[*const u8; R], q: usize) -> [[[__m256i; P]; R]; 2] {
    let mut acci = [[[_mm256_setzero_si256(); P]; R]; 2];
    // SAFETY (both): the caller's bounds.
    let y4 = |j: usize, g: usize| unsafe { _mm256_set1_epi32((xs[j].add(q + 4 * g) as *const i32).read_unaligned()) };
    let wv = |g: usize| -> [__m256i; P] { std::array::from_fn(|p| unsafe { _mm256_loadu_si256(blk[p].add(g * 32) as *const __m256i) }) };
    let ones = _mm256_set1_epi16(1);
    if G == 1 {
        // Q8_0: the signed bytes `q = u ^ 0x80`, `maddubs(|q|, sign(y, q))` = q·y (|q| ≤ 128,
        // |y| ≤ 127), `madd` with ones per group.
        for g in 0..8 {
            let q = wv(g).map(|w| _mm256_xor_si256(w, _mm256_set1_epi8(-128)));
            let aq = q.map(|q| _mm256_abs_epi8(q));
            for (j, a) in acci[0].iter_mut().enumerate() {
                let y = y4(j, g);
                for p in 0..P {
                    let s = _mm256_maddubs_epi16(aq[p], _mm256_sign_epi8(y, q[p]));
                    a[p] = _mm256_add_epi32(a[p], _mm256_madd_epi16(s, ones));
                }
            }
        }
        return acci;
    }
    for g0 in (0..8).step_by(G) {
        let mut s = [[_mm256_setzero_si256(); P]; R];
        for g in g0..g0 + G {
            let w = wv(g);
            for (j, s) in s.iter_mut().enumerate() {
                let y = y4(j, g);
                for p in 0..P {
                    s[p] = _mm256_add_epi16(s[p], _mm256_maddubs_epi16(w[p], y));
                }
            }
        }
        for (a, s) in acci[if SPLIT { g0 / 4 } else { 0 }].iter_mut().zip(s) {
            for p in 0..P {
                a[p] = _mm256_add_epi32(a[p], _mm256_madd_epi16(s[p], ones));
            }
        }
    }
    acci
}

/// A register tile's part of [`PanelJob::ahead`] (rows `r0 .. r0 + r` take their share of the
/// bytes), asked for one piece per block of the tile's loop: a hundred prefetches issued at
/// once fill the core's miss buffers and stall the loads behind them.
struct Ahead<'a> {
    bytes: &'a [u8],
    step: usize,
}

impl<'a> Ahead<'a> {
    #[inline(always)]
    fn new(job: &PanelJob<'a>, r0: usize, r: usize) -> Self {
        let (len, rows) = (job.ahead.len(), job.rows.max(1));
        let bytes = &job.ahead[len * r0.min(rows) / rows..len * (r0 + r).min(rows) / rows];
        Ahead { bytes, step: bytes.len().div_ceil((job.b1 - job.b0).max(1)).next_multiple_of(64) }
    }

    /// The piece of block `i` of the loop (from the first block summed).
    #[inline(always)]
    fn step(&self, i: usize) {
        let at = i * self.step;
        if at < self.bytes.len() {
            crate::simd::prefetch(&self.bytes[at..(at + self.step).min(self.bytes.len())], crate::simd::CacheLevel::L2);
        }
    }
}

/// Start each row's integer sums of a block at its offset term with the sign turned
/// (`negated(j, h)`: row `j`'s half `h`, from block scalars made with `−o` (`gemm_impl`); without
/// `SPLIT` the second is 0 and unused): `Σ u·y − o·Σy` then needs no subtraction after the products, one
/// vector operation less per row and block beside the `vpdpbusd` (Zen 4, 16 rows of Q5_0 in
/// L2: 129 → 121 µs). The integer sum is the same.
#[inline(always)]
fn start_offsets<V: Copy, const R: usize>(acci: &mut [[V; R]; 2], negated: impl Fn(usize, usize) -> V) {
    for j in 0..R {
        acci[0][j] = negated(j, 0);
        acci[1][j] = negated(j, 1);
    }
}

/// Bytes of an activation block of kind `A` (Q8_K: of a super-block of eight 32-blocks).
const fn act_bytes<const A: u8>() -> usize {
    match A {
        Q8_0 => size_of::<BlockQ8_0>(),
        Q8_1 => size_of::<BlockQ8_1>(),
        _ => size_of::<BlockQ8K>(),
    }
}

/// Where activation block `b`'s scale (Q8_K: its super-block's) and 32 quants sit in a row of
/// kind `A`.
#[inline(always)]
fn block_at<const A: u8>(b: usize) -> (usize, usize) {
    let head = if A == Q8K { b / 8 * act_bytes::<A>() } else { b * act_bytes::<A>() };
    let q = match A {
        Q8_0 => offset_of!(BlockQ8_0, qs),
        Q8_1 => offset_of!(BlockQ8_1, qs),
        _ => offset_of!(BlockQ8K, qs) + b % 8 * 32,
    };
    (head, head + q)
}

/// A row's block scale and (with a min) `s` from its block head `hp` (Q8_K: its super-block's,
/// `s = d·Σy` from the block's two 16-sums), as `act_block` gives them, with F16C.
///
/// # Safety
/// `hp` is block `b`'s head in a row of kind `A`; F16C present.
#[inline(always)]
unsafe fn scalars<const A: u8>(hp: *const u8, b: usize) -> (f32, f32) {
    let h = |at: usize| h2f(half::f16::from_bits(unsafe { (hp.add(at) as *const u16).read_unaligned() }));
    match A {
        Q8_0 => (h(offset_of!(BlockQ8_0, d)), 0.0),
        Q8_1 => (h(offset_of!(BlockQ8_1, d)), h(offset_of!(BlockQ8_1, s))),
        _ => {
            // SAFETY: the super-block's f32 scale and its 16 i16 sums.
            let (d, bs) = unsafe { ((hp.add(offset_of!(BlockQ8K, d)) as *const f32).read_unaligned(), hp.add(offset_of!(BlockQ8K, bsums) + b % 8 * 4) as *const i16) };
            // SAFETY: sums 2(b % 8) and 2(b % 8) + 1 of the 16.
            let (s0, s1) = unsafe { (bs.read_unaligned(), bs.add(1).read_unaligned()) };
            (d, d * (s0 as i32 + s1 as i32) as f32)
        }
    }
}

/// The two 8-column halves of a 512-bit vector, from panel 0 (low) and panel 1 (high).
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// [`rows_block`] over a pair of panels in 512-bit vectors (AVX-512 VNNI): lanes 0‥8 are panel
/// 0's columns, 8‥16 panel 1's, each unit of both one load (`PanelLayout::pair`), one
/// `vpdpbusd` per group and row for both, and the float steps once per row for both. The same
/// operations per lane as the 256-bit form.
///
/// # Safety
/// As [`panel_kind`] with AVX-512 F/VL/VNNI; its asserts bound every access.
#[inline(always)]
unsafe fn rows_wide<const R: usize, const A: u8, const OFF: bool, const SPLIT: bool>(
    job: &PanelJob,
    pair: &[u8],
    r0: usize,
    acc0: &impl Fn(usize, usize) -> [f32; PANEL],
    store: &mut impl FnMut(usize, usize, &[f32; PANEL]),
) {
    let PanelJob { nb, b0, b1, o, x, xrb, ysum, sc, sc_rows, .. } = *job;
    let lay = PanelLayout::pair(0);
    let ps = |v: __m512i| _mm512_castsi512_ps(v);
    let mut accf = [_mm512_setzero_ps(); R];
    for (j, a) in accf.iter_mut().enumerate() {
        let (lo, hi) = (acc0(r0 + j, 0), acc0(r0 + j, 1));
        // SAFETY: 8 f32 of stack memory each.
        *a = unsafe { ps(join(_mm256_loadu_si256(lo.as_ptr() as *const __m256i), _mm256_loadu_si256(hi.as_ptr() as *const __m256i))) };
    }
    // SAFETY (the loop): as in `rows_block`.
    unsafe {
        let xs: [*const u8; R] = std::array::from_fn(|j| x.as_ptr().add((r0 + j) * xrb));
        let ahead = Ahead::new(job, r0, R);
        for b in b0..b1 {
            ahead.step(b - b0);
            let blk = pair.as_ptr().add(lay.at(b));
            let (head, q) = block_at::<A>(b);
            // Unit u of both panels.
            let wv = |u: usize| _mm512_loadu_si512(blk.add(u * lay.unit) as *const _);
            let mut acci = [[_mm512_setzero_si512(); R]; 2];
            if OFF && !sc.is_empty() {
                start_offsets(&mut acci, |j, h| _mm512_set1_epi32((sc.as_ptr().add((b * sc_rows + r0 + j) * ROW_SCALARS + 4 * h) as *const i32).read_unaligned()));
            }
            for g in 0..8 {
                let w = wv(g);
                for (j, a) in acci[if SPLIT { g / 4 } else { 0 }].iter_mut().enumerate() {
                    *a = _mm512_dpbusd_epi32(*a, w, _mm512_set1_epi32((xs[j].add(q + 4 * g) as *const i32).read_unaligned()));
                }
            }
            let (dw, mw) = (ps(wv(8)), ps(wv(9)));
            if !sc.is_empty() {
                // The block scalars converted once per call: each a broadcast operand of the
                // float step that uses it, no F16 conversion per row and block; the sums
                // started at the offsets' negated sums, nothing to subtract.
                for (j, acc) in accf.iter_mut().enumerate() {
                    let at = sc.as_ptr().add((b * sc_rows + r0 + j) * ROW_SCALARS);
                    let dx = _mm512_set1_ps((at.add(8) as *const f32).read_unaligned());
                    if SPLIT {
                        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci[0][j]), _mm512_mul_ps(dw, dx), *acc);
                        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci[1][j]), _mm512_mul_ps(mw, dx), *acc);
                        continue;
                    }
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci[0][j]), _mm512_mul_ps(dw, dx), *acc);
                    if A != Q8_0 {
                        *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps((at.add(12) as *const f32).read_unaligned()), *acc);
                    }
                }
                continue;
            }
            for (j, acc) in accf.iter_mut().enumerate() {
                let (dx, sx) = scalars::<A>(xs[j].add(head), b);
                let dx = _mm512_set1_ps(dx);
                let ys = ysum.as_ptr().add(((r0 + j) * nb + b) * 2);
                if SPLIT {
                    let lo = _mm512_sub_epi32(acci[0][j], _mm512_set1_epi32(o * *ys));
                    let hi = _mm512_sub_epi32(acci[1][j], _mm512_set1_epi32(o * *ys.add(1)));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(dw, dx), *acc);
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(mw, dx), *acc);
                    continue;
                }
                let mut s = acci[0][j];
                if OFF {
                    s = _mm512_sub_epi32(s, _mm512_set1_epi32(o * (*ys + *ys.add(1))));
                }
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, dx), *acc);
                if A != Q8_0 {
                    *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), *acc);
                }
            }
        }
    }
    for (j, a) in accf.iter().enumerate() {
        let mut out = [0f32; 2 * PANEL];
        // SAFETY: 16 f32 of stack memory.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), *a) };
        for p in 0..2 {
            store(r0 + j, p, out[p * PANEL..(p + 1) * PANEL].try_into().expect("a panel's columns"));
        }
    }
}

/// [`tile::row_scalars`](super::tile::row_scalars) with F16C's conversion (the same values).
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::too_many_arguments)]
pub fn row_scalars(x: &[u8], xrb: usize, rows: usize, nb: usize, act: Act, ysum: &[i32], os: (i32, bool), out: &mut [u8]) {
    super::tile::row_scalars_with(x, xrb, rows, nb, act, ysum, os, out, |h| h2f(h))
}
