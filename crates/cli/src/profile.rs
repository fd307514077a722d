//! `corelm profile`: this machine's roofline (`corelm_plan::profile`), measured once and cached
//! per machine, or a profile file shown.

use anyhow::Result;
use corelm_plan::Roofline;
use std::fmt::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ProfileArgs {
    /// Show this profile file (a cached one, or a stated one from fixtures/profiles/) instead of
    /// this machine's.
    #[arg(long)]
    show: Option<PathBuf>,
    /// Measure again even if this machine's profile is cached.
    #[arg(long)]
    refresh: bool,
    /// Also write the profile here.
    #[arg(short, long)]
    out: Option<PathBuf>,
    /// Measure the accelerator (the device `wgpu` opens: a GPU, or Mesa's software lavapipe)
    /// and add it to this machine's profile as a target: its ceilings, read bandwidth, host
    /// link, and the CPU's int8 rate while it is busy (`--accel-split` plans with it).
    #[arg(long)]
    accel: bool,
}

/// The CPU model from /proc/cpuinfo (the architecture where there is none).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|m| m.trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The roofline as a table.
pub fn describe(r: &Roofline) -> String {
    let mut s = format!("{} — {}\n", r.machine, r.source);
    s += "| target | kind | workers | family | kernel | 1 worker GFLOP/s | all GFLOP/s | ridge FLOP/byte |\n|---|---|---|---|---|---|---|---|\n";
    for t in &r.targets {
        for c in &t.ceilings {
            let ridge = r.ridge(&t.name, &c.family).unwrap_or(0.0);
            let _ = writeln!(
                s,
                "| {} | {:?} | {} | {} | {} | {:.1} | {:.1} | {ridge:.2} |",
                t.name, t.kind, t.workers, c.family, c.kernel, c.one_worker_gflops, c.all_workers_gflops
            );
        }
    }
    for c in &r.combined {
        let _ = writeln!(s, "together: {} on {}: {:.0} GFLOP/s", c.family, c.targets.join(" + "), c.gflops);
    }
    let read: Vec<String> = r.memory.read_gbps.iter().map(|(t, g)| format!("{t}: {g:.1}")).collect();
    if !read.is_empty() {
        let knee = r.bandwidth_knee(0.9).unwrap_or(1);
        let _ = writeln!(s, "read bandwidth GB/s by threads: {} (90 % knee at {knee} thread(s))", read.join(", "));
    }
    let per: Vec<String> = r.memory.per_target_gbps.iter().map(|(t, g)| format!("{t} {g:.0}")).collect();
    let _ = writeln!(s, "memory roof: {:.1} GB/s with every target busy (alone: {})", r.memory.all_busy_gbps, per.join(", "));
    s
}

/// This machine's profile: the cached one, or (none cached, or `refresh`) measured and cached.
pub fn this_machine(refresh: bool) -> Result<Roofline> {
    let kernels = corelm_kernels::kernels();
    let n = corelm_engine::engine::default_threads();
    let machine = cpu_model();
    let path = corelm_plan::profile::cache_path(&machine, &kernels.isa().to_string(), n);
    if !refresh {
        if let Ok(r) = Roofline::load(&path) {
            return Ok(r);
        }
    }
    eprintln!("measuring this machine's roofline: {n} core(s), {} kernels …", kernels.isa());
    let r = corelm_plan::profile::measure(kernels, &machine, n, 512 << 20);
    r.save(&path)?;
    eprintln!("cached in {}", path.display());
    Ok(r)
}

/// Measure the accelerator and add it to `r` as the target `accel`.
fn add_accelerator(r: &mut Roofline) -> Result<()> {
    use corelm_plan::profile::{Ceiling, Link, Target, TargetKind};
    let gpu = corelm_accel::Gpu::open()?;
    eprintln!("measuring the accelerator: {} …", gpu.name());
    let secs = 0.05;
    let d = corelm_accel::probe::measure(&gpu, secs)?;
    let kernels = corelm_kernels::kernels();
    let n = corelm_engine::engine::default_threads();
    // The CPU's three timed runs with the device kept busy through all of them.
    let (cpu, acc) = corelm_plan::profile::int8_beside(kernels, n, secs, || corelm_accel::probe::int8_for(&gpu, 5.0 * secs));
    let acc = acc?;
    // The CPU's read bandwidth while the device reads (a 512 MiB buffer, three passes).
    let (cpu_read, acc_read) = corelm_plan::profile::read_beside(n, 512 << 20, || corelm_accel::probe::read_for(&gpu, 1.0));
    let acc_read = acc_read?;
    let ceilings = d.ceilings.iter().map(|(f, k, g)| Ceiling { family: f.to_string(), kernel: k.clone(), one_worker_gflops: *g, all_workers_gflops: *g }).collect();
    let name = if d.software { "accel (software)" } else { "accel" };
    let target = Target { name: "accel".into(), kind: TargetKind::Accelerator, workers: 1, ceilings, tile: None, link: Some(Link { overhead_us: d.round_trip_us, gbps: d.link_gbps }) };
    eprintln!(
        "{name}: {}: read {:.1} GB/s, link {:.1} GB/s, round trip {:.0} µs; both busy: int8 device {acc:.1} + CPU {cpu:.1} GFLOP/s, read device {acc_read:.1} + CPU {cpu_read:.1} GB/s",
        d.name, d.read_gbps, d.link_gbps, d.round_trip_us
    );
    corelm_plan::profile::add_accelerator(r, target, d.read_gbps, Some(cpu + acc), Some(cpu_read));
    Ok(())
}

pub fn profile(a: &ProfileArgs) -> Result<()> {
    let mut r = match &a.show {
        Some(p) => Roofline::load(p)?,
        None => this_machine(a.refresh)?,
    };
    if a.accel {
        anyhow::ensure!(a.show.is_none(), "--accel measures this machine's accelerator: it cannot be combined with --show");
        add_accelerator(&mut r)?;
        let kernels = corelm_kernels::kernels();
        let path = corelm_plan::profile::cache_path(&r.machine, &kernels.isa().to_string(), corelm_engine::engine::default_threads());
        r.save(&path)?;
        eprintln!("cached in {}", path.display());
    }
    if let Some(out) = &a.out {
        r.save(out)?;
    }
    print!("{}", describe(&r));
    Ok(())
}

