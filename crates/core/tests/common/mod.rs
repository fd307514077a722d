//! Shared helpers for the core crate's integration tests.

#![allow(dead_code)]

/// `n` deterministic values in [-1, 1] (xorshift from `seed`).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 20001) as f32 / 10000.0 - 1.0
        })
        .collect()
}
