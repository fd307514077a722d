// Shared by every GEMV shader: the reduction (bindings: products.wgsl; byte access: bytes.wgsl).
// A workgroup of 256 threads computes 8 output rows for up to 8 tokens: 32 lanes per row take
// its 32-value sub-blocks s = lane, lane + 32, ... (neighbouring lanes read neighbouring
// bytes), each calls the type's `sub_dot` once per token (the block's bytes are read from
// memory once and from cache for the other tokens), and each (row, token)'s 32 lane sums are
// added in workgroup memory, in a fixed order.

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
        for (var s = lane; s < P.cols / 32u; s += LANES) {
            for (var t = 0u; t < TOK; t++) {
                if (tok0 + t < P.tokens) {
                    acc[t] += sub_dot(rb, s, (tok0 + t) * P.cols + s * 32u);
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
                Y[(tok0 + t) * P.rows + row] = partial[t * 256u + lid];
            }
        }
    }
}
