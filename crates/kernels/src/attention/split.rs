//! ggml's split-KV decode ([`AttnKernel::Split`](super::AttnKernel::Split)): for one query row
//! over an F16 cache whose padded length `n_kv` is at least 512 cells, ggml-cpu cuts the cells
//! into one chunk per thread (`ceil(n_kv / n_threads)` cells), runs `one_chunk` on each — the
//! reference kernel, restarted: maximum −∞, sum 0, F16 accumulator 0 — and combines the
//! chunks' (maximum, sum, accumulator as f32) in chunk order
//! (`ggml_flash_attn_ext_reduce_partials`):
//!
//! ```text
//! skip chunks whose sum is 0
//! M' = max(M, M_c);  a = exp(M − M'),  b = exp(M_c − M')
//! V  = V·a + V_c·b   (GCC contracts it to fma(V, a, V_c·b)),  S = fma(S, a, S_c·b)
//! out = V · (1/S)    (V itself when S = 0)
//! ```
//!
//! The decode kernels (`x86::attn_decode*`) run the chunks and [`fold`] the partials as they
//! finish; without them each head goes through the portable reference per chunk.

use super::{reference_partial, AttnScratch, KvRows};

/// Fold one chunk's partial (`st` = (maximum, sum), `acc` its unnormalised values) into the
/// running result (`fin`, `out`), as `ggml_flash_attn_ext_reduce_partials` does.
pub(crate) fn fold(fin: &mut [f32; 2], out: &mut [f32], st: [f32; 2], acc: &[f32]) {
    let [mc, sc] = st;
    if sc == 0.0 {
        return;
    }
    let m = fin[0].max(mc);
    let (a, b) = ((fin[0] - m).exp(), (mc - m).exp());
    for (o, &v) in out.iter_mut().zip(acc) {
        *o = o.mul_add(a, v * b);
    }
    fin[1] = fin[1].mul_add(a, sc * b);
    fin[0] = m;
}

/// The combined values divided by the combined sum (left as they are when it is 0).
pub(crate) fn finish(fin: [f32; 2], out: &mut [f32]) {
    if fin[1] != 0.0 {
        let inv = 1.0 / fin[1];
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

/// Split-KV attention of the `q.len() / head_dim` query heads in `q` over the visible cells
/// `c < n_cells` of an F16 cache, in chunks of `chunk` cells.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_split(
    kernels: &crate::Kernels,
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    scale: f32,
    visible: &dyn Fn(usize) -> bool,
    chunk: usize,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let chunk = chunk.max(1);
    #[cfg(target_arch = "x86_64")]
    if super::attend_decode(kernels, q, kv, n_cells, scale, visible, chunk, scratch, out) {
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = kernels;
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        let mut fin = [f32::NEG_INFINITY, 0.0];
        oh.fill(0.0);
        for a in (0..n_cells).step_by(chunk) {
            let st = reference_partial(qh, kv, a..(a + chunk).min(n_cells), scale, visible, scratch);
            let acc = &mut scratch.acc[..hd];
            for (d, s) in acc.iter_mut().zip(&scratch.acc16) {
                *d = s.to_f32();
            }
            fold(&mut fin, oh, st, &scratch.acc[..hd]);
        }
        finish(fin, oh);
    }
}
