// The 64 × 64 output tile both tiled products share (gemm.wgsl, down_gemm.wgsl): a workgroup
// of 256 threads, thread (ty, tx) = (lid / 16, lid % 16) holding outputs 4 ty .. + 4 for
// tokens 4 tx .. + 4. Each step the shader fills `tile_w` ([32][64]: for each output, 32 of
// the weights it sums over) and `tile_x` ([32][64]: the same 32 activations of each token),
// and `tile_step` adds the 32 products, in order, into `acc`.

const TILE: u32 = 64u;
var<workgroup> tile_w: array<f32, 2048>;
var<workgroup> tile_x: array<f32, 2048>;

fn tile_step(acc: ptr<function, array<vec4<f32>, 4>>, ty: u32, tx: u32) {
    for (var k = 0u; k < 32u; k++) {
        let o = k * TILE + 4u * ty;
        let t = k * TILE + 4u * tx;
        let xv = vec4<f32>(tile_x[t], tile_x[t + 1u], tile_x[t + 2u], tile_x[t + 3u]);
        (*acc)[0] += tile_w[o] * xv;
        (*acc)[1] += tile_w[o + 1u] * xv;
        (*acc)[2] += tile_w[o + 2u] * xv;
        (*acc)[3] += tile_w[o + 3u] * xv;
    }
}

// Writes the thread's outputs inside `n_out` outputs × `n_tok` tokens into Y (`[n_tok][n_out]`).
fn tile_store(acc: array<vec4<f32>, 4>, out0: u32, tok0: u32, ty: u32, tx: u32, n_out: u32, n_tok: u32) {
    for (var i = 0u; i < 4u; i++) {
        let r = out0 + 4u * ty + i;
        if (r < n_out) {
            for (var j = 0u; j < 4u; j++) {
                let t = tok0 + 4u * tx + j;
                if (t < n_tok) {
                    Y[t * n_out + r] = acc[i][j];
                }
            }
        }
    }
}
