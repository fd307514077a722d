//! The accelerator under online balancing: the engine's `Offload`, which runs the hot part
//! of each layer on [`HotFfn`], keeps the residency masks the CPU's sparse nodes read, and
//! carries out the [`Balancer`]'s moves.

use super::policy::{BalanceConfig, Balancer, Move, Policy};
use crate::offload::{device_part_on_cpu, ffn_of, file_matrix};
use corelm_accel::{gather_rows, FileMatrix, HotFfn};
use corelm_core::{sched::gate_activation, Glu, Offload};
use corelm_gguf::Gguf;
use corelm_kernels::{DType, Kernels};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What balancing did so far (`corelm bench` prints it; the ablation compares policies).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BalanceStats {
    /// Passes of the model (a decode token, or a prompt batch).
    pub passes: u64,
    /// Groups loaded, and their bytes (gate + up rows, down column).
    pub loads: u64,
    pub load_bytes: u64,
    /// Firing neurons computed on the device, and in all (the device's hit rate).
    pub fired_device: u64,
    pub fired: u64,
    /// Seconds issuing loads and waiting on layers whose submission carried them.
    pub load_secs: f64,
    /// Seconds the CPU waited for the device at all.
    pub wait_secs: f64,
    /// Seconds observing activity and choosing moves.
    pub policy_secs: f64,
    /// The decay at the end (moves under the adaptive policy).
    pub lambda: f32,
    /// The device was lost: its part of that pass came from the CPU, and the CPU computes
    /// every neuron since.
    pub device_lost: bool,
    /// Firing neurons that the best fixed set of groups in hindsight would have held: per
    /// layer, the groups that fired most over these passes, as many as its slots: what a
    /// static choice knowing these passes would reach (a policy beats it only by following
    /// changes within them).
    pub fired_best: u64,
}

impl BalanceStats {
    /// The share of firing neurons the device computed.
    pub fn hit_rate(&self) -> f64 {
        self.fired_device as f64 / self.fired.max(1) as f64
    }

    /// The hit rate of the best fixed set in hindsight ([`BalanceStats::fired_best`]).
    pub fn best_hit_rate(&self) -> f64 {
        self.fired_best as f64 / self.fired.max(1) as f64
    }
}

/// One offloaded layer's host side.
struct Layer {
    /// The neurons of each group: group `g` is `members[g·group ..][..group]`.
    members: Vec<u32>,
    /// The group of each neuron.
    group_of: Vec<u32>,
    /// The weights reordered at load so that each group is contiguous (KAIROX §5.2): gate and
    /// up rows as the file stores them, and down columns as neuron-major Q8_0 rows, row `p`
    /// of each being neuron `members[p]`'s. A move then writes three slices, no gather.
    rows: [Vec<u8>; 3],
    /// The gate's and up's types.
    types: [DType; 2],
    /// Bit `n`: neuron `n` is on the device.
    mask: Vec<AtomicU64>,
}

impl Layer {
    /// Group `g`'s rows (of `gs` neurons) in reordered matrix `k` (0 gate, 1 up, 2 down): one
    /// contiguous run.
    fn group_rows(&self, k: usize, g: u32, gs: usize) -> &[u8] {
        let rb = self.rows[k].len() / self.members.len();
        &self.rows[k][g as usize * gs * rb..][..gs * rb]
    }

    /// Mark group `g` (of `gs` neurons) on the device, or off it.
    fn set(&self, g: u32, gs: usize, on: bool) {
        for &n in &self.members[g as usize * gs..][..gs] {
            let (bit, w) = (1u64 << (n % 64), &self.mask[n as usize / 64]);
            if on {
                w.fetch_or(bit, Ordering::Relaxed);
            } else {
                w.fetch_and(!bit, Ordering::Relaxed);
            }
        }
    }
}

/// Mutable state, touched by worker 0 only (between barriers).
struct State {
    balancer: Balancer,
    /// The activation and threshold of each layer's current pass (from `begin`).
    glu: Vec<(Glu, f32)>,
    /// Layers whose next submission carries loads.
    loaded: Vec<bool>,
    act: Vec<f32>,
    ones: Vec<f32>,
    counts: Vec<u32>,
    activity: Vec<f32>,
    moves: Vec<Move>,
    /// Per offloaded layer, each group's firing neurons since the statistics were reset.
    fired_by_group: Vec<Vec<u64>>,
    stats: BalanceStats,
    /// The FFN input each layer's submission got (`[max_tokens × n_embd]`; the device-loss
    /// fallback recomputes the device's part from it).
    x: Vec<f32>,
    /// One dequantized row (the fallback).
    row: Vec<f32>,
    /// This pass so far: its start, load and wait seconds.
    pass_start: Option<Instant>,
    pass_load: f64,
    pass_wait: f64,
}

/// `HotFfn` with its neurons balanced online.
pub struct Online {
    ffn: Arc<HotFfn>,
    kernels: &'static Kernels,
    layers: Vec<Option<Layer>>,
    n_ff: usize,
    n_embd: usize,
    group: usize,
    /// The last offloaded layer: its `observe` ends a pass.
    last: usize,
    state: Mutex<State>,
}

impl Online {
    /// Open the accelerator for `gguf`'s FFN layers balanced under `cfg`, for batches of up
    /// to `max_tokens`: layer `l`'s groups are `members[l]` cut in runs of `cfg.group` (a
    /// permutation of its neurons), its slots starting with groups `initial[l]` (empty: not
    /// offloaded).
    pub fn new(gguf: Arc<Gguf>, kernels: &'static Kernels, cfg: BalanceConfig, max_tokens: usize, members: Vec<Vec<u32>>, initial: &[Vec<u32>]) -> Result<Online, crate::Error> {
        let group = cfg.group;
        let (mut n_ff, mut n_embd) = (0, 0);
        let mut layers = Vec::with_capacity(initial.len());
        // The starting rows and their down columns, uploaded below.
        let (mut rows, mut downs) = (Vec::with_capacity(initial.len()), Vec::with_capacity(initial.len()));
        for ((l, init), members) in initial.iter().enumerate().zip(members) {
            if init.is_empty() {
                layers.push(None);
                rows.push(Vec::new());
                downs.push(Vec::new());
                continue;
            }
            let f = ffn_of(&gguf, l)?;
            (n_embd, n_ff) = (f.gate.shape[0] as usize, f.gate.shape[1] as usize);
            assert!(group > 0 && n_ff % group == 0, "groups of {group} neurons dividing {n_ff}");
            let mut group_of = vec![u32::MAX; n_ff];
            for (i, &n) in members.iter().enumerate() {
                if let Some(g) = group_of.get_mut(n as usize) {
                    *g = (i / group) as u32;
                }
            }
            if members.len() != n_ff || group_of.contains(&u32::MAX) {
                return Err(crate::Error::Config(format!("layer {l}: the neuron groups are not a permutation of its {n_ff} neurons")));
            }
            let (mut gate, mut up) = (Vec::new(), Vec::new());
            gather_rows(&file_matrix(&gguf, f.gate), &members, &mut gate);
            gather_rows(&file_matrix(&gguf, f.up), &members, &mut up);
            let down = corelm_accel::down_neuron_major(&file_matrix(&gguf, f.down), &members);
            let layer = Layer {
                members,
                group_of,
                rows: [gate, up, down],
                types: [f.gate.dtype, f.up.dtype],
                mask: (0..n_ff.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            };
            init.iter().for_each(|&g| layer.set(g, group, true));
            let hot: Vec<u32> = init.iter().flat_map(|&g| layer.members[g as usize * group..][..group].iter().copied()).collect();
            let down: Vec<u8> = init.iter().flat_map(|&g| layer.group_rows(2, g, group)).copied().collect();
            rows.push(hot);
            downs.push(down);
            layers.push(Some(layer));
        }
        let ffn = crate::offload::upload(&gguf, &rows, &downs, n_embd, max_tokens)?;
        let last = layers.iter().rposition(Option::is_some).unwrap_or(0);
        let n_groups = n_ff / group.max(1);
        let state = State {
            balancer: Balancer::new(cfg, n_groups, initial),
            glu: vec![(Glu::Silu, 0.0); initial.len()],
            loaded: vec![false; initial.len()],
            act: vec![0.0; n_ff],
            ones: vec![1.0; n_ff],
            counts: vec![0; n_groups],
            activity: vec![0.0; n_groups],
            moves: Vec::with_capacity(n_groups),
            fired_by_group: initial.iter().map(|i| vec![0; if i.is_empty() { 0 } else { n_groups }]).collect(),
            stats: BalanceStats { lambda: cfg.lambda, ..Default::default() },
            x: vec![0.0; max_tokens * n_embd],
            row: vec![0.0; n_embd],
            pass_start: None,
            pass_load: 0.0,
            pass_wait: 0.0,
        };
        Ok(Online { ffn, kernels, layers, n_ff, n_embd, group, last, state: Mutex::new(state) })
    }

    /// A layer's gate, up and neuron-major down in group order (row `p`: neuron `members[p]`).
    fn matrices<'a>(&self, l: &'a Layer) -> [FileMatrix<'a>; 3] {
        let m = |dtype: DType, bytes: &'a [u8]| FileMatrix { dtype, rows: self.n_ff, cols: self.n_embd, bytes };
        [m(l.types[0], &l.rows[0]), m(l.types[1], &l.rows[1]), m(DType::Q8_0, &l.rows[2])]
    }

    pub fn ffn(&self) -> &Arc<HotFfn> {
        &self.ffn
    }

    pub fn policy(&self) -> Policy {
        self.lock().balancer.config().policy
    }

    pub fn stats(&self) -> BalanceStats {
        let s = self.lock();
        // The best fixed set: each layer's most firing groups, as many as it has slots.
        let fired_best = s
            .fired_by_group
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.is_empty())
            .map(|(l, f)| {
                let mut f = f.clone();
                f.sort_unstable_by(|a, b| b.cmp(a));
                f[..s.balancer.slots(l).len()].iter().sum::<u64>()
            })
            .sum();
        BalanceStats { device_lost: self.ffn.failed(), fired_best, ..s.stats }
    }

    /// Make the next layer's read-back fail as a lost device would (the device's work is still
    /// waited for, then dropped): for tests and drills of the fallback.
    pub fn simulate_device_loss(&self) {
        self.ffn.simulate_device_loss();
    }

    /// Zero the statistics (a benchmark's measured run starts here).
    pub fn reset_stats(&self) {
        let mut s = self.lock();
        let lambda = s.balancer.lambda();
        s.stats = BalanceStats { lambda, ..Default::default() };
        s.fired_by_group.iter_mut().for_each(|f| f.fill(0));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device's part of `layer`'s pass, on the CPU: every neuron in the mask, from the
    /// saved input, as the device computes it ([`device_part_on_cpu`]), into `y` (`[n_tokens ×
    /// n_embd]`).
    fn fallback(&self, s: &mut State, layer: usize, y: &mut [f32]) {
        let l = self.layers[layer].as_ref().expect("an offloaded layer");
        let [gate, up, down] = self.matrices(l);
        let (kind, thr) = s.glu[layer];
        let on = |n: usize| l.mask[n / 64].load(Ordering::Relaxed) >> (n % 64) & 1 == 1;
        let resident = (0..self.n_ff).filter(|&p| on(l.members[p] as usize)).map(|p| (p, p));
        device_part_on_cpu([&gate, &up, &down], resident, kind, thr, &s.x, y, &mut s.row);
    }

    /// Carry out `moves` on `layer`: device rows and the residency mask. Returns the bytes.
    fn apply(&self, layer: usize, moves: &[Move]) -> u64 {
        let l = self.layers[layer].as_ref().expect("an offloaded layer");
        let gs = self.group;
        let mut bytes = 0;
        for m in moves {
            let [gate, up, down] = [0, 1, 2].map(|k| l.group_rows(k, m.group, gs));
            bytes += self.ffn.load(layer, m.slot * gs, gate, up, down);
            if let Some(e) = m.evicted {
                l.set(e, gs, false);
            }
            l.set(m.group, gs, true);
        }
        bytes
    }
}

impl Offload for Online {
    fn begin(&self, layer: usize, x: &[f32], kind: Glu, thr: f32) {
        let mut s = self.lock();
        s.pass_start.get_or_insert_with(Instant::now);
        s.glu[layer] = (kind, thr);
        if self.ffn.failed() {
            return;
        }
        s.x[..x.len()].copy_from_slice(x);
        drop(s);
        self.ffn.submit(layer, x, kind, thr);
    }

    fn finish(&self, layer: usize, y: &mut [f32]) {
        let t0 = Instant::now();
        if self.ffn.failed() {
            y.fill(0.0); // the CPU computes every neuron now
            return;
        }
        let waited = self.ffn.wait(layer, y);
        let dt = t0.elapsed().as_secs_f64();
        let mut s = self.lock();
        if waited.is_err() {
            // Nothing running is lost: the device's part of this pass comes from the CPU,
            // and from the next pass on the CPU computes every neuron (masks cleared).
            self.fallback(&mut s, layer, y);
            for l in self.layers.iter().flatten() {
                l.mask.iter().for_each(|w| w.store(0, Ordering::Relaxed));
            }
            return;
        }
        s.pass_wait += dt;
        s.stats.wait_secs += dt;
        if std::mem::take(&mut s.loaded[layer]) {
            s.pass_load += dt;
            s.stats.load_secs += dt;
        }
    }

    fn resident(&self, layer: usize) -> Option<&[AtomicU64]> {
        self.layers.get(layer)?.as_ref().map(|l| &l.mask[..])
    }

    fn observe<'a>(&self, layer: usize, n_tokens: usize, piece: &dyn Fn(usize) -> Option<&'a [f32]>) {
        let t0 = Instant::now();
        let Some(l) = self.layers[layer].as_ref() else { return };
        let mut guard = self.lock();
        let s = &mut *guard;
        if self.ffn.failed() {
            return;
        }
        let (kind, thr) = s.glu[layer];
        let gs = self.group;
        s.counts.fill(0);
        // Piece by piece (a shard's neurons each with tensor parallelism), token by token.
        let mut n0 = 0;
        for gate in (0..).map_while(piece) {
            let n = gate.len() / n_tokens.max(1);
            for g in gate.chunks_exact(n.max(1)) {
                gate_activation(self.kernels, kind, g, &s.ones, &mut s.act[..n]);
                for (j, a) in s.act[..n].iter().enumerate() {
                    if a.abs() > thr {
                        s.counts[l.group_of[n0 + j] as usize] += 1;
                    }
                }
            }
            n0 += n;
        }
        assert_eq!(n0, self.n_ff, "the gate pieces cover the layer");
        for (g, (&c, a)) in s.counts.iter().zip(s.activity.iter_mut()).enumerate() {
            *a = c as f32 / (gs * n_tokens) as f32;
            s.stats.fired += u64::from(c);
            s.fired_by_group[layer][g] += u64::from(c);
            if s.balancer.resident(layer, g) {
                s.stats.fired_device += u64::from(c);
            }
        }
        s.balancer.observe(layer, &s.activity, &mut s.moves);
        s.stats.policy_secs += t0.elapsed().as_secs_f64();
        if !s.moves.is_empty() {
            let t1 = Instant::now();
            let bytes = self.apply(layer, &s.moves);
            let dt = t1.elapsed().as_secs_f64();
            s.stats.loads += s.moves.len() as u64;
            s.stats.load_bytes += bytes;
            s.stats.load_secs += dt;
            s.pass_load += dt;
            s.loaded[layer] = true;
        }
        if layer == self.last {
            let secs = s.pass_start.take().map_or(0.0, |t| t.elapsed().as_secs_f64());
            let (load, wait) = (std::mem::take(&mut s.pass_load), std::mem::take(&mut s.pass_wait));
            s.balancer.adapt(load, wait, secs);
            s.stats.passes += 1;
            s.stats.lambda = s.balancer.lambda();
        }
    }
}
