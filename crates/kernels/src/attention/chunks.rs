//! The chunk driver every decode kernel shares (`x86::decode` with AVX-512, `x86::decode_avx2`,
//! `aarch64::decode` with NEON): the queries rounded to F16, the visible cells gathered
//! [`CHUNK`] at a time as key and value row pointers, the outputs normalised, or with ggml's
//! split-KV decode each range's partial folded as ggml combines them.
#![allow(clippy::missing_safety_doc)]

use crate::attention::portable::{finish, fold, normalize_heads};
use crate::attention::types::{DecodeBuffers, KvRows, DECODE_CHUNK as CHUNK};
use crate::simd::{prefetch_lines, CacheLevel};
use half::f16;

/// How many cells ahead of the one gathered its key and value rows are asked for.
const AHEAD: usize = CHUNK;

/// At cell `c` of the range `start..end` a decode kernel gathers: ask for the key and value rows
/// (into L2) of the cell a chunk ahead, or in the range's first chunk of `c` itself (nothing
/// asked for it earlier). The rows of a chunk's cells are scattered (cache pages, other heads'
/// rows between them): asked for a chunk ahead, they arrive while this chunk is computed,
/// instead of one miss per row in the kernel (SmolLM2 decode at 1024 cells: attention 8.4 ->
/// 4.8 ms per token, AVX2, asking for the chunk's own rows as it is gathered; a chunk ahead
/// instead, Zen 5 at 2048 cells, 1 thread: AVX-512 4.9 -> 4.3 ms, AVX2 6.8 -> 6.2, a Q8_0
/// cache 13.0 -> 6.8; two chunks ahead no better).
#[inline(always)]
pub(crate) fn prefetch_ahead(kv: &KvRows, c: usize, start: usize, end: usize) {
    let cell = if c + AHEAD < end { c + AHEAD } else if c < start + AHEAD { c } else { return };
    let (k, v) = (kv.k_bytes(cell), kv.v_bytes(cell));
    prefetch_lines(k.as_ptr(), k.len(), CacheLevel::L2);
    prefetch_lines(v.as_ptr(), v.len(), CacheLevel::L2);
}

/// Largest head dimension (in 64-value steps) the kernels take.
pub const MAX_STEPS: usize = 4;

/// Whether [`attend_decode_group`] takes this head dimension.
pub fn supports(head_dim: usize) -> bool {
    head_dim.is_multiple_of(64) && (1..=MAX_STEPS).contains(&(head_dim / 64))
}

/// What both decode kernels share: the queries rounded to F16, the state reset, the visible
/// cells gathered `CHUNK` at a time (key and value row pointers) for `chunk`, the outputs
/// normalised. With `split` > 0, all that per range of `split` cells, each range's partial
/// folded into the outputs as ggml combines them (`attention::portable::fold`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn drive(
    q: &[f32],
    kv: &KvRows,
    n_cells: usize,
    visible: &dyn Fn(usize) -> bool,
    split: usize,
    mut bufs: DecodeBuffers,
    out: &mut [f32],
    mut chunk: impl FnMut(&[*const f16], &[*const f16], &mut DecodeBuffers),
) {
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    let b = &mut bufs;
    assert!(supports(hd) && kv.is_f16() && out.len() >= heads * hd);
    assert!(b.qf.len() >= heads * hd && b.acc.len() >= heads * hd && b.state.len() >= heads && b.fin.len() >= heads);
    assert!(b.scores.len() >= heads * CHUNK && b.grow.len() >= heads && b.k32.len() >= hd && b.v32.len() >= hd);
    crate::simd::round_f16_row(&q[..heads * hd], &mut b.qf[..heads * hd]);
    let range = if split == 0 { n_cells.max(1) } else { split };
    if split > 0 {
        out[..heads * hd].fill(0.0);
        b.fin[..heads].fill([f32::NEG_INFINITY, 0.0]);
    }
    // Row pointers of the chunk's visible cells: `[CHUNK]` keys, `[CHUNK]` values.
    let mut kr = [std::ptr::null::<f16>(); CHUNK];
    let mut vr = [std::ptr::null::<f16>(); CHUNK];
    for start in (0..n_cells.max(1)).step_by(range) {
        let end = (start + range).min(n_cells);
        b.acc[..heads * hd].fill(0.0);
        b.state[..heads].fill([f32::NEG_INFINITY, 0.0]);
        let mut n = 0;
        for c in start..end {
            prefetch_ahead(kv, c, start, end);
            if visible(c) {
                let (k, v) = (kv.k(c), kv.v(c));
                (kr[n], vr[n]) = (k.as_ptr(), v.as_ptr());
                n += 1;
            }
            if n > 0 && (n == CHUNK || c + 1 == end) {
                chunk(&kr[..n], &vr[..n], b);
                n = 0;
            }
        }
        if split == 0 {
            return normalize_heads(&b.acc[..heads * hd], &b.state[..heads], hd, out);
        }
        for h in 0..heads {
            fold(&mut b.fin[h], &mut out[h * hd..(h + 1) * hd], b.state[h], &b.acc[h * hd..(h + 1) * hd]);
        }
    }
    for h in 0..heads {
        finish(b.fin[h], &mut out[h * hd..(h + 1) * hd]);
    }
}
