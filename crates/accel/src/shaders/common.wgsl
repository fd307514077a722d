// Shared by every GEMV shader: bindings and the reduction (byte access: bytes.wgsl).
// A workgroup computes one output row for one token: its threads take 32-value sub-blocks
// s = lid, lid + WG, ... of the row, each calls the type's `sub_dot`, and the partial sums are
// added in workgroup memory.

struct Params {
    rows: u32,       // output rows (the matrix's rows)
    cols: u32,       // values per row (a multiple of 32)
    row_bytes: u32,  // bytes per row in the file's block layout
    groups_x: u32,   // workgroups along x (row = wid.x + wid.y * groups_x)
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const WG: u32 = 64u;
var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * P.groups_x;
    let tok = wid.z;
    var acc = 0.0;
    if (row < P.rows) {
        let rb = row * P.row_bytes;
        let xo = tok * P.cols;
        for (var s = lid; s < P.cols / 32u; s += WG) {
            acc += sub_dot(rb, s, xo + s * 32u);
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k / 2u) {
        if (lid < k) {
            partial[lid] += partial[lid + k];
        }
        workgroupBarrier();
    }
    if (lid == 0u && row < P.rows) {
        Y[tok * P.rows + row] = partial[0];
    }
}
