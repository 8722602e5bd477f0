//! [`AddrBits`]: a set of single addresses as 64-address bitmaps, for the observer's
//! addresses in use: a million of them at 10,000 nodes, packed into a few blocks a node.
//!
//! Hand-written rather than a crate: `roaring` keeps `u32`s (or `u64`s), not IPv6's 128
//! bits; and `AddrSet`'s coalescing runs cost ~2,000 instructions an insert, a bitmap word
//! a B-tree lookup and a bit.

use std::collections::BTreeMap;
use std::net::IpAddr;

use tidepool_ipam::PerFamily;
use tidepool_ipam::addrs::number;

/// Addresses as bits of 64-address words, keyed by the address's number / 64; a word
/// with no bit left goes.
#[derive(Default)]
pub(crate) struct AddrBits {
    words: PerFamily<BTreeMap<u128, u64>>,
}

/// The address's family's words, its word's key and its bit.
fn place(a: &IpAddr) -> (tidepool_ipam::Family, u128, u64) {
    let (f, n) = number(a);
    (f, n >> 6, 1 << (n & 63))
}

impl AddrBits {
    pub(crate) fn contains(&self, a: &IpAddr) -> bool {
        let (f, key, bit) = place(a);
        self.words.get(f).get(&key).is_some_and(|w| w & bit != 0)
    }

    pub(crate) fn insert(&mut self, a: &IpAddr) {
        let (f, key, bit) = place(a);
        *self.words.get_mut(f).entry(key).or_default() |= bit;
    }

    pub(crate) fn remove(&mut self, a: &IpAddr) {
        let (f, key, bit) = place(a);
        let words = self.words.get_mut(f);
        if let Some(w) = words.get_mut(&key) {
            *w &= !bit;
            if *w == 0 {
                words.remove(&key);
            }
        }
    }

    /// How many words it keeps (its memory).
    pub(crate) fn word_count(&self) -> usize {
        self.words.v4.len() + self.words.v6.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::BTreeSet;

    use proptest::prelude::*;

    fn addr(v6: bool, n: u16) -> IpAddr {
        if v6 {
            IpAddr::V6(std::net::Ipv6Addr::from(0xfd00_u128 << 112 | u128::from(n)))
        } else {
            IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 | u32::from(n)))
        }
    }

    proptest! {
        /// The bits against a set of addresses, through inserts and removals of both
        /// families (the same low bits in each: no family sees the other's).
        #[test]
        fn bits_match_a_set(ops in prop::collection::vec((any::<bool>(), any::<bool>(), 0u16..300), 1..400)) {
            let (mut bits, mut model) = (AddrBits::default(), BTreeSet::new());
            for (insert, v6, n) in ops {
                let a = addr(v6, n);
                if insert {
                    bits.insert(&a);
                    model.insert(a);
                } else {
                    bits.remove(&a);
                    model.remove(&a);
                }
                for probe in [a, addr(!v6, n), addr(v6, n ^ 1)] {
                    prop_assert_eq!(bits.contains(&probe), model.contains(&probe));
                }
            }
            let words: BTreeSet<(bool, u16)> = model
                .iter()
                .map(|a| (a.is_ipv6(), (number(a).1 as u16) >> 6))
                .collect();
            prop_assert_eq!(bits.word_count(), words.len(), "empty words go");
        }
    }
}
