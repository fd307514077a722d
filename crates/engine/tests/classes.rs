//! `--matrix-workers` (SMEPilot's tile split in the engine): on an SME CPU (CI: qemu-aarch64
//! with SME) the prefill panel GEMMs that a roofline plan splits between the `sme` and `cpu`
//! targets run cut between the matrix unit's workers and the vector cores', with the logits of
//! `--fast-prefill` alone, bit for bit; elsewhere, and without what it needs, the flag is
//! refused by name.

mod common;

use common::*;
use corelm_engine::{Batch, Engine, EngineConfig};
use corelm_kernels::Isa;
use corelm_plan::profile::{Ceiling, Combined, Memory, Target, TargetKind};
use corelm_plan::Roofline;

/// A stated two-target profile: vector cores and a matrix unit of twice their int8 rate.
fn stated() -> Roofline {
    let target = |name: &str, kind, gflops: f64, tile| Target {
        name: name.into(),
        kind,
        workers: 1,
        ceilings: vec![Ceiling { family: "int8_dot".into(), kernel: "stated".into(), one_worker_gflops: gflops, all_workers_gflops: gflops }],
        tile: Some(tile),
        link: None,
    };
    Roofline {
        machine: "stated for a test".into(),
        source: "stated".into(),
        targets: vec![target("cpu", TargetKind::Vector, 100.0, [8, 4]), target("sme", TargetKind::Matrix, 200.0, [16, 8])],
        combined: vec![Combined { targets: vec!["cpu".into(), "sme".into()], family: "int8_dot".into(), gflops: 300.0 }],
        memory: Memory { read_gbps: vec![], per_target_gbps: vec![("cpu".into(), 50.0), ("sme".into(), 50.0)], all_busy_gbps: 50.0 },
    }
}

/// Every logit of a 24-token prompt.
fn prefill(e: &mut Engine) -> Vec<u32> {
    prefill_n(e, 24)
}

/// Every logit of an `n`-token prompt.
fn prefill_n(e: &mut Engine, n: u32) -> Vec<u32> {
    let mut b = Batch::new();
    let vocab = e.hyper().n_vocab as u32;
    for i in 0..n {
        b.add((i * 977 + 13) % vocab, i as i32, 0, true);
    }
    let l = e.decode(&b).unwrap();
    (0..n as usize).flat_map(|r| l.row(r).iter().map(|v| v.to_bits()).collect::<Vec<_>>()).collect()
}

#[test]
fn matrix_workers_split_prefill_gemms_and_keep_the_bits() {
    let file = MODELS[0].1;
    let cfg = EngineConfig { fast_prefill: true, roofline: Some(stated()), ..test_config(2) };
    let (mut base, _) = load(file, cfg.clone());
    let isa = base.kernels().isa();
    let split = Engine::load(model_path(file), EngineConfig { matrix_workers: 1, ..cfg.clone() });
    if isa != Isa::Sme {
        let e = split.err().expect("refused without a matrix unit").to_string();
        assert!(e.contains("--matrix-workers 1") && e.contains("matrix unit") && e.contains(isa.name()), "{e}");
        return;
    }
    let mut split = split.expect("loads on an SME CPU");
    let cut = split.graph(24, 24).splits.len();
    assert!(cut > 0, "the plan splits a 24-token prefill's matmuls");
    assert!(prefill(&mut split) == prefill(&mut base), "split GEMMs change no bits");
    eprintln!("{cut} matmuls of a 24-token prefill split between 1 SME worker and 1 vector worker");
    for (c, why) in [
        (EngineConfig { matrix_workers: 2, ..cfg.clone() }, "no vector worker"),
        (EngineConfig { matrix_workers: 1, roofline: None, ..cfg.clone() }, "--roofline"),
        (EngineConfig { matrix_workers: 1, fast_prefill: false, ..cfg.clone() }, "--fast-prefill"),
    ] {
        let e = Engine::load(model_path(file), c).err().expect("refused").to_string();
        assert!(e.contains(why), "{e}");
    }
}

/// With keys in columns and `--attn-pipeline`, the matrix-unit worker takes prefill
/// attention's matrix phases (scores and values as SME outer products) first and the vector
/// worker the softmax (NEON): the logits of the fused column-key kernel, bit for bit, on a
/// prompt long enough for the tiled kernels. (Elsewhere `--matrix-workers` is refused, above.)
#[test]
fn matrix_workers_take_the_attention_pipelines_matrix_phases() {
    let file = MODELS[0].1;
    let cfg = EngineConfig { fast_prefill: true, roofline: Some(stated()), kv_layout: corelm_kernels::attention::KeyLayout::Columns, ..test_config(2) };
    let (mut base, _) = load(file, cfg.clone());
    if base.kernels().isa() != Isa::Sme {
        return;
    }
    let (mut piped, _) = load(file, EngineConfig { matrix_workers: 1, attn_pipeline: true, ..cfg });
    let n = corelm_kernels::attention::TILED_MIN_ROWS as u32 + 16;
    assert!(prefill_n(&mut piped, n) == prefill_n(&mut base, n), "the pipeline on a matrix-unit and a vector worker changes no bits");
    assert!(piped.attn_pipeline_blocks().is_some_and(|b| b > 0), "the pipeline ran");
}

/// A MoE model's expert rule, executed: with `--matrix-workers` the plan cuts each expert by
/// its routed pairs among the matrix unit's worker and the vector worker, and the experts of 8
/// or more pairs run as panel GEMMs of that cut — the logits of `--fast-prefill` alone, bit for
/// bit. The Qwen3-MoE fixture (8 experts, 2 per token) quantized to Q8_0 for the panel's
/// kernels; elsewhere than on an SME CPU, only the plan's cuts are checked.
#[test]
fn matrix_workers_place_experts_by_routed_pairs() {
    let dir = std::env::temp_dir().join(format!("corelm-classes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3moe.gguf");
    let file = dir.join("qwen3moe-q8_0.gguf");
    corelm_engine::quantize::quantize_file(&src, &file, corelm_kernels::DType::Q8_0, false, 2).unwrap();
    let cfg = EngineConfig { fast_prefill: true, roofline: Some(stated()), ..test_config(2) };
    let mut base = Engine::load(&file, cfg.clone()).unwrap();
    // The plan itself: a 24-token prefill's expert matmuls have steps off the vector cores.
    let plans = corelm_plan::planner::plan_graph(base.graph(24, 24), &stated(), 512);
    let rules: Vec<_> = plans.iter().filter_map(|p| p.experts.as_ref()).collect();
    assert!(!rules.is_empty() && rules.iter().all(|r| corelm_plan::planner::expert_cuts(&stated(), r, 48, &["sme", "cpu"]).is_some()), "{rules:?}");
    if base.kernels().isa() != Isa::Sme {
        std::fs::remove_dir_all(&dir).ok();
        return;
    }
    let mut split = Engine::load(&file, EngineConfig { matrix_workers: 1, ..cfg }).unwrap();
    assert!(!split.graph(24, 24).expert_splits.is_empty(), "the engine's graph carries the cuts");
    assert!(prefill(&mut split) == prefill(&mut base), "experts cut among worker classes change no bits");
    std::fs::remove_dir_all(&dir).ok();
}
