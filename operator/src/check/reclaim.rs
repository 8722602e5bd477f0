//! Reclaim candidates: `status.used` entries the engine's own rule
//! ([`candidate_reason`]) would reclaim, judged against the listed pods.

use tidepool_ipam::candidate_reason;
use tidepool_ipam::{IpamNode, PodCache};

use super::report::ReclaimCandidate;
use crate::index::PodIndex;

/// Every entry of every IPAMNode whose pod is gone, terminal or a replaced sandbox, by node
/// and address.
pub(super) fn candidates(nodes: &[&IpamNode], pods: &PodIndex) -> Vec<ReclaimCandidate> {
    let mut out = Vec::new();
    for n in nodes {
        let used = &n.node.used;
        pods.with_pods(
            used.iter(),
            |(_, e)| e.pod_uid,
            |(address, e), pod| {
                let Some(reason) = candidate_reason(&address, e, used, pod) else {
                    return;
                };
                let tombstoned = n
                    .operator
                    .reclaim
                    .get(&address)
                    .is_some_and(|t| t.pod_uid == e.pod_uid && t.allocation == e.allocation);
                out.push(ReclaimCandidate {
                    node: n.name.to_string(),
                    address,
                    pod_uid: e.pod_uid.to_string(),
                    namespace: e.pod.namespace().to_string(),
                    pod: e.pod.name().to_string(),
                    reason: reason.as_str(),
                    tombstoned,
                });
            },
        );
    }
    out.sort_by(|a, b| (&a.node, a.address).cmp(&(&b.node, b.address)));
    out
}
