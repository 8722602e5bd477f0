//! [`PodWatch`]: the pods bound to this node (field selector `spec.nodeName`), list (from
//! the API server's watch cache) then watch with kube's default backoff, kept as [`LivePods`] — only each pod's UID, whether it
//! is terminal, and its `status.podIPs` (DESIGN.md "Watches": a full Pod costs ~35 KB, the
//! projection a few dozen bytes; each event is projected and the Pod dropped) — and its
//! labels and `ipam.tidepool.dev/pools` annotation; and every Namespace (listed the same
//! way), kept as its labels and that annotation: what the pool choice reads at ADD.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher as watch_objects};
use tidepool_api::convert::parse_uid;
use tidepool_ipam::PodUid;
use tidepool_ipam::pool::choice::Subject;
use tokio::sync::watch;

use super::KubeError;
use super::running::Running;
use super::view::Listed;
use super::watch::on_event;
use crate::pods::{LivePods, PodAddrs};
use crate::pool_choice::{Terms, subject};

struct Shared {
    node: String,
    /// `None` until the first list is done.
    live: watch::Sender<Option<Arc<LivePods>>>,
    /// Per pod UID: what the pool choice reads of the pod.
    terms: watch::Sender<Arc<BTreeMap<PodUid, Terms>>>,
    /// Per namespace: what the pool choice reads of it (`None` until the first list).
    namespaces: watch::Sender<Option<Arc<BTreeMap<String, Terms>>>>,
}

/// One event of either watch (boxed: a Pod is large).
enum Change {
    Pod(Box<watcher::Event<Pod>>),
    Namespace(Box<watcher::Event<Namespace>>),
}

/// The live pods on this node as the watch sees them. Cheap to clone; the watch stops with
/// the last clone.
#[derive(Clone)]
pub struct PodWatch {
    running: Arc<Running<Shared>>,
}

impl std::fmt::Debug for PodWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodWatch")
            .field("node", &self.running.shared.node)
            .field("synced", &self.live().is_some())
            .finish()
    }
}

impl PodWatch {
    /// Starts watching the pods bound to node `node` through `client` (on the current tokio
    /// runtime).
    pub fn start(client: kube::Client, node: &str) -> Self {
        let shared = Arc::new(Shared {
            node: node.to_string(),
            live: watch::Sender::new(None),
            terms: watch::Sender::new(Arc::default()),
            namespaces: watch::Sender::new(None),
        });
        let pods: Api<Pod> = Api::all(client.clone());
        let namespaces: Api<Namespace> = Api::all(client);
        // from the API server's watch cache (resourceVersion=0), as the kubelet and
        // client-go's informers list: one answer, no continue token to expire
        // (no page size: kube sends no resourceVersion=0 with a limit)
        let on_node = watcher::Config {
            page_size: None,
            ..watcher::Config::default()
                .fields(&format!("spec.nodeName={node}"))
                .any_semantic()
        };
        let every = watcher::Config {
            page_size: None,
            ..watcher::Config::default().any_semantic()
        };
        let events = futures::stream::select(
            watch_objects(pods, on_node)
                .default_backoff()
                .map_ok(|e| Change::Pod(Box::new(e))),
            watch_objects(namespaces, every)
                .default_backoff()
                .map_ok(|e| Change::Namespace(Box::new(e))),
        );
        let task = tokio::spawn(drive(shared.clone(), events));
        Self {
            running: Arc::new(Running { shared, task }),
        }
    }

    /// The live pods, once the first list is done (`None` before: nothing may be concluded
    /// from pods not seen yet). A relist keeps answering with what was seen until it is done.
    pub fn live(&self) -> Option<Arc<LivePods>> {
        self.running.shared.live.borrow().clone()
    }

    /// The pool choice's subject for pod `uid` in `namespace` (one not seen yet: without
    /// its labels and annotation).
    pub fn subject(&self, uid: PodUid, namespace: &str) -> Subject {
        let terms = self.running.shared.terms.borrow().clone();
        let namespaces = self.running.shared.namespaces.borrow().clone();
        subject(
            terms.get(&uid),
            namespaces.as_ref().and_then(|n| n.get(namespace)),
        )
    }

    /// Waits, at most `timeout`, for the first lists of the pods and the namespaces.
    pub async fn synced(&self, timeout: Duration) -> Result<Arc<LivePods>, KubeError> {
        let mut live = self.running.shared.live.subscribe();
        let mut namespaces = self.running.shared.namespaces.subscribe();
        let wait = async {
            namespaces.wait_for(Option::is_some).await.map(|_| ())?;
            live.wait_for(Option::is_some).await.map(|v| v.clone())
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(v)) => Ok(v.unwrap_or_default()),
            _ => Err(KubeError::PodsNotListed {
                node: self.running.shared.node.clone(),
                waited: timeout,
            }),
        }
    }
}

async fn drive(
    shared: Arc<Shared>,
    events: impl Stream<Item = Result<Change, watcher::Error>> + Send,
) {
    let mut seen: Listed<(PodAddrs, Terms)> = Listed::default();
    let mut namespaces: Listed<Terms> = Listed::default();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(Change::Pod(e)) => {
                // a node's pods are few (its max-pods): the view is rebuilt per event
                if on_event(&mut seen, *e, |p| Some(project(p))) && seen.listed() {
                    let live = Arc::new(LivePods::new(seen.values().map(|(a, _)| a)));
                    shared.live.send_replace(Some(live));
                    let terms = seen.values().filter_map(|(a, t)| Some((a.uid?, t.clone())));
                    shared.terms.send_replace(Arc::new(terms.collect()));
                }
            }
            Ok(Change::Namespace(e)) => {
                let read = |n: &Namespace| {
                    Some(Terms::of(
                        n.metadata.labels.as_ref(),
                        n.metadata.annotations.as_ref(),
                    ))
                };
                if on_event(&mut namespaces, *e, read) && namespaces.listed() {
                    let all = namespaces.entries().map(|(n, t)| (n.clone(), t.clone()));
                    shared
                        .namespaces
                        .send_replace(Some(Arc::new(all.collect())));
                }
            }
            // the watcher retries with its backoff; what was seen keeps answering
            Err(e) => tracing::warn!(node = %shared.node, error = %e, "pod watch failed; retrying"),
        }
    }
    tracing::error!(node = %shared.node, "{}", KubeError::WatchEnded { what: "the node's pods" });
}

/// A pod as the rules read it: its UID (if a UUID), whether it is terminal, its addresses
/// (`status.podIPs`, or `status.podIP` from older writers; unparsable ones skipped), and
/// what the pool choice reads of it.
fn project(pod: &Pod) -> (PodAddrs, Terms) {
    let m = &pod.metadata;
    (
        addrs(pod),
        Terms::of(m.labels.as_ref(), m.annotations.as_ref()),
    )
}

fn addrs(pod: &Pod) -> PodAddrs {
    let status = pod.status.as_ref();
    let terminal = matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    let mut listed: Vec<&str> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .collect();
    if listed.is_empty() {
        listed.extend(status.and_then(|s| s.pod_ip.as_deref()));
    }
    PodAddrs {
        uid: pod.metadata.uid.as_deref().and_then(parse_uid).map(PodUid),
        terminal,
        addrs: listed
            .iter()
            .filter_map(|a| a.parse::<IpAddr>().ok())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "p", "namespace": "default", "uid": UID },
            "spec": { "nodeName": "n1", "containers": [] },
            "status": status,
        }))
        .expect("a pod")
    }

    #[test]
    fn a_pod_projects_to_its_uid_phase_and_addresses() {
        let p = addrs(&pod(json!({
            "phase": "Running",
            "podIP": "10.0.0.9",
            "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}, {"ip": "nonsense"}],
        })));
        assert_eq!(p.uid, parse_uid(UID).map(PodUid));
        assert!(!p.terminal);
        let want: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        assert_eq!(p.addrs, want);
        // an older writer's podIP alone
        let old = addrs(&pod(json!({ "phase": "Pending", "podIP": "10.0.0.9" })));
        assert_eq!(old.addrs, vec!["10.0.0.9".parse::<IpAddr>().unwrap()]);
        for phase in ["Succeeded", "Failed"] {
            assert!(addrs(&pod(json!({ "phase": phase }))).terminal, "{phase}");
        }
        assert!(!addrs(&pod(json!({ "phase": "Unknown" }))).terminal);
    }
}
