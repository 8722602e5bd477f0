//! One node's pool maintainer: a task that waits on its debounced trigger, runs a
//! maintenance pass (plan, then execute the plan's calls through the budgets, then one
//! coalesced write), and schedules its own next deadline or backs off on failure.
//!
//! A pass ([`pass`]) reads the node, plans ([`crate::plan`], where its decisions are),
//! and runs the plan in named phases: confirm reclaims, release, claim, mark, write.
//! The calls the phases make through the budgets are in `calls`, a deleted node's
//! whole-node reclaim in `deleted`, what an IPAMNode on its way out waits for (its
//! `Deleting` condition) in `deletion`.

mod calls;
mod conditions;
mod deleted;
mod deletion;
mod pass;
mod place;
mod pools;
mod reclaim;
#[cfg(test)]
mod scarcity_tests;
#[cfg(test)]
pub(crate) mod tests;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use crate::backoff::{Backoff, Retry};
use crate::budget::Pass;
use crate::config::EngineConfig;
use crate::error::IpamError;
use crate::ip_wait::IpWaits;
use crate::plan::NodeMemory;
use crate::pods::PodView;
use crate::shared::{NodeHandle, Shared};
use crate::source::IpSource;
use crate::store::NodeStore;
use crate::trigger::{Reason, TriggerRx};
use crate::types::{BlockedPool, Family, IpamNode};
use crate::vocab::Blocked;
use place::Place;

/// What a maintainer remembers between passes.
struct Local {
    mem: NodeMemory,
    backoff: Backoff,
    /// The leader epoch this maintainer last seeded in (0 = never).
    seeded_epoch: u64,
    /// The source may hold something our fields do not show (a call failed after effect).
    needs_describe: bool,
    /// The family whose claim failed as exhausted in the last pass.
    exhausted: Option<Family>,
    /// That claim found the node's pool Invalid (not a lack of addresses).
    pool_invalid: bool,
    /// The pools other than the default whose claims got nothing in the last pass.
    exhausted_pools: Vec<BlockedPool>,
    /// What the node's waiting pods were told of their pools.
    told: pools::Told,
    /// The last pass's own next deadline (reclaim's second observation, the release
    /// delay), kept when the pass failed.
    deadline: Option<Instant>,
    /// Our place in the source budget's queue.
    ticket: Place<Ticket>,
    /// This pass's place in the kube budget's queue: one for all of the pass's API server
    /// writes ([`Pass`]). Kept to the next pass only when its wait was interrupted before
    /// it was admitted (a source whose every call is a kube write: see
    /// [`calls::kube_place`]).
    kube: Place<Pass>,
    /// Pods seen waiting for an address, for `tidepool_ipam_pod_ip_wait_seconds`.
    waits: IpWaits,
}

impl Local {
    fn new(cfg: &EngineConfig, node: &str) -> Self {
        Local {
            mem: NodeMemory::default(),
            backoff: Backoff::new(&cfg.backoff, seed_of(node)),
            seeded_epoch: 0,
            needs_describe: false,
            exhausted: None,
            pool_invalid: false,
            exhausted_pools: Vec::new(),
            told: pools::Told::new(),
            deadline: None,
            ticket: Place::Empty,
            kube: Place::Empty,
            waits: IpWaits::default(),
        }
    }
}

type Ticket = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// How a pass ended.
enum Outcome {
    /// Done; run again at this deadline if any.
    Idle(Option<Instant>),
    /// The node is gone and its addresses were reclaimed: the maintainer ends.
    Finished,
}

fn seed_of(name: &str) -> u64 {
    // FNV-1a: deterministic per node, independent of hash-map state.
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Local {
    /// Why the last pass's claim found nothing, if it did: the node's pool is Invalid, or
    /// it has nothing left for it.
    fn claim_blocked(&self) -> Option<Blocked> {
        self.exhausted.map(|_| match self.pool_invalid {
            true => Blocked::PoolInvalid,
            false => Blocked::Exhausted,
        })
    }
}

/// The maintainer task.
pub(crate) async fn run<S: IpSource, N: NodeStore, P: PodView>(
    shared: Arc<Shared<S, N, P>>,
    h: Arc<NodeHandle>,
    mut rx: TriggerRx,
) {
    let mut local = Local::new(&shared.cfg, &h.name);
    let mut retry_at: Option<Instant> = None;
    while let Some(run) = rx.next().await {
        if h.removed.load(Ordering::Relaxed) {
            break;
        }
        // A run asked for while the node backs off (a resync, a pod or store event) waits
        // for the retry; only a new lead or the Node's deletion does not.
        if let Some(t) = retry_at
            && Instant::now() < t
            && !run.reasons.contains(Reason::Leadership)
            && !run.reasons.contains(Reason::Delete)
        {
            rx.finished(&run);
            h.trigger.trigger_at(t, Reason::Retry);
            continue;
        }
        retry_at = None;
        local.ticket.begin_pass();
        local.kube.begin_pass();
        tracing::debug!(node = %h.name, reasons = %run.reasons, "maintenance pass");
        // boxed: a pass's future is kilobytes (the store's and the source's calls inline),
        // and thousands of maintainers sit idle between passes
        let result = Box::pin(pass(&shared, &h, &mut local)).await;
        shared.counts_may_change();
        rx.finished(&run);
        local.ticket.end_pass(result.is_ok());
        local.kube.end_pass(result.is_ok());
        match result {
            Ok(Outcome::Finished) => {
                if shared.remove_if_deleted(&h) {
                    break;
                }
                // the Node came back while its old incarnation was reclaimed: what this
                // maintainer knew went with the IPAMNode, and it starts afresh
                local = Local::new(&shared.cfg, &h.name);
                h.trigger.trigger(Reason::Upsert);
            }
            Ok(Outcome::Idle(deadline)) => {
                tracing::debug!(node = %h.name, next = ?deadline, "maintenance pass done");
                if let Some(d) = deadline {
                    h.trigger.trigger_at(d, Reason::Deadline);
                }
                park_for_pools(&shared, &h, &local);
            }
            Err(e) => {
                tracing::debug!(node = %h.name, error = %e, "maintenance pass failed");
                let now = Instant::now();
                match local.backoff.on_failure(
                    &shared.cfg.backoff,
                    e.class(),
                    now,
                    shared.node_count(),
                ) {
                    Retry::After(d) => {
                        retry_at = Some(now + d);
                        h.trigger.trigger_at(now + d, Reason::Retry);
                    }
                    Retry::ParkUntilPoolFrees => {
                        // Parked for claims only: reclaim and release deadlines still run
                        // (a reclaim is what frees an exhausted pool).
                        if let Some(d) = local.deadline {
                            h.trigger.trigger_at(d, Reason::Deadline);
                        }
                        shared.park(&h.name);
                        // Park first, then look: a release between the failed claim and
                        // the park (its wake-up found nobody parked), or a claim that lost
                        // a race for a partly freed pool (concurrent claims all prepared
                        // against the same free count), must not wait for a release
                        // that may never come.
                        let claimable = local.exhausted.is_some_and(|f| {
                            shared.source.prepare_allocation(&h.name, f, 1, u64::MAX) > 0
                        });
                        if claimable {
                            h.trigger.trigger(Reason::PoolFreed);
                        }
                    }
                    Retry::UntilSpecChanges => {}
                }
            }
        }
    }
}

/// A pass that found another pool than the node's default exhausted parks the node for
/// it (the node's other work goes on): a release of any pool wakes it. Park first, then
/// look, as for the default pool (a release between the claim and the park).
fn park_for_pools<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &Local,
) {
    if local.exhausted_pools.is_empty() {
        return;
    }
    shared.park(&h.name);
    let claimable = (local.exhausted_pools.iter()).any(|p| {
        (shared.source).prepare_pool_allocation(&h.name, p.family, &p.pool, 1, u64::MAX) > 0
    });
    if claimable {
        h.trigger.trigger(Reason::PoolFreed);
    }
}

/// One pass: nothing while not leading, a deleted node's whole-node reclaim, or (retried
/// on a conflict, from a live read) [`pass::pass_once`] over the node as stored.
async fn pass<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &mut Local,
) -> Result<Outcome, IpamError> {
    if !shared.is_leader() {
        // No mutating call while we do not lead; clocks restart with the next lead.
        local.seeded_epoch = 0;
        local.ticket.clear();
        local.kube.clear();
        local.waits.clear();
        return Ok(Outcome::Idle(None));
    }
    let epoch = shared.leader_epoch.load(Ordering::Relaxed);
    let mut live = false;
    if local.seeded_epoch != epoch {
        // Seed from the server before the first write of this lead.
        local.mem.reset();
        local.needs_describe = true;
        live = true;
    }
    let (info, deleted_at) = {
        let st = h.state.lock();
        (st.info.clone(), st.deleted_at)
    };
    if let Some(at) = deleted_at {
        // Its calls wait in the queue afresh: a kept place nobody polls could hold the
        // budget's dispatcher role while they wait behind it.
        local.ticket.clear();
        local.kube.clear();
        return deleted::node_deleted(shared, h, at).await;
    }
    let mut attempt = 0;
    loop {
        let node = if live {
            shared.store.get(&h.name).await?
        } else {
            shared.store.cached(&h.name)
        };
        let node = match node {
            Some(n) if n.node_uid == info.uid => n,
            // Left by an older Node of the same name (a kubelet that re-registered, or a
            // new machine under a reused name): adopt it, so nothing it records is lost.
            // Its addresses are checked against the source, and the entries of pods that
            // are gone are reclaimed pod by pod; the write records the new UID.
            Some(n) => {
                if !live {
                    live = true;
                    continue;
                }
                local.needs_describe = true;
                n
            }
            // Missing: the first write creates it.
            None => Arc::new(IpamNode::new(h.name.clone(), info.uid)),
        };
        local.seeded_epoch = epoch;
        match pass::pass_once(shared, h, local, &node, &info).await {
            Err(IpamError::Conflict { .. }) if attempt < shared.cfg.conflict_retries => {
                attempt += 1;
                live = true;
                local.needs_describe = true;
            }
            r => return r,
        }
    }
}
