//! The engine's view of pods: per UID (cached and live) and per node (pods waiting for an
//! address, pods still bound). An in-memory implementation with an informer lag.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::error::IpamError;
use crate::types::{NodeName, PodUid};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl PodPhase {
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

/// What the engine needs of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: PodUid,
    pub node: NodeName,
    pub phase: PodPhase,
    /// `status.podIPs`.
    pub ips: PodIps,
}

/// A pod's `status.podIPs`. Kubernetes allows at most one address per family, so both fit
/// inline: 22 bytes, nothing allocated, and a reclaim scan comparing a pod's addresses
/// follows no pointer (one cache miss less per `used` entry on a large node table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodIps {
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
}

impl PodIps {
    /// The pod's addresses; a second address of a family (which the API server refuses)
    /// is ignored, the first one counts.
    pub fn new(addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        let mut ips = Self::default();
        for a in addrs {
            match a {
                IpAddr::V4(v) => {
                    ips.v4.get_or_insert(v);
                }
                IpAddr::V6(v) => {
                    ips.v6.get_or_insert(v);
                }
            }
        }
        ips
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_none() && self.v6.is_none()
    }

    pub fn contains(&self, addr: &IpAddr) -> bool {
        match addr {
            IpAddr::V4(v) => self.v4 == Some(*v),
            IpAddr::V6(v) => self.v6 == Some(*v),
        }
    }

    /// IPv4 first, then IPv6.
    pub fn iter(&self) -> impl Iterator<Item = IpAddr> {
        self.v4
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.v6.map(IpAddr::V6))
    }
}

/// Looks pods up in a cache without copying them.
pub trait PodCache {
    /// Calls `f` with the pod of `uid` as the cache shows it (None: no such pod).
    fn with_pod<R>(&self, uid: PodUid, f: impl FnOnce(Option<&PodInfo>) -> R) -> R;

    /// Calls `f` with each item and the pod of its UID (`uid(item)`), in order: one
    /// [`PodCache::with_pod`] per item, or one look at the cache for them all.
    fn with_pods<T>(
        &self,
        items: impl IntoIterator<Item = T>,
        uid: impl Fn(&T) -> PodUid,
        mut f: impl FnMut(T, Option<&PodInfo>),
    ) {
        for item in items {
            let u = uid(&item);
            self.with_pod(u, |p| f(item, p));
        }
    }

    /// Which pods bound to `node` may show differently now than they did at `since` (a
    /// reclaim scan then looks up only those): the node's change sequence number now, and
    /// with `since` the pods changed after it. `None`: the cache cannot tell (it keeps no
    /// such record, or no longer holds the changes since then), and a reclaim scan looks
    /// every pod up.
    fn pod_changes(&self, _node: &str, _since: Option<Since>) -> Option<PodChanges> {
        None
    }
}

/// A point a reclaim scan saw a node's pods at: the node's change sequence number and the
/// time (a cache may show a change some time after it happened).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Since {
    pub seq: u64,
    pub at: Instant,
}

/// See [`PodCache::pod_changes`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodChanges {
    pub seq: u64,
    /// Pods changed since the given point (in change order; a pod may repeat).
    pub changed: Vec<PodUid>,
}

impl<S: std::hash::BuildHasher> PodCache for std::collections::HashMap<PodUid, PodInfo, S> {
    fn with_pod<R>(&self, uid: PodUid, f: impl FnOnce(Option<&PodInfo>) -> R) -> R {
        f(self.get(&uid))
    }
}

impl PodCache for BTreeMap<PodUid, PodInfo> {
    fn with_pod<R>(&self, uid: PodUid, f: impl FnOnce(Option<&PodInfo>) -> R) -> R {
        f(self.get(&uid))
    }
}

/// A pod cache answered by a function (handy in tests).
pub struct FnPods<F>(pub F);

impl<F: Fn(PodUid) -> Option<PodInfo>> PodCache for FnPods<F> {
    fn with_pod<R>(&self, uid: PodUid, f: impl FnOnce(Option<&PodInfo>) -> R) -> R {
        f((self.0)(uid).as_ref())
    }
}

/// Pod lookups. `with_pod`, `pod`, `pending_pods` and `bound_pods` answer from the
/// informer cache; `pod_live` asks the server.
pub trait PodView: PodCache + Send + Sync + 'static {
    fn pod(&self, uid: PodUid) -> Option<PodInfo> {
        self.with_pod(uid, |p| p.cloned())
    }
    fn pod_live(
        &self,
        uid: PodUid,
    ) -> impl Future<Output = Result<Option<PodInfo>, IpamError>> + Send;
    /// Pods bound to `node`, not terminal, with no pod IPs yet (candidates for "waiting").
    fn pending_pods(&self, node: &str) -> Vec<PodUid>;
    /// How many non-terminal pods are bound to `node`.
    fn bound_pods(&self, node: &str) -> usize;
}

pub(crate) struct PodRecord {
    info: PodInfo,
    /// When the informer cache first shows the pod.
    visible_from: Nanos,
    /// When the pod was deleted from the server (live lookups stop finding it).
    deleted_at: Nanos,
}

/// An instant as nanoseconds since the view's start: 8 bytes where an `Instant` takes 16
/// (and an `Option<Instant>` 16), converted exactly (whole nanoseconds both ways), so a
/// pod record stays small. [`Nanos::NEVER`] (not deleted) takes the place of a `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Nanos(u64);

impl Nanos {
    const NEVER: Nanos = Nanos(u64::MAX);

    fn is_never(self) -> bool {
        self == Self::NEVER
    }
    fn since(base: Instant, t: Instant) -> Nanos {
        Nanos(u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX - 1))
    }

    fn plus(self, d: Duration) -> Nanos {
        Nanos(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                .min(u64::MAX - 1),
        )
    }
}

/// A record keyed by a pod UID it carries.
pub(crate) trait Keyed {
    fn uid(&self) -> PodUid;
}

impl Keyed for PodRecord {
    fn uid(&self) -> PodUid {
        self.info.uid
    }
}

/// Records per chunk of a [`UidTable`].
const CHUNK: usize = 4096;
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
pub(crate) struct UidTable<V> {
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
        self.chunks[id / CHUNK][id % CHUNK]
            .as_ref()
            .expect("indexed records exist")
    }

    fn rec_mut(&mut self, id: u32) -> &mut Option<V> {
        let id = id as usize;
        &mut self.chunks[id / CHUNK][id % CHUNK]
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

    pub(crate) fn get(&self, uid: &PodUid) -> Option<&V> {
        self.find(*uid).map(|(_, id)| self.rec(id))
    }

    pub(crate) fn get_mut(&mut self, uid: &PodUid) -> Option<&mut V> {
        let (_, id) = self.find(*uid)?;
        self.rec_mut(id).as_mut()
    }

    /// Inserts the record, replacing one of the same UID.
    pub(crate) fn insert(&mut self, rec: V) {
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
                if id as usize == self.chunks.len() * CHUNK {
                    self.chunks.push((0..CHUNK).map(|_| None).collect());
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

    pub(crate) fn remove(&mut self, uid: &PodUid) -> Option<V> {
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

    #[cfg(test)]
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.chunks.iter().flat_map(|c| c.iter().flatten())
    }

    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.chunks.iter_mut().flat_map(|c| c.iter_mut().flatten())
    }

    /// Heap bytes (exact: the index, the chunks, the free list).
    pub(crate) fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.index.capacity() * 4
            + self.chunks.capacity() * size_of::<Box<[Option<V>]>>()
            + self.chunks.len() * CHUNK * size_of::<Option<V>>()
            + self.free.capacity() * 4
    }
}

#[derive(Default)]
struct Inner {
    /// Looked up per `used` entry on every reclaim scan: a hash table (nothing iterates it).
    pods: UidTable<PodRecord>,
    /// Per node (hash maps: looked up on every pod event and pass, iterated never).
    pending: HashMap<NodeName, BTreeSet<PodUid>>,
    bound: HashMap<NodeName, usize>,
    /// Deleted pods in deletion order, forgotten once the cache has seen the deletion.
    deleted: VecDeque<(Instant, PodUid)>,
    /// Per node: its pods' recent changes ([`PodCache::pod_changes`]).
    changes: HashMap<NodeName, ChangeLog>,
    /// The last sequence number handed out (one counter for all nodes).
    seq: u64,
}

/// Changes of one node's pods kept for [`PodCache::pod_changes`].
const CHANGES_KEPT: usize = 16;

#[derive(Default)]
struct ChangeLog {
    /// (sequence number, pod, when the cache shows the change), oldest first, at most
    /// [`CHANGES_KEPT`].
    recent: VecDeque<(u64, PodUid, Nanos)>,
    /// The largest sequence number and the latest visibility of the changes dropped.
    dropped: (u64, Nanos),
}

impl Inner {
    /// A pod bound to `node` changed; the cache shows the change from `visible` on.
    fn touch(&mut self, node: &NodeName, uid: PodUid, visible: Nanos) {
        self.seq += 1;
        let log = self.changes.entry(node.clone()).or_default();
        if log.recent.len() == CHANGES_KEPT
            && let Some((seq, _, at)) = log.recent.pop_front()
        {
            log.dropped = (seq, log.dropped.1.max(at));
        }
        log.recent.push_back((self.seq, uid, visible));
    }
}

/// In-memory pods. The cache shows a new pod `lag` after its creation and forgets a
/// deleted pod `lag` after its deletion; live lookups see the truth at once.
#[derive(Clone)]
pub struct MemoryPodView {
    inner: Arc<Mutex<Inner>>,
    lag: Duration,
    /// What the records' [`Nanos`] count from.
    base: Instant,
}

impl MemoryPodView {
    pub fn new(lag: Duration) -> Self {
        Self {
            inner: Arc::default(),
            lag,
            base: Instant::now(),
        }
    }

    fn now(&self) -> Nanos {
        Nanos::since(self.base, Instant::now())
    }

    /// A pod is scheduled to `node` (Pending, no IPs).
    pub fn add(&self, uid: PodUid, node: NodeName) {
        let mut g = self.inner.lock();
        g.pending.entry(node.clone()).or_default().insert(uid);
        *g.bound.entry(node.clone()).or_default() += 1;
        let visible = self.now().plus(self.lag);
        g.touch(&node, uid, visible);
        g.pods.insert(PodRecord {
            info: PodInfo {
                uid,
                node,
                phase: PodPhase::Pending,
                ips: PodIps::default(),
            },
            visible_from: visible,
            deleted_at: Nanos::NEVER,
        });
    }

    /// The pod runs with these addresses (its status.podIPs).
    pub fn set_running(&self, uid: PodUid, ips: impl IntoIterator<Item = IpAddr>) {
        let mut g = self.inner.lock();
        let Some(rec) = g.pods.get_mut(&uid) else {
            return;
        };
        if !rec.deleted_at.is_never() || rec.info.phase.is_terminal() {
            return;
        }
        rec.info.phase = PodPhase::Running;
        rec.info.ips = PodIps::new(ips);
        let node = rec.info.node.clone();
        g.touch(&node, uid, self.now());
        if let Some(set) = g.pending.get_mut(&node) {
            set.remove(&uid);
        }
    }

    /// The pod reached Succeeded or Failed (it stays in the API until deleted).
    pub fn set_terminal(&self, uid: PodUid, phase: PodPhase) {
        let mut g = self.inner.lock();
        let Some(rec) = g.pods.get_mut(&uid) else {
            return;
        };
        if !rec.deleted_at.is_never() || rec.info.phase.is_terminal() {
            return;
        }
        rec.info.phase = phase;
        let node = rec.info.node.clone();
        g.touch(&node, uid, self.now());
        Self::unbind(&mut g, &node, uid);
    }

    /// The pod object is deleted from the API.
    pub fn delete(&self, uid: PodUid) {
        let now = Instant::now();
        let now_ns = Nanos::since(self.base, now);
        let mut g = self.inner.lock();
        // forget pods whose deletion the cache has already seen
        while let Some((at, old)) = g.deleted.front().copied() {
            if at + self.lag > now {
                break;
            }
            g.deleted.pop_front();
            g.pods.remove(&old);
        }
        let Some(rec) = g.pods.get_mut(&uid) else {
            return;
        };
        if !rec.deleted_at.is_never() {
            return;
        }
        rec.deleted_at = now_ns;
        g.deleted.push_back((now, uid));
        let rec = g.pods.get_mut(&uid).expect("just seen");
        let was_bound = !rec.info.phase.is_terminal();
        let node = rec.info.node.clone();
        g.touch(&node, uid, now_ns.plus(self.lag));
        if was_bound {
            Self::unbind(&mut g, &node, uid);
        }
    }

    fn unbind(g: &mut Inner, node: &NodeName, uid: PodUid) {
        if let Some(set) = g.pending.get_mut(node) {
            set.remove(&uid);
            if set.is_empty() {
                g.pending.remove(node);
            }
        }
        if let Some(n) = g.bound.get_mut(node) {
            *n -= 1;
            if *n == 0 {
                g.bound.remove(node);
            }
        }
    }

    /// The truth for one pod (ignoring the cache lag).
    pub fn truth(&self, uid: PodUid) -> Option<PodInfo> {
        let g = self.inner.lock();
        g.pods
            .get(&uid)
            .filter(|r| r.deleted_at.is_never())
            .map(|r| r.info.clone())
    }
}

/// The buckets of a std (hashbrown) hash table of this capacity: a power of two, with room
/// for 7/8 of them (small tables: capacity + 1).
pub(crate) fn hash_slots(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        1..8 => (capacity + 1).next_power_of_two(),
        _ => (capacity * 8 / 7).next_power_of_two(),
    }
}

impl MemoryPodView {
    /// The pod API's heap as a deterministic size estimate (see
    /// [`crate::sim::World::world_heap_estimate`]): the pod table (records hold their
    /// addresses inline), the per-node sets and change logs.
    pub fn heap_estimate(&self) -> usize {
        use std::mem::size_of;
        let g = self.inner.lock();
        let mut bytes = g.pods.heap_bytes();
        let set = |n: usize| (n.div_ceil(7)) * (11 * size_of::<PodUid>() + 112);
        bytes += hash_slots(g.pending.capacity()) * (size_of::<(NodeName, BTreeSet<PodUid>)>() + 1)
            + g.pending.values().map(|s| set(s.len())).sum::<usize>();
        bytes += hash_slots(g.bound.capacity()) * (size_of::<(NodeName, usize)>() + 1);
        bytes += hash_slots(g.changes.capacity()) * (size_of::<(NodeName, ChangeLog)>() + 1)
            + g.changes
                .values()
                .map(|l| l.recent.capacity() * size_of::<(u64, PodUid, Nanos)>())
                .sum::<usize>();
        bytes + g.deleted.capacity() * size_of::<(Instant, PodUid)>()
    }

    /// The pod as the cache shows it at `now`.
    fn cached<'a>(&self, g: &'a Inner, uid: PodUid, now: Nanos) -> Option<&'a PodInfo> {
        g.pods
            .get(&uid)
            .filter(|r| {
                r.visible_from <= now
                    && (r.deleted_at.is_never() || r.deleted_at.plus(self.lag) > now)
            })
            .map(|r| &r.info)
    }
}

impl PodCache for MemoryPodView {
    fn with_pod<R>(&self, uid: PodUid, f: impl FnOnce(Option<&PodInfo>) -> R) -> R {
        let now = self.now();
        let g = self.inner.lock();
        f(self.cached(&g, uid, now))
    }

    /// One lock and one clock reading for the whole batch.
    fn with_pods<T>(
        &self,
        items: impl IntoIterator<Item = T>,
        uid: impl Fn(&T) -> PodUid,
        mut f: impl FnMut(T, Option<&PodInfo>),
    ) {
        let now = self.now();
        let g = self.inner.lock();
        for item in items {
            let u = uid(&item);
            f(item, self.cached(&g, u, now));
        }
    }

    fn pod_changes(&self, node: &str, since: Option<Since>) -> Option<PodChanges> {
        let now = self.now();
        let g = self.inner.lock();
        let Some(log) = g.changes.get(node) else {
            // no pod was ever bound to it
            return Some(PodChanges::default());
        };
        let seq = log.recent.back().map_or(log.dropped.0, |c| c.0);
        let Some(since) = since else {
            return Some(PodChanges {
                seq,
                changed: Vec::new(),
            });
        };
        let at = Nanos::since(self.base, since.at);
        // a change no longer kept may be one the caller has not seen, or one that shows
        // only now: it cannot tell which pod
        if log.dropped.0 > since.seq || log.dropped.1 > at {
            return None;
        }
        let changed = log
            .recent
            .iter()
            .filter(|(s, _, visible)| *s > since.seq || (*visible > at && *visible <= now))
            .map(|(_, uid, _)| *uid)
            .collect();
        Some(PodChanges { seq, changed })
    }
}

impl PodView for MemoryPodView {
    async fn pod_live(&self, uid: PodUid) -> Result<Option<PodInfo>, IpamError> {
        Ok(self.truth(uid))
    }

    fn pending_pods(&self, node: &str) -> Vec<PodUid> {
        let g = self.inner.lock();
        g.pending
            .get(node)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    fn bound_pods(&self, node: &str) -> usize {
        self.inner.lock().bound.get(node).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rec(PodUid, u64);

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
                    t.insert(Rec(PodUid(uid), step));
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
        assert!(t.get(&PodUid(u128::MAX)).is_none() || model.contains_key(&u128::MAX));
    }

    #[tokio::test(start_paused = true)]
    async fn cache_lags_behind_the_truth() {
        let v = MemoryPodView::new(Duration::from_secs(2));
        let uid = PodUid(1);
        v.add(uid, "n".into());
        assert!(v.pod(uid).is_none(), "not in the cache yet");
        assert!(v.pod_live(uid).await.unwrap().is_some());
        assert_eq!(v.pending_pods("n"), vec![uid]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(v.pod(uid).is_some());
        v.set_running(uid, vec!["10.0.0.1".parse().unwrap()]);
        assert!(v.pending_pods("n").is_empty());
        assert_eq!(v.bound_pods("n"), 1);
        v.delete(uid);
        assert_eq!(v.bound_pods("n"), 0);
        assert!(v.pod_live(uid).await.unwrap().is_none());
        assert!(v.pod(uid).is_some(), "cache still shows it");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(v.pod(uid).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn pod_changes_name_the_pods_changed_and_those_shown_late() {
        let lag = Duration::from_secs(2);
        let v = MemoryPodView::new(lag);
        let changes = |since: Option<Since>| v.pod_changes("n", since).expect("kept");
        assert_eq!(changes(None), PodChanges::default(), "no pod was ever on n");
        let (a, b) = (PodUid(1), PodUid(2));
        v.add(a, "n".into());
        let t0 = Instant::now();
        let s0 = Since {
            seq: changes(None).seq,
            at: t0,
        };
        // added, shown `lag` later: not a change at t0, one at t0 + lag
        assert!(changes(Some(s0)).changed.is_empty());
        tokio::time::sleep(lag).await;
        assert_eq!(changes(Some(s0)).changed, vec![a]);
        let s1 = Since {
            seq: s0.seq,
            at: Instant::now(),
        };
        assert!(changes(Some(s1)).changed.is_empty());
        // a phase change shows at once; another node's pods are not this one's
        v.set_running(a, vec!["10.0.0.1".parse().unwrap()]);
        v.add(b, "m".into());
        let c = changes(Some(s1));
        assert_eq!(c.changed, vec![a]);
        assert!(c.seq > s1.seq);
        let s2 = Since {
            seq: c.seq,
            at: Instant::now(),
        };
        v.delete(a);
        assert_eq!(
            changes(Some(s2)).changed,
            vec![a],
            "a new change, shown later"
        );
        let s3 = Since {
            seq: changes(None).seq,
            at: Instant::now(),
        };
        tokio::time::sleep(lag).await;
        assert_eq!(
            changes(Some(s3)).changed,
            vec![a],
            "now shown: changed again"
        );
        // more changes than are kept: it can no longer tell since s3
        for i in 0..CHANGES_KEPT as u128 {
            v.add(PodUid(10 + i), "n".into());
        }
        assert_eq!(v.pod_changes("n", Some(s3)), None);
        assert!(v.pod_changes("n", None).is_some());
    }

    #[test]
    fn pod_ips_hold_one_address_per_family() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let ips = PodIps::new([ip("10.0.0.1"), ip("fd00::1"), ip("10.0.0.2")]);
        assert!(ips.contains(&ip("10.0.0.1")) && ips.contains(&ip("fd00::1")));
        assert!(
            !ips.contains(&ip("10.0.0.2")),
            "a second IPv4 address is ignored"
        );
        assert_eq!(
            ips.iter().collect::<Vec<_>>(),
            vec![ip("10.0.0.1"), ip("fd00::1")]
        );
        assert!(!ips.is_empty() && PodIps::default().is_empty());
        assert_eq!(PodIps::new([ip("fd00::2")]).iter().count(), 1);
    }
}
