//! One node's pool maintainer: a task that waits on its debounced trigger, runs a
//! maintenance pass (plan, then execute the plan's calls through the budgets, then one
//! coalesced write), and schedules its own next deadline or backs off on failure.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use crate::addrs::{AddrMap, AddrSet};
use crate::backoff::{Backoff, Retry};
use crate::budget::{Api, Pass};
use crate::error::{ErrorClass, IpamError};
use crate::gate::Gate;
use crate::handshake;
use crate::ip_wait::IpWaits;
use crate::plan::{self, NodeMemory, Snapshot};
use crate::pods::PodView;
use crate::reclaim::ReclaimGroup;
use crate::shared::{NodeHandle, Shared};
use crate::source::IpSource;
use crate::store::{EventType, NodeStore};
use crate::trigger::{Reason, TriggerRx};
use crate::types::{
    AllocationId, Condition, Family, IpamNode, NodeName, OperatorFields, PerFamily, ReclaimAck,
    ReclaimOutcome, ReleaseState, Tombstone,
};
use crate::vocab::{Blocked, ConditionReason, ConditionType, EventReason};

use tidepool_metrics as m;

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
    /// The last pass's own next deadline (reclaim's second observation, the release
    /// delay), kept when the pass failed.
    deadline: Option<Instant>,
    /// Our place in the source budget's queue, kept from a pass whose wait was
    /// interrupted to the next one. Only then: a place nobody polls could hold the
    /// budget's dispatcher role and stall every other node.
    ticket: Option<Ticket>,
    keep_ticket: bool,
    /// This pass's place in the kube budget's queue: one for all of the pass's API server
    /// writes ([`Pass`]). Kept to the next pass only when its wait was interrupted before
    /// it was admitted (a source whose every call is a kube write: see [`kube_place`]).
    kube: Option<Pass>,
    keep_kube: bool,
    /// Pods seen waiting for an address, for `tidepool_ipam_pod_ip_wait_seconds`.
    waits: IpWaits,
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

/// The maintainer task.
pub(crate) async fn run<S: IpSource, N: NodeStore, P: PodView>(
    shared: Arc<Shared<S, N, P>>,
    h: Arc<NodeHandle>,
    mut rx: TriggerRx,
) {
    let mut local = Local {
        mem: NodeMemory::default(),
        backoff: Backoff::new(&shared.cfg.backoff, seed_of(&h.name)),
        seeded_epoch: 0,
        needs_describe: false,
        exhausted: None,
        deadline: None,
        ticket: None,
        keep_ticket: false,
        kube: None,
        keep_kube: false,
        waits: IpWaits::default(),
    };
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
        local.keep_ticket = false;
        local.keep_kube = false;
        let result = pass(&shared, &h, &mut local).await;
        rx.finished(&run);
        if !local.keep_ticket || result.is_err() {
            local.ticket = None;
        }
        if !local.keep_kube || result.is_err() {
            local.kube = None;
        }
        match result {
            Ok(Outcome::Finished) => {
                shared.remove(&h);
                break;
            }
            Ok(Outcome::Idle(deadline)) => {
                if let Some(d) = deadline {
                    h.trigger.trigger_at(d, Reason::Deadline);
                }
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

/// Records one API call's outcome.
fn api_call(api: &'static str, op: &'static str, ok: bool) {
    let outcome = if ok { "success" } else { "failure" };
    metrics::counter!(m::API_REQUESTS_TOTAL, "api" => api, "op" => op, "outcome" => outcome)
        .increment(1);
}

async fn pass<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &mut Local,
) -> Result<Outcome, IpamError> {
    if !shared.is_leader() {
        // No mutating call while we do not lead; clocks restart with the next lead.
        local.seeded_epoch = 0;
        local.ticket = None;
        local.kube = None;
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
        local.ticket = None;
        local.kube = None;
        return node_deleted(shared, h, at).await;
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
        match pass_once(shared, h, local, &node, &info).await {
            Err(IpamError::Conflict { .. }) if attempt < shared.cfg.conflict_retries => {
                attempt += 1;
                live = true;
                local.needs_describe = true;
            }
            r => return r,
        }
    }
}

async fn pass_once<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &mut Local,
    node: &IpamNode,
    info: &crate::types::NodeInfo,
) -> Result<Outcome, IpamError> {
    let now = Instant::now();
    let cfg = &shared.cfg;
    local.exhausted = None;
    local.deadline = None;
    // What the store holds: the write below is judged against it, so that a repair from
    // the source alone is written too (judged against the repaired copy it never was).
    let stored = node;
    // A source that keeps the node's addresses and handshakes (cluster-pool's blocks) is
    // the truth each pass; the others' are repaired from `describe` when a reply was lost.
    let holdings = shared.source.holdings(&h.name);
    // boxed: held across the awaits below, it would otherwise make every node's task
    // future an IpamNode larger, for a copy made only after a lost reply
    let repaired_copy: Box<IpamNode>;
    let node = if local.needs_describe && holdings.is_none() {
        let mut base = node.operator.clone();
        // Addresses the source took back in a call whose reply was lost: the pool freed,
        // and nodes parked on an exhausted pool must hear it.
        if repair_from_source(shared, &h.name, &mut base).await? {
            shared.pool_freed();
        }
        repaired_copy = Box::new(IpamNode {
            operator: base,
            ..node.clone()
        });
        &*repaired_copy
    } else {
        node
    };
    local.needs_describe = false;
    let repaired = node.operator != stored.operator;
    let held = holdings.is_some();
    let (operator, release_ack) = match holdings {
        Some(hd) => (
            Cow::Owned(OperatorFields {
                addresses: hd.addresses,
                release: hd.release,
                ..node.operator.clone()
            }),
            Cow::Owned(hd.acks),
        ),
        None => (
            Cow::Borrowed(&node.operator),
            Cow::Borrowed(&node.node.release_ack),
        ),
    };
    // What this pass would write: for a source that keeps addresses and marks, neither.
    let to_write = |fields: &OperatorFields| -> OperatorFields {
        if held {
            OperatorFields {
                addresses: stored.operator.addresses.clone(),
                release: stored.operator.release.clone(),
                reclaim: fields.reclaim.clone(),
                conditions: fields.conditions.clone(),
            }
        } else {
            fields.clone()
        }
    };
    let changed = |fields: &OperatorFields| -> bool {
        if held {
            fields.reclaim != stored.operator.reclaim
                || fields.conditions != stored.operator.conditions
        } else {
            *fields != stored.operator
        }
    };
    let pending = shared.pods.pending_pods(&h.name);
    let alive = |uid| {
        shared
            .pods
            .with_pod(uid, |p| p.is_some_and(|p| !p.phase.is_terminal()))
    };
    for wait in local.waits.look(now, &pending, &node.node.used, alive) {
        metrics::histogram!(m::POD_IP_WAIT_SECONDS).record(wait.as_secs_f64());
    }

    // Invalid overrides: plan with the flags' watermarks so reclaim and handshakes go on,
    // but claim and mark nothing; a condition and an event say why.
    let (watermarks, invalid) = match cfg.watermarks.with_overrides(&node.watermarks) {
        Ok(w) => (w, None),
        Err(e) => (cfg.watermarks, Some(e)),
    };
    let families = shared.source.families();
    let grant_size = PerFamily {
        v4: shared.source.grant_size(Family::V4),
        v6: shared.source.grant_size(Family::V6),
    };
    let snap = Snapshot {
        now,
        node,
        operator: &operator,
        release_ack: &release_ack,
        info,
        watermarks,
        families,
        grant_size,
        pending: &pending,
        release: cfg.release,
        reclaim: cfg.reclaim,
    };
    let mut plan = plan::plan(&mut local.mem, &snap, &shared.pods);
    // the plan's summary of its own fields, before a hold-back changes it
    let planned = plan.summary;
    let mut fields = plan.fields;
    match &invalid {
        None => {
            if fields
                .conditions
                .iter()
                .any(|c| c.type_ == WATERMARKS_VALID)
            {
                drop_condition(fields.to_mut(), WATERMARKS_VALID);
            }
        }
        Some(e) => set_invalid_condition(shared, h, fields.to_mut(), e),
    }
    // Invalid overrides, or a duplicate repair found: nothing new for the node.
    let held_back = if invalid.is_some() {
        Some(Blocked::InvalidSpec)
    } else if shared.source.node_blocked(&h.name) {
        Some(Blocked::Duplicate)
    } else {
        None
    };
    if held_back.is_some() {
        plan.claims.clear();
        plan.marks.clear();
        plan.summary.blocked = held_back;
    }
    shared.publish(h, plan.summary);

    // A source whose calls are API server writes (cluster-pool's block creates, deletes and
    // marks): all of this pass's writes, the IPAMNode apply included, share one place in the
    // kube budget's queue, taken before the first of them. While the node waits for it, it
    // still sees new work and its deadline: then this pass writes nothing (and reports
    // nothing), keeps the place, and the next pass plans again with the new work, and
    // writes it all when the place comes up.
    if shared.source.api() == Api::Kube {
        let writes = !plan.release_now.is_empty()
            || !plan.claims.is_empty()
            || !plan.marks.is_empty()
            || !plan.reclaim.ready.is_empty()
            || changed(&fields)
            || (held && fields.release != operator.release)
            || stored.resource_version.is_none()
            || stored.node_uid != info.uid;
        if !writes {
            local.kube = None;
        } else if !kube_place(shared, h, local, plan.next_deadline).await {
            local.deadline = plan.next_deadline;
            return Ok(Outcome::Idle(plan.next_deadline));
        }
    }

    // Reclaim: tombstones the node side answered; groups observed twice, confirmed live.
    for (addr, ack) in &plan.answered_tombstones {
        tombstone_answered(shared, h, &mut local.mem, node, addr, ack);
    }
    for g in &plan.reclaim.ready {
        let Some(entries) = confirm_live(shared, h, &mut local.mem, node, now, g).await else {
            continue;
        };
        for (a, allocation) in entries {
            fields.to_mut().reclaim.insert(
                a,
                Tombstone {
                    pod_uid: g.pod_uid,
                    allocation,
                    reason: g.reason,
                },
            );
        }
        metrics::histogram!(m::RECLAIM_LATENCY_SECONDS).record(
            now.saturating_duration_since(g.first_observed)
                .as_secs_f64(),
        );
    }

    // Source calls wait for the source budget, but a maintainer waiting there must not
    // miss its node's other work. Changes this pass already made (tombstones, withdrawn
    // marks, a release) are written at once unless a token is free right now; and a pass
    // with nothing else to write waits only until new work arrives for the node or its
    // next deadline passes. Either way the calls follow in the next pass, which keeps the
    // place in the queue.
    let mut deferred = false;
    let deadline = plan.next_deadline;

    // Release handshakes: addresses answered ready-for-release go back to the source.
    let mut failure: Option<IpamError> = None;
    let mut freed = false;
    if !plan.release_now.is_empty()
        && source_token(shared, h, local, changed(&fields), deadline, &mut deferred).await
    {
        match source_release(
            shared,
            h,
            &plan.release_now,
            &mut requests(shared, h, local),
        )
        .await
        {
            Ok(()) => {
                handshake::released(fields.to_mut(), &plan.release_now);
                freed = true;
            }
            Err(e) => {
                local.needs_describe = true;
                failure = Some(e);
            }
        }
    }

    // Claims, then marks.
    let mut blocked = plan.summary.blocked;
    for c in &plan.claims {
        if failure.is_some() {
            break;
        }
        let n = shared
            .source
            .prepare_allocation(&h.name, c.family, c.count, c.limit);
        if n == 0 {
            blocked = Some(Blocked::Exhausted);
            local.exhausted = Some(c.family);
            failure = Some(IpamError::Source {
                op: "allocate",
                node: h.name.to_string(),
                class: ErrorClass::Exhausted,
                message: format!("no {} address left", c.family.as_str()),
            });
            break;
        }
        if !source_token(shared, h, local, changed(&fields), deadline, &mut deferred).await {
            break;
        }
        match source_allocate(shared, h, c.family, n, &mut requests(shared, h, local)).await {
            Ok(addrs) => {
                // The source had less than the claim: look again at once, so a node still
                // short is seen exhausted (blocked, parked) now, not at the next resync.
                if n < c.count {
                    h.trigger.trigger(Reason::Retry);
                }
                Arc::make_mut(&mut fields.to_mut().addresses).union_with(&addrs)
            }
            Err(e) => {
                local.needs_describe = true;
                if e.class() == ErrorClass::Exhausted {
                    blocked = Some(Blocked::Exhausted);
                    local.exhausted = Some(c.family);
                }
                failure = Some(e);
            }
        }
    }
    for mk in &plan.marks {
        let chosen = shared.source.prepare_release(&h.name, &mk.free, mk.count);
        if !chosen.is_empty() {
            fields
                .to_mut()
                .release
                .insert_set(&chosen, ReleaseState::MarkedForRelease);
        }
    }

    // Marks kept by the source: place the new ones and withdraw the dropped ones there.
    if held {
        // Withdrawals always go (a refused or vanished mark must not keep the block from
        // the node while a claim fails, e.g. on an exhausted pool); new marks only from a
        // pass that did not fail.
        let (mut mark, withdraw) = mark_changes(&operator.release, &fields.release);
        if failure.is_some() {
            mark = AddrSet::new();
        }
        if !mark.is_empty() || !withdraw.is_empty() {
            let r = if shared.is_leader() {
                let mut gate = requests(shared, h, local);
                shared
                    .source
                    .set_marks_gated(&h.name, &mark, &withdraw, &mut gate)
                    .await
            } else {
                Err(IpamError::NotLeader)
            };
            api_call("kube", "mark", r.is_ok());
            if let Err(e) = r {
                failure.get_or_insert(e);
            }
        }
    }

    // The Blocked condition: a node that cannot get the addresses it needs says why.
    let needs = plan.summary.needed() > 0 || plan.summary.waiting() > 0;
    let reason = held_back
        .or(plan.summary.blocked)
        .or(blocked)
        .filter(|_| needs);
    set_blocked_condition(shared, h, &mut fields, reason);

    // One coalesced write.
    // (no resourceVersion: the IPAMNode does not exist yet, the operator creates it; another
    // Node UID: the operator adopts it)
    if (changed(&fields) || stored.resource_version.is_none() || stored.node_uid != info.uid)
        && let Err(e) = write(
            shared,
            h,
            kube_pass(shared, h, local),
            info.uid,
            to_write(&fields),
        )
        .await
    {
        local.needs_describe |= repaired || fields.addresses != stored.operator.addresses;
        for (addr, t) in &fields.reclaim {
            if !stored.operator.reclaim.contains_key(addr) {
                metrics::counter!(m::RECLAIMS_TOTAL, "reason" => t.reason.as_str(), "outcome" => "failed")
                    .increment(1);
                let message = format!(
                    "could not write the tombstone for {addr} of pod {}: {e}",
                    t.pod_uid
                );
                let reason = EventReason::GarbageCollectionFailed;
                shared
                    .pods
                    .event(t.pod_uid, EventType::Warning, reason, message.clone());
                shared
                    .store
                    .event(&h.name, EventType::Warning, reason, message);
            }
        }
        return Err(e);
    }
    if freed {
        shared.pool_freed();
    }
    // fields nothing changed since the plan summarized them need no second count
    let mut summary = match fields {
        Cow::Borrowed(_) => planned,
        Cow::Owned(_) => plan::summarize(
            &mut local.mem,
            &snap,
            &fields,
            plan.summary.reclaim_candidates,
        ),
    };
    summary.blocked = held_back.or(summary.blocked).or(blocked);
    shared.publish(h, summary);
    local.deadline = plan.next_deadline;
    match failure {
        Some(e) => Err(e),
        None => Ok(Outcome::Idle(plan.next_deadline)),
    }
}

/// Marks to place (marked now, not before) and to withdraw (marked before, gone now
/// without having been released).
/// The node side answered the tombstone on `addr`: `reclaimed` is counted and reported;
/// `live` (the pod runs on the node: the operator's view of it lagged) is counted as
/// refused, reported as a Warning naming the pod, and that allocation is not tombstoned
/// again until a live lookup finds the pod gone. The tombstone goes either way (the plan
/// dropped it).
fn tombstone_answered<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    mem: &mut NodeMemory,
    node: &IpamNode,
    addr: &std::net::IpAddr,
    ack: &ReclaimAck,
) {
    let (outcome, type_, reason, verb) = match ack.outcome {
        ReclaimOutcome::Reclaimed => (
            m::reclaim_outcome::RECLAIMED,
            EventType::Normal,
            EventReason::GarbageCollected,
            "reclaimed",
        ),
        ReclaimOutcome::Live => {
            mem.reclaim.refuse(ack.pod_uid, ack.allocation);
            (
                m::reclaim_outcome::REFUSED,
                EventType::Warning,
                EventReason::GarbageCollectionFailed,
                "did not reclaim",
            )
        }
        ReclaimOutcome::Stale => return,
    };
    let tombstone = node.operator.reclaim.get(addr);
    let label = tombstone.map_or("pod-deleted", |t| t.reason.as_str());
    metrics::counter!(m::RECLAIMS_TOTAL, "reason" => label, "outcome" => outcome).increment(1);
    let pod = match node.node.used.get(addr) {
        Some(e) if ack.outcome == ReclaimOutcome::Live => {
            format!("{}/{} ({})", e.namespace, e.pod, ack.pod_uid)
        }
        _ => ack.pod_uid.to_string(),
    };
    let why = if ack.outcome == ReclaimOutcome::Live {
        ": the node side sees the pod running with it"
    } else {
        ""
    };
    let message = format!("{verb} {addr} from pod {pod} on node {}{why}", h.name);
    shared
        .pods
        .event(ack.pod_uid, type_, reason, message.clone());
    shared.store.event(&h.name, type_, reason, message);
}

/// Confirms a ready reclaim group with a GET of its pod by the namespace and name its
/// `used` entry records (never an answer from the cache): the entries to tombstone. A
/// lookup that fails, or confirms nothing, starts the group's observations again; the
/// rest of the pass goes on.
async fn confirm_live<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    mem: &mut NodeMemory,
    node: &IpamNode,
    now: Instant,
    g: &ReclaimGroup,
) -> Option<Vec<(std::net::IpAddr, AllocationId)>> {
    let entry = g.addrs.iter().find_map(|a| node.node.used.get(a))?;
    match (shared.pods)
        .pod_live(g.pod_uid, &entry.namespace, &entry.pod)
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

fn mark_changes(
    before: &AddrMap<ReleaseState>,
    after: &AddrMap<ReleaseState>,
) -> (AddrSet, AddrSet) {
    let marked = |m: &AddrMap<ReleaseState>| m.keys_where(|s| *s == ReleaseState::MarkedForRelease);
    let (was, is) = (marked(before), marked(after));
    let mut mark = is.clone();
    mark.subtract(&was);
    let mut withdraw = was;
    withdraw.subtract(&after.keys());
    (mark, withdraw)
}

const WATERMARKS_VALID: ConditionType = ConditionType::WatermarksValid;
const BLOCKED: ConditionType = ConditionType::Blocked;

/// Sets `Blocked` (status True, with the reason) while the node needs addresses it cannot
/// get, and drops it once it can grow again or needs none; a pool exhausted for the node
/// also gets a `PoolExhausted` warning event when the condition appears.
fn set_blocked_condition<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    fields: &mut Cow<'_, OperatorFields>,
    blocked: Option<Blocked>,
) {
    let current = fields.conditions.iter().find(|c| c.type_ == BLOCKED);
    let Some(b) = blocked else {
        if current.is_some() {
            drop_condition(fields.to_mut(), BLOCKED);
        }
        return;
    };
    let reason = ConditionReason::Blocked(b);
    if current.is_some_and(|c| c.reason == reason) {
        return;
    }
    let message = format!("the node needs addresses and gets none: {}", b.as_str());
    let fields = fields.to_mut();
    drop_condition(fields, BLOCKED);
    fields.conditions.push(Condition {
        type_: BLOCKED,
        status: true,
        reason,
        message: message.clone(),
        last_transition: shared.clock.utc(),
    });
    if b == Blocked::Exhausted {
        shared.store.event(
            &h.name,
            EventType::Warning,
            EventReason::PoolExhausted,
            message,
        );
    }
}

fn drop_condition(fields: &mut OperatorFields, type_: ConditionType) {
    fields.conditions.retain(|c| c.type_ != type_);
}

/// Invalid watermarks: a condition (and, when it is new, a warning event). The node gets no
/// new addresses until the spec changes; reclaim and handshakes go on.
fn set_invalid_condition<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    fields: &mut OperatorFields,
    e: &IpamError,
) {
    let message = e.to_string();
    let already = fields
        .conditions
        .iter()
        .any(|c| c.type_ == WATERMARKS_VALID && c.message == message);
    if already {
        return;
    }
    drop_condition(fields, WATERMARKS_VALID);
    fields.conditions.push(Condition {
        type_: WATERMARKS_VALID,
        status: false,
        reason: ConditionReason::InvalidWatermarks,
        message: message.clone(),
        last_transition: shared.clock.utc(),
    });
    shared.store.event(
        &h.name,
        EventType::Warning,
        EventReason::InvalidWatermarks,
        message,
    );
}

/// The source's truth repairs our fields after a call whose reply was lost: addresses it
/// granted that we do not show are added; addresses we show that it no longer grants
/// were released (a marked one completes its handshake). Returns whether any were.
async fn repair_from_source<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    name: &NodeName,
    fields: &mut OperatorFields,
) -> Result<bool, IpamError> {
    let truth = shared.source.describe(name).await?;
    let mut gone = (*fields.addresses).clone();
    gone.subtract(&truth);
    // a marked address gone completes its handshake
    let released = gone.intersection(&fields.release.keys());
    fields.release.insert_set(&released, ReleaseState::Released);
    fields.addresses = Arc::new(truth);
    Ok(!gone.is_empty())
}

/// A source budget token for one call of this pass (see the comment in `pass_once`).
/// `pending`: the pass has changes of its own to write. Returns false when the call must
/// wait for the next pass, which is then triggered.
async fn source_token<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &mut Local,
    pending: bool,
    deadline: Option<Instant>,
    deferred: &mut bool,
) -> bool {
    if shared.source.api() == Api::Kube {
        // API server writes: the pass's one place in the kube budget's queue (see
        // `pass_once`), taken already, admits each of the call's requests.
        return true;
    }
    let got = match (&mut local.ticket, pending) {
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
        (ticket, false) => {
            let t = ticket.get_or_insert_with(|| {
                Box::pin(shared.call_budget().acquire_owned(h.priority.clone()))
            });
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
        local.ticket = None;
    } else {
        local.keep_ticket = local.ticket.is_some();
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
struct Requests<'a> {
    kube: Option<&'a mut Pass>,
    leader: &'a tokio::sync::watch::Receiver<bool>,
}

fn requests<'a, S: IpSource, N: NodeStore, P: PodView>(
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

async fn source_allocate<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    family: Family,
    count: u64,
    gate: &mut impl Gate,
) -> Result<AddrSet, IpamError> {
    if !shared.is_leader() {
        return Err(IpamError::NotLeader);
    }
    let started = Instant::now();
    let r = shared
        .source
        .allocate_gated(&h.name, family, count, gate)
        .await;
    let src = shared.source.name();
    let outcome = if r.is_ok() { "success" } else { "failure" };
    api_call("source", "allocate", r.is_ok());
    metrics::counter!(m::ALLOCATION_OPS_TOTAL, "source" => src, "outcome" => outcome).increment(1);
    metrics::histogram!(m::ALLOCATION_DURATION_SECONDS, "op" => "allocate", "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
    if let Ok(addrs) = &r {
        metrics::counter!(m::IPS_ALLOCATED_TOTAL, "family" => family.as_str())
            .increment(addrs.count(family));
    }
    r
}

async fn source_release<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    addrs: &AddrSet,
    gate: &mut impl Gate,
) -> Result<(), IpamError> {
    if !shared.is_leader() {
        return Err(IpamError::NotLeader);
    }
    let started = Instant::now();
    let r = shared.source.release_gated(&h.name, addrs, gate).await;
    let outcome = if r.is_ok() { "success" } else { "failure" };
    api_call("source", "release", r.is_ok());
    metrics::counter!(m::RELEASE_OPS_TOTAL, "source" => shared.source.name(), "outcome" => outcome)
        .increment(1);
    metrics::histogram!(m::ALLOCATION_DURATION_SECONDS, "op" => "release", "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
    if r.is_ok() {
        for f in Family::ALL {
            let n = addrs.count(f);
            if n > 0 {
                metrics::counter!(m::IPS_RELEASED_TOTAL, "family" => f.as_str()).increment(n);
            }
        }
    }
    r
}

/// This pass's place in the kube budget's queue, for its next API server write: the one
/// `pass_once` waited for, or (a source whose calls are not kube writes: the pass's only
/// kube write is its IPAMNode apply) a new one, then waited for in place.
fn kube_pass<'a, S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &'a mut Local,
) -> &'a mut Pass {
    local
        .kube
        .get_or_insert_with(|| shared.kube_budget.pass(h.priority.clone()))
}

/// Waits for this pass's place in the kube budget's queue (a source whose calls are kube
/// writes), as `source_token` waits for the source budget: the wait ends early when the
/// node has new work or its next deadline passes. Returns false then: the place is kept
/// (parked, so it stalls nobody) for the next pass, which is triggered.
async fn kube_place<S: IpSource, N: NodeStore, P: PodView>(
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
        local.keep_kube = true;
        h.trigger.trigger(Reason::Retry);
    }
    admitted
}

/// The pass's one write of the operator's fields, on the pass's kube place, with the UID of
/// the Node it is for (an IPAMNode that names another, adopted or changed by someone else,
/// gets the Node's).
async fn write<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    kube: &mut Pass,
    node_uid: u128,
    fields: OperatorFields,
) -> Result<(), IpamError> {
    // each of the write's requests (a spec and a status apply) on the pass's place
    let mut gate = Requests {
        kube: Some(kube),
        leader: &shared.leader,
    };
    let r = shared
        .store
        .apply_operator_gated(&h.name, node_uid, fields, &mut gate)
        .await;
    api_call("kube", "apply", r.is_ok());
    let written = r?;
    if let Some(rv) = &written.resource_version {
        h.own_write.store(rv.fingerprint(), Ordering::Relaxed);
    }
    Ok(())
}

/// Whole-node reclaim (DESIGN.md): only when no non-terminal pod is bound to the node
/// name and either the source says the machine is gone or `node_reclaim_grace` has passed
/// since the Node's deletion; then every address goes back to the source and the
/// IPAMNode's finalizer goes.
async fn node_deleted<S: IpSource, N: NodeStore, P: PodView>(
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
            metrics::counter!(m::RECLAIMS_TOTAL, "reason" => "node-deleted", "outcome" => "reclaimed")
                .increment(n);
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
    shared.store.remove_gated(&h.name, &mut gate).await?;
    api_call("kube", "delete", true);
    Ok(Outcome::Finished)
}
