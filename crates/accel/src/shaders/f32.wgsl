// F32: 32 values of 4 bytes.
// Values 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads).
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let w = ((rb + s * 128u) >> 2u) + 4u * i4;
    return vec4<f32>(bitcast<f32>(W[w]), bitcast<f32>(W[w + 1u]), bitcast<f32>(W[w + 2u]), bitcast<f32>(W[w + 3u]));
}
