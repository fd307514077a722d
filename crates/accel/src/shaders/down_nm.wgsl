// The hot neurons' down projection, stored neuron-major: row n of `W` is neuron n's column of
// the down matrix as `n_embd` Q8_0 values, so a group of neurons is a contiguous range of rows
// (what online balancing loads and evicts). Y[t][r] = sum over neurons n with A[t][n] != 0 of
// A[t][n] * down[n][r], in neuron order; a thread per output value.

// The matrix's own GEMV parameters (common.wgsl's Params) read under these names.
struct DownParams {
    n_hot: u32,      // neurons (rows of W, values per token in A)
    n_embd: u32,     // outputs per token
    row_bytes: u32,  // bytes per row of W
    groups_x: u32,   // the GEMV's workgroup count (unused here)
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: DownParams;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    let tok = gid.y;
    if (r >= P.n_embd) {
        return;
    }
    let block = (r / 32u) * 34u;
    let lane = 2u + (r % 32u);
    var acc = 0.0;
    for (var n = 0u; n < P.n_hot; n++) {
        let a = A[tok * P.n_hot + n];
        if (a != 0.0) {
            let b = n * P.row_bytes + block;
            acc += a * (f16at(b) * i8at(b + lane));
        }
    }
    Y[tok * P.n_embd + r] = acc;
}
