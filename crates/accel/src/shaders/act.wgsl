// Gated activation of the hot neurons: A = act(G) U where |act(G)| > thr, else 0 (the same
// rule as the CPU's sparse nodes; thr < 0: every neuron fires). kind 0: SiLU, 1: GELU (tanh;
// act_fn.wgsl). Whole device layers whose gate and up are one product skip this dispatch: their
// down product reads act(gate) · up itself (products.wgsl's `x_act`).

struct ActParams {
    n: u32,     // values (hot neurons x tokens)
    kind: u32,
    thr: f32,
    pad: u32,
}

@group(0) @binding(0) var<storage, read> G: array<f32>;
@group(0) @binding(1) var<storage, read> U: array<f32>;
@group(0) @binding(2) var<storage, read_write> A: array<f32>;
@group(0) @binding(3) var<uniform> Q: ActParams;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 64u;
    if (i >= Q.n) {
        return;
    }
    let a = act_of(G[i], Q.kind);
    if (abs(a) > Q.thr) {
        A[i] = a * U[i];
    } else {
        A[i] = 0.0;
    }
}
