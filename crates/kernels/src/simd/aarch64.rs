//! aarch64 feature detection that `std::arch::is_aarch64_feature_detected!` does not give on
//! this toolchain — the Scalable Matrix Extension, read from the kernel's `AT_HWCAP2` bits, and
//! its streaming vector length (`rdsvl`) — and the NEON helpers the aarch64 kernels share:
//! F16 loads and rounding (`fcvtl`/`fcvtn`), the 16-lane sum in `simd::reduce_add_16`'s order.

use std::arch::aarch64::*;

/// `getauxval` key of the second hardware-capability word.
const AT_HWCAP2: u64 = 26;
/// `HWCAP2_*` bits (Linux `arch/arm64/include/uapi/asm/hwcap.h`): SME itself, its 8-bit
/// integer outer products into 32-bit tiles, and its single-precision ones.
const HWCAP2_SME: u64 = 1 << 23;
const HWCAP2_SME_I8I32: u64 = 1 << 26;
const HWCAP2_SME_F32F32: u64 = 1 << 29;

extern "C" {
    /// glibc's auxiliary-vector reader.
    fn getauxval(key: u64) -> u64;
}

/// Whether the kernel reports SME with the int8 → int32 and f32 outer products (detected once).
pub fn has_sme() -> bool {
    static SME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SME.get_or_init(|| {
        // SAFETY: `getauxval` reads the process's auxiliary vector; any key is valid (an
        // absent one gives 0).
        let caps = unsafe { getauxval(AT_HWCAP2) };
        let need = HWCAP2_SME | HWCAP2_SME_I8I32 | HWCAP2_SME_F32F32;
        caps & need == need
    })
}

/// Whether the CPU has the 8-bit integer matrix multiply extension (`usmmla`; FEAT_I8MM).
pub fn has_i8mm() -> bool {
    std::arch::is_aarch64_feature_detected!("i8mm")
}

/// The streaming vector length in bytes (16..256; one ZA tile of 32-bit elements is
/// `bytes / 4` square). 0 without SME.
pub fn sme_vector_bytes() -> usize {
    static SVL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SVL.get_or_init(|| {
        if !has_sme() {
            return 0;
        }
        let bytes: u64;
        // SAFETY: SME is present (checked above); `rdsvl` reads the streaming vector length
        // without entering streaming mode and touches no other state.
        unsafe { std::arch::asm!(".arch_extension sme", "rdsvl {0}, #1", out(reg) bytes, options(nomem, nostack, preserves_flags)) };
        bytes as usize
    })
}

// F16 ⇄ f32 conversions on NEON vectors, through `asm!`: the intrinsics (`vcvt_f32_f16`,
// `vcvt_f16_f32`) take `float16x4_t`, which is not stable. `fcvtl`/`fcvtn` are base Armv8 (no
// FP16 arithmetic extension needed) and round to nearest even under the default FPCR, as
// `half::f16::from_f32` and x86's `vcvtps2ph` with `_MM_FROUND_TO_NEAREST_INT`.

/// 4 F16 values at `p`, widened (exact).
///
/// # Safety
/// 4 F16 values (8 bytes) readable at `p`.
#[inline(always)]
pub unsafe fn load_f16x4(p: *const half::f16) -> float32x4_t {
    // SAFETY (caller): 8 bytes readable at `p`; `vld1_u16` has no alignment requirement
    // beyond the element's, and F16 values are 2-byte aligned.
    from_f16_bits4(unsafe { vld1_u16(p as *const u16) })
}

/// 8 F16 values at `p`, widened (exact): values 0..4, then 4..8.
///
/// # Safety
/// 8 F16 values (16 bytes) readable at `p`.
#[inline(always)]
pub unsafe fn load_f16x8(p: *const half::f16) -> [float32x4_t; 2] {
    // SAFETY (caller): 16 bytes readable at `p`, 2-byte aligned.
    let h = unsafe { vld1q_u16(p as *const u16) };
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: register-only conversions; `lo` is written before `h` is read again, so it must
    // not share `h`'s register (`out`, not `lateout`).
    unsafe {
        std::arch::asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            lo = out(vreg) lo,
            hi = lateout(vreg) hi,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    [lo, hi]
}

/// Each lane rounded to the nearest F16 (ties to even, as `f16::from_f32`) and widened back.
#[inline(always)]
pub fn round_f16x4(x: float32x4_t) -> float32x4_t {
    from_f16_bits4(to_f16_bits4(x))
}

/// `simd::round_f16_row` four at a time: the values done (a multiple of 4; the caller rounds
/// the rest).
pub fn round_f16_row(src: &[f32], dst: &mut [f32]) -> usize {
    let n = src.len().min(dst.len()) / 4 * 4;
    for i in (0..n).step_by(4) {
        // SAFETY: i + 4 <= n <= both lengths; NEON is part of aarch64.
        unsafe { vst1q_f32(dst.as_mut_ptr().add(i), round_f16x4(vld1q_f32(src.as_ptr().add(i)))) };
    }
    n
}

/// The 16 lanes `t[0..4]` (lanes 4i..4i + 4 in `t[i]`) summed in the order of
/// `simd::reduce_add_16` (GCC's `_mm512_reduce_add_ps`): lane i + lane i + 8, then those
/// i + i + 4, then `(h0 + h2) + (h1 + h3)`.
#[inline(always)]
pub fn reduce_add_16x4(t: [float32x4_t; 4]) -> f32 {
    // SAFETY: register arithmetic; NEON is the aarch64 baseline.
    unsafe {
        let h = vaddq_f32(vaddq_f32(t[3], t[1]), vaddq_f32(t[2], t[0]));
        let u = vaddq_f32(h, vextq_f32::<2>(h, h));
        vgetq_lane_f32::<0>(u) + vgetq_lane_f32::<1>(u)
    }
}

/// A 4×4 block of f32 transposed: lane `j` of result `i` is lane `i` of `r[j]`.
#[inline(always)]
pub fn transpose4(r: [float32x4_t; 4]) -> [float32x4_t; 4] {
    // SAFETY: register permutes; NEON is the aarch64 baseline.
    unsafe {
        let t0 = vreinterpretq_f64_f32(vtrn1q_f32(r[0], r[1]));
        let t1 = vreinterpretq_f64_f32(vtrn2q_f32(r[0], r[1]));
        let t2 = vreinterpretq_f64_f32(vtrn1q_f32(r[2], r[3]));
        let t3 = vreinterpretq_f64_f32(vtrn2q_f32(r[2], r[3]));
        [
            vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)),
            vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)),
            vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)),
            vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)),
        ]
    }
}

/// Each lane rounded to the nearest F16 (ties to even), as F16 bits.
#[inline(always)]
pub fn to_f16_bits4(x: float32x4_t) -> uint16x4_t {
    let h: uint16x4_t;
    // SAFETY: a register-only conversion under the default rounding mode.
    unsafe { std::arch::asm!("fcvtn {h:v}.4h, {x:v}.4s", h = lateout(vreg) h, x = in(vreg) x, options(pure, nomem, nostack, preserves_flags)) };
    h
}

/// 4 F16 values given as bits, widened (exact).
#[inline(always)]
pub fn from_f16_bits4(h: uint16x4_t) -> float32x4_t {
    let y: float32x4_t;
    // SAFETY: a register-only conversion.
    unsafe { std::arch::asm!("fcvtl {y:v}.4s, {h:v}.4h", y = lateout(vreg) y, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags)) };
    y
}
