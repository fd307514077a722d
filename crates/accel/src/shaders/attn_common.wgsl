// What both attention shaders share (device.rs prepends it): the shape, each token's position
// and block table, and a cache row through a table.
struct AttnParams {
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    scale: f32,
    window: u32, // a sliding window's positions (0: none)
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(4) var<storage, read> Pos: array<i32>;
// [n_tokens] offsets of each token's block table in the rest of the array, then the tables.
@group(0) @binding(5) var<storage, read> Tab: array<u32>;
@group(0) @binding(6) var<uniform> A: AttnParams;

const BLOCK: u32 = 16u;

// The cache row of position p through the table at offset toff (row of position p:
// table[p / 16] · 16 + p % 16, as the CPU's cache lays them out).
fn cache_row(toff: u32, p: u32) -> u32 {
    return Tab[A.n_tokens + toff + p / BLOCK] * BLOCK + p % BLOCK;
}
