//! Exponentials exactly as the reference computes them: ggml's vectorised `expf`
//! ([`expf_ggml`], used by its softmax and SiLU) lane for lane, and ([`x86`]) its 8- and
//! 16-lane versions plus glibc's `expf` on 8 and 16 lanes (what ggml's one-chunk attention
//! gets from libm), and ([`aarch64`]) ggml's on 4 NEON lanes, all bit-identical to the scalar
//! functions they replace.

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86;

/// ggml's vectorised `expf` (`ggml_v_expf`, the AVX-512 build; from Arm's optimized routines),
/// lane for lane: max error 1.45 ulp + 0.5, overflow to +inf above ~88.38, zero below ~-103.97.
#[inline(always)]
pub fn expf_ggml(x: f32) -> f32 {
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3FB8_AA3B), r); // 0x1.715476p+0 = log2(e)
    let n = z - r;
    // ln2 split in two: 0x1.62e4p-1 + 0x1.7f7d1cp-20.
    let b = (-n).mul_add(f32::from_bits(0x35BF_BE8E), (-n).mul_add(f32::from_bits(0x3F31_7200), x));
    let u = b * b;
    // Polynomial coefficients 0x1.0e4020p-7, 0x1.573e2ep-5, 0x1.555e66p-3, 0x1.fffdb6p-2, 0x1.ffffecp-1.
    let j = f32::from_bits(0x3C07_2010)
        .mul_add(b, f32::from_bits(0x3D2B_9F17))
        .mul_add(u, f32::from_bits(0x3E2A_AF33).mul_add(b, f32::from_bits(0x3EFF_FEDB)))
        .mul_add(u, f32::from_bits(0x3F7F_FFF6).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n as i32)
}

/// `j · 2^n` with one rounding (as `vscalefps`), for |n| ≤ 192.
#[inline(always)]
fn scalef(j: f32, n: i32) -> f32 {
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    if (-126..=127).contains(&n) {
        j * pow2(n)
    } else if n > 127 {
        j * pow2(127) * pow2(n - 127)
    } else {
        // Scale into the normal range first so the final product rounds once: j · 2^(n+100)
        // is exact (n ≥ -192 keeps it normal), × 2^-100 rounds. (With +64, n = -192 made the
        // first factor's exponent field -1, i.e. -∞.)
        (j * pow2(n + 100)) * pow2(-100)
    }
}
