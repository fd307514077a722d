// A whole layer on the device (layers.rs): Y[i] += B[i % period] — a bias over every row
// (period: the row length) or a residual (period: all of Y).

struct AddParams {
    n: u32,
    period: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> Y: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<uniform> D: AddParams;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if (i < D.n) {
        Y[i] += B[i % D.period];
    }
}
