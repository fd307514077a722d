//! The element-wise nodes (adds, scales, soft caps, per-row gates): each worker computes its
//! rows (`split`), each value the one f32 operation (or ggml's chain of them) llama.cpp's node
//! computes, so the results are ggml's bits.

use super::{split, Ctx};
use crate::tensor::{Op, Tensor};

/// Llama 4's and Mistral 3's attention temperature at position `pos` (`Op::TempScale`), as
/// llama.cpp's `llm_graph_input_attn_temp` computes it: `⌊pos / floor⌋` in f32, then
/// `ln(that + 1) · scale + 1` in f64, rounded to f32 once. 1 below `floor`.
pub fn attn_temperature(pos: i32, scale: f32, floor: u32) -> f32 {
    let q = (pos as f32 / floor as f32).floor();
    ((q as f64 + 1.0).ln() * scale as f64 + 1.0) as f32
}

impl Ctx<'_> {
    /// Worker `ith`'s rows of the element-wise node `t`.
    pub(super) fn pointwise(&self, t: &Tensor, ith: usize, nth: usize) {
        let [ne0, rows] = t.ne;
        match t.op {
            Op::Add { a, b } => {
                let (a, b, b_rows) = (self.f32s(a), self.f32s(b), self.t(b).ne[1]);
                for r in split(rows, ith, nth) {
                    // SAFETY: row r belongs to this worker only.
                    let y = unsafe { self.out_f32(t, r * ne0, ne0) };
                    let br = if b_rows == 1 { 0 } else { r };
                    for ((o, &p), &q) in y.iter_mut().zip(&a[r * ne0..]).zip(&b[br * ne0..(br + 1) * ne0]) {
                        *o = p + q;
                    }
                }
            }
            Op::AddScaled { a, b, s } => {
                let (a, b) = (self.f32s(a), self.f32s(b));
                for r in split(rows, ith, nth) {
                    // SAFETY: row r belongs to this worker only.
                    let y = unsafe { self.out_f32(t, r * ne0, ne0) };
                    for ((o, &p), &q) in y.iter_mut().zip(&a[r * ne0..]).zip(&b[r * ne0..(r + 1) * ne0]) {
                        *o = p + q * s;
                    }
                }
            }
            Op::Scale { x, s } => self.each_row(t, self.f32s(x), ith, nth, &|_| move |v| v * s),
            Op::TempScale { x, scale, floor } => {
                let pos = self.batch.pos;
                self.each_row(t, self.f32s(x), ith, nth, &|r| {
                    let s = attn_temperature(pos[r], scale, floor);
                    move |v| v * s
                });
            }
            Op::Softcap { x, cap } => {
                // ggml's three nodes: x times 1/cap (rounded once), tanhf, times cap.
                let inv = 1.0 / cap;
                self.each_row(t, self.f32s(x), ith, nth, &|_| move |v: f32| (v * inv).tanh() * cap);
            }
            Op::SigmoidMul { x, g } => {
                let g = self.f32s(g);
                self.each_row(t, self.f32s(x), ith, nth, &|r| {
                    let s = 1.0 / (1.0 + (-g[r]).exp());
                    move |v| v * s
                });
            }
            ref op => unreachable!("{} is not element-wise", op.name()),
        }
    }

    /// Worker `ith`'s rows r of `x` through `row(r)` (a row's function, its factor computed
    /// once) into the node `t`'s row r.
    fn each_row<F: Fn(f32) -> f32>(&self, t: &Tensor, x: &[f32], ith: usize, nth: usize, row: &impl Fn(usize) -> F) {
        let [ne0, rows] = t.ne;
        for r in split(rows, ith, nth) {
            let f = row(r);
            // SAFETY: row r belongs to this worker only.
            let y = unsafe { self.out_f32(t, r * ne0, ne0) };
            y.iter_mut().zip(&x[r * ne0..]).for_each(|(o, &v)| *o = f(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::attn_temperature;

    #[test]
    fn attention_temperature_steps_at_each_multiple_of_the_floor() {
        // Below the floor: exactly 1 (ln 1 = 0).
        assert_eq!(attn_temperature(0, 0.1, 8), 1.0);
        assert_eq!(attn_temperature(7, 0.1, 8), 1.0);
        // ⌊8/8⌋ = 1: 1 + 0.1·ln 2, ⌊23/8⌋ = 2: 1 + 0.1·ln 3, computed in f64.
        assert_eq!(attn_temperature(8, 0.1, 8), (2f64.ln() * 0.1f32 as f64 + 1.0) as f32);
        assert_eq!(attn_temperature(15, 0.1, 8), attn_temperature(8, 0.1, 8));
        assert_eq!(attn_temperature(23, 0.1, 8), (3f64.ln() * 0.1f32 as f64 + 1.0) as f32);
        // Ministral 3's setting: 16384 positions per step.
        assert_eq!(attn_temperature(16383, 0.1, 16384), 1.0);
        assert!((attn_temperature(40000, 0.1, 16384) - (1.0 + 0.1 * 3f32.ln())).abs() < 1e-6);
    }
}
