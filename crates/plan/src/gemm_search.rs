//! Sandwich §6: dynamic-shape GEMM schedules, searched per matrix over increasing sequence
//! lengths with a cost the caller measures (`corelm tune` times the real matmul on the real
//! weights with the engine's workers).
//!
//! Per length `m`, in increasing order:
//!
//! 1. **Reuse.** The previous length's best schedule is timed at `m` against the path's default.
//!    When its ratio to the default is within `reuse` of the average ratio the search has reached
//!    so far, it is kept (once confirmed as in step 5) and the search at `m` stops early.
//! 2. **Fast start.** From the better of the previous best and the default, each blocking
//!    dimension (`mc`, `nc`, then `kc` on the panel path) is walked in steps growing
//!    exponentially (×2, ×4, ×8 of the value the walk started from) while each step pays; the
//!    first step that does not is rolled back and the walk stops. A dimension whose first step up
//!    does not pay is walked down the same way.
//! 3. **Micro-kernels.** The register tile heights within a sliding window of `window` heights
//!    around the previous length's best height (all of them at the first length) are timed with
//!    that blocking.
//! 4. **Finetune.** The thread grids — the scheduler's own, and every row-part count that
//!    divides the workers — are timed with the best schedule so far.
//! 5. **Confirm.** The winner and the default are timed again, alternately, `confirm` times
//!    each; the winner is kept only if the better of its new timings still pays against the
//!    better of the default's, and the gain reported is theirs. The search's own figure is the
//!    best of many noisy timings against one of the default, so a winner picked by noise
//!    would otherwise stay, and the gain read high (a 2-core VM whose speed drifts by tens of
//!    per cent within minutes: docs/benchmarks.md, 2026-12-01).
//!
//! A step *pays* when it is faster than the best so far by more than `min_gain` (timing noise
//! should not move the search). Everything timed is kept in [`Tuned`] for the report.

use corelm_kernels::matmul::schedule::{Schedule, PANEL_MR, TILE_MR};

/// What may vary for one matrix.
#[derive(Clone, Copy, Debug)]
pub struct Space {
    /// The panel GEMM's micro-kernels and `kc`, or the tiles'.
    pub panel: bool,
    /// Workers the matmul runs on.
    pub nth: usize,
    /// Output columns and 32-value blocks of the inner dimension.
    pub n_out: usize,
    pub nb: usize,
    /// Widest column block allowed (scratch and stack limits).
    pub max_nc: usize,
    /// The schedule the matrix runs before tuning, the search's start and yardstick (the
    /// engine's default for it: [`default_schedule`], or AMX's for the AMX table's tiles).
    pub start: Schedule,
}

/// The search's knobs.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Micro-kernel heights timed around the previous length's best (σ).
    pub window: usize,
    /// Reuse the previous length's schedule when its ratio to the default is within this
    /// fraction of the average ratio so far.
    pub reuse: f64,
    /// Least relative gain that counts as paying.
    pub min_gain: f64,
    /// Timings of the winner and of the default, alternated, that confirm a searched winner
    /// (0: none).
    pub confirm: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options { window: 3, reuse: 0.05, min_gain: 0.02, confirm: 2 }
    }
}

/// One length's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuned {
    pub rows: usize,
    pub sched: Schedule,
    /// Seconds of the chosen schedule and of the path's default at this length.
    pub secs: f64,
    pub default_secs: f64,
    /// Schedules timed at this length, and whether the previous one was reused.
    pub measured: usize,
    pub reused: bool,
}

impl Tuned {
    /// Speed-up over the default (≥ 1 up to noise).
    pub fn gain(&self) -> f64 {
        self.default_secs / self.secs
    }
}

/// The path's schedule before tuning.
pub fn default_schedule(panel: bool) -> Schedule {
    if panel {
        Schedule::PANEL_DEFAULT
    } else {
        Schedule::TILE_DEFAULT
    }
}

/// Tune every length of `lengths` (ascending); `measure(rows, schedule)` gives seconds.
pub fn search(lengths: &[usize], space: &Space, opts: &Options, measure: &mut dyn FnMut(usize, &Schedule) -> f64) -> Vec<Tuned> {
    let heights: &[usize] = if space.panel { &PANEL_MR } else { &TILE_MR };
    let def = space.start;
    let mut out: Vec<Tuned> = Vec::new();
    for &m in lengths {
        let mut n_measured = 0;
        let mut time = |s: &Schedule| {
            n_measured += 1;
            measure(m, s)
        };
        let t_def = time(&def);
        let prev = out.last().map(|t| t.sched).filter(|&s| s != def);
        let (mut best, mut t_best) = (def, t_def);
        if let Some(p) = prev {
            let t_prev = time(&p);
            let avg = out.iter().map(|t| t.secs / t.default_secs).sum::<f64>() / out.len() as f64;
            if t_prev / t_def <= avg * (1.0 + opts.reuse) {
                let (sched, secs, default_secs) = if t_prev <= t_def {
                    confirm((p, t_prev), (def, t_def), opts, &mut time)
                } else {
                    (def, t_def, t_def)
                };
                out.push(Tuned { rows: m, sched, secs, default_secs, measured: n_measured, reused: true });
                continue;
            }
            if t_prev < t_best {
                (best, t_best) = (p, t_prev);
            }
        }
        let pays = |t: f64, t_best: f64| t < t_best * (1.0 - opts.min_gain);
        // 2. Fast start over the blocking dimensions.
        let dims: &[Dim] = if space.panel { &[Dim::Mc, Dim::Nc, Dim::Kc] } else { &[Dim::Mc, Dim::Nc] };
        for &d in dims {
            let start = d.get(&best, m, space);
            let mut improved = false;
            for dir in [Dir::Up, Dir::Down] {
                if improved {
                    break;
                }
                let mut step = 2;
                while let Some(v) = d.step(start, step, dir, m, space) {
                    let cand = d.set(&best, v, m, space);
                    if cand == best {
                        break;
                    }
                    let t = time(&cand);
                    if !pays(t, t_best) {
                        break; // roll back: `best` still holds the last step that paid
                    }
                    (best, t_best, improved) = (cand, t, true);
                    step *= 2;
                }
            }
        }
        // Each candidate of a list timed; the best kept where it pays.
        let mut each = |cands: &mut dyn Iterator<Item = Schedule>, best: &mut Schedule, t_best: &mut f64| {
            for cand in cands.filter(|c| c != best).collect::<Vec<_>>() {
                let t = time(&cand);
                if pays(t, *t_best) {
                    (*best, *t_best) = (cand, t);
                }
            }
        };
        // 3. Micro-kernels in the window around the previous best height.
        let centre = heights.iter().position(|&h| h == out.last().map_or(best.mr, |t| t.sched.mr)).unwrap_or(0);
        let (lo, hi) = if out.is_empty() { (0, heights.len()) } else { window(centre, opts.window, heights.len()) };
        let blocking = best;
        each(&mut heights[lo..hi].iter().map(|&mr| Schedule { mr, ..blocking }), &mut best, &mut t_best);
        // 4. Thread grids.
        let tiled = best;
        let grids = std::iter::once(0).chain((1..=space.nth).filter(|d| space.nth.is_multiple_of(*d)));
        each(&mut grids.map(|row_parts| Schedule { row_parts, ..tiled }), &mut best, &mut t_best);
        // 5. Confirmed against the default, timed alternately.
        let (sched, secs, default_secs) = confirm((best, t_best), (def, t_def), opts, &mut time);
        out.push(Tuned { rows: m, sched, secs, default_secs, measured: n_measured, reused: false });
    }
    out
}

/// Step 5: `best` and the default `def`, each with the seconds the search timed, timed again
/// alternately `opts.confirm` times each; `best` is kept only if the better of its new timings
/// still pays (by `min_gain`) against the better of the default's. Gives the schedule kept, its
/// seconds and the default's. Nothing is timed when `best` is the default or `confirm` is 0.
fn confirm(best: (Schedule, f64), def: (Schedule, f64), opts: &Options, time: &mut dyn FnMut(&Schedule) -> f64) -> (Schedule, f64, f64) {
    if best.0 == def.0 || opts.confirm == 0 {
        return (best.0, best.1, def.1);
    }
    let (mut t_best, mut t_def) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..opts.confirm {
        t_def = t_def.min(time(&def.0));
        t_best = t_best.min(time(&best.0));
    }
    if t_best < t_def * (1.0 - opts.min_gain) {
        (best.0, t_best, t_def)
    } else {
        (def.0, t_def, t_def)
    }
}

/// `window` consecutive indices out of `len` around `centre`.
fn window(centre: usize, window: usize, len: usize) -> (usize, usize) {
    let w = window.clamp(1, len);
    let lo = centre.saturating_sub((w - 1) / 2).min(len - w);
    (lo, lo + w)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Dir {
    Up,
    Down,
}

/// A blocking dimension, valued in its own unit (rows, columns, inner blocks); "all" (0) is
/// the dimension's whole extent.
#[derive(Clone, Copy, Debug)]
enum Dim {
    Mc,
    Nc,
    Kc,
}

impl Dim {
    fn extent(self, m: usize, space: &Space) -> usize {
        match self {
            Dim::Mc => m.div_ceil(8) * 8,
            Dim::Nc => space.n_out.min(space.max_nc),
            Dim::Kc => space.nb,
        }
    }

    fn unit(self, space: &Space) -> usize {
        match self {
            Dim::Mc => 8,
            Dim::Nc if space.panel => 8,
            Dim::Nc => 4,
            Dim::Kc => 1,
        }
    }

    fn get(self, s: &Schedule, m: usize, space: &Space) -> usize {
        let v = match self {
            Dim::Mc => s.mc,
            Dim::Nc => s.nc,
            Dim::Kc => s.kc,
        };
        if v == 0 {
            self.extent(m, space)
        } else {
            v.min(self.extent(m, space))
        }
    }

    fn set(self, s: &Schedule, v: usize, m: usize, space: &Space) -> Schedule {
        // The whole extent is stored as "all" where the field has one.
        let v = if v >= self.extent(m, space) && !matches!(self, Dim::Nc) { 0 } else { v };
        match self {
            Dim::Mc => Schedule { mc: v, ..*s },
            Dim::Nc => Schedule { nc: v, ..*s },
            Dim::Kc => Schedule { kc: v, ..*s },
        }
    }

    /// `start` times or divided by `step`, in whole units, within the extent; `None` past it.
    fn step(self, start: usize, step: usize, dir: Dir, m: usize, space: &Space) -> Option<usize> {
        let (unit, ext) = (self.unit(space), self.extent(m, space));
        let v = match dir {
            Dir::Up if start >= ext => return None,
            Dir::Up => (start * step).min(ext),
            Dir::Down if start <= unit => return None,
            Dir::Down => (start / step).max(unit),
        };
        Some(v.div_ceil(unit) * unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(panel: bool) -> Space {
        Space { panel, nth: 4, n_out: 1024, nb: 64, max_nc: 256, start: default_schedule(panel) }
    }

    /// A separable cost with its optimum at mc 64, nc 128, kc 16, mr 6, 2 row parts: each
    /// factor a bowl in log2 of the value.
    fn bowl(m: usize, s: &Schedule) -> f64 {
        let l = |v: usize, all: usize, best: f64| {
            let v = if v == 0 { all } else { v } as f64;
            1.0 + 0.1 * (v.log2() - best.log2()).powi(2)
        };
        let mr = 1.0 + 0.05 * (s.mr as f64 - 6.0).abs();
        let grid = if s.row_parts == 2 { 1.0 } else { 1.1 };
        m as f64 * l(s.mc, m.div_ceil(8) * 8, 64.0) * l(s.nc, 1024, 128.0) * l(s.kc, 64, 16.0) * mr * grid
    }

    #[test]
    fn the_fast_start_search_finds_a_separable_optimum() {
        let mut calls = 0;
        let t = search(&[512], &space(true), &Options::default(), &mut |m, s| {
            calls += 1;
            bowl(m, s)
        });
        assert_eq!(t[0].sched, Schedule { mr: 6, nc: 128, mc: 64, kc: 16, row_parts: 2 });
        assert!(t[0].gain() > 1.5 && !t[0].reused);
        // Far fewer timings than the grid (5 heights × 6 nc × 7 mc × 7 kc × 4 grids): under 30
        // searched, then the confirmation's two per round.
        assert!(calls == t[0].measured && calls < 30 + 2 * Options::default().confirm, "{calls} timings");
    }

    #[test]
    fn a_winner_that_does_not_hold_when_timed_again_is_dropped() {
        // Every schedule costs the same, but the first timing of `nc` 32 comes out fast
        // (noise): the search picks it, the confirmation finds no gain and keeps the default.
        let noisy = || {
            let mut first = true;
            move |_: usize, s: &Schedule| if s.nc == 32 && std::mem::take(&mut first) { 0.5 } else { 1.0 }
        };
        let sp = Space { panel: true, nth: 1, n_out: 512, nb: 4, max_nc: 256, start: Schedule::PANEL_DEFAULT };
        let t = search(&[64], &sp, &Options::default(), &mut noisy());
        assert_eq!(t[0].sched, Schedule::PANEL_DEFAULT);
        assert_eq!(t[0].gain(), 1.0);
        // Without the confirmation the noisy timing wins.
        let t = search(&[64], &sp, &Options { confirm: 0, ..Options::default() }, &mut noisy());
        assert_eq!(t[0].sched.nc, 32);
        assert_eq!(t[0].gain(), 2.0);
    }

    #[test]
    fn a_step_that_does_not_pay_is_rolled_back() {
        // Columns: 16 and 32 pay, 64 does not (and 128 would, past a bump the walk stops at).
        let cost = |_: usize, s: &Schedule| match s.nc {
            16 => 0.9,
            32 => 0.8,
            64 => 0.85,
            128 => 0.1,
            _ => 1.0,
        };
        let sp = Space { panel: true, nth: 1, n_out: 512, nb: 4, max_nc: 256, start: Schedule::PANEL_DEFAULT };
        let t = search(&[64], &sp, &Options::default(), &mut |m, s| cost(m, s));
        assert_eq!(t[0].sched.nc, 32);
    }

    #[test]
    fn a_length_reuses_the_previous_schedule_when_it_keeps_its_gain() {
        let mut per_length = std::collections::BTreeMap::new();
        let t = search(&[64, 128, 256], &space(true), &Options::default(), &mut |m, s| {
            *per_length.entry(m).or_insert(0) += 1;
            bowl(m, s)
        });
        // The bowl does not move with m (mc is capped by m at 64 only): 128 and 256 reuse.
        assert!(!t[0].reused && t[1].reused && t[2].reused, "{t:?}");
        // The default and the reused schedule, then the confirmation's two per round.
        assert_eq!(per_length[&128], 2 + 2 * Options::default().confirm);
        assert_eq!(t[2].sched, t[0].sched);
    }

    #[test]
    fn a_reused_schedule_whose_gain_does_not_hold_is_dropped() {
        // `nc` 32 halves the cost at 64 rows. At 128 its first timing (the reuse check) comes
        // out as fast again, by noise, and then no faster than the default.
        let noisy = || {
            let mut first_at_128 = true;
            move |m: usize, s: &Schedule| match (m, s.nc) {
                (64, 32) => 0.5,
                (128, 32) if std::mem::take(&mut first_at_128) => 0.5,
                _ => 1.0,
            }
        };
        let sp = Space { panel: true, nth: 1, n_out: 512, nb: 4, max_nc: 256, start: Schedule::PANEL_DEFAULT };
        let t = search(&[64, 128], &sp, &Options::default(), &mut noisy());
        assert_eq!((t[0].sched.nc, t[0].gain()), (32, 2.0));
        assert!(t[1].reused && t[1].sched == Schedule::PANEL_DEFAULT && t[1].gain() == 1.0, "{t:?}");
        // Without the confirmation the reuse keeps it, and reads the noise as a gain.
        let t = search(&[64, 128], &sp, &Options { confirm: 0, ..Options::default() }, &mut noisy());
        assert!(t[1].reused && t[1].sched.nc == 32 && t[1].gain() == 2.0, "{t:?}");
    }

    #[test]
    fn the_micro_kernel_window_slides_with_the_best_height() {
        // The best height moves from 1 at short lengths to 8 at long ones, and the cost of
        // keeping the old schedule grows so that reuse never applies.
        let cost = |m: usize, s: &Schedule| {
            let want = if m < 100 { 1.0 } else { 8.0 };
            m as f64 * (1.0 + (s.mr as f64 - want).abs() * m as f64 / 64.0)
        };
        let mut heights_at_512 = std::collections::BTreeSet::new();
        let t = search(&[8, 512], &Space { panel: true, nth: 1, n_out: 64, nb: 2, max_nc: 64, start: Schedule::PANEL_DEFAULT }, &Options { window: 3, ..Options::default() }, &mut |m, s| {
            if m == 512 {
                heights_at_512.insert(s.mr);
            }
            cost(m, s)
        });
        assert_eq!(t[0].sched.mr, 1);
        // Around height 1 (index 0), the window of 3 is heights 1, 2, 4: 8 is never timed.
        assert!(!heights_at_512.contains(&8) && !heights_at_512.contains(&6), "{heights_at_512:?}");
        assert_eq!(t[1].sched.mr, 4);
        assert_eq!(window(0, 3, 5), (0, 3));
        assert_eq!(window(4, 3, 5), (2, 5));
        assert_eq!(window(2, 2, 5), (2, 4));
    }

    #[test]
    fn tile_schedules_stay_on_the_tiles_grid() {
        let t = search(&[40], &space(false), &Options::default(), &mut |m, s| bowl(m, s));
        let s = t[0].sched;
        assert!(TILE_MR.contains(&s.mr) && s.nc.is_multiple_of(4) && s.mc.is_multiple_of(8) && s.kc == 0, "{s:?}");
        assert_eq!(s.normalized(false), s);
    }
}
