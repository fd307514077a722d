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
