// The RMS norms' shared reduction (rms_norm.wgsl, head_norm.wgsl): a workgroup of 64 threads
// per row, each with its partial sum of squares `s`; the sums added by a tree, in a fixed
// order, and the row's scale 1 / sqrt(mean + eps) returned to every thread.

var<workgroup> part: array<f32, 64>;

fn rms_scale(lid: u32, s: f32, n: u32, eps: f32) -> f32 {
    part[lid] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k / 2u) {
        if (lid < k) {
            part[lid] += part[lid + k];
        }
        workgroupBarrier();
    }
    return 1.0 / sqrt(part[0] / f32(n) + eps);
}
