// Shared by every GEMM shader, the products of batches of GEMM_MIN_TOKENS tokens or more
// (prefill): Y[t][r] = sum over k of W[r][k] X[t][k], with the GEMV's bindings and parameters
// (products.wgsl). A workgroup of 256 threads computes a tile of 64 output rows × 64 tokens.
// Per 32-value sub-block of the rows, each thread dequantizes 8 values of one weight row
// (the type's `sub_val4`, twice) and loads 8 values of one token's activations into workgroup
// memory, and then each thread adds the 32 products into its 4 rows × 4 tokens. Each weight
// block is read and decoded once per 64 tokens (the GEMV decodes it once per 8), and every
// output sums its sub-blocks in order, a fixed order whatever the batch.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.x + wid.y * P.groups_x) * TILE;
    let tok0 = wid.z * TILE;
    // Loading: row (and token) lid / 4 of the tile, values 8 (lid % 4) .. + 8 of the sub-block.
    let lr = lid / 4u;
    let lq = lid % 4u;
    let wrow = row0 + lr;
    let xtok = tok0 + lr;
    // Computing: rows 4 ty .. + 4 and tokens 4 tx .. + 4 of the tile.
    let ty = lid / 16u;
    let tx = lid % 16u;
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var s = 0u; s < P.cols / 32u; s++) {
        var w0 = vec4<f32>(0.0);
        var w1 = vec4<f32>(0.0);
        if (wrow < P.rows) {
            w0 = sub_val4(wrow * P.row_bytes, s, 2u * lq);
            w1 = sub_val4(wrow * P.row_bytes, s, 2u * lq + 1u);
        }
        var x0 = vec4<f32>(0.0);
        var x1 = vec4<f32>(0.0);
        if (xtok < P.tokens) {
            let xo = xtok * P.cols + s * 32u + 8u * lq;
            x0 = vec4<f32>(X[xo], X[xo + 1u], X[xo + 2u], X[xo + 3u]);
            x1 = vec4<f32>(X[xo + 4u], X[xo + 5u], X[xo + 6u], X[xo + 7u]);
        }
        // The previous sub-block's products are done before its tiles are overwritten.
        workgroupBarrier();
        for (var c = 0u; c < 4u; c++) {
            set_w(8u * lq + c, lr, w0[c]);
            set_w(8u * lq + 4u + c, lr, w1[c]);
            set_x(8u * lq + c, lr, x0[c]);
            set_x(8u * lq + 4u + c, lr, x1[c]);
        }
        workgroupBarrier();
        tile_step(&acc, ty, tx);
    }
    tile_store(acc, row0, tok0, ty, tx, P.rows, P.tokens);
}

// tile_store's output: row `r` of token `t`, through the products' addend and output place.
fn tile_out(t: u32, r: u32, v: f32) {
    store_product(t, r, v);
}
