//! The portable twins of the gated activations, one element at a time, and what the SIMD
//! kernels share with them: ggml's GELU table and the scalar tails.

use crate::exp::expf_ggml;
#[cfg(target_arch = "x86_64")]
use crate::simd::{has_f16c, has_fma};
use half::f16;

/// SiLU as ggml computes it: `x / (1 + expf(-x))` with [`expf_ggml`].
#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + expf_ggml(0.0 - x))
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

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

const GELU_COEF_A: f32 = 0.044715;

/// α and the clamp of gpt-oss's SwiGLU, as llama.cpp hard-codes them (`LLM_FFN_SWIGLU_OAI_MOE`).
pub const OAI_ALPHA: f32 = 1.702;
pub const OAI_LIMIT: f32 = 7.0;

/// gpt-oss's clamped SwiGLU, ggml-cpu's `swiglu_oai` step for step (scalar there too):
/// `x = min(g, 7)`, `v = clamp(u, −7, 7)`, `y = x / (1 + exp(α·(−x))) · (v + 1)`.
pub fn swiglu_oai(g: &[f32], u: &[f32], y: &mut [f32]) {
    for ((o, &g), &u) in y.iter_mut().zip(g).zip(u) {
        let x = g.min(OAI_LIMIT);
        let v = u.clamp(-OAI_LIMIT, OAI_LIMIT);
        let glu = x / (1.0 + (OAI_ALPHA * -x).exp());
        *o = glu * (v + 1.0);
    }
}

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
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
pub(crate) fn gelu_table() -> &'static [u16] {
    static T: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    T.get_or_init(|| (0..=u16::MAX).map(|b| gelu_entry(f16::from_bits(b)).to_bits()).chain([0]).collect())
}

/// [`geglu`] through the table with F16C conversions: the same bits as `gelu_tanh` (whose
/// result is the table entry of the f16-rounded input), without two software conversions per
/// element.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,f16c")]
fn geglu_f16c(g: &[f32], u: &[f32], y: &mut [f32], table: &[u16]) {
    use crate::simd::x86::{f2h, h2f};
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
