//! The promise's breach counter (issue 30, "The promise"): under scarcity, no pod of pool
//! P waits longer than T while another node of P holds a releasable unit beyond its own
//! `used + waiting`, and has held one for longer than T: the engine may keep an excess for
//! the release delay before it gives it back (DESIGN.md's handshake), so a unit that turns
//! up and is taken again by its own node's next pod within T is not one it could have
//! moved (with churn that replaces a node's pods in place, most are). Pure: it is handed the world's state of each pool at each sample
//! ([`PoolSample`]) and keeps the pools' scarcity and the breaches. Scarcity is judged
//! here on the world's truth by DESIGN.md's rule (pressure `(used + waiting + cooldown) /
//! capacity` entering at `--scarcity-enter`, leaving below `--scarcity-exit` no sooner
//! than `--scarcity-min-duration`), independently of the engine's own measure, as the
//! observer judges the engine's safety.

use std::collections::BTreeMap;

use foldhash::HashSet;
use std::time::Duration;

use tidepool_ipam::{NodeName, PodUid, ScarcityConfig};
use tokio::time::Instant;

use super::PoolKey;

/// How often the run samples the pools (docs/simulate.md "Scarcity").
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// One pool and family as the world holds it at a sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolSample {
    /// Usable addresses of the pool.
    pub capacity: u128,
    pub used: u128,
    pub cooldown: u128,
    /// Pods of the pool waiting for an address: their node, and since when.
    pub waiting: Vec<(NodeName, PodUid, Instant)>,
    /// Nodes holding releasable units beyond their own `used + waiting` (whole blocks with
    /// no used or cooling address; free addresses for a per-address source), with how many.
    pub holders: Vec<(NodeName, u64)>,
}

/// What the counter found in one pool.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolBreaches {
    /// Times the pool entered scarcity.
    pub episodes: u64,
    /// Pods that waited longer than T while another node held a releasable unit.
    pub pods: u64,
    /// Their waiting beyond T while it held, summed.
    pub seconds_beyond: f64,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Scarce since when, if it is.
    scarce_since: Option<Instant>,
    breaches: PoolBreaches,
    breached: HashSet<PodUid>,
    /// Each holder, since when it has held a releasable unit without a break.
    holding_since: BTreeMap<NodeName, Instant>,
}

/// The counter over a run's samples.
#[derive(Debug)]
pub struct PromiseCounter {
    cfg: ScarcityConfig,
    /// T: how long a pod may wait while a unit idles elsewhere.
    limit: Duration,
    pools: BTreeMap<PoolKey, PoolState>,
    last: Option<Instant>,
}

impl PromiseCounter {
    pub fn new(cfg: ScarcityConfig, limit: Duration) -> PromiseCounter {
        PromiseCounter {
            cfg,
            limit,
            pools: BTreeMap::new(),
            last: None,
        }
    }

    /// T.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Takes the pools' state at `now`: their scarcity, and the breaches since the last
    /// sample (a pod breaching at this sample counts the time since the last one, at most
    /// [`SAMPLE_PERIOD`], beyond T).
    pub fn observe(&mut self, now: Instant, samples: &BTreeMap<PoolKey, PoolSample>) {
        let since = self
            .last
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        let dt = since.min(SAMPLE_PERIOD);
        self.last = Some(now);
        for (key, s) in samples {
            let p = self.pools.entry(key.clone()).or_default();
            p.holding_since
                .retain(|n, _| s.holders.iter().any(|(h, k)| h == n && *k > 0));
            for (n, _) in s.holders.iter().filter(|(_, k)| *k > 0) {
                p.holding_since.entry(n.clone()).or_insert(now);
            }
            let demand = s.used + s.waiting.len() as u128 + s.cooldown;
            let pressure = demand as f64 / s.capacity.max(1) as f64;
            match p.scarce_since {
                None if pressure >= self.cfg.enter => {
                    p.scarce_since = Some(now);
                    p.breaches.episodes += 1;
                }
                Some(since) if pressure < self.cfg.exit && now >= since + self.cfg.min_duration => {
                    p.scarce_since = None;
                }
                _ => {}
            }
            if p.scarce_since.is_none() || s.holders.is_empty() {
                continue;
            }
            let limit = self.limit;
            let held_past_t = |n: &NodeName| {
                (p.holding_since.get(n)).is_some_and(|t| now.saturating_duration_since(*t) > limit)
            };
            for (node, uid, since) in &s.waiting {
                let waited = now.saturating_duration_since(*since);
                let elsewhere = (p.holding_since.keys()).any(|n| n != node && held_past_t(n));
                if waited <= self.limit || !elsewhere {
                    continue;
                }
                if p.breached.insert(*uid) {
                    p.breaches.pods += 1;
                }
                p.breaches.seconds_beyond += dt.min(waited - self.limit).as_secs_f64();
            }
        }
    }

    /// Whether some pool is scarce now.
    pub fn any_scarce(&self) -> bool {
        self.pools.values().any(|p| p.scarce_since.is_some())
    }

    /// Each pool's findings.
    pub fn pools(&self) -> impl Iterator<Item = (&PoolKey, &PoolBreaches)> {
        self.pools.iter().map(|(k, p)| (k, &p.breaches))
    }
}
