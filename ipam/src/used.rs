//! `status.used` of an IPAMNode: address → the pod using it, in address order.
//!
//! Two sorted arrays (addresses, entries) instead of a B-tree: a node holds a few hundred
//! entries at most, every pass walks them all (planning, reclaim, repair), and walking
//! contiguous addresses is several times cheaper than walking B-tree nodes that are cold
//! at 10,000 nodes; it also takes less memory per entry. Lookups are binary searches over
//! the addresses alone; inserting and removing move at most a few kilobytes.

use std::fmt;
use std::net::IpAddr;
use std::ops::Index;

use crate::types::UsedEntry;

/// Address → entry, in address order. `E` is the engine's [`UsedEntry`] for `status.used`,
/// and the node side's own entry in [`crate::node::NodeSide`].
#[derive(Clone, PartialEq, Eq)]
pub struct UsedMap<E = UsedEntry> {
    /// Sorted, no duplicates.
    addrs: Vec<IpAddr>,
    /// `entries[i]` is the entry of `addrs[i]`.
    entries: Vec<E>,
}

impl<E> Default for UsedMap<E> {
    fn default() -> Self {
        UsedMap {
            addrs: Vec::new(),
            entries: Vec::new(),
        }
    }
}

/// The entries in address order.
pub type Iter<'a, E = UsedEntry> =
    std::iter::Zip<std::slice::Iter<'a, IpAddr>, std::slice::Iter<'a, E>>;

impl<E> UsedMap<E> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Removes every entry, keeping the storage.
    pub fn clear(&mut self) {
        self.addrs.clear();
        self.entries.clear();
    }

    pub fn get(&self, addr: &IpAddr) -> Option<&E> {
        self.addrs
            .binary_search(addr)
            .ok()
            .map(|i| &self.entries[i])
    }

    pub fn contains_key(&self, addr: &IpAddr) -> bool {
        self.addrs.binary_search(addr).is_ok()
    }

    /// Sets the entry of `addr`; returns the one it replaced.
    pub fn insert(&mut self, addr: IpAddr, entry: E) -> Option<E> {
        // addresses are mostly handed out in order: appending needs no search
        if self.addrs.last().is_none_or(|last| *last < addr) {
            self.addrs.push(addr);
            self.entries.push(entry);
            return None;
        }
        match self.addrs.binary_search(&addr) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i], entry)),
            Err(i) => {
                self.addrs.insert(i, addr);
                self.entries.insert(i, entry);
                None
            }
        }
    }

    pub fn remove(&mut self, addr: &IpAddr) -> Option<E> {
        let i = self.addrs.binary_search(addr).ok()?;
        self.addrs.remove(i);
        Some(self.entries.remove(i))
    }

    pub fn keys(&self) -> std::slice::Iter<'_, IpAddr> {
        self.addrs.iter()
    }

    /// The addresses from `addr` on, in order.
    pub fn keys_from(&self, addr: &IpAddr) -> std::slice::Iter<'_, IpAddr> {
        self.addrs[self.addrs.partition_point(|a| a < addr)..].iter()
    }

    pub fn values(&self) -> std::slice::Iter<'_, E> {
        self.entries.iter()
    }

    pub fn iter(&self) -> Iter<'_, E> {
        self.addrs.iter().zip(self.entries.iter())
    }

    /// The IPv4 entries and the IPv6 entries, each in order (an `IpAddr` orders IPv4
    /// first).
    pub fn by_family(&self) -> (Iter<'_, E>, Iter<'_, E>) {
        let n = self.addrs.partition_point(IpAddr::is_ipv4);
        let (a4, a6) = self.addrs.split_at(n);
        let (e4, e6) = self.entries.split_at(n);
        (a4.iter().zip(e4), a6.iter().zip(e6))
    }

    /// The same addresses with each entry converted by `f`.
    pub fn map<F>(&self, f: impl FnMut(&E) -> F) -> UsedMap<F> {
        UsedMap {
            addrs: self.addrs.clone(),
            entries: self.entries.iter().map(f).collect(),
        }
    }

    /// Makes this map hold `other`'s addresses with their entries converted by `make`,
    /// in place: only the span between the longest common start and end (equal addresses,
    /// entries `same`) is replaced, the rest is kept as it is; the storage is reused.
    pub fn update_from<H>(
        &mut self,
        other: &UsedMap<H>,
        same: impl Fn(&E, &H) -> bool,
        make: impl Fn(&H) -> E,
    ) {
        let alike = |(a, e): (&IpAddr, &E), (b, h): (&IpAddr, &H)| a == b && same(e, h);
        let start = self
            .iter()
            .zip(other.iter())
            .take_while(|(x, y)| alike(*x, *y))
            .count();
        let end = self.iter().rev().zip(other.iter().rev());
        let end = end.take_while(|(x, y)| alike(*x, *y)).count();
        let end = end.min(self.len().min(other.len()) - start);
        let mine = start..self.len() - end;
        self.addrs.drain(mine.clone());
        self.entries.drain(mine);
        // room for exactly the new length: a copy of a stored object has no spare room,
        // and one more entry would double it (a node's 110 entries took 14 KiB, not 7,
        // in every object the node side wrote after a copy); the allocator rounds up to
        // its size class, and moves nothing while the length stays within it
        let grow = other.len().saturating_sub(self.len());
        self.addrs.reserve_exact(grow);
        self.entries.reserve_exact(grow);
        for (i, j) in (start..other.len() - end).enumerate() {
            self.addrs.insert(start + i, other.addrs[j]);
            self.entries.insert(start + i, make(&other.entries[j]));
        }
    }

    /// Heap bytes held (for the simulator's memory estimate).
    pub fn heap_bytes(&self) -> usize {
        self.addrs.capacity() * size_of::<IpAddr>() + self.entries.capacity() * size_of::<E>()
    }
}

impl<'a, E> IntoIterator for &'a UsedMap<E> {
    type Item = (&'a IpAddr, &'a E);
    type IntoIter = Iter<'a, E>;

    fn into_iter(self) -> Iter<'a, E> {
        self.iter()
    }
}

/// Like a map built by inserting in order: a later entry for the same address wins.
impl<E> FromIterator<(IpAddr, E)> for UsedMap<E> {
    fn from_iter<T: IntoIterator<Item = (IpAddr, E)>>(iter: T) -> Self {
        let mut m = UsedMap::new();
        for (a, e) in iter {
            m.insert(a, e);
        }
        m
    }
}

impl<E> Index<&IpAddr> for UsedMap<E> {
    type Output = E;

    /// Panics when `addr` has no entry, like a map's index.
    fn index(&self, addr: &IpAddr) -> &E {
        self.get(addr).expect("no entry for this address")
    }
}

impl<E: fmt::Debug> fmt::Debug for UsedMap<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::SystemTime;

    use proptest::prelude::*;

    use super::*;
    use crate::types::PodUid;

    fn entry(uid: u128) -> UsedEntry {
        UsedEntry {
            pod_uid: PodUid(uid),
            namespace: "default".into(),
            pod: "p".into(),
            allocation: crate::types::AllocationId(0),
            since: SystemTime::UNIX_EPOCH.into(),
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u8),
        Remove(u8),
    }

    fn addr(i: u8) -> IpAddr {
        // both families, so the order across them is exercised too
        if i.is_multiple_of(4) {
            IpAddr::V6(std::net::Ipv6Addr::new(
                0xfd00,
                0,
                0,
                0,
                0,
                0,
                0,
                u16::from(i),
            ))
        } else {
            IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, i))
        }
    }

    proptest! {
        /// Every operation answers as a `BTreeMap` does, and the contents and their order
        /// stay the map's.
        #[test]
        fn behaves_as_a_btreemap(ops in prop::collection::vec(
            prop_oneof![
                (any::<u8>(), any::<u8>()).prop_map(|(a, u)| Op::Insert(a, u)),
                any::<u8>().prop_map(Op::Remove),
            ],
            0..200,
        )) {
            let mut m = UsedMap::new();
            let mut b: BTreeMap<IpAddr, UsedEntry> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(a, u) => prop_assert_eq!(
                        m.insert(addr(a), entry(u128::from(u))),
                        b.insert(addr(a), entry(u128::from(u)))
                    ),
                    Op::Remove(a) => prop_assert_eq!(m.remove(&addr(a)), b.remove(&addr(a))),
                }
                prop_assert_eq!(m.len(), b.len());
            }
            prop_assert!(m.iter().eq(b.iter()));
            prop_assert!(m.keys().eq(b.keys()));
            prop_assert!(m.values().eq(b.values()));
            prop_assert_eq!(m.is_empty(), b.is_empty());
            for (a, e) in &b {
                prop_assert_eq!(&m[a], e);
            }
            for i in 0..=u8::MAX {
                prop_assert_eq!(m.get(&addr(i)), b.get(&addr(i)));
                prop_assert_eq!(m.contains_key(&addr(i)), b.contains_key(&addr(i)));
                prop_assert!(m.keys_from(&addr(i)).eq(b.range(addr(i)..).map(|(a, _)| a)));
            }
            let rebuilt: UsedMap = b.clone().into_iter().collect();
            prop_assert_eq!(&rebuilt, &m);
            prop_assert_eq!(format!("{m:?}"), format!("{b:?}"));
        }
    }

    proptest! {
        /// `update_from` leaves what converting `other` anew gives: an entry it kept (its
        /// name stays) was the same, and the entries before the first change are kept.
        #[test]
        fn update_from_equals_a_new_conversion(
            before in prop::collection::btree_map(any::<u8>(), 0..4u8, 0..40),
            after in prop::collection::btree_map(any::<u8>(), 0..4u8, 0..40),
        ) {
            let named = |uid: u8, pod: &str| UsedEntry { pod: pod.into(), ..entry(u128::from(uid)) };
            let mut m: UsedMap = before.iter().map(|(a, u)| (addr(*a), named(*u, "old"))).collect();
            let other: UsedMap<u8> = after.iter().map(|(a, u)| (addr(*a), *u)).collect();
            let unchanged = m.keys().zip(other.iter()).take_while(|(a, (b, u))| {
                *a == *b && m[*a].pod_uid == PodUid(u128::from(**u))
            }).count();
            m.update_from(&other, |e, u| e.pod_uid == PodUid(u128::from(*u)), |u| named(*u, "new"));
            prop_assert_eq!(m.len(), other.len());
            for (i, (a, u)) in other.iter().enumerate() {
                prop_assert_eq!(m[a].pod_uid, PodUid(u128::from(*u)));
                let was = before.iter().any(|(b, v)| addr(*b) == *a && v == u);
                let kept = &*m[a].pod == "old";
                prop_assert!(was || !kept);
                prop_assert!(i >= unchanged || kept);
            }
            prop_assert!(m.keys().eq(other.keys()));
            let back = m.map(|e| u8::try_from(e.pod_uid.0).unwrap());
            prop_assert_eq!(back, other);
        }
    }

    #[test]
    fn collecting_keeps_the_last_entry_of_an_address() {
        let m: UsedMap = [
            (addr(1), entry(1)),
            (addr(2), entry(2)),
            (addr(1), entry(3)),
        ]
        .into_iter()
        .collect();
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), [addr(1), addr(2)]);
        assert_eq!(m[&addr(1)].pod_uid, PodUid(3));
    }
}
