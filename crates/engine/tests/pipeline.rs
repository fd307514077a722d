//! Prefill attention as a pipeline (`--attn-pipeline`, SMEPilot's attention: scores, softmax
//! and values of different tiles on different workers at once). On the golden models, a prompt
//! long enough for the tiled kernels gives every logit row bit for bit as without the pipeline
//! (keys in columns, the fused column-key kernels) on 1 to 3 workers, and the pipeline scored
//! exactly the key blocks the causal mask leaves; with tensor parallelism each worker group
//! pipelines its own shard's heads, again bit for bit; it is refused without keys in columns.

mod common;

use common::*;
use corelm_engine::{Engine, EngineConfig};
use corelm_kernels::attention::{KeyLayout, ROWS_MAX_VECTORS, TILED_MIN_ROWS};

#[test]
fn the_pipeline_keeps_every_bit_and_skips_what_the_mask_hides() {
    for (name, file, _) in MODELS {
        let columns = EngineConfig { kv_layout: KeyLayout::Columns, ..test_config(2) };
        let (mut fused, tok) = load(file, columns.clone());
        let prompt = tok.encode(&"A pipeline keeps the matrix unit busy while the vector cores run the softmax. ".repeat(6), true, true).unwrap();
        assert!(prompt.len() >= TILED_MIN_ROWS && prompt.len() <= 128, "{name}: {} tokens", prompt.len());
        let want = prompt_logits(&mut fused, &prompt);
        assert_eq!(fused.attn_pipeline_blocks(), None);
        // The blocks of 16 cells some row of an item (rows of one block × one KV head) sees:
        // under the causal mask, every block up to its last row's.
        let h = fused.hyper().clone();
        let per = (ROWS_MAX_VECTORS / (h.n_head / h.n_kv_head)).max(1);
        let n = prompt.len();
        let per_layer: u64 = (0..n.div_ceil(per)).map(|b| ((b + 1) * per).min(n).div_ceil(16) as u64).sum::<u64>() * h.n_kv_head as u64;
        for threads in 1..=3 {
            let (mut piped, _) = load(file, EngineConfig { attn_pipeline: true, ..EngineConfig { n_threads: threads, ..columns.clone() } });
            let got = prompt_logits(&mut piped, &prompt);
            for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}, {threads} workers: logits of row {r} differ");
            }
            assert_eq!(piped.attn_pipeline_blocks(), Some(per_layer * h.n_layer as u64), "{name}, {threads} workers: blocks scored");
        }
    }
}

/// With tensor parallelism each worker group runs its shard's attention on a pipeline of its
/// own while the other groups run theirs: the logits equal the fused column-key kernels' at the
/// same degree bit for bit (groups of 1 + 1 and 2 + 1 workers; SmolLM2's 9 heads and 3 KV
/// heads give shards of 5 + 4 and 6 + 3 heads), and every shard's blocks are scored.
#[test]
fn each_shard_pipelines_its_own_heads() {
    let (name, file, _) = MODELS[0];
    for (tp, threads) in [(2, 2), (2, 3), (3, 3)] {
        let columns = EngineConfig { kv_layout: KeyLayout::Columns, tp, ..test_config(threads) };
        let (mut fused, tok) = load(file, columns.clone());
        let prompt = tok.encode(&"Each node of a two-socket server runs the attention of its own heads. ".repeat(6), true, true).unwrap();
        let want = prompt_logits(&mut fused, &prompt);
        drop(fused);
        let (mut piped, _) = load(file, EngineConfig { attn_pipeline: true, ..columns });
        let got = prompt_logits(&mut piped, &prompt);
        for (r, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} --tp {tp}, {threads} workers: logits of row {r} differ");
        }
        assert!(piped.attn_pipeline_blocks().is_some_and(|b| b > 0), "{name} --tp {tp}: the pipelines ran");
    }
}

#[test]
fn the_pipeline_is_refused_where_it_cannot_run() {
    let err = Engine::load(model_path(MODELS[0].1), EngineConfig { attn_pipeline: true, ..test_config(2) }).err().expect("refused").to_string();
    assert!(err.contains("--attn-pipeline") && err.contains("--kv-layout columns"), "{err}");
}
