//! x86-64 helpers below every SIMD kernel: F16 scalar conversions that stay inlined (F16C),
//! the horizontal sums whose lane order the portable twins reproduce (`simd::hsum_8`), F16
//! loads and widening, and an 8×8 f32 transpose.
//!
//! # Safety
//! Every `#[target_feature]` function here may be called only on a CPU with the features it
//! names; the kernels that call them are reached only after the same features were detected.
#![allow(clippy::missing_safety_doc)]

use super::reduce_add_16;
use half::f16;
use std::arch::x86_64::*;

/// F16 → f32 with the F16C instruction (exact, like `half`'s conversion, but inlined: `half`
/// checks the CPU on every call, which cost more than the SIMD work in the dot products).
#[inline]
#[target_feature(enable = "f16c")]
pub(crate) fn h2f(h: half::f16) -> f32 {
    // Not `_mm_cvtsi32_si128`: LLVM sees that only lane 0 is read and lowers it to a `vpinsrw`
    // into whatever register it picks, a false dependency that chained every block of a dot
    // product through the scalar accumulator (~11 cycles per block at decode). `vmovd` from a
    // general register writes the whole xmm register.
    let r: __m128;
    // SAFETY: two register-only instructions (`vmovd`, `vcvtph2ps`); F16C is enabled here.
    unsafe {
        std::arch::asm!(
            "vmovd {t}, {x:e}",
            "vcvtph2ps {t}, {t}",
            x = in(reg) h.to_bits() as u32,
            t = out(xmm_reg) r,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    _mm_cvtss_f32(r)
}

/// f32 → F16 with F16C (round to nearest even, as `half`).
#[inline]
#[target_feature(enable = "f16c")]
pub(crate) fn f2h(v: f32) -> half::f16 {
    half::f16::from_bits(_mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v))) as u16)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum_f32x8(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// The 16 lanes summed as GCC's `_mm512_reduce_add_ps` (`simd::reduce_add_16`): halves,
/// quarters, then `(t0 + t2) + (t1 + t3)`.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(crate) fn reduce_add_ps16(t: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(t)));
    hsum_f32x8(_mm256_add_ps(hi, _mm512_castps512_ps256(t)))
}

/// The largest of the 8 lanes (`maxps` pairwise: high half against low, then within).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hmax_f32x8(x: __m256) -> f32 {
    let r = _mm_max_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    let r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)))
}

/// The largest of `x`'s values (-∞ if empty), 8 lanes at a time: the value of a scalar
/// `f32::max` fold (max is exact, so the order does not matter; a NaN is skipped as there,
/// since `maxps` returns its second operand, the running maximum, when either is NaN).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn max_f32(x: &[f32]) -> f32 {
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        // SAFETY: 8 f32 readable; unaligned load.
        m = _mm256_max_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, m);
    }
    chunks.remainder().iter().fold(hmax_f32x8(m), |m, &v| m.max(v))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum_i32x8(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load_ph(p: &[f16]) -> __m256 {
    assert!(p.len() >= 8);
    // SAFETY: at least 8 f16 (16 bytes) readable; unaligned load.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.as_ptr() as *const __m128i)) }
}

/// 8×8 transpose of f32 rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// `simd::round_f16_row` eight at a time: the values done (a multiple of 8; the caller rounds
/// the rest).
#[inline]
#[target_feature(enable = "avx,f16c")]
pub(crate) fn round_f16_row(src: &[f32], dst: &mut [f32]) -> usize {
    let n = src.len().min(dst.len()) / 8 * 8;
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 <= n <= both lengths; unaligned load and store.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    n
}

/// F16 → f32, 8 at a time (`dst.len() % 8 == 0`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn widen(src: &[f16], dst: &mut [f32]) {
    let mut d = 0;
    while d + 8 <= dst.len() {
        // SAFETY: d + 8 <= dst.len(); unaligned store.
        unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(d), load_ph(&src[d..])) };
        d += 8;
    }
}

/// ggml's fold of its four 16-lane accumulators (here eight 8-lane halves: accumulator j =
/// `acc[2j], acc[2j + 1]`): 0+2 and 1+3, then 0+1, then the 16 lanes as `reduce_add_16`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fold_ggml(acc: &[__m256; 8]) -> f64 {
    let (a0, a1) = (_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[1], acc[5]));
    let (a2, a3) = (_mm256_add_ps(acc[2], acc[6]), _mm256_add_ps(acc[3], acc[7]));
    let (lo, hi) = (_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    let mut lanes = [0f32; 16];
    // SAFETY: 16 f32 of stack memory.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    }
    reduce_add_16(&lanes) as f64
}

/// Whether the AVX2 table's integer kernels use AVX-VNNI (`vpdpbusd` on 256-bit vectors, VEX:
/// Intel since Alder Lake, AMD since Zen 5) where the CPU has it: the interleaved GEMV and
/// tiles (`matmul::x86::avx2_il`) and the panel GEMM (`matmul::gemm::x86`), the same bits as
/// their `maddubs` forms. `CORELM_AVX_VNNI=0` turns it off, to measure or test the plain AVX2
/// kernels on such a CPU; read once per process.
pub fn avx_vnni() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::is_x86_feature_detected!("avxvnni") && std::env::var("CORELM_AVX_VNNI").map_or(true, |v| v != "0"))
}

/// Whether the CPU reports AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25). Whether
/// the kernel lets this process use them is [`amx_permitted`].
pub fn amx_cpuid() -> (bool, bool) {
    // CPUID leaf 7 exists on every x86-64 CPU with AVX2; on an older one it reads zeros.
    let edx = __cpuid_count(7, 0).edx;
    (edx >> 24 & 1 == 1, edx >> 25 & 1 == 1)
}

/// Linux's `arch_prctl` request for leave to use an extended state component, and its reader.
const ARCH_GET_XCOMP_PERM: i64 = 0x1022;
const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
/// The AMX tile data state component (XTILEDATA).
const XFEATURE_XTILEDATA: i64 = 18;
const SYS_ARCH_PRCTL: i64 = 158;

unsafe extern "C" {
    /// glibc's raw system call.
    fn syscall(num: i64, ...) -> i64;
}

/// Whether this process may use the AMX tiles: the CPU has AMX-TILE and AMX-INT8 and Linux
/// granted the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`, asked once,
/// process-wide; read back with `ARCH_GET_XCOMP_PERM`). Without that grant the first tile
/// instruction of any thread raises SIGILL, so nothing may use AMX unless this said yes.
pub fn amx_permitted() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        if amx_cpuid() != (true, true) || cfg!(not(target_os = "linux")) {
            return false;
        }
        let mut granted: u64 = 0;
        // SAFETY: `arch_prctl` with these requests reads an integer argument and writes one
        // u64 through the pointer given (a live local); a kernel without them returns an error.
        let (req, get) = unsafe {
            (
                syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
                syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, &mut granted as *mut u64),
            )
        };
        req == 0 && get == 0 && granted >> XFEATURE_XTILEDATA & 1 == 1
    })
}

/// Whether this CPU issues 512-bit `vpdpbusd` as often as its 256-bit form (Zen 5 desktop and
/// server, Intel cores with two 512-bit units), rather than half as often (Zen 4, whose 512-bit
/// operations take its 256-bit pipes twice; Zen 5 mobile). It decides the AVX-512 panel GEMM's
/// default register tile (`gemm::default_schedule`): eight rows where the wide form runs at
/// full rate (Zen 5 server, 16 rows in L2: 5–24 % faster than four rows over Q4_0‥Q6_K), four
/// where it is split (Zen 4: eight rows 144 µs against 126). Timed once per process, under
/// 0.2 ms: twelve independent accumulators in each width, the best of 24 interleaved rounds;
/// the two widths' times differ by about 2× or not at all, so a ratio of 1.5 parts them
/// whatever the clock. `CORELM_VNNI512_FULL=0|1` sets the answer instead (to measure or test
/// either default on one CPU). False without AVX-512 VNNI.
pub fn vnni512_full_rate() -> bool {
    static FULL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FULL.get_or_init(|| {
        if let Ok(v) = std::env::var("CORELM_VNNI512_FULL") {
            if !v.trim().is_empty() {
                return v.trim() != "0";
            }
        }
        if !(std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512vl")) {
            return false;
        }
        let (mut wide, mut half) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..24 {
            // SAFETY: AVX-512 F/VL/VNNI detected above.
            unsafe {
                half = half.min(time_vpdpbusd::<false>());
                wide = wide.min(time_vpdpbusd::<true>());
            }
        }
        wide < 1.5 * half
    })
}

/// Seconds for 12 × 1024 dependent-per-accumulator `vpdpbusd`, 512-bit (`WIDE`) or 256-bit.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
fn time_vpdpbusd<const WIDE: bool>() -> f64 {
    const STEPS: usize = 1024;
    let w = std::hint::black_box(_mm512_set1_epi32(0x0102_0304));
    let x = std::hint::black_box(_mm512_set1_epi32(0x0101_0101));
    let mut acc = [_mm512_setzero_si512(); 12];
    let start = std::time::Instant::now();
    for _ in 0..STEPS {
        for a in acc.iter_mut() {
            *a = if WIDE {
                _mm512_dpbusd_epi32(*a, w, x)
            } else {
                _mm512_castsi256_si512(_mm256_dpbusd_epi32(_mm512_castsi512_si256(*a), _mm512_castsi512_si256(w), _mm512_castsi512_si256(x)))
            };
        }
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(acc);
    secs
}
