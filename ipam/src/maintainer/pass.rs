//! One attempt of a maintenance pass: read what the node holds, plan, then run the plan in
//! phases, each a method of the pass's context ([`PassCtx`]): confirm reclaims, release,
//! claim, mark, write. What each phase decides is the plan's ([`crate::plan`]); the phases
//! make its calls.

use std::borrow::Cow;
use std::sync::Arc;

use tokio::time::Instant;

use super::calls::{self, Requests};
use super::deletion::{self, Leaving};
use super::{Local, Outcome, conditions, pools as blocked, reclaim};
use crate::addrs::{AddrMap, AddrSet};
use crate::budget::Api;
use crate::error::{ErrorClass, IpamError};
use crate::handshake;
use crate::plan::{self, Claim, LaneSummary, Marks, NodePools, Plan, Snapshot, WriteRule};
use crate::pods::PodView;
use crate::scarcity::{self, Squeezes};
use crate::shared::{NodeHandle, PoolKey, Shared};
use crate::source::IpSource;
use crate::store::{EventType, NodeStore};
use crate::trigger::Reason;
use crate::types::{
    Family, IpamNode, NodeInfo, NodeName, NodeUid, OperatorFields, PerFamily, PodUid, ReleaseAck,
    ReleaseState,
};
use crate::vocab::EventReason;

use tidepool_metrics as m;

/// What the phases of one pass share.
struct PassCtx<'p, S, N, P> {
    shared: &'p Shared<S, N, P>,
    h: &'p NodeHandle,
    local: &'p mut Local,
    now: Instant,
    /// The node's pools beyond its default ones.
    pools: &'p NodePools,
    /// The node as planned from (repaired from the source after a lost reply).
    node: &'p IpamNode,
    rule: WriteRule<'p>,
    /// The operator's fields as the phases change them.
    fields: Cow<'p, OperatorFields>,
    /// The plan's next deadline: a wait for the source budget ends there.
    deadline: Option<Instant>,
    /// A call waits for the next pass, which is triggered already.
    deferred: bool,
    /// The first call that failed; the phases after it place no new claim or mark.
    failure: Option<IpamError>,
    /// Addresses went back to the source.
    freed: bool,
}

/// One attempt of a pass over `stored` (the IPAMNode as the store holds it) for the Node
/// `info`.
pub(super) async fn pass_once<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &mut Local,
    stored: &IpamNode,
    info: &NodeInfo,
) -> Result<Outcome, IpamError> {
    let now = Instant::now();
    local.exhausted = None;
    local.pool_invalid = false;
    local.exhausted_pools.clear();
    local.deadline = None;
    // A source that keeps the node's addresses and handshakes (cluster-pool's blocks) is
    // the truth each pass; the others' are repaired from `describe` when a reply was lost.
    let holdings = shared.source.holdings(&h.name);
    // boxed: held across the awaits below, it would otherwise make every node's task
    // future an IpamNode larger, for a copy made only after a lost reply
    let repaired = if local.needs_describe && holdings.is_none() {
        Some(Box::new(repair(shared, h, stored).await?))
    } else {
        None
    };
    local.needs_describe = false;
    let node = repaired.as_deref().unwrap_or(stored);
    let held = holdings.is_some();
    let (operator, release_ack): (Cow<'_, OperatorFields>, Cow<'_, AddrMap<ReleaseAck>>) =
        match holdings {
            Some(hd) => {
                let fields = OperatorFields {
                    addresses: hd.addresses,
                    release: hd.release,
                    ..node.operator.clone()
                };
                (Cow::Owned(fields), Cow::Owned(hd.acks))
            }
            None => (
                Cow::Borrowed(&node.operator),
                Cow::Borrowed(&node.node.release_ack),
            ),
        };
    let pending = shared.pods.pending_pods(&h.name);
    observe_waits(shared, local, node, &pending, now);
    // boxed: held across the awaits below, in every node's task future
    let pools = Box::new(node_pools(shared, &h.name, &pending));
    let (mut snap, invalid) = snapshot(shared, node, &operator, &release_ack, info, &pending, now);
    snap.pools = &pools;
    let squeezes = shared.squeezes();
    snap.squeezes = &squeezes;
    let mut plan = plan::plan(&mut local.mem, &snap, &shared.pods);
    // the plan's summary of its own fields, before a hold-back changes it
    let planned = plan.summary;
    conditions::set_watermarks_condition(shared, h, &mut plan.fields, invalid.as_ref());
    plan.hold_back(invalid.is_some(), shared.source.node_blocked(&h.name));
    shared.publish(h, plan.summary, &plan.lanes);
    if !plan.claims.is_empty() && squeezed_since(shared, &squeezes, &plan.lanes).await {
        // the pool turned scarcer while this node planned: the next pass plans with it
        h.trigger.trigger(Reason::Scarcity);
        local.deadline = plan.next_deadline;
        return Ok(Outcome::Idle(plan.next_deadline));
    }
    let rule = WriteRule::new(stored, &node.operator, info.uid, held);
    if !take_kube_place(shared, h, local, &plan, &rule, &operator.release).await {
        local.deadline = plan.next_deadline;
        return Ok(Outcome::Idle(plan.next_deadline));
    }
    let fields = std::mem::replace(&mut plan.fields, Cow::Borrowed(&*operator));
    let mut ctx = PassCtx {
        shared,
        h,
        local,
        pools: &pools,
        now,
        node,
        rule,
        fields,
        deadline: plan.next_deadline,
        deferred: false,
        failure: None,
        freed: false,
    };
    ctx.confirm_reclaims(&plan).await;
    ctx.release(&plan.release_now, &plan.scarce_release).await;
    ctx.claim(&plan.claims).await;
    ctx.mark(&plan.marks);
    ctx.send_marks(&operator.release).await;
    ctx.adopt(info.uid).await;
    ctx.write(&plan, info.uid).await?;
    ctx.finish(&plan, &snap, planned)
}

/// The node as the source has it, after a call whose reply was lost: addresses the source
/// took back freed the pool, and nodes parked on an exhausted pool must hear it.
async fn repair<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    stored: &IpamNode,
) -> Result<IpamNode, IpamError> {
    let mut base = stored.operator.clone();
    if repair_from_source(shared, &h.name, &mut base).await? {
        shared.pool_freed();
    }
    Ok(IpamNode {
        operator: base,
        ..stored.clone()
    })
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

/// Pods seen waiting for an address, for `tidepool_ipam_pod_ip_wait_seconds`.
fn observe_waits<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    local: &mut Local,
    node: &IpamNode,
    pending: &[crate::types::PodUid],
    now: Instant,
) {
    let alive = |uid| {
        shared
            .pods
            .with_pod(uid, |p| p.is_some_and(|p| !p.phase.is_terminal()))
    };
    for wait in local.waits.look(now, pending, &node.node.used, alive) {
        m::record::pod_ip_wait(wait);
    }
}

/// What the pass plans from, and the error of invalid watermark overrides: then it plans
/// with the flags' watermarks so reclaim and handshakes go on (the plan holds the rest
/// back).
fn snapshot<'a, S: IpSource, N: NodeStore, P: PodView>(
    shared: &'a Shared<S, N, P>,
    node: &'a IpamNode,
    operator: &'a OperatorFields,
    release_ack: &'a AddrMap<ReleaseAck>,
    info: &'a NodeInfo,
    pending: &'a [crate::types::PodUid],
    now: Instant,
) -> (Snapshot<'a>, Option<IpamError>) {
    let cfg = &shared.cfg;
    let (watermarks, invalid) = match cfg.watermarks.with_overrides(&node.watermarks) {
        Ok(w) => (w, None),
        Err(e) => (cfg.watermarks, Some(e)),
    };
    let grant_size = PerFamily {
        v4: shared.source.grant_size(Family::V4),
        v6: shared.source.grant_size(Family::V6),
    };
    let snap = Snapshot {
        now,
        utc: shared.clock.utc(),
        node,
        operator,
        release_ack,
        info,
        watermarks,
        families: shared.source.families(),
        grant_size,
        pending,
        pools: const { &NodePools::EMPTY },
        release: cfg.release,
        reclaim: cfg.reclaim,
        squeezes: const { &Squeezes::new() },
    };
    (snap, invalid)
}

/// The node's pools beyond its default ones, and the pending pods each takes.
fn node_pools<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    node: &NodeName,
    pending: &[PodUid],
) -> NodePools {
    let subjects: Vec<_> = (pending.iter())
        .map(|u| (*u, shared.pods.pool_subject(*u)))
        .collect();
    shared.source.node_pools(node, &subjects)
}

/// Whether a pool the pass claims warm addresses from (beyond its pods waiting) turned
/// scarcer since it planned under `planned`. When pods not yet counted could make it so,
/// the passes woken with this one publish their demand first: a burst of pods over many
/// nodes counts in its pool's pressure before any of those nodes claims a warm pool.
async fn squeezed_since<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    planned: &Squeezes,
    lanes: &[LaneSummary],
) -> bool {
    if !shared.cfg.scarcity.enabled {
        return false;
    }
    let keys: Vec<PoolKey> = (lanes.iter())
        .filter(|l| l.sizing.claim > l.counts.waiting.saturating_sub(l.counts.free()))
        .map(|l| (l.pool.clone(), l.family))
        .collect();
    if keys.is_empty() {
        return false;
    }
    let tightened = |now: &Squeezes| (keys.iter()).any(|k| scarcity::tightened(planned, now, k));
    if tightened(&shared.squeezes()) {
        return true; // by this pass's own figures
    }
    if !keys.iter().any(|k| shared.may_tighten(k)) {
        return false;
    }
    tokio::task::yield_now().await;
    tightened(&shared.squeezes())
}

/// A source whose calls are API server writes (cluster-pool's block creates, deletes and
/// marks): all of this pass's writes, the IPAMNode apply included, share one place in the
/// kube budget's queue, taken before the first of them. While the node waits for it, it
/// still sees new work and its deadline: then this pass writes nothing (and reports
/// nothing), keeps the place, and the next pass plans again with the new work, and writes
/// it all when the place comes up. Returns false then.
async fn take_kube_place<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
    local: &mut Local,
    plan: &Plan<'_>,
    rule: &WriteRule<'_>,
    planned_release: &AddrMap<ReleaseState>,
) -> bool {
    if shared.source.api() != Api::Kube {
        return true;
    }
    if !plan.writes(rule, planned_release) {
        local.kube.clear();
        return true;
    }
    calls::kube_place(shared, h, local, plan.next_deadline).await
}

impl<S: IpSource, N: NodeStore, P: PodView> PassCtx<'_, S, N, P> {
    /// Reclaim: tombstones the node side answered are reported; groups observed twice are
    /// confirmed live and tombstoned.
    async fn confirm_reclaims(&mut self, plan: &Plan<'_>) {
        for (addr, ack) in &plan.answered_tombstones {
            reclaim::tombstone_answered(
                self.shared,
                self.h,
                &mut self.local.mem,
                self.node,
                addr,
                ack,
            );
        }
        (self.local.mem.reclaim).keep_tombstoned(&self.fields.reclaim);
        for g in &plan.reclaim.ready {
            let mem = &mut self.local.mem;
            let confirmed = reclaim::confirm_live(self.shared, self.h, mem, self.node, self.now, g);
            let Some(entries) = confirmed.await else {
                continue;
            };
            plan::tombstone(self.fields.to_mut(), g, entries);
            let latency = self.now.saturating_duration_since(g.first_observed);
            m::record::reclaim_latency(latency);
        }
    }

    /// A source budget token for the next call (see [`calls::source_token`]): the changes
    /// this pass made already are written at once unless a token is free right now.
    async fn source_token(&mut self) -> bool {
        let pending = self.rule.changed(&self.fields);
        let (shared, h) = (self.shared, self.h);
        calls::source_token(
            shared,
            h,
            self.local,
            pending,
            self.deadline,
            &mut self.deferred,
        )
        .await
    }

    /// The gate of the next call's API requests.
    fn requests(&mut self) -> Requests<'_> {
        calls::requests(self.shared, self.h, self.local)
    }

    /// Release handshakes: addresses answered ready-for-release go back to the source.
    /// `scarce`: how many of them are of scarce pools, for the metric.
    async fn release(&mut self, release_now: &AddrSet, scarce: &[(Arc<str>, Family, u64)]) {
        if release_now.is_empty() || !self.source_token().await {
            return;
        }
        let (shared, h) = (self.shared, self.h);
        match calls::source_release(shared, h, release_now, &mut self.requests()).await {
            Ok(()) => {
                handshake::released(self.fields.to_mut(), release_now);
                self.freed = true;
                for (pool, f, n) in scarce {
                    m::record::scarcity_released_ips(pool, (*f).into(), *n);
                }
            }
            Err(e) => {
                self.local.needs_describe = true;
                self.failure = Some(e);
            }
        }
    }

    /// Claims, each for what the source can give; none after a failure. A claim the source
    /// has nothing for leaves the node exhausted (blocked, parked) when it is of a default
    /// pool; another pool's only leaves its own pods waiting, so those claims go first.
    async fn claim(&mut self, claims: &[Claim]) {
        let (shared, h) = (self.shared, self.h);
        let others = claims.iter().filter(|c| c.pool.is_some());
        for c in others.chain(claims.iter().filter(|c| c.pool.is_none())) {
            if self.failure.is_some() {
                break;
            }
            let n = match &c.pool {
                None => (shared.source).prepare_allocation(&h.name, c.family, c.count, c.limit),
                Some(p) => {
                    (shared.source).prepare_pool_allocation(&h.name, c.family, p, c.count, c.limit)
                }
            };
            if let (0, Some(pool)) = (n, &c.pool) {
                self.pool_exhausted(pool, c.family);
                continue;
            }
            if n == 0 {
                // parked either way: a pool that turns valid wakes it (the pools changed)
                self.local.exhausted = Some(c.family);
                self.local.pool_invalid = shared.source.pool_invalid(&h.name, c.family);
                let why = match self.local.pool_invalid {
                    true => "its pool is Invalid",
                    false => "none left",
                };
                self.failure = Some(IpamError::Source {
                    op: "allocate",
                    node: h.name.to_string(),
                    class: ErrorClass::Exhausted,
                    message: format!("no {} address: {why}", c.family.as_str()),
                });
                break;
            }
            if !self.source_token().await {
                break;
            }
            let pool = c.pool.as_deref();
            let mut gate = self.requests();
            let r = calls::source_allocate(shared, h, c.family, pool, n, &mut gate).await;
            match r {
                Ok(addrs) => {
                    // The source had less than the claim: look again at once, so a node
                    // still short is seen exhausted (blocked, parked) now, not at the next
                    // resync.
                    if n < c.count {
                        h.trigger.trigger(Reason::Retry);
                    }
                    Arc::make_mut(&mut self.fields.to_mut().addresses).union_with(&addrs);
                }
                Err(e) if c.pool.is_some() && e.class() == ErrorClass::Exhausted => {
                    self.local.needs_describe = true;
                    self.pool_exhausted(c.pool.as_ref().expect("a pool"), c.family);
                }
                Err(e) => {
                    self.local.needs_describe = true;
                    if e.class() == ErrorClass::Exhausted {
                        self.local.exhausted = Some(c.family);
                    }
                    self.failure = Some(e);
                }
            }
        }
    }

    /// A pool other than the default has nothing for the node: only its pods wait.
    fn pool_exhausted(&mut self, pool: &Arc<str>, family: Family) {
        let pool = pool.clone();
        (self.local.exhausted_pools).push(crate::types::BlockedPool { pool, family });
    }

    /// The node's blocked pools in its fields, and their pods told why.
    fn blocked_pools(&mut self) {
        let exhausted = &self.local.exhausted_pools;
        let list = blocked::blocked_pools(self.pools, self.local.exhausted, exhausted);
        if list != self.fields.blocked_pools {
            self.fields.to_mut().blocked_pools = list;
        }
        let notes = blocked::pod_notes(&self.h.name, self.pools, exhausted);
        blocked::tell_pods(self.shared, &mut self.local.told, notes);
    }

    /// The node's grants carry the Node's UID `uid` (cluster-pool: its blocks): a Node
    /// re-created under its name adopts them, before the write records the UID in its
    /// IPAMNode (DESIGN.md "Reclaim").
    async fn adopt(&mut self, uid: NodeUid) {
        let r = if self.shared.is_leader() {
            let (shared, h) = (self.shared, self.h);
            let mut gate = self.requests();
            shared.source.adopt(&h.name, uid, &mut gate).await
        } else {
            Err(IpamError::NotLeader)
        };
        if let Err(e) = r {
            self.failure.get_or_insert(e);
        }
    }

    /// New marks, on the free addresses the source chooses.
    fn mark(&mut self, marks: &[Marks]) {
        for mk in marks {
            let chosen = self
                .shared
                .source
                .prepare_release(&self.h.name, &mk.free, mk.count);
            if !chosen.is_empty() {
                let release = &mut self.fields.to_mut().release;
                release.insert_set(&chosen, ReleaseState::MarkedForRelease);
            }
        }
    }

    /// Marks kept by the source ([`WriteRule`]'s `held`): the new ones placed and the
    /// dropped ones withdrawn there ([`plan::marks_to_send`]), `before` being the marks
    /// planned from.
    async fn send_marks(&mut self, before: &AddrMap<ReleaseState>) {
        if !self.rule.held() {
            return;
        }
        let failed = self.failure.is_some();
        let (mark, withdraw) = plan::marks_to_send(before, &self.fields.release, failed);
        if mark.is_empty() && withdraw.is_empty() {
            return;
        }
        let (shared, h) = (self.shared, self.h);
        let r = if shared.is_leader() {
            let mut gate = self.requests();
            shared
                .source
                .set_marks(&h.name, &mark, &withdraw, &mut gate)
                .await
        } else {
            Err(IpamError::NotLeader)
        };
        m::record::api_requests(m::ApiOp::KubeMark, m::Outcome::of(&r).into());
        if let Err(e) = r {
            self.failure.get_or_insert(e);
        }
    }

    /// The `Blocked` and `Deleting` conditions, then the one coalesced write (also when
    /// nothing changed for an IPAMNode that does not exist yet, or names another Node's
    /// UID: the operator creates or adopts it). A failed write reports the tombstones it
    /// lost.
    async fn write(&mut self, plan: &Plan<'_>, node_uid: NodeUid) -> Result<(), IpamError> {
        self.blocked_pools();
        let pools_blocked = !self.fields.blocked_pools.is_empty();
        let reason = (plan.condition_reason(self.local.claim_blocked()))
            .or(pools_blocked.then_some(crate::vocab::Blocked::Pools));
        conditions::set_blocked_condition(self.shared, self.h, &mut self.fields, reason);
        let leaving = Leaving::NodeLive {
            deleting: self.node.deleting,
        };
        let grace = self.shared.cfg.node_reclaim_grace;
        let wait = deletion::deletion_wait(&self.h.name, grace, leaving);
        deletion::set_deleting_condition(&mut self.fields, wait, self.shared.clock.utc());
        if !self.rule.due(&self.fields) {
            return Ok(());
        }
        let body = self.rule.body(&self.fields);
        let kube = calls::kube_pass(self.shared, self.h, self.local);
        let Err(e) = calls::write(self.shared, self.h, kube, node_uid, body).await else {
            return Ok(());
        };
        self.local.needs_describe |= self.rule.unsure_after_failure(&self.fields);
        for (addr, t) in self.rule.new_tombstones(&self.fields) {
            m::record::reclaims(t.reason.into(), m::ReclaimOutcome::Failed, 1);
            let message = format!(
                "could not write the tombstone for {addr} of pod {}: {e}",
                t.pod_uid
            );
            let (warning, reason) = (EventType::Warning, EventReason::GarbageCollectionFailed);
            let entry = (self.node.node.used.get(addr)).filter(|e| e.pod_uid == t.pod_uid);
            let name = entry.map(|e| (e.pod.namespace(), e.pod.name()));
            (self.shared.pods).event(t.pod_uid, name, warning, reason, message.clone());
            (self.shared.store).event(&self.h.name, warning, reason, message);
        }
        Err(e)
    }

    /// After the write: parked nodes hear of freed addresses; the node's summary as the
    /// pass left it is published; the pass ends with its first failure, or idle until its
    /// next deadline.
    fn finish(
        self,
        plan: &Plan<'_>,
        snap: &Snapshot<'_>,
        planned: plan::NodeSummary,
    ) -> Result<Outcome, IpamError> {
        if self.freed {
            self.shared.pool_freed();
        }
        // fields nothing changed since the plan summarized them need no second count
        let (mut summary, lanes) = match &self.fields {
            Cow::Borrowed(_) => (planned, Cow::Borrowed(&plan.lanes)),
            Cow::Owned(f) => {
                let candidates = plan.summary.reclaim_candidates;
                let (summary, lanes) = plan::summarize(&mut self.local.mem, snap, f, candidates);
                (summary, Cow::Owned(lanes))
            }
        };
        summary.blocked = plan.blocked(&summary, self.local.claim_blocked());
        self.shared.publish(self.h, summary, &lanes);
        self.local.deadline = plan.next_deadline;
        match self.failure {
            Some(e) => Err(e),
            None => Ok(Outcome::Idle(plan.next_deadline)),
        }
    }
}
