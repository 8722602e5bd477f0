//! [`UidTable`]: records by pod UID in a compact open-addressing table, and the bucket
//! count of a std hash table (for the deterministic heap estimates of the simulator).
//!
//! Hand-written rather than a std `HashMap` or a crate: the records of a churning pod
//! table must not double under churn (see [`UidTable`]); no crate offers chunked record
//! storage with 4-byte tagged slots and backward-shift deletion.

use crate::types::PodUid;

/// A record keyed by a pod UID it carries.
pub trait Keyed {
    fn uid(&self) -> PodUid;
}

/// Bytes per chunk of a [`UidTable`]'s records: a power of two, so that a chunk fills an
/// allocator's size class whatever the record's size (4,096 records of 72 bytes took a
/// 320 KiB class for 288 KiB, jemalloc's classes being four per doubling).
const CHUNK_BYTES: usize = 256 * 1024;
/// An empty index slot.
const FREE: u32 = u32::MAX;
/// Bits of a slot that hold the record number (2^26 records: beyond what fits in memory
/// here); the 6 above hold a tag from the hash.
const ID_BITS: u32 = 26;
const ID_MASK: u32 = (1 << ID_BITS) - 1;
/// The largest record number (its slot could not be told from [`FREE`] otherwise).
const MAX_ID: u32 = ID_MASK - 1;

/// Records by pod UID, compact under churn: the records sit in fixed chunks (a removed
/// record's place is reused, nothing doubles), found through an index of 4-byte slots
/// (open addressing, linear probing, at most 3/4 full, backward-shift deletion: no
/// tombstones; a std hash table keeps those until it runs out of room, then doubles
/// although the live records would fit). A slot holds a 26-bit record number and a 6-bit
/// tag from the UID's hash: a probe compares the tag before it touches a record, so most
/// probes past other records read no record. The hash is a fixed (seedless, so
/// deterministic) mix of the UID. Only lookups use it; nothing depends on its order.
pub struct UidTable<V> {
    /// A power of two of slots ([`FREE`]: empty; else tag << 26 | record number), or none.
    index: Vec<u32>,
    chunks: Vec<Box<[Option<V>]>>,
    /// Record numbers handed out so far.
    next: u32,
    /// Handed-out record numbers free again.
    free: Vec<u32>,
    len: usize,
}

impl<V> Default for UidTable<V> {
    fn default() -> Self {
        Self {
            index: Vec::new(),
            chunks: Vec::new(),
            next: 0,
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<V> UidTable<V> {
    /// Records per chunk.
    const CHUNK: usize = {
        let n = CHUNK_BYTES / size_of::<Option<V>>();
        if n == 0 { 1 } else { n }
    };
}

impl<V: Keyed> UidTable<V> {
    /// The UID's hash.
    fn hash(uid: PodUid) -> u64 {
        let x = (uid.0 as u64) ^ ((uid.0 >> 64) as u64).rotate_left(32);
        let x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (x ^ (x >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// The home slot (from the hash's high bits) in an index of `slots` (a power of two).
    fn home(hash: u64, slots: usize) -> usize {
        (hash >> (64 - slots.trailing_zeros())) as usize
    }

    /// The slot of a record: its tag (the hash's low bits) and number.
    fn slot(hash: u64, id: u32) -> u32 {
        ((hash as u32) << ID_BITS) | id
    }

    fn rec(&self, id: u32) -> &V {
        let id = id as usize;
        self.chunks[id / Self::CHUNK][id % Self::CHUNK]
            .as_ref()
            .expect("indexed records exist")
    }

    fn rec_mut(&mut self, id: u32) -> &mut Option<V> {
        let id = id as usize;
        &mut self.chunks[id / Self::CHUNK][id % Self::CHUNK]
    }

    /// The index slot and record number of `uid`.
    fn find(&self, uid: PodUid) -> Option<(usize, u32)> {
        if self.index.is_empty() {
            return None;
        }
        let mask = self.index.len() - 1;
        let hash = Self::hash(uid);
        let tag = Self::slot(hash, 0);
        let mut i = Self::home(hash, self.index.len());
        loop {
            let e = self.index[i];
            if e == FREE {
                return None;
            }
            let id = e & ID_MASK;
            if e & !ID_MASK == tag && self.rec(id).uid() == uid {
                return Some((i, id));
            }
            i = (i + 1) & mask;
        }
    }

    pub fn get(&self, uid: &PodUid) -> Option<&V> {
        self.find(*uid).map(|(_, id)| self.rec(id))
    }

    pub fn get_mut(&mut self, uid: &PodUid) -> Option<&mut V> {
        let (_, id) = self.find(*uid)?;
        self.rec_mut(id).as_mut()
    }

    /// Inserts the record, replacing one of the same UID.
    pub fn insert(&mut self, rec: V) {
        if let Some((_, id)) = self.find(rec.uid()) {
            *self.rec_mut(id) = Some(rec);
            return;
        }
        if (self.len + 1) * 4 > self.index.len() * 3 {
            self.grow_index();
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = self.next;
                assert!(id <= MAX_ID, "at most 2^26 - 1 records");
                if id as usize == self.chunks.len() * Self::CHUNK {
                    self.chunks.push((0..Self::CHUNK).map(|_| None).collect());
                }
                self.next += 1;
                id
            }
        };
        let uid = rec.uid();
        *self.rec_mut(id) = Some(rec);
        self.place(uid, id);
        self.len += 1;
    }

    fn place(&mut self, uid: PodUid, id: u32) {
        let hash = Self::hash(uid);
        let mask = self.index.len() - 1;
        let mut i = Self::home(hash, self.index.len());
        while self.index[i] != FREE {
            i = (i + 1) & mask;
        }
        self.index[i] = Self::slot(hash, id);
    }

    fn grow_index(&mut self) {
        let n = (self.index.len() * 2).max(16);
        let old = std::mem::replace(&mut self.index, vec![FREE; n]);
        for e in old.into_iter().filter(|&e| e != FREE) {
            let id = e & ID_MASK;
            let uid = self.rec(id).uid();
            self.place(uid, id);
        }
    }

    pub fn remove(&mut self, uid: &PodUid) -> Option<V> {
        let (mut hole, id) = self.find(*uid)?;
        let out = self.rec_mut(id).take();
        self.free.push(id);
        self.index[hole] = FREE;
        self.len -= 1;
        // backward shift: move later entries of the run into the hole when the hole lies
        // on their probe path, so no lookup ever stops short at it
        let mask = self.index.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let other = self.index[j];
            if other == FREE {
                break;
            }
            let home = Self::home(
                Self::hash(self.rec(other & ID_MASK).uid()),
                self.index.len(),
            );
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.index[hole] = other;
                self.index[j] = FREE;
                hole = j;
            }
        }
        out
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.chunks.iter().flat_map(|c| c.iter().flatten())
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.chunks.iter_mut().flat_map(|c| c.iter_mut().flatten())
    }

    /// Heap bytes (exact: the index, the chunks, the free list).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.index.capacity() * 4
            + self.chunks.capacity() * size_of::<Box<[Option<V>]>>()
            + self.chunks.len() * Self::CHUNK * size_of::<Option<V>>()
            + self.free.capacity() * 4
    }
}

/// The buckets of a std (hashbrown) hash table of this capacity: a power of two, with room
/// for 7/8 of them (small tables: capacity + 1).
pub fn hash_slots(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        1..8 => (capacity + 1).next_power_of_two(),
        _ => (capacity * 8 / 7).next_power_of_two(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::BTreeMap;

    /// Large enough that the UIDs below fill several chunks.
    struct Rec(PodUid, u64, #[allow(dead_code)] [u64; 16]);

    impl Keyed for Rec {
        fn uid(&self) -> PodUid {
            self.0
        }
    }

    /// The UID table against a BTreeMap model through random inserts, replacements and
    /// removals (long probe runs, backward shifts, index growth, reused record numbers).
    #[test]
    fn uid_table_matches_a_map() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut t: UidTable<Rec> = UidTable::default();
        let mut model: BTreeMap<u128, u64> = BTreeMap::new();
        for step in 0..200_000u64 {
            // few distinct UIDs, some far apart: many collisions and removals
            let uid = if rng.random_bool(0.9) {
                rng.random_range(0..5_000u128)
            } else {
                rng.random::<u128>() >> rng.random_range(0..128)
            };
            match rng.random_range(0..3) {
                0 | 1 => {
                    t.insert(Rec(PodUid(uid), step, [0; 16]));
                    model.insert(uid, step);
                }
                _ => {
                    let got = t.remove(&PodUid(uid)).map(|r| r.1);
                    assert_eq!(got, model.remove(&uid), "remove {uid} at {step}");
                }
            }
            if step % 997 == 0 {
                for (u, v) in &model {
                    assert_eq!(t.get(&PodUid(*u)).map(|r| r.1), Some(*v));
                }
                assert_eq!(t.values().count(), model.len());
            }
        }
        assert_eq!(t.len, model.len());
        assert!(t.chunks.len() > 1, "records span chunks");
        assert!(t.get(&PodUid(u128::MAX)).is_none() || model.contains_key(&u128::MAX));
    }
}
