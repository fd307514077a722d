//! Invariant (SMEPilot's layout state): every tensor of a planned graph knows its layout, and
//! nothing on the per-token path re-lays weights out. The process-wide counter of weight
//! re-layouts (`corelm_kernels::matmul::layout::repacks`) is read around a prompt and 16
//! single-token decodes of real models; so is the counter of key chunks that attention
//! transposes while it runs (`corelm_kernels::attention::key_transposes`), which a cache with
//! keys stored in columns (`--kv-layout columns`) must keep at zero. Its own test binary: no
//! other test loads models concurrently and moves the counters.

mod common;

use common::*;
use corelm_core::tensor::{Layout, Op};
use corelm_engine::sample::argmax;
use corelm_engine::{Batch, EngineConfig};
use corelm_kernels::attention::{key_transposes, KeyLayout};
use corelm_kernels::matmul::layout::repacks;

/// The tests of this binary one at a time: each moves the process-wide counters the other reads.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// (re-layouts while prefilling `prompt`, while decoding 16 tokens after it).
fn count(engine: &mut corelm_engine::Engine, prompt: &[u32]) -> (u64, u64) {
    let mut b = Batch::with_capacity(64);
    for (i, &t) in prompt.iter().enumerate() {
        b.add(t, i as i32, 0, i + 1 == prompt.len());
    }
    let r0 = repacks().0;
    let mut next = argmax(engine.decode(&b).unwrap().row(0));
    let r1 = repacks().0;
    for pos in prompt.len()..prompt.len() + 16 {
        b.clear();
        b.add(next, pos as i32, 0, true);
        next = argmax(engine.decode(&b).unwrap().row(0));
    }
    (r1 - r0, repacks().0 - r1)
}

#[test]
fn decoding_relayouts_nothing_and_every_tensor_has_its_layout() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // SmolLM2 (Q4_1, Q8_0 head) and Qwen2.5 (Q5_0, Q4_K, Q6_K, Q8_0 head), default config.
    for file in [MODELS[0].1, MODELS[2].1] {
        let before = repacks();
        let (mut engine, tok) = load(file, test_config(2));
        let loaded = repacks();
        let kernels = engine.kernels();
        let prompt = tok.encode("The weather today is sunny and warm, so we walked to the park by the river", true, true).unwrap();
        assert!(prompt.len() >= 16, "a prompt the tiles run on");
        // Layouts: a matmul reads an interleaved copy exactly when its table has kernels for the
        // type and the matrix was repacked; every KV store writes cells; load made the copies.
        let g = engine.graph(prompt.len(), 1);
        let (mut interleaved, mut kv) = (0, 0);
        for t in &g.tensors {
            match t.op {
                Op::MatMul { w, .. } => {
                    let wt = g.tensor(w);
                    let il = kernels.ops(wt.dtype).is_some_and(|o| o.interleaved.is_some()) && wt.ne[1] % 4 == 0;
                    assert_eq!(wt.layout() == Layout::Interleaved, il, "{file}: a {} matmul weight", wt.dtype);
                    interleaved += il as usize;
                }
                Op::KvStore { .. } => {
                    assert_eq!(t.layout(), Layout::KvCells);
                    kv += 1;
                }
                _ => {}
            }
        }
        assert!(kv > 0);
        if interleaved > 0 {
            assert!(loaded.0 > before.0 && loaded.1 > before.1, "{file}: load made interleaved copies and counted them");
        }
        let (prefill, decode) = count(&mut engine, &prompt);
        assert_eq!((prefill, decode), (0, 0), "{file}: weight re-layouts while prefilling, decoding");
    }
    // `--fast-prefill` decodes weight panels per call (its design, counted; with `--no-repack`,
    // since on x86 the panel leaves repacked matrices to their tiles), `--no-repack`'s tiles
    // pack plain rows per call; neither touches a weight while decoding one token. (One test
    // function: tests of one binary run concurrently and would move each other's count.)
    let file = MODELS[0].1;
    for (cfg, name) in [(EngineConfig { fast_prefill: true, repack: false, ..test_config(2) }, "fast-prefill"), (EngineConfig { repack: false, ..test_config(2) }, "no-repack")] {
        let (mut engine, tok) = load(file, cfg);
        let prompt = tok.encode("The weather today is sunny and warm, so we walked to the park by the river", true, true).unwrap();
        let (prefill, decode) = count(&mut engine, &prompt);
        assert_eq!(decode, 0, "{name}: weight re-layouts while decoding");
        if name == "fast-prefill" {
            assert!(prefill > 0, "{name}: the panel GEMM's per-call decode is counted");
        }
    }
}

/// Keys stored in columns by the node that writes them: the graph says so, and neither a
/// prompt long enough for the tiled kernels (which transpose key rows per call) nor decoding
/// transposes a key; with keys as rows the same prompt does (so the count is live). The
/// answers stay close to ggml's algorithm's: the same greedy tokens over the decode.
#[test]
fn keys_in_columns_are_never_transposed_per_token() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let file = MODELS[0].1;
    let mut tokens = Vec::new();
    for (layout, name) in [(KeyLayout::Rows, "rows"), (KeyLayout::Columns, "columns")] {
        let (mut engine, tok) = load(file, EngineConfig { kv_layout: layout, ..test_config(2) });
        let prompt = tok.encode(&"The weather today is sunny and warm, so we walked to the park by the river. ".repeat(5), true, true).unwrap();
        assert!(prompt.len() >= corelm_kernels::attention::TILED_MIN_ROWS, "a prompt the tiled kernels run on");
        let g = engine.graph(prompt.len(), 1);
        let want = if layout == KeyLayout::Columns { Layout::KvColumns } else { Layout::KvCells };
        assert!(g.tensors.iter().filter(|t| matches!(t.op, Op::KvStore { .. })).all(|t| t.layout() == want), "{name}: KV store layouts");
        let t0 = key_transposes();
        let mut b = Batch::with_capacity(128);
        for (i, &t) in prompt.iter().enumerate() {
            b.add(t, i as i32, 0, i + 1 == prompt.len());
        }
        let mut next = argmax(engine.decode(&b).unwrap().row(0));
        let t1 = key_transposes();
        let mut out = vec![next];
        for pos in prompt.len()..prompt.len() + 16 {
            b.clear();
            b.add(next, pos as i32, 0, true);
            next = argmax(engine.decode(&b).unwrap().row(0));
            out.push(next);
        }
        let t2 = key_transposes();
        if layout == KeyLayout::Columns {
            assert_eq!((t1 - t0, t2 - t1), (0, 0), "keys in columns: key chunks transposed while prefilling, decoding");
        } else if corelm_kernels::attention::has_simd(engine.kernels()) {
            assert!(t1 > t0, "keys as rows: the tiled kernels' transposes are counted");
        }
        tokens.push(out);
    }
    assert_eq!(tokens[0], tokens[1], "greedy tokens with keys as rows and in columns");
    // Every table's column-key kernels are the portable model's bits, and the golden models'
    // matmuls are too: the logits with keys in columns are the same on AVX-512 and AVX2.
    let tables: Vec<corelm_kernels::Isa> = [corelm_kernels::Isa::Avx512, corelm_kernels::Isa::Avx2].into_iter().filter(|i| i.missing().is_empty()).collect();
    let mut logits: Vec<Vec<u32>> = Vec::new();
    for &isa in &tables {
        let (mut engine, tok) = load(file, EngineConfig { kv_layout: KeyLayout::Columns, isa: Some(isa), ..test_config(2) });
        let prompt = tok.encode(&"The weather today is sunny and warm, so we walked to the park by the river. ".repeat(5), true, true).unwrap();
        let mut b = Batch::with_capacity(128);
        for (i, &t) in prompt.iter().enumerate() {
            b.add(t, i as i32, 0, i + 1 == prompt.len());
        }
        let mut row: Vec<u32> = engine.decode(&b).unwrap().row(0).iter().map(|x| x.to_bits()).collect();
        b.clear();
        b.add(tokens[1][0], prompt.len() as i32, 0, true);
        row.extend(engine.decode(&b).unwrap().row(0).iter().map(|x| x.to_bits()));
        logits.push(row);
    }
    for (isa, l) in tables.iter().zip(&logits).skip(1) {
        assert!(l == &logits[0], "keys in columns: {isa:?}'s logits differ from {:?}'s", tables[0]);
    }
}
