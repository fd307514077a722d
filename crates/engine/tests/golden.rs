//! Every public golden case of the three models against llama.cpp's reference outputs, with the
//! four checks and tolerances of ../shared/golden/README.md:
//! 1. exact tokenization (`prompt_token_ids` and all of `tokenizer.json`);
//! 2. prompt logits: top-1 equal where the golden margin ≥ 1.5, shared top-10 ids within the
//!    model's tolerance;
//! 3. teacher-forced decode: the same on `greedy_top10`, argmax equal where the margin ≥ 0.5;
//! 4. free-running greedy ids equal up to min(16, first step with golden margin < 0.25).

mod common;

use common::*;
use corelm_engine::eval::{run_case, Case, EvalOutput};
use serde_json::Value;

fn pairs(v: &Value) -> Vec<Vec<(u32, f32)>> {
    serde_json::from_value(v.clone()).expect("top-10 lists")
}

fn margin(top: &[(u32, f32)]) -> f32 {
    top[0].1 - top[1].1
}

struct Stats {
    diffs: Vec<f32>,
    errors: Vec<String>,
}

fn compare_rows(ours: &[Vec<(u32, f32)>], gold: &[Vec<(u32, f32)>], tol: f32, top1_margin: f32, what: &str, st: &mut Stats) {
    assert_eq!(ours.len(), gold.len(), "{what}: row count");
    for (i, (o, g)) in ours.iter().zip(gold).enumerate() {
        for &(id, l) in g {
            if let Some(&(_, ol)) = o.iter().find(|e| e.0 == id) {
                let d = (ol - l).abs();
                st.diffs.push(d);
                if d > tol {
                    st.errors.push(format!("{what}[{i}] id {id}: {ol:.4} vs golden {l:.4}"));
                }
            }
        }
        if margin(g) >= top1_margin && o[0].0 != g[0].0 {
            st.errors.push(format!("{what}[{i}] top-1 {} vs golden {} (margin {:.2})", o[0].0, g[0].0, margin(g)));
        }
    }
}

fn check_model(dir: &str, file: &str, tol: f32) {
    // Every golden prompt in one pass, as llama.cpp computed it (n_ubatch 512): a prompt split
    // into passes gives slightly different rows past the split (decode-style attention).
    check_model_cfg(dir, file, tol, corelm_engine::EngineConfig { n_batch: 512, ..test_config(2) }, &[]);
}

/// The golden checks of the cases whose names start with one of `only` (all if empty).
fn check_model_cfg(dir: &str, file: &str, tol: f32, cfg: corelm_engine::EngineConfig, only: &[&str]) {
    let simd = cfg.repack && cfg.isa.is_some_and(|i| i != corelm_kernels::Isa::Portable);
    let (mut engine, tok) = load(file, cfg);
    // Every SIMD table has interleaved kernels for these models' matrix types, so the golden
    // check also runs them (a table that lost them would pass on its plain dots otherwise).
    assert!(!simd || engine.packed().0 > 0, "{file}: no matrix repacked under a SIMD table");
    let gdir = golden_dir().join(dir);
    let mut cases: Vec<_> = std::fs::read_dir(&gdir)
        .unwrap_or_else(|e| panic!("golden data at {}: {e}", gdir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with('p'))
        .collect();
    cases.sort();
    assert_eq!(cases.len(), 8, "expected 8 golden cases in {}", gdir.display());
    cases.retain(|p| only.is_empty() || only.iter().any(|o| p.file_name().unwrap().to_string_lossy().starts_with(o)));
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for path in &cases {
        let raw: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let case: Case = serde_json::from_value(raw.clone()).unwrap();
        let free: EvalOutput = run_case(&mut engine, &tok, &case, false).unwrap();
        let tf: EvalOutput = run_case(&mut engine, &tok, &case, true).unwrap();
        let mut st = Stats { diffs: vec![], errors: vec![] };
        // 1. tokenization
        if free.prompt_token_ids != case.prompt_token_ids {
            st.errors.push(format!("tokenization: {:?} vs golden {:?}", free.prompt_token_ids, case.prompt_token_ids));
        }
        // 2. prompt logits
        compare_rows(&free.prompt_top10, &pairs(&raw["prompt_top10"]), tol, 1.5, "prompt", &mut st);
        // 3. teacher-forced decode
        let gold_steps = pairs(&raw["greedy_top10"]);
        compare_rows(&tf.greedy_top10, &gold_steps, tol, 0.5, "tf_step", &mut st);
        for (k, g) in gold_steps.iter().enumerate() {
            if margin(g) >= 0.5 && tf.greedy_ids[k] != case.greedy_ids[k] {
                st.errors.push(format!("tf argmax step {k}: {} vs {}", tf.greedy_ids[k], case.greedy_ids[k]));
            }
        }
        // 4. free-running greedy
        let limit = gold_steps.iter().position(|g| margin(g) < 0.25).unwrap_or(usize::MAX).min(16);
        for k in 0..limit.min(case.greedy_ids.len()) {
            if free.greedy_ids[k] != case.greedy_ids[k] {
                st.errors.push(format!("greedy step {k}: {} vs golden {}", free.greedy_ids[k], case.greedy_ids[k]));
                break;
            }
        }
        st.diffs.sort_by(f32::total_cmp);
        let med = st.diffs.get(st.diffs.len() / 2).copied().unwrap_or(0.0);
        let max = st.diffs.last().copied().unwrap_or(0.0);
        report.push(format!("{dir}/{} ({} kernels): median |Δlogit| {med:.4}, max {max:.4}", case.case_id, engine.kernels().isa()));
        if !st.errors.is_empty() {
            failures.push(format!("{}: {}", case.case_id, st.errors[..st.errors.len().min(5)].join("; ")));
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{dir}: {} failing case(s):\n{}", failures.len(), failures.join("\n"));
}

fn check_tokenizer(dir: &str, file: &str) {
    let g = corelm_engine::engine::open_gguf(model_path(file)).unwrap();
    let tok = corelm_engine::Tokenizer::from_gguf(&g).unwrap();
    let path = golden_dir().join(dir).join("tokenizer.json");
    let raw: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cases = raw["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 100);
    compare_tokenization(&tok, cases, dir);
}

/// Each case's text tokenized three ways (special tokens parsed; with BOS; special tokens as
/// text) against the ids llama.cpp gave, and the ids decoded where the case has llama.cpp's text.
fn compare_tokenization(tok: &corelm_engine::Tokenizer, cases: &[Value], what: &str) {
    let mut bad = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = |k: &str| -> Vec<u32> { serde_json::from_value(c[k].clone()).unwrap() };
        let ids = tok.encode(text, false, true).unwrap();
        if ids != want("ids") {
            bad.push(format!("ids of {text:?}: {ids:?} vs {:?}", want("ids")));
        }
        let ids_sp = tok.encode(text, true, true).unwrap();
        if ids_sp != want("ids_add_special") {
            bad.push(format!("ids_add_special of {text:?}: {ids_sp:?}"));
        }
        let ids_np = tok.encode(text, false, false).unwrap();
        if ids_np != want("ids_no_parse_special") {
            bad.push(format!("ids_no_parse_special of {text:?}: {ids_np:?} vs {:?}", want("ids_no_parse_special")));
        }
        if let Some(want_text) = c.get("detokenized").and_then(Value::as_str) {
            let detok = tok.decode(&want("ids"));
            if detok != want_text {
                bad.push(format!("detokenized {text:?}: {detok:?}"));
            }
        }
    }
    assert!(bad.is_empty(), "{what}: {} tokenizer mismatches:\n{}", bad.len(), bad[..bad.len().min(10)].join("\n"));
}

/// A SentencePiece vocabulary with `add_space_prefix` (llama.cpp's default for them: Llama 2,
/// Mistral, TinyLlama), which no golden model has: Gemma 3's metadata with the flag turned to
/// true, against llama.cpp's tokenization of that same vocabulary
/// (`fixtures/spm_prefix_golden.json`, written by `scripts/make_spm_prefix_golden.py`). Every
/// run of text — the first, and each after a special token — starts with a space.
#[test]
fn spm_space_prefix_tokenizes_as_llama_cpp() {
    const FLAG: &str = "tokenizer.ggml.add_space_prefix";
    let g = corelm_engine::engine::open_gguf(model_path(MODELS[1].1)).unwrap();
    assert!(matches!(g.metadata.iter().find(|(k, _)| k.as_str() == FLAG), Some((_, corelm_gguf::Value::Bool(false)))), "Gemma 3's file says {FLAG} = false");
    let tok = tokenizer_edited(&g, &[(FLAG, Some(corelm_gguf::Value::Bool(true)))]);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/spm_prefix_golden.json");
    let raw: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = raw["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 110);
    compare_tokenization(&tok, cases, "Gemma 3's vocabulary with add_space_prefix");
}

#[test]
fn golden_smollm2() {
    let (d, f, t) = MODELS[0];
    check_model(d, f, t);
}

/// `--fast-prefill` (panel GEMM, ggml's float order given up): the same checks with the
/// tolerance widened by half (measured max |Δlogit| 1.01 against the golden 1.0), under the
/// best table and, where that is AVX-512, under AVX2's panel kernel too (same bits: both
/// equal the portable panel). With `--no-repack` every matmul of 8 or more rows takes the
/// panel; with the repacked weights (the default), on x86 only those of
/// `matmul::PANEL_OVER_TILES_ROWS` or more rows (AVX2: `PANEL_OVER_TILES_ROWS_AVX2`; from
/// `PANEL_OVER_TILES_ROWS_GROUPS` for Q4_1 and Q8_0, whose panels the table decodes from the
/// repacked groups), the tiles the
/// others (`matmul::panel_over_tiles`), under each table; and with `--tp 2`, whose column
/// slices (Wo, down) have only their repacked copy.
#[test]
fn golden_smollm2_fast_prefill() {
    use corelm_kernels::Isa;
    let (d, f, t) = MODELS[0];
    let best = corelm_kernels::best_isa();
    let isas = if best == Isa::Avx512 { vec![best, Isa::Avx2] } else { vec![best] };
    for isa in isas {
        check_model_cfg(d, f, 1.5 * t, corelm_engine::EngineConfig { fast_prefill: true, repack: false, isa: Some(isa), ..test_config(2) }, &[]);
        check_model_cfg(d, f, 1.5 * t, corelm_engine::EngineConfig { fast_prefill: true, isa: Some(isa), ..test_config(2) }, &[]);
    }
    // Tensor-parallel column slices have only their interleaved copy: the panel decodes it.
    check_model_cfg(d, f, 1.5 * t, corelm_engine::EngineConfig { fast_prefill: true, tp: 2, n_batch: 512, isa: Some(best), ..test_config(2) }, &["p01", "p04"]);
}

/// The same checks under every kernel table below the best this CPU runs (`--isa`), so each
/// dispatch path runs end to end on a real model. The AVX2 table (on an AVX-512 CPU) keeps
/// ggml's x86 float orders: every case, the golden tolerance. The portable table sums dot
/// products in ggml's generic scalar order instead (one float per block, not eight lanes), so
/// on SmolLM2's massive-activation rows it drifts further from the AVX-512 llama.cpp that made
/// the golden data (max |Δlogit| 1.07 measured over all eight cases): two short cases (the
/// scalar kernels are ~15× slower), tolerance widened by half as for `--fast-prefill`.
#[test]
fn golden_smollm2_lower_isas() {
    use corelm_kernels::Isa;
    let (d, f, t) = MODELS[0];
    let best = corelm_kernels::best_isa();
    for isa in Isa::ALL.into_iter().filter(|&i| i < best && corelm_kernels::dispatch::check(i).is_ok()) {
        let cfg = corelm_engine::EngineConfig { n_batch: 512, isa: Some(isa), ..test_config(2) };
        match isa {
            Isa::Portable => check_model_cfg(d, f, 1.5 * t, cfg, &["p01", "p02"]),
            _ => check_model_cfg(d, f, t, cfg, &[]),
        }
    }
}

/// The K-quant models (Q4_K, Q6_K, Q5_0, Q8_0 matrices, repacked for the AVX2 table's
/// interleaved kernels) under the AVX2 table where the CPU's best is higher: one short and one
/// long case each (the long one runs prefill's tiles on every matrix).
#[test]
fn golden_kquants_avx2() {
    use corelm_kernels::Isa;
    if corelm_kernels::best_isa() != Isa::Avx512 {
        return; // no AVX2 table here, or the default tests run it already
    }
    for (d, f, t) in [MODELS[1], MODELS[2]] {
        let cfg = corelm_engine::EngineConfig { n_batch: 512, isa: Some(Isa::Avx2), ..test_config(2) };
        check_model_cfg(d, f, t, cfg, &["p01", "p04"]);
    }
}

/// SmolLM2's first case alone, under every kernel table this CPU runs: the real-model check of
/// the emulated aarch64 runs (`scripts/test_arm.sh`: portable, NEON, NEON + `sdot`, and SME;
/// dotprod and SME also with their panel GEMM under `--fast-prefill`), where a whole model is
/// 10–50× slower. The SIMD
/// tables' dots follow the x86 lane order, so they get the golden tolerance; the portable
/// table, ggml's generic order, gets it widened by half as in [`golden_smollm2_lower_isas`].
#[test]
fn golden_smollm2_p01() {
    use corelm_kernels::Isa;
    let (d, f, t) = MODELS[0];
    // `CORELM_GOLDEN_ISAS=sme` keeps only the tables named (comma-separated):
    // `scripts/test_arm.sh` runs each table once, under the one CPU model it names for it.
    let only: Option<Vec<Isa>> = std::env::var("CORELM_GOLDEN_ISAS")
        .ok()
        .map(|v| v.split(',').map(|n| n.trim().parse().unwrap_or_else(|e| panic!("CORELM_GOLDEN_ISAS: {e}"))).collect());
    let wanted = |i: Isa| only.as_ref().is_none_or(|o| o.contains(&i));
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|&i| wanted(i) && corelm_kernels::dispatch::check(i).is_ok()).collect();
    assert!(!isas.is_empty(), "no table of CORELM_GOLDEN_ISAS runs on this CPU");
    for isa in isas {
        let tol = if isa == Isa::Portable { 1.5 * t } else { t };
        check_model_cfg(d, f, tol, corelm_engine::EngineConfig { n_batch: 512, isa: Some(isa), ..test_config(2) }, &["p01"]);
        if matches!(isa, Isa::Sme | Isa::Dotprod) {
            // The panel GEMM (`--fast-prefill`, prompts of 8 tokens or more: p02's 11) on the
            // matrix unit (SME) or on `usmmla`/`sdot` (dotprod, by the CPU's i8mm): its float
            // order, so the tolerance of `golden_smollm2_fast_prefill`.
            check_model_cfg(d, f, 1.5 * t, corelm_engine::EngineConfig { n_batch: 512, isa: Some(isa), fast_prefill: true, ..test_config(2) }, &["p02"]);
        }
    }
}

/// Gemma 3's first case under every SIMD table this CPU runs: the real-model check of the
/// K-quant kernels in the emulated aarch64 runs (`scripts/test_arm.sh`, where the whole model
/// test takes 18 minutes a CPU): its feed-forward Q4_K and Q6_K matrices and its Q5_0/Q8_0
/// ones on the interleaved GEMV and tiles of NEON and `sdot`. The golden tolerance: every
/// SIMD table keeps the x86 lane order.
#[test]
fn golden_gemma3_p01() {
    use corelm_kernels::Isa;
    let (d, f, t) = MODELS[1];
    for isa in Isa::ALL.into_iter().filter(|&i| i != Isa::Portable && corelm_kernels::dispatch::check(i).is_ok()) {
        check_model_cfg(d, f, t, corelm_engine::EngineConfig { n_batch: 512, isa: Some(isa), ..test_config(2) }, &["p01"]);
    }
}

#[test]
fn golden_gemma3() {
    let (d, f, t) = MODELS[1];
    check_model(d, f, t);
}

#[test]
fn golden_qwen2() {
    let (d, f, t) = MODELS[2];
    check_model(d, f, t);
}

#[test]
fn tokenizer_conformance_smollm2() {
    let (d, f, _) = MODELS[0];
    check_tokenizer(d, f);
}

#[test]
fn tokenizer_conformance_gemma3() {
    let (d, f, _) = MODELS[1];
    check_tokenizer(d, f);
}

#[test]
fn tokenizer_conformance_qwen2() {
    let (d, f, _) = MODELS[2];
    check_tokenizer(d, f);
}

/// Tensor parallelism on virtual nodes (worker groups): every model's first and a long case at
/// `--tp 2` and `--tp 3` (uneven head splits, replicated KV heads) against llama.cpp, with the
/// golden tolerance (the shards' partial sums change the float order, not the checks).
#[test]
fn golden_tensor_parallel() {
    for (d, f, t) in MODELS {
        for tp in [2, 3] {
            let cfg = corelm_engine::EngineConfig { n_batch: 512, tp, ..test_config(3) };
            check_model_cfg(d, f, t, cfg, &["p01", "p04"]);
        }
    }
}

/// Every byte-level pre-tokenizer of llama.cpp's table that corelm keeps
/// (`tokenizer::pre::TABLE`), against llama.cpp's tokenization under it
/// (`fixtures/pre_tokenizer_golden.json`, written by `scripts/make_pre_tokenizer_golden.py`):
/// SmolLM2's vocabulary relabelled with each name, `add_bos_token` removed (each name's BOS
/// default shows) and three merges removed (so `ignore_merges` shows). One name per row is
/// tokenized here; llama.cpp gave each row's names the same ids (checked from the file).
#[test]
fn pre_tokenizers_split_as_llama_cpp() {
    use corelm_engine::tokenizer::pre::TABLE;
    use corelm_gguf::{Array, Value as Meta};
    let g = corelm_engine::engine::open_gguf(model_path(MODELS[0].1)).unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/pre_tokenizer_golden.json");
    let raw: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let removed: Vec<String> = serde_json::from_value(raw["removed_merges"].clone()).unwrap();
    let texts: Vec<String> = serde_json::from_value(raw["texts"].clone()).unwrap();
    let names = raw["names"].as_object().unwrap();
    let case = |name: &str| names.get(name).unwrap_or_else(|| panic!("no golden case for pre-tokenizer {name:?}: rerun the script"));
    let Some(Meta::Array(Array::String(merges))) = g.get("tokenizer.ggml.merges") else { panic!("SmolLM2 has no merges") };
    assert!(removed.iter().all(|r| merges.contains(r)));
    let merges = Meta::Array(Array::String(merges.iter().filter(|x| !removed.contains(x)).cloned().collect()));
    let mut bad = Vec::new();
    for pre in TABLE {
        let first = case(pre.names[0]);
        for n in pre.names {
            assert_eq!(case(n), first, "llama.cpp splits {n:?} unlike {:?}, in the same row", pre.names[0]);
        }
        let tok = tokenizer_edited(
            &g,
            &[
                ("tokenizer.ggml.add_bos_token", None),
                ("tokenizer.ggml.pre", Some(Meta::String(pre.names[0].to_string()))),
                ("tokenizer.ggml.merges", Some(merges.clone())),
            ],
        );
        let want = &raw["outputs"][first["output"].as_u64().unwrap() as usize];
        for (i, text) in texts.iter().enumerate() {
            let ids = tok.encode(text, false, true).unwrap();
            let w: Vec<u32> = serde_json::from_value(want[i].clone()).unwrap();
            if ids != w {
                bad.push(format!("{}: {text:?}: {ids:?} vs llama.cpp's {w:?}", pre.names[0]));
            }
        }
        let hello: Vec<u32> = serde_json::from_value(first["hello_with_special"].clone()).unwrap();
        let ids = tok.encode("Hello", true, true).unwrap();
        if ids != hello {
            bad.push(format!("{}: BOS: {ids:?} vs llama.cpp's {hello:?}", pre.names[0]));
        }
    }
    assert_eq!(names.len(), TABLE.iter().map(|p| p.names.len()).sum::<usize>(), "golden names the table lacks");
    assert!(bad.is_empty(), "{} pre-tokenizer mismatches:\n{}", bad.len(), bad[..bad.len().min(12)].join("\n"));
}
