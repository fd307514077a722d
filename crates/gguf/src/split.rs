//! Models split across files, as llama.cpp's `gguf-split` writes them: `NAME-00001-of-0000N.gguf`
//! and its siblings, every file with `split.no`, `split.count` and `split.tensors.count`, the
//! first with the model's metadata, each with its share of the tensors. A model is opened from
//! its first file, as in llama.cpp.
//!
//! The files are mapped side by side in one reserved range of addresses, each at a page
//! boundary, so the model is one byte range as a single file is: every tensor's offset is
//! rebased onto that range (from the first file's data section), nothing is copied, and pages
//! can still be dropped and faulted back from their files.
//!
//! Invariant: every page of the range belongs to one file's mapping (no gaps), so the whole of
//! [`Joined`]'s slice can be read.

use crate::{Error, Gguf, Header, TensorInfo, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// `split.count`: 1 for a whole file.
pub(crate) fn count(h: &Header) -> Result<usize, Error> {
    match h.get("split.count") {
        None => Ok(1),
        Some(v) => v
            .as_u64()
            .filter(|&n| (1..=u16::MAX as u64).contains(&n))
            .map(|n| n as usize)
            .ok_or_else(|| invalid("split.count", format!("{v:?} is not a count of files"))),
    }
}

fn invalid(field: &str, reason: String) -> Error {
    Error::Invalid { field: field.to_string(), reason }
}

fn number(h: &Header, key: &str, file: &Path) -> Result<u64, Error> {
    h.get(key).and_then(Value::as_u64).ok_or_else(|| invalid(key, format!("missing, or not a whole number, in {}", file.display())))
}

/// The paths of all `n` files of a split model, from the first's (`NAME-00001-of-0000N.gguf`).
fn paths(first: &Path, n: usize) -> Result<Vec<PathBuf>, Error> {
    let tail = format!("-{:05}-of-{n:05}.gguf", 1);
    let prefix = first
        .to_str()
        .and_then(|s| s.strip_suffix(&tail))
        .ok_or_else(|| invalid("split file name", format!("{} is the first of {n} files but its name does not end in {tail}", first.display())))?;
    Ok((1..=n).map(|i| PathBuf::from(format!("{prefix}-{i:05}-of-{n:05}.gguf"))).collect())
}

/// The system's page size.
#[cfg(unix)]
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

/// Open a model split in `n` files from its first (`head`: the first file's header).
#[cfg(unix)]
pub(crate) fn open(first: &Path, head: Header, n: usize) -> Result<Gguf, Error> {
    let no = number(&head, "split.no", first)?;
    if no != 0 {
        return Err(invalid("split.no", format!("{} is file {} of {n}: open the model from its first file", first.display(), no + 1)));
    }
    let expected = number(&head, "split.tensors.count", first)?;
    let paths = paths(first, n)?;
    let joined = Joined::map(&paths)?;
    let in_file = |p: &Path, e: Error| Error::InSplit { path: p.display().to_string(), source: Box::new(e) };
    // The other files' headers, each checked against its place and the first file's alignment.
    let mut rest = Vec::with_capacity(n - 1);
    for (i, p) in paths.iter().enumerate().skip(1) {
        let h = Header::parse(joined.file(i)).map_err(|e| in_file(p, e))?;
        let no = number(&h, "split.no", p)?;
        if no != i as u64 {
            return Err(in_file(p, invalid("split.no", format!("{no}, expected {i}"))));
        }
        if h.alignment != head.alignment {
            return Err(in_file(p, invalid("general.alignment", format!("{}, the first file's is {}", h.alignment, head.alignment))));
        }
        rest.push(h);
    }
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut tensor_index = HashMap::new();
    for (i, (p, h)) in paths.iter().zip(std::iter::once(&head).chain(&rest)).enumerate() {
        // The file's data section as an offset from the first file's.
        let shift = (joined.starts[i] as u64 + h.data_start) - head.data_start;
        for t in &h.tensors {
            if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
                return Err(in_file(p, Error::Duplicate { what: "tensor", name: t.name.clone() }));
            }
            tensors.push(TensorInfo { offset: t.offset + shift, ..t.clone() });
        }
    }
    if tensors.len() as u64 != expected {
        return Err(invalid("split.tensors.count", format!("{expected} tensors, but the {n} files hold {}", tensors.len())));
    }
    let Header { version, alignment, metadata, index, data_start, .. } = head;
    Ok(Gguf::assemble(crate::Bytes::Joined(joined), Header { version, alignment, metadata, index, tensors, tensor_index, data_start }))
}

#[cfg(not(unix))]
pub(crate) fn open(first: &Path, _head: Header, n: usize) -> Result<Gguf, Error> {
    Err(invalid("split.count", format!("{} is the first of {n} files; split models are read on Unix only", first.display())))
}

/// Several files mapped read-only side by side: file `i` at `starts[i]`, `lens[i]` bytes, each
/// start a page boundary and each file's last page followed directly by the next file.
#[cfg(unix)]
pub(crate) struct Joined {
    base: *mut u8,
    len: usize,
    starts: Vec<usize>,
    lens: Vec<usize>,
}

// SAFETY: the range is mapped read-only for the Joined's whole life and never written, so
// shared reads from any thread are sound.
#[cfg(unix)]
unsafe impl Send for Joined {}
#[cfg(unix)]
unsafe impl Sync for Joined {}

#[cfg(unix)]
impl Joined {
    fn map(paths: &[PathBuf]) -> Result<Joined, Error> {
        use std::os::fd::AsRawFd;
        fn io(p: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
            move |source| Error::Io { path: p.display().to_string(), source }
        }
        let mut files = Vec::with_capacity(paths.len());
        for p in paths {
            let f = std::fs::File::open(p).map_err(io(p))?;
            let len = f.metadata().map_err(io(p))?.len() as usize;
            if len == 0 {
                return Err(Error::InSplit { path: p.display().to_string(), source: Box::new(invalid("file", "it is empty".into())) });
            }
            files.push((f, len));
        }
        let page = page_size();
        let mut starts = Vec::with_capacity(files.len());
        let mut total = 0usize;
        for (_, len) in &files {
            starts.push(total);
            total += len.div_ceil(page) * page;
        }
        // SAFETY: a fresh reservation of addresses, placed by the kernel: it replaces nothing.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), total, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0) };
        if base == libc::MAP_FAILED {
            return Err(io(&paths[0])(std::io::Error::last_os_error()));
        }
        let joined = Joined { base: base as *mut u8, len: total, starts, lens: files.iter().map(|f| f.1).collect() };
        for (i, (f, len)) in files.iter().enumerate() {
            // SAFETY: [base + start, base + start + len) lies inside the reservation above, which
            // this Joined owns (MAP_FIXED replaces only those pages of it); the file is mapped
            // private and read-only from its start. On error `joined` unmaps the whole range.
            let at = unsafe { joined.base.add(joined.starts[i]) } as *mut libc::c_void;
            let p = unsafe { libc::mmap(at, *len, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_FIXED, f.as_raw_fd(), 0) };
            if p == libc::MAP_FAILED {
                return Err(io(&paths[i])(std::io::Error::last_os_error()));
            }
        }
        Ok(joined)
    }

    /// File `i`'s bytes.
    fn file(&self, i: usize) -> &[u8] {
        &self[self.starts[i]..self.starts[i] + self.lens[i]]
    }

    /// Fault every page in now (`MADV_POPULATE_READ`); whether the kernel did.
    #[cfg(target_os = "linux")]
    pub(crate) fn populate(&self) -> bool {
        // SAFETY: advice on our own mapped range; it changes no contents.
        unsafe { libc::madvise(self.base as *mut libc::c_void, self.len, libc::MADV_POPULATE_READ) == 0 }
    }

    /// Drop the pages of `start .. start + len` (`MADV_DONTNEED`; whole pages, inside the
    /// range): a later read faults them back in from their file.
    #[cfg(target_os = "linux")]
    pub(crate) fn drop_pages(&self, start: usize, len: usize) {
        debug_assert!(start.is_multiple_of(page_size()) && start + len <= self.len);
        // SAFETY: whole pages of our own read-only private file mappings, which hold no
        // changes of ours: dropping them only means rereading them from the files.
        unsafe { libc::madvise(self.base.add(start) as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    }
}

#[cfg(unix)]
impl std::ops::Deref for Joined {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: every page of [base, base + len) is mapped readable (module invariant) for
        // the Joined's life.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }
}

#[cfg(unix)]
impl Drop for Joined {
    fn drop(&mut self) {
        // SAFETY: the range was reserved by `map` and is unmapped once, here.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

#[cfg(all(test, unix))]
mod tests {
    use crate::writer::Writer;
    use crate::{Error, GgmlType, Gguf, Value};
    use std::path::PathBuf;

    /// A model of five F32 tensors, whole and as `gguf-split` would write it in three files
    /// (the first with the metadata, 2 + 2 + 1 tensors) under `dir`; the first file's path.
    fn write(dir: &str, n_files: usize, tensors_count: u64) -> (Gguf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("corelm-split-{}-{dir}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let shapes: [&[u64]; 5] = [&[7], &[64, 3], &[1000], &[5, 5], &[33, 2]];
        let data = |i: usize, n: u64| (0..n).flat_map(|j| ((i * 1000) as f32 + j as f32).to_le_bytes()).collect::<Vec<u8>>();
        let meta = |w: &mut Writer| {
            w.kv("general.architecture", Value::String("llama".into()));
            w.kv("general.name", Value::String("split test".into()));
        };
        let mut whole = Writer::new();
        meta(&mut whole);
        for (i, s) in shapes.iter().enumerate() {
            whole.tensor(&format!("t{i}"), s, GgmlType::F32, data(i, s.iter().product()));
        }
        let per_file = [vec![0, 1], vec![2, 3], vec![4]];
        for (f, ts) in per_file.iter().enumerate().take(n_files) {
            let mut w = Writer::new();
            if f == 0 {
                meta(&mut w);
            }
            w.kv("split.no", Value::U16(f as u16));
            w.kv("split.count", Value::U16(n_files as u16));
            w.kv("split.tensors.count", Value::I32(tensors_count as i32));
            for &i in ts {
                w.tensor(&format!("t{i}"), shapes[i], GgmlType::F32, data(i, shapes[i].iter().product()));
            }
            std::fs::write(dir.join(format!("m-{:05}-of-{n_files:05}.gguf", f + 1)), w.to_bytes()).unwrap();
        }
        (Gguf::from_bytes(whole.to_bytes()).unwrap(), dir.join(format!("m-00001-of-{n_files:05}.gguf")))
    }

    #[test]
    fn a_split_model_reads_as_the_whole_file() {
        let (whole, first) = write("ok", 3, 5);
        let g = Gguf::open(&first).unwrap();
        assert_eq!(g.str("general.name").unwrap(), "split test");
        assert_eq!(g.tensors.len(), 5);
        for t in &whole.tensors {
            let s = g.tensor(&t.name).unwrap();
            assert_eq!((s.shape, s.dtype), (t.shape, t.dtype));
            assert_eq!(g.tensor_data(s), whole.tensor_data(t), "{}", t.name);
            // As the engine addresses weights: the data section's start plus the offset.
            let at = (g.data_start() + s.offset) as usize;
            assert_eq!(&g.bytes()[at..at + s.n_bytes as usize], whole.tensor_data(t));
        }
        // Every byte of the joined range reads (no unmapped gaps); pages dropped come back.
        assert!(g.bytes().iter().map(|&b| b as u64).sum::<u64>() > 0);
        g.release(0, g.bytes().len());
        assert_eq!(g.tensor_data(g.tensor("t2").unwrap()), whole.tensor_data(whole.tensor("t2").unwrap()));
        assert!(g.populate());

        // Opened from another file of the set: refused, naming the first.
        let second = first.with_file_name("m-00002-of-00003.gguf");
        let e = Gguf::open(&second).err().unwrap().to_string();
        assert!(e.contains("file 2 of 3") && e.contains("first file"), "{e}");
        // A missing file is named.
        let third = first.with_file_name("m-00003-of-00003.gguf");
        std::fs::remove_file(&third).unwrap();
        let e = Gguf::open(&first).err().unwrap().to_string();
        assert!(e.contains("m-00003-of-00003.gguf"), "{e}");
        std::fs::remove_dir_all(first.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_split_model_missing_tensors_or_misnamed_is_refused() {
        let (_, first) = write("count", 3, 6);
        let e = Gguf::open(&first).err().unwrap();
        assert!(matches!(&e, Error::Invalid { field, .. } if field == "split.tensors.count"), "{e}");
        let renamed = first.with_file_name("m-first.gguf");
        std::fs::rename(&first, &renamed).unwrap();
        let e = Gguf::open(&renamed).err().unwrap().to_string();
        assert!(e.contains("-00001-of-00003.gguf"), "{e}");
        std::fs::remove_dir_all(first.parent().unwrap()).unwrap();
    }
}
