//! The attention block's cache-facing nodes: storing each shard's keys and values into the KV
//! cache, and attention over it. Under tensor parallelism a shard caches every KV head its
//! query heads read; a head several shards read is projected once (`TpPlan::k_heads`,
//! `v_heads`: its keys by one reader, its values by one, the least loaded) and its projector stores
//! it into every reader's slots, followed by one global barrier, so that each shard then
//! attends over its own copy. Keeping the copies (rather than reading another shard's slots)
//! keeps a shard's attention on its own node's memory; projecting once keeps its rows of Wk
//! and Wv from growing with the number of readers.

use super::*;

impl Builder<'_> {
    /// Store each shard's K and V rows in its own cache slots. With a plan that projects a
    /// shared KV head once (`TpPlan::exchanges_kv`: `k`'s shards hold their `k_heads`, `v`'s
    /// their `v_heads`), each shard stores what it projected into the slots of every shard
    /// that reads those heads, and the global barrier after the stores lets every shard's
    /// attention read its copies.
    pub fn kv_store(&mut self, layer: usize, k: &Bundle, v: &Bundle) {
        let keys = self.key_layout;
        let layer = layer as u32;
        let exchange = self.shard_plan().filter(|p| p.exchanges_kv());
        let Some(plan) = exchange else {
            self.zip(&[k, v], |b, t| {
                let (k, v) = (t[0], t[1]);
                b.check_src(k);
                b.check_src(v);
                let kv_base = b.shard().map_or(0, |(plan, s)| plan.kv_base[s]) as u32;
                let width = b.t(k).ne[0] as u32;
                assert_eq!(b.t(v).ne[0] as u32, width, "K and V rows of different widths");
                b.push([0, 0], DType::F32, Op::KvStore { layer, k: Some(k), v: Some(v), c0: 0, width, kv_base, keys }, Storage::None)
            });
            return;
        };
        let hd = plan.dims.head_dim;
        for (bundle, heads, values) in [(k, &plan.k_heads, false), (v, &plan.v_heads, true)] {
            assert_eq!(bundle.0.len(), plan.degree(), "an exchange stores each shard's projection");
            for (s, (&x, own)) in bundle.0.iter().zip(heads).enumerate() {
                self.check_src(x);
                self.group = Some(s as u16);
                // The readers of this shard's heads, a run of consecutive slots on each.
                for (t, kv) in plan.kv_heads.iter().enumerate() {
                    let (h0, h1) = (own.start.max(kv.start), own.end.min(kv.end));
                    if h0 >= h1 {
                        continue;
                    }
                    let (c0, width, kv_base) = ((h0 - own.start) * hd, (h1 - h0) * hd, plan.kv_base[t] + h0 - kv.start);
                    let (k, v) = if values { (None, Some(x)) } else { (Some(x), None) };
                    let op = Op::KvStore { layer, k, v, c0: c0 as u32, width: width as u32, kv_base: kv_base as u32, keys };
                    self.push([0, 0], DType::F32, op, Storage::None);
                }
            }
        }
        self.group = None;
        self.global_after.push(self.nodes.len() - 1);
    }

    /// Attention of the query heads of `q` (`p` gives the model's head counts; a shard covers
    /// its own query heads and the KV heads they read).
    pub fn attention(&mut self, layer: usize, q: &Bundle, p: AttnParams) -> Bundle {
        self.attention_sinks(layer, q, p, None)
    }

    /// [`Builder::attention`] with an attention sink per query head (`sinks`: the model's
    /// `[n_head]` f32 logits, whole; each shard reads its heads' from `AttnShard::q_head0`).
    pub fn attention_sinks(&mut self, layer: usize, q: &Bundle, p: AttnParams, sinks: Option<&Bundle>) -> Bundle {
        assert!(p.n_kv_head > 0 && p.n_head.is_multiple_of(p.n_kv_head), "heads not a multiple of KV heads");
        let group = p.n_head / p.n_kv_head;
        self.max_head_dim = self.max_head_dim.max(p.head_dim);
        if let Some(s) = sinks {
            let ne = self.t(s.single()).ne;
            assert!(ne == [p.n_head, 1] && self.t(s.single()).dtype == DType::F32, "attention sinks: one f32 per query head");
        }
        let srcs: Vec<&Bundle> = match sinks {
            Some(s) => vec![q, s],
            None => vec![q],
        };
        self.zip(&srcs, |b, t| {
            let q = t[0];
            let sinks = t.get(1).copied();
            b.check_src(q);
            let ne = b.t(q).ne;
            let (p, shard) = match b.shard() {
                Some((plan, s)) => {
                    let (qh, kv) = (&plan.q_heads[s], &plan.kv_heads[s]);
                    let p = AttnParams { n_head: qh.len(), n_kv_head: kv.len(), ..p };
                    (p, AttnShard { q_head0: qh.start, group, kv_base: plan.kv_base[s] })
                }
                None => (p, AttnShard { q_head0: 0, group, kv_base: 0 }),
            };
            assert_eq!(ne[0], p.n_head * p.head_dim, "attention query row length");
            b.node(ne, DType::F32, Op::Attention { layer: layer as u32, q, p, shard, sinks }).single()
        })
    }
}
