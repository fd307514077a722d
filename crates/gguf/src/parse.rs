//! The bounds-checked parser. Every read goes through [`Cursor`], which names the field it was
//! reading when the bytes run out, so a truncated or hostile file yields an error, never a panic.

use crate::value::{tag, Array, Value};
use crate::{Error, GgmlType, TensorInfo, MAX_DIMS};

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, field: &dyn Fn() -> String) -> Result<&'a [u8], Error> {
        if n > self.remaining() {
            return Err(Error::Truncated { field: field(), offset: self.pos as u64, need: n as u64 });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N], Error> {
        let s = self.take(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A GGUF string: u64 length, then bytes. The length is checked against the bytes left
    /// before anything is allocated.
    pub fn string(&mut self, field: &dyn Fn() -> String) -> Result<String, Error> {
        let len = self.u64(field)?;
        if len > self.remaining() as u64 {
            return Err(Error::Truncated { field: field(), offset: self.pos as u64, need: len });
        }
        let bytes = self.take(len as usize, field)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, Error> {
        let f = || format!("metadata value of '{key}'");
        Ok(match ty {
            tag::U8 => Value::U8(self.array::<1>(&f)?[0]),
            tag::I8 => Value::I8(self.array::<1>(&f)?[0] as i8),
            tag::U16 => Value::U16(u16::from_le_bytes(self.array(&f)?)),
            tag::I16 => Value::I16(i16::from_le_bytes(self.array(&f)?)),
            tag::U32 => Value::U32(self.u32(&f)?),
            tag::I32 => Value::I32(i32::from_le_bytes(self.array(&f)?)),
            tag::F32 => Value::F32(f32::from_le_bytes(self.array(&f)?)),
            tag::BOOL => match self.array::<1>(&f)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(Error::Invalid { field: f(), reason: format!("bool byte {b}") }),
            },
            tag::STRING => Value::String(self.string(&f)?),
            tag::ARRAY => Value::Array(self.array_value(key, depth)?),
            tag::U64 => Value::U64(self.u64(&f)?),
            tag::I64 => Value::I64(i64::from_le_bytes(self.array(&f)?)),
            tag::F64 => Value::F64(f64::from_le_bytes(self.array(&f)?)),
            other => return Err(Error::UnknownValueType { key: key.to_string(), ty: other }),
        })
    }

    fn array_value(&mut self, key: &str, depth: u32) -> Result<Array, Error> {
        let f = || format!("array header of '{key}'");
        if depth >= 4 {
            return Err(Error::Invalid { field: f(), reason: "arrays nested deeper than 4".into() });
        }
        let ty = self.u32(&f)?;
        let n = self.u64(&f)?;
        // Every element takes at least one byte (strings and arrays at least 8), so a count
        // larger than the bytes left is a lie: refuse before allocating.
        let min = match ty {
            tag::U8 | tag::I8 | tag::BOOL => 1,
            tag::U16 | tag::I16 => 2,
            tag::U32 | tag::I32 | tag::F32 => 4,
            _ => 8,
        };
        if n.checked_mul(min).is_none_or(|b| b > self.remaining() as u64) {
            return Err(Error::Invalid {
                field: f(),
                reason: format!("{n} elements cannot fit in the {} bytes left", self.remaining()),
            });
        }
        let n = n as usize;
        Ok(match ty {
            tag::U8 => Array::U8(self.elems(n, key, |b: [u8; 1]| b[0])?),
            tag::I8 => Array::I8(self.elems(n, key, |b: [u8; 1]| b[0] as i8)?),
            tag::U16 => Array::U16(self.elems(n, key, u16::from_le_bytes)?),
            tag::I16 => Array::I16(self.elems(n, key, i16::from_le_bytes)?),
            tag::U32 => Array::U32(self.elems(n, key, u32::from_le_bytes)?),
            tag::I32 => Array::I32(self.elems(n, key, i32::from_le_bytes)?),
            tag::F32 => Array::F32(self.elems(n, key, f32::from_le_bytes)?),
            tag::U64 => Array::U64(self.elems(n, key, u64::from_le_bytes)?),
            tag::I64 => Array::I64(self.elems(n, key, i64::from_le_bytes)?),
            tag::F64 => Array::F64(self.elems(n, key, f64::from_le_bytes)?),
            tag::BOOL => {
                let raw = self.elems(n, key, |b: [u8; 1]| b[0])?;
                if let Some(i) = raw.iter().position(|&b| b > 1) {
                    return Err(Error::Invalid {
                        field: format!("element {i} of '{key}'"),
                        reason: format!("bool byte {}", raw[i]),
                    });
                }
                Array::Bool(raw.into_iter().map(|b| b == 1).collect())
            }
            tag::STRING => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string(&|| format!("element {i} of '{key}'"))?);
                }
                Array::String(v)
            }
            tag::ARRAY => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(v)
            }
            other => return Err(Error::UnknownValueType { key: key.to_string(), ty: other }),
        })
    }

    /// `n` fixed-size little-endian elements (the count was already checked against the bytes left).
    fn elems<T, const N: usize>(
        &mut self,
        n: usize,
        key: &str,
        conv: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>, Error> {
        let mut v = Vec::with_capacity(n);
        for i in 0..n {
            v.push(conv(self.array(&|| format!("element {i} of '{key}'"))?));
        }
        Ok(v)
    }

    /// One metadata pair.
    pub fn kv(&mut self, index: u64) -> Result<(String, Value), Error> {
        let key = self.string(&|| format!("key of metadata entry {index}"))?;
        let ty = self.u32(&|| format!("value type of '{key}'"))?;
        let v = self.value(ty, &key, 0)?;
        Ok((key, v))
    }

    /// One tensor directory entry (not yet checked against the data section).
    pub fn tensor_info(&mut self, index: u64) -> Result<TensorInfo, Error> {
        let name = self.string(&|| format!("name of tensor {index}"))?;
        let n_dims = self.u32(&|| format!("n_dims of tensor '{name}'"))?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(Error::Invalid {
                field: format!("n_dims of tensor '{name}'"),
                reason: format!("{n_dims} (must be 1..={MAX_DIMS})"),
            });
        }
        let mut shape = [1u64; MAX_DIMS];
        for (d, s) in shape.iter_mut().enumerate().take(n_dims as usize) {
            *s = self.u64(&|| format!("dimension {d} of tensor '{name}'"))?;
        }
        let ty_id = self.u32(&|| format!("type of tensor '{name}'"))?;
        let dtype = GgmlType::from_id(ty_id)
            .ok_or_else(|| Error::UnknownTensorType { tensor: name.clone(), id: ty_id })?;
        let offset = self.u64(&|| format!("data offset of tensor '{name}'"))?;
        // Element count and byte size with overflow checks.
        let mut n_elems: u64 = 1;
        for &s in &shape {
            n_elems = n_elems.checked_mul(s).ok_or_else(|| Error::Invalid {
                field: format!("shape of tensor '{name}'"),
                reason: format!("{shape:?} overflows"),
            })?;
        }
        let row_bytes = dtype.row_bytes(shape[0]).ok_or_else(|| Error::Invalid {
            field: format!("shape of tensor '{name}'"),
            reason: format!(
                "first dimension {} is not a multiple of the {} block size {}",
                shape[0],
                dtype,
                dtype.block_size()
            ),
        })?;
        let n_bytes = row_bytes.checked_mul(n_elems / shape[0].max(1)).ok_or_else(|| Error::Invalid {
            field: format!("shape of tensor '{name}'"),
            reason: "byte size overflows".into(),
        })?;
        Ok(TensorInfo { name, n_dims: n_dims as usize, shape, dtype, offset, n_bytes })
    }
}
