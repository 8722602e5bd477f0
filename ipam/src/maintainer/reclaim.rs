//! A pass's reclaim calls: the report of the node side's answers to tombstones, and the
//! live lookup that confirms a ready group.

use std::net::IpAddr;

use tokio::time::Instant;

use crate::plan::{Answered, NodeMemory};
use crate::pods::PodView;
use crate::reclaim::ReclaimGroup;
use crate::shared::{NodeHandle, Shared};
use crate::source::IpSource;
use crate::store::NodeStore;
use crate::types::{AllocationId, IpamNode, ReclaimAck};

use tidepool_metrics::record;

/// The node side answered the tombstone on `addr` ([`Answered::of`]): counted and reported
/// on the pod and the IPAMNode; a `live` answer is refused, so that allocation is not
/// tombstoned again until a live lookup finds the pod gone. The tombstone goes either way
/// (the plan dropped it).
pub(super) fn tombstone_answered<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    mem: &mut NodeMemory,
    node: &IpamNode,
    addr: &IpAddr,
    ack: &ReclaimAck,
) {
    let Some(a) = Answered::of(node, &h.name, addr, ack) else {
        return;
    };
    if a.refused {
        mem.reclaim.refuse(ack.pod_uid, ack.allocation);
    }
    record::reclaims(a.label, a.outcome, 1);
    let name = mem.reclaim.take_tombstoned(addr, ack.pod_uid);
    let name = name.as_ref().map(|n| (n.namespace(), n.name()));
    (shared.pods).event(ack.pod_uid, name, a.type_, a.reason, a.message.clone());
    shared.store.event(&h.name, a.type_, a.reason, a.message);
}

/// Confirms a ready reclaim group with a GET of its pod by the namespace and name its
/// `used` entry records (never an answer from the cache): the entries to tombstone. A
/// lookup that fails, or confirms nothing, starts the group's observations again; the
/// rest of the pass goes on.
pub(super) async fn confirm_live<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    mem: &mut NodeMemory,
    node: &IpamNode,
    now: Instant,
    g: &ReclaimGroup,
) -> Option<Vec<(IpAddr, AllocationId)>> {
    let entry = g.addrs.iter().find_map(|a| node.node.used.get(a))?;
    match (shared.pods)
        .pod_live(g.pod_uid, entry.pod.namespace(), entry.pod.name())
        .await
    {
        Ok(live) => mem.reclaim.confirm(now, g, &node.node, live.as_ref()),
        Err(e) => {
            tracing::debug!(node = %h.name, pod = %g.pod_uid, error = %e, "live lookup failed");
            mem.reclaim.restart(now, &g.addrs);
            None
        }
    }
}
