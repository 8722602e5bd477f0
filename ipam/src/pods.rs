//! The engine's view of pods: per UID (cached and live) and per node (pods waiting for an
//! address, pods still bound). An in-memory implementation with an informer lag.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::net::IpAddr;
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
    /// `status.podIPs` (shared: cloning a PodInfo allocates nothing).
    pub ips: Arc<[IpAddr]>,
}

/// Looks pods up in a cache without copying them.
pub trait PodCache {
    /// Calls `f` with the pod of `uid` as the cache shows it (None: no such pod).
    fn with_pod<R>(&self, uid: PodUid, f: impl FnOnce(Option<&PodInfo>) -> R) -> R;
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

struct PodRecord {
    info: PodInfo,
    /// When the informer cache first shows the pod.
    visible_from: Instant,
    /// When the pod was deleted from the server (live lookups stop finding it).
    deleted_at: Option<Instant>,
}

#[derive(Default)]
struct Inner {
    pods: BTreeMap<PodUid, PodRecord>,
    pending: BTreeMap<NodeName, BTreeSet<PodUid>>,
    bound: BTreeMap<NodeName, usize>,
    /// Deleted pods in deletion order, forgotten once the cache has seen the deletion.
    deleted: VecDeque<(Instant, PodUid)>,
}

/// In-memory pods. The cache shows a new pod `lag` after its creation and forgets a
/// deleted pod `lag` after its deletion; live lookups see the truth at once.
#[derive(Clone)]
pub struct MemoryPodView {
    inner: Arc<Mutex<Inner>>,
    lag: Duration,
}

impl MemoryPodView {
    pub fn new(lag: Duration) -> Self {
        Self {
            inner: Arc::default(),
            lag,
        }
    }

    /// A pod is scheduled to `node` (Pending, no IPs).
    pub fn add(&self, uid: PodUid, node: NodeName) {
        let mut g = self.inner.lock();
        g.pending.entry(node.clone()).or_default().insert(uid);
        *g.bound.entry(node.clone()).or_default() += 1;
        g.pods.insert(
            uid,
            PodRecord {
                info: PodInfo {
                    uid,
                    node,
                    phase: PodPhase::Pending,
                    ips: Arc::from([]),
                },
                visible_from: Instant::now() + self.lag,
                deleted_at: None,
            },
        );
    }

    /// The pod runs with these addresses (its status.podIPs).
    pub fn set_running(&self, uid: PodUid, ips: Vec<IpAddr>) {
        let mut g = self.inner.lock();
        let Some(rec) = g.pods.get_mut(&uid) else {
            return;
        };
        if rec.deleted_at.is_some() || rec.info.phase.is_terminal() {
            return;
        }
        rec.info.phase = PodPhase::Running;
        rec.info.ips = ips.into();
        let node = rec.info.node.clone();
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
        if rec.deleted_at.is_some() || rec.info.phase.is_terminal() {
            return;
        }
        rec.info.phase = phase;
        let node = rec.info.node.clone();
        Self::unbind(&mut g, &node, uid);
    }

    /// The pod object is deleted from the API.
    pub fn delete(&self, uid: PodUid) {
        let now = Instant::now();
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
        if rec.deleted_at.is_some() {
            return;
        }
        rec.deleted_at = Some(now);
        g.deleted.push_back((now, uid));
        let rec = g.pods.get_mut(&uid).expect("just seen");
        let was_bound = !rec.info.phase.is_terminal();
        let node = rec.info.node.clone();
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
            .filter(|r| r.deleted_at.is_none())
            .map(|r| r.info.clone())
    }
}

impl PodCache for MemoryPodView {
    fn with_pod<R>(&self, uid: PodUid, f: impl FnOnce(Option<&PodInfo>) -> R) -> R {
        let now = Instant::now();
        let g = self.inner.lock();
        let r = g
            .pods
            .get(&uid)
            .filter(|r| r.visible_from <= now && r.deleted_at.is_none_or(|d| d + self.lag > now));
        f(r.map(|r| &r.info))
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
}
