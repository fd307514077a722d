//! Matmuls an accelerator shares (`Graph::device_splits`; SMEPilot's accelerator target, the
//! engine's `--accel-split`): the device computes the first output columns, the workers the
//! others, at the same time.
//!
//! In the node, worker 0 submits the device's part first ([`DeviceMatmul::begin`], with the
//! matmul's f32 input: the source of its `Quantize` node), then every worker computes its share
//! of the CPU's columns through the usual matmul paths (weights, interleaved groups and output
//! shifted by the cut, a multiple of the four-row group), and worker 0 then waits for the
//! device and copies its columns into the output before the node's barrier. The CPU's columns
//! keep their bits; the device's agree within the accelerator's bound
//! (`corelm_accel::gemv_bound`).
//!
//! A lost device loses nothing: when `finish` fails, worker 0 computes the device's columns
//! itself with the CPU's kernels (the other workers are already at the barrier).

use super::matmul::{self, Operands};
use super::{Ctx, Scratch};
use crate::tensor::{DeviceSplit, Op, TensorId};

/// An accelerator computing the first output columns of some matmuls. Called on worker 0:
/// `begin` with the matmul's input `[n_tokens, k]` and the columns wanted (at most the rows
/// the device holds of matrix `matrix`) must submit and return; `finish` waits and writes the
/// product `[n_tokens, cols]` into `y`, or returns false (a lost device), and the CPU then
/// computes those columns.
pub trait DeviceMatmul: Send + Sync {
    fn begin(&self, matrix: usize, x: &[f32], cols: usize);
    fn finish(&self, matrix: usize, y: &mut [f32]) -> bool;
}

impl Ctx<'_> {
    /// Node `id` (`out = x · wᵀ`) with the device computing columns `0..ds.cols`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_device(&self, id: TensorId, o: &Operands, ds: DeviceSplit, dev: &dyn DeviceMatmul, ith: usize, nth: usize, scratch: &mut Scratch) {
        let t = self.t(id);
        let Op::MatMul { w, x } = t.op else { unreachable!("device splits are planned on matmuls") };
        let c0 = ds.cols.min(o.n_out);
        assert!(c0.is_multiple_of(corelm_kernels::matmul::layout::ROWS), "a device cut inside a four-row group");
        let rows = o.rows;
        if ith == 0 && c0 > 0 {
            let src = match self.t(x).op {
                Op::Quantize { x: src, .. } => src,
                _ => x,
            };
            assert!(self.t(src).dtype == corelm_kernels::DType::F32, "the device reads f32 activations");
            dev.begin(ds.matrix as usize, &self.f32s(src)[..rows * o.k], c0);
        }
        let rb = self.t(w).row_bytes();
        let part = |lo: usize, hi: usize| Operands {
            n_out: hi - lo,
            w: if o.w.is_empty() { o.w } else { &o.w[lo * rb..hi * rb] },
            il: o.il.map(|b| &b[lo * rb..hi * rb]),
            // SAFETY: column `lo` of row 0 lies inside the `[rows][ldo]` output.
            out: unsafe { o.out.add(lo) },
            split: None,
            ..*o
        };
        if c0 < o.n_out {
            // SAFETY: every worker writes its own share of columns c0.., worker 0 alone columns
            // ..c0 below; the matmul contract of `run` is kept on the shifted operands.
            unsafe { matmul::run(self.kernels, &part(c0, o.n_out), self.mode, self.schedules, ith, nth, &mut scratch.mm) };
        }
        if ith != 0 || c0 == 0 {
            return;
        }
        let y = &mut scratch.device_y[..rows * c0];
        if dev.finish(ds.matrix as usize, y) {
            for (r, src) in y.chunks_exact(c0).enumerate() {
                // SAFETY: columns ..c0 of row r belong to worker 0 alone in this node.
                let dst = unsafe { std::slice::from_raw_parts_mut(o.out.add(r * o.ldo), c0) };
                dst.copy_from_slice(src);
            }
        } else {
            // SAFETY: as above, worker 0 alone computing columns ..c0.
            unsafe { matmul::run(self.kernels, &part(0, c0), self.mode, self.schedules, 0, 1, &mut scratch.mm) };
        }
    }
}
