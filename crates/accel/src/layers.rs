//! Whole decoder layers on the accelerator (`--accel-layers N`): the first N pre-norm blocks of
//! a LLaMA, Qwen2, Qwen3 or Gemma 3 model — norms, Q/K/V with their biases and per-head norms,
//! RoPE, the KV cache, attention (a sliding window where the layer has one), Wo, the gated
//! feed-forward, the output norms, both residual adds — recorded for every layer into one
//! command buffer, so a pass pays one upload and one read-back however many layers the device
//! holds (the per-layer round trip is what made the hot-neuron feed-forward slower than 16
//! cores on an H100: docs/benchmarks.md).
//!
//! Each dispatch waits for the one before it (about 10 µs each on an H200, measured as a
//! whole pass: docs/benchmarks.md), so adds ride on the products that make their operands:
//! Q's, K's and V's biases are added in their products, and without an output norm Wo's and
//! down's products add themselves onto `x` (`matrix::Addend`, the same float operations as
//! the add dispatches); RoPE of Q, of K and the cache store are one dispatch (K rotated on its way
//! into the cache); matrices that read the same input are one matrix of their rows where their
//! type is the same, one product: gate and up, and Q, K and V (or Q and K where V's type
//! differs). Q, K and V are written into one buffer, each token's row `[q | k | v]` (products
//! at a stride and an offset, `matrix::Place`), whatever products make them. In passes through
//! the GEMV (fewer than `GEMM_MIN_TOKENS` tokens: decode; or batch-invariant ones) the
//! products after a norm norm their input as they read it (`Input::Normed`: each workgroup
//! computes its tokens' scales as the norm's dispatch would, a read of its tokens' rows), so
//! a LLaMA layer is 7 dispatches at decode (16 before these fusions), a Qwen2 layer 7 or 8
//! (19), Gemma 3's 13 or 14 (20); prefill passes keep the two norms' dispatches (9, 9–10,
//! 15–16). The activation keeps its dispatch: down's product reading act(gate) · up itself
//! would compute each activation once per workgroup of output rows (576–896 times), which
//! made decode on lavapipe twice as slow and on a weaker GPU could cost more than the
//! dispatch it saves (docs/benchmarks.md).
//!
//! The device's KV cache mirrors the CPU's (`corelm_core::kv`): each token's key and value rows
//! go to the cache row the CPU's block tables give it (`slots`), and each token attends over
//! its sequence's rows 0 ..= pos through the same tables, so several sequences per batch,
//! their releases and shared prefix blocks need nothing of their own here. Rows are f32.
//!
//! Every buffer is allocated at load, sized for `max_tokens` tokens and `max_table` table
//! entries; a pass only writes them. Sums are f32 (the matrices through [`Matrix`]'s GEMV or
//! tiled GEMM), so results agree with the CPU's within a bound, not bit for bit.

use crate::clock::{DeviceClock, Kind, Timestamps};
use crate::device::{grid, AccelError, Gpu, Shape};
use crate::ffn::FileMatrix;
use crate::matrix::{Addend, Input, Matrix, Place, GEMM_MIN_TOKENS};
use corelm_core::DeviceLayerSpec;
use std::sync::{Arc, Mutex, OnceLock};

/// The shape and settings every device layer shares.
#[derive(Clone, Copy, Debug)]
pub struct LayerShape {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Values of each head RoPE rotates (the first ones).
    pub n_rot: usize,
    pub n_ff: usize,
    pub eps: f32,
}

/// One layer's weights as the model file holds them, and its settings.
pub struct LayerFiles<'a> {
    pub cfg: DeviceLayerSpec,
    pub attn_norm: &'a [f32],
    /// Per-head norms of Q and K (Gemma 3, Qwen3), and norms of the attention's and the
    /// feed-forward's outputs (Gemma 3).
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    pub post_attn_norm: Option<&'a [f32]>,
    pub post_ffn_norm: Option<&'a [f32]>,
    pub wq: FileMatrix<'a>,
    pub wk: FileMatrix<'a>,
    pub wv: FileMatrix<'a>,
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    pub wo: FileMatrix<'a>,
    pub ffn_norm: &'a [f32],
    pub gate: FileMatrix<'a>,
    pub up: FileMatrix<'a>,
    pub down: FileMatrix<'a>,
}

/// A layer's matrices, its cache, its parameters and the bind group of each of its dispatches.
struct Layer {
    /// Q's, K's and V's products: runs of them of one type as one matrix of their rows, each
    /// with its first column in the row `[q | k | v]`.
    qkv: Vec<(Matrix, usize)>,
    mats: [Matrix; 2], // wo, down
    /// Gate and up as one matrix of `2 · n_ff` rows where they have one type (one product
    /// into `[tokens][gate | up]`), else the two.
    gate_up: Vec<Matrix>,
    /// Its key and value cache, `[n_cells, kvd]` f32 each.
    kc: wgpu::Buffer,
    vc: wgpu::Buffer,
    /// Norms, biases and the cache, kept alive for the bind groups.
    _bufs: Vec<wgpu::Buffer>,
    /// Q, K and V add their biases in their products (`Addend::Bias`).
    has_bias: bool,
    cfg: DeviceLayerSpec,
    /// Its RoPE (of Q, and of K into the cache), attention and activation parameters (written
    /// when the batch changes).
    rope: Shape,
    attn: Shape,
    act: Shape,
    bind: LayerBinds,
}

struct LayerBinds {
    norm1: wgpu::BindGroup,
    /// `Layer::qkv`'s products, reading `xn`; and reading `x` normed as they read it (the
    /// GEMV: passes of fewer than `GEMM_MIN_TOKENS` tokens, or batch-invariant ones).
    qkv: Vec<wgpu::BindGroup>,
    qkv_normed: Vec<wgpu::BindGroup>,
    q_norm: Option<wgpu::BindGroup>,
    k_norm: Option<wgpu::BindGroup>,
    /// RoPE of Q in place, K rotated into the cache and V copied there: one dispatch.
    rope_store: wgpu::BindGroup,
    attn: wgpu::BindGroup,
    /// Wo's product: onto `x` itself (`x += Wo · attention`, no residual dispatch), or with an
    /// output norm into `o`.
    o: wgpu::BindGroup,
    /// The attention's output norm from `o` into `xn` (Gemma 3), and the residual add of `xn`
    /// (only with the norm).
    post_attn: Option<wgpu::BindGroup>,
    residual1: Option<wgpu::BindGroup>,
    norm2: wgpu::BindGroup,
    /// Gate's and up's product (one where `Layer::gate_up` is one matrix; reading `xn`, or `x`
    /// normed as `qkv_normed`), and the activation.
    gate_up: Vec<wgpu::BindGroup>,
    gate_up_normed: Vec<wgpu::BindGroup>,
    act: wgpu::BindGroup,
    /// Down's product, onto `x` or into `o` as Wo's.
    down: wgpu::BindGroup,
    post_ffn: Option<wgpu::BindGroup>,
    residual2: Option<wgpu::BindGroup>,
}

/// Shader parameters every layer shares, one uniform buffer each (those that depend on the
/// batch written only when it changes: decode steps write none).
struct Params {
    norm: wgpu::Buffer,
    /// Q's and K's per-head norms (their row counts differ).
    norm_q: Shape,
    norm_k: Shape,
    add_e: Shape,
}

/// The first layers of a model on the device, and the buffers a pass uses.
pub struct DeviceLayers {
    gpu: Arc<Gpu>,
    shape: LayerShape,
    max_tokens: usize,
    max_table: usize,
    layers: Vec<Layer>,
    x: wgpu::Buffer,
    pos: wgpu::Buffer,
    slots: wgpu::Buffer,
    tables: wgpu::Buffer,
    staging: wgpu::Buffer,
    /// `read_cells`' staging, `[layer][key, value][max_tokens][kvd]` f32 (made when first
    /// needed: `with_cache_read_back`, a shift).
    cache_staging: OnceLock<wgpu::Buffer>,
    params: Params,
    cache_bytes: u64,
    /// Every product through the GEMV, so a token's results do not depend on its batch.
    batch_invariant: bool,
    /// One pass at a time (the buffers are shared).
    lock: Mutex<()>,
    /// Where the passes' time went, since the last `take_times`.
    times: Mutex<PassTimes>,
    /// The device's clock between dispatches, while timing is on (`set_timing`).
    clock: Mutex<Option<Timestamps>>,
}

/// Where passes on the device spent their time (host clocks), summed over passes.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassTimes {
    pub passes: usize,
    /// Dispatches recorded.
    pub dispatches: usize,
    /// Uploading the pass's inputs, recording its dispatches and submitting them.
    pub record_secs: f64,
    /// Waiting for the device to finish, and reading the output back.
    pub wait_secs: f64,
    /// The device's own clock per kind of dispatch, over the passes timed (`set_timing`).
    pub device: DeviceClock,
}

/// A pass's dispatches as they are recorded: counted, and timed while timing is on.
struct Recorder<'a, 'p> {
    pass: &'a mut wgpu::ComputePass<'p>,
    dispatches: usize,
    clock: Option<&'a mut Timestamps>,
}

impl Recorder<'_, '_> {
    /// One dispatch of `pipe` over `bind`.
    fn run(&mut self, kind: Kind, pipe: &wgpu::ComputePipeline, bind: &wgpu::BindGroup, (gx, gy): (u32, u32)) {
        self.pass.set_pipeline(pipe);
        self.pass.set_bind_group(0, bind, &[]);
        self.pass.dispatch_workgroups(gx, gy, 1);
        self.done(kind);
    }

    /// A dispatch of `kind` recorded.
    fn done(&mut self, kind: Kind) {
        self.dispatches += 1;
        if let Some(clock) = self.clock.as_deref_mut() {
            clock.mark(self.pass, kind);
        }
    }
}

impl DeviceLayers {
    /// Upload `layers` (the model's first ones, in order) with a cache of `n_cells` rows per
    /// layer (the CPU cache's), for passes of up to `max_tokens` tokens whose block tables
    /// hold up to `max_table` entries together. `batch_invariant`: every product through the
    /// GEMV (a token's sums as if alone; the tiled GEMM sums in another order).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: Arc<Gpu>,
        shape: LayerShape,
        layers: &[LayerFiles],
        n_cells: usize,
        max_tokens: usize,
        max_table: usize,
        batch_invariant: bool,
    ) -> Result<DeviceLayers, AccelError> {
        let s = shape;
        let (e, qd, kvd, ff) = (s.n_embd, s.n_head * s.head_dim, s.n_kv_head * s.head_dim, s.n_ff);
        assert!(s.head_dim <= 256 && s.n_head.is_multiple_of(s.n_kv_head), "head_dim {} ≤ 256, {} heads over {} KV heads", s.head_dim, s.n_head, s.n_kv_head);
        let f = |n: usize| (n * 4) as u64;
        let rw = wgpu::BufferUsages::empty();
        let dst = wgpu::BufferUsages::COPY_DST;
        let x = gpu.storage("layers x", f(max_tokens * e), dst | wgpu::BufferUsages::COPY_SRC)?;
        let xn = gpu.storage("layers xn", f(max_tokens * e), rw)?;
        // Each token's row `[q | k | v]`.
        let qkv_row = qd + 2 * kvd;
        let qkv_buf = gpu.storage("layers qkv", f(max_tokens * qkv_row), rw)?;
        let att = gpu.storage("layers attention", f(max_tokens * qd), rw)?;
        let o = gpu.storage("layers o", f(max_tokens * e), rw)?;
        // Gate's outputs, or gate's and up's where one product makes both.
        let g = gpu.storage("layers gate", f(max_tokens * 2 * ff), rw)?;
        // Up's outputs where a layer's up is a product of its own (allocated for the first).
        let mut u: Option<wgpu::Buffer> = None;
        let a = gpu.storage("layers act", f(max_tokens * ff), rw)?;
        let pos = gpu.storage("layers pos", f(max_tokens), dst)?;
        let slots = gpu.storage("layers slots", f(max_tokens), dst)?;
        let tables = gpu.storage("layers tables", f(max_tokens + max_table), dst)?;
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("layers staging"),
            size: x.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let params = Params {
            norm: gpu.uniform(&[e as u32, s.eps.to_bits(), 0, 0]),
            norm_q: Shape::new(&gpu),
            norm_k: Shape::new(&gpu),
            add_e: Shape::new(&gpu),
        };
        let vector = |name: &str, v: &[f32]| -> Result<wgpu::Buffer, AccelError> {
            let b = gpu.storage(name, f(v.len()), dst)?;
            gpu.queue.write_buffer(&b, 0, bytemuck::cast_slice(v));
            Ok(b)
        };
        let mut out = Vec::with_capacity(layers.len());
        let mut cache_bytes = 0;
        for (il, l) in layers.iter().enumerate() {
            assert_eq!((l.attn_norm.len(), l.ffn_norm.len()), (e, e), "layer {il}: norms of {e}");
            let up = |name: &str, m: &FileMatrix| Matrix::upload(&gpu, &format!("blk.{il}.{name}"), m.dtype, m.rows, m.cols, &m.bytes[..m.rows * m.row_bytes()]);
            let mats = [up("attn_output", &l.wo)?, up("ffn_down", &l.down)?];
            let shapes = [(qd, e), (kvd, e), (kvd, e), (e, qd), (e, ff), (ff, e), (ff, e)];
            for (&(rows, cols), m) in shapes.iter().zip([&l.wq, &l.wk, &l.wv, &l.wo, &l.down, &l.gate, &l.up]) {
                assert_eq!((m.rows, m.cols), (rows, cols), "layer {il}: a matrix of {rows} × {cols}");
            }
            // Gate's rows then up's, one product for both where their type is the same (and the
            // two fit one buffer).
            let gate_up: Vec<Matrix> = runs(&gpu, [&l.gate, &l.up], &format!("blk.{il}"), ["ffn_gate", "ffn_up"])?.into_iter().map(|(m, _)| m).collect();
            let fused = gate_up.len() == 1;
            if !fused && u.is_none() {
                u = Some(gpu.storage("layers up", f(max_tokens * ff), rw)?);
            }
            let up_out = if fused { &g } else { u.as_ref().expect("allocated above") };
            let gate_up_out = if fused { vec![&g] } else { vec![&g, up_out] };
            let n1 = vector(&format!("blk.{il}.attn_norm"), l.attn_norm)?;
            let n2 = vector(&format!("blk.{il}.ffn_norm"), l.ffn_norm)?;
            // Copied to and from the CPU's cache where passes alternate (`write_cells`, `read_cells`).
            let copy = wgpu::BufferUsages::COPY_SRC | dst;
            let kc = gpu.storage(&format!("blk.{il} key cache"), f(n_cells * kvd), copy)?;
            let vc = gpu.storage(&format!("blk.{il} value cache"), f(n_cells * kvd), copy)?;
            cache_bytes += kc.size() + vc.size();
            let biases = [l.bq, l.bk, l.bv];
            let has_bias = biases.iter().any(Option::is_some);
            assert!(biases.iter().all(Option::is_some) || !has_bias, "layer {il}: biases on all of Q, K, V or none");
            // Q, K and V as runs of one type, each run's biases side by side as its rows are.
            let qkv = runs(&gpu, [&l.wq, &l.wk, &l.wv], &format!("blk.{il}"), ["attn_q", "attn_k", "attn_v"])?;
            let mut bias_bufs = Vec::new();
            if has_bias {
                let all: Vec<f32> = biases.iter().flat_map(|b| b.expect("checked: all or none").iter().copied()).collect();
                assert_eq!(all.len(), qkv_row, "layer {il}: biases of Q, K and V");
                for (m, c0) in &qkv {
                    bias_bufs.push(vector(&format!("blk.{il} bias from {c0}"), &all[*c0..*c0 + m.rows])?);
                }
            }
            let mut bufs = Vec::new();
            let norm = |name: &str, w: Option<&[f32]>, len: usize| -> Result<Option<wgpu::Buffer>, AccelError> {
                let Some(w) = w else { return Ok(None) };
                assert_eq!(w.len(), len, "layer {il}: {name} of {len}");
                Ok(Some(vector(&format!("blk.{il}.{name}"), w)?))
            };
            let (qn, kn) = (norm("attn_q_norm", l.q_norm, s.head_dim)?, norm("attn_k_norm", l.k_norm, s.head_dim)?);
            let (pa, pf) = (norm("post_attention_norm", l.post_attn_norm, e)?, norm("post_ffw_norm", l.post_ffn_norm, e)?);
            let p = &gpu.layer;
            let (rope, attn, act) = (Shape::new(&gpu), Shape::new(&gpu), Shape::new(&gpu));
            let head_norm = |w: &Option<wgpu::Buffer>, pn| w.as_ref().map(|w| gpu.bind("head norm", &p.head_norm, [&qkv_buf, w, pn]));
            let post = |w: &Option<wgpu::Buffer>| w.as_ref().map(|w| gpu.bind("post norm", &p.rms_norm, [&o, w, &xn, &params.norm]));
            // Without an output norm a product adds itself onto `x`; with one, the norm's
            // output `xn` is added by a dispatch of its own.
            let residual = |w: &Option<wgpu::Buffer>| w.as_ref().map(|_| gpu.bind("residual", &p.add, [&x, &xn, &params.add_e.buf]));
            let onto = |w: &Option<wgpu::Buffer>| if w.is_some() { &o } else { &x };
            let bind = LayerBinds {
                norm1: gpu.bind("attn norm", &p.rms_norm, [&x, &n1, &xn, &params.norm]),
                // Each run into its columns of `[q | k | v]`, adding its biases where the layer has them.
                qkv: qkv.iter().enumerate().map(|(i, (m, _))| m.bind_with(&gpu, &xn, &qkv_buf, bias_bufs.get(i), None)).collect(),
                qkv_normed: qkv.iter().enumerate().map(|(i, (m, _))| m.bind_with(&gpu, &x, &qkv_buf, bias_bufs.get(i), Some(&n1))).collect(),
                q_norm: head_norm(&qn, &params.norm_q.buf),
                k_norm: head_norm(&kn, &params.norm_k.buf),
                rope_store: gpu.bind("rope and kv store", &p.rope_store, [&qkv_buf, &kc, &vc, &pos, &slots, &rope.buf]),
                attn: gpu.bind("attention", &p.attention, [&qkv_buf, &kc, &vc, &att, &pos, &tables, &attn.buf]),
                o: mats[0].bind(&gpu, &att, onto(&pa)),
                post_attn: post(&pa),
                residual1: residual(&pa),
                norm2: gpu.bind("ffn norm", &p.rms_norm, [&x, &n2, &xn, &params.norm]),
                gate_up: gate_up.iter().zip(&gate_up_out).map(|(m, y)| m.bind(&gpu, &xn, y)).collect(),
                gate_up_normed: gate_up.iter().zip(&gate_up_out).map(|(m, y)| m.bind_with(&gpu, &x, y, None, Some(&n2))).collect(),
                act: gpu.bind("act", &gpu.act, [&g, up_out, &a, &act.buf]),
                down: mats[1].bind(&gpu, &a, onto(&pf)),
                post_ffn: post(&pf),
                residual2: residual(&pf),
            };
            bufs.extend([n1, n2]);
            bufs.extend(bias_bufs);
            bufs.extend([qn, kn, pa, pf].into_iter().flatten());
            out.push(Layer { qkv, mats, gate_up, kc, vc, _bufs: bufs, has_bias, cfg: l.cfg, rope, attn, act, bind });
        }
        // The activation buffers live on in the bind groups; `x` also here, to upload and read.
        drop((xn, qkv_buf, att, o, g, u, a));
        // The tiled attention of this head dimension compiled now, at load, not in a pass.
        let _ = gpu.layer.attention_tiles(&gpu.device, s.head_dim);
        Ok(DeviceLayers { gpu, shape, max_tokens, max_table, layers: out, x, pos, slots, tables, staging, cache_staging: OnceLock::new(), params, cache_bytes, batch_invariant, lock: Mutex::new(()), times: Mutex::new(PassTimes::default()), clock: Mutex::new(None) })
    }

    /// Room to read a pass's cache rows back ([`Self::read_cells`]) allocated now, not at the
    /// first read.
    pub fn with_cache_read_back(self) -> Result<DeviceLayers, AccelError> {
        self.cache_staging()?;
        Ok(self)
    }

    /// `read_cells`' staging: `max_tokens` cells of every layer, allocated once.
    pub fn cache_staging(&self) -> Result<&wgpu::Buffer, AccelError> {
        if let Some(b) = self.cache_staging.get() {
            return Ok(b);
        }
        let len = (self.layers.len() * 2 * self.max_tokens * self.kvd() * 4) as u64;
        if len > self.gpu.max_buffer {
            return Err(AccelError::TooLarge { what: "the cache rows of a pass".into(), need: len, max: self.gpu.max_buffer });
        }
        let b = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("layers cache staging"),
            size: len.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(self.cache_staging.get_or_init(|| b))
    }

    /// Move cache rows `(from, to)` of every layer, in order (a context shift: each row is
    /// read before any move lands on it), the keys of the moves from `copied` on passed
    /// through `rotate(layer, key)` one KV head (`head_dim` values) at a time. Through the
    /// host, `max_tokens` rows a round: read back, rotated, written through the queue.
    pub fn move_cells(&self, moves: &[(u32, u32)], copied: usize, rotate: &mut dyn FnMut(usize, &mut [f32])) -> Result<(), AccelError> {
        let (kvd, hd) = (self.kvd(), self.shape.head_dim);
        let mut rows = Vec::new();
        let mut from = Vec::with_capacity(self.max_tokens.min(moves.len()));
        for (c, chunk) in moves.chunks(self.max_tokens).enumerate() {
            // Every source of the round is read before any of its rows is written; an earlier
            // round's writes land on no later source (the order above).
            from.clear();
            from.extend(chunk.iter().map(|m| m.0));
            self.read_cells(&from, |r| {
                rows.clear();
                rows.extend_from_slice(r);
            })?;
            let n = chunk.len();
            for (l, layer) in rows.chunks_exact_mut(2 * n * kvd).enumerate() {
                let (k, v) = layer.split_at_mut(n * kvd);
                // This round's copies keep their keys.
                let kept = copied.saturating_sub(c * self.max_tokens).min(n);
                k[kept * kvd..].chunks_exact_mut(hd).for_each(|key| rotate(l, key));
                // One write per run of consecutive destination cells.
                let mut i = 0;
                while i < n {
                    let j = (i + 1..n).find(|&j| chunk[j].1 != chunk[j - 1].1 + 1).unwrap_or(n);
                    self.write_cells(l, chunk[i].1, &k[i * kvd..j * kvd], &v[i * kvd..j * kvd]);
                    i = j;
                }
            }
        }
        Ok(())
    }

    /// Values of one cache row: every KV head's `head_dim`.
    fn kvd(&self) -> usize {
        self.shape.n_kv_head * self.shape.head_dim
    }

    /// Write cache rows `cell0 ..` of `layer` (`k`, `v`: whole rows, `[n, kvd]` f32), through
    /// the queue: the next pass sees them.
    pub fn write_cells(&self, layer: usize, cell0: u32, k: &[f32], v: &[f32]) {
        let l = &self.layers[layer];
        let off = u64::from(cell0) * (self.kvd() * 4) as u64;
        assert!(k.len() == v.len() && k.len().is_multiple_of(self.kvd()) && off + (k.len() * 4) as u64 <= l.kc.size(), "rows {cell0}.. of {} values", self.kvd());
        self.gpu.queue.write_buffer(&l.kc, off, bytemuck::cast_slice(k));
        self.gpu.queue.write_buffer(&l.vc, off, bytemuck::cast_slice(v));
    }

    /// Read back the cache rows of `cells` (at most `max_tokens`) of every layer and hand them,
    /// mapped, to `f`: `[layer][key, value][cells.len()][kvd]` f32. One copy per layer and run
    /// of consecutive cells, one submission and a wait.
    pub fn read_cells(&self, cells: &[u32], f: impl FnOnce(&[f32])) -> Result<(), AccelError> {
        let (n, kvd) = (cells.len(), self.kvd());
        assert!(n <= self.max_tokens, "{n} cells, at most {}", self.max_tokens);
        let staging = self.cache_staging()?;
        if n == 0 {
            f(&[]);
            return Ok(());
        }
        let _pass = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let row = (kvd * 4) as u64;
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        let mut i = 0;
        while i < n {
            // The run of consecutive cells from i.
            let mut j = i + 1;
            while j < n && cells[j] == cells[j - 1] + 1 {
                j += 1;
            }
            for (il, l) in self.layers.iter().enumerate() {
                for (kind, buf) in [&l.kc, &l.vc].into_iter().enumerate() {
                    let dst = ((il * 2 + kind) * n + i) as u64 * row;
                    enc.copy_buffer_to_buffer(buf, u64::from(cells[i]) * row, staging, dst, (j - i) as u64 * row);
                }
            }
            i = j;
        }
        self.gpu.queue.submit([enc.finish()]);
        self.gpu.read_back_with(staging, self.layers.len() * 2 * n * kvd, f)
    }

    /// Most tokens a pass takes, and cells a read-back ([`Self::read_cells`]) takes.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Layers held.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.layers.iter().flat_map(|l| l.qkv.iter().map(|(m, _)| m).chain(&l.mats).chain(&l.gate_up)).map(Matrix::bytes).sum()
    }

    /// Bytes of the device's KV cache.
    pub fn cache_bytes(&self) -> u64 {
        self.cache_bytes
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The passes' times since the last call, then zero.
    pub fn take_times(&self) -> PassTimes {
        std::mem::take(&mut *self.times.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The tiled attention's pipeline and tokens per tile where a pass of `n_tokens` takes it:
    /// prefill (the tiled GEMM's threshold) outside batch-invariant serving (it sums in another
    /// order than the one-token shader), head dimension 64, 128 or 256 (S = 1, 2 or 4 threads
    /// a row) with a tile's 64 rows holding at least one token's heads, a device with its
    /// workgroup memory, and tokens in long runs of one sequence (`offsets`: each token's block
    /// table, equal within a sequence): at most one tile in two may straddle two sequences,
    /// whose rows the shader takes alone — a step of many sequences' decode tokens keeps the
    /// one-token shader, whose 64 threads share each row.
    fn attention_tiles(&self, n_tokens: usize, offsets: &[u32]) -> Option<(&wgpu::ComputePipeline, usize)> {
        let s = &self.shape;
        let per = 64 / (s.n_head / s.n_kv_head);
        if n_tokens < GEMM_MIN_TOKENS || self.batch_invariant || per == 0 {
            return None;
        }
        let seams = offsets.windows(2).filter(|w| w[0] != w[1]).count();
        self.gpu.layer.attention_tiles(&self.gpu.device, s.head_dim).filter(|_| 2 * seams * per <= n_tokens).map(|p| (p, per))
    }

    /// Whether a pass of `n_tokens` of one sequence runs its attention in tiles of tokens
    /// (prefill; see `shaders/attention_tiles.wgsl`).
    pub fn tiles_attention(&self, n_tokens: usize) -> bool {
        self.attention_tiles(n_tokens, &[]).is_some()
    }

    /// Time every dispatch of the following passes on the device's clock (`PassTimes::device`),
    /// or stop. False where the device cannot (no timestamps inside compute passes).
    pub fn set_timing(&self, on: bool) -> bool {
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        // Room for the most dispatches a layer records (Gemma 3's prefill: 18).
        *clock = if on { Timestamps::new(&self.gpu, self.layers.len() * 20) } else { None };
        clock.is_some()
    }

    /// Run every layer over `x` (`[n_tokens, n_embd]`, replaced by the last layer's output):
    /// token `t` at position `pos[t]` writes cache row `slots[t]` and attends over the rows
    /// its block table gives; `tables` holds `n_tokens` offsets (each token's table in the
    /// rest of the array), then the tables. One submission, one read-back.
    pub fn forward(&self, x: &mut [f32], pos: &[i32], slots: &[u32], tables: &[u32]) -> Result<(), AccelError> {
        let s = &self.shape;
        let n = pos.len();
        let (e, kvd, ff) = (s.n_embd, s.n_kv_head * s.head_dim, s.n_ff);
        assert!(n > 0 && n <= self.max_tokens && x.len() == n * e && slots.len() == n, "{n} tokens of {e} (at most {})", self.max_tokens);
        assert!(tables.len() <= n + self.max_table, "block tables of {} entries (at most {})", tables.len() - n, self.max_table);
        let _pass = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let start = std::time::Instant::now();
        let (gpu, q, p) = (&*self.gpu, &self.gpu.queue, &self.params);
        q.write_buffer(&self.x, 0, bytemuck::cast_slice(x));
        q.write_buffer(&self.pos, 0, bytemuck::cast_slice(pos));
        q.write_buffer(&self.slots, 0, bytemuck::cast_slice(slots));
        q.write_buffer(&self.tables, 0, bytemuck::cast_slice(tables));
        let u = |v: usize| v as u32;
        p.add_e.set(gpu, [u(n * e), u(n * e), 0, 0, 0, 0, 0, 0]);
        // Q's heads and K's in each token's row `[q | k | v]`.
        let (qd, row) = (s.n_head * s.head_dim, (s.n_head + 2 * s.n_kv_head) * s.head_dim);
        p.norm_q.set(gpu, [u(s.head_dim), s.eps.to_bits(), u(n * s.n_head), u(s.n_head), u(row), 0, 0, 0]);
        p.norm_k.set(gpu, [u(s.head_dim), s.eps.to_bits(), u(n * s.n_kv_head), u(s.n_kv_head), u(row), u(qd), 0, 0]);
        for l in &self.layers {
            let c = &l.cfg;
            l.rope.set(gpu, [u(n), u(s.n_head), u(s.n_kv_head), u(s.head_dim), u(s.n_rot), c.rope_base.to_bits(), c.freq_scale.to_bits(), u(c.neox as usize)]);
            l.attn.set(gpu, [u(n), u(s.n_head), u(s.n_kv_head), u(s.head_dim), c.scale.to_bits(), c.window.unwrap_or(0), 0, 0]);
            // Every neuron fires; with one product for gate and up, its rows `[gate | up]`.
            let width = if l.gate_up.len() == 1 { ff } else { 0 };
            l.act.set(gpu, [u(n * ff), u(c.gelu as usize), (-1f32).to_bits(), u(width), 0, 0, 0, 0]);
        }
        let pl = &gpu.layer;
        let tiles = self.attention_tiles(n, &tables[..n]);
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let dispatches = {
            let pass = &mut enc.begin_compute_pass(&Default::default());
            if let Some(c) = clock.as_mut() {
                c.start(pass);
            }
            let mut r = Recorder { pass, dispatches: 0, clock: clock.as_mut() };
            // The products record themselves (their shapes go through the queue).
            let product = |r: &mut Recorder, kind: Kind, m: &Matrix, bind: &wgpu::BindGroup, how: (Addend, Place, Input)| {
                m.dispatch_adding(gpu, r.pass, bind, n, self.batch_invariant, how);
                r.done(kind);
            };
            let alone = |m: &Matrix| Place::alone(m.rows);
            // Through the GEMV the products norm their input themselves: the norms' dispatches
            // saved (the tiled GEMM's workgroups would each norm 64 tokens).
            let fuse_norms = self.batch_invariant || n < GEMM_MIN_TOKENS;
            let normed = if fuse_norms { Input::Normed(s.eps) } else { Input::Rows };
            // A product whose residual has no dispatch of its own adds itself onto `x`.
            let onto_x = |residual: &Option<wgpu::BindGroup>| if residual.is_none() { Addend::Output } else { Addend::None };
            for l in &self.layers {
                let b = &l.bind;
                // x [n, e] → xn = norm(x) → q, k, v (+ biases), RoPE → cache → attention [n, qd]
                if !fuse_norms {
                    r.run(Kind::Norm, &pl.rms_norm, &b.norm1, (u(n), 1));
                }
                let bias = if l.has_bias { Addend::Bias } else { Addend::None };
                for ((m, c0), bind) in l.qkv.iter().zip(if fuse_norms { &b.qkv_normed } else { &b.qkv }) {
                    product(&mut r, Kind::Qkv, m, bind, (bias, Place { stride: row, offset: *c0 }, normed));
                }
                for (norm, heads) in [(&b.q_norm, s.n_head), (&b.k_norm, s.n_kv_head)] {
                    if let Some(norm) = norm {
                        r.run(Kind::HeadNorm, &pl.head_norm, norm, grid(n * heads, 1));
                    }
                }
                r.run(Kind::RopeStore, &pl.rope_store, &b.rope_store, grid(n * (s.n_head * s.n_rot / 2 + kvd), 64));
                match tiles {
                    Some((pipe, per)) => r.run(Kind::Attention, pipe, &b.attn, (u(s.n_kv_head), u(n.div_ceil(per)))),
                    None => r.run(Kind::Attention, &pl.attention, &b.attn, (u(s.n_head), u(n))),
                }
                // x += Wo · attention; xn = norm(x); x += down(silu(gate xn) · up xn)
                product(&mut r, Kind::Wo, &l.mats[0], &b.o, (onto_x(&b.residual1), alone(&l.mats[0]), Input::Rows));
                if let Some(post) = &b.post_attn {
                    r.run(Kind::Norm, &pl.rms_norm, post, (u(n), 1));
                }
                if let Some(residual) = &b.residual1 {
                    r.run(Kind::Add, &pl.add, residual, grid(n * e, 256));
                }
                if !fuse_norms {
                    r.run(Kind::Norm, &pl.rms_norm, &b.norm2, (u(n), 1));
                }
                for (m, bind) in l.gate_up.iter().zip(if fuse_norms { &b.gate_up_normed } else { &b.gate_up }) {
                    product(&mut r, Kind::GateUp, m, bind, (Addend::None, alone(m), normed));
                }
                r.run(Kind::Act, &gpu.act, &b.act, grid(n * ff, 64));
                product(&mut r, Kind::Down, &l.mats[1], &b.down, (onto_x(&b.residual2), alone(&l.mats[1]), Input::Rows));
                if let Some(post) = &b.post_ffn {
                    r.run(Kind::Norm, &pl.rms_norm, post, (u(n), 1));
                }
                if let Some(residual) = &b.residual2 {
                    r.run(Kind::Add, &pl.add, residual, grid(n * e, 256));
                }
            }
            r.dispatches
        };
        if let Some(c) = clock.as_ref() {
            c.resolve(&mut enc);
        }
        enc.copy_buffer_to_buffer(&self.x, 0, &self.staging, 0, (n * e * 4) as u64);
        gpu.queue.submit([enc.finish()]);
        let submitted = std::time::Instant::now();
        let r = gpu.read_back(&self.staging, x);
        let mut t = self.times.lock().unwrap_or_else(|e| e.into_inner());
        t.passes += 1;
        t.dispatches += dispatches;
        t.record_secs += (submitted - start).as_secs_f64();
        t.wait_secs += submitted.elapsed().as_secs_f64();
        match clock.as_ref() {
            Some(c) if r.is_ok() => c.read(gpu, &mut t.device),
            _ => r,
        }
    }
}

/// `mats` (of the same columns, read from one input) uploaded as runs of neighbours of one
/// type, each run one matrix of its members' rows in order (one product where there were
/// several) as long as it fits one buffer; with each run the column where its outputs start
/// in the members' outputs side by side. `names` name the members.
fn runs<const N: usize>(gpu: &Gpu, mats: [&FileMatrix; N], layer: &str, names: [&str; N]) -> Result<Vec<(Matrix, usize)>, AccelError> {
    let bytes = |m: &FileMatrix| m.rows * m.row_bytes();
    let mut out = Vec::new();
    let (mut i, mut c0) = (0, 0);
    while i < N {
        // Members i .. j of one type whose bytes (and the shaders' padding) fit one buffer.
        let mut j = i + 1;
        while j < N && mats[j].dtype == mats[i].dtype && (mats[i..=j].iter().map(|m| bytes(m)).sum::<usize>() + 8) as u64 <= gpu.max_buffer {
            j += 1;
        }
        let rows = mats[i..j].iter().map(|m| m.rows).sum();
        let data: Vec<u8> = mats[i..j].iter().flat_map(|m| &m.bytes[..bytes(m)]).copied().collect();
        let name = format!("{layer}.{}", names[i..j].join("+"));
        out.push((Matrix::upload(gpu, &name, mats[i].dtype, rows, mats[i].cols, &data)?, c0));
        c0 += rows;
        i = j;
    }
    Ok(out)
}
