// Q4_0 (18 bytes): d: f16, qs[16]: element j low nibble, j+16 high; value (q - 8) d.
// Values 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads): low nibbles of qs[4 i4 ..] for
// i4 < 4, high nibbles of qs[4 (i4 - 4) ..] after.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + s * 18u;
    let q = w32(b + 2u + 4u * (i4 % 4u)) >> ((i4 / 4u) * 4u);
    let d = f16at(b);
    return (vec4<f32>(nib4(q)) - 8.0) * d;
}
