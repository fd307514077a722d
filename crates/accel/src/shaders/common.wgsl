// Shared by every GEMV shader: the reduction (bindings: products.wgsl; byte access: bytes.wgsl).
// A workgroup of 256 threads computes 8 output rows for up to 8 tokens: 32 lanes per row take
// its values four at a time, lane l the groups l, l + 32, ... (`sub_val4`, the type's
// dequantization of 4 values, which the tiled GEMM reads too), so neighbouring lanes read
// neighbouring weight words and neighbouring activations (on a GPU, one load of the warp
// covers a few cache lines; reading a whole 32-value sub-block per lane made its
// activation loads 128 bytes apart, a line per lane). Each group's weights are decoded once
// for all the tokens, and each (row, token)'s 32 lane sums are added in workgroup memory, in
// a fixed order. With `x_norm` the workgroup first computes its tokens' RMS scales
// (`norm_scales`), and each activation is read as x · scale · w, the norm's dispatch saved.

const LANES: u32 = 32u;
const ROWS: u32 = 8u;
const TOK: u32 = 8u;
var<workgroup> partial: array<f32, 2048>; // [TOK][ROWS * LANES]
var<workgroup> x_scale: array<f32, 8>;     // [TOK]: each token's RMS scale (x_norm)

// The RMS scale 1 / sqrt(mean(x²) + eps) of tokens tok0 .. tok0 + TOK into `x_scale`, with
// rms_norm.wgsl's operations in its order: per token 64 partial sums of squares (partial l
// over values l, l + 64, ...), added by the same tree. Four tokens at a time, 64 threads each.
fn norm_scales(lid: u32, tok0: u32) {
    let l = lid % 64u;
    for (var r = 0u; r < 2u; r++) {
        let t = r * 4u + lid / 64u;
        var s = 0.0;
        if (tok0 + t < P.tokens) {
            let o = (tok0 + t) * P.cols;
            for (var i = l; i < P.cols; i += 64u) {
                let v = X[o + i];
                s += v * v;
            }
        }
        partial[t * 64u + l] = s;
    }
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k / 2u) {
        if (l < k) {
            for (var r = 0u; r < 2u; r++) {
                let t = r * 4u + lid / 64u;
                partial[t * 64u + l] += partial[t * 64u + l + k];
            }
        }
        workgroupBarrier();
    }
    if (lid < TOK) {
        x_scale[lid] = 1.0 / sqrt(partial[lid * 64u] / f32(P.cols) + P.eps);
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let row = (wid.x + wid.y * P.groups_x) * ROWS + lid / LANES;
    let tok0 = wid.z * TOK;
    if (P.x_norm != 0u) {
        norm_scales(lid, tok0);
    }
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
                    var x = x4(tok0 + t, 4u * v);
                    if (P.x_norm != 0u) {
                        // rms_norm.wgsl's x · scale · w, per value.
                        let c = 4u * v;
                        x = x * x_scale[t] * vec4<f32>(Wn[c], Wn[c + 1u], Wn[c + 2u], Wn[c + 3u]);
                    }
                    acc[t] += dot(w, x);
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
