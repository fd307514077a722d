//! Helpers shared by the kernel test files: a deterministic generator and well-formed random
//! weight rows.
#![allow(dead_code)]

use corelm_kernels::quant::blocks::*;
use corelm_kernels::{row_bytes, DType, Isa, Kernels};
use half::f16;

/// Deterministic xorshift, so failures reproduce.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn f32(&mut self) -> f32 {
        (self.next() % 2_000_001) as f32 / 1_000_000.0 - 1.0
    }
}

/// A random but well-formed weight row of `n` elements: random quant bits, scales in a range
/// real models use.
pub fn random_row(t: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b = vec![0u8; row_bytes(t, n)];
    b.iter_mut().for_each(|x| *x = rng.next() as u8);
    let sc = |rng: &mut Rng| f16::from_f32(0.01 + 0.02 * rng.f32().abs());
    match t {
        DType::F32 => as_blocks_mut::<f32>(&mut b).iter_mut().for_each(|x| *x = rng.f32()),
        DType::F16 => as_blocks_mut::<f16>(&mut b).iter_mut().for_each(|x| *x = f16::from_f32(rng.f32())),
        DType::Q4_1 => as_blocks_mut::<BlockQ4_1>(&mut b).iter_mut().for_each(|x| {
            x.d = sc(rng);
            x.m = f16::from_f32(-0.1 * rng.f32().abs());
        }),
        DType::Q5_0 => as_blocks_mut::<BlockQ5_0>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::Q8_0 => as_blocks_mut::<BlockQ8_0>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::Q4K => as_blocks_mut::<BlockQ4K>(&mut b).iter_mut().for_each(|x| {
            x.d = sc(rng);
            x.dmin = sc(rng);
        }),
        DType::Q6K => as_blocks_mut::<BlockQ6K>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::Q4_0 => as_blocks_mut::<BlockQ4_0>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::Q5_1 => as_blocks_mut::<BlockQ5_1>(&mut b).iter_mut().for_each(|x| {
            x.d = sc(rng);
            x.m = f16::from_f32(-0.2 * rng.f32().abs());
        }),
        DType::IQ4NL => as_blocks_mut::<BlockIQ4NL>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::Q2K => as_blocks_mut::<BlockQ2K>(&mut b).iter_mut().for_each(|x| {
            x.d = sc(rng);
            x.dmin = sc(rng);
        }),
        DType::Q3K => as_blocks_mut::<BlockQ3K>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::Q5K => as_blocks_mut::<BlockQ5K>(&mut b).iter_mut().for_each(|x| {
            x.d = sc(rng);
            x.dmin = sc(rng);
        }),
        DType::IQ4XS => as_blocks_mut::<BlockIQ4XS>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::IQ2XXS => as_blocks_mut::<BlockIQ2XXS>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::IQ2XS => as_blocks_mut::<BlockIQ2XS>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::IQ2S => as_blocks_mut::<BlockIQ2S>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::IQ3XXS => as_blocks_mut::<BlockIQ3XXS>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::IQ3S => as_blocks_mut::<BlockIQ3S>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        DType::IQ1S => as_blocks_mut::<BlockIQ1S>(&mut b).iter_mut().for_each(|x| x.d = sc(rng)),
        // The f16 scale's four nibbles sit at the top of the four u16s of `scales`.
        DType::IQ1M => as_blocks_mut::<BlockIQ1M>(&mut b).iter_mut().for_each(|x| {
            let d = sc(rng).to_bits();
            for i in 0..4 {
                x.scales[2 * i + 1] = (x.scales[2 * i + 1] & 0x0F) | (((d >> (4 * i)) & 0xF) << 4) as u8;
            }
        }),
        // Exponents around 2^0, the range gpt-oss's blocks take.
        DType::MXFP4 => as_blocks_mut::<BlockMXFP4>(&mut b).iter_mut().for_each(|x| x.e = 118 + (x.e % 16)),
        DType::BF16 => as_blocks_mut::<u16>(&mut b)
            .iter_mut()
            .for_each(|x| *x = (rng.f32().to_bits() >> 16) as u16),
        _ => unreachable!(),
    }
    b
}

pub fn aligned(bytes: Vec<u8>) -> Vec<u8> {
    // Vec<u8> from the global allocator is at least 8-aligned for these sizes in practice;
    // assert so a platform where it is not fails loudly rather than reading misaligned.
    assert_eq!(bytes.as_ptr() as usize % 4, 0);
    bytes
}


/// The kernel table of every ISA level this CPU runs, lowest first (portable always).
pub fn tables() -> Vec<Kernels> {
    Isa::ALL.into_iter().filter_map(|i| Kernels::for_isa(i).ok()).collect()
}
