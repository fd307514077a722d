//! The accelerator's hot-neuron FFN against the same computation in f64 on the CPU from the
//! same values: gate and up rows of the hot neurons as stored, down columns as the Q8_0 rows
//! the accelerator holds, the CPU's firing rule.

use corelm_accel::{FileMatrix, Gpu, HotFfn, HotLayer};
use corelm_core::{Glu, Offload};
use corelm_kernels::{quant::reference::quantizer, DType, Kernels};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn quantized(t: DType, rows: usize, cols: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<u8> {
    let rb = corelm_kernels::row_bytes(t, cols);
    let mut out = vec![0u8; rows * rb];
    let mut f = vec![0f32; cols];
    for row in out.chunks_exact_mut(rb) {
        f.iter_mut().for_each(|v| *v = (rng.random::<f32>() - 0.5) * 0.2);
        quantizer(t).unwrap()(&f, row);
    }
    out
}

fn dequant(t: DType, bytes: &[u8], cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / corelm_kernels::row_bytes(t, cols) * cols];
    let f = Kernels::portable().to_float(t).unwrap();
    for (r, o) in out.chunks_exact_mut(cols).enumerate() {
        let rb = corelm_kernels::row_bytes(t, cols);
        f(&bytes[r * rb..(r + 1) * rb], o);
    }
    out
}

#[test]
fn hot_ffn_matches_the_cpu_computation() {
    let gpu = Arc::new(Gpu::open().expect("an accelerator (CI: Mesa lavapipe)"));
    let (n_embd, n_ff, n_tok) = (256, 320, 3);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let gate = quantized(DType::Q4K, n_ff, n_embd, &mut rng);
    let up = quantized(DType::Q4_1, n_ff, n_embd, &mut rng);
    let down = quantized(DType::Q6K, n_embd, n_ff, &mut rng);
    // Hot: every third neuron, 96 of them (layer 1); layer 0 all 320 with every neuron firing.
    let hot1: Vec<u32> = (0..96).map(|i| i * 3 + 1).collect();
    let all: Vec<u32> = (0..n_ff as u32).collect();
    let layer = |l, neurons| HotLayer {
        layer: l,
        neurons,
        gate: FileMatrix { dtype: DType::Q4K, rows: n_ff, cols: n_embd, bytes: &gate },
        up: FileMatrix { dtype: DType::Q4_1, rows: n_ff, cols: n_embd, bytes: &up },
        down: FileMatrix { dtype: DType::Q6K, rows: n_embd, cols: n_ff, bytes: &down },
    };
    let ffn = HotFfn::new(gpu, 2, n_embd, 4, &[layer(0, &all[..]), layer(1, &hot1[..])]).unwrap();
    assert_eq!(ffn.hot_counts(), vec![320, 96]);
    let (g, u, d) = (dequant(DType::Q4K, &gate, n_embd), dequant(DType::Q4_1, &up, n_embd), dequant(DType::Q6K, &down, n_ff));
    for kind in [Glu::Silu, Glu::GeluTanh] {
        for (l, neurons, thr) in [(0usize, &all, -1.0f32), (1, &hot1, 0.02)] {
            let x: Vec<f32> = (0..n_tok * n_embd).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
            let mut y = vec![0f32; n_tok * n_embd];
            ffn.begin(l, &x, kind, thr);
            ffn.finish(l, &mut y);
            // The down columns as the accelerator holds them: Q8_0 rows over the hot neurons.
            let mut cols = vec![0f32; n_embd * neurons.len()];
            for o in 0..n_embd {
                let sel: Vec<f32> = neurons.iter().map(|&n| d[o * n_ff + n as usize]).collect();
                let mut q = vec![0u8; corelm_kernels::row_bytes(DType::Q8_0, sel.len())];
                quantizer(DType::Q8_0).unwrap()(&sel, &mut q);
                cols[o * neurons.len()..(o + 1) * neurons.len()].copy_from_slice(&dequant(DType::Q8_0, &q, sel.len()));
            }
            let mut fired = 0;
            for t in 0..n_tok {
                let xr = &x[t * n_embd..(t + 1) * n_embd];
                let dot = |m: &[f32], r: usize| m[r * n_embd..(r + 1) * n_embd].iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>();
                let h: Vec<f64> = neurons
                    .iter()
                    .map(|&n| {
                        let gv = dot(&g, n as usize);
                        let a = match kind {
                            Glu::Silu => gv / (1.0 + (-gv).exp()),
                            Glu::GeluTanh => 0.5 * gv * (1.0 + (0.7978845608028654 * gv * (1.0 + 0.044715 * gv * gv)).tanh()),
                        };
                        // Neurons within 1e-4 of the threshold may go either way in f32.
                        if (a.abs() - thr as f64).abs() < 1e-4 {
                            return f64::NAN;
                        }
                        if a.abs() > thr as f64 {
                            fired += 1;
                            a * dot(&u, n as usize)
                        } else {
                            0.0
                        }
                    })
                    .collect();
                if h.iter().any(|v| v.is_nan()) {
                    continue;
                }
                for o in 0..n_embd {
                    let row = &cols[o * neurons.len()..(o + 1) * neurons.len()];
                    let want: f64 = row.iter().zip(&h).map(|(&w, &a)| w as f64 * a).sum();
                    let scale: f64 = row.iter().zip(&h).map(|(&w, &a)| (w as f64 * a).abs()).sum();
                    let got = y[t * n_embd + o] as f64;
                    assert!((got - want).abs() <= 1e-4 * scale + 1e-6, "{kind:?} layer {l} token {t} out {o}: {got} vs {want}");
                }
            }
            // Layer 1's threshold lets some neurons fire and not others.
            assert!(fired > 0 && (l == 0 || fired < n_tok * neurons.len()), "layer {l}: {fired} fired");
        }
    }
}
