//! Row kernels for everything that is not a matrix product: RMS norm, RoPE, gated activations,
//! and (from [`crate::attention`], re-exported here) fused online-softmax attention. Portable
//! Rust with SIMD twins chosen at run time; numerics follow ggml-cpu (f64 sum of squares in RMS
//! norm, iterated RoPE angles, GELU through f16 as ggml's table does).

pub use crate::attention::*;
use half::f16;

/// `y = x / sqrt(mean(x²) + eps) * w` over one group (`x.len() == w.len()`): ggml's order, the
/// squares summed one by one in double.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let sum = x.iter().fold(0f64, |a, &v| a + (v * v) as f64);
    rms_scale(sum, x, w, eps, y);
}

fn rms_scale(sum: f64, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in y.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// [`rms_norm`] over every group of `w.len()` values of `x` (rows, or heads of rows), with the
/// same bits. With AVX2 and groups of a multiple of four values, the sums of eight groups run
/// together (`x86::norm`): one group alone is a chain of dependent double additions.
pub fn rms_norm_groups(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    #[cfg(target_arch = "x86_64")]
    if n.is_multiple_of(4) && has_avx2() {
        const CHUNK: usize = 64;
        let mut sums = [0f64; CHUNK];
        for (xc, yc) in x.chunks(CHUNK * n).zip(y.chunks_mut(CHUNK * n)) {
            let groups = xc.len() / n;
            // SAFETY: AVX2 and FMA were detected.
            unsafe { crate::x86::norm::sum_squares(xc, n, &mut sums[..groups]) };
            for ((xg, yg), &s) in xc.chunks_exact(n).zip(yc.chunks_exact_mut(n)).zip(&sums) {
                rms_scale(s, xg, w, eps, yg);
            }
        }
        return;
    }
    for (xg, yg) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        rms_norm(xg, w, eps, yg);
    }
}

/// Cosines and sines for one position: `cache[i] = cos θ_i`, `cache[n_rot/2 + i] = sin θ_i`,
/// with `θ_i = pos · freq_scale · base^(-2i/n_rot)` computed by repeated multiplication as ggml
/// does.
pub fn rope_cache(pos: i32, n_rot: usize, base: f32, freq_scale: f32, freq_factors: Option<&[f32]>, cache: &mut [f32]) {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    let half = n_rot / 2;
    for i in 0..half {
        // Per-frequency divisors (Llama 3 `rope_freqs`, Phi-3 rope factors), as ggml applies them.
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let t = freq_scale * (theta / ff);
        cache[i] = t.cos();
        cache[half + i] = t.sin();
        theta *= theta_scale;
    }
}

/// Rotate one head in place. `neox`: pairs `(i, i + n_rot/2)` (GPT-NeoX, Qwen, Gemma); otherwise
/// adjacent pairs `(2i, 2i+1)` (LLaMA layout in GGUF). Dimensions past `n_rot` are untouched.
/// 16 or 8 pairs at a time with AVX-512 or AVX2 (`x86::rope`, same bits).
pub fn rope_apply(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: AVX-512 F/VL, AVX2 and FMA were detected.
            return unsafe { crate::x86::rope::rope_avx512(x, cache, n_rot, neox) };
        }
        if has_avx2() {
            // SAFETY: AVX2 and FMA were detected.
            return unsafe { crate::x86::rope::rope_avx2(x, cache, n_rot, neox) };
        }
    }
    rope_apply_scalar(x, cache, n_rot, neox)
}

/// [`rope_apply`] one pair at a time: the portable twin.
pub fn rope_apply_scalar(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: FMA support was detected.
        return unsafe { rope_apply_fma(x, cache, n_rot, neox) };
    }
    rope_apply_body(x, cache, n_rot, neox)
}

#[inline(always)]
fn rope_apply_body(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    let half = n_rot / 2;
    for i in 0..half {
        let (c, s) = (cache[i], cache[half + i]);
        let (a, b) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
        let (x0, x1) = (x[a], x[b]);
        // ggml is built with FMA contraction: the first product of each expression is fused.
        x[a] = x0.mul_add(c, -(x1 * s));
        x[b] = x0.mul_add(s, x1 * c);
    }
}

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

/// SiLU as ggml computes it: `x / (1 + expf(-x))` with [`expf_ggml`].
#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + expf_ggml(0.0 - x))
}

/// `y = silu(g) · u`: sixteen or eight lanes at a time with AVX-512 or AVX2
/// (`x86::norm::swiglu_avx512`, `swiglu`; same bits).
pub fn swiglu(g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() && has_f16c() {
        // SAFETY: AVX-512 F/VL, AVX2, FMA and F16C were detected.
        return unsafe { crate::x86::norm::swiglu_avx512(g, u, y) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && has_f16c() {
        // SAFETY: AVX2, FMA and F16C were detected.
        return unsafe { crate::x86::norm::swiglu(g, u, y) };
    }
    swiglu_scalar(g, u, y)
}

/// [`swiglu`] one element at a time: the portable twin.
pub fn swiglu_scalar(g: &[f32], u: &[f32], y: &mut [f32]) {
    gated(g, u, y, silu)
}

/// `y = act(g) · u`, with hardware FMA when the CPU has it (bit-identical: `mul_add` is a fused
/// multiply-add either way; without the feature it is a slow libm call).
#[inline(always)]
fn gated(g: &[f32], u: &[f32], y: &mut [f32], act: impl Fn(f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: FMA support was detected.
        return unsafe { gated_fma(g, u, y, act) };
    }
    gated_body(g, u, y, act)
}

#[inline(always)]
fn gated_body(g: &[f32], u: &[f32], y: &mut [f32], act: impl Fn(f32) -> f32) {
    for ((o, &a), &b) in y.iter_mut().zip(g).zip(u) {
        *o = act(a) * b;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn gated_fma(g: &[f32], u: &[f32], y: &mut [f32], act: impl Fn(f32) -> f32) {
    gated_body(g, u, y, act)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn rope_apply_fma(x: &mut [f32], cache: &[f32], n_rot: usize, neox: bool) {
    rope_apply_body(x, cache, n_rot, neox)
}

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

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044715;

/// GELU (tanh approximation) as ggml-cpu computes it: input and output rounded through f16, as
/// its lookup table does, exact outside (-10, 10).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        gelu_entry(f16::from_f32(x)).to_f32()
    }
}

/// ggml's table entry for an f16 input: gelu contracted as GCC compiles it, stored f16.
#[inline(always)]
fn gelu_entry(h: f16) -> f16 {
    let v = h.to_f32();
    let inner = (GELU_COEF_A * v).mul_add(v, 1.0);
    let g = (0.5 * v) * (1.0 + ((SQRT_2_OVER_PI * v) * inner).tanh());
    f16::from_f32(g)
}

/// `y = gelu_tanh(g) · u`.
pub fn geglu(g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && has_f16c() {
        // SAFETY: AVX2, FMA and F16C were detected.
        return unsafe { crate::x86::norm::geglu(g, u, y, gelu_table()) };
    }
    geglu_scalar_table(g, u, y)
}

/// [`geglu`] one element at a time (through the table with F16C where the CPU has it): the
/// twin of the eight-lane kernel and its tail.
pub fn geglu_scalar_table(g: &[f32], u: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() && has_f16c() {
        // SAFETY: FMA and F16C support were detected.
        return unsafe { geglu_f16c(g, u, y, gelu_table()) };
    }
    gated(g, u, y, gelu_tanh)
}

/// [`gelu_tanh`] of every f16 value, as f16 bits (what ggml's table holds), built once; one
/// zero entry of padding for the SIMD gather.
fn gelu_table() -> &'static [u16] {
    static T: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    T.get_or_init(|| (0..=u16::MAX).map(|b| gelu_entry(f16::from_bits(b)).to_bits()).chain([0]).collect())
}

/// [`geglu`] through the table with F16C conversions: the same bits as `gelu_tanh` (whose
/// result is the table entry of the f16-rounded input), without two software conversions per
/// element.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,f16c")]
fn geglu_f16c(g: &[f32], u: &[f32], y: &mut [f32], table: &[u16]) {
    use crate::x86::avx2::{f2h, h2f};
    for ((o, &a), &b) in y.iter_mut().zip(g).zip(u) {
        let act = if a <= -10.0 {
            0.0
        } else if a >= 10.0 {
            a
        } else {
            h2f(f16::from_bits(table[f2h(a).to_bits() as usize]))
        };
        *o = act * b;
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_f16c() -> bool {
    static F16C: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F16C.get_or_init(|| std::is_x86_feature_detected!("f16c"))
}

