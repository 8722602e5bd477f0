//! [`Sightings`]: when the operator first saw each `used` entry of a node, kept in the
//! `used` map's order, one list per family: an IPv4 entry's sighting takes 32 bytes and an
//! IPv6 entry's 48, where one list keyed by `IpAddr` (17 bytes) took 48 for both. It is
//! kept for every address of the cluster, and most are IPv4.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::types::{PodUid, UnixNanos, UsedEntry, UsedMap};

/// A `used` entry (address, pod UID) and when the operator first saw it.
#[derive(Debug, Clone, Copy)]
struct Sighting<A> {
    uid: PodUid,
    /// Nanoseconds since the tracker's base.
    at: u64,
    addr: A,
    /// A fingerprint of the entry's `since` ([`since_tag`]; in what was padding): an entry
    /// re-recorded for the same pod at the same address (a new sandbox given the same
    /// address) keeps its first sighting, but its pod must be looked at again, since the
    /// replaced-sandbox rule compares the `since` of a pod's entries.
    since: u32,
}

// the tag lives in what was padding
const _: () = assert!(size_of::<Sighting<Ipv4Addr>>() == 32);
const _: () = assert!(size_of::<Sighting<Ipv6Addr>>() == 48);

/// 32 bits of a hash of `since`: two different times give the same tag with a chance of
/// about 2^-32, and then only that pod's re-lookup is missed until its next change (the
/// confirmation before any tombstone reads the entries and the pod afresh). Hashed, not cut
/// to its low bits, so that times a structured step apart do not collide.
fn since_tag(since: UnixNanos) -> u32 {
    let x = std::hash::BuildHasher::hash_one(&foldhash::fast::FixedState::default(), since);
    (x ^ (x >> 32)) as u32
}

impl<A: Eq> Sighting<A> {
    fn same_entry(&self, addr: &A, e: &UsedEntry) -> bool {
        self.addr == *addr && self.uid == e.pod_uid && self.since == since_tag(e.since)
    }
}

/// The first sightings of a node's `used` entries: after [`Sightings::merge`], one per
/// entry, in the same order.
#[derive(Debug, Default)]
pub(super) struct Sightings {
    v4: Vec<Sighting<Ipv4Addr>>,
    v6: Vec<Sighting<Ipv6Addr>>,
}

impl Sightings {
    /// Whether these are the sightings of exactly `used`'s entries.
    pub(super) fn matches(&self, used: &UsedMap) -> bool {
        same_family(&self.v4, used.ipv4()) && same_family(&self.v6, used.ipv6())
    }

    /// When the entry of `addr` was first seen (nanoseconds since the tracker's base).
    pub(super) fn at(&self, addr: &IpAddr) -> Option<u64> {
        match addr {
            IpAddr::V4(a) => find(&self.v4, a),
            IpAddr::V6(a) => find(&self.v6, a),
        }
    }

    /// The sightings' times in the `used` map's order.
    pub(super) fn times(&self) -> impl Iterator<Item = u64> + Clone + '_ {
        let v4 = self.v4.iter().map(|s| s.at);
        v4.chain(self.v6.iter().map(|s| s.at))
    }

    /// Refreshes the sightings from the `used` map with one merge per family: an entry
    /// already sighted (same address and pod) keeps its time, a new one is sighted at
    /// `now_at`. Returns the pod UIDs of the entries added and gone, in address order.
    pub(super) fn merge(&mut self, now_at: u64, used: &UsedMap) -> Vec<PodUid> {
        let mut moved = Vec::new();
        merge_family(&mut self.v4, used.ipv4(), now_at, &mut moved);
        merge_family(&mut self.v6, used.ipv6(), now_at, &mut moved);
        moved
    }
}

/// Whether `list` holds the sightings of exactly one family's `(addresses, entries)`.
fn same_family<A: Eq>(list: &[Sighting<A>], (addrs, entries): (&[A], &[UsedEntry])) -> bool {
    list.len() == addrs.len()
        && (list.iter().zip(addrs).zip(entries)).all(|((s, a), e)| s.same_entry(a, e))
}

fn find<A: Ord>(list: &[Sighting<A>], addr: &A) -> Option<u64> {
    let i = list.binary_search_by(|s| s.addr.cmp(addr)).ok()?;
    Some(list[i].at)
}

/// [`Sightings::merge`] of one family's entries.
fn merge_family<A: Copy + Ord>(
    list: &mut Vec<Sighting<A>>,
    (addrs, entries): (&[A], &[UsedEntry]),
    now_at: u64,
    moved: &mut Vec<PodUid>,
) {
    let old = std::mem::replace(list, Vec::with_capacity(entries.len()));
    let mut i = 0;
    for (&addr, entry) in addrs.iter().zip(entries) {
        while i < old.len() && old[i].addr < addr {
            moved.push(old[i].uid);
            i += 1;
        }
        let uid = entry.pod_uid;
        let since = since_tag(entry.since);
        let at = match old.get(i) {
            Some(o) if o.addr == addr && o.uid == uid => {
                if o.since != since {
                    moved.push(uid);
                }
                i += 1;
                o.at
            }
            Some(o) if o.addr == addr => {
                moved.extend([o.uid, uid]);
                i += 1;
                now_at
            }
            _ => {
                moved.push(uid);
                now_at
            }
        };
        list.push(Sighting {
            uid,
            at,
            addr,
            since,
        });
    }
    moved.extend(old[i..].iter().map(|o| o.uid));
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::{Duration, SystemTime};

    use proptest::prelude::*;

    use super::*;
    use crate::types::{AllocationId, PodName};

    /// Both families, so that the split and the order across it are exercised.
    fn addr(i: u8) -> IpAddr {
        if i.is_multiple_of(3) {
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(i)))
        } else {
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, i))
        }
    }

    fn entry(uid: u8, since: u8) -> UsedEntry {
        UsedEntry {
            pod_uid: PodUid(u128::from(uid)),
            pod: PodName::new("default", "p"),
            allocation: AllocationId(0),
            since: (SystemTime::UNIX_EPOCH + Duration::from_secs(since.into())).into(),
        }
    }

    proptest! {
        /// Over a sequence of `used` maps, each merge keeps the time of an entry whose
        /// address and pod stay, sights the others now, lines the times up with the map,
        /// and names every pod whose entry came, went or was re-recorded.
        #[test]
        fn merges_keep_first_sightings_and_name_what_moved(
            maps in prop::collection::vec(
                prop::collection::btree_map(any::<u8>(), (0..4u8, 0..2u8), 0..30), 1..8),
        ) {
            let mut s = Sightings::default();
            let mut model: BTreeMap<IpAddr, (u8, u8, u64)> = BTreeMap::new();
            for (step, m) in maps.iter().enumerate() {
                let now = step as u64 + 1;
                let used: UsedMap =
                    m.iter().map(|(a, (u, t))| (addr(*a), entry(*u, *t))).collect();
                let mut next = BTreeMap::new();
                let mut expect = BTreeSet::new();
                for (a, (u, t)) in m.iter().map(|(a, e)| (addr(*a), *e)) {
                    let at = match model.get(&a) {
                        Some((ou, ot, at)) if *ou == u => {
                            if *ot != t {
                                expect.insert(u);
                            }
                            *at
                        }
                        other => {
                            expect.extend(other.map(|o| o.0));
                            expect.insert(u);
                            now
                        }
                    };
                    next.insert(a, (u, t, at));
                }
                for (a, (u, _, _)) in &model {
                    if !next.contains_key(a) {
                        expect.insert(*u);
                    }
                }
                let moved: BTreeSet<u8> = (s.merge(now, &used).into_iter())
                    .map(|u| u8::try_from(u.0).unwrap())
                    .collect();
                prop_assert_eq!(moved, expect);
                model = next;
                prop_assert!(s.matches(&used));
                prop_assert!(s.times().eq(model.values().map(|v| v.2)));
                for i in 0..=u8::MAX {
                    prop_assert_eq!(s.at(&addr(i)), model.get(&addr(i)).map(|v| v.2));
                }
            }
        }
    }
}
