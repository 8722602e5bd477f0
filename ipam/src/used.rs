//! `status.used` of an IPAMNode: address → the pod using it, in address order.
//!
//! Sorted arrays (each family's addresses, the entries) instead of a B-tree: a node holds a
//! few hundred entries at most, every pass walks them all (planning, reclaim, repair), and
//! walking contiguous addresses is several times cheaper than walking B-tree nodes that
//! are cold at 10,000 nodes; it also takes less memory per entry. Lookups are binary
//! searches over one family's addresses alone; inserting and removing move at most a few
//! kilobytes.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::{Index, Range};

use crate::types::UsedEntry;

/// Address → entry, in address order. `E` is the engine's [`UsedEntry`] for `status.used`,
/// and the node side's own entry in [`crate::node::NodeSide`].
///
/// The addresses are kept per family, an IPv4 one in 4 bytes where an `IpAddr` takes 17
/// (a cluster keeps one `used` entry per pod, most of them IPv4). An `IpAddr` orders IPv4
/// before IPv6, so the entries are the IPv4 addresses' and then the IPv6 ones'.
#[derive(Clone, PartialEq, Eq)]
pub struct UsedMap<E = UsedEntry> {
    /// Sorted, no duplicates.
    v4: Vec<Ipv4Addr>,
    /// Sorted, no duplicates.
    v6: Vec<Ipv6Addr>,
    /// `entries[i]` is the entry of `v4[i]`, and `entries[v4.len() + j]` that of `v6[j]`.
    entries: Vec<E>,
}

impl<E> Default for UsedMap<E> {
    fn default() -> Self {
        UsedMap {
            v4: Vec::new(),
            v6: Vec::new(),
            entries: Vec::new(),
        }
    }
}

/// The addresses of a [`UsedMap`] (or of a part of it), in order.
#[derive(Clone, Debug)]
pub struct Keys<'a> {
    v4: std::slice::Iter<'a, Ipv4Addr>,
    v6: std::slice::Iter<'a, Ipv6Addr>,
}

impl Iterator for Keys<'_> {
    type Item = IpAddr;

    fn next(&mut self) -> Option<IpAddr> {
        match self.v4.next() {
            Some(a) => Some(IpAddr::V4(*a)),
            None => self.v6.next().map(|a| IpAddr::V6(*a)),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.v4.len() + self.v6.len();
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Keys<'_> {
    fn next_back(&mut self) -> Option<IpAddr> {
        match self.v6.next_back() {
            Some(a) => Some(IpAddr::V6(*a)),
            None => self.v4.next_back().map(|a| IpAddr::V4(*a)),
        }
    }
}

impl ExactSizeIterator for Keys<'_> {}

/// The entries in address order.
pub type Iter<'a, E = UsedEntry> = std::iter::Zip<Keys<'a>, std::slice::Iter<'a, E>>;

impl<E> UsedMap<E> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Removes every entry, keeping the storage.
    pub fn clear(&mut self) {
        self.v4.clear();
        self.v6.clear();
        self.entries.clear();
    }

    /// The place of `addr` among the entries: `Ok` where it is, `Err` where it would go.
    fn search(&self, addr: &IpAddr) -> Result<usize, usize> {
        match addr {
            IpAddr::V4(a) => self.v4.binary_search(a),
            IpAddr::V6(a) => {
                let n = self.v4.len();
                self.v6.binary_search(a).map(|j| n + j).map_err(|j| n + j)
            }
        }
    }

    pub fn get(&self, addr: &IpAddr) -> Option<&E> {
        self.search(addr).ok().map(|i| &self.entries[i])
    }

    pub fn contains_key(&self, addr: &IpAddr) -> bool {
        self.search(addr).is_ok()
    }

    /// Sets the entry of `addr`; returns the one it replaced.
    pub fn insert(&mut self, addr: IpAddr, entry: E) -> Option<E> {
        // addresses are mostly handed out in order: appending needs no search
        let last = match addr {
            IpAddr::V4(a) => self.v4.last().is_none_or(|l| *l < a),
            IpAddr::V6(a) => self.v6.last().is_none_or(|l| *l < a),
        };
        let at = match last {
            true => Err(self.family_end(&addr)),
            false => self.search(&addr),
        };
        match at {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i], entry)),
            Err(i) => {
                match addr {
                    IpAddr::V4(a) => self.v4.insert(i, a),
                    IpAddr::V6(a) => self.v6.insert(i - self.v4.len(), a),
                }
                self.entries.insert(i, entry);
                None
            }
        }
    }

    /// Where the entries of `addr`'s family end.
    fn family_end(&self, addr: &IpAddr) -> usize {
        match addr {
            IpAddr::V4(_) => self.v4.len(),
            IpAddr::V6(_) => self.entries.len(),
        }
    }

    pub fn remove(&mut self, addr: &IpAddr) -> Option<E> {
        let i = self.search(addr).ok()?;
        match addr {
            IpAddr::V4(_) => {
                self.v4.remove(i);
            }
            IpAddr::V6(_) => {
                self.v6.remove(i - self.v4.len());
            }
        }
        Some(self.entries.remove(i))
    }

    pub fn keys(&self) -> Keys<'_> {
        Keys {
            v4: self.v4.iter(),
            v6: self.v6.iter(),
        }
    }

    /// How many addresses sort before `addr` (and with `addr` itself, if `inclusive`).
    pub fn rank(&self, addr: &IpAddr, inclusive: bool) -> usize {
        match addr {
            IpAddr::V4(a) => self.v4.partition_point(|x| x < a || (inclusive && x == a)),
            IpAddr::V6(a) => {
                self.v4.len() + self.v6.partition_point(|x| x < a || (inclusive && x == a))
            }
        }
    }

    /// The IPv4 addresses from `a` on, in order.
    pub fn v4_from(&self, a: &Ipv4Addr) -> &[Ipv4Addr] {
        &self.v4[self.v4.partition_point(|x| x < a)..]
    }

    /// The IPv6 addresses from `a` on, in order.
    pub fn v6_from(&self, a: &Ipv6Addr) -> &[Ipv6Addr] {
        &self.v6[self.v6.partition_point(|x| x < a)..]
    }

    pub fn values(&self) -> std::slice::Iter<'_, E> {
        self.entries.iter()
    }

    pub fn iter(&self) -> Iter<'_, E> {
        self.keys().zip(self.entries.iter())
    }

    /// The IPv4 addresses and their entries, in order.
    pub fn ipv4(&self) -> (&[Ipv4Addr], &[E]) {
        (&self.v4, &self.entries[..self.v4.len()])
    }

    /// The IPv6 addresses and their entries, in order.
    pub fn ipv6(&self) -> (&[Ipv6Addr], &[E]) {
        (&self.v6, &self.entries[self.v4.len()..])
    }

    /// The same addresses with each entry converted by `f`.
    pub fn map<F>(&self, f: impl FnMut(&E) -> F) -> UsedMap<F> {
        UsedMap {
            v4: self.v4.clone(),
            v6: self.v6.clone(),
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
        let alike = |(a, e): (IpAddr, &E), (b, h): (IpAddr, &H)| a == b && same(e, h);
        let start = self
            .iter()
            .zip(other.iter())
            .take_while(|(x, y)| alike(*x, *y))
            .count();
        let end = self.iter().rev().zip(other.iter().rev());
        let end = end.take_while(|(x, y)| alike(*x, *y)).count();
        let end = end.min(self.len().min(other.len()) - start);
        let mine = start..self.len() - end;
        let theirs = start..other.len() - end;
        // room for exactly the new length: a copy of a stored object has no spare room,
        // and one more entry would double it (a node's 110 entries took 14 KiB, not 7,
        // in every object the node side wrote after a copy); the allocator rounds up to
        // its size class, and moves nothing while the length stays within it
        let (m4, m6) = self.family_spans(&mine);
        let (t4, t6) = other.family_spans(&theirs);
        self.v4.reserve_exact(t4.len().saturating_sub(m4.len()));
        self.v6.reserve_exact(t6.len().saturating_sub(m6.len()));
        let grow = theirs.len().saturating_sub(mine.len());
        self.entries.reserve_exact(grow);
        self.v4.splice(m4, other.v4[t4].iter().copied());
        self.v6.splice(m6, other.v6[t6].iter().copied());
        self.entries
            .splice(mine, other.entries[theirs].iter().map(make));
    }

    /// The parts of an entry span in `v4` and in `v6`.
    fn family_spans(&self, span: &Range<usize>) -> (Range<usize>, Range<usize>) {
        let n = self.v4.len();
        let v4 = span.start.min(n)..span.end.min(n);
        let v6 = span.start.max(n) - n..span.end.max(n) - n;
        (v4, v6)
    }

    /// Heap bytes held (for the simulator's memory estimate).
    pub fn heap_bytes(&self) -> usize {
        self.v4.capacity() * size_of::<Ipv4Addr>()
            + self.v6.capacity() * size_of::<Ipv6Addr>()
            + self.entries.capacity() * size_of::<E>()
    }
}

impl<'a, E> IntoIterator for &'a UsedMap<E> {
    type Item = (IpAddr, &'a E);
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
    use crate::types::{PodName, PodUid};

    fn entry(uid: u128) -> UsedEntry {
        UsedEntry {
            pod_uid: PodUid(uid),
            pod: PodName::new("default", "p"),
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
            prop_assert!(m.iter().eq(b.iter().map(|(a, e)| (*a, e))));
            prop_assert!(m.keys().eq(b.keys().copied()));
            prop_assert!(m.keys().rev().eq(b.keys().rev().copied()));
            prop_assert_eq!(m.keys().len(), b.len());
            let ((a4, e4), (a6, e6)) = (m.ipv4(), m.ipv6());
            let v4 = a4.iter().map(|a| IpAddr::V4(*a)).zip(e4);
            let v6 = a6.iter().map(|a| IpAddr::V6(*a)).zip(e6);
            prop_assert!(v4.chain(v6).eq(b.iter().map(|(a, e)| (*a, e))));
            prop_assert!(m.values().eq(b.values()));
            prop_assert_eq!(m.is_empty(), b.is_empty());
            for (a, e) in &b {
                prop_assert_eq!(&m[a], e);
            }
            for i in 0..=u8::MAX {
                prop_assert_eq!(m.get(&addr(i)), b.get(&addr(i)));
                prop_assert_eq!(m.contains_key(&addr(i)), b.contains_key(&addr(i)));
                let from = b.range(addr(i)..).map(|(a, _)| *a);
                match addr(i) {
                    IpAddr::V4(a) => prop_assert!(m.v4_from(&a).iter().map(|x| IpAddr::V4(*x))
                        .eq(from.filter(IpAddr::is_ipv4))),
                    IpAddr::V6(a) => prop_assert!(m.v6_from(&a).iter().map(|x| IpAddr::V6(*x))
                        .eq(from)),
                }
                prop_assert_eq!(m.rank(&addr(i), false), b.range(..addr(i)).count());
                prop_assert_eq!(m.rank(&addr(i), true), b.range(..=addr(i)).count());
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
            let named = |uid: u8, pod: &str| UsedEntry { pod: PodName::new("default", pod), ..entry(u128::from(uid)) };
            let mut m: UsedMap = before.iter().map(|(a, u)| (addr(*a), named(*u, "old"))).collect();
            let other: UsedMap<u8> = after.iter().map(|(a, u)| (addr(*a), *u)).collect();
            let unchanged = m.keys().zip(other.iter()).take_while(|(a, (b, u))| {
                a == b && m[a].pod_uid == PodUid(u128::from(**u))
            }).count();
            m.update_from(&other, |e, u| e.pod_uid == PodUid(u128::from(*u)), |u| named(*u, "new"));
            prop_assert_eq!(m.len(), other.len());
            for (i, (a, u)) in other.iter().enumerate() {
                prop_assert_eq!(m[&a].pod_uid, PodUid(u128::from(*u)));
                let was = before.iter().any(|(b, v)| addr(*b) == a && v == u);
                let kept = m[&a].pod.name() == "old";
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
        assert_eq!(m.keys().collect::<Vec<_>>(), [addr(1), addr(2)]);
        assert_eq!(m[&addr(1)].pod_uid, PodUid(3));
    }
}
