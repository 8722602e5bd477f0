//! A Pod cut down to what the engine needs.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use tidepool_ipam::pool::choice::{Labels, POOLS_ANNOTATION};
use tidepool_ipam::{NodeName, PodInfo, PodIps, PodPhase, PodUid};

use crate::index::{LabelSelector, parse_uid};

/// What the index keeps of a pod: the engine's [`PodInfo`], the pod's `namespace/name`
/// (for the live GET), whether it uses the host's network, and for a node agent's pod
/// whether it is Ready. No full Pod: two bytes more than the engine's part and the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PodRecord {
    pub info: PodInfo,
    /// `namespace/name` in one allocation (a namespace holds no `/`).
    pub key: Box<str>,
    /// `spec.hostNetwork`: the pod gets no address from tidepool, so it never waits for one.
    pub host_network: bool,
    /// A node agent's pod (`--agent-pod-selector`): whether its `Ready` condition is True
    /// (the kubelet probes the agent's `/readyz`). `None`: not an agent pod.
    pub agent_ready: Option<bool>,
    /// What the pool choice reads of a pod waiting for its addresses; none of the others
    /// (from its ADD on, a pod's pool is its `used` entries').
    pub pool_terms: Option<Box<PodTerms>>,
}

/// A waiting pod's labels and [`POOLS_ANNOTATION`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PodTerms {
    pub labels: Labels,
    pub pools: Option<String>,
}

/// A record's `key` as (namespace, name).
pub(super) fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// The pod's UID as the engine's number; `None` (logged) when it is missing or not a UUID.
pub(super) fn pod_uid(pod: &Pod) -> Option<PodUid> {
    let raw = pod.metadata.uid.as_deref().unwrap_or("");
    let uid = parse_uid(raw).map(PodUid);
    if uid.is_none() {
        tracing::warn!(
            pod = pod.metadata.name.as_deref().unwrap_or(""),
            uid = raw,
            "pod skipped: its UID is not a UUID"
        );
    }
    uid
}

/// The node the pod is bound to (`spec.nodeName`); empty when it is not bound yet.
pub(super) fn bound_node(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

/// The projection of a pod bound to `node` (see [`bound_node`]; the caller shares one
/// name among the node's pods); `agents` tells a node agent's pod by its labels (`None`:
/// no pod is one).
pub(super) fn project(
    pod: &Pod,
    uid: PodUid,
    node: NodeName,
    agents: Option<&LabelSelector>,
) -> PodRecord {
    let status = pod.status.as_ref();
    let phase = match status.and_then(|s| s.phase.as_deref()) {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        // Pending, Unknown (the node is unreachable: not terminal) or not reported yet
        _ => PodPhase::Pending,
    };
    let listed = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten();
    let mut addrs: Vec<&str> = listed.map(|p| p.ip.as_str()).collect();
    // older writers set only status.podIP
    if addrs.is_empty() {
        addrs.extend(status.and_then(|s| s.pod_ip.as_deref()));
    }
    let ips = PodIps::new(addrs.iter().filter_map(|a| a.parse::<IpAddr>().ok()));
    let meta = &pod.metadata;
    let key = format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    );
    let agent = (agents.zip(meta.labels.as_ref())).is_some_and(|(s, l)| s.matches(l));
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
    let waiting = !phase.is_terminal() && ips.is_empty() && !host_network;
    let pool_terms = waiting.then(|| {
        Box::new(PodTerms {
            labels: meta.labels.clone().unwrap_or_default(),
            pools: (meta.annotations.as_ref()).and_then(|a| a.get(POOLS_ANNOTATION).cloned()),
        })
    });
    PodRecord {
        info: PodInfo {
            uid,
            node,
            phase,
            ips,
        },
        key: key.into_boxed_str(),
        host_network,
        agent_ready: agent.then(|| is_ready(pod)),
        pool_terms,
    }
}

/// The pod's `Ready` condition is True.
fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}
