//! x86 decoders of the panel GEMM's panels from the matrix interleaved at load
//! (`matmul::layout`, the table's form) instead of its plain rows: the same bytes as
//! `x86::pack`, at a fraction of its work. A group-block holds one block of four rows with the
//! rows' value bytes side by side, 16 bytes a row, so a panel's four-byte groups (group g of
//! every column together) are a few permutes of whole vectors away — AVX-512: `vpermt2d` of
//! two groups' vectors; AVX2: a 4 × 8 transpose — where the plain rows' decoder gathers eight
//! rows and converts sixteen scalar scales per block. Which table decodes which type:
//! [`packs_groups`]. What lets `--fast-prefill`'s panel GEMM pay from a few rows on (a batched
//! decode step packs its weights once per step) and gives tensor-parallel column slices, which
//! have only the interleaved copy, the panel.

#![allow(clippy::missing_safety_doc)]

use super::panel::{PanelLayout, PANEL};
use crate::quant::blocks::{BlockQ4K, BlockQ6K};
use crate::DType;
use std::arch::x86_64::*;

/// Whether [`pack_groups`] (AVX-512) and [`pack_groups_avx2`] decode `t`'s interleaved groups —
/// the same types for both, each in its table's layout: values as nibbles (Q4_0,
/// Q4_1), as nibbles and fifth bits (Q5_0, Q5_1: AVX-512 as masks, `Q5Bits::Masks`; AVX2 folded
/// into the value bytes, `Q5Bits::Folded`), bytes (Q8_0), 16-byte runs of nibbles with packed
/// 6-bit scales (Q4_K), or Q6_K's runs (AVX-512: low nibbles and high bit pairs,
/// `Q6Form::Split`; AVX2: three values and a fourth's bits per byte, `Q6Form::Folded`), moved
/// into the panel's four-byte groups.
pub fn packs_groups(t: DType) -> bool {
    matches!(t, DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q4K | DType::Q6K)
}

/// [`x86::pack`](super::x86::pack) from the matrix interleaved at load (in the AVX-512 table's
/// layout) instead of its plain rows, the same bytes: weight rows `c0 .. c0 + n` (`c0` and `n`
/// multiples of four, n ≤ 8; the missing columns' codes at the offset, scale and min 0) of `g`
/// into `panel`. Per block, one 512-bit vector holds a group's unsigned codes of values 0‥16
/// of each of its four rows (`lo`) and one those of values 16‥32 (`hi`), as [`Decode::codes`]
/// makes them for each type, so the panel's four-byte groups of both groups' eight columns are
/// four `vpermt2d` away; the scales (and mins) are a few conversions and permutes
/// ([`Decode::scales`]) — about 15 operations per panel and block where the plain rows'
/// decoder takes a transpose of eight vectors and sixteen scalar scales. The blocks go where
/// `lay` says (alone, or as half of a pair).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub fn pack_groups(t: DType, g: &[u8], k: usize, c0: usize, n: usize, panel: &mut [u8], lay: PanelLayout) {
    let (nb, bs4, gb) = group_sizes(t, g, k, (c0, n), panel, lay);
    let at = Groups { g, gb, c0, nb };
    // SAFETY (each arm): the features the decoders need are this function's; `group_sizes`
    // checked the bounds.
    unsafe {
        match t {
            DType::Q4K => single(&Q4k, at, n == PANEL, t, panel, lay),
            DType::Q6K => single(&Q6k, at, n == PANEL, t, panel, lay),
            _ => single(&Plain { t, bs4 }, at, n == PANEL, t, panel, lay),
        }
    }
}

/// [`pack_groups`] of both panels of a pair at once, in [`PanelLayout::pair`]: columns
/// `c0 .. c0 + 16` (all there) of `g` into `panel` (the pair's two panels' bytes), the same
/// bytes as the two halves packed apart. Per block, the four groups' `vpermt2d` give each
/// panel's units two at a time, and one `vshufi64x2` per pair of them joins the two panels'
/// halves into the 64-byte vector the kernel loads, stored whole: eight 64-byte stores for the
/// codes where the halves packed apart took sixteen 32-byte ones. Types: [`packs_groups`].
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub fn pack_groups_pair(t: DType, g: &[u8], k: usize, c0: usize, panel: &mut [u8]) {
    let (nb, bs4, gb) = group_sizes(t, g, k, (c0, PANEL), panel, PanelLayout::pair(0));
    assert!(g.len() >= (c0 + 2 * PANEL) / 4 * gb, "the pair's second panel's groups");
    let at = Groups { g, gb, c0, nb };
    // SAFETY (each arm): as in `pack_groups`; the second panel's groups asserted above.
    unsafe {
        match t {
            DType::Q4K => pair(&Q4k, at, panel),
            DType::Q6K => pair(&Q6k, at, panel),
            _ => pair(&Plain { t, bs4 }, at, panel),
        }
    }
}

/// The interleaved groups a call packs from: `g`, `gb` bytes a group of four rows, the panel's
/// first group `c0 / 4`, `nb` blocks of 32 values a row.
#[derive(Clone, Copy)]
struct Groups<'a> {
    g: &'a [u8],
    gb: usize,
    c0: usize,
    nb: usize,
}

impl Groups<'_> {
    /// Where the `i`th group of the panel (or pair) starts its data for panel block `b`.
    ///
    /// # Safety
    /// That group's data for block `b` lies inside `g`.
    #[inline(always)]
    unsafe fn at(&self, i: usize, b: usize, d: &impl Decode) -> *const u8 {
        // SAFETY: the caller's.
        unsafe { self.g.as_ptr().add((self.c0 / 4 + i) * self.gb + d.block(b)) }
    }
}

/// How one type's group-blocks give a panel block, for [`single`] and [`pair`] (each type's
/// decoder monomorphised into its loop): where block `b`'s group-block starts within a group,
/// its codes, and its scale and min units.
trait Decode {
    /// Bytes from a group's start to the group-block that holds panel block `b`.
    fn block(&self, b: usize) -> usize;

    /// Panel block `b`'s unsigned codes in the group-block at `p`: values 0‥16 of its four
    /// rows (`lo`, 16 bytes a row) and values 16‥32 (`hi`).
    ///
    /// # Safety
    /// AVX-512 F/BW present; `p` is [`Decode::block`]'s group-block.
    unsafe fn codes(&self, p: *const u8, b: usize) -> (__m512i, __m512i);

    /// Panel block `b`'s scale and min units for the eight columns of the groups at `p0` and
    /// (with `two`) `p1` into the block at `dst`, laid out as `lay` says (a missing second
    /// group's 0).
    ///
    /// # Safety
    /// AVX2, F16C and AVX-512 F present; `p0`, `p1` as in [`Decode::codes`] (`p1` read only with
    /// `two`); `dst` holds a packed block laid out as `lay` says.
    unsafe fn scales(&self, dst: *mut u8, lay: PanelLayout, p0: *const u8, p1: *const u8, two: bool, b: usize);

    /// [`Decode::scales`] of both panels of a pair (groups `p`) into the pair's block at `dst`.
    ///
    /// # Safety
    /// As [`Decode::scales`], all four groups there.
    #[inline(always)]
    unsafe fn scales_pair(&self, dst: *mut u8, p: [*const u8; 4], b: usize) {
        // SAFETY: the caller's; half 1's units start 32 bytes in.
        unsafe {
            self.scales(dst, PanelLayout::pair(0), p[0], p[1], true, b);
            self.scales(dst.add(32), PanelLayout::pair(1), p[2], p[3], true, b);
        }
    }
}

/// [`pack_groups`]' loop: per block, both groups' codes (a missing second group's at the
/// type's offset), [`store_codes`], then the scales.
///
/// # Safety
/// The decoder's features present; `group_sizes` checked the bounds for these groups.
#[inline(always)]
unsafe fn single(d: &impl Decode, at: Groups, two: bool, t: DType, panel: &mut [u8], lay: PanelLayout) {
    let pad = _mm512_set1_epi8(super::offset(t) as i8);
    // SAFETY: the caller's features.
    let (i01, i23) = unsafe { unit_indices() };
    for b in 0..at.nb {
        // SAFETY: the caller's features and bounds; the second group is read only with `two`
        // (`wrapping_add` without it).
        unsafe {
            let p0 = at.at(0, b, d);
            let p1 = p0.wrapping_add(at.gb);
            let dst = panel.as_mut_ptr().add(lay.at(b));
            let (lo1, hi1) = if two { d.codes(p1, b) } else { (pad, pad) };
            store_codes(dst, lay, d.codes(p0, b), (lo1, hi1), (i01, i23));
            d.scales(dst, lay, p0, p1, two, b);
        }
    }
}

/// [`pack_groups_pair`]'s loop: per block, the four groups' codes, each pair of units of both
/// panels joined into one 64-byte store, then both panels' scales.
///
/// # Safety
/// As [`single`], for the four groups.
#[inline(always)]
unsafe fn pair(d: &impl Decode, at: Groups, panel: &mut [u8]) {
    let lay = PanelLayout::pair(0);
    // SAFETY: the caller's features.
    let (i01, i23) = unsafe { unit_indices() };
    for b in 0..at.nb {
        // SAFETY: groups `c0 / 4 .. c0 / 4 + 4` and their block b are inside `g`, block b of
        // the pair inside `panel` (the caller's); the features are the caller's.
        unsafe {
            // (No closures around the intrinsics: one LLVM leaves out of line does not inherit
            // the caller's features, and every intrinsic in it becomes a call.)
            let p = [at.at(0, b, d), at.at(1, b, d), at.at(2, b, d), at.at(3, b, d)];
            let dst = panel.as_mut_ptr().add(lay.at(b));
            let c = [d.codes(p[0], b), d.codes(p[1], b), d.codes(p[2], b), d.codes(p[3], b)];
            for (u, (pick, i)) in [(0usize, (false, i01)), (2, (false, i23)), (4, (true, i01)), (6, (true, i23))] {
                let v = if pick { [c[0].1, c[1].1, c[2].1, c[3].1] } else { [c[0].0, c[1].0, c[2].0, c[3].0] };
                // Units u, u + 1 of both panels (panel 0's from `a`, panel 1's from `z`),
                // joined per unit.
                let (a, z) = (_mm512_permutex2var_epi32(v[0], i, v[1]), _mm512_permutex2var_epi32(v[2], i, v[3]));
                _mm512_storeu_si512(dst.add(64 * u) as *mut _, _mm512_shuffle_i64x2::<0x44>(a, z));
                _mm512_storeu_si512(dst.add(64 * (u + 1)) as *mut _, _mm512_shuffle_i64x2::<0xEE>(a, z));
            }
            d.scales_pair(dst, p, b);
        }
    }
}

/// The `vpermt2d` indices of a panel's units 0, 1 and 2, 3 from two groups' codes: dword i of
/// the result is four-byte group `first + i / 8` of column `i % 8`, dword `4·(i % 4) + group`
/// of the first group's vector (columns 0‥4) or of the second's.
#[inline]
#[target_feature(enable = "avx512f")]
fn unit_indices() -> (__m512i, __m512i) {
    let idx = |first: i32| _mm512_setr_epi32(first, 4 + first, 8 + first, 12 + first, 16 + first, 20 + first, 24 + first, 28 + first, first + 1, 5 + first, 9 + first, 13 + first, 17 + first, 21 + first, 25 + first, 29 + first);
    (idx(0), idx(2))
}

/// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: one group-block (`bs4` bytes) per panel block, its codes
/// a mask of the loaded nibbles (Q5: the fifth bits or'ed in from their byte masks,
/// `Q5Bits::Masks`; Q8_0 its bytes flipped); scales as F16 (Q4_1, Q5_1: scale and min pairs).
struct Plain {
    t: DType,
    bs4: usize,
}

/// Bytes of a group-block's scales (and mins), and where its values start (past them and Q5's
/// two 64-bit masks), for the types [`Plain`] reads.
fn value_start(t: DType) -> (usize, usize) {
    match t {
        DType::Q4_1 => (16, 16),
        DType::Q5_0 => (8, 24),
        DType::Q5_1 => (16, 32),
        _ => (8, 8),
    }
}

impl Decode for Plain {
    #[inline(always)]
    fn block(&self, b: usize) -> usize {
        b * self.bs4
    }

    #[inline(always)]
    unsafe fn codes(&self, p: *const u8, _: usize) -> (__m512i, __m512i) {
        let (nib, fifth, flip) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10), _mm512_set1_epi8(-128));
        let values = value_start(self.t).1;
        // SAFETY: the caller's.
        unsafe {
            let v = _mm512_loadu_si512(p.add(values) as *const _);
            match self.t {
                DType::Q8_0 => (_mm512_xor_si512(v, flip), _mm512_xor_si512(_mm512_loadu_si512(p.add(values + 64) as *const _), flip)),
                DType::Q5_0 | DType::Q5_1 => {
                    let (hl, hh) = ((p.add(values - 16) as *const u64).read_unaligned(), (p.add(values - 8) as *const u64).read_unaligned());
                    (
                        _mm512_or_si512(_mm512_and_si512(v, nib), _mm512_maskz_mov_epi8(hl, fifth)),
                        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), nib), _mm512_maskz_mov_epi8(hh, fifth)),
                    )
                }
                _ => (_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16(v, 4), nib)),
            }
        }
    }

    #[inline(always)]
    unsafe fn scales(&self, dst: *mut u8, lay: PanelLayout, p0: *const u8, p1: *const u8, two: bool, _: usize) {
        // SAFETY (all): the caller's.
        unsafe {
            if value_start(self.t).0 == 16 {
                // Scales and mins `[d0 m0 d1 m1 …]` per group to `[d0‥d7, m0‥m7]`.
                let dm = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
                let h0 = _mm_loadu_si128(p0 as *const __m128i);
                let h1 = if two { _mm_loadu_si128(p1 as *const __m128i) } else { _mm_setzero_si128() };
                let f = _mm512_cvtph_ps(_mm256_set_m128i(h1, h0));
                store_units(dst, lay, 8, _mm512_castps_si512(_mm512_permutexvar_ps(dm, f)));
            } else {
                _mm256_storeu_ps(dst.add(8 * lay.unit) as *mut f32, scales8(p0, p1, two));
                _mm256_storeu_ps(dst.add(9 * lay.unit) as *mut f32, _mm256_setzero_ps());
            }
        }
    }

    /// Both panels' scales (and mins) in whole 64-byte units: the d's of both, then the m's.
    #[inline(always)]
    unsafe fn scales_pair(&self, dst: *mut u8, p: [*const u8; 4], _: usize) {
        // SAFETY (all): the caller's.
        unsafe {
            if value_start(self.t).0 == 16 {
                // `[d0 m0 d1 m1 …]` of two panels' groups to the d's and the m's of both.
                let (di, mi) = (_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31));
                let h = |i: usize| _mm_loadu_si128(p[i] as *const __m128i);
                let (f0, f1) = (_mm512_cvtph_ps(_mm256_set_m128i(h(1), h(0))), _mm512_cvtph_ps(_mm256_set_m128i(h(3), h(2))));
                _mm512_storeu_ps(dst.add(64 * 8) as *mut f32, _mm512_permutex2var_ps(f0, di, f1));
                _mm512_storeu_ps(dst.add(64 * 9) as *mut f32, _mm512_permutex2var_ps(f0, mi, f1));
            } else {
                _mm256_storeu_ps(dst.add(64 * 8) as *mut f32, scales8(p[0], p[1], true));
                _mm256_storeu_ps(dst.add(64 * 8 + 32) as *mut f32, scales8(p[2], p[3], true));
                _mm512_storeu_ps(dst.add(64 * 9) as *mut f32, _mm512_setzero_ps());
            }
        }
    }
}

/// Q4_K: panel block `b` is sub-block `j = b % 8` of super-block `b / 8`, whose values are
/// the low (even j) or high (odd j) nibbles of the 16-byte runs `2·(j/2)` and `2·(j/2) + 1` of
/// each row's `qs` (a group-block holds run h of its four rows at `64 + 64h`); its scale and
/// min are `d·sc` and `−dmin·m` with `(sc, m)` the 6-bit pair j of the row's 12 scale bytes
/// ([`store_q4k_scales`]).
struct Q4k;

impl Decode for Q4k {
    #[inline(always)]
    fn block(&self, b: usize) -> usize {
        b / 8 * Q4K_GROUP_BLOCK
    }

    #[inline(always)]
    unsafe fn codes(&self, p: *const u8, b: usize) -> (__m512i, __m512i) {
        let (j, nib) = (b % 8, _mm512_set1_epi8(0x0F));
        // Runs h and h + 1: values 0‥16 and 16‥32, low nibbles for even j, high for odd.
        let h = 2 * (j / 2);
        // SAFETY: the caller's.
        let (lo, hi) = unsafe { (_mm512_loadu_si512(p.add(64 + 64 * h) as *const _), _mm512_loadu_si512(p.add(128 + 64 * h) as *const _)) };
        let shift = _mm_cvtsi32_si128(4 * (j % 2) as i32);
        (_mm512_and_si512(_mm512_srl_epi16(lo, shift), nib), _mm512_and_si512(_mm512_srl_epi16(hi, shift), nib))
    }

    #[inline(always)]
    unsafe fn scales(&self, dst: *mut u8, lay: PanelLayout, p0: *const u8, p1: *const u8, two: bool, b: usize) {
        // SAFETY: the caller's.
        unsafe { store_q4k_scales(dst, lay, p0, p1, two, b % 8) }
    }
}

/// Q6_K (`Q6Form::Split`): panel block `b` is values `32k .. 32k + 32` of half `n` of
/// super-block `b / 8` (`k = b % 4`, `n = b % 8 / 4`), each the low (k < 2) or high nibble of
/// an `ql` byte (16-byte runs `4n + 2·(k % 2)` and the next; a group-block holds run p of its
/// four rows at `72 + 64p`) and bits `2k, 2k + 1` of a `qh` byte (runs `2n` and the next, at
/// `584 + 64p`) — the code `q + 32` as it is stored; its two scales [`store_q6k_scales`]'.
struct Q6k;

impl Decode for Q6k {
    #[inline(always)]
    fn block(&self, b: usize) -> usize {
        b / 8 * Q6K_GROUP_BLOCK
    }

    #[inline(always)]
    unsafe fn codes(&self, p: *const u8, b: usize) -> (__m512i, __m512i) {
        let (n, k) = (b % 8 / 4, b % 4);
        let (nib, bits) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
        let (lo_shift, hi_shift) = (_mm_cvtsi32_si128(4 * (k / 2) as i32), _mm_cvtsi32_si128(2 * k as i32));
        let mut v = [_mm512_setzero_si512(); 2];
        for (i, v) in v.iter_mut().enumerate() {
            // Values 16i .. 16i + 16 of the block. SAFETY: the caller's.
            let (ql, qh) = unsafe { (_mm512_loadu_si512(p.add(72 + 64 * (4 * n + 2 * (k % 2) + i)) as *const _), _mm512_loadu_si512(p.add(584 + 64 * (2 * n + i)) as *const _)) };
            let high = _mm512_slli_epi16(_mm512_and_si512(_mm512_srl_epi16(qh, hi_shift), bits), 4);
            *v = _mm512_or_si512(_mm512_and_si512(_mm512_srl_epi16(ql, lo_shift), nib), high);
        }
        (v[0], v[1])
    }

    #[inline(always)]
    unsafe fn scales(&self, dst: *mut u8, lay: PanelLayout, p0: *const u8, p1: *const u8, two: bool, b: usize) {
        // SAFETY: the caller's.
        unsafe { store_q6k_scales(dst, lay, p0, p1, two, b % 8) }
    }
}

/// Bytes of one Q4_K super-block of a group of four rows (576).
const Q4K_GROUP_BLOCK: usize = 4 * std::mem::size_of::<BlockQ4K>();
/// Bytes of one Q6_K super-block of a group of four rows (840).
const Q6K_GROUP_BLOCK: usize = 4 * std::mem::size_of::<BlockQ6K>();

/// Panel block `b` of a K-quant matrix's groups whose super-blocks take `sbb` bytes a group
/// ([`Q4K_GROUP_BLOCK`], [`Q6K_GROUP_BLOCK`]): its sub-block `j` (of super-block `b / 8`),
/// the super-block's group-blocks of group `c0 / 4` and of the next, and the block in `panel`
/// (where `lay` puts it).
///
/// # Safety
/// Super-block `b / 8` of group `c0 / 4` lies inside `g` (the next group's is only addressed)
/// and block `b` inside `panel` (`group_sizes`).
#[inline(always)]
unsafe fn kquant_block(g: &[u8], gb: usize, sbb: usize, c0: usize, b: usize, panel: &mut [u8], lay: PanelLayout) -> (usize, *const u8, *const u8, *mut u8) {
    // SAFETY: the caller's; `wrapping_add` for the next group, read only where it exists.
    unsafe {
        let p0 = g.as_ptr().add(c0 / 4 * gb + b / 8 * sbb);
        (b % 8, p0, p0.wrapping_add(gb), panel.as_mut_ptr().add(lay.at(b)))
    }
}

/// A Q4_K panel block's scales `d·sc` and mins `−dmin·m` (sub-block `j` of the super-block
/// whose group-blocks start at `p0` and, with `two`, `p1`) into its scale and min slots: the
/// eight rows' 6-bit pairs (`get_scale_min_k4`) unpacked at once from the three 32-bit words
/// each group-block keeps side by side, the products those of the plain decoder.
///
/// # Safety
/// AVX2 and F16C present; a Q4_K group-block head (64 bytes) at `p0` (and with `two` at
/// `p1`); `dst` holds a packed block laid out as `lay` says.
#[inline(always)]
unsafe fn store_q4k_scales(dst: *mut u8, lay: PanelLayout, p0: *const u8, p1: *const u8, two: bool, j: usize) {
    let (six, four, two_bits) = (_mm256_set1_epi32(63), _mm256_set1_epi32(0x0F), _mm256_set1_epi32(3));
    // SAFETY (all): the caller's.
    unsafe {
        // Word w of the eight rows' scale bytes (rows of the second group zero without it).
        let word = |w: usize| {
            let a = _mm_loadu_si128(p0.add(16 + 16 * w) as *const __m128i);
            let b = if two { _mm_loadu_si128(p1.add(16 + 16 * w) as *const __m128i) } else { _mm_setzero_si128() };
            _mm256_set_m128i(b, a)
        };
        let shift = _mm_cvtsi32_si128(8 * (j % 4) as i32);
        let byte = |w: usize| _mm256_srl_epi32(word(w), shift);
        let (sc, mn) = if j < 4 {
            (_mm256_and_si256(byte(0), six), _mm256_and_si256(byte(1), six))
        } else {
            let (q0, q1, q2) = (byte(0), byte(1), byte(2));
            let high = |q: __m256i| _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(q, 6), two_bits), 4);
            (_mm256_or_si256(_mm256_and_si256(q2, four), high(q0)), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(q2, 4), four), high(q1)))
        };
        // `[d0‥d3 dmin0‥dmin3]` of each group: scales in the low halves, mins in the high.
        let h0 = _mm_loadu_si128(p0 as *const __m128i);
        let h1 = if two { _mm_loadu_si128(p1 as *const __m128i) } else { _mm_setzero_si128() };
        let (d, dmin) = (_mm256_cvtph_ps(_mm_unpacklo_epi64(h0, h1)), _mm256_cvtph_ps(_mm_unpackhi_epi64(h0, h1)));
        let m = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)), _mm256_set1_ps(-0.0));
        // The plain decoder leaves a padding column's min at +0.
        let m = if two { m } else { _mm256_blend_ps::<0xF0>(m, _mm256_setzero_ps()) };
        _mm256_storeu_ps(dst.add(8 * lay.unit) as *mut f32, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
        _mm256_storeu_ps(dst.add(9 * lay.unit) as *mut f32, m);
    }
}

/// A Q6_K panel block's two scales, `d` times the signed scale bytes `2j` and `2j + 1` of each
/// row (sub-block `j` of the super-block whose group-blocks start at `p0` and, with `two`,
/// `p1`; a missing second group's 0), into its scale and min slots. Both layouts keep `d` and
/// the scales where `Split` has them.
///
/// # Safety
/// AVX2 and F16C present; a Q6_K group-block head (72 bytes) at `p0` (and with `two` at
/// `p1`); `dst` holds a packed block laid out as `lay` says.
#[inline(always)]
unsafe fn store_q6k_scales(dst: *mut u8, lay: PanelLayout, p0: *const u8, p1: *const u8, two: bool, j: usize) {
    // Row r's eight scale bytes `8·(j / 4) ..` at `8 + 32·(j / 4) + 8r` of its group-block: one
    // 64-bit lane a row, shifted so that bytes 2j, 2j + 1 of the row's sixteen come first.
    let at = 8 + 32 * (j / 4);
    let shift = _mm_cvtsi32_si128(16 * (j % 4) as i32);
    // SAFETY (all): the caller's.
    unsafe {
        let a = _mm256_srl_epi64(_mm256_loadu_si256(p0.add(at) as *const __m256i), shift);
        let b = if two { _mm256_srl_epi64(_mm256_loadu_si256(p1.add(at) as *const __m256i), shift) } else { _mm256_setzero_si256() };
        // The low dword of each row's lane, rows 0‥8 in order (`[0 1 4 5 | 2 3 6 7]` put back).
        let rows = _mm256_shuffle_ps::<0b10_00_10_00>(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
        let rows = _mm256_castpd_si256(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(rows)));
        // Bytes 0 and 1 of each dword, sign-extended.
        let (s0, s1) = (_mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(rows)), _mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(rows)));
        let d = scales8(p0, p1, two);
        _mm256_storeu_ps(dst.add(8 * lay.unit) as *mut f32, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s0)));
        _mm256_storeu_ps(dst.add(9 * lay.unit) as *mut f32, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s1)));
    }
}

/// Both groups' codes — `lo` (values 0‥16) and `hi` (16‥32) of each, 128-bit lane r row r —
/// stored at `dst` as a panel block's eight four-byte groups: group g of the eight columns is
/// dword g % 4 of each lane of `lo` (g < 4) or `hi`, the first group's columns first
/// ([`unit_indices`]), where `lay` puts them.
///
/// # Safety
/// AVX-512 F present; `dst` holds the block's code units as `lay` lays them out.
#[inline(always)]
unsafe fn store_codes(dst: *mut u8, lay: PanelLayout, (lo0, hi0): (__m512i, __m512i), (lo1, hi1): (__m512i, __m512i), (i01, i23): (__m512i, __m512i)) {
    // SAFETY: the block's code units at `dst` (the caller's).
    unsafe {
        store_units(dst, lay, 0, _mm512_permutex2var_epi32(lo0, i01, lo1));
        store_units(dst, lay, 2, _mm512_permutex2var_epi32(lo0, i23, lo1));
        store_units(dst, lay, 4, _mm512_permutex2var_epi32(hi0, i01, hi1));
        store_units(dst, lay, 6, _mm512_permutex2var_epi32(hi0, i23, hi1));
    }
}

/// Units `u` and `u + 1` of a block (`v`'s low and high 32 bytes) at `dst` where `lay` puts
/// them: one 64-byte store alone, two 32-byte stores in a pair.
///
/// # Safety
/// AVX-512 F present; `dst` holds the block's units `u`, `u + 1` as `lay` lays them out.
#[inline(always)]
unsafe fn store_units(dst: *mut u8, lay: PanelLayout, u: usize, v: __m512i) {
    // SAFETY: the caller's.
    unsafe {
        if lay.unit == 32 {
            _mm512_storeu_si512(dst.add(32 * u) as *mut _, v);
        } else {
            _mm256_storeu_si256(dst.add(u * lay.unit) as *mut __m256i, _mm512_castsi512_si256(v));
            _mm256_storeu_si256(dst.add((u + 1) * lay.unit) as *mut __m256i, _mm512_extracti64x4_epi64::<1>(v));
        }
    }
}

/// The eight rows' F16 scales `d0‥d3` that open the two groups' block heads at `p0` and `p1`
/// (the second group's 0 without `two`), as f32.
///
/// # Safety
/// F16C present; 8 readable bytes at `p0` (and, with `two`, at `p1`).
#[inline(always)]
unsafe fn scales8(p0: *const u8, p1: *const u8, two: bool) -> __m256 {
    // SAFETY: the caller's.
    unsafe {
        let h0 = (p0 as *const i64).read_unaligned();
        let h1 = if two { (p1 as *const i64).read_unaligned() } else { 0 };
        _mm256_cvtph_ps(_mm_set_epi64x(h1, h0))
    }
}

/// [`pack_groups_avx2`] for Q6_K in the AVX2 table's layout (`Q6Form::Folded`): panel block
/// `b` is values `128n + 32k .. + 32` of super-block `b / 8` (`k = b % 4`, `n = b % 8 / 4`);
/// position `l = 16h + i` of them is byte `i` of run `3·(2n + h) + c` (at `72 + 64·run`, the
/// four rows' 16 bytes side by side), whose bits 0‥5 are value k = c (c < 3) and bits 6, 7 two
/// bits of value k = 3. So k < 3 is one transpose ([`transpose8`]) and a mask per 16 values,
/// k = 3 three transposes, shifts and masks joined by ors. The padding columns' bytes are
/// code 32 (`0x20`; run 2's `0xA0`, whose top bits give value 3 its 32 too).
///
/// # Safety
/// `group_sizes` checked the bounds.
#[target_feature(enable = "avx2,f16c")]
unsafe fn pack_groups_q6k_avx2(g: &[u8], nb: usize, gb: usize, c0: usize, two: bool, panel: &mut [u8]) {
    let lay = PanelLayout::SINGLE;
    let low6 = _mm256_set1_epi8(63);
    let pads = [_mm256_set1_epi8(0x20), _mm256_set1_epi8(0x20), _mm256_set1_epi8(0xA0u8 as i8)];
    for b in 0..nb {
        // SAFETY: super-block b / 8 of group `c0 / 4` (and the next, with `two`) is inside
        // `g`, block b of the panel inside `panel` (the caller's `group_sizes`).
        let (j, p0, p1, dst) = unsafe { kquant_block(g, gb, Q6K_GROUP_BLOCK, c0, b, panel, lay) };
        let (n, k) = (j / 4, j % 4);
        // SAFETY: as above; `p1` is read only with `two`.
        unsafe {
            for h in 0..2 {
                let run = |c: usize| transpose8(p0, p1, 72 + 64 * (3 * (2 * n + h) + c), two, pads[c]);
                let groups = if k < 3 {
                    run(k).map(|v| _mm256_and_si256(v, low6))
                } else {
                    let (a0, a1, a2) = (run(0), run(1), run(2));
                    let bits = |v: __m256i, shift: i32, mask: i8| _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(mask));
                    std::array::from_fn(|i| _mm256_or_si256(_mm256_or_si256(bits(a0[i], 6, 0x03), bits(a1[i], 4, 0x0C)), bits(a2[i], 2, 0x30)))
                };
                for (i, v) in groups.into_iter().enumerate() {
                    _mm256_storeu_si256(dst.add(32 * (4 * h + i)) as *mut __m256i, v);
                }
            }
            store_q6k_scales(dst, lay, p0, p1, two, j);
        }
    }
}

/// The four-byte groups of the 16 bytes at `off` of each row of the two groups of four rows
/// at `p0` and `p1` (a group-block holds its rows' 16 bytes side by side; without `two` the
/// second group's bytes are `pad`), in row order: group i of the 16 bytes in vector i — two
/// unpacks of 32-bit and of 64-bit lanes, then a permute into row order.
///
/// # Safety
/// AVX2 present; 64 readable bytes at `p0 + off` (and with `two` at `p1 + off`).
#[inline(always)]
unsafe fn transpose8(p0: *const u8, p1: *const u8, off: usize, two: bool, pad: __m256i) -> [__m256i; 4] {
    // SAFETY (all): the caller's; unaligned loads.
    unsafe {
        let ld = |p: *const u8| _mm256_loadu_si256(p as *const __m256i);
        let (a0, a1) = (ld(p0.add(off)), ld(p0.add(off + 32)));
        let (b0, b1) = if two { (ld(p1.add(off)), ld(p1.add(off + 32))) } else { (pad, pad) };
        let (t0, t1) = (_mm256_unpacklo_epi32(a0, a1), _mm256_unpackhi_epi32(a0, a1));
        let (u0, u1) = (_mm256_unpacklo_epi32(b0, b1), _mm256_unpackhi_epi32(b0, b1));
        // After the unpacks the rows sit as 0, 2, 4, 6 | 1, 3, 5, 7.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        [_mm256_unpacklo_epi64(t0, u0), _mm256_unpackhi_epi64(t0, u0), _mm256_unpacklo_epi64(t1, u1), _mm256_unpackhi_epi64(t1, u1)].map(|v| _mm256_permutevar8x32_epi32(v, order))
    }
}

/// A group packer's blocks per row, bytes per group-block and per group, after checking that
/// `t` is one they decode, that columns `c0 .. c0 + n` are whole groups of
/// at most one panel inside `g`, and that `panel` holds a row of blocks laid out as `lay` says.
fn group_sizes(t: DType, g: &[u8], k: usize, (c0, n): (usize, usize), panel: &[u8], lay: PanelLayout) -> (usize, usize, usize) {
    assert!(packs_groups(t) && c0.is_multiple_of(4) && n.is_multiple_of(4) && (4..=PANEL).contains(&n));
    let nb = k / 32;
    let (bs4, gb) = (4 * t.type_size(), 4 * crate::row_bytes(t, k));
    assert!(g.len() >= (c0 + n) / 4 * gb && panel.len() >= nb * lay.block);
    (nb, bs4, gb)
}

/// [`pack_groups`] with AVX2 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K; Q6_K:
/// [`pack_groups_q6k_avx2`]), the same bytes: per block,
/// a 256-bit load holds two rows' 16 value bytes, so the eight rows' four-byte groups are a
/// 4 × 8 transpose of four loads ([`transpose8`]): the nibbles' low halves give groups 0‥4 and
/// their high halves 4‥8; Q5's folded bytes (`Q5Bits::Folded`) give values 0‥16 as their low
/// five bits and values 16‥32 as their high three with two bits each from the group's 16
/// shared bytes, moved per row by a variable shift; Q8_0's first 16 bytes of each row give groups 0‥4 and its last 16 (a
/// second transpose) 4‥8, their bytes flipped to the unsigned codes; a Q4_K sub-block's two
/// 16-byte runs give groups 0‥4 and 4‥8, their low or high nibbles, and its scales and mins
/// come as the AVX-512 packer makes them ([`store_q4k_scales`]). Where the rows' decoder
/// transposed eight rows and converted eight scalar scales per block (Q4_K: unpacked each
/// row's 6-bit pair per block), the AVX2 table's 16-row panel GEMM (one thread,
/// `scripts/gemm_bench`) took 19 % (Q8_0, 576 × 4096), 34 % (Q5_0, 896 × 4864; Q6_K, 4864 ×
/// 896) and 54 % (Q4_K, 4864 × 896) of its time decoding.
#[target_feature(enable = "avx2,f16c")]
pub fn pack_groups_avx2(t: DType, g: &[u8], k: usize, c0: usize, n: usize, panel: &mut [u8]) {
    let lay = PanelLayout::SINGLE;
    let (nb, bs4, gb) = group_sizes(t, g, k, (c0, n), panel, lay);
    let (nib, flip) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(-128));
    let two = n == PANEL;
    let store = |dst: *mut u8, i: usize, v: __m256i| {
        // SAFETY: group i < 8 of a packed block (the callers').
        unsafe { _mm256_storeu_si256(dst.add(32 * i) as *mut __m256i, v) }
    };
    if t == DType::Q6K {
        // SAFETY: the features are this function's; `group_sizes` checked the bounds.
        return unsafe { pack_groups_q6k_avx2(g, nb, gb, c0, two, panel) };
    }
    if t == DType::Q4K {
        for b in 0..nb {
            // SAFETY: `group_sizes` checked the bounds.
            let (j, p0, p1, dst) = unsafe { kquant_block(g, gb, Q4K_GROUP_BLOCK, c0, b, panel, lay) };
            // SAFETY: super-block b / 8 of group `c0 / 4` (and the next, with `two`) is inside
            // `g`, block b of the panel inside `panel` (`group_sizes`); the features are this
            // function's.
            unsafe {
                // Runs h and h + 1 (at 64 + 64h) hold the sub-block's values 0‥16 and 16‥32.
                let h = 2 * (j / 2);
                for (half, groups) in [transpose8(p0, p1, 64 + 64 * h, two, _mm256_setzero_si256()), transpose8(p0, p1, 128 + 64 * h, two, _mm256_setzero_si256())].into_iter().enumerate() {
                    for (i, v) in groups.into_iter().enumerate() {
                        store(dst, 4 * half + i, _mm256_and_si256(if j % 2 == 1 { _mm256_srli_epi16(v, 4) } else { v }, nib));
                    }
                }
                store_q4k_scales(dst, lay, p0, p1, two, j);
            }
        }
        return;
    }
    let (q8, q5) = (t == DType::Q8_0, matches!(t, DType::Q5_0 | DType::Q5_1));
    // The padding group's bytes: both nibbles at the offset (Q4_0's 8; Q4_1's 0); Q8_0's zeros,
    // flipped to the offset 128 with the rest; Q5_0's folded bytes 0x10 with the shared bits'
    // bytes 0xAA (value j and value 16 + j both 16), Q5_1's zeros.
    let pad = match t {
        DType::Q8_0 | DType::Q5_1 => _mm256_setzero_si256(),
        DType::Q5_0 => _mm256_set1_epi8(0x10),
        _ => _mm256_set1_epi8((super::offset(t) * 0x11) as i8),
    };
    let pad_bits = _mm_set1_epi8(if t == DType::Q5_0 { 0xAAu8 as i8 } else { 0 });
    // Where the values start: past the scales (and Q5's 16 shared bytes of high bits).
    let at = match t {
        DType::Q4_1 => 16,
        DType::Q5_0 => 24,
        DType::Q5_1 => 32,
        _ => 8,
    };
    // Q5 (`Q5Bits::Folded`): row r's bits of the shared bytes at 2r, 2r + 1.
    let (five, three, two_bits, row_shift) = (_mm256_set1_epi8(0x1F), _mm256_set1_epi8(7), _mm256_set1_epi8(3), _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
    for b in 0..nb {
        // SAFETY: as in `pack_groups`: the groups' block b and the panel's are in bounds
        // (asserted above); the features are this function's.
        unsafe {
            let p0 = g.as_ptr().add(c0 / 4 * gb + b * bs4);
            let p1 = p0.add(gb);
            let dst = panel.as_mut_ptr().add(lay.at(b));
            if q8 {
                for (half, groups) in [transpose8(p0, p1, at, two, pad), transpose8(p0, p1, at + 64, two, pad)].into_iter().enumerate() {
                    for (i, v) in groups.into_iter().enumerate() {
                        store(dst, 4 * half + i, _mm256_xor_si256(v, flip));
                    }
                }
            } else if q5 {
                // Byte j of a row: value j (bits 0‥4) and value 16 + j's bits 0‥2 (5‥7); its
                // bits 3 and 4 in the group's shared byte j. The shared bytes of both groups,
                // group i's dword of them broadcast in each half, moved to each row's bits.
                let bits = _mm256_set_m128i(if two { _mm_loadu_si128(p1.add(at - 16) as *const __m128i) } else { pad_bits }, _mm_loadu_si128(p0.add(at - 16) as *const __m128i));
                let shared = [_mm256_shuffle_epi32::<0x00>(bits), _mm256_shuffle_epi32::<0x55>(bits), _mm256_shuffle_epi32::<0xAA>(bits), _mm256_shuffle_epi32::<0xFF>(bits)];
                for (i, v) in transpose8(p0, p1, at, two, pad).into_iter().enumerate() {
                    store(dst, i, _mm256_and_si256(v, five));
                    let high = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(shared[i], row_shift), two_bits), 3);
                    store(dst, 4 + i, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 5), three), high));
                }
            } else {
                for (i, v) in transpose8(p0, p1, at, two, pad).into_iter().enumerate() {
                    store(dst, i, _mm256_and_si256(v, nib));
                    store(dst, 4 + i, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
                }
            }
            if matches!(t, DType::Q4_1 | DType::Q5_1) {
                // `[d0 m0 d1 m1 …]` of each group: scales at even places, mins at odd.
                let f0 = _mm256_cvtph_ps(_mm_loadu_si128(p0 as *const __m128i));
                let f1 = if two { _mm256_cvtph_ps(_mm_loadu_si128(p1 as *const __m128i)) } else { _mm256_setzero_ps() };
                let d = _mm256_shuffle_ps::<0b10_00_10_00>(f0, f1);
                let m = _mm256_shuffle_ps::<0b11_01_11_01>(f0, f1);
                let rows = |v: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)));
                _mm256_storeu_ps(dst.add(256) as *mut f32, rows(d));
                _mm256_storeu_ps(dst.add(288) as *mut f32, rows(m));
            } else {
                _mm256_storeu_ps(dst.add(256) as *mut f32, scales8(p0, p1, two));
                _mm256_storeu_ps(dst.add(288) as *mut f32, _mm256_setzero_ps());
            }
        }
    }
}
