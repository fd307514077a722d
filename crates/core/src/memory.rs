//! The memory manager: pools allocated once, up front, each tagged with the NUMA node it lives
//! on. Large pools are anonymous mappings with transparent huge pages requested; on a NUMA
//! machine a pool can be bound to a node with `mbind` (raw syscall: glibc has no wrapper).
//!
//! Pages are faulted in when a pool is created (except the worst-case-sized logits buffer) (`MADV_POPULATE_WRITE`, or a write per page on
//! kernels without it), so the first request does not pay for page faults and zeroing — at two
//! threads that was 15 % of a first 512-token prefill.
//!
//! Invariant: nothing here is allocated on the per-token path; pools are created at load and
//! only viewed afterwards.

use std::ptr::NonNull;

const ALIGN: usize = 64;
const HUGE_THRESHOLD: usize = 4 << 20;

/// A zero-initialised, 64-byte-aligned block of memory.
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    mapped: bool,
    /// NUMA node the pages were bound to, if any.
    pub node: Option<usize>,
}

// SAFETY: a Buffer owns its memory exclusively; concurrent access is coordinated by the
// scheduler (disjoint writes per thread, barriers between nodes).
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

/// A pool could not be allocated.
#[derive(Debug, thiserror::Error)]
#[error("cannot allocate {bytes} bytes ({gib:.2} GiB)")]
pub struct AllocError {
    pub bytes: usize,
    pub gib: f64,
}

impl Buffer {
    /// Allocate `len` bytes (at least one cache line), on `node` if given, every page faulted in.
    pub fn new(len: usize, node: Option<usize>) -> Result<Buffer, AllocError> {
        Self::alloc(len, node, true)
    }

    /// [`Buffer::new`] whose pages are faulted in on first use: for buffers sized for a worst
    /// case that most passes touch a small part of (the logits of every row of a batch).
    pub fn lazy(len: usize, node: Option<usize>) -> Result<Buffer, AllocError> {
        Self::alloc(len, node, false)
    }

    fn alloc(len: usize, node: Option<usize>, populate: bool) -> Result<Buffer, AllocError> {
        let err = || AllocError { bytes: len, gib: len as f64 / (1u64 << 30) as f64 };
        let len = len.max(ALIGN).checked_next_multiple_of(ALIGN).ok_or_else(err)?;
        if len >= HUGE_THRESHOLD {
            if let Some(b) = Self::mmap(len, node, populate) {
                return Ok(b);
            }
        }
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).map_err(|_| err())?;
        // SAFETY: layout has non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or_else(err)?;
        if populate {
            // SAFETY: p is valid for len bytes, just allocated and zeroed.
            unsafe { touch_pages(p, len) };
        }
        Ok(Buffer { ptr, len, mapped: false, node: None })
    }

    #[cfg(target_os = "linux")]
    fn mmap(len: usize, node: Option<usize>, populate: bool) -> Option<Buffer> {
        // SAFETY: anonymous private mapping; checked for MAP_FAILED; madvise/mbind only affect
        // the range we just mapped.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return None;
            }
            libc::madvise(p, len, libc::MADV_HUGEPAGE);
            let mut bound = None;
            if let Some(n) = node.filter(|&n| n < 64) {
                const MPOL_BIND: libc::c_long = 2;
                let mask: u64 = 1 << n;
                let r = libc::syscall(libc::SYS_mbind, p, len, MPOL_BIND, &mask as *const u64, 65usize, 0usize);
                if r == 0 {
                    bound = Some(n);
                }
            }
            // After mbind, so the pages come from the bound node.
            if populate && libc::madvise(p, len, libc::MADV_POPULATE_WRITE) != 0 {
                touch_pages(p as *mut u8, len);
            }
            Some(Buffer { ptr: NonNull::new(p as *mut u8)?, len, mapped: true, node: bound })
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn mmap(_len: usize, _node: Option<usize>, _populate: bool) -> Option<Buffer> {
        None
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes; &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Fault in every page of `[p, p + len)` by rewriting one zero byte per page.
///
/// # Safety
/// `p` is valid for reads and writes of `len` bytes, all zero, and nobody else uses them yet.
unsafe fn touch_pages(p: *mut u8, len: usize) {
    const PAGE: usize = 4096;
    for off in (0..len).step_by(PAGE) {
        // SAFETY: off < len; volatile so the store is not elided (the byte is already zero).
        unsafe { std::ptr::write_volatile(p.add(off), 0) };
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: ptr/len come from the matching allocation call in `new`.
        unsafe {
            if self.mapped {
                #[cfg(target_os = "linux")]
                libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len);
            } else {
                let layout = std::alloc::Layout::from_size_align_unchecked(self.len, ALIGN);
                std::alloc::dealloc(self.ptr.as_ptr(), layout);
            }
        }
    }
}

/// The activation pools of one engine: two buffers that layers use alternately (layer `il`
/// writes into buffer `il % 2` and reads its input from the other), plus the output buffer
/// that holds the logits of the rows asked for.
pub struct Pools {
    pub act: [Buffer; 2],
    pub out: Buffer,
}

impl Pools {
    pub fn new(act_bytes: [usize; 2], out_bytes: usize, node: Option<usize>) -> Result<Pools, AllocError> {
        Ok(Pools {
            act: [Buffer::new(act_bytes[0], node)?, Buffer::new(act_bytes[1], node)?],
            // Sized for the logits of every row; most passes want one row's.
            out: Buffer::lazy(out_bytes, node)?,
        })
    }
}
