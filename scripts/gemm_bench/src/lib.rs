//! What the harness's timers share: their random operands.

/// Uniform values in [-1, 1) from a fixed seed (xorshift), so runs time the same operands.
pub fn uniform() -> impl FnMut() -> f32 {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}
