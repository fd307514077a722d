// Q5_0 (22 bytes): d: f16, qh: u32 (bit j: fifth bit of element j), qs[16]; value (q - 16) d.
fn sub_dot(rb: u32, s: u32, xo: u32) -> f32 {
    let b = rb + s * 22u;
    let qh = w32(b + 2u);
    var acc = 0.0;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = w32(b + 6u + j);
        for (var k = 0u; k < 4u; k++) {
            let i = j + k;
            let v = (q >> (8u * k)) & 0xffu;
            let lo = (v & 15u) | (((qh >> i) & 1u) << 4u);
            let hi = (v >> 4u) | (((qh >> (i + 16u)) & 1u) << 4u);
            acc += (f32(lo) - 16.0) * X[xo + i] + (f32(hi) - 16.0) * X[xo + i + 16u];
        }
    }
    return f16at(b) * acc;
}

// Values e = 4 i4 .. 4 i4 + 3 of sub-block s (the GEMM's loads): nibbles as in Q4_0, fifth
// bit e of qh.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 22u;
    let h = w32(b + 2u) >> (4u * i4);
    let q = w32(b + 6u + 4u * (i4 % 4u)) >> ((i4 / 4u) * 4u);
    return (vec4<f32>(nib4(q) | high4(h, 1u, 1u)) - 16.0) * f16at(b);
}
