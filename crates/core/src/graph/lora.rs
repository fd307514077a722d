//! LoRA adapters in the graph, as llama.cpp's `build_lora_mm` builds them: a matrix an
//! adapter pairs becomes `y = W·x`, then for each adapter in turn `y = y + s · B·(A·x)` — the
//! rank-`r` product `A·x` (`[n_tokens, r]`), its product with `B` (`[n_tokens, n_out]`), and
//! `y + s·(B·A·x)` in one pass (`Op::AddScaled`: ggml's scale node then its add, same bits). `s` is the adapter's scale times `alpha / r`, or the scale alone
//! where the adapter has no alpha. The adapters' matrices are plain rows in their own buffer
//! (`Storage::Adapter`), multiplied by the table's kernels for their type like any weight, so
//! `W·x` is the node it was without adapters and a graph without them is unchanged.
//!
//! Invariant: a pair is applied only to a matrix of its full shape (`a` `[n_in, r]` where `W`
//! is `[n_in, n_out]`, `b` `[r, n_out]`); the engine refuses adapters a graph left out (a
//! fused or expert tensor), so none is dropped silently.

use super::Builder;
use crate::tensor::{Bundle, Op, Storage, WeightRef};
use corelm_kernels::DType;
use std::collections::HashMap;
use std::sync::Arc;

/// One adapter matrix: its type, shape `[row length, rows]` and byte offset in the adapter
/// buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdapterMatrix {
    pub dtype: DType,
    pub ne: [usize; 2],
    pub offset: usize,
}

impl AdapterMatrix {
    pub fn n_bytes(&self) -> usize {
        corelm_kernels::row_bytes(self.dtype, self.ne[0]) * self.ne[1]
    }
}

/// One adapter's low-rank pair for one matrix, and the factor its product is scaled by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraPair {
    /// `[n_in, r]`.
    pub a: AdapterMatrix,
    /// `[r, n_out]`.
    pub b: AdapterMatrix,
    pub scale: f32,
}

/// The adapters a graph applies: per weight name (`blk.0.attn_q.weight`), its pairs in
/// adapter order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lora {
    pub pairs: HashMap<String, Vec<LoraPair>>,
}

impl Builder<'_> {
    /// Apply `lora`'s adapters to the matrices built after this.
    pub fn with_lora(mut self, lora: Option<Arc<Lora>>) -> Self {
        self.lora = lora;
        self
    }

    /// `y`, the product `w · x` just built, plus each adapter's `s · B·(A·x)` for `w`
    /// (`[n_tokens, n_out]`); `y` itself where no adapter pairs `w`. Serial graphs only.
    pub fn lora(&mut self, w: &WeightRef, x: &Bundle, y: Bundle) -> Bundle {
        let Some(pairs) = self.lora.as_ref().and_then(|l| l.pairs.get(&w.name)).cloned() else {
            return y;
        };
        let mut y = y;
        for p in pairs.iter().filter(|p| p.a.ne[0] == w.ne[0] && p.b.ne[1] == w.ne[1]) {
            let (a, b) = (self.adapter(&p.a), self.adapter(&p.b));
            let t = self.matmul(&a, x); // [n_tokens, r]
            let u = self.matmul(&b, &t); // [n_tokens, n_out]
            y = self.add_scaled(&y, &u, p.scale);
        }
        y
    }

    /// `y + u · s` (`Op::AddScaled`: ggml's scale, then its add, in one pass).
    fn add_scaled(&mut self, y: &Bundle, u: &Bundle, s: f32) -> Bundle {
        self.zip(&[y, u], |bl, t| {
            let (a, b) = (t[0], t[1]);
            bl.check_src(a);
            bl.check_src(b);
            assert_eq!(bl.t(a).ne, bl.t(b).ne, "a LoRA term's shape");
            bl.node(bl.t(a).ne, DType::F32, Op::AddScaled { a, b, s }).single()
        })
    }

    fn adapter(&mut self, m: &AdapterMatrix) -> Bundle {
        Bundle::one(self.leaf(m.ne, m.dtype, Storage::Adapter { offset: m.offset, len: m.n_bytes() }))
    }
}
