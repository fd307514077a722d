//! ggml's one-chunk attention over a quantized KV cache (Q8_0/Q4_0 keys and/or values): per
//! head ([`attend_quant`]) and for the heads of a GQA group at once ([`attend_quant_group`]),
//! the same bits per head.

use super::chunks::prefetch_ahead;
use super::portable::{normalize_heads, softmax_steps};
use super::types::{AttnScratch, Cells, DECODE_CHUNK};
#[cfg(target_arch = "x86_64")]
use crate::simd::has_fma;
use crate::DType;
use half::f16;

pub(super) fn attend_quant(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: f32,
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
    scale: f32,
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
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let Cells { kv, n: n_cells, visible } = cells;
    let kops = kernels.ops(kv.k_type).expect("KV cache type checked at start-up");
    let qt = kops.vec_dot_type;
    let qq = &mut scratch.qq[..crate::row_bytes(qt, q.len())];
    kernels.from_float(qt).expect("activation quantizer")(q, qq);
    let v_f16 = kv.v_type == DType::F16;
    let v_to_float = kernels.to_float(kv.v_type).expect("KV cache type checked at start-up");
    scratch.acc16.iter_mut().for_each(|a| *a = f16::ZERO);
    scratch.acc.iter_mut().for_each(|a| *a = 0.0);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    for c in 0..n_cells {
        if !visible(c) {
            continue;
        }
        let score = (kops.vec_dot)(kv.k_bytes(c), qq) * scale;
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
/// memory, not in cache).
pub(super) fn attend_quant_group(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [f32],
    ahead: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if kernels.isa() >= crate::Isa::Avx2 {
        // SAFETY: an Avx2 table is only built after detecting AVX2 and FMA.
        return unsafe { attend_quant_group_avx2(kernels, q, cells, scale, scratch, out, ahead) };
    }
    attend_quant_group_body::<false>(kernels, q, cells, scale, scratch, out, ahead)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn attend_quant_group_avx2(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [f32],
    ahead: bool,
) {
    attend_quant_group_body::<true>(kernels, q, cells, scale, scratch, out, ahead)
}

/// `X86`: compiled inside [`attend_quant_group_avx2`] (AVX2, FMA and F16C available).
#[inline(always)]
fn attend_quant_group_body<const X86: bool>(
    kernels: &crate::Kernels,
    q: &[f32],
    cells: Cells,
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [f32],
    ahead: bool,
) {
    let Cells { kv, n: n_cells, visible } = cells;
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    let kops = kernels.ops(kv.k_type).expect("KV cache type checked at start-up");
    let qt = kops.vec_dot_type;
    let qrb = crate::row_bytes(qt, hd);
    let v_to_float = kernels.to_float(kv.v_type).expect("KV cache type checked at start-up");
    let exps = |x: &mut [f32]| {
        #[cfg(target_arch = "x86_64")]
        {
            if kernels.isa() == crate::Isa::Avx512 {
                // SAFETY: an Avx512 table is only built after detecting AVX-512 F/VL (and FMA).
                return unsafe { crate::exp::x86::expf_slice(x) };
            }
            if kernels.isa() >= crate::Isa::Avx2 {
                // SAFETY: an Avx2 table is only built after detecting AVX2 and FMA.
                return unsafe { crate::exp::x86::expf_slice_avx2(x) };
            }
        }
        x.iter_mut().for_each(|v| *v = v.exp());
    };
    let v_f16 = kv.v_type == DType::F16;
    let AttnScratch { gqq, dacc, gstate, gscores, dgrow, v32, k32, .. } = scratch;
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
    for c in 0..n_cells {
        if ahead {
            prefetch_ahead(kv, c, 0, n_cells);
        }
        if visible(c) {
            cells[n] = c;
            n += 1;
        }
        if n == 0 || (n < DECODE_CHUNK && c + 1 < n_cells) {
            continue;
        }
        for (i, &cell) in cells[..n].iter().enumerate() {
            let k = kv.k_bytes(cell);
            for (h, qb) in qq.chunks_exact(qrb).enumerate() {
                gscores[h * DECODE_CHUNK + i] = (kops.vec_dot)(k, qb) * scale;
            }
        }
        softmax_steps(gscores, dgrow, state, n, exps);
        for (i, &cell) in cells[..n].iter().enumerate() {
            v_to_float(kv.v_bytes(cell), v32);
            for (h, st) in state.iter_mut().enumerate() {
                let e = gscores[h * DECODE_CHUNK + i];
                let (ms, vs) = if dgrow[h] & (1 << i) != 0 { (e, 1f32) } else { (1f32, e) };
                let a = &mut acc[h * hd..(h + 1) * hd];
                if v_f16 {
                    mad_f16::<X86>(a, v32, ms, vs, k32);
                } else {
                    // Skipping `× 1` changes no bits.
                    if ms != 1.0 {
                        a.iter_mut().for_each(|x| *x *= ms);
                    }
                    for (x, &v) in a.iter_mut().zip(v32.iter()) {
                        *x = v.mul_add(vs, *x);
                    }
                }
                st[1] = st[1].mul_add(ms, vs);
            }
        }
        n = 0;
    }
    normalize_heads(acc, state, hd, out);
}


/// One step of ggml's F16 value accumulator (`ggml_vec_scale_f16`, `ggml_vec_mad_f16`), on f32
/// values that F16 represents exactly: `a = f16(a · ms)` where `ms ≠ 1` (`× 1` changes no F16
/// value), then `a = f16(fma(v, vs, a))`, each element rounded to nearest, ties to even. `X86`:
/// the caller runs with AVX2, FMA and F16C; `tmp`: at least `a.len()` values.
#[inline(always)]
fn mad_f16<const X86: bool>(a: &mut [f32], v: &[f32], ms: f32, vs: f32, tmp: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if X86 {
        // SAFETY: `X86` instances run inside a function compiled with AVX2, FMA and F16C, which
        // are only called after detecting them.
        return unsafe { mad_f16_x86(a, v, ms, vs) };
    }
    let tmp = &mut tmp[..a.len()];
    if ms != 1.0 {
        a.iter().zip(tmp.iter_mut()).for_each(|(x, t)| *t = *x * ms);
        crate::simd::round_f16_row(tmp, a);
    }
    a.iter().zip(v).zip(tmp.iter_mut()).for_each(|((x, &v), t)| *t = v.mul_add(vs, *x));
    crate::simd::round_f16_row(tmp, a);
}

/// [`mad_f16`] on 8 lanes (F16C's round trip `cvtps2ph`/`cvtph2ps` rounds to nearest, ties to
/// even, as `half` and ggml's stores do).
///
/// # Safety
/// AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mad_f16_x86(a: &mut [f32], v: &[f32], ms: f32, vs: f32) {
    use std::arch::x86_64::*;
    let n = a.len().min(v.len());
    let round = |x: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    let (m, s) = (_mm256_set1_ps(ms), _mm256_set1_ps(vs));
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, inside both slices.
        unsafe {
            let p = a.as_mut_ptr().add(i);
            let mut x = _mm256_loadu_ps(p);
            if ms != 1.0 {
                x = round(_mm256_mul_ps(x, m));
            }
            _mm256_storeu_ps(p, round(_mm256_fmadd_ps(_mm256_loadu_ps(v.as_ptr().add(i)), s, x)));
        }
        i += 8;
    }
    for (x, &v) in a[i..n].iter_mut().zip(&v[i..n]) {
        if ms != 1.0 {
            *x = f16::from_f32(*x * ms).to_f32();
        }
        *x = f16::from_f32(v.mul_add(vs, *x)).to_f32();
    }
}
