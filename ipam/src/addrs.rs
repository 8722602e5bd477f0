//! Sets and maps of IP addresses kept as runs of consecutive addresses, per family: memory
//! follows how fragmented a node's addresses are, not how many there are. A /64 block is
//! one run (Kubernetes' usual IPv6 mask per node), a node with 110 pods on it at most a
//! few hundred; a set of every address would need 2^64 entries.
//!
//! Built on `rangemap` (coalescing range sets and maps); the address arithmetic is ours.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::RangeInclusive;

use ipnet::IpNet;
use rangemap::{RangeInclusiveMap, RangeInclusiveSet};

use crate::types::{Family, PerFamily};

/// Consecutive addresses of one family, as numbers (inclusive).
pub type Run = RangeInclusive<u128>;

/// An address as its family and number.
pub fn number(a: &IpAddr) -> (Family, u128) {
    match a {
        IpAddr::V4(v) => (Family::V4, u128::from(u32::from(*v))),
        IpAddr::V6(v) => (Family::V6, u128::from(*v)),
    }
}

/// The address of a family with this number (IPv4 keeps the low 32 bits).
pub fn address(family: Family, n: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// The first and last address of a network, as numbers.
pub fn span(net: &IpNet) -> (Family, Run) {
    let (f, lo) = number(&net.network());
    let (_, hi) = number(&net.broadcast());
    (f, lo..=hi)
}

/// How many addresses a run holds (a whole IPv6 space saturates).
pub fn run_len(r: &Run) -> u128 {
    (r.end() - r.start()).saturating_add(1)
}

/// Saturates a count of addresses into the engine's counters.
pub fn saturate(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A set of addresses of both families.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AddrSet {
    runs: PerFamily<RangeInclusiveSet<u128>>,
}

impl AddrSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every address of `net`.
    pub fn of_net(net: &IpNet) -> Self {
        let mut s = Self::new();
        s.insert_net(net);
        s
    }

    pub fn insert(&mut self, a: IpAddr) {
        let (f, n) = number(&a);
        self.runs.get_mut(f).insert(n..=n);
    }

    pub fn remove(&mut self, a: &IpAddr) {
        let (f, n) = number(a);
        self.runs.get_mut(f).remove(n..=n);
    }

    pub fn contains(&self, a: &IpAddr) -> bool {
        let (f, n) = number(a);
        self.runs.get(f).contains(&n)
    }

    pub fn insert_run(&mut self, family: Family, run: Run) {
        self.runs.get_mut(family).insert(run);
    }

    pub fn remove_run(&mut self, family: Family, run: Run) {
        self.runs.get_mut(family).remove(run);
    }

    pub fn insert_net(&mut self, net: &IpNet) {
        let (f, r) = span(net);
        self.insert_run(f, r);
    }

    /// Adds every address of `other`.
    pub fn union_with(&mut self, other: &AddrSet) {
        for (f, r) in other.runs() {
            self.insert_run(f, r.clone());
        }
    }

    /// Takes away every address of `other`.
    pub fn subtract(&mut self, other: &AddrSet) {
        for (f, r) in other.runs() {
            self.remove_run(f, r.clone());
        }
    }

    /// The addresses of both sets.
    pub fn intersection(&self, other: &AddrSet) -> AddrSet {
        let mut out = AddrSet::new();
        for f in Family::ALL {
            for r in self.runs.get(f).intersection(other.runs.get(f)) {
                out.insert_run(f, r);
            }
        }
        out
    }

    /// The set's runs of one family overlapping `run`, each cut to it.
    pub fn runs_within(&self, family: Family, run: &Run) -> impl Iterator<Item = Run> + '_ {
        let (lo, hi) = (*run.start(), *run.end());
        self.runs
            .get(family)
            .overlapping(run.clone())
            .map(move |r| *r.start().max(&lo)..=*r.end().min(&hi))
    }

    /// Whether any address of `run` is in the set.
    pub fn overlaps(&self, family: Family, run: &Run) -> bool {
        self.runs.get(family).overlaps(run)
    }

    /// Whether every address of `run` is in the set.
    pub fn covers(&self, family: Family, run: &Run) -> bool {
        self.runs
            .get(family)
            .get(run.start())
            .is_some_and(|r| r.end() >= run.end())
    }

    /// How many addresses of a family the set holds.
    pub fn len(&self, family: Family) -> u128 {
        self.runs
            .get(family)
            .iter()
            .fold(0u128, |n, r| n.saturating_add(run_len(r)))
    }

    /// How many addresses of both families the set holds.
    pub fn total(&self) -> u128 {
        self.len(Family::V4).saturating_add(self.len(Family::V6))
    }

    /// [`Self::len`], saturated into the engine's counters.
    pub fn count(&self, family: Family) -> u64 {
        saturate(self.len(family))
    }

    pub fn is_empty(&self) -> bool {
        self.runs.v4.is_empty() && self.runs.v6.is_empty()
    }

    /// The runs of one family, ascending.
    pub fn runs_of(&self, family: Family) -> impl DoubleEndedIterator<Item = &Run> + '_ {
        self.runs.get(family).iter()
    }

    /// Every run, IPv4 first, each family ascending.
    pub fn runs(&self) -> impl Iterator<Item = (Family, &Run)> + '_ {
        Family::ALL
            .into_iter()
            .flat_map(move |f| self.runs_of(f).map(move |r| (f, r)))
    }

    /// How many runs the set keeps (its memory).
    pub fn run_count(&self) -> usize {
        self.runs.v4.len() + self.runs.v6.len()
    }

    /// Every address in `IpAddr` order (IPv4 first). As many items as addresses: for sets
    /// known to be small, or with `take`.
    pub fn iter(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.runs()
            .flat_map(|(f, r)| r.clone().map(move |n| address(f, n)))
    }

    /// The addresses of one family only.
    pub fn of_family(&self, family: Family) -> AddrSet {
        let mut out = AddrSet::new();
        *out.runs.get_mut(family) = self.runs.get(family).clone();
        out
    }

    /// At most `n` of the set's addresses of a family, the highest ones.
    pub fn highest(&self, family: Family, n: u128) -> AddrSet {
        let mut out = AddrSet::new();
        let mut left = n;
        for r in self.runs_of(family).rev() {
            if left == 0 {
                break;
            }
            let take = run_len(r).min(left);
            out.insert_run(family, r.end() - (take - 1)..=*r.end());
            left -= take;
        }
        out
    }

    /// The lowest address of a family.
    pub fn first(&self, family: Family) -> Option<IpAddr> {
        self.runs
            .get(family)
            .first()
            .map(|r| address(family, *r.start()))
    }
}

impl FromIterator<IpAddr> for AddrSet {
    fn from_iter<I: IntoIterator<Item = IpAddr>>(iter: I) -> Self {
        let mut s = AddrSet::new();
        s.extend(iter);
        s
    }
}

impl Extend<IpAddr> for AddrSet {
    fn extend<I: IntoIterator<Item = IpAddr>>(&mut self, iter: I) {
        for a in iter {
            self.insert(a);
        }
    }
}

/// A run as `a` or `a-b`.
pub fn show_run(family: Family, r: &Run) -> String {
    if r.start() == r.end() {
        address(family, *r.start()).to_string()
    } else {
        format!(
            "{}-{}",
            address(family, *r.start()),
            address(family, *r.end())
        )
    }
}

fn fmt_run(f: &mut fmt::Formatter<'_>, family: Family, r: &Run) -> fmt::Result {
    f.write_str(&show_run(family, r))
}

impl fmt::Debug for AddrSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (fam, r)) in self.runs().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            fmt_run(f, fam, r)?;
        }
        f.write_str("}")
    }
}

/// A map from addresses to values, kept as runs of consecutive addresses with one value
/// (neighbouring runs of equal values merge).
#[derive(Clone, PartialEq, Eq)]
pub struct AddrMap<V: Clone + Eq> {
    runs: PerFamily<RangeInclusiveMap<u128, V>>,
}

impl<V: Clone + Eq> Default for AddrMap<V> {
    fn default() -> Self {
        Self {
            runs: PerFamily::default(),
        }
    }
}

impl<V: Clone + Eq> AddrMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, a: IpAddr, v: V) {
        let (f, n) = number(&a);
        self.runs.get_mut(f).insert(n..=n, v);
    }

    pub fn insert_run(&mut self, family: Family, run: Run, v: V) {
        self.runs.get_mut(family).insert(run, v);
    }

    /// Sets every address of `set` to `v`.
    pub fn insert_set(&mut self, set: &AddrSet, v: V) {
        for (f, r) in set.runs() {
            self.insert_run(f, r.clone(), v.clone());
        }
    }

    pub fn remove(&mut self, a: &IpAddr) {
        let (f, n) = number(a);
        self.runs.get_mut(f).remove(n..=n);
    }

    pub fn remove_run(&mut self, family: Family, run: Run) {
        self.runs.get_mut(family).remove(run);
    }

    /// Drops every address of `set`.
    pub fn remove_set(&mut self, set: &AddrSet) {
        for (f, r) in set.runs() {
            self.remove_run(f, r.clone());
        }
    }

    pub fn get(&self, a: &IpAddr) -> Option<&V> {
        let (f, n) = number(a);
        self.runs.get(f).get(&n)
    }

    pub fn contains_key(&self, a: &IpAddr) -> bool {
        self.get(a).is_some()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.v4.is_empty() && self.runs.v6.is_empty()
    }

    /// How many runs the map keeps (its memory).
    pub fn run_count(&self) -> usize {
        self.runs.v4.len() + self.runs.v6.len()
    }

    /// The runs of one family with their values, ascending.
    pub fn runs_of(&self, family: Family) -> impl DoubleEndedIterator<Item = (&Run, &V)> + '_ {
        self.runs.get(family).iter()
    }

    /// Every run with its value, IPv4 first.
    pub fn runs(&self) -> impl Iterator<Item = (Family, &Run, &V)> + '_ {
        Family::ALL
            .into_iter()
            .flat_map(move |f| self.runs_of(f).map(move |(r, v)| (f, r, v)))
    }

    /// The runs of one family overlapping `run`, each cut to it.
    pub fn within(&self, family: Family, run: &Run) -> impl Iterator<Item = (Run, &V)> + '_ {
        let (lo, hi) = (*run.start(), *run.end());
        self.runs
            .get(family)
            .overlapping(run.clone())
            .map(move |(r, v)| (*r.start().max(&lo)..=*r.end().min(&hi), v))
    }

    /// `run` cut where the map's values change: each piece with its value, or None where
    /// the map holds none of it. The pieces cover `run`, in order.
    pub fn pieces(&self, family: Family, run: &Run) -> Vec<(Run, Option<&V>)> {
        let mut out = Vec::new();
        let mut at = Some(*run.start());
        for (piece, v) in self.within(family, run) {
            if let Some(a) = at
                && a < *piece.start()
            {
                out.push((a..=piece.start() - 1, None));
            }
            at = piece.end().checked_add(1);
            out.push((piece, Some(v)));
        }
        if let Some(a) = at
            && a <= *run.end()
        {
            out.push((a..=*run.end(), None));
        }
        out
    }

    /// The addresses whose value passes `keep`.
    pub fn keys_where(&self, mut keep: impl FnMut(&V) -> bool) -> AddrSet {
        let mut out = AddrSet::new();
        for (f, r, v) in self.runs() {
            if keep(v) {
                out.insert_run(f, r.clone());
            }
        }
        out
    }

    /// Every address of the map.
    pub fn keys(&self) -> AddrSet {
        self.keys_where(|_| true)
    }

    /// How many addresses of a family have a value passing `keep`.
    pub fn count_where(&self, family: Family, mut keep: impl FnMut(&V) -> bool) -> u64 {
        saturate(
            self.runs_of(family)
                .filter(|(_, v)| keep(v))
                .fold(0u128, |n, (r, _)| n.saturating_add(run_len(r))),
        )
    }

    /// Keeps the runs for which `keep` says so.
    pub fn retain(&mut self, mut keep: impl FnMut(Family, &Run, &V) -> bool) {
        let drop: Vec<(Family, Run)> = self
            .runs()
            .filter(|(f, r, v)| !keep(*f, r, v))
            .map(|(f, r, _)| (f, r.clone()))
            .collect();
        for (f, r) in drop {
            self.remove_run(f, r);
        }
    }

    /// Each address with its value (one item per address: for maps known to be small).
    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, &V)> + '_ {
        self.runs()
            .flat_map(|(f, r, v)| r.clone().map(move |n| (address(f, n), v)))
    }
}

impl<V: Clone + Eq> FromIterator<(IpAddr, V)> for AddrMap<V> {
    fn from_iter<I: IntoIterator<Item = (IpAddr, V)>>(iter: I) -> Self {
        let mut m = AddrMap::new();
        for (a, v) in iter {
            m.insert(a, v);
        }
        m
    }
}

impl<V: Clone + Eq + fmt::Debug> fmt::Debug for AddrMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (fam, r, v)) in self.runs().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            fmt_run(f, fam, r)?;
            write!(f, ": {v:?}")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn v4(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
    }

    fn v6(n: u8) -> IpAddr {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n)))
    }

    /// An address of either family from a small number (0..64 IPv4, 64..128 IPv6).
    fn addr(n: u8) -> IpAddr {
        if n < 64 { v4(n) } else { v6(n - 64) }
    }

    #[test]
    fn a_64_is_one_run_and_counts_saturate() {
        let net: IpNet = "fd00:0:0:1::/64".parse().unwrap();
        let mut s = AddrSet::of_net(&net);
        assert_eq!(s.run_count(), 1);
        assert_eq!(s.len(Family::V6), 1u128 << 64);
        assert_eq!(s.count(Family::V6), u64::MAX);
        let used: IpAddr = "fd00:0:0:1::5".parse().unwrap();
        s.remove(&used);
        assert_eq!(s.run_count(), 2);
        assert!(!s.contains(&used));
        assert!(s.contains(&"fd00:0:0:1::6".parse().unwrap()));
        assert_eq!(s.first(Family::V6), Some("fd00:0:0:1::".parse().unwrap()));
        assert_eq!(
            format!("{:?}", s.highest(Family::V6, 2)),
            "{fd00::1:ffff:ffff:ffff:fffe-fd00::1:ffff:ffff:ffff:ffff}"
        );
        // the whole IPv6 space is one run too
        let all = AddrSet::of_net(&"::/0".parse().unwrap());
        assert_eq!(all.len(Family::V6), u128::MAX);
    }

    proptest! {
        /// The set answers as a BTreeSet of the same addresses would, through inserts,
        /// removals, unions, differences and the highest-n pick.
        #[test]
        fn the_set_agrees_with_a_btreeset(
            ops in proptest::collection::vec((any::<bool>(), 0u8..128), 0..80),
            other in proptest::collection::btree_set(0u8..128, 0..40),
            n in 0u128..20,
        ) {
            let mut s = AddrSet::new();
            let mut model = BTreeSet::new();
            for (add, a) in ops {
                if add { s.insert(addr(a)); model.insert(addr(a)); }
                else { s.remove(&addr(a)); model.remove(&addr(a)); }
            }
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
            for f in Family::ALL {
                let of_f: Vec<IpAddr> = model.iter().filter(|a| Family::of(a) == f).copied().collect();
                prop_assert_eq!(s.len(f), of_f.len() as u128);
                let top: Vec<IpAddr> = of_f.iter().rev().take(n as usize).rev().copied().collect();
                prop_assert_eq!(s.highest(f, n).iter().collect::<Vec<_>>(), top);
                prop_assert_eq!(s.first(f), of_f.first().copied());
            }
            let o: AddrSet = other.iter().map(|a| addr(*a)).collect();
            let om: BTreeSet<IpAddr> = other.iter().map(|a| addr(*a)).collect();
            prop_assert_eq!(
                s.intersection(&o).iter().collect::<BTreeSet<_>>(),
                model.intersection(&om).copied().collect::<BTreeSet<_>>()
            );
            let mut d = s.clone();
            d.subtract(&o);
            prop_assert_eq!(d.iter().collect::<BTreeSet<_>>(), model.difference(&om).copied().collect::<BTreeSet<_>>());
            let mut u = s.clone();
            u.union_with(&o);
            prop_assert_eq!(u.iter().collect::<BTreeSet<_>>(), model.union(&om).copied().collect::<BTreeSet<_>>());
        }

        /// The map answers as a BTreeMap would; runs of equal values merge.
        #[test]
        fn the_map_agrees_with_a_btreemap(
            ops in proptest::collection::vec((0u8..3, 0u8..128), 0..80),
        ) {
            let mut m = AddrMap::new();
            let mut model = BTreeMap::new();
            for (op, a) in ops {
                match op {
                    0 => { m.remove(&addr(a)); model.remove(&addr(a)); }
                    v => { m.insert(addr(a), v); model.insert(addr(a), v); }
                }
            }
            prop_assert_eq!(
                m.iter().map(|(a, v)| (a, *v)).collect::<Vec<_>>(),
                model.iter().map(|(a, v)| (*a, *v)).collect::<Vec<_>>()
            );
            for f in Family::ALL {
                let twos = model.iter().filter(|(a, v)| Family::of(a) == f && **v == 2).count();
                prop_assert_eq!(m.count_where(f, |v| *v == 2), twos as u64);
            }
            let mut r = m.clone();
            r.retain(|_, _, v| *v == 1);
            prop_assert_eq!(r.keys(), m.keys_where(|v| *v == 1));
        }
    }
}
