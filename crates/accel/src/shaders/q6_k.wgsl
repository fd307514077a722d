// Q6_K (210 bytes per 256): ql[128], qh[64], scales[16]: i8, d: f16. Sub-block j (of 8) is
// quarter k = j % 4 of half n = j / 4: low 4 bits from ql[64 n + 32 (k % 2) + l] (high nibble
// for k >= 2), top 2 bits (qh[32 n + l] >> 2k) & 3; value d scale[i / 16] (q - 32).
// Values l = 4 i4 .. 4 i4 + 3 of sub-block s (the GEMV's and the GEMM's loads): d scale (q - 32), the scale
// of values 0..15 or 16..31.
fn sub_val4(rb: u32, s: u32, i4: u32) -> vec4<f32> {
    let b = rb + (s / 8u) * 210u;
    let j = s % 8u;
    let n = j / 4u;
    let k = j % 4u;
    let lo = w32(b + 64u * n + 32u * (k % 2u) + 4u * i4) >> ((k / 2u) * 4u);
    let hi = w32(b + 128u + 32u * n + 4u * i4) >> (2u * k);
    let v = nib4(lo) | high4(hi, 8u, 3u);
    let sc = i8at(b + 192u + 8u * n + 2u * k + i4 / 4u);
    return (f16at(b + 208u) * sc) * (vec4<f32>(v) - 32.0);
}
