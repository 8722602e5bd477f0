//! [`MemoryPodView`]: an in-memory pod API with an informer lag, for tests and the
//! simulator.

use std::collections::{BTreeSet, VecDeque};

use foldhash::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::*;
use crate::error::IpamError;
use crate::types::{NodeName, PodUid};
use crate::uid_table::{Keyed, UidTable, hash_slots};

struct PodRecord {
    info: PodInfo,
    shown: Shown,
}

// 64 bytes, with room for none (the phase's spare values): the deletion time is kept
// aside (a few pods at a time have one), where a field took 8 bytes of every record
const _: () = assert!(size_of::<Option<PodRecord>>() == 64);

/// When the informer cache first shows a pod, and whether the pod was deleted from the
/// server (live lookups stop finding it; when, is in [`Inner::deleted_at`]): one word,
/// the flag in the top bit.
#[derive(Debug, Clone, Copy)]
struct Shown(u64);

impl Shown {
    const DELETED: u64 = 1 << 63;

    fn from(t: Nanos) -> Self {
        Shown(t.0.min(Self::DELETED - 1))
    }

    fn visible_from(self) -> Nanos {
        Nanos(self.0 & !Self::DELETED)
    }

    fn deleted(self) -> bool {
        self.0 & Self::DELETED != 0
    }

    fn mark_deleted(&mut self) {
        self.0 |= Self::DELETED;
    }
}

/// An instant as nanoseconds since the view's start: 8 bytes where an `Instant` takes 16,
/// converted exactly (whole nanoseconds both ways), so a pod record stays small.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Nanos(u64);

impl Nanos {
    fn since(base: Instant, t: Instant) -> Nanos {
        Nanos(u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX))
    }

    fn plus(self, d: Duration) -> Nanos {
        Nanos(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl Keyed for PodRecord {
    fn uid(&self) -> PodUid {
        self.info.uid
    }
}
#[derive(Default)]
struct Inner {
    /// Looked up per `used` entry on every reclaim scan: a hash table (nothing iterates it).
    pods: UidTable<PodRecord>,
    /// Per node (hash maps: looked up on every pod event and pass, iterated never).
    pending: HashMap<NodeName, BTreeSet<PodUid>>,
    /// The pods in `pending`, over every node.
    pending_total: usize,
    bound: HashMap<NodeName, usize>,
    /// Deleted pods in deletion order, forgotten once the cache has seen the deletion.
    deleted: VecDeque<(Instant, PodUid)>,
    /// The same pods' deletion times, by UID.
    deleted_at: HashMap<PodUid, Nanos>,
    /// Per node: its pods' recent changes ([`PodCache::pod_changes`]).
    changes: HashMap<NodeName, ChangeLog>,
    /// The last sequence number handed out (one counter for all nodes).
    seq: u64,
    /// What the pool choice reads of the pods that carry it ([`PodView::pool_subject`]).
    subjects: HashMap<PodUid, Arc<Subject>>,
    /// Events on pods: how many of each reason, and the last one's pod and message.
    events: HashMap<EventReason, (u64, PodUid, String)>,
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

    /// How many events of `reason` pods got.
    pub fn event_count(&self, reason: EventReason) -> u64 {
        self.inner.lock().events.get(&reason).map_or(0, |e| e.0)
    }

    /// The pod and the message of the last event of `reason` on a pod, if any.
    pub fn last_event(&self, reason: EventReason) -> Option<(PodUid, String)> {
        let g = self.inner.lock();
        g.events.get(&reason).map(|(_, uid, m)| (*uid, m.clone()))
    }

    /// A pod is scheduled to `node` (Pending, no IPs).
    pub fn add(&self, uid: PodUid, node: NodeName) {
        let mut g = self.inner.lock();
        if g.pending.entry(node.clone()).or_default().insert(uid) {
            g.pending_total += 1;
        }
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
            shown: Shown::from(visible),
        });
    }

    /// The pod's labels and annotations and its namespace's, as the pool choice reads them.
    pub fn set_pool_subject(&self, uid: PodUid, subject: Subject) {
        self.inner.lock().subjects.insert(uid, Arc::new(subject));
    }

    /// The pod runs with these addresses (its status.podIPs).
    pub fn set_running(&self, uid: PodUid, ips: impl IntoIterator<Item = IpAddr>) {
        let mut g = self.inner.lock();
        let Some(rec) = g.pods.get_mut(&uid) else {
            return;
        };
        if rec.shown.deleted() || rec.info.phase.is_terminal() {
            return;
        }
        rec.info.phase = PodPhase::Running;
        rec.info.ips = PodIps::new(ips);
        let node = rec.info.node.clone();
        g.touch(&node, uid, self.now());
        if let Some(set) = g.pending.get_mut(&node)
            && set.remove(&uid)
        {
            g.pending_total -= 1;
        }
    }

    /// The pod reached Succeeded or Failed (it stays in the API until deleted).
    pub fn set_terminal(&self, uid: PodUid, phase: PodPhase) {
        let mut g = self.inner.lock();
        let Some(rec) = g.pods.get_mut(&uid) else {
            return;
        };
        if rec.shown.deleted() || rec.info.phase.is_terminal() {
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
            g.deleted_at.remove(&old);
            g.pods.remove(&old);
            g.subjects.remove(&old);
        }
        let Some(rec) = g.pods.get_mut(&uid) else {
            return;
        };
        if rec.shown.deleted() {
            return;
        }
        rec.shown.mark_deleted();
        g.deleted.push_back((now, uid));
        g.deleted_at.insert(uid, now_ns);
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
            if set.remove(&uid) {
                g.pending_total -= 1;
            }
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
            .filter(|r| !r.shown.deleted())
            .map(|r| r.info.clone())
    }
}

impl MemoryPodView {
    /// The pod API's heap as a deterministic size estimate (see
    /// `tidepool_sim::World::world_heap_estimate`): the pod table (records hold their
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
        bytes += hash_slots(g.deleted_at.capacity()) * (size_of::<(PodUid, Nanos)>() + 1);
        bytes + g.deleted.capacity() * size_of::<(Instant, PodUid)>()
    }

    /// The pod as the cache shows it at `now`.
    fn cached<'a>(&self, g: &'a Inner, uid: PodUid, now: Nanos) -> Option<&'a PodInfo> {
        g.pods
            .get(&uid)
            .filter(|r| {
                r.shown.visible_from() <= now
                    && (!r.shown.deleted() || g.deleted_at[&uid].plus(self.lag) > now)
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
    /// The truth by UID (pods here have no names).
    async fn pod_live(
        &self,
        uid: PodUid,
        _namespace: &str,
        _name: &str,
    ) -> Result<Option<PodInfo>, IpamError> {
        Ok(self.truth(uid))
    }

    fn pool_subject(&self, uid: PodUid) -> Option<Subject> {
        self.inner.lock().subjects.get(&uid).map(|s| (**s).clone())
    }

    fn event(
        &self,
        uid: PodUid,
        _name: Option<(&str, &str)>,
        _type: EventType,
        reason: EventReason,
        message: String,
    ) {
        let mut g = self.inner.lock();
        let e = g.events.entry(reason).or_insert((0, uid, String::new()));
        *e = (e.0 + 1, uid, message);
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

    fn pending_total(&self) -> usize {
        self.inner.lock().pending_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The total is the pending pods of every node, through each way a pod stops pending.
    #[test]
    fn pending_total_counts_every_nodes_pending_pods() {
        let v = MemoryPodView::new(Duration::ZERO);
        let sum = |v: &MemoryPodView| v.pending_pods("a").len() + v.pending_pods("b").len();
        for uid in 1..=6 {
            let node = if uid % 2 == 0 { "a" } else { "b" };
            v.add(PodUid(uid), node.into());
        }
        assert_eq!((v.pending_total(), sum(&v)), (6, 6));
        v.set_running(PodUid(1), vec!["10.0.0.1".parse().unwrap()]);
        v.set_running(PodUid(1), vec!["10.0.0.1".parse().unwrap()]);
        v.set_terminal(PodUid(2), PodPhase::Failed);
        v.delete(PodUid(3));
        v.delete(PodUid(1)); // running: not pending any more
        assert_eq!((v.pending_total(), sum(&v)), (3, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn cache_lags_behind_the_truth() {
        let v = MemoryPodView::new(Duration::from_secs(2));
        let uid = PodUid(1);
        v.add(uid, "n".into());
        assert!(v.pod(uid).is_none(), "not in the cache yet");
        assert!(v.pod_live(uid, "ns", "p").await.unwrap().is_some());
        assert_eq!(v.pending_pods("n"), vec![uid]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(v.pod(uid).is_some());
        v.set_running(uid, vec!["10.0.0.1".parse().unwrap()]);
        assert!(v.pending_pods("n").is_empty());
        assert_eq!(v.bound_pods("n"), 1);
        v.delete(uid);
        assert_eq!(v.bound_pods("n"), 0);
        assert!(v.pod_live(uid, "ns", "p").await.unwrap().is_none());
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
