//! A Node cut down to what the engine needs, and its labels.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use tidepool_api::names::EXHAUSTED_TAINT;
use tidepool_ipam::{NodeInfo, NodeName, NodeUid};

use crate::index::parse_uid;

/// What the index keeps of a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NodeRecord {
    pub info: NodeInfo,
    pub labels: BTreeMap<String, String>,
    /// Whether the Node carries the exhaustion taint (of any effect).
    pub exhausted_taint: bool,
}

/// The Node's projection; `None` (logged) when it has no name or its UID is not a UUID.
pub(super) fn project(node: &Node) -> Option<NodeRecord> {
    let meta = &node.metadata;
    let name = meta.name.as_deref().filter(|n| !n.is_empty())?;
    let Some(uid) = meta.uid.as_deref().and_then(parse_uid).map(NodeUid) else {
        let uid = meta.uid.as_deref().unwrap_or("");
        tracing::warn!(node = name, uid, "node skipped: its UID is not a UUID");
        return None;
    };
    let info = NodeInfo {
        name: NodeName::from(name),
        uid,
        allocatable_pods: allocatable_pods(node, name),
        cordoned: node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
        terminating: meta.deletion_timestamp.is_some(),
    };
    let labels = meta.labels.clone().unwrap_or_default();
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref());
    let exhausted_taint = taints
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == EXHAUSTED_TAINT);
    Some(NodeRecord {
        info,
        labels,
        exhausted_taint,
    })
}

/// `status.allocatable["pods"]` as a plain count (the form kubelets report).
fn allocatable_pods(node: &Node, name: &str) -> u32 {
    let status = node.status.as_ref();
    let quantity = status.and_then(|s| s.allocatable.as_ref()?.get("pods"));
    let Some(q) = quantity else {
        return NodeInfo::DEFAULT_ALLOCATABLE_PODS;
    };
    q.0.trim().parse().unwrap_or_else(|_| {
        tracing::warn!(
            node = name,
            pods = q.0,
            default = NodeInfo::DEFAULT_ALLOCATABLE_PODS,
            "allocatable pods is not a plain count; using the default"
        );
        NodeInfo::DEFAULT_ALLOCATABLE_PODS
    })
}
