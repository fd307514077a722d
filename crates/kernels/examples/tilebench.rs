use corelm_kernels::matmul::layout::scratch_len;
use corelm_kernels::{row_bytes, DType, Kernels};
use std::time::Instant;
#[path = "../tests/common/mod.rs"]
mod common;
use common::{aligned, random_row, Rng};
fn main() {
    let t = DType::Q4_1;
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let (k, n) = (args[0], args[1]);
    let kern = if std::env::var("GB_ISA").as_deref() == Ok("avx2") { Kernels::detect_avx2() } else { Kernels::detect() };
    let mut rng = Rng(7);
    let xrb = row_bytes(t, k);
    let w = aligned((0..n).flat_map(|_| random_row(t, k, &mut rng)).collect());
    let mut g = aligned(vec![0u8; w.len()]);
    kern.layout().pack(t, &w, xrb, &mut g);
    let vdt = kern.ops(t).unwrap().vec_dot_type;
    let ys: Vec<Vec<u8>> = (0..8).map(|_| { let x: Vec<f32> = (0..k).map(|_| rng.f32()).collect(); let mut q = aligned(vec![0u8; row_bytes(vdt, k)]); kern.from_float(vdt).unwrap()(&x, &mut q); q }).collect();
    let il = kern.ops(t).unwrap().interleaved.unwrap();
    let mut prep = vec![0i32; scratch_len(k)];
    let mut out = vec![[0f32; 8]; n];
    let y: [&[u8]; 8] = std::array::from_fn(|j| &ys[j][..]);
    let reps = (2_000_000_000 / (k * n)).max(1);
    for _ in 0..3 { (il.tiles.tile8)(&g, xrb, y, &mut out, &mut prep); }
    let t0 = Instant::now();
    for _ in 0..reps { (il.tiles.tile8)(&g, xrb, y, &mut out, &mut prep); std::hint::black_box(&out); }
    let e = t0.elapsed().as_secs_f64();
    let units = reps as f64 * (n / 4) as f64 * (k / 32) as f64 * 8.0;
    println!("k={k} n={n}: {:.3} ns per (block, j, 4 rows) unit, {:.1} GMAC/s", e / units * 1e9, units * 128.0 / e / 1e9);
}
