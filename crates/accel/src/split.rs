//! The accelerator's share of split matmuls (SMEPilot's accelerator target).
//!
//! A matmul the roofline plan splits between the CPU and the accelerator is cut along its
//! weight rows, so the device needs only its own rows: it holds rows `0..cut` of the matrix
//! (the file's bytes, uploaded once at load) and computes output columns `0..cut` of every
//! token while the CPU computes the others. [`SplitMatrices::begin`] writes the activations and
//! submits; [`SplitMatrices::wait`] reads the product back.
//!
//! One product is in flight at a time (the scheduler runs one node at once), so the x, y and
//! staging buffers are shared by every matrix and allocated here, sized for the largest batch
//! and the widest cut: this code allocates nothing per token.

use crate::device::{AccelError, Gpu};
use crate::ffn::FileMatrix;
use crate::matrix::Matrix;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The first rows of some weight matrices on the device, and the buffers their products use.
pub struct SplitMatrices {
    gpu: Arc<Gpu>,
    mats: Vec<(Matrix, wgpu::BindGroup)>,
    x: wgpu::Buffer,
    y: wgpu::Buffer,
    staging: wgpu::Buffer,
    max_tokens: usize,
    /// (matrix, tokens) submitted and not yet read back.
    pending: Mutex<Option<(usize, usize)>>,
    fail_next: AtomicBool,
}

impl SplitMatrices {
    /// Upload `mats` (each the rows the device computes: `rows` of them, the file's layout)
    /// with buffers for batches of up to `max_tokens` tokens.
    pub fn new(gpu: Arc<Gpu>, mats: &[FileMatrix], max_tokens: usize) -> Result<SplitMatrices, AccelError> {
        let f = |n: usize| (n * 4) as u64;
        let max_cols = mats.iter().map(|m| m.cols).max().unwrap_or(0);
        let max_rows = mats.iter().map(|m| m.rows).max().unwrap_or(0);
        let x = gpu.storage("split x", f(max_tokens * max_cols), wgpu::BufferUsages::COPY_DST)?;
        let y = gpu.storage("split y", f(max_tokens * max_rows), wgpu::BufferUsages::COPY_SRC)?;
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("split staging"),
            size: y.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut out = Vec::with_capacity(mats.len());
        for (i, m) in mats.iter().enumerate() {
            let bytes = &m.bytes[..m.rows * m.row_bytes()];
            let mat = Matrix::upload(&gpu, &format!("split matrix {i}"), m.dtype, m.rows, m.cols, bytes)?;
            let bind = mat.bind(&gpu, &x, &y);
            out.push((mat, bind));
        }
        Ok(SplitMatrices { gpu, mats: out, x, y, staging, max_tokens, pending: Mutex::new(None), fail_next: AtomicBool::new(false) })
    }

    /// Matrices held.
    pub fn len(&self) -> usize {
        self.mats.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mats.is_empty()
    }

    /// Rows (output columns) matrix `i` computes.
    pub fn rows(&self, i: usize) -> usize {
        self.mats[i].0.rows
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.mats.iter().map(|(m, _)| m.bytes()).sum()
    }

    /// The device this runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Start `y = x · Wᵀ` over the first `rows` rows of matrix `i` (at most [`Self::rows`]) for
    /// `x` of whole rows (`[n_tokens, cols]`); returns at once. Each `begin` is followed by its
    /// [`Self::wait`] before the next.
    pub fn begin(&self, i: usize, x: &[f32], rows: usize) {
        let (m, bind) = &self.mats[i];
        let n_tokens = x.len() / m.cols;
        assert!(x.len() == n_tokens * m.cols && n_tokens <= self.max_tokens, "{} values for a batch of at most {} rows of {}", x.len(), self.max_tokens, m.cols);
        assert!(rows > 0 && rows <= m.rows, "rows 0..{rows} of a device matrix of {}", m.rows);
        let gpu = &self.gpu;
        gpu.queue.write_buffer(&self.x, 0, bytemuck::cast_slice(x));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            m.dispatch_rows(gpu, &mut pass, bind, rows, n_tokens);
        }
        enc.copy_buffer_to_buffer(&self.y, 0, &self.staging, 0, (n_tokens * rows * 4) as u64);
        gpu.queue.submit([enc.finish()]);
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        assert!(p.is_none(), "a split product is already in flight");
        *p = Some((i, n_tokens * rows));
    }

    /// Wait for matrix `i`'s product and write it to `y` (`[n_tokens, rows]` of the `begin`).
    /// An error (a lost device) leaves `y` unspecified; the caller computes it elsewhere.
    pub fn wait(&self, i: usize, y: &mut [f32]) -> Result<(), AccelError> {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        assert_eq!(pending, Some((i, y.len())), "wait matches the last begin");
        let r = self.gpu.read_back(&self.staging, y);
        if r.is_ok() && self.fail_next.swap(false, Ordering::Relaxed) {
            y.fill(f32::NAN);
            return Err(AccelError::Readback("device loss simulated (SplitMatrices::simulate_device_loss)".into()));
        }
        r
    }

    /// Make the next [`Self::wait`] fail as a lost device would (tests of the fallback).
    pub fn simulate_device_loss(&self) {
        self.fail_next.store(true, Ordering::Relaxed);
    }
}
