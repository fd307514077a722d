// Shared by every GEMV shader: the reduction (bindings: products.wgsl; byte access: bytes.wgsl).
// A workgroup of 256 threads computes 8 output rows for up to TOK tokens (8; 1 in the copy
// compiled for one-token passes, the decode steps, whose workgroup memory and loops then hold
// one token): 32 lanes per row take its values four at a time, lane l the groups l, l + 32, ...
// (`sub_val4`, the type's dequantization of 4 values, which the tiled GEMM reads too), so
// neighbouring lanes read neighbouring weight words and neighbouring activations (on a GPU, one
// load of the warp covers a few cache lines; reading a whole 32-value sub-block per lane made
// its activation loads 128 bytes apart, a line per lane). A lane decodes four of its groups
// before it adds any (their loads in flight together: a one-token product is a chain of load
// latencies, not of bandwidth), and adds them in the order one at a time would. Each group's
// weights are decoded once for all the tokens, and each (row, token)'s 32 lane sums are added
// in workgroup memory, in a fixed order — the same for every TOK, so a token's outputs do not
// depend on its batch. With `x_norm` the workgroup first computes its tokens' RMS scales
// (`norm_scales`), and each activation is read as x · scale · w, the norm's dispatch saved.

const LANES: u32 = 32u;
const ROWS: u32 = 8u;
const TOK: u32 = 8u;
var<workgroup> partial: array<f32, TOK * 256u>; // [TOK][ROWS * LANES]; norm_scales: [TOK][64]
var<workgroup> x_scale: array<f32, TOK>;        // [TOK]: each token's RMS scale (x_norm)

// The RMS scale 1 / sqrt(mean(x²) + eps) of tokens tok0 .. tok0 + TOK into `x_scale`, with
// rms_norm.wgsl's operations in its order: per token 64 partial sums of squares (partial l
// over values l, l + 64, ..., four loaded before they are added), added by the same tree. Four
// tokens at a time, 64 threads each.
fn norm_scales(lid: u32, tok0: u32) {
    let l = lid % 64u;
    for (var r = 0u; r * 4u < TOK; r++) {
        let t = r * 4u + lid / 64u;
        var s = 0.0;
        if (t < TOK && tok0 + t < P.tokens) {
            let o = (tok0 + t) * P.cols;
            var i = l;
            for (; i + 192u < P.cols; i += 256u) {
                let v = vec4<f32>(X[o + i], X[o + i + 64u], X[o + i + 128u], X[o + i + 192u]);
                s += v.x * v.x;
                s += v.y * v.y;
                s += v.z * v.z;
                s += v.w * v.w;
            }
            for (; i < P.cols; i += 64u) {
                let v = X[o + i];
                s += v * v;
            }
        }
        if (t < TOK) {
            partial[t * 64u + l] = s;
        }
    }
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k / 2u) {
        if (l < k) {
            for (var r = 0u; r * 4u < TOK; r++) {
                let t = r * 4u + lid / 64u;
                if (t < TOK) {
                    partial[t * 64u + l] += partial[t * 64u + l + k];
                }
            }
        }
        workgroupBarrier();
    }
    if (lid < TOK) {
        x_scale[lid] = 1.0 / sqrt(partial[lid * 64u] / f32(P.cols) + P.eps);
    }
    workgroupBarrier();
}

// Token tok0 + t's activations of group v (values 4v .. 4v + 3), normed where `x_norm` asks:
// rms_norm.wgsl's x · scale · w, per value.
fn x_in(tok0: u32, t: u32, v: u32) -> vec4<f32> {
    let x = x4(tok0 + t, 4u * v);
    if (P.x_norm == 0u) {
        return x;
    }
    let c = 4u * v;
    return x * x_scale[t] * vec4<f32>(Wn[c], Wn[c + 1u], Wn[c + 2u], Wn[c + 3u]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let row = (wid.x + wid.y * P.groups_x) * ROWS + lid / LANES;
    let tok0 = wid.z * TOK;
    if (P.x_norm != 0u) {
        norm_scales(lid, tok0);
    }
    var acc: array<f32, TOK>;
    for (var t = 0u; t < TOK; t++) {
        acc[t] = 0.0;
    }
    if (row < P.rows) {
        let rb = row * P.row_bytes;
        let groups = P.cols / 4u;
        var v = lane;
        for (; v + 3u * LANES < groups; v += 4u * LANES) {
            var w: array<vec4<f32>, 4>;
            for (var j = 0u; j < 4u; j++) {
                let g = v + j * LANES;
                w[j] = sub_val4(rb, g / 8u, g % 8u);
            }
            for (var t = 0u; t < TOK; t++) {
                if (tok0 + t < P.tokens) {
                    for (var j = 0u; j < 4u; j++) {
                        acc[t] += dot(w[j], x_in(tok0, t, v + j * LANES));
                    }
                }
            }
        }
        for (; v < groups; v += LANES) {
            let w = sub_val4(rb, v / 8u, v % 8u);
            for (var t = 0u; t < TOK; t++) {
                if (tok0 + t < P.tokens) {
                    acc[t] += dot(w, x_in(tok0, t, v));
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
