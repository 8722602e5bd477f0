//! Per-node exponential backoff with error classes (DESIGN.md, "Backoff"; Cilium's
//! `pkg/backoff`, research §4).
//!
//! The n-th consecutive timed failure waits `min · factor^(n−1)`, capped at `max` (the first
//! failure waits `min`; Cilium's first wait is already `min · factor`). With jitter the wait is
//! drawn uniformly from `[min, t]` (Cilium: `rand·(t − min) + min`). With cluster-size scaling,
//! from the second consecutive failure on, the wait is multiplied by `ln(1 + nodes)` (Cilium's
//! `ClusterSizeDependantInterval`; `nodes = 0` leaves it unchanged) and then kept within
//! `[min, max]` — the floor is ours: for one or two nodes `ln(1 + n) < 1.1` would otherwise shrink
//! the wait below `min`. The attempt count starts over when the previous failure lies more than
//! `reset_after` back. Jitter comes from a [`SmallRng`] seeded by the caller, so a simulation
//! with the same seed waits the same.
//!
//! Classes ([`ErrorClass`]): *transient* waits the backoff; *throttled* waits
//! `max(Retry-After, backoff)`; *exhausted* parks until the pool frees (no timer); *permanent*
//! waits for a spec or pool change (no timer). Only the timed classes advance the attempt count:
//! a node parked on an exhausted source or a bad spec is not failing repeatedly, it is waiting
//! for an event, and its next timed wait should not be inflated by that.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::{ErrorClass, IpamError};

/// Backoff settings (`--backoff-min`, `--backoff-max`, `--backoff-reset-after`).
#[derive(Clone, Debug, PartialEq)]
pub struct BackoffConfig {
    /// The first wait, and the lower bound of every wait.
    pub min: Duration,
    /// The upper bound of every wait (Retry-After aside).
    pub max: Duration,
    /// Growth per consecutive failure; at least 1.
    pub factor: f64,
    /// A failure more than this long after the previous one starts the count over.
    pub reset_after: Duration,
    /// Draw each wait uniformly from `[min, t]`.
    pub jitter: bool,
    /// Multiply waits from the second consecutive failure by `ln(1 + nodes)`.
    pub cluster_size_scaling: bool,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            min: Duration::from_secs(1),
            max: Duration::from_secs(300),
            factor: 2.0,
            reset_after: Duration::from_secs(600),
            jitter: true,
            cluster_size_scaling: false,
        }
    }
}

fn invalid(name: &'static str, value: impl std::fmt::Debug, reason: String) -> IpamError {
    IpamError::InvalidSetting {
        name,
        value: format!("{value:?}"),
        reason,
    }
}

impl BackoffConfig {
    /// Checks the settings; the error names the offending flag.
    pub fn validate(&self) -> Result<(), IpamError> {
        if self.min.is_zero() {
            return Err(invalid("backoff-min", self.min, "must be positive".into()));
        }
        if self.min > self.max {
            return Err(invalid(
                "backoff-min",
                self.min,
                format!("must not exceed backoff-max ({:?})", self.max),
            ));
        }
        if !self.factor.is_finite() || self.factor < 1.0 {
            return Err(invalid(
                "backoff-factor",
                self.factor,
                "must be a finite number of at least 1".into(),
            ));
        }
        if self.reset_after <= self.max {
            // Cilium ignores ResetAfter <= Max; we refuse it: the count would start over after
            // every capped wait and the backoff would never stay at max.
            return Err(invalid(
                "backoff-reset-after",
                self.reset_after,
                format!("must exceed backoff-max ({:?})", self.max),
            ));
        }
        Ok(())
    }
}

/// What the runner does after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Try again after this long.
    After(Duration),
    /// Park until the pool frees addresses (woken by the release, no polling).
    ParkUntilPoolFrees,
    /// No retry until the node's spec or its pool changes.
    UntilSpecChanges,
}

/// One node's backoff state: 56 bytes, no heap.
#[derive(Debug, Clone)]
pub struct Backoff {
    attempt: u32,
    last_failure: Option<Instant>,
    rng: SmallRng,
}

impl Backoff {
    /// A fresh backoff whose jitter is drawn from a generator seeded with `seed` (derive it from
    /// the run's seed and the node, so simulations are reproducible).
    pub fn new(_cfg: &BackoffConfig, seed: u64) -> Self {
        Self {
            attempt: 0,
            last_failure: None,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// A failure at `now` of class `class` in a cluster of `nodes` nodes. Resets the attempt
    /// count first if the last failure was more than `reset_after` ago.
    pub fn on_failure(
        &mut self,
        cfg: &BackoffConfig,
        class: ErrorClass,
        now: Instant,
        nodes: usize,
    ) -> Retry {
        if self
            .last_failure
            .is_some_and(|last| now.saturating_duration_since(last) > cfg.reset_after)
        {
            self.attempt = 0;
        }
        let retry_after = match class {
            ErrorClass::Exhausted => return Retry::ParkUntilPoolFrees,
            ErrorClass::Permanent => return Retry::UntilSpecChanges,
            ErrorClass::Transient => Duration::ZERO,
            ErrorClass::Throttled { retry_after } => retry_after.unwrap_or_default(),
        };
        self.last_failure = Some(now);
        self.attempt = self.attempt.saturating_add(1);
        let sample = if cfg.jitter {
            self.rng.random::<f64>()
        } else {
            0.0
        };
        Retry::After(retry_after.max(self.delay(cfg, self.attempt, nodes, sample)))
    }

    #[cfg(test)]
    /// Consecutive timed failures counted so far (0 after [`Backoff::reset`]).
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    #[cfg(test)]
    /// When the last timed failure happened.
    pub fn last_failure(&self) -> Option<Instant> {
        self.last_failure
    }

    #[cfg(test)]
    /// Starts the count over (e.g. the spec changed or this replica just became leader).
    pub fn reset(&mut self) {
        self.attempt = 0;
        self.last_failure = None;
    }

    /// The wait after the `attempt`-th consecutive failure (1-based; 0 counts as 1) in a
    /// cluster of `nodes` nodes, with `jitter_sample` in `[0, 1)` (ignored without jitter).
    /// A pure formula.
    pub fn delay(
        &self,
        cfg: &BackoffConfig,
        attempt: u32,
        nodes: usize,
        jitter_sample: f64,
    ) -> Duration {
        let (min, max) = (cfg.min, cfg.max.max(cfg.min));
        let exp = attempt.saturating_sub(1).min(i32::MAX as u32) as i32;
        let secs = min.as_secs_f64() * cfg.factor.max(1.0).powi(exp);
        let mut t = if secs.is_finite() && secs < max.as_secs_f64() {
            Duration::from_secs_f64(secs).clamp(min, max)
        } else {
            max
        };
        if cfg.jitter {
            let s = if jitter_sample.is_finite() {
                jitter_sample.clamp(0.0, 1.0)
            } else {
                0.0
            };
            t = min + (t - min).mul_f64(s);
        }
        if cfg.cluster_size_scaling && attempt >= 2 && nodes > 0 {
            let scale = (1.0 + nodes as f64).ln();
            t = Duration::try_from_secs_f64(t.as_secs_f64() * scale)
                .unwrap_or(max)
                .clamp(min, max);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn no_jitter() -> BackoffConfig {
        BackoffConfig {
            jitter: false,
            ..BackoffConfig::default()
        }
    }

    fn after(r: Retry) -> Duration {
        match r {
            Retry::After(d) => d,
            other => panic!("expected After, got {other:?}"),
        }
    }

    #[test]
    fn default_matches_design() {
        let c = BackoffConfig::default();
        assert_eq!(c.min, S(1));
        assert_eq!(c.max, S(300));
        assert_eq!(c.factor, 2.0);
        assert_eq!(c.reset_after, S(600));
        assert!(c.jitter);
        assert!(!c.cluster_size_scaling);
        assert_eq!(c.validate(), Ok(()));
        assert!(size_of::<Backoff>() <= 64, "{}", size_of::<Backoff>());
        eprintln!("size_of Backoff {}", size_of::<Backoff>());
    }

    #[tokio::test(start_paused = true)]
    async fn exact_sequence_without_jitter() {
        let cfg = no_jitter();
        let mut b = Backoff::new(&cfg, 1);
        let mut got = Vec::new();
        for _ in 0..12 {
            got.push(after(b.on_failure(
                &cfg,
                ErrorClass::Transient,
                Instant::now(),
                1000,
            )));
            tokio::time::advance(S(1)).await;
        }
        let want: Vec<_> = [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
            .into_iter()
            .map(S)
            .collect();
        assert_eq!(got, want);
        assert_eq!(b.attempts(), 12);
    }

    #[test]
    fn pure_formula_and_other_factors() {
        let cfg = no_jitter();
        let b = Backoff::new(&cfg, 0);
        assert_eq!(b.delay(&cfg, 1, 0, 0.5), S(1), "first failure waits min");
        assert_eq!(b.delay(&cfg, 0, 0, 0.5), S(1));
        assert_eq!(b.delay(&cfg, 9, 0, 0.5), S(256));
        assert_eq!(b.delay(&cfg, 10, 0, 0.5), S(300));
        assert_eq!(b.delay(&cfg, u32::MAX, 0, 0.5), S(300), "no overflow");
        let slow = BackoffConfig {
            factor: 1.5,
            min: Duration::from_millis(100),
            ..no_jitter()
        };
        assert_eq!(b.delay(&slow, 3, 0, 0.0), Duration::from_millis(225));
        let flat = BackoffConfig {
            factor: 1.0,
            ..no_jitter()
        };
        assert_eq!(b.delay(&flat, 50, 0, 0.0), S(1));
        let unbounded = BackoffConfig {
            max: Duration::MAX,
            reset_after: Duration::MAX,
            cluster_size_scaling: true,
            ..BackoffConfig::default()
        };
        assert_eq!(b.delay(&unbounded, u32::MAX, 1 << 40, 0.999), Duration::MAX);
    }

    #[test]
    fn jitter_stays_within_min_and_t() {
        let cfg = BackoffConfig::default();
        let b = Backoff::new(&cfg, 0);
        assert_eq!(b.delay(&cfg, 5, 0, 0.0), S(1), "sample 0 → min");
        assert_eq!(b.delay(&cfg, 5, 0, 0.5), Duration::from_millis(8500));
        assert!(b.delay(&cfg, 5, 0, 0.999_999) <= S(16));
        assert_eq!(b.delay(&cfg, 5, 0, 7.0), S(16), "samples clamp to [0, 1]");

        let mut b = Backoff::new(&cfg, 42);
        let now = Instant::now();
        let mut distinct = std::collections::BTreeSet::new();
        for attempt in 1..=40u32 {
            let d = after(b.on_failure(&cfg, ErrorClass::Transient, now, 0));
            let t = S(1u64 << (attempt - 1).min(9)).min(S(300));
            assert!(
                d >= S(1) && d <= t,
                "attempt {attempt}: {d:?} outside [1s, {t:?}]"
            );
            distinct.insert(d);
        }
        assert!(distinct.len() > 30, "jitter does not vary: {distinct:?}");
    }

    #[test]
    fn deterministic_for_a_seed() {
        let cfg = BackoffConfig::default();
        let now = Instant::now();
        let run = |seed| {
            let mut b = Backoff::new(&cfg, seed);
            (0..20)
                .map(|_| after(b.on_failure(&cfg, ErrorClass::Transient, now, 10)))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[tokio::test(start_paused = true)]
    async fn resets_after_ten_quiet_minutes() {
        let cfg = no_jitter();
        let mut b = Backoff::new(&cfg, 1);
        let t0 = Instant::now();
        assert_eq!(
            after(b.on_failure(&cfg, ErrorClass::Transient, t0, 0)),
            S(1)
        );
        assert_eq!(
            after(b.on_failure(&cfg, ErrorClass::Transient, t0 + S(1), 0)),
            S(2)
        );
        // Exactly reset_after later: not more than it, no reset.
        let t2 = t0 + S(1) + S(600);
        assert_eq!(
            after(b.on_failure(&cfg, ErrorClass::Transient, t2, 0)),
            S(4)
        );
        assert_eq!(b.attempts(), 3);
        // More than reset_after after the previous failure: starts over.
        let t3 = t2 + S(601);
        assert_eq!(
            after(b.on_failure(&cfg, ErrorClass::Transient, t3, 0)),
            S(1)
        );
        assert_eq!(b.attempts(), 1);
        assert_eq!(b.last_failure(), Some(t3));
        b.reset();
        assert_eq!(b.attempts(), 0);
        assert_eq!(
            after(b.on_failure(&cfg, ErrorClass::Transient, t3, 0)),
            S(1)
        );
    }

    #[test]
    fn throttled_waits_retry_after_when_larger() {
        let cfg = no_jitter();
        let mut b = Backoff::new(&cfg, 1);
        let now = Instant::now();
        let throttled = |s| ErrorClass::Throttled {
            retry_after: Some(S(s)),
        };
        assert_eq!(after(b.on_failure(&cfg, throttled(30), now, 0)), S(30));
        assert_eq!(after(b.on_failure(&cfg, throttled(0), now, 0)), S(2));
        assert_eq!(after(b.on_failure(&cfg, throttled(3), now, 0)), S(4));
        let none = ErrorClass::Throttled { retry_after: None };
        assert_eq!(after(b.on_failure(&cfg, none, now, 0)), S(8));
        // Retry-After beyond max is honoured: the server knows best.
        assert_eq!(after(b.on_failure(&cfg, throttled(900), now, 0)), S(900));
        assert_eq!(b.attempts(), 5, "throttling counts as a failure");
    }

    #[test]
    fn scaling_only_from_the_second_failure() {
        let cfg = BackoffConfig {
            cluster_size_scaling: true,
            ..no_jitter()
        };
        let mut b = Backoff::new(&cfg, 1);
        let now = Instant::now();
        let ln101 = (101f64).ln();
        assert_eq!(
            after(b.on_failure(&cfg, ErrorClass::Transient, now, 100)),
            S(1)
        );
        let second = after(b.on_failure(&cfg, ErrorClass::Transient, now, 100));
        assert!(
            (second.as_secs_f64() - 2.0 * ln101).abs() < 1e-6,
            "{second:?}"
        );
        assert_eq!(
            b.delay(&cfg, 6, 100, 0.0).as_secs_f64().round(),
            (32.0 * ln101).round()
        );
        assert_eq!(
            b.delay(&cfg, 8, 100, 0.0),
            S(300),
            "capped again after scaling"
        );
        assert_eq!(b.delay(&cfg, 2, 0, 0.0), S(2), "no nodes: unscaled");
        // One node: ln 2 < 1, floored at min.
        let jit = BackoffConfig {
            jitter: true,
            ..cfg.clone()
        };
        assert_eq!(b.delay(&jit, 2, 1, 0.0), S(1));
        // Cilium's table (base 1 min, 100 nodes = 4m36.9s) holds where min and max allow.
        let base = BackoffConfig {
            min: S(60),
            max: S(3600),
            reset_after: S(7200),
            factor: 1.0,
            ..cfg
        };
        assert_eq!(b.delay(&base, 2, 1024, 0.0).as_secs(), 415); // 6m55.9s
        assert_eq!(b.delay(&base, 2, 16384, 0.0).as_secs(), 582); // 9m42.2s
    }

    #[test]
    fn classes() {
        let cfg = BackoffConfig::default();
        let mut b = Backoff::new(&cfg, 1);
        let now = Instant::now();
        assert_eq!(
            b.on_failure(&cfg, ErrorClass::Exhausted, now, 5),
            Retry::ParkUntilPoolFrees
        );
        assert_eq!(
            b.on_failure(&cfg, ErrorClass::Permanent, now, 5),
            Retry::UntilSpecChanges
        );
        assert_eq!(b.attempts(), 0, "untimed classes do not advance the count");
        assert_eq!(b.last_failure(), None);
        assert!(matches!(
            b.on_failure(&cfg, ErrorClass::Transient, now, 5),
            Retry::After(_)
        ));
        assert_eq!(b.attempts(), 1);
        // An engine error maps through its class: NotLeader is transient (attempt 2: 1s..2s).
        let d = after(b.on_failure(&cfg, IpamError::NotLeader.class(), now, 5));
        assert!(d >= S(1) && d <= S(2), "{d:?}");
        assert_eq!(b.attempts(), 2);
    }

    #[test]
    fn validate_names_the_field() {
        let check = |cfg: BackoffConfig, field: &str| match cfg.validate() {
            Err(IpamError::InvalidSetting { name, .. }) => assert_eq!(name, field),
            other => panic!("{field}: expected InvalidSetting, got {other:?}"),
        };
        let d = BackoffConfig::default;
        check(BackoffConfig { min: S(0), ..d() }, "backoff-min");
        check(BackoffConfig { min: S(301), ..d() }, "backoff-min");
        check(BackoffConfig { factor: 0.5, ..d() }, "backoff-factor");
        check(
            BackoffConfig {
                factor: f64::NAN,
                ..d()
            },
            "backoff-factor",
        );
        check(
            BackoffConfig {
                reset_after: S(300),
                ..d()
            },
            "backoff-reset-after",
        );
        let err = BackoffConfig { min: S(301), ..d() }
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("backoff-min") && err.contains("backoff-max"),
            "{err}"
        );
        assert_eq!(
            BackoffConfig {
                min: S(300),
                factor: 1.0,
                ..d()
            }
            .validate(),
            Ok(())
        );
    }
}
