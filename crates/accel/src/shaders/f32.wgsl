// F32: 32 values of 4 bytes.
fn sub_dot(rb: u32, s: u32, xo: u32) -> f32 {
    let w = (rb + s * 128u) >> 2u;
    var acc = 0.0;
    for (var l = 0u; l < 32u; l++) {
        acc += bitcast<f32>(W[w + l]) * X[xo + l];
    }
    return acc;
}

// Values 4 i4 .. 4 i4 + 3 of sub-block s (the GEMM's loads).
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let w = ((rb + s * 128u) >> 2u) + 4u * i4;
    return vec4<f32>(bitcast<f32>(W[w]), bitcast<f32>(W[w + 1u]), bitcast<f32>(W[w + 2u]), bitcast<f32>(W[w + 3u]));
}
