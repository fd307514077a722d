// F16: 32 values of 2 bytes (rows of whole 32-value groups are 4-byte aligned).
// Values 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads).
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let w = ((rb + s * 64u) >> 2u) + 2u * i4;
    let a = unpack2x16float(W[w]);
    let b = unpack2x16float(W[w + 1u]);
    return vec4<f32>(a.x, a.y, b.x, b.y);
}
