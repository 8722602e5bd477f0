//! The engine's view of pods: per UID (cached and live) and per node (pods waiting for an
//! address, pods still bound). An in-memory implementation with an informer lag.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tokio::time::Instant;

use crate::error::IpamError;
use crate::pool::choice::Subject;
use crate::store::EventType;
use crate::types::{NodeName, PodUid};
use crate::vocab::EventReason;

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
    /// The pod `namespace/name` (as a `used` entry records it) as the server has it now, a
    /// consistent read that never answers from the cache: `Some` only when it has UID
    /// `uid`; `None` when there is no such pod or it has another UID (this pod is gone).
    fn pod_live(
        &self,
        uid: PodUid,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<PodInfo>, IpamError>> + Send;
    /// Pods bound to `node`, not terminal, with no pod IPs yet (candidates for "waiting").
    fn pending_pods(&self, node: &str) -> Vec<PodUid>;
    /// How many non-terminal pods are bound to `node`.
    fn bound_pods(&self, node: &str) -> usize;
    /// How many pods of every node are pending (as [`PodView::pending_pods`] counts them).
    fn pending_total(&self) -> usize;
    /// What the pool choice reads of a pod and its namespace (labels, `ipam.tidepool.dev/pools`
    /// annotations; the node's part is the source's): `None` for a view that has none, whose
    /// pods all take their node's default pools.
    fn pool_subject(&self, _uid: PodUid) -> Option<Subject> {
        None
    }
    /// Records a Kubernetes event on the pod `uid`, named by `name` (namespace, name) when
    /// the caller has it (a `used` entry records it: the pod may have left the cache), by
    /// the view otherwise; a view that cannot name it records nothing.
    fn event(
        &self,
        _uid: PodUid,
        _name: Option<(&str, &str)>,
        _type: EventType,
        _reason: EventReason,
        _message: String,
    ) {
    }
}

mod memory;
pub use memory::MemoryPodView;
