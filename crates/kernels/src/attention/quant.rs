//! ggml's one-chunk attention over a quantized KV cache (Q8_0/Q4_0 keys and/or values): per
//! head ([`attend_quant`]), for the heads of a GQA group at once ([`attend_quant_group`]), and
//! for the rows of a prefill block with their heads ([`attend_quant_rows`]), the same bits per
//! head.

use crate::attention::Scale;
use super::chunks::prefetch_ahead;
use super::portable::{normalize_heads, softmax_step, softmax_steps};
use super::types::{AttnScratch, Cells, KvRows, RowsScratch, DECODE_CHUNK, ROWS_MAX_VECTORS};
#[cfg(target_arch = "x86_64")]
use crate::simd::has_fma;
use crate::DType;
use half::f16;

pub(super) fn attend_quant(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: FMA support was detected.
        return unsafe { attend_quant_fma(kernels, q, cells, scale, scratch, out) };
    }
    attend_quant_body(kernels, q, cells, scale, scratch, out)
}

/// [`attend_quant_body`] compiled with FMA: its `mul_add`s are one instruction instead of a
/// libm call per element (the same bits; the call made Q8_0-cache decode 13× slower than F16).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn attend_quant_fma(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    attend_quant_body(kernels, q, cells, scale, scratch, out)
}

#[inline(always)]
fn attend_quant_body(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let Cells { kv, visible, .. } = cells;
    let kops = kernels.ops(kv.k_type).expect("KV cache type checked at start-up");
    let qt = kops.vec_dot_type;
    let qq = &mut scratch.qq[..crate::row_bytes(qt, q.len())];
    kernels.from_float(qt).expect("activation quantizer")(q, qq);
    let v_f16 = kv.v_type == DType::F16;
    let v_to_float = kernels.to_float(kv.v_type).expect("KV cache type checked at start-up");
    scratch.acc16.iter_mut().for_each(|a| *a = f16::ZERO);
    scratch.acc.iter_mut().for_each(|a| *a = 0.0);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    for c in cells.span() {
        if !visible.at(c) {
            continue;
        }
        let score = scale.score((kops.vec_dot)(kv.k_bytes(c), qq));
        let (mut ms, mut vs) = (1f32, 1f32);
        if score > m {
            let old = m;
            m = score;
            ms = (old - m).exp();
            if v_f16 {
                scratch.acc16.iter_mut().for_each(|a| *a = f16::from_f32(a.to_f32() * ms));
            } else {
                scratch.acc.iter_mut().for_each(|a| *a *= ms);
            }
        } else {
            vs = (score - m).exp();
        }
        if v_f16 {
            for (a, &vv) in scratch.acc16.iter_mut().zip(kv.v(c)) {
                *a = f16::from_f32(vv.to_f32().mul_add(vs, a.to_f32()));
            }
        } else {
            v_to_float(kv.v_bytes(c), &mut scratch.v32);
            for (a, &vv) in scratch.acc.iter_mut().zip(&scratch.v32) {
                *a = vv.mul_add(vs, *a);
            }
        }
        s = s.mul_add(ms, vs);
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    for (i, o) in out.iter_mut().enumerate() {
        *o = if v_f16 { scratch.acc16[i].to_f32() } else { scratch.acc[i] } * inv;
    }
}

/// [`attend_quant`] for the query heads of a GQA group at once over a quantized cache (Q8_0/Q4_0
/// keys, values Q8_0/Q4_0 or F16, `--cache-type-k/-v`), the same bits per head: per chunk of
/// [`DECODE_CHUNK`] visible cells every head's scores (`vec_dot` against its query quantized
/// once), the chunk's running maxima and exponentials ([`softmax_steps`], vectorised `expf`
/// where the table has it), then each value row converted to f32 once for all heads and the
/// accumulators updated (`acc · ms` where the maximum grew, then `fma(v, vs, acc)`; with F16
/// values each result rounded to F16, ggml's F16 accumulator, kept here as f32 values that F16
/// represents exactly). `ahead`: ask for the KV rows a chunk before they are read (they are in
/// memory, not in cache). `sinks` (gpt-oss, one per head): each head's attention sink counted
/// after the last cell, as ggml's one-chunk kernel counts it ([`finish_heads`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_quant_group(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
    ahead: bool,
    sinks: Option<&[f32]>,
) {
    #[cfg(target_arch = "x86_64")]
    if kernels.isa() >= crate::Isa::Avx2 {
        // SAFETY: an Avx2 table is only built after detecting AVX2 and FMA.
        return unsafe { attend_quant_group_avx2(kernels, q, cells, scale, scratch, out, ahead, sinks) };
    }
    attend_quant_group_body::<false>(kernels, q, cells, scale, scratch, out, ahead, sinks)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn attend_quant_group_avx2(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
    ahead: bool,
    sinks: Option<&[f32]>,
) {
    attend_quant_group_body::<true>(kernels, q, cells, scale, scratch, out, ahead, sinks)
}

/// `X86`: compiled inside [`attend_quant_group_avx2`] (AVX2, FMA and F16C available).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_quant_group_body<const X86: bool>(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: Scale,
    scratch: &mut AttnScratch,
    out: &mut [f32],
    ahead: bool,
    sinks: Option<&[f32]>,
) {
    let span = cells.span();
    let Cells { kv, n: n_cells, visible } = cells;
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    let kops = kernels.ops(kv.k_type).expect("KV cache type checked at start-up");
    let qt = kops.vec_dot_type;
    let qrb = crate::row_bytes(qt, hd);
    let v_to_float = kernels.to_float(kv.v_type).expect("KV cache type checked at start-up");
    let exps = |x: &mut [f32]| expfs(kernels, x);
    let v_f16 = kv.v_type == DType::F16;
    let AttnScratch { gqq, dacc, gstate, gscores, dgrow, k32, rows, .. } = scratch;
    let vrows = &mut rows.v32[..DECODE_CHUNK * hd];
    let (qq, acc, state) = (&mut gqq[..heads * qrb], &mut dacc[..heads * hd], &mut gstate[..heads]);
    for (qh, qb) in q.chunks_exact(hd).zip(qq.chunks_exact_mut(qrb)) {
        kernels.from_float(qt).expect("activation quantizer")(qh, qb);
    }
    acc.fill(0.0);
    state.fill([f32::NEG_INFINITY, 0.0]);
    // Gathered here rather than through a closure-taking helper: a closure would be compiled
    // apart from this FMA-enabled body, its `mul_add`s back to libm calls.
    let mut cells = [0usize; DECODE_CHUNK];
    let mut n = 0;
    for c in span.clone() {
        if ahead {
            prefetch_ahead(kv, c, span.start, n_cells);
        }
        if visible.at(c) {
            cells[n] = c;
            n += 1;
        }
        if n == 0 || (n < DECODE_CHUNK && c + 1 < n_cells) {
            continue;
        }
        for (i, &cell) in cells[..n].iter().enumerate() {
            let k = kv.k_bytes(cell);
            for (h, qb) in qq.chunks_exact(qrb).enumerate() {
                gscores[h * DECODE_CHUNK + i] = scale.score((kops.vec_dot)(k, qb));
            }
        }
        softmax_steps(gscores, dgrow, state, n, exps);
        // The chunk's value rows converted once, then each head's accumulator over them.
        for (i, &cell) in cells[..n].iter().enumerate() {
            v_to_float(kv.v_bytes(cell), &mut vrows[i * hd..(i + 1) * hd]);
        }
        for (h, st) in state.iter_mut().enumerate() {
            let e = &gscores[h * DECODE_CHUNK..(h + 1) * DECODE_CHUNK];
            st[1] = accumulate::<X86>(&mut acc[h * hd..(h + 1) * hd], vrows, 0..n, e, dgrow[h], st[1], v_f16, k32);
        }
        n = 0;
    }
    finish_heads(acc, state, hd, sinks, out);
}


/// libm's `expf` of every element, on the table's widest lanes (the same bits).
fn expfs(kernels: &crate::Kernels, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if kernels.isa().avx512() {
            // SAFETY: an Avx512 table is only built after detecting AVX-512 F/VL (and FMA).
            return unsafe { crate::exp::x86::expf_slice(x) };
        }
        if kernels.isa() >= crate::Isa::Avx2 {
            // SAFETY: an Avx2 table is only built after detecting AVX2 and FMA.
            return unsafe { crate::exp::x86::expf_slice_avx2(x) };
        }
    }
    let _ = kernels;
    x.iter_mut().for_each(|v| *v = v.exp());
}

/// One cell's value row `v` (f32) into one head's accumulator `a`, given the cell's factors
/// (`ms` rescales what was accumulated, `vs` weighs the row): ggml's f32 accumulator for
/// quantized values, its F16 one ([`mad_f16`]) for F16 values.
#[inline(always)]
fn value_step(a: &mut [f32], v: &[f32], ms: f32, vs: f32, v_f16: bool, tmp: &mut [f32]) {
    if v_f16 {
        return mad_f16(a, v, ms, vs, tmp);
    }
    // Skipping `× 1` changes no bits.
    if ms != 1.0 {
        a.iter_mut().for_each(|x| *x *= ms);
    }
    for (x, &v) in a.iter_mut().zip(v) {
        *x = v.mul_add(vs, *x);
    }
}

/// [`attend_quant_group`] for the rows of one sequence at once (prefill): row `r`'s `heads`
/// query heads (`q[r]`, `out[r]`) see the logical cells `spans[r]`; at most
/// [`ROWS_MAX_VECTORS`] rows × heads. Every head of every row gets the bits of its own
/// [`attend_quant`] call: per chunk of [`DECODE_CHUNK`] cells, each cell's key scored against
/// the query of every vector that sees it, each vector's softmax step over the cells it sees,
/// then each value row converted to f32 once for all the vectors (where each row used to convert
/// it again). `sinks`: each of the `heads` heads' attention sink, as in [`attend_quant_group`].
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_quant_rows(kernels: &crate::Kernels, q: &[&[f32]], heads: usize, spans: &[std::ops::Range<usize>], kv: &KvRows, scale: Scale, sinks: Option<&[f32]>, scratch: &mut AttnScratch, out: &mut [&mut [f32]]) {
    #[cfg(target_arch = "x86_64")]
    if kernels.isa() >= crate::Isa::Avx2 {
        // SAFETY: an Avx2 table is only built after detecting AVX2, FMA and F16C.
        return unsafe { attend_quant_rows_avx2(kernels, q, heads, spans, kv, scale, sinks, scratch, out) };
    }
    attend_quant_rows_body::<false>(kernels, q, heads, spans, kv, scale, sinks, scratch, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn attend_quant_rows_avx2(kernels: &crate::Kernels, q: &[&[f32]], heads: usize, spans: &[std::ops::Range<usize>], kv: &KvRows, scale: Scale, sinks: Option<&[f32]>, scratch: &mut AttnScratch, out: &mut [&mut [f32]]) {
    attend_quant_rows_body::<true>(kernels, q, heads, spans, kv, scale, sinks, scratch, out)
}

/// `X86`: compiled inside [`attend_quant_rows_avx2`] (AVX2, FMA and F16C available).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_quant_rows_body<const X86: bool>(kernels: &crate::Kernels, q: &[&[f32]], heads: usize, spans: &[std::ops::Range<usize>], kv: &KvRows, scale: Scale, sinks: Option<&[f32]>, scratch: &mut AttnScratch, out: &mut [&mut [f32]]) {
    const CH: usize = DECODE_CHUNK;
    let hd = kv.head_dim;
    let n = q.len() * heads;
    assert!(n <= ROWS_MAX_VECTORS && spans.len() == q.len() && out.len() == q.len(), "{n} query vectors");
    let kops = kernels.ops(kv.k_type).expect("KV cache type checked at start-up");
    let qt = kops.vec_dot_type;
    let qrb = crate::row_bytes(qt, hd);
    let v_to_float = kernels.to_float(kv.v_type).expect("KV cache type checked at start-up");
    let v_f16 = kv.v_type == DType::F16;
    let AttnScratch { rows, k32, .. } = scratch;
    let RowsScratch { qq, scores, acc, state, v32, .. } = rows;
    let (qq, acc, state) = (&mut qq[..n * qrb], &mut acc[..n * hd], &mut state[..n]);
    let quant = kernels.from_float(qt).expect("activation quantizer");
    for (i, qb) in qq.chunks_exact_mut(qrb).enumerate() {
        quant(&q[i / heads][(i % heads) * hd..][..hd], qb);
    }
    acc.fill(0.0);
    state.fill([f32::NEG_INFINITY, 0.0]);
    let lo = spans.iter().map(|s| s.start).min().unwrap_or(0);
    let hi = spans.iter().map(|s| s.end).max().unwrap_or(0);
    let mut grow = [0u64; ROWS_MAX_VECTORS];
    for c0 in (lo..hi).step_by(CH) {
        let c1 = (c0 + CH).min(hi);
        // The cells of the chunk row `r` sees (empty, never reversed, where it sees none).
        let seen = |r: usize| {
            let a = spans[r].start.clamp(c0, c1);
            a..spans[r].end.clamp(a, c1)
        };
        for c in c0..c1 {
            let k = kv.k_bytes(c);
            for (r, span) in spans.iter().enumerate() {
                if span.contains(&c) {
                    for i in r * heads..(r + 1) * heads {
                        scores[i * CH + c - c0] = scale.score((kops.vec_dot)(k, &qq[i * qrb..(i + 1) * qrb]));
                    }
                }
            }
        }
        let (mut va, mut vb) = (c1, c0);
        for (i, (st, g)) in state.iter_mut().zip(grow.iter_mut()).enumerate() {
            let s = seen(i / heads);
            *g = 0;
            if s.start < s.end {
                *g = softmax_step(&mut scores[i * CH + s.start - c0..i * CH + s.end - c0], st, |x: &mut [f32]| expfs(kernels, x)) << (s.start - c0);
                (va, vb) = (va.min(s.start), vb.max(s.end));
            }
        }
        for c in va..vb {
            v_to_float(kv.v_bytes(c), &mut v32[(c - c0) * hd..(c - c0 + 1) * hd]);
        }
        for (i, (st, &g)) in state.iter_mut().zip(grow.iter()).enumerate() {
            let (seen, e) = (seen(i / heads), &scores[i * CH..(i + 1) * CH]);
            st[1] = accumulate::<X86>(&mut acc[i * hd..(i + 1) * hd], v32, seen.start - c0..seen.end - c0, e, g, st[1], v_f16, k32);
        }
    }
    for (r, o) in out.iter_mut().enumerate() {
        finish_heads(&mut acc[r * heads * hd..(r + 1) * heads * hd], &state[r * heads..(r + 1) * heads], hd, sinks, o);
    }
}

/// Each head's output from its unnormalised values `acc` and its (maximum, sum) `state`
/// ([`normalize_heads`]); with `sinks`, head `h`'s sink `sinks[h]` counted first in its softmax
/// as ggml's one-chunk kernel counts it after its last cell (`tiles::sink_step`: a sink above
/// the maximum rescales the values and the sum, one below adds to the sum).
fn finish_heads(acc: &mut [f32], state: &[[f32; 2]], hd: usize, sinks: Option<&[f32]>, out: &mut [f32]) {
    let Some(sinks) = sinks else { return normalize_heads(acc, state, hd, out) };
    assert!(sinks.len() == state.len(), "{} sinks for {} heads", sinks.len(), state.len());
    for (((a, &st), &sink), o) in acc.chunks_exact_mut(hd).zip(state).zip(sinks).zip(out.chunks_exact_mut(hd)) {
        let mut st = st;
        super::tiles::sink_step(&mut st, sink, a);
        normalize_heads(a, &[st], hd, o);
    }
}

/// One vector's accumulator `a` over the cells `cells` of a chunk: `v` its value rows in f32
/// (`[cell][a.len()]`), `e` the cells' exponentials, `grow` the cells where the maximum grew
/// (`ms = e`, `vs = 1` there, `ms = 1`, `vs = e` elsewhere); [`value_step`] cell by cell, on
/// 8 vectors of accumulators held in registers where the table and the head dimension allow.
/// Returns the softmax sum `sum` carried over the cells.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn accumulate<const X86: bool>(a: &mut [f32], v: &[f32], cells: std::ops::Range<usize>, e: &[f32], grow: u64, mut sum: f32, v_f16: bool, tmp: &mut [f32]) -> f32 {
    let hd = a.len();
    let factors = |j: usize| if grow >> j & 1 != 0 { (e[j], 1f32) } else { (1f32, e[j]) };
    #[cfg(target_arch = "x86_64")]
    if X86 && hd.is_multiple_of(32) {
        // SAFETY: `X86` instances run with AVX2, FMA and F16C; `v` holds the rows `cells`
        // (`values_x86` asserts it).
        return unsafe { values_x86(a, v, cells, sum, factors, v_f16) };
    }
    for j in cells {
        let (ms, vs) = factors(j);
        value_step(a, &v[j * hd..(j + 1) * hd], ms, vs, v_f16, tmp);
        sum = sum.mul_add(ms, vs);
    }
    sum
}

/// [`value_step`] over the cells `cells` of a chunk (`v`: `[cell][a.len()]` f32 rows,
/// `factors(j)`: cell `j`'s `(ms, vs)`), 32 dimensions at a time with the accumulators in
/// registers across the cells; `a.len()` a multiple of 32. Returns the softmax sum `sum`
/// carried over the cells (`fma(sum, ms, vs)` each).
///
/// # Safety
/// AVX2, FMA and F16C; `v` holds the rows `cells`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn values_x86(a: &mut [f32], v: &[f32], cells: std::ops::Range<usize>, mut sum: f32, factors: impl Fn(usize) -> (f32, f32), f16: bool) -> f32 {
    // SAFETY (all four): the caller's contract. Eight vectors of accumulators where the
    // dimensions allow: eight independent chains hide the latency of each step (for F16 values
    // an FMA and a rounding round trip).
    match (f16, a.len().is_multiple_of(64)) {
        (true, true) => unsafe { values_x86_n::<true, 8>(a, v, cells.clone(), &factors) },
        (true, false) => unsafe { values_x86_n::<true, 4>(a, v, cells.clone(), &factors) },
        (false, true) => unsafe { values_x86_n::<false, 8>(a, v, cells.clone(), &factors) },
        (false, false) => unsafe { values_x86_n::<false, 4>(a, v, cells.clone(), &factors) },
    }
    for j in cells {
        let (ms, vs) = factors(j);
        sum = sum.mul_add(ms, vs);
    }
    sum
}

/// [`values_x86`]' accumulators; `F16`: each result rounded to F16.
///
/// # Safety
/// As [`values_x86`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn values_x86_n<const F16: bool, const NB: usize>(a: &mut [f32], v: &[f32], cells: std::ops::Range<usize>, factors: &impl Fn(usize) -> (f32, f32)) {
    use std::arch::x86_64::*;
    let hd = a.len();
    assert!(hd.is_multiple_of(8 * NB) && v.len() >= cells.end * hd);
    let round = |x: __m256| if F16 { _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) } else { x };
    for d0 in (0..hd).step_by(8 * NB) {
        // SAFETY: d0 + 8·NB <= hd, inside `a`; row j's dimensions d0.. lie inside `v` (asserted).
        unsafe {
            let p = a.as_mut_ptr().add(d0);
            let mut x: [__m256; NB] = std::array::from_fn(|k| _mm256_loadu_ps(p.add(8 * k)));
            for j in cells.clone() {
                let (ms, vs) = factors(j);
                let row = v.as_ptr().add(j * hd + d0);
                if ms != 1.0 {
                    let m = _mm256_set1_ps(ms);
                    x = x.map(|x| round(_mm256_mul_ps(x, m)));
                }
                let s = _mm256_set1_ps(vs);
                for (k, x) in x.iter_mut().enumerate() {
                    *x = round(_mm256_fmadd_ps(_mm256_loadu_ps(row.add(8 * k)), s, *x));
                }
            }
            for (k, x) in x.iter().enumerate() {
                _mm256_storeu_ps(p.add(8 * k), *x);
            }
        }
    }
}

/// One step of ggml's F16 value accumulator (`ggml_vec_scale_f16`, `ggml_vec_mad_f16`), on f32
/// values that F16 represents exactly: `a = f16(a · ms)` where `ms ≠ 1` (`× 1` changes no F16
/// value), then `a = f16(fma(v, vs, a))`, each element rounded to nearest, ties to even
/// (`simd::round_f16_row`: F16C or NEON); `tmp`: at least `a.len()` values. The x86 tables take
/// [`values_x86`] instead: a quantized cache's head dimension is a multiple of its 32-value blocks.
#[inline(always)]
fn mad_f16(a: &mut [f32], v: &[f32], ms: f32, vs: f32, tmp: &mut [f32]) {
    let tmp = &mut tmp[..a.len()];
    if ms != 1.0 {
        a.iter().zip(tmp.iter_mut()).for_each(|(x, t)| *t = *x * ms);
        crate::simd::round_f16_row(tmp, a);
    }
    a.iter().zip(v).zip(tmp.iter_mut()).for_each(|((x, &v), t)| *t = v.mul_add(vs, *x));
    crate::simd::round_f16_row(tmp, a);
}
