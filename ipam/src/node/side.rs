//! [`NodeSide`]: the node side's own record (what it holds, cools down and has answered)
//! and the rules that change it for CNI ADD and DEL. Its maps are private: a caller
//! changes them only through these methods and those of `answers.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::addrs::{AddrMap, AddrSet, address};
use crate::types::{
    AllocationId, Family, FewByAddr, IpamNode, PodUid, ReclaimOutcome, ReleaseAck, UnixNanos,
};
use crate::used::UsedMap;

use super::MAX_REUSE_COOLDOWN;

/// An allocation's key: what a CNI ADD and DEL name. The simulator's is the 64-bit
/// [`AllocationId`] itself; the agent's is the (containerID, ifname) strings behind it.
pub trait Key: Ord + Clone + std::fmt::Debug {
    /// The engine's 64-bit hash of the key (what `status.used` and tombstones carry).
    fn id(&self) -> AllocationId;
}

impl Key for AllocationId {
    fn id(&self) -> AllocationId {
        *self
    }
}

/// The CNI network an allocation attaches (its network config's `name`, what a CNI GC
/// names); `None`: unknown (recorded before allocations kept it, or rebuilt from
/// `status.used`). [`NodeSide::gc`] never frees an allocation of an unknown network.
pub type Network = Option<Arc<str>>;

/// Whom an allocation is for: its pod (the identity) and the CNI network it attaches. A
/// bare [`PodUid`] is a pod on an unknown network (the simulator's, a rebuild's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub pod: PodUid,
    pub network: Network,
}

impl From<PodUid> for Owner {
    fn from(pod: PodUid) -> Self {
        Owner { pod, network: None }
    }
}

/// `used[address]`: which allocation of which pod holds the address, since when. The
/// pod's namespace and name are not here: the agent keeps them beside its `NodeSide`, the
/// simulator shares one pair for every pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held<K> {
    pub pod_uid: PodUid,
    pub key: K,
    pub since: UnixNanos,
    pub network: Network,
}

/// A tombstone answered: which allocation of which pod, and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimAnswer<K> {
    pub pod_uid: PodUid,
    pub key: K,
    pub outcome: ReclaimOutcome,
}

/// What [`NodeSide::add`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Added {
    /// One per family: in the order of the ADD's families when new, in address order
    /// when repeated.
    pub addrs: Vec<IpAddr>,
    /// The key was already allocated to this pod (a runtime retrying after a lost reply):
    /// its addresses are returned and nothing changed.
    pub repeated: bool,
}

/// Why [`NodeSide::add`] or [`NodeSide::adopt`] took nothing. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused<K> {
    /// The key is held by another pod.
    KeyHeldByOtherPod { owner: PodUid },
    /// No free address of this family (the pool is empty, or all of it is busy).
    NoFreeAddress { family: Family },
    /// No addresses, or one twice.
    BadAddresses,
    /// A record lists one key twice.
    KeyRecordedTwice,
    /// The address is held by another allocation.
    AddressInUse { addr: IpAddr, holder: K },
    /// The address cools down.
    AddressCooling { addr: IpAddr },
}

/// What [`NodeSide::del`] did. Every outcome is a CNI success: DEL is idempotent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelOutcome {
    /// The allocation was the pod's: these addresses cool down now.
    Freed(Vec<IpAddr>),
    /// No allocation has this key (freed already, or never made).
    Unknown,
    /// The key is another pod's: a stale DEL, nothing freed (cilium#10065).
    Stale { owner: PodUid },
}

impl DelOutcome {
    /// The addresses freed (none unless [`DelOutcome::Freed`]).
    pub fn freed(&self) -> &[IpAddr] {
        match self {
            DelOutcome::Freed(a) => a,
            _ => &[],
        }
    }
}

/// The node side's record: `used` (address → pod UID, key, since), cooldowns, the answers to address marks, tombstones and block marks, and whether any
/// of it changed since the caller last saved or wrote it (`dirty`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSide<K> {
    pub(super) reuse_cooldown: Duration,
    /// No index by key: a node holds a few hundred entries at most, an ADD or DEL scans
    /// them, and the simulator builds a `NodeSide` on every call (see `published.rs`),
    /// where building an index cost more than the scans it saved.
    pub(super) used: UsedMap<Held<K>>,
    /// Address → end of its reuse cooldown.
    pub(super) cooldown: FewByAddr<SystemTime>,
    pub(super) release_ack: AddrMap<ReleaseAck>,
    pub(super) reclaim_ack: BTreeMap<IpAddr, ReclaimAnswer<K>>,
    /// Answers (`reclaimed`, `stale`) whose tombstone is gone: they go with the next write
    /// ([`NodeSide::tidy`]), not with one of their own.
    pub(super) settled: BTreeSet<IpAddr>,
    /// Block name → the answer to its release mark (cluster-pool).
    pub(super) block_ack: BTreeMap<String, ReleaseAck>,
    pub(super) dirty: bool,
}

impl<K: Key> NodeSide<K> {
    /// An empty record; freed addresses cool down for `reuse_cooldown`, at most
    /// [`MAX_REUSE_COOLDOWN`] (a longer one is cut to it).
    pub fn new(reuse_cooldown: Duration) -> Self {
        NodeSide {
            reuse_cooldown: reuse_cooldown.min(MAX_REUSE_COOLDOWN),
            used: UsedMap::default(),
            cooldown: FewByAddr::new(),
            release_ack: AddrMap::new(),
            reclaim_ack: BTreeMap::new(),
            settled: BTreeSet::new(),
            block_ack: BTreeMap::new(),
            dirty: false,
        }
    }

    pub fn reuse_cooldown(&self) -> Duration {
        self.reuse_cooldown
    }

    /// Whether something changed since [`NodeSide::mark_clean`].
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The caller saved (or wrote) what changed.
    pub fn mark_clean(&mut self) {
        self.dirty = false;
    }

    /// The entry holding `addr`.
    pub fn holder(&self, addr: &IpAddr) -> Option<&Held<K>> {
        self.used.get(addr)
    }

    /// Every `used` entry, in address order.
    pub fn used(&self) -> impl Iterator<Item = (IpAddr, &Held<K>)> {
        self.used.iter()
    }

    /// The addresses `key` holds, in address order (empty: no such allocation).
    pub fn addrs_of(&self, key: &K) -> Vec<IpAddr> {
        self.of_key(key).collect()
    }

    fn of_key<'a>(&'a self, key: &'a K) -> impl Iterator<Item = IpAddr> + 'a {
        self.used
            .iter()
            .filter(move |(_, h)| h.key == *key)
            .map(|(a, _)| a)
    }

    /// `key`'s allocation: its entry (of its first address) and its addresses.
    pub fn allocation(&self, key: &K) -> Option<(&Held<K>, Vec<IpAddr>)> {
        let addrs = self.addrs_of(key);
        let held = self.used.get(addrs.first()?)?;
        Some((held, addrs))
    }

    /// Every allocation: its entry (of its first address) and its addresses, by key.
    pub fn allocations(&self) -> impl Iterator<Item = (&Held<K>, Vec<IpAddr>)> + '_ {
        // `used` is in address order: a stable sort by key keeps each key's in it
        let mut by_key: Vec<(&K, IpAddr)> = self.used.iter().map(|(a, h)| (&h.key, a)).collect();
        by_key.sort_by(|x, y| x.0.cmp(y.0));
        let mut it = by_key.into_iter().peekable();
        std::iter::from_fn(move || {
            let (key, first) = it.next()?;
            let mut addrs = vec![first];
            while let Some((_, a)) = it.next_if(|(k, _)| *k == key) {
                addrs.push(a);
            }
            Some((&self.used[&first], addrs))
        })
    }

    pub fn cooldowns(&self) -> &FewByAddr<SystemTime> {
        &self.cooldown
    }

    pub fn release_acks(&self) -> &AddrMap<ReleaseAck> {
        &self.release_ack
    }

    pub fn reclaim_acks(&self) -> &BTreeMap<IpAddr, ReclaimAnswer<K>> {
        &self.reclaim_ack
    }

    pub fn block_acks(&self) -> &BTreeMap<String, ReleaseAck> {
        &self.block_ack
    }

    /// The earliest cooldown end after `now` (when the node side must look again).
    pub fn next_cooldown_end(&self, now: SystemTime) -> Option<SystemTime> {
        crate::types::next_cooldown_end(self.cooldown.values(), now)
    }

    /// CNI ADD of `key` for `owner`: one free address per family of `node`'s pool (see
    /// [`NodeSide::free_address`]; never one of `exclude`: gateways, live pods' addresses
    /// the record does not hold), all or none, recorded since `now`. A repeated ADD of
    /// the same key by the same pod returns what it holds and changes nothing; a key held
    /// by another pod is refused.
    pub fn add(
        &mut self,
        node: &IpamNode,
        families: &[Family],
        exclude: &AddrSet,
        key: K,
        owner: impl Into<Owner>,
        now: SystemTime,
    ) -> Result<Added, Refused<K>> {
        let owner = owner.into();
        if let Some(added) = self.repeated(&key, owner.pod)? {
            return Ok(added);
        }
        let mut addrs = Vec::with_capacity(families.len());
        for &family in families {
            let a = self
                .free_address(node, family, exclude, now)
                .ok_or(Refused::NoFreeAddress { family })?;
            addrs.push(a);
        }
        self.hold(key, owner, &addrs, now)
    }

    /// Records `addrs` for `key` of `owner` since `since` (a rebuild from `status.used`, a
    /// restored checkpoint), with [`NodeSide::add`]'s guards — the last line against giving
    /// one address twice: a repeated key returns what it holds, a key of another pod, no
    /// or repeated addresses, an address held or cooling down at `since` are refused.
    pub fn adopt(
        &mut self,
        key: K,
        owner: impl Into<Owner>,
        addrs: &[IpAddr],
        since: SystemTime,
    ) -> Result<Added, Refused<K>> {
        let owner = owner.into();
        if let Some(added) = self.repeated(&key, owner.pod)? {
            return Ok(added);
        }
        self.hold(key, owner, addrs, since)
    }

    /// [`NodeSide::adopt`] of a key that holds nothing yet.
    fn hold(
        &mut self,
        key: K,
        Owner { pod, network }: Owner,
        addrs: &[IpAddr],
        since: SystemTime,
    ) -> Result<Added, Refused<K>> {
        let unique = addrs
            .iter()
            .enumerate()
            .all(|(i, a)| !addrs[..i].contains(a));
        if addrs.is_empty() || !unique {
            return Err(Refused::BadAddresses);
        }
        for addr in addrs {
            if let Some(h) = self.used.get(addr) {
                let holder = h.key.clone();
                return Err(Refused::AddressInUse {
                    addr: *addr,
                    holder,
                });
            }
            if self.cooldown.get(addr).is_some_and(|until| *until > since) {
                return Err(Refused::AddressCooling { addr: *addr });
            }
        }
        for addr in addrs {
            // a cooldown that ended is over whether or not it was expired yet
            self.cooldown.remove(addr);
            let held = Held {
                pod_uid: pod,
                key: key.clone(),
                since: since.into(),
                network: network.clone(),
            };
            self.used.insert(*addr, held);
        }
        self.dirty = true;
        Ok(Added {
            addrs: addrs.to_vec(),
            repeated: false,
        })
    }

    /// A repeated ADD: `key` held by `pod` (its addresses), or by another pod (refused).
    fn repeated(&self, key: &K, pod: PodUid) -> Result<Option<Added>, Refused<K>> {
        let Some((held, addrs)) = self.allocation(key) else {
            return Ok(None);
        };
        if held.pod_uid != pod {
            return Err(Refused::KeyHeldByOtherPod {
                owner: held.pod_uid,
            });
        }
        Ok(Some(Added {
            addrs,
            repeated: true,
        }))
    }

    /// A free address of one family of `node`'s pool: not used, not cooling down at `now`
    /// (a cooldown that ended is over, whether or not [`NodeSide::tidy`] dropped it), not marked or
    /// released, not answered for, not in `exclude`; the lowest one. Marks, answers and
    /// `exclude` are skipped a run at a time, used and cooling addresses one at a time (a
    /// full node tries ~100 addresses before a free one).
    pub(super) fn free_address(
        &self,
        node: &IpamNode,
        family: Family,
        exclude: &AddrSet,
        now: SystemTime,
    ) -> Option<IpAddr> {
        // mostly all three are empty: then no set is built (an ADD is the world's most
        // frequent call)
        let mut skip = match node.operator.release.is_empty() {
            true => AddrSet::new(),
            false => node.operator.release.keys().of_family(family),
        };
        if !self.release_ack.is_empty() {
            skip.union_with(&self.release_ack.keys());
        }
        if !exclude.is_empty() {
            skip.union_with(exclude);
        }
        // from each run's start: past a skipped run at once, past the used addresses
        // that follow on without a gap in one binary search (a node hands its addresses
        // out from the bottom, so the first free one mostly lies past every used one),
        // then past a cooling address one by one (few cool at a time)
        for run in node.operator.addresses.runs_of(family) {
            let mut skips = skip.runs_of(family).peekable();
            let mut n = *run.start();
            while n <= *run.end() {
                while skips.next_if(|r| *r.end() < n).is_some() {}
                if let Some(r) = skips.peek().filter(|r| *r.start() <= n) {
                    n = r.end().checked_add(1)?;
                    continue;
                }
                let here = address(family, n);
                let past_used = match &here {
                    IpAddr::V4(a) => {
                        first_unused(self.used.v4_from(a), n, |x| u32::from(*x).into())
                    }
                    IpAddr::V6(a) => first_unused(self.used.v6_from(a), n, |x| u128::from(*x)),
                }?;
                if past_used != n {
                    n = past_used;
                } else if self.cooldown.get(&here).is_some_and(|until| *until > now) {
                    n = n.checked_add(1)?;
                } else {
                    return Some(here);
                }
            }
        }
        None
    }

    /// CNI DEL of `key`: frees its addresses into cooldown — only if its pod is `pod` (a
    /// DEL without one, such as an old spool entry, is matched by its key alone: container
    /// IDs are not reused); a DEL of another pod's key (kuryr's rule; Calico #1406, Cilium
    /// #10065) or of an unknown key frees nothing. Idempotent.
    pub fn del(&mut self, key: &K, pod: Option<PodUid>, now: SystemTime) -> DelOutcome {
        let Some((held, _)) = self.allocation(key) else {
            return DelOutcome::Unknown;
        };
        if let Some(uid) = pod
            && uid != held.pod_uid
        {
            return DelOutcome::Stale {
                owner: held.pod_uid,
            };
        }
        DelOutcome::Freed(self.free(key, now))
    }

    /// Removes `key`'s allocation; its addresses cool down from `now`. Returns them.
    fn free(&mut self, key: &K, now: SystemTime) -> Vec<IpAddr> {
        let addrs = self.addrs_of(key);
        for addr in &addrs {
            self.take_address(*addr, now);
        }
        addrs
    }

    /// Removes `addr` from its allocation; it cools down from `now`.
    pub(super) fn take_address(&mut self, addr: IpAddr, now: SystemTime) {
        self.used.remove(&addr);
        self.cool(addr, now);
        self.dirty = true;
    }

    /// `addr` cools down until `now` + the reuse cooldown, or longer if it already did.
    fn cool(&mut self, addr: IpAddr, now: SystemTime) {
        // no overflow: the cooldown is at most MAX_REUSE_COOLDOWN and `now` a clock's reading
        let until = now + self.reuse_cooldown;
        let e = self.cooldown.entry(addr).or_insert(until);
        *e = (*e).max(until);
    }

    /// A reboot killed every pod of an earlier boot: frees every allocation whose key
    /// `of_past_boot` says so into cooldown at once, without waiting for DELs that may
    /// never come (cri-o#4727). Returns what it freed: key, pod and addresses.
    pub fn expire_boot(
        &mut self,
        of_past_boot: impl Fn(&K) -> bool,
        now: SystemTime,
    ) -> Vec<(K, PodUid, Vec<IpAddr>)> {
        self.free_where(|h| of_past_boot(&h.key), now)
    }

    /// CNI GC of `network` (CNI 1.1: `valid` lists that network's valid attachments):
    /// frees into cooldown every allocation attached to `network` whose key `valid` does
    /// not name. An allocation of another network, or of an unknown one, is never freed
    /// by a GC — the list says nothing of it; DEL (and the agent's reconcile) still free
    /// those. Returns what it freed: key, pod and addresses.
    pub fn gc(
        &mut self,
        network: &str,
        valid: impl Fn(&K) -> bool,
        now: SystemTime,
    ) -> Vec<(K, PodUid, Vec<IpAddr>)> {
        self.free_where(
            |h| h.network.as_deref() == Some(network) && !valid(&h.key),
            now,
        )
    }

    /// Frees into cooldown every allocation whose entry `doomed` says so.
    fn free_where(
        &mut self,
        doomed: impl Fn(&Held<K>) -> bool,
        now: SystemTime,
    ) -> Vec<(K, PodUid, Vec<IpAddr>)> {
        let dead: Vec<(K, PodUid)> = self
            .allocations()
            .filter(|(h, _)| doomed(h))
            .map(|(h, _)| (h.key.clone(), h.pod_uid))
            .collect();
        dead.into_iter()
            .map(|(k, uid)| {
                let addrs = self.free(&k, now);
                (k, uid, addrs)
            })
            .collect()
    }
}

/// The numbers of `family`'s addresses among `addrs` (sorted), until another family begins.
/// The first number from `n` on that no address of `used` (one family's, sorted, none
/// below `n`; `number` gives an address's) holds, found by bisection: the held ones that
/// follow on from `n` without a gap are exactly the first `i` for which `used[i]` is
/// `n + i`. None past the family's last address.
fn first_unused<A>(used: &[A], n: u128, number: impl Fn(&A) -> u128) -> Option<u128> {
    let follows_on = |i: usize| n.checked_add(i as u128) == Some(number(&used[i]));
    let (mut lo, mut hi) = (0, used.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match follows_on(mid) {
            true => lo = mid + 1,
            false => hi = mid,
        }
    }
    n.checked_add(lo as u128)
}
