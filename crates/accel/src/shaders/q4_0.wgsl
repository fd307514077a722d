// Q4_0 (18 bytes): d: f16, qs[16]: element j low nibble, j+16 high; value (q - 8) d.
fn sub_dot(rb: u32, s: u32, xo: u32) -> f32 {
    let b = rb + s * 18u;
    var acc = 0.0;
    for (var j = 0u; j < 16u; j += 4u) {
        let q = w32(b + 2u + j);
        for (var k = 0u; k < 4u; k++) {
            let v = (q >> (8u * k)) & 0xffu;
            acc += (f32(v & 15u) - 8.0) * X[xo + j + k] + (f32(v >> 4u) - 8.0) * X[xo + j + k + 16u];
        }
    }
    return f16at(b) * acc;
}

// Values 4 i4 .. 4 i4 + 3 of sub-block s (the GEMM's loads): low nibbles of qs[4 i4 ..] for
// i4 < 4, high nibbles of qs[4 (i4 - 4) ..] after.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 18u;
    let q = w32(b + 2u + 4u * (i4 % 4u)) >> ((i4 / 4u) * 4u);
    let d = f16at(b);
    return (vec4<f32>(nib4(q)) - 8.0) * d;
}
