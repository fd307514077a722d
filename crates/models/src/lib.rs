//! Model architectures. Each file reads hyper-parameters from GGUF metadata, resolves its
//! weights by name, and builds the forward graph with the core builder — nothing else: no I/O,
//! no kernels, no threads.
//!
//! Invariant: every weight a graph uses is resolved (and its type and shape checked) in
//! [`load`], so building a graph cannot fail on a missing tensor; and every tensor of the file
//! is one of them, else [`load`] refuses the file naming it (`ModelError::UnusedTensor`).

mod common;
pub mod gemma;
pub mod gpt_oss;
pub mod granite;
pub mod llama;
pub mod phi3;
pub mod postnorm;
mod prenorm;
pub mod qwen2;
pub mod qwen3;
pub mod smollm3;

use corelm_core::{Builder, Bundle, WeightRef};
use corelm_gguf::Gguf;
use corelm_kernels::{DType, Kernels};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unsupported architecture '{0}' (supported: {SUPPORTED_ARCHS})")]
    UnknownArch(String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("model is missing tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    BadShape { name: String, found: Vec<u64>, expected: Vec<u64> },
    #[error("tensor '{name}' has type {dtype}, which this build cannot compute with")]
    UnsupportedType { name: String, dtype: DType },
    #[error("tensor '{name}' ({count} unread in all) is not read by corelm's {arch} graph: refused rather than run without it (llama.cpp computes with every tensor its loader creates and refuses a file with others)")]
    UnusedTensor { arch: String, name: String, count: usize },
    #[error("bad hyper-parameter: {0}")]
    BadHyper(String),
    #[error(transparent)]
    Gguf(#[from] corelm_gguf::Error),
}

/// Hyper-parameters common to the supported decoder-only transformers.
#[derive(Clone, Debug)]
pub struct Hyper {
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub eps: f32,
    pub rope_base: f32,
    pub n_rot: usize,
}

/// A loaded architecture: builds the forward graph of one batch shape.
pub trait Model: Send + Sync {
    fn hyper(&self) -> &Hyper;
    /// Append the forward pass for the builder's batch; returns the logits of the output rows.
    fn build(&self, b: &mut Builder) -> Bundle;
    /// How layer `il` runs whole on an accelerator (`--accel-layers`: a pre-norm block whose
    /// weights are named as LLaMA's, with the optional biases and norms found by name), or
    /// `None` where the device's layer cannot compute it. A model that returns `Some` also
    /// starts its `build` at [`Builder::device_layers`].
    fn device_layer(&self, _il: usize) -> Option<DeviceLayerSpec> {
        None
    }
    /// How layer `il`'s keys were rotated before they were stored, so a context shift can
    /// rotate them again (`--context-shift`); `None` where a plain RoPE does not say it.
    fn key_rope(&self, _il: usize) -> Option<KeyRope> {
        None
    }
    /// Whether attention scores are soft-capped (Gemma 2): the keys-in-columns kernels and the
    /// accelerator's attention have no cap (the engine refuses `--kv-layout columns`;
    /// `device_layer` refuses the layers).
    fn attn_softcap(&self) -> bool {
        false
    }
    /// Why `--tp` cannot split this model's layers, if it cannot (OLMo 2's Q/K norms over
    /// whole rows); the engine refuses the degree with it.
    fn tp_refusal(&self) -> Option<String> {
        None
    }
}

/// The RoPE a layer applied to its keys: its parameters and per-frequency divisors (an F32
/// weight of the model file, Llama 3's `rope_freqs.weight`).
#[derive(Clone, Debug)]
pub struct KeyRope {
    pub rope: corelm_core::RopeParams,
    pub freqs: Option<corelm_core::WeightRef>,
}

pub use corelm_core::DeviceLayerSpec;

/// `general.architecture` values this build runs.
pub const SUPPORTED_ARCHS: &str = "llama (Llama 2/3.x, Mistral, SmolLM), mistral3 (Ministral 3), seed_oss, olmo2 (OLMo 2 and 3), exaone4, smollm3, granite, granitemoe, ernie4_5, exaone, qwen2, qwen2moe, qwen3, qwen3moe, qwen2vl, qwen3vl, qwen3vlmoe (their language models, on text), phi3, gemma, gemma2, gemma3";

/// What a model's graph depends on besides its file.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// The longest context one sequence may reach (Phi-3 LongRoPE chooses its factors by it).
    pub n_ctx: usize,
}

/// Pick the architecture named by `general.architecture` and resolve its weights.
pub fn load(g: &Gguf, kernels: &Kernels, opts: LoadOptions) -> Result<Box<dyn Model>, ModelError> {
    let arch = g.str("general.architecture")?;
    let l = Loader::new(g, kernels)?;
    let model: Box<dyn Model> = match arch {
        "llama" => Box::new(llama::load(&l)?),
        "mistral3" => Box::new(llama::load_mistral3(&l)?),
        "seed_oss" => Box::new(llama::load_seed_oss(&l)?),
        "olmo2" => Box::new(postnorm::load_olmo2(&l)?),
        "exaone4" => Box::new(postnorm::load_exaone4(&l)?),
        "qwen2" => Box::new(qwen2::load(&l, false)?),
        "qwen2moe" => Box::new(qwen2::load(&l, true)?),
        "qwen3" => Box::new(qwen3::load(&l, false)?),
        "qwen3moe" => Box::new(qwen3::load(&l, true)?),
        "qwen2vl" => Box::new(qwen2::load_vl(&l)?),
        "qwen3vl" => Box::new(qwen3::load_vl(&l, false)?),
        "qwen3vlmoe" => Box::new(qwen3::load_vl(&l, true)?),
        "phi3" => Box::new(phi3::load(&l, opts)?),
        "gemma" => Box::new(gemma::Gemma::load(&l, gemma::Family::Gemma)?),
        "gemma2" => Box::new(gemma::Gemma::load(&l, gemma::Family::Gemma2)?),
        "gemma3" => Box::new(gemma::Gemma::load(&l, gemma::Family::Gemma3)?),
        "smollm3" => Box::new(smollm3::load(&l)?),
        "ernie4_5" => Box::new(llama::load_llama_block(&l, false)?),
        "exaone" => Box::new(llama::load_llama_block(&l, true)?),
        "granite" => Box::new(granite::load(&l, false)?),
        "granitemoe" => Box::new(granite::load(&l, true)?),
        "gpt-oss" => Box::new(gpt_oss::load(&l)?),
        other => return Err(ModelError::UnknownArch(other.to_string())),
    };
    // Every tensor of the file must be part of the graph: llama.cpp refuses a file with a
    // tensor its loader does not create, and computes with those it creates, so a tensor
    // corelm leaves unread is one llama.cpp would use (a bias, a norm) — refused by name
    // rather than run without.
    let unread: Vec<&str> = g.tensors.iter().map(|t| t.name.as_str()).filter(|&n| !l.used(n)).collect();
    if let Some(&name) = unread.first() {
        return Err(ModelError::UnusedTensor { arch: arch.to_string(), name: name.to_string(), count: unread.len() });
    }
    Ok(model)
}

/// Reads hyper-parameters and weights of one file, checking as it goes.
pub(crate) struct Loader<'a> {
    pub g: &'a Gguf,
    pub kernels: &'a Kernels,
    pub arch: String,
    /// Names of the tensors the graph reads (every checked lookup).
    used: std::cell::RefCell<std::collections::HashSet<String>>,
}

impl<'a> Loader<'a> {
    pub fn new(g: &'a Gguf, kernels: &'a Kernels) -> Result<Self, ModelError> {
        // Every tensor of a model file is a weight: refuse types no kernel computes with up
        // front, naming the first such tensor, before any shape or hyper-parameter checks.
        if let Some(t) = g.tensors.iter().find(|t| kernels.ops(t.dtype).is_none()) {
            return Err(ModelError::UnsupportedType { name: t.name.clone(), dtype: t.dtype });
        }
        Ok(Loader { g, kernels, arch: g.str("general.architecture")?.to_string(), used: Default::default() })
    }

    /// `<arch>.<key>` as an integer.
    pub fn u(&self, key: &str) -> Result<usize, ModelError> {
        let v = self.g.u64(&format!("{}.{key}", self.arch))?;
        usize::try_from(v).ok().filter(|&v| v > 0 && v < 1 << 40).ok_or_else(|| {
            ModelError::BadHyper(format!("{}.{key} = {v}", self.arch))
        })
    }

    pub fn opt_u(&self, key: &str) -> Result<Option<usize>, ModelError> {
        match self.g.get(&format!("{}.{key}", self.arch)) {
            None => Ok(None),
            Some(_) => self.u(key).map(Some),
        }
    }

    pub fn f(&self, key: &str) -> Result<f32, ModelError> {
        Ok(self.g.f32(&format!("{}.{key}", self.arch))?)
    }

    pub fn opt_f(&self, key: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.g.opt_f32(&format!("{}.{key}", self.arch))?)
    }

    /// The hyper-parameters every supported architecture shares, validated.
    pub fn hyper(&self) -> Result<Hyper, ModelError> {
        let n_embd = self.u("embedding_length")?;
        let n_head = self.u("attention.head_count")?;
        let n_kv_head = self.opt_u("attention.head_count_kv")?.unwrap_or(n_head);
        let head_dim = match self.opt_u("attention.key_length")? {
            Some(d) => d,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => return Err(ModelError::BadHyper(format!("{n_embd} not divisible by {n_head} heads"))),
        };
        if n_head % n_kv_head != 0 {
            return Err(ModelError::BadHyper(format!("{n_head} heads not a multiple of {n_kv_head} KV heads")));
        }
        if let Some(vd) = self.opt_u("attention.value_length")? {
            if vd != head_dim {
                return Err(ModelError::BadHyper(format!("value length {vd} differs from key length {head_dim}")));
            }
        }
        let n_rot = self.opt_u("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 || n_rot > 1024 {
            return Err(ModelError::BadHyper(format!("rope dimension {n_rot} with head dim {head_dim}")));
        }
        let eps = self.f("attention.layer_norm_rms_epsilon")?;
        let tok = self.g.tensor("token_embd.weight").ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        Ok(Hyper {
            arch: self.arch.clone(),
            n_layer: self.u("block_count")?,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            n_ff: self.u("feed_forward_length")?,
            n_vocab: tok.shape[1] as usize,
            n_ctx_train: self.u("context_length")?,
            eps,
            rope_base: self.opt_f("rope.freq_base")?.unwrap_or(10000.0),
            n_rot,
        })
    }

    /// The file's RoPE scaling (`rope.scaling.*`) as llama.cpp applies it to every layer of a
    /// model with `n_rot` rotated values and base `base`: linear (the default: angles times
    /// 1/`factor`), `none`, or YaRN (llama.cpp's defaults for the families without YaRN keys
    /// of their own: β_fast 32, β_slow 1, the attention factor `get_mscale(factor)` over
    /// `1 + 0.1·ln(factor)` times the file's `attn_factor`, each rounded as its f32 code
    /// rounds it); `longrope` scales as linear (its factors are Phi-3's tensors). Anything
    /// else is refused by name.
    pub fn rope_scaling(&self, n_rot: usize, base: f32, n_ctx_train: usize) -> Result<corelm_core::RopeParams, ModelError> {
        let kind = self.g.opt_str(&format!("{}.rope.scaling.type", self.arch))?.unwrap_or("linear");
        let factor = self.opt_f("rope.scaling.factor")?.filter(|&f| f != 0.0);
        let freq_scale = match (kind, factor) {
            ("none", _) | (_, None) => 1.0,
            (_, Some(f)) => 1.0 / f,
        };
        let mut p = corelm_core::RopeParams::plain(0, n_rot, n_rot, base, freq_scale, false);
        let attn_factor = self.opt_f("rope.scaling.attn_factor")?.unwrap_or(1.0);
        if !(attn_factor.is_finite() && attn_factor > 0.0) {
            return Err(ModelError::BadHyper(format!("{}.rope.scaling.attn_factor = {attn_factor}", self.arch)));
        }
        match kind {
            "none" | "linear" | "longrope" => p.mscale = attn_factor,
            "yarn" => {
                let orig = self.opt_u("rope.scaling.original_context_length")?.unwrap_or(n_ctx_train);
                let factor = 1.0 / freq_scale;
                // llama.cpp reads YaRN's betas and `yarn_log_multiplier` (transformers'
                // `mscale_all_dim`) for Mistral 3 only, of the families here; the others take
                // its defaults (32, 1, none).
                let own = |key: &str, default: f32| -> Result<f32, ModelError> {
                    let v = if self.arch == "mistral3" { self.opt_f(key)?.unwrap_or(default) } else { default };
                    if v.is_finite() { Ok(v) } else { Err(ModelError::BadHyper(format!("{}.{key} = {v}", self.arch))) }
                };
                let (beta_fast, beta_slow) = (own("rope.scaling.yarn_beta_fast", 32.0)?, own("rope.scaling.yarn_beta_slow", 1.0)?);
                let log_mul = own("rope.scaling.yarn_log_multiplier", 0.0)?;
                let get_mscale = |s: f32, m: f32| if s <= 1.0 { 1.0 } else { 0.1 * m * s.ln() + 1.0 };
                let yarn = if log_mul != 0.0 { get_mscale(factor, 1.0) / get_mscale(factor, log_mul) } else { get_mscale(factor, 1.0) };
                let attn = yarn * (1.0 / (1.0 + 0.1 * factor.ln())) * attn_factor;
                // ggml's `rope_yarn` multiplies it by its magnitude correction (an FMA there).
                p.mscale = attn * 0.1f32.mul_add((1.0 / freq_scale).ln(), 1.0);
                p.ext_factor = 1.0;
                p.corr_dims = corelm_kernels::rope::yarn_corr_dims(n_rot, orig, base, beta_fast, beta_slow);
            }
            other => return Err(ModelError::Unsupported(format!("RoPE scaling type '{other}'"))),
        }
        Ok(p)
    }

    /// A weight by name with its expected GGML shape `[ne0, ne1]` (`ne1 = 1` for vectors).
    pub fn weight(&self, name: &str, ne: [usize; 2]) -> Result<WeightRef, ModelError> {
        let shape: &[usize] = if ne[1] == 1 { &ne[..1] } else { &ne };
        self.checked(name, shape, ne)
    }

    /// A 3-D weight `[ne0, ne1, ne2]` (stacked experts), seen as `[ne0, ne1 · ne2]`.
    pub fn weight3(&self, name: &str, ne: [usize; 3]) -> Result<WeightRef, ModelError> {
        self.checked(name, &ne, [ne[0], ne[1] * ne[2]])
    }

    /// Rows `start .. start + n` of a `[ne0, total]` weight (one part of a fused matrix).
    pub fn rows(&self, name: &str, ne0: usize, total: usize, start: usize, n: usize) -> Result<WeightRef, ModelError> {
        let w = self.weight(name, [ne0, total])?;
        let rb = corelm_kernels::row_bytes(w.dtype, ne0);
        Ok(WeightRef { offset: w.offset + start * rb, len: n * rb, ne: [ne0, n], ..w })
    }

    /// The tensor `name`, checked to have exactly the GGML `shape`, a type some kernel computes
    /// with and whole blocks per row; referenced as a matrix `ne`.
    fn checked(&self, name: &str, shape: &[usize], ne: [usize; 2]) -> Result<WeightRef, ModelError> {
        let t = self.g.tensor(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        self.used.borrow_mut().insert(name.to_string());
        let found = t.shape[..t.n_dims].to_vec();
        let expected: Vec<u64> = shape.iter().map(|&v| v as u64).collect();
        if found != expected {
            return Err(ModelError::BadShape { name: name.to_string(), found, expected });
        }
        if self.kernels.ops(t.dtype).is_none() {
            return Err(ModelError::UnsupportedType { name: name.to_string(), dtype: t.dtype });
        }
        if !ne[0].is_multiple_of(t.dtype.block_size()) {
            return Err(ModelError::BadHyper(format!(
                "tensor '{name}': rows of {} elements are not whole {} blocks",
                ne[0],
                t.dtype
            )));
        }
        Ok(WeightRef {
            name: name.to_string(),
            dtype: t.dtype,
            ne,
            offset: (self.g.data_start() + t.offset) as usize,
            len: t.n_bytes as usize,
        })
    }

    /// A norm/bias vector, which must be F32.
    pub fn vector(&self, name: &str, n: usize) -> Result<WeightRef, ModelError> {
        let w = self.weight(name, [n, 1])?;
        if w.dtype != DType::F32 {
            return Err(ModelError::UnsupportedType { name: name.to_string(), dtype: w.dtype });
        }
        Ok(w)
    }

    /// Values `start .. start + n` of an F32 vector of `total` (one part of a fused bias).
    pub fn vector_part(&self, name: &str, total: usize, start: usize, n: usize) -> Result<WeightRef, ModelError> {
        let w = self.vector(name, total)?;
        Ok(WeightRef { offset: w.offset + 4 * start, len: 4 * n, ne: [n, 1], ..w })
    }

    /// Whether a checked lookup has read tensor `name`.
    pub fn used(&self, name: &str) -> bool {
        self.used.borrow().contains(name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.g.tensor(name).is_some()
    }
}
