//! Row kernels for everything that is not a matrix product: RMS norm, RoPE, gated activations,
//! fused online-softmax attention. Portable Rust; numerics follow ggml-cpu (f64 sum of squares
//! in RMS norm, iterated RoPE angles, GELU through f16 as ggml's table does, F16 queries against
//! an F16 KV cache).

use crate::blocks::{as_blocks, bytes_of};
use crate::DType;
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
fn has_fma() -> bool {
    static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FMA.get_or_init(|| std::is_x86_feature_detected!("fma"))
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| {
        has_avx2() && std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl")
    })
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2() -> bool {
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
fn has_f16c() -> bool {
    static F16C: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F16C.get_or_init(|| std::is_x86_feature_detected!("f16c"))
}

/// Which of ggml-cpu's flash-attention algorithms to reproduce. They give different bits, and
/// on rows with massive activations the difference is visible in the logits, so the scheduler
/// picks the one llama.cpp would: `Tiled` for batches of at least [`TILED_MIN_ROWS`] query rows,
/// `Reference` otherwise (single-token decode included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnKernel {
    /// ggml's `one_chunk`: query rounded to F16, F16 dot products, the V accumulator kept in
    /// F16 and rescaled whenever the running maximum grows.
    Reference,
    /// ggml's tiled kernel: F32 query and keys, KV in tiles of [`KV_TILE`] cells, the softmax
    /// sum of each tile in double, an F32 accumulator.
    Tiled,
}

/// Visible cells per phase of the two-phase decode kernels (`x86::attn_decode*`,
/// `attend_quant_group`); their grow masks are `u64`.
pub const DECODE_CHUNK: usize = 64;

/// Per head, the running maximum over the chunk's `n` scores, which fixes every cell's
/// exponent — `max_old - score` where the maximum grows (`grow` bit set), `score - max`
/// elsewhere, exactly the scalar kernel's arguments — then all the exponentials at once
/// (`exps`, libm's `expf` lane for lane). `scores` become the exponentials.
pub fn softmax_steps(scores: &mut [f32], grow: &mut [u64], state: &mut [[f32; 2]], n: usize, exps: impl Fn(&mut [f32])) {
    for ((st, g), sc) in state.iter_mut().zip(grow.iter_mut()).zip(scores.chunks_exact_mut(DECODE_CHUNK)) {
        let mut m = st[0];
        *g = 0;
        for (i, s) in sc[..n].iter_mut().enumerate() {
            if *s > m {
                (*s, m) = (m - *s, *s);
                *g |= 1 << i;
            } else {
                *s -= m;
            }
        }
        st[0] = m;
        exps(&mut sc[..n]);
    }
}

/// Query rows from which ggml switches to the tiled kernel.
pub const TILED_MIN_ROWS: usize = 64;
/// KV cells per tile of the tiled kernel.
pub const KV_TILE: usize = 64;

/// Scratch for one attention row, allocated once per worker.
pub struct AttnScratch {
    /// The query in the key type's `vec_dot_type` (quantized caches).
    qq: Vec<u8>,
    /// One value row converted to f32 (quantized caches).
    v32: Vec<f32>,
    q16: Vec<f16>,
    acc16: Vec<f16>,
    acc: Vec<f32>,
    scores: [f32; KV_TILE],
    /// Grouped tiled kernel: `[heads][KV_TILE]` probabilities of the current tile.
    gscores: Vec<f32>,
    /// Grouped tiled kernel: `[heads][head_dim]` f32 accumulators.
    gacc: Vec<f32>,
    /// Grouped tiled kernel: running maximum and sum per head.
    gstate: Vec<[f32; 2]>,
    /// Grouped reference kernel: `[heads][head_dim]` F16 accumulators.
    gacc16: Vec<f16>,
    /// One key row in f32.
    k32: Vec<f32>,
    /// Decode kernels: `[heads][head_dim]` f32 accumulators.
    dacc: Vec<f32>,
    /// Grouped quantized-cache kernel: `[heads]` queries in the key type's `vec_dot_type`.
    gqq: Vec<u8>,
    /// AVX-512 decode kernel: per head, the cells of a chunk that raise its maximum.
    dgrow: Vec<u64>,
    /// Buffers of the multi-row kernel ([`attend_rows`]).
    rows: RowsScratch,
}

/// Buffers of [`attend_rows`]' SIMD kernel (`x86::attn_rows`) for up to
/// [`ROWS_MAX_VECTORS`] query vectors (rows × heads).
pub struct RowsScratch {
    /// `[head_dim][8]` f32: the keys of one 8-cell chunk, transposed.
    pub(crate) kt: Vec<f32>,
    /// `[vector][KV_TILE]` scores, then probabilities, of the current tile.
    pub(crate) scores: Vec<f32>,
    /// `[vector][head_dim]` f32 accumulators.
    pub(crate) acc: Vec<f32>,
    /// Running (maximum, sum) per vector.
    pub(crate) state: Vec<[f32; 2]>,
    /// `[KV_TILE][head_dim]` f32: the values of the current tile.
    pub(crate) v32: Vec<f32>,
    /// `head_dim` zeros: the key row of a chunk's missing cells.
    pub(crate) zero: Vec<f16>,
}

/// Most query vectors (rows × heads) one [`attend_rows`] call takes.
pub const ROWS_MAX_VECTORS: usize = 16;

impl RowsScratch {
    fn new(head_dim: usize) -> Self {
        RowsScratch {
            kt: vec![0.0; head_dim * 8],
            scores: vec![0.0; ROWS_MAX_VECTORS * KV_TILE],
            acc: vec![0.0; ROWS_MAX_VECTORS * head_dim],
            state: vec![[0.0; 2]; ROWS_MAX_VECTORS],
            v32: vec![0.0; KV_TILE * head_dim],
            zero: vec![f16::ZERO; head_dim],
        }
    }
}

/// The buffers of the grouped reference kernel for `heads` heads: widened queries
/// `[heads][head_dim]`, F16 accumulators `[heads][head_dim]`, (maximum, sum) per head, one key
/// row and one value row in f32.
pub type ReferenceBuffers<'a> = (&'a mut [f32], &'a mut [f16], &'a mut [[f32; 2]], &'a mut [f32], &'a mut [f32]);

/// The buffers of the grouped tiled kernel for `heads` heads: probabilities `[heads][KV_TILE]`,
/// accumulators `[heads][head_dim]`, (maximum, sum) per head, one value row in f32.
pub type GroupBuffers<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [[f32; 2]], &'a mut [f32]);

impl AttnScratch {
    /// Buffers for [`attend_heads`]' grouped kernel, `None` if sized for fewer heads.
    pub fn group_buffers(&mut self, heads: usize) -> Option<GroupBuffers<'_>> {
        let hd = self.acc.len();
        (heads <= self.gstate.len()).then(|| {
            (
                &mut self.gscores[..heads * KV_TILE],
                &mut self.gacc[..heads * hd],
                &mut self.gstate[..heads],
                &mut self.v32[..],
            )
        })
    }


    /// Buffers for the grouped reference kernel, `None` if sized for fewer heads.
    pub fn reference_buffers(&mut self, heads: usize) -> Option<ReferenceBuffers<'_>> {
        let hd = self.acc.len();
        (heads <= self.gstate.len()).then(|| {
            (
                &mut self.gacc[..heads * hd],
                &mut self.gacc16[..heads * hd],
                &mut self.gstate[..heads],
                &mut self.k32[..],
                &mut self.v32[..],
            )
        })
    }

    /// Buffers for the AVX-512 decode kernel (`x86::attn_decode`), `None` if sized for fewer
    /// heads.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn decode_buffers(&mut self, heads: usize) -> Option<crate::x86::attn_decode::DecodeBuffers<'_>> {
        let hd = self.acc.len();
        (heads <= self.gstate.len() && KV_TILE >= DECODE_CHUNK).then(|| crate::x86::attn_decode::DecodeBuffers {
            qf: &mut self.gacc[..heads * hd],
            acc: &mut self.dacc[..heads * hd],
            state: &mut self.gstate[..heads],
            scores: &mut self.gscores[..],
            grow: &mut self.dgrow[..heads],
            k32: &mut self.k32[..],
            v32: &mut self.v32[..],
        })
    }

    /// The F16 query and accumulator buffers and one f32 value row (for SIMD twins of the
    /// reference kernel).
    pub fn f16_buffers(&mut self) -> (&mut [f16], &mut [f16], &mut [f32]) {
        (&mut self.q16, &mut self.acc16, &mut self.v32)
    }

    /// Scratch for one query head at a time.
    pub fn new(head_dim: usize) -> Self {
        Self::with_heads(head_dim, 1)
    }

    /// Scratch for up to `heads` query heads per [`attend_heads`] call.
    pub fn with_heads(head_dim: usize, heads: usize) -> Self {
        AttnScratch {
            // Enough for any activation type: F32 is the widest per element.
            qq: vec![0; head_dim * 4 + 64],
            v32: vec![0.0; head_dim],
            q16: vec![f16::ZERO; head_dim],
            acc16: vec![f16::ZERO; head_dim],
            acc: vec![0.0; head_dim],
            scores: [0.0; KV_TILE],
            gscores: vec![0.0; heads * KV_TILE],
            gacc: vec![0.0; heads * head_dim],
            gstate: vec![[0.0; 2]; heads],
            gacc16: vec![f16::ZERO; heads * head_dim],
            k32: vec![0.0; head_dim],
            dacc: vec![0.0; heads * head_dim],
            gqq: vec![0; heads * (head_dim * 4 + 64)],
            dgrow: vec![0; heads],
            rows: RowsScratch::new(head_dim),
        }
    }
}

/// The K and V rows of one KV head in a paged cache. Logical cell `i` (the token at position
/// `i` of the sequence) lives in physical row `table[i >> shift] << shift | i & mask`: the cache
/// is cut into blocks of `1 << shift` rows and `table` lists the sequence's blocks in order.
/// Rows are `head_dim` elements of `k_type` / `v_type` (F16 by default; Q8_0 or Q4_0 blocks).
#[derive(Clone, Copy)]
pub struct KvRows<'a> {
    /// `[physical row][row bytes]` keys of this KV head.
    pub k: &'a [u8],
    /// `[physical row][row bytes]` values of this KV head.
    pub v: &'a [u8],
    pub k_type: DType,
    pub v_type: DType,
    pub head_dim: usize,
    /// Physical block of each logical block.
    pub table: &'a [u32],
    /// log2 of the rows per block.
    pub shift: u32,
}

impl<'a> KvRows<'a> {
    /// F16 rows `0..n` stored contiguously (an identity table over blocks of one row).
    pub fn contiguous(k: &'a [f16], v: &'a [f16], head_dim: usize, identity: &'a [u32]) -> Self {
        KvRows {
            k: bytes_of(k),
            v: bytes_of(v),
            k_type: DType::F16,
            v_type: DType::F16,
            head_dim,
            table: identity,
            shift: 0,
        }
    }

    #[inline(always)]
    pub fn row(&self, i: usize) -> usize {
        ((self.table[i >> self.shift] as usize) << self.shift) | (i & ((1 << self.shift) - 1))
    }

    #[inline(always)]
    pub fn k_bytes(&self, i: usize) -> &'a [u8] {
        let rb = crate::row_bytes(self.k_type, self.head_dim);
        let r = self.row(i) * rb;
        &self.k[r..r + rb]
    }

    #[inline(always)]
    pub fn v_bytes(&self, i: usize) -> &'a [u8] {
        let rb = crate::row_bytes(self.v_type, self.head_dim);
        let r = self.row(i) * rb;
        &self.v[r..r + rb]
    }

    /// Key row of an F16 cache.
    #[inline(always)]
    pub fn k(&self, i: usize) -> &'a [f16] {
        debug_assert_eq!(self.k_type, DType::F16);
        as_blocks(self.k_bytes(i))
    }

    /// Value row of an F16 cache.
    #[inline(always)]
    pub fn v(&self, i: usize) -> &'a [f16] {
        debug_assert_eq!(self.v_type, DType::F16);
        as_blocks(self.v_bytes(i))
    }

    pub fn is_f16(&self) -> bool {
        self.k_type == DType::F16 && self.v_type == DType::F16
    }
}

/// Fused attention for one query head over an F16 KV cache, with online softmax (one pass, no
/// score matrix): `out = Σ_c softmax(scale · q·k_c) v_c` over the logical cells `c < n_cells`
/// of `kv` for which `visible(c)` holds, in logical order. Writes zeros if no cell is visible.
#[allow(clippy::too_many_arguments)]
pub fn attend_row(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let isa = kernels.isa;
    if !kv.is_f16() {
        return attend_quant(kernels, q, kv, n_cells, scale, visible, scratch, out);
    }
    #[cfg(target_arch = "x86_64")]
    if kind == AttnKernel::Reference && attend_decode(kernels, q, kv, n_cells, scale, &visible, scratch, out) {
        return;
    }
    match kind {
        #[cfg(target_arch = "x86_64")]
        AttnKernel::Reference if isa == crate::Isa::Avx2 => {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe { crate::x86::attn::attend_reference(q, kv, n_cells, scale, &visible, scratch, out) }
        }
        AttnKernel::Reference => attend_reference(q, kv, n_cells, scale, visible, scratch, out),
        AttnKernel::Tiled => {
            if !tiled_group(kernels, q, kv, n_cells, scale, &visible, scratch, out) {
                attend_tiled(q, kv, n_cells, scale, visible, scratch, out)
            }
        }
    }
}

/// [`attend_row`] for consecutive query heads that read the same KV head (a GQA group or part of
/// one; `q` and `out` hold `heads × kv.head_dim` values). With the AVX2 table and an F16 cache
/// the heads go through the cells together: for the tiled kernel (`x86::attn::attend_tiled_group`)
/// each 8-cell block of keys is loaded and transposed once for all of them; for the reference
/// kernel, decode's (`x86::attn::attend_reference_group`), each key and value row is widened
/// once. Every head gets the bits of its own `attend_row` call.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    if kind == AttnKernel::Tiled && tiled_group(kernels, q, kv, n_cells, scale, &visible, scratch, out) {
        return;
    }
    let hd = kv.head_dim;
    #[cfg(target_arch = "x86_64")]
    if kind == AttnKernel::Reference && attend_decode(kernels, q, kv, n_cells, scale, &visible, scratch, out) {
        return;
    }
    // A quantized cache always takes ggml's one-chunk path (`attend_row` ignores `kind` for it).
    if !kv.is_f16() && kv.v_type != DType::F16 && q.len() / hd <= scratch.gstate.len() {
        return attend_quant_group(kernels, q, kv, n_cells, scale, &visible, scratch, out);
    }
    #[cfg(target_arch = "x86_64")]
    if kind == AttnKernel::Reference && kernels.isa == crate::Isa::Avx2 && kv.is_f16() && hd.is_multiple_of(8) && q.len() > hd {
        if let Some(bufs) = scratch.reference_buffers(q.len() / hd) {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe { crate::x86::attn::attend_reference_group(q, kv, n_cells, scale, &visible, bufs, out) };
            return;
        }
    }
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        attend_row(kind, kernels, qh, kv, n_cells, scale, &visible, scratch, oh);
    }
}

/// The reference kernel for `q.len() / head_dim` heads with the two-phase decode kernel
/// (`x86::attn_decode` with AVX-512, `x86::attn_decode_avx2` with the AVX2 table), if the cache
/// is F16 and the head dimension one it takes; returns whether it ran.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn attend_decode(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) -> bool {
    use crate::x86::attn_decode;
    if !(kernels.isa == crate::Isa::Avx2 && kv.is_f16() && attn_decode::supports(kv.head_dim)) {
        return false;
    }
    let Some(bufs) = scratch.decode_buffers(q.len() / kv.head_dim) else { return false };
    if kernels.avx512 {
        // SAFETY: `avx512` is only set by `Kernels::detect` after detecting AVX-512 F/BW/VL/VNNI
        // (and AVX2, FMA, F16C).
        unsafe { attn_decode::attend_decode_group(q, kv, n_cells, scale, visible, bufs, out) };
    } else {
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
        unsafe { crate::x86::attn_decode_avx2::attend_decode_group_avx2(q, kv, n_cells, scale, visible, bufs, out) };
    }
    true
}

/// Attention for a block of query rows of one sequence (prefill): row `r` holds `heads`
/// query heads that read the KV head `kv` (`q[r]`, `out[r]`: `heads × head_dim` values) and
/// sees the logical cells `spans[r]` (causal limit and sliding window). Every head of every row
/// gets the bits of its own [`attend_row`] call with `n_cells = spans[r].end` and `visible(c)
/// = c >= spans[r].start`. With the AVX2 table, an F16 cache, the tiled kernel and at most
/// [`ROWS_MAX_VECTORS`] rows × heads, the rows go through the cells together
/// (`x86::attn_rows`); otherwise row by row.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    kind: AttnKernel,
    kernels: &crate::Kernels,
    q: &[&[f32]],
    heads: usize,
    spans: &[std::ops::Range<usize>],
    kv: &KvRows,
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [&mut [f32]],
) {
    #[cfg(target_arch = "x86_64")]
    if kind == AttnKernel::Tiled
        && kernels.isa == crate::Isa::Avx2
        && kv.is_f16()
        && kv.head_dim.is_multiple_of(8)
        && q.len() * heads <= ROWS_MAX_VECTORS
        && scratch.rows.zero.len() >= kv.head_dim
    {
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
        unsafe { crate::x86::attn_rows::attend_tiled_rows(q, heads, spans, kv, scale, &mut scratch.rows, out) };
        return;
    }
    for ((qr, or), span) in q.iter().zip(out.iter_mut()).zip(spans) {
        let lo = span.start;
        attend_heads(kind, kernels, qr, kv, span.end, scale, |c| c >= lo, scratch, or);
    }
}

/// The tiled kernel's SIMD version (`x86::attn::attend_tiled_group`) over the `q.len() /
/// head_dim` heads in `q`, if this table, cache and shape allow it; `false` if it did not run.
#[allow(clippy::too_many_arguments)]
fn tiled_group(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) -> bool {
    let hd = kv.head_dim;
    #[cfg(target_arch = "x86_64")]
    if kernels.isa == crate::Isa::Avx2
        && kv.is_f16()
        && hd.is_multiple_of(8)
        && q.len() / hd <= crate::x86::attn::MAX_GROUP
    {
        if let Some(bufs) = scratch.group_buffers(q.len() / hd) {
            // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
            unsafe { crate::x86::attn::attend_tiled_group(q, kv, n_cells, scale, visible, bufs, out) };
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kernels, q, hd, n_cells, scale, visible, scratch, out);
    false
}

/// ggml's `one_chunk` kernel over a quantized cache: the query quantized to the key type's
/// `vec_dot_type` and scored with the type's dot product; F16 values accumulated in F16 as in
/// [`AttnKernel::Reference`], quantized values converted to f32 and accumulated in f32.
#[allow(clippy::too_many_arguments)]
fn attend_quant(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: FMA support was detected.
        return unsafe { attend_quant_fma(kernels, q, kv, n_cells, scale, &visible, scratch, out) };
    }
    attend_quant_body(kernels, q, kv, n_cells, scale, visible, scratch, out)
}

/// [`attend_quant_body`] compiled with FMA: its `mul_add`s are one instruction instead of a
/// libm call per element (the same bits; the call made Q8_0-cache decode 13× slower than F16).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "fma")]
fn attend_quant_fma(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    attend_quant_body(kernels, q, kv, n_cells, scale, visible, scratch, out)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_quant_body(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let kops = kernels.ops(kv.k_type).expect("KV cache type checked at start-up");
    let qt = kops.vec_dot_type;
    let qq = &mut scratch.qq[..crate::row_bytes(qt, q.len())];
    kernels.from_float(qt).expect("activation quantizer")(q, qq);
    let v_f16 = kv.v_type == DType::F16;
    let v_to_float = kernels.to_float(kv.v_type).expect("KV cache type checked at start-up");
    scratch.acc16.iter_mut().for_each(|a| *a = f16::ZERO);
    scratch.acc.iter_mut().for_each(|a| *a = 0.0);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    for c in 0..n_cells {
        if !visible(c) {
            continue;
        }
        let score = (kops.vec_dot)(kv.k_bytes(c), qq) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if score > m {
            let old = m;
            m = score;
            ms = (old - m).exp();
            if v_f16 {
                scratch.acc16.iter_mut().for_each(|a| *a = f16::from_f32(a.to_f32() * ms));
            } else {
                scratch.acc.iter_mut().for_each(|a| *a *= ms);
            }
        } else {
            vs = (score - m).exp();
        }
        if v_f16 {
            for (a, &vv) in scratch.acc16.iter_mut().zip(kv.v(c)) {
                *a = f16::from_f32(vv.to_f32().mul_add(vs, a.to_f32()));
            }
        } else {
            v_to_float(kv.v_bytes(c), &mut scratch.v32);
            for (a, &vv) in scratch.acc.iter_mut().zip(&scratch.v32) {
                *a = vv.mul_add(vs, *a);
            }
        }
        s = s.mul_add(ms, vs);
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for (i, o) in out.iter_mut().enumerate() {
        *o = if v_f16 { scratch.acc16[i].to_f32() } else { scratch.acc[i] } * inv;
    }
}

#[allow(clippy::too_many_arguments)]
fn attend_reference(
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    for (d, &s) in scratch.q16.iter_mut().zip(q) {
        *d = f16::from_f32(s);
    }
    scratch.acc16.iter_mut().for_each(|a| *a = f16::ZERO);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    for c in 0..n_cells {
        if !visible(c) {
            continue;
        }
        let score = dot_f16_ggml(kv.k(c), &scratch.q16) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if score > m {
            let old = m;
            m = score;
            ms = (old - m).exp();
            for a in scratch.acc16.iter_mut() {
                *a = f16::from_f32(a.to_f32() * ms);
            }
        } else {
            vs = (score - m).exp();
        }
        for (a, &vv) in scratch.acc16.iter_mut().zip(kv.v(c)) {
            *a = f16::from_f32(vv.to_f32().mul_add(vs, a.to_f32()));
        }
        s = s.mul_add(ms, vs);
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for (o, a) in out.iter_mut().zip(&scratch.acc16) {
        *o = a.to_f32() * inv;
    }
}

/// [`attend_quant`] for the query heads of a GQA group at once over a cache with quantized
/// values (Q8_0/Q4_0 keys and values, `--cache-type-k/-v`), the same bits per head: per chunk of
/// [`DECODE_CHUNK`] visible cells every head's scores (`vec_dot` against its query quantized
/// once), the chunk's running maxima and exponentials ([`softmax_steps`], vectorised `expf`
/// where the table has it), then each value row dequantized once for all heads and the f32
/// accumulators updated (`acc · ms` where the maximum grew, then `fma(v, vs, acc)`).
#[allow(clippy::too_many_arguments)]
fn attend_quant_group(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { attend_quant_group_avx2(kernels, q, kv, n_cells, scale, visible, scratch, out) };
    }
    attend_quant_group_body(kernels, q, kv, n_cells, scale, visible, scratch, out)
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
fn attend_quant_group_avx2(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    attend_quant_group_body(kernels, q, kv, n_cells, scale, visible, scratch, out)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn attend_quant_group_body(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    let kops = kernels.ops(kv.k_type).expect("KV cache type checked at start-up");
    let qt = kops.vec_dot_type;
    let qrb = crate::row_bytes(qt, hd);
    let v_to_float = kernels.to_float(kv.v_type).expect("KV cache type checked at start-up");
    let exps = |x: &mut [f32]| {
        #[cfg(target_arch = "x86_64")]
        {
            if kernels.avx512 {
                // SAFETY: `avx512` is only set after detecting AVX-512 F/VL (and FMA).
                return unsafe { crate::x86::expf::expf_slice(x) };
            }
            if kernels.isa == crate::Isa::Avx2 {
                // SAFETY: an Avx2 table is only built after detecting AVX2 and FMA.
                return unsafe { crate::x86::expf::expf_slice_avx2(x) };
            }
        }
        x.iter_mut().for_each(|v| *v = v.exp());
    };
    let AttnScratch { gqq, dacc, gstate, gscores, dgrow, v32, .. } = scratch;
    let (qq, acc, state) = (&mut gqq[..heads * qrb], &mut dacc[..heads * hd], &mut gstate[..heads]);
    for (qh, qb) in q.chunks_exact(hd).zip(qq.chunks_exact_mut(qrb)) {
        kernels.from_float(qt).expect("activation quantizer")(qh, qb);
    }
    acc.fill(0.0);
    state.fill([f32::NEG_INFINITY, 0.0]);
    let mut cells = [0usize; DECODE_CHUNK];
    let mut n = 0;
    for c in 0..n_cells {
        if visible(c) {
            cells[n] = c;
            n += 1;
        }
        if n == 0 || (n < DECODE_CHUNK && c + 1 < n_cells) {
            continue;
        }
        for (i, &cell) in cells[..n].iter().enumerate() {
            let k = kv.k_bytes(cell);
            for (h, qb) in qq.chunks_exact(qrb).enumerate() {
                gscores[h * DECODE_CHUNK + i] = (kops.vec_dot)(k, qb) * scale;
            }
        }
        softmax_steps(gscores, dgrow, state, n, exps);
        for (i, &cell) in cells[..n].iter().enumerate() {
            v_to_float(kv.v_bytes(cell), v32);
            for (h, st) in state.iter_mut().enumerate() {
                let e = gscores[h * DECODE_CHUNK + i];
                let (ms, vs) = if dgrow[h] & (1 << i) != 0 { (e, 1f32) } else { (1f32, e) };
                let a = &mut acc[h * hd..(h + 1) * hd];
                // Skipping `× 1` changes no bits.
                if ms != 1.0 {
                    a.iter_mut().for_each(|x| *x *= ms);
                }
                for (x, &v) in a.iter_mut().zip(v32.iter()) {
                    *x = v.mul_add(vs, *x);
                }
                st[1] = st[1].mul_add(ms, vs);
            }
        }
        n = 0;
    }
    for (h, st) in state.iter().enumerate() {
        let inv = if st[1] == 0.0 { 0.0 } else { 1.0 / st[1] };
        for (o, &a) in out[h * hd..(h + 1) * hd].iter_mut().zip(&acc[h * hd..(h + 1) * hd]) {
            *o = a * inv;
        }
    }
}

/// ggml's tiled kernel, portable. The AVX2 version is `x86::attn::attend_tiled_group` (one or
/// more heads of a GQA group at once), bit-identical to this per head.
#[allow(clippy::too_many_arguments)]
fn attend_tiled(
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: impl Fn(usize) -> bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    scratch.acc.iter_mut().for_each(|a| *a = 0.0);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    let mut t0 = 0;
    while t0 < n_cells {
        let t1 = (t0 + KV_TILE).min(n_cells);
        let mut tile_max = f32::NEG_INFINITY;
        for c in t0..t1 {
            let sc = if visible(c) {
                kv.k(c).iter().zip(q).fold(0f32, |acc, (&kk, &qq)| kk.to_f32().mul_add(qq, acc)) * scale
            } else {
                f32::NEG_INFINITY
            };
            scratch.scores[c - t0] = sc;
            tile_max = tile_max.max(sc);
        }
        if tile_max == f32::NEG_INFINITY {
            t0 = t1;
            continue;
        }
        let m_new = m.max(tile_max);
        if m_new > m {
            let ms = (m - m_new).exp();
            scratch.acc.iter_mut().for_each(|a| *a *= ms);
            s *= ms;
        }
        m = m_new;
        // ggml_vec_soft_max_f32: its own expf, each group of 16 reduced in float (GCC's
        // `_mm512_reduce_add_ps` order), the groups summed in double, added to S in double.
        for p in scratch.scores[t1 - t0..].iter_mut() {
            *p = f32::NEG_INFINITY; // the padding of a short last tile
        }
        let mut sum = 0f64;
        for g in scratch.scores.chunks_exact_mut(16) {
            for p in g.iter_mut() {
                *p = expf_ggml(*p - m);
            }
            sum += reduce_add_16(&<[f32; 16]>::try_from(&*g).expect("16 lanes")) as f64;
        }
        s = (s as f64 + sum) as f32;
        for c in t0..t1 {
            let p = scratch.scores[c - t0];
            if p == 0.0 {
                continue;
            }
            for (a, &vv) in scratch.acc.iter_mut().zip(kv.v(c)) {
                *a = p.mul_add(vv.to_f32(), *a);
            }
        }
        t0 = t1;
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for (o, &a) in out.iter_mut().zip(&scratch.acc) {
        *o = a * inv;
    }
}

/// F16 dot product in exactly the order ggml-cpu's AVX-512 build sums it (`ggml_vec_dot_f16`
/// with `F32Cx16`): four 16-lane f32 accumulators over 64-element steps, fused multiply-adds,
/// the accumulators folded (0+2, 1+3, then 0+1), the 16 lanes reduced as GCC's
/// `_mm512_reduce_add_ps` does, the tail added in double. Attention scores of massive-activation
/// rows are sensitive to these bits.
pub fn dot_f16_ggml(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, al) in a.iter_mut().enumerate() {
                let k = i + j * 16 + l;
                *al = x[k].to_f32().mul_add(y[k].to_f32(), *al);
            }
        }
    }
    for l in 0..16 {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
    }
    for l in 0..16 {
        acc[0][l] += acc[1][l];
    }
    let mut sum = reduce_add_16(&acc[0]) as f64;
    for k in np..n {
        sum += (x[k].to_f32() * y[k].to_f32()) as f64;
    }
    sum as f32
}

/// Sum of 16 lanes in the order of GCC's `_mm512_reduce_add_ps`: halves, quarters, then pairs.
#[inline]
pub fn reduce_add_16(a: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| a[8 + i] + a[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[4 + i] + t3[i]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}
