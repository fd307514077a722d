// A whole layer on the device (layers.rs): RMS norm in place of each row of N.n values (each
// head of Q or K: Gemma 3's and Qwen3's per-head norms) times the norm's weights, as
// rms_norm.wgsl computes it. Row r is head r % heads of token r / heads, at
// `(r / heads) · stride + offset + (r % heads) · n` (Q's or K's columns of the buffer the
// products write Q, K and V into). A workgroup of 64 threads per row (the reduction: norm.wgsl).

struct NormParams {
    n: u32,
    eps: f32,
    rows: u32,
    heads: u32,
    stride: u32,
    offset: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> Y: array<f32>;
@group(0) @binding(1) var<storage, read> Wn: array<f32>;
@group(0) @binding(2) var<uniform> N: NormParams;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nw.x;
    if (row >= N.rows) {
        return;
    }
    let o = (row / N.heads) * N.stride + N.offset + (row % N.heads) * N.n;
    var s = 0.0;
    for (var i = lid; i < N.n; i += 64u) {
        let v = Y[o + i];
        s += v * v;
    }
    let scale = rms_scale(lid, s, N.n, N.eps);
    for (var i = lid; i < N.n; i += 64u) {
        Y[o + i] = Y[o + i] * scale * Wn[i];
    }
}
