//! A weight matrix on the accelerator and its products: the GEMV for small batches, the tiled
//! GEMM for prefill's.

use crate::device::{grid, AccelError, Gpu, Shape, TYPES};
use corelm_kernels::DType;

/// Whether the accelerator has a GEMV for `t`.
pub fn supported(t: DType) -> bool {
    TYPES.contains(&t)
}

/// The bound the tests hold the accelerator's GEMV to, for one output `y = Σ w_i x_i` of
/// `n` terms: `|y_gpu - y| ≤ (n + 8) · 2⁻²⁴ · Σ |w_i x_i|`, where `w_i` are the file's
/// dequantized values and `y` is computed exactly — the worst-case rounding of an f32 sum of
/// `n` terms, whatever its order (plus the products' own roundings).
pub fn gemv_bound(n: usize, sum_abs: f64) -> f64 {
    (n as f64 + 8.0) * f64::from(f32::EPSILON) / 2.0 * sum_abs
}

/// A `rows × cols` matrix in the file's block layout, resident on the device.
pub struct Matrix {
    pub(crate) buf: wgpu::Buffer,
    /// The products' shape (`shaders/products.wgsl`'s `Params`, 12 words), set by each dispatch.
    params: Shape,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
}

/// What a product adds to its sums (`shaders/products.wgsl`'s `addend`), in the order of the
/// add dispatch it replaces (`shaders/add.wgsl`): the same values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Addend {
    None = 0,
    /// The output's own values (`y + Σ`): a residual.
    Output = 1,
    /// The bias bound by [`Matrix::bind_with`], per row (`Σ + b`).
    Bias = 2,
}

/// Where a product writes token t's output row r: `y[t · stride + offset + r]`
/// (`shaders/products.wgsl`'s `y_stride`, `y_offset`). A product of its own writes `[tokens,
/// rows]`; products that share an output buffer write their columns of each token's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub stride: usize,
    pub offset: usize,
}

impl Place {
    /// `[tokens, rows]`: the product's rows alone.
    pub fn alone(rows: usize) -> Place {
        Place { stride: rows, offset: 0 }
    }
}

/// What a product reads as its activations (`shaders/products.wgsl`'s `x_norm`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Input {
    /// `x`, `[tokens, cols]`.
    Rows,
    /// `x` RMS-normed with this epsilon and the weights bound by [`Matrix::bind_with`], as
    /// `shaders/rms_norm.wgsl` computes it (the GEMV only: each workgroup computes its tokens'
    /// scales).
    Normed(f32),
}

/// Output rows per workgroup, and tokens per workgroup (`shaders/common.wgsl`).
const ROWS_PER_GROUP: usize = 8;
const TOKENS_PER_GROUP: usize = 8;

/// Batches of this many tokens or more run the tiled GEMM (`shaders/gemm.wgsl`: a workgroup
/// per 64 rows × 64 tokens, each block decoded once per 64 tokens), smaller ones the GEMV.
/// Chosen, not measured on a GPU: at 32 tokens the GEMV decodes each block four times.
pub const GEMM_MIN_TOKENS: usize = 32;
const GEMM_TILE: usize = 64;

impl Matrix {
    /// Upload `bytes` (`rows` rows of `cols` values of `dtype`, the file's layout).
    pub fn upload(gpu: &Gpu, name: &str, dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Matrix, AccelError> {
        if !supported(dtype) {
            return Err(AccelError::Type(dtype));
        }
        let row_bytes = corelm_kernels::row_bytes(dtype, cols);
        assert_eq!(bytes.len(), rows * row_bytes, "{name}: {rows} rows of {cols} {dtype} values");
        assert!(cols.is_multiple_of(32), "{name}: rows of whole 32-value groups");
        let buf = gpu.storage(name, bytes.len() as u64 + 4, wgpu::BufferUsages::COPY_DST)?;
        // The shaders' unaligned reads may touch the word after the last byte: pad to 4 + 4.
        let mut padded = bytes.to_vec();
        padded.resize((bytes.len() + 4).next_multiple_of(4), 0);
        gpu.queue.write_buffer(&buf, 0, &padded);
        let params = Shape::words(gpu, 12);
        // Its type's shaders compiled now, at load, not at its first product.
        gpu.products(dtype);
        Ok(Matrix { buf, params, dtype, rows, cols })
    }

    /// Bytes per row in the file's block layout.
    pub fn row_bytes(&self) -> usize {
        corelm_kernels::row_bytes(self.dtype, self.cols)
    }

    /// Bytes the matrix holds on the device.
    pub fn bytes(&self) -> u64 {
        self.buf.size()
    }

    /// The bind group of `y = W x` over device buffers `x` (`[n_tokens, cols]`) and `y`
    /// (`[n_tokens, rows]`).
    pub(crate) fn bind(&self, gpu: &Gpu, x: &wgpu::Buffer, y: &wgpu::Buffer) -> wgpu::BindGroup {
        self.bind_with(gpu, x, y, None, None)
    }

    /// [`Self::bind`] with a bias of `rows` values, which [`Addend::Bias`] adds, and a norm's
    /// `cols` weights, which [`Input::Normed`] reads.
    pub(crate) fn bind_with(&self, gpu: &Gpu, x: &wgpu::Buffer, y: &wgpu::Buffer, bias: Option<&wgpu::Buffer>, norm: Option<&wgpu::Buffer>) -> wgpu::BindGroup {
        // What is not given, the weights stand in for: bound, never read.
        let (bias, norm) = (bias.unwrap_or(&self.buf), norm.unwrap_or(&self.buf));
        gpu.bind("product", &gpu.products(self.dtype).gemv, [&self.buf, x, y, &self.params.buf, bias, norm])
    }

    /// Record `y = W x` for `n_tokens` tokens into `pass`.
    pub(crate) fn dispatch(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass, bind: &wgpu::BindGroup, n_tokens: usize) {
        self.dispatch_rows(gpu, pass, bind, self.rows, n_tokens)
    }

    /// Record `y = W x` through the GEMV whatever the batch: each token's outputs summed as if
    /// it were alone (batch-invariant results).
    pub(crate) fn dispatch_gemv(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass, bind: &wgpu::BindGroup, n_tokens: usize) {
        self.record(gpu, pass, bind, self.rows, n_tokens, false, (Addend::None, Place::alone(self.rows), Input::Rows))
    }

    /// Record `y = W x` over the first `rows` rows for `n_tokens` (`y`: `[n_tokens, rows]`).
    /// The shape goes to the matrix's parameters through the queue, ahead of the submission
    /// that runs the pass: one product of a matrix per submission.
    /// Batches of [`GEMM_MIN_TOKENS`] or more take the tiled GEMM, smaller ones the GEMV.
    pub(crate) fn dispatch_rows(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass, bind: &wgpu::BindGroup, rows: usize, n_tokens: usize) {
        self.record(gpu, pass, bind, rows, n_tokens, n_tokens >= GEMM_MIN_TOKENS, (Addend::None, Place::alone(rows), Input::Rows))
    }

    /// Record `y = W x` plus `addend` for `n_tokens` tokens at `place` in `y`, reading `input`,
    /// through the GEMV with `gemv` whatever the batch (else as [`Self::dispatch`]): one
    /// dispatch where a residual or bias add, or a norm, took a second.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dispatch_adding(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass, bind: &wgpu::BindGroup, n_tokens: usize, gemv: bool, how: (Addend, Place, Input)) {
        self.record(gpu, pass, bind, self.rows, n_tokens, !gemv && n_tokens >= GEMM_MIN_TOKENS, how)
    }

    #[allow(clippy::too_many_arguments)]
    fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass, bind: &wgpu::BindGroup, rows: usize, n_tokens: usize, tiled: bool, (addend, place, input): (Addend, Place, Input)) {
        assert!(place.offset + rows <= place.stride, "rows {rows} at {} of a stride of {}", place.offset, place.stride);
        assert!(!(tiled && matches!(input, Input::Normed(_))), "the tiled GEMM reads no normed input");
        let (pipeline, rows_per, tokens_per) = if tiled {
            (&gpu.products(self.dtype).gemm, GEMM_TILE, GEMM_TILE)
        } else if n_tokens == 1 {
            (&gpu.products(self.dtype).gemv1, ROWS_PER_GROUP, 1)
        } else {
            (&gpu.products(self.dtype).gemv, ROWS_PER_GROUP, TOKENS_PER_GROUP)
        };
        let (gx, gy) = grid(rows, rows_per);
        let u = |v: usize| v as u32;
        let (x_norm, eps) = match input {
            Input::Rows => (0, 0.0),
            Input::Normed(eps) => (1, eps),
        };
        self.params.set(gpu, [u(rows), u(self.cols), u(self.row_bytes()), gx, u(n_tokens), addend as u32, u(place.stride), u(place.offset), x_norm, f32::to_bits(eps), 0, 0]);
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, bind, &[]);
        pass.dispatch_workgroups(gx, gy, n_tokens.div_ceil(tokens_per) as u32);
    }

    /// `y = W x` for `x` of `n_tokens · cols` values, into `y` (`n_tokens · rows`): one
    /// submission and a wait (tests, benchmarks; the engine's path is [`crate::HotFfn`]).
    pub fn gemv(&self, gpu: &Gpu, x: &[f32], y: &mut [f32]) -> Result<(), AccelError> {
        self.product(gpu, x, y, None, (Addend::None, Place::alone(self.rows), Input::Rows))
    }

    /// `y += W x` as the device layers add a residual where it is made (`y` uploaded, each
    /// output `y + Σ`): as [`Self::gemv`] otherwise.
    pub fn gemv_onto(&self, gpu: &Gpu, x: &[f32], y: &mut [f32]) -> Result<(), AccelError> {
        self.product(gpu, x, y, None, (Addend::Output, Place::alone(self.rows), Input::Rows))
    }

    /// `y = W x + b` as the device layers add Q's, K's and V's biases (`bias`: one per row,
    /// each output `Σ + b`): as [`Self::gemv`] otherwise.
    pub fn gemv_bias(&self, gpu: &Gpu, x: &[f32], bias: &[f32], y: &mut [f32]) -> Result<(), AccelError> {
        assert_eq!(bias.len(), self.rows, "a bias per row");
        self.product(gpu, x, y, Some(bias), (Addend::Bias, Place::alone(self.rows), Input::Rows))
    }

    /// `y = W x` into columns `offset ..` of rows of `stride` values (`y`: `[tokens, stride]`,
    /// uploaded first, so its other columns stay) as the device layers write Q, K and V into
    /// one buffer: as [`Self::gemv`] otherwise.
    pub fn gemv_at(&self, gpu: &Gpu, x: &[f32], y: &mut [f32], stride: usize, offset: usize) -> Result<(), AccelError> {
        self.product(gpu, x, y, None, (Addend::None, Place { stride, offset }, Input::Rows))
    }

    /// `y = W rms_norm(x)` with the norm's `weights` and `eps` (`x`: `[tokens, cols]`) as the
    /// device layers' Q, K, V and gate and up products read the residual stream at decode,
    /// through the GEMV whatever the batch.
    pub fn gemv_normed(&self, gpu: &Gpu, x: &[f32], weights: &[f32], eps: f32, y: &mut [f32]) -> Result<(), AccelError> {
        assert_eq!(weights.len(), self.cols, "a norm weight per column");
        self.product(gpu, x, y, Some(weights), (Addend::None, Place::alone(self.rows), Input::Normed(eps)))
    }

    /// `y = W x` plus `addend` (`y`'s own values, uploaded first, or the bias `extra`), at `place`
    /// in `y` (uploaded first unless the product's alone), reading `input` (normed with the
    /// weights `extra`).
    fn product(&self, gpu: &Gpu, x: &[f32], y: &mut [f32], extra: Option<&[f32]>, (addend, place, input): (Addend, Place, Input)) -> Result<(), AccelError> {
        let normed = matches!(input, Input::Normed(_));
        assert_eq!(addend == Addend::Bias || normed, extra.is_some(), "a bias where it is added, weights where x is normed");
        let n_tokens = x.len() / self.cols;
        assert_eq!(x.len(), n_tokens * self.cols, "x holds whole rows");
        assert_eq!(y.len(), n_tokens * place.stride, "y holds a row per token");
        let xb = gpu.storage("x", (x.len() * 4) as u64, wgpu::BufferUsages::COPY_DST)?;
        gpu.queue.write_buffer(&xb, 0, bytemuck::cast_slice(x));
        let yn = (y.len() * 4) as u64;
        let yb = gpu.storage("y", yn, wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST)?;
        if addend == Addend::Output || place != Place::alone(self.rows) {
            gpu.queue.write_buffer(&yb, 0, bytemuck::cast_slice(y));
        }
        let extra = match extra {
            Some(b) => {
                let bb = gpu.storage("bias or norm", (b.len() * 4) as u64, wgpu::BufferUsages::COPY_DST)?;
                gpu.queue.write_buffer(&bb, 0, bytemuck::cast_slice(b));
                Some(bb)
            }
            None => None,
        };
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("staging"),
            size: yb.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let (bias, norm) = if normed { (None, extra.as_ref()) } else { (extra.as_ref(), None) };
        let bind = self.bind_with(gpu, &xb, &yb, bias, norm);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            self.dispatch_adding(gpu, &mut pass, &bind, n_tokens, false, (addend, place, input));
        }
        enc.copy_buffer_to_buffer(&yb, 0, &staging, 0, yb.size());
        gpu.queue.submit([enc.finish()]);
        gpu.read_back(&staging, y)
    }
}
