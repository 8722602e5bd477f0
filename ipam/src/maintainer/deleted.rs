//! Whole-node reclaim of a deleted node.

use std::borrow::Cow;
use std::time::Duration;

use tokio::time::Instant;

use super::Outcome;
use super::calls::{self, Requests, source_release};
use super::deletion::{Leaving, deletion_wait, set_deleting_condition};
use crate::budget::Api;
use crate::error::IpamError;
use crate::pods::PodView;
use crate::shared::{NodeHandle, Shared};
use crate::source::IpSource;
use crate::store::{EventType, NodeStore};
use crate::vocab::{DeletionWait, EventReason};

use tidepool_metrics::{ApiOp, ApiOutcome, KubeOp, ReclaimOutcome, ReclaimReason, record};

/// Whole-node reclaim (DESIGN.md): only when no non-terminal pod is bound to the node
/// name and either the source says the machine is gone or `node_reclaim_grace` has passed
/// since the Node's deletion; then every address goes back to the source and the
/// IPAMNode's finalizer goes. Until then its `Deleting` condition says what it waits for.
pub(super) async fn node_deleted<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    deleted_at: Instant,
) -> Result<Outcome, IpamError> {
    let bound_pods = shared.pods.bound_pods(&h.name);
    let due = deleted_at + shared.cfg.node_reclaim_grace;
    let grace_left = match shared.source.machine_gone(&h.name) {
        true => Duration::ZERO,
        false => due.saturating_duration_since(Instant::now()),
    };
    let leaving = Leaving::NodeGone {
        bound_pods,
        grace_left,
    };
    if let Some(wait) = deletion_wait(&h.name, shared.cfg.node_reclaim_grace, leaving) {
        say_why(shared, h, wait).await?;
        // pod deletions trigger us again
        return Ok(Outcome::Idle((bound_pods == 0).then_some(due)));
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

/// What the IPAMNode waits for, in its `Deleting` condition: written when it changed (an
/// IPAMNode the store never wrote, or no longer holds, is not written).
async fn say_why<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    wait: (DeletionWait, String),
) -> Result<(), IpamError> {
    let cached = shared.store.cached(&h.name);
    let Some(node) = cached.filter(|n| n.resource_version.is_some()) else {
        return Ok(());
    };
    let mut fields = Cow::Borrowed(&node.operator);
    set_deleting_condition(&mut fields, Some(wait), shared.clock.utc());
    let Cow::Owned(fields) = fields else {
        return Ok(());
    };
    let mut kube = shared.kube_budget.pass(h.priority.clone());
    calls::write(shared, h, &mut kube, node.node_uid, fields).await
}
