//! The node's state in memory: what the checkpoint holds, with the node side's rules for
//! changing it. Pure (no I/O, time passed in); [`NodeState::save`] writes it.
//!
//! Every change marks the state dirty and the agent saves before it replies or publishes
//! ("durable before it answers"). A failed save leaves it dirty, so a retried request that
//! changes nothing (a repeated DEL) still saves what the first one changed.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tidepool_ipam::node::tombstone_outcome;
use tidepool_ipam::{
    AddrMap, AddrSet, AllocationId, NodeSideFields, PodUid, ReclaimAck, ReclaimOutcome, ReleaseAck,
    UsedEntry, UsedMap,
};

use super::error::{Result, StateError};
use super::fs::Fs;

/// An allocation's key: the runtime's sandbox (containerID) and the interface in it. Not the
/// pod's name (calico#1406: a new pod of the same name was freed by the old one's DEL).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocKey {
    pub container_id: String,
    pub ifname: String,
}

impl AllocKey {
    pub fn new(container_id: impl Into<String>, ifname: impl Into<String>) -> Self {
        AllocKey {
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }

    /// The engine's hash of this key (what tombstones and `ipam` compare).
    pub fn id(&self) -> AllocationId {
        AllocationId::new(&self.container_id, &self.ifname)
    }
}

/// The pod an allocation belongs to: its UID is its identity, namespace and name are for
/// `status.used` and for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
}

/// One CNI ADD's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub pod: PodRef,
    /// One per family, in the order ADD returned them.
    pub addrs: Vec<IpAddr>,
    pub since: SystemTime,
    /// The boot it was made under: after a reboot every earlier pod is dead.
    pub boot_id: String,
    /// The sandbox's network namespace path (`CNI_NETNS`), reconcile's evidence; format v2.
    pub netns: Option<String>,
}

/// A tombstone answered: which allocation of which pod, and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimAnswer {
    pub pod_uid: PodUid,
    pub key: AllocKey,
    pub outcome: ReclaimOutcome,
}

/// What [`NodeState::add`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Added {
    pub addrs: Vec<IpAddr>,
    /// The key was already allocated to this pod (a runtime retrying after a lost reply):
    /// its addresses are returned and nothing changed.
    pub repeated: bool,
}

/// What [`NodeState::del`] did. Every outcome is a CNI success: DEL is idempotent.
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

/// The node's allocations, cooldowns and answers. See the module doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// This boot's ID: new allocations are made under it.
    pub(super) boot_id: String,
    pub(super) reuse_cooldown: Duration,
    pub(super) allocations: BTreeMap<AllocKey, Allocation>,
    /// Address → the allocation holding it (an index of `allocations`).
    pub(super) owners: BTreeMap<IpAddr, AllocKey>,
    /// Address → end of its reuse cooldown (persisted: aws PR #1188).
    pub(super) cooldown: BTreeMap<IpAddr, SystemTime>,
    pub(super) release_ack: AddrMap<ReleaseAck>,
    /// Block name → the answer to its release mark (cluster-pool).
    pub(super) block_release_ack: BTreeMap<String, ReleaseAck>,
    pub(super) reclaim_ack: BTreeMap<IpAddr, ReclaimAnswer>,
    pub(super) dirty: bool,
}

impl NodeState {
    /// An empty state for this boot; freed addresses cool down for `reuse_cooldown`.
    pub fn new(boot_id: impl Into<String>, reuse_cooldown: Duration) -> Self {
        NodeState {
            boot_id: boot_id.into(),
            reuse_cooldown,
            allocations: BTreeMap::new(),
            owners: BTreeMap::new(),
            cooldown: BTreeMap::new(),
            release_ack: AddrMap::new(),
            block_release_ack: BTreeMap::new(),
            reclaim_ack: BTreeMap::new(),
            dirty: false,
        }
    }

    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    pub fn reuse_cooldown(&self) -> Duration {
        self.reuse_cooldown
    }

    /// Whether something changed since the last successful save.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    pub fn get(&self, key: &AllocKey) -> Option<&Allocation> {
        self.allocations.get(key)
    }

    pub fn allocations(&self) -> impl Iterator<Item = (&AllocKey, &Allocation)> {
        self.allocations.iter()
    }

    /// The allocation holding `addr`.
    pub fn owner(&self, addr: &IpAddr) -> Option<(&AllocKey, &Allocation)> {
        let key = self.owners.get(addr)?;
        self.allocations.get_key_value(key)
    }

    pub fn cooldowns(&self) -> &BTreeMap<IpAddr, SystemTime> {
        &self.cooldown
    }

    pub fn release_acks(&self) -> &AddrMap<ReleaseAck> {
        &self.release_ack
    }

    pub fn block_release_acks(&self) -> &BTreeMap<String, ReleaseAck> {
        &self.block_release_ack
    }

    pub fn reclaim_acks(&self) -> &BTreeMap<IpAddr, ReclaimAnswer> {
        &self.reclaim_ack
    }

    /// CNI ADD's record: `key` gets `addrs` (picked by the caller with `ipam`'s
    /// `free_address` over [`NodeState::node_side`]). A repeated ADD of the same key by the
    /// same pod returns what it got the first time and ignores `addrs`. Refused: a key held
    /// by another pod, an address held or cooling down at `now` — the last guard against
    /// giving one address twice. `now` is also the allocation's time (a rebuild from
    /// `status.used` passes the entry's `since`).
    pub fn add(
        &mut self,
        key: AllocKey,
        pod: PodRef,
        addrs: &[IpAddr],
        netns: Option<String>,
        now: SystemTime,
    ) -> Result<Added> {
        if let Some(a) = self.allocations.get(&key) {
            if a.pod.uid != pod.uid {
                return Err(StateError::KeyHeldByOtherPod {
                    container_id: key.container_id,
                    ifname: key.ifname,
                    owner: a.pod.uid,
                    pod: pod.uid,
                });
            }
            return Ok(Added {
                addrs: a.addrs.clone(),
                repeated: true,
            });
        }
        let unique = addrs
            .iter()
            .enumerate()
            .all(|(i, a)| !addrs[..i].contains(a));
        if addrs.is_empty() || !unique {
            return Err(StateError::BadAddresses);
        }
        for addr in addrs {
            if let Some(k) = self.owners.get(addr) {
                return Err(StateError::AddressInUse {
                    addr: *addr,
                    container_id: k.container_id.clone(),
                    ifname: k.ifname.clone(),
                });
            }
            if self.cooldown.get(addr).is_some_and(|until| *until > now) {
                return Err(StateError::AddressCooling { addr: *addr });
            }
        }
        for addr in addrs {
            // a cooldown that ended is over whether or not it was expired yet
            self.cooldown.remove(addr);
            self.owners.insert(*addr, key.clone());
        }
        let allocation = Allocation {
            pod,
            addrs: addrs.to_vec(),
            since: now,
            boot_id: self.boot_id.clone(),
            netns,
        };
        self.allocations.insert(key, allocation);
        self.dirty = true;
        Ok(Added {
            addrs: addrs.to_vec(),
            repeated: false,
        })
    }

    /// CNI DEL: frees `key`'s addresses into cooldown — only if the recorded owner is
    /// `pod_uid` (a DEL without one, such as an old spool entry, is matched by its key
    /// alone: container IDs are not reused). Idempotent: an unknown key frees nothing.
    pub fn del(&mut self, key: &AllocKey, pod_uid: Option<PodUid>, now: SystemTime) -> DelOutcome {
        let Some(a) = self.allocations.get(key) else {
            return DelOutcome::Unknown;
        };
        if let Some(uid) = pod_uid
            && uid != a.pod.uid
        {
            return DelOutcome::Stale { owner: a.pod.uid };
        }
        match self.free(key, now) {
            Some(a) => DelOutcome::Freed(a.addrs),
            None => DelOutcome::Unknown,
        }
    }

    /// Removes `key`'s allocation; its addresses cool down from `now`.
    fn free(&mut self, key: &AllocKey, now: SystemTime) -> Option<Allocation> {
        let a = self.allocations.remove(key)?;
        for addr in &a.addrs {
            self.owners.remove(addr);
            self.cool(*addr, now);
        }
        self.dirty = true;
        Some(a)
    }

    /// `addr` cools down until `now` + the reuse cooldown, or longer if it already did.
    fn cool(&mut self, addr: IpAddr, now: SystemTime) {
        let until = now + self.reuse_cooldown;
        let e = self.cooldown.entry(addr).or_insert(until);
        *e = (*e).max(until);
    }

    /// Answers the operator's tombstone on `addr` (`spec.reclaim`: take back allocation
    /// `key` of pod `pod_uid`) by `ipam::node::tombstone_outcome`, once `addr` is found to
    /// be exactly that allocation's on the full key (else `stale`): `reclaimed` frees it
    /// into cooldown; `live` (`live(uid)`: a pod of that UID runs on the node, not
    /// Succeeded or Failed, and this is its newest allocation in the family) frees nothing.
    /// The answer is recorded for `status.reclaimAck`; answering the same tombstone again
    /// changes nothing.
    pub fn ack_reclaim(
        &mut self,
        addr: IpAddr,
        pod_uid: PodUid,
        key: &AllocKey,
        live: impl Fn(PodUid) -> bool,
        now: SystemTime,
    ) -> ReclaimOutcome {
        if let Some(ack) = self.reclaim_ack.get(&addr)
            && ack.pod_uid == pod_uid
            && ack.key == *key
        {
            return ack.outcome;
        }
        let exact = self
            .owner(&addr)
            .is_some_and(|(k, a)| k == key && a.pod.uid == pod_uid);
        let outcome = if exact {
            tombstone_outcome(&addr, pod_uid, key.id(), &self.used(), live)
        } else {
            ReclaimOutcome::Stale
        };
        if outcome == ReclaimOutcome::Reclaimed {
            self.take_address(key, addr, now);
        }
        let answer = ReclaimAnswer {
            pod_uid,
            key: key.clone(),
            outcome,
        };
        self.reclaim_ack.insert(addr, answer);
        self.dirty = true;
        outcome
    }

    /// Removes one address from `key`'s allocation (the whole allocation with its last);
    /// it cools down from `now`.
    fn take_address(&mut self, key: &AllocKey, addr: IpAddr, now: SystemTime) {
        let Some(a) = self.allocations.get_mut(key) else {
            return;
        };
        a.addrs.retain(|x| *x != addr);
        if a.addrs.is_empty() {
            self.allocations.remove(key);
        }
        self.owners.remove(&addr);
        self.cool(addr, now);
        self.dirty = true;
    }

    /// Drops the answer on `addr` once its tombstone is gone. Returns whether it was there.
    pub fn forget_reclaim_ack(&mut self, addr: &IpAddr) -> bool {
        let had = self.reclaim_ack.remove(addr).is_some();
        self.dirty |= had;
        had
    }

    /// Sets the answers to address release marks (`status.releaseAck`), as
    /// `ipam::node::reconcile` computed them over [`NodeState::node_side`]. Returns
    /// whether they changed.
    pub fn ack_release(&mut self, acks: AddrMap<ReleaseAck>) -> bool {
        if acks == self.release_ack {
            return false;
        }
        self.release_ack = acks;
        self.dirty = true;
        true
    }

    /// Sets (or with `None` drops) the answer to block `block`'s release mark. Returns
    /// whether it changed.
    pub fn ack_block(&mut self, block: &str, ack: Option<ReleaseAck>) -> bool {
        let old = match ack {
            Some(a) => self.block_release_ack.insert(block.to_owned(), a),
            None => self.block_release_ack.remove(block),
        };
        let changed = old != ack;
        self.dirty |= changed;
        changed
    }

    /// Ends the cooldowns whose time has come. Returns whether any ended.
    pub fn expire_cooldowns(&mut self, now: SystemTime) -> bool {
        let before = self.cooldown.len();
        self.cooldown.retain(|_, until| *until > now);
        let changed = self.cooldown.len() != before;
        self.dirty |= changed;
        changed
    }

    /// Ends the cooldowns of addresses no longer in the node's pool (`ipam`'s rule: a
    /// cooldown protects a reuse that can no longer happen here). Returns whether any ended.
    pub fn forget_cooldowns_outside(&mut self, pool: &AddrSet) -> bool {
        let before = self.cooldown.len();
        self.cooldown.retain(|a, _| pool.contains(a));
        let changed = self.cooldown.len() != before;
        self.dirty |= changed;
        changed
    }

    /// A reboot killed every pod of an earlier boot: frees every allocation made under
    /// another boot ID into cooldown at once, without waiting for DELs that may never
    /// come (cri-o#4727). Returns what it freed. [`super::StateDir::load`] calls it.
    pub fn expire_boot(&mut self, now: SystemTime) -> Vec<(AllocKey, Allocation)> {
        let dead: Vec<AllocKey> = self
            .allocations
            .iter()
            .filter(|(_, a)| a.boot_id != self.boot_id)
            .map(|(k, _)| k.clone())
            .collect();
        dead.into_iter()
            .filter_map(|k| self.free(&k, now).map(|a| (k, a)))
            .collect()
    }

    /// The node side's fields as `ipam`'s node rules read them (`used` keyed by the
    /// allocation's hash), for `free_address`, `reconcile` and `answer_blocks`, and for
    /// publishing.
    pub fn node_side(&self) -> NodeSideFields {
        let used = self.used();
        let reclaim_ack = self
            .reclaim_ack
            .iter()
            .map(|(addr, r)| {
                let ack = ReclaimAck {
                    pod_uid: r.pod_uid,
                    allocation: r.key.id(),
                    outcome: r.outcome,
                };
                (*addr, ack)
            })
            .collect();
        NodeSideFields {
            used,
            cooldown: self.cooldown.clone(),
            release_ack: self.release_ack.clone(),
            reclaim_ack,
        }
    }

    /// `status.used` as `ipam`'s node rules read it (keyed by the allocation's hash).
    fn used(&self) -> UsedMap {
        self.allocations
            .iter()
            .flat_map(|(k, a)| {
                let entry = UsedEntry {
                    pod_uid: a.pod.uid,
                    namespace: Arc::from(a.pod.namespace.as_str()),
                    pod: Arc::from(a.pod.name.as_str()),
                    allocation: k.id(),
                    since: a.since,
                };
                a.addrs.iter().map(move |addr| (*addr, entry.clone()))
            })
            .collect()
    }

    /// Writes the checkpoint durably: temp file, write, fsync, rename over the checkpoint,
    /// fsync of `dir`. The state is clean once it returned `Ok`; reply or publish only then.
    pub fn save(&mut self, fs: &dyn Fs, dir: &Path) -> Result<()> {
        super::checkpoint::save(fs, dir, self)?;
        self.dirty = false;
        Ok(())
    }
}

/// A pod UID as the API server writes it (a UUID, either case) as the engine's number;
/// the inverse of `PodUid`'s `Display` (`tidepool_api::convert::parse_uid`, the one parser).
pub fn parse_pod_uid(s: &str) -> Result<PodUid> {
    (tidepool_api::convert::parse_uid(s).map(PodUid))
        .ok_or_else(|| StateError::BadPodUid(s.to_owned()))
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
