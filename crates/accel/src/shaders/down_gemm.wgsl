// The hot neurons' down projection for batches of GEMM_MIN_TOKENS tokens or more (prefill):
// Y[t][r] = sum over neurons n of A[t][n] * down[n][r], `W` neuron-major as in down_nm.wgsl
// (row n: neuron n's column of the down matrix, `n_embd` Q8_0 values). A workgroup of 256
// threads computes 64 outputs × 64 tokens, as gemm.wgsl with the roles of rows and values
// exchanged: per 32 neurons, each thread loads 8 values of one neuron's row (a quarter of a
// Q8_0 block) and 8 activations of one token into workgroup memory, then adds the 32 products
// into its 4 outputs × 4 tokens. Every output sums its neurons in order; quiet neurons (A = 0)
// add zeros. Writes Y directly (no slice sums).

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: DownParams;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r0 = wid.x * TILE;
    let tok0 = wid.y * TILE;
    // Loading the weights: neuron lid / 8 of the chunk, outputs r0 + 8 (lid % 8) .. + 8.
    let ln = lid / 8u;
    let lr = 8u * (lid % 8u);
    // Loading the activations: token lid / 4, neurons 8 (lid % 4) .. + 8 of the chunk.
    let lt = lid / 4u;
    let lq = 8u * (lid % 4u);
    let ty = lid / 16u;
    let tx = lid % 16u;
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var n0 = 0u; n0 < P.n_hot; n0 += 32u) {
        var w: array<f32, 8>;
        let r = r0 + lr;
        let n = n0 + ln;
        if (r < P.n_embd && n < P.n_hot) {
            let b = n * P.row_bytes + (r / 32u) * 34u;
            let d = f16at(b);
            for (var c = 0u; c < 8u; c++) {
                w[c] = d * i8at(b + 2u + r % 32u + c);
            }
        } else {
            for (var c = 0u; c < 8u; c++) {
                w[c] = 0.0;
            }
        }
        var a: array<f32, 8>;
        for (var c = 0u; c < 8u; c++) {
            let nn = n0 + lq + c;
            a[c] = 0.0;
            if (tok0 + lt < P.tokens && nn < P.n_hot) {
                a[c] = A[(tok0 + lt) * P.n_hot + nn];
            }
        }
        // The previous chunk's products are done before its tiles are overwritten.
        workgroupBarrier();
        for (var c = 0u; c < 8u; c++) {
            set_w(ln, lr + c, w[c]);
            set_x(lq + c, lt, a[c]);
        }
        workgroupBarrier();
        tile_step(&acc, ty, tx);
    }
    tile_store(acc, r0, tok0, ty, tx, P.n_embd, P.tokens);
}

// tile_store's output: row `r` of token `t` (Y is `[tokens][n_embd]`), the sum itself.
fn tile_out(t: u32, r: u32, v: f32) {
    Y[t * P.n_embd + r] = v;
}
