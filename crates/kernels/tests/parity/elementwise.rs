//! Elementwise kernels against their scalar twins: GeGLU/SwiGLU, grouped RMS norm, RoPE and
//! the two `expf`s.

use crate::common::{tables, Rng};
use corelm_kernels::Kernels;
use half::f16;

/// GeGLU (eight lanes through the F16 table, scalar tail) equals the portable `gelu_tanh` bit
/// for bit, over every f16 input, values outside (-10, 10) and values that are not f16.
#[test]
fn geglu_table_equals_portable() {
    use corelm_kernels::act::{geglu, gelu_tanh};
    let mut rng = Rng(11);
    let g: Vec<f32> = (0..=u16::MAX)
        .map(|b| f16::from_bits(b).to_f32())
        .filter(|v| v.is_finite())
        .chain([-12.0, 11.5, 9.999, -9.999])
        .chain((0..4099).map(|_| rng.f32() * 12.0)) // not f16 values: rounded first; ragged tail
        .collect();
    let u: Vec<f32> = (0..g.len()).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
    for k in tables() {
        let mut y = vec![0f32; g.len()];
        geglu(&k, &g, &u, &mut y);
        for i in 0..g.len() {
            let want = gelu_tanh(g[i]) * u[i];
            assert_eq!(y[i].to_bits(), want.to_bits(), "{} x = {}", k.isa(), g[i]);
        }
    }
}

/// `rms_norm_groups` (eight groups' double sums advancing together) gives every group the bits
/// of `rms_norm` on it alone, for group sizes with and without the SIMD path and counts that
/// leave a tail of fewer than eight groups, with values spanning many magnitudes.
#[test]
fn grouped_rms_norm_equals_per_group() {
    use corelm_kernels::norm::{rms_norm, rms_norm_groups};
    let mut rng = Rng(99);
    for n in [4usize, 12, 64, 640, 100, 3] {
        for groups in [1usize, 7, 8, 9, 17, 70, 130] {
            let x: Vec<f32> = (0..groups * n).map(|i| rng.f32() * [1e-3, 1.0, 300.0][i % 3]).collect();
            let w: Vec<f32> = (0..n).map(|_| rng.f32() + 1.0).collect();
            for k in tables() {
                let mut y = vec![0f32; groups * n];
                rms_norm_groups(&k, &x, &w, 1e-6, &mut y);
                for g in 0..groups {
                    let mut one = vec![0f32; n];
                    rms_norm(&x[g * n..(g + 1) * n], &w, 1e-6, &mut one);
                    let got = &y[g * n..(g + 1) * n];
                    assert!(got.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{} n {n} groups {groups} group {g}", k.isa());
                }
            }
            // The double sums themselves (most order errors vanish in the f32 rounding above).
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            if n % 4 == 0 && corelm_kernels::attention::has_simd(&Kernels::detect()) {
                let mut sums = vec![0f64; groups];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a SIMD table on x86 means AVX2 and FMA were detected.
                unsafe {
                    corelm_kernels::norm::x86::sum_squares(&x, n, &mut sums)
                };
                #[cfg(target_arch = "aarch64")]
                corelm_kernels::norm::aarch64::sum_squares(&x, n, &mut sums);
                for (g, s) in sums.iter().enumerate() {
                    let want = x[g * n..(g + 1) * n].iter().fold(0f64, |a, &v| a + (v * v) as f64);
                    assert_eq!(s.to_bits(), want.to_bits(), "sum of squares n {n} groups {groups} group {g}");
                }
            }
        }
    }
}

/// The SIMD SwiGLU against the scalar one, bit for bit: inputs across the exponential's
/// ranges (underflow to 0, overflow to ∞, subnormal scaling), lengths with ragged tails.
#[test]
fn swiglu_simd_equals_scalar() {
    use corelm_kernels::act::{swiglu, swiglu_scalar};
    let mut rng = Rng(5);
    for n in [1usize, 7, 8, 9, 15, 16, 17, 64, 1000, 4099] {
        let g: Vec<f32> = (0..n).map(|i| rng.f32() * [1.0, 20.0, 95.0, 200.0, 1e-3][i % 5]).collect();
        let u: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
        let mut b = vec![0f32; n];
        swiglu_scalar(&g, &u, &mut b);
        // Every table this CPU runs: the 16-lane kernel (AVX-512), the 8-lane one (AVX2).
        for k in tables() {
            let mut a = vec![0f32; n];
            swiglu(&k, &g, &u, &mut a);
            for i in 0..n {
                assert_eq!(a[i].to_bits(), b[i].to_bits(), "{} n {n} i {i} g {}", k.isa(), g[i]);
            }
        }
    }
}

/// The AVX-512 `expf` (glibc's algorithm on 16 lanes, used by decode attention) against
/// `f32::exp` — libm's `expf` — on every negative float above -104 (the arguments attention
/// passes), and on the edges: ±0, ±∞, NaN, overflow, underflow, subnormals.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_expf_equals_libm_expf() {
    if Kernels::detect().isa() != corelm_kernels::Isa::Avx512 {
        return;
    }
    use corelm_kernels::exp::x86::expf_slice;
    let (start, end) = (0x8000_0000u32, (-104f32).to_bits());
    let mut xs = vec![0f32; 1 << 16];
    let mut ys = vec![0f32; 1 << 16];
    let mut bits = start;
    while bits <= end {
        let n = ((end - bits + 1) as usize).min(xs.len());
        for (i, x) in xs[..n].iter_mut().enumerate() {
            *x = f32::from_bits(bits + i as u32);
        }
        ys[..n].copy_from_slice(&xs[..n]);
        // SAFETY: AVX-512 F/VL (and FMA) were detected.
        unsafe { expf_slice(&mut ys[..n]) };
        for (x, y) in xs[..n].iter().zip(&ys[..n]) {
            assert_eq!(y.to_bits(), x.exp().to_bits(), "expf({x:e})");
        }
        // The AVX2 twin on every seventh value of the same range.
        let mut zs: Vec<f32> = xs[..n].iter().step_by(7).copied().collect();
        let want: Vec<u32> = zs.iter().map(|x| x.exp().to_bits()).collect();
        // SAFETY: AVX2 and FMA are implied by the AVX-512 table.
        unsafe { corelm_kernels::exp::x86::expf_slice_avx2(&mut zs) };
        assert!(zs.iter().zip(&want).all(|(z, w)| z.to_bits() == *w), "avx2 expf near {:e}", xs[0]);
        bits += n as u32;
    }
    let mut edges: Vec<f32> = vec![0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 88.0, 88.8, 100.0, -103.5, -103.99, -200.0];
    edges.extend([1e-40f32, -1e-40, 0.5, 1.0, 10.0, 87.9, f32::MAX, f32::MIN]);
    let mut ys = edges.clone();
    let mut zs = edges.clone();
    // SAFETY: as above.
    unsafe {
        expf_slice(&mut ys);
        corelm_kernels::exp::x86::expf_slice_avx2(&mut zs);
    }
    for ((x, y), z) in edges.iter().zip(&ys).zip(&zs) {
        let want = x.exp();
        for v in [y, z] {
            assert!(v.to_bits() == want.to_bits() || (v.is_nan() && want.is_nan()), "expf({x:e}) = {v:e}, libm {want:e}");
        }
    }
}

/// RoPE with the detected SIMD kernels (`rope::x86`, 8 or 16 lanes) against the scalar loop,
/// bit for bit, for both pair layouts, rotated widths with ragged tails, partial rotation
/// (`n_rot < head_dim`: the rest untouched) and several positions; and near an f64 rotation.
#[test]
fn rope_simd_equals_scalar() {
    use corelm_kernels::rope::{rope_apply, rope_apply_scalar, rope_cache};
    let mut rng = Rng(77);
    for (hd, n_rot) in [(64usize, 64usize), (128, 128), (256, 256), (80, 80), (96, 64), (64, 36), (6, 6), (2, 2)] {
        for neox in [false, true] {
            for pos in [0i32, 1, 17, 511, 4095] {
                let mut cache = vec![0f32; n_rot];
                rope_cache(pos, n_rot, &corelm_kernels::rope::Angles::plain(10000.0, 1.0), None, &mut cache);
                let x: Vec<f32> = (0..hd).map(|_| rng.f32() * 8.0).collect();
                let mut b = x.clone();
                rope_apply_scalar(&mut b, &cache, n_rot, neox);
                // Every table this CPU runs: 16 lanes (AVX-512), 8 (AVX2), the scalar loop.
                for k in tables() {
                    let mut a = x.clone();
                    rope_apply(&k, &mut a, &cache, n_rot, neox);
                    for d in 0..hd {
                        assert_eq!(a[d].to_bits(), b[d].to_bits(), "{} hd {hd} n_rot {n_rot} neox {neox} pos {pos} dim {d}", k.isa());
                    }
                }
                assert_eq!(&b[n_rot..], &x[n_rot..], "dimensions past n_rot");
                let half = n_rot / 2;
                for i in 0..half {
                    let (ia, ib) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
                    let th = pos as f64 * 10000f64.powf(-2.0 * i as f64 / n_rot as f64);
                    let (x0, x1) = (x[ia] as f64, x[ib] as f64);
                    let (r0, r1) = (x0 * th.cos() - x1 * th.sin(), x0 * th.sin() + x1 * th.cos());
                    // f32 angles lose ~pos·2^-24 radians, the iterated θ a few ulps more.
                    let tol = 1e-4 * (1.0 + pos as f64 / 64.0) * (x0.abs() + x1.abs() + 1.0);
                    assert!((b[ia] as f64 - r0).abs() < tol && (b[ib] as f64 - r1).abs() < tol, "hd {hd} pos {pos} pair {i}");
                }
            }
        }
    }
}

/// ggml's `expf` as the scalar (`exp::expf_ggml`, also the AVX2 lanes' model) computes it
/// against ggml's own AVX-512 code (`exp::x86::expf_ggml16`, whose `vscalefps` is the
/// reference for the single rounding): every float in [-140, -64] — the subnormal and
/// underflow range, where `n = -192` once produced -∞ — and in [64, 100], plus a sweep of
/// [-64, 64].
#[cfg(target_arch = "x86_64")]
#[test]
fn ggml_expf_scalar_equals_avx512() {
    if Kernels::detect().isa() != corelm_kernels::Isa::Avx512 {
        return;
    }
    use corelm_kernels::exp::expf_ggml;
    use std::arch::x86_64::*;
    let check = |xs: &[f32]| {
        for c in xs.chunks_exact(16) {
            let mut v = [0f32; 16];
            // SAFETY: AVX-512 F/VL detected; 16 f32 loads and stores.
            unsafe { _mm512_storeu_ps(v.as_mut_ptr(), corelm_kernels::exp::x86::expf_ggml16(_mm512_loadu_ps(c.as_ptr()))) };
            for (x, y) in c.iter().zip(&v) {
                assert_eq!(expf_ggml(*x).to_bits(), y.to_bits(), "expf_ggml({x:e})");
            }
        }
    };
    let ranges = [((-140f32).to_bits(), (-64f32).to_bits(), 1usize), (64f32.to_bits(), 100f32.to_bits(), 1), (0, 64f32.to_bits(), 97), (0x8000_0000, (-64f32).to_bits(), 97)];
    for (a, b, step) in ranges {
        let (lo, hi) = (a.min(b), a.max(b));
        let xs: Vec<f32> = (lo..=hi).step_by(step).map(f32::from_bits).collect();
        check(&xs[..xs.len() / 16 * 16]);
    }
}

