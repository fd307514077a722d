// A whole layer on the device (layers.rs), one dispatch after the Q, K and V products, which
// write each token's row `[q: n_heads · head_dim | k: n_kv_heads · head_dim | v: the same]` of
// one buffer: RoPE in place on Q, and each token's key row rotated the same way and
// its value row copied into the layer's cache at the row the CPU's cache gives it (`Slots`), so
// the device's cache mirrors the CPU's block tables (prefix blocks shared between sequences
// too). The first n_rot values of each head are rotated by pairs — adjacent (LLaMA's permuted
// layout) or NeoX's halves — by θ = pos · freq_scale · base^(−2i / n_rot), as ggml's rope
// without YaRN; the angle is reduced to [0, 2π) before sin and cos (whose accuracy a GPU only
// promises there). Threads `[0, tokens · n_heads · n_rot / 2)` rotate a pair of Q each, the
// next `tokens · n_kv_heads · head_dim` store one key and one value each (a rotated key value
// computed from its pair, as the pair's thread of Q computes it).

struct RopeParams {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    n_rot: u32,
    base: f32,
    freq_scale: f32,
    neox: u32,
}

@group(0) @binding(0) var<storage, read_write> QKV: array<f32>;
@group(0) @binding(1) var<storage, read_write> Kc: array<f32>;
@group(0) @binding(2) var<storage, read_write> Vc: array<f32>;
@group(0) @binding(3) var<storage, read> Pos: array<i32>;
@group(0) @binding(4) var<storage, read> Slots: array<u32>;
@group(0) @binding(5) var<uniform> R: RopeParams;

// (cos, sin) of pair i's angle at token t.
fn angle(t: u32, i: u32) -> vec2<f32> {
    let theta = f32(Pos[t]) * R.freq_scale * pow(R.base, -2.0 * f32(i) / f32(R.n_rot));
    let two_pi = 6.283185307179586;
    let r = theta - two_pi * floor(theta / two_pi);
    return vec2<f32>(cos(r), sin(r));
}

// The pair (x0, x1) rotated by the angle whose (cos, sin) is `cs`.
fn rotate(x0: f32, x1: f32, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(x0 * cs.x - x1 * cs.y, x0 * cs.y + x1 * cs.x);
}

// Offsets in a head of pair i's two values.
fn pair(i: u32) -> vec2<u32> {
    if (R.neox != 0u) {
        return vec2<u32>(i, i + R.n_rot / 2u);
    }
    return vec2<u32>(2u * i, 2u * i + 1u);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let half = R.n_rot / 2u;
    let idx = gid.x + gid.y * nw.x * 64u;
    let n_q = R.n_tokens * R.n_heads * half;
    let qd = R.n_heads * R.head_dim;
    let kv = R.n_kv_heads * R.head_dim;
    let row = qd + 2u * kv;
    if (idx < n_q) {
        let i = idx % half;
        let th = idx / half;
        let t = th / R.n_heads;
        let cs = angle(t, i);
        let o = t * row + (th % R.n_heads) * R.head_dim;
        let ab = pair(i);
        let r = rotate(QKV[o + ab.x], QKV[o + ab.y], cs);
        QKV[o + ab.x] = r.x;
        QKV[o + ab.y] = r.y;
        return;
    }
    let e = idx - n_q;
    if (e >= R.n_tokens * kv) {
        return;
    }
    let t = e / kv;
    let j = e % kv;
    let d = j % R.head_dim;
    let dst = Slots[t] * kv + j;
    // This token's key value j, and its value value j.
    let k = t * row + qd + j;
    Vc[dst] = QKV[k + kv];
    if (d >= R.n_rot) {
        Kc[dst] = QKV[k];
        return;
    }
    // This value's pair, and which of its two it is.
    var i = d / 2u;
    if (R.neox != 0u) {
        i = d % half;
    }
    let o = k - d;
    let ab = pair(i);
    let cs = angle(t, i);
    let r = rotate(QKV[o + ab.x], QKV[o + ab.y], cs);
    Kc[dst] = select(r.y, r.x, d == ab.x);
}
