//! The Intel AMX kernel of the panel GEMM and its portable model (`matmul::gemm::tile`).
//!
//! Everywhere: the model's tile product on a hand-worked tile. On an x86 CPU with AMX-TILE and
//! AMX-INT8 whose kernel grants the tile data: the kernel against the model bit for bit
//! (`amx::self_test`), the table granted exactly when it agrees. With `CORELM_EXPECT_AMX=1`
//! (runs on a machine known to have AMX) the AMX table must be granted, so such a run cannot
//! pass without running the kernel. The panel GEMM through the AMX table is checked against
//! the portable panel on ragged shapes in `parity/main.rs`.

use corelm_kernels::matmul::gemm::tile::tdpbsud;
use corelm_kernels::Isa;

#[test]
fn tile_product_model_on_a_worked_tile() {
    // 2 rows × 8 bytes of signed A, 2 rows (8 / 4) × 2 columns × 4 bytes of unsigned B.
    let a: [i8; 16] = [1, -2, 3, -4, 5, 0, 0, 1, -128, 127, 0, 5, 0, 0, 2, 0];
    let b: [u8; 16] = [255, 1, 2, 3, 10, 20, 30, 40, 1, 1, 1, 1, 0, 0, 0, 255];
    let mut c = vec![100, 0, 0, -7];
    tdpbsud(&mut c, (2, 2, 8), &a, 8, &b, 8);
    // c[0][0] = (255 − 2 + 6 − 12) + (5 + 0 + 0 + 1) = 253; c[0][1] = (10 − 40 + 90 − 160) + 1·255 = 155.
    // c[1][0] = (−32640 + 127 + 0 + 15) + 2 = −32496; c[1][1] = (−1280 + 2540 + 0 + 200) + 0 = 1460.
    assert_eq!(c, vec![100 + 253, 155, -32496, 1460 - 7]);
}

#[test]
fn amx_kernel_matches_its_model_or_is_refused() {
    let expect = std::env::var("CORELM_EXPECT_AMX").is_ok_and(|v| v == "1");
    let has = Isa::Amx.missing().is_empty();
    assert!(has || !expect, "CORELM_EXPECT_AMX=1 but this CPU or process lacks AMX: {:?}", Isa::Amx.missing());
    if !has {
        return;
    }
    let granted = corelm_kernels::dispatch::check(Isa::Amx);
    assert!(granted.is_ok() || !expect, "CORELM_EXPECT_AMX=1 but the AMX table was refused: {}", granted.unwrap_err());
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AMX's features and the tile data are present (checked above).
        let agrees = unsafe { corelm_kernels::matmul::gemm::amx::self_test() };
        assert_eq!(agrees, granted.is_ok());
        if !agrees {
            assert_eq!(corelm_kernels::best_isa(), Isa::Avx512, "a failed self-test steps the best table down");
        } else {
            assert_eq!(corelm_kernels::best_isa(), Isa::Amx);
        }
        // Opt-in: without `--isa amx` a process keeps the AVX-512 table.
        assert_eq!(corelm_kernels::dispatch::default_isa(), Isa::Avx512);
    }
}
