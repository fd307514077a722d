//! Prometheus metrics in the text exposition format: request counts by endpoint and status,
//! prompt and generated tokens, TTFT / TPOT / queueing histograms, and gauges read from the
//! batcher (queue depth, running sequences, KV blocks used / cached / free).

use corelm_engine::batcher::Stats;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Fixed-bucket histogram of seconds.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    /// Sum in microseconds.
    sum_us: AtomicU64,
    n: AtomicU64,
}

const TTFT_BOUNDS: &[f64] = &[0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0];
const TPOT_BOUNDS: &[f64] = &[0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.4, 1.0];

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
            n: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, secs: f64) {
        let i = self.bounds.iter().position(|&b| secs <= b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add((secs.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.n.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c.load(Ordering::Relaxed);
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {}", self.n.load(Ordering::Relaxed));
    }
}

pub struct Metrics {
    /// (endpoint, status) → count.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    pub ttft: Histogram,
    pub tpot: Histogram,
    pub queue: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::default(),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            tpot: Histogram::new(TPOT_BOUNDS),
            queue: Histogram::new(TTFT_BOUNDS),
        }
    }
}

impl Metrics {
    pub fn request(&self, endpoint: &'static str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((endpoint, status)).or_default() += 1;
    }

    pub fn finished(&self, f: &corelm_engine::batcher::Finish) {
        self.prompt_tokens.fetch_add(f.prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens.fetch_add(f.cached_tokens as u64, Ordering::Relaxed);
        self.generated_tokens.fetch_add(f.completion_tokens as u64, Ordering::Relaxed);
        if f.completion_tokens > 0 {
            self.ttft.observe(f.ttft_secs);
            self.queue.observe(f.queue_secs);
        }
        if f.completion_tokens > 1 {
            self.tpot.observe(f.tpot_secs);
        }
        if f.reason == corelm_engine::batcher::FinishReason::Cancelled {
            self.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn render(&self, stats: &Stats, queued: u64) -> String {
        let mut o = String::with_capacity(4096);
        let _ = writeln!(o, "# HELP corelm_requests_total HTTP requests by endpoint and status code.");
        let _ = writeln!(o, "# TYPE corelm_requests_total counter");
        for ((ep, st), n) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(o, "corelm_requests_total{{endpoint=\"{ep}\",status=\"{st}\"}} {n}");
        }
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(&mut o, "corelm_prompt_tokens_total", "Prompt tokens of finished requests.", ld(&self.prompt_tokens));
        counter(&mut o, "corelm_prompt_tokens_cached_total", "Prompt tokens served from the prefix cache.", ld(&self.cached_tokens));
        counter(&mut o, "corelm_generated_tokens_total", "Generated tokens.", ld(&self.generated_tokens));
        counter(&mut o, "corelm_requests_cancelled_total", "Requests cancelled (client gone).", ld(&self.cancelled));
        counter(&mut o, "corelm_engine_steps_total", "Forward passes of the batcher.", ld(&stats.steps));
        counter(&mut o, "corelm_draft_tokens_total", "Draft tokens fed (--lookup, --spec-draft-model).", ld(&stats.drafted));
        counter(&mut o, "corelm_draft_tokens_accepted_total", "Draft tokens kept: the ones the model chose.", ld(&stats.drafts_kept));
        let us = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed) as u64;
        gauge(&mut o, "corelm_queue_depth", "Requests accepted and without a first token yet.", queued);
        gauge(&mut o, "corelm_requests_waiting", "Requests waiting for admission in the batcher.", us(&stats.waiting));
        gauge(&mut o, "corelm_sequences_running", "Sequences in the running batch.", us(&stats.running));
        let (total, used, cached) = (us(&stats.kv_blocks_total), us(&stats.kv_blocks_used), us(&stats.kv_blocks_cached));
        gauge(&mut o, "corelm_kv_blocks_total", "KV cache blocks (16 tokens each).", total);
        gauge(&mut o, "corelm_kv_blocks_used", "KV blocks held by running sequences.", used);
        gauge(&mut o, "corelm_kv_blocks_cached", "Unreferenced KV blocks kept for prefix reuse.", cached);
        gauge(&mut o, "corelm_kv_blocks_free", "KV blocks holding nothing.", total.saturating_sub(used + cached));
        self.ttft.render(&mut o, "corelm_ttft_seconds", "Time from arrival to the first generated token.");
        self.tpot.render(&mut o, "corelm_tpot_seconds", "Mean time per generated token after the first, per request.");
        self.queue.render(&mut o, "corelm_queue_seconds", "Time from arrival to admission into the running batch.");
        o
    }
}
