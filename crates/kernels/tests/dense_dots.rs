//! The dense weight types' dots (F32, F16, BF16) of every SIMD table follow the float order
//! their table documents, bit for bit: F32 the AVX2 kernel's eight lanes (`matmul::lanes`) on
//! x86 and aarch64; F16 ggml's AVX-512 order on the AVX-512 and aarch64 tables; BF16 ggml's
//! AVX2 order on the aarch64 tables (x86's BF16 orders: `parity::bf16_dots_follow_ggml_order_per_isa`).
//! Ragged lengths exercise the tails; values span binades, with zeros and F16 subnormals.

use corelm_kernels::matmul::{lanes, portable};
use corelm_kernels::{row_bytes, DType, Isa, Kernels};

mod common;
use common::{aligned, tables, Rng};

/// `n` values over several binades, about one in 17 an exact zero and one in 29 tiny (an F16
/// subnormal once rounded), encoded as `t` by the portable converter.
fn row(t: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let v: Vec<f32> = (0..n)
        .map(|_| match rng.next() % 29 {
            0 => 0.0,
            1 => rng.f32() * 3e-5,
            _ => rng.f32() * (1 << (rng.next() % 6)) as f32,
        })
        .collect();
    let mut b = aligned(vec![0u8; row_bytes(t, n)]);
    Kernels::portable().from_float(t).unwrap()(&v, &mut b);
    b
}

fn dot_f16_ggml(x: &[u8], y: &[u8]) -> f32 {
    portable::dot_f16_ggml(corelm_kernels::quant::blocks::as_blocks(x), corelm_kernels::quant::blocks::as_blocks(y))
}

/// A dot product of two rows given as bytes.
type Dot = fn(&[u8], &[u8]) -> f32;

/// The reference of `t`'s dot in table `isa`, where that table's order is one of these.
fn reference(isa: Isa, t: DType) -> Option<Dot> {
    let arm = matches!(isa, Isa::Neon | Isa::Dotprod | Isa::Sme);
    match t {
        DType::F32 if arm || isa == Isa::Avx512 || isa == Isa::Amx => Some(portable::dot_f32_ggml),
        DType::F32 if isa != Isa::Portable => Some(lanes::dot_f32),
        DType::F16 if arm || isa == Isa::Avx512 => Some(dot_f16_ggml),
        DType::BF16 if arm => Some(portable::dot_bf16_avx2_order),
        _ => None,
    }
}

#[test]
fn dense_dots_follow_their_tables_order() {
    let port = Kernels::portable();
    let mut rng = Rng(0xDE45_E001);
    let mut checked = 0;
    for k in tables().iter().filter(|k| k.isa() != Isa::Portable) {
        for t in [DType::F32, DType::F16, DType::BF16] {
            let Some(want) = reference(k.isa(), t) else { continue };
            let ops = k.ops(t).unwrap();
            assert_ne!(ops.vec_dot as usize, port.ops(t).unwrap().vec_dot as usize, "{} {t}: the portable dot in a SIMD table", k.isa());
            for n in [1usize, 7, 8, 9, 31, 32, 63, 64, 65, 100, 576, 896, 4871] {
                let (x, y) = (row(t, n, &mut rng), row(t, n, &mut rng));
                let (a, b) = ((ops.vec_dot)(&x, &y), want(&x, &y));
                assert_eq!(a.to_bits(), b.to_bits(), "{} {t} n={n}: dot {a} vs its order {b}", k.isa());
                let tile = (ops.vec_dot_tile)(&x, &y);
                assert_eq!(tile.to_bits(), b.to_bits(), "{} {t} n={n}: tile dot {tile} vs {b}", k.isa());
                // The order is a float order only: the portable sum differs in the last bits.
                let p = (port.ops(t).unwrap().vec_dot)(&x, &y);
                assert!((a - p).abs() <= 1e-4 * (1.0 + p.abs()) * (n as f32).sqrt(), "{} {t} n={n}: {a} vs portable {p}", k.isa());
                checked += 1;
            }
        }
    }
    eprintln!("{checked} dense dots checked against their order");
}

/// Decode's GEMV of F32 rows, where a table has one (AVX-512: rows under 64 values sixteen at a
/// time in the lanes of a vector), gives each row's `vec_dot` bits: short and long rows, row
/// counts around the 16-row groups.
#[test]
fn f32_rows_kernels_give_the_dot() {
    let mut rng = Rng(0xDE45_E003);
    let mut checked = 0;
    for k in tables() {
        let ops = k.ops(DType::F32).unwrap();
        let Some(rows) = ops.vec_dot_rows else { continue };
        for n in [1usize, 4, 16, 17, 63, 64, 100] {
            for n_rows in [1usize, 15, 16, 17, 40] {
                let w: Vec<u8> = (0..n_rows).flat_map(|_| row(DType::F32, n, &mut rng)).collect();
                let y = row(DType::F32, n, &mut rng);
                let mut out = vec![0f32; n_rows];
                rows(&w, 4 * n, &y, &mut out);
                for (r, &v) in out.iter().enumerate() {
                    let want = (ops.vec_dot)(&w[r * 4 * n..(r + 1) * 4 * n], &y);
                    assert_eq!(v.to_bits(), want.to_bits(), "{} n={n}, row {r} of {n_rows}", k.isa());
                }
                checked += 1;
            }
        }
    }
    eprintln!("{checked} F32 row kernels checked");
}

/// The references themselves differ from the sequential sum only by rounding: a wrong lane
/// mapping in a reference (and so in the kernel tested against it) would show up here.
#[test]
fn dense_orders_are_sums_of_the_products() {
    let mut rng = Rng(0xDE45_E002);
    for n in [5usize, 64, 100, 4871] {
        for (t, f) in [(DType::F32, lanes::dot_f32 as fn(&[u8], &[u8]) -> f32), (DType::F32, portable::dot_f32_ggml), (DType::F16, dot_f16_ggml), (DType::BF16, portable::dot_bf16_avx2_order)] {
            let (x, y) = (row(t, n, &mut rng), row(t, n, &mut rng));
            let (mut xf, mut yf) = (vec![0f32; n], vec![0f32; n]);
            let port = Kernels::portable();
            (port.ops(t).unwrap().to_float)(&x, &mut xf);
            (port.ops(t).unwrap().to_float)(&y, &mut yf);
            let exact: f64 = xf.iter().zip(&yf).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = xf.iter().zip(&yf).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let got = f(&x, &y) as f64;
            // Each value passes through at most n/8 + 16 roundings of a partial sum.
            assert!((got - exact).abs() <= 1.2e-7 * (n as f64 / 8.0 + 16.0) * mag, "{t} n={n}: {got} vs exact {exact}");
        }
    }
}
