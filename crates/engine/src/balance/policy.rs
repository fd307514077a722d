//! Which neuron groups the accelerator holds, pass by pass (KAIROX Algorithm 1 and the
//! policies its ablation compares). Pure bookkeeping: activities in, moves out; the device
//! side ([`super::Online`]) carries the moves out and measures the stalls that adapt λ.
//!
//! Each offloaded layer has a fixed number of slots (its share of `--accel-mem`), each holding
//! one group of neurons. After a pass of a layer, every group's activity `A` (the fraction of
//! its neurons that fired, over the pass's tokens) updates the scores, and the policy returns
//! moves (group into slot, evicting the slot's group), at most `max_loads` per pass so a burst
//! of moves cannot stall one token:
//! - **Static**: the hot set chosen at load stays. As `static` it is not balanced at all (the
//!   engine splits each layer's neurons once, `crate::offload::choose`); as `static-groups`
//!   it runs through the same slots, masks and statistics as the online policies with no
//!   moves (the starting groups, the calibration's most frequent): the ablation's baseline.
//! - **TopK**: the groups most active in this pass alone replace the least active residents.
//! - **LRU**: a group is *used* in a pass when its activity is above the layer's mean; used
//!   groups that are not resident replace the least recently used residents.
//! - **TAM** (Temporal Activation Momentum): `S ← λ·S + (1−λ)·H`, `H` = 1 when the group is
//!   used, else 0. A group is a candidate when `S > (1−λ) + ε` — used in more than one recent
//!   pass, so a one-pass spike loads nothing — and a candidate replaces the resident of lowest
//!   score when its own is higher.
//! - **TAM adaptive**: TAM with λ moved by the measured stall source after every token
//!   ([`Balancer::adapt`]): passes held up by loads (I/O-bound) raise λ (slower, steadier
//!   scores, fewer loads); passes where the device waited for nothing while the CPU worked
//!   (CPU-bound) lower it (faster reaction, more work moved to the device); bounded.

/// A balancing policy (`--accel-policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Static,
    StaticGroups,
    TopK,
    Lru,
    Tam,
    TamAdaptive,
}

impl Policy {
    pub const ALL: [Policy; 6] = [Policy::Static, Policy::StaticGroups, Policy::TopK, Policy::Lru, Policy::Tam, Policy::TamAdaptive];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Static => "static",
            Policy::StaticGroups => "static-groups",
            Policy::TopK => "topk",
            Policy::Lru => "lru",
            Policy::Tam => "tam",
            Policy::TamAdaptive => "tam-adaptive",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Policy::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
            format!("unknown --accel-policy '{s}' ({})", names.join(", "))
        })
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A policy and its constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BalanceConfig {
    pub policy: Policy,
    /// Neurons per group (a multiple of 4: the device's rows are written in whole words).
    pub group: usize,
    /// TAM's decay λ (the adaptive policy's start).
    pub lambda: f32,
    /// TAM's load threshold margin ε.
    pub eps: f32,
    /// The adaptive policy's bounds and step.
    pub lambda_min: f32,
    pub lambda_max: f32,
    pub lambda_step: f32,
    /// Moves at most per pass of a layer.
    pub max_loads: usize,
}

impl BalanceConfig {
    pub fn new(policy: Policy) -> Self {
        BalanceConfig { policy, group: 64, lambda: 0.9, eps: 0.02, lambda_min: 0.5, lambda_max: 0.98, lambda_step: 0.02, max_loads: 2 }
    }
}

/// Load `group` into `slot` (evicting the group there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub slot: usize,
    pub group: u32,
    /// The group evicted, if the slot held one.
    pub evicted: Option<u32>,
}

/// One layer's residency and scores.
struct Layer {
    /// The group in each slot.
    slots: Vec<Option<u32>>,
    /// The slot of each group, if resident.
    slot_of: Vec<Option<u32>>,
    /// TAM's momentum score (TopK: the last pass's activity).
    score: Vec<f32>,
    /// LRU: the last pass in which each group was used.
    last: Vec<u64>,
}

/// The residency of every offloaded layer under one policy.
pub struct Balancer {
    cfg: BalanceConfig,
    layers: Vec<Option<Layer>>,
    lambda: f32,
    pass: u64,
    /// Candidates of a pass (reused: no allocation per pass).
    cand: Vec<u32>,
    res: Vec<u32>,
}

impl Balancer {
    /// `initial[l]`: the groups layer `l`'s slots start with (their count is its slot count;
    /// empty: the layer is not offloaded), of `n_groups` groups per layer.
    pub fn new(cfg: BalanceConfig, n_groups: usize, initial: &[Vec<u32>]) -> Balancer {
        let layers = initial
            .iter()
            .map(|init| {
                (!init.is_empty()).then(|| {
                    let mut slot_of = vec![None; n_groups];
                    for (s, &g) in init.iter().enumerate() {
                        assert!(slot_of[g as usize].is_none(), "group {g} in two slots");
                        slot_of[g as usize] = Some(s as u32);
                    }
                    Layer { slots: init.iter().map(|&g| Some(g)).collect(), slot_of, score: vec![0.0; n_groups], last: vec![0; n_groups] }
                })
            })
            .collect();
        Balancer { lambda: cfg.lambda, cfg, layers, pass: 0, cand: Vec::with_capacity(n_groups), res: Vec::with_capacity(n_groups) }
    }

    pub fn config(&self) -> &BalanceConfig {
        &self.cfg
    }

    /// The decay in use (the adaptive policy moves it).
    pub fn lambda(&self) -> f32 {
        self.lambda
    }

    /// Whether `group` of `layer` is on the device.
    pub fn resident(&self, layer: usize, group: usize) -> bool {
        self.layers[layer].as_ref().is_some_and(|l| l.slot_of[group].is_some())
    }

    /// The groups in `layer`'s slots.
    pub fn slots(&self, layer: usize) -> &[Option<u32>] {
        self.layers[layer].as_ref().map_or(&[], |l| &l.slots)
    }

    /// After a pass of `layer`: `activity[g]`, the fraction of group `g`'s neurons that fired.
    /// Fills `moves` with what to load now (and applies them to the bookkeeping).
    pub fn observe(&mut self, layer: usize, activity: &[f32], moves: &mut Vec<Move>) {
        moves.clear();
        self.pass += 1;
        let (cfg, lambda, pass) = (self.cfg, self.lambda, self.pass);
        let Some(l) = self.layers[layer].as_mut() else { return };
        let mean = activity.iter().sum::<f32>() / activity.len().max(1) as f32;
        let used = |a: f32| a > mean;
        // Scores, and the candidates (not resident) and residents, best and worst first.
        self.cand.clear();
        self.res.clear();
        for (g, &a) in activity.iter().enumerate() {
            match cfg.policy {
                Policy::Static | Policy::StaticGroups => return,
                Policy::TopK => l.score[g] = a,
                Policy::Lru => {
                    if used(a) {
                        l.last[g] = pass;
                    }
                }
                Policy::Tam | Policy::TamAdaptive => {
                    l.score[g] = lambda * l.score[g] + (1.0 - lambda) * if used(a) { 1.0 } else { 0.0 };
                }
            }
            let eligible = match cfg.policy {
                Policy::Static | Policy::StaticGroups => false,
                Policy::TopK => true,
                Policy::Lru => l.last[g] == pass,
                Policy::Tam | Policy::TamAdaptive => l.score[g] > (1.0 - lambda) + cfg.eps,
            };
            if l.slot_of[g].is_some() {
                self.res.push(g as u32);
            } else if eligible {
                self.cand.push(g as u32);
            }
        }
        // Candidates: highest score (LRU: most active now) first; residents: the one to
        // evict first (lowest score; LRU: least recently used, then least active).
        let (score, last) = (&l.score, &l.last);
        let key = |g: u32| if cfg.policy == Policy::Lru { activity[g as usize] } else { score[g as usize] };
        self.cand.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
        if cfg.policy == Policy::Lru {
            self.res.sort_by(|&a, &b| last[a as usize].cmp(&last[b as usize]).then(activity[a as usize].total_cmp(&activity[b as usize])).then(a.cmp(&b)));
        } else {
            self.res.sort_by(|&a, &b| score[a as usize].total_cmp(&score[b as usize]).then(a.cmp(&b)));
        }
        for (&c, &r) in self.cand.iter().zip(&self.res).take(cfg.max_loads) {
            let better = match cfg.policy {
                Policy::Lru => last[r as usize] < pass,
                _ => key(c) > key(r),
            };
            if !better {
                break;
            }
            let slot = l.slot_of[r as usize].take().expect("a resident group has a slot");
            l.slot_of[c as usize] = Some(slot);
            l.slots[slot as usize] = Some(c);
            moves.push(Move { slot: slot as usize, group: c, evicted: Some(r) });
        }
    }

    /// After a pass of the model: `load_secs` spent issuing loads and waiting on layers whose
    /// submission carried them (I/O), `device_wait_secs` the CPU spent waiting for the device
    /// at all (none: the CPU was the slower side), of `token_secs`. Only the adaptive policy
    /// moves λ: I/O above 5 % of the pass raises it; otherwise a wait below 1 % lowers it.
    pub fn adapt(&mut self, load_secs: f64, device_wait_secs: f64, token_secs: f64) {
        if self.cfg.policy != Policy::TamAdaptive || token_secs <= 0.0 {
            return;
        }
        let c = self.cfg;
        if load_secs > 0.05 * token_secs {
            self.lambda = (self.lambda + c.lambda_step).min(c.lambda_max);
        } else if device_wait_secs < 0.01 * token_secs {
            self.lambda = (self.lambda - c.lambda_step).max(c.lambda_min);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Activities of 8 groups where `hot` groups fire at 0.9 and the others at 0.1.
    fn act(hot: &[u32]) -> Vec<f32> {
        (0..8).map(|g| if hot.contains(&g) { 0.9 } else { 0.1 }).collect()
    }

    fn run(policy: Policy, passes: &[Vec<f32>]) -> (Balancer, usize) {
        let mut cfg = BalanceConfig::new(policy);
        cfg.max_loads = 8;
        let mut b = Balancer::new(cfg, 8, &[vec![0, 1], vec![]]);
        let mut moves = Vec::new();
        let mut loads = 0;
        for a in passes {
            b.observe(0, a, &mut moves);
            loads += moves.len();
            // Bookkeeping stays a bijection between slots and resident groups.
            for (s, g) in b.slots(0).iter().enumerate() {
                assert_eq!(b.layers[0].as_ref().unwrap().slot_of[g.unwrap() as usize], Some(s as u32));
            }
        }
        (b, loads)
    }

    fn resident(b: &Balancer) -> Vec<u32> {
        let mut v: Vec<u32> = b.slots(0).iter().flatten().copied().collect();
        v.sort();
        v
    }

    #[test]
    fn policies_follow_a_shift_of_the_hot_groups() {
        // Groups 4 and 5 are hot for 20 passes.
        let shift: Vec<Vec<f32>> = (0..20).map(|_| act(&[4, 5])).collect();
        for p in [Policy::Static, Policy::StaticGroups] {
            let (b, loads) = run(p, &shift);
            assert_eq!((resident(&b), loads), (vec![0, 1], 0));
        }
        for p in [Policy::TopK, Policy::Lru, Policy::Tam, Policy::TamAdaptive] {
            let (b, loads) = run(p, &shift);
            assert_eq!((resident(&b), loads), (vec![4, 5], 2), "{p}");
        }
        // TAM waits for evidence: after one pass nothing moves (S = 1 − λ is not above the
        // threshold); TopK and LRU move at once.
        assert_eq!(run(Policy::Tam, &shift[..1]).1, 0);
        assert_eq!(run(Policy::TopK, &shift[..1]).1, 2);
        assert_eq!(run(Policy::Lru, &shift[..1]).1, 2);
    }

    #[test]
    fn momentum_ignores_one_pass_spikes_that_make_topk_and_lru_thrash() {
        // Groups 0 and 1 are hot, but every other pass two others spike instead.
        let spike = |i: usize| (i / 2 % 3) as u32 * 2;
        let passes: Vec<Vec<f32>> = (0..40).map(|i| if i % 2 == 0 { act(&[0, 1]) } else { act(&[2 + spike(i), 3 + spike(i)]) }).collect();
        let (b, tam) = run(Policy::Tam, &passes);
        // (spikes: groups 2-3, 4-5, 6-7 in turn, each back every 6 passes)
        assert_eq!((resident(&b), tam), (vec![0, 1], 0));
        let (_, topk) = run(Policy::TopK, &passes);
        let (_, lru) = run(Policy::Lru, &passes);
        assert!(topk >= 70 && lru >= 70, "topk {topk}, lru {lru} loads");
    }

    #[test]
    fn loads_per_pass_are_capped_and_unoffloaded_layers_ignored() {
        let mut cfg = BalanceConfig::new(Policy::TopK);
        cfg.max_loads = 1;
        let mut b = Balancer::new(cfg, 8, &[vec![0, 1], vec![]]);
        let mut moves = Vec::new();
        b.observe(0, &act(&[6, 7]), &mut moves);
        // The most active candidate replaces the least active resident (ties: lowest index).
        assert_eq!(moves, vec![Move { slot: 0, group: 6, evicted: Some(0) }]);
        b.observe(1, &act(&[6, 7]), &mut moves);
        assert!(moves.is_empty() && !b.resident(1, 6));
        b.observe(0, &act(&[6, 7]), &mut moves);
        assert_eq!(moves, vec![Move { slot: 1, group: 7, evicted: Some(1) }]);
    }

    #[test]
    fn adaptive_lambda_moves_with_the_stall_source_within_bounds() {
        let mut b = Balancer::new(BalanceConfig::new(Policy::TamAdaptive), 8, &[vec![0]]);
        for _ in 0..100 {
            b.adapt(0.5, 0.0, 1.0); // I/O-bound
        }
        assert_eq!(b.lambda(), 0.98);
        b.adapt(0.0, 0.3, 1.0); // balanced: the device did wait, loads cost nothing
        assert_eq!(b.lambda(), 0.98);
        for _ in 0..100 {
            b.adapt(0.0, 0.0, 1.0); // CPU-bound
        }
        assert_eq!(b.lambda(), 0.5);
        // Fixed TAM keeps its λ.
        let mut t = Balancer::new(BalanceConfig::new(Policy::Tam), 8, &[vec![0]]);
        t.adapt(0.5, 0.0, 1.0);
        assert_eq!(t.lambda(), 0.9);
    }
}
