//! The planner's placements on the stated Apple M4 Pro profile (SMEPilot's machine) and on a
//! one-target machine.

use corelm_plan::planner::{attention_pipeline, expert_cuts, expert_rule, place, Placement, Regime, SOFTMAX_FLOPS};
use corelm_plan::Roofline;

fn m4() -> Roofline {
    Roofline::load(&std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/profiles/apple-m4-pro.json")).unwrap()
}

/// An F16 matmul of `rows` activation rows through a k × n matrix: FLOPs and bytes moved.
fn f16_matmul(rows: usize, k: usize, n: usize) -> (f64, f64) {
    let (r, k, n) = (rows as f64, k as f64, n as f64);
    (2.0 * r * k * n, 2.0 * k * n + 2.0 * r * k + 4.0 * r * n)
}

#[test]
fn m4_pro_placements_are_the_papers() {
    let roof = m4();
    // Decode GEMV: memory-bound everywhere; the CPU reads faster than SME (247 vs 224 GB/s).
    let (f, b) = f16_matmul(1, 4096, 4096);
    let p = place(&roof, "gemv".into(), "f16_fma", f, b);
    assert_eq!((p.placement.clone(), p.regime), (Placement::On("cpu".into()), Regime::Memory));
    // Batched decode, 16 rows: past the CPU's ridge, not past the combined one: SME alone.
    let (f, b) = f16_matmul(16, 4096, 4096);
    let p = place(&roof, "batched".into(), "f16_fma", f, b);
    assert_eq!(p.placement, Placement::On("sme".into()));
    assert_eq!(p.gflops, 2920.0);
    // A long prefill's FFN: compute-bound on the combined roofline: split 2920 : 1850.
    let (f, b) = f16_matmul(512, 4096, 14336);
    let p = place(&roof, "ffn".into(), "f16_fma", f, b);
    let Placement::Split(shares) = &p.placement else { panic!("{:?}", p.placement) };
    let sme = shares.iter().find(|(t, _)| t == "sme").unwrap().1;
    assert!((sme - 2920.0 / 4770.0).abs() < 1e-9 && (shares.iter().map(|s| s.1).sum::<f64>() - 1.0).abs() < 1e-12);
    assert_eq!((p.gflops, p.regime), (4270.0, Regime::Compute));
    // A family no target has (int8 here): the vector cores at the memory roof.
    let p = place(&roof, "q".into(), "int8_dot", 1e6, 1e6);
    assert_eq!(p.placement, Placement::On("cpu".into()));
}

#[test]
fn a_memory_bound_operator_stops_at_the_bandwidth_knee() {
    let mut roof = m4();
    // Bandwidth flat from 4 of 8 threads.
    roof.memory.read_gbps = (1..=8).map(|t| (t, 247.0 * (t.min(4) as f64) / 4.0)).collect();
    let (f, b) = f16_matmul(1, 4096, 4096);
    assert_eq!(place(&roof, "gemv".into(), "f16_fma", f, b).threads, 4);
    let (f, b) = f16_matmul(512, 4096, 4096);
    let p = place(&roof, "gemm".into(), "f16_fma", f, b);
    assert!(matches!(p.placement, Placement::Split(_)));
    assert_eq!(p.threads, 8, "compute-bound: every worker");
}

/// `apply_splits` cuts the matmuls the plan splits — here a 512-token prefill's 4096 × 14336
/// Q4_0 FFN matrix on the M4 Pro profile given int8 ceilings in the ratio of its FP16 ones —
/// into one range per worker class in the executor's order, as `split_tiles` cuts them, and
/// leaves a one-token decode's GEMV whole.
#[test]
fn splits_are_written_into_the_graph_in_class_order() {
    use corelm_core::graph::Builder;
    use corelm_core::tensor::{ClassSplit, Op, WeightRef};
    use corelm_kernels::{DType, Isa, Kernels};
    use corelm_plan::planner::plan_graph;
    use corelm_plan::profile::{Ceiling, Combined};
    let mut roof = m4();
    for t in &mut roof.targets {
        let all = t.ceilings[0].all_workers_gflops * 2.0;
        t.ceilings.push(Ceiling { family: "int8_dot".into(), kernel: "stated ×2".into(), one_worker_gflops: all / t.workers as f64, all_workers_gflops: all });
    }
    roof.combined.push(Combined { targets: vec!["cpu".into(), "sme".into()], family: "int8_dot".into(), gflops: 8540.0 });
    let kernels = Kernels::for_isa(Isa::Portable).unwrap();
    let graph = |rows: usize| {
        let mut b = Builder::new(&kernels, rows, 1);
        let table = b.weight(&WeightRef { name: "tok".into(), dtype: DType::F32, ne: [4096, 8], offset: 0, len: 4096 * 8 * 4 });
        let w = b.weight(&WeightRef { name: "up".into(), dtype: DType::Q4_0, ne: [4096, 14336], offset: 0, len: 14336 * 128 * 18 });
        b.begin_layer(0);
        let x = b.embed(&table);
        let y = b.matmul(&w, &x);
        b.finish(&y)
    };
    let mut g = graph(512);
    let plans = plan_graph(&g, &roof, 0);
    assert_eq!(corelm_plan::planner::apply_splits(&mut g, &roof, &plans, &["sme", "cpu"]), 1);
    let (id, cut) = &g.splits[0];
    assert!(matches!(g.tensor(*id).op, Op::MatMul { .. }));
    // Columns (14336 > 512) in units of lcm(16, 4) = 16: 896 units, 896 · 2920 / 4770 = 548.49.
    assert_eq!(cut, &ClassSplit { by_rows: false, bounds: vec![0, 548 * 16, 14336] });
    assert_eq!(g.split_of(*id), Some(cut));
    // The other class order gives the mirrored cut.
    corelm_plan::planner::apply_splits(&mut g, &roof, &plans, &["cpu", "sme"]);
    assert_eq!(g.splits[0].1.bounds, vec![0, 14336 - 548 * 16, 14336]);
    // Classes the plan does not split across, and a decode GEMV: no cut.
    assert_eq!(corelm_plan::planner::apply_splits(&mut g, &roof, &plans, &["sme"]), 0);
    let mut d = graph(1);
    let decode = plan_graph(&d, &roof, 0);
    assert_eq!(corelm_plan::planner::apply_splits(&mut d, &roof, &decode, &["sme", "cpu"]), 0);
}

/// An accelerator target behind a link: a stated machine (CPU 1 TFLOP/s int8 at 100 GB/s; an
/// accelerator of 20 TFLOP/s at 2 TB/s behind a 50 µs round trip and 25 GB/s), not a real one.
fn with_accelerator(combined: Option<f64>) -> Roofline {
    use corelm_plan::profile::{Ceiling, Combined, Link, Memory, Target, TargetKind};
    let target = |name: &str, kind, gflops: f64, link| Target {
        name: name.into(),
        kind,
        workers: 16,
        ceilings: vec![Ceiling { family: "int8_dot".into(), kernel: "stated".into(), one_worker_gflops: gflops / 16.0, all_workers_gflops: gflops }],
        tile: None,
        link,
    };
    Roofline {
        machine: "stated".into(),
        source: "stated: test".into(),
        targets: vec![target("cpu", TargetKind::Vector, 1000.0, None), target("gpu", TargetKind::Accelerator, 20000.0, Some(Link { overhead_us: 50.0, gbps: 25.0 }))],
        combined: combined.map(|g| vec![Combined { targets: vec!["cpu".into(), "gpu".into()], family: "int8_dot".into(), gflops: g }]).unwrap_or_default(),
        memory: Memory { read_gbps: vec![], per_target_gbps: vec![("cpu".into(), 100.0), ("gpu".into(), 2000.0)], all_busy_gbps: 100.0 },
    }
}

/// An int8 matmul of `rows` rows through a k × n Q8_0 matrix: FLOPs, bytes, link bytes.
fn q8_matmul(rows: usize, k: usize, n: usize) -> (f64, f64, f64) {
    let (r, k, n) = (rows as f64, k as f64, n as f64);
    (2.0 * r * k * n, 1.0625 * k * n + 1.0625 * r * k + 4.0 * r * n, 4.0 * r * (k + n))
}

#[test]
fn an_accelerator_takes_the_matmuls_that_pay_for_its_link() {
    use corelm_plan::planner::{device_share, place_io};
    let roof = with_accelerator(None);
    // A small decode GEMV: 9 µs on the CPU, under the 50 µs round trip: the CPU.
    let (f, b, io) = q8_matmul(1, 896, 896);
    let p = place_io(&roof, "gemv".into(), "int8_dot", f, b, io, 896);
    assert_eq!(p.placement, Placement::On("cpu".into()));
    // A 30 MB LM head in decode: 301 µs at the CPU's 100 GB/s, 15 on the device plus its
    // link (50 µs and 197 kB of logits: 58); split, both finish in 69: the device 77 % of it.
    let (f, b, io) = q8_matmul(1, 576, 49152);
    let p = place_io(&roof, "head".into(), "int8_dot", f, b, io, 49152);
    assert!((device_share(&p, "gpu") - 0.77).abs() < 0.01 && p.regime == Regime::Memory, "{:?}", p.placement);
    assert!((p.seconds - 69e-6).abs() < 1e-6, "{}", p.seconds);
    // A 512-token prefill matmul: both, finishing together.
    let (f, b, io) = q8_matmul(512, 896, 4864);
    let p = place_io(&roof, "ffn".into(), "int8_dot", f, b, io, 4864);
    let s = device_share(&p, "gpu");
    let (t_cpu, t_acc, fixed) = (f / 1000e9, f / 20000e9, 50e-6 + io / 25e9);
    assert!(s > 0.0 && s < 1.0, "{:?}", p.placement);
    assert!(((1.0 - s) * t_cpu - (fixed + s * t_acc)).abs() < 1e-9 && (p.seconds - (1.0 - s) * t_cpu).abs() < 1e-12);
    assert!(p.seconds < t_cpu && p.seconds < fixed + t_acc);
    // Both busy at once slower (a software device on the CPU's cores): a smaller share,
    // a longer time.
    let slow = place_io(&with_accelerator(Some(1500.0)), "ffn".into(), "int8_dot", f, b, io, 4864);
    assert!(slow.seconds > p.seconds, "{} vs {}", slow.seconds, p.seconds);
    // A device like this machine's software one (0.5 GFLOP/s, 0.6 GB/s, 180 µs): the model
    // would give it 1 % of the LM head for a 0.5 % gain, under MIN_GAIN: nothing.
    let mut soft = with_accelerator(None);
    soft.targets[1].ceilings[0].all_workers_gflops = 0.5;
    soft.targets[1].link = Some(corelm_plan::profile::Link { overhead_us: 180.0, gbps: 5.0 });
    soft.memory.per_target_gbps[1].1 = 0.6;
    soft.memory.per_target_gbps[0].1 = 34.0;
    soft.memory.all_busy_gbps = 34.0;
    let (f, b, io) = q8_matmul(1, 576, 49152);
    assert_eq!(place_io(&soft, "head".into(), "int8_dot", f, b, io, 49152).placement, Placement::On("cpu".into()));
    // Only matmuls go to the accelerator: `place` never names it.
    let p = place(&roof, "attention".into(), "int8_dot", 1e12, 1e6);
    assert_eq!(p.placement, Placement::On("cpu".into()));
}

/// MoE experts placed by their routed-token counts (SMEPilot): on the M4 Pro profile an F16
/// expert of 2048 × 768 (Qwen3-MoE's shape) with a few pairs is a GEMV on the CPU, with more a
/// GEMM on SME, with many split between both; every step of the rule is where `place` changes
/// its mind, and on a one-target machine every count stays on the vector cores.
#[test]
fn experts_are_placed_by_their_routed_pairs() {
    let roof = m4();
    let (k, n) = (2048usize, 768usize);
    let bytes = 2.0 * (k * n) as f64;
    let rule = expert_rule(&roof, "f16_fma", bytes, k, n, 512);
    let on = |c: usize| {
        let (f, b) = (2.0 * (c * k * n) as f64, bytes + 4.0 * (c * (k + n)) as f64);
        place(&roof, String::new(), "f16_fma", f, b).placement
    };
    assert_eq!(rule.steps[0], (1, Placement::On("cpu".into())), "{rule:?}");
    assert!(rule.steps.iter().any(|(_, p)| *p == Placement::On("sme".into())), "{rule:?}");
    assert!(matches!(rule.steps.last().unwrap().1, Placement::Split(_)), "{rule:?}");
    for w in rule.steps.windows(2) {
        let (c, ref p) = w[1];
        assert!(c > w[0].0 && on(c) == *p && on(c - 1) == w[0].1, "{rule:?}");
    }
    for c in [1, 2, 7, 16, 100, 512] {
        assert_eq!(rule.placement(c), &on(c), "{c} pairs");
    }
    // Executed as cuts of each expert's n columns among the classes (sme first, as the
    // executor orders them): all to the vector cores, all to the matrix unit, then a cut at a
    // boundary of both targets' tiles.
    let cuts = expert_cuts(&roof, &rule, n, &["sme", "cpu"]).expect("a rule with sme steps is cut");
    assert_eq!(cuts.len(), rule.steps.len());
    for ((from, cut), (c, p)) in cuts.iter().zip(&rule.steps) {
        assert_eq!(from, c);
        assert!(!cut.by_rows && cut.bounds.len() == 3 && cut.bounds[0] == 0 && cut.bounds[2] == n, "{cut:?}");
        match p {
            Placement::On(t) if t == "cpu" => assert_eq!(cut.bounds[1], 0),
            Placement::On(_) => assert_eq!(cut.bounds[1], n),
            Placement::Split(_) => assert!(cut.bounds[1] > 0 && cut.bounds[1] < n && cut.bounds[1] % 8 == 0, "{cut:?}"),
        }
    }
    // One target: nothing to choose, nothing to cut.
    let mut one = m4();
    one.targets.retain(|t| t.name == "cpu");
    one.combined.clear();
    let only = expert_rule(&one, "f16_fma", bytes, k, n, 512);
    assert_eq!(only.steps, vec![(1, Placement::On("cpu".into()))]);
    assert!(expert_cuts(&one, &only, n, &["sme", "cpu"]).is_none());
}

/// Prefill attention as a pipeline on the M4 Pro profile: the matrix phases on SME (2920
/// GFLOP/s) overlap the softmax on the CPU (1850), so it takes the longer of the two instead
/// of their sum; a machine without a matrix unit gets no such plan.
#[test]
fn a_pipeline_hides_the_softmax_behind_the_matrix_unit() {
    let roof = m4();
    // 512 rows × 9 heads × 256 cells at head dimension 64.
    let cells = 512.0 * 9.0 * 256.0;
    let flops = 4.0 * 64.0 * cells;
    let a = attention_pipeline(&roof, flops, cells, 1e6).expect("a matrix target");
    let soft = SOFTMAX_FLOPS * cells;
    assert_eq!((a.matrix.as_str(), a.vector.as_str()), ("sme", "cpu"));
    assert!((a.pipelined_seconds - flops / 2920e9).abs() < 1e-12, "{a:?}");
    assert!((a.fused_seconds - (flops / 2920e9 + soft / 1850e9)).abs() < 1e-12, "{a:?}");
    assert!(a.pays());
    // Memory-bound (a decode's bytes): both at the memory roof, no gain.
    let slow = attention_pipeline(&roof, flops, cells, 1e10).unwrap();
    assert!(!slow.pays() && slow.fused_seconds == slow.pipelined_seconds);
    let mut one = m4();
    one.targets.retain(|t| t.name == "cpu");
    assert_eq!(attention_pipeline(&one, flops, cells, 1e6), None);
}
