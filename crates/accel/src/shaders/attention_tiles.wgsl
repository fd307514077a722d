// Prefill attention in tiles (layers.rs: passes of GEMM_MIN_TOKENS tokens or more outside
// batch-invariant serving, head dimension 64). attention.wgsl runs a workgroup per (head,
// token), each reading every cache row its token sees: a 512-token prompt reads each row
// about 256 times per head. Here a workgroup of 64 threads takes one KV head and a tile of
// T = 64 / G consecutive tokens (G: query heads per KV head), one thread per (token, head) row
// of the tile. Per chunk of 32 cache rows the threads load the rows' keys and values once
// into workgroup memory (16 KiB), and every row of the tile reads them there: the cache is
// read once per tile and KV head instead of once per token and query head.
// Each thread keeps its query and its 64 value sums in registers (16 vec4 each) and takes the
// chunk's cells in position order with the online softmax (the sums rescaled only when the
// maximum grows); a score's four lanes are attention.wgsl's four running sums.
// A tile whose tokens do not share one block table (a batch of several sequences, where a
// tile straddles two) takes each row alone, from the cache in memory, in the same order
// (layers.rs keeps the one-token shader for passes where many tiles would).
// Same causal and sliding-window rule as attention.wgsl, sums in f32 in another order: a
// bound, not bits (and not used where results must not depend on the batch).

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> Kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> Vc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;

const HD4: u32 = 16u; // head dimension (64) in vec4s
const KC: u32 = 32u; // cache rows a chunk
var<workgroup> ks: array<vec4<f32>, 512>; // KC × HD4 keys
var<workgroup> vs: array<vec4<f32>, 512>; // KC × HD4 values
// The tile's cells lo .. hi (the union of its tokens' ranges), and whether its tokens share
// one block table (1) or not (0), as thread 0 found them.
var<workgroup> tile: vec3<u32>;

// Token t's visible cells first .. n_cells.
fn cells(t: u32) -> vec2<u32> {
    let n_cells = u32(Pos[t]) + 1u;
    var first = 0u;
    if (A.window > 0u && n_cells > A.window) {
        first = n_cells - A.window;
    }
    return vec2<u32>(first, n_cells);
}

// This thread's row: its running maximum and sum of exponentials, its query, its value sums.
var<private> m: f32;
var<private> l: f32;
var<private> q: array<vec4<f32>, 16>;
var<private> acc: array<vec4<f32>, 16>;

// The weight of a cell of scaled score `s` (the sums rescaled first if it is a new maximum).
fn weight(s: f32) -> f32 {
    if (s > m) {
        let corr = exp(m - s);
        l *= corr;
        for (var i = 0u; i < HD4; i++) {
            acc[i] *= corr;
        }
        m = s;
    }
    let p = exp(s - m);
    l += p;
    return p;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = A.n_head / A.n_kv_head;
    let per = 64u / g; // tokens a tile
    let kvh = wid.x;
    let t0 = wid.y * per;
    let t_end = min(t0 + per, A.n_tokens);
    let kvd4 = A.n_kv_head * HD4;
    if (lid == 0u) {
        var lo = 0xffffffffu;
        var hi = 0u;
        var one = 1u;
        for (var u = t0; u < t_end; u++) {
            let c = cells(u);
            lo = min(lo, c.x);
            hi = max(hi, c.y);
            if (Tab[u] != Tab[t0]) {
                one = 0u;
            }
        }
        tile = vec3<u32>(lo, hi, one);
    }
    let span = workgroupUniformLoad(&tile);
    // This thread's row: token t, query head h.
    let t = t0 + lid / g;
    let h = kvh * g + lid % g;
    let live = lid / g < per && t < t_end;
    m = -3.0e38;
    l = 0.0;
    var mine = vec2<u32>(0u, 0u);
    if (live) {
        let qo = t * (A.n_head + 2u * A.n_kv_head) * HD4 + h * HD4;
        for (var i = 0u; i < HD4; i++) {
            q[i] = Q[qo + i];
            acc[i] = vec4<f32>(0.0);
        }
        mine = cells(t);
    }
    if (span.z == 1u) {
        let toff = Tab[t0];
        for (var c0 = span.x; c0 < span.y; c0 += KC) {
            // Thread lid loads vec4 lid % 16 of rows lid / 16, + 4, + 8, ...
            for (var j = lid / HD4; j < KC; j += 4u) {
                let c = c0 + j;
                var k = vec4<f32>(0.0);
                var v = vec4<f32>(0.0);
                if (c < span.y) {
                    let o = cache_row(toff, c) * kvd4 + kvh * HD4 + lid % HD4;
                    k = Kc[o];
                    v = Vc[o];
                }
                ks[j * HD4 + lid % HD4] = k;
                vs[j * HD4 + lid % HD4] = v;
            }
            workgroupBarrier();
            if (live) {
                for (var c = max(c0, mine.x); c < min(c0 + KC, mine.y); c++) {
                    let b = (c - c0) * HD4;
                    var s = vec4<f32>(0.0);
                    for (var i = 0u; i < HD4; i++) {
                        s += q[i] * ks[b + i];
                    }
                    let p = weight(((s.x + s.y) + (s.z + s.w)) * A.scale);
                    for (var i = 0u; i < HD4; i++) {
                        acc[i] += p * vs[b + i];
                    }
                }
            }
            workgroupBarrier();
        }
    } else if (live) {
        let toff = Tab[t];
        for (var c = mine.x; c < mine.y; c++) {
            let o = cache_row(toff, c) * kvd4 + kvh * HD4;
            var s = vec4<f32>(0.0);
            for (var i = 0u; i < HD4; i++) {
                s += q[i] * Kc[o + i];
            }
            let p = weight(((s.x + s.y) + (s.z + s.w)) * A.scale);
            for (var i = 0u; i < HD4; i++) {
                acc[i] += p * Vc[o + i];
            }
        }
    }
    if (live) {
        let oo = (t * A.n_head + h) * HD4;
        for (var i = 0u; i < HD4; i++) {
            O[oo + i] = acc[i] / l;
        }
    }
}
