//! A dense two-level bitmap: one bit per block (set = unavailable), plus one summary bit per
//! 64-bit word (set = the word is full), so a search skips 4,096 unavailable blocks per summary
//! word and a nearly full /12 of /28 blocks (65,536 bits, 8 KiB + 128 B) is crossed in at most
//! 16 summary reads. Bits past `len` are kept set, so searches never return them.

/// See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    len: usize,
    words: Vec<u64>,
    full: Vec<u64>,
}

impl Bitmap {
    /// `len` clear bits.
    pub fn new(len: usize) -> Self {
        let nwords = len.div_ceil(64);
        let mut words = vec![0u64; nwords];
        if !len.is_multiple_of(64) {
            words[nwords - 1] = u64::MAX << (len % 64);
        }
        let nfull = nwords.div_ceil(64);
        let mut full = vec![0u64; nfull];
        if !nwords.is_multiple_of(64) {
            full[nfull - 1] = u64::MAX << (nwords % 64);
        }
        let mut b = Self { len, words, full };
        for w in 0..nwords {
            b.sync(w);
        }
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn sync(&mut self, w: usize) {
        let bit = 1u64 << (w % 64);
        if self.words[w] == u64::MAX {
            self.full[w / 64] |= bit;
        } else {
            self.full[w / 64] &= !bit;
        }
    }

    #[inline]
    pub fn get(&self, i: usize) -> bool {
        debug_assert!(i < self.len);
        self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Sets bit `i`; returns whether it was clear.
    #[inline]
    pub fn set(&mut self, i: usize) -> bool {
        debug_assert!(i < self.len);
        let w = i / 64;
        let bit = 1u64 << (i % 64);
        let was_clear = self.words[w] & bit == 0;
        self.words[w] |= bit;
        if self.words[w] == u64::MAX {
            self.full[w / 64] |= 1 << (w % 64);
        }
        was_clear
    }

    /// Clears bit `i`; returns whether it was set.
    #[inline]
    pub fn clear(&mut self, i: usize) -> bool {
        debug_assert!(i < self.len);
        let w = i / 64;
        let bit = 1u64 << (i % 64);
        let was_set = self.words[w] & bit != 0;
        self.words[w] &= !bit;
        self.full[w / 64] &= !(1 << (w % 64));
        was_set
    }

    /// The first clear bit in `lo..hi` (`hi ≤ len`).
    #[inline]
    pub fn find_clear(&self, lo: usize, hi: usize) -> Option<usize> {
        debug_assert!(hi <= self.len);
        if lo >= hi {
            return None;
        }
        let mut w = lo / 64;
        let mut bits = !self.words[w] & (u64::MAX << (lo % 64));
        loop {
            if bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                return (i < hi).then_some(i);
            }
            w += 1;
            if w * 64 >= hi {
                return None;
            }
            // the next word that is not full, from w on
            let mut s = w / 64;
            let mut m = !self.full[s] & (u64::MAX << (w % 64));
            while m == 0 {
                s += 1;
                if s >= self.full.len() || s * 64 * 64 >= hi {
                    return None;
                }
                m = !self.full[s];
            }
            w = s * 64 + m.trailing_zeros() as usize;
            if w >= self.words.len() {
                return None;
            }
            bits = !self.words[w];
        }
    }

    /// Set bits in `0..len`, in order.
    pub fn iter_set(&self) -> impl Iterator<Item = usize> + '_ {
        let len = self.len;
        self.words.iter().enumerate().flat_map(move |(w, &word)| {
            let mut bits = word;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                Some(i)
            })
            .take_while(move |&i| i < len)
        })
    }

    /// Heap bytes held (both levels).
    pub fn heap_bytes(&self) -> usize {
        (self.words.capacity() + self.full.capacity()) * 8
    }

    /// 64-bit words stored (both levels).
    pub fn stored_words(&self) -> usize {
        self.words.len() + self.full.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn padding_is_never_found() {
        for len in [0usize, 1, 63, 64, 65, 4095, 4096, 4097, 70_000] {
            let mut b = Bitmap::new(len);
            for i in 0..len {
                assert_eq!(b.find_clear(0, len), Some(i));
                assert!(b.set(i));
            }
            assert_eq!(b.find_clear(0, len), None);
            assert_eq!(b.iter_set().count(), len);
        }
    }

    proptest! {
        /// find_clear agrees with a linear scan.
        #[test]
        fn find_clear_matches_linear_scan(
            len in 1usize..9000,
            ops in proptest::collection::vec((any::<bool>(), any::<usize>()), 0..3000),
            lo in any::<usize>(),
            hi in any::<usize>(),
        ) {
            let mut b = Bitmap::new(len);
            let mut model = vec![false; len];
            for (set, i) in ops {
                let i = i % len;
                if set { prop_assert_eq!(b.set(i), !model[i]); model[i] = true; }
                else { prop_assert_eq!(b.clear(i), model[i]); model[i] = false; }
            }
            let (lo, hi) = (lo % (len + 1), hi % (len + 1));
            let want = (lo..hi).find(|&i| !model[i]);
            prop_assert_eq!(b.find_clear(lo, hi), want);
            let set: Vec<usize> = (0..len).filter(|&i| model[i]).collect();
            prop_assert_eq!(b.iter_set().collect::<Vec<_>>(), set);
        }
    }
}
