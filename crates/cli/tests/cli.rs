//! The `corelm` binary end to end on SmolLM2.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};


fn smol() -> String {
    let p = corelm_engine::models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "run scripts/fetch_models.py first: {} is missing", p.display());
    p.display().to_string()
}

fn golden(case: &str) -> PathBuf {
    let base = std::env::var_os("CORELM_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"));
    base.join("SmolLM2-135M-Instruct.Q4_1").join(case)
}

fn corelm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_corelm"))
}

#[test]
fn eval_prints_the_golden_fields() {
    let out = corelm()
        .args(["eval", "--model", &smol(), "--threads", "1", "--no-pin", "--case"])
        .arg(golden("p02_sentence.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden("p02_sentence.json")).unwrap()).unwrap();
    assert_eq!(v["prompt_token_ids"], case["prompt_token_ids"]);
    assert_eq!(v["prompt_top10"].as_array().unwrap().len(), case["prompt_token_ids"].as_array().unwrap().len());
    assert_eq!(v["greedy_ids"].as_array().unwrap().len(), 48);
    assert_eq!(v["greedy_top10"].as_array().unwrap().len(), 48);
    assert_eq!(v["greedy_ids"].as_array().unwrap()[..16], case["greedy_ids"].as_array().unwrap()[..16]);
    // Teacher-forced runs the case's own tokens.
    let out = corelm()
        .args(["eval", "--model", &smol(), "--threads", "2", "--no-pin", "--teacher-forced", "--case"])
        .arg(golden("p02_sentence.json"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let tf: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(tf["greedy_ids"], case["greedy_ids"]);
}

#[test]
fn tokenize_and_run() {
    let out = corelm().args(["tokenize", "--model", &smol(), "Hello"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[19556]");
    let out = corelm()
        .args(["run", "--model", &smol(), "-p", "The capital of France is", "-n", "8", "--temp", "0", "--no-pin"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Paris"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("generated"));
    // Fill in the middle needs a model with FIM tokens; SmolLM2's error says so.
    let out = corelm().args(["run", "--model", &smol(), "-p", "def f(", "--suffix", "):", "-n", "4", "--no-pin"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no fill-in-the-middle tokens"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn run_shifts_the_context_when_asked() {
    let model = smol();
    let run = |shift: &[&str]| {
        let mut args = vec!["run", "--model", &model, "-p", "Once upon a time", "-n", "100", "-c", "64", "--temp", "0", "--ignore-eos", "--no-pin"];
        args.extend_from_slice(shift);
        let out = corelm().args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = run(&[]);
    assert!(err.contains("stop: ContextFull"), "{err}");
    let err = run(&["--context-shift", "--keep", "-1"]);
    assert!(err.contains("100 generated") && err.contains("stop: MaxTokens") && err.contains("[context shifts: 2 in "), "{err}");
}

#[test]
fn chat_keeps_the_conversation() {
    let mut child = corelm()
        .args(["chat", "--model", &smol(), "-n", "24", "--temp", "0", "--no-pin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"My name is Ada.\nWhat is my name?\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().filter(|l| !l.trim().is_empty()).count() >= 2, "{text}");
    assert!(text.contains("Ada"), "the second answer should use the first turn: {text}");
}

#[test]
fn bad_model_paths_and_files_are_named() {
    let out = corelm().args(["run", "--model", "/no/such/model.gguf", "-p", "hi"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/no/such/model.gguf"), "{err}");

    let bad = std::env::temp_dir().join(format!("corelm-cli-bad-{}.gguf", std::process::id()));
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let out = corelm().args(["run", "--model"]).arg(&bad).args(["-p", "hi"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("truncated") || err.contains("tensor_count"), "{err}");
    std::fs::remove_file(bad).ok();

    // A predictor without a sparsity level.
    let out = corelm().args(["run", "--model", &smol(), "-p", "hi", "--predictor", "/no/such.gguf"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("give --sparsity too"), "{err}");
}

#[test]
fn bench_json_has_llama_bench_fields() {
    let out = corelm()
        .args(["bench", "--model", &smol(), "-p", "16", "-n", "4", "-t", "1", "-r", "2", "--json", "--no-pin"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "one object per test (pp16, tg4)");
    assert_eq!((lines[0]["n_prompt"].as_u64(), lines[0]["n_gen"].as_u64()), (Some(16), Some(0)));
    assert_eq!((lines[1]["n_prompt"].as_u64(), lines[1]["n_gen"].as_u64()), (Some(0), Some(4)));
    for l in &lines {
        assert_eq!(l["n_threads"].as_u64(), Some(1));
        assert!(l["avg_ts"].as_f64().unwrap() > 0.0);
        assert!(l["stddev_ts"].as_f64().unwrap() >= 0.0);
        assert_eq!(l["samples_ts"].as_array().unwrap().len(), 2);
        // The table's run-time choices beside its name, on the x86 tables that make any.
        let (isa, variant) = (l["kernels"].as_str().unwrap(), l["kernel_variant"].as_str().unwrap_or(""));
        match isa {
            "avx2" => assert!(variant == "AVX-VNNI" || variant == "maddubs, no AVX-VNNI", "{variant}"),
            "avx512" | "amx" => assert!(variant.contains("512-bit vpdpbusd at"), "{variant}"),
            _ => assert!(variant.is_empty(), "{isa}: {variant}"),
        }
    }
}

/// `tune` here writes a plan that `plan` explains and `run --plan` uses; a plan for another
/// machine (modelled from a snapshot) names the CPU this one lacks.
#[test]
fn tune_writes_a_plan_that_run_and_plan_use() {
    let dir = std::env::temp_dir().join(format!("corelm-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let here = dir.join("here.json");
    let out = corelm()
        .args(["tune", "--model", &smol(), "--prompt", "32", "--gen", "8", "--reps", "1", "--out"])
        .arg(&here)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("finalists: times from 5 interleaved rounds"), "{err}");
    let explained = corelm().args(["plan", "--plan"]).arg(&here).output().unwrap();
    let text = String::from_utf8_lossy(&explained.stdout);
    assert!(text.contains("Prefill: tp") && text.contains("Decode:  tp") && text.contains("measured"), "{text}");
    assert!(text.contains("(confirmed in 5 rounds)"), "{text}");
    let run = corelm().args(["run", "--model", &smol(), "-n", "4", "--temp", "0", "-p", "Hello", "--plan"]).arg(&here).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let both = corelm().args(["run", "--model", &smol(), "-t", "1", "-p", "x", "--plan"]).arg(&here).output().unwrap();
    assert!(String::from_utf8_lossy(&both.stderr).contains("drop --threads"));
    // Modelled for a 2-socket Xeon: its CPUs are not this machine's.
    let topo = format!("{}/../../fixtures/topo/xeon6230-2p.xml", env!("CARGO_MANIFEST_DIR"));
    let there = dir.join("there.json");
    let out = corelm().args(["tune", "--model", &smol(), "--topology", &topo, "--out"]).arg(&there).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("modelled"));
    let run = corelm().args(["run", "--model", &smol(), "-n", "1", "-p", "x", "--plan"]).arg(&there).output().unwrap();
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("run `corelm tune` here"), "{}", String::from_utf8_lossy(&run.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tune --accel on` times the model's layers on the accelerator against the CPU (lavapipe in
/// CI: slower at the prompt's length, so one pass rules it out and the plan places nothing
/// there). A plan whose device wins from 2 tokens runs a prompt's layers there and decodes on
/// the CPU, in `run` and in `serve --no-batch-invariant` (a request's log-probabilities near
/// the CPU-only server's); with `--batch-invariant` (and in `serve` unless
/// `--no-batch-invariant`) it says why the device is left out.
#[test]
fn tune_times_the_accelerator_and_run_follows_the_plan() {
    let dir = std::env::temp_dir().join(format!("corelm-tune-accel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.json");
    let out = corelm()
        .args(["tune", "--model", &smol(), "--prompt", "2", "--gen", "4", "--reps", "1", "--gemm", "0", "--accel", "on", "--max-measured", "2", "--out"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("slower than the CPU at 2 tokens, the longest pass timed"), "{text}");
    let mut plan: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let accel = &mut plan["accel"];
    assert_eq!((accel["layers"].as_u64(), accel["points"].as_array().map(Vec::len)), (Some(0), Some(1)), "{accel}");
    // As a GPU's timing would place it: a prompt of 2 tokens or more on the device, the rest
    // on a one-group configuration (as `tune` switches to where the device wins).
    accel["layers"] = 30.into();
    accel["min_tokens"] = 2.into();
    let one = plan["candidates"].as_array().unwrap().iter().find(|c| c["config"]["groups"].as_array().unwrap().len() == 1).expect("a one-group candidate")["config"].clone();
    (plan["prefill"], plan["decode"], plan["prefill_min_tokens"]) = (one.clone(), one, 1.into());
    std::fs::write(&path, serde_json::to_vec(&plan).unwrap()).unwrap();
    let explained = corelm().args(["plan", "--plan"]).arg(&path).output().unwrap();
    assert!(String::from_utf8_lossy(&explained.stdout).contains("passes of 2 tokens or more run the first 30 layers there"));
    let run = corelm().args(["run", "--model", &smol(), "-n", "2", "--temp", "0", "-p", "The capital of France is", "--plan"]).arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success() && err.contains("accel-layers: 30 layers"), "{err}");
    let invariant = corelm().args(["run", "--model", &smol(), "-n", "1", "-p", "x", "--batch-invariant", "--plan"]).arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&invariant.stderr);
    assert!(invariant.status.success() && err.contains("plan: the plan's 30 layers") && err.contains("--batch-invariant") && !err.contains("accel-layers:"), "{err}");
    // serve is batch-invariant unless told otherwise: the plan's device only with the opt-out.
    let plan = path.to_str().unwrap();
    let cpu = Served::start(&["--plan", plan]);
    assert!(cpu.log.contains("plan: the plan's 30 layers") && cpu.log.contains("`serve --no-batch-invariant` allows it") && !cpu.log.contains("accel-layers:"), "{}", cpu.log);
    let device = Served::start(&["--plan", plan, "--no-batch-invariant"]);
    assert!(device.log.contains("accel-layers: 30 layers") && !device.log.contains("plan:"), "{}", device.log);
    // A request served that way: its prompt's pass on the device, its decode steps (one token
    // each) on the CPU, which reads the prompt's rows read back from the device's cache.
    // Greedy log-probabilities near the CPU-only server's (the device sums in f32, the CPU
    // rounds its activations to 8 bits: 0.005–0.06 apart here), not its bits. (A short prompt:
    // lavapipe takes about 3 s a token on 2 cores.)
    let request = serde_json::json!({ "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "logprobs": 1 });
    let want = logprobs(cpu.post("/v1/completions", &request));
    let got = logprobs(device.post("/v1/completions", &request));
    assert_eq!((got.len(), want.len()), (4, 4));
    assert_ne!(got[0], want[0], "the prompt's pass ran on the CPU, not on the device");
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 0.2), "device prefill {got:?} vs CPU {want:?}");
    drop((cpu, device));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `plan --model` on the stated M4 Pro profile: decode's matrices on the CPU (memory-bound),
/// prefill's split between CPU and SME; `--svg` draws every operator.
#[test]
fn plan_places_operators_on_a_stated_roofline() {
    let profile = format!("{}/../../fixtures/profiles/apple-m4-pro.json", env!("CARGO_MANIFEST_DIR"));
    let svg = std::env::temp_dir().join(format!("corelm-roofline-{}.svg", std::process::id()));
    let out = corelm().args(["plan", "--model", &smol(), "--profile", &profile, "--prompt", "256", "--svg"]).arg(&svg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let (prefill, decode) = text.split_once("decode at").expect("two tables");
    let row = |t: &str, op: &str| t.lines().find(|l| l.starts_with(&format!("| {op} "))).map(str::to_string).unwrap_or_default();
    // Split at a boundary on both tiles (NEON 8 × 4, SME 16 × 16: units of 16 columns), 37 of
    // 96 units to the CPU (1536 · 1850 / 4770 = 595.8 columns, rounded to 592).
    assert!(row(prefill, "matmul Q4_1 576×1536").contains("cpu 39% (cols 0..592) + sme 61% (cols 592..1536)"), "{prefill}");
    assert!(row(decode, "matmul Q4_1 576×1536").contains("| memory | cpu |"), "{decode}");
    // Prefill attention as a pipeline pays on a matrix unit (modelled); decode has none.
    assert!(prefill.contains("as a pipeline, QKᵀ and PV on sme and the softmax on cpu") && prefill.contains("— pays"), "{prefill}");
    assert!(!decode.contains("as a pipeline"), "{decode}");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(drawn.matches("<circle").count() >= 20, "every distinct operator of both phases is a point");
    let both = corelm().args(["plan", "--plan", "x.json", "--profile", &profile]).output().unwrap();
    assert!(String::from_utf8_lossy(&both.stderr).contains("one or the other"));
    // A MoE model (the Qwen3-MoE fixture: 8 experts of 64 × 48, 2 per token): its expert
    // matmuls costed at the experts a batch reaches, each with its rule by routed pairs — a
    // one-token decode routes one pair per expert at most: the CPU.
    let moe = format!("{}/../../fixtures/qwen3moe.gguf", env!("CARGO_MANIFEST_DIR"));
    let out = corelm().args(["plan", "--model", &moe, "--profile", &profile, "--prompt", "64"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let (prefill, decode) = text.split_once("decode at").expect("two tables");
    assert!(prefill.contains("experts of matmul_id F16 64×48 ×8 by routed pairs: 1–") && prefill.contains("→ cpu;") && prefill.contains("+ → sme"), "{prefill}");
    assert!(decode.contains("experts of matmul_id F16 64×48 ×8 by routed pairs: 1+ → cpu"), "{decode}");
}

/// `--accel-split` from the command line on a stated profile with an accelerator target (10×
/// the CPU's compute, 25× its bandwidth, a 100 µs link; lavapipe runs it in CI): `plan` shows
/// a prefill matmul's first columns on the device, `run` loads the device's rows and
/// generates; without such a profile the flag is refused by name.
#[test]
fn accel_split_runs_the_plan_from_the_command_line() {
    let profile = std::env::temp_dir().join(format!("corelm-accel-{}.json", std::process::id()));
    let target = |name: &str, kind: &str, gflops: f64, link: &str| {
        format!(r#"{{ "name": "{name}", "kind": "{kind}", "workers": 2, "ceilings": [{{ "family": "int8_dot", "kernel": "stated", "one_worker_gflops": {}, "all_workers_gflops": {gflops} }}]{link} }}"#, gflops / 2.0)
    };
    let json = format!(
        r#"{{ "machine": "stated", "source": "stated: test", "targets": [{}, {}], "combined": [], "memory": {{ "read_gbps": [[1, 30.0], [2, 40.0]], "per_target_gbps": [["cpu", 40.0], ["gpu", 1000.0]], "all_busy_gbps": 40.0 }} }}"#,
        target("cpu", "vector", 100.0, ""),
        target("gpu", "accelerator", 1000.0, r#", "link": { "overhead_us": 100.0, "gbps": 20.0 }"#)
    );
    std::fs::write(&profile, json).unwrap();
    let out = corelm().args(["plan", "--model", &smol(), "--profile"]).arg(&profile).args(["--prompt", "128"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("| matmul Q4_1 576×1536 ")).unwrap_or_default().to_string();
    assert!(line.contains("gpu 85% (cols 0..1300) + cpu 15% (cols 1300..1536)"), "{text}");
    let run = corelm().args(["run", "--model", &smol(), "-n", "4", "-p", "The capital of France is", "--no-pin", "--roofline"]).arg(&profile).arg("--accel-split").output().unwrap();
    let _ = std::fs::remove_file(&profile);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(err.contains("accel-split: 211 matrices' first rows"), "{err}");
    assert!(!String::from_utf8_lossy(&run.stdout).trim().is_empty());
    let bare = corelm().args(["run", "--model", &smol(), "-n", "1", "-p", "x", "--accel-split"]).output().unwrap();
    assert!(!bare.status.success());
    assert!(String::from_utf8_lossy(&bare.stderr).contains("--accel-split: needs --roofline with an accelerator target"), "{}", String::from_utf8_lossy(&bare.stderr));
}

/// A SmolLM2 sidecar calibrated on the first 256 tokens of `text`, written to `side`.
fn collect_sidecar(text: &Path, side: &Path) {
    let out = corelm()
        .args(["sparsity", "collect", "--model", &smol(), "--max-tokens", "256", "--chunk", "128", "--threads", "2", "--no-pin", "--file"])
        .arg(text)
        .arg("--output")
        .arg(side)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `perplexity` under an online balancing policy prints each chunk's own balance figures
/// (what `scripts/balance_drift.sh` reads): one token per pass, so a chunk of 32 tokens is 32
/// passes, the statistics reset between chunks. On the accelerator (lavapipe in CI), with a
/// sidecar calibrated here.
#[test]
fn perplexity_prints_balance_per_chunk() {
    let dir = std::env::temp_dir().join(format!("corelm-drift-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let side = dir.join("smol.sparsity");
    let text = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/ppl-gpl3.txt");
    collect_sidecar(&text, &side);
    let out = corelm()
        .args(["perplexity", "--model", &smol(), "-c", "32", "-b", "1", "--chunks", "2", "-t", "2", "--no-pin", "--sparsity", "0.5", "--accel-mem", "2M", "--accel-policy", "tam", "--file"])
        .arg(&text)
        .arg("--sparsity-file")
        .arg(&side)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    for c in 1..=2 {
        assert!(err.contains(&format!("[chunk {c}: balance tam: 32 passes, device hit rate ")), "chunk {c}: {err}");
    }
}

/// `sparsity predict` trains and writes predictors; `--check` reads them back and reports the
/// same table (a row per layer, recall, mass recall, worst miss) on a text, and refuses a file
/// that is not a predictor by name.
#[test]
fn sparsity_predict_writes_and_checks_predictors() {
    let dir = std::env::temp_dir().join(format!("corelm-predict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (side, pred) = (dir.join("smol.sparsity"), dir.join("smol.predictor.gguf"));
    let text = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/ppl-gpl3.txt");
    let args = |extra: &[&str]| {
        let mut c = corelm();
        c.args(["sparsity"]).args(extra).args(["--model", &smol(), "--threads", "2", "--no-pin", "--file"]).arg(&text);
        c.arg("--sparsity-file").arg(&side);
        c
    };
    collect_sidecar(&text, &side);
    let train = args(&["predict", "--tokens", "256", "--rank", "8", "--epochs", "1", "-c", "128"]).arg("--output").arg(&pred).output().unwrap();
    assert!(train.status.success(), "{}", String::from_utf8_lossy(&train.stderr));
    let check = args(&["predict", "--tokens", "128", "-c", "128"]).arg("--check").arg(&pred).output().unwrap();
    let wrong = args(&["predict", "--tokens", "128", "-c", "128"]).arg("--check").arg(smol()).output().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let (trained, checked) = (String::from_utf8_lossy(&train.stdout), String::from_utf8_lossy(&check.stdout));
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    for out in [&trained, &checked] {
        assert!(out.contains("| layer | predicts from | pinned | firing | predicted | recall | mass recall | worst miss |"), "{out}");
        assert!(out.contains("| 29 | layer 28 |") && out.contains("| mean |"), "{out}");
    }
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success() && err.contains("not a predictor file"), "{err}");
}

/// A `corelm serve` process on a free port, killed when dropped.
struct Served {
    child: std::process::Child,
    addr: String,
    /// Its standard error up to the line that announces the address.
    log: String,
}

impl Served {
    fn start(args: &[&str]) -> Served {
        use std::io::BufRead;
        let mut child = corelm()
            .args(["serve", "--model", &smol(), "--port", "0", "--parallel", "2", "-c", "512"])
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let mut log = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            log += &line;
            log.push('\n');
            if let Some(at) = line.split("http://").nth(1) {
                let addr = at.split_whitespace().next().unwrap().to_string();
                // Keep draining what it writes later, so it never blocks on a full pipe.
                std::thread::spawn(move || lines.for_each(drop));
                return Served { child, addr, log };
            }
        }
        let _ = child.wait();
        panic!("serve {args:?} exited before serving:\n{log}");
    }

    /// POST `body` to `path`; the reply's JSON body.
    fn post(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        use std::io::Read;
        let body = body.to_string();
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap();
        write!(s, "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", self.addr, body.len()).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        let (head, json) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{reply}");
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {reply}"))
    }
}

/// The per-token log-probabilities of a `/v1/completions` reply with `logprobs` on.
fn logprobs(v: serde_json::Value) -> Vec<f64> {
    v["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap_or_else(|| panic!("{v}")).iter().map(|l| l.as_f64().unwrap()).collect()
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve --no-batch-invariant --fast-prefill` prefills through the panel GEMM: the same greedy
/// request's log-probabilities move off the batch-invariant server's bits (activations rounded
/// per panel, another summation order; 0.03–0.06 here) but stay near them. `--fast-prefill` alone is refused, naming the flag
/// it needs.
#[test]
fn serve_without_batch_invariance_takes_the_fast_prefill() {
    let request = serde_json::json!({
        "prompt": "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable metal type, oil-based ink and a wooden press into one system",
        "max_tokens": 4, "temperature": 0, "logprobs": 1,
    });
    let invariant = logprobs(Served::start(&[]).post("/v1/completions", &request));
    let fast = Served::start(&["--no-batch-invariant", "--fast-prefill"]);
    assert!(fast.log.contains("results depend on batching, panel GEMM prefill"), "{}", fast.log);
    let variant = logprobs(fast.post("/v1/completions", &request));
    assert_eq!(invariant.len(), 4);
    assert_ne!(invariant[0], variant[0], "the prompt's pass ran the same kernels: the panel GEMM was not used");
    assert!(invariant.iter().zip(&variant).all(|(a, b)| (a - b).abs() < 0.2), "{invariant:?} vs {variant:?}");
    let refused = corelm().args(["serve", "--model", &smol(), "--port", "0", "--fast-prefill"]).output().unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("--no-batch-invariant"), "{err}");
}

/// `run --prompt-cache`: the first run writes the prompt's whole blocks, the second takes
/// them from the file and computes the rest, with the same greedy text (batch-invariant, so
/// the shorter pass gives the same bits); `--prompt-cache-ro` never writes.
#[test]
fn run_reuses_a_prompt_cache_file() {
    let dir = std::env::temp_dir().join(format!("corelm-prompt-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("p.kv");
    let prompt = "The keeper of the northern lighthouse wrote in his log every night. ".repeat(5);
    let run = |extra: &[&str]| {
        let out = corelm()
            .args(["run", "--model", &smol(), "-p", &prompt, "-n", "12", "--temp", "0", "--no-pin", "--batch-invariant"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let f = file.to_str().unwrap();
    let (plain, _) = run(&[]);
    let (first, log) = run(&["--prompt-cache", f]);
    assert_eq!(first, plain);
    assert!(log.contains("tokens written") && !log.contains("reused"), "{log}");
    let written = std::fs::metadata(&file).unwrap().modified().unwrap();
    let (second, log) = run(&["--prompt-cache", f, "--prompt-cache-ro"]);
    assert_eq!(second, plain, "the text from the cached prompt");
    let line = log.lines().find(|l| l.contains("reused")).unwrap_or_else(|| panic!("{log}"));
    assert!(!line.contains(" 0 of"), "{line}");
    assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), written, "read-only");
}
