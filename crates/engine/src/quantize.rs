//! `corelm quantize`: rewrite a GGUF with its F32/F16/BF16 weight matrices quantized to one
//! type, with ggml's reference block semantics (`kernels::quant::reference`, bit-identical to
//! `ggml_quantize_chunk`), so llama.cpp and corelm read the result alike.
//!
//! What is quantized: every tensor of at least two dimensions stored as F32, F16 or BF16,
//! except the MoE router (`ffn_gate_inp`, kept as llama-quantize keeps it). Norms, biases and
//! other vectors are copied. A matrix whose rows are not whole blocks of the target type falls
//! back as llama-quantize does (Q4_K → Q5_0, Q6_K → Q8_0), or else stays as it is. Metadata is
//! copied, with `general.file_type` and `general.quantization_version` set. Per-tensor types
//! (llama-quantize's `--tensor-type`, as its Q4_K_M keeps `attn_v` and `ffn_down` in higher
//! types): `NAME=TYPE` gives the tensors whose name contains NAME that type instead, the
//! first such rule that matches deciding.
//!
//! The output is written to `<out>.part` and renamed when complete, so a failure never leaves
//! a truncated model behind. Rows are split across the worker threads of a core thread pool.
//! No `unsafe` here: each worker gets its own output range up front.

use crate::Error;
use corelm_core::{PoolConfig, ThreadPool, Worker};
use corelm_gguf::writer::Writer;
use corelm_gguf::{Gguf, Value};
use corelm_kernels::quant::reference::quantizer;
use corelm_kernels::{kernels, row_bytes, DType};
use std::io::Write;
use std::path::Path;

/// Types `corelm quantize --type` accepts.
pub const TARGETS: [DType; 12] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q6K,
    DType::IQ4NL,
    DType::IQ4XS,
    DType::F16,
    DType::BF16,
    DType::F32,
];

/// llama.cpp's `llama_ftype` for a file mostly of type `t`.
fn file_type(t: DType) -> u32 {
    match t {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q8_0 => 7,
        DType::Q5_0 => 8,
        DType::Q5_1 => 9,
        DType::Q4K => 14, // Q4_K_S: all Q4_K
        DType::Q6K => 18,
        DType::IQ4NL => 25,
        DType::IQ4XS => 30,
        DType::BF16 => 32,
        _ => 0,
    }
}

/// Parse a target type name (`q4_0`, `Q4_K`, `f16`, ...).
pub fn parse_type(s: &str) -> Result<DType, String> {
    TARGETS.iter().find(|t| t.name().eq_ignore_ascii_case(s)).copied().ok_or_else(|| {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.name()).collect();
        format!("cannot quantize to '{s}' (supported: {})", names.join(", "))
    })
}

/// What happened to each tensor.
#[derive(Debug, Default)]
pub struct Report {
    pub quantized: usize,
    pub fell_back: Vec<(String, DType)>,
    pub copied: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// The type tensor `name` of `src` type and GGML `shape` gets.
fn target_of(name: &str, src: DType, shape: &[u64], t: DType, requantize: bool) -> DType {
    let matrix = shape.len() >= 2 && shape[1..].iter().any(|&d| d > 1);
    let float = matches!(src, DType::F32 | DType::F16 | DType::BF16);
    let readable = float || (requantize && kernels().to_float(src).is_some());
    if !matrix || !readable || name.contains("ffn_gate_inp") || src == t {
        return src;
    }
    let ne0 = shape[0] as usize;
    // llama-quantize's fallbacks for rows that are not whole super-blocks.
    let fallback = match t {
        DType::Q4K => DType::Q5_0,
        DType::IQ4XS => DType::IQ4NL,
        _ => DType::Q8_0,
    };
    if ne0.is_multiple_of(t.block_size()) {
        t
    } else if ne0.is_multiple_of(fallback.block_size()) {
        fallback
    } else {
        src
    }
}

/// Parse a per-tensor type rule `NAME=TYPE` (`ffn_up=q8_0`): tensors whose name contains NAME
/// are quantized to TYPE.
pub fn parse_tensor_type(s: &str) -> Result<(String, DType), String> {
    let (name, t) = s.split_once('=').ok_or_else(|| format!("'{s}': expected NAME=TYPE, e.g. attn_v=q8_0"))?;
    if name.is_empty() {
        return Err(format!("'{s}': an empty tensor name matches every tensor; use --type"));
    }
    Ok((name.to_string(), parse_type(t)?))
}

/// `requantize`: also convert matrices that are already quantized (dequantized first, so the
/// result carries both quantization errors; llama-quantize's `--allow-requantize`).
pub fn quantize_file(input: &Path, output: &Path, t: DType, requantize: bool, n_threads: usize) -> Result<Report, Error> {
    quantize_file_with(input, output, t, &[], requantize, n_threads)
}

/// [`quantize_file`] with per-tensor types: a tensor whose name contains `rules[i].0` (the
/// first such i) is quantized to `rules[i].1` instead of `t`.
pub fn quantize_file_with(input: &Path, output: &Path, t: DType, rules: &[(String, DType)], requantize: bool, n_threads: usize) -> Result<Report, Error> {
    for &to in std::iter::once(&t).chain(rules.iter().map(|(_, to)| to)) {
        if !TARGETS.contains(&to) {
            return Err(Error::Config(format!("cannot quantize to {to}")));
        }
    }
    let g = Gguf::open(input)?;
    let mut w = Writer::new();
    w.alignment = g.alignment;
    for (k, v) in &g.metadata {
        if k != "general.file_type" && k != "general.quantization_version" {
            w.kv(k, v.clone());
        }
    }
    w.kv("general.file_type", Value::U32(file_type(t)));
    w.kv("general.quantization_version", Value::U32(2));
    let mut report = Report::default();
    let plan: Vec<DType> = g
        .tensors
        .iter()
        .map(|ti| {
            let shape = &ti.shape[..ti.n_dims];
            let want = rules.iter().find(|(name, _)| ti.name.contains(name.as_str())).map_or(t, |&(_, to)| to);
            let to = target_of(&ti.name, ti.dtype, shape, want, requantize);
            let n_bytes = row_bytes(to, shape[0] as usize) as u64 * shape[1..].iter().product::<u64>();
            w.tensor_info(&ti.name, shape, to, n_bytes);
            if to == ti.dtype {
                report.copied += 1;
            } else if to == want {
                report.quantized += 1;
            } else {
                report.fell_back.push((ti.name.clone(), to));
            }
            to
        })
        .collect();
    let part = output.with_extension("gguf.part");
    let io = |e: std::io::Error| Error::Config(format!("writing {}: {e}", part.display()));
    let file = std::fs::File::create(&part).map_err(io)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let header = w.header();
    out.write_all(&header).map_err(io)?;
    report.bytes_out = header.len() as u64;
    let pool = ThreadPool::new(PoolConfig { n_threads: n_threads.max(1), cpus: vec![] });
    let mut buf = Vec::new();
    for (ti, &to) in g.tensors.iter().zip(&plan) {
        let data = g.tensor_data(ti);
        report.bytes_in += data.len() as u64;
        if to == ti.dtype {
            out.write_all(data).map_err(io)?;
            report.bytes_out += data.len() as u64;
        } else {
            convert(&pool, data, ti.dtype, to, ti.shape[0] as usize, &mut buf);
            out.write_all(&buf).map_err(io)?;
            report.bytes_out += buf.len() as u64;
        }
        let pad = w.padding(report.bytes_out - header.len() as u64);
        out.write_all(&vec![0u8; pad]).map_err(io)?;
        report.bytes_out += pad as u64;
    }
    out.flush().map_err(io)?;
    drop(out);
    std::fs::rename(&part, output).map_err(|e| Error::Config(format!("renaming to {}: {e}", output.display())))?;
    Ok(report)
}

/// Rows of `ne0` elements of `from` → rows of `to`, split across the pool's workers.
fn convert(pool: &ThreadPool, data: &[u8], from: DType, to: DType, ne0: usize, out: &mut Vec<u8>) {
    let (rb_in, rb_out) = (row_bytes(from, ne0), row_bytes(to, ne0));
    let rows = data.len() / rb_in;
    out.clear();
    out.resize(rows * rb_out, 0);
    let to_float = kernels().to_float(from).expect("source type checked in target_of");
    let quant = quantizer(to).expect("target checked");
    // One disjoint output range per worker, handed over through an uncontended mutex.
    let nth = pool.n_threads();
    let mut parts: Vec<std::sync::Mutex<&mut [u8]>> = Vec::with_capacity(nth);
    let mut rest: &mut [u8] = out;
    for ith in 0..nth {
        let n = corelm_core::sched::split(rows, ith, nth).len();
        let (mine, tail) = rest.split_at_mut(n * rb_out);
        parts.push(std::sync::Mutex::new(mine));
        rest = tail;
    }
    pool.run(&|wk: &Worker| {
        let mut row = vec![0f32; ne0];
        let mut dst = parts[wk.ith].lock().unwrap_or_else(|e| e.into_inner());
        for (i, r) in corelm_core::sched::split(rows, wk.ith, wk.nth).enumerate() {
            to_float(&data[r * rb_in..(r + 1) * rb_in], &mut row);
            quant(&row, &mut dst[i * rb_out..(i + 1) * rb_out]);
        }
    });
}
