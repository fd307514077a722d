// A whole layer on the device (layers.rs): causal attention of each token over its sequence's
// cached rows 0 ..= pos, read through the sequence's block table as the CPU's cache lays them
// out (row of position p: table[p / 16] · 16 + p % 16). A workgroup of 64 threads per (head,
// token): per chunk of 64 positions, each thread scores one (q · k · scale, four running sums
// over the head's dimensions) and finds its cache row, then the running maximum and sum are
// updated (online softmax, the same values on every thread) and each thread adds the chunk's
// values into its dimensions (d = lid, lid + 64, …), in position order, two positions' values
// loaded before they are added (a decode step's attention is a chain of load latencies).
// With a sliding window w, positions max(0, pos + 1 − w) ..= pos. Sums in f32 (the CPU's F16
// cache and rounding are not reproduced: a bound, not bits).

@group(0) @binding(0) var<storage, read> Q: array<f32>;
@group(0) @binding(1) var<storage, read> Kc: array<f32>;
@group(0) @binding(2) var<storage, read> Vc: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, 64>;
var<workgroup> rows: array<u32, 64>; // the chunk's cache rows

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let hd = A.head_dim;
    let kvh = h / (A.n_head / A.n_kv_head);
    let kvd = A.n_kv_head * hd;
    // Q's columns of token t's row `[q | k | v]` (rope_store.wgsl).
    let qo = t * (A.n_head + 2u * A.n_kv_head) * hd + h * hd;
    for (var d = lid; d < hd; d += 64u) {
        qs[d] = Q[qo + d];
    }
    workgroupBarrier();
    let n_cells = u32(Pos[t]) + 1u;
    var first = 0u;
    if (A.window > 0u && n_cells > A.window) {
        first = n_cells - A.window;
    }
    let toff = Tab[t];
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var c0 = first; c0 < n_cells; c0 += 64u) {
        let c = c0 + lid;
        var s = -3.0e38;
        var row = 0u;
        if (c < n_cells) {
            row = cache_row(toff, c);
            let ko = row * kvd + kvh * hd;
            var s0 = 0.0;
            var s1 = 0.0;
            var s2 = 0.0;
            var s3 = 0.0;
            var d = 0u;
            for (; d + 3u < hd; d += 4u) {
                s0 += qs[d] * Kc[ko + d];
                s1 += qs[d + 1u] * Kc[ko + d + 1u];
                s2 += qs[d + 2u] * Kc[ko + d + 2u];
                s3 += qs[d + 3u] * Kc[ko + d + 3u];
            }
            for (; d < hd; d++) {
                s0 += qs[d] * Kc[ko + d];
            }
            s = ((s0 + s1) + (s2 + s3)) * A.scale;
        }
        sc[lid] = s;
        rows[lid] = row;
        workgroupBarrier();
        let n = min(64u, n_cells - c0);
        var cm = m;
        for (var i = 0u; i < n; i++) {
            cm = max(cm, sc[i]);
        }
        let corr = exp(m - cm);
        l *= corr;
        for (var j = 0u; j < 4u; j++) {
            acc[j] *= corr;
        }
        var i = 0u;
        for (; i + 1u < n; i += 2u) {
            let p0 = exp(sc[i] - cm);
            let p1 = exp(sc[i + 1u] - cm);
            let vo0 = rows[i] * kvd + kvh * hd;
            let vo1 = rows[i + 1u] * kvd + kvh * hd;
            l += p0;
            l += p1;
            for (var j = 0u; j < 4u; j++) {
                let d = lid + 64u * j;
                if (d < hd) {
                    let v0 = Vc[vo0 + d];
                    let v1 = Vc[vo1 + d];
                    acc[j] += p0 * v0;
                    acc[j] += p1 * v1;
                }
            }
        }
        if (i < n) {
            let p = exp(sc[i] - cm);
            l += p;
            let vo = rows[i] * kvd + kvh * hd;
            for (var j = 0u; j < 4u; j++) {
                let d = lid + 64u * j;
                if (d < hd) {
                    acc[j] += p * Vc[vo + d];
                }
            }
        }
        m = cm;
        workgroupBarrier();
    }
    for (var j = 0u; j < 4u; j++) {
        let d = lid + 64u * j;
        if (d < hd) {
            O[(t * A.n_head + h) * hd + d] = acc[j] / l;
        }
    }
}
