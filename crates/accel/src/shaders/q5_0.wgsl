// Q5_0 (22 bytes): d: f16, qh: u32 (bit j: fifth bit of element j), qs[16]; value (q - 16) d.
// Values e = 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads): nibbles as in Q4_0, fifth
// bit e of qh.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 22u;
    let h = w32(b + 2u) >> (4u * i4);
    let q = w32(b + 6u + 4u * (i4 % 4u)) >> ((i4 / 4u) * 4u);
    return (vec4<f32>(nib4(q) | high4(h, 1u, 1u)) - 16.0) * f16at(b);
}
