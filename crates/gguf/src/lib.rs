//! GGUF reader.
//!
//! Parses GGUF v2 and v3 files (the format llama.cpp writes): a header, typed key/value metadata
//! (every value type, arrays included, nested arrays too), and a tensor directory whose entries
//! point into an aligned data section. The file is memory-mapped; tensor data is handed out as
//! zero-copy byte slices of the mapping.
//!
//! Design: parsing is a single pass over the mapped bytes through a bounds-checked cursor
//! (`parse::Cursor`). Nothing is allocated from a count read from the file before the count is
//! checked against the bytes that remain, so a hostile file cannot make the reader allocate more
//! than a small multiple of its own size. Every error names the field (metadata key, tensor name
//! and dimension) or offset that was wrong.
//!
//! A model split in several files (llama.cpp's `gguf-split`) is opened from its first file and
//! reads as one (`split`).
//!
//! Invariant: after [`Gguf::open`] succeeds, every tensor's `[offset, offset + n_bytes)` lies
//! inside the data section, so [`Gguf::tensor_data`] cannot read out of bounds.

mod parse;
mod split;
mod types;
mod value;

use std::collections::HashMap;
use std::path::Path;

pub use types::{GgmlType, QK_K};
pub use value::{Array, Value};

/// GGML's maximum tensor rank.
pub const MAX_DIMS: usize = 4;
const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// Everything that can be wrong with a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open '{path}': {source}")]
    Io { path: String, source: std::io::Error },
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (this reader supports 2 and 3)")]
    Version(u32),
    #[error("file truncated while reading {field} at offset {offset} (needs {need} more bytes)")]
    Truncated { field: String, offset: u64, need: u64 },
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("metadata '{key}' has unknown value type {ty}")]
    UnknownValueType { key: String, ty: u32 },
    #[error("tensor '{tensor}' has unknown or unsupported ggml type id {id}")]
    UnknownTensorType { tensor: String, id: u32 },
    #[error("tensor '{tensor}' data [{start}, {end}) lies outside the data section of {len} bytes")]
    TensorOutOfBounds { tensor: String, start: u64, end: u64, len: u64 },
    #[error("duplicate {what} '{name}'")]
    Duplicate { what: &'static str, name: String },
    #[error("metadata key '{0}' is missing")]
    MissingKey(String),
    #[error("metadata key '{key}' is a {found}, expected {expected}")]
    WrongType { key: String, found: &'static str, expected: &'static str },
    #[error("in split file '{path}': {source}")]
    InSplit { path: String, source: Box<Error> },
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub n_dims: usize,
    /// GGML order: `shape[0]` is the contiguous (row) dimension; unused dimensions are 1.
    pub shape: [u64; MAX_DIMS],
    pub dtype: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Storage behind a parsed file: a read-only mapping, the mappings of a split model's files
/// side by side, or owned bytes (tests, in-memory files).
enum Bytes {
    Mmap(memmap2::Mmap),
    #[cfg(unix)]
    Joined(split::Joined),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mmap(m) => m,
            #[cfg(unix)]
            Bytes::Joined(j) => j,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file.
pub struct Gguf {
    bytes: Bytes,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_start: u64,
}

impl Gguf {
    /// Memory-map and parse a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf, Error> {
        let path = path.as_ref();
        let io = |source| Error::Io { path: path.display().to_string(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only and private to this process; we accept that another
        // process truncating the file while mapped is outside our control (as every mmap reader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let head = Header::parse(&map)?;
        match split::count(&head)? {
            1 => Ok(Self::assemble(Bytes::Mmap(map), head)),
            n => {
                drop(map);
                split::open(path, head, n)
            }
        }
    }

    /// Fault the whole mapping into memory now (`MADV_POPULATE_READ` on Linux), so that the
    /// first pass over the weights does not stall on page faults; a no-op for owned bytes or
    /// where the kernel lacks the advice. Returns whether the pages were populated.
    pub fn populate(&self) -> bool {
        match &self.bytes {
            #[cfg(target_os = "linux")]
            Bytes::Mmap(m) => m.advise(memmap2::Advice::PopulateRead).is_ok(),
            #[cfg(target_os = "linux")]
            Bytes::Joined(j) => j.populate(),
            _ => false,
        }
    }

    /// Drop the whole pages inside `offset .. offset + len` of the mapping from this process
    /// (`MADV_DONTNEED`): for data copied elsewhere at load. A later read of them faults them
    /// back in from the file (the mapping is read-only, so nothing is lost). A no-op for owned
    /// bytes or ranges outside the mapping.
    pub fn release(&self, offset: usize, len: usize) {
        #[cfg(target_os = "linux")]
        {
            let page = split::page_size();
            let start = offset.next_multiple_of(page);
            let end = offset.saturating_add(len).min(self.bytes.len()) / page * page;
            if end <= start {
                return;
            }
            match &self.bytes {
                Bytes::Mmap(m) => {
                    // SAFETY: a read-only file mapping never holds changes of ours, so
                    // discarding its pages only means rereading them from the file on next access.
                    let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
                }
                Bytes::Joined(j) => j.drop_pages(start, end - start),
                Bytes::Owned(_) => {}
            }
        }
    }

    /// Parse a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, Error> {
        let head = Header::parse(&bytes)?;
        Ok(Self::assemble(Bytes::Owned(bytes), head))
    }

    fn assemble(bytes: Bytes, h: Header) -> Gguf {
        let Header { version, alignment, metadata, index, tensors, tensor_index, data_start } = h;
        Gguf { bytes, version, alignment, metadata, index, tensors, tensor_index, data_start }
    }
}

/// What a file's header says: its metadata and tensor directory, every tensor checked to lie
/// inside the file's data section.
struct Header {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_start: u64,
}

impl Header {
    fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn parse(bytes: &[u8]) -> Result<Header, Error> {
        let mut c = parse::Cursor::new(bytes);
        let magic_field = || "magic".to_string();
        let magic = c.u32(&magic_field)?.to_le_bytes();
        if &magic != MAGIC {
            return Err(Error::BadMagic { found: magic });
        }
        let version = c.u32(&|| "version".into())?;
        if version != 2 && version != 3 {
            return Err(Error::Version(version));
        }
        let n_tensors = c.u64(&|| "tensor_count".into())?;
        let n_kv = c.u64(&|| "metadata_kv_count".into())?;
        // A metadata entry takes at least 8 (key len) + 4 (type) + 1 bytes; a tensor entry at
        // least 8 + 4 + 8 + 4 + 8.
        check_count("metadata_kv_count", n_kv, 13, c.remaining())?;
        check_count("tensor_count", n_tensors, 32, c.remaining())?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let (k, v) = c.kv(i)?;
            if index.insert(k.clone(), metadata.len()).is_some() {
                return Err(Error::Duplicate { what: "metadata key", name: k });
            }
            metadata.push((k, v));
        }
        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(Error::Invalid {
                        field: "general.alignment".into(),
                        reason: format!("{v:?} is not a power of two up to 1 MiB"),
                    })
                }
            },
        };

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let t = c.tensor_info(i)?;
            if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
                return Err(Error::Duplicate { what: "tensor", name: t.name });
            }
            tensors.push(t);
        }
        let data_start = (c.pos() as u64).div_ceil(alignment) * alignment;
        let len = (bytes.len() as u64).saturating_sub(data_start);
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(Error::Invalid {
                    field: format!("data offset of tensor '{}'", t.name),
                    reason: format!("{} is not a multiple of the alignment {alignment}", t.offset),
                });
            }
            let end = t.offset.checked_add(t.n_bytes);
            if data_start > bytes.len() as u64 || end.is_none_or(|e| e > len) {
                return Err(Error::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: t.offset,
                    end: end.unwrap_or(u64::MAX),
                    len,
                });
            }
        }
        Ok(Header { version, alignment, metadata, index, tensors, tensor_index, data_start })
    }
}

impl Gguf {
    /// Raw metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, Error> {
        self.get(key).ok_or_else(|| Error::MissingKey(key.to_string()))
    }

    fn wrong(&self, key: &str, expected: &'static str) -> Error {
        let found = self.get(key).map_or("missing", Value::type_name);
        Error::WrongType { key: key.to_string(), found, expected }
    }

    /// A required unsigned integer.
    pub fn u64(&self, key: &str) -> Result<u64, Error> {
        self.require(key)?.as_u64().ok_or_else(|| self.wrong(key, "unsigned integer"))
    }

    /// A required float (integers are accepted).
    pub fn f32(&self, key: &str) -> Result<f32, Error> {
        self.require(key)?.as_f64().map(|v| v as f32).ok_or_else(|| self.wrong(key, "number"))
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&str, Error> {
        self.require(key)?.as_str().ok_or_else(|| self.wrong(key, "string"))
    }

    /// An optional value of the given kind: `Ok(None)` when absent, an error when mistyped.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, Error> {
        self.get(key).map(|_| self.u64(key)).transpose()
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, Error> {
        self.get(key).map(|_| self.f32(key)).transpose()
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, Error> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| self.wrong(key, "bool")))
            .transpose()
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, Error> {
        self.get(key).map(|_| self.str(key)).transpose()
    }

    /// An optional array.
    pub fn opt_array(&self, key: &str) -> Result<Option<&Array>, Error> {
        self.get(key)
            .map(|v| v.as_array().ok_or_else(|| self.wrong(key, "array")))
            .transpose()
    }

    /// Directory entry of a tensor.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Zero-copy bytes of a tensor.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_start + t.offset) as usize;
        &self.bytes[start..start + t.n_bytes as usize]
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Offset of the data section in the file.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.bytes.len() as u64
    }
}

fn check_count(field: &str, n: u64, min_bytes: u64, remaining: usize) -> Result<(), Error> {
    if n.checked_mul(min_bytes).is_none_or(|b| b > remaining as u64) {
        return Err(Error::Invalid {
            field: field.to_string(),
            reason: format!("{n} entries cannot fit in the {remaining} bytes left in the file"),
        });
    }
    Ok(())
}

pub mod writer;
