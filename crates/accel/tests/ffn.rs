//! The accelerator's hot-neuron FFN against the same computation in f64 on the CPU from the
//! same values: gate and up rows of the hot neurons as stored, down columns as the Q8_0 rows
//! the accelerator holds (neuron-major), the CPU's firing rule; before and after groups of
//! rows are replaced (online balancing's loads).

use corelm_accel::{down_neuron_major, gather_rows, FileMatrix, Gpu, HotFfn, HotLayer};
use corelm_core::Glu;
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

struct Model {
    n_embd: usize,
    n_ff: usize,
    gate: Vec<u8>,
    up: Vec<u8>,
    down: Vec<u8>,
}

impl Model {
    fn matrices(&self) -> [FileMatrix<'_>; 3] {
        let (n_embd, n_ff) = (self.n_embd, self.n_ff);
        [
            FileMatrix { dtype: DType::Q4K, rows: n_ff, cols: n_embd, bytes: &self.gate },
            FileMatrix { dtype: DType::Q4_1, rows: n_ff, cols: n_embd, bytes: &self.up },
            FileMatrix { dtype: DType::Q6K, rows: n_embd, cols: n_ff, bytes: &self.down },
        ]
    }

    /// The accelerator's output for `x` against f64 from the values it holds, `rows[i]` the
    /// neuron in row `i` (`None`: an empty row). Returns how many neurons fired.
    fn check(&self, ffn: &HotFfn, l: usize, rows: &[Option<u32>], kind: Glu, thr: f32, x: &[f32]) -> usize {
        let (n_embd, n_ff) = (self.n_embd, self.n_ff);
        let n_tok = x.len() / n_embd;
        let mut y = vec![0f32; n_tok * n_embd];
        ffn.submit(l, x, kind, thr);
        ffn.wait(l, &mut y).unwrap();
        let (g, u) = (dequant(DType::Q4K, &self.gate, n_embd), dequant(DType::Q4_1, &self.up, n_embd));
        let neurons: Vec<u32> = rows.iter().flatten().copied().collect();
        // The down columns as the accelerator holds them: a Q8_0 row per neuron.
        let cols = dequant(DType::Q8_0, &down_neuron_major(&self.matrices()[2], &neurons), n_embd);
        let mut fired = 0;
        for t in 0..n_tok {
            let xr = &x[t * n_embd..(t + 1) * n_embd];
            let dot = |m: &[f32], r: usize| m[r * n_embd..(r + 1) * n_embd].iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>();
            let h: Vec<f64> = neurons
                .iter()
                .map(|&n| {
                    assert!((n as usize) < n_ff);
                    let gv = dot(&g, n as usize);
                    let a = match kind {
                        Glu::Silu => gv / (1.0 + (-gv).exp()),
                        Glu::GeluTanh => 0.5 * gv * (1.0 + (0.7978845608028654 * gv * (1.0 + 0.044715 * gv * gv)).tanh()),
                        Glu::SwigluOai => unreachable!("not offloaded"),
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
                let terms = || (0..neurons.len()).map(|i| cols[i * n_embd + o] as f64 * h[i]);
                let (want, scale) = (terms().sum::<f64>(), terms().map(f64::abs).sum::<f64>());
                let got = y[t * n_embd + o] as f64;
                assert!((got - want).abs() <= 1e-4 * scale + 1e-6, "{kind:?} layer {l} token {t} out {o}: {got} vs {want}");
            }
        }
        fired
    }
}

#[test]
fn hot_ffn_matches_the_cpu_computation() {
    let gpu = Arc::new(Gpu::open().expect("an accelerator (CI: Mesa lavapipe)"));
    let (n_embd, n_ff, n_tok) = (256, 1280, 9);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let m = Model {
        n_embd,
        n_ff,
        gate: quantized(DType::Q4K, n_ff, n_embd, &mut rng),
        up: quantized(DType::Q4_1, n_ff, n_embd, &mut rng),
        down: quantized(DType::Q6K, n_embd, n_ff, &mut rng),
    };
    // Layer 0: all 1280 neurons (three neuron ranges in the down product), every one firing.
    // Layer 1: every third neuron, 96 of them, in 128 rows (the last 32 empty).
    let hot1: Vec<u32> = (0..96).map(|i| i * 3 + 1).collect();
    let all: Vec<u32> = (0..n_ff as u32).collect();
    let [gate, up, down] = m.matrices();
    let (down0, down1) = (down_neuron_major(&down, &all), down_neuron_major(&down, &hot1));
    let layer = |l, capacity, neurons, down| HotLayer { layer: l, capacity, neurons, gate, up, down };
    let ffn = HotFfn::new(gpu, 2, n_embd, 70, &[layer(0, n_ff, &all[..], &down0[..]), layer(1, 128, &hot1[..], &down1[..])]).unwrap();
    assert_eq!(ffn.hot_counts(), vec![1280, 128]);
    let mut x = || (0..n_tok * n_embd).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect::<Vec<f32>>();
    let mut rows1: Vec<Option<u32>> = hot1.iter().map(|&n| Some(n)).chain([None; 32]).collect();
    for kind in [Glu::Silu, Glu::GeluTanh] {
        let all_rows: Vec<Option<u32>> = all.iter().map(|&n| Some(n)).collect();
        assert_eq!(m.check(&ffn, 0, &all_rows, kind, -1.0, &x()), n_tok * n_ff);
        let fired = m.check(&ffn, 1, &rows1, kind, 0.02, &x());
        // The threshold lets some neurons fire and not others.
        assert!(fired > 0 && fired < n_tok * hot1.len(), "{fired} fired");
    }
    // A prompt's batch of 70 tokens (two 64-token tiles): the tiled gate, up and down.
    const { assert!(70 >= corelm_accel::GEMM_MIN_TOKENS) };
    let mut rng70 = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let x70: Vec<f32> = (0..70 * n_embd).map(|_| rng70.random::<f32>() * 2.0 - 1.0).collect();
    let all_rows: Vec<Option<u32>> = all.iter().map(|&n| Some(n)).collect();
    assert_eq!(m.check(&ffn, 0, &all_rows, Glu::Silu, -1.0, &x70), 70 * n_ff);
    let fired = m.check(&ffn, 1, &rows1, Glu::GeluTanh, 0.02, &x70);
    assert!(fired > 0 && fired < 70 * hot1.len(), "{fired} fired");
    // Online balancing's loads: neurons 0, 3, 6, ... into the empty rows 96..128, then
    // neurons 2, 5, 8, ... over rows 32..64; each pass after a load computes the new rows.
    let load = |row0: usize, neurons: &[u32]| {
        let (mut g, mut u) = (Vec::new(), Vec::new());
        gather_rows(&gate, neurons, &mut g);
        gather_rows(&up, neurons, &mut u);
        ffn.load(1, row0, &g, &u, &down_neuron_major(&down, neurons))
    };
    let a: Vec<u32> = (0..32).map(|i| i * 3).collect();
    let bytes = load(96, &a);
    assert_eq!(bytes as usize, 32 * (gate.row_bytes() + up.row_bytes() + corelm_kernels::row_bytes(DType::Q8_0, n_embd)));
    rows1[96..].iter_mut().zip(&a).for_each(|(r, &n)| *r = Some(n));
    assert!(m.check(&ffn, 1, &rows1, Glu::Silu, 0.02, &x()) > 0);
    let b: Vec<u32> = (0..32).map(|i| i * 3 + 2).collect();
    load(32, &b);
    rows1[32..64].iter_mut().zip(&b).for_each(|(r, &n)| *r = Some(n));
    assert_eq!(m.check(&ffn, 1, &rows1, Glu::GeluTanh, -1.0, &x()), n_tok * 128);
    // Batch-invariant (a server's): the 70-token batch's first 9 rows are, bit for bit, those
    // of the 9 tokens alone (without it, the batch takes the tiled products, summed otherwise).
    ffn.set_batch_invariant();
    let run = |x: &[f32]| {
        let mut y = vec![0f32; x.len()];
        ffn.submit(0, x, Glu::Silu, -1.0);
        ffn.wait(0, &mut y).unwrap();
        y
    };
    assert_eq!(run(&x70)[..9 * n_embd], run(&x70[..9 * n_embd])[..], "a token's outputs depend on its batch");
}
