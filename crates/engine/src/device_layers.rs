//! `--accel-layers N`: the model's first N layers whole on the accelerator
//! (`corelm_accel::DeviceLayers`), the CPU running the rest and the LM head — llama.cpp's
//! `-ngl`, counted from the first layer. The graph hands the embeddings to one
//! `Op::DeviceLayers` node and starts its own layers at N.
//!
//! The device keeps those layers' KV cache, written and read through the CPU cache's block
//! tables (each pass uploads its tokens' cache rows and their sequences' tables), so every
//! sequence, release and shared prefix the CPU's cache tracks holds on the device too. The
//! CPU's cache still has room for those layers (unused). A context shift's moves are repeated
//! in the device's cache (its rows read back, keys rotated on the host, written again).
//!
//! `--accel-min-tokens T`: passes of fewer than T tokens (decode steps) run those layers on the
//! CPU instead — the accelerator where a pass is compute-bound, the CPU where one round trip
//! per token costs more than its layers (docs/benchmarks.md: on an H200 through wgpu, prefill
//! 4–5.6× 16 cores, decode 0.3–0.66×). Both caches then hold every row: after a pass on the
//! device its rows are read back into the CPU's cache (converted to the CPU cache's type), and
//! the rows CPU passes wrote are uploaded before the next device pass (`Sync`). The CPU holds
//! those layers' repacked weights too.
//!
//! Which layers can go is the model's to say (`Model::device_layer`): LLaMA, Qwen2, Qwen3 and
//! Gemma 3 (RoPE without per-frequency factors, separate Q/K/V, dense feed-forwards); not with
//! tensor parallelism or the other accelerator modes. A device lost mid-run fails the
//! pass with its error: the layers' cache lives there, so the CPU cannot take them over.

use crate::Error;
use corelm_accel::{DeviceLayers, FileMatrix, Gpu, LayerFiles, LayerShape};
use corelm_core::kv::{KvCache, BLOCK};
use corelm_core::BatchView;
use corelm_gguf::{Gguf, TensorInfo};
use corelm_kernels::{DType, Kernels};
use corelm_models::Model;
use std::sync::{Arc, Mutex};

/// The accelerator's layers and the per-pass table buffer (reused: nothing allocated per
/// pass once it has grown to the largest batch's).
pub struct LayersOnDevice {
    layers: DeviceLayers,
    tables: Mutex<PassTables>,
    /// Where passes alternate between the device and the CPU (`--accel-min-tokens`).
    sync: Option<Mutex<Sync>>,
}

/// The two caches kept in step (`--accel-min-tokens`): buffers sized at load.
struct Sync {
    /// Cells the CPU wrote since the last device pass (their rows not yet on the device).
    stale: Vec<u32>,
    /// Up to `UPLOAD_CELLS` consecutive cells' keys and values on their way to the device.
    k: Vec<f32>,
    v: Vec<f32>,
}

/// Cells uploaded per copy (`Sync::k`, `Sync::v`).
const UPLOAD_CELLS: usize = 256;

/// One pass's block tables for the device.
struct PassTables {
    /// `[n_tokens]` table offsets, then the batch's sequences' block tables.
    words: Vec<u32>,
    /// The sequences seen in the pass, with their tables' offsets.
    seqs: Vec<(i32, u32)>,
}

/// Why `--accel-layers` cannot run with `cfg`, if it cannot (checked before the model loads).
pub fn check(cfg: &crate::EngineConfig) -> Result<(), Error> {
    check_with(cfg, cfg.tp, cfg.accel_min_tokens).map_err(|why| Error::Config(format!("--accel-layers: {why}")))
}

/// Why layers on the accelerator from `min_tokens` tokens cannot run with the rest of `cfg` at
/// tensor-parallel degree `tp`: [`check`]'s rules, also for a plan's layers
/// (`Plan::accel_for`), which are not in `cfg` yet.
pub(crate) fn check_with(cfg: &crate::EngineConfig, tp: usize, min_tokens: usize) -> Result<(), String> {
    if tp > 1 {
        return Err("runs without tensor parallelism for now; drop --tp".into());
    }
    if cfg.accel.is_some() || cfg.accel_split || cfg.sparsity.is_some() {
        return Err("runs whole layers on the accelerator; --accel-mem, --accel-split and --sparsity place other work: use one".into());
    }
    let t = min_tokens;
    if t > 1 {
        if t > cfg.n_batch {
            return Err(format!("--accel-min-tokens {t}: passes hold at most the batch size's {} tokens, so none would reach the accelerator", cfg.n_batch));
        }
        if cfg.batch_invariant {
            return Err(format!("--accel-min-tokens {t} runs a token's first layers on the accelerator or the CPU by the size of its batch, so its results would depend on the batch: not with --batch-invariant (serve's default; `serve --no-batch-invariant` allows it)"));
        }
        if cfg.kv_layout == corelm_kernels::attention::KeyLayout::Columns {
            return Err(format!("--accel-min-tokens {t} copies cache rows between the CPU and the accelerator, which reads keys in rows: not with --kv-layout columns; use --kv-layout rows"));
        }
    }
    Ok(())
}

impl LayersOnDevice {
    /// Open the accelerator and upload the first `n` layers of `gguf` (`model` says how each
    /// runs) with a cache of `n_cells` rows, for passes of up to `n_batch` tokens of up to
    /// `n_seq` sequences. `batch_invariant`: a token's results as if alone in its batch (what
    /// `serve` asks).
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        gguf: &Gguf,
        model: &dyn Model,
        n: usize,
        kv: &KvCache,
        n_batch: usize,
        n_seq: usize,
        batch_invariant: bool,
        alternate: bool,
    ) -> Result<LayersOnDevice, Error> {
        let n_cells = kv.n_cells;
        let h = model.hyper();
        let refuse = |why: String| Error::Config(format!("--accel-layers {n}: {why}"));
        if n > h.n_layer {
            return Err(refuse(format!("the model has {} layers", h.n_layer)));
        }
        if h.head_dim > 256 || !h.n_rot.is_multiple_of(2) || h.n_rot > h.head_dim {
            return Err(refuse(format!("heads of {} values with {} rotated: the device's attention takes at most 256", h.head_dim, h.n_rot)));
        }
        let specs = (0..n)
            .map(|il| {
                model.device_layer(il).ok_or_else(|| {
                    refuse(format!(
                        "layer {il} of this {} model cannot run on the accelerator (it runs LLaMA, Qwen2, Qwen3 and Gemma 3 layers: not RoPE with per-frequency factors or YaRN, fused Q/K/V, experts or a query temperature)",
                        h.arch
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let shape = LayerShape { n_embd: h.n_embd, n_head: h.n_head, n_kv_head: h.n_kv_head, head_dim: h.head_dim, n_rot: h.n_rot, n_ff: h.n_ff, eps: h.eps };
        let tensor = |name: String| gguf.tensor(&name).ok_or_else(|| refuse(format!("the model has no {name}")));
        let matrix = |t: &TensorInfo| -> Result<FileMatrix, Error> {
            if !corelm_accel::supported(t.dtype) {
                return Err(refuse(format!("{} is {}, which the accelerator has no kernel for", t.name, t.dtype)));
            }
            Ok(crate::offload::file_matrix(gguf, t))
        };
        let vector = |t: &TensorInfo| -> Result<Vec<f32>, Error> {
            if t.dtype != DType::F32 {
                return Err(refuse(format!("{} is {}, not F32", t.name, t.dtype)));
            }
            Ok(gguf.tensor_data(t).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        };
        // Each layer's norms and biases as f32 (the optional ones where the file has them),
        // then the file views of its matrices.
        const VECTORS: [&str; 9] = [
            "attn_norm.weight",
            "ffn_norm.weight",
            "attn_q.bias",
            "attn_k.bias",
            "attn_v.bias",
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "post_attention_norm.weight",
            "post_ffw_norm.weight",
        ];
        let mut vectors = Vec::with_capacity(n);
        for l in 0..n {
            let mut v: [Option<Vec<f32>>; 9] = Default::default();
            for (slot, name) in v.iter_mut().zip(VECTORS) {
                *slot = gguf.tensor(&format!("blk.{l}.{name}")).map(vector).transpose()?;
            }
            for (i, name) in VECTORS.iter().enumerate().take(2) {
                if v[i].is_none() {
                    return Err(refuse(format!("the model has no blk.{l}.{name}")));
                }
            }
            vectors.push(v);
        }
        let mut files = Vec::with_capacity(n);
        for (l, (v, spec)) in vectors.iter().zip(&specs).enumerate() {
            let m = |w: &str| tensor(format!("blk.{l}.{w}.weight")).and_then(matrix);
            files.push(LayerFiles {
                cfg: *spec,
                attn_norm: v[0].as_deref().expect("checked above"),
                ffn_norm: v[1].as_deref().expect("checked above"),
                bq: v[2].as_deref(),
                bk: v[3].as_deref(),
                bv: v[4].as_deref(),
                q_norm: v[5].as_deref(),
                k_norm: v[6].as_deref(),
                post_attn_norm: v[7].as_deref(),
                post_ffn_norm: v[8].as_deref(),
                wq: m("attn_q")?,
                wk: m("attn_k")?,
                wv: m("attn_v")?,
                wo: m("attn_output")?,
                gate: m("ffn_gate")?,
                up: m("ffn_up")?,
                down: m("ffn_down")?,
            });
        }
        let gpu = Arc::new(Gpu::open().map_err(|e| refuse(e.to_string()))?);
        let max_table = n_seq.min(n_batch) * n_cells.div_ceil(BLOCK);
        let layers = DeviceLayers::new(gpu, shape, &files, n_cells, n_batch, max_table, batch_invariant).map_err(|e| refuse(e.to_string()))?;
        let tables = Mutex::new(PassTables { words: Vec::with_capacity(n_batch + max_table), seqs: Vec::with_capacity(n_seq.min(n_batch)) });
        let (layers, sync) = if alternate {
            let kvd = h.n_kv_head * h.head_dim;
            let layers = layers.with_cache_read_back().map_err(|e| refuse(e.to_string()))?;
            let sync = Sync {
                // At most every cell once after a dedup, plus a pass's slots (`cpu_pass`).
                stale: Vec::with_capacity(n_cells + n_batch),
                k: vec![0.0; UPLOAD_CELLS * kvd],
                v: vec![0.0; UPLOAD_CELLS * kvd],
            };
            (layers, Some(Mutex::new(sync)))
        } else {
            (layers, None)
        };
        Ok(LayersOnDevice { layers, tables, sync })
    }

    /// The layers `cfg` asks for (`accel_layers`; none: `None`), opened with `kv`'s cells;
    /// `from_plan`: a plan file chose them, so a failure says to tune again.
    pub(crate) fn open_for(gguf: &Gguf, model: &dyn Model, kv: &KvCache, cfg: &crate::EngineConfig, from_plan: bool) -> Result<Option<LayersOnDevice>, Error> {
        if cfg.accel_layers == 0 {
            return Ok(None);
        }
        let d = Self::open(gguf, model, cfg.accel_layers, kv, cfg.n_batch, cfg.n_seq_max, cfg.batch_invariant, cfg.alternates_layers());
        match d {
            Err(e) if from_plan => Err(Error::Config(format!("the plan (corelm tune) runs layers on the accelerator, which failed here ({e}): tune again on this machine"))),
            d => d.map(Some),
        }
    }

    /// Where the device's passes spent their time since the last call (`bench --profile`).
    pub fn take_times(&self) -> corelm_accel::PassTimes {
        self.layers.take_times()
    }

    /// Whether a pass of `n_tokens` runs the device's attention in tiles of tokens (prefill).
    pub fn tiles_attention(&self, n_tokens: usize) -> bool {
        self.layers.tiles_attention(n_tokens)
    }

    /// Time the following passes' dispatches on the device's clock, or stop; false where the
    /// device cannot (`corelm_accel::clock`).
    pub fn set_timing(&self, on: bool) -> bool {
        self.layers.set_timing(on)
    }

    /// After a pass that ran the device's layers on the CPU: its cells' rows are not on the
    /// device yet.
    pub(crate) fn cpu_pass(&self, slots: &[u32]) {
        let Some(sync) = &self.sync else { return };
        let mut s = sync.lock().unwrap_or_else(|e| e.into_inner());
        if s.stale.len() + slots.len() > s.stale.capacity() {
            // Cells written twice since the last device pass (released and reused): once
            // deduplicated they number at most `n_cells`, so a pass's slots fit without growing.
            s.stale.sort_unstable();
            s.stale.dedup();
        }
        debug_assert!(s.stale.len() + slots.len() <= s.stale.capacity(), "a pass of {} tokens", slots.len());
        s.stale.extend_from_slice(slots);
    }

    /// Do CPU passes run these layers too (`--accel-min-tokens`), so that the CPU cache's rows
    /// of them are read?
    pub(crate) fn keeps_cpu_rows(&self) -> bool {
        self.sync.is_some()
    }

    /// Before a pass on the device: upload the rows the CPU wrote since the last one, from the
    /// CPU's cache (`kv`).
    pub(crate) fn upload_stale(&self, kv: &KvCache, kernels: &Kernels) {
        let Some(sync) = &self.sync else { return };
        let mut guard = sync.lock().unwrap_or_else(|e| e.into_inner());
        let Sync { stale, k, v, .. } = &mut *guard;
        stale.sort_unstable();
        stale.dedup();
        self.upload(kv, kernels, stale, k, v);
        stale.clear();
    }

    /// The CPU cache's rows of `cells` (ascending) onto the device, a run of consecutive cells
    /// at a time through `k` and `v` (`UPLOAD_CELLS` rows each).
    fn upload(&self, kv: &KvCache, kernels: &Kernels, cells: &[u32], k: &mut [f32], v: &mut [f32]) {
        let kvd = kv.n_kv_head * kv.head_dim;
        let mut i = 0;
        while i < cells.len() {
            // A run of consecutive cells from i, at most UPLOAD_CELLS.
            let mut j = i + 1;
            while j < cells.len() && j - i < UPLOAD_CELLS && cells[j] == cells[j - 1] + 1 {
                j += 1;
            }
            let n = (j - i) * kvd;
            for layer in 0..self.layers.len() {
                kv.load_cells(kernels, layer, &cells[i..j], &mut k[..n], &mut v[..n]);
                self.layers.write_cells(layer, cells[i], &k[..n], &v[..n]);
            }
            i = j;
        }
    }

    /// Slot files (`Engine::save_slot`) are written from the CPU's cache: the device's rows
    /// of `cells` into it first, converted to its type. Where both caches hold every row
    /// (`--accel-min-tokens`), the CPU's are current already.
    pub(crate) fn pull(&self, kv: &mut KvCache, kernels: &Kernels, cells: &[u32]) -> Result<(), Error> {
        if self.sync.is_some() {
            return Ok(());
        }
        cells.chunks(self.layers.max_tokens()).try_for_each(|c| self.read_into(kv, kernels, c)).map_err(|e| Error::Slot(format!("reading the accelerator's cache rows: {e}")))
    }

    /// Rows of the CPU's cache (a restored slot file's) onto the device.
    pub(crate) fn push(&self, kv: &KvCache, kernels: &Kernels, cells: &[u32]) {
        let kvd = kv.n_kv_head * kv.head_dim;
        let (mut k, mut v) = (vec![0f32; UPLOAD_CELLS * kvd], vec![0f32; UPLOAD_CELLS * kvd]);
        self.upload(kv, kernels, cells, &mut k, &mut v);
    }

    /// The device's rows of `cells` (at most `max_tokens`) into the CPU's cache.
    fn read_into(&self, kv: &mut KvCache, kernels: &Kernels, cells: &[u32]) -> Result<(), corelm_accel::AccelError> {
        let n = cells.len() * kv.n_kv_head * kv.head_dim;
        // Converted straight from the mapped read-back buffer.
        self.layers.read_cells(cells, |rows: &[f32]| {
            for (layer, rows) in rows.chunks_exact(2 * n).enumerate() {
                let (k, v) = rows.split_at(n);
                kv.store_cells(kernels, layer, cells, k, v);
            }
        })
    }

    /// After a pass on the device: its cells' rows (`slots`) into the CPU's cache.
    pub(crate) fn read_back(&self, kv: &mut KvCache, kernels: &Kernels, slots: &[u32]) {
        if self.sync.is_none() || slots.is_empty() {
            return;
        }
        if let Err(e) = self.read_into(kv, kernels, slots) {
            panic!("--accel-layers: reading the accelerator's cache rows back failed ({e}); the CPU's cache misses them, so the run cannot go on");
        }
    }

    /// The model's layers held (its first ones).
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Whether a context shift can move the device's rows: room to read them back (allocated
    /// here, once), else why not.
    pub(crate) fn can_shift(&self) -> Result<(), Error> {
        self.layers.cache_staging().map(|_| ()).map_err(|e| Error::Config(format!("context shift with --accel-layers: {e}")))
    }

    /// A context shift's moves (the CPU cache's, [`KvCache::shift`]) repeated in the device's
    /// cache, which the CPU's block tables index too; its keys rotated by `rotate` (f32 rows,
    /// so llama.cpp's shift of an F32 cache). The caller uploads the rows CPU passes wrote
    /// ([`Self::upload_stale`]) before the CPU's cache moves them.
    pub(crate) fn shift(&self, moved: &corelm_core::kv::Moved, rotate: &mut dyn FnMut(usize, &mut [f32])) {
        if let Err(e) = self.layers.move_cells(&moved.cells, moved.copied, rotate) {
            panic!("--accel-layers: moving the accelerator's cache rows for a context shift failed ({e}); its layers' cache no longer matches the CPU's, so the run cannot go on");
        }
    }

    /// Layer `layer`'s key and value rows of cache cell `cell` on the device (`[kvd]` f32 each).
    pub(crate) fn cell(&self, layer: usize, cell: u32) -> Result<(Vec<f32>, Vec<f32>), Error> {
        let mut out = (vec![], vec![]);
        let n_layers = self.layers.len();
        self.layers
            .read_cells(&[cell], |rows| {
                let kvd = rows.len() / (2 * n_layers);
                out = (rows[2 * layer * kvd..(2 * layer + 1) * kvd].to_vec(), rows[(2 * layer + 1) * kvd..(2 * layer + 2) * kvd].to_vec());
            })
            .map_err(|e| Error::Config(format!("--accel-layers: reading a cache row back: {e}")))?;
        Ok(out)
    }

    /// `N layers, X MB of weights and Y MB of cache on <device>`.
    pub fn summary(&self) -> String {
        let l = &self.layers;
        format!("{} layers, {:.1} MB of weights and {:.1} MB of KV cache, on {}", l.len(), l.weight_bytes() as f64 / 1e6, l.cache_bytes() as f64 / 1e6, l.gpu().name())
    }
}

impl corelm_core::DeviceLayers for LayersOnDevice {
    fn forward(&self, x: &mut [f32], batch: &BatchView, kv: &KvCache) {
        let mut guard = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let PassTables { words: tables, seqs } = &mut *guard;
        let n = batch.pos.len();
        tables.clear();
        seqs.clear();
        tables.resize(n, 0);
        for t in 0..n {
            let seq = batch.seq[t];
            let off = match seqs.iter().find(|(s, _)| *s == seq) {
                Some(&(_, off)) => off,
                None => {
                    let off = (tables.len() - n) as u32;
                    tables.extend_from_slice(kv.blocks.table(seq as usize));
                    seqs.push((seq, off));
                    off
                }
            };
            tables[t] = off;
        }
        if let Err(e) = self.layers.forward(x, batch.pos, batch.slots, tables) {
            panic!("--accel-layers: the accelerator failed ({e}); its layers' KV cache is lost with it, so the run cannot go on without it");
        }
    }
}
