//! KAIROX's second device in the engine (`--accel-mem`): which FFN neurons the accelerator
//! holds under a memory budget, and its part of each layer (`corelm_accel::HotFfn`, run
//! through `corelm_core::Offload` nodes while the CPU computes the other neurons).
//!
//! Choice: every neuron of every dense FFN layer costs its gate and up rows (the file's bytes)
//! plus its down column as Q8_0; neurons are taken by firing frequency (the calibration's, at
//! the level nearest the `--sparsity` target), most frequent first, until the budget is spent,
//! and each layer's count is then rounded down to a multiple of 32. Without frequencies every
//! neuron scores the same and whole layers go first to last. That choice is made once at load
//! (`--accel-policy static`, run by [`Static`]); the online policies ([`crate::balance`])
//! start from [`choose_groups`] instead: every layer an equal number of groups, the most
//! frequent first.
//!
//! A device lost mid-run loses nothing: both keep each layer's FFN input, and when a read-back
//! fails the device's part of that layer comes from the CPU ([`device_part_on_cpu`]), as do
//! all of its parts from then on.

use crate::balance::{BalanceConfig, Policy};
use crate::Error;
use corelm_accel::{down_neuron_major, FileMatrix, Gpu, HotFfn, HotLayer};
use corelm_core::{sched::gate_activation, Glu, Offload};
use corelm_gguf::{Gguf, TensorInfo};
use corelm_kernels::{DType, Kernels};
use std::sync::{Arc, Mutex};

/// `--accel-mem` and what chooses the hot neurons.
#[derive(Clone, Debug)]
pub struct AccelConfig {
    /// Bytes of FFN weights the accelerator may hold.
    pub mem: u64,
    /// `[layer][neuron]` firing frequencies (a calibration's); `None`: all alike.
    pub freq: Option<Vec<Vec<f32>>>,
    /// How the hot neurons change as the run goes (`--accel-policy`; static: never).
    pub balance: BalanceConfig,
    /// `[layer]`: the neurons in groups of `balance.group` that fire together (a
    /// calibration's co-activation groups, `crate::coact`); `None`: by firing frequency.
    pub groups: Option<Vec<Vec<u32>>>,
}

impl AccelConfig {
    /// A budget of `mem` bytes, no frequencies, the static policy.
    pub fn new(mem: u64) -> Self {
        AccelConfig { mem, freq: None, balance: BalanceConfig::new(Policy::Static), groups: None }
    }
}

/// One layer's FFN matrices in the file: gate, up (`[n_ff rows, n_embd]`) and down.
pub(crate) struct Ffn<'a> {
    pub gate: &'a TensorInfo,
    pub up: &'a TensorInfo,
    pub down: &'a TensorInfo,
}

pub(crate) fn ffn_of(gguf: &Gguf, layer: usize) -> Result<Ffn<'_>, Error> {
    let t = |w: &str| {
        let name = format!("blk.{layer}.ffn_{w}.weight");
        gguf.tensor(&name).ok_or_else(|| Error::Config(format!("--accel-mem offloads dense FFN layers; the model has no {name}")))
    };
    Ok(Ffn { gate: t("gate")?, up: t("up")?, down: t("down")? })
}

pub(crate) fn file_matrix<'a>(gguf: &'a Gguf, t: &TensorInfo) -> FileMatrix<'a> {
    FileMatrix { dtype: t.dtype, rows: t.shape[1] as usize, cols: t.shape[0] as usize, bytes: gguf.tensor_data(t) }
}

/// Bytes one neuron of `f` costs on the accelerator.
fn neuron_bytes(f: &Ffn) -> u64 {
    let n_embd = f.gate.shape[0] as usize;
    let row = |t: &TensorInfo| corelm_kernels::row_bytes(t.dtype, n_embd) as u64;
    row(f.gate) + row(f.up) + corelm_kernels::row_bytes(DType::Q8_0, n_embd) as u64
}

/// The hot neurons of each layer (sorted, a multiple of 32 each) for a budget of `mem` bytes,
/// neurons costing `cost[layer]` each, scored by `freq` (all alike without it).
pub fn choose(cost: &[u64], n_ff: usize, mem: u64, freq: Option<&[Vec<f32>]>) -> Vec<Vec<u32>> {
    let score = |l: usize, n: usize| freq.and_then(|f| f.get(l)?.get(n).copied()).unwrap_or(1.0);
    let mut all: Vec<(usize, u32)> = (0..cost.len()).flat_map(|l| (0..n_ff as u32).map(move |n| (l, n))).collect();
    // Most frequent first; ties by layer, then neuron (whole layers in order without scores).
    all.sort_by(|a, b| score(b.0, b.1 as usize).total_cmp(&score(a.0, a.1 as usize)).then(a.cmp(b)));
    let mut hot: Vec<Vec<u32>> = vec![Vec::new(); cost.len()];
    let mut left = mem;
    for (l, n) in all {
        if cost[l] <= left {
            left -= cost[l];
            hot[l].push(n);
        }
    }
    for h in &mut hot {
        // `h` is in score order: drop the least frequent down to a multiple of 32.
        h.truncate(h.len() / 32 * 32);
        h.sort_unstable();
    }
    hot
}

/// Each layer's neurons in groups for the online policies: by firing frequency, most frequent
/// first (group 0 the `group` hottest neurons, ...), so a group's neurons fire alike; without
/// frequencies, in index order.
pub fn neuron_groups(n_layer: usize, n_ff: usize, freq: Option<&[Vec<f32>]>) -> Vec<Vec<u32>> {
    (0..n_layer)
        .map(|l| {
            let mut order: Vec<u32> = (0..n_ff as u32).collect();
            if let Some(f) = freq.and_then(|f| f.get(l)) {
                order.sort_by(|&a, &b| f[b as usize].total_cmp(&f[a as usize]).then(a.cmp(&b)));
            }
            order
        })
        .collect()
}

/// The starting groups of each layer for the online policies (`members[l]`: layer `l`'s
/// neurons, cut into groups of `group`): every layer the same number of groups (the budget's
/// leftover one more each in layer order), those of highest firing frequency first (without
/// frequencies, in order).
pub fn choose_groups(cost: &[u64], n_ff: usize, mem: u64, freq: Option<&[Vec<f32>]>, members: &[Vec<u32>], group: usize) -> Vec<Vec<u32>> {
    let n_groups = n_ff / group;
    let per_round: u64 = cost.iter().map(|c| c * group as u64).sum();
    let k = (mem / per_round.max(1)).min(n_groups as u64) as usize;
    let mut left = mem - k as u64 * per_round;
    (0..cost.len())
        .map(|l| {
            let mut count = k;
            let one = cost[l] * group as u64;
            if k < n_groups && one <= left {
                left -= one;
                count += 1;
            }
            let score = |g: u32| freq.and_then(|f| f.get(l)).map_or(0.0, |f| members[l][g as usize * group..][..group].iter().map(|&n| f[n as usize]).sum::<f32>());
            let mut order: Vec<u32> = (0..n_groups as u32).collect();
            order.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
            order.truncate(count);
            order
        })
        .collect()
}

/// Each layer's down columns of its `hot` neurons, neuron-major Q8_0 (empty where none).
fn down_columns(gguf: &Gguf, hot: &[Vec<u32>]) -> Result<Vec<Vec<u8>>, Error> {
    let mut down = Vec::with_capacity(hot.len());
    for (l, h) in hot.iter().enumerate() {
        down.push(if h.is_empty() { Vec::new() } else { down_neuron_major(&file_matrix(gguf, ffn_of(gguf, l)?.down), h) });
    }
    Ok(down)
}

/// The device's part of one layer on the CPU, as the device computes it: for each (neuron
/// `n`, its row `d` of the neuron-major Q8_0 `down`) of `neurons`, f32 gate and up products
/// over the file's rows `n` of `gate` and `up`, the firing rule `|act(g)| > thr`, and `h ·
/// down[d]` added up; `xs`: the layer's input (`[≥ n_tokens × n_embd]`), `y` (`[n_tokens ×
/// n_embd]`) overwritten, `row`: `n_embd` f32 of scratch. Portable and one-threaded: the
/// fallback of a lost device, not a fast path.
#[allow(clippy::too_many_arguments)]
pub(crate) fn device_part_on_cpu(m: [&FileMatrix; 3], neurons: impl Iterator<Item = (usize, usize)> + Clone, kind: Glu, thr: f32, xs: &[f32], y: &mut [f32], row: &mut [f32]) {
    let portable = Kernels::portable();
    let [gate, up, down] = m;
    let [to_gate, to_up, to_down] = [gate, up, down].map(|m| portable.to_float(m.dtype).expect("a model weight type"));
    let [grb, urb, drb] = [gate, up, down].map(FileMatrix::row_bytes);
    let n_embd = row.len();
    let dot = |to: fn(&[u8], &mut [f32]), bytes: &[u8], row: &mut [f32], x: &[f32]| -> f32 {
        to(bytes, row);
        row.iter().zip(x).map(|(&w, &v)| w * v).sum()
    };
    y.fill(0.0);
    for (yt, xt) in y.chunks_exact_mut(n_embd).zip(xs.chunks_exact(n_embd)) {
        for (n, d) in neurons.clone() {
            let g = dot(to_gate, &gate.bytes[n * grb..][..grb], row, xt);
            let mut a = [0f32];
            gate_activation(&portable, kind, &[g], &[1.0], &mut a);
            if a[0].abs() <= thr {
                continue;
            }
            let h = a[0] * dot(to_up, &up.bytes[n * urb..][..urb], row, xt);
            to_down(&down.bytes[d * drb..][..drb], row);
            yt.iter_mut().zip(row.iter()).for_each(|(o, &v)| *o += h * v);
        }
    }
}

/// The accelerator under `--accel-policy static`: the hot neurons chosen at load stay on the
/// device; the graph's CPU nodes leave them out. If the device is lost, their part of every
/// layer is computed on the CPU from then on ([`device_part_on_cpu`]; slow, but nothing
/// running is lost).
pub struct Static {
    ffn: Arc<HotFfn>,
    gguf: Arc<Gguf>,
    /// `[layer]`: its hot neurons and their down columns (the fallback's), if any.
    layers: Vec<Option<(Vec<u32>, Vec<u8>)>>,
    n_embd: usize,
    state: Mutex<StaticState>,
}

struct StaticState {
    /// Per layer, the firing rule of its last `begin`.
    glu: Vec<(Glu, f32)>,
    /// The FFN input of the last `begin` (`[max_tokens × n_embd]`).
    x: Vec<f32>,
    row: Vec<f32>,
}

impl Static {
    /// Open the accelerator with `gguf`'s hot neurons `hot` (per layer, as [`choose`] picks
    /// them), for batches of up to `max_tokens`.
    pub fn open(gguf: Arc<Gguf>, hot: &[Vec<u32>], n_embd: usize, max_tokens: usize) -> Result<Static, Error> {
        let down = down_columns(&gguf, hot)?;
        let ffn = upload(&gguf, hot, &down, n_embd, max_tokens)?;
        let layers = hot.iter().zip(down).map(|(h, d)| (!h.is_empty()).then(|| (h.clone(), d))).collect();
        let state = StaticState { glu: vec![(Glu::Silu, 0.0); hot.len()], x: vec![0.0; max_tokens * n_embd], row: vec![0.0; n_embd] };
        Ok(Static { ffn, gguf, layers, n_embd, state: Mutex::new(state) })
    }

    pub fn ffn(&self) -> &Arc<HotFfn> {
        &self.ffn
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StaticState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fallback(&self, s: &mut StaticState, layer: usize, y: &mut [f32]) {
        let (hot, down) = self.layers[layer].as_ref().expect("an offloaded layer");
        let f = ffn_of(&self.gguf, layer).expect("checked at open");
        let (gate, up) = (file_matrix(&self.gguf, f.gate), file_matrix(&self.gguf, f.up));
        let down = FileMatrix { dtype: DType::Q8_0, rows: hot.len(), cols: self.n_embd, bytes: down };
        let (kind, thr) = s.glu[layer];
        device_part_on_cpu([&gate, &up, &down], hot.iter().enumerate().map(|(d, &n)| (n as usize, d)), kind, thr, &s.x, y, &mut s.row);
    }
}

impl Offload for Static {
    fn begin(&self, layer: usize, x: &[f32], kind: Glu, thr: f32) {
        let mut s = self.lock();
        s.glu[layer] = (kind, thr);
        s.x[..x.len()].copy_from_slice(x);
        drop(s);
        if !self.ffn.failed() {
            self.ffn.submit(layer, x, kind, thr);
        }
    }

    fn finish(&self, layer: usize, y: &mut [f32]) {
        // Once a read-back failed, the device is not asked again (`failed` stays set).
        if self.ffn.failed() || self.ffn.wait(layer, y).is_err() {
            self.fallback(&mut self.lock(), layer, y);
        }
    }
}

/// Open the accelerator and upload the hot neurons `hot` of `gguf`'s layers (row `i` of a
/// layer holds `hot[l][i]`) with their down columns `down[l]` (as [`down_neuron_major`] makes
/// them), for batches of up to `max_tokens`.
pub(crate) fn upload(gguf: &Gguf, hot: &[Vec<u32>], down: &[Vec<u8>], n_embd: usize, max_tokens: usize) -> Result<Arc<HotFfn>, Error> {
    let gpu = Arc::new(Gpu::open().map_err(|e| Error::Config(e.to_string()))?);
    let ffns: Vec<Ffn> = (0..hot.len()).map(|l| ffn_of(gguf, l)).collect::<Result<_, _>>()?;
    let layers: Vec<HotLayer> = hot
        .iter()
        .enumerate()
        .filter(|(_, h)| !h.is_empty())
        .map(|(l, h)| HotLayer {
            layer: l,
            capacity: h.len(),
            neurons: h,
            gate: file_matrix(gguf, ffns[l].gate),
            up: file_matrix(gguf, ffns[l].up),
            down: &down[l],
        })
        .collect();
    let ffn = HotFfn::new(gpu, hot.len(), n_embd, max_tokens, &layers).map_err(|e| Error::Config(e.to_string()))?;
    Ok(Arc::new(ffn))
}

/// The per-neuron cost of each layer of `gguf` (`n_layer` dense FFN layers) and their width.
pub fn costs(gguf: &Gguf, n_layer: usize) -> Result<(Vec<u64>, usize), Error> {
    let ffns: Vec<Ffn> = (0..n_layer).map(|l| ffn_of(gguf, l)).collect::<Result<_, _>>()?;
    let n_ff = ffns.first().map_or(0, |f| f.gate.shape[1] as usize);
    Ok((ffns.iter().map(neuron_bytes).collect(), n_ff))
}

#[cfg(test)]
mod tests {
    use super::choose;

    #[test]
    fn hot_neurons_by_frequency_within_the_budget() {
        // Two layers of 64 neurons at 10 bytes each.
        let freq = vec![(0..64).map(|n| n as f32 / 64.0).collect::<Vec<f32>>(), vec![0.5; 64]];
        let hot = choose(&[10, 10], 64, 10 * 70, Some(&freq));
        // 70 neurons fit: layer 0's 32 above 0.5 (n = 33..63: 31, plus n = 32 at 0.5), then
        // ties at 0.5 by layer (layer 0 first), then neuron; each rounded down to 32.
        let total: usize = hot.iter().map(Vec::len).sum();
        assert!(total <= 70 && hot.iter().all(|h| h.len() % 32 == 0));
        assert_eq!(hot[0], (32..64).collect::<Vec<u32>>());
        assert_eq!(hot[1], (0..32).collect::<Vec<u32>>());
        // Without frequencies: whole layers, first to last.
        let hot = choose(&[10, 10], 64, 10 * 100, None);
        assert_eq!((hot[0].len(), hot[1].len()), (64, 32));
        // A budget below one group of 32 offloads nothing.
        assert!(choose(&[10, 10], 64, 310, None).iter().all(Vec::is_empty));
    }

    #[test]
    fn online_policies_start_with_equal_shares_of_the_most_frequent_groups() {
        use super::{choose_groups, neuron_groups};
        // Three layers of 256 neurons (4 groups of 64) at 1 byte each: 64 bytes a group.
        let freq: Vec<Vec<f32>> = (0..3).map(|l| (0..256).map(|n| ((n / 64 + l) % 4) as f32).collect()).collect();
        // 7 groups' worth: 2 each, the 7th to layer 0. In index order, groups are ranked by
        // their frequency; grouped by frequency, the first groups are the hottest.
        let plain = neuron_groups(3, 256, None);
        let g = choose_groups(&[1, 1, 1], 256, 7 * 64, Some(&freq), &plain, 64);
        assert_eq!(g, vec![vec![3, 2, 1], vec![2, 1], vec![1, 0]]);
        let by_freq = neuron_groups(3, 256, Some(&freq));
        assert_eq!(&by_freq[1][..64], &(128..192).collect::<Vec<u32>>()[..]);
        let g = choose_groups(&[1, 1, 1], 256, 7 * 64, Some(&freq), &by_freq, 64);
        assert_eq!(g, vec![vec![0, 1, 2], vec![0, 1], vec![0, 1]]);
        // Without frequencies, in order; a budget over the whole FFN holds every group once.
        assert_eq!(choose_groups(&[1, 1, 1], 256, 64, None, &plain, 64), vec![vec![0], vec![], vec![]]);
        assert!(choose_groups(&[1, 1, 1], 256, 1 << 20, None, &plain, 64).iter().all(|v| v.len() == 4));
    }
}
