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

pub fn profile(a: &ProfileArgs) -> Result<()> {
    let r = match &a.show {
        Some(p) => Roofline::load(p)?,
        None => this_machine(a.refresh)?,
    };
    if let Some(out) = &a.out {
        r.save(out)?;
    }
    print!("{}", describe(&r));
    Ok(())
}

