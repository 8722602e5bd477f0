//! The node side's rules (DESIGN.md "Resources", the node side's promises), run both by the
//! simulated world and by the node agent: allocate to pods from the node's pool and answer
//! the operator's release marks and tombstones. Pure functions over the node's resource;
//! the caller writes what they change.
//!
//! - [`add`] allocates from the pool (the node's blocks, see [`project`], or `spec.addresses`
//!   for cloud sources), never an address used, cooling down, marked or released; an ADD
//!   is keyed by its [`AllocationId`] (containerID, ifname), so a repeated ADD returns the
//!   addresses it got the first time;
//! - [`del`] frees only the exact allocation: idempotent, and a stale DEL (another
//!   container ID) frees nothing (kuryr's rule; Calico #1406, Cilium #10065);
//! - [`reconcile`] answers tombstones (`reclaimed` only for the exact allocation, and
//!   `live` for the running sandbox of a pod the node side sees: [`tombstone_outcome`]),
//!   address marks, and ends cooldowns; [`answer_blocks`] answers block marks (cluster-pool).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::addrs::{AddrSet, address};
use crate::types::{
    AllocationId, Family, IpamNode, NodeSideFields, PodUid, ReclaimAck, ReclaimOutcome, ReleaseAck,
    ReleaseState, UsedEntry, UsedMap,
};

/// What a reconcile changed that the observer must know.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Answers {
    /// Addresses answered ready-for-release: the node will not use them again.
    pub ready: AddrSet,
    /// Addresses whose ready-for-release was withdrawn by the operator: usable again.
    pub resumed: AddrSet,
    /// Entries removed by a tombstone (pod UID, address).
    pub reclaimed: Vec<(PodUid, IpAddr)>,
    /// Whether the node-side fields changed (a write is due).
    pub changed: bool,
}

/// Answers the operator: tombstones, release marks, stale acks, expired cooldowns.
/// `live(uid)`: whether the node side sees a pod of that UID on its node, not Succeeded or
/// Failed (see [`tombstone_outcome`]).
pub fn reconcile(
    node: &IpamNode,
    side: &mut NodeSideFields,
    now: SystemTime,
    reuse_cooldown: Duration,
    live: &impl Fn(PodUid) -> bool,
) -> Answers {
    let mut out = answer_tombstones(node, side, now, reuse_cooldown, live);
    answer_marks(node, side, now, &mut out);
    out.changed |= expire_cooldowns(node, side, now);
    out
}

/// The answer to a tombstone on `addr` naming allocation `allocation` of pod `pod_uid`,
/// given the node's `used` entries and `live(uid)`: whether the node side sees a pod of
/// that UID on its node, not Succeeded or Failed.
/// - `stale`: the entry is not that exact allocation (pod UID, containerID, ifname);
/// - `live`: it is, its pod is live, and the entry is the pod's newest allocation in the
///   address's family: the pod's running sandbox (the operator saw the pod gone through a
///   lagging watch). Nothing is freed;
/// - `reclaimed`: it is, and its pod is gone or terminal, or a newer allocation of the pod in
///   the family replaced it (a replaced sandbox).
pub fn tombstone_outcome(
    addr: &IpAddr,
    pod_uid: PodUid,
    allocation: AllocationId,
    used: &UsedMap,
    live: impl Fn(PodUid) -> bool,
) -> ReclaimOutcome {
    let exact = |e: &&UsedEntry| e.pod_uid == pod_uid && e.allocation == allocation;
    let Some(entry) = used.get(addr).filter(exact) else {
        return ReclaimOutcome::Stale;
    };
    if live(entry.pod_uid) && newest_in_family(addr, entry, used) {
        ReclaimOutcome::Live
    } else {
        ReclaimOutcome::Reclaimed
    }
}

/// Whether no other allocation of `entry`'s pod in `addr`'s family was made after it.
fn newest_in_family(addr: &IpAddr, entry: &UsedEntry, used: &UsedMap) -> bool {
    let family = Family::of(addr);
    !used.iter().any(|(a, e)| {
        Family::of(a) == family
            && e.pod_uid == entry.pod_uid
            && e.allocation != entry.allocation
            && e.since > entry.since
    })
}

/// Tombstones answered by [`tombstone_outcome`] (`reclaimed` frees the entry into
/// cooldown); an ack goes once its tombstone is gone.
pub fn answer_tombstones(
    node: &IpamNode,
    side: &mut NodeSideFields,
    now: SystemTime,
    reuse_cooldown: Duration,
    live: &impl Fn(PodUid) -> bool,
) -> Answers {
    let op = &node.operator;
    let mut out = Answers::default();
    for (addr, t) in &op.reclaim {
        if side.reclaim_ack.get(addr).is_some_and(|a| a.answers(t)) {
            continue;
        }
        let outcome = tombstone_outcome(addr, t.pod_uid, t.allocation, &side.used, live);
        if outcome == ReclaimOutcome::Reclaimed {
            side.used.remove(addr);
            side.cooldown.insert(*addr, now + reuse_cooldown);
            out.reclaimed.push((t.pod_uid, *addr));
        }
        // a new answer, or one for another pod replaced: a change either way
        side.reclaim_ack.insert(
            *addr,
            ReclaimAck {
                pod_uid: t.pod_uid,
                allocation: t.allocation,
                outcome,
            },
        );
        out.changed = true;
    }
    let before = side.reclaim_ack.len();
    side.reclaim_ack
        .retain(|a, ack| op.reclaim.get(a).is_some_and(|t| ack.answers(t)));
    out.changed |= side.reclaim_ack.len() != before;
    out
}

/// Address-level release marks (IPAMNode `spec.release`): answered once; an answer goes once
/// the mark is withdrawn or the address released.
fn answer_marks(node: &IpamNode, side: &mut NodeSideFields, now: SystemTime, out: &mut Answers) {
    let op = &node.operator;
    let marked = op
        .release
        .keys_where(|s| *s == ReleaseState::MarkedForRelease);
    let mut new = marked.clone();
    new.subtract(&side.release_ack.keys());
    if !new.is_empty() {
        let busy = busy_set(side, now).intersection(&new);
        let mut ready = new;
        ready.subtract(&busy);
        side.release_ack.insert_set(&busy, ReleaseAck::DoNotRelease);
        side.release_ack
            .insert_set(&ready, ReleaseAck::ReadyForRelease);
        out.ready.union_with(&ready);
        out.changed = true;
    }
    // answers whose mark is gone go; a withdrawn ready-for-release is ours again
    let mut stale = side.release_ack.keys();
    stale.subtract(&marked);
    if !stale.is_empty() {
        let resumed = side
            .release_ack
            .keys_where(|a| *a == ReleaseAck::ReadyForRelease)
            .intersection(&stale)
            .intersection(&op.addresses);
        out.resumed.union_with(&resumed);
        side.release_ack.remove_set(&stale);
        out.changed = true;
    }
}

/// Cooldowns end with their time or when the address leaves the pool. Returns whether any
/// ended.
pub fn expire_cooldowns(node: &IpamNode, side: &mut NodeSideFields, now: SystemTime) -> bool {
    let before = side.cooldown.len();
    side.cooldown
        .retain(|a, until| *until > now && node.operator.addresses.contains(a));
    side.cooldown.len() != before
}

/// Every address used, or cooling down at `now` (a cooldown that ended counts for
/// nothing, whether or not [`expire_cooldowns`] has dropped it yet).
fn busy_set(side: &NodeSideFields, now: SystemTime) -> AddrSet {
    let cooling = side.cooldown.iter().filter(|(_, until)| **until > now);
    side.used
        .keys()
        .copied()
        .chain(cooling.map(|(a, _)| *a))
        .collect()
}

/// Whether any address of `addrs` is used or cooling down at `now`.
fn any_busy(side: &NodeSideFields, addrs: &AddrSet, now: SystemTime) -> bool {
    let cooling = side.cooldown.iter().filter(|(_, until)| **until > now);
    side.used
        .keys()
        .chain(cooling.map(|(a, _)| a))
        .any(|a| addrs.contains(a))
}

/// One of the node's blocks as the node side reads it (cluster-pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockView {
    pub name: std::sync::Arc<str>,
    /// The block's usable addresses.
    pub addrs: AddrSet,
    /// Every address of the block (what the observer tracks).
    pub all: AddrSet,
    pub release: bool,
    pub ack: Option<ReleaseAck>,
}

/// The node as its blocks make it (cluster-pool): its pool is the union of its blocks, and
/// a marked block's addresses count as marked — the form [`add`] and [`free_address`] read.
pub fn project(node: &IpamNode, blocks: &[BlockView]) -> IpamNode {
    let mut view = IpamNode {
        operator: crate::types::OperatorFields {
            reclaim: node.operator.reclaim.clone(),
            ..Default::default()
        },
        node: NodeSideFields::default(),
        ..node.clone()
    };
    for b in blocks {
        Arc::make_mut(&mut view.operator.addresses).union_with(&b.addrs);
        if b.release || b.ack.is_some() {
            view.operator
                .release
                .insert_set(&b.addrs, ReleaseState::MarkedForRelease);
        }
    }
    view
}

/// Answers the release marks on the node's blocks: `do-not-release` while any address of the
/// block is used or cooling down, else `ready-for-release` (and then none is used again
/// unless the mark is withdrawn) — a `do-not-release` turns into `ready-for-release` once
/// the block is free (a drained block waits marked until then); an answer goes once its
/// mark is withdrawn. Returns the answers to write (block name, new answer) and, in `out`,
/// the addresses given up or taken back.
pub fn answer_blocks(
    side: &NodeSideFields,
    blocks: &[BlockView],
    now: SystemTime,
    out: &mut Answers,
) -> Vec<(std::sync::Arc<str>, Option<ReleaseAck>)> {
    let mut writes = Vec::new();
    for b in blocks {
        match (b.release, b.ack) {
            // unanswered, or answered do-not-release and free since
            (true, None) | (true, Some(ReleaseAck::DoNotRelease))
                if !any_busy(side, &b.addrs, now) =>
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
    writes
}

/// A free address of one family: in the pool, not used, not cooling down, not marked or
/// released, not promised away; the lowest one. Marks and answers are skipped a run at a
/// time, used and cooling addresses one at a time (a full node tries ~100 addresses
/// before a free one).
pub fn free_address(node: &IpamNode, side: &NodeSideFields, family: Family) -> Option<IpAddr> {
    let mut skip = node.operator.release.keys().of_family(family);
    skip.union_with(&side.release_ack.keys());
    for run in node.operator.addresses.runs_of(family) {
        let mut n = *run.start();
        while n <= *run.end() {
            if let Some(r) = skip.run_at(family, n) {
                n = r.end().checked_add(1)?;
                continue;
            }
            let a = address(family, n);
            if !side.used.contains_key(&a) && !side.cooldown.contains_key(&a) {
                return Some(a);
            }
            n = n.checked_add(1)?;
        }
    }
    None
}

/// CNI ADD: one address per family, all or none. Returns the addresses taken; a repeated
/// ADD of the same allocation (same pod UID, containerID and ifname: a runtime retrying
/// after a lost reply) returns the addresses it holds already and takes nothing new.
pub fn add(
    node: &IpamNode,
    side: &mut NodeSideFields,
    families: &[Family],
    entry: UsedEntry,
) -> Option<Vec<IpAddr>> {
    let held = allocated(side, families, entry.pod_uid, entry.allocation);
    if !held.is_empty() {
        return Some(held);
    }
    let mut addrs = Vec::with_capacity(families.len());
    for &f in families {
        addrs.push(free_address(node, side, f)?);
    }
    for a in &addrs {
        side.used.insert(*a, entry.clone());
    }
    Some(addrs)
}

/// The addresses `allocation` of `pod` holds (at most one per family).
pub fn allocated(
    side: &NodeSideFields,
    families: &[Family],
    pod: PodUid,
    allocation: AllocationId,
) -> Vec<IpAddr> {
    // an ADD records one address per family: the search ends when it found them all
    side.used
        .iter()
        .filter(|(_, e)| e.pod_uid == pod && e.allocation == allocation)
        .map(|(a, _)| *a)
        .take(families.len())
        .collect()
}

/// CNI DEL: frees only the exact allocation — idempotent, and a DEL whose containerID (or
/// ifname) differs from the recorded ADD frees nothing (kuryr's rule). Freed addresses cool
/// down before reuse. Returns the freed addresses.
pub fn del(
    side: &mut NodeSideFields,
    families: &[Family],
    pod: PodUid,
    allocation: AllocationId,
    now: SystemTime,
    reuse_cooldown: Duration,
) -> Vec<IpAddr> {
    let freed = allocated(side, families, pod, allocation);
    for a in &freed {
        side.used.remove(a);
        side.cooldown.insert(*a, now + reuse_cooldown);
    }
    freed
}

/// The earliest cooldown end (when the node side must look again).
pub fn next_cooldown_end(side: &NodeSideFields) -> Option<SystemTime> {
    side.cooldown.values().min().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::NodeUid;
    use crate::types::ReclaimReason;
    use crate::types::Tombstone;

    fn alloc(cid: u64) -> AllocationId {
        AllocationId::new(&format!("{cid:064x}"), "eth0")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn set(addrs: &[&str]) -> AddrSet {
        addrs.iter().map(|a| ip(a)).collect()
    }

    fn entry(uid: u128, cid: u64) -> UsedEntry {
        UsedEntry {
            pod_uid: PodUid(uid),
            namespace: "ns".into(),
            pod: "p".into(),
            allocation: alloc(cid),
            since: SystemTime::UNIX_EPOCH,
        }
    }

    fn node_with(addrs: &[&str]) -> IpamNode {
        let mut n = IpamNode::new("n".into(), NodeUid(1));
        n.operator.addresses = Arc::new(addrs.iter().map(|a| ip(a)).collect());
        n
    }

    const CD: Duration = Duration::from_secs(30);

    #[test]
    fn add_is_all_or_none_and_del_checks_the_container() {
        let n = node_with(&["10.0.0.1", "fd00::1"]);
        let mut side = NodeSideFields::default();
        let t = SystemTime::UNIX_EPOCH;
        let got = add(&n, &mut side, &[Family::V4, Family::V6], entry(1, 7)).unwrap();
        assert_eq!(got, vec![ip("10.0.0.1"), ip("fd00::1")]);
        assert!(add(&n, &mut side, &[Family::V4], entry(2, 1)).is_none());
        let both = [Family::V4, Family::V6];
        assert!(
            del(&mut side, &both, PodUid(1), alloc(8), t, CD).is_empty(),
            "stale DEL ignored"
        );
        assert_eq!(del(&mut side, &both, PodUid(1), alloc(7), t, CD).len(), 2);
        assert!(
            del(&mut side, &both, PodUid(1), alloc(7), t, CD).is_empty(),
            "DEL is idempotent"
        );
        // cooling down: not reusable yet
        assert!(add(&n, &mut side, &[Family::V4], entry(2, 1)).is_none());
        reconcile(&n, &mut side, t + CD, CD, &|_| false);
        assert!(add(&n, &mut side, &[Family::V4], entry(2, 1)).is_some());
    }

    #[test]
    fn release_marks_are_answered_and_honoured() {
        let mut n = node_with(&["10.0.0.1", "10.0.0.2"]);
        let mut side = NodeSideFields::default();
        let t = SystemTime::UNIX_EPOCH;
        add(&n, &mut side, &[Family::V4], entry(1, 1)).unwrap();
        n.operator
            .release
            .insert(ip("10.0.0.1"), ReleaseState::MarkedForRelease);
        n.operator
            .release
            .insert(ip("10.0.0.2"), ReleaseState::MarkedForRelease);
        let a = reconcile(&n, &mut side, t, CD, &|_| false);
        assert_eq!(a.ready, set(&["10.0.0.2"]));
        assert_eq!(
            side.release_ack.get(&ip("10.0.0.1")),
            Some(&ReleaseAck::DoNotRelease)
        );
        // never used again while marked
        assert!(add(&n, &mut side, &[Family::V4], entry(2, 1)).is_none());
        // a mark on an address whose cooldown ends now: ready (the cooldown counts for
        // nothing from its end, whether or not it was expired yet)
        n.operator
            .release
            .insert(ip("10.0.0.3"), ReleaseState::MarkedForRelease);
        Arc::make_mut(&mut n.operator.addresses).insert(ip("10.0.0.3"));
        side.cooldown.insert(ip("10.0.0.3"), t);
        let mut out = Answers::default();
        answer_marks(&n, &mut side, t, &mut out);
        assert_eq!(out.ready, set(&["10.0.0.3"]));
        n.operator.release.remove(&ip("10.0.0.3"));
        Arc::make_mut(&mut n.operator.addresses).remove(&ip("10.0.0.3"));
        reconcile(&n, &mut side, t, CD, &|_| false);
        assert!(!side.cooldown.contains_key(&ip("10.0.0.3")));
        // withdrawn: usable again, and the answer goes
        n.operator.release.remove(&ip("10.0.0.2"));
        let a = reconcile(&n, &mut side, t, CD, &|_| false);
        assert_eq!(a.resumed, set(&["10.0.0.2"]));
        assert!(!side.release_ack.contains_key(&ip("10.0.0.2")));
        assert!(add(&n, &mut side, &[Family::V4], entry(2, 1)).is_some());
        // released: the answer goes, the address is no longer in the pool
        n.operator
            .release
            .insert(ip("10.0.0.1"), ReleaseState::Released);
        Arc::make_mut(&mut n.operator.addresses).remove(&ip("10.0.0.1"));
        reconcile(&n, &mut side, t, CD, &|_| false);
        assert!(side.release_ack.is_empty());
    }

    /// A marked block is answered do-not-release while an address of it is used or cooling
    /// down, and ready-for-release from the moment the last cooldown ends, even before
    /// `expire_cooldowns` dropped it (the world answers blocks before it writes the node).
    #[test]
    fn a_block_is_ready_once_its_cooldowns_end() {
        let block = |ack| BlockView {
            name: "b".into(),
            addrs: set(&["10.0.0.1", "10.0.0.2"]),
            all: AddrSet::of_net(&"10.0.0.0/30".parse().unwrap()),
            release: true,
            ack,
        };
        let mut side = NodeSideFields::default();
        let t = SystemTime::UNIX_EPOCH;
        side.cooldown.insert(ip("10.0.0.2"), t + CD);
        let mut out = Answers::default();
        let w = answer_blocks(&side, &[block(None)], t + CD / 2, &mut out);
        assert_eq!(w, vec![("b".into(), Some(ReleaseAck::DoNotRelease))]);
        assert!(out.ready.is_empty());
        let dnr = Some(ReleaseAck::DoNotRelease);
        let w = answer_blocks(&side, &[block(dnr)], t + CD, &mut out);
        assert_eq!(w, vec![("b".into(), Some(ReleaseAck::ReadyForRelease))]);
        assert_eq!(out.ready, block(None).all);
        // a used address keeps it whatever the time
        side.used.insert(ip("10.0.0.1"), entry(1, 1));
        let mut out = Answers::default();
        assert!(answer_blocks(&side, &[block(dnr)], t + CD * 9, &mut out).is_empty());
        assert!(out.ready.is_empty());
    }

    /// `changed` says exactly whether the node-side fields changed (the world writes only
    /// then, so a missed change would be lost and a false one would bump the version).
    #[test]
    fn answers_say_whether_anything_changed() {
        let mut n = node_with(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        let mut side = NodeSideFields::default();
        let t = SystemTime::UNIX_EPOCH;
        let check = |n: &IpamNode, side: &mut NodeSideFields, now| {
            let before = side.clone();
            let a = reconcile(n, side, now, CD, &|_| false);
            assert_eq!(a.changed, before != *side, "{before:?} -> {side:?}");
        };
        check(&n, &mut side, t);
        add(&n, &mut side, &[Family::V4], entry(1, 1)).unwrap();
        add(&n, &mut side, &[Family::V4], entry(2, 1)).unwrap();
        check(&n, &mut side, t);
        // a tombstone: reclaimed, then acked again (nothing), then its ack goes
        let tomb = |uid| Tombstone {
            pod_uid: PodUid(uid),
            allocation: alloc(1),
            reason: ReclaimReason::PodDeleted,
        };
        n.operator.reclaim.insert(ip("10.0.0.1"), tomb(1));
        check(&n, &mut side, t);
        check(&n, &mut side, t);
        // an ack for another pod replaced in place (same count)
        n.operator.reclaim.insert(ip("10.0.0.1"), tomb(5));
        check(&n, &mut side, t);
        n.operator.reclaim.clear();
        check(&n, &mut side, t);
        // marks: answered, answered already, withdrawn
        n.operator
            .release
            .insert(ip("10.0.0.3"), ReleaseState::MarkedForRelease);
        check(&n, &mut side, t);
        check(&n, &mut side, t);
        n.operator.release = Default::default();
        check(&n, &mut side, t);
        // cooldowns: still running, then over
        check(&n, &mut side, t + CD / 2);
        check(&n, &mut side, t + CD);
        check(&n, &mut side, t + CD);
        let before = side.clone();
        assert!(!expire_cooldowns(&n, &mut side, t + CD));
        assert_eq!(before, side);
    }

    #[test]
    fn tombstones_are_reclaimed_or_stale() {
        let mut n = node_with(&["10.0.0.1", "10.0.0.2"]);
        let mut side = NodeSideFields::default();
        let t = SystemTime::UNIX_EPOCH;
        add(&n, &mut side, &[Family::V4], entry(1, 1)).unwrap();
        add(&n, &mut side, &[Family::V4], entry(2, 1)).unwrap();
        let tomb = |uid| Tombstone {
            pod_uid: PodUid(uid),
            allocation: alloc(1),
            reason: ReclaimReason::PodDeleted,
        };
        n.operator.reclaim.insert(ip("10.0.0.1"), tomb(1));
        // the entry of 10.0.0.2 changed owner: its tombstone names pod 9
        n.operator.reclaim.insert(ip("10.0.0.2"), tomb(9));
        let a = reconcile(&n, &mut side, t, CD, &|_| false);
        assert_eq!(a.reclaimed, vec![(PodUid(1), ip("10.0.0.1"))]);
        assert_eq!(
            side.reclaim_ack[&ip("10.0.0.1")].outcome,
            ReclaimOutcome::Reclaimed
        );
        assert_eq!(
            side.reclaim_ack[&ip("10.0.0.2")].outcome,
            ReclaimOutcome::Stale
        );
        assert_eq!(
            side.used[&ip("10.0.0.2")].pod_uid,
            PodUid(2),
            "nothing lost"
        );
        assert!(side.cooldown.contains_key(&ip("10.0.0.1")));
        // acks go once the tombstones do
        n.operator.reclaim.clear();
        reconcile(&n, &mut side, t, CD, &|_| false);
        assert!(side.reclaim_ack.is_empty());
    }

    /// Issue 25: a tombstone on the running sandbox of a pod the node side sees live (the
    /// operator's pod watch lagged) is answered `live` and frees nothing; once the pod has
    /// a newer sandbox, or is terminal or gone, the same tombstone is reclaimed.
    #[test]
    fn a_live_pods_newest_allocation_is_answered_live() {
        let mut n = node_with(&["10.0.0.1", "10.0.0.2", "fd00::1"]);
        let mut side = NodeSideFields::default();
        let t = SystemTime::UNIX_EPOCH;
        let both = [Family::V4, Family::V6];
        add(&n, &mut side, &both, entry(1, 1)).unwrap();
        let tomb = Tombstone {
            pod_uid: PodUid(1),
            allocation: alloc(1),
            reason: ReclaimReason::PodDeleted,
        };
        n.operator.reclaim.insert(ip("10.0.0.1"), tomb);
        let live_1 = |uid: PodUid| uid == PodUid(1);
        let a = reconcile(&n, &mut side, t, CD, &live_1);
        assert!(a.reclaimed.is_empty() && a.changed);
        assert_eq!(
            side.reclaim_ack[&ip("10.0.0.1")].outcome,
            ReclaimOutcome::Live
        );
        assert_eq!(side.used[&ip("10.0.0.1")].allocation, alloc(1), "kept");
        assert!(side.cooldown.is_empty());
        // a newer sandbox of the pod in the same family: the old one is reclaimed
        let mut newer = entry(1, 2);
        newer.since = t + Duration::from_secs(5);
        side.used.insert(ip("10.0.0.2"), newer);
        assert_eq!(
            tombstone_outcome(&ip("10.0.0.1"), PodUid(1), alloc(1), &side.used, live_1),
            ReclaimOutcome::Reclaimed
        );
        // a newer allocation in the other family only: still live
        let mut v6 = entry(1, 3);
        v6.since = t + Duration::from_secs(9);
        side.used.remove(&ip("10.0.0.2"));
        side.used.insert(ip("fd00::1"), v6);
        assert_eq!(
            tombstone_outcome(&ip("10.0.0.1"), PodUid(1), alloc(1), &side.used, live_1),
            ReclaimOutcome::Live
        );
        // the pod not seen live (gone or terminal): reclaimed
        assert_eq!(
            tombstone_outcome(&ip("10.0.0.1"), PodUid(1), alloc(1), &side.used, |_| false),
            ReclaimOutcome::Reclaimed
        );
    }

    /// Issue 10's crash loop: a pod's first sandbox is tombstoned (it was replaced), its
    /// late DEL frees the address, and a later sandbox of the same pod gets the same address
    /// back; the tombstone, still meant for the first sandbox, must then be answered
    /// `stale` and free nothing. With tombstones that named only the pod UID, the live
    /// sandbox's address was freed.
    #[test]
    fn a_late_tombstone_never_frees_a_later_sandbox_of_the_same_pod() {
        let mut n = node_with(&["10.0.0.1"]);
        let mut side = NodeSideFields::default();
        let t = SystemTime::UNIX_EPOCH;
        let v4 = [Family::V4];
        assert_eq!(
            add(&n, &mut side, &v4, entry(1, 1)).unwrap(),
            vec![ip("10.0.0.1")]
        );
        // the operator tombstones sandbox 1's entry ...
        let tomb = Tombstone {
            pod_uid: PodUid(1),
            allocation: alloc(1),
            reason: ReclaimReason::SandboxReplaced,
        };
        // ... but sandbox 1's DEL arrives first, and after the cooldown sandbox 3 gets the
        // same address back
        assert_eq!(del(&mut side, &v4, PodUid(1), alloc(1), t, CD).len(), 1);
        reconcile(&n, &mut side, t + CD, CD, &|_| false);
        assert_eq!(
            add(&n, &mut side, &v4, entry(1, 3)).unwrap(),
            vec![ip("10.0.0.1")]
        );
        n.operator.reclaim.insert(ip("10.0.0.1"), tomb);
        let a = reconcile(&n, &mut side, t + CD, CD, &|_| false);
        assert!(a.reclaimed.is_empty(), "{a:?}");
        assert_eq!(
            side.reclaim_ack[&ip("10.0.0.1")].outcome,
            ReclaimOutcome::Stale
        );
        assert_eq!(
            side.used[&ip("10.0.0.1")].allocation,
            alloc(3),
            "the live sandbox keeps it"
        );
    }

    /// A repeated ADD of one allocation returns what it holds; another ifname of the same
    /// container is another allocation; a DEL frees only its own.
    #[test]
    fn allocations_are_keyed_by_container_and_ifname() {
        let n = node_with(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        let mut side = NodeSideFields::default();
        let t = SystemTime::UNIX_EPOCH;
        let v4 = [Family::V4];
        let eth0 = AllocationId::new("c1", "eth0");
        let net1 = AllocationId::new("c1", "net1");
        assert_ne!(eth0, net1);
        assert_ne!(
            AllocationId::new("c1e", "th0"),
            eth0,
            "the separator keeps fields apart"
        );
        let e = |allocation| UsedEntry {
            allocation,
            ..entry(1, 0)
        };
        let first = add(&n, &mut side, &v4, e(eth0)).unwrap();
        assert_eq!(
            add(&n, &mut side, &v4, e(eth0)).unwrap(),
            first,
            "repeated ADD"
        );
        assert_eq!(side.used.len(), 1);
        let second = add(&n, &mut side, &v4, e(net1)).unwrap();
        assert_ne!(first, second);
        assert_eq!(del(&mut side, &v4, PodUid(1), net1, t, CD), second);
        assert_eq!(side.used[&first[0]].allocation, eth0);
        // the same allocation of another pod UID is not this pod's
        assert!(del(&mut side, &v4, PodUid(2), eth0, t, CD).is_empty());
    }

    #[test]
    fn allocation_ids_are_stable() {
        // FNV-1a 64 of "\0" and "a\0" (computed apart, in Python): the operator and the
        // agent, built apart, must compute the same value
        assert_eq!(AllocationId::new("", "").0, 0xaf63_bd4c_8601_b7df);
        assert_eq!(AllocationId::new("a", "").0, 0x089b_e207_b544_f1e4);
    }

    /// One step of a CNI runtime against the node side.
    #[derive(Debug, Clone)]
    enum Op {
        Add { pod: u8, cid: u8 },
        Del { pod: u8, cid: u8 },
        Mark { addr: u8 },
        Tick,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (0..4u8, 0..3u8).prop_map(|(pod, cid)| Op::Add { pod, cid }),
            2 => (0..4u8, 0..3u8).prop_map(|(pod, cid)| Op::Del { pod, cid }),
            1 => (0..6u8).prop_map(|addr| Op::Mark { addr }),
            1 => Just(Op::Tick),
        ]
    }

    proptest::proptest! {
        /// Random ADDs, DELs (stale ones included), marks and time: an allocation holds one
        /// address per family and a repeated ADD returns it; a DEL frees exactly its own
        /// allocation's addresses (and nothing when stale or repeated); nothing is handed
        /// out that is outside the pool, used, cooling down or marked.
        #[test]
        fn the_node_side_keeps_its_promises(ops in proptest::collection::vec(op(), 1..60)) {
            use proptest::prop_assert;
            use proptest::prop_assert_eq;
            let pool = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1", "fd00::2", "fd00::3"];
            let mut n = node_with(&pool);
            let mut side = NodeSideFields::default();
            let both = [Family::V4, Family::V6];
            let mut now = SystemTime::UNIX_EPOCH;
            for op in ops {
                match op {
                    Op::Add { pod, cid } => {
                        let e = UsedEntry { since: now, ..entry(u128::from(pod), u64::from(cid)) };
                        let held = allocated(&side, &both, e.pod_uid, e.allocation);
                        let before = side.clone();
                        match add(&n, &mut side, &both, e.clone()) {
                            Some(got) if !held.is_empty() => {
                                prop_assert_eq!(got, held, "a repeated ADD returns what it holds");
                                prop_assert_eq!(&side, &before);
                            }
                            Some(got) => {
                                prop_assert_eq!(got.len(), 2);
                                for a in &got {
                                    prop_assert!(n.operator.addresses.contains(a));
                                    prop_assert!(!before.used.contains_key(a));
                                    prop_assert!(!any_busy(&before, &AddrSet::from_iter([*a]), now));
                                    prop_assert!(!n.operator.release.contains_key(a));
                                }
                            }
                            None => prop_assert_eq!(&side, &before, "all or none"),
                        }
                    }
                    Op::Del { pod, cid } => {
                        let (uid, allocation) = (PodUid(u128::from(pod)), alloc(u64::from(cid)));
                        let mine = allocated(&side, &both, uid, allocation);
                        let others: Vec<_> = side.used.iter()
                            .filter(|(_, e)| e.pod_uid != uid || e.allocation != allocation)
                            .map(|(a, e)| (*a, e.clone()))
                            .collect();
                        let freed = del(&mut side, &both, uid, allocation, now, CD);
                        prop_assert_eq!(freed, mine);
                        let left: Vec<_> = side.used.iter().map(|(a, e)| (*a, e.clone())).collect();
                        prop_assert_eq!(left, others, "only its own allocation goes");
                        prop_assert!(del(&mut side, &both, uid, allocation, now, CD).is_empty());
                    }
                    Op::Mark { addr } => {
                        let a = ip(pool[usize::from(addr)]);
                        n.operator.release.insert(a, ReleaseState::MarkedForRelease);
                        reconcile(&n, &mut side, now, CD, &|_| false);
                    }
                    Op::Tick => {
                        now += CD / 2;
                        reconcile(&n, &mut side, now, CD, &|_| false);
                    }
                }
                // one address per family per allocation
                let mut seen = std::collections::BTreeSet::new();
                for (a, e) in side.used.iter() {
                    prop_assert!(seen.insert((e.pod_uid, e.allocation, Family::of(a))));
                }
            }
        }

    }

    proptest::proptest! {
        /// The one-walk search finds what a lookup per address finds.
        #[test]
        fn free_address_is_the_lowest_address_no_map_holds(
            // per address 0..48 of each family: in the pool, used, cooling, marked, acked
            flags in proptest::collection::vec(proptest::prelude::any::<[bool; 5]>(), 96),
        ) {
            let mut n = IpamNode::new("n".into(), NodeUid(1));
            let mut side = NodeSideFields::default();
            let mut pool = AddrSet::new();
            for (i, f) in flags.iter().enumerate() {
                let a = if i < 48 {
                    IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, i as u8))
                } else {
                    IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i as u16))
                };
                if f[0] { pool.insert(a); }
                if f[1] { side.used.insert(a, entry(i as u128, 1)); }
                if f[2] { side.cooldown.insert(a, SystemTime::UNIX_EPOCH); }
                if f[3] { n.operator.release.insert(a, ReleaseState::MarkedForRelease); }
                if f[4] { side.release_ack.insert(a, ReleaseAck::DoNotRelease); }
            }
            n.operator.addresses = Arc::new(pool);
            for family in [Family::V4, Family::V6] {
                let looked_up = n.operator.addresses.iter().find(|a| {
                    Family::of(a) == family
                        && !side.used.contains_key(a)
                        && !side.cooldown.contains_key(a)
                        && !n.operator.release.contains_key(a)
                        && !side.release_ack.contains_key(a)
                });
                proptest::prop_assert_eq!(free_address(&n, &side, family), looked_up);
            }
        }
    }
}
