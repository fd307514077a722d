// A whole layer on the device (layers.rs): RMS norm of each row times the norm's weights,
// y = x / sqrt(mean(x²) + eps) · w, as ggml computes it (the scale, then the weights). A
// workgroup of 64 threads per row (the reduction: norm.wgsl).

struct NormParams {
    n: u32,    // values per row
    eps: f32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> Wn: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> N: NormParams;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = wid.x * N.n;
    var s = 0.0;
    for (var i = lid; i < N.n; i += 64u) {
        let v = X[o + i];
        s += v * v;
    }
    let scale = rms_scale(lid, s, N.n, N.eps);
    for (var i = lid; i < N.n; i += 64u) {
        Y[o + i] = X[o + i] * scale * Wn[i];
    }
}
