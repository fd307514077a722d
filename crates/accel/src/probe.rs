//! The accelerator measured as a roofline target (`corelm profile --accel`): the product
//! shaders' throughput per kernel family at a compute-bound batch (the tiled GEMM's), the
//! device's read bandwidth (one token over a matrix far larger than its caches), the host
//! link's bandwidth, and the round trip of the smallest product (submit, dispatch, read back)
//! — the fixed cost every product placed on the device pays, which the planner adds to its
//! time there.
//!
//! Every figure is the best of a few timed products. A product's time includes the upload of
//! its activations and the read back of its results, as the engine's products pay them.
//! Operands are zero bytes: the shaders' work does not depend on the values.

use crate::device::{AccelError, Gpu};
use crate::matrix::Matrix;
use corelm_kernels::DType;
use std::time::Instant;

/// What [`measure`] found.
#[derive(Clone, Debug)]
pub struct DeviceProfile {
    /// `NVIDIA H100 (Vulkan)`, `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`, …
    pub name: String,
    /// A CPU emulating a GPU (lavapipe): its compute shares the CPU's cores.
    pub software: bool,
    /// (family, kernel, GFLOP/s) — `int8_dot` (Q8_0), `f16_fma` (F16), `f32_fma` (F32).
    pub ceilings: Vec<(&'static str, String, f64)>,
    /// GB/s the device reads its own memory at (a one-token GEMV).
    pub read_gbps: f64,
    /// GB/s between host and device (upload and read back, their mean).
    pub link_gbps: f64,
    /// Microseconds of the smallest product's round trip.
    pub round_trip_us: f64,
}

/// Seconds of one `y = W x` of `tokens` tokens on `m` (submission, dispatch and read back).
fn time_gemv(gpu: &Gpu, m: &Matrix, x: &[f32], y: &mut [f32]) -> Result<f64, AccelError> {
    let t0 = Instant::now();
    m.gemv(gpu, x, y)?;
    Ok(t0.elapsed().as_secs_f64())
}

/// A zero `rows × cols` matrix of `t` on the device.
fn zeros(gpu: &Gpu, t: DType, rows: usize, cols: usize) -> Result<Matrix, AccelError> {
    Matrix::upload(gpu, "probe", t, rows, cols, &vec![0u8; rows * corelm_kernels::row_bytes(t, cols)])
}

/// GFLOP/s of `t`'s products at a batch large enough to be compute-bound — rows and tokens
/// doubled (from 256 × 1) until one product takes `secs / 4`, or 4096 rows × 256 tokens, so
/// from `GEMM_MIN_TOKENS` tokens the tiled GEMM — with the matrix and token count that gave it.
const MAX_TOKENS: usize = 256;

fn compute_bound(gpu: &Gpu, t: DType, secs: f64) -> Result<(f64, Matrix, usize), AccelError> {
    let cols = 4096;
    let (mut rows, mut tokens) = (256, 1);
    loop {
        let m = zeros(gpu, t, rows, cols)?;
        let x = vec![0f32; tokens * cols];
        let mut y = vec![0f32; tokens * rows];
        // The better of two: the first product of a pipeline also pays its warm-up (tens of
        // milliseconds on a GPU driver), which would stop the doubling at a tiny shape.
        let once = time_gemv(gpu, &m, &x, &mut y)?.min(time_gemv(gpu, &m, &x, &mut y)?);
        let last = tokens == MAX_TOKENS && rows == 4096;
        if once >= secs / 4.0 || last {
            let mut best = once;
            for _ in 0..3 {
                best = best.min(time_gemv(gpu, &m, &x, &mut y)?);
            }
            return Ok((2.0 * (rows * cols * tokens) as f64 / best / 1e9, m, tokens));
        }
        if tokens < MAX_TOKENS {
            tokens *= 2;
        } else {
            rows *= 2;
        }
    }
}

/// Products of `m` per second, repeated for `secs` (at least one): the device kept busy while
/// the CPU is measured beside it (`corelm_plan::profile::int8_beside`, `read_beside`).
fn keep_busy(gpu: &Gpu, m: &Matrix, tokens: usize, secs: f64) -> Result<f64, AccelError> {
    let (x, mut y) = (vec![0f32; tokens * m.cols], vec![0f32; tokens * m.rows]);
    let (t0, mut n) = (Instant::now(), 0usize);
    while t0.elapsed().as_secs_f64() < secs || n == 0 {
        m.gemv(gpu, &x, &mut y)?;
        n += 1;
    }
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// A zero Q8_0 matrix of rows of 8192 values, `cap` bytes at most (and the device's buffer
/// limit): the one-token products that measure the device's read bandwidth.
fn read_matrix(gpu: &Gpu, cap: u64) -> Result<Matrix, AccelError> {
    let cols = 8192;
    let rb = corelm_kernels::row_bytes(DType::Q8_0, cols) as u64;
    zeros(gpu, DType::Q8_0, (cap.min(gpu.max_buffer - 8) / rb) as usize, cols)
}

/// GFLOP/s of Q8_0 products at the compute-bound shape, kept up for `secs`.
pub fn int8_for(gpu: &Gpu, secs: f64) -> Result<f64, AccelError> {
    let (_, m, tokens) = compute_bound(gpu, DType::Q8_0, secs / 4.0)?;
    Ok(2.0 * (m.rows * m.cols * tokens) as f64 * keep_busy(gpu, &m, tokens, secs)? / 1e9)
}

/// GB/s of one-token Q8_0 products over a 32 MiB matrix, kept up for `secs`.
pub fn read_for(gpu: &Gpu, secs: f64) -> Result<f64, AccelError> {
    let m = read_matrix(gpu, 32 << 20)?;
    Ok((m.rows * m.row_bytes()) as f64 * keep_busy(gpu, &m, 1, secs)? / 1e9)
}

/// Measure `gpu` (each run about `secs`; a test passes a small one). A software device gets
/// smaller operands: its figures only have to order it against the CPU.
pub fn measure(gpu: &Gpu, secs: f64) -> Result<DeviceProfile, AccelError> {
    let mut ceilings = Vec::new();
    for (family, t) in [("int8_dot", DType::Q8_0), ("f16_fma", DType::F16), ("f32_fma", DType::F32)] {
        let (gflops, _, tokens) = compute_bound(gpu, t, secs)?;
        let kind = if tokens >= crate::matrix::GEMM_MIN_TOKENS { "gemm" } else { "gemv" };
        ceilings.push((family, format!("wgsl {} {kind}", t.name().to_lowercase()), gflops));
    }
    // Read bandwidth: one token over the largest Q8_0 matrix allowed (256 MiB on a GPU, 32 MiB
    // under software), best of 3 after a warm-up.
    let m = read_matrix(gpu, if gpu.is_software() { 32 << 20 } else { 256 << 20 })?;
    let (x, mut y) = (vec![0f32; m.cols], vec![0f32; m.rows]);
    let mut best = f64::MAX;
    for _ in 0..4 {
        best = best.min(time_gemv(gpu, &m, &x, &mut y)?);
    }
    let read_gbps = (m.rows * m.row_bytes()) as f64 / best / 1e9;
    drop(m);
    // The smallest product's round trip: 32 rows of 32 values.
    let tiny = zeros(gpu, DType::Q8_0, 32, 32)?;
    let (x, mut y) = (vec![0f32; 32], vec![0f32; 32]);
    let mut round = f64::MAX;
    for _ in 0..20 {
        round = round.min(time_gemv(gpu, &tiny, &x, &mut y)?);
    }
    // The link: a 16 MiB upload and read back, minus the round trip, best of 3.
    let n = 4 << 20;
    let big = vec![0f32; n];
    let buf = gpu.storage("probe link", (n * 4) as u64, wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC)?;
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("probe staging"),
        size: (n * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut back = vec![0f32; n];
    let mut link = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        gpu.queue.write_buffer(&buf, 0, bytemuck::cast_slice(&big));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&buf, 0, &staging, 0, (n * 4) as u64);
        gpu.queue.submit([enc.finish()]);
        gpu.read_back(&staging, &mut back)?;
        link = link.min((t0.elapsed().as_secs_f64() - round).max(1e-9));
    }
    Ok(DeviceProfile {
        name: gpu.name(),
        software: gpu.is_software(),
        ceilings,
        read_gbps,
        link_gbps: 2.0 * (n * 4) as f64 / link / 1e9,
        round_trip_us: round * 1e6,
    })
}
