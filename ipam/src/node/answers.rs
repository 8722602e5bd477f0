//! The node side's answers to the operator, as [`NodeSide`] methods: tombstones (the
//! `live` answer included), address release marks, block release marks, and the tidying
//! of what ended (cooldowns, settled answers) when the record is written anyway.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::SystemTime;

use super::side::{Key, NodeSide, ReclaimAnswer};
use super::{Answers, BlockView};
use crate::addrs::AddrSet;
use crate::types::{
    AllocationId, Family, IpamNode, PodUid, ReclaimOutcome, ReleaseAck, ReleaseState, Tombstone,
};

/// Whether `ack` answers `t` (the same allocation of the same pod).
fn answers<K: Key>(ack: &ReclaimAnswer<K>, t: &Tombstone) -> bool {
    ack.pod_uid == t.pod_uid && ack.key.id() == t.allocation
}

impl<K: Key> NodeSide<K> {
    /// Answers the operator's tombstones (`spec.reclaim`) by
    /// [`NodeSide::tombstone_outcome`]: `reclaimed` frees the address into cooldown. An
    /// answered tombstone is not answered again. Once its tombstone is gone (or replaced),
    /// a `live` answer goes at once: the operator waits for that before it tombstones the
    /// allocation again. A `reclaimed` or `stale` one goes with the node side's next
    /// write ([`NodeSide::tidy`]): the operator reads an answer only beside its tombstone,
    /// and a write of its own per reclaim would be one more status write per pod.
    /// `key_of` gives the key a tombstone's allocation names (`None`: not known yet,
    /// answered later). Returns what was reclaimed (pod UID, address).
    pub fn answer_tombstones(
        &mut self,
        reclaim: &BTreeMap<IpAddr, Tombstone>,
        key_of: impl Fn(AllocationId) -> Option<K>,
        live: impl Fn(PodUid) -> bool,
        now: SystemTime,
    ) -> Vec<(PodUid, IpAddr)> {
        let mut reclaimed = Vec::new();
        for (addr, t) in reclaim {
            let answered = self.reclaim_ack.get(addr).is_some_and(|a| answers(a, t));
            if answered && !self.settled.contains(addr) {
                continue;
            }
            let Some(key) = key_of(t.allocation) else {
                continue;
            };
            let outcome = self.tombstone_outcome(addr, t.pod_uid, &key, &live);
            if outcome == ReclaimOutcome::Reclaimed {
                self.take_address(*addr, now);
                reclaimed.push((t.pod_uid, *addr));
            }
            // a new answer, or one for another pod replaced: a change either way
            let answer = ReclaimAnswer {
                pod_uid: t.pod_uid,
                key,
                outcome,
            };
            self.reclaim_ack.insert(*addr, answer);
            self.settled.remove(addr);
            self.dirty = true;
        }
        self.settle_answers(reclaim);
        reclaimed
    }

    /// The answers whose tombstone is gone: `live` ones dropped, the others settled.
    fn settle_answers(&mut self, reclaim: &BTreeMap<IpAddr, Tombstone>) {
        let gone: Vec<(IpAddr, bool)> = (self.reclaim_ack.iter())
            .filter(|(a, ack)| !reclaim.get(a).is_some_and(|t| answers(ack, t)))
            .map(|(a, ack)| (*a, ack.outcome == ReclaimOutcome::Live))
            .collect();
        for (addr, live) in gone {
            if live {
                self.reclaim_ack.remove(&addr);
                self.dirty = true;
            } else {
                self.settled.insert(addr);
            }
        }
    }

    /// The answer to a tombstone on `addr` naming allocation `key` of pod `pod_uid`;
    /// `live(uid)`: whether the node side sees a pod of that UID on its node, not
    /// Succeeded or Failed.
    /// - `stale`: the entry is not that exact allocation (pod UID, key);
    /// - `live`: it is, its pod is live, and the entry is the pod's newest allocation in the
    ///   address's family: the pod's running sandbox (the operator saw the pod gone through
    ///   a lagging watch). Nothing is freed;
    /// - `reclaimed`: it is, and its pod is gone or terminal, or a newer allocation of the
    ///   pod in the family replaced it (a replaced sandbox).
    pub fn tombstone_outcome(
        &self,
        addr: &IpAddr,
        pod_uid: PodUid,
        key: &K,
        live: impl Fn(PodUid) -> bool,
    ) -> ReclaimOutcome {
        let exact = |h: &&super::Held<K>| h.pod_uid == pod_uid && h.key == *key;
        let Some(held) = self.used.get(addr).filter(exact) else {
            return ReclaimOutcome::Stale;
        };
        let family = Family::of(addr);
        let newer = self.used.iter().any(|(a, h)| {
            Family::of(&a) == family
                && h.pod_uid == pod_uid
                && h.key != *key
                && h.since > held.since
        });
        if live(pod_uid) && !newer {
            ReclaimOutcome::Live
        } else {
            ReclaimOutcome::Reclaimed
        }
    }

    /// Address-level release marks (`node`'s `spec.release`): `do-not-release` while the
    /// address is used, cooling down at `now` or in `busy` (live pods' addresses the
    /// record does not hold), else `ready-for-release` — and then it is never used again
    /// unless the mark is withdrawn. Answered once; an answer goes once the mark is
    /// withdrawn or the address released. The addresses given up or taken back go to `out`.
    pub fn answer_marks(
        &mut self,
        node: &IpamNode,
        busy: &AddrSet,
        now: SystemTime,
        out: &mut Answers,
    ) {
        let op = &node.operator;
        let marked = op
            .release
            .keys_where(|s| *s == ReleaseState::MarkedForRelease);
        let mut new = marked.clone();
        new.subtract(&self.release_ack.keys());
        if !new.is_empty() {
            let busy = self.busy_set(busy, now).intersection(&new);
            let mut ready = new;
            ready.subtract(&busy);
            self.release_ack.insert_set(&busy, ReleaseAck::DoNotRelease);
            self.release_ack
                .insert_set(&ready, ReleaseAck::ReadyForRelease);
            out.ready.union_with(&ready);
            self.dirty = true;
        }
        // answers whose mark is gone go; a withdrawn ready-for-release is ours again
        let mut stale = self.release_ack.keys();
        stale.subtract(&marked);
        if !stale.is_empty() {
            let resumed = self
                .release_ack
                .keys_where(|a| *a == ReleaseAck::ReadyForRelease)
                .intersection(&stale)
                .intersection(&op.addresses);
            out.resumed.union_with(&resumed);
            self.release_ack.remove_set(&stale);
            self.dirty = true;
        }
    }

    /// Answers the release marks on the node's `blocks` (cluster-pool): `do-not-release`
    /// while any address of the block is used, cooling down or in `busy`, else
    /// `ready-for-release` (and then none is used again unless the mark is withdrawn) — a
    /// `do-not-release` turns into `ready-for-release` once the block is free (a drained
    /// block waits marked until then); an answer goes once its mark is withdrawn, and with
    /// its block. Records the answers and returns those to write (block name, new
    /// answer); the addresses given up or taken back go to `out`.
    pub fn answer_blocks(
        &mut self,
        blocks: &[BlockView],
        busy: &AddrSet,
        now: SystemTime,
        out: &mut Answers,
    ) -> Vec<(std::sync::Arc<str>, Option<ReleaseAck>)> {
        let mut writes = Vec::new();
        for b in blocks {
            match (b.release, b.ack) {
                // unanswered, or answered do-not-release and free since
                (true, None) | (true, Some(ReleaseAck::DoNotRelease))
                    if !self.any_busy(&b.addrs, busy, now) =>
                {
                    out.ready.union_with(&b.all);
                    writes.push((b.name.clone(), Some(ReleaseAck::ReadyForRelease)));
                }
                (true, None) => writes.push((b.name.clone(), Some(ReleaseAck::DoNotRelease))),
                (false, Some(ack)) => {
                    if ack == ReleaseAck::ReadyForRelease {
                        out.resumed.union_with(&b.all);
                    }
                    writes.push((b.name.clone(), None));
                }
                _ => {}
            }
        }
        for (name, ack) in &writes {
            let old = match ack {
                Some(a) => self.block_ack.insert(name.to_string(), *a),
                None => self.block_ack.remove(&**name),
            };
            self.dirty |= old != *ack;
        }
        // a block that went (released and deleted) takes its answer with it
        let before = self.block_ack.len();
        self.block_ack
            .retain(|name, _| blocks.iter().any(|b| &*b.name == name.as_str()));
        self.dirty |= self.block_ack.len() != before;
        writes
    }

    /// Every address used, cooling down at `now` (a cooldown that ended counts for
    /// nothing, whether or not [`NodeSide::tidy`] has dropped it yet), or in
    /// `busy`.
    fn busy_set(&self, busy: &AddrSet, now: SystemTime) -> AddrSet {
        let cooling = self.cooldown.iter().filter(|(_, until)| **until > now);
        let mut set: AddrSet = self.used.keys().chain(cooling.map(|(a, _)| *a)).collect();
        set.union_with(busy);
        set
    }

    /// Whether any address of `addrs` is used, cooling down at `now`, or in `busy`.
    fn any_busy(&self, addrs: &AddrSet, busy: &AddrSet, now: SystemTime) -> bool {
        let cooling = self.cooldown.iter().filter(|(_, until)| **until > now);
        self.used
            .keys()
            .chain(cooling.map(|(a, _)| *a))
            .any(|a| addrs.contains(&a))
            || (!busy.is_empty() && !busy.intersection(addrs).is_empty())
    }

    /// When the record is to be written anyway (dirty), drops what needs no write of its
    /// own: the cooldowns ended at `now` and the settled tombstone answers. An ended
    /// cooldown is over for everyone whether or not it is dropped: the node side's own
    /// checks and the operator compare its end with their clock. So a pod's start and its
    /// end (a DEL, or a tombstone's answer) are its two status writes; the end of its
    /// address's cooldown and its answer's going ride along with a later one. Returns
    /// whether it dropped anything.
    pub fn tidy(&mut self, now: SystemTime) -> bool {
        if !self.dirty {
            return false;
        }
        let before = self.cooldown.len() + self.reclaim_ack.len();
        self.cooldown.retain(|_, until| *until > now);
        for addr in std::mem::take(&mut self.settled) {
            self.reclaim_ack.remove(&addr);
        }
        self.cooldown.len() + self.reclaim_ack.len() != before
    }

    /// Forgets the cooldowns of addresses no longer in the node's `pool`: a cooldown
    /// protects a reuse that can no longer happen here. Returns whether any ended.
    pub fn forget_outside(&mut self, pool: &AddrSet) -> bool {
        let before = self.cooldown.len();
        self.cooldown.retain(|a, _| pool.contains(a));
        let changed = self.cooldown.len() != before;
        self.dirty |= changed;
        changed
    }
}
