// Q8_0 (34 bytes): d: f16, qs[32]: i8; value q d.
// Values 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads).
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 34u;
    let q = w32(b + 2u + 4u * i4);
    let v = vec4<i32>(i32(q << 24u), i32(q << 16u), i32(q << 8u), i32(q)) >> vec4<u32>(24u);
    return vec4<f32>(v) * f16at(b);
}
