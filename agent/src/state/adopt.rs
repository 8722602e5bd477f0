//! The rebuild after a corrupt checkpoint (DESIGN.md "Node agent"): the node side the
//! agent published before (`status.used`, `status.cooldown` of its IPAMNode) is what it
//! had made durable then, so it is adopted back — nothing is freed, and nothing given
//! twice, because the checkpoint could not be read. Live pods' podIPs are the other half
//! (see [`crate::pods`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::SystemTime;

use tidepool_api::convert::Allocations;
use tidepool_ipam::{AllocationId, NodeSideFields, UsedEntry};

use super::model::{AddrPools, AllocKey, NodeState, PodRef};

/// What [`NodeState::adopt`] took over.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// Allocations rebuilt from `status.used` (one per (containerID, ifname)).
    pub allocations: usize,
    /// Cooldowns taken over from `status.cooldown`.
    pub cooldowns: usize,
    /// Entries that could not be taken over, and why (logged; their addresses still
    /// cannot be given out while a live pod lists them).
    pub skipped: Vec<String>,
}

impl NodeState {
    /// Adopts the published node side `side`: every `used` entry becomes an allocation
    /// again (entries of one (containerID, ifname) — dual-stack — as one, its addresses in
    /// family order, since the oldest entry's `since`, under this boot), and every cooldown
    /// not over at `now` cools on. `keys` gives the (containerID, ifname) strings behind the
    /// entries' hashes, `pools` the pool each entry names (`status.used[addr].pool`, kept:
    /// it is never re-evaluated). Entries that conflict with the state or each other are
    /// skipped and reported. The state is left dirty: save it before publishing.
    pub fn adopt(
        &mut self,
        side: &NodeSideFields,
        keys: &Allocations,
        pools: &AddrPools,
        now: SystemTime,
    ) -> Adopted {
        let mut out = Adopted::default();
        for (id, entries) in by_allocation(side) {
            match self.adopt_one(id, &entries, keys, pools) {
                Ok(()) => out.allocations += 1,
                Err(why) => out.skipped.push(why),
            }
        }
        for (addr, until) in &side.cooldown {
            if self.side.adopt_cooldown(*addr, *until, now) {
                out.cooldowns += 1;
            }
        }
        out
    }

    fn adopt_one(
        &mut self,
        id: AllocationId,
        entries: &[(IpAddr, &UsedEntry)],
        keys: &Allocations,
        pools: &AddrPools,
    ) -> Result<(), String> {
        let addrs: Vec<IpAddr> = entries.iter().map(|(a, _)| *a).collect();
        let Some(names) = keys.get(&id) else {
            return Err(format!("{addrs:?}: no (containerID, ifname) for the entry"));
        };
        let (_, first) = entries[0];
        if entries.iter().any(|(_, e)| e.pod_uid != first.pod_uid) {
            return Err(format!(
                "{addrs:?}: ({}, {}) is listed for more than one pod",
                names.container_id(),
                names.ifname()
            ));
        }
        let since = entries
            .iter()
            .map(|(_, e)| e.since)
            .min()
            .unwrap_or(first.since);
        let pod = PodRef {
            uid: first.pod_uid,
            namespace: first.pod.namespace().to_string(),
            name: first.pod.name().to_string(),
        };
        let key = AllocKey::new(names.container_id(), names.ifname());
        let named = addrs
            .iter()
            .filter_map(|a| Some((*a, pools.get(a)?.clone())));
        self.adopt_in_pools(key, pod, &addrs, None, since.into(), named.collect())
            .map(|_| ())
            .map_err(|e| format!("{addrs:?}: {}", super::StateError::from(e)))
    }
}

/// `side.used` grouped by allocation, addresses in order (IPv4 before IPv6).
fn by_allocation(side: &NodeSideFields) -> BTreeMap<AllocationId, Vec<(IpAddr, &UsedEntry)>> {
    let mut out: BTreeMap<AllocationId, Vec<(IpAddr, &UsedEntry)>> = BTreeMap::new();
    for (addr, e) in &side.used {
        out.entry(e.allocation).or_default().push((addr, e));
    }
    for v in out.values_mut() {
        v.sort_by_key(|(a, _)| *a);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use tidepool_api::convert::AllocationNames;
    use tidepool_ipam::PodUid;

    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn entry(uid: u128, key: &AllocKey, since: u64) -> UsedEntry {
        UsedEntry {
            pod_uid: PodUid(uid),
            pod: tidepool_ipam::PodName::new("default", &format!("p{uid}")),
            allocation: key.id(),
            since: at(since).into(),
        }
    }

    fn names(keys: &[&AllocKey]) -> Allocations {
        keys.iter()
            .map(|k| {
                let v = AllocationNames::new(&k.container_id, k.ifname.as_str());
                (k.id(), v)
            })
            .collect()
    }

    #[test]
    fn the_published_side_is_adopted_back() {
        let dual = AllocKey::new("c1", "eth0");
        let single = AllocKey::new("c2", "eth0");
        let unnamed = AllocKey::new("c3", "eth0");
        let mut side = NodeSideFields::default();
        side.used.insert(ip("fd00::5"), entry(1, &dual, 10));
        side.used.insert(ip("10.0.0.5"), entry(1, &dual, 11));
        side.used.insert(ip("10.0.0.6"), entry(2, &single, 20));
        side.used.insert(ip("10.0.0.7"), entry(3, &unnamed, 30));
        side.cooldown.insert(ip("10.0.0.8"), at(200));
        side.cooldown.insert(ip("10.0.0.9"), at(50));
        let keys = names(&[&dual, &single]);
        // the dual-stack pod's v6 address came from pool blue; the others name none
        let pools = AddrPools::from([(ip("fd00::5"), Arc::from("blue"))]);
        let mut st = NodeState::new("boot", Duration::from_secs(30));
        let out = st.adopt(&side, &keys, &pools, at(100));
        assert_eq!((out.allocations, out.cooldowns), (2, 1));
        assert_eq!(out.skipped.len(), 1, "c3's strings are unknown: {out:?}");
        assert!(st.is_dirty());
        let a = st.get(&dual).expect("c1");
        assert_eq!(a.addrs, vec![ip("10.0.0.5"), ip("fd00::5")]);
        assert_eq!(
            (a.pod.uid, a.since, a.boot_id.as_str()),
            (PodUid(1), at(10), "boot")
        );
        assert_eq!(a.pools, pools, "the pool each entry named, kept");
        assert_eq!(st.pools(), pools);
        assert_eq!(st.get(&single).expect("c2").addrs, vec![ip("10.0.0.6")]);
        assert_eq!(st.cooldowns().get(&ip("10.0.0.8")), Some(&at(200)));
        assert!(!st.cooldowns().contains_key(&ip("10.0.0.9")), "over");
        // an ADD of the same key by the same pod gets the same addresses back; another key
        // cannot take them
        let again = st
            .adopt_allocation(dual.clone(), a_pod(1), &[ip("10.0.0.99")], None, at(101))
            .expect("repeated");
        assert!(again.repeated);
        assert_eq!(again.addrs, vec![ip("10.0.0.5"), ip("fd00::5")]);
        assert!(
            st.adopt_allocation(
                AllocKey::new("c9", "eth0"),
                a_pod(9),
                &[ip("10.0.0.6")],
                None,
                at(101)
            )
            .is_err()
        );
    }

    #[test]
    fn one_key_listed_for_two_pods_is_skipped() {
        let key = AllocKey::new("c1", "eth0");
        let mut side = NodeSideFields::default();
        side.used.insert(ip("10.0.0.5"), entry(1, &key, 10));
        side.used.insert(ip("fd00::5"), entry(2, &key, 10));
        let mut st = NodeState::new("boot", Duration::from_secs(30));
        let out = st.adopt(&side, &names(&[&key]), &AddrPools::new(), at(100));
        assert_eq!(out.allocations, 0);
        assert_eq!(out.skipped.len(), 1);
        assert!(st.get(&key).is_none());
    }

    fn a_pod(uid: u128) -> PodRef {
        PodRef {
            uid: PodUid(uid),
            namespace: "default".into(),
            name: format!("p{uid}"),
        }
    }
}
