// The 64 × 64 output tile both tiled products share (gemm.wgsl, down_gemm.wgsl): a workgroup
// of 256 threads, thread (ty, tx) = (lid / 16, lid % 16) holding outputs 4 ty .. + 4 for
// tokens 4 tx .. + 4. Each step the shader fills `tile_w` ([32][64]: for each output, 32 of
// the weights it sums over; `set_w`) and `tile_x` ([32][64]: the same 32 activations of each
// token; `set_x`), four outputs (tokens) to a vector so that `tile_step` reads a thread's
// four with one load, and `tile_step` adds the 32 products, in order, into `acc`.

const TILE: u32 = 64u;
var<workgroup> tile_w: array<vec4<f32>, 512>; // [32][16]
var<workgroup> tile_x: array<vec4<f32>, 512>;

// Weight k (of 32) of output o (of 64).
fn set_w(k: u32, o: u32, v: f32) {
    tile_w[k * 16u + o / 4u][o % 4u] = v;
}

// Activation k (of 32) of token t (of 64).
fn set_x(k: u32, t: u32, v: f32) {
    tile_x[k * 16u + t / 4u][t % 4u] = v;
}

fn tile_step(acc: ptr<function, array<vec4<f32>, 4>>, ty: u32, tx: u32) {
    for (var k = 0u; k < 32u; k++) {
        let w = tile_w[k * 16u + ty];
        let xv = tile_x[k * 16u + tx];
        (*acc)[0] += w.x * xv;
        (*acc)[1] += w.y * xv;
        (*acc)[2] += w.z * xv;
        (*acc)[3] += w.w * xv;
    }
}

// Writes the thread's outputs inside `n_out` outputs × `n_tok` tokens through the including
// shader's `tile_out(token, row, value)`.
fn tile_store(acc: array<vec4<f32>, 4>, out0: u32, tok0: u32, ty: u32, tx: u32, n_out: u32, n_tok: u32) {
    for (var i = 0u; i < 4u; i++) {
        let r = out0 + 4u * ty + i;
        if (r < n_out) {
            for (var j = 0u; j < 4u; j++) {
                let t = tok0 + 4u * tx + j;
                if (t < n_tok) {
                    tile_out(t, r, acc[i][j]);
                }
            }
        }
    }
}
