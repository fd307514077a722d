// Q4_K and Q5_K sub-block j's 6-bit scale and min (ggml's get_scale_min_k4); scales at byte sc.
fn scale_min_k4(j: u32, sc: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(b8(sc + j) & 63u), f32(b8(sc + j + 4u) & 63u));
    }
    let s = (b8(sc + j + 4u) & 15u) | ((b8(sc + j - 4u) >> 6u) << 4u);
    let m = (b8(sc + j + 4u) >> 4u) | ((b8(sc + j) >> 6u) << 4u);
    return vec2<f32>(f32(s), f32(m));
}
