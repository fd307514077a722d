//! Times decode attention (`attention::attend_heads`, ggml's one-chunk algorithm over an F16
//! cache, the kernel a decode step runs) on one thread: `heads` query heads of one KV head of
//! dimension `hd` over `cells` cells. With `--copies C` the calls go round C caches (SmolLM2's
//! 16-sequence step reads 16 · 30 · 3 = 1,440 of 150 cells: 55 MB, over the L3), else one
//! cache stays in L2. The rows are paged in blocks of 16, as the engine's cache holds them.
//! Prints ns per (head, cell), the best of five rounds.
//!
//!     cargo run --release --manifest-path scripts/gemm_bench/Cargo.toml --bin attn -- \
//!         [--cells 150] [--heads 3] [--hd 64] [--copies 1] [--reps 20000] [--window 0] [--wide 0]
//!
//! `--window W` (W > 0) shows only the last W cells, as a sliding window deep in a context does;
//! the time is still given per (head, cell) of all `cells`. `--wide 1` times `AttnKernel::Wide`
//! (the value accumulators in F32, `--fast-prefill`'s decode) instead of ggml's F16 ones.

use corelm_kernels::attention::{attend_heads, AttnKernel, AttnScratch, Cells, KvRows, Visible};
use corelm_kernels::kernels;
use half::f16;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut cells, mut heads, mut hd, mut copies, mut reps, mut window) = (150usize, 3usize, 64usize, 1usize, 20000usize, 0usize);
    let mut wide = false;
    while let Some(a) = args.next() {
        let v: usize = args.next().unwrap_or_else(|| panic!("{a} takes a value")).parse().expect("a number");
        match a.as_str() {
            "--cells" => cells = v,
            "--heads" => heads = v,
            "--hd" => hd = v,
            "--copies" => copies = v,
            "--reps" => reps = v,
            "--window" => window = v,
            "--wide" => wide = v != 0,
            other => panic!("unknown argument {other}"),
        }
    }
    let table = kernels();
    let mut uniform = gemm_bench::uniform();
    // Rows in blocks of 16, as the engine's paged cache holds them (`core::kv::BLOCK_SHIFT`).
    let rows = cells.next_multiple_of(16);
    let k: Vec<Vec<f16>> = (0..copies).map(|_| (0..rows * hd).map(|_| f16::from_f32(uniform())).collect()).collect();
    let v: Vec<Vec<f16>> = (0..copies).map(|_| (0..rows * hd).map(|_| f16::from_f32(uniform())).collect()).collect();
    let q: Vec<f32> = (0..heads * hd).map(|_| uniform()).collect();
    let blocks: Vec<u32> = (0..(rows / 16) as u32).collect();
    let kv: Vec<KvRows> = (0..copies).map(|c| KvRows { table: &blocks, shift: 4, ..KvRows::contiguous(&k[c], &v[c], hd, &[]) }).collect();
    let mut scratch = AttnScratch::with_heads(hd, heads);
    let mut out = vec![0f32; heads * hd];
    let scale = 1.0 / (hd as f32).sqrt();
    // The engine's form of a window: every cell from the window's first on.
    let visible = Visible::From(if window > 0 { cells.saturating_sub(window) } else { 0 });
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        for i in 0..reps {
            let c = Cells { kv: &kv[i % copies], n: cells, visible };
            // As the engine's decode node: the next call's first cells asked for during this
            // call's last chunk.
            scratch.read_next(Some((kv[(i + 1) % copies], visible.first()..cells)));
            attend_heads(if wide { AttnKernel::Wide } else { AttnKernel::Reference }, table, &q, c, scale, &mut scratch, &mut out);
        }
        best = best.min(t0.elapsed().as_secs_f64());
    }
    println!("{:?}{}: {} heads x {} cells (hd {}), {} copies: {:.2} ns per (head, cell)", table.isa(), if wide { " wide" } else { "" }, heads, cells, hd, copies, best * 1e9 / (reps * heads * cells) as f64);
    std::hint::black_box(&out);
}
