// Prefill attention in tiles (layers.rs: passes of GEMM_MIN_TOKENS tokens or more outside
// batch-invariant serving, head dimension 64, 128 or 256). attention.wgsl runs a workgroup per
// (head, token), each reading every cache row its token sees: a 512-token prompt reads each
// row about 256 times per head. Here a workgroup of 64 · S threads takes one KV head and a
// tile of T = 64 / G consecutive tokens (G: query heads per KV head), S threads per (token,
// head) row of the tile, each holding 64 of the row's dimensions (S = head dimension / 64;
// device.rs compiles one pipeline per S, replacing the constant below; 64 rows at every S: on
// lavapipe Gemma 3's attention took the same time with 16 rows, but each row of the cache is
// then read for 4 tokens instead of 16). Per chunk of KC cache rows
// (512 vec4s of keys and as many of values, 16 KiB) the threads load the rows once into
// workgroup memory, and every row of the tile reads them there: the cache is read once per
// tile and KV head instead of once per token and query head.
// Each thread keeps its query slice and its value sums in registers (16 vec4 each). With one
// thread a row (S = 1) it takes the chunk's cells in position order with the online softmax
// (the sums rescaled only when the maximum grows). With more, a chunk takes two steps: each
// thread scores the cells its row sees over its 64 dimensions into workgroup memory; then
// each adds the row's S partial scores of a cell (in slice order: the row's threads get the
// same score), takes the chunk's maximum, rescales its sums once if it grew, and adds the
// cells' weighted values in position order. (Two steps at S = 1 too: 197 → 314 ms a layer on
// lavapipe, SmolLM2 at 512 tokens.) A score's four lanes are attention.wgsl's four sums.
// A tile whose tokens do not share one block table (a batch of several sequences, where a
// tile straddles two) reads each row's keys and values from the cache in memory, in the same
// order (layers.rs keeps the one-token shader for passes where many tiles would).
// Same causal and sliding-window rule as attention.wgsl, sums in f32 in another order: a
// bound, not bits (and not used where results must not depend on the batch).

@group(0) @binding(0) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> Kc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> Vc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<vec4<f32>>;

const S: u32 = 1u; // threads a row: head dimension / 64 (1, 2 or 4; device.rs replaces it)
const HD4: u32 = 16u; // a thread's slice of a row, in vec4s (64 dimensions)
const RD4: u32 = HD4 * S; // a head's row, in vec4s
const KC: u32 = 32u / S; // cache rows a chunk (KC × RD4 = 512 vec4s)
const ROWS: u32 = 64u; // (token, head) rows a workgroup
const WG: u32 = ROWS * S; // threads a workgroup
var<workgroup> ks: array<vec4<f32>, 512>; // [KC][RD4] keys
var<workgroup> vs: array<vec4<f32>, 512>; // [KC][RD4] values
const PSN: u32 = select(WG * KC, 1u, S == 1u); // partial scores: none at S = 1
var<workgroup> ps: array<f32, PSN>; // [ROWS][S][KC] partial scores
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

// This thread's row: its running maximum and sum of exponentials, its query slice, its value
// sums; and where its slice starts in a chunk's row and in a cache row.
var<private> m: f32;
var<private> l: f32;
var<private> q: array<vec4<f32>, 16>;
var<private> acc: array<vec4<f32>, 16>;
var<private> in_chunk: u32;
var<private> in_cache: u32;

// The slice's score of the cell at chunk row j (`one_table`: the tile's tokens share one block
// table, the chunk is in workgroup memory) or at cache row `row` (not). The callers pass
// `one_table` as a literal, each in its own loop, so the branch folds away.
fn partial(one_table: bool, j: u32, row: u32) -> f32 {
    var s = vec4<f32>(0.0);
    if (one_table) {
        let b = j * RD4 + in_chunk;
        for (var i = 0u; i < HD4; i++) {
            s += q[i] * ks[b + i];
        }
    } else {
        let o = row * A.n_kv_head * RD4 + in_cache;
        for (var i = 0u; i < HD4; i++) {
            s += q[i] * Kc[o + i];
        }
    }
    return (s.x + s.y) + (s.z + s.w);
}

// Add weight p times the slice's values of the same cell.
fn add_values(one_table: bool, j: u32, row: u32, p: f32) {
    if (one_table) {
        let b = j * RD4 + in_chunk;
        for (var i = 0u; i < HD4; i++) {
            acc[i] += p * vs[b + i];
        }
    } else {
        let o = row * A.n_kv_head * RD4 + in_cache;
        for (var i = 0u; i < HD4; i++) {
            acc[i] += p * Vc[o + i];
        }
    }
}

// Make `mx` (greater than m) the row's maximum: the sum of exponentials and the value sums
// rescaled to it.
fn raise_max(mx: f32) {
    let corr = exp(m - mx);
    l *= corr;
    for (var i = 0u; i < HD4; i++) {
        acc[i] *= corr;
    }
    m = mx;
}

// The weight of a cell of scaled score `s` (the sums rescaled first if it is a new maximum).
fn weight(s: f32) -> f32 {
    if (s > m) {
        raise_max(s);
    }
    let p = exp(s - m);
    l += p;
    return p;
}

// Row r's scaled score of the chunk's cell j: its S partial scores added in slice order.
fn score(r: u32, j: u32) -> f32 {
    var s = ps[r * S * KC + j];
    for (var i = 1u; i < S; i++) {
        s += ps[(r * S + i) * KC + j];
    }
    return s * A.scale;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = A.n_head / A.n_kv_head;
    let per = ROWS / g; // tokens a tile
    let kvh = wid.x;
    let t0 = wid.y * per;
    let t_end = min(t0 + per, A.n_tokens);
    let kvd4 = A.n_kv_head * RD4;
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
    // This thread's row r (token t, query head h) and its slice `part` of the row's dimensions.
    let r = lid / S;
    let part = lid % S;
    let t = t0 + r / g;
    let h = kvh * g + r % g;
    let live = r / g < per && t < t_end;
    m = -3.0e38;
    l = 0.0;
    var mine = vec2<u32>(0u, 0u);
    var toff = Tab[t0];
    if (live) {
        let qo = t * (A.n_head + 2u * A.n_kv_head) * RD4 + h * RD4 + part * HD4;
        for (var i = 0u; i < HD4; i++) {
            q[i] = Q[qo + i];
            acc[i] = vec4<f32>(0.0);
        }
        mine = cells(t);
        toff = Tab[t];
    }
    in_chunk = part * HD4;
    in_cache = kvh * RD4 + part * HD4;
    let one_table = span.z == 1u;
    for (var c0 = span.x; c0 < span.y; c0 += KC) {
        if (one_table) {
            // Thread lid loads vec4s lid, lid + WG, … of the chunk's [KC][RD4].
            for (var j = lid; j < KC * RD4; j += WG) {
                let c = c0 + j / RD4;
                var k = vec4<f32>(0.0);
                var v = vec4<f32>(0.0);
                if (c < span.y) {
                    let o = cache_row(toff, c) * kvd4 + kvh * RD4 + j % RD4;
                    k = Kc[o];
                    v = Vc[o];
                }
                ks[j] = k;
                vs[j] = v;
            }
        }
        workgroupBarrier();
        let lo = max(c0, mine.x);
        let hi = min(c0 + KC, mine.y);
        if (S == 1u) {
            if (one_table) {
                for (var c = lo; c < hi; c++) {
                    add_values(true, c - c0, 0u, weight(partial(true, c - c0, 0u) * A.scale));
                }
            } else {
                for (var c = lo; c < hi; c++) {
                    let row = cache_row(toff, c);
                    add_values(false, 0u, row, weight(partial(false, 0u, row) * A.scale));
                }
            }
        } else {
            if (one_table) {
                for (var c = lo; c < hi; c++) {
                    ps[lid * KC + c - c0] = partial(true, c - c0, 0u);
                }
            } else {
                for (var c = lo; c < hi; c++) {
                    ps[lid * KC + c - c0] = partial(false, 0u, cache_row(toff, c));
                }
            }
            workgroupBarrier();
            if (lo < hi) {
                var cm = m;
                for (var c = lo; c < hi; c++) {
                    cm = max(cm, score(r, c - c0));
                }
                if (cm > m) {
                    raise_max(cm);
                }
                for (var c = lo; c < hi; c++) {
                    let p = exp(score(r, c - c0) - m);
                    l += p;
                    if (one_table) {
                        add_values(true, c - c0, 0u, p);
                    } else {
                        add_values(false, 0u, cache_row(toff, c), p);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (live) {
        let oo = (t * A.n_head + h) * RD4 + part * HD4;
        for (var i = 0u; i < HD4; i++) {
            O[oo + i] = acc[i] / l;
        }
    }
}
