//! `--accel-split`: SMEPilot's accelerator target in the engine. The roofline plan
//! (`corelm_plan::planner::place_io`) leaves a matmul on the vector cores or splits it between
//! them and the accelerator in the ratio that makes both finish together; the accelerator
//! computes its share as the matrix's first rows (`corelm_accel::SplitMatrices`), while the
//! CPU's workers compute the rest (`corelm_core::sched`'s device splits).
//!
//! At load the largest batch's graph and a one-token decode's are planned: every matrix a
//! node of either shares with the accelerator uploads the rows of its larger cut (a compute-
//! bound prefill's share grows with the batch, its link cost spread over more tokens; a
//! memory-bound decode matrix may go to a device of more bandwidth). Graphs of other batch
//! sizes are planned when first used and cut each matmul at their own share, at most the rows
//! uploaded; a one-token decode's small matmuls stay on the CPU, where they take less time
//! than the link's round trip.
//!
//! Cuts fall on four-row boundaries (the interleaved groups of the CPU's kernels). The CPU's
//! columns keep their bits; the device's agree within `corelm_accel::gemv_bound`. A lost
//! device (a failed read back) hands its columns to the CPU for that product and every later
//! one, with a message on stderr: the run goes on.

use crate::Error;
use corelm_accel::{FileMatrix, Gpu, SplitMatrices};
use corelm_core::graph::Graph;
use corelm_core::{DeviceMatmul, DeviceSplit, Op, Storage, TensorId};
use corelm_gguf::Gguf;
use corelm_plan::planner::{device_cut as cut, device_share, OpPlan};
use corelm_plan::profile::TargetKind;
use corelm_plan::Roofline;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The accelerator's rows of the split matrices, by the weight's offset in the model file.
pub struct DeviceSplits {
    mats: SplitMatrices,
    /// File offset of a weight → (its device matrix, rows held).
    index: HashMap<usize, (u32, usize)>,
    /// The profile's accelerator target.
    target: String,
    lost: AtomicBool,
}

/// The accelerator target of `roof`, or why `--accel-split` cannot use it.
pub fn target(roof: Option<&Roofline>) -> Result<String, String> {
    let roof = roof.ok_or("needs --roofline with an accelerator target (`corelm profile --accel` measures one)")?;
    roof.targets
        .iter()
        .find(|t| t.kind == TargetKind::Accelerator)
        .map(|t| t.name.clone())
        .ok_or_else(|| format!("the --roofline profile of {} has no accelerator target (`corelm profile --accel` measures one)", roof.machine))
}


/// Node `id` of `g` as the device can run it: (its weight, the weight's file offset) when it is
/// a matmul of a whole matrix of a type the device has, on f32 activations.
fn candidate(g: &Graph, id: TensorId) -> Option<(TensorId, usize)> {
    let Op::MatMul { w, x } = g.tensor(id).op else { return None };
    let wt = g.tensor(w);
    let Storage::Weight { offset, cols: None, .. } = wt.storage else { return None };
    let src = match g.tensor(x).op {
        Op::Quantize { x, .. } => x,
        _ => x,
    };
    let ok = corelm_accel::supported(wt.dtype) && wt.ne[0].is_multiple_of(32) && g.tensor(src).dtype == corelm_kernels::DType::F32;
    ok.then_some((w, offset))
}

impl DeviceSplits {
    /// Open the accelerator and upload the rows that `graphs` (each with its plan on `roof`:
    /// the largest batch's first, whose tensors name the matrices) give it, the largest cut of
    /// each matrix; `None` when the plans give it nothing.
    pub fn open(gguf: &Gguf, graphs: &[(&Graph, &[OpPlan])], roof: &Roofline, max_tokens: usize) -> Result<Option<DeviceSplits>, Error> {
        let target = target(Some(roof)).map_err(|e| Error::Config(format!("--accel-split: {e}")))?;
        // File offset → (the matrix's dtype, rows of k values, its cut).
        let mut rows: HashMap<usize, (corelm_kernels::DType, usize, usize)> = HashMap::new();
        for (g, plans) in graphs {
            for (p, &id) in plans.iter().zip(&g.nodes) {
                let share = device_share(p, &target);
                if let (true, Some((w, offset))) = (share > 0.0, candidate(g, id)) {
                    let wt = g.tensor(w);
                    let e = rows.entry(offset).or_insert((wt.dtype, wt.ne[0], 0));
                    e.2 = e.2.max(cut(share, wt.ne[1]));
                }
            }
        }
        rows.retain(|_, e| e.2 > 0);
        if rows.is_empty() {
            return Ok(None);
        }
        let gpu = Arc::new(Gpu::open().map_err(|e| Error::Config(format!("--accel-split: {e}")))?);
        // Matrices in file order, so a run's device layout does not depend on hashing.
        let mut order: Vec<(usize, (corelm_kernels::DType, usize, usize))> = rows.into_iter().collect();
        order.sort_unstable_by_key(|e| e.0);
        let file = gguf.bytes();
        let mats: Vec<FileMatrix> = order
            .iter()
            .map(|&(offset, (dtype, k, c))| FileMatrix { dtype, rows: c, cols: k, bytes: &file[offset..offset + corelm_kernels::row_bytes(dtype, k) * c] })
            .collect();
        let mats = SplitMatrices::new(gpu, &mats, max_tokens).map_err(|e| Error::Config(format!("--accel-split: {e}")))?;
        let index = order.iter().enumerate().map(|(i, &(o, (_, _, c)))| (o, (i as u32, c))).collect();
        Ok(Some(DeviceSplits { mats, index, target, lost: AtomicBool::new(false) }))
    }

    /// Write `g`'s device splits from its `plans`: each matmul the plan shares with the
    /// accelerator, cut at its share, at most the rows the device holds.
    pub fn apply(&self, g: &mut Graph, plans: &[OpPlan]) -> usize {
        g.device_splits.clear();
        for (p, &id) in plans.iter().zip(&g.nodes) {
            let share = device_share(p, &self.target);
            let Some((w, offset)) = candidate(g, id).filter(|_| share > 0.0) else { continue };
            let Some(&(matrix, held)) = self.index.get(&offset) else { continue };
            let cols = cut(share, g.tensor(w).ne[1]).min(held);
            if cols > 0 {
                g.device_splits.push((id, DeviceSplit { matrix, cols }));
            }
        }
        g.device_splits.sort_unstable_by_key(|(id, _)| id.0);
        g.device_splits.len()
    }

    /// The largest product in floats: tokens × the most rows a matrix holds.
    pub fn max_values(&self, max_tokens: usize) -> usize {
        max_tokens * (0..self.mats.len()).map(|i| self.mats.rows(i)).max().unwrap_or(0)
    }

    /// `N matrices, X MB on <device>`.
    pub fn summary(&self) -> String {
        format!("{} matrices' first rows, {:.1} MB, on {}", self.mats.len(), self.mats.weight_bytes() as f64 / 1e6, self.mats.gpu().name())
    }

    /// Whether the device was lost (its columns are the CPU's since).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Make the next product's read back fail (tests of the fallback).
    pub fn simulate_device_loss(&self) {
        self.mats.simulate_device_loss();
    }
}

impl DeviceMatmul for DeviceSplits {
    fn begin(&self, matrix: usize, x: &[f32], cols: usize) {
        if !self.lost() {
            self.mats.begin(matrix, x, cols);
        }
    }

    fn finish(&self, matrix: usize, y: &mut [f32]) -> bool {
        if self.lost() {
            return false;
        }
        match self.mats.wait(matrix, y) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("corelm: the accelerator failed ({e}); its share of every split matmul runs on the CPU from now on");
                self.lost.store(true, Ordering::Relaxed);
                false
            }
        }
    }
}
