//! The hot neurons' feed-forward on the accelerator (KAIROX §4): per layer, a fixed number of
//! rows (its capacity), each holding one neuron: its gate and up rows copied from the file as
//! they are, and its column of the down projection as a Q8_0 row of `n_embd` values
//! (neuron-major, [`down_neuron_major`]). So a group of neurons is a contiguous range of rows
//! in all three matrices, and [`HotFfn::load`] replaces one with three buffer writes (online
//! balancing); rows never loaded are zeros and contribute nothing. `submit` uploads the FFN
//! input and records gate and up (GEMVs; a prompt's batch the tiled GEMM), the gated
//! activation (the kind and firing rule the graph's node gives: `|act(g)| > thr`, else 0, as
//! the CPU's sparse nodes) and the neuron-major down (skipping neurons that did not fire; a
//! prompt's batch `shaders/down_gemm.wgsl`, tiled, adding their zeros) in one command buffer;
//! `wait` reads the partial output back (an error if the device was lost). The engine adds it
//! to the CPU's part through `corelm_core::Offload` (its `offload::Static` or
//! `balance::Online`, which compute the device's part on the CPU once a read-back fails).

use crate::device::{AccelError, Gpu, Shape};
use crate::matrix::Matrix;
use corelm_core::Glu;
use corelm_kernels::DType;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A matrix of the model file: `rows` rows of `cols` values of `dtype`, as stored.
#[derive(Clone, Copy)]
pub struct FileMatrix<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: &'a [u8],
}

impl FileMatrix<'_> {
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        corelm_kernels::row_bytes(self.dtype, self.cols)
    }
}

/// What the accelerator computes of one layer.
pub struct HotLayer<'a> {
    pub layer: usize,
    /// Rows the layer holds on the device: the most neurons it can compute at once.
    pub capacity: usize,
    /// The neurons loaded at upload, row `i` holding `neurons[i]` (at most `capacity`).
    pub neurons: &'a [u32],
    /// `[n_ff rows, n_embd]` gate and up.
    pub gate: FileMatrix<'a>,
    pub up: FileMatrix<'a>,
    /// The down columns of `neurons` as [`down_neuron_major`] gives them.
    pub down: &'a [u8],
}

/// One layer's weights and bindings on the device.
struct Layer {
    gate: Matrix,
    up: Matrix,
    /// `[capacity rows, n_embd]` Q8_0, row `i` the down column of the neuron in row `i`.
    down: Matrix,
    bind: [wgpu::BindGroup; 6], // gate, up, act, down, down's slice sums, down tiled
    /// Neuron ranges the down product is split into (`shaders/down_nm.wgsl`).
    slices: usize,
}

/// Neurons per range of the down product: enough workgroups for a GPU at one token, each
/// thread adding about 64 neurons; at most [`MAX_SLICES`] ranges.
const NEURONS_PER_SLICE: usize = 512;
const MAX_SLICES: usize = 16;

/// Every offloaded layer, and the buffers they share (one layer runs at a time).
pub struct HotFfn {
    gpu: Arc<Gpu>,
    n_embd: usize,
    max_tokens: usize,
    layers: Vec<Option<Layer>>,
    x: wgpu::Buffer,
    y: wgpu::Buffer,
    staging: wgpu::Buffer,
    act_params: Shape,
    /// The down shaders' shape (`shaders/down_params.wgsl`).
    down_params: Shape,
    /// The layer and token count submitted by `begin`, not yet read back.
    pending: Mutex<Option<(usize, usize)>>,
    /// The next [`HotFfn::wait`] fails as a lost device's would ([`HotFfn::simulate_device_loss`]).
    fail_next: AtomicBool,
    /// A read-back failed.
    failed: AtomicBool,
    /// Products through the GEMV and the per-token down whatever the batch
    /// ([`HotFfn::set_batch_invariant`]).
    batch_invariant: AtomicBool,
}

/// `m`'s rows `neurons`, as stored, into `out` (cleared first).
pub fn gather_rows(m: &FileMatrix, neurons: &[u32], out: &mut Vec<u8>) {
    let rb = m.row_bytes();
    out.clear();
    neurons.iter().for_each(|&n| out.extend_from_slice(&m.bytes[n as usize * rb..][..rb]));
}

/// The down projection `m` (`[n_embd rows, n_ff]`) neuron-major: for each of `neurons`, its
/// column as a Q8_0 row of `m.rows` values (`[neurons.len() rows, n_embd]`), through the
/// CPU's dequantizer and ggml's reference quantizer (as the CPU's neuron-major copy).
pub fn down_neuron_major(m: &FileMatrix, neurons: &[u32]) -> Vec<u8> {
    let to_float = corelm_kernels::Kernels::portable().to_float(m.dtype).expect("a model weight type");
    let quant = corelm_kernels::quant::reference::quantizer(DType::Q8_0).expect("Q8_0 quantizer");
    let (rb, out_rb) = (corelm_kernels::row_bytes(m.dtype, m.cols), corelm_kernels::row_bytes(DType::Q8_0, m.rows));
    // Columns gathered as f32 first (`[neurons, n_embd]`), then each quantized as a row.
    let mut row = vec![0f32; m.cols];
    let mut cols = vec![0f32; neurons.len() * m.rows];
    for r in 0..m.rows {
        to_float(&m.bytes[r * rb..(r + 1) * rb], &mut row);
        for (i, &n) in neurons.iter().enumerate() {
            cols[i * m.rows + r] = row[n as usize];
        }
    }
    let mut out = vec![0u8; neurons.len() * out_rb];
    for (o, c) in out.chunks_exact_mut(out_rb).zip(cols.chunks_exact(m.rows)) {
        quant(c, o);
    }
    out
}

impl HotFfn {
    /// Upload `layers` (of a model of `n_layer` layers and width `n_embd`) for batches of up
    /// to `max_tokens` tokens.
    pub fn new(gpu: Arc<Gpu>, n_layer: usize, n_embd: usize, max_tokens: usize, layers: &[HotLayer]) -> Result<HotFfn, AccelError> {
        assert!(n_embd.is_multiple_of(32), "rows of whole 32-value groups");
        let max_hot = layers.iter().map(|l| l.capacity).max().unwrap_or(0);
        let f = |n: usize| (n * 4) as u64;
        let dst = wgpu::BufferUsages::COPY_DST;
        let x = gpu.storage("ffn x", f(max_tokens * n_embd), dst)?;
        let y = gpu.storage("ffn y", f(max_tokens * n_embd), wgpu::BufferUsages::COPY_SRC)?;
        let [g, u, a] = ["ffn gate", "ffn up", "ffn act"].map(|w| gpu.storage(w, f(max_tokens * max_hot), wgpu::BufferUsages::empty()));
        let (g, u, a) = (g?, u?, a?);
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ffn staging"),
            size: y.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let act_params = Shape::new(&gpu);
        let down_params = Shape::new(&gpu);
        let slices_of = |cap: usize| cap.div_ceil(NEURONS_PER_SLICE).clamp(1, MAX_SLICES);
        let max_slices = layers.iter().map(|l| slices_of(l.capacity)).max().unwrap_or(1);
        let sums = gpu.storage("ffn down slices", f(max_tokens * max_slices * n_embd), wgpu::BufferUsages::empty())?;
        let mut out: Vec<Option<Layer>> = (0..n_layer).map(|_| None).collect();
        for l in layers {
            let (cap, n) = (l.capacity, l.neurons.len());
            assert!(cap > 0 && n <= cap, "layer {}: {n} neurons loaded into {cap} rows", l.layer);
            let name = |w: &str| format!("blk.{}.{w} (hot)", l.layer);
            // Rows beyond the loaded neurons stay zero: no gate, no up, no output.
            let mut rows = Vec::new();
            let mut upload = |what: &str, dtype: DType, loaded: &[u8]| {
                rows.clear();
                rows.extend_from_slice(loaded);
                rows.resize(cap * corelm_kernels::row_bytes(dtype, n_embd), 0);
                Matrix::upload(&gpu, &name(what), dtype, cap, n_embd, &rows)
            };
            let mut loaded = Vec::new();
            gather_rows(&l.gate, l.neurons, &mut loaded);
            let gate = upload("gate", l.gate.dtype, &loaded)?;
            gather_rows(&l.up, l.neurons, &mut loaded);
            let up = upload("up", l.up.dtype, &loaded)?;
            let down = upload("down", DType::Q8_0, l.down)?;
            let act = gpu.bind("act", &gpu.act, [&g, &u, &a, &act_params.buf]);
            let bind_down = gpu.bind("down", &gpu.down, [&down.buf, &a, &sums, &down_params.buf]);
            let bind_sum = gpu.bind("down sums", &gpu.down_sum, [&sums, &y, &down_params.buf]);
            let bind_tiled = gpu.bind("down tiled", &gpu.down_gemm, [&down.buf, &a, &y, &down_params.buf]);
            let bind = [gate.bind(&gpu, &x, &g), up.bind(&gpu, &x, &u), act, bind_down, bind_sum, bind_tiled];
            out[l.layer] = Some(Layer { gate, up, down, bind, slices: slices_of(cap) });
        }
        Ok(HotFfn { gpu, n_embd, max_tokens, layers: out, x, y, staging, act_params, down_params, pending: Mutex::new(None), fail_next: AtomicBool::new(false), failed: AtomicBool::new(false), batch_invariant: AtomicBool::new(false) })
    }

    /// Bytes of weights held on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.layers.iter().flatten().map(|l| l.gate.bytes() + l.up.bytes() + l.down.bytes()).sum()
    }

    /// Neuron rows of each layer (0: not offloaded).
    pub fn hot_counts(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.as_ref().map_or(0, |l| l.gate.rows)).collect()
    }

    /// Replace rows `row0..` of `layer` with other neurons: their gate and up rows as the file
    /// stores them and their down columns as [`down_neuron_major`] gives them, the same
    /// number of rows each. The writes are queued ahead of the next submission (no wait
    /// here); a pass submitted before keeps the old rows. Returns the bytes written.
    /// Offsets and lengths must be multiples of 4 bytes (groups of a multiple of 4 rows are).
    pub fn load(&self, layer: usize, row0: usize, gate: &[u8], up: &[u8], down: &[u8]) -> u64 {
        let l = self.layers[layer].as_ref().unwrap_or_else(|| panic!("layer {layer} has no rows on the accelerator"));
        let n = down.len() / l.down.row_bytes();
        assert!(row0 + n <= l.gate.rows, "layer {layer}: rows {row0}..{} of {}", row0 + n, l.gate.rows);
        let q = &self.gpu.queue;
        for (m, bytes) in [(&l.gate, gate), (&l.up, up), (&l.down, down)] {
            let (buf, rb) = (&m.buf, m.row_bytes());
            assert_eq!(bytes.len(), n * rb, "layer {layer}: {n} rows of {rb} bytes");
            assert!((row0 * rb).is_multiple_of(4) && bytes.len() % 4 == 0, "layer {layer}: rows {row0}.. of {rb} bytes are not 4-byte aligned");
            q.write_buffer(buf, (row0 * rb) as u64, bytes);
        }
        (gate.len() + up.len() + down.len()) as u64
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Compute every token as if alone in its batch (what a server asks): gate and up through
    /// the GEMV and down per token at every batch size, not the tiled products from
    /// `GEMM_MIN_TOKENS`, whose sums run in another order.
    pub fn set_batch_invariant(&self) {
        self.batch_invariant.store(true, Ordering::Relaxed);
    }

    /// Submit layer `layer`'s hot part for `x` (`[n_tokens, n_embd]`), activation `kind`,
    /// neurons firing where `|act(gate)| > thr`.
    pub fn submit(&self, layer: usize, x: &[f32], kind: Glu, thr: f32) {
        let l = self.layers[layer].as_ref().unwrap_or_else(|| panic!("layer {layer} has no hot neurons on the accelerator"));
        let n_tokens = x.len() / self.n_embd;
        assert!(n_tokens <= self.max_tokens, "{n_tokens} tokens exceed the accelerator's batch of {}", self.max_tokens);
        let gpu = &self.gpu;
        gpu.queue.write_buffer(&self.x, 0, bytemuck::cast_slice(x));
        let n = (l.gate.rows * n_tokens) as u32;
        let kind = match kind {
            Glu::Silu => 0,
            Glu::GeluTanh => 1,
            // Only dense feed-forwards go to the device; gpt-oss's clamped SwiGLU is a
            // mixture of experts' (`ModelSetup` refuses `--accel` sparsity for it).
            Glu::SwigluOai => unreachable!("a feed-forward with gpt-oss's clamped SwiGLU offloaded"),
        };
        self.act_params.set(gpu, [n, kind, thr.to_bits(), 0, 0, 0, 0, 0]);
        let (rows, slices) = (l.down.rows as u32, l.slices as u32);
        self.down_params.set(gpu, [rows, self.n_embd as u32, l.down.row_bytes() as u32, slices, n_tokens as u32, 0, 0, 0]);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            let invariant = self.batch_invariant.load(Ordering::Relaxed);
            if invariant {
                l.gate.dispatch_gemv(gpu, &mut pass, &l.bind[0], n_tokens);
                l.up.dispatch_gemv(gpu, &mut pass, &l.bind[1], n_tokens);
            } else {
                l.gate.dispatch(gpu, &mut pass, &l.bind[0], n_tokens);
                l.up.dispatch(gpu, &mut pass, &l.bind[1], n_tokens);
            }
            pass.set_pipeline(&gpu.act);
            pass.set_bind_group(0, &l.bind[2], &[]);
            let (gx, gy) = crate::device::grid(n as usize, 64);
            pass.dispatch_workgroups(gx, gy, 1);
            if n_tokens >= crate::matrix::GEMM_MIN_TOKENS && !invariant {
                // A prompt's batch: the tiled product, each block read once per 64 tokens.
                pass.set_pipeline(&gpu.down_gemm);
                pass.set_bind_group(0, &l.bind[5], &[]);
                pass.dispatch_workgroups(self.n_embd.div_ceil(64) as u32, n_tokens.div_ceil(64) as u32, 1);
            } else {
                pass.set_pipeline(&gpu.down);
                pass.set_bind_group(0, &l.bind[3], &[]);
                pass.dispatch_workgroups(self.n_embd.div_ceil(32) as u32, slices, n_tokens as u32);
                pass.set_pipeline(&gpu.down_sum);
                pass.set_bind_group(0, &l.bind[4], &[]);
                pass.dispatch_workgroups(self.n_embd.div_ceil(64) as u32, n_tokens as u32, 1);
            }
        }
        enc.copy_buffer_to_buffer(&self.y, 0, &self.staging, 0, (n_tokens * self.n_embd * 4) as u64);
        gpu.queue.submit([enc.finish()]);
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some((layer, n_tokens));
    }

    /// Wait for layer `layer`'s submitted part and write it to `y` (`[n_tokens, n_embd]`).
    pub fn wait(&self, layer: usize, y: &mut [f32]) -> Result<(), AccelError> {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        assert_eq!(pending, Some((layer, y.len() / self.n_embd)), "finish matches the last begin");
        let mut r = self.gpu.read_back(&self.staging, y);
        if r.is_ok() && self.fail_next.swap(false, Ordering::Relaxed) {
            // What was read back is gone, as after a real loss.
            y.fill(f32::NAN);
            r = Err(AccelError::Readback("device loss simulated (HotFfn::simulate_device_loss)".into()));
        }
        if r.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        r
    }

    /// Whether a read-back has failed (the callers compute the device's part on the CPU since).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Make the next [`HotFfn::wait`] fail as a lost device's would (the device's work is
    /// still waited for, then dropped): for tests and drills of the callers' fallbacks.
    pub fn simulate_device_loss(&self) {
        self.fail_next.store(true, Ordering::Relaxed);
    }
}
