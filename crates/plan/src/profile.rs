//! The roofline profile of a machine: compute ceilings per target and kernel family, and the
//! memory roof they share.
//!
//! Measured here ([`measure`]): the vector target (the CPU cores through the kernel table this
//! process runs) on each kernel family's matrix kernel — the int8 dot products of the quantized
//! types (Q8_0's tiles, on interleaved rows where the table has them), and the F32, F16 and
//! BF16 tiles of the dense types — on operands that stay in the L1/L2 caches, one worker alone
//! and all physical cores at once; and read bandwidth of a buffer far larger than the caches at
//! 1..N threads. With one target, "all targets busy" is the all-cores figure. A matrix unit
//! joins as a second target where the table has one (Arm SME, `Isa::Sme`: the panel GEMM's
//! `SUMOPA` tile kernel for `int8_dot`, the `FMOPA` GEMM for `f32_fma`; Intel AMX, `Isa::Amx`:
//! its `TDPBSUD` panel for `int8_dot`); the memory roof with it busy, and the vector cores and
//! it busy together, are not measured yet. An accelerator joins through `corelm profile --accel` ([`add_accelerator`]:
//! `corelm_accel::probe` measures it, [`int8_beside`] the CPU's rate while it is busy).
//!
//! Stated profiles (`fixtures/profiles/*.json`) carry a paper's figures so the planner can be
//! run as those machines; their `source` says so.

use corelm_core::threads::{PoolConfig, ThreadPool, Worker};
use corelm_kernels::{DType, Kernels};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What a target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    /// Vector cores (AVX2/AVX-512/NEON through the kernel table).
    Vector,
    /// A matrix unit (Arm SME, Intel AMX).
    Matrix,
    /// An attached accelerator.
    Accelerator,
}

/// One kernel family's ceiling on one target, GFLOP/s (2 per multiply-add).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Ceiling {
    /// `int8_dot`, `f32_fma`, `f16_fma`, `bf16_dot`.
    pub family: String,
    /// The kernel that reached it (`avx512 q8_0 interleaved tile8`, …).
    pub kernel: String,
    pub one_worker_gflops: f64,
    pub all_workers_gflops: f64,
}

/// A compute target.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Target {
    pub name: String,
    pub kind: TargetKind,
    pub workers: usize,
    pub ceilings: Vec<Ceiling>,
    /// Its prefill micro-kernel's output tile, `[rows, columns]` (activation rows × weight
    /// rows): the unit a tile-level split ([`crate::split`]) aligns to. Absent: 1 × 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tile: Option<[usize; 2]>,
    /// An accelerator's host link: what every product placed on it pays besides its compute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<Link>,
}

/// The host link of an accelerator target (`corelm profile --accel` measures it).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Link {
    /// Microseconds of the smallest product's round trip (submit, dispatch, read back).
    pub overhead_us: f64,
    /// GB/s of activations to the device and results back.
    pub gbps: f64,
}

/// Compute of several targets busy at once (stated or measured), GFLOP/s.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Combined {
    pub targets: Vec<String>,
    pub family: String,
    pub gflops: f64,
}

/// The shared memory roof, GB/s.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Memory {
    /// Read bandwidth of the vector target at 1..N threads.
    pub read_gbps: Vec<(usize, f64)>,
    /// What each target reads alone at full load.
    pub per_target_gbps: Vec<(String, f64)>,
    /// With every target busy at once: not the sum (SMEPilot's observation).
    pub all_busy_gbps: f64,
}

/// A machine's roofline.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Roofline {
    pub machine: String,
    /// `measured on <date>` or `stated: <reference>`.
    pub source: String,
    pub targets: Vec<Target>,
    #[serde(default)]
    pub combined: Vec<Combined>,
    pub memory: Memory,
}

/// A profile that cannot be read or written.
#[derive(Debug, thiserror::Error)]
#[error("profile {0}")]
pub struct ProfileError(#[from] pub crate::file::FileError);

impl Roofline {
    pub fn load(path: &Path) -> Result<Roofline, ProfileError> {
        Ok(crate::file::read_json(path)?)
    }

    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        Ok(crate::file::write_json(path, self)?)
    }

    /// A target's ceiling for a kernel family.
    pub fn ceiling(&self, target: &str, family: &str) -> Option<&Ceiling> {
        self.targets.iter().find(|t| t.name == target)?.ceilings.iter().find(|c| c.family == family)
    }

    /// The ridge point of a target and family: FLOPs per byte above which it is compute-bound
    /// with every target busy (the shared roof).
    pub fn ridge(&self, target: &str, family: &str) -> Option<f64> {
        Some(self.ceiling(target, family)?.all_workers_gflops / self.memory.all_busy_gbps)
    }

    /// Fewest threads that read at `frac` of the best measured bandwidth (the knee where a
    /// memory-bound operator stops gaining from more cores); `None` without a measured curve.
    pub fn bandwidth_knee(&self, frac: f64) -> Option<usize> {
        let best = self.memory.read_gbps.iter().map(|&(_, g)| g).fold(0.0, f64::max);
        self.memory.read_gbps.iter().find(|&&(_, g)| g >= frac * best).map(|&(t, _)| t)
    }
}

/// Read bandwidth of main memory with `n_threads` pinned threads, in bytes/s: each thread sums
/// its share of a buffer much larger than the caches, asking for it [`STREAM_AHEAD`] bytes
/// ahead; best of `reps` passes.
///
/// [`STREAM_AHEAD`]: corelm_kernels::simd::STREAM_AHEAD
pub fn read_bandwidth(n_threads: usize, bytes: usize, reps: usize) -> f64 {
    let words = vec![1u64; bytes / 8];
    let cpus = corelm_core::placement::physical_cores();
    let pool = ThreadPool::new(PoolConfig { n_threads, cpus });
    let sink = AtomicU64::new(0);
    let mut best = 0f64;
    for _ in 0..reps {
        let t0 = Instant::now();
        pool.run(&|w: &Worker| {
            let r = corelm_core::sched::split(words.len(), w.ith, w.nth);
            // Eight independent lanes so the loop is bound by loads, not by the add chain;
            // each line asked for ahead as the GEMVs ask for their weights, so the probe reads
            // what a core can stream, not what its hardware prefetcher alone brings.
            let mut acc = [0u64; 8];
            for c in words[r].chunks_exact(8) {
                let ahead = c.as_ptr().wrapping_byte_add(corelm_kernels::simd::STREAM_AHEAD) as *const u8;
                corelm_kernels::simd::prefetch_lines(ahead, 64, corelm_kernels::simd::CacheLevel::L1);
                for (a, &v) in acc.iter_mut().zip(c) {
                    *a = a.wrapping_add(v);
                }
            }
            sink.fetch_add(acc.iter().fold(0, |a, &b| a.wrapping_add(b)), Ordering::Relaxed);
        });
        best = best.max(bytes as f64 / t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.load(Ordering::Relaxed));
    best
}

/// Inner dimension of the probes: a row of Q8_0 is 1088 bytes, of F32 4 KiB.
const K: usize = 1024;
/// Weight rows per probe call (four interleaved groups).
const ROWS: usize = 16;

/// One kernel call on cache-resident operands: returns the multiply-adds it did.
type Probe = Box<dyn Fn(&mut [i32]) -> usize + Sync>;

/// The probes' operand values: `rows` rows of `K`.
fn probe_values(rows: usize) -> Vec<f32> {
    (0..rows * K).map(|i| ((i * 7919 % 251) as f32 - 125.0) / 64.0).collect()
}

/// Bytes of a probe row of `t`.
fn row_bytes(t: DType) -> usize {
    t.row_bytes(K as u64).expect("K is a multiple of every block") as usize
}

/// The first `rows` rows of `vals` in `t` (`None` where `kernels` cannot quantize to it).
fn quantize(kernels: &Kernels, vals: &[f32], t: DType, rows: usize) -> Option<Vec<u8>> {
    let from = kernels.ops(t)?.from_float?;
    let rb = row_bytes(t);
    let mut out = vec![0u8; rows * rb];
    for (r, o) in out.chunks_exact_mut(rb).enumerate() {
        from(&vals[r * K..(r + 1) * K], o);
    }
    Some(out)
}

/// The probe of `family` with `kernels`: the kernel prefill uses for that family's types.
fn probe(kernels: &'static Kernels, family: &str) -> Option<(String, Probe)> {
    let vals = probe_values(ROWS);
    let isa = kernels.isa();
    let quantize = |t: DType, rows: usize| quantize(kernels, &vals, t, rows);
    let dense = |t: DType| -> Option<(String, Probe)> {
        let ops = kernels.ops(t)?;
        let (w, x) = (quantize(t, ROWS)?, quantize(t, 4)?);
        let rb = row_bytes(t);
        let Some(b) = ops.batch_dot else {
            // Tables without batch tiles compute dense types row by row (ggml's order).
            let dot = ops.vec_dot;
            let f: Probe = Box::new(move |_| {
                let s: f32 = (0..ROWS).map(|r| dot(&w[r * rb..(r + 1) * rb], &x[..rb])).sum();
                std::hint::black_box(s);
                ROWS * K
            });
            return Some((format!("{isa} {t} row dots"), f));
        };
        let f: Probe = Box::new(move |_| {
            let mut o = [[0f32; 4]; ROWS];
            (b.tile)(&w, rb, std::array::from_fn(|j| &x[j * rb..(j + 1) * rb]), &mut o);
            std::hint::black_box(&o);
            ROWS * 4 * K
        });
        Some((format!("{isa} {t} 4×4 tiles"), f))
    };
    match family {
        "int8_dot" => {
            let ops = kernels.ops(DType::Q8_0)?;
            let w = quantize(DType::Q8_0, ROWS)?;
            let x = quantize(DType::Q8_0, 8)?;
            let rb = row_bytes(DType::Q8_0);
            if let Some(il) = ops.interleaved {
                let mut g = vec![0u8; w.len()];
                kernels.layout().pack(DType::Q8_0, &w, rb, &mut g);
                let f: Probe = Box::new(move |prep| {
                    let mut o = [[0f32; 8]; ROWS];
                    (il.tiles.tile8)(&g, rb, std::array::from_fn(|j| &x[j * rb..(j + 1) * rb]), &mut o, prep);
                    std::hint::black_box(&o);
                    ROWS * 8 * K
                });
                return Some((format!("{isa} q8_0 interleaved 8-row tiles"), f));
            }
            let dot = ops.vec_dot;
            let f: Probe = Box::new(move |_| {
                let mut s = 0f32;
                for r in 0..ROWS {
                    s += dot(&w[r * rb..(r + 1) * rb], &x[..rb]);
                }
                std::hint::black_box(s);
                ROWS * K
            });
            Some((format!("{isa} q8_0 row dots"), f))
        }
        "f32_fma" => dense(DType::F32),
        "f16_fma" => dense(DType::F16),
        "bf16_dot" => dense(DType::BF16),
        _ => None,
    }
}

/// Activation rows of the matrix-unit probes (a multiple of every SME tile height).
const MATRIX_ROWS: usize = 64;

/// The matrix unit's probe of `family`, where `kernels` has one (SME; AMX: int8 only).
fn matrix_probe(kernels: &'static Kernels, family: &str) -> Option<(String, Probe)> {
    use corelm_kernels::matmul::gemm::{self, GemmScratch};
    let isa = kernels.isa();
    if !matches!(isa, corelm_kernels::Isa::Sme | corelm_kernels::Isa::Amx) {
        return None;
    }
    let vals = probe_values(MATRIX_ROWS);
    match family {
        "int8_dot" => {
            let rb = row_bytes(DType::Q8_0);
            let (w, x) = (quantize(kernels, &vals, DType::Q8_0, ROWS)?, quantize(kernels, &vals, DType::Q8_0, MATRIX_ROWS)?);
            let f: Probe = Box::new(move |_| {
                thread_local! {
                    // Per worker: the GEMM's scratch and its output, sized once.
                    static BUFS: std::cell::RefCell<(GemmScratch, Vec<f32>)> =
                        std::cell::RefCell::new((GemmScratch::new(K, MATRIX_ROWS, ROWS / gemm::PANEL), vec![0f32; MATRIX_ROWS * ROWS]));
                }
                let sched = gemm::default_schedule(isa, DType::Q8_0);
                BUFS.with_borrow_mut(|(s, out)| {
                    // SAFETY: `out` holds MATRIX_ROWS × ROWS f32, all written by this one call;
                    // the SME or AMX table runs on this CPU (it is `kernels`').
                    unsafe { gemm::gemm(DType::Q8_0, gemm::Weights::Rows(&w), K, 0..ROWS, &x, rb, MATRIX_ROWS, out.as_mut_ptr(), ROWS, isa, &sched, s) };
                    std::hint::black_box(&out);
                });
                ROWS * MATRIX_ROWS * K
            });
            let name = if isa == corelm_kernels::Isa::Amx { "amx q8_0 panel (TDPBSUD tiles)" } else { "sme q8_0 panel (SUMOPA tiles)" };
            Some((name.into(), f))
        }
        #[cfg(target_arch = "aarch64")]
        "f32_fma" => {
            let (a, b) = (vals[..MATRIX_ROWS * K].to_vec(), vals[..MATRIX_ROWS * K].iter().map(|v| v * 0.5).collect::<Vec<f32>>());
            let f: Probe = Box::new(move |_| {
                let mut c = vec![0f32; MATRIX_ROWS * MATRIX_ROWS];
                // SAFETY: the SME table runs on this CPU (it is `kernels`').
                unsafe { corelm_kernels::matmul::aarch64::sme::gemm_f32(&a, &b, &mut c, MATRIX_ROWS, MATRIX_ROWS, K) };
                std::hint::black_box(&c);
                MATRIX_ROWS * MATRIX_ROWS * K
            });
            Some(("sme f32 gemm (FMOPA tiles)".into(), f))
        }
        _ => None,
    }
}

/// GFLOP/s of `p` on `n` pinned workers at once: each worker calls it for about `secs`
/// (calibrated on one call burst first), best of three runs.
fn rate(p: &Probe, n: usize, secs: f64) -> f64 {
    let cpus = corelm_core::placement::physical_cores();
    let pool = ThreadPool::new(PoolConfig { n_threads: n, cpus });
    let macs = AtomicU64::new(0);
    // Seconds and multiply-adds of `calls` calls on every worker.
    let run = |calls: usize| -> (f64, f64) {
        macs.store(0, Ordering::Relaxed);
        let t0 = Instant::now();
        pool.run(&|_w: &Worker| {
            let mut prep = vec![0i32; corelm_kernels::matmul::layout::scratch_len(K)];
            let mut m = 0;
            for _ in 0..calls {
                m += p(&mut prep);
            }
            macs.fetch_add(m as u64, Ordering::Relaxed);
        });
        (t0.elapsed().as_secs_f64(), macs.load(Ordering::Relaxed) as f64)
    };
    let burst = 64;
    let calls = ((secs / run(burst).0.max(1e-9)) * burst as f64).clamp(burst as f64, 1e7) as usize;
    (0..3)
        .map(|_| {
            let (t, m) = run(calls);
            2.0 * m / t / 1e9
        })
        .fold(0.0, f64::max)
}

/// The kernel families measured.
pub const FAMILIES: [&str; 4] = ["int8_dot", "f32_fma", "f16_fma", "bf16_dot"];

/// Measure this machine with `kernels` on `n_cores` cores: every family one worker alone and
/// all at once, then read bandwidth at 1..=n_cores threads (`bytes` buffer; below 256 MiB the
/// compute runs are shortened too, for tests).
pub fn measure(kernels: &'static Kernels, machine: &str, n_cores: usize, bytes: usize) -> Roofline {
    let n = n_cores.max(1);
    // Each timed run about 50 ms (tests pass a small buffer and get shorter runs).
    let secs = if bytes >= 256 << 20 { 0.05 } else { 0.005 };
    let ceilings = |probe: &dyn Fn(&str) -> Option<(String, Probe)>| -> Vec<Ceiling> {
        FAMILIES
            .iter()
            .filter_map(|&fam| {
                let (kernel, p) = probe(fam)?;
                Some(Ceiling { family: fam.into(), kernel, one_worker_gflops: rate(&p, 1, secs), all_workers_gflops: rate(&p, n, secs) })
            })
            .collect()
    };
    // The vector cores' prefill tile: 8 activation rows × a group of 4 interleaved weight rows.
    let mut targets = vec![Target { name: "cpu".into(), kind: TargetKind::Vector, workers: n, ceilings: ceilings(&|f| probe(kernels, f)), tile: Some([8, 4]), link: None }];
    let matrix = ceilings(&|f| matrix_probe(kernels, f));
    if !matrix.is_empty() {
        // SME's panel tile: a ZA tile's rows × the panel's 8 columns (AMX: 16 rows × two panels).
        let amx = kernels.isa() == corelm_kernels::Isa::Amx;
        let cols = if amx { 2 * corelm_kernels::matmul::gemm::PANEL } else { corelm_kernels::matmul::gemm::PANEL };
        let tile = Some([corelm_kernels::matmul::gemm::matrix_tile_rows(), cols]);
        targets.push(Target { name: if amx { "amx" } else { "sme" }.into(), kind: TargetKind::Matrix, workers: n, ceilings: matrix, tile, link: None });
    }
    let read: Vec<(usize, f64)> = (1..=n).map(|t| (t, read_bandwidth(t, bytes, 3) / 1e9)).collect();
    let best = read.iter().map(|&(_, g)| g).fold(0.0, f64::max);
    Roofline {
        machine: machine.to_string(),
        source: if targets.len() == 1 { "measured (one vector target: all targets busy = all cores)".into() } else { "measured (all targets busy = the vector cores' all-core roof; the matrix unit's share not measured)".into() },
        targets,
        combined: Vec::new(),
        memory: Memory { read_gbps: read, per_target_gbps: vec![("cpu".into(), best)], all_busy_gbps: best },
    }
}

/// The vector target's `int8_dot` ceiling on all `n` cores while `other` runs on a thread of
/// its own — an accelerator kept busy at the same time — and what `other` returned: the
/// combined ceiling is their sum (SMEPilot's targets busy at once; a software accelerator on
/// the CPU's own cores takes from the CPU's rate).
pub fn int8_beside<T: Send>(kernels: &'static Kernels, n: usize, secs: f64, other: impl FnOnce() -> T + Send) -> (f64, T) {
    let (_, p) = probe(kernels, "int8_dot").expect("every table has an int8 probe");
    std::thread::scope(|s| {
        let h = s.spawn(other);
        let cpu = rate(&p, n.max(1), secs);
        (cpu, h.join().expect("the accelerator's probe thread"))
    })
}

/// Read bandwidth (GB/s) of `n` threads over a `bytes` buffer while `other` runs on a thread of
/// its own — an accelerator reading its memory at the same time — and what `other` returned.
/// A device with memory of its own leaves the CPU's figure as it was; one on the CPU's memory
/// (an integrated GPU, a software device) takes from it: SMEPilot's non-additive roof.
pub fn read_beside<T: Send>(n: usize, bytes: usize, other: impl FnOnce() -> T + Send) -> (f64, T) {
    std::thread::scope(|s| {
        let h = s.spawn(other);
        let cpu = read_bandwidth(n.max(1), bytes, 3) / 1e9;
        (cpu, h.join().expect("the accelerator's probe thread"))
    })
}

/// Add an accelerator target to `roof` (`corelm profile --accel`): its ceilings, the memory
/// it reads alone, its link, and the `int8_dot` ceiling of it and the vector cores busy at
/// once where measured, and the CPU's read bandwidth with it reading (`all_busy_gbps`: the
/// lower of that and the CPU's own best, so measuring again replaces an earlier device's
/// figure instead of keeping the lowest ever seen).
pub fn add_accelerator(roof: &mut Roofline, target: Target, read_gbps: f64, combined_int8: Option<f64>, cpu_read_beside: Option<f64>) {
    if let Some(g) = cpu_read_beside {
        let alone = roof.memory.read_gbps.iter().map(|&(_, b)| b).fold(0.0, f64::max);
        let alone = if alone > 0.0 { alone } else { roof.memory.all_busy_gbps };
        roof.memory.all_busy_gbps = alone.min(g);
    }
    roof.targets.retain(|t| t.name != target.name);
    roof.memory.per_target_gbps.retain(|(t, _)| t != &target.name);
    roof.combined.retain(|c| !c.targets.contains(&target.name));
    roof.memory.per_target_gbps.push((target.name.clone(), read_gbps));
    if let (Some(g), Some(v)) = (combined_int8, roof.targets.iter().find(|t| t.kind == TargetKind::Vector)) {
        roof.combined.push(Combined { targets: vec![v.name.clone(), target.name.clone()], family: "int8_dot".into(), gflops: g });
    }
    roof.source = format!("{}; accelerator {} measured (corelm profile --accel)", roof.source.split("; accelerator").next().unwrap_or(""), target.name);
    roof.targets.push(target);
}

/// What the probes measure changed (2: the bandwidth probe asks for its lines ahead): a
/// profile cached by older probes is not read, it is measured again.
const PROBES: u32 = 2;

/// Where this machine's measured profile is cached: `$XDG_CACHE_HOME/corelm/profiles/` (or
/// `~/.cache/…`), named after the CPU model, the kernel table, the core count and the
/// probes' version ([`PROBES`]).
pub fn cache_path(machine: &str, isa: &str, n_cores: usize) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let slug: String = machine.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    base.join("corelm").join("profiles").join(format!("{}-{isa}-{n_cores}c-p{PROBES}.json", slug.trim_matches('-')))
}
