// Q5_K (176 bytes per 256): d, dmin: f16, scales[12], qh[32], qs[128]. Sub-block j: nibbles
// as Q4_K, fifth bit = bit j of qh[l]; value d sc q - dmin m.
// Values l = 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads).
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + (s / 8u) * 176u;
    let j = s % 8u;
    let sm = scale_min_k4(j, b + 4u);
    let q = w32(b + 48u + (j / 2u) * 32u + 4u * i4) >> ((j % 2u) * 4u);
    let h = w32(b + 16u + 4u * i4) >> j;
    return (f16at(b) * sm.x) * vec4<f32>(nib4(q) | high4(h, 8u, 1u)) - f16at(b + 2u) * sm.y;
}
