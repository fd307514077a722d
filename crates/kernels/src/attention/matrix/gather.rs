//! A cell's key read back from its column block as the row the row writer made (F16, Q8_0 or
//! Q4_0 bytes): the inverse of `store_key_at`, `store_key_q8_at` and `store_key_q4_at`, for
//! the few readers that need one key whole (a context shift rotating keys in place).

use super::model::C;
use super::widen::{Q4_BLOCK, Q8_BLOCK};

/// Cell `j`'s F16 key out of its column block at `block` (`[hd][16]` F16) into `key` (`hd` F16
/// as bytes).
///
/// # Safety
/// `block` points to `key.len() / 2 · 16` readable F16 that no one writes meanwhile; `j < 16`.
pub unsafe fn load_key_at(block: *const u8, j: usize, key: &mut [u8]) {
    debug_assert!(j < C);
    for (d, x) in key.chunks_exact_mut(2).enumerate() {
        // SAFETY: (d·16 + j)·2 + 2 ≤ key.len() · 16, inside the block (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(block.add((d * C + j) * 2), x.as_mut_ptr(), 2) };
    }
}

/// Cell `j`'s Q8_0 key out of its column block at `block` (`17 · hd` bytes) into `key` (one
/// Q8_0 row of `hd` values).
///
/// # Safety
/// `block` points to `17 · hd` readable bytes (`hd = key.len() / 34 · 32`) that no one writes
/// meanwhile; `j < 16`.
pub unsafe fn load_key_q8_at(block: *const u8, j: usize, key: &mut [u8]) {
    debug_assert!(j < C && key.len().is_multiple_of(Q8_BLOCK));
    let hd = key.len() / Q8_BLOCK * 32;
    for (b, blk) in key.chunks_exact_mut(Q8_BLOCK).enumerate() {
        // SAFETY: every offset is below 17·hd (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(block.add(hd * C + (b * C + j) * 2), blk.as_mut_ptr(), 2);
            for (i, q) in blk[2..].iter_mut().enumerate() {
                *q = *block.add((b * 32 + i) * C + j);
            }
        }
    }
}

/// Cell `j`'s Q4_0 key out of its column block at `block` (`9 · hd` bytes) into `key` (one
/// Q4_0 row of `hd` values).
///
/// # Safety
/// As [`load_key_q8_at`], for `9 · hd` bytes (`hd = key.len() / 18 · 32`).
pub unsafe fn load_key_q4_at(block: *const u8, j: usize, key: &mut [u8]) {
    debug_assert!(j < C && key.len().is_multiple_of(Q4_BLOCK));
    let hd = key.len() / Q4_BLOCK * 32;
    for (b, blk) in key.chunks_exact_mut(Q4_BLOCK).enumerate() {
        // SAFETY: every offset is below 9·hd (the caller's contract).
        let nib = |e: usize| unsafe {
            let byte = *block.add(((b * 32 + e) / 2) * C + j);
            if e.is_multiple_of(2) { byte & 0x0F } else { byte >> 4 }
        };
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(block.add(hd * C / 2 + (b * C + j) * 2), blk.as_mut_ptr(), 2) };
        for i in 0..16 {
            blk[2 + i] = nib(i) | nib(i + 16) << 4;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{store_key_at, store_key_q4_at, store_key_q8_at};
    use super::*;

    /// Sixteen keys of `hd` stored into one column block and read back, each as it went in.
    fn round_trip(row: usize, block: usize, store: unsafe fn(*mut u8, usize, &[u8]), load: unsafe fn(*const u8, usize, &mut [u8])) {
        let keys: Vec<Vec<u8>> = (0..C).map(|j| (0..row).map(|i| (i * 7 + j * 31 + 3) as u8).collect()).collect();
        let mut col = vec![0u8; block];
        for (j, k) in keys.iter().enumerate() {
            // SAFETY: `col` holds the block's bytes for this head dimension.
            unsafe { store(col.as_mut_ptr(), j, k) };
        }
        for (j, k) in keys.iter().enumerate() {
            let mut back = vec![0u8; row];
            // SAFETY: as above.
            unsafe { load(col.as_ptr(), j, &mut back) };
            assert_eq!(&back, k, "cell {j}");
        }
    }

    #[test]
    fn keys_come_back_from_their_columns_as_stored() {
        let hd = 64;
        round_trip(2 * hd, 2 * hd * C, store_key_at, load_key_at);
        round_trip(hd / 32 * Q8_BLOCK, 17 * hd, store_key_q8_at, load_key_q8_at);
        round_trip(hd / 32 * Q4_BLOCK, 9 * hd, store_key_q4_at, load_key_q4_at);
    }
}
