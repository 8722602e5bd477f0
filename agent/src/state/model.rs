//! The node's state in memory: `ipam`'s [`NodeSide`] (the node side's record and every
//! rule that changes it, the simulator's too) keyed by (containerID, ifname), and what is
//! the agent's own beside it: the boot each allocation was made under, its netns (the
//! reconcile's evidence) and its pod's namespace and name. Pure (no I/O, time passed in);
//! [`NodeState::save`] writes it.
//!
//! Every change marks the state dirty and the agent saves before it replies or publishes
//! ("durable before it answers"). A failed save leaves it dirty, so a retried request that
//! changes nothing (a repeated DEL) still saves what the first one changed. The agent's
//! group commit saves [`NodeState::snapshot`]s instead: there dirty means changed since the
//! last snapshot, and the commit remembers a failed save (`crate::serve`'s `commit`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tidepool_api::convert::Allocations;
use tidepool_ipam::node::{
    Added, Answers, BlockView, DelOutcome, Held, Key, Network, NodeSide, Owner, Refused,
};
use tidepool_ipam::{
    AddrMap, AddrSet, AllocationId, Family, FewByAddr, IpamNode, NodeSideFields, PerFamily,
    PodName, PodUid, ReleaseAck, Tombstone,
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

impl Key for AllocKey {
    fn id(&self) -> AllocationId {
        AllocKey::id(self)
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

/// One CNI ADD's record, as the node side and the agent's own part make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub pod: PodRef,
    /// One per family, in address order.
    pub addrs: Vec<IpAddr>,
    pub since: SystemTime,
    /// The boot it was made under: after a reboot every earlier pod is dead.
    pub boot_id: String,
    /// The sandbox's network namespace path (`CNI_NETNS`), reconcile's evidence; format v2.
    pub netns: Option<String>,
    /// The CNI network it attaches (the network config's `name`); `None`: unknown.
    pub network: Network,
    /// The pool each address was allocated from, as chosen at the ADD (`status.used[addr]
    /// .pool`); an address without one (recorded before pools were chosen per pod, or
    /// rebuilt from `status.used`) belongs to the pool whose block holds it.
    pub pools: AddrPools,
}

/// Address → the pool it was allocated from.
pub type AddrPools = BTreeMap<IpAddr, Arc<str>>;

/// Where an ADD attaches its allocation: the sandbox's network namespace path
/// (`CNI_NETNS`), the CNI network (the network config's `name`, what a GC names), and the
/// pod's pool per family (`None`: not known, nothing recorded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attachment {
    pub netns: Option<String>,
    pub network: Network,
    pub pools: PerFamily<Option<Arc<str>>>,
}

/// A tombstone answered, on the full key.
pub type ReclaimAnswer = tidepool_ipam::node::ReclaimAnswer<AllocKey>;

/// What the agent keeps of an allocation beside its node side: its own, not the rules'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Own {
    pub namespace: String,
    pub name: String,
    pub boot_id: String,
    pub netns: Option<String>,
    pub pools: AddrPools,
}

/// The node's allocations, cooldowns and answers. See the module doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// This boot's ID: new allocations are made under it.
    pub(super) boot_id: String,
    pub(super) side: NodeSide<AllocKey>,
    /// Per allocation of `side`: what the agent keeps of it (same keys).
    pub(super) own: BTreeMap<AllocKey, Own>,
}

impl NodeState {
    /// An empty state for this boot; freed addresses cool down for `reuse_cooldown`.
    pub fn new(boot_id: impl Into<String>, reuse_cooldown: Duration) -> Self {
        NodeState {
            boot_id: boot_id.into(),
            side: NodeSide::new(reuse_cooldown),
            own: BTreeMap::new(),
        }
    }

    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    pub fn reuse_cooldown(&self) -> Duration {
        self.side.reuse_cooldown()
    }

    /// Whether something changed since the last successful save.
    pub fn is_dirty(&self) -> bool {
        self.side.is_dirty()
    }

    pub fn get(&self, key: &AllocKey) -> Option<Allocation> {
        let (held, addrs) = self.side.allocation(key)?;
        Some(self.view(held, addrs))
    }

    /// Every allocation, by key.
    pub fn allocations(&self) -> impl Iterator<Item = (&AllocKey, Allocation)> {
        self.side
            .allocations()
            .map(|(h, addrs)| (&h.key, self.view(h, addrs)))
    }

    /// The allocation holding `addr`.
    pub fn owner(&self, addr: &IpAddr) -> Option<(&AllocKey, Allocation)> {
        let key = &self.side.holder(addr)?.key;
        Some((key, self.get(key)?))
    }

    fn view(&self, held: &Held<AllocKey>, addrs: Vec<IpAddr>) -> Allocation {
        let own = self.own.get(&held.key).cloned().unwrap_or_else(|| Own {
            namespace: String::new(),
            name: String::new(),
            boot_id: self.boot_id.clone(),
            netns: None,
            pools: AddrPools::new(),
        });
        Allocation {
            pod: PodRef {
                uid: held.pod_uid,
                namespace: own.namespace,
                name: own.name,
            },
            addrs,
            since: held.since.into(),
            boot_id: own.boot_id,
            netns: own.netns,
            network: held.network.clone(),
            pools: own.pools,
        }
    }

    pub fn cooldowns(&self) -> &FewByAddr<SystemTime> {
        self.side.cooldowns()
    }

    pub fn release_acks(&self) -> &AddrMap<ReleaseAck> {
        self.side.release_acks()
    }

    pub fn block_release_acks(&self) -> &BTreeMap<String, ReleaseAck> {
        self.side.block_acks()
    }

    pub fn reclaim_acks(&self) -> &BTreeMap<IpAddr, ReclaimAnswer> {
        self.side.reclaim_acks()
    }

    /// CNI ADD of `key` for `pod`, attached at `at`, by `ipam`'s [`NodeSide::add`]: one
    /// free address per family of `node`'s pool ([`pool_families`]), never one of
    /// `exclude` (gateways, live pods' addresses); a repeated ADD of the key by the same
    /// pod returns what it got the first time.
    pub fn add(
        &mut self,
        node: &IpamNode,
        exclude: &AddrSet,
        key: AllocKey,
        pod: PodRef,
        at: Attachment,
        now: SystemTime,
    ) -> Result<Added, Refused<AllocKey>> {
        let families = pool_families(node);
        let owner = Owner {
            pod: pod.uid,
            network: at.network,
        };
        let added = self
            .side
            .add(node, &families, exclude, key.clone(), owner, now)?;
        let pools = (added.addrs.iter())
            .filter_map(|a| Some((*a, at.pools.get(Family::of(a)).clone()?)))
            .collect();
        self.own_new(&added, key, pod, at.netns, pools);
        Ok(added)
    }

    /// Records `addrs` for `key` of `pod` since `since` with [`NodeSide::adopt`]'s guards
    /// (a rebuild from `status.used`, which names no network: unknown).
    pub fn adopt_allocation(
        &mut self,
        key: AllocKey,
        pod: PodRef,
        addrs: &[IpAddr],
        netns: Option<String>,
        since: SystemTime,
    ) -> Result<Added, Refused<AllocKey>> {
        self.adopt_in_pools(key, pod, addrs, netns, since, AddrPools::new())
    }

    /// [`Self::adopt_allocation`], each of `addrs` in its pool of `pools` (none: the pool
    /// whose block holds it).
    pub(super) fn adopt_in_pools(
        &mut self,
        key: AllocKey,
        pod: PodRef,
        addrs: &[IpAddr],
        netns: Option<String>,
        since: SystemTime,
        pools: AddrPools,
    ) -> Result<Added, Refused<AllocKey>> {
        let added = self.side.adopt(key.clone(), pod.uid, addrs, since)?;
        self.own_new(&added, key, pod, netns, pools);
        Ok(added)
    }

    fn own_new(
        &mut self,
        added: &Added,
        key: AllocKey,
        pod: PodRef,
        netns: Option<String>,
        pools: AddrPools,
    ) {
        if !added.repeated {
            let own = Own {
                namespace: pod.namespace,
                name: pod.name,
                boot_id: self.boot_id.clone(),
                netns,
                pools,
            };
            self.own.insert(key, own);
        }
    }

    /// CNI DEL by [`NodeSide::del`]: frees `key`'s addresses into cooldown, only if its
    /// pod is `pod_uid` (or none is named).
    pub fn del(&mut self, key: &AllocKey, pod_uid: Option<PodUid>, now: SystemTime) -> DelOutcome {
        let out = self.side.del(key, pod_uid, now);
        self.forget_freed();
        out
    }

    /// CNI GC of `network` by [`NodeSide::gc`]: frees that network's allocations whose key
    /// `valid` does not list, never one of another network or of an unknown one. Returns
    /// whether it freed any.
    pub fn gc(&mut self, network: &str, valid: &[AllocKey], now: SystemTime) -> bool {
        let freed = self.side.gc(network, |k| valid.contains(k), now);
        self.forget_freed();
        !freed.is_empty()
    }

    /// Drops what the agent kept of allocations the node side no longer holds.
    fn forget_freed(&mut self) {
        let side = &self.side;
        self.own.retain(|k, _| side.allocation(k).is_some());
    }

    /// Answers the operator's tombstones by [`NodeSide::answer_tombstones`] on their
    /// exact allocation: `keys` gives the (containerID, ifname) a tombstone names (one
    /// it does not name waits), `live(uid)` whether a pod of that UID runs on the node.
    pub fn answer_tombstones(
        &mut self,
        reclaim: &BTreeMap<IpAddr, Tombstone>,
        keys: &Allocations,
        live: impl Fn(PodUid) -> bool,
        now: SystemTime,
    ) {
        let key_of = |id| {
            keys.get(&id)
                .map(|n| AllocKey::new(n.container_id(), n.ifname()))
        };
        self.side.answer_tombstones(reclaim, key_of, live, now);
        self.forget_freed();
    }

    /// Answers address release marks by [`NodeSide::answer_marks`] (`busy`: live pods'
    /// addresses).
    pub fn answer_marks(&mut self, node: &IpamNode, busy: &AddrSet, now: SystemTime) {
        self.side
            .answer_marks(node, busy, now, &mut Answers::default());
    }

    /// Answers block release marks by [`NodeSide::answer_blocks`] (`busy`: live pods'
    /// addresses).
    pub fn answer_blocks(&mut self, blocks: &[BlockView], busy: &AddrSet, now: SystemTime) {
        self.side
            .answer_blocks(blocks, busy, now, &mut Answers::default());
    }

    /// Ends the cooldowns of addresses no longer in the node's `pool` (a change to save).
    /// One whose time has come needs no save of its own: it is over already, and goes
    /// with the next save ([`NodeState::snapshot`]). Returns whether any ended.
    pub fn forget_outside(&mut self, pool: &AddrSet) -> bool {
        self.side.forget_outside(pool)
    }

    /// A reboot killed every pod of an earlier boot: frees every allocation made under
    /// another boot ID by [`NodeSide::expire_boot`]. Returns what it freed.
    /// [`super::StateDir::load`] calls it.
    pub fn expire_boot(&mut self, now: SystemTime) -> Vec<(AllocKey, Allocation)> {
        let dead: Vec<(AllocKey, Allocation)> = self
            .allocations()
            .filter(|(_, a)| a.boot_id != self.boot_id)
            .map(|(k, a)| (k.clone(), a))
            .collect();
        let own = &self.own;
        let boot = &self.boot_id;
        self.side
            .expire_boot(|k| own.get(k).is_some_and(|o| o.boot_id != *boot), now);
        self.forget_freed();
        dead
    }

    /// The node side's fields as published (`status.used` names each entry's pod).
    pub fn node_side(&self) -> NodeSideFields {
        self.side.published(|k| {
            self.own.get(k).map_or_else(
                || PodName::new("", ""),
                |o| PodName::new(&o.namespace, &o.name),
            )
        })
    }

    /// The pool of each address allocated with one recorded (`status.used[addr].pool`).
    pub fn pools(&self) -> AddrPools {
        let recorded = self.own.values().flat_map(|o| o.pools.iter());
        recorded.map(|(a, p)| (*a, p.clone())).collect()
    }

    /// A copy to save, this state marked clean: a change from now on is in the next copy.
    /// If saving the copy fails, its changes are still to be saved: the caller keeps track.
    /// What ended by `now` and waited for a save goes with it ([`NodeSide::tidy`]).
    pub fn snapshot(&mut self, now: SystemTime) -> NodeState {
        self.side.tidy(now);
        let copy = self.clone();
        self.side.mark_clean();
        copy
    }

    /// Writes the checkpoint durably: temp file, write, fsync, rename over the checkpoint,
    /// fsync of `dir`. The state is clean once it returned `Ok`; reply or publish only then.
    pub fn save(&mut self, fs: &dyn Fs, dir: &Path) -> Result<()> {
        super::checkpoint::save(fs, dir, self)?;
        self.side.mark_clean();
        Ok(())
    }
}

/// The families `node`'s pool has addresses of (an ADD takes one address of each).
pub fn pool_families(node: &IpamNode) -> Vec<Family> {
    Family::ALL
        .into_iter()
        .filter(|f| node.operator.addresses.len(*f) > 0)
        .collect()
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
