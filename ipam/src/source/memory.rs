//! [`MemorySource`]: a per-address in-memory source with a fixed capacity per family and
//! injectable faults, for tests and the simulator.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{IpSource, Quota, SourceHook};
use crate::addrs::AddrSet;
use crate::error::{ErrorClass, IpamError};
use crate::gate::Gate;
use crate::types::{Family, NodeName, PerFamily};

/// Injectable faults of the in-memory source.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Share of mutating calls that fail before taking effect (transient).
    pub error_rate: f64,
    /// Share of mutating calls that take effect and then fail (a lost reply).
    pub lost_reply_rate: f64,
    /// Share of mutating calls answered "throttled" with this Retry-After.
    pub throttle_rate: f64,
    pub retry_after: Duration,
}

struct MemState {
    /// Next never-used offset per family (addresses are handed out lazily).
    next: PerFamily<u64>,
    /// Returned addresses, reused lowest first.
    returned: PerFamily<BTreeSet<IpAddr>>,
    owner: BTreeMap<IpAddr, NodeName>,
    by_node: BTreeMap<NodeName, AddrSet>,
    capacity: PerFamily<u64>,
    faults: Faults,
    rng: SmallRng,
    calls: u64,
    throttled: u64,
}

/// A per-address source with a fixed capacity per family: IPv4 from 10.0.0.0 upwards,
/// IPv6 from fd00:: upwards. Each call waits `latency` (virtual under paused time).
#[derive(Clone)]
pub struct MemorySource {
    families: Arc<[Family]>,
    latency: Duration,
    state: Arc<Mutex<MemState>>,
    hook: Option<Arc<dyn SourceHook>>,
}

const V4_BASE: u32 = u32::from_be_bytes([10, 0, 0, 0]);
const V6_BASE: u128 = 0xfd00 << 112;

fn nth(family: Family, n: u64) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(V4_BASE + n as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(V6_BASE + n as u128)),
    }
}

impl MemorySource {
    /// `capacity` addresses per served family (IPv4 capacity at most 2^24).
    pub fn new(families: &[Family], capacity: PerFamily<u64>, seed: u64) -> Self {
        Self {
            families: families.into(),
            latency: Duration::ZERO,
            state: Arc::new(Mutex::new(MemState {
                next: PerFamily::default(),
                returned: PerFamily::default(),
                owner: BTreeMap::new(),
                by_node: BTreeMap::new(),
                capacity: PerFamily {
                    v4: capacity.v4.min(1 << 24),
                    v6: capacity.v6,
                },
                faults: Faults::default(),
                rng: SmallRng::seed_from_u64(seed),
                calls: 0,
                throttled: 0,
            })),
            hook: None,
        }
    }

    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    pub fn with_hook(mut self, hook: Arc<dyn SourceHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Each call's latency.
    pub fn latency(&self) -> Duration {
        self.latency
    }

    /// Addresses `node` holds, per family.
    pub fn held_by_family(&self, node: &NodeName) -> PerFamily<u64> {
        let s = self.state.lock();
        let held = s.by_node.get(node);
        let count = |f| held.map_or(0, |h| h.count(f));
        PerFamily {
            v4: count(Family::V4),
            v6: count(Family::V6),
        }
    }

    /// How many addresses the source grants `node`.
    pub fn held_by(&self, node: &NodeName) -> u64 {
        self.state
            .lock()
            .by_node
            .get(node)
            .map_or(0, |s| s.count(Family::V4) + s.count(Family::V6))
    }

    /// Changes the injected faults (at any time).
    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().faults = faults;
    }

    /// The source's truth: who holds `addr`.
    pub fn owner(&self, addr: &IpAddr) -> Option<NodeName> {
        self.state.lock().owner.get(addr).cloned()
    }

    /// Every (address, node) the source has granted.
    pub fn granted(&self) -> Vec<(IpAddr, NodeName)> {
        let s = self.state.lock();
        s.owner.iter().map(|(a, n)| (*a, n.clone())).collect()
    }

    /// Draws the fault for one mutating call: None = proceed normally.
    /// Mutating calls received, and how many were answered "throttled".
    pub fn calls(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.calls, s.throttled)
    }

    fn draw_fault(&self, op: &'static str, node: &NodeName) -> (Option<IpamError>, bool) {
        let mut s = self.state.lock();
        s.calls += 1;
        let f = s.faults;
        if f.error_rate + f.lost_reply_rate + f.throttle_rate <= 0.0 {
            return (None, false);
        }
        let x: f64 = s.rng.random();
        let err = |class, message: &str| IpamError::Source {
            op,
            node: node.to_string(),
            class,
            message: message.to_string(),
        };
        if x < f.error_rate {
            (Some(err(ErrorClass::Transient, "injected error")), false)
        } else if x < f.error_rate + f.throttle_rate {
            s.throttled += 1;
            let class = ErrorClass::Throttled {
                retry_after: Some(f.retry_after),
            };
            (Some(err(class, "injected throttling")), false)
        } else if x < f.error_rate + f.throttle_rate + f.lost_reply_rate {
            (
                Some(err(
                    ErrorClass::Transient,
                    "reply lost after the call took effect",
                )),
                true,
            )
        } else {
            (None, false)
        }
    }

    fn free_count(s: &MemState, f: Family) -> u64 {
        s.capacity.get(f) - s.next.get(f) + s.returned.get(f).len() as u64
    }
}

impl IpSource for MemorySource {
    fn name(&self) -> tidepool_metrics::Source {
        tidepool_metrics::Source::Memory
    }

    fn families(&self) -> &[Family] {
        &self.families
    }

    fn grant_size(&self, _family: Family) -> u128 {
        1
    }

    fn prepare_allocation(&self, _node: &NodeName, family: Family, want: u64, limit: u64) -> u64 {
        let s = self.state.lock();
        want.min(limit).min(Self::free_count(&s, family))
    }

    async fn allocate<G: Gate>(
        &self,
        node: &NodeName,
        family: Family,
        count: u64,
        gate: &mut G,
    ) -> Result<AddrSet, IpamError> {
        gate.request().await?;
        tokio::time::sleep(self.latency).await;
        let (fault, takes_effect) = self.draw_fault("allocate", node);
        if let Some(e) = &fault
            && !takes_effect
        {
            return Err(e.clone());
        }
        let addrs = {
            let mut s = self.state.lock();
            if Self::free_count(&s, family) < count {
                return Err(IpamError::Source {
                    op: "allocate",
                    node: node.to_string(),
                    class: ErrorClass::Exhausted,
                    message: format!("{} free, {count} asked", Self::free_count(&s, family)),
                });
            }
            let mut out = AddrSet::new();
            for _ in 0..count {
                let a = match s.returned.get_mut(family).pop_first() {
                    Some(a) => a,
                    None => {
                        let n = *s.next.get(family);
                        *s.next.get_mut(family) += 1;
                        nth(family, n)
                    }
                };
                s.owner.insert(a, node.clone());
                out.insert(a);
            }
            s.by_node.entry(node.clone()).or_default().union_with(&out);
            out
        };
        if let Some(h) = &self.hook {
            h.granted(node, &addrs);
        }
        match fault {
            Some(e) => Err(e),
            None => Ok(addrs),
        }
    }

    fn prepare_release(&self, _node: &NodeName, free: &AddrSet, max: u64) -> AddrSet {
        let mut out = free.highest(Family::V4, max.into());
        out.union_with(&free.highest(Family::V6, max.into()));
        out
    }

    async fn release<G: Gate>(
        &self,
        node: &NodeName,
        addrs: &AddrSet,
        gate: &mut G,
    ) -> Result<(), IpamError> {
        gate.request().await?;
        tokio::time::sleep(self.latency).await;
        let (fault, takes_effect) = self.draw_fault("release", node);
        if let Some(e) = &fault
            && !takes_effect
        {
            return Err(e.clone());
        }
        let released: AddrSet = {
            let mut s = self.state.lock();
            // Releasing what the node does not hold is a no-op (idempotent).
            let done = s
                .by_node
                .get(node)
                .map(|held| held.intersection(addrs))
                .unwrap_or_default();
            for a in done.iter() {
                s.owner.remove(&a);
                s.returned.get_mut(Family::of(&a)).insert(a);
            }
            if let Some(set) = s.by_node.get_mut(node) {
                set.subtract(&done);
            }
            if s.by_node.get(node).is_some_and(|set| set.is_empty()) {
                s.by_node.remove(node);
            }
            done
        };
        if let Some(h) = &self.hook
            && !released.is_empty()
        {
            h.released(node, &released);
        }
        match fault {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn describe(&self, node: &NodeName) -> Result<AddrSet, IpamError> {
        Ok(self
            .state
            .lock()
            .by_node
            .get(node)
            .cloned()
            .unwrap_or_default())
    }

    fn quota(&self) -> PerFamily<Quota> {
        let s = self.state.lock();
        let q = |f: Family| {
            if self.families.contains(&f) {
                Quota {
                    capacity: *s.capacity.get(f),
                    free: Self::free_count(&s, f),
                }
            } else {
                Quota::default()
            }
        };
        PerFamily {
            v4: q(Family::V4),
            v6: q(Family::V6),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::Ungated;

    fn node(n: &str) -> NodeName {
        n.into()
    }

    #[tokio::test(start_paused = true)]
    async fn grants_distinct_addresses_and_takes_them_back() {
        let s = MemorySource::new(&[Family::V4], PerFamily { v4: 4, v6: 0 }, 1);
        let a = s
            .allocate(&node("a"), Family::V4, 3, &mut Ungated)
            .await
            .unwrap();
        assert_eq!(s.prepare_allocation(&node("b"), Family::V4, 3, u64::MAX), 1);
        let b = s
            .allocate(&node("b"), Family::V4, 1, &mut Ungated)
            .await
            .unwrap();
        assert!(a.intersection(&b).is_empty());
        assert_eq!(
            s.quota().v4,
            Quota {
                capacity: 4,
                free: 0
            }
        );
        let err = s
            .allocate(&node("b"), Family::V4, 1, &mut Ungated)
            .await
            .unwrap_err();
        assert_eq!(err.class(), ErrorClass::Exhausted);
        let a: Vec<IpAddr> = a.iter().collect();
        s.release(&node("a"), &a[..1].iter().copied().collect(), &mut Ungated)
            .await
            .unwrap();
        // releasing an address the node does not hold changes nothing
        s.release(&node("b"), &a[1..2].iter().copied().collect(), &mut Ungated)
            .await
            .unwrap();
        assert_eq!(s.describe(&node("a")).await.unwrap().len(Family::V4), 2);
        assert_eq!(s.quota().v4.free, 1);
        assert_eq!(
            s.allocate(&node("b"), Family::V4, 1, &mut Ungated)
                .await
                .unwrap(),
            AddrSet::from_iter([a[0]])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lost_reply_takes_effect_and_describe_shows_it() {
        let s = MemorySource::new(&[Family::V4], PerFamily { v4: 8, v6: 0 }, 1);
        s.set_faults(Faults {
            lost_reply_rate: 1.0,
            ..Default::default()
        });
        assert!(
            s.allocate(&node("a"), Family::V4, 2, &mut Ungated)
                .await
                .is_err()
        );
        assert_eq!(s.describe(&node("a")).await.unwrap().len(Family::V4), 2);
        s.set_faults(Faults {
            error_rate: 1.0,
            ..Default::default()
        });
        assert!(
            s.allocate(&node("a"), Family::V4, 2, &mut Ungated)
                .await
                .is_err()
        );
        assert_eq!(s.describe(&node("a")).await.unwrap().len(Family::V4), 2);
    }
}
