//! Opening a device and compiling the shaders once.

use corelm_kernels::DType;
use std::sync::{Mutex, OnceLock};

/// What can go wrong on the accelerator.
#[derive(Debug, thiserror::Error)]
pub enum AccelError {
    #[error("no accelerator found: {0} (install a Vulkan driver; Mesa's lavapipe is apt mesa-vulkan-drivers)")]
    NoAdapter(String),
    #[error("the accelerator refused a device: {0}")]
    Device(String),
    #[error("weight type {0} has no accelerator kernel")]
    Type(DType),
    #[error("{what} needs {need} bytes of accelerator memory; the device allows {max} per buffer")]
    TooLarge { what: String, need: u64, max: u64 },
    #[error("reading results back from the accelerator failed: {0}")]
    Readback(String),
}

/// One accelerator: its device, queue, and the compiled pipelines.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    pub(crate) max_buffer: u64,
    /// Whether timestamps can be written inside a compute pass (`crate::clock`).
    pub(crate) timestamps: bool,
    /// The products' pipelines per weight type ([`TYPES`]' order), compiled when a matrix of
    /// the type first goes to the device ([`Gpu::products`]): a model compiles its own types'
    /// (2–4 of 10), not every type's.
    products: [OnceLock<Products>; TYPES.len()],
    /// The products' pipeline layout (their bindings), for those compiled later.
    products_layout: wgpu::PipelineLayout,
    pub(crate) act: wgpu::ComputePipeline,
    /// The neuron-major Q8_0 down projection of the hot neurons (`shaders/down_nm.wgsl`).
    pub(crate) down: wgpu::ComputePipeline,
    /// Its slice sums added in order (`shaders/down_sum.wgsl`).
    pub(crate) down_sum: wgpu::ComputePipeline,
    /// Whole layers' other shaders (`layers.rs`).
    pub(crate) layer: LayerPipelines,
    /// The same product tiled, for batches of `matrix::GEMM_MIN_TOKENS` tokens or more
    /// (`shaders/down_gemm.wgsl`).
    pub(crate) down_gemm: wgpu::ComputePipeline,
}

/// The product shaders of one weight type: one pipeline layout, so a matrix's bind group
/// serves all three.
pub(crate) struct Products {
    /// The GEMV (`shaders/common.wgsl`: 8 tokens a workgroup).
    pub(crate) gemv: wgpu::ComputePipeline,
    /// The GEMV compiled for one token (`TOK` 1): decode steps.
    pub(crate) gemv1: wgpu::ComputePipeline,
    /// The tiled products of batches of `matrix::GEMM_MIN_TOKENS` tokens or more
    /// (`shaders/gemm.wgsl`).
    pub(crate) gemm: wgpu::ComputePipeline,
}

/// The shaders of whole layers on the device (`crate::layers`) besides the products and the
/// gated activation.
pub(crate) struct LayerPipelines {
    pub(crate) rms_norm: wgpu::ComputePipeline,
    pub(crate) head_norm: wgpu::ComputePipeline,
    pub(crate) add: wgpu::ComputePipeline,
    pub(crate) rope_store: wgpu::ComputePipeline,
    pub(crate) attention: wgpu::ComputePipeline,
    /// Both attention shaders' pipeline layout (a layer's bind group serves either).
    attention_layout: wgpu::PipelineLayout,
    /// Prefill attention in tiles of tokens sharing each chunk of cache rows
    /// (`shaders/attention_tiles.wgsl`) per head dimension of [`TILE_HEAD_DIMS`], compiled for
    /// the first model of that head dimension ([`LayerPipelines::attention_tiles`]); none where
    /// the device's workgroup memory is under the shader's.
    attention_tiles: [OnceLock<Option<wgpu::ComputePipeline>>; TILE_HEAD_DIMS.len()],
    /// The device's workgroup memory, in bytes.
    workgroup_memory: u32,
}

/// The head dimensions the tiled attention takes: S = 1, 2 or 4 threads a row, 64 dimensions
/// each.
const TILE_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Workgroup memory the tiled attention declares with `s` threads a row: a chunk's keys and
/// values (2 × 512 vec4s), its partial scores (64 threads × 32 / s cells, none at one thread a
/// row) and its span.
const fn attention_tiles_memory(s: u32) -> u32 {
    2 * 512 * 16 + if s == 1 { 4 } else { 64 * s * (32 / s) * 4 } + 16
}

impl LayerPipelines {
    /// The tiled attention's pipeline for heads of `head_dim` values, compiled on the first
    /// call; none for another head dimension or where the device's workgroup memory is too
    /// small.
    pub(crate) fn attention_tiles(&self, device: &wgpu::Device, head_dim: usize) -> Option<&wgpu::ComputePipeline> {
        let i = TILE_HEAD_DIMS.iter().position(|&d| d == head_dim)?;
        self.attention_tiles[i]
            .get_or_init(|| {
                let body = include_str!("shaders/attention_tiles.wgsl");
                let threads = body.replacen("const S: u32 = 1u;", &format!("const S: u32 = {}u;", head_dim / 64), 1);
                assert!(head_dim == 64 || threads != body, "attention_tiles.wgsl declares S");
                let src = format!("{}\n{threads}", include_str!("shaders/attn_common.wgsl"));
                (self.workgroup_memory >= attention_tiles_memory(head_dim as u32 / 64)).then(|| compile(device, &format!("attention (tiles, head dimension {head_dim})"), src, Some(&self.attention_layout)))
            })
            .as_ref()
    }
}

/// The byte helpers every shader reading GGML blocks shares.
const BYTES: &str = include_str!("shaders/bytes.wgsl");

/// `t`'s part of the product shaders (`shaders/<type>.wgsl`): its `sub_val4` (what the GEMV
/// and the GEMM read), with the byte helpers it reads blocks with.
fn type_part(t: DType) -> Option<String> {
    let kmin = include_str!("shaders/kmin.wgsl");
    let part = match t {
        DType::F32 => include_str!("shaders/f32.wgsl").to_string(),
        DType::F16 => include_str!("shaders/f16.wgsl").to_string(),
        DType::Q4_0 => include_str!("shaders/q4_0.wgsl").to_string(),
        DType::Q4_1 => include_str!("shaders/q4_1.wgsl").to_string(),
        DType::Q5_0 => include_str!("shaders/q5_0.wgsl").to_string(),
        DType::Q5_1 => include_str!("shaders/q5_1.wgsl").to_string(),
        DType::Q8_0 => include_str!("shaders/q8_0.wgsl").to_string(),
        DType::Q4K => format!("{kmin}\n{}", include_str!("shaders/q4_k.wgsl")),
        DType::Q5K => format!("{kmin}\n{}", include_str!("shaders/q5_k.wgsl")),
        DType::Q6K => include_str!("shaders/q6_k.wgsl").to_string(),
        _ => return None,
    };
    Some(format!("{BYTES}\n{part}"))
}

/// The weight types with a GEMV shader.
pub(crate) const TYPES: [DType; 10] =
    [DType::F32, DType::F16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q5K, DType::Q6K];

impl Gpu {
    /// The highest-performance adapter the system offers (a discrete GPU before an integrated
    /// one, a software rasterizer last), a device with the adapter's own limits, and every
    /// shader compiled.
    pub fn open() -> Result<Gpu, AccelError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| AccelError::NoAdapter(e.to_string()))?;
        let limits = adapter.limits();
        // Timestamps between dispatches where the adapter has them (`bench --profile`).
        let clock = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let timestamps = adapter.features().contains(clock);
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("corelm"),
            required_features: if timestamps { clock } else { wgpu::Features::empty() },
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| AccelError::Device(e.to_string()))?;
        let max_buffer = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        let compile = |label: &str, src: String, layout: Option<&wgpu::PipelineLayout>| compile(&device, label, src, layout);
        let pipeline = |label: &str, src: String| compile(label, src, None);
        // The products' bindings (W, X, Y, the shape, a bias, a norm's weights), one layout for
        // the GEMV and the GEMM.
        let entry = |binding: u32, ty: wgpu::BindingType| wgpu::BindGroupLayoutEntry { binding, visibility: wgpu::ShaderStages::COMPUTE, ty, count: None };
        let storage = |read_only: bool| wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Storage { read_only }, has_dynamic_offset: false, min_binding_size: None };
        let uniform = wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Uniform, has_dynamic_offset: false, min_binding_size: None };
        let products = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("products"),
            entries: &[entry(0, storage(true)), entry(1, storage(true)), entry(2, storage(false)), entry(3, uniform), entry(4, storage(true)), entry(5, storage(true))],
        });
        let products_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor { label: Some("products"), bind_group_layouts: &[Some(&products)], immediate_size: 0 });
        let tile = include_str!("shaders/tile.wgsl");
        let act = pipeline("act", include_str!("shaders/act.wgsl").to_string());
        let down_params = include_str!("shaders/down_params.wgsl");
        let down = pipeline("down (neuron-major)", format!("{down_params}\n{}\n{BYTES}", include_str!("shaders/down_nm.wgsl")));
        let down_sum = pipeline("down (slice sums)", format!("{down_params}\n{}", include_str!("shaders/down_sum.wgsl")));
        let norm = include_str!("shaders/norm.wgsl");
        // Both attention shaders under one layout, so a layer's bind group serves either.
        let attention = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("attention"),
            entries: &[entry(0, storage(true)), entry(1, storage(true)), entry(2, storage(true)), entry(3, storage(false)), entry(4, storage(true)), entry(5, storage(true)), entry(6, uniform)],
        });
        let attention = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor { label: Some("attention"), bind_group_layouts: &[Some(&attention)], immediate_size: 0 });
        let attn = include_str!("shaders/attn_common.wgsl");
        let layer = LayerPipelines {
            rms_norm: pipeline("rms norm", format!("{}\n{norm}", include_str!("shaders/rms_norm.wgsl"))),
            head_norm: pipeline("head norm", format!("{}\n{norm}", include_str!("shaders/head_norm.wgsl"))),
            add: pipeline("add", include_str!("shaders/add.wgsl").to_string()),
            rope_store: pipeline("rope and kv store", include_str!("shaders/rope_store.wgsl").to_string()),
            attention: compile("attention", format!("{attn}\n{}", include_str!("shaders/attention.wgsl")), Some(&attention)),
            attention_layout: attention,
            attention_tiles: std::array::from_fn(|_| OnceLock::new()),
            workgroup_memory: limits.max_compute_workgroup_storage_size,
        };
        let down_gemm = pipeline("down (tiled)", format!("{down_params}\n{}\n{tile}\n{BYTES}", include_str!("shaders/down_gemm.wgsl")));
        let products = std::array::from_fn(|_| OnceLock::new());
        Ok(Gpu { device, queue, info: adapter.get_info(), max_buffer, timestamps, products, products_layout, act, down, down_sum, layer, down_gemm })
    }

    /// The product pipelines of weight type `t` (one of [`TYPES`]), compiled on the first call
    /// (a matrix's upload, not its products).
    pub(crate) fn products(&self, t: DType) -> &Products {
        let i = TYPES.iter().position(|&u| u == t).unwrap_or_else(|| panic!("{t} has no product shaders"));
        self.products[i].get_or_init(|| {
            let compile = |kind: &str, body: &str| {
                let src = format!("{}\n{body}\n{}", include_str!("shaders/products.wgsl"), type_part(t).expect("a listed type"));
                compile(&self.device, &format!("{kind} {t}"), src, Some(&self.products_layout))
            };
            let common = include_str!("shaders/common.wgsl");
            let one = common.replacen("const TOK: u32 = 8u;", "const TOK: u32 = 1u;", 1);
            assert_ne!(one, common, "common.wgsl declares TOK");
            let gemm = format!("{}\n{}", include_str!("shaders/gemm.wgsl"), include_str!("shaders/tile.wgsl"));
            Products { gemv: compile("gemv", common), gemv1: compile("gemv (one token)", &one), gemm: compile("gemm", &gemm) }
        })
    }

    /// The adapter's name and backend, e.g. `NVIDIA H100 (Vulkan)`.
    pub fn name(&self) -> String {
        format!("{} ({:?})", self.info.name, self.info.backend)
    }

    /// Whether the adapter is a CPU emulating a GPU (lavapipe, WARP): correct, not fast.
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// A storage buffer of `len` bytes (rounded up to 4), checked against the device's limit.
    pub(crate) fn storage(&self, what: &str, len: u64, extra: wgpu::BufferUsages) -> Result<wgpu::Buffer, AccelError> {
        let len = len.max(4).next_multiple_of(4);
        if len > self.max_buffer {
            return Err(AccelError::TooLarge { what: what.to_string(), need: len, max: self.max_buffer });
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(what),
            size: len,
            usage: wgpu::BufferUsages::STORAGE | extra,
            mapped_at_creation: false,
        }))
    }

    /// The bind group of `pipeline`'s bindings, `buffers` in binding order.
    pub(crate) fn bind<const N: usize>(&self, label: &str, pipeline: &wgpu::ComputePipeline, buffers: [&wgpu::Buffer; N]) -> wgpu::BindGroup {
        let entries: [wgpu::BindGroupEntry; N] = std::array::from_fn(|i| wgpu::BindGroupEntry { binding: i as u32, resource: buffers[i].as_entire_binding() });
        self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout: &pipeline.get_bind_group_layout(0), entries: &entries })
    }

    /// A uniform buffer holding `words`.
    pub(crate) fn uniform(&self, words: &[u32]) -> wgpu::Buffer {
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: (words.len() * 4).next_multiple_of(16) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue.write_buffer(&b, 0, bytemuck::cast_slice(words));
        b
    }

    /// Wait for the submitted work and copy `staging`'s first `out.len()` floats into `out`.
    pub(crate) fn read_back(&self, staging: &wgpu::Buffer, out: &mut [f32]) -> Result<(), AccelError> {
        self.read_back_with(staging, out.len(), |v| out.copy_from_slice(v))
    }

    /// Wait for the submitted work and hand `staging`'s first `len` floats, mapped, to `f`.
    pub(crate) fn read_back_with(&self, staging: &wgpu::Buffer, len: usize, f: impl FnOnce(&[f32])) -> Result<(), AccelError> {
        let n = (len * 4) as u64;
        let slice = staging.slice(..n);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).map_err(|e| AccelError::Readback(e.to_string()))?;
        rx.recv().map_err(|e| AccelError::Readback(e.to_string()))?.map_err(|e| AccelError::Readback(e.to_string()))?;
        {
            let view = slice.get_mapped_range().map_err(|e| AccelError::Readback(format!("{e:?}")))?;
            f(bytemuck::cast_slice(&view));
        }
        staging.unmap();
        Ok(())
    }
}

/// The compute pipeline of WGSL `src` (entry point `main`), with `layout` or the one its
/// bindings imply.
fn compile(device: &wgpu::Device, label: &str, src: String, layout: Option<&wgpu::PipelineLayout>) -> wgpu::ComputePipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(src.into()) });
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
}

/// Workgroups along x and y for `n` items at `per` items a workgroup (at most 65,535 along x;
/// the shaders fold y into their index).
pub(crate) fn grid(n: usize, per: usize) -> (u32, u32) {
    let groups = n.div_ceil(per).max(1);
    let gx = groups.min(65_535);
    (gx as u32, groups.div_ceil(gx) as u32)
}

/// A shader's shape (8 words, the products' 12) in a uniform buffer, written through the queue
/// (ahead of the next submission) only when the words change: a run of products of the same
/// shape — the decode steps — writes nothing per step.
pub(crate) struct Shape {
    pub(crate) buf: wgpu::Buffer,
    /// The words last written, zero-padded (a fixed array: no allocation when they change).
    last: Mutex<Option<[u32; MAX_WORDS]>>,
}

/// The most words a shape holds (the products' 12).
const MAX_WORDS: usize = 12;

impl Shape {
    pub(crate) fn new(gpu: &Gpu) -> Shape {
        Shape::words(gpu, 8)
    }

    /// A shape of `n` words.
    pub(crate) fn words(gpu: &Gpu, n: usize) -> Shape {
        assert!(n <= MAX_WORDS, "a shape of at most {MAX_WORDS} words");
        Shape { buf: gpu.uniform(&[0; MAX_WORDS][..n]), last: Mutex::new(None) }
    }

    /// The words the next submission's dispatches read (as many as the shape has).
    pub(crate) fn set<const N: usize>(&self, gpu: &Gpu, words: [u32; N]) {
        assert_eq!(self.buf.size(), (N * 4).next_multiple_of(16) as u64, "{N} words for this shape");
        let mut padded = [0; MAX_WORDS];
        padded[..N].copy_from_slice(&words);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if *last != Some(padded) {
            gpu.queue.write_buffer(&self.buf, 0, bytemuck::cast_slice(&words));
            *last = Some(padded);
        }
    }
}
