//! The calls a pass makes through the budgets: a source budget token per source call, the
//! pass's place in the kube budget's queue for its API server writes, the source's
//! allocate and release, and the IPAMNode's write, each counted.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::Local;
use crate::addrs::AddrSet;
use crate::budget::{Api, Pass};
use crate::error::IpamError;
use crate::gate::Gate;
use crate::pods::PodView;
use crate::shared::{NodeHandle, Shared};
use crate::source::IpSource;
use crate::store::NodeStore;
use crate::trigger::Reason;
use crate::types::{Family, NodeUid, OperatorFields};

use tidepool_metrics::{ApiOp, KubeOp, Outcome, SourceOp, record};

/// A source budget token for one call of this pass. `pending`: the pass has changes of its
/// own to write. Returns false when the call must wait for the next pass, which is then
/// triggered.
///
/// Source calls wait for the source budget, but a maintainer waiting there must not miss
/// its node's other work. Changes this pass already made (tombstones, withdrawn marks, a
/// release) are written at once unless a token is free right now; and a pass with nothing
/// else to write waits only until new work arrives for the node or its next deadline
/// passes. Either way the calls follow in the next pass, which keeps the place in the
/// queue.
pub(super) async fn source_token<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &mut Local,
    pending: bool,
    deadline: Option<Instant>,
    deferred: &mut bool,
) -> bool {
    if shared.source.api() == Api::Kube {
        // API server writes: the pass's one place in the kube budget's queue (see
        // `kube_place`), taken already, admits each of the call's requests.
        return true;
    }
    let got = match (local.ticket.get_mut(), pending) {
        // no place in the queue yet and changes to write: only a token free right now
        (None, true) => shared.call_budget().try_acquire(),
        // our place may have come up meanwhile
        (Some(t), true) => {
            tokio::select! {
                biased;
                _ = t.as_mut() => true,
                _ = std::future::ready(()) => false,
            }
        }
        (_, false) => {
            let t = local
                .ticket
                .get_or_take(|| Box::pin(shared.call_budget().acquire_owned(h.priority.clone())));
            let until = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = t.as_mut() => true,
                _ = h.work.notified() => false,
                _ = until => false,
            }
        }
    };
    if got {
        local.ticket.clear();
    } else {
        local.ticket.keep();
        if !*deferred {
            *deferred = true;
            h.trigger.trigger(Reason::Retry);
        }
    }
    got
}

/// Admits a call's API requests in a pass: each API server write takes a token of the
/// pass's kube place (a claim of k blocks is k writes; an IPAMNode write its spec and its
/// status apply); a source call that is not a kube write took its one token from the
/// source budget already. Each request checks the lead after its wait.
pub(super) struct Requests<'a> {
    pub(super) kube: Option<&'a mut Pass>,
    pub(super) leader: &'a tokio::sync::watch::Receiver<bool>,
}

pub(super) fn requests<'a, S: IpSource, N: NodeStore, P: PodView>(
    shared: &'a Shared<S, N, P>,
    h: &NodeHandle,
    local: &'a mut Local,
) -> Requests<'a> {
    let kube = match shared.source.api() {
        Api::Kube => Some(kube_pass(shared, h, local)),
        Api::Source => None,
    };
    Requests {
        kube,
        leader: &shared.leader,
    }
}

impl Gate for Requests<'_> {
    async fn request(&mut self) -> Result<(), IpamError> {
        if let Some(pass) = self.kube.as_deref_mut() {
            pass.call().await;
        }
        if *self.leader.borrow() {
            Ok(())
        } else {
            Err(IpamError::NotLeader)
        }
    }
}

pub(super) async fn source_allocate<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    family: Family,
    pool: Option<&str>,
    count: u64,
    gate: &mut impl Gate,
) -> Result<AddrSet, IpamError> {
    if !shared.is_leader() {
        return Err(IpamError::NotLeader);
    }
    let started = Instant::now();
    let r = match pool {
        None => shared.source.allocate(&h.name, family, count, gate).await,
        Some(p) => {
            (shared
                .source
                .allocate_from_pool(&h.name, family, p, count, gate))
            .await
        }
    };
    let outcome = Outcome::of(&r);
    record::api_requests(ApiOp::Source(SourceOp::Allocate), outcome.into());
    record::allocation_ops(shared.source.name(), outcome);
    record::allocation_duration(SourceOp::Allocate, outcome, started.elapsed());
    if let Ok(addrs) = &r {
        record::ips_allocated(family.into(), addrs.count(family));
    }
    r
}

pub(super) async fn source_release<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    addrs: &AddrSet,
    gate: &mut impl Gate,
) -> Result<(), IpamError> {
    if !shared.is_leader() {
        return Err(IpamError::NotLeader);
    }
    let started = Instant::now();
    let r = shared.source.release(&h.name, addrs, gate).await;
    let outcome = Outcome::of(&r);
    record::api_requests(ApiOp::Source(SourceOp::Release), outcome.into());
    record::release_ops(shared.source.name(), outcome);
    record::allocation_duration(SourceOp::Release, outcome, started.elapsed());
    if r.is_ok() {
        for f in Family::ALL {
            let n = addrs.count(f);
            if n > 0 {
                record::ips_released(f.into(), n);
            }
        }
    }
    r
}

/// This pass's place in the kube budget's queue, for its next API server write: the one
/// [`kube_place`] waited for, or (a source whose calls are not kube writes: the pass's only
/// kube write is its IPAMNode apply) a new one, then waited for in place.
pub(super) fn kube_pass<'a, S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &'a mut Local,
) -> &'a mut Pass {
    local
        .kube
        .get_or_take(|| shared.kube_budget.pass(h.priority.clone()))
}

/// Waits for this pass's place in the kube budget's queue (a source whose calls are kube
/// writes), as `source_token` waits for the source budget: the wait ends early when the
/// node has new work or its next deadline passes. Returns false then: the place is kept
/// (parked, so it stalls nobody) for the next pass, which is triggered.
pub(super) async fn kube_place<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &mut Local,
    deadline: Option<Instant>,
) -> bool {
    let pass = kube_pass(shared, h, local);
    if pass.is_admitted() {
        return true; // an earlier attempt of this pass (a conflict's retry) was admitted
    }
    let until = async {
        match deadline {
            Some(d) if d > Instant::now() => tokio::time::sleep_until(d).await,
            _ => std::future::pending().await,
        }
    };
    let admitted = tokio::select! {
        biased;
        _ = pass.admitted() => true,
        _ = h.work.notified() => false,
        _ = until => false,
    };
    if !admitted {
        local.kube.keep();
        h.trigger.trigger(Reason::Retry);
    }
    admitted
}

/// The pass's one write of the operator's fields, on the pass's kube place, with the UID of
/// the Node it is for (an IPAMNode that names another, adopted or changed by someone else,
/// gets the Node's).
pub(super) async fn write<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    kube: &mut Pass,
    node_uid: NodeUid,
    fields: OperatorFields,
) -> Result<(), IpamError> {
    // each of the write's requests (a spec and a status apply) on the pass's place
    let mut gate = Requests {
        kube: Some(kube),
        leader: &shared.leader,
    };
    let r = shared
        .store
        .apply_operator(&h.name, node_uid, fields, &mut gate)
        .await;
    record::api_requests(ApiOp::Kube(KubeOp::Apply), Outcome::of(&r).into());
    let written = r?;
    if let Some(rv) = &written.resource_version {
        h.own_write.store(rv.fingerprint(), Ordering::Relaxed);
    }
    Ok(())
}
