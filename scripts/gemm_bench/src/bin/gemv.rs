//! Times decode's GEMV (`TypeOps::interleaved.rows`, the kernel a one-token step runs on every
//! repacked matrix) on one thread: `n` weight rows of `k` values (random, quantized, interleaved
//! as the engine does at load) against one activation row. With `--copies C` the calls go round
//! C copies of the matrix, so that (with C · its bytes well over the L3) its weights come from
//! memory as in a decode step; else it stays in L2. The kernel table is the process's
//! (`CORELM_ISA=avx2` forces a lower one). Prints µs per call (the best of five rounds), the
//! weights' GB/s and ns per group-block (four rows × one block of 32 values).
//!
//!     cargo run --release --manifest-path scripts/gemm_bench/Cargo.toml --bin gemv -- \
//!         [--type q5_0] [--k 896] [--n 4864] [--copies 1] [--reps 2000]

use corelm_kernels::matmul::layout::scratch_len;
use corelm_kernels::quant::reference::quantizer;
use corelm_kernels::{kernels, row_bytes, DType};

fn main() {
    let gemm_bench::Opts { t, k, n, copies, reps, .. } = gemm_bench::Opts::parse(gemm_bench::Opts { t: DType::Q5_0, k: 896, n: 4864, rows: 1, mr: 1, nc: 0, copies: 1, reps: 2000 });
    let table = kernels();
    let ops = table.ops(t).expect("a weight type of the table");
    let il = ops.interleaved.expect("the table interleaves this type");
    let mut uniform = gemm_bench::uniform();
    let rb = row_bytes(t, k);
    let mut w = vec![0u8; rb * n];
    quantizer(t).expect("a reference quantizer")(&(0..n * k).map(|_| uniform()).collect::<Vec<_>>(), &mut w);
    let mut g = vec![0u8; w.len()];
    table.layout().pack(t, &w, rb, &mut g);
    let groups: Vec<Vec<u8>> = (0..copies).map(|_| g.clone()).collect();
    let vdt = ops.vec_dot_type;
    let mut x = vec![0u8; row_bytes(vdt, k)];
    let xf: Vec<f32> = (0..k).map(|_| uniform()).collect();
    table.from_float(vdt).expect("the activation quantizer")(&xf, &mut x);
    let mut out = vec![0f32; n];
    let mut prep = vec![0i32; scratch_len(k)];
    let mut call = |i: usize| (il.rows)(&groups[i % copies], rb, &x, &mut out, &mut prep);
    let best = gemm_bench::best_of_five(reps, reps / 10 + copies, &mut call);
    let group_blocks = (n / 4 * k / t.block_size()) as f64;
    println!(
        "{t} GEMV k {k} n {n} copies {copies} ({} table, {:.1} MB of weights): {:.2} µs, {:.1} GB/s, {:.2} ns per group-block",
        table.isa().name(),
        (copies * g.len()) as f64 / 1e6,
        best * 1e6,
        g.len() as f64 / best / 1e9,
        best * 1e9 / group_blocks
    );
}
