// Q4_K (144 bytes per 256): d, dmin: f16, scales[12], qs[128]. Sub-block j (of 8) reads the
// low (j even) or high nibbles of qs[32 (j / 2) ..]; value d sc q - dmin m.
// Values l = 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads): d sc q - dmin m, as ggml's
// dequantization computes them.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + (s / 8u) * 144u;
    let j = s % 8u;
    let sm = scale_min_k4(j, b + 4u);
    let q = w32(b + 16u + (j / 2u) * 32u + 4u * i4) >> ((j % 2u) * 4u);
    return (f16at(b) * sm.x) * vec4<f32>(nib4(q)) - f16at(b + 2u) * sm.y;
}
