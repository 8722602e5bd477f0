//! Scarcity (DESIGN.md "The engine", issue 30): when a pool's demand nears its capacity,
//! warm pools give way. Pure rules: the pressure, the hysteresis that says whether a pool
//! is scarce, and the squeeze a scarce pool puts on its nodes' watermarks. The manager's
//! pool step ([`crate::shared::Shared::pool_step`]) applies them.
//!
//! Pressure is measured on demand (`used + waiting + cooldown`), never on free addresses:
//! those include the warm pools themselves, so a control that frees them would switch
//! itself off.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::IpamError;
use crate::types::Family;
use crate::watermarks::Watermarks;

/// The `--scarcity-*` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScarcityConfig {
    /// `--scarcity-handling`: false keeps the watermarks whatever the pressure (the pressure
    /// and the `Scarce` state are still measured and shown).
    pub enabled: bool,
    /// `--scarcity-enter`: a pool becomes scarce at this pressure.
    pub enter: f64,
    /// `--scarcity-exit`: a scarce pool leaves below this pressure...
    pub exit: f64,
    /// `--scarcity-min-duration`: ...no sooner than this after it entered.
    pub min_duration: Duration,
    /// `--scarcity-release-delay`: how long excess must persist before it is marked, on a
    /// scarce pool (instead of `--excess-ip-release-delay`).
    pub release_delay: Duration,
}

impl Default for ScarcityConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            enter: 0.85,
            exit: 0.75,
            min_duration: Duration::from_secs(300),
            release_delay: Duration::from_secs(10),
        }
    }
}

impl ScarcityConfig {
    /// Rejects thresholds that cannot work, naming the flag: 0 < exit ≤ enter ≤ 1.
    pub fn validate(&self) -> Result<(), IpamError> {
        let bad = |name: &'static str, value: f64, reason: &str| {
            Err(IpamError::InvalidSetting {
                name,
                value: value.to_string(),
                reason: reason.into(),
            })
        };
        if !(self.enter > 0.0 && self.enter <= 1.0) {
            return bad("scarcity-enter", self.enter, "must be in (0, 1]");
        }
        if !(self.exit > 0.0 && self.exit <= self.enter) {
            return bad(
                "scarcity-exit",
                self.exit,
                "must be in (0, --scarcity-enter]",
            );
        }
        Ok(())
    }

    /// The pressure at which a scarce pool's pre-allocation reaches 0: halfway between
    /// `enter` and a full pool (0.925 with the defaults).
    fn lean_at(&self) -> f64 {
        f64::midpoint(self.enter, 1.0)
    }
}

/// `(used + waiting + cooldown) / capacity`; a pool of no capacity is full (1.0) when
/// anything is demanded of it, else empty.
pub fn pressure(used: u128, waiting: u128, cooldown: u128, capacity: u128) -> f64 {
    let demand = used.saturating_add(waiting).saturating_add(cooldown);
    match capacity {
        0 => f64::from(u8::from(demand > 0)),
        c => demand as f64 / c as f64,
    }
}

/// A pool's scarcity over time: scarce since when, if it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hysteresis {
    pub scarce_since: Option<Instant>,
}

/// A change of a pool's scarcity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Entered,
    Left,
}

impl Hysteresis {
    /// Takes one measurement: enters at `enter`, leaves below `exit` once `min_duration`
    /// has passed since entering.
    pub fn observe(&mut self, cfg: &ScarcityConfig, pressure: f64, now: Instant) -> Option<Change> {
        match self.scarce_since {
            None if pressure >= cfg.enter => {
                self.scarce_since = Some(now);
                Some(Change::Entered)
            }
            Some(since) if pressure < cfg.exit && now >= since + cfg.min_duration => {
                self.scarce_since = None;
                Some(Change::Left)
            }
            _ => None,
        }
    }

    pub fn scarce(&self) -> bool {
        self.scarce_since.is_some()
    }
}

/// The squeeze of each scarce pool (by name, "" for a source without pools, and family),
/// as the maintainers plan with it; a pool not in it is not scarce.
pub type Squeezes = BTreeMap<(Arc<str>, Family), Squeeze>;

/// Whether the pool `key` keeps less pre-allocation under `now` than under `before` (no
/// squeeze keeps all of it): a plan made under `before` claims more than the pool now
/// allows.
pub fn tightened(before: &Squeezes, now: &Squeezes, key: &(Arc<str>, Family)) -> bool {
    let kept = |s: &Squeezes| s.get(key).map_or(1000, |q| q.keep_per_mille);
    kept(now) < kept(before)
}

/// What a scarce pool does to its nodes' watermarks and release delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Squeeze {
    /// Per mille of each node's pre-allocation kept (integer, so runs stay deterministic).
    pub keep_per_mille: u16,
    pub release_delay: Duration,
}

/// The squeeze on a scarce pool at `pressure`: the pre-allocation kept falls linearly from
/// all of it at `exit` to none at [`ScarcityConfig::lean_at`], and is none while any node of
/// the pool has pods waiting (then no node claims beyond its own `used + waiting`).
pub fn squeeze(cfg: &ScarcityConfig, pressure: f64, pods_waiting: bool) -> Squeeze {
    let lean = cfg.lean_at();
    let kept = if pods_waiting || pressure >= lean {
        0.0
    } else {
        ((lean - pressure) / (lean - cfg.exit)).clamp(0.0, 1.0)
    };
    Squeeze {
        keep_per_mille: (kept * 1000.0).floor() as u16,
        release_delay: cfg.release_delay,
    }
}

impl Squeeze {
    /// A lane's watermarks under the squeeze: pre-allocation scaled down, `min_allocate`
    /// and `max_above_watermark` ignored (they would claim or keep beyond the need), the
    /// hard cap kept.
    pub fn apply(&self, w: &Watermarks) -> Watermarks {
        let pre = u64::from(w.pre_allocate) * u64::from(self.keep_per_mille) / 1000;
        Watermarks {
            pre_allocate: pre as u32,
            min_allocate: 0,
            max_above_watermark: 0,
            max_allocate: w.max_allocate,
        }
    }

    /// The excess-persistence delay of a squeezed lane: the shorter of the two.
    pub fn release_delay(&self, normal: Duration) -> Duration {
        normal.min(self.release_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ScarcityConfig {
        ScarcityConfig::default()
    }

    #[test]
    fn pressure_counts_demand_not_free_addresses() {
        assert!((pressure(646, 254, 0, 1024) - 900.0 / 1024.0).abs() < 1e-12);
        assert!((pressure(10, 0, 5, 100) - 0.15).abs() < 1e-12);
        assert_eq!(pressure(0, 0, 0, 0), 0.0);
        assert_eq!(pressure(0, 1, 0, 0), 1.0);
    }

    #[test]
    fn a_squeeze_tightens_when_it_keeps_less_than_before() {
        let key = (Arc::<str>::from("blue"), Family::V4);
        let other = (Arc::<str>::from("green"), Family::V4);
        let q = |keep_per_mille| Squeeze {
            keep_per_mille,
            release_delay: Duration::from_secs(10),
        };
        let none = Squeezes::new();
        let half: Squeezes = [(key.clone(), q(500))].into();
        let zero: Squeezes = [(key.clone(), q(0))].into();
        assert!(tightened(&none, &half, &key), "scarcity entered");
        assert!(tightened(&half, &zero, &key), "squeezed harder");
        assert!(!tightened(&half, &half, &key), "unchanged");
        assert!(!tightened(&zero, &half, &key), "loosened");
        assert!(!tightened(&half, &none, &key), "scarcity left");
        assert!(!tightened(&none, &half, &other), "another pool");
    }

    #[tokio::test(start_paused = true)]
    async fn enters_at_enter_and_leaves_below_exit_after_the_dwell() {
        let c = cfg();
        let t0 = Instant::now();
        let mut h = Hysteresis::default();
        assert_eq!(h.observe(&c, 0.84, t0), None);
        assert_eq!(h.observe(&c, 0.85, t0), Some(Change::Entered));
        assert_eq!(h.scarce_since, Some(t0));
        // between the thresholds: stays
        assert_eq!(h.observe(&c, 0.80, t0 + Duration::from_secs(600)), None);
        // below exit, but within the dwell: stays
        let mut early = Hysteresis::default();
        early.observe(&c, 0.9, t0);
        assert_eq!(early.observe(&c, 0.5, t0 + Duration::from_secs(299)), None);
        assert!(early.scarce());
        assert_eq!(
            early.observe(&c, 0.5, t0 + Duration::from_secs(300)),
            Some(Change::Left)
        );
        // exactly at exit is not below it
        assert_eq!(h.observe(&c, 0.75, t0 + Duration::from_secs(900)), None);
        assert_eq!(
            h.observe(&c, 0.7499, t0 + Duration::from_secs(900)),
            Some(Change::Left)
        );
        assert!(!h.scarce());
    }

    /// A workload oscillating ±2 % around either threshold, measured every 10 s for an
    /// hour, changes `Scarce` at most twice.
    #[tokio::test(start_paused = true)]
    async fn oscillation_around_a_threshold_changes_at_most_twice_an_hour() {
        let c = cfg();
        let t0 = Instant::now();
        for centre in [c.enter, c.exit] {
            for period in [20u64, 60, 600] {
                let mut h = Hysteresis::default();
                // start scarce around the exit threshold, as a pool that came down would be
                if centre == c.exit {
                    h.observe(&c, 1.0, t0);
                }
                let mut changes = 0;
                for step in 0..360u64 {
                    let t = step * 10;
                    let up = (t / (period / 2).max(1)) % 2 == 0;
                    let p = centre + if up { 0.02 } else { -0.02 };
                    changes += usize::from(h.observe(&c, p, t0 + Duration::from_secs(t)).is_some());
                }
                assert!(changes <= 2, "centre {centre}, period {period}s: {changes}");
                assert!(
                    changes >= 1,
                    "centre {centre}, period {period}s: never changed"
                );
            }
        }
    }

    #[test]
    fn the_squeeze_reaches_zero_before_the_pool_is_full() {
        let c = cfg();
        let keep = |p| squeeze(&c, p, false).keep_per_mille;
        assert_eq!(keep(0.75), 1000);
        assert!(keep(0.85) < 1000 && keep(0.85) > 0, "{}", keep(0.85));
        assert!(keep(0.90) < keep(0.85));
        assert_eq!(keep(0.925), 0);
        assert_eq!(keep(0.99), 0);
        // pods waiting in the pool: nothing beyond the need
        assert_eq!(squeeze(&c, 0.80, true).keep_per_mille, 0);
        let mut last = 1001;
        for i in 0..=100 {
            let k = keep(0.75 + f64::from(i) * 0.0025);
            assert!(k <= last, "the squeeze never loosens as pressure rises");
            last = k;
        }
    }

    #[test]
    fn a_squeezed_lane_ignores_min_allocate_and_keeps_its_cap() {
        let w = Watermarks {
            pre_allocate: 8,
            min_allocate: 16,
            max_allocate: 40,
            max_above_watermark: 4,
        };
        let s = Squeeze {
            keep_per_mille: 500,
            release_delay: Duration::from_secs(10),
        };
        let got = s.apply(&w);
        assert_eq!(
            (
                got.pre_allocate,
                got.min_allocate,
                got.max_above_watermark,
                got.max_allocate
            ),
            (4, 0, 0, 40)
        );
        assert_eq!(
            s.release_delay(Duration::from_secs(180)),
            Duration::from_secs(10)
        );
        assert_eq!(
            s.release_delay(Duration::from_secs(2)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn thresholds_are_validated_by_name() {
        let mut c = cfg();
        c.exit = 0.9;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("scarcity-exit"), "{e}");
        let c = ScarcityConfig {
            enter: 1.5,
            ..cfg()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("scarcity-enter")
        );
        assert!(cfg().validate().is_ok());
    }
}
