// Byte access to raw GGML blocks in the storage buffer `W` (declared by each shader that
// includes this file).

// Byte i of the weight buffer.
fn b8(i: u32) -> u32 {
    return (W[i >> 2u] >> ((i & 3u) << 3u)) & 0xffu;
}

// The 4 bytes at i (any alignment), little-endian.
fn w32(i: u32) -> u32 {
    let sh = (i & 3u) << 3u;
    let lo = W[i >> 2u];
    if (sh == 0u) {
        return lo;
    }
    return (lo >> sh) | (W[(i >> 2u) + 1u] << (32u - sh));
}

// The f16 at byte i, widened.
fn f16at(i: u32) -> f32 {
    return unpack2x16float(b8(i) | (b8(i + 1u) << 8u)).x;
}

// Byte i as a signed value.
fn i8at(i: u32) -> f32 {
    return f32(i32(b8(i) << 24u) >> 24u);
}

// The four bytes of q, each masked to its low 4 bits (a word of nibbles after its shift).
fn nib4(q: u32) -> vec4<u32> {
    return vec4<u32>(q, q >> 8u, q >> 16u, q >> 24u) & vec4<u32>(15u);
}

// Bits 0, s, 2 s, 3 s of h, each as 0 or 1 << 4 (fifth bits; Q6_K: with mask 3, top bits).
fn high4(h: u32, s: u32, mask: u32) -> vec4<u32> {
    return ((vec4<u32>(h, h >> s, h >> (2u * s), h >> (3u * s)) & vec4<u32>(mask)) << vec4<u32>(4u));
}
