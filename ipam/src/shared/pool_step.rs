//! The manager's pool step (DESIGN.md "The engine", Scarcity): each pool's pressure from
//! the aggregate stats, its scarcity through the hysteresis, and the squeeze its nodes plan
//! with. Run at every resync and whenever a pass changes a node's figures of a pool;
//! deterministic (no clock but tokio's, no iteration but in key order).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::{NodeHandle, Shared};
use crate::plan::LaneSummary;
use crate::pods::PodView;
use crate::scarcity::{self, Change, Hysteresis, Squeeze, Squeezes};
use crate::source::IpSource;
use crate::stats::PoolTotals;
use crate::store::NodeStore;
use crate::trigger::Reason;
use crate::types::Family;

/// A pool by name ("" for a source without pools) and family.
pub(crate) type PoolKey = (Arc<str>, Family);

/// Every pool's scarcity, and the squeezes as the maintainers read them.
#[derive(Debug, Default)]
pub(crate) struct PoolScarcity {
    pools: BTreeMap<PoolKey, PoolState>,
    squeezes: Arc<Squeezes>,
}

#[derive(Debug, Default, Clone, Copy)]
struct PoolState {
    hysteresis: Hysteresis,
    pressure: f64,
    squeeze: Option<Squeeze>,
}

/// One pool's scarcity as a person reads it (the IPPool's `Scarce` condition, `check`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScarcityState {
    pub pool: Arc<str>,
    pub family: Family,
    /// (used + waiting + cooldown) / capacity.
    pub pressure: f64,
    pub scarce: bool,
    /// The share of each node's pre-allocation kept (1 unless squeezed).
    pub kept: f64,
}

impl<S: IpSource, N: NodeStore, P: PodView> Shared<S, N, P> {
    /// The squeezes to plan with.
    pub fn squeezes(&self) -> Arc<Squeezes> {
        self.scarcity.lock().squeezes.clone()
    }

    /// Every pool's scarcity, in pool and family order.
    pub fn scarcity_states(&self) -> Vec<ScarcityState> {
        let table = self.scarcity.lock();
        (table.pools.iter())
            .map(|((pool, family), st)| ScarcityState {
                pool: pool.clone(),
                family: *family,
                pressure: st.pressure,
                scarce: st.hysteresis.scarce(),
                kept: kept(st.squeeze),
            })
            .collect()
    }

    /// Measures the pools of `keys` (every pool the stats know, for None) and updates their
    /// scarcity; nodes of a pool whose squeeze tightened are triggered, those holding the
    /// most spare units of it first; every node of a pool that left scarcity is.
    pub fn pool_step(&self, keys: Option<&[PoolKey]>) {
        let totals: Vec<(PoolKey, PoolTotals)> = {
            let stats = self.stats.lock();
            match keys {
                None => (stats.by_pool.iter())
                    .map(|(k, t)| (k.clone(), *t))
                    .collect(),
                Some(keys) => (keys.iter())
                    .filter_map(|k| stats.by_pool.get(k).map(|t| (k.clone(), *t)))
                    .collect(),
            }
        };
        let measured: Vec<(PoolKey, PoolTotals, u128)> = (totals.into_iter())
            .filter_map(|(k, t)| {
                let capacity = self.source.pool_capacity(&k.0, k.1)?;
                Some((k, t, capacity))
            })
            .collect();
        let now = Instant::now();
        let mut tightened = Vec::new();
        let mut left = Vec::new();
        {
            let mut table = self.scarcity.lock();
            let mut changed = false;
            for (key, t, capacity) in measured {
                let st = table.pools.entry(key.clone()).or_default();
                let (change, squeeze_changed) = self.step_one(st, &t, capacity, now);
                publish(&key, st);
                log_change(&key, st, change);
                if change == Some(Change::Left) {
                    left.push(key.clone());
                }
                if squeeze_changed {
                    changed = true;
                    if kept(st.squeeze) < 1.0 {
                        tightened.push(key);
                    }
                }
            }
            if changed {
                table.squeezes = Arc::new(
                    (table.pools.iter())
                        .filter_map(|(k, st)| st.squeeze.map(|q| (k.clone(), q)))
                        .collect(),
                );
            }
        }
        self.trigger_pools(&tightened, true);
        self.trigger_pools(&left, false);
    }

    /// Whether pods the nodes' figures do not count yet could make the pool `key` scarcer:
    /// more pods are pending than the figures count as waiting, and the pool is scarce
    /// already, or would be with all of them in its pressure.
    pub(crate) fn may_tighten(&self, key: &PoolKey) -> bool {
        let pending = self.pods.pending_total();
        let (t, counted) = {
            let stats = self.stats.lock();
            let t = stats.by_pool.get(key).copied().unwrap_or_default();
            (t, stats.pods_waiting(key.1))
        };
        let uncounted = i128::try_from(pending).unwrap_or(i128::MAX) - counted;
        if uncounted <= 0 {
            return false;
        }
        let scarce = (self.scarcity.lock().pools.get(key)).is_some_and(|st| st.hysteresis.scarce());
        if scarce {
            return true;
        }
        let Some(capacity) = self.source.pool_capacity(&key.0, key.1) else {
            return false;
        };
        let unsigned = |v: i128| u128::try_from(v).unwrap_or(0);
        let bound = scarcity::pressure(
            unsigned(t.ips.used),
            unsigned(t.pods_waiting + uncounted),
            unsigned(t.ips.cooldown),
            capacity,
        );
        bound >= self.cfg.scarcity.enter
    }

    /// One pool's measurement: its change of scarcity, and whether its squeeze changed.
    fn step_one(
        &self,
        st: &mut PoolState,
        t: &PoolTotals,
        capacity: u128,
        now: Instant,
    ) -> (Option<Change>, bool) {
        let cfg = &self.cfg.scarcity;
        let unsigned = |v: i128| u128::try_from(v).unwrap_or(0);
        st.pressure = scarcity::pressure(
            unsigned(t.ips.used),
            unsigned(t.pods_waiting),
            unsigned(t.ips.cooldown),
            capacity,
        );
        let change = st.hysteresis.observe(cfg, st.pressure, now);
        let squeeze = (cfg.enabled && st.hysteresis.scarce())
            .then(|| scarcity::squeeze(cfg, st.pressure, t.starved > 0));
        let changed = squeeze != st.squeeze;
        st.squeeze = squeeze;
        (change, changed)
    }

    /// Triggers the nodes holding addresses of `pools`: with `free_first`, only those with
    /// free addresses there, in [`Holding`] order (the nodes holding the most give back
    /// first); else all.
    fn trigger_pools(&self, pools: &[PoolKey], free_first: bool) {
        if pools.is_empty() {
            return;
        }
        let nodes: Vec<Arc<NodeHandle>> = self.nodes.lock().values().cloned().collect();
        let mut due: Vec<(Holding, Arc<NodeHandle>)> = (nodes.into_iter())
            .filter_map(|h| {
                let held = Holding::of(&h.state.lock().lanes, pools);
                (!free_first || held.free > 0).then_some((held, h))
            })
            .collect();
        due.sort_by(|(a, ha), (b, hb)| b.cmp(a).then_with(|| ha.name.cmp(&hb.name)));
        for (_, h) in due {
            h.trigger.trigger(Reason::Scarcity);
            h.work.notify_waiters();
        }
    }
}

/// What a node holds of some pools, ordered by its spare units (releasable beyond its own
/// used and waiting), then by its free addresses.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Holding {
    spare: u64,
    free: u64,
}

impl Holding {
    /// Summed over the node's lanes of `pools`, as its last pass left them.
    fn of(lanes: &[LaneSummary], pools: &[PoolKey]) -> Holding {
        (lanes.iter())
            .filter(|l| pools.iter().any(|(p, f)| *p == l.pool && *f == l.family))
            .fold(Holding::default(), |h, l| Holding {
                spare: h.spare + l.spare,
                free: h.free + l.counts.free(),
            })
    }
}

/// The share of pre-allocation a squeeze keeps (1 without one).
fn kept(squeeze: Option<Squeeze>) -> f64 {
    squeeze.map_or(1.0, |q| f64::from(q.keep_per_mille) / 1000.0)
}

fn publish((pool, family): &PoolKey, st: &PoolState) {
    tidepool_metrics::record::pool_scarcity(
        pool,
        (*family).into(),
        st.pressure,
        st.hysteresis.scarce(),
        kept(st.squeeze),
    );
}

fn log_change((pool, family): &PoolKey, st: &PoolState, change: Option<Change>) {
    match change {
        Some(Change::Entered) => tracing::warn!(
            pool = %pool, family = ?family, pressure = st.pressure,
            "pool is scarce: warm pools give way"
        ),
        Some(Change::Left) => tracing::info!(
            pool = %pool, family = ?family, pressure = st.pressure,
            "pool is no longer scarce: watermarks restored"
        ),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watermarks::{FamilyCounts, Sizing};

    fn lane(pool: &str, family: Family, allocated: u64, used: u64, spare: u64) -> LaneSummary {
        LaneSummary {
            pool: pool.into(),
            family,
            counts: FamilyCounts {
                allocated,
                used,
                ..FamilyCounts::default()
            },
            sizing: Sizing::default(),
            spare,
        }
    }

    /// A node's holding counts the lanes of the tightened pools only, and the nodes holding
    /// the most spare units come first, however many free addresses the others hold: free
    /// addresses spread over partly used blocks cannot be given back.
    #[test]
    fn the_nodes_with_the_most_spare_units_give_back_first() {
        let tight: [PoolKey; 1] = [("p".into(), Family::V4)];
        let scattered = [
            lane("p", Family::V4, 64, 20, 0),
            lane("q", Family::V4, 64, 0, 64),
            lane("p", Family::V6, 64, 0, 64),
        ];
        let whole = [lane("p", Family::V4, 32, 16, 16)];
        let a = Holding::of(&scattered, &tight);
        let b = Holding::of(&whole, &tight);
        assert_eq!(a, Holding { spare: 0, free: 44 });
        assert_eq!(
            b,
            Holding {
                spare: 16,
                free: 16
            }
        );
        assert!(b > a, "trigger_pools wakes the greater holding first");
        let tie = Holding {
            spare: 16,
            free: 20,
        };
        assert!(tie > b, "among equal spare units, the most free first");
    }
}
