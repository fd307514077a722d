//! The hot neurons' feed-forward on the accelerator (KAIROX §4): per layer, the gate and up
//! rows of the neurons chosen as hot, copied from the file as they are, and the down
//! projection's columns of those neurons requantized to Q8_0 rows (`[n_embd, n_hot]`), so all
//! three products are the same GEMV. `begin` uploads the FFN input and submits gate, up, the
//! gated activation (the kind and firing rule the graph's node gives: `|act(g)| > thr`, else
//! 0, as the CPU's sparse nodes) and down in one command
//! buffer; `finish` waits and reads the partial output back. The engine adds it to the CPU's
//! part (`corelm_core::Offload`).

use crate::device::{AccelError, Gpu};
use crate::matrix::Matrix;
use corelm_core::Glu;
use corelm_kernels::DType;
use std::sync::{Arc, Mutex};

/// A matrix of the model file: `rows` rows of `cols` values of `dtype`, as stored.
#[derive(Clone, Copy)]
pub struct FileMatrix<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub bytes: &'a [u8],
}

/// What the accelerator computes of one layer.
pub struct HotLayer<'a> {
    pub layer: usize,
    /// The hot neurons, sorted (a multiple of 32 of them).
    pub neurons: &'a [u32],
    /// `[n_ff rows, n_embd]` gate and up, `[n_embd rows, n_ff]` down.
    pub gate: FileMatrix<'a>,
    pub up: FileMatrix<'a>,
    pub down: FileMatrix<'a>,
}

/// One layer's weights and bindings on the device.
struct Layer {
    down: Matrix,
    bind: [wgpu::BindGroup; 4], // gate, up, act, down
    gate: Matrix,
    up: Matrix,
}

/// Every offloaded layer, and the buffers they share (one layer runs at a time).
pub struct HotFfn {
    gpu: Arc<Gpu>,
    n_embd: usize,
    max_tokens: usize,
    layers: Vec<Option<Layer>>,
    x: wgpu::Buffer,
    y: wgpu::Buffer,
    staging: wgpu::Buffer,
    act_params: wgpu::Buffer,
    /// The layer and token count submitted by `begin`, not yet read back.
    pending: Mutex<Option<(usize, usize)>>,
}

/// `m`'s rows `neurons`, as stored.
fn gather_rows(m: &FileMatrix, neurons: &[u32]) -> Vec<u8> {
    let rb = corelm_kernels::row_bytes(m.dtype, m.cols);
    neurons.iter().flat_map(|&n| &m.bytes[n as usize * rb..(n as usize + 1) * rb]).copied().collect()
}

/// `m`'s columns `neurons` as Q8_0 rows (`[m.rows, neurons.len()]`), through the CPU's
/// dequantizer and ggml's reference quantizer (as the CPU's neuron-major copy).
fn gather_cols_q8(m: &FileMatrix, neurons: &[u32]) -> Vec<u8> {
    let to_float = corelm_kernels::Kernels::portable().to_float(m.dtype).expect("a model weight type");
    let quant = corelm_kernels::quant::reference::quantizer(DType::Q8_0).expect("Q8_0 quantizer");
    let (rb, out_rb) = (corelm_kernels::row_bytes(m.dtype, m.cols), corelm_kernels::row_bytes(DType::Q8_0, neurons.len()));
    let (mut row, mut sel) = (vec![0f32; m.cols], vec![0f32; neurons.len()]);
    let mut out = vec![0u8; m.rows * out_rb];
    for (r, o) in out.chunks_exact_mut(out_rb).enumerate() {
        to_float(&m.bytes[r * rb..(r + 1) * rb], &mut row);
        sel.iter_mut().zip(neurons).for_each(|(s, &n)| *s = row[n as usize]);
        quant(&sel, o);
    }
    out
}

impl HotFfn {
    /// Upload `layers` (of a model of `n_layer` layers and width `n_embd`) for batches of up
    /// to `max_tokens` tokens.
    pub fn new(gpu: Arc<Gpu>, n_layer: usize, n_embd: usize, max_tokens: usize, layers: &[HotLayer]) -> Result<HotFfn, AccelError> {
        let max_hot = layers.iter().map(|l| l.neurons.len()).max().unwrap_or(0);
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
        let act_params = gpu.uniform(&[0, 0, 0, 0]);
        let mut out: Vec<Option<Layer>> = (0..n_layer).map(|_| None).collect();
        for l in layers {
            let n = l.neurons.len();
            assert!(n % 32 == 0 && n > 0, "layer {}: hot neurons in groups of 32", l.layer);
            assert!(l.neurons.windows(2).all(|w| w[0] < w[1]), "layer {}: hot neurons sorted", l.layer);
            let name = |w: &str| format!("blk.{}.{w} (hot)", l.layer);
            let gate = Matrix::upload(&gpu, &name("gate"), l.gate.dtype, n, n_embd, &gather_rows(&l.gate, l.neurons))?;
            let up = Matrix::upload(&gpu, &name("up"), l.up.dtype, n, n_embd, &gather_rows(&l.up, l.neurons))?;
            let down = Matrix::upload(&gpu, &name("down"), DType::Q8_0, n_embd, n, &gather_cols_q8(&l.down, l.neurons))?;
            let act = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("act"),
                layout: &gpu.act.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry { binding: 0, resource: g.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 1, resource: u.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 2, resource: a.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 3, resource: act_params.as_entire_binding() },
                ],
            });
            let bind = [gate.bind(&gpu, &x, &g), up.bind(&gpu, &x, &u), act, down.bind(&gpu, &a, &y)];
            out[l.layer] = Some(Layer { gate, up, down, bind });
        }
        Ok(HotFfn { gpu, n_embd, max_tokens, layers: out, x, y, staging, act_params, pending: Mutex::new(None) })
    }

    /// Bytes of weights held on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.layers.iter().flatten().map(|l| l.gate.bytes() + l.up.bytes() + l.down.bytes()).sum()
    }

    /// Hot neurons of each layer (0: not offloaded).
    pub fn hot_counts(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.as_ref().map_or(0, |l| l.gate.rows)).collect()
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
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
        };
        gpu.queue.write_buffer(&self.act_params, 0, bytemuck::cast_slice(&[n, kind, thr.to_bits(), 0]));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            l.gate.dispatch(gpu, &mut pass, &l.bind[0], n_tokens);
            l.up.dispatch(gpu, &mut pass, &l.bind[1], n_tokens);
            pass.set_pipeline(&gpu.act);
            pass.set_bind_group(0, &l.bind[2], &[]);
            pass.dispatch_workgroups(n.div_ceil(64), 1, 1);
            l.down.dispatch(gpu, &mut pass, &l.bind[3], n_tokens);
        }
        enc.copy_buffer_to_buffer(&self.y, 0, &self.staging, 0, (n_tokens * self.n_embd * 4) as u64);
        gpu.queue.submit([enc.finish()]);
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some((layer, n_tokens));
    }

    /// Wait for layer `layer`'s submitted part and write it to `y` (`[n_tokens, n_embd]`).
    pub fn wait(&self, layer: usize, y: &mut [f32]) -> Result<(), AccelError> {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        assert_eq!(pending, Some((layer, y.len() / self.n_embd)), "finish matches the last begin");
        self.gpu.read_back(&self.staging, y)
    }
}

impl corelm_core::Offload for HotFfn {
    fn begin(&self, layer: usize, x: &[f32], kind: Glu, thr: f32) {
        self.submit(layer, x, kind, thr);
    }

    fn finish(&self, layer: usize, y: &mut [f32]) {
        // A device lost mid-pass leaves no correct output to give: stop with the reason.
        if let Err(e) = self.wait(layer, y) {
            panic!("accelerator, layer {layer}: {e}");
        }
    }
}
