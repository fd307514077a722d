// The hot neurons' down projection, stored neuron-major: row n of `W` is neuron n's column of
// the down matrix as `n_embd` Q8_0 values, so a group of neurons is a contiguous range of rows
// (what online balancing loads and evicts). Y[t][r] = sum over neurons n with A[t][n] != 0 of
// A[t][n] * down[n][r].
//
// A workgroup of 256 threads takes one 32-value block of outputs (32 lanes: a lane per output,
// neighbouring lanes reading neighbouring bytes) and one of `slices` ranges of neurons (wid.y),
// split again over 8 threads per lane; each thread adds its neurons in order, the 8 are added
// in workgroup memory, and the slice's sum goes to S[t][slice][r]. `down_sum.wgsl` then adds
// the slices in order: enough workgroups to fill a GPU for one token, no atomics, the same
// order every run.

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> S: array<f32>;
@group(0) @binding(3) var<uniform> P: DownParams;

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % 32u;
    let sub = lid / 32u;
    let r = wid.x * 32u + lane;
    let tok = wid.z;
    let per = (P.n_hot + P.slices - 1u) / P.slices;
    let n0 = wid.y * per;
    let n1 = min(n0 + per, P.n_hot);
    let block = (r / 32u) * 34u;
    var acc = 0.0;
    if (r < P.n_embd) {
        for (var n = n0 + sub; n < n1; n += 8u) {
            let a = A[tok * P.n_hot + n];
            if (a != 0.0) {
                let b = n * P.row_bytes + block;
                acc += a * (f16at(b) * i8at(b + 2u + lane));
            }
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var k = 128u; k >= 32u; k = k / 2u) {
        if (lid < k) {
            partial[lid] += partial[lid + k];
        }
        workgroupBarrier();
    }
    if (sub == 0u && r < P.n_embd) {
        S[(tok * P.slices + wid.y) * P.n_embd + r] = partial[lid];
    }
}
