//! Whole-node reclaim of a deleted node.

use tokio::time::Instant;

use super::Outcome;
use super::calls::{Requests, source_release};
use crate::budget::Api;
use crate::error::IpamError;
use crate::pods::PodView;
use crate::shared::{NodeHandle, Shared};
use crate::source::IpSource;
use crate::store::{EventType, NodeStore};
use crate::vocab::EventReason;

use tidepool_metrics::{ApiOp, ApiOutcome, KubeOp, ReclaimOutcome, ReclaimReason, record};

/// Whole-node reclaim (DESIGN.md): only when no non-terminal pod is bound to the node
/// name and either the source says the machine is gone or `node_reclaim_grace` has passed
/// since the Node's deletion; then every address goes back to the source and the
/// IPAMNode's finalizer goes.
pub(super) async fn node_deleted<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    deleted_at: Instant,
) -> Result<Outcome, IpamError> {
    let now = Instant::now();
    if shared.pods.bound_pods(&h.name) > 0 {
        return Ok(Outcome::Idle(None)); // pod deletions trigger us again
    }
    let due = deleted_at + shared.cfg.node_reclaim_grace;
    if now < due && !shared.source.machine_gone(&h.name) {
        return Ok(Outcome::Idle(Some(due)));
    }
    // one place in the kube budget's queue for this pass's writes (cluster-pool: the
    // blocks' deletes too), waited for in place
    let mut kube = shared.kube_budget.pass(h.priority.clone());
    let truth = shared.source.describe(&h.name).await?;
    if !truth.is_empty() {
        let kube_writes = shared.source.api() == Api::Kube;
        if !kube_writes {
            shared.source_budget.acquire(&h.priority).await;
        }
        let mut gate = Requests {
            kube: kube_writes.then_some(&mut kube),
            leader: &shared.leader,
        };
        let r = source_release(shared, h, &truth, &mut gate).await;
        // Also after a failure: the call may have taken effect with its reply lost, and
        // the retry then finds nothing to release (a spurious wake-up costs parked nodes
        // one cheap pass; a lost one strands them).
        shared.pool_freed();
        r?;
    }
    if let Some(node) = shared.store.get(&h.name).await? {
        let n = node.node.used.len() as u64;
        if n > 0 {
            record::reclaims(ReclaimReason::NodeDeleted, ReclaimOutcome::Reclaimed, n);
            shared.store.event(
                &h.name,
                EventType::Normal,
                EventReason::GarbageCollected,
                format!("reclaimed {n} addresses of deleted node {}", h.name),
            );
        }
    }
    let mut gate = Requests {
        kube: Some(&mut kube),
        leader: &shared.leader,
    };
    shared.store.remove(&h.name, &mut gate).await?;
    record::api_requests(ApiOp::Kube(KubeOp::Delete), ApiOutcome::Success);
    Ok(Outcome::Finished)
}
