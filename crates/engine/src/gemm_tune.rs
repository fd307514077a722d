//! The timing side of `corelm tune`'s GEMM search (`corelm_plan::gemm_search`): the loaded
//! model's own matrices, one per distinct (path, weight type, shape) of its prefill passes,
//! multiplied by random activation rows on the engine's workers under a candidate schedule.
//!
//! A timing runs the matmul `iters` times inside one pool job, the workers meeting at a barrier
//! after each (as between graph nodes), so the wake-up of the pool is paid once; `iters` is
//! chosen so one timing lasts about a millisecond or more. Best of `reps`.

use crate::engine::Engine;
pub use corelm_core::sched::matmul::Path;
use corelm_core::sched::matmul::{self, Mode, Operands, ScheduleEntry, Schedules};
use corelm_core::tensor::WeightCopy;
use corelm_core::{Op, Storage, Worker};
use corelm_kernels::matmul::schedule::Schedule;
use corelm_kernels::DType;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Widest column block a schedule may ask for.
pub use corelm_core::sched::matmul::IL_COL_MAX as MAX_NC;

/// One matrix shape the prefill passes multiply by.
#[derive(Clone, Debug)]
pub struct GemmShape {
    pub path: Path,
    pub dtype: DType,
    pub k: usize,
    pub n_out: usize,
    /// The matrices of this shape per pass (one of them is timed).
    pub per_pass: usize,
    /// Where that one's plain rows start in the file (none for a tensor-parallel slice), and
    /// its interleaved copy in the packed weights (bytes).
    file_at: Option<usize>,
    il_at: Option<usize>,
}

impl GemmShape {
    /// `"Q5_0 896×4864 tiles"`.
    pub fn label(&self) -> String {
        let p = match self.path {
            Path::Panel => "panel",
            Path::Tiles => "tiles",
            Path::Plain => "plain",
        };
        format!("{} {}×{} {p}", self.dtype.name(), self.k, self.n_out)
    }
}

impl Engine {
    /// The distinct matrices of a full-batch prefill pass that a schedule applies to (the panel
    /// GEMM's with `--fast-prefill`, else the interleaved ones'), most multiplied first.
    pub fn gemm_shapes(&mut self) -> Vec<GemmShape> {
        let nb = self.config().n_batch;
        let (kernels, fast, bi) = (self.kernels(), self.config().fast_prefill, self.config().batch_invariant);
        let g = self.graph(nb, 1);
        let mut shapes: Vec<GemmShape> = Vec::new();
        for &id in &g.nodes {
            let t = g.tensor(id);
            let Op::MatMul { w, .. } = t.op else { continue };
            let wt = g.tensor(w);
            let Storage::Weight { offset, copy, cols, .. } = wt.storage else { continue };
            let il_at = match copy {
                Some(WeightCopy { at, interleaved: true }) => Some(at),
                Some(_) => continue, // a plain copy (a slice or NUMA copy): not tuned
                None => None,
            };
            // A tensor-parallel column slice has no plain rows of its own (`file_at` unused).
            let plain = cols.is_none();
            let mode = Mode { batch_invariant: bi, panel_gemm: fast };
            // The path of a full batch of rows, also for the LM head, which a prefill pass
            // runs on its one output row but a batched decode step or `eval` on many.
            let path = matmul::path(kernels, wt.dtype, il_at.is_some(), plain, nb, mode);
            if path == Path::Plain {
                continue;
            }
            let [k, n_out] = wt.ne;
            match shapes.iter_mut().find(|s| (s.path, s.dtype, s.k, s.n_out) == (path, wt.dtype, k, n_out)) {
                Some(s) => s.per_pass += 1,
                None => shapes.push(GemmShape { path, dtype: wt.dtype, k, n_out, per_pass: 1, file_at: plain.then_some(offset), il_at }),
            }
        }
        shapes.sort_by_key(|s| std::cmp::Reverse(s.per_pass * s.k * s.n_out));
        shapes
    }

    /// Seconds one matmul of `rows` random activation rows by `shape`'s matrix takes under
    /// `sched` on the workers that run it (best of `reps`): the first group's under tensor
    /// parallelism (each group runs its own shard's), else all.
    pub fn time_gemm(&mut self, shape: &GemmShape, rows: usize, sched: &Schedule, reps: usize) -> f64 {
        let kernels = self.kernels();
        let ops = kernels.ops(shape.dtype).expect("a type of the model");
        let vdt = ops.vec_dot_type;
        let (wrb, xrb) = (corelm_kernels::row_bytes(shape.dtype, shape.k), corelm_kernels::row_bytes(vdt, shape.k));
        let mut x = vec![0u8; rows * xrb];
        let quantize = kernels.from_float(vdt).expect("activation type");
        let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ rows as u64;
        let mut row = vec![0f32; shape.k];
        for r in 0..rows {
            for v in row.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *v = (seed % 20001) as f32 / 10000.0 - 1.0;
            }
            quantize(&row, &mut x[r * xrb..(r + 1) * xrb]);
        }
        let mut out = vec![0f32; rows * shape.n_out];
        let schedules = Schedules::new(vec![ScheduleEntry { path: shape.path, dtype: shape.dtype, k: shape.k, n_out: shape.n_out, rows: 1, sched: *sched, secs: 0.0 }]);
        let nth = self.pool().n_threads();
        let scratch: Vec<Mutex<matmul::MatmulScratch>> =
            (0..nth).map(|_| Mutex::new(matmul::MatmulScratch::new(shape.k, shape.k, rows, schedules.max_panels()))).collect();
        let file = self.gguf().bytes();
        let packed = self.packed_bytes();
        let o = Operands {
            dtype: shape.dtype,
            k: shape.k,
            n_out: shape.n_out,
            w: shape.file_at.map_or(&[][..], |at| &file[at..at + shape.n_out * wrb]),
            // The panel decodes the file's rows, or the interleaved copy where the table can
            // (`gemm::packs_groups`, which the engine then does too); for any other type, with the
            // copy at hand an x86 table would run the tiles instead below 32 rows
            // (`matmul::panel_over_tiles`).
            il: shape
                .il_at
                .filter(|_| shape.path != Path::Panel || corelm_kernels::matmul::gemm::packs_groups(shape.dtype, kernels.isa()))
                .map(|at| &packed[at..at + shape.n_out * wrb]),
            x: &x,
            xrb,
            rows,
            xmap: None,
            out: out.as_mut_ptr(),
            ldo: shape.n_out,
            split: None,
        };
        let mode = Mode { batch_invariant: false, panel_gemm: shape.path == Path::Panel };
        let run = |iters: usize| {
            let secs = Mutex::new(0.0);
            self.pool().run(&|w: &Worker| {
                if w.group != 0 {
                    return;
                }
                let mut s = scratch[w.ith].lock().unwrap_or_else(|e| e.into_inner());
                w.barrier();
                let t0 = Instant::now();
                for _ in 0..iters {
                    // SAFETY: `out` holds rows × n_out f32; each worker of the group writes its
                    // own share, and the barrier separates the repetitions.
                    unsafe { matmul::run(kernels, &o, mode, Some(&schedules), w.group_ith, w.group_nth, &mut s) };
                    w.barrier();
                }
                if w.group_ith == 0 {
                    *secs.lock().unwrap_or_else(|e| e.into_inner()) = t0.elapsed().as_secs_f64() / iters as f64;
                }
            });
            secs.into_inner().unwrap_or_else(|e| e.into_inner())
        };
        // About a millisecond per timing at least.
        let once = run(1);
        let iters = ((1e-3 / once.max(1e-7)) as usize).clamp(1, 1000);
        (0..reps.max(1)).map(|_| run(iters)).fold(f64::INFINITY, f64::min)
    }

    /// Workers one matmul runs on: a tensor-parallel group's, else all.
    pub fn gemm_workers(&self) -> usize {
        self.pool().groups().first().map_or(self.pool().n_threads(), |g| g.len())
    }

    /// Run matmuls with these tuned schedules from now on (`corelm tune`'s plan; `None`: the
    /// fixed defaults).
    pub fn set_schedules(&mut self, schedules: Option<Arc<Schedules>>) {
        self.exec_mut().set_schedules(schedules);
    }
}
