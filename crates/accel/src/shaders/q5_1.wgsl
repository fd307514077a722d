// Q5_1 (24 bytes): d, m: f16, qh: u32, qs[16]; value q d + m.
// Values e = 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads), bits as in Q5_0.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 24u;
    let h = w32(b + 4u) >> (4u * i4);
    let q = w32(b + 8u + 4u * (i4 % 4u)) >> ((i4 / 4u) * 4u);
    return vec4<f32>(nib4(q) | high4(h, 1u, 1u)) * f16at(b) + f16at(b + 2u);
}
