// The products' parameters and bindings, shared by the GEMV (common.wgsl) and the GEMM
// (gemm.wgsl): one binding layout, so a matrix's bind group serves both.

struct Params {
    rows: u32,       // output rows computed (the matrix's rows, or a split's first rows)
    cols: u32,       // values per row (a multiple of 32)
    row_bytes: u32,  // bytes per row in the file's block layout
    groups_x: u32,   // workgroups along x (row group or tile = wid.x + wid.y * groups_x)
    tokens: u32,     // tokens in X (`[tokens, cols]`) and Y (`[tokens, rows]`)
    addend: u32,     // 0: Y = W X; 1: Y = Y + W X (a residual added where it is made);
                     // 2: Y = W X + B[row] (a bias)
    y_stride: u32,   // values per token in Y (`rows` for a product of its own; more where
    y_offset: u32,   // several products write their columns of one row, from `y_offset`)
    x_norm: u32,     // 1: X is RMS-normed with eps and the weights Wn as read (the GEMV only:
    eps: f32,        // common.wgsl's `norm_scales`, rms_norm.wgsl's values)
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;
@group(0) @binding(4) var<storage, read> B: array<f32>; // the bias (addend 2; else any buffer)
@group(0) @binding(5) var<storage, read> Wn: array<f32>; // the norm's weights (x_norm; else any)

// Activations c .. c + 4 of token t.
fn x4(t: u32, c: u32) -> vec4<f32> {
    let o = t * P.cols + c;
    return vec4<f32>(X[o], X[o + 1u], X[o + 2u], X[o + 3u]);
}

// Output `row` of token `t`, `y` its sum, with the addend the parameters ask for: the order of
// the add dispatch it replaces (`add.wgsl`: Y + B).
fn store_product(t: u32, row: u32, y: f32) {
    let i = t * P.y_stride + P.y_offset + row;
    if (P.addend == 1u) {
        Y[i] = Y[i] + y;
    } else if (P.addend == 2u) {
        Y[i] = y + B[row];
    } else {
        Y[i] = y;
    }
}
