//! The roofline profile: this machine measured (every family's kernel runs, the numbers are
//! positive and consistent), written and read back, and the stated M4 Pro fixture.

use corelm_plan::profile::{cache_path, measure, FAMILIES};
use corelm_plan::Roofline;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/profiles").join(name)
}

#[test]
fn this_machine_measures_every_family_and_reads_back() {
    let kernels = corelm_kernels::kernels();
    let r = measure(kernels, "test machine", 2, 32 << 20);
    let cpu = &r.targets[0];
    assert_eq!((cpu.name.as_str(), cpu.workers), ("cpu", 2));
    let families: Vec<&str> = cpu.ceilings.iter().map(|c| c.family.as_str()).collect();
    // Every table has the int8 dot and the F32 tiles; F16/BF16 tiles where it has them.
    assert!(families.contains(&"int8_dot") && families.contains(&"f32_fma"), "{families:?}");
    assert!(families.iter().all(|f| FAMILIES.contains(f)));
    for c in &cpu.ceilings {
        assert!(c.one_worker_gflops > 0.0 && c.all_workers_gflops > 0.0, "{c:?}");
    }
    assert_eq!(r.memory.read_gbps.iter().map(|&(t, _)| t).collect::<Vec<_>>(), vec![1, 2]);
    assert!(r.memory.all_busy_gbps > 0.0);
    assert!((1..=2).contains(&r.bandwidth_knee(0.9).unwrap()));
    let path = std::env::temp_dir().join(format!("corelm-profile-{}.json", std::process::id()));
    r.save(&path).unwrap();
    let back = Roofline::load(&path).unwrap();
    // JSON keeps each number to within an ulp.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs().max(1.0);
    assert_eq!((back.machine.as_str(), back.targets[0].ceilings.len()), (r.machine.as_str(), cpu.ceilings.len()));
    for (x, y) in back.targets[0].ceilings.iter().zip(&cpu.ceilings) {
        assert!(x.family == y.family && close(x.all_workers_gflops, y.all_workers_gflops) && close(x.one_worker_gflops, y.one_worker_gflops));
    }
    assert!(close(back.memory.all_busy_gbps, r.memory.all_busy_gbps));
    let _ = std::fs::remove_file(&path);
    // A matrix unit is a second target exactly where the table has one (SME: its SUMOPA panel
    // and FMOPA GEMM; under qemu in scripts/test_arm.sh, numbers meaningless but positive).
    if kernels.isa() == corelm_kernels::Isa::Sme {
        let sme = &r.targets[1];
        assert_eq!((r.targets.len(), sme.name.as_str(), sme.kind), (2, "sme", corelm_plan::profile::TargetKind::Matrix));
        let fams: Vec<&str> = sme.ceilings.iter().map(|c| c.family.as_str()).collect();
        assert_eq!(fams, ["int8_dot", "f32_fma"]);
        assert!(sme.ceilings.iter().all(|c| c.one_worker_gflops > 0.0 && c.all_workers_gflops > 0.0));
    } else {
        assert_eq!(r.targets.len(), 1);
    }
    // One cache file per CPU model, table and core count.
    let p = cache_path("AMD EPYC 9R14 96-Core Processor", "avx512", 2);
    assert!(p.ends_with("corelm/profiles/amd-epyc-9r14-96-core-processor-avx512-2c-p2.json"), "{}", p.display());
}

#[test]
fn the_m4_pro_fixture_has_two_targets_and_a_shared_roof() {
    let r = Roofline::load(&fixture("apple-m4-pro.json")).unwrap();
    assert!(r.source.starts_with("stated"));
    let (cpu, sme) = (r.ceiling("cpu", "f16_fma").unwrap(), r.ceiling("sme", "f16_fma").unwrap());
    assert_eq!((cpu.all_workers_gflops, sme.all_workers_gflops), (1850.0, 2920.0));
    // Together less than the sum (4.27 < 4.77 TFLOP/s); memory not additive either.
    assert!(r.combined[0].gflops < cpu.all_workers_gflops + sme.all_workers_gflops);
    let sum: f64 = r.memory.per_target_gbps.iter().map(|(_, g)| g).sum();
    assert!(r.memory.all_busy_gbps < sum);
    // The matrix unit's ridge is further right: it needs more FLOPs per byte to pay.
    assert!(r.ridge("sme", "f16_fma").unwrap() > r.ridge("cpu", "f16_fma").unwrap());
    assert!(Roofline::load(&fixture("missing.json")).unwrap_err().to_string().contains("missing.json"));
}

/// `add_accelerator` (`corelm profile --accel`): the target, its read bandwidth and the
/// combined ceiling go in; measured again, they are replaced, and the all-busy roof is the
/// new measurement against the CPU's own best, not the lowest one ever seen.
#[test]
fn an_accelerator_added_again_replaces_its_figures() {
    use corelm_plan::profile::{add_accelerator, Ceiling, Link, Memory, Target, TargetKind};
    let target = |name: &str, kind, link| Target { name: name.into(), kind, workers: 1, ceilings: vec![Ceiling { family: "int8_dot".into(), kernel: "k".into(), one_worker_gflops: 1.0, all_workers_gflops: 1.0 }], tile: None, link };
    let mut r = Roofline {
        machine: "m".into(),
        source: "measured".into(),
        targets: vec![target("cpu", TargetKind::Vector, None)],
        combined: Vec::new(),
        memory: Memory { read_gbps: vec![(1, 30.0), (2, 40.0)], per_target_gbps: vec![("cpu".into(), 40.0)], all_busy_gbps: 40.0 },
    };
    let link = Some(Link { overhead_us: 200.0, gbps: 5.0 });
    add_accelerator(&mut r, target("accel", TargetKind::Accelerator, link), 0.7, Some(125.0), Some(35.0));
    assert_eq!((r.targets.len(), r.memory.all_busy_gbps, r.combined[0].gflops), (2, 35.0, 125.0));
    add_accelerator(&mut r, target("accel", TargetKind::Accelerator, link), 0.6, Some(170.0), Some(45.0));
    assert_eq!((r.targets.len(), r.combined.len(), r.memory.per_target_gbps.len()), (2, 1, 2));
    assert_eq!((r.memory.all_busy_gbps, r.combined[0].gflops, r.memory.per_target_gbps[1].1), (40.0, 170.0, 0.6));
    assert!(r.source.ends_with("accelerator accel measured (corelm profile --accel)") && r.source.matches("accelerator").count() == 1, "{}", r.source);
}
