//! GGML block layouts, byte for byte as ggml defines them (`ggml-common.h`). Each struct has a
//! compile-time size assert; weights in a GGUF are reinterpreted as slices of these blocks.

use half::f16;

pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
pub const QK5_1: usize = 32;
pub const QK4_NL: usize = 32;
pub const QK5_0: usize = 32;
pub const QK8_0: usize = 32;
pub const QK8_1: usize = 32;
pub use corelm_gguf::QK_K;
/// Bytes of packed scales/mins in a Q4_K/Q5_K super-block.
pub const K_SCALE_SIZE: usize = 12;

/// 32 weights: `x = d * (q - 8)`, q in 0..16, nibbles as in [`BlockQ4_1`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK4_0 / 2],
}

/// 32 weights: `x = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    /// Element j in the low nibble of byte j, element j+16 in its high nibble.
    pub qs: [u8; QK4_1 / 2],
}

/// 32 weights: `x = d * (q - 16)`, the fifth bit of each q in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0 {
    pub d: f16,
    /// Bit j is the high bit of element j (little-endian u32).
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}

/// 32 weights: `x = d * q + m`, q in 0..32, the fifth bit of each q in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}

/// 32 weights: `x = d * KVALUES_IQ4NL[q]`, nibbles as in [`BlockQ4_1`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; QK4_NL / 2],
}

/// The non-linear 4-bit grid of IQ4_NL and IQ4_XS (ggml `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// 32 weights of OCP microscaling FP4 (MXFP4, gpt-oss): `x = 2^(e − 127) · E2M1[q]`, kept as
/// ggml keeps it — doubled values [`KVALUES_MXFP4`] times half the scale ([`e8m0_half`]) —
/// nibbles as in [`BlockQ4_1`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockMXFP4 {
    /// The shared exponent (E8M0: no sign, no mantissa, bias 127).
    pub e: u8,
    pub qs: [u8; 16],
}

/// The E2M1 values doubled (ggml `kvalues_mxfp4`): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
/// negatives, times two.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of the E8M0 scale `2^(e − 127)`, the factor [`KVALUES_MXFP4`]'s doubled values take
/// (ggml's `ggml_e8m0_to_fp32_half`: subnormal for e < 2; e = 255 is not NaN here either).
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e - 1) as u32) << 23 };
    f32::from_bits(bits)
}

/// 32 values: `x = d * q`, q in -127..=127.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK8_0],
}

/// 32 activations for Q4_1 dot products: like Q8_0 plus `s = d * sum(qs)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK8_1],
}

/// 256 weights in 8 sub-blocks of 32: `x = d * sc * q - dmin * m`, 6-bit sc and m.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// 256 weights in 16 sub-blocks of 16: `x = d * (sc & 15) * q - dmin * (sc >> 4)`, q 2-bit.
/// Byte `l` of each 32-byte half of `qs` holds four elements `l + 32 * k` (k = shift / 2).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}

/// 256 weights in 16 sub-blocks of 16: `x = d * (sc - 32) * (q - 4 * !h)`, q 2-bit low part in
/// `qs` (as Q2_K), high bit in `hmask`, 6-bit scales packed in 12 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}

/// Like [`BlockQ4K`] plus a fifth bit of each q in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 256 weights in 8 sub-blocks of 32: `x = d * (ls - 32) * KVALUES_IQ4NL[q]`, 6-bit ls split
/// over `scales_l` (low 4 bits) and `scales_h` (high 2 bits).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

/// 256 weights in 8 sub-blocks of 32 (IQ2_XXS): per sub-block four `u16`s, the first two
/// four 8-value grid indices (bytes), the last two four 7-bit sign sets and a 4-bit scale
/// (bits 28‥32): `x = d · (2s+1)/8 · ±grid`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ2XXS {
    pub d: f16,
    pub qs: [u16; QK_K / 8],
}

/// IQ2_XS: per 8 values a `u16` of a 9-bit grid index and 7 sign bits; a 4-bit scale per 16.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ2XS {
    pub d: f16,
    pub qs: [u16; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}

/// IQ2_S: per 8 values an index byte (`qs[..32]`) with 2 high bits in `qh`, a sign byte
/// (`qs[32..]`); a 4-bit scale per 16.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ2S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}

/// IQ3_XXS: per 4 values a grid index byte (`qs[..64]`); per sub-block of 32 a `u32` of four
/// 7-bit sign sets and a 4-bit scale (`qs[64..]`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ3XXS {
    pub d: f16,
    pub qs: [u8; 3 * QK_K / 8],
}

/// IQ3_S: per 4 values an index byte with a ninth bit in `qh`; a sign bit per value; a 4-bit
/// scale per 32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ3S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}

/// IQ1_S: per 8 values an 11-bit index into the ternary grid (8 bits in `qs`, 3 in `qh`); per
/// sub-block of 32 a `u16` of those high bits, a 3-bit scale and the sign of a ±1/8 shift.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ1S {
    pub d: f16,
    pub qs: [u8; QK_K / 8],
    pub qh: [u16; QK_K / 32],
}

/// IQ1_M: as IQ1_S with a shift sign per 8 values (in `qh`), a 3-bit scale per 16, and the
/// super-block's f16 scale spread over the top nibbles of the four `u16`s of `scales`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}

/// 256 weights in 16 sub-blocks of 16: `x = d * sc * (q - 32)`, q 6-bit, sc i8.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// 256 activations for K-quant dot products, with sums of each 16 for the min terms.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18);
const _: () = assert!(std::mem::size_of::<BlockMXFP4>() == 17);
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);
const _: () = assert!(std::mem::size_of::<BlockIQ2XXS>() == 66);
const _: () = assert!(std::mem::size_of::<BlockIQ2XS>() == 74);
const _: () = assert!(std::mem::size_of::<BlockIQ2S>() == 82);
const _: () = assert!(std::mem::size_of::<BlockIQ3XXS>() == 98);
const _: () = assert!(std::mem::size_of::<BlockIQ3S>() == 110);
const _: () = assert!(std::mem::size_of::<BlockIQ1S>() == 50);
const _: () = assert!(std::mem::size_of::<BlockIQ1M>() == 56);

/// Plain-old-data block types that may be viewed from raw bytes.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only integer/float fields (every bit pattern
/// valid) and have no padding.
pub unsafe trait Block: Copy + 'static {}
// SAFETY: all of these are #[repr(C)] structs of integers, f16 and f32 with no padding (sizes
// asserted above equal the sum of their fields).
unsafe impl Block for BlockQ4_1 {}
// SAFETY: as above.
unsafe impl Block for BlockQ5_0 {}
// SAFETY: as above.
unsafe impl Block for BlockQ4_0 {}
// SAFETY: as above.
unsafe impl Block for BlockQ5_1 {}
// SAFETY: as above.
unsafe impl Block for BlockIQ4NL {}
// SAFETY: as above (bytes only).
unsafe impl Block for BlockMXFP4 {}
// SAFETY: as above.
unsafe impl Block for BlockQ2K {}
// SAFETY: as above.
unsafe impl Block for BlockQ3K {}
// SAFETY: as above.
unsafe impl Block for BlockQ5K {}
// SAFETY: as above (u16 scales_h is at offset 2, naturally aligned).
unsafe impl Block for BlockIQ4XS {}
// SAFETY: u16 (BF16 bits) is plain old data.
unsafe impl Block for u16 {}
// SAFETY: as above.
unsafe impl Block for BlockQ8_0 {}
// SAFETY: as above.
unsafe impl Block for BlockQ8_1 {}
// SAFETY: as above.
unsafe impl Block for BlockQ4K {}
// SAFETY: as above.
unsafe impl Block for BlockQ6K {}
// SAFETY: as above.
unsafe impl Block for BlockQ8K {}
// SAFETY: as above (the i-quants: f16 and u16 fields at even offsets, sizes asserted).
unsafe impl Block for BlockIQ2XXS {}
// SAFETY: as above.
unsafe impl Block for BlockIQ2XS {}
// SAFETY: as above.
unsafe impl Block for BlockIQ2S {}
// SAFETY: as above.
unsafe impl Block for BlockIQ3XXS {}
// SAFETY: as above.
unsafe impl Block for BlockIQ3S {}
// SAFETY: as above.
unsafe impl Block for BlockIQ1S {}
// SAFETY: as above (bytes only).
unsafe impl Block for BlockIQ1M {}
// SAFETY: primitive.
unsafe impl Block for f32 {}
// SAFETY: f16 is repr(transparent) over u16.
unsafe impl Block for f16 {}

/// View bytes as blocks. Panics if the length is not a whole number of blocks or the pointer is
/// misaligned: both are caller bugs (GGUF data is 32-byte aligned and rows are whole blocks).
#[inline]
pub fn as_blocks<T: Block>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len().is_multiple_of(size), "byte length {} not a multiple of {size}", bytes.len());
    assert!((bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()), "misaligned block data");
    // SAFETY: length and alignment checked above; T is plain old data (Block's contract).
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) }
}

/// The bytes of a slice of blocks.
#[inline]
pub fn bytes_of<T: Block>(s: &[T]) -> &[u8] {
    // SAFETY: T is plain old data without padding (Block's contract); u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// Mutable view of bytes as blocks; same checks as [`as_blocks`].
#[inline]
pub fn as_blocks_mut<T: Block>(bytes: &mut [u8]) -> &mut [T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len().is_multiple_of(size), "byte length {} not a multiple of {size}", bytes.len());
    assert!((bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()), "misaligned block data");
    // SAFETY: length and alignment checked above; T is plain old data; the borrow is unique.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, bytes.len() / size) }
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K super-block (ggml `get_scale_min_k4`).
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}
