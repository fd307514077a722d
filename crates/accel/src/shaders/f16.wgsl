// F16: 32 values of 2 bytes (rows of whole 32-value groups are 4-byte aligned).
fn sub_dot(rb: u32, s: u32, xo: u32) -> f32 {
    let w = (rb + s * 64u) >> 2u;
    var acc = 0.0;
    for (var l = 0u; l < 16u; l++) {
        let v = unpack2x16float(W[w + l]);
        acc += v.x * X[xo + 2u * l] + v.y * X[xo + 2u * l + 1u];
    }
    return acc;
}
