// Q8_0 (34 bytes): d: f16, qs[32]: i8; value q d.
fn sub_dot(rb: u32, s: u32, xo: u32) -> f32 {
    let b = rb + s * 34u;
    var acc = 0.0;
    for (var j = 0u; j < 32u; j += 4u) {
        let q = w32(b + 2u + j);
        for (var k = 0u; k < 4u; k++) {
            let v = f32(i32(q << (24u - 8u * k)) >> 24u);
            acc += v * X[xo + j + k];
        }
    }
    return f16at(b) * acc;
}

// Values 4 i4 .. 4 i4 + 3 of sub-block s (the GEMM's loads).
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 34u;
    let q = w32(b + 2u + 4u * i4);
    let v = vec4<i32>(i32(q << 24u), i32(q << 16u), i32(q << 8u), i32(q)) >> vec4<u32>(24u);
    return vec4<f32>(v) * f16at(b);
}
