// Shared by every GEMV shader: the reduction (bindings: products.wgsl; byte access: bytes.wgsl).
// A workgroup of 256 threads computes 8 output rows for up to 8 tokens: 32 lanes per row take
// its values four at a time, lane l the groups l, l + 32, ... (`sub_val4`, the type's
// dequantization of 4 values, which the tiled GEMM reads too), so neighbouring lanes read
// neighbouring weight words and neighbouring activations (on a GPU, one load of the warp
// covers a few cache lines; reading a whole 32-value sub-block per lane made its
// activation loads 128 bytes apart, a line per lane). Each group's weights are decoded once
// for all the tokens, and each (row, token)'s 32 lane sums are added in workgroup memory, in
// a fixed order.

const LANES: u32 = 32u;
const ROWS: u32 = 8u;
const TOK: u32 = 8u;
var<workgroup> partial: array<f32, 2048>; // [TOK][ROWS * LANES]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let row = (wid.x + wid.y * P.groups_x) * ROWS + lid / LANES;
    let tok0 = wid.z * TOK;
    var acc: array<f32, 8>;
    for (var t = 0u; t < TOK; t++) {
        acc[t] = 0.0;
    }
    if (row < P.rows) {
        let rb = row * P.row_bytes;
        for (var v = lane; v < P.cols / 4u; v += LANES) {
            let w = sub_val4(rb, v / 8u, v % 8u);
            for (var t = 0u; t < TOK; t++) {
                if (tok0 + t < P.tokens) {
                    acc[t] += dot(w, x4(tok0 + t, 4u * v));
                }
            }
        }
    }
    for (var t = 0u; t < TOK; t++) {
        partial[t * 256u + lid] = acc[t];
    }
    workgroupBarrier();
    for (var k = LANES / 2u; k > 0u; k = k / 2u) {
        if (lane < k) {
            for (var t = 0u; t < TOK; t++) {
                partial[t * 256u + lid] += partial[t * 256u + lid + k];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && row < P.rows) {
        for (var t = 0u; t < TOK; t++) {
            if (tok0 + t < P.tokens) {
                store_product(tok0 + t, row, partial[t * 256u + lid]);
            }
        }
    }
}
