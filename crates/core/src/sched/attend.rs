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
    /// Worker `ith` of `nth`'s share of the attention node `t` of layer `layer` (queries `q`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(&self, t: &Tensor, layer: usize, q: TensorId, p: AttnParams, shard: AttnShard, ith: usize, nth: usize, scratch: &mut AttnScratch) {
        let [ne0, rows] = t.ne;
        let q = self.f32s(q);
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
        // One query row over an F16 cache long enough for ggml's split-KV decode: its ranges
        // dealt to the workers with the KV heads (`split_decode`).
        if rows == 1 && kv.k_layout == KeyLayout::Rows {
            if let attention::AttnKernel::Split(chunk) = self.kv_split(kind, self.batch.pos[0] as usize, nth) {
                let seq = self.batch.seq[0];
                if self.split_decode(t, q, &|j| rows_of(seq, shard.kv_base + j), span_of(0), chunk, p, shard, ith, nth, scratch) {
                    return;
                }
            }
        }
        // A prefill of one sequence over keys in columns: the pipeline of the node's worker
        // group, if there is one (its slots are shared by the group's workers; a serial node
        // runs on the pool's only group).
        let seq0 = self.batch.seq[0];
        if let Some(pipe) = self.pipelines.get(t.group.map_or(0, usize::from)).filter(|pp| {
            kind == attention::AttnKernel::Tiled && kv.k_layout == KeyLayout::Columns && pp.head_dim() == hd && self.batch.seq[..rows].iter().all(|&s| s == seq0)
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
            unsafe { attention::matrix::attend_pipelined(self.kernels, pipe, role, ith, nth, blocks * n_kv, &item, p.scale, scratch) };
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
                attention::attend_rows(kind, self.kernels, q_rows, heads.len(), &spans[..n], &rows_kv, p.scale, scratch, out_rows);
                r0 = r1;
            }
        }
    }

    /// Worker `ith` of `nth`'s share of a one-row attention node `t` (queries `q`) under
    /// ggml's split-KV decode (`chunk`-cell ranges, of which those holding cells of the
    /// visible `span` count): the units — per KV head (whose rows `rows_of` gives), per range,
    /// per part of its query heads — cut into one contiguous run per
    /// worker. Heads are cut into parts only where KV heads × ranges are fewer than the workers
    /// (a sliding window leaves one range or two). Each unit's partials go to
    /// `Executor::split_parts`; the worker that writes a KV head's last unit folds its query
    /// heads in range order into the output (`partials`): the bits of the whole split on one
    /// worker (`attention::fold_ranges`; ranges without a visible cell fold as nothing).
    /// Workers' shares differ by at most one unit, and each key and value row is read once
    /// where the heads are not cut: split by heads, SmolLM2's 3 KV heads of 3 query heads over
    /// 2 workers gave one worker 5 heads, and both read the middle KV head's rows. Returns
    /// false, having done nothing, where `Executor::split_parts` has no slots for the node.
    #[allow(clippy::too_many_arguments)]
    fn split_decode<'k>(
        &self,
        t: &Tensor,
        q: &[f32],
        rows_of: &dyn Fn(usize) -> attention::KvRows<'k>,
        span: Range<usize>,
        chunk: usize,
        p: AttnParams,
        shard: AttnShard,
        ith: usize,
        nth: usize,
        scratch: &mut AttnScratch,
    ) -> bool {
        let hd = p.head_dim;
        let (n_kv, heads_of) = kv_heads(p.n_head, shard);
        let ranges = attention::split_ranges(span.end, chunk);
        // The model's query heads of the node's heads `h` (slots and counts are the model's).
        let model = |h: Range<usize>| shard.q_head0 + h.start..shard.q_head0 + h.end;
        if !self.split_parts.fits(model(0..p.n_head), ranges, hd) {
            return false;
        }
        // Ranges before `first` hold no visible cell.
        let first = (span.start / chunk).min(ranges - 1);
        let live = ranges - first;
        let parts = nth.div_ceil(n_kv * live).clamp(1, shard.group);
        // Unit u: KV head u / (live · parts), then its range, then its part of the heads.
        let unit = |u: usize| {
            let (j, rest) = (u / (live * parts), u % (live * parts));
            let all = heads_of(j);
            let part = split(all.len(), rest % parts, parts);
            (j, first + rest / parts, all.start + part.start..all.start + part.end)
        };
        let visible = attention::Visible::From(span.start);
        let mut units = split(n_kv * live * parts, ith, nth).map(unit).peekable();
        while let Some((j, r, heads)) = units.next() {
            // Its KV head's query heads, whose count this unit adds to.
            let group = model(heads_of(j));
            if !heads.is_empty() {
                // This unit's kernel asks for the next unit's first cells while it computes
                // its last chunk.
                let next = units.peek().map(|&(nj, nr, _)| {
                    let a = (nr * chunk).max(span.start).min(span.end);
                    (rows_of(nj), a..(a + chunk).min(span.end))
                });
                scratch.read_next(next);
                // SAFETY: the (range, head) slots of this unit are written by this worker alone
                // in this node (units are dealt once) and read only after the KV head's count
                // completes.
                let (states, acc) = unsafe { self.split_parts.slots(r, model(heads.clone()), hd) };
                let kvr = rows_of(j);
                let cells = attention::Cells { kv: &kvr, n: span.end, visible };
                attention::attend_split_range(self.kernels, &q[heads.start * hd..heads.end * hd], cells, p.scale, chunk, r, scratch, states, acc);
            }
            if !self.split_parts.written(group.start, live * parts) {
                continue;
            }
            for (h, mh) in heads_of(j).zip(group) {
                // SAFETY: this worker completed the KV head's count: every unit's slots of its
                // heads were written and released before; this head's output is written here
                // alone (one folder per KV head).
                let out = unsafe { self.out_f32(t, h * hd, hd) };
                // SAFETY: as above.
                attention::fold_ranges((first..ranges).map(|r| unsafe { self.split_parts.part(r, mh, hd) }), out);
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
        let one_row = self.graph.n_tokens == 1 || self.mode.batch_invariant;
        if !matches!(kind, attention::AttnKernel::Reference | attention::AttnKernel::Wide) || !one_row || kv.k_type != DType::F16 || kv.v_type != DType::F16 {
            return kind;
        }
        let n_kv = (pos + 1).next_multiple_of(256).min(kv.n_cells);
        if n_kv < 512 {
            return kind;
        }
        attention::AttnKernel::Split(n_kv.div_ceil(nth))
    }
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
    use super::attention_items;
    use crate::tensor::AttnShard;

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
