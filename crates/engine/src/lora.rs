//! LoRA adapters (`--lora FILE`, `--lora-scaled FILE SCALE`, the server's `/lora-adapters`):
//! GGUF adapter files as llama.cpp's `llama_adapter_lora_init` reads them, applied at run time
//! by the graph (`corelm_core::graph::Lora`, llama.cpp's `build_lora_mm`).
//!
//! A file is an adapter when `general.type` is `adapter` and `adapter.type` is `lora`, for the
//! model's `general.architecture`; `adapter.lora.alpha` (0 when absent) sets each pair's factor
//! `scale · alpha / r`, or `scale` alone at 0. Its tensors come in pairs `<weight>.lora_a`
//! (`[n_in, r]`) and `<weight>.lora_b` (`[r, n_out]`) for a weight `[n_in, n_out]` of the model;
//! `*_norm.weight` tensors are skipped, as llama.cpp skips them. Every adapter's matrices are
//! copied at load into one buffer the executor reads (`Weights::adapters`).
//!
//! An adapter at scale 0 is left out of the graph, so the model runs bit for bit as without
//! it. Changing scales rebuilds the graphs and empties the prefix cache (its KV rows were
//! computed under the old scales).
//!
//! Not supported, refused by name at load: adapters on the token embedding, on the LM head,
//! on fused or expert tensors (no graph node multiplies by them whole), aLoRA invocation
//! tokens, and adapters with `--tp`, `--sparsity` or the accelerator options.

use crate::Error;
use corelm_core::graph::{AdapterMatrix, Graph, Lora, LoraPair};
use corelm_core::Storage;
use corelm_gguf::Gguf;
use corelm_kernels::{DType, Kernels};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An adapter to load and the scale it starts at.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraSpec {
    pub path: PathBuf,
    pub scale: f32,
}

impl LoraSpec {
    /// `FILE` at scale 1 (`--lora`).
    pub fn new(path: impl Into<PathBuf>) -> LoraSpec {
        LoraSpec { path: path.into(), scale: 1.0 }
    }
}

/// One loaded adapter.
#[derive(Clone, Debug)]
pub struct Adapter {
    pub path: PathBuf,
    /// `adapter.lora.alpha` (0: none).
    pub alpha: f32,
    pub scale: f32,
    /// `adapter.lora.task_name` and `adapter.lora.prompt_prefix` (empty when absent), which
    /// llama-server lists.
    pub task_name: String,
    pub prompt_prefix: String,
    /// Per model weight its pair.
    pairs: Vec<(String, AdapterMatrix, AdapterMatrix)>,
}

impl Adapter {
    /// Model matrices the adapter pairs.
    pub fn n_matrices(&self) -> usize {
        self.pairs.len()
    }
}

/// The loaded adapters and the buffer their matrices live in.
pub struct Adapters {
    list: Vec<Adapter>,
    /// 64-byte units, so every matrix starts aligned.
    buf: Vec<[u8; 64]>,
}

impl Adapters {
    /// Read and check `specs` against `model` (the base model's file), copying their matrices.
    pub fn open(specs: &[LoraSpec], model: &Gguf, kernels: &Kernels) -> Result<Adapters, Error> {
        let mut list = Vec::with_capacity(specs.len());
        let mut bytes: Vec<u8> = Vec::new();
        for spec in specs {
            let g = Gguf::open(&spec.path).map_err(|e| bad(&spec.path, e.to_string()))?;
            list.push(read(spec, &g, model, kernels, &mut bytes)?);
        }
        let mut buf = vec![[0u8; 64]; bytes.len().div_ceil(64)];
        buf.as_flattened_mut()[..bytes.len()].copy_from_slice(&bytes);
        Ok(Adapters { list, buf })
    }

    pub fn list(&self) -> &[Adapter] {
        &self.list
    }

    /// The matrices' bytes, for the executor.
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_flattened()
    }

    /// Set every adapter's scale (one per adapter, in load order).
    pub fn set_scales(&mut self, scales: &[f32]) -> Result<(), Error> {
        if scales.len() != self.list.len() {
            return Err(Error::Config(format!("{} LoRA scales for {} adapters", scales.len(), self.list.len())));
        }
        if let Some(s) = scales.iter().find(|s| !s.is_finite()) {
            return Err(Error::Config(format!("LoRA scale {s} is not a finite number")));
        }
        for (a, &s) in self.list.iter_mut().zip(scales) {
            a.scale = s;
        }
        Ok(())
    }

    /// What the graph applies: the adapters of non-zero scale, or with `all` every adapter
    /// (at scale 1 where it is 0: the graph that sizes the pools holds every node any scales
    /// can need). `None` when nothing is applied.
    pub fn lora(&self, all: bool) -> Option<Arc<Lora>> {
        let mut l = Lora::default();
        for a in self.list.iter().rev() {
            let s = if a.scale == 0.0 && all { 1.0 } else { a.scale };
            if s == 0.0 {
                continue;
            }
            for (name, ma, mb) in &a.pairs {
                let r = ma.ne[1] as f32;
                let scale = if a.alpha != 0.0 { s * a.alpha / r } else { s };
                l.pairs.entry(name.clone()).or_default().push(LoraPair { a: *ma, b: *mb, scale });
            }
        }
        (!l.pairs.is_empty()).then(|| Arc::new(l))
    }

    /// An error naming the first pair `g` (built with [`Self::lora`]`(true)`) does not apply.
    pub fn check_applied(&self, g: &Graph) -> Result<(), Error> {
        // The builder makes an adapter matrix's tensor only where it applies the pair.
        let used: HashSet<usize> = g
            .tensors
            .iter()
            .filter_map(|t| match t.storage {
                Storage::Adapter { offset, .. } => Some(offset),
                _ => None,
            })
            .collect();
        for a in &self.list {
            if let Some((name, _, _)) = a.pairs.iter().find(|(_, ma, _)| !used.contains(&ma.offset)) {
                return Err(bad(
                    &a.path,
                    format!("'{name}' is not a matrix this model multiplies by whole (corelm applies adapters to attention and feed-forward matrices, not to the token embedding, the LM head, fused or expert tensors)"),
                ));
            }
        }
        Ok(())
    }
}

/// Why `cfg` cannot run adapters, if it cannot. (Mixtures of experts can: their routers and
/// shared experts take adapters; adapters on the experts are refused by
/// [`Adapters::check_applied`].)
pub(crate) fn check(cfg: &crate::EngineConfig) -> Result<(), Error> {
    let other = [
        (cfg.tp > 1 || cfg.tp == 0 && cfg.numa == corelm_core::NumaMode::Tp, "--tp"),
        (cfg.sparsity.is_some(), "--sparsity"),
        (cfg.accel.is_some() || cfg.accel_split || cfg.accel_layers > 0, "the accelerator (--accel-*)"),
        (cfg.plan.as_ref().is_some_and(|p| p.prefill.tp() > 1), "a plan's tensor parallelism"),
    ];
    if let Some((_, what)) = other.iter().find(|(on, _)| *on) {
        return Err(Error::Config(format!("LoRA adapters (--lora) run without {what} for now")));
    }
    Ok(())
}

fn bad(path: &Path, why: String) -> Error {
    Error::Config(format!("LoRA adapter {}: {why}", path.display()))
}

/// One adapter file, its matrices appended to `bytes` (each at a 64-byte boundary).
fn read(spec: &LoraSpec, g: &Gguf, model: &Gguf, kernels: &Kernels, bytes: &mut Vec<u8>) -> Result<Adapter, Error> {
    let path = &spec.path;
    let key = |k: &str| g.opt_str(k).map(|v| v.unwrap_or("").to_string()).map_err(|e| bad(path, e.to_string()));
    let general = key("general.type")?;
    if general != "adapter" {
        return Err(bad(path, format!("general.type is '{general}', expected 'adapter' (is this a model rather than an adapter?)")));
    }
    let (arch, base) = (key("general.architecture")?, model.str("general.architecture").unwrap_or(""));
    if arch != base {
        return Err(bad(path, format!("made for architecture '{arch}', the model is '{base}'")));
    }
    let kind = key("adapter.type")?;
    if kind != "lora" {
        return Err(bad(path, format!("adapter.type is '{kind}', expected 'lora'")));
    }
    if g.get("adapter.alora.invocation_tokens").is_some() {
        return Err(bad(path, "aLoRA adapters (adapter.alora.invocation_tokens) are not supported".into()));
    }
    let alpha = g.opt_f32("adapter.lora.alpha").map_err(|e| bad(path, e.to_string()))?.unwrap_or(0.0);
    let mut names: Vec<&str> = Vec::new();
    for t in &g.tensors {
        match t.name.strip_suffix(".lora_a").or_else(|| t.name.strip_suffix(".lora_b")) {
            Some(base) if !names.contains(&base) => names.push(base),
            Some(_) => {}
            None if t.name.ends_with("_norm.weight") => {}
            None => return Err(bad(path, format!("tensor '{}' is not a .lora_a or .lora_b matrix", t.name))),
        }
    }
    let mut pairs = Vec::with_capacity(names.len());
    for name in names {
        let part = |s: &str| g.tensor(&format!("{name}.lora_{s}")).ok_or_else(|| bad(path, format!("'{name}' has no .lora_{s} (its pair is missing one matrix)")));
        let (ta, tb) = (part("a")?, part("b")?);
        if name == "token_embd.weight" {
            return Err(bad(path, "adapters on the token embedding are not supported".into()));
        }
        let w = model.tensor(name).ok_or_else(|| bad(path, format!("'{name}' is not a tensor of the model (an adapter for another base model?)")))?;
        let dims = |t: &corelm_gguf::TensorInfo| t.shape[..t.n_dims.max(2)].iter().map(|&v| v as usize).collect::<Vec<_>>();
        let (da, db, dw) = (dims(ta), dims(tb), dims(w));
        if da.len() != 2 || db.len() != 2 || dw.len() != 2 || da[0] != dw[0] || db[1] != dw[1] {
            return Err(bad(path, format!("'{name}': lora_a {da:?} and lora_b {db:?} do not fit the model's {dw:?} (an adapter for another base model?)")));
        }
        if da[1] != db[0] {
            return Err(bad(path, format!("'{name}': lora_a {da:?} is not transposed against lora_b {db:?} (ranks {} and {})", da[1], db[0])));
        }
        let mut copy = |t: &corelm_gguf::TensorInfo, ne: [usize; 2]| -> Result<AdapterMatrix, Error> {
            let dtype: DType = t.dtype;
            if kernels.ops(dtype).is_none() || !ne[0].is_multiple_of(dtype.block_size()) {
                return Err(bad(path, format!("'{}': type {dtype} with rows of {} values cannot be multiplied here (F32, F16 and BF16 always can)", t.name, ne[0])));
            }
            let offset = bytes.len().div_ceil(64) * 64;
            bytes.resize(offset, 0);
            bytes.extend_from_slice(g.tensor_data(t));
            Ok(AdapterMatrix { dtype, ne, offset })
        };
        let a = copy(ta, [da[0], da[1]])?;
        let b = copy(tb, [db[0], db[1]])?;
        pairs.push((name.to_string(), a, b));
    }
    if pairs.is_empty() {
        return Err(bad(path, "holds no .lora_a/.lora_b pair".into()));
    }
    let (task_name, prompt_prefix) = (key("adapter.lora.task_name")?, key("adapter.lora.prompt_prefix")?);
    Ok(Adapter { path: path.clone(), alpha, scale: spec.scale, task_name, prompt_prefix, pairs })
}
