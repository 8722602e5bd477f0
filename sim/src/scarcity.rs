//! The report's scarcity section (issue 30; docs/simulate.md "Scarcity"): the promise's
//! breaches ([`promise`]), the waiting-time oracle ([`oracle`]) and the actual waiting,
//! per pool and family. Measured on the world's truth; nothing here calls the engine.

pub mod oracle;
pub mod promise;
pub(crate) mod sample;

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tidepool_ipam::Family;

use oracle::{ClaimBudget, OracleLimits, PoolOracle};
use promise::PromiseCounter;

/// A pool and family: a cluster pool by name, a cloud subnet (`subnet-<index>`), or the
/// in-memory source (`source`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    pub pool: Arc<str>,
    pub family: Family,
}

/// The promise's breaches in a pool, or in all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct IdleWhileWaiting {
    /// Pods that waited longer than `promise_seconds` while another node of their pool held
    /// a releasable unit beyond its own used + waiting.
    pub pods: u64,
    /// Their waiting beyond `promise_seconds` while that held, summed.
    pub seconds: f64,
}

/// One pool and family's scarcity figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PoolScarcity {
    pub pool: String,
    pub family: &'static str,
    pub episodes: u64,
    pub idle_while_waiting: IdleWhileWaiting,
    pub wait_seconds: f64,
    pub oracle_wait_seconds: f64,
}

/// The report's `scarcity` section: all zero (and no pools) for a run where no pool ever
/// became scarce. The totals are the sums over the pools of the family that waited most
/// (a dual-stack pod waits in both families at once).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScarcityReport {
    /// Times a pool entered scarcity.
    pub episodes: u64,
    /// T: the scarcity release delay, plus one handshake, plus one claim.
    pub promise_seconds: f64,
    pub idle_while_waiting: IdleWhileWaiting,
    /// Pod-waiting seconds of the measured period.
    pub wait_seconds: f64,
    /// The fewest pod-waiting seconds the oracle allows (a lower bound).
    pub oracle_wait_seconds: f64,
    pub pools: Vec<PoolScarcity>,
}

impl ScarcityReport {
    /// The section from the counter's findings and the oracles' (pool, oracle, actual)
    /// seconds.
    pub fn build(promise: &PromiseCounter, waits: &BTreeMap<PoolKey, (f64, f64)>) -> Self {
        let mut pools: Vec<PoolScarcity> = Vec::new();
        for (key, b) in promise.pools() {
            let (oracle, actual) = waits.get(key).copied().unwrap_or_default();
            pools.push(PoolScarcity {
                pool: key.pool.to_string(),
                family: key.family.as_str(),
                episodes: b.episodes,
                idle_while_waiting: IdleWhileWaiting {
                    pods: b.pods,
                    seconds: round3(b.seconds_beyond),
                },
                wait_seconds: round3(actual),
                oracle_wait_seconds: round3(oracle),
            });
        }
        if pools.iter().all(|p| p.episodes == 0) {
            return ScarcityReport::default();
        }
        let mut by_family = BTreeMap::<&str, ScarcityReport>::new();
        for p in &pools {
            let r = by_family.entry(p.family).or_default();
            r.episodes += p.episodes;
            r.idle_while_waiting.pods += p.idle_while_waiting.pods;
            r.idle_while_waiting.seconds += p.idle_while_waiting.seconds;
            r.wait_seconds += p.wait_seconds;
            r.oracle_wait_seconds += p.oracle_wait_seconds;
        }
        let most = (by_family.into_values())
            .max_by(|a, b| a.wait_seconds.total_cmp(&b.wait_seconds))
            .unwrap_or_default();
        ScarcityReport {
            promise_seconds: round3(promise.limit().as_secs_f64()),
            idle_while_waiting: IdleWhileWaiting {
                seconds: round3(most.idle_while_waiting.seconds),
                ..most.idle_while_waiting
            },
            wait_seconds: round3(most.wait_seconds),
            oracle_wait_seconds: round3(most.oracle_wait_seconds),
            pools,
            ..most
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The settings every pool's oracle shares (its unit and capacity are the pool's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OracleSettings {
    pub node_cap: u64,
    pub move_cost: Duration,
    pub reclaim_grace: Duration,
    pub reclaim_min_age: Duration,
    pub cooldown: Duration,
    pub claims: Option<ClaimBudget>,
}

/// The world's oracles, one per pool and family, and the pool sets its pods belong to
/// (a pod's set is one pool per family, kept as a small index in the pod's record).
#[derive(Debug)]
pub(crate) struct OracleBook {
    settings: OracleSettings,
    sets: Vec<Box<[PoolKey]>>,
    set_index: HashMap<Box<[PoolKey]>, u16>,
    oracles: BTreeMap<PoolKey, PoolOracle>,
    measure_from: Duration,
}

impl OracleBook {
    pub(crate) fn new(settings: OracleSettings) -> Self {
        OracleBook {
            settings,
            sets: Vec::new(),
            set_index: HashMap::default(),
            oracles: BTreeMap::new(),
            measure_from: Duration::ZERO,
        }
    }

    /// The index of a pod's pools (one per family); a pool new to the book gets an oracle
    /// of the size (usable addresses, addresses per unit) `size` gives it.
    pub(crate) fn set_of(
        &mut self,
        keys: Vec<PoolKey>,
        size: impl Fn(&PoolKey) -> (u128, u64),
        now: Duration,
    ) -> u16 {
        for k in &keys {
            if !self.oracles.contains_key(k) {
                let ((addresses, unit), s) = (size(k), self.settings);
                let limits = OracleLimits {
                    unit: unit.max(1),
                    capacity: units(addresses, unit),
                    node_cap: s.node_cap,
                    move_cost: s.move_cost,
                    reclaim_grace: s.reclaim_grace,
                    reclaim_min_age: s.reclaim_min_age,
                    cooldown: s.cooldown,
                    claims: s.claims,
                };
                let mut o = PoolOracle::new(limits, now);
                o.measure_from(self.measure_from);
                self.oracles.insert(k.clone(), o);
            }
        }
        let keys: Box<[PoolKey]> = keys.into_boxed_slice();
        if let Some(i) = self.set_index.get(&keys) {
            return *i;
        }
        let i = u16::try_from(self.sets.len()).unwrap_or(u16::MAX);
        self.sets.push(keys.clone());
        self.set_index.insert(keys, i);
        i
    }

    /// The pools of set `set`.
    pub(crate) fn keys(&self, set: u16) -> &[PoolKey] {
        self.sets.get(usize::from(set)).map_or(&[], |k| &k[..])
    }

    /// Applies `f` to the oracle of each pool of `set`.
    pub(crate) fn each(&mut self, set: u16, mut f: impl FnMut(&mut PoolOracle)) {
        let Some(keys) = self.sets.get(usize::from(set)) else {
            return;
        };
        for k in keys.iter() {
            if let Some(o) = self.oracles.get_mut(k) {
                f(o);
            }
        }
    }

    pub(crate) fn measure_from(&mut self, at: Duration) {
        self.measure_from = at;
        for o in self.oracles.values_mut() {
            o.measure_from(at);
        }
    }

    /// A pool's usable addresses changed (a cloud subnet's).
    pub(crate) fn set_capacity(&mut self, key: &PoolKey, at: Duration, addresses: u128, unit: u64) {
        if let Some(o) = self.oracles.get_mut(key) {
            o.set_capacity(at, units(addresses, unit));
        }
    }

    /// The highest share of its pool any pool's pods and holds occupy now.
    pub(crate) fn busiest_share(&self) -> f64 {
        (self.oracles.values())
            .map(PoolOracle::occupied_share)
            .fold(0.0, f64::max)
    }

    /// Every pool's (oracle, actual) waiting seconds up to `at`.
    pub(crate) fn finish(&mut self, at: Duration) -> BTreeMap<PoolKey, (f64, f64)> {
        (self.oracles.iter_mut())
            .map(|(k, o)| (k.clone(), o.finish(at)))
            .collect()
    }
}

/// Whole units in `addresses` (a pool's reserved addresses leave its last block whole).
fn units(addresses: u128, unit: u64) -> u64 {
    let u = addresses.div_ceil(u128::from(unit.max(1)));
    u64::try_from(u).unwrap_or(u64::MAX)
}
