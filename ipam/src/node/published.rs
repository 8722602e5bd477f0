//! [`NodeSide`] as the IPAMNode's node-side fields carry it (`status.used`, `.cooldown`,
//! `.releaseAck`, `.reclaimAck`), and back (the simulator's node side lives in its store's
//! objects, keyed by the 64-bit [`AllocationId`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use super::side::{Held, Key, NodeSide, ReclaimAnswer};
use crate::types::{AllocationId, NodeSideFields, PodName, ReclaimAck, UsedEntry};

impl<K: Key> NodeSide<K> {
    /// The record as the node-side fields publish it; `names(key)` gives the namespace and
    /// name of the pod holding `key` (not kept here).
    pub fn published(&self, names: impl Fn(&K) -> PodName) -> NodeSideFields {
        let mut side = NodeSideFields::default();
        self.publish_into(names, &mut side);
        side
    }

    /// [`NodeSide::published`] written over `side` in place: only the span of its `used`
    /// that changed is rewritten (the entries around it keep their names), its maps'
    /// storage is reused.
    pub fn publish_into(&self, names: impl Fn(&K) -> PodName, side: &mut NodeSideFields) {
        let same = |e: &UsedEntry, h: &Held<K>| {
            e.pod_uid == h.pod_uid && e.allocation == h.key.id() && e.since == h.since
        };
        let entry = |h: &Held<K>| UsedEntry {
            pod_uid: h.pod_uid,
            pod: names(&h.key),
            allocation: h.key.id(),
            since: h.since,
        };
        side.used.update_from(&self.used, same, entry);
        side.cooldown.clone_from(&self.cooldown);
        side.release_ack.clone_from(&self.release_ack);
        side.reclaim_ack = self
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
    }
}

impl NodeSide<AllocationId> {
    /// The record the node-side fields `side` publish, clean (nothing to write yet).
    pub fn from_published(side: &NodeSideFields, reuse_cooldown: Duration) -> Self {
        let mut ns = Self::with_used(side, reuse_cooldown);
        ns.cooldown.clone_from(&side.cooldown);
        ns.release_ack.clone_from(&side.release_ack);
        ns.reclaim_ack = reclaim_answers(side);
        ns
    }

    /// [`NodeSide::from_published`] taking the maps out of `side` instead of copying them
    /// (`used` is copied); [`NodeSide::return_published`] gives them back.
    pub fn take_published(side: &mut NodeSideFields, reuse_cooldown: Duration) -> Self {
        let mut ns = Self::with_used(side, reuse_cooldown);
        ns.cooldown = std::mem::take(&mut side.cooldown);
        ns.release_ack = std::mem::take(&mut side.release_ack);
        ns.reclaim_ack = reclaim_answers(side);
        ns
    }

    /// Writes the record back into the `side` it was taken from: the maps go back, `used`
    /// and the reclaim answers are rewritten if anything changed.
    pub fn return_published(
        mut self,
        names: impl Fn(&AllocationId) -> PodName,
        side: &mut NodeSideFields,
    ) {
        if self.dirty {
            self.publish_into(names, side);
        }
        side.cooldown = std::mem::take(&mut self.cooldown);
        side.release_ack = std::mem::take(&mut self.release_ack);
    }

    fn with_used(side: &NodeSideFields, reuse_cooldown: Duration) -> Self {
        let held = |e: &UsedEntry| Held {
            pod_uid: e.pod_uid,
            key: e.allocation,
            since: e.since,
            network: None,
        };
        NodeSide {
            used: side.used.map(held),
            ..NodeSide::new(reuse_cooldown)
        }
    }
}

fn reclaim_answers(side: &NodeSideFields) -> BTreeMap<IpAddr, ReclaimAnswer<AllocationId>> {
    side.reclaim_ack
        .iter()
        .map(|(addr, a)| {
            let answer = ReclaimAnswer {
                pod_uid: a.pod_uid,
                key: a.allocation,
                outcome: a.outcome,
            };
            (*addr, answer)
        })
        .collect()
}
