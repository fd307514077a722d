// A whole layer on the device (layers.rs): each token's key and value rows (all KV heads,
// `kv` values) into the layer's cache at the row the CPU's cache gives it (`Slots`), so the
// device's cache mirrors the CPU's block tables (prefix blocks shared between sequences too).

struct StoreParams {
    n_tokens: u32,
    kv: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> K: array<f32>;
@group(0) @binding(1) var<storage, read> V: array<f32>;
@group(0) @binding(2) var<storage, read_write> Kc: array<f32>;
@group(0) @binding(3) var<storage, read_write> Vc: array<f32>;
@group(0) @binding(4) var<storage, read> Slots: array<u32>;
@group(0) @binding(5) var<uniform> S: StoreParams;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 64u;
    if (i >= S.n_tokens * S.kv) {
        return;
    }
    let t = i / S.kv;
    let j = i % S.kv;
    let dst = Slots[t] * S.kv + j;
    Kc[dst] = K[i];
    Vc[dst] = V[i];
}
