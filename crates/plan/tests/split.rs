//! SMEPilot's tile-level split: exact coverage, boundaries on both kernels' tiles, shares
//! within one tile unit of the throughput ratio, on random shapes and classes; and the M4 Pro
//! figures' split of a prefill FFN.

use corelm_plan::split::{split_tiles, Class};
use proptest::prelude::*;

fn class(name: &str, tile: [usize; 2], gflops: f64) -> Class {
    Class { name: name.into(), tile, gflops }
}

#[test]
fn m4_pro_prefill_ffn_splits_in_the_ratio_of_the_stated_ceilings() {
    // 512 tokens × 14336 FFN rows, SME (16-row, 8-column panel tiles) at 2920 GFLOP/s and the
    // CPU's NEON (8 × 4 tiles) at 1850: columns (the larger side) in units of lcm(8, 4) = 8,
    // 1792 units, 1792 · 2920 / 4770 = 1097.0 to SME.
    let s = split_tiles(512, 14336, &[class("sme", [16, 8], 2920.0), class("cpu", [8, 4], 1850.0)]);
    assert_eq!((s[0].rows.clone(), s[0].cols.clone()), (0..512, 0..1097 * 8));
    assert_eq!((s[1].rows.clone(), s[1].cols.clone()), (0..512, 1097 * 8..14336));
    // A tall output (more tokens than columns) is cut by rows, in units of lcm(16, 8).
    let s = split_tiles(4096, 576, &[class("sme", [16, 8], 2920.0), class("cpu", [8, 4], 1850.0)]);
    assert_eq!((s[0].rows.clone(), s[1].rows.clone(), s[1].cols.clone()), (0..2512, 2512..4096, 0..576));
}

#[test]
fn degenerate_classes() {
    // No throughput anywhere: the first class takes it all; a zero class gets nothing.
    let s = split_tiles(4, 100, &[class("a", [1, 8], 0.0), class("b", [1, 8], 0.0)]);
    assert_eq!((s[0].cols.clone(), s[1].cols.clone()), (0..100, 100..100));
    let s = split_tiles(4, 100, &[class("a", [1, 8], 0.0), class("b", [1, 8], 5.0)]);
    assert_eq!((s[0].cols.clone(), s[1].cols.clone()), (0..0, 0..100));
}

proptest! {
    #[test]
    fn shares_cover_exactly_on_tile_boundaries_in_the_throughput_ratio(
        m in 1usize..3000,
        n in 1usize..3000,
        spec in prop::collection::vec(((1usize..5, 1usize..5), 0.0f64..5000.0), 1..5),
    ) {
        let classes: Vec<Class> = spec.iter().enumerate().map(|(i, &((a, b), g))| class(&format!("c{i}"), [1 << a, 1 << b], g)).collect();
        let s = split_tiles(m, n, &classes);
        prop_assert_eq!(s.len(), classes.len());
        let by_cols = n >= m;
        let len = if by_cols { n } else { m };
        let axis = if by_cols { 1 } else { 0 };
        let unit = classes.iter().map(|c| c.tile[axis]).max().unwrap(); // powers of two: lcm = max
        let mut at = 0;
        for sh in &s {
            let (cut, whole) = if by_cols { (&sh.cols, &sh.rows) } else { (&sh.rows, &sh.cols) };
            prop_assert_eq!(whole.clone(), 0..if by_cols { m } else { n });
            prop_assert_eq!(cut.start, at, "contiguous, in class order");
            prop_assert!((cut.start % unit == 0 || cut.start == len) && (cut.end % unit == 0 || cut.end == len), "on the tiles' boundaries");
            at = cut.end;
        }
        prop_assert_eq!(at, len, "every output once");
        let total: f64 = classes.iter().map(|c| c.gflops).sum();
        if total > 0.0 {
            let units = len.div_ceil(unit) as f64;
            for (sh, c) in s.iter().zip(&classes) {
                let cut = if by_cols { &sh.cols } else { &sh.rows };
                let got = cut.len().div_ceil(unit) as f64;
                prop_assert!((got - units * c.gflops / total).abs() < 1.0 + 1e-9, "within one unit of its share");
            }
        }
    }
}
