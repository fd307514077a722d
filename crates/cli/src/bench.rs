//! `corelm bench`: llama-bench's tests (pp, tg, with depth), llama-batched-bench's (`--npl`),
//! the decode roofline beside them, and `--profile`'s per-op tables.

use crate::{load, resolve_model, KernelArgs, ModelArgs, PlaceArgs};
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Clone)]
pub struct BenchArgs {
    /// GGUF file (default: SmolLM2 from the model cache).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Prompt lengths to test (comma-separated; 0 skips).
    #[arg(short = 'p', long, value_delimiter = ',', default_value = "512")]
    n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips).
    #[arg(short = 'n', long, value_delimiter = ',', default_value = "128")]
    n_gen: Vec<usize>,
    /// Tokens already in the context before each test (comma-separated), as llama-bench's `-d`:
    /// `-p 0 -n 128 -d 512` times decoding at positions 512..640.
    #[arg(short = 'd', long, value_delimiter = ',', default_value = "0")]
    n_depth: Vec<usize>,
    /// Thread counts to test (comma-separated; default: physical cores).
    #[arg(short = 't', long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// Repetitions per test (after one warm-up).
    #[arg(short = 'r', long, default_value_t = 5)]
    reps: usize,
    /// Tokens per forward pass for prompt processing.
    #[arg(short = 'b', long, default_value_t = 512)]
    batch_size: usize,
    /// Print one JSON object per test (llama-bench field names) instead of a table.
    #[arg(long)]
    json: bool,
    #[arg(long)]
    no_pin: bool,
    #[command(flatten)]
    place: PlaceArgs,
    /// After each test, one profiled pass: time per op kind, graph nodes per token, and the
    /// measured cost of the barriers that separate them.
    #[arg(long)]
    profile: bool,
    /// Batched decode, as llama-batched-bench's `-npl`: for each count B (comma-separated), B
    /// sequences get a prompt of the first `-p` length each, then the first `-n` length of
    /// decode steps with one token per sequence; prints aggregate prompt and decode rates (each
    /// repetition runs every count in turn) and, with 1 among the counts, each count's decode
    /// rate over B=1's.
    #[arg(long, value_delimiter = ',')]
    npl: Vec<usize>,
    #[command(flatten)]
    kernels: KernelArgs,
}


/// The header line of a bench table: the kernel table, the best this CPU runs, and what the
/// table chose inside its level (`Kernels::variant`: AVX-VNNI or not, the AVX-512 panel tile).
fn kernels_line() -> String {
    let k = corelm_kernels::kernels();
    let v = k.variant();
    format!("kernels: {}{} (this CPU runs up to {})", k.isa(), if v.is_empty() { String::new() } else { format!(", {v}") }, corelm_kernels::best_isa())
}

/// Thread counts to bench: `-t`, else the physical cores; under `--plan` one run on the plan's
/// workers (0 here, the plan's count once loaded).
fn bench_threads(a: &BenchArgs) -> Result<Vec<usize>> {
    Ok(match (&a.place.plan, a.threads.is_empty()) {
        (Some(_), true) => vec![0],
        (Some(_), false) => bail!("--plan sets the worker threads: drop -t"),
        (None, true) => vec![corelm_engine::engine::default_threads()],
        (None, false) => a.threads.clone(),
    })
}

/// The engine of one thread count `t` (0: the plan's) with the bench's placement and kernels.
fn model_args(a: &BenchArgs, path: &std::path::Path, t: usize, ctx_size: usize, batch_size: usize) -> ModelArgs {
    ModelArgs {
        model: Some(path.to_path_buf()),
        threads: (t > 0).then_some(t),
        ctx_size,
        batch_size,
        no_pin: a.no_pin,
        place: a.place.clone(),
        kernels: a.kernels,
    }
}

/// `bench --npl`: llama-batched-bench's table (PP, TG, B, N_KV, T_PP, S_PP, T_TG, S_TG, T, S).
fn bench_batched(a: &BenchArgs) -> Result<()> {
    let npp = a.n_prompt.first().copied().unwrap_or(128);
    let ntg = a.n_gen.first().copied().unwrap_or(128);
    let max_npl = a.npl.iter().copied().max().unwrap_or(1);
    if a.npl.contains(&0) || ntg == 0 {
        bail!("--npl needs sequence counts >= 1 and -n >= 1");
    }
    let path = resolve_model(&a.model)?;
    let threads = bench_threads(a)?;
    if !a.json {
        println!("{}{}", kernels_line(), if a.kernels.batch_invariant { ", batch-invariant" } else { "" });
        println!("| threads | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
    }
    for &t in &threads {
        // Every sequence's cells, rounded up to whole KV blocks per sequence.
        let ma = model_args(a, &path, t, max_npl * (npp + ntg + 64), a.batch_size.max(max_npl));
        let (mut engine, _) = load(&ma, max_npl)?;
        let t = engine.config().n_threads;
        // Every count in each repetition (interleaved), so the ratios below compare counts
        // measured in the same minutes.
        let results = corelm_engine::bench::run_batched_counts(&mut engine, npp, ntg, &a.npl, a.reps)?;
        for r in &results {
            let b = r.npl;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "| {t} | {npp} | {ntg} | {b} | {} | {:.3} | {:.2} | {:.3} | {:.2} | {:.3} | {:.2} |",
                    r.n_kv, r.t_pp, r.s_pp(), r.t_tg, r.s_tg(), r.t_pp + r.t_tg, r.s()
                );
            }
            if a.profile {
                let (prof, secs) = corelm_engine::bench::profile_batched(&mut engine, npp, ntg, b)?;
                print_profile(&engine, &prof, secs, &format!("B={b} decode (per step of {b} tokens)"), ntg, "step", b, t);
            }
        }
        if let Some(one) = results.iter().find(|r| r.npl == 1).filter(|_| !a.json && results.len() > 1) {
            let ratios: Vec<String> = results.iter().filter(|r| r.npl > 1).map(|r| format!("B={} {:.2}×", r.npl, r.s_tg() / one.s_tg())).collect();
            println!("  aggregate decode (S_TG) against B=1, {t} threads, the counts interleaved in every repetition: {}", ratios.join(", "));
        }
    }
    Ok(())
}

pub fn bench(a: &BenchArgs) -> Result<()> {
    if !a.npl.is_empty() {
        return bench_batched(a);
    }
    let (n_prompt, n_gen, reps, json) = (&a.n_prompt, &a.n_gen, a.reps.max(1), a.json);
    use corelm_engine::bench::{bytes_per_token, kv_bytes_per_token, memory_bandwidth, run_test, BenchResult};
    let path = resolve_model(&a.model)?;
    let threads = bench_threads(a)?;
    let max_depth = a.n_depth.iter().copied().max().unwrap_or(0);
    let max_tokens = max_depth + n_prompt.iter().chain(n_gen).copied().max().unwrap_or(0);
    let n_batch = a.batch_size.min(max_tokens.max(1));
    let mut results = Vec::new();
    if !json {
        println!("{}", kernels_line());
        println!("| model | threads | test | t/s | roofline t/s |");
        println!("|---|---|---|---|---|");
    }
    for &t in &threads {
        let ma = model_args(a, &path, t, max_tokens + 16, n_batch);
        let (mut engine, _) = load(&ma, 1)?;
        let t = engine.config().n_threads;
        let name = engine.gguf().opt_str("general.name").ok().flatten().unwrap_or("?").to_string();
        // The roofline is an upper bound, and this VM's bandwidth moves by a third between
        // minutes: the best of passes before the tests and after each one.
        let mut bw = memory_bandwidth(t, 512 << 20, 3);
        let tests: Vec<(usize, usize, usize)> = a
            .n_depth
            .iter()
            .flat_map(|&d| {
                let pp = n_prompt.iter().filter(|&&p| p > 0).map(move |&p| (d, p, 0));
                pp.chain(n_gen.iter().filter(|&&n| n > 0).map(move |&n| (d, 0, n)))
            })
            .collect();
        let mut rows = Vec::new();
        for (d, p, n) in tests {
            if let Some(b) = engine.balance() {
                b.reset_stats();
            }
            let (avg, sd, samples, ns) = run_test(&mut engine, d, p, n, reps)?;
            if let Some(b) = engine.balance() {
                let test = if p > 0 { format!("pp{p}") } else { format!("tg{n}") };
                eprintln!("[{test}, {reps} reps: {}]", crate::sparsity::describe_balance(b));
            }
            bw = bw.max(memory_bandwidth(t, 512 << 20, 2));
            // Weights plus the KV cache at the test's mean context.
            let bytes = bytes_per_token(&engine) + kv_bytes_per_token(&engine, d + n.div_ceil(2));
            let r = BenchResult {
                model_filename: path.display().to_string(),
                model_type: name.clone(),
                n_prompt: p,
                n_gen: n,
                n_depth: d,
                n_threads: t,
                n_batch: engine.config().n_batch,
                avg_ts: avg,
                stddev_ts: sd,
                samples_ts: samples,
                samples_ns: ns,
                kernels: corelm_kernels::kernels().isa().to_string(),
                kernel_variant: corelm_kernels::kernels().variant(),
                roofline_ts: (n > 0).then(|| bw / bytes as f64),
            };
            if json {
                println!("{}", serde_json::to_string(&r)?);
            }
            rows.push(r);
            if a.profile {
                print_bench_profile(&mut engine, d, p, n, t)?;
            }
        }
        if !json {
            for r in &rows {
                let (d, p, n, avg, sd) = (r.n_depth, r.n_prompt, r.n_gen, r.avg_ts, r.stddev_ts);
                let mut test = if p > 0 { format!("pp{p}") } else { format!("tg{n}") };
                if d > 0 {
                    test += &format!(" @ d{d}");
                }
                // Weights plus the KV cache at the test's mean context.
                let bytes = bytes_per_token(&engine) + kv_bytes_per_token(&engine, d + n.div_ceil(2));
                let roof = bw / bytes as f64;
                let roofline = if p > 0 { "".to_string() } else { format!("{roof:.1} ({:.0}%)", 100.0 * avg / roof) };
                println!("| {name} | {t} | {test} | {avg:.2} ± {sd:.2} | {roofline} |");
            }
        }
        results.extend(rows);
        if !json {
            let (n_packed, packed_bytes) = engine.packed();
            eprintln!(
                "[{t} threads: read bandwidth {:.1} GB/s (best pass), {:.1} MB of weights + {:.1} kB of KV cache per context token read per decoded token; roofline = bandwidth / bytes at the mean context; {n_packed} matrices ({:.1} MB) repacked at load]",
                bw / 1e9,
                bytes_per_token(&engine) as f64 / 1e6,
                engine.kv_bytes_per_cell() as f64 / 1e3,
                packed_bytes as f64 / 1e6
            );
        }
    }
    Ok(())
}

/// The rate a profile line's matmuls read their weights at, or "" for other ops.
pub fn gbps(e: &corelm_engine::ProfileEntry) -> String {
    if e.bytes == 0 || e.secs <= 0.0 {
        return String::new();
    }
    format!("{:.1}", e.bytes as f64 / e.secs / 1e9)
}

/// `corelm bench --profile`: one profiled pass of a test, per op kind, and what the barriers
/// between nodes cost (measured on this pool size).
fn print_bench_profile(engine: &mut corelm_engine::Engine, d: usize, p: usize, n: usize, t: usize) -> Result<()> {
    if let Some(dl) = engine.device_layers() {
        dl.take_times();
        dl.set_timing(true);
    }
    let profiled = corelm_engine::bench::profile_test(engine, d, p, n);
    if let Some(dl) = engine.device_layers() {
        dl.set_timing(false);
    }
    let (prof, secs) = profiled?;
    let at = if d > 0 { format!(" @ d{d}") } else { String::new() };
    let (test, per, unit) =
        if p > 0 { (format!("pp{p}{at} (per pass)"), 1, "pass") } else { (format!("tg{n}{at} (per token)"), n.max(1), "token") };
    print_profile(engine, &prof, secs, &test, per, unit, if p > 0 { p } else { 1 }, t);
    if let Some(dl) = engine.device_layers() {
        let pt = dl.take_times();
        if pt.passes > 0 {
            let k = pt.passes as f64;
            eprintln!(
                "  device layers: {} passes, each {:.3} ms uploading, recording and submitting {} dispatches ({:.1} µs each) and {:.3} ms waiting for the device and reading back",
                pt.passes,
                1e3 * pt.record_secs / k,
                pt.dispatches / pt.passes,
                1e6 * pt.record_secs / pt.dispatches.max(1) as f64,
                1e3 * pt.wait_secs / k
            );
            print_device_clock(&pt);
        }
    }
    Ok(())
}

/// The device's own clock over a profiled test's passes: per kind of dispatch, and what of the
/// host's wait it does not cover (submission, the device's start, the read-back). Passes but
/// none timed: the device could not write timestamps inside a compute pass.
fn print_device_clock(pt: &corelm_accel::PassTimes) {
    use corelm_accel::clock::Kind;
    let c = &pt.device;
    if c.passes == 0 {
        eprintln!("  device clock: not available (the device writes no timestamps inside compute passes)");
        return;
    }
    let k = c.passes as f64;
    let mut kinds: Vec<(Kind, f64, usize)> =
        Kind::ALL.iter().map(|&kind| (kind, c.secs[kind as usize], c.dispatches[kind as usize])).filter(|&(_, _, d)| d > 0).collect();
    kinds.sort_by(|a, b| b.1.total_cmp(&a.1));
    let per_kind: Vec<String> = kinds
        .iter()
        .map(|&(kind, secs, d)| format!("{} {:.3} ms ({} × {:.1} µs)", kind.name(), 1e3 * secs / k, d / c.passes, 1e6 * secs / d as f64))
        .collect();
    eprintln!(
        "  device clock: {:.3} ms a pass from its first dispatch to its last ({:.1} µs a dispatch); the host's wait {:.3} ms beyond it",
        1e3 * c.span_secs / k,
        1e6 * c.span_secs / c.dispatches.iter().sum::<usize>().max(1) as f64,
        1e3 * (pt.wait_secs / pt.passes.max(1) as f64 - c.span_secs / k)
    );
    eprintln!("  device clock per kind, a pass: {}", per_kind.join(", "));
}

/// A profile's table: time per op kind over `per` passes (each one `unit` of `pass_tokens`
/// tokens), then what the barriers between nodes cost.
#[allow(clippy::too_many_arguments)]
fn print_profile(engine: &corelm_engine::Engine, prof: &corelm_engine::Profile, secs: f64, test: &str, per: usize, unit: &str, pass_tokens: usize, t: usize) {
    let total = prof.total_secs();
    let mut ops = prof.per_op.clone();
    ops.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    // With tensor parallelism, a column of each group's busy time in its own shard's nodes.
    let groups = ops.iter().map(|e| e.group_secs.len()).max().unwrap_or(0);
    let (head, rule) = if groups > 0 {
        (format!(" {} |", (0..groups).map(|g| format!("group {g} ms")).collect::<Vec<_>>().join(" | ")), "---|".repeat(groups))
    } else {
        Default::default()
    };
    eprintln!("  profile of {test}, {t} threads:");
    eprintln!("  | op | ms | nodes | share | weights read at GB/s | waits after ms |{head}");
    eprintln!("  |---|---|---|---|---|---|{rule}");
    for e in &ops {
        let cols: String = (0..groups).map(|g| format!(" {:.3} |", 1e3 * e.group_secs.get(g).copied().unwrap_or(0.0) / per as f64)).collect();
        eprintln!(
            "  | {} | {:.3} | {} | {:.1}% | {} | {:.3} |{cols}",
            e.label(),
            1e3 * e.secs / per as f64,
            e.nodes / per,
            100.0 * e.secs / total.max(1e-12),
            gbps(e),
            1e3 * e.wait_secs / per as f64
        );
    }
    if groups > 0 {
        let busy: Vec<String> =
            (0..groups).map(|g| format!("{:.3}", 1e3 * ops.iter().filter_map(|e| e.group_secs.get(g)).sum::<f64>() / per as f64)).collect();
        eprintln!("  each group's busy ms in its shard's nodes (group barriers included, global waits not): {}", busy.join(" / "));
    }
    let nodes = ops.iter().map(|e| e.nodes).sum::<usize>() / per;
    let bar = corelm_engine::bench::barrier_ns(t, 20_000);
    let wall = secs / per as f64;
    // Barriers per pass of the planned graph (group and global alike); every node's where the
    // graph is not known.
    let counts = engine.barriers(pass_tokens);
    let barriers = counts.map_or(nodes, |(group, global)| group + global);
    eprintln!(
        "  {nodes} nodes, {barriers} barriers per {unit}; one barrier at {t} threads: {bar:.0} ns, so barriers cost {:.1} µs = {:.2}% of the {:.2} ms",
        barriers as f64 * bar / 1e3,
        100.0 * barriers as f64 * bar * 1e-9 / wall,
        1e3 * wall
    );
    if let Some((group, global)) = counts {
        eprintln!("  graph nodes per pass followed by the global barrier: {global}, by their worker group's only: {group}, by none: {}", nodes.saturating_sub(group + global));
    }
    match prof.group_wait.as_slice() {
        [] => {}
        [w] => eprintln!(
            "  a worker waits {:.3} ms per {unit} in global barriers (the mean over workers: the nodes' uneven shares, and single-row nodes that one worker runs)",
            1e3 * w / per as f64
        ),
        waits => {
            let waits: Vec<String> = waits.iter().enumerate().map(|(g, w)| format!("group {g} {:.3} ms", 1e3 * w / per as f64)).collect();
            eprintln!("  waits in global barriers per {unit} (a worker's mean; the group that waits least sets the pace): {}", waits.join(", "));
        }
    }
}
