// The down projection's slice sums added in slice order (down_nm.wgsl): a thread per output.

@group(0) @binding(0) var<storage, read> S: array<f32>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<uniform> P: DownParams;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    let tok = gid.y;
    if (r >= P.n_embd) {
        return;
    }
    var acc = 0.0;
    for (var s = 0u; s < P.slices; s++) {
        acc += S[(tok * P.slices + s) * P.n_embd + r];
    }
    Y[tok * P.n_embd + r] = acc;
}
