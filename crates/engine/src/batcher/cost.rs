//! The step-time model the TPOT target cuts prompt chunks by.

/// Online model of a step's time: `fixed + per_token · n_tokens` seconds.
#[derive(Clone, Copy, Debug)]
pub struct StepCost {
    pub fixed: f64,
    pub per_token: f64,
}

impl StepCost {
    pub(super) fn observe(&mut self, n: usize, secs: f64) {
        const A: f64 = 0.2;
        if n >= 16 {
            // Large steps are dominated by the per-token part.
            let pt = (secs - self.fixed).max(secs * 0.5) / n as f64;
            self.per_token += A * (pt - self.per_token);
        } else {
            let fx = (secs - self.per_token * n as f64).max(0.0);
            self.fixed += A * (fx - self.fixed);
        }
    }

    /// Tokens a step may carry to finish within `target` seconds.
    pub(super) fn tokens_within(&self, target: f64) -> usize {
        ((target - self.fixed) / self.per_token.max(1e-6)).max(0.0) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::StepCost;

    #[test]
    fn step_cost_learns_fixed_and_per_token_parts() {
        // True cost: 4 ms per step + 2 ms per token.
        let mut c = StepCost { fixed: 0.005, per_token: 0.005 };
        for _ in 0..60 {
            c.observe(64, 0.004 + 0.002 * 64.0);
            c.observe(4, 0.004 + 0.002 * 4.0);
        }
        assert!((c.per_token - 0.002).abs() < 2e-4, "{c:?}");
        assert!((c.fixed - 0.004).abs() < 1e-3, "{c:?}");
        // 100 ms allows about (0.1 - 0.004) / 0.002 = 48 tokens.
        let n = c.tokens_within(0.1);
        assert!((44..=52).contains(&n), "{n}");
        assert_eq!(c.tokens_within(0.001), 0);
    }
}
