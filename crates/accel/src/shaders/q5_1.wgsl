// Q5_1 (24 bytes): d, m: f16, qh: u32, qs[16]; value q d + m.
fn sub_dot(rb: u32, s: u32, xo: u32) -> f32 {
    let b = rb + s * 24u;
    let qh = w32(b + 4u);
    var acc = 0.0;
    var sx = 0.0;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = w32(b + 8u + j);
        for (var k = 0u; k < 4u; k++) {
            let i = j + k;
            let v = (q >> (8u * k)) & 0xffu;
            let lo = (v & 15u) | (((qh >> i) & 1u) << 4u);
            let hi = (v >> 4u) | (((qh >> (i + 16u)) & 1u) << 4u);
            let x0 = X[xo + i];
            let x1 = X[xo + i + 16u];
            acc += f32(lo) * x0 + f32(hi) * x1;
            sx += x0 + x1;
        }
    }
    return f16at(b) * acc + f16at(b + 2u) * sx;
}

// Values e = 4 i4 .. 4 i4 + 3 of sub-block s (the GEMM's loads), bits as in Q5_0.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 24u;
    let h = w32(b + 4u) >> (4u * i4);
    let q = w32(b + 8u + 4u * (i4 % 4u)) >> ((i4 / 4u) * 4u);
    return vec4<f32>(nib4(q) | high4(h, 1u, 1u)) * f16at(b) + f16at(b + 2u);
}
