//! Prefill's pace: how long a forward of `n` prompt tokens takes on this model and machine,
//! learnt from the forwards prefill runs, and so how many prompt tokens a step may take to
//! stay within a time target.
//!
//! Token budgets alone do not bound a step's time: 256 prompt tokens take milliseconds for a
//! small model on a GPU and seconds for an 8B model on a CPU, and a cancelled request, a new
//! arrival and every decoding sequence wait for the step in flight (a forward cannot be
//! interrupted). A forward's time is modelled as `fixed + per_token · n` — reading the weights
//! once, then work that grows with the tokens — fitted by least squares over recent forwards,
//! older ones weighing less. A step then takes as many tokens as fit in the target, but never
//! so few that the fixed part outweighs the work: where the weights alone take longer than the
//! target (a large model on a CPU), halving the tokens would halve prefill's speed without
//! making a step much shorter, so such a step takes `fixed / per_token` tokens and lasts
//! about twice `fixed`.

use std::time::Duration;

/// Paced budgets are multiples of this many tokens: a few steady chunk widths batch with each
/// other and reach compiled shapes again.
pub const PACE_GRANULE: usize = 16;

/// Paced budgets never go below this many tokens (four granules). The fit assumes a quiet
/// machine; on one oversubscribed by other processes a forward's fixed cost swings from one
/// step to the next, and a pace that read it as per-token cost would shrink prefill to a few
/// tokens a step (measured on a 2-core machine at load 10: 16-token steps prefilled a 135M
/// model at 7 tokens/s).
pub const PACE_FLOOR: usize = 4 * PACE_GRANULE;

/// How much each older forward's weight shrinks per newer one: about the last ten forwards
/// count, so the fit follows a prompt's attention growing with its depth.
const DECAY: f64 = 0.9;

/// The measured pace of prefill forwards on one loaded model.
#[derive(Debug, Clone, Default)]
pub struct PrefillPace {
    /// The time a step's prefill aims at; `None`: budgets are not paced.
    target: Option<Duration>,
    /// Exponentially weighted sums over forwards of (1, n, t, n², n·t), `n` tokens taking `t`
    /// seconds.
    weight: f64,
    tokens: f64,
    seconds: f64,
    tokens_squared: f64,
    tokens_seconds: f64,
    /// Whether the next paced budget is the halved one.
    halve: bool,
}

impl PrefillPace {
    /// A pace aiming each step's prefill at `target` (`None`: no pacing).
    pub fn new(target: Option<Duration>) -> PrefillPace {
        PrefillPace {
            target,
            ..PrefillPace::default()
        }
    }

    /// Records a forward of `tokens` prompt tokens (over all its rows) that took `elapsed`.
    pub fn record(&mut self, tokens: usize, elapsed: Duration) {
        if tokens == 0 {
            return;
        }
        let (n, t) = (tokens as f64, elapsed.as_secs_f64());
        self.weight = self.weight * DECAY + 1.0;
        self.tokens = self.tokens * DECAY + n;
        self.seconds = self.seconds * DECAY + t;
        self.tokens_squared = self.tokens_squared * DECAY + n * n;
        self.tokens_seconds = self.tokens_seconds * DECAY + n * t;
    }

    /// `budget`, or fewer tokens where the forwards measured so far say `budget` would take
    /// longer than the target (see the module docs); at least [`PACE_FLOOR`]. Paced budgets
    /// alternate between the width that fits and half of it (or the floor and twice it):
    /// forwards of one width alone cannot tell the fixed cost from the per-token one,
    /// and a pace that saw only small forwards would stay small.
    pub fn cap(&mut self, budget: usize) -> usize {
        let (Some(target), Some((fixed, per_token))) = (self.target, self.fit()) else {
            return budget;
        };
        let fitting = (target.as_secs_f64() - fixed) / per_token;
        let efficient = fixed / per_token;
        let paced = fitting.max(efficient);
        if !paced.is_finite() || paced >= budget as f64 {
            return budget;
        }
        // Rounded first: a fit's 399.99… tokens are 400.
        let width = (paced.round() as usize / PACE_GRANULE * PACE_GRANULE).max(PACE_FLOOR);
        let width = match self.halve {
            false => width,
            true if width / 2 >= PACE_FLOOR => width / 2 / PACE_GRANULE * PACE_GRANULE,
            true => 2 * width,
        };
        self.halve = !self.halve;
        budget.min(width)
    }

    /// The fitted `(fixed seconds, seconds per token)`. Where the widths measured hardly vary,
    /// or noise makes the fixed part come out negative, all of the time is taken as per-token;
    /// where time does not grow with the width, there is nothing to pace.
    fn fit(&self) -> Option<(f64, f64)> {
        if self.weight == 0.0 {
            return None;
        }
        let mean_n = self.tokens / self.weight;
        let mean_t = self.seconds / self.weight;
        let spread = self.tokens_squared / self.weight - mean_n * mean_n;
        let covariance = self.tokens_seconds / self.weight - mean_n * mean_t;
        if spread > 1e-3 * mean_n * mean_n {
            let per_token = covariance / spread;
            let fixed = mean_t - per_token * mean_n;
            return match (per_token > 0.0, fixed >= 0.0) {
                (false, _) => None,
                (true, true) => Some((fixed, per_token)),
                (true, false) => Some((0.0, mean_t / mean_n)),
            };
        }
        (mean_t > 0.0).then(|| (0.0, mean_t / mean_n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pace that measured forwards of `widths` on a machine taking `fixed + per_token · n`
    /// seconds for `n` tokens.
    fn measured(target_ms: u64, fixed: f64, per_token: f64, widths: &[usize]) -> PrefillPace {
        let mut pace = PrefillPace::new(Some(Duration::from_millis(target_ms)));
        for &n in widths {
            pace.record(n, Duration::from_secs_f64(fixed + per_token * n as f64));
        }
        pace
    }

    #[test]
    fn an_unmeasured_or_unpaced_loop_keeps_its_budget() {
        assert_eq!(
            PrefillPace::new(Some(Duration::from_millis(500))).cap(256),
            256
        );
        let mut unpaced = PrefillPace::new(None);
        unpaced.record(256, Duration::from_secs(10));
        assert_eq!(unpaced.cap(256), 256);
    }

    #[test]
    fn a_fast_model_keeps_its_budget() {
        // 256 tokens in 26 ms.
        let mut pace = measured(500, 0.01, 0.0000625, &[256, 128, 256]);
        assert_eq!(pace.cap(256), 256);
        assert_eq!(pace.cap(256), 256);
    }

    #[test]
    fn a_slow_model_takes_what_fits_in_the_target() {
        // 1 ms per token and 50 ms of fixed cost: 450 tokens fit in 500 ms; 448 is the
        // granule below, and every other step takes half of it.
        let mut pace = measured(500, 0.05, 0.001, &[256, 128, 64]);
        assert_eq!(pace.cap(1024), 448);
        assert_eq!(pace.cap(1024), 224);
        assert_eq!(pace.cap(1024), 448);
    }

    #[test]
    fn a_very_slow_model_keeps_the_floor() {
        // 10 ms per token: 45 tokens would fit in 500 ms, below the floor of 64.
        let mut pace = measured(500, 0.05, 0.01, &[256, 128, 64]);
        assert_eq!(pace.cap(256), PACE_FLOOR);
        assert_eq!(pace.cap(256), 2 * PACE_FLOOR);
        assert_eq!(pace.cap(256), PACE_FLOOR);
    }

    #[test]
    fn one_width_alone_is_paced_by_its_mean_time_per_token() {
        // 256 tokens in 0.256 s, every time: 1 ms a token, 500 tokens in 500 ms.
        let mut pace = measured(500, 0.0, 0.001, &[256, 256, 256]);
        assert_eq!(pace.cap(1024), 496);
    }

    #[test]
    fn a_pace_that_took_small_forwards_for_slow_ones_recovers() {
        // A machine with 400 ms of fixed cost a forward, first measured on 256-token forwards
        // only (their 2.6 ms a token is taken as all per-token).
        let (fixed, per_token) = (0.4, 0.001);
        let time = |n: usize| Duration::from_secs_f64(fixed + per_token * n as f64);
        let mut pace = measured(500, fixed, per_token, &[256, 256]);
        let mut widths = Vec::new();
        for _ in 0..40 {
            let n = pace.cap(1024);
            pace.record(n, time(n));
            widths.push(n);
        }
        // The fixed cost found, steps settle at 400 tokens (as long working as reading the
        // weights) and their half, not at the floor where one width would leave it.
        assert_eq!(&widths[36..], &[400, 192, 400, 192]);
    }

    #[test]
    fn weights_that_alone_outlast_the_target_keep_half_the_time_for_work() {
        // 800 ms to read the weights, 2 ms a token: no width fits 500 ms; 400 tokens would
        // spend as long working as reading.
        let mut pace = measured(500, 0.8, 0.002, &[256, 128, 64, 32]);
        assert_eq!(pace.cap(1024), 400);
        assert_eq!(pace.cap(256), 256);
    }

    #[test]
    fn the_fit_follows_a_machine_that_slows_down() {
        let mut pace = measured(500, 0.0, 0.001, &[256, 128]);
        assert_eq!(pace.cap(256), 256);
        for _ in 0..30 {
            for n in [64, 32] {
                pace.record(n, Duration::from_secs_f64(0.05 * n as f64));
            }
        }
        assert_eq!(pace.cap(256), PACE_FLOOR);
        assert_eq!(pace.cap(256), 2 * PACE_FLOOR);
    }
}
