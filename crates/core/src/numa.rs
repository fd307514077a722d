//! NUMA placement through the kernel's own calls — `mbind` to place a range, and three ways to
//! read placement back: `move_pages` (where each page is, queried without moving),
//! `get_mempolicy` (the policy of an address) and `/proc/self/numa_maps` (the kernel's summary
//! line per mapping). glibc has no wrappers and `libnuma` is not linked: raw `syscall`s, with
//! the `MPOL_*` constants written out.
//!
//! Placement is verified, not assumed: `memory`'s tests and `scripts/numa_qemu.sh` read it back.

use std::collections::BTreeMap;

pub const MPOL_DEFAULT: i32 = 0;
pub const MPOL_PREFERRED: i32 = 1;
pub const MPOL_BIND: i32 = 2;
pub const MPOL_INTERLEAVE: i32 = 3;
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;
/// Node masks cover this many nodes (Linux's default `CONFIG_NODES_SHIFT` ≤ 10).
pub const MAX_NODES: usize = 1024;
const WORDS: usize = MAX_NODES / 64;

/// A node mask as the kernel reads it (bit `n` = node `n`); `None` if a node is out of range.
fn mask(nodes: &[usize]) -> Option<[u64; WORDS]> {
    let mut m = [0u64; WORDS];
    for &n in nodes {
        if n >= MAX_NODES {
            return None;
        }
        m[n / 64] |= 1 << (n % 64);
    }
    Some(m)
}

/// Apply `mode` (`MPOL_BIND`, `MPOL_INTERLEAVE`, ...) over `nodes` to `[addr, addr + len)`,
/// before its pages are touched.
///
/// # Safety
/// `[addr, addr + len)` is a page-aligned range of this process's mappings.
#[cfg(target_os = "linux")]
pub unsafe fn mbind(addr: *mut u8, len: usize, mode: i32, nodes: &[usize]) -> std::io::Result<()> {
    let m = mask(nodes).ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the caller guarantees the range; the mask is WORDS*64 bits long and maxnode says
    // so (+1: the kernel counts one bit less than it is given).
    let r = unsafe { libc::syscall(libc::SYS_mbind, addr, len, mode as libc::c_long, m.as_ptr(), WORDS * 64 + 1, 0usize) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The policy of the page holding address `addr`: its mode and nodes.
#[cfg(target_os = "linux")]
pub fn policy_of(addr: usize) -> std::io::Result<(i32, Vec<usize>)> {
    let mut mode: libc::c_int = 0;
    let mut m = [0u64; WORDS];
    // SAFETY: mode and m are writable and m holds WORDS*64 bits, as maxnode says; with
    // MPOL_F_ADDR the kernel only looks the address up.
    let r = unsafe {
        libc::syscall(libc::SYS_get_mempolicy, &mut mode as *mut libc::c_int, m.as_mut_ptr(), WORDS * 64 + 1, addr as *const u8, MPOL_F_ADDR)
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let nodes = (0..MAX_NODES).filter(|&n| m[n / 64] >> (n % 64) & 1 == 1).collect();
    Ok((mode, nodes))
}

/// Where the pages of `[addr, addr + len)` are: node → pages, from `move_pages` in query mode
/// (no move). At most `max_samples` pages are asked about, evenly spaced; a page not yet
/// faulted in counts under `-ENOENT` (-2), other failures under their negative errno.
#[cfg(target_os = "linux")]
pub fn pages_per_node(addr: usize, len: usize, max_samples: usize) -> std::io::Result<BTreeMap<i32, usize>> {
    const PAGE: usize = 4096;
    let pages = len.div_ceil(PAGE).max(1);
    let step = pages.div_ceil(max_samples.max(1));
    let addrs: Vec<*const u8> = (0..pages).step_by(step).map(|p| (addr + p * PAGE) as *const u8).collect();
    let mut status = vec![0 as libc::c_int; addrs.len()];
    // SAFETY: addrs and status have equal lengths; nodes = NULL asks where pages are without
    // moving them; pid 0 is this process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0 as libc::c_int,
            addrs.len() as libc::c_ulong,
            addrs.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0 as libc::c_int,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = BTreeMap::new();
    for s in status {
        *out.entry(s).or_insert(0) += 1;
    }
    Ok(out)
}

/// The `/proc/self/numa_maps` line of the mapping that holds `addr` (policy, then
/// `N<node>=<pages>` counts), e.g. `7f12a0000000 bind:0 anon=2048 dirty=2048 N0=2048 kernelpagesize_kB=4`.
///
/// The kernel merges adjacent anonymous mappings with equal flags and policy into one, so a
/// buffer's mapping may start below the buffer (another thread's buffer beside it). Lines list
/// each mapping's start only; for a mapped `addr` the one holding it is the line with the
/// greatest start not above `addr`, found in one read. Its counts then cover merged neighbours.
#[cfg(target_os = "linux")]
pub fn numa_maps_line(addr: usize) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/numa_maps").ok()?;
    maps.lines()
        .filter_map(|l| Some((usize::from_str_radix(l.split_whitespace().next()?, 16).ok()?, l)))
        .filter(|&(start, _)| start <= addr)
        .max_by_key(|&(start, _)| start)
        .map(|(_, l)| l.to_string())
}

/// Pages per node that a `numa_maps` line reports (`N0=12 N1=40` → {0: 12, 1: 40}).
pub fn numa_maps_counts(line: &str) -> BTreeMap<usize, usize> {
    line.split_whitespace()
        .filter_map(|f| {
            let (n, c) = f.strip_prefix('N')?.split_once('=')?;
            Some((n.parse().ok()?, c.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_numa_maps_fields() {
        let m = mask(&[0, 3, 64, 1023]).unwrap();
        assert_eq!((m[0], m[1], m[15]), (0b1001, 1, 1 << 63));
        assert!(mask(&[1024]).is_none());
        let line = "7f00 interleave:0-1 anon=10 dirty=10 N0=6 N1=4 kernelpagesize_kB=4";
        assert_eq!(numa_maps_counts(line), BTreeMap::from([(0, 6), (1, 4)]));
    }
}
