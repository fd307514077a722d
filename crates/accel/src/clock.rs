//! The device's own clock between the dispatches of a pass of whole layers (`bench --profile`
//! with `--accel-layers`): where the device's time goes, shader kind by shader kind, which the
//! host cannot tell — a pass is one submission, and the host sees only when it ends.
//!
//! A timestamp is written before a pass's first dispatch and after each one, inside its compute
//! pass (wgpu's `TIMESTAMP_QUERY_INSIDE_PASSES`). The interval that ends at a dispatch's
//! timestamp is what that dispatch costs on the device's critical path: the barrier before it,
//! its launch and its work (the dispatches of a pass depend on each other, so they run one
//! after another). Off unless asked for: the query set and its two buffers exist only while
//! timing is on, and a device without timestamps inside passes cannot be timed (`None`).

use crate::device::{AccelError, Gpu};

/// The kinds of dispatch a pass of whole layers records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// RMS norm of a layer's input (prefill), or after attention / the feed-forward (Gemma 3).
    Norm,
    /// Q, K and V (one product, or one per weight type), their biases added.
    Qkv,
    /// Per-head Q and K norms (Qwen3, Gemma 3).
    HeadNorm,
    /// RoPE of Q and K, K and V stored into the cache.
    RopeStore,
    Attention,
    /// The attention's output projection, the residual added.
    Wo,
    /// A residual added by a dispatch of its own.
    Add,
    /// Gate and up (one product, or two).
    GateUp,
    /// The gated activation.
    Act,
    /// The down projection, the residual added.
    Down,
}

/// How many kinds there are ([`Kind::ALL`]'s length).
pub const KINDS: usize = 10;

impl Kind {
    pub const ALL: [Kind; KINDS] =
        [Kind::Norm, Kind::Qkv, Kind::HeadNorm, Kind::RopeStore, Kind::Attention, Kind::Wo, Kind::Add, Kind::GateUp, Kind::Act, Kind::Down];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Norm => "norm",
            Kind::Qkv => "q/k/v",
            Kind::HeadNorm => "head norms",
            Kind::RopeStore => "rope+store",
            Kind::Attention => "attention",
            Kind::Wo => "wo",
            Kind::Add => "add",
            Kind::GateUp => "gate/up",
            Kind::Act => "activation",
            Kind::Down => "down",
        }
    }
}

/// The device's time per kind of dispatch, summed over the timed passes.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceClock {
    /// Passes timed.
    pub passes: usize,
    /// Seconds per kind, indexed as [`Kind::ALL`] (`kind as usize`).
    pub secs: [f64; KINDS],
    /// Dispatches per kind, indexed as [`Kind::ALL`].
    pub dispatches: [usize; KINDS],
    /// From the first timestamp of each pass to its last (the sum of `secs`).
    pub span_secs: f64,
}

/// A query set with a timestamp before a pass's first dispatch and after each one, and the
/// buffers its values come back through.
pub(crate) struct Timestamps {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    staging: wgpu::Buffer,
    /// The kind of each dispatch timed in the pass being recorded (capacity fixed at creation).
    kinds: Vec<Kind>,
    capacity: usize,
    /// Nanoseconds a tick.
    period: f64,
}

impl Timestamps {
    /// Room for passes of up to `dispatches` dispatches; `None` where the device cannot write
    /// timestamps inside a compute pass.
    pub(crate) fn new(gpu: &Gpu, dispatches: usize) -> Option<Timestamps> {
        if !gpu.timestamps {
            return None;
        }
        let count = dispatches + 1;
        let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("dispatch clock"), ty: wgpu::QueryType::Timestamp, count: count as u32 });
        let buffer = |label: &str, usage: wgpu::BufferUsages| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size: (count * 8) as u64, usage, mapped_at_creation: false })
        };
        let resolve = buffer("dispatch clock (resolved)", wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
        let staging = buffer("dispatch clock (read back)", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
        let period = f64::from(gpu.queue.get_timestamp_period());
        Some(Timestamps { set, resolve, staging, kinds: Vec::with_capacity(dispatches), capacity: dispatches, period })
    }

    /// The timestamp before a pass's first dispatch.
    pub(crate) fn start(&mut self, pass: &mut wgpu::ComputePass) {
        self.kinds.clear();
        pass.write_timestamp(&self.set, 0);
    }

    /// The timestamp after a dispatch of `kind` (past the set's capacity, none).
    pub(crate) fn mark(&mut self, pass: &mut wgpu::ComputePass, kind: Kind) {
        if self.kinds.len() < self.capacity {
            self.kinds.push(kind);
            pass.write_timestamp(&self.set, self.kinds.len() as u32);
        }
    }

    /// After the pass: its timestamps into the staging buffer.
    pub(crate) fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        let n = self.kinds.len() + 1;
        enc.resolve_query_set(&self.set, 0..n as u32, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.staging, 0, (n * 8) as u64);
    }

    /// After the submission: the pass's intervals added into `into`, each to its dispatch's kind.
    pub(crate) fn read(&self, gpu: &Gpu, into: &mut DeviceClock) -> Result<(), AccelError> {
        let n = self.kinds.len() + 1;
        // The values are u64 ticks; `read_back_with` hands the mapped words as f32s.
        gpu.read_back_with(&self.staging, n * 2, |words| {
            let bytes: &[u8] = bytemuck::cast_slice(words);
            let tick = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            let secs = |t0: u64, t1: u64| t1.saturating_sub(t0) as f64 * self.period * 1e-9;
            for (i, kind) in self.kinds.iter().enumerate() {
                into.secs[*kind as usize] += secs(tick(i), tick(i + 1));
                into.dispatches[*kind as usize] += 1;
            }
            into.span_secs += secs(tick(0), tick(n - 1));
            into.passes += 1;
        })
    }
}
