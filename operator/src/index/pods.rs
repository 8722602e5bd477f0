//! [`PodIndex`]: the engine's pod view ([`PodCache`], [`PodView`]) fed by a Pod watch.

mod changes;
mod project;
mod state;
mod watched;

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use parking_lot::RwLock;
use tidepool_ipam::{
    EventReason, EventType, IpamError, NodeName, PodCache, PodChanges, PodInfo, PodUid, PodView,
    Since,
};

use project::{bound_node, pod_uid, project, split_key};
use state::State;
pub(crate) use watched::{WatchedPod, to_pod_event};

use super::LabelSelector;
use super::namespaces::NamespaceIndex;
use crate::store::Events;
use tidepool_ipam::pool::choice::Subject;

/// The direct GET behind [`PodView::pod_live`] (a `kube::Client`; tests pass a fake).
pub trait PodGetter: Send + Sync + 'static {
    /// The pod `namespace/name` as the server has it now; `None` when there is none.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<Option<Pod>, kube::Error>>;
}

impl PodGetter for kube::Client {
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<Option<Pod>, kube::Error>> {
        let api = kube::Api::<Pod>::namespaced(self.clone(), namespace);
        let name = name.to_owned();
        Box::pin(async move { api.get_opt(&name).await })
    }
}

/// Pods as the engine needs them (UID, node, phase, `status.podIPs`, and `namespace/name`
/// for the live GET), by UID and by node, fed by [`PodIndex::apply`]. Pods not bound to
/// a node are not kept. A pod being deleted stays until its `Delete` event; a pod in
/// Succeeded or Failed stays, terminal. Clones share one index.
#[derive(Clone)]
pub struct PodIndex {
    state: Arc<RwLock<State>>,
    live: Arc<dyn PodGetter>,
    events: Events,
    namespaces: NamespaceIndex,
}

impl PodIndex {
    pub fn new(live: impl PodGetter) -> Self {
        Self {
            state: Arc::default(),
            live: Arc::new(live),
            events: Events::none(),
            namespaces: NamespaceIndex::default(),
        }
    }

    /// The pool choice reads the pods' namespaces from `namespaces`.
    pub fn with_namespaces(mut self, namespaces: NamespaceIndex) -> Self {
        self.namespaces = namespaces;
        self
    }

    /// The nodes with a pod of `namespace` waiting for its addresses (their demand's pools
    /// follow the namespace).
    pub fn waiting_in(&self, namespace: &str) -> Vec<NodeName> {
        let mut nodes = self.state.read().waiting_in(namespace);
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// Pods matching `agents` are the node agents' (`--agent-pod-selector`): the index
    /// keeps whether each is Ready ([`PodIndex::agent_pod_ready`]). Set it before the
    /// first event.
    pub fn with_agent_pods(self, agents: LabelSelector) -> Self {
        self.state.write().set_agents(agents);
        self
    }

    /// Whether `node`'s agent pod is Ready (its kubelet's probe of the agent's `/readyz`):
    /// `None` when no agent pod that is not terminal is bound to it; with two (a rollout),
    /// whether either is.
    pub fn agent_pod_ready(&self, node: &str) -> Option<bool> {
        self.state.read().agent_pod_ready(node)
    }

    /// Pod events (the reclaim's) go to `events`.
    pub fn with_events(mut self, events: Events) -> Self {
        self.events = events;
        self
    }

    /// Applies one watch event (relist semantics: see [`crate::index`]). Returns the
    /// nodes whose pods changed, sorted, each once: the engine's `on_pod_event` for each.
    pub fn apply(&self, event: &Event<Pod>) -> Vec<NodeName> {
        let mut touched = Vec::new();
        let mut st = self.state.write();
        match event {
            Event::Apply(pod) => {
                if let Some(uid) = pod_uid(pod) {
                    st.apply(pod, uid, &mut touched);
                }
            }
            Event::Delete(pod) => {
                if let Some(uid) = pod_uid(pod) {
                    st.remove(uid, &mut touched);
                }
            }
            Event::Init => st.begin_relist(),
            Event::InitApply(pod) => {
                if let Some(uid) = pod_uid(pod) {
                    st.relisted(pod, uid);
                }
            }
            Event::InitDone => st.finish_relist(&mut touched),
        }
        drop(st);
        touched.sort_unstable();
        touched.dedup();
        touched
    }

    /// The addresses live pods hold (no block holding one may be granted to another node).
    pub fn live_ips(&self) -> tidepool_ipam::AddrSet {
        self.state.read().live_ips()
    }

    /// True once the first relist is complete (the operator's readiness).
    pub fn ready(&self) -> bool {
        self.state.read().ready
    }
}

impl PodCache for PodIndex {
    fn with_pod<R>(&self, uid: PodUid, f: impl FnOnce(Option<&PodInfo>) -> R) -> R {
        f(self.state.read().pod(uid))
    }

    /// One read lock for the whole batch.
    fn with_pods<T>(
        &self,
        items: impl IntoIterator<Item = T>,
        uid: impl Fn(&T) -> PodUid,
        mut f: impl FnMut(T, Option<&PodInfo>),
    ) {
        let st = self.state.read();
        for item in items {
            let u = uid(&item);
            f(item, st.pod(u));
        }
    }

    fn pod_changes(&self, node: &str, since: Option<Since>) -> Option<PodChanges> {
        self.state.read().changes(node, since)
    }
}

impl PodView for PodIndex {
    /// A GET of `namespace/name` (the names a `used` entry records), whether or not the
    /// index holds the pod: a pods watch can run minutes behind the IPAMNode watch, and a
    /// pod it has not shown yet is not gone. A pod of that name with another UID is not
    /// this pod.
    async fn pod_live(
        &self,
        uid: PodUid,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PodInfo>, IpamError> {
        let pod = (self.live.get(namespace, name).await)
            .map_err(|e| IpamError::PodView(format!("GET pod {namespace}/{name}: {e}")))?;
        Ok(pod
            .filter(|p| p.metadata.uid.as_deref().and_then(super::parse_uid) == Some(uid.0))
            .map(|p| project(&p, uid, NodeName::from(bound_node(&p)), None).info))
    }

    fn pending_pods(&self, node: &str) -> Vec<PodUid> {
        self.state.read().pending(node)
    }

    fn bound_pods(&self, node: &str) -> usize {
        self.state.read().bound(node)
    }

    fn pending_total(&self) -> usize {
        self.state.read().pending_total()
    }

    /// A waiting pod's labels and annotation, and its namespace's; `None` while the
    /// namespace watch has not shown its namespace (the pod then counts for its node's
    /// default pools until it does).
    fn pool_subject(&self, uid: PodUid) -> Option<Subject> {
        let st = self.state.read();
        let (pod, key) = st.pool_terms(uid)?;
        let ns = self.namespaces.get(split_key(key).0)?;
        Some(Subject {
            pod_labels: pod.labels.clone(),
            pod_pools: pod.pools.clone(),
            namespace_labels: ns.labels.clone(),
            namespace_pools: ns.pools.clone(),
            ..Subject::default()
        })
    }

    fn event(
        &self,
        uid: PodUid,
        name: Option<(&str, &str)>,
        type_: EventType,
        reason: EventReason,
        message: String,
    ) {
        let key;
        let (namespace, name) = match name {
            Some(pair) => pair,
            None => {
                let Some(known) = self.state.read().key(uid).map(str::to_owned) else {
                    return;
                };
                key = known;
                split_key(&key)
            }
        };
        // `PodUid`'s display is the API's UUID form
        let uid = uid.to_string();
        self.events
            .emit_on_pod(namespace, name, &uid, type_, reason, message);
    }
}
