//! The matrix-unit (Arm SME) kernels and their portable model (`matmul::gemm::tile`).
//!
//! Everywhere: the model's outer products on hand-worked tiles. On an aarch64 CPU with SME's
//! features (qemu `-cpu max` in `scripts/test_arm.sh`): the f32 and int8 kernels against the
//! model bit for bit on ragged shapes, or, where the int8 kernel disagrees (Debian 12's qemu
//! 7.2 computes `SUMOPA`'s 32-bit tiles wrongly), the self-test refusing `Isa::Sme`. With
//! `CORELM_EXPECT_SME=1` (the script's runs on a qemu that emulates SME correctly) the SME
//! table must be granted, so those runs cannot pass without running the kernels. The panel GEMM
//! through the SME table is checked against the portable panel in `parity/main.rs`.

use corelm_kernels::matmul::gemm::tile::{fmopa, gemm_f32_model, sumopa};
use corelm_kernels::Isa;

#[test]
fn outer_product_models_on_worked_tiles() {
    // r = 2: za[i][j] += Σₗ n[4i+l]·m[4j+l], signed rows by unsigned columns.
    let n: [i8; 8] = [1, -2, 3, -4, -128, 127, 0, 5];
    let m: [u8; 8] = [255, 1, 2, 3, 10, 20, 30, 40];
    let mut za = vec![100, 0, 0, -7];
    sumopa(&mut za, 2, &n, &m);
    // Row 0: 255 − 2 + 6 − 12 = 247; 10 − 40 + 90 − 160 = −100.
    // Row 1: −32640 + 127 + 0 + 15 = −32498; −1280 + 2540 + 0 + 200 = 1460.
    assert_eq!(za, vec![100 + 247, -100, -32498, 1460 - 7]);
    // fmopa is fused: (1 + 2⁻¹²)² is 1 + 2⁻¹¹ + 2⁻²⁴, whose last term a rounded product loses
    // (a tie, to even); minus (1 + 2⁻¹¹) it leaves 2⁻²⁴ only without a rounding in between.
    let e = 1.0 + 2f32.powi(-12);
    let mut zf = vec![-(1.0 + 2f32.powi(-11)), 0.0, 0.0, 1.0];
    fmopa(&mut zf, 2, &[e, 2.0], &[e, 3.0]);
    assert_eq!(zf, vec![2f32.powi(-24), 3.0 * e, 2.0 * e, 7.0]);
    // The f32 GEMM is the same chain, over k in order, from c's value.
    let (a, b) = ([1.0, 2.0, 3.0, 4.0f32], [0.5, -1.0f32]);
    let mut c = vec![10.0, 20.0];
    gemm_f32_model(&a, &b, &mut c, 2, 1, 2);
    assert_eq!(c, vec![10.0 + 0.5 - 2.0, 20.0 + 1.5 - 4.0]);
}

#[test]
fn sme_kernels_match_their_model_or_are_refused() {
    let expect = std::env::var("CORELM_EXPECT_SME").is_ok_and(|v| v == "1");
    let has = Isa::Sme.missing().is_empty();
    assert!(has || !expect, "CORELM_EXPECT_SME=1 but this CPU lacks SME's features: {:?}", Isa::Sme.missing());
    if !has {
        return;
    }
    let granted = corelm_kernels::dispatch::check(Isa::Sme);
    assert!(granted.is_ok() || !expect, "CORELM_EXPECT_SME=1 but the SME table was refused: {}", granted.unwrap_err());
    #[cfg(target_arch = "aarch64")]
    {
        use corelm_kernels::matmul::aarch64::sme;
        // The f32 kernel: ragged shapes around the 2r × 2r block, k from 1.
        let r = corelm_kernels::simd::aarch64::sme_vector_bytes() / 4;
        let mut seed = 7u32;
        let mut f = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        };
        for (m, n, k) in [(1, 1, 1), (2 * r, 2 * r, 5), (2 * r + 1, 3 * r - 1, 33), (5, 4 * r + 3, 130)] {
            let a: Vec<f32> = (0..m * k).map(|_| f()).collect();
            let b: Vec<f32> = (0..n * k).map(|_| f()).collect();
            let c0: Vec<f32> = (0..m * n).map(|_| f()).collect();
            let (mut got, mut want) = (c0.clone(), c0);
            // SAFETY: SME's features are present (checked above).
            unsafe { sme::gemm_f32(&a, &b, &mut got, m, n, k) };
            gemm_f32_model(&a, &b, &mut want, m, n, k);
            assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "f32 {m}×{n}×{k}");
        }
        // The self-test's verdict is the int8 kernel's: granted exactly when it agrees.
        // SAFETY: as above.
        let agrees = unsafe { sme::self_test() };
        assert_eq!(agrees, granted.is_ok());
        if !agrees {
            assert_eq!(corelm_kernels::best_isa(), Isa::Dotprod, "a failed self-test steps the best table down");
        }
    }
}
