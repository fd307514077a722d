//! The sampler's stages against llama.cpp's: `fixtures/sampler_golden.json` holds what
//! llama.cpp 4df29be's chain (penalties, DRY, top-nσ, top-k, typical, top-p, min-p, XTC) keeps
//! of fixed logits over SmolLM2's vocabulary after a history of 57 tokens, in the default order
//! and in seven others (the temperature first, penalties and DRY after the cuts, the infill
//! stage, …), written by
//! `scripts/make_sampler_golden.c` (every token kept, when 200 or fewer are, and every token
//! whose logit the penalties or DRY moved); [`Sampler::candidates`] must keep the same tokens
//! with the same logits. DRY's sequence breakers are found in the same vocabulary.

mod common;

use common::*;
use corelm_engine::sample::{Breakers, Dry, InfillVocab, Mirostat, Parsed, Sampler, SamplingParams, Stage};
use corelm_engine::Tokenizer;
use std::sync::Arc;

const TEXT: &str = "Q: what is the capital of France?\nA: Paris is the capital of France.\n\
Q: what is the capital of Spain?\nA: Madrid is the capital of Spain.\n\
Q: what is the capital of Italy?\nA: Rome is the capital of";

fn fixture() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/sampler_golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture is JSON")
}

fn tokenizer() -> Tokenizer {
    let g = corelm_gguf::Gguf::open(model_path("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    Tokenizer::from_gguf(&g).unwrap()
}

/// The C program's logits: the ids permuted over [−4, 4) (no two alike), plus 2 per history
/// token.
fn logits(n_vocab: usize, history: &[u32]) -> Vec<f32> {
    let mut l: Vec<f32> = (0..n_vocab as u64).map(|i| (i * 40503 % 65537) as f32 / 65537.0 * 8.0 - 4.0).collect();
    for &t in history {
        l[t as usize] += 2.0;
    }
    l
}

fn params(c: &serde_json::Value, breakers: &Arc<Breakers>, tok: &Tokenizer) -> SamplingParams {
    let f = |k: &str| c[k].as_f64().unwrap() as f32;
    let u = |k: &str| c[k].as_i64().unwrap().max(0) as usize;
    let order = c["order"].as_str().unwrap().chars().map(|l| match Stage::from_char(l) {
        Parsed::Stage(s) => s,
        other => panic!("{l}: {other:?}"),
    });
    let order: Vec<Stage> = order.collect();
    let bias = c["bias"].as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32)).collect();
    SamplingParams {
        temperature: f("temperature"),
        infill: order.contains(&Stage::Infill).then(|| Arc::new(InfillVocab::new(tok).unwrap())),
        order,
        logit_bias: bias,
        repeat_penalty: f("repeat_penalty"),
        frequency_penalty: f("frequency_penalty"),
        presence_penalty: f("presence_penalty"),
        repeat_last_n: u("repeat_last_n"),
        dry: Dry {
            multiplier: f("dry_multiplier"),
            base: f("dry_base"),
            allowed_length: u("dry_allowed_length"),
            last_n: u("dry_penalty_last_n"),
            breakers: breakers.clone(),
        },
        top_n_sigma: f("top_n_sigma"),
        top_k: u("top_k"),
        typical_p: f("typical_p"),
        top_p: f("top_p"),
        min_p: f("min_p"),
        xtc_probability: f("xtc_probability"),
        xtc_threshold: f("xtc_threshold"),
        ..Default::default()
    }
}

#[test]
fn the_chain_keeps_what_llama_cpp_keeps() {
    let tok = tokenizer();
    let fx = fixture();
    let history: Vec<u32> = fx["history"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(tok.encode(TEXT, false, false).unwrap(), history, "the history tokenizes as llama.cpp's");
    let logits = logits(tok.n_vocab(), &history);
    let breakers = Arc::new(Breakers::new(&tok, &Breakers::DEFAULT));
    for c in fx["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let pairs = |k: &str| -> Vec<(u32, f32)> {
            let mut v: Vec<(u32, f32)> = c[k].as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32)).collect();
            v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            v
        };
        let near = |g: &(u32, f32), w: &(u32, f32)| {
            assert!((g.1 - w.1).abs() <= 1e-5 * w.1.abs().max(1.0), "{name}: token {} logit {} against llama.cpp's {}", g.0, g.1, w.1)
        };
        let breakers = match c["breaker"].as_str().unwrap() {
            "" => breakers.clone(),
            b => Arc::new(Breakers::new(&tok, &[b])),
        };
        let mut s = Sampler::new(params(c, &breakers, &tok), tok.n_vocab()).unwrap();
        for &t in &history {
            s.accept(t);
        }
        let got: Vec<(u32, f32)> = s.candidates(&logits).into_iter().filter(|c| c.1.is_finite()).collect();
        let ids = |v: &[(u32, f32)]| v.iter().map(|c| c.0).collect::<Vec<_>>();
        assert_eq!(got.len() as u64, c["size"].as_u64().unwrap(), "{name}: how many are kept");
        let want = pairs("kept");
        if !want.is_empty() {
            assert_eq!(ids(&got), ids(&want), "{name}: the tokens kept, best first");
            got.iter().zip(&want).for_each(|(g, w)| near(g, w));
        }
        // What llama-server's `post_sampling_probs` reports: the softmax of what is kept (the
        // temperature already divided in), drawn with the same generator as `candidates` used.
        if !want.is_empty() {
            let mut d = Sampler::new(params(c, &breakers, &tok), tok.n_vocab()).unwrap();
            history.iter().for_each(|&t| d.accept(t));
            let t = d.sample(&logits);
            let (p_t, top) = d.chain_probs(t, 20);
            let z: f64 = want.iter().map(|w| ((w.1 - want[0].1) as f64).exp()).sum();
            let p = |w: &(u32, f32)| (((w.1 - want[0].1) as f64).exp() / z) as f32;
            assert_eq!(ids(&top), ids(&want[..want.len().min(20)]), "{name}: post-sampling alternatives");
            top.iter().zip(&want).for_each(|(g, w)| assert!((g.1 - p(w)).abs() < 1e-5, "{name}: token {} p {} against {}", g.0, g.1, p(w)));
            let w = want.iter().find(|w| w.0 == t).expect("the draw is among the kept");
            assert!((p_t - p(w)).abs() < 1e-5, "{name}: the drawn token's probability");
        }
        // The tokens whose logits the penalties and DRY moved, and where to.
        let moved: Vec<(u32, f32)> = got.iter().filter(|g| g.1 != logits[g.0 as usize]).copied().collect();
        let want_moved = pairs("changed");
        assert_eq!(ids(&moved), ids(&want_moved), "{name}: the tokens moved");
        moved.iter().zip(&want_moved).for_each(|(g, w)| near(g, w));
        // Greedy (the default order, the temperature last at 0) takes the best of what the
        // penalties and DRY left (typical and XTC off).
        if c["order"] == "edskypmx" && c["typical_p"].as_f64() == Some(1.0) && c["xtc_probability"].as_f64() == Some(0.0) {
            let mut g = Sampler::new(SamplingParams { temperature: 0.0, order: corelm_engine::sample::DEFAULT_ORDER.to_vec(), ..params(c, &breakers, &tok) }, tok.n_vocab()).unwrap();
            for &t in &history {
                g.accept(t);
            }
            assert_eq!(g.sample(&logits), got[0].0, "{name}: greedy");
        }
    }
}

/// DRY moves the greedy choice off a repeat: made the best token, " France" would continue
/// "is the capital of France"; with DRY another is taken.
#[test]
fn dry_changes_the_greedy_choice() {
    let tok = tokenizer();
    let fx = fixture();
    let history: Vec<u32> = fx["history"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let mut logits = logits(tok.n_vocab(), &history);
    let france = tok.encode(" France", false, false).unwrap()[0];
    // One above the best; DRY takes 0.8 · 1.75^(4 − 2) = 2.45 for the 4 tokens it repeats.
    logits[france as usize] = logits.iter().fold(f32::MIN, |a, &b| a.max(b)) + 1.0;
    let breakers = Arc::new(Breakers::new(&tok, &Breakers::DEFAULT));
    let pick = |mult: f32| {
        let p = SamplingParams { temperature: 0.0, dry: Dry { multiplier: mult, breakers: breakers.clone(), ..Dry::default() }, ..Default::default() };
        let mut s = Sampler::new(p, tok.n_vocab()).unwrap();
        history.iter().for_each(|&t| s.accept(t));
        s.sample(&logits)
    };
    assert_eq!(pick(0.0), france);
    assert_ne!(pick(0.8), france);
}

/// Mirostat keeps the surprise of what it draws near its target τ (a free draw from these
/// logits averages 7.7 bits).
#[test]
fn mirostat_holds_the_surprise_near_tau() {
    // Zipf-like logits over 5000 tokens.
    let logits: Vec<f32> = (0..5000).map(|i| -1.1 * ((i + 1) as f32).ln()).collect();
    for (m, tau) in [(Mirostat::V1, 3.0f32), (Mirostat::V1, 6.0), (Mirostat::V2, 3.0), (Mirostat::V2, 6.0)] {
        let p = SamplingParams { temperature: 1.0, mirostat: m, mirostat_tau: tau, mirostat_eta: 0.1, seed: 7, ..Default::default() };
        let mut s = Sampler::new(p, logits.len()).unwrap();
        let (lse, max) = {
            let max = logits[0];
            (logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln(), max)
        };
        let n = 3000;
        let mut surprise = 0.0;
        for _ in 0..n {
            let t = s.sample(&logits) as usize;
            // The model's own surprise of the token, in bits.
            surprise += -((logits[t] - max - lse) / std::f32::consts::LN_2) as f64;
        }
        let mean = surprise / n as f64;
        // The target is the surprise within the cut; the model's own is a little higher.
        assert!(mean > tau as f64 && mean < tau as f64 + 1.5, "{m:?} tau {tau}: mean surprise {mean:.2}");
    }
}

/// `chain_probs` after a greedy choice (probability 1, alone) and after Mirostat (its cut's
/// softmax: best first, summing to 1 when all are asked for).
#[test]
fn chain_probs_follow_the_last_draw() {
    let logits: Vec<f32> = (0..500).map(|i| -1.1 * ((i + 1) as f32).ln()).collect();
    let mut g = Sampler::new(SamplingParams::greedy(), logits.len()).unwrap();
    assert_eq!(g.chain_probs(0, 5), (0.0, vec![]), "nothing drawn yet");
    assert_eq!(g.sample(&logits), 0);
    assert_eq!(g.chain_probs(0, 5), (1.0, vec![(0, 1.0)]));
    for m in [Mirostat::V1, Mirostat::V2] {
        let p = SamplingParams { temperature: 1.0, mirostat: m, mirostat_tau: 3.0, seed: 3, ..Default::default() };
        let mut s = Sampler::new(p, logits.len()).unwrap();
        for _ in 0..20 {
            let t = s.sample(&logits);
            let (p_t, all) = s.chain_probs(t, logits.len());
            let sum: f32 = all.iter().map(|x| x.1).sum();
            assert!((sum - 1.0).abs() < 1e-4, "{m:?}: the cut's probabilities sum to {sum}");
            assert!(all.windows(2).all(|w| w[0].1 >= w[1].1), "{m:?}: best first");
            assert!(all.len() < logits.len(), "{m:?}: the cut dropped the tail");
            assert_eq!(all.iter().find(|x| x.0 == t).map(|x| x.1), Some(p_t), "{m:?}: the drawn token's own");
        }
    }
}

/// Temperature 0 is greedy only where the order has the temperature and nothing before it that
/// can drop the best token; the chain agrees with `is_greedy`.
#[test]
fn greedy_follows_the_order() {
    let logits: Vec<f32> = (0..200).map(|i| -0.05 * i as f32).collect();
    let at = |order: &[Stage], typical_p: f32| SamplingParams { temperature: 0.0, typical_p, order: order.to_vec(), seed: 9, ..Default::default() };
    let cases = [
        (at(&corelm_engine::sample::DEFAULT_ORDER, 1.0), true),
        (at(&corelm_engine::sample::DEFAULT_ORDER, 0.2), false),
        (at(&[Stage::Temperature, Stage::Typical], 0.2), true),
        (at(&[Stage::TopK], 1.0), false),
    ];
    for (p, greedy) in cases {
        assert_eq!(p.is_greedy(), greedy, "{:?} typical {}", p.order, p.typical_p);
        let mut s = Sampler::new(p.clone(), logits.len()).unwrap();
        let draws: Vec<u32> = (0..20).map(|_| s.sample(&logits)).collect();
        // A flat tail: typical at 0.2 keeps tokens near the entropy, far from the best; a free
        // draw at temperature 1 rarely takes token 0 twenty times.
        assert_eq!(draws.iter().all(|&t| t == 0), greedy, "{:?}: {draws:?}", p.order);
    }
}

/// A mask asked about the best tokens only (`sample_checked`: greedy, or top-k first) draws
/// what the mask over every token (`sample_allowed`) draws: the same tokens from the same
/// generator, with masks that admit most, few and almost no tokens, penalties and a banned
/// token.
#[test]
fn a_mask_asked_about_the_best_tokens_draws_as_the_whole_mask() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
    let n = 3000;
    for round in 0..24 {
        let logits: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 8.0 - 4.0).collect();
        let density = [0.9, 0.05, 0.002][round % 3];
        let admitted: Vec<bool> = (0..n).map(|_| rng.random::<f64>() < density).collect();
        let allowed = |t: u32| admitted[t as usize];
        let temperature = if round % 4 == 0 { 0.0 } else { 0.9 };
        let base = SamplingParams {
            temperature,
            repeat_penalty: 1.3,
            logit_bias: vec![(7, f32::NEG_INFINITY), (11, 5.0)],
            seed: round as u64,
            ..Default::default()
        };
        let whole = base.clone();
        let (mut a, mut b) = (Sampler::new(base, n).unwrap(), Sampler::new(whole, n).unwrap());
        for t in [11, 12, 13, 12] {
            a.accept(t);
            b.accept(t);
        }
        for step in 0..20 {
            let (x, y) = (a.sample_checked(&logits, allowed), b.sample_allowed(&logits, Some(allowed)));
            assert_eq!(x, y, "round {round} (density {density}, temperature {temperature}), step {step}");
            assert!(x.is_none_or(|t| admitted[t as usize] && t != 7));
        }
    }
    // Ties go to the lower id, whichever way the search left the list: here the best 100 are
    // refused, so the whole mask is asked after a selection moved the tokens about.
    let mut g = Sampler::new(SamplingParams::greedy(), 3000).unwrap();
    for pair in [(2500u32, 2999u32), (1200, 2100), (150, 160), (2998, 2999)] {
        let mut l = vec![0.0f32; 3000];
        l[..100].fill(10.0);
        l[pair.0 as usize] = 1.0;
        l[pair.1 as usize] = 1.0;
        let ok = |t: u32| t == pair.0 || t == pair.1 || (t % 7 == 3 && t >= 100);
        assert_eq!(g.sample_checked(&l, ok), Some(pair.0), "{pair:?}");
        assert_eq!(g.sample_allowed(&l, Some(ok)), Some(pair.0), "{pair:?}");
    }
    // Nothing admitted: none.
    let mut s = Sampler::new(SamplingParams::default(), 100).unwrap();
    assert_eq!(s.sample_checked(&[0.0; 100], |_| false), None);
}

/// A prompt-free check of each option's refusal.
#[test]
fn bad_sampler_settings_are_refused() {
    let bad = [
        SamplingParams { xtc_probability: 1.5, ..Default::default() },
        SamplingParams { dynatemp_range: -1.0, ..Default::default() },
        SamplingParams { typical_p: f32::NAN, ..Default::default() },
        SamplingParams { dry: Dry { base: 0.5, ..Dry::default() }, ..Default::default() },
    ];
    for p in bad {
        assert!(Sampler::new(p, 10).is_err());
    }
}

/// A banned token leaves the list after the penalties, so they land on the right ids.
#[test]
fn penalties_hit_their_tokens_beside_a_banned_one() {
    let logits = [0.0, 1.0, 2.0, 5.0, 4.0];
    let p = SamplingParams { temperature: 0.0, repeat_penalty: 10.0, logit_bias: vec![(0, f32::NEG_INFINITY)], ..Default::default() };
    let mut s = Sampler::new(p, logits.len()).unwrap();
    s.accept(3);
    assert_eq!(s.sample(&logits), 4, "token 3's logit 5 / 10 falls below token 4's");
}

/// A look-back longer than any context (a careless flag) does not allocate itself up front.
#[test]
fn a_window_past_any_context_is_not_allocated_whole() {
    let dry = Dry { multiplier: 1.0, last_n: 1 << 40, ..Dry::default() };
    let p = SamplingParams { temperature: 0.0, repeat_penalty: 1.5, repeat_last_n: 1 << 40, dry, ..Default::default() };
    let mut s = Sampler::new(p, 4).unwrap();
    for t in [3, 3, 3] {
        s.accept(t);
    }
    assert_eq!(s.sample(&[0.0, 1.0, 2.0, 2.5]), 2, "token 3 penalised");
}
