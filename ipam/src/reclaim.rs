//! Reclaiming the addresses of pods that went away without releasing them (DESIGN.md
//! "Reclaim"): the candidate predicate and the two-observation tracker. Pure: the caller
//! supplies time and pod lookups, and confirms ready groups with a live lookup
//! ([`ReclaimTracker::confirm`]).

mod sightings;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use self::sightings::Sightings;
use crate::pods::{PodCache, PodInfo, PodPhase, Since};
use crate::types::{
    AllocationId, Family, IpamNode, NodeSideFields, PodName, PodUid, ReclaimReason,
    ResourceVersion, Tombstone, UsedEntry, UsedMap,
};

/// Why `addr` (held by `entry`) may be reclaimed, given the pod as seen (`None` = no pod
/// with that UID). `used` is the node's whole `used` map, for the replaced-sandbox rule.
pub fn candidate_reason(
    addr: &IpAddr,
    entry: &UsedEntry,
    used: &UsedMap,
    pod: Option<&PodInfo>,
) -> Option<ReclaimReason> {
    let Some(pod) = pod else {
        return Some(ReclaimReason::PodDeleted);
    };
    if pod.phase.is_terminal() {
        return Some(ReclaimReason::PodTerminal);
    }
    if pod.phase != PodPhase::Running || pod.ips.is_empty() || pod.ips.contains(addr) {
        return None;
    }
    // A replaced sandbox: the running pod lists, in the same family, another address whose
    // entry is another allocation of the same UID, made later.
    let family = Family::of(addr);
    let replaced = pod.ips.iter().any(|other| {
        Family::of(&other) == family
            && used.get(&other).is_some_and(|e| {
                e.pod_uid == entry.pod_uid
                    && e.allocation != entry.allocation
                    && e.since > entry.since
            })
    });
    replaced.then_some(ReclaimReason::SandboxReplaced)
}

/// Reclaim timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimConfig {
    /// Time between the two observations.
    pub grace: Duration,
    /// Minimum time since the operator first saw an entry.
    pub min_age: Duration,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(30),
            min_age: Duration::from_secs(120),
        }
    }
}

/// The addresses of one pod (or one replaced sandbox) to reclaim together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimGroup {
    pub pod_uid: PodUid,
    pub reason: ReclaimReason,
    pub addrs: Vec<IpAddr>,
    /// The first observation (the engine's "pod gone" time for its latency metric).
    pub first_observed: Instant,
}

/// The outcome of one observation pass.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReclaimStep {
    /// Groups observed twice, old enough: confirm live, then write tombstones.
    pub ready: Vec<ReclaimGroup>,
    /// Addresses that are candidates now.
    pub candidates: usize,
    /// Addresses past the grace but held back by the minimum age.
    pub held_by_min_age: usize,
    /// When the next held group becomes ready.
    pub next_deadline: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Observed {
    uid: PodUid,
    reason: ReclaimReason,
    first: Instant,
}

/// Per-node reclaim memory: when the operator first saw each `used` entry, and the first
/// observation of each candidate.
#[derive(Debug, Default)]
pub struct ReclaimTracker {
    /// (address, pod UID, first seen), in address order like the `used` map, so a pass
    /// refreshes it with one merge instead of a lookup per entry.
    first_seen: Sightings,
    /// What the sightings' times count from (the first observation's time).
    base: Option<Instant>,
    observed: BTreeMap<IpAddr, Observed>,
    /// What the last scan's answers depended on, when the next scan may reuse them.
    scanned: Option<Scanned>,
    /// Allocations the node side answered `live` (its pod runs there): not tombstoned again
    /// until a live lookup finds the pod gone or terminal.
    refused: BTreeSet<(PodUid, AllocationId)>,
    /// The pods this tracker's confirmations tombstoned, by address, named as their `used`
    /// entries recorded them, until the node side answers: the answer's event names the
    /// pod, which has left every cache by then. Bounded by the tombstones in flight.
    tombstoned: BTreeMap<IpAddr, TombstonedPod>,
}

/// A tombstoned entry's pod: UID, namespace and name.
type TombstonedPod = (PodUid, PodName);

/// What a scan read: the node's pods as the cache showed them, the resourceVersion of the
/// IPAMNode it read the `used` entries from, and the tombstoned addresses it skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scanned {
    pods: Since,
    node: Option<ResourceVersion>,
    tombstones: Vec<IpAddr>,
}

/// A candidate of one scan: its address and entry, when it was first sighted, and why.
type Reasoned<'n> = (IpAddr, &'n UsedEntry, Instant, ReclaimReason);

/// Group key: a gone or terminal pod's addresses go together; a replaced sandbox's too.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct GroupKey(PodUid, bool);

impl ReclaimTracker {
    /// Forgets everything (a new lead starts its clocks afresh).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// The namespace and name of `uid`, whose tombstone on `addr` the node side answered
    /// (taken: the answer ends the tombstone).
    pub fn take_tombstoned(&mut self, addr: &IpAddr, uid: PodUid) -> Option<PodName> {
        let (pod, name) = self.tombstoned.remove(addr)?;
        self.shed_tombstoned();
        (pod == uid).then_some(name)
    }

    /// Forgets the pods of tombstones no longer among `tombstones` (gone unanswered: a
    /// write that failed, to be confirmed again).
    pub fn keep_tombstoned(&mut self, tombstones: &BTreeMap<IpAddr, Tombstone>) {
        let kept = |a: &IpAddr, uid: &PodUid| tombstones.get(a).is_some_and(|t| t.pod_uid == *uid);
        self.tombstoned.retain(|a, (uid, ..)| kept(a, uid));
        self.shed_tombstoned();
    }

    /// Lets an emptied map go of its storage: std's `BTreeMap` keeps its root leaf (720
    /// bytes here) once emptied, so every node that ever had a tombstone in flight kept one
    /// (at 5,000 nodes, 3.3 MB that grew as the churn reached more nodes: BENCHMARKS.md).
    fn shed_tombstoned(&mut self) {
        if self.tombstoned.is_empty() {
            self.tombstoned = BTreeMap::new();
        }
    }

    /// The node side answered a tombstone on this allocation `live`.
    pub fn refuse(&mut self, uid: PodUid, allocation: AllocationId) {
        self.refused.insert((uid, allocation));
    }

    /// Confirms a ready group with the live lookup's answer (`live`: the pod of the group's
    /// UID as the server has it; `None`: deleted, or a pod of that name with another UID):
    /// the entries to tombstone (address, allocation), each still the group's pod's and
    /// still a candidate for that answer — and for an allocation the node side answered
    /// `live`, only if the pod is gone or terminal now, and once that answer is gone from
    /// `side` (it would answer the new tombstone). Otherwise nothing, and the group's
    /// candidates start their two observations again.
    pub fn confirm(
        &mut self,
        now: Instant,
        g: &ReclaimGroup,
        side: &NodeSideFields,
        live: Option<&PodInfo>,
    ) -> Option<Vec<(IpAddr, AllocationId)>> {
        let used = &side.used;
        let confirmed: Option<Vec<_>> = g
            .addrs
            .iter()
            .map(|a| {
                let e = used.get(a).filter(|e| e.pod_uid == g.pod_uid)?;
                let reason = candidate_reason(a, e, used, live)?;
                let key = (g.pod_uid, e.allocation);
                if !self.refused.contains(&key) {
                    return Some((*a, e.allocation));
                }
                let gone = matches!(
                    reason,
                    ReclaimReason::PodDeleted | ReclaimReason::PodTerminal
                );
                let answered = side
                    .reclaim_ack
                    .get(a)
                    .is_some_and(|k| (k.pod_uid, k.allocation) == key);
                (gone && !answered).then_some((*a, e.allocation))
            })
            .collect();
        match &confirmed {
            Some(entries) => {
                for (a, allocation) in entries {
                    self.refused.remove(&(g.pod_uid, *allocation));
                    if let Some(e) = used.get(a) {
                        let pod = (g.pod_uid, e.pod.clone());
                        self.tombstoned.insert(*a, pod);
                    }
                }
            }
            None => self.restart(now, &g.addrs),
        }
        confirmed
    }

    /// The candidates at `addrs` start their two observations again at `now` (a live
    /// lookup that confirmed nothing, or failed).
    pub fn restart(&mut self, now: Instant, addrs: &[IpAddr]) {
        for a in addrs {
            if let Some(o) = self.observed.get_mut(a) {
                o.first = now;
            }
        }
    }

    /// Refreshes the first sightings from the `used` map (address order) with one merge
    /// (one allocation per scan rather than a second buffer kept per node: memory is what
    /// limits large runs). Returns the pod UIDs of the entries added and gone.
    fn merge_first_seen(&mut self, now: Instant, used: &UsedMap) -> Vec<PodUid> {
        // the same entries (another field of the object changed): nothing to redo
        if self.first_seen.matches(used) {
            return Vec::new();
        }
        let base = *self.base.get_or_insert(now);
        let now_at = u64::try_from(now.saturating_duration_since(base).as_nanos())
            .expect("fewer than 584 years since the first observation");
        self.first_seen.merge(now_at, used)
    }

    /// When a sighting was.
    fn seen(&self, at: u64) -> Instant {
        self.base.expect("set by the first merge") + std::time::Duration::from_nanos(at)
    }

    /// Observes the node's `used` map at `now`. Addresses in `tombstones` (the node's,
    /// less those answered) are skipped. `pods` answers from the cache. Pods are looked up
    /// only where the answer may have changed since the last scan: when the cache can tell
    /// which of the node's pods changed ([`PodCache::pod_changes`]), the pods of the
    /// entries added or gone since (none when the IPAMNode is the same object: its
    /// resourceVersion; 0, not stored yet, is never the same) and the pods the cache
    /// changed; every entry otherwise. An entry keeps its identity (address and pod UID)
    /// as for its first sighting.
    pub fn observe(
        &mut self,
        now: Instant,
        cfg: &ReclaimConfig,
        node: &IpamNode,
        tombstones: &BTreeMap<IpAddr, Tombstone>,
        pods: &impl PodCache,
    ) -> ReclaimStep {
        let last = self.scanned.take();
        let changes = pods.pod_changes(&node.name, last.as_ref().map(|s| s.pods));
        let same_object = last
            .as_ref()
            .is_some_and(|l| node.resource_version.is_some() && l.node == node.resource_version);
        // the pods to look up: None = all of them
        let dirty: Option<Vec<PodUid>> = match (&last, &changes) {
            (Some(l), Some(c)) if l.tombstones.iter().eq(tombstones.keys()) => {
                Some(c.changed.clone())
            }
            _ => None,
        };
        let dirty = self.merge_sightings(now, node, same_object, dirty);
        let (reasons, own_pods) = match &dirty {
            // nothing changed: the last scan's candidates stand
            Some(d) if d.is_empty() && same_object => (self.last_reasons(node), true),
            _ => self.look_up(node, tombstones, pods, dirty.as_deref()),
        };
        self.scanned = changes.filter(|_| own_pods).map(|c| Scanned {
            pods: Since {
                seq: c.seq,
                at: now,
            },
            node: node.resource_version.clone(),
            tombstones: tombstones.keys().copied().collect(),
        });
        let groups = self.record(now, reasons);
        self.ready(now, cfg, groups)
    }

    /// Merges the entries' sightings unless the IPAMNode is the same object; the pods of
    /// entries added or gone join `dirty`, which comes back sorted and deduplicated.
    fn merge_sightings(
        &mut self,
        now: Instant,
        node: &IpamNode,
        same_object: bool,
        mut dirty: Option<Vec<PodUid>>,
    ) -> Option<Vec<PodUid>> {
        if !same_object {
            let moved = self.merge_first_seen(now, &node.node.used);
            if let Some(d) = &mut dirty {
                d.extend(moved);
            }
        }
        if let Some(d) = &mut dirty {
            d.sort_unstable();
            d.dedup();
        }
        dirty
    }

    /// The last scan's candidates, for the entries still in `used`.
    fn last_reasons<'n>(&self, node: &'n IpamNode) -> Vec<Reasoned<'n>> {
        let used = &node.node.used;
        let mut reasons = Vec::new();
        for (addr, o) in &self.observed {
            if let (Some(entry), Some(at)) = (used.get(addr), self.first_seen.at(addr)) {
                reasons.push((*addr, entry, self.seen(at), o.reason));
            }
        }
        reasons
    }

    /// The candidates among the untombstoned entries, looking up the pods in `dirty` (all
    /// when None) and keeping the last answer for the others; and whether every pod found
    /// is bound to this node (only then are the answers reusable: its changes say nothing
    /// about the others).
    fn look_up<'n>(
        &self,
        node: &'n IpamNode,
        tombstones: &BTreeMap<IpAddr, Tombstone>,
        pods: &impl PodCache,
        dirty: Option<&[PodUid]>,
    ) -> (Vec<Reasoned<'n>>, bool) {
        let used = &node.node.used;
        let mut reasons = Vec::new();
        let mut own_pods = true;
        let look = |uid: &PodUid| dirty.is_none_or(|d| d.binary_search(uid).is_ok());
        let entries = used
            .iter()
            .zip(self.first_seen.times())
            .filter(|((addr, _), _)| !tombstones.contains_key(addr));
        for ((addr, entry), seen) in entries.clone() {
            if !look(&entry.pod_uid)
                && let Some(o) = self.observed.get(&addr).filter(|o| o.uid == entry.pod_uid)
            {
                reasons.push((addr, entry, self.seen(seen), o.reason));
            }
        }
        // one batch of cache lookups
        pods.with_pods(
            entries.filter(|((_, entry), _)| look(&entry.pod_uid)),
            |((_, entry), _)| entry.pod_uid,
            |((addr, entry), seen), pod| {
                if let Some(p) = pod {
                    own_pods &= Arc::ptr_eq(&p.node, &node.name) || p.node == node.name;
                }
                if let Some(r) = candidate_reason(&addr, entry, used, pod) {
                    reasons.push((addr, entry, self.seen(seen), r));
                }
            },
        );
        reasons.sort_unstable_by_key(|r| r.0);
        (reasons, own_pods)
    }

    /// Records this scan's candidates (each keeps its first observation while its pod and
    /// reason stay), grouped by pod and by whether their sandbox was replaced.
    fn record(
        &mut self,
        now: Instant,
        reasons: Vec<Reasoned<'_>>,
    ) -> BTreeMap<GroupKey, Vec<(IpAddr, Instant)>> {
        let mut groups: BTreeMap<GroupKey, Vec<(IpAddr, Instant)>> = BTreeMap::new();
        let mut still = BTreeMap::new();
        for (addr, entry, seen, reason) in reasons {
            let first = match self.observed.get(&addr) {
                Some(o) if o.uid == entry.pod_uid && o.reason == reason => o.first,
                _ => now,
            };
            still.insert(
                addr,
                Observed {
                    uid: entry.pod_uid,
                    reason,
                    first,
                },
            );
            let key = GroupKey(entry.pod_uid, reason == ReclaimReason::SandboxReplaced);
            groups.entry(key).or_default().push((addr, seen));
        }
        self.observed = still;
        groups
    }

    /// The groups past their grace and min-age, and when the next one will be.
    fn ready(
        &self,
        now: Instant,
        cfg: &ReclaimConfig,
        groups: BTreeMap<GroupKey, Vec<(IpAddr, Instant)>>,
    ) -> ReclaimStep {
        let mut step = ReclaimStep {
            candidates: self.observed.len(),
            ..ReclaimStep::default()
        };
        for (GroupKey(uid, _), members) in groups {
            let mut ready_at = now;
            let mut grace_at = now;
            for (a, seen) in &members {
                let o = &self.observed[a];
                grace_at = grace_at.max(o.first + cfg.grace);
                ready_at = ready_at.max(o.first + cfg.grace);
                ready_at = ready_at.max(*seen + cfg.min_age);
            }
            let addrs: Vec<IpAddr> = members.into_iter().map(|(a, _)| a).collect();
            if ready_at <= now {
                let o = self.observed[&addrs[0]];
                let first_observed = addrs
                    .iter()
                    .map(|a| self.observed[a].first)
                    .min()
                    .unwrap_or(now);
                step.ready.push(ReclaimGroup {
                    pod_uid: uid,
                    reason: o.reason,
                    addrs,
                    first_observed,
                });
            } else {
                if grace_at <= now {
                    step.held_by_min_age += addrs.len();
                }
                step.next_deadline = Some(step.next_deadline.map_or(ready_at, |d| d.min(ready_at)));
            }
        }
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::{FnPods, PodChanges, PodIps};
    use crate::types::NodeUid;
    use std::time::SystemTime;

    /// An entry of pod `uid` made at `since` by the sandbox started then.
    fn entry(uid: u128, since: u64) -> UsedEntry {
        UsedEntry {
            pod_uid: PodUid(uid),
            pod: PodName::new("ns", "p"),
            allocation: crate::types::AllocationId(since),
            since: (SystemTime::UNIX_EPOCH + Duration::from_secs(since)).into(),
        }
    }

    /// An IPAMNode "n" with these entries, not stored (resourceVersion 0: scans never
    /// reuse answers for it).
    fn node(used: &UsedMap) -> IpamNode {
        let mut n = IpamNode::new("n".into(), NodeUid(1));
        n.node.used = used.clone();
        n
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A resourceVersion other than the node's (the tests' writes).
    fn next_version(n: &IpamNode) -> ResourceVersion {
        let last = n.resource_version.as_ref().map_or(0, |v| v.fingerprint());
        ResourceVersion::counter(last + 1)
    }

    fn running(uid: u128, ips: &[&str]) -> PodInfo {
        PodInfo {
            uid: PodUid(uid),
            node: "n".into(),
            phase: PodPhase::Running,
            ips: PodIps::new(ips.iter().map(|s| ip(s))),
        }
    }

    /// Issue 25: a live lookup that finds the pod running confirms nothing and restarts
    /// the observations; an allocation answered `live` is tombstoned again only once a
    /// lookup finds its pod gone and the old answer has gone.
    #[tokio::test(start_paused = true)]
    async fn confirmations_restart_on_a_live_pod_and_respect_refusals() {
        let cfg = ReclaimConfig {
            grace: Duration::from_secs(30),
            min_age: Duration::ZERO,
        };
        let mut t = ReclaimTracker::default();
        let mut used = UsedMap::new();
        used.insert(ip("10.0.0.1"), entry(1, 0));
        used.insert(ip("10.0.0.2"), entry(1, 5));
        let n = node(&used);
        let none = BTreeMap::new();
        let now = Instant::now();
        let at = |s: u64| now + Duration::from_secs(s);
        // the cache never saw pod 1
        t.observe(now, &cfg, &n, &none, &FnPods(|_| None));
        let s = t.observe(at(30), &cfg, &n, &none, &FnPods(|_| None));
        let g = s.ready[0].clone();
        // the GET finds it running with .2: only the replaced .1 would go, and a group
        // goes whole or not at all
        let p = running(1, &["10.0.0.2"]);
        assert_eq!(t.confirm(at(30), &g, &n.node, Some(&p)), None);
        let s = t.observe(at(31), &cfg, &n, &none, &FnPods(|_| None));
        assert!(s.ready.is_empty(), "observed afresh from 30 s on");
        assert_eq!(s.next_deadline, Some(at(60)));
        // refused: a replaced sandbox, even confirmed, is not tombstoned again
        let replaced = ReclaimGroup {
            addrs: vec![ip("10.0.0.1")],
            ..g.clone()
        };
        let old = used[&ip("10.0.0.1")].allocation;
        assert_eq!(
            t.confirm(at(60), &replaced, &n.node, Some(&p)),
            Some(vec![(ip("10.0.0.1"), old)])
        );
        t.refuse(PodUid(1), old);
        assert_eq!(t.confirm(at(61), &replaced, &n.node, Some(&p)), None);
        // gone by GET, but the node side's `live` answer still stands: not yet
        let mut answered = n.node.clone();
        answered.reclaim_ack.insert(
            ip("10.0.0.1"),
            crate::types::ReclaimAck {
                pod_uid: PodUid(1),
                allocation: old,
                outcome: crate::types::ReclaimOutcome::Live,
            },
        );
        assert_eq!(t.confirm(at(62), &replaced, &answered, None), None);
        // gone, the answer gone: tombstoned, and the refusal is lifted
        assert!(t.confirm(at(63), &replaced, &n.node, None).is_some());
        assert!(t.refused.is_empty());
    }

    /// A confirmed group's pod is named as its `used` entries recorded it until the node
    /// side answers the tombstone (the pod has left every cache by then); a tombstone gone
    /// unanswered forgets it, and so does an answer for another pod.
    #[tokio::test(start_paused = true)]
    async fn a_tombstoned_pod_is_named_until_its_answer() {
        let cfg = ReclaimConfig {
            grace: Duration::ZERO,
            min_age: Duration::ZERO,
        };
        let mut t = ReclaimTracker::default();
        let mut used = UsedMap::new();
        used.insert(ip("10.0.0.1"), entry(1, 0));
        used.insert(ip("10.0.0.2"), entry(2, 0));
        used.insert(ip("10.0.0.3"), entry(3, 0));
        let n = node(&used);
        let (none, now) = (BTreeMap::new(), Instant::now());
        t.observe(now, &cfg, &n, &none, &FnPods(|_| None));
        let step = t.observe(now, &cfg, &n, &none, &FnPods(|_| None));
        assert_eq!(step.ready.len(), 3, "all three pods gone");
        for g in &step.ready {
            assert!(t.confirm(now, g, &n.node, None).is_some());
        }
        let tombstone = |uid: u128| Tombstone {
            pod_uid: PodUid(uid),
            allocation: crate::types::AllocationId(0),
            reason: ReclaimReason::PodDeleted,
        };
        // .2's tombstone went unanswered (its write failed): forgotten
        t.keep_tombstoned(&BTreeMap::from([
            (ip("10.0.0.1"), tombstone(1)),
            (ip("10.0.0.3"), tombstone(3)),
        ]));
        assert_eq!(t.take_tombstoned(&ip("10.0.0.2"), PodUid(2)), None);
        // .3 answered for another pod: named nothing, and its entry is gone with the answer
        assert_eq!(t.take_tombstoned(&ip("10.0.0.3"), PodUid(9)), None);
        assert_eq!(t.take_tombstoned(&ip("10.0.0.3"), PodUid(3)), None, "ended");
        assert_eq!(
            t.take_tombstoned(&ip("10.0.0.1"), PodUid(1)),
            Some(PodName::new("ns", "p"))
        );
        assert_eq!(t.take_tombstoned(&ip("10.0.0.1"), PodUid(1)), None, "taken");
        assert!(t.tombstoned.is_empty());
    }

    #[test]
    fn candidate_rules() {
        let mut used = UsedMap::new();
        used.insert(ip("10.0.0.1"), entry(1, 10));
        used.insert(ip("10.0.0.2"), entry(1, 20));
        let e = &used[&ip("10.0.0.1")];
        assert_eq!(
            candidate_reason(&ip("10.0.0.1"), e, &used, None),
            Some(ReclaimReason::PodDeleted)
        );
        let mut done = running(1, &[]);
        done.phase = PodPhase::Succeeded;
        assert_eq!(
            candidate_reason(&ip("10.0.0.1"), e, &used, Some(&done)),
            Some(ReclaimReason::PodTerminal)
        );
        // the running pod lists the newer address: the older one is a replaced sandbox
        let p = running(1, &["10.0.0.2"]);
        assert_eq!(
            candidate_reason(&ip("10.0.0.1"), e, &used, Some(&p)),
            Some(ReclaimReason::SandboxReplaced)
        );
        // ... nor when the newer entry is the same allocation (not another sandbox)
        let mut same = used.clone();
        same.insert(
            ip("10.0.0.2"),
            UsedEntry {
                since: (SystemTime::from(e.since) + Duration::from_secs(1)).into(),
                ..e.clone()
            },
        );
        assert_eq!(candidate_reason(&ip("10.0.0.1"), e, &same, Some(&p)), None);
        // ... but never the address it lists, nor when the other entry is older
        assert_eq!(
            candidate_reason(&ip("10.0.0.2"), &used[&ip("10.0.0.2")], &used, Some(&p)),
            None
        );
        let p = running(1, &["10.0.0.1"]);
        assert_eq!(
            candidate_reason(&ip("10.0.0.2"), &used[&ip("10.0.0.2")], &used, Some(&p)),
            None
        );
        // a pending pod, or one without IPs yet, is never a candidate
        assert_eq!(
            candidate_reason(&ip("10.0.0.1"), e, &used, Some(&running(1, &[]))),
            None
        );
        // another family's address does not make a replacement
        let p = running(1, &["fd00::9"]);
        assert_eq!(candidate_reason(&ip("10.0.0.1"), e, &used, Some(&p)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn two_observations_grace_apart_and_min_age() {
        let cfg = ReclaimConfig {
            grace: Duration::from_secs(30),
            min_age: Duration::from_secs(120),
        };
        let mut t = ReclaimTracker::default();
        let mut used = UsedMap::new();
        used.insert(ip("10.0.0.1"), entry(1, 0));
        let none = BTreeMap::new();
        let start = Instant::now();
        // the pod exists: the operator just records the entry
        let s = t.observe(
            start,
            &cfg,
            &node(&used),
            &none,
            &FnPods(|_| Some(running(1, &["10.0.0.1"]))),
        );
        assert_eq!(s.candidates, 0);
        // at 100 s the pod is gone: first observation
        let t1 = start + Duration::from_secs(100);
        let s = t.observe(t1, &cfg, &node(&used), &none, &FnPods(|_| None));
        assert_eq!((s.candidates, s.ready.len()), (1, 0));
        assert_eq!(s.next_deadline, Some(start + Duration::from_secs(130)));
        // second observation at 130: grace passed and the entry is 130 s old ≥ 120
        let s = t.observe(
            start + Duration::from_secs(130),
            &cfg,
            &node(&used),
            &none,
            &FnPods(|_| None),
        );
        assert_eq!(s.ready.len(), 1);
        assert_eq!(s.ready[0].reason, ReclaimReason::PodDeleted);
        assert_eq!(s.ready[0].first_observed, t1);
        // tombstoned addresses are skipped
        let mut tomb = BTreeMap::new();
        tomb.insert(
            ip("10.0.0.1"),
            Tombstone {
                pod_uid: PodUid(1),
                allocation: crate::types::AllocationId(1),
                reason: ReclaimReason::PodDeleted,
            },
        );
        let s = t.observe(
            start + Duration::from_secs(131),
            &cfg,
            &node(&used),
            &tomb,
            &FnPods(|_| None),
        );
        assert_eq!(s.candidates, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn young_entries_wait_for_min_age_and_reappearing_pods_reset() {
        let cfg = ReclaimConfig::default();
        let mut t = ReclaimTracker::default();
        let mut used = UsedMap::new();
        used.insert(ip("10.0.0.1"), entry(1, 0));
        let now = Instant::now();
        let none = BTreeMap::new();
        assert_eq!(
            t.observe(now, &cfg, &node(&used), &none, &FnPods(|_| None))
                .ready
                .len(),
            0
        );
        let s = t.observe(
            now + Duration::from_secs(31),
            &cfg,
            &node(&used),
            &none,
            &FnPods(|_| None),
        );
        assert_eq!((s.ready.len(), s.held_by_min_age), (0, 1));
        assert_eq!(s.next_deadline, Some(now + Duration::from_secs(120)));
        // the pod shows up in the cache: no longer a candidate, the clock restarts
        let s = t.observe(
            now + Duration::from_secs(60),
            &cfg,
            &node(&used),
            &none,
            &FnPods(|_| Some(running(1, &["10.0.0.1"]))),
        );
        assert_eq!(s.candidates, 0);
        let s = t.observe(
            now + Duration::from_secs(125),
            &cfg,
            &node(&used),
            &none,
            &FnPods(|_| None),
        );
        assert!(s.ready.is_empty(), "a fresh first observation is needed");
    }

    #[tokio::test(start_paused = true)]
    async fn both_families_of_a_pod_go_together() {
        let cfg = ReclaimConfig {
            grace: Duration::from_secs(30),
            min_age: Duration::ZERO,
        };
        let mut t = ReclaimTracker::default();
        let mut used = UsedMap::new();
        used.insert(ip("10.0.0.1"), entry(1, 0));
        let now = Instant::now();
        let none = BTreeMap::new();
        t.observe(now, &cfg, &node(&used), &none, &FnPods(|_| None));
        // the v6 entry appears later: the group waits for its own grace
        used.insert(ip("fd00::1"), entry(1, 0));
        let s = t.observe(
            now + Duration::from_secs(20),
            &cfg,
            &node(&used),
            &none,
            &FnPods(|_| None),
        );
        assert!(s.ready.is_empty());
        let s = t.observe(
            now + Duration::from_secs(31),
            &cfg,
            &node(&used),
            &none,
            &FnPods(|_| None),
        );
        assert!(s.ready.is_empty(), "v6 observed only 11 s ago");
        let s = t.observe(
            now + Duration::from_secs(50),
            &cfg,
            &node(&used),
            &none,
            &FnPods(|_| None),
        );
        assert_eq!(s.ready.len(), 1);
        assert_eq!(s.ready[0].addrs, vec![ip("10.0.0.1"), ip("fd00::1")]);
    }

    /// Pods in a map, a change log the test writes, and a count of lookups.
    struct Logged {
        pods: std::cell::RefCell<BTreeMap<PodUid, PodInfo>>,
        log: std::cell::RefCell<Vec<PodUid>>,
        /// Whether it can tell what changed.
        tells: std::cell::Cell<bool>,
        lookups: std::cell::Cell<usize>,
    }

    impl Logged {
        fn new(pods: impl IntoIterator<Item = PodInfo>) -> Self {
            Logged {
                pods: std::cell::RefCell::new(pods.into_iter().map(|p| (p.uid, p)).collect()),
                log: Default::default(),
                tells: std::cell::Cell::new(true),
                lookups: Default::default(),
            }
        }
        fn change(&self, uid: PodUid, pod: Option<PodInfo>) {
            match pod {
                Some(p) => self.pods.borrow_mut().insert(uid, p),
                None => self.pods.borrow_mut().remove(&uid),
            };
            self.log.borrow_mut().push(uid);
        }
    }

    impl PodCache for Logged {
        fn with_pod<R>(&self, uid: PodUid, f: impl FnOnce(Option<&PodInfo>) -> R) -> R {
            self.lookups.set(self.lookups.get() + 1);
            f(self.pods.borrow().get(&uid))
        }
        fn pod_changes(&self, _node: &str, since: Option<Since>) -> Option<PodChanges> {
            let log = self.log.borrow();
            let from = since.map_or(log.len(), |s| s.seq as usize);
            self.tells.get().then(|| PodChanges {
                seq: log.len() as u64,
                changed: log[from..].to_vec(),
            })
        }
    }

    fn tomb(a: &str, uid: u128) -> BTreeMap<IpAddr, Tombstone> {
        BTreeMap::from([(
            ip(a),
            Tombstone {
                pod_uid: PodUid(uid),
                allocation: crate::types::AllocationId(1),
                reason: ReclaimReason::PodDeleted,
            },
        )])
    }

    #[tokio::test(start_paused = true)]
    async fn scans_look_up_only_the_pods_that_may_have_changed() {
        let cfg = ReclaimConfig {
            grace: Duration::from_secs(30),
            min_age: Duration::ZERO,
        };
        let mut t = ReclaimTracker::default();
        let mut n = IpamNode::new("n".into(), NodeUid(1));
        n.resource_version = Some(ResourceVersion::counter(7));
        for i in 1..=3u8 {
            n.node
                .used
                .insert(ip(&format!("10.0.0.{i}")), entry(u128::from(i), 0));
        }
        // pod 1 is gone, 2 and 3 run
        let cache = Logged::new([running(2, &["10.0.0.2"]), running(3, &["10.0.0.3"])]);
        let none = BTreeMap::new();
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let lookups = || cache.lookups.get();
        let s = t.observe(start, &cfg, &n, &none, &cache);
        assert_eq!((s.candidates, lookups()), (1, 3));
        // same object, same pods: no lookup, and the candidate still comes due
        let s = t.observe(at(10), &cfg, &n, &none, &cache);
        assert_eq!((s.candidates, s.ready.len(), lookups()), (1, 0, 3));
        let s = t.observe(at(30), &cfg, &n, &none, &cache);
        assert_eq!((s.ready.len(), lookups()), (1, 3));
        assert_eq!(
            (s.ready[0].pod_uid, s.ready[0].first_observed),
            (PodUid(1), start)
        );
        // pod 2 is deleted: only it is looked up
        cache.change(PodUid(2), None);
        let s = t.observe(at(31), &cfg, &n, &none, &cache);
        assert_eq!((s.candidates, lookups()), (2, 4));
        // a new object with one more entry: only its pod is looked up; pod 1's candidate
        // keeps its first observation
        n.resource_version = Some(ResourceVersion::counter(8));
        n.node.used.insert(ip("10.0.0.4"), entry(4, 0));
        cache.change(PodUid(4), Some(running(4, &["10.0.0.4"])));
        let s = t.observe(at(32), &cfg, &n, &none, &cache);
        assert_eq!((s.candidates, lookups()), (2, 5));
        assert_eq!(s.ready.len(), 1, "pod 1 is still due, pod 2 not yet");
        // an entry gone (pod 3's): nothing to look up
        n.resource_version = Some(ResourceVersion::counter(9));
        n.node.used.remove(&ip("10.0.0.3"));
        let s = t.observe(at(33), &cfg, &n, &none, &cache);
        assert_eq!((s.candidates, lookups()), (2, 5));
        // a replaced sandbox: pod 4 gets a second address and lists only the new one;
        // both of its entries are looked up and the old one is a candidate
        n.resource_version = Some(ResourceVersion::counter(10));
        n.node.used.insert(ip("10.0.0.5"), entry(4, 5));
        cache.change(PodUid(4), Some(running(4, &["10.0.0.5"])));
        let s = t.observe(at(34), &cfg, &n, &none, &cache);
        assert_eq!((s.candidates, lookups()), (3, 7));
        // a tombstone written: every entry is looked at again, the tombstoned one skipped
        n.resource_version = Some(ResourceVersion::counter(11));
        let s = t.observe(at(35), &cfg, &n, &tomb("10.0.0.1", 1), &cache);
        assert_eq!((s.candidates, lookups()), (2, 10));
        // the cache cannot tell what changed: every entry again
        cache.tells.set(false);
        t.observe(at(36), &cfg, &n, &tomb("10.0.0.1", 1), &cache);
        assert_eq!(lookups(), 13);
        // an object not stored (resourceVersion 0) is compared entry by entry
        cache.tells.set(true);
        n.resource_version = None;
        t.observe(at(37), &cfg, &n, &tomb("10.0.0.1", 1), &cache);
        let before = lookups();
        let s = t.observe(at(38), &cfg, &n, &tomb("10.0.0.1", 1), &cache);
        assert_eq!((s.candidates, lookups()), (2, before));
        n.node.used.insert(ip("10.0.0.6"), entry(6, 0));
        let s = t.observe(at(39), &cfg, &n, &tomb("10.0.0.1", 1), &cache);
        assert_eq!(
            (s.candidates, lookups()),
            (3, before + 1),
            "pod 6 is unknown"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_bound_elsewhere_makes_every_scan_look_again() {
        let cfg = ReclaimConfig::default();
        let mut t = ReclaimTracker::default();
        let mut n = IpamNode::new("n".into(), NodeUid(1));
        n.resource_version = Some(ResourceVersion::counter(7));
        n.node.used.insert(ip("10.0.0.1"), entry(1, 0));
        let mut elsewhere = running(1, &["10.0.0.1"]);
        elsewhere.node = "other".into();
        let cache = Logged::new([elsewhere]);
        let none = BTreeMap::new();
        let now = Instant::now();
        t.observe(now, &cfg, &n, &none, &cache);
        t.observe(now + Duration::from_secs(1), &cfg, &n, &none, &cache);
        // the node's changes say nothing about that pod
        assert_eq!(cache.lookups.get(), 2);
    }

    /// One step of [`incremental_scans_find_what_a_full_scan_finds`].
    #[derive(Debug, Clone)]
    enum Step {
        /// The node side records pod `uid` at address `addr` with this `since`.
        Entry {
            addr: u8,
            uid: u8,
            since: u8,
        },
        Drop {
            addr: u8,
        },
        /// Another field of the IPAMNode changes (a new resourceVersion, the same entries).
        Touch,
        /// The pod is gone (0), terminal (1), or running with these addresses (a bit per
        /// address) on this node (2) or bound to another (3).
        Pod {
            uid: u8,
            state: u8,
            ips: u8,
        },
        /// A tombstone is written on `addr` or, when one is there, taken away.
        Tombstone {
            addr: u8,
        },
        /// Whether the pod cache can tell which pods changed.
        Tells(bool),
    }

    fn arb_step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..4u8, 0..3u8, 0..3u8).prop_map(|(addr, uid, since)| Step::Entry { addr, uid, since }),
            1 => (0..4u8).prop_map(|addr| Step::Drop { addr }),
            1 => Just(Step::Touch),
            4 => (0..3u8, 0..4u8, 0..16u8).prop_map(|(uid, state, ips)| Step::Pod { uid, state, ips }),
            1 => (0..4u8).prop_map(|addr| Step::Tombstone { addr }),
            1 => any::<bool>().prop_map(Step::Tells),
        ]
    }

    proptest::proptest! {
        /// Whatever the entries, the pods and the tombstones do between two scans, a scan
        /// that looks up only the pods that may have changed ends with the candidates (and
        /// reasons) that looking every entry's pod up gives.
        #[test]
        fn incremental_scans_find_what_a_full_scan_finds(
            steps in proptest::collection::vec(arb_step(), 1..60)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let addr = |i: u8| IpAddr::from([10, 0, 0, i + 1]);
                let cfg = ReclaimConfig::default();
                let mut t = ReclaimTracker::default();
                let mut n = IpamNode::new("n".into(), NodeUid(1));
                n.resource_version = Some(ResourceVersion::counter(1));
                let cache = Logged::new([]);
                let mut tombstones: BTreeMap<IpAddr, Tombstone> = BTreeMap::new();
                for step in steps {
                    match step {
                        Step::Entry { addr: a, uid, since } => {
                            n.node.used.insert(addr(a), entry(u128::from(uid), u64::from(since)));
                            n.resource_version = Some(next_version(&n));
                        }
                        Step::Drop { addr: a } => {
                            n.node.used.remove(&addr(a));
                            n.resource_version = Some(next_version(&n));
                        }
                        Step::Touch => n.resource_version = Some(next_version(&n)),
                        Step::Pod { uid, state, ips } => {
                            let uid = u128::from(uid);
                            let pod = match state {
                                0 => None,
                                1 => Some(PodInfo {
                                    phase: PodPhase::Succeeded,
                                    ..running(uid, &[])
                                }),
                                _ => Some(PodInfo {
                                    // at most one address per family: the lowest chosen
                                    ips: PodIps::new((0..4).filter(|i| ips & (1 << i) != 0).map(addr).take(1)),
                                    node: if state == 3 { "other".into() } else { "n".into() },
                                    ..running(uid, &[])
                                }),
                            };
                            cache.change(PodUid(uid), pod);
                        }
                        Step::Tells(tells) => cache.tells.set(tells),
                        Step::Tombstone { addr: a } => {
                            if tombstones.remove(&addr(a)).is_none() {
                                tombstones.insert(
                                    addr(a),
                                    Tombstone {
                                        pod_uid: PodUid(0),
                                        allocation: crate::types::AllocationId(1),
                                        reason: ReclaimReason::PodDeleted,
                                    },
                                );
                            }
                        }
                    }
                    tokio::time::advance(Duration::from_secs(1)).await;
                    t.observe(Instant::now(), &cfg, &n, &tombstones, &cache);
                    let found: BTreeMap<IpAddr, (PodUid, ReclaimReason)> = t
                        .observed
                        .iter()
                        .map(|(a, o)| (*a, (o.uid, o.reason)))
                        .collect();
                    let full: BTreeMap<IpAddr, (PodUid, ReclaimReason)> = n
                        .node
                        .used
                        .iter()
                        .filter(|(a, _)| !tombstones.contains_key(a))
                        .filter_map(|(a, e)| {
                            let pods = cache.pods.borrow();
                            candidate_reason(&a, e, &n.node.used, pods.get(&e.pod_uid))
                                .map(|r| (a, (e.pod_uid, r)))
                        })
                        .collect();
                    proptest::prop_assert_eq!(found, full);
                }
                Ok(())
            })?;
        }
    }
}
