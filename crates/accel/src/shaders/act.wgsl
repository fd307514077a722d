// Gated activation of the hot neurons: A = act(G) U where |act(G)| > thr, else 0 (the same
// rule as the CPU's sparse nodes; thr < 0: every neuron fires). kind 0: SiLU, 1: GELU (tanh).
// With `width` (whole layers, gate and up made by one product: `[tokens][gate | up]`, `width`
// each), value i = t · width + j reads G[2t · width + j] and U[(2t + 1) · width + j]; 0: G[i]
// and U[i].

struct ActParams {
    n: u32,     // values (hot neurons x tokens)
    kind: u32,
    thr: f32,
    width: u32,
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
    var gi = i;
    var ui = i;
    if (Q.width != 0u) {
        gi = i / Q.width * 2u * Q.width + i % Q.width;
        ui = gi + Q.width;
    }
    let g = G[gi];
    var a: f32;
    if (Q.kind == 0u) {
        a = g / (1.0 + exp(-g));
    } else {
        a = 0.5 * g * (1.0 + tanh(0.7978845608028654 * g * (1.0 + 0.044715 * g * g)));
    }
    if (abs(a) > Q.thr) {
        A[i] = a * U[ui];
    } else {
        A[i] = 0.0;
    }
}
