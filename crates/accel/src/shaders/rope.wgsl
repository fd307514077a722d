// A whole layer on the device (layers.rs): RoPE in place on `[tokens][heads][head_dim]`, the
// first n_rot values of each head rotated by pairs — adjacent (LLaMA's permuted layout) or
// NeoX's halves — by θ = pos · freq_scale · base^(−2i / n_rot), as ggml's rope without YaRN.
// The angle is reduced to [0, 2π) before sin and cos (whose accuracy a GPU only promises there).

struct RopeParams {
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    n_rot: u32,
    base: f32,
    freq_scale: f32,
    neox: u32,
    pad: u32,
}

@group(0) @binding(0) var<storage, read_write> Y: array<f32>;
@group(0) @binding(1) var<storage, read> Pos: array<i32>;
@group(0) @binding(2) var<uniform> R: RopeParams;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let half = R.n_rot / 2u;
    let idx = gid.x + gid.y * nw.x * 64u;
    if (idx >= R.n_tokens * R.n_heads * half) {
        return;
    }
    let i = idx % half;
    let th = idx / half;
    let h = th % R.n_heads;
    let t = th / R.n_heads;
    let theta = f32(Pos[t]) * R.freq_scale * pow(R.base, -2.0 * f32(i) / f32(R.n_rot));
    let two_pi = 6.283185307179586;
    let r = theta - two_pi * floor(theta / two_pi);
    let c = cos(r);
    let s = sin(r);
    let o = (t * R.n_heads + h) * R.head_dim;
    var a = o + 2u * i;
    var b = a + 1u;
    if (R.neox != 0u) {
        a = o + i;
        b = o + i + half;
    }
    let x0 = Y[a];
    let x1 = Y[b];
    Y[a] = x0 * c - x1 * s;
    Y[b] = x0 * s + x1 * c;
}
