//! The bottom of the kernels crate: which SIMD features this CPU has (detected once), the
//! lane orders of the SIMD horizontal sums written out for the portable twins, and
//! ([`x86`]) the intrinsic helpers every x86 kernel shares.

#[cfg(target_arch = "x86_64")]
pub mod x86;

/// Detected once.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_fma() -> bool {
    static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FMA.get_or_init(|| std::is_x86_feature_detected!("fma"))
}

#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| {
        has_avx2() && std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl")
    })
}

#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"))
}

#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_f16c() -> bool {
    static F16C: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F16C.get_or_init(|| std::is_x86_feature_detected!("f16c"))
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

/// Whether this CPU runs the VNNI panel kernel.
pub fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}
