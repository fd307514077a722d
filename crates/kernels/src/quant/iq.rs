//! The 1-, 2- and 3-bit i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M).
//! One decoder of a 32-value sub-block, [`IqType::sub_block`] (grid entries, sign bytes,
//! scales, IQ1's shifts), serves every kernel: the SIMD ones (`matmul::x86::avx2_iq`,
//! `matmul::aarch64::neon_iq`) inline it per type; [`IqType::decode`] builds from it a whole
//! super-block in plain form, [`Decoded`], for the dequantizers here and the portable dots
//! (`matmul::portable`, ggml's generic order; `matmul::lanes`, ggml's AVX2 order).
//!
//! Every type stores groups of 4 or 8 values as an index into a lattice grid
//! ([`super::iq_grids`]) plus, for the 2- and 3-bit types, a sign per value, and an odd scale
//! `ls = 2s + 1` per 16 or 32 values. A value is `d · ls · C · (±grid)` with `C` the type's
//! constant ([`IqType::c`]); IQ1 grids are −1, 0, 1 and each value gains a shift of ±1/8:
//! `d · ls · (grid ± 1/8)`.

use super::blocks::*;
use super::iq_grids::*;
use half::f16;

/// The sign byte of a 7-bit sign set: bit 7 makes the count of set bits even (ggml's
/// `ksigns_iq2xs`).
#[inline]
pub const fn ksigns(s: u32) -> u8 {
    let s = (s & 127) as u8;
    s | (((s.count_ones() & 1) as u8) << 7)
}

/// For each sign byte, eight bytes of 1 or −1 (bit j set: byte j is −1): the NEON kernels'
/// sign multiplier (the x86 ones build the same bytes in registers, `avx2_iq::sign_mask`).
pub static SIGN_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            t[s] |= (if s >> j & 1 != 0 { 0xff } else { 0x01 }) << (8 * j);
            j += 1;
        }
        s += 1;
    }
    t
};

/// The i-quant types and what differs between them in the arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IqType {
    IQ2XXS,
    IQ2XS,
    IQ2S,
    IQ3XXS,
    IQ3S,
    IQ1S,
    IQ1M,
}

impl IqType {
    /// Every type, each at its own discriminant (`ALL[t as usize] == t`): the SIMD kernels
    /// take the type as a constant index, so each instance decodes one type.
    pub const ALL: [IqType; 7] = [IqType::IQ2XXS, IqType::IQ2XS, IqType::IQ2S, IqType::IQ3XXS, IqType::IQ3S, IqType::IQ1S, IqType::IQ1M];

    /// The GGML type of each of [`Self::ALL`], in the same order.
    const DTYPES: [crate::DType; 7] = {
        use crate::DType as D;
        [D::IQ2XXS, D::IQ2XS, D::IQ2S, D::IQ3XXS, D::IQ3S, D::IQ1S, D::IQ1M]
    };

    /// The i-quant type `t` is, if it is one of these.
    pub fn of(t: crate::DType) -> Option<IqType> {
        Self::DTYPES.iter().position(|&d| d == t).map(|i| Self::ALL[i])
    }

    /// The constant each value (and each dot product) is scaled by: `d · ls · C`.
    pub fn c(self) -> f32 {
        match self {
            IqType::IQ2XXS | IqType::IQ2XS | IqType::IQ2S => 0.125,
            IqType::IQ3XXS => 0.25,
            IqType::IQ3S | IqType::IQ1S | IqType::IQ1M => 1.0,
        }
    }

    /// Bytes of one super-block (its GGML type's block size).
    #[inline(always)]
    pub fn block_bytes(self) -> usize {
        Self::DTYPES[self as usize].type_size()
    }

    /// Decode one super-block (`block_bytes` bytes).
    pub fn decode(self, b: &[u8]) -> Decoded {
        let mut o = Decoded { d: self.d(b), v: [0; QK_K], ls: [0; QK_K / 16], shift: [0; QK_K / 8] };
        for ib in 0..QK_K / 32 {
            let s = self.sub_block(b, ib);
            (o.ls[2 * ib], o.ls[2 * ib + 1]) = (s.ls[0], s.ls[1]);
            o.shift[4 * ib..4 * ib + 4].copy_from_slice(&s.shift);
            for (l, (&grid, &signs)) in s.grid.iter().zip(&s.signs).enumerate() {
                for j in 0..8 {
                    let m = (grid >> (8 * j)) as u8 as i8;
                    o.v[32 * ib + 8 * l + j] = if signs >> j & 1 != 0 { -m } else { m };
                }
            }
        }
        o
    }

    /// The super-block scale of `b` (IQ1_M's spread over its scales' top nibbles).
    #[inline(always)]
    pub fn d(self, b: &[u8]) -> f32 {
        match self {
            IqType::IQ1M => iq1_m_scale(&as_blocks::<BlockIQ1M>(b)[0].scales).to_f32(),
            _ => f16::from_le_bytes([b[0], b[1]]).to_f32(),
        }
    }

    /// Sub-block `ib` (values `32·ib‥32·ib + 32`) of super-block `b` as every kernel takes it
    /// (the SIMD ones inline this with `self` constant, so the match folds away).
    #[inline(always)]
    pub fn sub_block(self, b: &[u8], ib: usize) -> Sub {
        let ksigns4 = |sg: u32| [ksigns(sg), ksigns(sg >> 7), ksigns(sg >> 14), ksigns(sg >> 21)];
        let halves = |sc: u8| [2 * (sc & 15) + 1, 2 * (sc >> 4) + 1];
        let (none, flat) = ([0u8; 4], [0i8; 4]);
        match self {
            IqType::IQ2XXS => {
                let q = &as_blocks::<BlockIQ2XXS>(b)[0].qs[4 * ib..4 * ib + 4];
                let (idx, sg) = (q[0] as usize | (q[1] as usize) << 16, q[2] as u32 | (q[3] as u32) << 16);
                let ls = (2 * (sg >> 28) + 1) as u8;
                Sub { grid: each4(|l: usize| IQ2XXS_GRID[idx >> (8 * l) & 255]), signs: ksigns4(sg), ls: [ls, ls], shift: flat }
            }
            IqType::IQ2XS => {
                let a = &as_blocks::<BlockIQ2XS>(b)[0];
                let q = &a.qs[4 * ib..4 * ib + 4];
                Sub { grid: each4(|l: usize| IQ2XS_GRID[(q[l] & 511) as usize]), signs: each4(|l: usize| ksigns((q[l] >> 9) as u32)), ls: halves(a.scales[ib]), shift: flat }
            }
            IqType::IQ2S => {
                let a = &as_blocks::<BlockIQ2S>(b)[0];
                let qh = a.qh[ib] as usize;
                let grid = each4(|l: usize| IQ2S_GRID[a.qs[4 * ib + l] as usize | (qh << (8 - 2 * l) & 0x300)]);
                let signs = a.qs[QK_K / 8 + 4 * ib..QK_K / 8 + 4 * ib + 4].try_into().unwrap();
                Sub { grid, signs, ls: halves(a.scales[ib]), shift: flat }
            }
            IqType::IQ3XXS => {
                let a = &as_blocks::<BlockIQ3XXS>(b)[0];
                let q = &a.qs[8 * ib..8 * ib + 8];
                let sg = u32::from_le_bytes(a.qs[QK_K / 4 + 4 * ib..QK_K / 4 + 4 * ib + 4].try_into().unwrap());
                let ls = (2 * (sg >> 28) + 1) as u8;
                let grid = each4(|l: usize| IQ3XXS_GRID[q[2 * l] as usize] as u64 | (IQ3XXS_GRID[q[2 * l + 1] as usize] as u64) << 32);
                Sub { grid, signs: ksigns4(sg), ls: [ls, ls], shift: flat }
            }
            IqType::IQ3S => {
                let a = &as_blocks::<BlockIQ3S>(b)[0];
                let (q, qh) = (&a.qs[8 * ib..8 * ib + 8], a.qh[ib] as usize);
                let grid = each4(|l: usize| {
                    let (i1, i2) = (q[2 * l] as usize | (qh << (8 - 2 * l) & 256), q[2 * l + 1] as usize | (qh << (7 - 2 * l) & 256));
                    IQ3S_GRID[i1] as u64 | (IQ3S_GRID[i2] as u64) << 32
                });
                let ls = 2 * (a.scales[ib / 2] >> (4 * (ib % 2)) & 15) + 1;
                Sub { grid, signs: a.signs[4 * ib..4 * ib + 4].try_into().unwrap(), ls: [ls, ls], shift: flat }
            }
            IqType::IQ1S => {
                let a = &as_blocks::<BlockIQ1S>(b)[0];
                let qh = a.qh[ib] as usize;
                let ls = (2 * ((qh >> 12) & 7) + 1) as u8;
                let grid = each4(|l: usize| IQ1S_GRID[a.qs[4 * ib + l] as usize | ((qh >> (3 * l)) & 7) << 8]);
                Sub { grid, signs: none, ls: [ls, ls], shift: [if qh & 0x8000 != 0 { -1 } else { 1 }; 4] }
            }
            IqType::IQ1M => {
                let a = &as_blocks::<BlockIQ1M>(b)[0];
                let s = u16::from_le_bytes([a.scales[ib / 2 * 2], a.scales[ib / 2 * 2 + 1]]) >> (6 * (ib % 2));
                let qh = |l: usize| a.qh[2 * ib + l / 2] as usize >> (4 * (l % 2));
                let grid = each4(|l: usize| IQ1S_GRID[a.qs[4 * ib + l] as usize | (qh(l) & 7) << 8]);
                let shift = each4(|l: usize| if qh(l) & 8 != 0 { -1 } else { 1 });
                Sub { grid, signs: none, ls: [(2 * (s & 7) + 1) as u8, (2 * ((s >> 3) & 7) + 1) as u8], shift }
            }
        }
    }

    /// Whether values carry the IQ1 shift ([`Decoded::shift`]).
    pub fn shifted(self) -> bool {
        matches!(self, IqType::IQ1S | IqType::IQ1M)
    }
}

/// One super-block in plain form.
#[derive(Clone, Copy, Debug)]
pub struct Decoded {
    /// The super-block's scale.
    pub d: f32,
    /// The 256 grid values, signs applied (|v| ≤ 62; IQ1: −1, 0, 1).
    pub v: [i8; QK_K],
    /// The odd scale `2s + 1` of each 16 values.
    pub ls: [u8; QK_K / 16],
    /// IQ1 only: the sign (±1) of the 1/8 shift of each 8 values; 0 for the other types.
    pub shift: [i8; QK_K / 8],
}

/// `[f(0), f(1), f(2), f(3)]` (not `array::map`, which the SIMD kernels' instances do not
/// inline).
#[inline(always)]
pub(crate) fn each4<T>(f: impl Fn(usize) -> T) -> [T; 4] {
    [f(0), f(1), f(2), f(3)]
}

/// One sub-block of 32 values as the kernels take it ([`IqType::sub_block`]).
#[derive(Clone, Copy, Debug)]
pub struct Sub {
    /// Four 8-value grid entries, little-endian bytes (IQ3: two 4-byte entries each; IQ1:
    /// bytes −1, 0, 1).
    pub grid: [u64; 4],
    /// Per entry, bit j set: its value j is negative (0 for IQ1, whose grid is signed).
    pub signs: [u8; 4],
    /// The odd scales of the first and second 16 values.
    pub ls: [u8; 2],
    /// IQ1: the sign (±1) of each entry's 1/8 shift; 0 otherwise.
    pub shift: [i8; 4],
}

/// The f16 scale of an IQ1_M super-block, spread over the top nibbles of its four `u16`s.
pub fn iq1_m_scale(scales: &[u8; QK_K / 32]) -> f16 {
    let sc = |i: usize| u16::from_le_bytes([scales[2 * i], scales[2 * i + 1]]);
    f16::from_bits((sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000))
}

/// Dequantize a row of `t` as ggml does, bit for bit: `(d·ls)·C·v`, IQ1 `(d·ls)·(v ± 1/8)`.
pub fn dequant(t: IqType, x: &[u8], y: &mut [f32]) {
    for (b, out) in x.chunks_exact(t.block_bytes()).zip(y.chunks_exact_mut(QK_K)) {
        let q = t.decode(b);
        for (i, o) in out.iter_mut().enumerate() {
            let dl = q.d * q.ls[i / 16] as f32;
            *o = if t.shifted() { dl * (q.v[i] as f32 + 0.125 * q.shift[i / 8] as f32) } else { dl * t.c() * q.v[i] as f32 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ksigns_matches_ggml_table_start() {
        // ggml-common.h's ksigns_iq2xs[0..8] and [120..128].
        assert_eq!((0..8).map(ksigns).collect::<Vec<_>>(), [0, 129, 130, 3, 132, 5, 6, 135]);
        assert_eq!((120..128).map(ksigns).collect::<Vec<_>>(), [120, 249, 250, 123, 252, 125, 126, 255]);
    }

    #[test]
    fn grids_match_ggml_entries() {
        // Entries of ggml's tables: first, middle, last.
        assert_eq!((IQ2XXS_GRID[0], IQ2XXS_GRID[128], IQ2XXS_GRID[255]), (0x0808080808080808, 0x082b2b0808082b08, 0x2b2b2b1908081908));
        assert_eq!((IQ2XS_GRID[256], IQ2XS_GRID[511]), (0x190808080808192b, 0x2b2b2b2b2b2b2b2b));
        assert_eq!((IQ2S_GRID[512], IQ2S_GRID[1023]), (0x19080819082b1919, 0x2b2b2b2b2b2b2b2b));
        assert_eq!((IQ3S_GRID[256], IQ3S_GRID[511]), (0x05090507, 0x0f0f0101));
        assert_eq!((IQ1S_GRID[1024], IQ1S_GRID[2047]), (0x0000000000ff0100, 0x0101010101010101));
        assert_eq!(IQ3XXS_GRID[..6], [0x04040404, 0x04040414, 0x04040424, 0x04040c0c, 0x04040c1c, 0x04040c3e]);
        assert_eq!(IQ1S_GRID[..4], [0xffffffffffffffff, 0xffffffffffffff01, 0xffffffffffff0000, 0xffffffffffff01ff]);
    }
}
