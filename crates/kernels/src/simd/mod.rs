//! The bottom of the kernels crate: which SIMD features this CPU has (detected once), the
//! lane orders of the SIMD horizontal sums written out for the portable twins, and
//! ([`x86`]) the intrinsic helpers every x86 kernel shares.

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// An instruction-set level: which kernel table runs (`dispatch::Kernels::for_isa`) and which
/// row kernels (norm, RoPE, activations) it takes. Ordered within an architecture: a level
/// includes the levels of its architecture below it (and `Portable`); the aarch64 levels sort
/// below the x86 ones, so `isa >= Isa::Avx2` means "an x86 SIMD table". A level of another
/// architecture never passes [`Isa::check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// The portable twins only.
    Portable,
    /// aarch64 with NEON (every aarch64 CPU): widening multiplies for the integer dots.
    Neon,
    /// NEON plus the dot-product extension (`sdot`; Armv8.2+, e.g. Neoverse N1, Apple M1).
    Dotprod,
    /// Dotprod plus the Scalable Matrix Extension (Armv9.2, e.g. Apple M4): the panel GEMM's
    /// outer-product kernels (`matmul::aarch64::sme`). Needs a streaming vector of 256 bits or
    /// more, and (checked by `dispatch`, not here) the start-up self-test passed.
    Sme,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// AVX2 plus AVX-512 F, BW, VL and VNNI (BF16 where present, for the BF16 dots).
    Avx512,
    /// AVX-512 plus Intel AMX (TILE and INT8; Sapphire Rapids and later), granted by the kernel
    /// (`arch_prctl`): the AVX-512 table whose panel GEMM runs on the tile unit
    /// (`matmul::gemm::amx`). Like SME, `dispatch` grants it only after the start-up self-test.
    Amx,
}

impl Isa {
    pub const ALL: [Isa; 7] = [Isa::Portable, Isa::Neon, Isa::Dotprod, Isa::Sme, Isa::Avx2, Isa::Avx512, Isa::Amx];

    /// The name `--isa` and `CORELM_ISA` take.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Neon => "neon",
            Isa::Dotprod => "dotprod",
            Isa::Sme => "sme",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// The highest level this CPU has the features of (detected once). `dispatch::best_isa`
    /// is this, stepped down from [`Isa::Sme`] where the SME self-test fails.
    pub fn detected() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Isa::ALL.into_iter().rev().find(|i| i.missing().is_empty()).unwrap_or(Isa::Portable))
    }

    /// The CPU features this level needs that the CPU lacks (empty: it runs here).
    pub fn missing(self) -> Vec<&'static str> {
        let need: &[&'static str] = match self {
            Isa::Portable => &[],
            Isa::Neon => &["neon"],
            Isa::Dotprod => &["neon", "dotprod"],
            Isa::Sme => &["neon", "dotprod", "sme", "sme-vl256"],
            Isa::Avx2 => &["avx2", "fma", "f16c"],
            Isa::Avx512 => &["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni"],
            Isa::Amx => &["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "amx-tile", "amx-int8", "amx-permission"],
        };
        need.iter().copied().filter(|f| !cpu_has(f)).collect()
    }

    /// Whether this level runs the AVX-512 vector kernels (AVX-512 itself, and AMX, whose
    /// table is AVX-512's with the tile unit's panel GEMM).
    pub fn avx512(self) -> bool {
        matches!(self, Isa::Avx512 | Isa::Amx)
    }

    /// `self` if this CPU runs it, otherwise an error naming the missing features.
    pub fn check(self) -> Result<Isa, IsaError> {
        let missing = self.missing();
        if missing.is_empty() {
            Ok(self)
        } else {
            Err(IsaError::Unsupported { isa: self, missing, best: Isa::detected() })
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Isa {
    type Err = IsaError;
    fn from_str(s: &str) -> Result<Isa, IsaError> {
        Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(s.trim())).ok_or_else(|| IsaError::Unknown(s.to_string()))
    }
}

/// A kernel table that cannot be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsaError {
    Unknown(String),
    Unsupported { isa: Isa, missing: Vec<&'static str>, best: Isa },
    AlreadyChosen { isa: Isa, chosen: Isa },
    /// The CPU has the features but the level's kernels failed their start-up self-test.
    SelfTest { isa: Isa, best: Isa },
}

impl std::fmt::Display for IsaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IsaError::Unknown(s) => write!(f, "unknown ISA {s:?}: expected portable, neon, dotprod, sme, avx2, avx512 or amx"),
            IsaError::Unsupported { isa, missing, best } => {
                write!(f, "this CPU cannot run the {isa} kernels: it lacks {}; the highest it runs is {best}", missing.join(", "))
            }
            IsaError::AlreadyChosen { isa, chosen } => write!(f, "cannot switch the kernels to {isa}: this process already runs {chosen}"),
            IsaError::SelfTest { isa, best } => {
                write!(f, "the {isa} kernels disagree with their portable model on this CPU (start-up self-test), so they are disabled; the highest level that runs is {best}")
            }
        }
    }
}

impl std::error::Error for IsaError {}

/// Whether the CPU has one named feature (`std::is_x86_feature_detected!` and
/// `std::arch::is_aarch64_feature_detected!` names); a feature of another architecture: no.
fn cpu_has(feature: &str) -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        match feature {
            "neon" => std::arch::is_aarch64_feature_detected!("neon"),
            "dotprod" => std::arch::is_aarch64_feature_detected!("dotprod"),
            "sme" => aarch64::has_sme(),
            // The panel kernel keeps a panel's 8 columns × 4 codes (32 bytes) in one vector.
            "sme-vl256" => aarch64::has_sme() && aarch64::sme_vector_bytes() >= 32,
            _ => false,
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            "avx2" => std::is_x86_feature_detected!("avx2"),
            "fma" => std::is_x86_feature_detected!("fma"),
            "f16c" => std::is_x86_feature_detected!("f16c"),
            "avx512f" => std::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::is_x86_feature_detected!("avx512bw"),
            "avx512vl" => std::is_x86_feature_detected!("avx512vl"),
            "avx512vnni" => std::is_x86_feature_detected!("avx512vnni"),
            "amx-tile" => x86::amx_cpuid().0,
            "amx-int8" => x86::amx_cpuid().1,
            // The kernel's leave to use the tile data (asked once for the whole process).
            "amx-permission" => x86::amx_permitted(),
            _ => false,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = feature;
        false
    }
}

/// The cache level a [`prefetch`] asks lines into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLevel {
    /// Into L1 (and the levels below): data read within the next few hundred instructions.
    L1,
    /// Into L2: data read later, or more of it than L1 holds.
    L2,
}

/// How far ahead of what it is reading a one-pass stream (a decode GEMV's weights, the read
/// bandwidth probe) asks for its bytes. One core's hardware prefetcher alone leaves bandwidth
/// unread on some CPUs: on a Zen 5 core, asking 8 KiB ahead lifted the AVX2 Q4_1 GEMV from
/// 28–30 to 38–40 GB/s (2 KiB: 30–31; 16 KiB: no more than 8).
pub const STREAM_AHEAD: usize = 8192;

/// Ask for every cache line `bytes` touches to be brought into `level`: rows whose addresses
/// the hardware prefetcher cannot foresee (the KV rows of a chunk of cells, the rows of the
/// next firing neurons). A hint: it never faults and changes no result.
#[inline(always)]
pub fn prefetch(bytes: &[u8], level: CacheLevel) {
    // From the cache line holding the first byte to the one holding the last.
    let start = bytes.as_ptr() as usize % 64;
    prefetch_lines(bytes.as_ptr().wrapping_sub(start), bytes.len() + start, level);
}

/// Ask for the `bytes.div_ceil(64)` cache lines at `p`, `p + 64`, … to be brought into `level`
/// (`prefetcht0`/`t1` on x86-64, `prfm pldl1keep`/`pldl2keep` on aarch64, nothing elsewhere).
/// The addresses are only computed (wrapping), never dereferenced, and a prefetch never faults:
/// `p` may point past the end of what is read (a GEMV's rows ahead of the last one).
#[inline(always)]
pub fn prefetch_lines(p: *const u8, bytes: usize, level: CacheLevel) {
    for off in (0..bytes).step_by(64) {
        let p = p.wrapping_add(off);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch hint; it never faults and writes nothing.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
            match level {
                CacheLevel::L1 => _mm_prefetch::<_MM_HINT_T0>(p as *const i8),
                CacheLevel::L2 => _mm_prefetch::<_MM_HINT_T1>(p as *const i8),
            }
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `prfm` is a hint: it never faults and writes nothing (its intrinsic is not
        // stable).
        unsafe {
            match level {
                CacheLevel::L1 => std::arch::asm!("prfm pldl1keep, [{p}]", p = in(reg) p, options(nostack, readonly, preserves_flags)),
                CacheLevel::L2 => std::arch::asm!("prfm pldl2keep, [{p}]", p = in(reg) p, options(nostack, readonly, preserves_flags)),
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let _ = (p, level);
    }
}

/// FMA, detected once: portable twins use it for `mul_add` (the same bits, without a libm
/// call), whatever the table.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_fma() -> bool {
    static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FMA.get_or_init(|| std::is_x86_feature_detected!("fma"))
}

/// F16C, detected once: portable twins use it for single F16 conversions (exact either way).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_f16c() -> bool {
    static F16C: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F16C.get_or_init(|| std::is_x86_feature_detected!("f16c"))
}

/// `dst[i]` = `src[i]` rounded to the nearest F16 (ties to even, as `f16::from_f32`) and
/// widened back, with F16C or NEON eight or four at a time where present: `half` checks the CPU
/// on every value, which cost a decode attention call at depth 256 about as much as 100 cells.
pub fn round_f16_row(src: &[f32], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: F16C detected.
    let done = if has_f16c() { unsafe { x86::round_f16_row(&src[..n], &mut dst[..n]) } } else { 0 };
    #[cfg(target_arch = "aarch64")]
    let done = aarch64::round_f16_row(&src[..n], &mut dst[..n]);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let done = 0;
    for (d, &s) in dst[done..n].iter_mut().zip(&src[done..n]) {
        *d = half::f16::from_f32(s).to_f32();
    }
}

/// Sum of 16 lanes in the order of GCC's `_mm512_reduce_add_ps`: halves, then [`hsum_8`].
#[inline]
pub fn reduce_add_16(a: &[f32; 16]) -> f32 {
    hsum_8(&std::array::from_fn(|i| a[8 + i] + a[i]))
}

/// Sum of 8 lanes in the order of `hsum_f32x8` (and the lower steps of `_mm512_reduce_add_ps`):
/// halves, then `[0] + [2]` and `[1] + [3]`, then those two.
#[inline]
pub fn hsum_8(a: &[f32; 8]) -> f32 {
    let h: [f32; 4] = std::array::from_fn(|i| a[4 + i] + a[i]);
    (h[0] + h[2]) + (h[1] + h[3])
}

#[cfg(test)]
mod tests {
    /// The SIMD rounding gives `half`'s bits for normal, subnormal, tied, huge and odd values,
    /// over lengths that leave a scalar tail.
    #[test]
    fn round_f16_row_matches_half() {
        let mut src: Vec<f32> = vec![0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 1e6, -1e6, 6.1e-5, 3e-7, 1e-9, f32::INFINITY, f32::NEG_INFINITY];
        // Ties: halfway between two F16 values at a few exponents.
        src.extend([1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0, 1024.0 + 0.5, 2048.0 + 1.0]);
        let mut x = 0x1234_5678u32;
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            src.push(f32::from_bits(x & 0xBFFF_FFFF));
        }
        for n in [0, 3, 8, 15, src.len()] {
            let mut dst = vec![f32::NAN; n];
            super::round_f16_row(&src[..n], &mut dst);
            for (s, d) in src[..n].iter().zip(&dst) {
                let want = half::f16::from_f32(*s).to_f32();
                assert!(want.to_bits() == d.to_bits() || (want.is_nan() && d.is_nan()), "{s}: {d} vs {want}");
            }
        }
    }
}
