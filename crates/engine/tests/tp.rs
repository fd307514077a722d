//! Tensor parallelism on virtual nodes (worker groups of this machine): degrees 2, 3 and 4 give
//! the logits of degree 1 within each model's golden tolerance (the shards' partial sums are
//! added in another order than one matmul's, so not bit for bit), greedy choices equal wherever
//! degree 1's margin is at least 0.5 (the golden rule), in both synchronisation modes; a degree
//! that cannot work is refused with its numbers.

mod common;

use common::*;
use corelm_engine::{Batch, Engine, EngineConfig, TpSync};

/// Logits of a prompt (every row) and of decode steps fed `steps`.
fn run(e: &mut Engine, prompt: &[u32], steps: &[u32]) -> Vec<Vec<f32>> {
    let mut b = Batch::new();
    for (i, &t) in prompt.iter().enumerate() {
        b.add(t, i as i32, 0, true);
    }
    let l = e.decode(&b).unwrap();
    let mut rows: Vec<Vec<f32>> = (0..prompt.len()).map(|r| l.row(r).to_vec()).collect();
    for (i, &t) in steps.iter().enumerate() {
        let mut b = Batch::new();
        b.add(t, (prompt.len() + i) as i32, 0, true);
        rows.push(e.decode(&b).unwrap().row(0).to_vec());
    }
    rows
}

const TEXT: &str = "The history of the printing press begins in the fifteenth century, when Johannes \
    Gutenberg combined movable metal type, oil-based ink and a screw press adapted from wine making.";

#[test]
fn tp_degrees_match_degree_one_within_the_golden_tolerance() {
    for (_, file, tol) in MODELS {
        let cfg = |tp: usize, tp_sync: TpSync| EngineConfig { tp, tp_sync, ..test_config(4) };
        let (mut one, tok) = load(file, cfg(1, TpSync::Async));
        let prompt = tok.encode(TEXT, true, false).unwrap();
        // Degree 1's own greedy choices as the decode steps (teacher-forced for every degree).
        let mut steps = Vec::new();
        let mut rows = run(&mut one, &prompt, &steps);
        for _ in 0..6 {
            steps.push(top10(rows.last().unwrap())[0] as u32);
            one.clear_all();
            rows = run(&mut one, &prompt, &steps);
        }
        let want = rows;
        drop(one);
        for (tp, sync) in [(2, TpSync::Async), (3, TpSync::Async), (4, TpSync::Async), (2, TpSync::Lockstep)] {
            let (mut e, _) = load(file, cfg(tp, sync));
            let got = run(&mut e, &prompt, &steps);
            // The golden checks' measure: degree 1's ten largest logits.
            let (max, all) = golden_rule(&got, &want, &format!("{file} --tp {tp} {sync}"));
            eprintln!(
                "{file} --tp {tp} --tp-sync {sync}: max |Δlogit| {max:.4} on the top 10 ({all:.4} on any logit) against --tp 1, {} rows",
                want.len()
            );
            assert!(max <= tol, "{file} --tp {tp} {sync}: max |Δlogit| {max} > {tol}");
        }
    }
}

/// The LM head is split by vocabulary rows: at `--tp 3` three matmul nodes, one per worker
/// group, each reading its own rows of the output matrix (whole 64-row units) and writing its
/// columns of the one logits tensor, which together cover the vocabulary once; no gather node
/// follows. Their logits equal degree 1's bit for bit (a row's dot does not depend on the
/// split), which `tp_degrees_match_degree_one_within_the_golden_tolerance` bounds.
#[test]
fn the_lm_head_is_split_by_vocabulary_rows() {
    use corelm_core::{Op, Storage};
    let (mut e, _) = load(MODELS[0].1, EngineConfig { tp: 3, ..test_config(3) });
    let n_vocab = e.hyper().n_vocab;
    let g = e.graph(5, 2);
    let heads: Vec<_> = g.nodes.iter().copied().filter(|id| matches!(g.tensors[id.0 as usize].storage, Storage::Output { .. })).collect();
    assert_eq!(heads.len(), 3, "one LM head node per shard");
    assert_eq!(g.nodes.last(), heads.last(), "no node after the shards' heads");
    let mut col = 0;
    for (s, id) in heads.iter().enumerate() {
        let t = &g.tensors[id.0 as usize];
        let Storage::Output { offset, ld } = t.storage else { unreachable!() };
        let Op::MatMul { w, .. } = t.op else { panic!("shard {s}: {:?}", t.op) };
        let w = &g.tensors[w.0 as usize];
        assert_eq!((t.group, ld, offset, t.ne), (Some(s as u16), n_vocab, 4 * col, [w.ne[1], 2]), "shard {s}");
        assert!(w.ne[1] % 64 == 0 && w.group == Some(s as u16), "shard {s}: {} rows", w.ne[1]);
        col += w.ne[1];
    }
    assert_eq!(col, n_vocab);
    assert!(matches!(g.tensors[g.result.0 as usize].storage, Storage::Output { offset: 0, ld } if ld == n_vocab));
}

/// A cut inside one of down's quantization blocks: Qwen2.5's 4,864 neurons (19 blocks of 256
/// in down) split 2,432 + 2,432 at `--tp 2`. Each shard multiplies its gate/up rows, and every
/// block of down its neurons touch (the block they share on both sides, in the file's type) by
/// its activations padded with zeros to those blocks: 128 after shard 0's, 128 before shard
/// 1's. (The logits against degree 1: `tp_degrees_match_degree_one_within_the_golden_tolerance`.)
#[test]
fn a_feed_forward_cut_inside_a_block_pads_the_activations() {
    use corelm_core::{Op, Storage};
    let (mut e, _) = load(MODELS[2].1, EngineConfig { tp: 2, ..test_config(2) });
    let (n_embd, n_ff) = (e.hyper().n_embd, e.hyper().n_ff);
    let g = e.graph(5, 5);
    // Per shard: rows of its gate/up matmuls; down's columns, and its input's padding.
    let (mut ff_rows, mut down) = ([vec![], vec![]], [vec![], vec![]]);
    for id in &g.nodes {
        let t = &g.tensors[id.0 as usize];
        let (Op::MatMul { w, x }, Some(s), 0) = (t.op, t.group, t.layer) else { continue };
        let w = &g.tensors[w.0 as usize];
        let Storage::Weight { cols, .. } = w.storage else { unreachable!("matmul weights") };
        match cols {
            Some(c) if c.row_len == n_ff => {
                assert_eq!((w.ne[1], w.dtype.block_size()), (n_embd, 256));
                let xq = &g.tensors[x.0 as usize];
                let Op::Quantize { x: a, pad } = xq.op else { panic!("{:?}", xq.op) };
                down[s as usize].push((c.c0..c.c0 + w.ne[0], pad, xq.ne[0], g.tensors[a.0 as usize].ne[0]));
            }
            None if w.ne[1] == n_ff / 2 => ff_rows[s as usize].push(w.ne[1]),
            _ => {}
        }
    }
    assert_eq!(ff_rows, [[2432, 2432], [2432, 2432]], "gate and up rows of each shard");
    assert_eq!(down, [[(0..2560, 0, 2560, 2432)], [(2304..4864, 128, 2560, 2432)]], "(down's columns, zeros before, padded width, activations)");
}

/// ArcLight's per-node pools: under `--numa tp` each shard's nodes write their results into
/// their own region of the activation buffers (serial nodes into region 0), for the batch that
/// sized the pools and for smaller ones alike, and each shard region's pages are bound to its
/// node, read back from the kernel. On one node every shard is bound to it; the placement
/// changes no bits.
#[test]
fn shard_activations_live_in_their_own_regions_on_their_nodes() {
    use corelm_core::numa::{pages_per_node, policy_of, MPOL_BIND};
    use corelm_core::Storage;
    let cfg = EngineConfig { tp: 2, numa: corelm_engine::NumaMode::Tp, pin: true, ..test_config(2) };
    let (mut e, _) = load(MODELS[0].1, cfg.clone());
    let layout = e.pools().layout.clone();
    assert!(layout.regions.iter().all(|r| r.len() == 3), "a serial region and one per shard: {layout:?}");
    let n_batch = e.config().n_batch;
    for (n, out) in [(n_batch, n_batch), (9, 9), (1, 1)] {
        let g = e.graph(n, out);
        let mut used = [[0usize; 3]; 2];
        for t in g.tensors.iter() {
            let Storage::Act { buf, offset } = t.storage else { continue };
            let (b, r) = (buf as usize, t.group.map_or(0, |s| s as usize + 1));
            let range = layout.range(b, r);
            assert!(range.start <= offset && offset + t.n_bytes() <= range.end, "{n} tokens: a tensor of group {:?} at {offset} outside {range:?}", t.group);
            used[b][r] += 1;
        }
        assert!(used.iter().all(|u| u.iter().all(|&c| c > 0)), "{n} tokens: every region holds results: {used:?}");
    }
    let nodes = e.placement().tp_workers(&[1, 1]).1;
    for (b, buf) in e.pools().act.iter().enumerate() {
        for (s, &node) in nodes.iter().enumerate() {
            let r = layout.range(b, s + 1);
            let at = buf.as_ptr() as usize + r.start;
            assert_eq!(policy_of(at).unwrap(), (MPOL_BIND, vec![node]), "buffer {b}, shard {s}");
            let pages = pages_per_node(at, r.len(), 256).unwrap();
            assert_eq!(pages.keys().copied().collect::<Vec<_>>(), vec![node as i32], "buffer {b}, shard {s}: {pages:?}");
        }
    }
    let tokens: Vec<u32> = (0..23).map(|i| (i * 733 + 5) % 49152).collect();
    let placed = run(&mut e, &tokens, &[17, 4242]);
    drop(e);
    let (mut plain, _) = load(MODELS[0].1, EngineConfig { numa: corelm_engine::NumaMode::Off, ..cfg });
    let want = run(&mut plain, &tokens, &[17, 4242]);
    for (r, (a, b)) in placed.iter().zip(&want).enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "row {r}");
    }
}

#[test]
fn impossible_degrees_are_refused_by_number() {
    let (file, tp) = (MODELS[1].1, 5); // Gemma 3 270M: 4 query heads
    let e = Engine::load(model_path(file), EngineConfig { tp, ..test_config(8) }).err().expect("refused").to_string();
    assert!(e.contains("--tp 5") && e.contains("4 query heads"), "{e}");
    let e = Engine::load(model_path(file), EngineConfig { tp: 3, ..test_config(2) }).err().expect("refused").to_string();
    assert!(e.contains("at least 3 worker threads"), "{e}");
}

/// Both synchronisation modes under stress: 7 workers on this 2-core machine (oversubscribed,
/// so workers are preempted mid-node) in 3 groups of 3, 2 and 2, many prompt and decode passes.
/// The two modes differ only in barriers, so any race would show as differing bits: every
/// logit of every pass must be equal between them, and between repeated runs.
#[test]
fn async_and_lockstep_give_the_same_bits_under_stress() {
    let file = MODELS[0].1;
    let prompt: Vec<u32> = (0..23).map(|i| (i * 577 + 5) % 40000).collect();
    let steps: Vec<u32> = (0..20).map(|i| (i * 131 + 7) % 40000).collect();
    let mut runs = Vec::new();
    for tp_sync in [TpSync::Async, TpSync::Lockstep, TpSync::Async] {
        let (mut e, _) = load(file, EngineConfig { tp: 3, tp_sync, ..test_config(7) });
        runs.push(run(&mut e, &prompt, &steps));
    }
    for (i, r) in runs.iter().enumerate().skip(1) {
        for (row, (a, b)) in r.iter().zip(&runs[0]).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "run {i}, row {row}");
        }
    }
}

/// Unequal worker groups get parts in proportion: `-t 3 --tp 2` is a group of 2 workers and
/// one of 1, so SmolLM2's 9 heads split 6 + 3 and its 48 feed-forward blocks 32 + 16, and each
/// layer's matrices hold twice the weights in the first shard; the logits stay within the
/// golden tolerance of degree 1. A profile reports each group's waits at the global barriers
/// (and the same waits by the op kind of the node before them), and each group's busy time in
/// its own shard's nodes per op kind.
#[test]
fn shards_follow_their_worker_groups() {
    use corelm_core::Op;
    let (file, tol) = (MODELS[0].1, MODELS[0].2);
    let (mut e, tok) = load(file, EngineConfig { tp: 2, ..test_config(3) });
    let g = e.graph(5, 5);
    let mut weights = [0usize; 2];
    let mut q_rows = [0usize; 2];
    for id in &g.nodes {
        let t = &g.tensors[id.0 as usize];
        let (Op::MatMul { w, .. }, Some(s), 0) = (t.op, t.group, t.layer) else { continue };
        let w = &g.tensors[w.0 as usize];
        weights[s as usize] += w.ne[0] * w.ne[1];
        if q_rows[s as usize] == 0 {
            q_rows[s as usize] = w.ne[1];
        }
    }
    assert_eq!(q_rows, [6 * 64, 3 * 64], "the first matmul of each shard is its Wq rows");
    assert_eq!(weights[0], 2 * weights[1], "{weights:?}");
    let prompt = tok.encode(TEXT, true, false).unwrap();
    e.profile = Some(Default::default());
    let got = run(&mut e, &prompt, &[17]);
    let prof = e.profile.take().unwrap();
    let waits = &prof.group_wait;
    assert!(waits.len() == 2 && waits.iter().all(|w| w.is_finite() && *w >= 0.0), "{waits:?}");
    // The waits after each op kind's nodes are the same waits, per worker of the pool: the
    // group of 2's mean counts twice, the group of 1's once.
    let per_op: f64 = prof.per_op.iter().map(|p| p.wait_secs).sum();
    let per_group = (2.0 * waits[0] + waits[1]) / 3.0;
    assert!((per_op - per_group).abs() <= 1e-6 + 1e-6 * per_group, "waits after op kinds {per_op} s, per group {per_group} s");
    // Each shard's busy time: both shards run matmuls; a serial op kind has none.
    for p in &prof.per_op {
        let busy = p.group_secs.iter().filter(|s| **s > 0.0).count();
        match p.op {
            "matmul" => assert_eq!(busy, 2, "{p:?}"),
            "rms_norm" | "gather_sum" | "embed" => assert_eq!(busy, 0, "{p:?}"),
            _ => {}
        }
    }
    drop(e);
    let (mut one, _) = load(file, test_config(3));
    let want = run(&mut one, &prompt, &[17]);
    for (r, (a, b)) in got.iter().zip(&want).enumerate() {
        let top = top10(b);
        let max = top.iter().map(|&i| (a[i] - b[i]).abs()).fold(0f32, max_nan);
        assert!(max <= tol, "row {r}: max |Δlogit| {max} > {tol}");
    }
}

/// A llama model whose Wo (4 heads of 64 = one 256-value block per row) and down (512
/// neurons = 2 blocks) are Q4_K, the rest F32, written here from the llama fixture's metadata
/// and tokenizer: `--tp 3` cuts the heads 2 + 1 + 1 (Wo at columns 128 and 192) and the
/// feed-forward 224 + 96 + 192, every cut inside a block.
fn k_quant_cut_model() -> std::path::PathBuf {
    use corelm_gguf::writer::Writer;
    use corelm_gguf::{GgmlType, Gguf, Value};
    let fixture = Gguf::open(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/llama3.gguf")).unwrap();
    let (n_embd, n_ff, n_vocab, head_dim) = (256u64, 512u64, 288u64, 64u64);
    let mut w = Writer::new();
    for (k, v) in &fixture.metadata {
        let v = match k.as_str() {
            "llama.embedding_length" => Value::U32(n_embd as u32),
            "llama.feed_forward_length" => Value::U32(n_ff as u32),
            "llama.attention.key_length" | "llama.attention.value_length" | "llama.rope.dimension_count" => Value::U32(head_dim as u32),
            _ => v.clone(),
        };
        w.kv(k, v);
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut values = |n: u64, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed % 20001) as f32 / 10000.0 - 1.0) * scale
            })
            .collect()
    };
    let f32s = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let q4k = |v: Vec<f32>, k: u64| {
        let rb = corelm_kernels::row_bytes(corelm_kernels::DType::Q4K, k as usize);
        let mut out = vec![0u8; v.len() / k as usize * rb];
        let q = corelm_kernels::quant::reference::quantizer(corelm_kernels::DType::Q4K).unwrap();
        for (row, dst) in v.chunks_exact(k as usize).zip(out.chunks_exact_mut(rb)) {
            q(row, dst);
        }
        out
    };
    let ones = |n: u64| f32s(vec![1.0; n as usize]);
    w.tensor("token_embd.weight", &[n_embd, n_vocab], GgmlType::F32, f32s(values(n_embd * n_vocab, 1.0)));
    w.tensor("output_norm.weight", &[n_embd], GgmlType::F32, ones(n_embd));
    w.tensor("output.weight", &[n_embd, n_vocab], GgmlType::F32, f32s(values(n_embd * n_vocab, 0.1)));
    for il in 0..2 {
        let t = |s: &str| format!("blk.{il}.{s}.weight");
        w.tensor(&t("attn_norm"), &[n_embd], GgmlType::F32, ones(n_embd));
        w.tensor(&t("attn_q"), &[n_embd, 4 * head_dim], GgmlType::F32, f32s(values(n_embd * 4 * head_dim, 0.1)));
        w.tensor(&t("attn_k"), &[n_embd, 2 * head_dim], GgmlType::F32, f32s(values(n_embd * 2 * head_dim, 0.1)));
        w.tensor(&t("attn_v"), &[n_embd, 2 * head_dim], GgmlType::F32, f32s(values(n_embd * 2 * head_dim, 0.1)));
        w.tensor(&t("attn_output"), &[4 * head_dim, n_embd], GgmlType::Q4K, q4k(values(4 * head_dim * n_embd, 0.1), 4 * head_dim));
        w.tensor(&t("ffn_norm"), &[n_embd], GgmlType::F32, ones(n_embd));
        w.tensor(&t("ffn_gate"), &[n_embd, n_ff], GgmlType::F32, f32s(values(n_embd * n_ff, 0.1)));
        w.tensor(&t("ffn_up"), &[n_embd, n_ff], GgmlType::F32, f32s(values(n_embd * n_ff, 0.1)));
        w.tensor(&t("ffn_down"), &[n_ff, n_embd], GgmlType::Q4K, q4k(values(n_ff * n_embd, 0.1), n_ff));
    }
    let p = std::env::temp_dir().join(format!("corelm-tp-kquant-{}.gguf", std::process::id()));
    std::fs::write(&p, w.to_bytes()).unwrap();
    p
}

/// Cuts inside the blocks of Wo and down (`Builder::matmul_cols`): at `--tp 2` and `--tp 3`
/// every shard multiplies the blocks its columns touch by its activations padded with zeros,
/// and the logits stay those of `--tp 1` within the activations' quantization (each padded
/// block's Q8_K scale is its shard's own): at most 5 % of the largest logit (measured: 1.8 %
/// and 1.7 %; with Wo and down in F32, 0.003 %). Every pad left at 0 gave 113 %, and two
/// shards' slices of down from the same column sharing one copy (before the width was part
/// of `ColSlice`) 96 %.
#[test]
fn cuts_inside_quantization_blocks_of_wo_and_down_keep_the_logits() {
    use corelm_core::Op;
    let path = k_quant_cut_model();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 23 + 5) % 280).collect();
    let mut one = Engine::load(&path, test_config(2)).unwrap();
    let want = run(&mut one, &prompt, &[7, 100]);
    drop(one);
    for tp in [2, 3] {
        let mut e = Engine::load(&path, EngineConfig { tp, ..test_config(tp) }).unwrap();
        let g = e.graph(5, 5);
        // (padding before, padded width) of every padded activation: Wo's and down's, each layer.
        let mut pads: Vec<(u32, usize)> = g.nodes.iter().filter_map(|id| match g.tensors[id.0 as usize].op {
            Op::Quantize { x, pad } if g.tensors[x.0 as usize].ne[0] != g.tensors[id.0 as usize].ne[0] => Some((pad, g.tensors[id.0 as usize].ne[0])),
            _ => None,
        }).collect();
        pads.sort_unstable();
        pads.dedup();
        let expect: &[(u32, usize)] = if tp == 2 {
            // Heads 2 + 2 (Wo cut at 128) and neurons 256 + 256 (down on block boundaries).
            &[(0, 256), (128, 256)]
        } else {
            // Wo: 0..128, 128..192, 192..256 of one block; down: 0..224 (block 0), 224..320
            // (blocks 0 and 1), 320..512 (block 1), the cut that costs its largest shard least.
            &[(0, 256), (64, 256), (128, 256), (192, 256), (224, 512)]
        };
        assert_eq!(pads, expect, "--tp {tp}");
        let got = run(&mut e, &prompt, &[7, 100]);
        let rel = max_rel_diff(&want, &got);
        eprintln!("--tp {tp}: max |Δlogit| {rel:.5} of the largest logit against --tp 1");
        assert!(rel <= 0.05, "--tp {tp}: {rel}");
    }
    std::fs::remove_file(&path).ok();
}

/// A KV head that several shards read is projected once (`--tp-kv exchange`, the default): its
/// keys and its values each by the reader with the least work (`TpPlan::k_heads`), stored
/// into every reader's cache slots before a global barrier. Against projecting it on every
/// reader (`replicate`), the same bits (each head's rows are the same dot products, stored by
/// another group), for Gemma 3's one KV head at `--tp 2` and `--tp 4` (shards 2 and 3 project
/// nothing of it; Q8_0 keys and Q4_0 values) and SmolLM2's middle head at `--tp 2` with Q8_0
/// keys in columns. In the graph: each shard's Wk and Wv rows, and one more global barrier per
/// layer.
#[test]
fn a_shared_kv_head_is_projected_once_with_the_same_bits() {
    use corelm_core::{Op, Storage};
    use corelm_engine::TpKv;
    let prompt: Vec<u32> = (0..21).map(|i| (i * 577 + 5) % 40000).collect();
    let steps = [17, 4242, 99];
    use corelm_kernels::attention::KeyLayout::{Columns, Rows};
    use corelm_kernels::DType::{F16, Q4_0, Q8_0};
    let cases = [(MODELS[1].1, 2, Rows, F16, F16), (MODELS[1].1, 4, Rows, Q8_0, Q4_0), (MODELS[0].1, 2, Columns, Q8_0, F16)];
    for (file, tp, kv_layout, cache_type_k, cache_type_v) in cases {
        let cfg = |tp_kv| EngineConfig { tp, tp_kv, kv_layout, cache_type_k, cache_type_v, ..test_config(4) };
        let (mut rep, _) = load(file, cfg(TpKv::Replicate));
        let want = run(&mut rep, &prompt, &steps);
        let replicated_globals = rep.graph(prompt.len(), prompt.len()).barriers().1;
        drop(rep);
        let (mut e, _) = load(file, cfg(TpKv::Exchange));
        let got = run(&mut e, &prompt, &steps);
        for (r, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{file} --tp {tp}: row {r}");
        }
        let (h, n_layer) = (e.hyper().clone(), e.hyper().n_layer);
        let g = e.graph(prompt.len(), prompt.len());
        assert_eq!(g.barriers().1, replicated_globals + n_layer, "{file} --tp {tp}: one more global barrier per layer");
        // Layer 0's K and V projection rows per shard: its matmuls over the embedding of at
        // most n_kv_head · head_dim rows (Wq's slices too where they are that narrow).
        let mut rows = vec![0; tp];
        for id in &g.nodes {
            let t = &g.tensors[id.0 as usize];
            let (Op::MatMul { w, .. }, Some(s), 0) = (t.op, t.group, t.layer) else { continue };
            let w = &g.tensors[w.0 as usize];
            if matches!(w.storage, Storage::Weight { cols: None, .. }) && w.ne[0] == h.n_embd && w.ne[1] <= h.n_kv_head * h.head_dim {
                rows[s as usize] += w.ne[1];
            }
        }
        let want_rows: &[usize] = match (h.n_kv_head, tp) {
            (1, 2) => &[256, 256],           // Gemma: keys on shard 0, values on shard 1
            (1, 4) => &[512, 512, 256, 256], // and nothing on shards 2 and 3 (+ 256 of Wq each)
            _ => &[2 * 64, 4 * 64],          // SmolLM2: K/V 0 | K/V 1-2 (the shard of 4 query heads)
        };
        assert_eq!(rows, want_rows, "{file} --tp {tp}: K and V rows per shard");
    }
}

/// A draft model beside `--tp 2`: the draft is not cut, it runs on the pool's view of all the
/// workers as one group, between the target's sharded passes. The answer is the target's
/// without drafts (batch-invariant arithmetic), with a session's next turn in the same
/// sequence too, and the draft (the same weights, uncut) has most proposals kept.
#[test]
fn a_draft_model_runs_beside_tensor_parallelism() {
    use corelm_engine::draft::{DraftModel, DraftParams};
    use corelm_engine::generate::{generate_drafted, GenerateParams};
    use corelm_engine::sample::SamplingParams;
    let file = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let (mut e, tok) = load(file, EngineConfig { tp: 2, batch_invariant: true, n_batch: 32, ..test_config(2) });
    let prompt = tok.encode("Copy the list exactly, three times:\n- red apple\n- green pear\n- blue plum\n", true, true).unwrap();
    let params = GenerateParams { max_tokens: 60, sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
    let more = tok.encode("\nAgain:", false, true).unwrap();
    let answer = |e: &mut Engine, mut m: Option<&mut DraftModel>| {
        e.clear_all();
        let a = generate_drafted(e, m.as_deref_mut(), &tok, &prompt, &params, |_| true).unwrap();
        let b = generate_drafted(e, m, &tok, &more, &GenerateParams { max_tokens: 20, ..params.clone() }, |_| true).unwrap();
        (a, b)
    };
    let plain = answer(&mut e, None);
    let mut model = DraftModel::load(&model_path(file), &e, &tok, DraftParams { n_max: 4, ..Default::default() }).unwrap();
    let (a, b) = answer(&mut e, Some(&mut model));
    assert_eq!((&a.tokens, &b.tokens), (&plain.0.tokens, &plain.1.tokens));
    assert!(a.drafted > 40 && 2 * a.kept > a.drafted, "{} of {} proposals kept", a.kept, a.drafted);
    assert_eq!(e.last_view(), 0, "the target's passes run on its shard groups");
    assert_ne!(model.engine().last_view(), 0, "the draft's passes on the view of one group");
}
