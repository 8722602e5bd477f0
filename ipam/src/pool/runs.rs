//! A sparse set of `u64` indices stored as maximal runs of consecutive members: a `BTreeMap`
//! from each run's first index to its last (inclusive). Runs never touch (adjacent runs are
//! merged), so "the first non-member at or after x" is one lookup: x itself, or the end of the
//! run holding x plus one. Memory is one entry per run — at most one per member, and one for
//! any number of consecutive members (a sequential fill of a /64 costs one entry, a block record
//! covering 2^60 blocks one entry too).

use std::collections::BTreeMap;

/// See the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runs {
    map: BTreeMap<u64, u64>,
}

impl Runs {
    pub fn new() -> Self {
        Self::default()
    }

    /// The run holding `i`, as (first, last).
    #[inline]
    pub fn run_containing(&self, i: u64) -> Option<(u64, u64)> {
        match self.map.range(..=i).next_back() {
            Some((&s, &l)) if l >= i => Some((s, l)),
            _ => None,
        }
    }

    #[inline]
    pub fn contains(&self, i: u64) -> bool {
        self.run_containing(i).is_some()
    }

    /// Adds `i`; returns whether it was absent.
    pub fn insert(&mut self, i: u64) -> bool {
        let left = match self.map.range(..=i).next_back() {
            Some((_, &l)) if l >= i => return false,
            Some((&s, &l)) if i > 0 && l == i - 1 => Some(s),
            _ => None,
        };
        let right = i
            .checked_add(1)
            .and_then(|n| self.map.get(&n).map(|&l| (n, l)));
        match (left, right) {
            (Some(s), Some((rs, rl))) => {
                self.map.remove(&rs);
                self.map.insert(s, rl);
            }
            (Some(s), None) => {
                self.map.insert(s, i);
            }
            (None, Some((rs, rl))) => {
                self.map.remove(&rs);
                self.map.insert(i, rl);
            }
            (None, None) => {
                self.map.insert(i, i);
            }
        }
        true
    }

    /// Removes `i`; returns whether it was present.
    pub fn remove(&mut self, i: u64) -> bool {
        let Some((s, l)) = self.run_containing(i) else {
            return false;
        };
        if s == i {
            self.map.remove(&s);
        } else {
            self.map.insert(s, i - 1);
        }
        if l > i {
            self.map.insert(i + 1, l);
        }
        true
    }

    /// Adds every index of `lo..=last`; returns how many were absent.
    pub fn insert_range(&mut self, lo: u64, last: u64) -> u128 {
        debug_assert!(lo <= last);
        let mut start = lo;
        let mut end = last;
        let mut present = 0u128;
        // runs overlapping or touching lo..=last
        let from = match self.map.range(..=lo).next_back() {
            Some((&s, &l)) if l.saturating_add(1) >= lo => s,
            _ => lo,
        };
        let upto = last.saturating_add(1);
        let touched: Vec<(u64, u64)> = self.map.range(from..=upto).map(|(&s, &l)| (s, l)).collect();
        for (s, l) in touched {
            self.map.remove(&s);
            let (a, b) = (s.max(lo), l.min(last));
            if a <= b {
                present += (b - a) as u128 + 1;
            }
            start = start.min(s);
            end = end.max(l);
        }
        self.map.insert(start, end);
        (last - lo) as u128 + 1 - present
    }

    /// Whether any index of `lo..=last` is a member.
    pub fn any_in(&self, lo: u64, last: u64) -> bool {
        self.contains(lo) || self.map.range(lo..=last).next().is_some()
    }

    /// Runs as (first, last), in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &l)| (s, l))
    }

    /// Stored runs (map entries).
    pub fn entries(&self) -> usize {
        self.map.len()
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// An upper-bound estimate of the heap held: std's B-tree nodes hold up to 11 entries and
    /// are at least half full except the root; a leaf of `u64 → u64` is 192 bytes, an internal
    /// node 288. The benchmark measures the real figure with a counting allocator.
    pub fn heap_bytes_estimate(&self) -> usize {
        let n = self.map.len();
        if n == 0 {
            return 0;
        }
        let leaves = n.div_ceil(5);
        let internal = leaves.div_ceil(5);
        leaves * 192 + internal * 288
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn check(r: &Runs, model: &BTreeSet<u64>) -> Result<(), TestCaseError> {
        let mut prev: Option<u64> = None;
        let mut members = BTreeSet::new();
        for (s, l) in r.iter() {
            prop_assert!(s <= l);
            if let Some(p) = prev {
                prop_assert!(s > p + 1, "runs touch or overlap");
            }
            prev = Some(l);
            members.extend(s..=l);
        }
        prop_assert_eq!(&members, model);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn runs_match_a_set(ops in proptest::collection::vec((0u8..3, 0u64..200, 0u64..20), 0..400)) {
            let mut r = Runs::new();
            let mut model = BTreeSet::new();
            for (k, (op, i, n)) in ops.into_iter().enumerate() {
                match op {
                    0 => prop_assert_eq!(r.insert(i), model.insert(i)),
                    1 => prop_assert_eq!(r.remove(i), model.remove(&i)),
                    _ => {
                        let absent = (i..=i + n).filter(|x| !model.contains(x)).count() as u128;
                        prop_assert_eq!(r.any_in(i, i + n), absent < (n + 1) as u128);
                        prop_assert_eq!(r.insert_range(i, i + n), absent);
                        model.extend(i..=i + n);
                    }
                }
                if k % 16 == 0 {
                    check(&r, &model)?;
                }
            }
            check(&r, &model)?;
        }
    }

    #[test]
    fn extremes_of_u64() {
        let mut r = Runs::new();
        assert!(r.insert(u64::MAX));
        assert!(r.insert(u64::MAX - 1));
        assert_eq!(r.entries(), 1);
        assert_eq!(r.insert_range(0, u64::MAX), u64::MAX as u128 - 1);
        assert_eq!(r.entries(), 1);
        assert!(r.remove(0));
        assert!(r.remove(u64::MAX));
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(1, u64::MAX - 1)]);
    }
}
