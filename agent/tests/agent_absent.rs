//! Issue 16's bad input, on the whole system (root: network namespaces, as `e2e.rs`): a
//! node whose agent never starts. Its pods stay Pending without addresses (the kubelet
//! stand-in's ADD keeps failing and is retried), its IPAMNode has no `AgentReady`
//! condition, and the operator's `AgentNotReady` event on it says why — while the pods of
//! the other nodes run with their addresses as usual. Then its agent starts, and its pods
//! run.
//!
//! Run: `cargo build -p tidepool-operator --bin tidepool-operator && cargo test -p
//! tidepool-agent --test agent_absent`.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::e2e::{Cluster, Tuning};
use common::eventually;
use common::kubelet::{Backoff, Kubelet, Sandbox};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::json;
use tidepool_api as api;
use tidepool_api::names::{condition, reason};

/// The node whose agent is not started at first.
const ABSENT: &str = "node-x";

/// Pods `{node}-{i}` bound to `node` at creation (no scheduling: the scheduler stand-in
/// would spread them), as a YAML stream of JSON documents.
fn pods_on(node: &str, count: usize) -> String {
    let docs: Vec<String> = (0..count)
        .map(|i| {
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{node}-{i}"), "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
            })
            .to_string()
        })
        .collect();
    docs.join("\n---\n")
}

/// The kubelet's sandboxes of the pods on `node`: (pod name, sandbox).
fn sandboxes_on(k: &Kubelet, node: &str) -> Vec<(String, Sandbox)> {
    k.record(|r| {
        r.sandboxes
            .iter()
            .map(|(uid, s)| (r.names[uid].clone(), s.clone()))
            .filter(|(name, _)| name.starts_with(&format!("{node}-")))
            .collect()
    })
}

/// The pods on `node` that run with their addresses, as the API has them: name → podIP.
async fn running_with_ips(pods: &Api<Pod>, node: &str) -> Vec<(String, String)> {
    let list = pods.list(&ListParams::default()).await.expect("list pods");
    list.items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter_map(|p| {
            let st = p.status?;
            let ip = st.pod_ips?.first()?.ip.clone();
            (st.phase.as_deref() == Some("Running")).then_some((p.metadata.name?, ip))
        })
        .collect()
}

/// The `AgentNotReady` events on IPAMNode `node`.
async fn agent_not_ready(events: &Api<Event>, node: &str) -> Vec<Event> {
    let list = events.list(&ListParams::default()).await.expect("events");
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason::AGENT_NOT_READY))
        .filter(|e| {
            let r = e.regarding.as_ref();
            r.and_then(|r| r.kind.as_deref()) == Some("IPAMNode")
                && r.and_then(|r| r.name.as_deref()) == Some(node)
        })
        .collect()
}

/// The `AgentReady` condition's status on IPAMNode `node` (None: there is none).
async fn agent_ready(ipamnodes: &Api<api::IPAMNode>, node: &str) -> Option<String> {
    let n = ipamnodes.get(node).await.expect("the IPAMNode");
    let conditions = n.status.map(|s| s.conditions).unwrap_or_default();
    conditions
        .into_iter()
        .find(|c| c.type_ == condition::AGENT_READY)
        .map(|c| c.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_agent_never_starts_waits_and_says_why_and_nothing_else_is_affected() {
    let mut cluster = Cluster::start("abs", Tuning::default()).await;
    cluster.apply_pool(&["10.77.0.0/24"], 28).await;
    cluster.start_operator();
    cluster.add_node("node-a").await;
    cluster.add_node("node-b").await;
    cluster.add_node_without_agent(ABSENT).await;
    let kubelet = cluster.start_kubelet(Backoff {
        first: Duration::from_millis(500),
        cap: Duration::from_secs(2),
    });
    for node in [ABSENT, "node-a", "node-b"] {
        cluster.kubectl.apply(&pods_on(node, 3)).await;
    }
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), "default");
    let events: Api<Event> = Api::namespaced(cluster.admin.clone(), "default");
    let ipamnodes: Api<api::IPAMNode> = Api::all(cluster.admin.clone());

    // the other nodes' pods run with their addresses, one address each
    let mut others = Vec::new();
    for node in ["node-a", "node-b"] {
        let on = eventually(&format!("{node}'s three pods running"), || {
            let pods = pods.clone();
            async move {
                let r = running_with_ips(&pods, node).await;
                (r.len() == 3).then_some(r)
            }
        })
        .await;
        others.extend(on.into_iter().map(|(_, ip)| ip));
    }
    let distinct: BTreeSet<&String> = others.iter().collect();
    assert_eq!(distinct.len(), 6, "one address per pod: {others:?}");

    // node-x: the operator says why its pods wait
    let event = eventually("an AgentNotReady event on node-x", || {
        let events = events.clone();
        async move { agent_not_ready(&events, ABSENT).await.into_iter().next() }
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    for words in [
        "3 pod(s) on node node-x have waited for an address since",
        "its agent has never reported (no AgentReady condition)",
        "check the tidepool-agent DaemonSet pod on node node-x",
        "spec.nodeName=node-x",
    ] {
        assert!(note.contains(words), "{words:?} not in {note:?}");
    }
    // ... and they do wait: Pending, no address, their ADDs failing and retried
    eventually("node-x's ADDs failed and retried", || {
        let failed = kubelet.record(|r| r.failed_adds);
        std::future::ready((failed >= 6).then_some(()))
    })
    .await;
    let waiting = sandboxes_on(&kubelet, ABSENT);
    assert_eq!(waiting.len(), 3, "{waiting:?}");
    assert!(
        waiting.iter().all(|(_, s)| *s == Sandbox::Starting),
        "{waiting:?}"
    );
    for p in pods.list(&ListParams::default()).await.expect("pods").items {
        if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(ABSENT) {
            continue;
        }
        let st = p.status.unwrap_or_default();
        assert_ne!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.pod_ips.unwrap_or_default(), vec![]);
    }
    assert_eq!(agent_ready(&ipamnodes, ABSENT).await, None);
    // nothing else: the serving nodes are ready, and have no such event
    for node in ["node-a", "node-b"] {
        assert_eq!(agent_ready(&ipamnodes, node).await.as_deref(), Some("True"));
        assert_eq!(agent_not_ready(&events, node).await, vec![], "{node}");
        assert_eq!(running_with_ips(&pods, node).await.len(), 3, "{node}");
    }

    // its agent starts: its pods run with addresses of their own
    cluster.start_agent(ABSENT);
    cluster.until_serving(ABSENT).await;
    let on_x = eventually("node-x's three pods running", || {
        let pods = pods.clone();
        async move {
            let r = running_with_ips(&pods, ABSENT).await;
            (r.len() == 3).then_some(r)
        }
    })
    .await;
    let mut all: BTreeSet<String> = others.into_iter().collect();
    all.extend(on_x.into_iter().map(|(_, ip)| ip));
    assert_eq!(all.len(), 9, "one address per pod: {all:?}");
    assert_eq!(
        agent_ready(&ipamnodes, ABSENT).await.as_deref(),
        Some("True")
    );
    drop(kubelet);
}
