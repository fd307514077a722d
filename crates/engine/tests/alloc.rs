//! Invariant: after planning, decoding token after token allocates nothing, and neither does
//! sampling. A counting global allocator watches a run of single-token decodes on a real
//! model, and the sampler's every stage; the tests take turns, since the counter is global.

mod common;

use common::*;
use corelm_engine::sample::{Sampler, SamplingParams};
use corelm_engine::Batch;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Held by each test: another test's allocations would count in this one's window.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    /// Count this thread's allocations alone (the sampler runs on the caller's thread; the
    /// engine's workers of an earlier test may still be winding down).
    static HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static HERE_ALLOCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        if HERE.try_with(|h| h.get()).unwrap_or(false) {
            let _ = HERE_ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decoding_allocates_nothing_per_token() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Every model without tensor parallelism, and with two shards (virtual nodes).
    let runs = MODELS.iter().map(|m| (m.1, 1)).chain(MODELS.iter().map(|m| (m.1, 2)));
    for (file, tp) in runs {
        let (mut engine, tok) = load(file, corelm_engine::EngineConfig { tp, ..test_config(2) });
        let prompt = tok.encode("The weather today is", true, true).unwrap();
        let mut b = Batch::with_capacity(64);
        for (i, &t) in prompt.iter().enumerate() {
            b.add(t, i as i32, 0, i + 1 == prompt.len());
        }
        let mut sampler = Sampler::new(SamplingParams::default(), engine.hyper().n_vocab).unwrap();
        let mut next = sampler.sample(engine.decode(&b).unwrap().row(0));
        // Warm-up step plans the single-token graph.
        let mut pos = prompt.len() as i32;
        b.clear();
        b.add(next, pos, 0, true);
        next = sampler.sample(engine.decode(&b).unwrap().row(0));
        pos += 1;
        ALLOCS.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        for _ in 0..16 {
            b.clear();
            b.add(next, pos, 0, true);
            let l = engine.decode(&b).unwrap();
            next = sampler.sample(l.row(0));
            sampler.accept(next);
            pos += 1;
        }
        COUNTING.store(false, Ordering::Relaxed);
        assert_eq!(ALLOCS.load(Ordering::Relaxed), 0, "{file} --tp {tp}: allocations during 16 decode steps");
    }
}

/// Every stage of the sampler (penalties, DRY, top-nσ, typical, XTC, dynamic temperature;
/// Mirostat 1 and 2) samples without allocating once built.
#[test]
fn sampling_allocates_nothing_per_token() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use corelm_engine::sample::{Breakers, Dry, Mirostat};
    let n_vocab = 5000;
    let breakers = std::sync::Arc::new(Breakers::from_tokens(&[vec![3], vec![7, 8]]));
    let dry = Dry { multiplier: 0.8, breakers, ..Dry::default() };
    let all = SamplingParams {
        repeat_penalty: 1.1,
        frequency_penalty: 0.1,
        dry,
        top_n_sigma: 3.0,
        top_k: 0,
        typical_p: 0.95,
        xtc_probability: 0.5,
        dynatemp_range: 0.3,
        ..SamplingParams::default()
    };
    for p in [all.clone(), SamplingParams { mirostat: Mirostat::V1, ..all.clone() }, SamplingParams { mirostat: Mirostat::V2, ..all }] {
        let mut sampler = Sampler::new(p, n_vocab).unwrap();
        let mut logits: Vec<f32> = (0..n_vocab).map(|i| ((i * 7919) % 1009) as f32 / 100.0).collect();
        for step in 0..80 {
            if step == 2 {
                HERE_ALLOCS.with(|n| n.set(0));
                HERE.with(|h| h.set(true));
            }
            let t = sampler.sample(&logits);
            // Repeat a short cycle so that DRY finds repeats.
            sampler.accept(t % 4);
            logits[t as usize] -= 0.5;
        }
        HERE.with(|h| h.set(false));
        assert_eq!(HERE_ALLOCS.with(|n| n.get()), 0, "{:?}: allocations while sampling", sampler.params.mirostat);
    }
}
