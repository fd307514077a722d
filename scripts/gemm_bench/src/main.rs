//! Times `gemm::gemm`, the panel GEMM of `--fast-prefill` and of batched decode steps, on one
//! thread: a `t` matrix of `n` rows of `k` values (random, quantized, interleaved at load as the
//! engine does) against `rows` activation rows, as the engine calls it for one worker's whole
//! matrix. With `--copies C` the matrix is copied C times and the calls go round the copies, so
//! that (with C · the matrix's bytes well over the L3) its weights come from memory as in a
//! decode step, instead of from L2. The kernel table is the process's (`CORELM_ISA=avx2`
//! forces a lower one; `CORELM_AVX_VNNI=0` keeps the AVX2 table on `maddubs` where the CPU has
//! AVX-VNNI). Prints µs per call (the best of five rounds) and GMAC/s.
//!
//!     cargo run --release --manifest-path scripts/gemm_bench/Cargo.toml -- \
//!         [--type q4_1] [--k 576] [--n 1536] [--rows 16] [--mr 0] [--nc 0] (0: the engine's defaults) [--copies 1] [--reps 2000]

use corelm_kernels::matmul::gemm::{self, GemmScratch, Weights};
use corelm_kernels::matmul::schedule::Schedule;
use corelm_kernels::quant::reference::quantizer;
use corelm_kernels::{kernels, row_bytes, DType};

fn main() {
    let gemm_bench::Opts { t, k, n, rows, mr, nc, copies, reps } =
        gemm_bench::Opts::parse(gemm_bench::Opts { t: DType::Q4_1, k: 576, n: 1536, rows: 16, mr: 0, nc: 0, copies: 1, reps: 2000 });
    let table = kernels();
    let ops = table.ops(t).expect("a weight type of the table");
    let mut uniform = gemm_bench::uniform();
    let rb = row_bytes(t, k);
    let mut w = vec![0u8; rb * n];
    quantizer(t).expect("a reference quantizer")(&(0..n * k).map(|_| uniform()).collect::<Vec<_>>(), &mut w);
    // The interleaved copy where the table decodes its panels from it (as the engine's
    // repacked matrices), else the plain rows.
    let grouped = gemm::packs_groups(t, table.isa());
    let mut g = vec![0u8; w.len()];
    if grouped {
        table.layout().pack(t, &w, rb, &mut g);
    } else {
        g.copy_from_slice(&w);
    }
    let groups: Vec<Vec<u8>> = (0..copies).map(|_| g.clone()).collect();
    let vdt = ops.vec_dot_type;
    let xrb = row_bytes(vdt, k);
    let mut x = vec![0u8; xrb * rows];
    for r in 0..rows {
        let xf: Vec<f32> = (0..k).map(|_| uniform()).collect();
        table.from_float(vdt).expect("the activation quantizer")(&xf, &mut x[r * xrb..(r + 1) * xrb]);
    }
    let mut out = vec![0f32; rows * n];
    let mut scratch = GemmScratch::new(k, rows, 64);
    // `--mr 0`, `--nc 0` (the defaults): the engine's default tile height and column block on
    // this CPU and table.
    let def = gemm::default_schedule(table.isa(), t);
    let pick = |v: usize, d: usize| if v == 0 { d } else { v };
    let sched = Schedule { mr: pick(mr, def.mr), nc: pick(nc, def.nc), ..def };
    let (mr, nc) = (sched.mr, sched.nc);
    let mut call = |i: usize| {
        let w = if grouped { Weights::Groups(&groups[i % copies]) } else { Weights::Rows(&groups[i % copies]) };
        // SAFETY: `out` holds rows × n f32, all written by this one call.
        unsafe { gemm::gemm(t, w, k, 0..n, &x, xrb, rows, out.as_mut_ptr(), n, table.isa(), &sched, &mut scratch) }
    };
    let best = gemm_bench::best_of_five(reps, reps / 10 + copies, &mut call);
    let macs = (k * n * rows) as f64;
    println!(
        "{t} k {k} n {n} rows {rows} mr {mr} nc {nc} copies {copies} ({} table, {}, {:.1} MB of weights): {:.1} µs, {:.1} GMAC/s",
        table.isa().name(),
        if grouped { "interleaved" } else { "plain rows" },
        (copies * g.len()) as f64 / 1e6,
        best * 1e6,
        macs / best / 1e9
    );
}
