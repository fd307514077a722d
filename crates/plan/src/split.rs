//! SMEPilot's tile-level split (its eq. 1): one GEMM's `m × n` output shared among
//! heterogeneous worker classes (a matrix unit and the vector cores, or performance and
//! efficiency cores) in the ratio of their throughput, `n_i = N · P_i / Σ P`.
//!
//! The output is cut along its larger dimension only, into one contiguous range per class, so
//! each class streams its own weight rows (or activation rows) and the other dimension stays
//! whole. Every boundary falls on a multiple of the least common multiple of the classes'
//! micro-kernel tiles along that dimension, so no class computes a partial tile of its own
//! kernel except at the matrix edge. Shares are whole units (largest remainder after the
//! floor), so each class gets within one unit of its exact share: the slowest class finishes
//! at most one unit's time after the ideal.

use std::ops::Range;

/// One worker class: its micro-kernel's output tile (`[rows, cols]`) and its throughput.
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    pub name: String,
    pub tile: [usize; 2],
    pub gflops: f64,
}

/// One class's part of the output: rows × columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    pub name: String,
    pub rows: Range<usize>,
    pub cols: Range<usize>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The split of an `m × n` output among `classes` (in their order along the cut dimension):
/// columns when `n ≥ m`, else rows. A class of zero throughput gets an empty range; with no
/// throughput at all the first class takes everything.
pub fn split_tiles(m: usize, n: usize, classes: &[Class]) -> Vec<Share> {
    let by_cols = n >= m;
    let (len, axis) = if by_cols { (n, 1) } else { (m, 0) };
    let unit = classes.iter().map(|c| c.tile[axis].max(1)).fold(1, |u, t| u / gcd(u, t) * t);
    let units = len.div_ceil(unit);
    let total: f64 = classes.iter().map(|c| c.gflops.max(0.0)).sum();
    let mut count: Vec<usize> = vec![0; classes.len()];
    if total > 0.0 {
        let exact: Vec<f64> = classes.iter().map(|c| units as f64 * c.gflops.max(0.0) / total).collect();
        for (k, e) in count.iter_mut().zip(&exact) {
            *k = e.floor() as usize;
        }
        // Largest remainders first (the faster class on ties).
        let mut order: Vec<usize> = (0..classes.len()).collect();
        order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(classes[b].gflops.total_cmp(&classes[a].gflops)));
        let left = units - count.iter().sum::<usize>();
        for &i in order.iter().take(left) {
            count[i] += 1;
        }
    } else if let Some(c) = count.first_mut() {
        *c = units;
    }
    let mut at = 0;
    classes
        .iter()
        .zip(count)
        .map(|(c, k)| {
            let r = (at * unit).min(len)..((at + k) * unit).min(len);
            at += k;
            let (rows, cols) = if by_cols { (0..m, r) } else { (r, 0..n) };
            Share { name: c.name.clone(), rows, cols }
        })
        .collect()
}
