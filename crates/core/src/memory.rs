//! The memory manager: pools allocated once, up front, each tagged with where it lives
//! ([`Place`]: anywhere, bound to one NUMA node, or interleaved over several). Large pools, and
//! every placed one, are anonymous mappings with transparent huge pages requested, placed with
//! `mbind` (`crate::numa`) before their first page is touched; a placement the kernel refuses
//! (a node that does not exist) is an error, never a silently unplaced buffer.
//!
//! Pages are faulted in when a pool is created (`MADV_POPULATE_WRITE`, or a write per page on
//! kernels without it; [`Buffer::lazy`] for the worst-case-sized logits buffer), so the first
//! request does not pay for page faults and zeroing — at two threads that was 15 % of a first
//! 512-token prefill. A pool larger than the memory the kernel
//! reports available (`MemAvailable`) is refused with an [`AllocError`] at load, where faulting
//! it in would have ended in the OOM killer.
//!
//! Invariant: nothing here is allocated on the per-token path; pools are created at load and
//! only viewed afterwards.

use std::ptr::NonNull;

const ALIGN: usize = 64;
const HUGE_THRESHOLD: usize = 4 << 20;

/// Where a buffer's pages live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Place {
    /// The kernel's default: first touch (the node of the thread that faults a page in).
    #[default]
    Any,
    /// Bound to one node (`MPOL_BIND`).
    Node(usize),
    /// Pages spread round-robin over these nodes (`MPOL_INTERLEAVE`).
    Interleave(Vec<usize>),
    /// Consecutive parts of one buffer placed separately: part `i` runs from its byte offset
    /// (the first at 0, offsets increasing) to the next one's, each boundary rounded down to a
    /// page; a part's place is not itself `Parts`. Tensor-parallel shards' weight copies and KV
    /// rows, each on its node.
    Parts(Vec<(usize, Place)>),
}

impl Place {
    /// The kernel policy (`MPOL_*`) and nodes of a simple place; `None` for `Any`.
    #[cfg(target_os = "linux")]
    fn policy(&self) -> Option<(i32, &[usize])> {
        match self {
            Place::Any | Place::Parts(_) => None,
            Place::Node(n) => Some((crate::numa::MPOL_BIND, std::slice::from_ref(n))),
            Place::Interleave(nodes) => Some((crate::numa::MPOL_INTERLEAVE, nodes)),
        }
    }
}

/// A zero-initialised, 64-byte-aligned block of memory.
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    mapped: bool,
    /// Where the kernel was told to put the pages (always what was asked for: a refused
    /// placement fails the allocation).
    pub place: Place,
}

// SAFETY: a Buffer owns its memory exclusively; concurrent access is coordinated by the
// scheduler (disjoint writes per thread, barriers between nodes).
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

/// A pool could not be allocated (or placed where it was asked to be).
#[derive(Debug, thiserror::Error)]
#[error("cannot allocate {bytes} bytes ({gib:.2} GiB){}", cause.as_ref().map(|c| format!(": {c}")).unwrap_or_default())]
pub struct AllocError {
    pub bytes: usize,
    pub gib: f64,
    /// Why, where it is not simply a lack of memory.
    pub cause: Option<String>,
}

impl AllocError {
    pub fn new(bytes: usize) -> AllocError {
        AllocError { bytes, gib: bytes as f64 / (1u64 << 30) as f64, cause: None }
    }
}

impl Buffer {
    /// Allocate `len` bytes (at least one cache line), placed as `place` says, every page
    /// faulted in.
    pub fn new(len: usize, place: &Place) -> Result<Buffer, AllocError> {
        Self::alloc(len, place, true)
    }

    /// [`Buffer::new`] whose pages are faulted in on first use: for buffers sized for a worst
    /// case that most passes touch a small part of (the logits of every row of a batch).
    pub fn lazy(len: usize, place: &Place) -> Result<Buffer, AllocError> {
        Self::alloc(len, place, false)
    }

    /// The node the pages are bound to, if one.
    pub fn node(&self) -> Option<usize> {
        match self.place {
            Place::Node(n) => Some(n),
            _ => None,
        }
    }

    fn alloc(len: usize, place: &Place, populate: bool) -> Result<Buffer, AllocError> {
        let err = || AllocError::new(len);
        let len = len.max(ALIGN).checked_next_multiple_of(ALIGN).ok_or_else(err)?;
        // A placed buffer must be a mapping of its own, whatever its size: placement is per page.
        if len >= HUGE_THRESHOLD || *place != Place::Any {
            match Self::mmap(len, place, populate) {
                Mapped::Ok(b) => return Ok(b),
                // The kernel could not back the pages: fail now, not in a request.
                Mapped::NoMemory => return Err(err()),
                Mapped::Refused(cause) => return Err(AllocError { cause: Some(cause), ..err() }),
                Mapped::Unavailable => {}
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
        Ok(Buffer { ptr, len, mapped: false, place: Place::Any })
    }

    #[cfg(target_os = "linux")]
    fn mmap(len: usize, place: &Place, populate: bool) -> Mapped {
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
                return Mapped::Unavailable;
            }
            libc::madvise(p, len, libc::MADV_HUGEPAGE);
            // Each part from its page-rounded start to the next part's (a simple place: one part).
            let parts = match place {
                Place::Parts(parts) => parts.clone(),
                _ => vec![(0, place.clone())],
            };
            const PAGE: usize = 4096;
            for (i, (start, part)) in parts.iter().enumerate() {
                let a = if i == 0 { 0 } else { start / PAGE * PAGE };
                let b = parts.get(i + 1).map_or(len, |(s, _)| s / PAGE * PAGE).min(len);
                let Some((mode, nodes)) = part.policy().filter(|_| b > a) else { continue };
                if let Err(e) = crate::numa::mbind((p as *mut u8).add(a), b - a, mode, nodes) {
                    libc::munmap(p, len);
                    return Mapped::Refused(format!("placing it {place:?} (mbind: {e})"));
                }
            }
            // Faulting in more than the kernel can hand out would end in the OOM killer, not in
            // an error: refuse up front.
            if populate && ensure_available(len).is_err() {
                libc::munmap(p, len);
                return Mapped::NoMemory;
            }
            // After mbind, so the pages come from the bound node. Kernels before 5.14 lack the
            // advice (EINVAL): touch the pages instead. Any other failure means the pages
            // cannot be backed.
            if populate && libc::madvise(p, len, libc::MADV_POPULATE_WRITE) != 0 {
                if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                    libc::munmap(p, len);
                    return Mapped::NoMemory;
                }
                touch_pages(p as *mut u8, len);
            }
            match NonNull::new(p as *mut u8) {
                Some(ptr) => Mapped::Ok(Buffer { ptr, len, mapped: true, place: place.clone() }),
                None => Mapped::Unavailable,
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn mmap(_len: usize, _place: &Place, _populate: bool) -> Mapped {
        Mapped::Unavailable
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

/// `MemAvailable` of /proc/meminfo in bytes: what the kernel can still give without swapping.
#[cfg(target_os = "linux")]
fn mem_available() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(not(target_os = "linux"))]
fn mem_available() -> Option<usize> {
    None
}

/// Refuse `bytes` of buffers about to be created together (populated) when they exceed what
/// the kernel reports available. Each [`Buffer::new`] checks only itself against what is left,
/// so a set of buffers that fits one by one but not together was found out only after most of
/// memory had been faulted in: 44 s for the KV cache of `-c 2000000` on SmolLM2.
pub fn ensure_available(bytes: usize) -> Result<(), AllocError> {
    match mem_available() {
        Some(avail) if bytes > avail => Err(AllocError::new(bytes)),
        _ => Ok(()),
    }
}

/// What [`Buffer::mmap`] got.
enum Mapped {
    Ok(Buffer),
    /// No mapping (not Linux, or `mmap` refused): use the allocator instead.
    Unavailable,
    /// Mapped, but its pages could not be faulted in: out of memory.
    NoMemory,
    /// The kernel refused the placement (why).
    Refused(String),
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

/// How each of the two activation buffers is cut into regions, one after another: region 0
/// holds the results of serial nodes, region `1 + s` those of tensor-parallel shard `s`'s
/// nodes (ArcLight's per-node pools: a shard's activations are written and read by its own
/// node's workers, so they live on that node). Each region is a whole number of pages, so it
/// can be bound on its own. A graph without shards has one region per buffer.
///
/// Invariant: every graph an engine runs uses the layout its pools were made with (planned
/// from the largest batch, whose regions bound every smaller batch's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActLayout {
    /// Bytes of each region of each buffer.
    pub regions: [Vec<usize>; 2],
}

impl ActLayout {
    /// Regions' granularity: the page `mbind` places.
    pub const PAGE: usize = 4096;

    /// Regions holding `peaks` bytes each, rounded up to whole pages.
    pub fn from_peaks(peaks: &[Vec<usize>; 2]) -> ActLayout {
        ActLayout { regions: peaks.clone().map(|v| v.into_iter().map(|b| b.div_ceil(Self::PAGE) * Self::PAGE).collect()) }
    }

    /// Regions that hold either layout's (each region the larger of the two).
    pub fn max(&self, other: &ActLayout) -> ActLayout {
        let merge = |a: &Vec<usize>, b: &Vec<usize>| (0..a.len().max(b.len())).map(|r| a.get(r).copied().unwrap_or(0).max(b.get(r).copied().unwrap_or(0))).collect();
        ActLayout { regions: [merge(&self.regions[0], &other.regions[0]), merge(&self.regions[1], &other.regions[1])] }
    }

    /// Bytes of buffer `buf`.
    pub fn bytes(&self, buf: usize) -> usize {
        self.regions[buf].iter().sum()
    }

    /// Byte range of region `region` of buffer `buf` (empty past the last region).
    pub fn range(&self, buf: usize, region: usize) -> std::ops::Range<usize> {
        let r = &self.regions[buf];
        let start: usize = r.iter().take(region).sum();
        start..start + r.get(region).copied().unwrap_or(0)
    }

    /// Where buffer `buf` lives: region 0 as `shared`, shard `s`'s region as `shards[s]`; all
    /// of it as `shared` when there are no shard places (or no shard regions).
    pub fn place(&self, buf: usize, shared: &Place, shards: &[Place]) -> Place {
        let n = self.regions[buf].len();
        if n <= 1 || shards.len() + 1 != n {
            return shared.clone();
        }
        let parts = std::iter::once((0, shared.clone()))
            .chain(shards.iter().enumerate().map(|(s, p)| (self.range(buf, s + 1).start, p.clone())))
            .collect();
        Place::Parts(parts)
    }
}

/// The activation pools of one engine: two buffers that layers use alternately (layer `il`
/// writes into buffer `il % 2` and reads its input from the other), each cut into regions
/// as [`ActLayout`] says, plus the output buffer that holds the logits of the rows asked for.
pub struct Pools {
    pub act: [Buffer; 2],
    pub out: Buffer,
    pub layout: ActLayout,
}

impl Pools {
    /// Pools for graphs of `layout`: serial regions and the output buffer placed as `shared`,
    /// shard `s`'s regions as `shards[s]` (none: everything as `shared`).
    pub fn new(layout: &ActLayout, out_bytes: usize, shared: &Place, shards: &[Place]) -> Result<Pools, AllocError> {
        let buf = |b: usize| Buffer::new(layout.bytes(b), &layout.place(b, shared, shards));
        Ok(Pools {
            act: [buf(0)?, buf(1)?],
            // Sized for the logits of every row; most passes want one row's.
            out: Buffer::lazy(out_bytes, shared)?,
            layout: layout.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_and_sized() {
        for len in [1usize, 100, 5 << 20] {
            for b in [Buffer::new(len, &Place::Any).unwrap(), Buffer::lazy(len, &Place::Any).unwrap()] {
                assert!(b.len() >= len && b.len().is_multiple_of(ALIGN));
                assert_eq!(b.as_ptr() as usize % ALIGN, 0);
                assert!(b.as_slice().iter().all(|&x| x == 0));
            }
        }
    }

    /// Regions are whole pages, one after another; with shard places a buffer is placed by
    /// parts (serial region first), without them whole.
    #[test]
    fn activation_regions_are_pages_in_order() {
        let l = ActLayout::from_peaks(&[vec![100, 4096, 0], vec![5000, 1, 1]]);
        assert_eq!(l.regions, [vec![4096, 4096, 0], vec![8192, 4096, 4096]]);
        assert_eq!((l.bytes(0), l.bytes(1)), (8192, 16384));
        assert_eq!((l.range(1, 0), l.range(1, 2), l.range(1, 3)), (0..8192, 12288..16384, 16384..16384));
        let shards = [Place::Node(0), Place::Node(1)];
        assert_eq!(l.place(1, &Place::Any, &shards), Place::Parts(vec![(0, Place::Any), (8192, Place::Node(0)), (12288, Place::Node(1))]));
        assert_eq!(l.place(1, &Place::Any, &[]), Place::Any);
        let one = ActLayout::from_peaks(&[vec![10], vec![0]]);
        assert_eq!(one.place(0, &Place::Node(3), &shards), Place::Node(3));
    }

    /// A set of buffers larger than available memory together is refused before any is made.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_set_larger_than_available_memory_is_refused_up_front() {
        let avail = mem_available().expect("/proc/meminfo has MemAvailable");
        assert_eq!(ensure_available(avail + (1 << 30)).expect_err("an error").bytes, avail + (1 << 30));
        assert!(ensure_available(1 << 20).is_ok());
    }

    /// Faulting in more than the kernel can give would end in the OOM killer; a pool that large
    /// must be a clear error at load instead.
    #[cfg(target_os = "linux")]
    #[test]
    fn populating_more_than_available_memory_is_an_error() {
        let avail = mem_available().expect("/proc/meminfo has MemAvailable");
        let e = Buffer::new(avail + (1 << 30), &Place::Any).err().expect("an error, not a populated buffer");
        assert_eq!(e.bytes, avail + (1 << 30));
    }
}
