//! The free-block index of one pool and family ([`FamilyIndex`]) and of one pool
//! ([`PoolIndex`]).
//!
//! Blocks are numbered per CIDR (`0..count`, count ≤ 2^64) and, across the family, by a global
//! offset that walks the CIDRs in spec order. [`FamilyIndex::claim`] takes a start offset (taken
//! modulo the number of blocks; callers randomize it so two operators rarely race for one
//! block) and returns the first free block at or after it, wrapping around through every CIDR.
//!
//! Storage per CIDR ([`Layout::Auto`]): a dense two-level [`Bitmap`] when the CIDR has at most
//! [`DENSE_MAX_BLOCKS`] (2^24) blocks — 2 MiB at most, 8 KiB for an IPv4 /12 in /28 blocks —
//! and otherwise a [`SparseBitmap`] (B-tree of partly taken 64-block words plus runs of full
//! words) whose size follows what is granted (an IPv6 /64 in /124 blocks has 2^60 blocks).
//! [`Layout::Runs`] (a B-tree of taken runs) is kept for comparison; see BENCHMARKS.md for the
//! figures behind the choice. Excluded blocks are kept as a short sorted list of block ranges
//! per CIDR (in the dense layout they are also set in the bitmap, so a search skips them for
//! free).

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::bitmap::Bitmap;
use super::runs::Runs;
use super::sparse::SparseBitmap;
use super::spec::{PoolSpec, excluded_ranges};
use super::{PoolError, family_of, make_net, max_prefix, shl, shr, span};
use crate::addrs::AddrSet;
use crate::types::{Family, PerFamily};

/// CIDRs with at most this many blocks get a dense bitmap under [`Layout::Auto`].
pub const DENSE_MAX_BLOCKS: u128 = 1 << 24;
/// [`Layout::Dense`] is honoured up to this many blocks (64 MiB), beyond it the runs are used.
pub const DENSE_LIMIT: u128 = 1 << 29;

/// How taken blocks are stored per CIDR.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Layout {
    /// Dense for CIDRs of at most [`DENSE_MAX_BLOCKS`] blocks, runs beyond.
    #[default]
    Auto,
    /// Dense bitmap (up to [`DENSE_LIMIT`] blocks, sparse beyond); for benchmarks and tests.
    Dense,
    /// Sparse two-level bitmap; for benchmarks and tests.
    Sparse,
    /// Runs of taken blocks (the alternative to the sparse bitmap); for benchmarks and tests.
    Runs,
}

/// Usable addresses of a family, saturating at `u128::MAX`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddressCounts {
    pub capacity: u128,
    pub allocated: u128,
    pub free: u128,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Store {
    Dense(Bitmap),
    Sparse(SparseBitmap),
    Runs(Runs),
}

/// One CIDR of a family index.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    net: IpNet,
    base: u128,
    /// Blocks in the CIDR (≤ 2^64).
    count: u128,
    /// Global offset of this CIDR's block 0.
    first: u128,
    /// Excluded block ranges, inclusive, sorted, merged.
    excluded: Vec<(u64, u64)>,
    excluded_count: u128,
    /// IPv4 network and broadcast addresses (CIDR prefix ≤ 30), never usable.
    reserved: [Option<u128>; 2],
    store: Store,
    taken: u128,
}

impl Slot {
    fn new(cidr: &IpNet, block_prefix: u8, exclude: &[IpNet], first: u128, layout: Layout) -> Self {
        let family = family_of(cidr);
        let (c0, c1) = span(cidr);
        let count = 1u128 << (block_prefix - cidr.prefix_len());
        let excluded = excluded_ranges(cidr, block_prefix, exclude);
        let excluded_count = excluded.iter().map(|&(l, h)| (h - l) as u128 + 1).sum();
        let dense = match layout {
            Layout::Auto => count <= DENSE_MAX_BLOCKS,
            Layout::Dense => count <= DENSE_LIMIT,
            Layout::Sparse | Layout::Runs => false,
        };
        let store = if layout == Layout::Runs {
            Store::Runs(Runs::new())
        } else if dense {
            let mut b = Bitmap::new(count as usize);
            for &(lo, hi) in &excluded {
                for i in lo..=hi {
                    b.set(i as usize);
                }
            }
            Store::Dense(b)
        } else {
            Store::Sparse(SparseBitmap::new())
        };
        let reserved = if family == Family::V4 && cidr.prefix_len() <= 30 {
            [Some(c0), Some(c1)]
        } else {
            [None, None]
        };
        Slot {
            net: *cidr,
            base: c0,
            count,
            first,
            excluded,
            excluded_count,
            reserved,
            store,
            taken: 0,
        }
    }

    /// The excluded range holding block `i`, if any.
    #[inline]
    fn excluded_run(&self, i: u64) -> Option<(u64, u64)> {
        if self.excluded.is_empty() {
            return None;
        }
        let k = self.excluded.partition_point(|&(lo, _)| lo <= i);
        (k > 0 && self.excluded[k - 1].1 >= i).then(|| self.excluded[k - 1])
    }

    #[inline]
    fn is_taken(&self, i: u64) -> bool {
        match &self.store {
            Store::Dense(b) => b.get(i as usize) && self.excluded_run(i).is_none(),
            Store::Sparse(b) => b.contains(i),
            Store::Runs(r) => r.contains(i),
        }
    }

    /// First block in `lo..hi` neither taken nor excluded.
    #[inline]
    fn find_free(&self, lo: u128, hi: u128) -> Option<u64> {
        match &self.store {
            Store::Dense(b) => b.find_clear(lo as usize, hi as usize).map(|i| i as u64),
            Store::Sparse(b) => {
                let mut x = lo;
                while x < hi {
                    let y = b.next_clear(x as u64)? as u128;
                    if y >= hi {
                        return None;
                    }
                    match self.excluded_run(y as u64) {
                        Some((_, last)) => x = last as u128 + 1,
                        None => return Some(y as u64),
                    }
                }
                None
            }
            Store::Runs(r) => {
                let mut x = lo;
                while x < hi {
                    if let Some((_, last)) = r.run_containing(x as u64) {
                        x = last as u128 + 1;
                    } else if let Some((_, last)) = self.excluded_run(x as u64) {
                        x = last as u128 + 1;
                    } else {
                        return Some(x as u64);
                    }
                }
                None
            }
        }
    }

    /// Marks a block that is not excluded as taken; returns whether it was free.
    #[inline]
    fn take(&mut self, i: u64) -> bool {
        let new = match &mut self.store {
            Store::Dense(b) => b.set(i as usize),
            Store::Sparse(b) => b.insert(i),
            Store::Runs(r) => r.insert(i),
        };
        self.taken += new as u128;
        new
    }

    /// Frees a block that is not excluded; returns whether it was taken.
    #[inline]
    fn free(&mut self, i: u64) -> bool {
        let was = match &mut self.store {
            Store::Dense(b) => b.clear(i as usize),
            Store::Sparse(b) => b.remove(i),
            Store::Runs(r) => r.remove(i),
        };
        self.taken -= was as u128;
        was
    }

    /// Marks every non-excluded block of `lo..=hi` taken; returns (newly taken, already taken).
    fn take_range(&mut self, lo: u64, hi: u64) -> (u128, u128) {
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        let mut x = lo as u128;
        for &(elo, ehi) in &self.excluded {
            if (ehi as u128) < x {
                continue;
            }
            if elo as u128 > hi as u128 {
                break;
            }
            if (elo as u128) > x {
                pieces.push((x as u64, elo - 1));
            }
            x = ehi as u128 + 1;
        }
        if x <= hi as u128 {
            pieces.push((x as u64, hi));
        }
        let (mut new, mut old) = (0u128, 0u128);
        for (a, b) in pieces {
            let n = match &mut self.store {
                Store::Dense(bm) => (a..=b).filter(|&i| bm.set(i as usize)).count() as u128,
                Store::Sparse(s) => s.insert_range(a, b),
                Store::Runs(r) => r.insert_range(a, b),
            };
            new += n;
            old += (b - a) as u128 + 1 - n;
        }
        self.taken += new;
        (new, old)
    }

    /// Reserved addresses inside block `i`.
    #[inline]
    fn reserved_in(&self, i: u64, shift: u32) -> u128 {
        let lo = self.base + shl(i as u128, shift);
        let hi = lo + (shl(1, shift).wrapping_sub(1));
        self.reserved
            .iter()
            .flatten()
            .filter(|&&a| a >= lo && a <= hi)
            .count() as u128
    }

    fn clear(&mut self) {
        match &mut self.store {
            Store::Dense(b) => {
                *b = Bitmap::new(b.len());
                for &(lo, hi) in &self.excluded {
                    for i in lo..=hi {
                        b.set(i as usize);
                    }
                }
            }
            Store::Sparse(b) => b.clear(),
            Store::Runs(r) => r.clear(),
        }
        self.taken = 0;
    }

    fn iter_taken(&self) -> Box<dyn Iterator<Item = u64> + '_> {
        match &self.store {
            Store::Dense(b) => Box::new(
                b.iter_set()
                    .map(|i| i as u64)
                    .filter(|&i| self.excluded_run(i).is_none()),
            ),
            Store::Sparse(b) => Box::new(b.iter()),
            Store::Runs(r) => Box::new(r.iter().flat_map(|(s, l)| s..=l)),
        }
    }
}

/// The free-block index of one pool and one family. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyIndex {
    pool: Arc<str>,
    family: Family,
    block_prefix: u8,
    /// Host bits of a block.
    shift: u32,
    /// CIDRs in spec order (the claim walk order).
    slots: Vec<Slot>,
    /// Slot numbers sorted by address (lookup of a block or an address).
    by_addr: Vec<usize>,
    /// Blocks of all CIDRs, excluded ones included.
    total: u128,
    capacity: u128,
}

impl FamilyIndex {
    /// The index of `family` for a spec that passed [`PoolSpec::validate`]; `None` if the pool
    /// has no CIDR of that family.
    pub fn new(spec: &PoolSpec, family: Family, layout: Layout) -> Option<Self> {
        let block_prefix = *spec.block_size.get(family);
        let shift = (max_prefix(family) - block_prefix) as u32;
        let mut slots = Vec::new();
        let mut total = 0u128;
        for c in spec.cidrs_of(family) {
            let s = Slot::new(c, block_prefix, &spec.exclude, total, layout);
            total = total.saturating_add(s.count);
            slots.push(s);
        }
        if slots.is_empty() {
            return None;
        }
        let mut by_addr: Vec<usize> = (0..slots.len()).collect();
        by_addr.sort_by_key(|&i| slots[i].base);
        let capacity = slots.iter().map(|s| s.count - s.excluded_count).sum();
        Some(Self {
            pool: spec.name.as_str().into(),
            family,
            block_prefix,
            shift,
            slots,
            by_addr,
            total,
            capacity,
        })
    }

    pub fn pool(&self) -> &str {
        &self.pool
    }

    pub fn family(&self) -> Family {
        self.family
    }

    /// The block size as a prefix length.
    pub fn block_prefix(&self) -> u8 {
        self.block_prefix
    }

    /// Addresses per block (saturating).
    pub fn block_addresses(&self) -> u128 {
        shl(1, self.shift).wrapping_sub(1).saturating_add(1)
    }

    /// The CIDRs, in claim order.
    pub fn cidrs(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.slots.iter().map(|s| s.net)
    }

    /// Blocks that can ever be granted (excluded ones left out).
    pub fn capacity(&self) -> u128 {
        self.capacity
    }

    /// Blocks taken.
    pub fn allocated(&self) -> u128 {
        self.slots.iter().map(|s| s.taken).sum()
    }

    /// Blocks free: `capacity − allocated`.
    pub fn free(&self) -> u128 {
        self.capacity - self.allocated()
    }

    /// Blocks in all CIDRs including excluded ones: the range of claim start offsets.
    pub fn total_blocks(&self) -> u128 {
        self.total
    }

    /// Usable addresses: capacity, allocated, free (see [`Self::usable_count`]).
    pub fn addresses(&self) -> AddressCounts {
        let size = self.block_addresses();
        let mut c = AddressCounts::default();
        for s in &self.slots {
            let mut cap = (s.count - s.excluded_count).saturating_mul(size);
            let mut alloc = s.taken.saturating_mul(size);
            for (k, r) in s.reserved.iter().enumerate() {
                if r.is_some() {
                    let i = if k == 0 { 0 } else { (s.count - 1) as u64 };
                    if s.excluded_run(i).is_none() {
                        cap -= 1;
                        if s.is_taken(i) {
                            alloc -= 1;
                        }
                    }
                }
            }
            c.capacity = c.capacity.saturating_add(cap);
            c.allocated = c.allocated.saturating_add(alloc);
        }
        c.free = c.capacity - c.allocated;
        c
    }

    fn net_of(&self, slot: usize, i: u64) -> IpNet {
        let s = &self.slots[slot];
        make_net(
            self.family,
            s.base + shl(i as u128, self.shift),
            self.block_prefix,
        )
    }

    fn slot_of_addr(&self, a: u128) -> Option<usize> {
        if self.slots.len() == 1 {
            let (lo, hi) = span(&self.slots[0].net);
            return (a >= lo && a <= hi).then_some(0);
        }
        let k = self.by_addr.partition_point(|&i| self.slots[i].base <= a);
        if k == 0 {
            return None;
        }
        let i = self.by_addr[k - 1];
        (span(&self.slots[i].net).1 >= a).then_some(i)
    }

    /// Checks `block` against the pool: family, size, alignment, range, exclusions.
    fn locate(&self, block: &IpNet) -> Result<(usize, u64), PoolError> {
        let pool = || self.pool.to_string();
        if family_of(block) != self.family {
            return Err(PoolError::BlockOutsidePool {
                pool: pool(),
                block: *block,
            });
        }
        if block.prefix_len() != self.block_prefix {
            return Err(PoolError::WrongBlockSize {
                pool: pool(),
                block: *block,
                expected: self.block_prefix,
            });
        }
        let a = super::addr_bits(block);
        if span(block).0 != a {
            return Err(PoolError::Misaligned {
                pool: pool(),
                block: *block,
            });
        }
        let slot = self
            .slot_of_addr(a)
            .ok_or_else(|| PoolError::BlockOutsidePool {
                pool: pool(),
                block: *block,
            })?;
        let i = shr(a - self.slots[slot].base, self.shift) as u64;
        if self.slots[slot].excluded_run(i).is_some() {
            return Err(PoolError::BlockExcluded {
                pool: pool(),
                block: *block,
            });
        }
        Ok((slot, i))
    }

    /// Claims the first free block at or after `start` (modulo [`Self::total_blocks`]),
    /// walking the CIDRs in order and wrapping around; `None` when every block is taken.
    #[inline]
    pub fn claim(&mut self, start: u128) -> Option<IpNet> {
        if self.allocated() >= self.capacity {
            return None;
        }
        let x = if start < self.total {
            start
        } else {
            start % self.total
        };
        let n = self.slots.len();
        let first = if n == 1 {
            0
        } else {
            self.slots.partition_point(|s| s.first <= x) - 1
        };
        let local = x - self.slots[first].first;
        for k in 0..=n {
            let j = (first + k) % n;
            let s = &self.slots[j];
            let (lo, hi) = match k {
                0 => (local, s.count),
                _ if k == n => (0, local),
                _ => (0, s.count),
            };
            if let Some(i) = s.find_free(lo, hi) {
                self.slots[j].take(i);
                return Some(self.net_of(j, i));
            }
        }
        None
    }

    /// Claims this block (rebuild, adoption). Errors if it is not a block of the pool (size,
    /// alignment, range, exclusion) or is already taken.
    pub fn claim_block(&mut self, block: &IpNet) -> Result<(), PoolError> {
        let (slot, i) = self.locate(block)?;
        if self.slots[slot].take(i) {
            Ok(())
        } else {
            Err(PoolError::BlockTaken {
                pool: self.pool.to_string(),
                block: *block,
            })
        }
    }

    /// Frees this block; `Ok(false)` if it was free already (release is idempotent). Errors if
    /// it is not a block of the pool.
    #[inline]
    pub fn release(&mut self, block: &IpNet) -> Result<bool, PoolError> {
        let (slot, i) = self.locate(block)?;
        Ok(self.slots[slot].free(i))
    }

    /// Whether `block` is a block of the pool and taken.
    pub fn is_taken(&self, block: &IpNet) -> bool {
        self.locate(block)
            .is_ok_and(|(slot, i)| self.slots[slot].is_taken(i))
    }

    /// The block of the pool holding `addr` (excluded blocks included), if any.
    pub fn block_of(&self, addr: IpAddr) -> Option<IpNet> {
        let a = match (addr, self.family) {
            (IpAddr::V4(a), Family::V4) => u32::from(a) as u128,
            (IpAddr::V6(a), Family::V6) => u128::from(a),
            _ => return None,
        };
        let slot = self.slot_of_addr(a)?;
        let i = shr(a - self.slots[slot].base, self.shift) as u64;
        Some(self.net_of(slot, i))
    }

    /// The addresses of `block` a node may use: all of them, except the IPv4 network and
    /// broadcast addresses of the CIDR holding it. Errors as [`Self::claim_block`] does for a
    /// block that is not a grantable block of the pool.
    pub fn usable_addresses(&self, block: &IpNet) -> Result<AddrSet, PoolError> {
        let (slot, _) = self.locate(block)?;
        let mut set = AddrSet::of_net(block);
        for r in self.slots[slot].reserved.iter().flatten() {
            set.remove_run(self.family, *r..=*r);
        }
        Ok(set)
    }

    /// How many addresses [`Self::usable_addresses`] yields (saturating).
    pub fn usable_count(&self, block: &IpNet) -> Result<u128, PoolError> {
        let (slot, i) = self.locate(block)?;
        Ok(self.block_addresses() - self.slots[slot].reserved_in(i, self.shift))
    }

    /// Every taken block, CIDRs in spec order, blocks in address order. One item per block:
    /// a huge run (a rebuilt record covering 2^60 blocks) yields that many.
    pub fn iter_taken(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.slots
            .iter()
            .enumerate()
            .flat_map(move |(j, s)| s.iter_taken().map(move |i| self.net_of(j, i)))
    }

    /// Marks every grantable block overlapping the address range `lo..=hi` taken (rebuild of
    /// odd records: "any existing block overlapping a candidate counts as taken"); returns
    /// (newly taken, already taken) block counts.
    pub(crate) fn occupy(&mut self, lo: u128, hi: u128) -> (u128, u128) {
        let (mut new, mut old) = (0, 0);
        for s in &mut self.slots {
            let (c0, c1) = span(&s.net);
            if hi < c0 || lo > c1 {
                continue;
            }
            let a = shr(lo.max(c0) - c0, self.shift) as u64;
            let b = shr(hi.min(c1) - c0, self.shift) as u64;
            let (n, o) = s.take_range(a, b);
            new += n;
            old += o;
        }
        (new, old)
    }

    /// Whether the address range `lo..=hi` overlaps one of the CIDRs.
    pub(crate) fn overlaps_range(&self, lo: u128, hi: u128) -> bool {
        self.slots.iter().any(|s| {
            let (c0, c1) = span(&s.net);
            lo <= c1 && c0 <= hi
        })
    }

    /// Frees every block.
    pub fn clear(&mut self) {
        for s in &mut self.slots {
            s.clear();
        }
    }

    /// Entries stored for taken blocks: bitmap words (both levels) for dense CIDRs, runs for
    /// sparse ones (partly taken words plus runs of full words), runs for the runs layout. A
    /// measure of memory independent of the allocator.
    pub fn stored_entries(&self) -> usize {
        self.slots
            .iter()
            .map(|s| match &s.store {
                Store::Dense(b) => b.stored_words(),
                Store::Sparse(b) => b.entries(),
                Store::Runs(r) => r.entries(),
            })
            .sum()
    }

    /// Heap bytes held (exact for bitmaps, an upper-bound estimate for runs).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.by_addr.capacity() * 8
            + self
                .slots
                .iter()
                .map(|s| {
                    s.excluded.capacity() * 16
                        + match &s.store {
                            Store::Dense(b) => b.heap_bytes(),
                            Store::Sparse(b) => b.heap_bytes_estimate(),
                            Store::Runs(r) => r.heap_bytes_estimate(),
                        }
                })
                .sum::<usize>()
    }

    /// Whether each CIDR uses the dense layout (in spec order).
    pub fn dense(&self) -> Vec<bool> {
        self.slots
            .iter()
            .map(|s| matches!(s.store, Store::Dense(_)))
            .collect()
    }
}

/// The free-block index of one pool: one [`FamilyIndex`] per family it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolIndex {
    spec: PoolSpec,
    families: PerFamily<Option<FamilyIndex>>,
}

impl PoolIndex {
    /// Validates `spec` and builds an empty index.
    pub fn new(spec: &PoolSpec) -> Result<Self, PoolError> {
        Self::with_layout(spec, Layout::Auto)
    }

    pub fn with_layout(spec: &PoolSpec, layout: Layout) -> Result<Self, PoolError> {
        spec.validate()?;
        Ok(Self {
            spec: spec.clone(),
            families: PerFamily {
                v4: FamilyIndex::new(spec, Family::V4, layout),
                v6: FamilyIndex::new(spec, Family::V6, layout),
            },
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    pub fn family(&self, f: Family) -> Option<&FamilyIndex> {
        self.families.get(f).as_ref()
    }

    pub fn family_mut(&mut self, f: Family) -> Option<&mut FamilyIndex> {
        self.families.get_mut(f).as_mut()
    }

    fn served(&mut self, f: Family) -> Result<&mut FamilyIndex, PoolError> {
        let pool = &self.spec.name;
        self.families
            .get_mut(f)
            .as_mut()
            .ok_or_else(|| PoolError::FamilyNotServed {
                pool: pool.clone(),
                family: f,
            })
    }

    /// Claims a free block of `family` at or after `start` (see [`FamilyIndex::claim`]).
    pub fn claim(&mut self, family: Family, start: u128) -> Result<IpNet, PoolError> {
        let idx = self.served(family)?;
        idx.claim(start).ok_or_else(|| PoolError::Exhausted {
            pool: idx.pool().to_string(),
            family,
        })
    }

    /// See [`FamilyIndex::claim_block`].
    pub fn claim_block(&mut self, block: &IpNet) -> Result<(), PoolError> {
        self.served(family_of(block))?.claim_block(block)
    }

    /// See [`FamilyIndex::release`].
    pub fn release(&mut self, block: &IpNet) -> Result<bool, PoolError> {
        self.served(family_of(block))?.release(block)
    }

    pub fn is_taken(&self, block: &IpNet) -> bool {
        self.family(family_of(block))
            .is_some_and(|i| i.is_taken(block))
    }

    /// Frees every block of both families.
    pub fn clear(&mut self) {
        for f in Family::ALL {
            if let Some(i) = self.families.get_mut(f) {
                i.clear();
            }
        }
    }
}
