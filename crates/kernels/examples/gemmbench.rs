use corelm_kernels::matmul::gemm::{gemm, GemmScratch};
use corelm_kernels::matmul::schedule::Schedule;
use corelm_kernels::{row_bytes, DType, Kernels};
use std::time::Instant;
#[path = "../tests/common/mod.rs"]
mod common;
use common::{aligned, random_row, Rng};
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let t: DType = match args[0].as_str() { "q4_0" => DType::Q4_0, "q4_1" => DType::Q4_1, "q8_0" => DType::Q8_0, "q5_0" => DType::Q5_0, "q4_k" => DType::Q4K, "q6_k" => DType::Q6K, _ => DType::Q4_1 };
    let (k, n, rows): (usize, usize, usize) = (args[1].parse().unwrap(), args[2].parse().unwrap(), args[3].parse().unwrap());
    let mr: usize = args.get(4).map(|a| a.parse().unwrap()).unwrap_or(4);
    let kern = if std::env::var("GB_ISA").as_deref() == Ok("avx2") { Kernels::detect_avx2() } else { Kernels::detect() };
    let mut rng = Rng(7);
    let xrb = row_bytes(t, k);
    let w = aligned((0..n).flat_map(|_| random_row(t, k, &mut rng)).collect());
    let vdt = kern.ops(t).unwrap().vec_dot_type;
    let yrb = row_bytes(vdt, k);
    let mut x = aligned(vec![0u8; rows * yrb]);
    for r in 0..rows { let xf: Vec<f32> = (0..k).map(|_| rng.f32()).collect(); kern.from_float(vdt).unwrap()(&xf, &mut x[r * yrb..(r + 1) * yrb]); }
    let mut out = vec![0f32; rows * n];
    let mut s = GemmScratch::new(k, rows, 64);
    let nc: usize = args.get(5).map(|a| a.parse().unwrap()).unwrap_or(8); let sched = Schedule { mr, nc, ..Schedule::PANEL_DEFAULT };
    let reps = (std::env::var("GB_SCALE").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(4) * 1_000_000_000 / (k * n * rows)).max(1);
    let run = |out: &mut [f32], s: &mut GemmScratch| unsafe { gemm(t, &w, k, 0..n, &x, yrb, rows, out.as_mut_ptr(), n, kern.isa(), &sched, s) };
    run(&mut out, &mut s);
    // check vs vec_dot
    let vd = kern.ops(t).unwrap().vec_dot;
    let mut maxd = 0f32;
    for r in 0..rows.min(4) { for c in 0..n { let want = vd(&w[c * xrb..(c + 1) * xrb], &x[r * yrb..(r + 1) * yrb]); maxd = maxd.max((out[r * n + c] - want).abs() / (1.0 + want.abs())); } }
    let t0 = Instant::now();
    for _ in 0..reps { run(&mut out, &mut s); std::hint::black_box(&out); }
    let e = t0.elapsed().as_secs_f64();
    let macs = reps as f64 * (k * n * rows) as f64;
    println!("{:?} k={k} n={n} rows={rows} mr={mr}: {:.3} ns per 128 MAC, {:.1} GMAC/s (max rel diff vs vec_dot {maxd:.2e})", t, e / macs * 128.0 * 1e9, macs / e / 1e9);
}
