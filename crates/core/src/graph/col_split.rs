//! Column-split matmuls of tensor parallelism (Wo by the shards' query heads, down by their
//! feed-forward ranges) whose cut may fall inside one of the matrix's quantization blocks
//! (K-quants: 256 values; heads are cut at any head, the feed-forward every 32 neurons:
//! [`crate::tp::TpDims::ff_unit`]). A shard multiplies every block its columns touch — a
//! [`ColSlice`] copy of whole blocks, as any column shard, so a block cut in two is copied on
//! both sides — by its activations padded with zeros to those blocks: `Op::Quantize` puts the
//! columns before its range (`pad`) and after it at zero, so the other shard's columns of a
//! shared block add exactly nothing. The weights keep their file values; a shared block is
//! computed twice, and read by both shards, where the row-split matrices beside it (Wq/Wk/Wv,
//! gate/up) are cut exactly. Cutting only at whole blocks instead left Qwen2.5's 4,864 neurons
//! as 19 units, 10 + 9 at `--tp 2`, and refused more shards than a model has groups of heads
//! filling whole blocks of Wo.

use super::*;
use corelm_kernels::quant::FromFloat;

impl Builder<'_> {
    /// `a · wᵀ` over each shard's columns of `w` under `split` ([`Split::HeadCols`] or
    /// [`Split::FfCols`]): per shard `[n_tokens, w.ne1]`, a partial sum for the gather. `a`: per
    /// shard `[n_tokens, cols_s]` (its attention output, or the GLU of its gate/up rows). In
    /// serial mode, the one product.
    pub fn matmul_cols(&mut self, w: &WeightRef, a: &Bundle, split: Split) -> Bundle {
        let Some(plan) = self.shard_plan() else {
            let wt = self.weight(w);
            return self.matmul(&wt, a);
        };
        let bs = w.dtype.block_size();
        let [ne0, ne1] = w.ne;
        let mut parts = Vec::with_capacity(plan.degree());
        for s in 0..plan.degree() {
            let (r, by_cols) = split.range(&plan, s, w);
            assert!(by_cols && r.end <= ne0, "{}: {split:?} is not a cut of {ne0} columns ({r:?})", w.name);
            self.group = Some(s as u16);
            let x = a.0[if a.0.len() == 1 { 0 } else { s }];
            self.check_src(x);
            let rows = self.t(x).ne[1];
            assert_eq!(self.t(x).ne[0], r.len(), "{}: shard {s}'s activations are not its columns {r:?}", w.name);
            // The whole blocks the range touches.
            let cols = r.start / bs * bs..r.end.next_multiple_of(bs).min(ne0);
            let wt = self.weight_part(w, [cols.len(), ne1], w.offset, w.len, Some(ColSlice { row_len: ne0, c0: cols.start, n: cols.len() }));
            let xq = self.quantized_padded(x, w.dtype, r.start - cols.start, cols.len());
            parts.push(self.node([ne1, rows], DType::F32, Op::MatMul { w: wt, x: xq }).single());
        }
        self.group = None;
        Bundle(parts)
    }
}

/// `q` (the quantizer of activation type `t`) over the row of `pad` zeros, then `x`, then zeros
/// to `out`'s length: blocks inside `x` from `x` itself, the others through a block of zeros
/// on the stack (blocks are quantized each on its own, so the bytes are the padded row's).
pub(crate) fn quantize_padded(q: FromFloat, x: &[f32], pad: usize, t: DType, out: &mut [u8]) {
    let (bs, ts) = (t.block_size(), t.type_size());
    let mut tmp = [0f32; 256];
    assert!(bs <= tmp.len() && pad + x.len() <= out.len() / ts * bs, "{} values after {pad} in {} bytes of {t:?}", x.len(), out.len());
    for (b, o) in out.chunks_exact_mut(ts).enumerate() {
        // The block's values in the padded row, and in `x`.
        let (lo, hi) = (b * bs, (b + 1) * bs);
        if lo >= pad && hi <= pad + x.len() {
            q(&x[lo - pad..hi - pad], o);
            continue;
        }
        tmp[..bs].fill(0.0);
        let (a, e) = (lo.max(pad), hi.min(pad + x.len()));
        if a < e {
            tmp[a - lo..e - lo].copy_from_slice(&x[a - pad..e - pad]);
        }
        q(&tmp[..bs], o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corelm_kernels::Kernels;

    /// A padded row's bytes are those of the row with its zeros written out, for a shard at
    /// either side of a cut inside a block and one inside a single block (Q8_K: 256-value
    /// blocks; Q8_0: 32).
    #[test]
    fn padded_rows_quantize_as_the_rows_with_their_zeros() {
        let kernels = Kernels::portable();
        for (t, pad, n, width) in [(DType::Q8K, 0, 2432, 2560), (DType::Q8K, 128, 2432, 2560), (DType::Q8K, 32, 160, 256), (DType::Q8_0, 64, 96, 256)] {
            let q = kernels.from_float(t).unwrap();
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let mut full = vec![0f32; width];
            full[pad..pad + n].copy_from_slice(&x);
            let rb = corelm_kernels::row_bytes(t, width);
            let (mut want, mut got) = (vec![0u8; rb], vec![1u8; rb]);
            q(&full, &mut want);
            quantize_padded(q, &x, pad, t, &mut got);
            assert_eq!(got, want, "{t:?}: {n} values after {pad} zeros in {width}");
        }
    }
}
