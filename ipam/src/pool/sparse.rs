//! A sparse two-level bitmap over `u64` indices, for CIDRs too large for a dense bitmap (an IPv6
//! /64 in /124 blocks has 2^60 of them):
//!
//! - level 0: a hash map from chunk number (`index / 64`) to its 64-bit word, holding only
//!   chunks that are partly taken (a word is never 0 and never all ones);
//! - level 1: [`Runs`] (a B-tree) of chunk numbers that are entirely taken.
//!
//! Memory follows what is granted: one 16-byte entry (+1 control byte, load ≤ 7/8) per partly
//! taken chunk — at most one per taken block, 1/64 of that when claims cluster — and one per
//! run of full chunks (a sequential fill of any length is one entry, a rebuilt record covering
//! 2^60 blocks too). The map shrinks when it falls below a quarter of its capacity, so memory
//! follows releases as well. The representation of a set is unique, so two indices holding the
//! same blocks compare equal.
//!
//! Costs: test / set / clear of an index are one hash lookup (plus a run lookup when the word
//! is absent); "first clear index at or after x" is at most one run lookup and two word
//! lookups, whatever the fill pattern. No decision depends on the map's iteration order:
//! [`SparseBitmap::iter`] sorts. A hash map rather than a `BTreeMap` for level 0 because random
//! claims in a /64 touch a new chunk each and a B-tree descent over 100,000 such entries costs
//! three times a hash lookup (BENCHMARKS.md: 6.6 vs 2.1 M claim+release pairs/s).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasherDefault, Hasher};

use super::runs::Runs;

/// See the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SparseBitmap {
    words: HashMap<u64, u64, BuildHasherDefault<Mix>>,
    full: Runs,
}

/// splitmix64's finalizer: chunk numbers are not attacker-chosen, and no decision depends on
/// the map's iteration order (only lookups; iteration sorts).
#[derive(Default)]
pub struct Mix(u64);

impl Hasher for Mix {
    #[inline]
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }
}

#[inline]
fn split(i: u64) -> (u64, u64) {
    (i >> 6, 1u64 << (i & 63))
}

impl SparseBitmap {
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    pub fn contains(&self, i: u64) -> bool {
        let (c, bit) = split(i);
        match self.words.get(&c) {
            Some(w) => w & bit != 0,
            None => self.full.contains(c),
        }
    }

    /// Sets `i`; returns whether it was clear.
    #[inline]
    pub fn insert(&mut self, i: u64) -> bool {
        let (c, bit) = split(i);
        match self.words.entry(c) {
            Entry::Occupied(mut e) => {
                let w = e.get_mut();
                if *w & bit != 0 {
                    return false;
                }
                *w |= bit;
                if *w == u64::MAX {
                    e.remove();
                    self.full.insert(c);
                }
                true
            }
            Entry::Vacant(e) => {
                if self.full.contains(c) {
                    return false;
                }
                e.insert(bit);
                true
            }
        }
    }

    /// Clears `i`; returns whether it was set.
    #[inline]
    pub fn remove(&mut self, i: u64) -> bool {
        let (c, bit) = split(i);
        match self.words.entry(c) {
            Entry::Occupied(mut e) => {
                let w = e.get_mut();
                if *w & bit == 0 {
                    return false;
                }
                *w &= !bit;
                if *w == 0 {
                    e.remove();
                    let cap = self.words.capacity();
                    if cap > 64 && self.words.len() < cap / 4 {
                        self.words.shrink_to(self.words.len() * 2);
                    }
                }
                true
            }
            Entry::Vacant(e) => {
                if !self.full.remove(c) {
                    return false;
                }
                e.insert(!bit);
                true
            }
        }
    }

    /// The first clear index at or after `x`, if any below 2^64.
    #[inline]
    pub fn next_clear(&self, x: u64) -> Option<u64> {
        let (mut c, _) = split(x);
        let mut from = x & 63;
        loop {
            if let Some((_, last)) = self.full.run_containing(c) {
                c = last + 1;
                from = 0;
                if c > u64::MAX >> 6 {
                    return None;
                }
            }
            let w = self.words.get(&c).copied().unwrap_or(0);
            let free = !w & (u64::MAX << from);
            if free != 0 {
                return Some((c << 6) | free.trailing_zeros() as u64);
            }
            c += 1;
            if c > u64::MAX >> 6 {
                return None;
            }
            from = 0;
        }
    }

    /// Sets `mask` in chunk `c`; returns how many bits were clear.
    fn set_mask(&mut self, c: u64, mask: u64) -> u128 {
        if self.full.contains(c) {
            return 0;
        }
        let w = self.words.get(&c).copied().unwrap_or(0);
        let new = (mask & !w).count_ones() as u128;
        let w = w | mask;
        if w == u64::MAX {
            self.words.remove(&c);
            self.full.insert(c);
        } else {
            self.words.insert(c, w);
        }
        new
    }

    /// Sets every index of `lo..=hi`; returns how many were clear.
    pub fn insert_range(&mut self, lo: u64, hi: u64) -> u128 {
        debug_assert!(lo <= hi);
        let (ca, cb) = (lo >> 6, hi >> 6);
        let head = u64::MAX << (lo & 63);
        let tail = u64::MAX >> (63 - (hi & 63));
        if ca == cb {
            return self.set_mask(ca, head & tail);
        }
        let mut new = self.set_mask(ca, head) + self.set_mask(cb, tail);
        if cb > ca + 1 {
            let (a, b) = (ca + 1, cb - 1);
            let inside: Vec<(u64, u64)> = if ((b - a) as usize) < self.words.len() {
                (a..=b)
                    .filter_map(|k| self.words.get(&k).map(|&w| (k, w)))
                    .collect()
            } else {
                self.words
                    .iter()
                    .filter(|&(&k, _)| k >= a && k <= b)
                    .map(|(&k, &w)| (k, w))
                    .collect()
            };
            let in_words: u128 = inside.iter().map(|&(_, w)| w.count_ones() as u128).sum();
            for (k, _) in inside {
                self.words.remove(&k);
            }
            let chunks = (b - a) as u128 + 1;
            let were_full = chunks - self.full.insert_range(a, b);
            let already = in_words + were_full * 64;
            new += chunks * 64 - already;
        }
        new
    }

    /// Set indices, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let mut sorted: Vec<(u64, u64)> = self.words.iter().map(|(&k, &w)| (k, w)).collect();
        sorted.sort_unstable();
        let mut runs = self.full.iter().peekable();
        let mut words = sorted.into_iter().peekable();
        std::iter::from_fn(move || {
            let run_first = match (runs.peek(), words.peek()) {
                (Some(&(s, _)), Some(&(k, _))) => s < k,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return None,
            };
            let seg: Box<dyn Iterator<Item = u64>> = if run_first {
                let (s, l) = runs.next()?;
                Box::new((s << 6)..=((l << 6) | 63))
            } else {
                let (k, w) = words.next()?;
                let mut bits = w;
                Box::new(std::iter::from_fn(move || {
                    (bits != 0).then(|| {
                        let b = bits.trailing_zeros() as u64;
                        bits &= bits - 1;
                        (k << 6) | b
                    })
                }))
            };
            Some(seg)
        })
        .flatten()
    }

    /// Stored entries: partly taken chunks plus runs of full chunks.
    pub fn entries(&self) -> usize {
        self.words.len() + self.full.entries()
    }

    pub fn clear(&mut self) {
        self.words.clear();
        self.full.clear();
    }

    /// Estimate of the heap held: the hash table's buckets (16-byte entry + control byte) and
    /// [`Runs::heap_bytes_estimate`].
    pub fn heap_bytes_estimate(&self) -> usize {
        let cap = self.words.capacity();
        let buckets = if cap == 0 {
            0
        } else {
            (cap * 8 / 7).next_power_of_two()
        };
        buckets * 17 + self.full.heap_bytes_estimate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn sparse_bitmap_matches_a_set(
            ops in proptest::collection::vec((0u8..4, 0u64..600, 0u64..300), 0..300),
        ) {
            let mut s = SparseBitmap::new();
            let mut model = BTreeSet::new();
            for (op, i, n) in ops {
                match op {
                    0 => prop_assert_eq!(s.insert(i), model.insert(i)),
                    1 => prop_assert_eq!(s.remove(i), model.remove(&i)),
                    2 => {
                        let absent = (i..=i + n).filter(|x| !model.contains(x)).count() as u128;
                        prop_assert_eq!(s.insert_range(i, i + n), absent);
                        model.extend(i..=i + n);
                    }
                    _ => {
                        let want = (i..).find(|x| !model.contains(x));
                        prop_assert_eq!(s.next_clear(i), want);
                        prop_assert_eq!(s.contains(i), model.contains(&i));
                    }
                }
            }
            prop_assert_eq!(s.iter().collect::<BTreeSet<_>>(), model.clone());
            prop_assert!(s.iter().collect::<Vec<_>>().windows(2).all(|w| w[0] < w[1]));
            // the representation is canonical: rebuilding bit by bit gives an equal value
            let mut t = SparseBitmap::new();
            for &i in &model {
                t.insert(i);
            }
            prop_assert_eq!(s, t);
        }
    }

    #[test]
    fn sequential_fill_is_one_run() {
        let mut s = SparseBitmap::new();
        for i in 0..100_000 {
            assert_eq!(s.next_clear(0), Some(i));
            assert!(s.insert(i));
        }
        assert!(s.entries() <= 2);
        assert_eq!(s.insert_range(0, u64::MAX), (1u128 << 64) - 100_000);
        assert_eq!(s.entries(), 1);
        assert_eq!(s.next_clear(5), None);
        assert!(s.remove(u64::MAX));
        assert_eq!(s.next_clear(5), Some(u64::MAX));
    }
}
