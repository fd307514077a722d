//! Builders of the element-wise and row-wise nodes (norms, adds, scales, gated activations):
//! each keeps its input's shape and, under tensor parallelism, runs once per shard on the
//! shard's own tensors (`Builder::zip`).

use super::Builder;
use crate::tensor::{Bundle, Glu, Op};
use corelm_kernels::DType;

impl Builder<'_> {
    pub fn rms_norm(&mut self, x: &Bundle, w: &Bundle, eps: f32) -> Bundle {
        self.zip(&[x, w], |b, t| {
            let (x, w) = (t[0], t[1]);
            b.check_src(x);
            let ne = b.t(x).ne;
            assert!(ne[0] % b.t(w).ne[0] == 0, "norm weight does not divide rows");
            b.node(ne, DType::F32, Op::RmsNorm { x, w, eps }).single()
        })
    }

    pub fn add(&mut self, a: &Bundle, b: &Bundle) -> Bundle {
        self.zip(&[a, b], |bl, t| {
            let (a, b) = (t[0], t[1]);
            bl.check_src(a);
            bl.check_src(b);
            let (na, nb) = (bl.t(a).ne, bl.t(b).ne);
            assert!(na[0] == nb[0] && (nb[1] == na[1] || nb[1] == 1), "add shapes {na:?} {nb:?}");
            bl.node(na, DType::F32, Op::Add { a, b }).single()
        })
    }

    pub fn scale(&mut self, x: &Bundle, s: f32) -> Bundle {
        self.zip(&[x], |b, t| {
            b.check_src(t[0]);
            let ne = b.t(t[0]).ne;
            b.node(ne, DType::F32, Op::Scale { x: t[0], s }).single()
        })
    }

    /// Each row of `x` times its position's attention temperature ([`Op::TempScale`]: Llama 4's
    /// and Mistral 3's queries, `1 + scale · ln(⌊pos / floor⌋ + 1)`).
    pub fn temp_scale(&mut self, x: &Bundle, scale: f32, floor: u32) -> Bundle {
        assert!(floor > 0, "attention temperature floor of 0");
        self.zip(&[x], |b, t| {
            b.check_src(t[0]);
            let ne = b.t(t[0]).ne;
            b.node(ne, DType::F32, Op::TempScale { x: t[0], scale, floor }).single()
        })
    }

    /// `cap · tanh(x / cap)` elementwise (Gemma 2's final logits; [`Op::Softcap`]).
    pub fn softcap(&mut self, x: &Bundle, cap: f32) -> Bundle {
        self.zip(&[x], |b, t| {
            b.check_src(t[0]);
            let ne = b.t(t[0]).ne;
            b.node(ne, DType::F32, Op::Softcap { x: t[0], cap }).single()
        })
    }

    /// `x · sigmoid(g)` with `g` one value per row: `[ne0, rows]`, `[1, rows]` → `[ne0, rows]`.
    pub fn sigmoid_mul(&mut self, x: &Bundle, g: &Bundle) -> Bundle {
        let (x, g) = (x.single(), g.single());
        self.check_src(x);
        self.check_src(g);
        let (nx, ng) = (self.t(x).ne, self.t(g).ne);
        assert!(ng[0] == 1 && ng[1] == nx[1], "sigmoid_mul shapes {nx:?} {ng:?}");
        self.node(nx, DType::F32, Op::SigmoidMul { x, g })
    }

    pub fn glu(&mut self, gate: &Bundle, up: &Bundle, kind: Glu) -> Bundle {
        self.zip(&[gate, up], |b, t| {
            let (gate, up) = (t[0], t[1]);
            b.check_src(gate);
            b.check_src(up);
            let ne = b.t(gate).ne;
            assert_eq!(ne, b.t(up).ne, "glu shapes");
            b.node(ne, DType::F32, Op::Glu { gate, up, kind }).single()
        })
    }
}
