// Q4_1 (20 bytes): d, m: f16, qs[16]; value q d + m.
// Values 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads), nibbles as in Q4_0.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 20u;
    let q = w32(b + 4u + 4u * (i4 % 4u)) >> ((i4 / 4u) * 4u);
    return vec4<f32>(nib4(q)) * f16at(b) + f16at(b + 2u);
}
