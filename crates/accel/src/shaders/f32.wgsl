// F32: 32 values of 4 bytes.
fn sub_dot(rb: u32, s: u32, xo: u32) -> f32 {
    let w = (rb + s * 128u) >> 2u;
    var acc = 0.0;
    for (var l = 0u; l < 32u; l++) {
        acc += bitcast<f32>(W[w + l]) * X[xo + l];
    }
    return acc;
}
