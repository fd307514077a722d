//! The portable attention kernels, the reference every SIMD twin is tested against per head:
//! ggml's `one_chunk` ([`reference_partial`]: F16 query and dots, F16 accumulator rescaled as
//! the maximum grows) and its tiled kernel ([`attend_tiled`]: F32, 64-cell tiles, softmax sums
//! in double), the softmax step the decode kernels share ([`softmax_steps`]), and the fold of
//! ggml's split-KV decode ([`fold`], [`finish`]):
//!
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
//! The decode kernels (`x86::decode*`) run the chunks and [`fold`] the partials as they
//! finish; without them each head goes through the portable reference per chunk.

use crate::attention::Scale;
use super::tiles::tile_step;
use super::types::{AttnScratch, Cells, KvRows, Visible, DECODE_CHUNK, KV_TILE};
use crate::exp::expf_ggml;
use crate::matmul::portable::dot_f16_ggml;
use crate::simd::reduce_add_16;
use half::f16;

/// Per head, the running maximum over the chunk's `n` scores, which fixes every cell's
/// exponent — `max_old - score` where the maximum grows (`grow` bit set), `score - max`
/// elsewhere, exactly the scalar kernel's arguments — then all the exponentials at once
/// (`exps`, libm's `expf` lane for lane). `scores` become the exponentials.
pub fn softmax_steps(scores: &mut [f32], grow: &mut [u64], state: &mut [[f32; 2]], n: usize, exps: impl Fn(&mut [f32])) {
    for ((st, g), sc) in state.iter_mut().zip(grow.iter_mut()).zip(scores.chunks_exact_mut(DECODE_CHUNK)) {
        *g = softmax_step(&mut sc[..n], st, &exps);
    }
}

/// [`softmax_steps`] for one head over the scores `sc` (at most 64): returns its grow mask.
#[inline(always)]
pub(crate) fn softmax_step(sc: &mut [f32], st: &mut [f32; 2], exps: impl Fn(&mut [f32])) -> u64 {
    let (mut m, mut g) = (st[0], 0u64);
    for (i, s) in sc.iter_mut().enumerate() {
        if *s > m {
            (*s, m) = (m - *s, *s);
            g |= 1 << i;
        } else {
            *s -= m;
        }
    }
    st[0] = m;
    exps(sc);
    g
}

/// `out[h] = acc[h] / sum_h` for every head of `head_dim` values, where `state[h]` is the
/// head's (maximum, sum); zeros for a head that saw no cell.
pub(crate) fn normalize_heads(acc: &[f32], state: &[[f32; 2]], head_dim: usize, out: &mut [f32]) {
    for ((st, a), o) in state.iter().zip(acc.chunks_exact(head_dim)).zip(out.chunks_exact_mut(head_dim)) {
        let inv = if st[1] == 0.0 { 0.0 } else { 1.0 / st[1] };
        for (o, &a) in o.iter_mut().zip(a) {
            *o = a * inv;
        }
    }
}

/// ggml's `one_chunk` over an F16 cache ([`AttnKernel::Reference`]; with `wide`,
/// [`AttnKernel::Wide`]: the V accumulator in F32) for one head.
pub(crate) fn attend_reference(
    q: &[f32],
    cells: Cells,
    scale: Scale,
    wide: bool,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let Cells { kv, n: n_cells, visible } = cells;
    let [_, s] = reference_partial(q, kv, 0..n_cells, scale, visible, wide, scratch);
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    if wide {
        for (o, a) in out.iter_mut().zip(&scratch.acc) {
            *o = a * inv;
        }
    } else {
        for (o, a) in out.iter_mut().zip(&scratch.acc16) {
            *o = a.to_f32() * inv;
        }
    }
}

/// ggml's `one_chunk` over the visible cells of `cells`: returns (maximum, sum) and leaves the
/// unnormalised F16 accumulator in `scratch.acc16` (with `wide`, the F32 one in `scratch.acc`).
pub(crate) fn reference_partial(
    q: &[f32],
    kv: &KvRows,
    cells: std::ops::Range<usize>,
    scale: Scale,
    visible: Visible,
    wide: bool,
    scratch: &mut AttnScratch,
) -> [f32; 2] {
    for (d, &s) in scratch.q16.iter_mut().zip(q) {
        *d = f16::from_f32(s);
    }
    if wide {
        scratch.acc.iter_mut().for_each(|a| *a = 0.0);
    } else {
        scratch.acc16.iter_mut().for_each(|a| *a = f16::ZERO);
    }
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    for c in visible.clip(cells) {
        if !visible.at(c) {
            continue;
        }
        let score = scale.score(dot_f16_ggml(kv.k(c), &scratch.q16));
        let (mut ms, mut vs) = (1f32, 1f32);
        if score > m {
            let old = m;
            m = score;
            ms = (old - m).exp();
            if wide {
                scratch.acc.iter_mut().for_each(|a| *a *= ms);
            } else {
                scratch.acc16.iter_mut().for_each(|a| *a = f16::from_f32(a.to_f32() * ms));
            }
        } else {
            vs = (score - m).exp();
        }
        if wide {
            for (a, &vv) in scratch.acc.iter_mut().zip(kv.v(c)) {
                *a = vv.to_f32().mul_add(vs, *a);
            }
        } else {
            for (a, &vv) in scratch.acc16.iter_mut().zip(kv.v(c)) {
                *a = f16::from_f32(vv.to_f32().mul_add(vs, a.to_f32()));
            }
        }
        s = s.mul_add(ms, vs);
    }
    [m, s]
}

/// ggml's tiled kernel, portable. The AVX2 version is `x86::reference::attend_tiled_group` (one or
/// more heads of a GQA group at once), bit-identical to this per head.
pub(crate) fn attend_tiled(
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let Cells { kv, n: n_cells, visible } = cells;
    scratch.acc.iter_mut().for_each(|a| *a = 0.0);
    let mut st = [f32::NEG_INFINITY, 0f32];
    let mut t0 = 0;
    while t0 < n_cells {
        let t1 = (t0 + KV_TILE).min(n_cells);
        for c in t0..t1 {
            scratch.scores[c - t0] = if visible.at(c) {
                scale.score(kv.k(c).iter().zip(q).fold(0f32, |acc, (&kk, &qq)| kk.to_f32().mul_add(qq, acc)))
            } else {
                f32::NEG_INFINITY
            };
        }
        let max = |x: &[f32]| x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        // ggml_vec_soft_max_f32: its own expf, each group of 16 reduced in float (GCC's
        // `_mm512_reduce_add_ps` order), the groups summed in double, added to S in double.
        let softmax = |p: &mut [f32], m: f32| {
            let mut sum = 0f64;
            for g in p.chunks_exact_mut(16) {
                for p in g.iter_mut() {
                    *p = expf_ggml(*p - m);
                }
                sum += reduce_add_16(&<[f32; 16]>::try_from(&*g).expect("16 lanes")) as f64;
            }
            sum
        };
        if !tile_step(&mut scratch.scores, t1 - t0, &mut st, &mut scratch.acc, max, softmax) {
            t0 = t1;
            continue;
        }
        for c in t0..t1 {
            let p = scratch.scores[c - t0];
            if p == 0.0 {
                continue;
            }
            for (a, &vv) in scratch.acc.iter_mut().zip(kv.v(c)) {
                *a = p.mul_add(vv.to_f32(), *a);
            }
        }
        t0 = t1;
    }
    let inv = if st[1] == 0.0 { 0.0 } else { 1.0 / st[1] };
    for (o, &a) in out.iter_mut().zip(&scratch.acc) {
        *o = a * inv;
    }
}

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

/// One head's partial (`st` = (maximum, sum), `acc` its unnormalised values) finished with an
/// attention sink `sink` counted in the softmax — a logit with no value — as ggml's flash
/// attention counts it (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`): a sink above
/// the maximum rescales the values and the sum to it, one below adds `exp(sink − max)` to the
/// sum; then the values divided by the sum.
pub(crate) fn sink_finish(mut st: [f32; 2], sink: f32, acc: &mut [f32]) {
    super::tiles::sink_step(&mut st, sink, acc);
    let inv = if st[1] == 0.0 { 0.0 } else { 1.0 / st[1] };
    acc.iter_mut().for_each(|v| *v *= inv);
}

/// One range of [`attend_split`] alone (cells `r·chunk ..`): per head its partial, `state[h]`
/// and the unnormalised values in `acc[h·hd..]`, for [`fold`] in range order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_split_range(
    q: &[f32],
    cells: Cells,
    scale: Scale,
    chunk: usize,
    r: usize,
    scratch: &mut AttnScratch,
    state: &mut [[f32; 2]],
    acc: &mut [f32],
) {
    let hd = cells.kv.head_dim;
    for ((qh, ah), st) in q.chunks_exact(hd).zip(acc.chunks_exact_mut(hd)).zip(state.iter_mut()) {
        *st = range_partial(qh, cells, scale, chunk, r, scratch);
        ah.copy_from_slice(&scratch.acc[..hd]);
    }
}

/// One head's partial over range `r` of `chunk` cells ([`reference_partial`] restarted):
/// returns (maximum, sum) and leaves the unnormalised values, widened, in `scratch.acc[..hd]`.
fn range_partial(qh: &[f32], cells: Cells, scale: Scale, chunk: usize, r: usize, scratch: &mut AttnScratch) -> [f32; 2] {
    let Cells { kv, n: n_cells, visible } = cells;
    let a = (r * chunk).min(n_cells);
    let st = reference_partial(qh, kv, a..(a + chunk).min(n_cells), scale, visible, false, scratch);
    for (d, s) in scratch.acc[..kv.head_dim].iter_mut().zip(&scratch.acc16) {
        *d = s.to_f32();
    }
    st
}

/// ggml's split-KV decode, portable: for each head, [`reference_partial`] restarted on every
/// chunk of `chunk` cells, the partials folded in order.
pub(crate) fn attend_split(
    q: &[f32],
    cells: Cells,
    scale: Scale,
    chunk: usize,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let (hd, n_cells) = (cells.kv.head_dim, cells.n);
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        let mut fin = [f32::NEG_INFINITY, 0.0];
        oh.fill(0.0);
        for r in 0..n_cells.div_ceil(chunk) {
            let st = range_partial(qh, cells, scale, chunk, r, scratch);
            fold(&mut fin, oh, st, &scratch.acc[..hd]);
        }
        finish(fin, oh);
    }
}
