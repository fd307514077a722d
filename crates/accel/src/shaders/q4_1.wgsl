// Q4_1 (20 bytes): d, m: f16, qs[16]; value q d + m.
fn sub_dot(rb: u32, s: u32, xo: u32) -> f32 {
    let b = rb + s * 20u;
    var acc = 0.0;
    var sx = 0.0;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = w32(b + 4u + j);
        for (var k = 0u; k < 4u; k++) {
            let v = (q >> (8u * k)) & 0xffu;
            let x0 = X[xo + j + k];
            let x1 = X[xo + j + k + 16u];
            acc += f32(v & 15u) * x0 + f32(v >> 4u) * x1;
            sx += x0 + x1;
        }
    }
    return f16at(b) * acc + f16at(b + 2u) * sx;
}

// Values 4 i4 .. 4 i4 + 3 of sub-block s (the GEMM's loads), nibbles as in Q4_0.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 20u;
    let q = w32(b + 4u + 4u * (i4 % 4u)) >> ((i4 / 4u) * 4u);
    return vec4<f32>(nib4(q)) * f16at(b) + f16at(b + 2u);
}
