// Q4_K (144 bytes per 256): d, dmin: f16, scales[12], qs[128]. Sub-block j (of 8) reads the
// low (j even) or high nibbles of qs[32 (j / 2) ..]; value d sc q - dmin m.
fn sub_dot(rb: u32, s: u32, xo: u32) -> f32 {
    let b = rb + (s / 8u) * 144u;
    let j = s % 8u;
    let sm = scale_min_k4(j, b + 4u);
    let qs = b + 16u + (j / 2u) * 32u;
    let shift = (j % 2u) * 4u;
    var acc = 0.0;
    var sx = 0.0;
    for (var l = 0u; l < 32u; l += 4u) {
        let q = w32(qs + l);
        for (var k = 0u; k < 4u; k++) {
            let x = X[xo + l + k];
            acc += f32((q >> (8u * k + shift)) & 15u) * x;
            sx += x;
        }
    }
    return f16at(b) * sm.x * acc - f16at(b + 2u) * sm.y * sx;
}

// Values l = 4 i4 .. 4 i4 + 3 of sub-block s (the GEMM's loads): d sc q - dmin m, as ggml's
// dequantization computes them.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + (s / 8u) * 144u;
    let j = s % 8u;
    let sm = scale_min_k4(j, b + 4u);
    let q = w32(b + 16u + (j / 2u) * 32u + 4u * i4) >> ((j % 2u) * 4u);
    return (f16at(b) * sm.x) * vec4<f32>(nib4(q)) - f16at(b + 2u) * sm.y;
}
