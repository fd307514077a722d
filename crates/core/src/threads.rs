//! The thread pool: `n` workers (the calling thread is worker 0), optionally pinned to CPUs, that
//! can be split into groups and re-joined (ArcLight's multi-view pool).
//!
//! * A job is one closure run by every worker; [`ThreadPool::run`] returns when all are done.
//! * Inside a job, [`Worker::barrier`] syncs the worker's group and [`Worker::global_barrier`]
//!   syncs all workers. Barrier counters sit on their own cache lines.
//! * Barriers spin (then yield) because they separate nodes microseconds apart; between jobs
//!   idle workers spin briefly and then park on a condition variable, so an idle server does
//!   not burn its cores.
//!
//! * Views: besides its layout (`split`), the pool keeps further views ([`ThreadPool::add_view`]),
//!   each a subset of the workers in groups; [`ThreadPool::run_view`] runs a job on one view
//!   only, the other workers skipping it, and inside it worker indices, group sizes and the
//!   global barrier count the view's workers alone. Sandwich switches between its prefill and
//!   decode configurations this way, without restarting or re-pinning a thread.
//!
//! * A panic in a job (a bug) does not hang the pool: the panicking worker sets an abort flag,
//!   workers waiting at a barrier leave the job, `run` re-raises the panic in the caller once
//!   all have left, and the pool takes new jobs.
//!
//! * One pool serves a process: a draft model's engine runs its jobs on its target's pool
//!   (shared by `Arc`), one caller at a time (a claim taken for each job).
//!
//! Invariant: the group layout changes only between jobs (`split`/`rejoin`/`add_view` take
//! `&mut self`).

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Pads a value to its own 64-byte cache line.
#[repr(align(64))]
#[derive(Default)]
pub struct CachePadded<T>(pub T);

/// Iterations of pure spinning before a waiter starts yielding its core.
const SPIN_BEFORE_YIELD: u32 = 1 << 12;
/// Iterations of waiting for a new job before an idle worker parks.
const SPIN_BEFORE_PARK: u32 = 1 << 14;

/// A reusable barrier for a fixed number of participants (generation counting).
#[derive(Default)]
pub struct Barrier {
    count: CachePadded<AtomicUsize>,
    phase: CachePadded<AtomicUsize>,
}

impl Barrier {
    /// Wait until `n` participants (the same `n` for everyone) have arrived.
    pub fn wait(&self, n: usize) {
        self.wait_or_abort(n, &AtomicBool::new(false));
    }

    /// [`Barrier::wait`], giving up (false) once `abort` is set: a participant panicked and
    /// will never arrive.
    fn wait_or_abort(&self, n: usize, abort: &AtomicBool) -> bool {
        if n <= 1 {
            return true;
        }
        let phase = self.phase.0.load(Ordering::Acquire);
        if self.count.0.fetch_add(1, Ordering::AcqRel) == n - 1 {
            // Last to arrive: reset before releasing, so nobody can re-enter early.
            self.count.0.store(0, Ordering::Relaxed);
            self.phase.0.fetch_add(1, Ordering::Release);
        } else {
            let mut spins = 0u32;
            while self.phase.0.load(Ordering::Acquire) == phase {
                // The abort flag is looked at now and then, off the fast path.
                if spins < SPIN_BEFORE_YIELD {
                    std::hint::spin_loop();
                    spins += 1;
                    if spins.is_multiple_of(256) && abort.load(Ordering::Relaxed) {
                        return false;
                    }
                } else {
                    if abort.load(Ordering::Relaxed) {
                        return false;
                    }
                    std::thread::yield_now();
                }
            }
        }
        true
    }

    /// After an aborted job: no participant is inside, start counting afresh.
    fn reset(&self) {
        self.count.0.store(0, Ordering::Relaxed);
        self.phase.0.fetch_add(1, Ordering::Release);
    }
}

/// The unwind payload of a worker leaving a job because another worker panicked.
struct Aborted;

/// A view of the pool: some of its workers, in groups. Inside a job of the view, workers are
/// numbered 0.. in group order and `groups` are ranges of those numbers.
pub struct Layout {
    pub groups: Vec<Range<usize>>,
    barriers: Vec<Barrier>,
    global: Barrier,
    /// For each pool worker: its (index in the view, group), or `None` outside the view.
    slot: Vec<Option<(usize, usize)>>,
}

impl Layout {
    /// `members`: the pool workers of each group (disjoint, none empty) of a pool of `n`.
    fn new(n: usize, members: &[Range<usize>]) -> Result<Self, String> {
        let mut slot = vec![None; n];
        let mut groups = Vec::with_capacity(members.len());
        let mut next = 0;
        for (gi, g) in members.iter().enumerate() {
            if g.is_empty() || g.end > n {
                return Err(format!("worker group {g:?} is empty or outside the pool's {n} workers"));
            }
            for w in g.clone() {
                if slot[w].replace((next + w - g.start, gi)).is_some() {
                    return Err(format!("worker {w} is in two groups of {members:?}"));
                }
            }
            groups.push(next..next + g.len());
            next += g.len();
        }
        let barriers = groups.iter().map(|_| Barrier::default()).collect();
        Ok(Layout { groups, barriers, global: Barrier::default(), slot })
    }

    /// One group of all `n` workers.
    fn all(n: usize) -> Self {
        Layout::new(n, std::slice::from_ref(&(0..n))).expect("one group of every worker")
    }

    /// Workers in the view.
    fn n_active(&self) -> usize {
        self.groups.last().map_or(0, |g| g.end)
    }
}

/// What a worker knows while it runs a job.
pub struct Worker<'a> {
    /// Index among all workers, and their number.
    pub ith: usize,
    pub nth: usize,
    /// Group index, index inside the group, and the group's size.
    pub group: usize,
    pub group_ith: usize,
    pub group_nth: usize,
    layout: &'a Layout,
    /// Set when a worker of the job panicked: barriers give up instead of waiting for it.
    abort: &'a AtomicBool,
}

impl Worker<'_> {
    /// Sync this worker's group.
    pub fn barrier(&self) {
        if !self.layout.barriers[self.group].wait_or_abort(self.group_nth, self.abort) {
            std::panic::resume_unwind(Box::new(Aborted));
        }
    }

    /// Sync every worker of the job (of its view).
    pub fn global_barrier(&self) {
        if !self.layout.global.wait_or_abort(self.nth, self.abort) {
            std::panic::resume_unwind(Box::new(Aborted));
        }
    }

    /// The worker ranges of all groups.
    pub fn groups(&self) -> &[Range<usize>] {
        &self.layout.groups
    }
}

type Job = dyn Fn(&Worker) + Sync;

struct Shared {
    n: usize,
    /// The published job and layout; written by worker 0 only while no job runs.
    job: UnsafeCell<Option<(*const Job, *const Layout)>>,
    generation: CachePadded<AtomicU64>,
    done: CachePadded<AtomicUsize>,
    shutdown: AtomicBool,
    sleepers: Mutex<usize>,
    wake: Condvar,
    /// A worker of the running job panicked.
    aborted: AtomicBool,
    /// A caller's job is running: pools shared by two engines (a draft model's) take one
    /// caller at a time.
    claimed: AtomicBool,
}

/// One caller's hold on the pool, let go when its job ends (also by a panic).
struct Claim<'a>(&'a AtomicBool);

impl<'a> Claim<'a> {
    fn take(flag: &'a AtomicBool) -> Claim<'a> {
        while flag.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        Claim(flag)
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

// SAFETY: the raw pointers in `job` are written by the owner of the pool before bumping
// `generation` (Release) and read by workers after observing it (Acquire); the pointees outlive
// the job because `run` waits for every worker to finish before returning.
unsafe impl Sync for Shared {}
// SAFETY: as above; the pointers are only dereferenced during a job.
unsafe impl Send for Shared {}

/// Configuration of a pool.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub n_threads: usize,
    /// CPUs to pin workers to, one per worker (worker `i` → `cpus[i % len]`); empty = no pinning.
    pub cpus: Vec<usize>,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    /// View 0 (all workers, in the groups of `split`), then those of `add_view`.
    views: Vec<Layout>,
    handles: Vec<JoinHandle<()>>,
    /// The caller's CPU affinity before worker 0 (the caller) was pinned; restored on drop.
    caller_affinity: Option<Vec<usize>>,
}

impl ThreadPool {
    pub fn new(cfg: PoolConfig) -> ThreadPool {
        let n = cfg.n_threads.max(1);
        let shared = Arc::new(Shared {
            n,
            job: UnsafeCell::new(None),
            generation: CachePadded(AtomicU64::new(0)),
            done: CachePadded(AtomicUsize::new(0)),
            shutdown: AtomicBool::new(false),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
            aborted: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
        });
        let caller_affinity = cfg.cpus.first().map(|&cpu| {
            let before = current_affinity();
            pin_current(cpu);
            before
        });
        let handles = (1..n)
            .map(|i| {
                let s = shared.clone();
                let cpu = (!cfg.cpus.is_empty()).then(|| cfg.cpus[i % cfg.cpus.len()]);
                std::thread::Builder::new()
                    .name(format!("corelm-w{i}"))
                    .spawn(move || {
                        if let Some(c) = cpu {
                            pin_current(c);
                        }
                        worker_loop(&s, i)
                    })
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool { shared, views: vec![Layout::all(n)], handles, caller_affinity }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n
    }

    /// Split the workers into groups of the given sizes (must sum to the pool size). Views
    /// added before are dropped.
    pub fn split(&mut self, sizes: &[usize]) -> Result<(), String> {
        if sizes.iter().sum::<usize>() != self.shared.n || sizes.contains(&0) {
            return Err(format!("group sizes {sizes:?} do not partition {} workers", self.shared.n));
        }
        let mut start = 0;
        let groups: Vec<Range<usize>> = sizes
            .iter()
            .map(|&s| {
                start += s;
                start - s..start
            })
            .collect();
        self.views = vec![Layout::new(self.shared.n, &groups)?];
        Ok(())
    }

    /// Back to one group of all workers (views added before are dropped).
    pub fn rejoin(&mut self) {
        self.views = vec![Layout::all(self.shared.n)];
    }

    /// Groups of view 0 (all workers).
    pub fn groups(&self) -> &[Range<usize>] {
        &self.views[0].groups
    }

    /// Add a view: `groups` of pool workers (disjoint ranges of worker indices, none empty;
    /// workers in none of them sit the view's jobs out). Returns its number for
    /// [`ThreadPool::run_view`].
    pub fn add_view(&mut self, groups: &[Range<usize>]) -> Result<usize, String> {
        self.views.push(Layout::new(self.shared.n, groups)?);
        Ok(self.views.len() - 1)
    }

    /// Groups of a view, in the view's worker numbers.
    pub fn view_groups(&self, view: usize) -> &[Range<usize>] {
        &self.views[view].groups
    }

    /// Run `f` on every worker (the caller is worker 0) and wait for all to finish.
    pub fn run(&self, f: &(dyn Fn(&Worker) + Sync)) {
        self.run_view(0, f)
    }

    /// Run `f` on the workers of view `view` and wait for them to finish.
    pub fn run_view(&self, view: usize, f: &(dyn Fn(&Worker) + Sync)) {
        let layout = &self.views[view];
        let s = &*self.shared;
        let _claim = Claim::take(&s.claimed);
        if s.n > 1 {
            // SAFETY: no job is running (the previous `run` waited for all workers, and the
            // claim keeps other callers out), so nobody reads `job` now; workers read it only
            // after the generation bump below.
            unsafe {
                let f: *const Job = std::mem::transmute::<&(dyn Fn(&Worker) + Sync), &'static Job>(f);
                *s.job.get() = Some((f, layout as *const Layout));
            }
            s.generation.0.fetch_add(1, Ordering::Release);
            let sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            if *sleepers > 0 {
                s.wake.notify_all();
            }
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_job(0, f, layout, &s.aborted)));
        if mine.is_err() {
            s.aborted.store(true, Ordering::Release);
        }
        if s.n > 1 {
            let mut spins = 0u32;
            while s.done.0.load(Ordering::Acquire) != s.n - 1 {
                if spins < SPIN_BEFORE_YIELD {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            s.done.0.store(0, Ordering::Relaxed);
        }
        if s.aborted.swap(false, Ordering::AcqRel) {
            // Every worker has left the job: the barriers it left half-counted start afresh,
            // and the pool takes jobs again. The caller sees the panic.
            layout.global.reset();
            layout.barriers.iter().for_each(Barrier::reset);
            match mine {
                Err(payload) if !payload.is::<Aborted>() => std::panic::resume_unwind(payload),
                _ => panic!("a worker thread panicked during a pool job (its message is above)"),
            }
        }
    }
}

/// Pool worker `worker`'s part of a job on `layout` (nothing outside the view).
fn run_job(worker: usize, f: &(dyn Fn(&Worker) + Sync + '_), layout: &Layout, abort: &AtomicBool) {
    let Some((ith, group)) = layout.slot[worker] else { return };
    let g = &layout.groups[group];
    let w = Worker { ith, nth: layout.n_active(), group, group_ith: ith - g.start, group_nth: g.len(), layout, abort };
    f(&w);
}

fn worker_loop(s: &Shared, ith: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then park.
        let mut spins = 0u32;
        loop {
            let g = s.generation.0.load(Ordering::Acquire);
            if g != seen || s.shutdown.load(Ordering::Acquire) {
                break;
            }
            if spins < SPIN_BEFORE_PARK {
                std::hint::spin_loop();
                spins += 1;
                continue;
            }
            let mut sl = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            *sl += 1;
            while s.generation.0.load(Ordering::Acquire) == seen && !s.shutdown.load(Ordering::Acquire) {
                sl = s.wake.wait(sl).unwrap_or_else(|e| e.into_inner());
            }
            *sl -= 1;
        }
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = s.generation.0.load(Ordering::Acquire);
        // SAFETY: the generation bump (Acquire above) happened after `job` was written; the job
        // and layout stay alive until `done` reaches n-1, which we signal only afterwards.
        let Some((f, layout)) = (unsafe { *s.job.get() }) else { continue };
        // SAFETY: see above; both pointers were set from live references by `run`.
        // A panic (its message printed by the hook) or an abort: tell the others, then report done.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { run_job(ith, &*f, &*layout, &s.aborted) }));
        if r.is_err() {
            s.aborted.store(true, Ordering::Release);
        }
        s.done.0.fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _g = self.shared.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
        if let Some(cpus) = self.caller_affinity.take() {
            set_affinity(&cpus);
        }
    }
}

/// Pin the calling thread to one CPU (best effort: failure leaves it unpinned).
pub fn pin_current(cpu: usize) {
    set_affinity(&[cpu]);
}

/// Restrict the calling thread to `cpus` (best effort).
fn set_affinity(cpus: &[usize]) {
    #[cfg(target_os = "linux")]
    // SAFETY: cpu_set_t is plain data; indices are checked against CPU_SETSIZE before CPU_SET,
    // and sched_setaffinity(0, ..) affects only this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpus;
}

/// The calling thread's current CPU affinity.
fn current_affinity() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    // SAFETY: sched_getaffinity fills a plain cpu_set_t for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            return (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
        }
    }
    (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
}

/// CPUs this process may run on, in order: read once, on first use, so that pinning a thread
/// afterwards (worker 0 is the caller) does not shrink what later pools see.
pub fn allowed_cpus() -> Vec<usize> {
    static ALLOWED: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    ALLOWED.get_or_init(current_affinity).clone()
}
