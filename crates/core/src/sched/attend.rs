//! The attention node: (block of rows, KV head) items over the paged cache, run by the fused
//! kernels (`corelm_kernels::attention`) each on its worker's share of the items — or, for a
//! prefill over keys stored in columns with a [`Pipeline`] given (`--attn-pipeline`), as a
//! pipeline whose phases of different tiles run on different workers at once
//! (`attention::matrix::attend_pipelined`), the same bits.

use super::{split, Ctx, Range};
use crate::tensor::{AttnParams, AttnShard, Tensor, TensorId};
use corelm_kernels::attention::matrix::{PipeItem, Role};
use corelm_kernels::attention::{self, AttnScratch, KeyLayout};
use corelm_kernels::DType;

impl Ctx<'_> {
    /// Worker `w.ith` of `w.nth`'s share of the attention node `t` of layer `layer` (queries
    /// `q`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(&self, t: &Tensor, layer: usize, q: TensorId, p: AttnParams, shard: AttnShard, sinks: Option<TensorId>, w: AttnWorker) {
        let AttnWorker { ith, nth, scratch, plans } = w;
        let [ne0, rows] = t.ne;
        let q = self.f32s(q);
        let scale = p.scores();
        let kv = self.kv;
        let (kp, vp) = kv.layer_ptrs(layer);
        let (hd, cells) = (p.head_dim, kv.n_cells);
        let (krb, vrb) = kv.row_bytes();
        let group = shard.group;
        // Fewer rows than ggml's tiled kernel takes: its one-chunk kernel, with the value
        // accumulators in F32 under `--fast-prefill` (llama.cpp's bits given up there already).
        let kind = if rows >= attention::TILED_MIN_ROWS && !self.mode.batch_invariant {
            attention::AttnKernel::Tiled
        } else if self.mode.panel_gemm && !self.mode.batch_invariant {
            attention::AttnKernel::Wide
        } else {
            attention::AttnKernel::Reference
        };
        // Work items are (block of rows, KV head, query heads of it): the heads and rows
        // of an item share each key/value block read. The tiled kernel takes up to
        // ROWS_MAX_VECTORS rows × heads per call; decode's kernel one row.
        let per_block = match kind {
            attention::AttnKernel::Tiled => (attention::ROWS_MAX_VECTORS / group).max(1),
            _ => 1,
        };
        let blocks = rows.div_ceil(per_block);
        // The KV rows of sequence `seq`'s KV head `kvh` (of the model).
        let rows_of = |seq: i32, kvh: usize| {
            // SAFETY: K/V of this layer were written by the kv_store node before
            // the barrier; nobody writes them during attention.
            unsafe {
                attention::KvRows {
                    k: std::slice::from_raw_parts(kp.add(kvh * cells * krb), cells * krb),
                    v: std::slice::from_raw_parts(vp.add(kvh * cells * vrb), cells * vrb),
                    k_type: kv.k_type,
                    v_type: kv.v_type,
                    head_dim: hd,
                    table: kv.blocks.table(seq as usize),
                    shift: crate::kv::BLOCK_SHIFT,
                    k_layout: kv.k_layout,
                }
            }
        };
        // Logical cell c holds position c: causal means c <= pos; a window w keeps the
        // cells with pos - c < w.
        let span_of = |r: usize| {
            let pos = self.batch.pos[r] as usize;
            p.window.map_or(0, |w| (pos + 1).saturating_sub(w as usize))..pos + 1
        };
        // Attention sinks (gpt-oss), each query head's from the model's `[n_head]`: counted by
        // `attend_rows` in the item loop below — ggml's tiled kernel at its end, its one-chunk
        // kernel (decode, batch-invariant rows) after each row as one split-KV range, or after
        // the last cell over a quantized cache; the column kernels at their end — so such a
        // node takes neither the dealt decode nor the pipeline.
        let sinks = sinks.map(|s| &self.f32s(s)[shard.q_head0..]);
        // A decode step (a query row per sequence, over key rows): its (row, KV head, range,
        // query head) units dealt to the workers by their cells (`decode_dealt`).
        if per_block == 1 && sinks.is_none() && kv.k_layout == KeyLayout::Rows && self.decode_dealt(t, q, &rows_of, &span_of, kind, p, shard, AttnWorker { ith, nth, scratch: &mut *scratch, plans }) {
            return;
        }
        // A prefill of one sequence over keys in columns: the pipeline of the node's worker
        // group, if there is one (its slots are shared by the group's workers; a serial node
        // runs on the pool's only group).
        let seq0 = self.batch.seq[0];
        if let Some(pipe) = self.pipelines.get(t.group.map_or(0, usize::from)).filter(|pp| {
            sinks.is_none() && kind == attention::AttnKernel::Tiled && kv.k_layout == KeyLayout::Columns && pp.head_dim() == hd && self.batch.seq[..rows].iter().all(|&s| s == seq0)
        }) {
            let (n_kv, heads_of) = kv_heads(p.n_head, shard);
            let out = self.base(t) as *mut f32;
            // Item k: the rows of block k / n_kv with the query heads of KV head k % n_kv.
            let item = |k: usize| {
                let (b, j) = (k / n_kv, k % n_kv);
                let heads = heads_of(j);
                let r0 = b * per_block;
                let at = r0 * ne0 + heads.start * hd;
                PipeItem {
                    kv: rows_of(seq0, shard.kv_base + j),
                    heads: heads.len(),
                    rows: ((b + 1) * per_block).min(rows) - r0,
                    q: &q[at..],
                    out: out.wrapping_add(at),
                    stride: ne0,
                    row0: r0,
                    span_of: &span_of,
                }
            };
            // Workers of a matrix-unit class (`--matrix-workers`) take the matrix phases first.
            let role = match self.classes.first() {
                Some(c) if nth == self.classes.iter().map(|c| c.workers).sum::<usize>() => {
                    if ith < c.workers {
                        Role::Matrix
                    } else {
                        Role::Vector
                    }
                }
                _ => Role::Any,
            };
            // SAFETY: every worker of this node (all `nth` of its group) calls it once with
            // these items; an item's outputs are its rows' heads of its KV head inside this
            // node's tensor, disjoint between items; no other node runs at the same time on
            // this group, the only one using this pipeline.
            unsafe { attention::matrix::attend_pipelined(self.kernels, pipe, role, ith, nth, blocks * n_kv, &item, scale.uncapped(), scratch) };
            return;
        }
        let mut items = attention_items(blocks, p.n_head, shard, ith, nth).peekable();
        while let Some((b, kvh, heads)) = items.next() {
            let kvh = shard.kv_base + kvh;
            let block = b * per_block..((b + 1) * per_block).min(rows);
            // Decode: this item's kernel asks for the next item's first cells while it
            // computes its last chunk, as it asks for each of its chunks during the one before.
            let next = items.peek().filter(|_| kind != attention::AttnKernel::Tiled).map(|&(nb, nkvh, _)| {
                let r = nb * per_block;
                (rows_of(self.batch.seq[r], shard.kv_base + nkvh), span_of(r))
            });
            scratch.read_next(next);
            // Rows of one sequence go to the kernel together.
            let mut r0 = block.start;
            while r0 < block.end {
                let seq = self.batch.seq[r0];
                let r1 = (r0..block.end).find(|&r| self.batch.seq[r] != seq).unwrap_or(block.end);
                let rows_kv = rows_of(seq, kvh);
                let mut qs: [&[f32]; attention::ROWS_MAX_VECTORS] = [&[]; attention::ROWS_MAX_VECTORS];
                let mut outs: [&mut [f32]; attention::ROWS_MAX_VECTORS] = std::array::from_fn(|_| &mut [][..]);
                let mut spans: [std::ops::Range<usize>; attention::ROWS_MAX_VECTORS] = std::array::from_fn(|_| 0..0);
                for r in r0..r1 {
                    let i = r - r0;
                    let span = r * ne0 + heads.start * hd..r * ne0 + heads.end * hd;
                    qs[i] = &q[span.clone()];
                    // SAFETY: (row, KV head, chunk) triples are dealt to exactly one
                    // worker, and each row of the block is taken once.
                    outs[i] = unsafe { self.out_f32(t, span.start, span.len()) };
                    spans[i] = span_of(r);
                }
                let n = r1 - r0;
                let (q_rows, out_rows) = (&qs[..n], &mut outs[..n]);
                let kind = self.kv_split(kind, self.batch.pos[r0] as usize, nth);
                let sinks = sinks.map(|s| &s[heads.clone()]);
                attention::attend_rows(kind, self.kernels, q_rows, heads.len(), &spans[..n], &rows_kv, scale, sinks, scratch, out_rows);
                r0 = r1;
            }
        }
    }

    /// Worker `ith` of `nth`'s share of a decode node `t` (queries `q`, one row per block):
    /// every row's units — per KV head (whose rows `rows_of` gives), per range of cells, per
    /// query head — dealt to the workers in one contiguous run each, cut by their cells, so that
    /// a long row and a short one, or one sequence alone, keep every worker busy. A row under
    /// ggml's split-KV decode (`kv_split`: an F16 cache of 512+ padded cells, `chunk`-cell
    /// ranges, of which those holding visible cells count) has a unit per live range; its
    /// partials go to `Executor::split_parts`, and the worker that writes a KV head's last unit
    /// of that row folds its query heads in range order into the output (`partials`): the bits
    /// of the whole split on one worker (`attention::fold_ranges`). Any other row is one range,
    /// its whole span, written directly (the per-row kernel's bits). Each worker's consecutive
    /// units of one (row, KV head, range) are one kernel call, so where a cut falls between KV
    /// heads a key row is read once. Before, the items were cut by their count: a 4,000-cell
    /// row and a 100-cell one on 2 workers left one idle, and a split row's ranges ran on one
    /// worker. Returns false, having done nothing, where `Executor::split_parts` has no slots
    /// for the split rows (`partials::SplitParts::rows_for`: [`SPLIT_ROWS`] at most), where no
    /// row is split and the longest row is within 1.5× the shortest, and where `plans` has no
    /// room for the node's rows (sized for the largest attention node's).
    #[allow(clippy::too_many_arguments)]
    fn decode_dealt<'k>(
        &self,
        t: &Tensor,
        q: &[f32],
        rows_of: &dyn Fn(i32, usize) -> attention::KvRows<'k>,
        span_of: &dyn Fn(usize) -> Range<usize>,
        kind: attention::AttnKernel,
        p: AttnParams,
        shard: AttnShard,
        w: AttnWorker,
    ) -> bool {
        let AttnWorker { ith, nth, scratch, plans } = w;
        let [ne0, rows] = t.ne;
        let scale = p.scores();
        // Plans for every row in the worker's room for them (an attention node's rows at most).
        if rows > plans.capacity() {
            return false;
        }
        // Rows alike (the longest within 1.5× the shortest) and none split: the count-based
        // cut is even already, and kept (16 rows of 160 cells on 2 workers: 0.93–0.97× the old
        // cut's aggregate decode rate with this one). Where no row can be split (a step of
        // several rows without `--batch-invariant`), before planning the rows.
        let lens = (0..rows).map(|r| span_of(r).len());
        let alike = 2 * lens.clone().max().unwrap_or(0) <= 3 * lens.min().unwrap_or(0);
        if alike && !self.splits() {
            return false;
        }
        let hd = p.head_dim;
        let (n_kv, heads_of) = kv_heads(p.n_head, shard);
        // The model's query heads of the node's heads `h` (slots and counts are the model's).
        let model = |h: Range<usize>| shard.q_head0 + h.start..shard.q_head0 + h.end;
        plans.clear();
        let (mut split_rows, mut max_ranges, mut total) = (0, 1, 0u64);
        for r in 0..rows {
            let span = span_of(r);
            total += (span.len() * p.n_head) as u64;
            let plan = match self.kv_split(kind, self.batch.pos[r] as usize, nth) {
                attention::AttnKernel::Split(chunk) => {
                    split_rows += 1;
                    RowPlan::split(span, kind, chunk, split_rows - 1)
                }
                kind => RowPlan::whole(span, kind),
            };
            max_ranges = max_ranges.max(plan.ranges);
            plans.push(plan);
        }
        if split_rows > 0 && !self.split_parts.fits(split_rows, model(0..p.n_head), max_ranges, hd) {
            return false;
        }
        // Rows alike and none split after all (every row under 512 cells): as above.
        if alike && split_rows == 0 {
            return false;
        }
        let plans = &plans[..];
        let mut calls = dealt_calls(plans, n_kv, &heads_of, total.max(1), ith, nth).peekable();
        // The rows of the call peeked at, which the next iteration computes.
        let mut peeked = None;
        while let Some(Call { r, j, i, heads }) = calls.next() {
            let plan = &plans[r];
            let kvr = peeked.take().unwrap_or_else(|| rows_of(self.batch.seq[r], shard.kv_base + j));
            // This call's kernel asks for the next call's first cells while it computes its
            // last chunk.
            let next = calls.peek().map(|c| {
                let kv = rows_of(self.batch.seq[c.r], shard.kv_base + c.j);
                peeked = Some(kv);
                (kv, plans[c.r].cells(c.i))
            });
            scratch.read_next(next);
            let at = r * ne0 + heads.start * hd;
            let qs = &q[at..at + heads.len() * hd];
            if plan.chunk == 0 {
                // SAFETY: (row, KV head, range, head) units are dealt to exactly one worker;
                // a whole row's range is its one range.
                let out = unsafe { self.out_f32(t, at, heads.len() * hd) };
                attention::attend_rows(plan.kind, self.kernels, &[qs], heads.len(), std::slice::from_ref(&plan.span), &kvr, scale, None, scratch, &mut [out]);
                continue;
            }
            // SAFETY: the (row, range, head) slots of this call are written by this worker
            // alone in this node (units are dealt once) and read only after the row's KV head
            // count completes.
            let (states, acc) = unsafe { self.split_parts.slots(plan.slot, i, model(heads.clone()), hd) };
            let cells = attention::Cells { kv: &kvr, n: plan.span.end, visible: attention::Visible::From(plan.span.start) };
            attention::attend_split_range(self.kernels, qs, cells, scale, plan.chunk, i, scratch, states, acc);
            let group = model(heads_of(j));
            if !self.split_parts.written(plan.slot, group.start, heads.len(), (plan.ranges - plan.first) * group.len()) {
                continue;
            }
            for (h, mh) in heads_of(j).zip(group) {
                // SAFETY: this worker completed the row's KV head count: every unit's slots of
                // its heads were written and released before; this head's output is written
                // here alone (one folder per row and KV head).
                let out = unsafe { self.out_f32(t, r * ne0 + h * hd, hd) };
                // SAFETY: as above.
                attention::fold_ranges((plan.first..plan.ranges).map(|i| unsafe { self.split_parts.part(plan.slot, i, mh, hd) }), out);
            }
        }
        true
    }

    /// The attention kernel llama.cpp runs for a query row at `pos` with `nth` threads: its
    /// split-KV decode when the batch is that one row (or every row is computed as if alone),
    /// the cache is F16 and its padded length — `used + 1` rounded up to 256 cells, at most
    /// the cache size, as `llama_kv_cache::get_n_kv` gives it for one sequence — reaches 512
    /// cells, in `ceil(n_kv / nth)`-cell chunks; otherwise `kind`. The bits then match
    /// llama.cpp run with the same thread count. A one-row [`attention::AttnKernel::Wide`] is
    /// split the same way (the split's chunks keep ggml's F16 accumulators).
    fn kv_split(&self, kind: attention::AttnKernel, pos: usize, nth: usize) -> attention::AttnKernel {
        let kv = self.kv;
        if !matches!(kind, attention::AttnKernel::Reference | attention::AttnKernel::Wide) || !self.splits() {
            return kind;
        }
        let n_kv = (pos + 1).next_multiple_of(256).min(kv.n_cells);
        if n_kv < 512 {
            return kind;
        }
        attention::AttnKernel::Split(n_kv.div_ceil(nth))
    }

    /// Whether [`Ctx::kv_split`] may split a row of this pass: every row computed as if alone
    /// (one row, or `--batch-invariant`) over an F16 cache.
    fn splits(&self) -> bool {
        let kv = self.kv;
        (self.graph.n_tokens == 1 || self.mode.batch_invariant) && kv.k_type == DType::F16 && kv.v_type == DType::F16
    }
}

/// A worker's part in an attention node: worker `ith` of the node's `nth`, with its buffers.
pub(super) struct AttnWorker<'s> {
    pub ith: usize,
    pub nth: usize,
    pub scratch: &'s mut AttnScratch,
    /// A decode node's row plans ([`Ctx::decode_dealt`]), room for an attention node's rows.
    pub plans: &'s mut Vec<RowPlan>,
}

/// Split rows of a decode node whose ranges [`Ctx::decode_dealt`] deals, at most (the partial
/// slots' rows, `partials::SplitParts::rows_for`; a step with more split rows cuts its items by
/// their count, `attention_items`, each split row's ranges on one worker).
pub(super) const SPLIT_ROWS: usize = 16;

/// How [`Ctx::decode_dealt`] computes one row: its visible cells, its kernel and, under the
/// split-KV decode (`chunk` > 0), its ranges `first .. ranges` and its row of partial slots.
pub(super) struct RowPlan {
    span: Range<usize>,
    kind: attention::AttnKernel,
    chunk: usize,
    first: usize,
    ranges: usize,
    slot: usize,
}

impl RowPlan {
    /// A row computed in one call over its visible cells `span`.
    fn whole(span: Range<usize>, kind: attention::AttnKernel) -> Self {
        RowPlan { span, kind, chunk: 0, first: 0, ranges: 1, slot: 0 }
    }

    /// A row under the split-KV decode in `chunk`-cell ranges, its partials in slot row
    /// `slot`: ranges before `first` hold no visible cell.
    fn split(span: Range<usize>, kind: attention::AttnKernel, chunk: usize, slot: usize) -> Self {
        let ranges = attention::split_ranges(span.end, chunk);
        RowPlan { first: (span.start / chunk).min(ranges - 1), span, kind, chunk, ranges, slot }
    }

    /// The visible cells of range `i` (the whole span without the split).
    fn cells(&self, i: usize) -> Range<usize> {
        if self.chunk == 0 {
            return self.span.clone();
        }
        let a = (i * self.chunk).max(self.span.start).min(self.span.end);
        a..((i + 1) * self.chunk).min(self.span.end)
    }
}

/// One kernel call of [`Ctx::decode_dealt`]: row `r`'s query heads `heads` of KV head `j` (of
/// the node) over range `i` of its cells.
#[derive(Debug, PartialEq)]
struct Call {
    r: usize,
    j: usize,
    i: usize,
    heads: Range<usize>,
}

/// Worker `ith` of `nth`'s calls over `plans`' units — (row, KV head, live range, query head),
/// in that order, each costing its range's visible cells, `total` in all — as one contiguous
/// run: a unit is the worker's whose cost midpoint falls in its `nth`th of `total`. The owner
/// never decreases along the units, so every unit has one worker and the runs differ by less
/// than a unit's cost from `total / nth`.
fn dealt_calls<'a>(plans: &'a [RowPlan], n_kv: usize, heads_of: &'a impl Fn(usize) -> Range<usize>, total: u64, ith: usize, nth: usize) -> impl Iterator<Item = Call> + 'a {
    let (nth64, ith64) = (nth as u64, ith as u64);
    // The owner of a unit starting at `prefix` with cost `c`.
    let owner = move |prefix: u64, c: u64| ((2 * prefix + c) * nth64 / (2 * total)).min(nth64 - 1);
    let (mut r, mut j, mut i, mut prefix) = (0, 0, plans.first().map_or(0, |p| p.first), 0u64);
    std::iter::from_fn(move || {
        while r < plans.len() {
            let plan = &plans[r];
            let heads = heads_of(j);
            let c = plan.cells(i).len() as u64;
            let start = prefix;
            prefix += c * heads.len() as u64;
            let at = (r, j, i);
            // Next (row, KV head, range).
            i += 1;
            if i == plan.ranges {
                j += 1;
                if j == n_kv {
                    (r, j) = (r + 1, 0);
                }
                i = plans.get(r).map_or(0, |p| p.first);
            }
            if owner(start + c * (heads.len() as u64 - 1), c) < ith64 {
                continue;
            }
            if owner(start, c) > ith64 {
                (r, j, i) = (plans.len(), 0, 0);
                return None;
            }
            // This worker's heads of the group: those whose midpoint is its.
            let mine = heads.clone().filter(|&h| owner(start + c * (h - heads.start) as u64, c) == ith64);
            let (lo, n) = mine.fold((usize::MAX, 0), |(lo, n), h| (lo.min(h), n + 1));
            if n > 0 {
                return Some(Call { r: at.0, j: at.1, i: at.2, heads: lo..lo + n });
            }
        }
        None
    })
}

/// The KV heads of a node over `n_head` query heads of `shard` and, for KV head `j` (of the
/// shard), its query heads: the model's heads (k0 + j)·group .. (k0 + j + 1)·group, k0 the
/// shard's first KV head, less the shard's first query head, within the shard's heads.
fn kv_heads(n_head: usize, shard: AttnShard) -> (usize, impl Fn(usize) -> Range<usize> + Copy) {
    let n_kv = shard.kv_of(n_head - 1) + 1;
    let k0 = shard.q_head0 / shard.group;
    let heads_of = move |j: usize| {
        let (first, end) = ((k0 + j) * shard.group, (k0 + j + 1) * shard.group);
        first.saturating_sub(shard.q_head0)..(end - shard.q_head0).min(n_head)
    };
    (n_kv, heads_of)
}

/// Worker `ith`'s share of an attention node over `blocks` blocks of rows and `n_head` query
/// heads whose KV heads `shard.kv_of` gives (`group` query heads each in serial mode; a
/// tensor-parallel shard's first and last KV heads may serve fewer), as (block, KV head, query
/// heads) items. With many (block, KV head) pairs (prefill) they are dealt round-robin, whole
/// KV heads (later rows see more cells, so contiguous ranges would be uneven). With few
/// (decode), the (block, query head) units are cut into one contiguous range per worker, split
/// at KV-head boundaries: 3 KV heads × 3 heads on 2 workers give 5 and 4 heads, where whole
/// groups gave 6 and 3.
pub fn attention_items(
    blocks: usize,
    n_head: usize,
    shard: AttnShard,
    ith: usize,
    nth: usize,
) -> impl Iterator<Item = (usize, usize, Range<usize>)> {
    let (n_kv, heads_of) = kv_heads(n_head, shard);
    let pairs = blocks * n_kv;
    let dealt = pairs >= 4 * nth;
    let whole = (ith..if dealt { pairs } else { 0 }).step_by(nth).map(move |pr| (pr / n_kv, pr % n_kv, heads_of(pr % n_kv)));
    let mut units = if dealt { 0..0 } else { split(blocks * n_head, ith, nth) };
    let cut = std::iter::from_fn(move || {
        let u = units.start;
        if u >= units.end {
            return None;
        }
        let (b, h0) = (u / n_head, u % n_head);
        let kv = shard.kv_of(h0);
        let h1 = heads_of(kv).end.min(h0 + units.end - u);
        units.start = u + h1 - h0;
        Some((b, kv, h0..h1))
    });
    whole.chain(cut)
}

#[cfg(test)]
mod tests {
    use super::{attention_items, dealt_calls, kv_heads, RowPlan};
    use crate::tensor::AttnShard;
    use corelm_kernels::attention::AttnKernel;

    /// Every (row, KV head, live range, query head) unit is dealt to exactly one worker, each
    /// worker's calls are one contiguous run in unit order, and each worker's cells lie within
    /// one unit's cost of an even share: rows of mixed lengths, split and whole, windows, one
    /// worker to more workers than units, and tensor-parallel shards.
    #[test]
    fn decode_units_dealt_once_by_their_cells() {
        let whole = |span| RowPlan::whole(span, AttnKernel::Reference);
        let split = |span, chunk| RowPlan::split(span, AttnKernel::Reference, chunk, 0);
        let cases: Vec<(Vec<RowPlan>, AttnShard, usize)> = vec![
            (vec![split(0..4000, 2048)], AttnShard { q_head0: 0, group: 3, kv_base: 0 }, 9),
            (vec![split(0..4000, 2048), whole(0..100)], AttnShard { q_head0: 0, group: 3, kv_base: 0 }, 9),
            (vec![whole(0..7), whole(0..3000), whole(0..40)], AttnShard { q_head0: 0, group: 7, kv_base: 0 }, 14),
            (vec![split(3488..4000, 1000), split(0..1400, 700), whole(0..1)], AttnShard { q_head0: 0, group: 4, kv_base: 0 }, 4),
            (vec![whole(0..600), split(0..2600, 163)], AttnShard { q_head0: 5, group: 3, kv_base: 0 }, 4),
        ];
        for (plans, shard, n_head) in &cases {
            let (n_kv, heads_of) = kv_heads(*n_head, *shard);
            // Units in order, with their cost.
            let mut units = vec![];
            for (r, p) in plans.iter().enumerate() {
                for j in 0..n_kv {
                    for i in p.first..p.ranges {
                        for h in heads_of(j) {
                            units.push(((r, j, i, h), p.cells(i).len() as u64));
                        }
                    }
                }
            }
            let total: u64 = units.iter().map(|u| u.1).sum();
            assert_eq!(total, plans.iter().map(|p| (p.span.len() * n_head) as u64).sum::<u64>());
            let max_unit = units.iter().map(|u| u.1).max().unwrap();
            for nth in [1, 2, 3, 5, 16, 40] {
                let mut seen = vec![];
                for ith in 0..nth {
                    let mut cost = 0;
                    for c in dealt_calls(plans, n_kv, &heads_of, total, ith, nth) {
                        assert!(!c.heads.is_empty() && c.heads.start >= heads_of(c.j).start && c.heads.end <= heads_of(c.j).end, "{c:?}");
                        for h in c.heads {
                            seen.push((c.r, c.j, c.i, h));
                            cost += plans[c.r].cells(c.i).len() as u64;
                        }
                    }
                    let share = total as f64 / nth as f64;
                    assert!((cost as f64 - share).abs() <= max_unit as f64, "worker {ith} of {nth}: {cost} cells against {share}");
                }
                // Once each, in unit order: the workers' runs follow one another.
                assert_eq!(seen, units.iter().map(|u| u.0).collect::<Vec<_>>(), "{nth} workers");
            }
        }
    }

    /// Every (block, query head) is taken by exactly one worker; with few pairs the workers'
    /// head counts differ by at most one (up to ceil-division rounding), and no item spans two
    /// KV heads.
    #[test]
    fn attention_items_cover_every_head_once_and_balance_decode() {
        for (blocks, n_kv, group) in [(1usize, 3usize, 3usize), (1, 2, 7), (1, 1, 4), (4, 8, 4), (40, 3, 3), (2, 5, 1)] {
            for nth in 1..=9 {
                let mut seen = vec![0u32; blocks * n_kv * group];
                let mut per_worker = vec![];
                for ith in 0..nth {
                    let mut n = 0;
                    let shard = AttnShard { q_head0: 0, group, kv_base: 0 };
                    for (b, kvh, heads) in attention_items(blocks, n_kv * group, shard, ith, nth) {
                        assert!(b < blocks && kvh < n_kv && !heads.is_empty());
                        assert!(heads.start >= kvh * group && heads.end <= (kvh + 1) * group);
                        for h in heads {
                            seen[b * n_kv * group + h] += 1;
                            n += 1;
                        }
                    }
                    per_worker.push(n);
                }
                assert!(seen.iter().all(|&c| c == 1), "{blocks} {n_kv} {group} nth {nth}");
                if blocks * n_kv < 4 * nth {
                    let units = blocks * n_kv * group;
                    assert!(per_worker.iter().all(|&n| n <= units.div_ceil(nth)), "{per_worker:?}");
                }
            }
        }
    }

    /// A tensor-parallel shard's heads (any first head, any count): every (block, head) once,
    /// each item's heads all reading the item's KV head.
    #[test]
    fn attention_items_of_uneven_shards() {
        // (first query head, heads, group): SmolLM2's shards at --tp 2 and 4, Qwen2.5's at 3,
        // Gemma 3's at 4.
        for (q_head0, n_head, group) in [(0, 5, 3), (5, 4, 3), (3, 2, 3), (7, 2, 3), (5, 5, 7), (10, 4, 7), (3, 1, 4)] {
            let shard = AttnShard { q_head0, group, kv_base: 0 };
            for (blocks, nth) in [(1usize, 1usize), (1, 3), (2, 2), (40, 2), (3, 7)] {
                let mut seen = vec![0u32; blocks * n_head];
                for ith in 0..nth {
                    for (b, kvh, heads) in attention_items(blocks, n_head, shard, ith, nth) {
                        for h in heads {
                            assert_eq!(shard.kv_of(h), kvh, "head {h} of shard {q_head0}+{n_head}");
                            seen[b * n_head + h] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "{q_head0} {n_head} {group}: {seen:?}");
            }
        }
    }
}
