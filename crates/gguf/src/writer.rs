//! A minimal GGUF v3 writer: metadata of every type and tensors with aligned data. Used to build
//! test files (valid and deliberately corrupt) and by tools that write GGUF.

use crate::value::{tag, Array, Value};
use crate::GgmlType;

/// Builds a GGUF file, in memory ([`Writer::to_bytes`]) or streamed: declare tensors with
/// [`Writer::tensor_info`], write [`Writer::header`], then each tensor's bytes in order, each
/// followed by [`Writer::padding`] zero bytes.
#[derive(Default)]
pub struct Writer {
    pub version: u32,
    pub alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorEntry>,
}

/// Name, GGML shape, type, byte length, data (empty for streamed tensors).
type TensorEntry = (String, Vec<u64>, GgmlType, u64, Vec<u8>);

impl Writer {
    pub fn new() -> Self {
        Writer { version: 3, alignment: 32, ..Default::default() }
    }

    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.metadata.push((key.to_string(), v));
        self
    }

    /// Add a tensor; `shape` is in GGML order and `data` its raw bytes.
    pub fn tensor(&mut self, name: &str, shape: &[u64], dtype: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), shape.to_vec(), dtype, data.len() as u64, data));
        self
    }

    /// Declare a tensor of `n_bytes` whose data the caller streams after [`Writer::header`].
    pub fn tensor_info(&mut self, name: &str, shape: &[u64], dtype: GgmlType, n_bytes: u64) -> &mut Self {
        self.tensors.push((name.to_string(), shape.to_vec(), dtype, n_bytes, Vec::new()));
        self
    }

    /// Zero bytes to write after a tensor of `n_bytes` so the next one starts aligned.
    pub fn padding(&self, n_bytes: u64) -> usize {
        (n_bytes.div_ceil(self.alignment) * self.alignment - n_bytes) as usize
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.header();
        for (i, (_, _, _, n, data)) in self.tensors.iter().enumerate() {
            out.extend_from_slice(data);
            if i + 1 < self.tensors.len() {
                out.resize(out.len() + self.padding(*n), 0);
            }
        }
        out
    }

    /// Everything before the first tensor's data: magic, version, counts, metadata, the tensor
    /// directory (offsets of aligned, back-to-back tensors) and padding to the data section.
    pub fn header(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&value_tag(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        for (name, shape, dtype, n, _) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&dtype.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + n).div_ceil(self.alignment) * self.alignment;
        }
        let start = (out.len() as u64).div_ceil(self.alignment) * self.alignment;
        out.resize(start as usize, 0);
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_tag(v: &Value) -> u32 {
    match v {
        Value::U8(_) => tag::U8,
        Value::I8(_) => tag::I8,
        Value::U16(_) => tag::U16,
        Value::I16(_) => tag::I16,
        Value::U32(_) => tag::U32,
        Value::I32(_) => tag::I32,
        Value::F32(_) => tag::F32,
        Value::Bool(_) => tag::BOOL,
        Value::String(_) => tag::STRING,
        Value::Array(_) => tag::ARRAY,
        Value::U64(_) => tag::U64,
        Value::I64(_) => tag::I64,
        Value::F64(_) => tag::F64,
    }
}

fn array_tag(a: &Array) -> u32 {
    match a {
        Array::U8(_) => tag::U8,
        Array::I8(_) => tag::I8,
        Array::U16(_) => tag::U16,
        Array::I16(_) => tag::I16,
        Array::U32(_) => tag::U32,
        Array::I32(_) => tag::I32,
        Array::F32(_) => tag::F32,
        Array::Bool(_) => tag::BOOL,
        Array::String(_) => tag::STRING,
        Array::Array(_) => tag::ARRAY,
        Array::U64(_) => tag::U64,
        Array::I64(_) => tag::I64,
        Array::F64(_) => tag::F64,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&array_tag(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        Array::U8(v) => v.iter().for_each(|&x| put_value(out, &Value::U8(x))),
        Array::I8(v) => v.iter().for_each(|&x| put_value(out, &Value::I8(x))),
        Array::U16(v) => v.iter().for_each(|&x| put_value(out, &Value::U16(x))),
        Array::I16(v) => v.iter().for_each(|&x| put_value(out, &Value::I16(x))),
        Array::U32(v) => v.iter().for_each(|&x| put_value(out, &Value::U32(x))),
        Array::I32(v) => v.iter().for_each(|&x| put_value(out, &Value::I32(x))),
        Array::F32(v) => v.iter().for_each(|&x| put_value(out, &Value::F32(x))),
        Array::Bool(v) => v.iter().for_each(|&x| put_value(out, &Value::Bool(x))),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|x| put_array(out, x)),
        Array::U64(v) => v.iter().for_each(|&x| put_value(out, &Value::U64(x))),
        Array::I64(v) => v.iter().for_each(|&x| put_value(out, &Value::I64(x))),
        Array::F64(v) => v.iter().for_each(|&x| put_value(out, &Value::F64(x))),
    }
}
