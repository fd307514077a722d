// A whole layer on the device (layers.rs): RMS norm of each row times the norm's weights,
// y = x / sqrt(mean(x²) + eps) · w, as ggml computes it (the scale, then the weights). A
// workgroup per row; the squares summed by 256 threads and a tree, in a fixed order.

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

var<workgroup> part: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let o = wid.x * N.n;
    var s = 0.0;
    for (var i = lid; i < N.n; i += 256u) {
        let v = X[o + i];
        s += v * v;
    }
    part[lid] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k = k / 2u) {
        if (lid < k) {
            part[lid] += part[lid + k];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(part[0] / f32(N.n) + N.eps);
    for (var i = lid; i < N.n; i += 256u) {
        Y[o + i] = X[o + i] * scale * Wn[i];
    }
}
