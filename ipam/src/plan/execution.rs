//! The decisions the executor ([`crate::maintainer`]) takes as it runs a plan, kept pure:
//! what a pass holds back, whether and what it writes, which marks a source that keeps them
//! gets, the tombstones of a confirmed reclaim, how an answered tombstone is reported, and
//! the `Blocked` reason it ends with.

use std::net::IpAddr;

use tidepool_metrics as m;

use super::{NodeSummary, Plan};
use crate::addrs::{AddrMap, AddrSet};
use crate::reclaim::ReclaimGroup;
use crate::store::EventType;
use crate::types::{
    AllocationId, IpamNode, NodeUid, OperatorFields, ReclaimAck, ReclaimOutcome, ReleaseState,
    Tombstone,
};
use crate::vocab::{Blocked, EventReason};

impl Plan<'_> {
    /// Invalid watermark overrides, or a duplicate repair found: nothing new for the node
    /// (no claims, no marks; reclaim and handshakes go on), and its summary says why (the
    /// invalid spec first).
    pub(crate) fn hold_back(&mut self, invalid_watermarks: bool, duplicate: bool) {
        self.held_back = if invalid_watermarks {
            Some(Blocked::InvalidSpec)
        } else if duplicate {
            Some(Blocked::Duplicate)
        } else {
            None
        };
        if let Some(b) = self.held_back {
            self.claims.clear();
            self.marks.clear();
            self.summary.blocked = Some(b);
        }
    }

    /// Why the node gets no new addresses once the pass ran, `summary` being its state
    /// then: held back; else what the summary says; else `claim`, why a claim found nothing
    /// (`exhausted`, or `pool-invalid`).
    pub(crate) fn blocked(&self, summary: &NodeSummary, claim: Option<Blocked>) -> Option<Blocked> {
        self.held_back.or(summary.blocked).or(claim)
    }

    /// The `Blocked` condition's reason: [`Plan::blocked`] as planned, only while the node
    /// needs addresses (needed, or pods waiting); none once it needs none.
    pub(crate) fn condition_reason(&self, claim: Option<Blocked>) -> Option<Blocked> {
        let needs = self.summary.needed() > 0 || self.summary.waiting() > 0;
        self.blocked(&self.summary, claim).filter(|_| needs)
    }

    /// Whether the pass makes any API server write (a source whose calls are kube writes
    /// takes one place in the kube budget's queue for all of them, before the first):
    /// a release, a claim, a mark, a tombstone, or the IPAMNode's own write. `planned`:
    /// the marks it planned from (a source that keeps marks gets the changed ones).
    pub(crate) fn writes(&self, rule: &WriteRule<'_>, planned: &AddrMap<ReleaseState>) -> bool {
        !self.release_now.is_empty()
            || !self.claims.is_empty()
            || !self.marks.is_empty()
            || !self.reclaim.ready.is_empty()
            || rule.due(&self.fields)
            || (rule.held && self.fields.release != *planned)
    }
}

/// What a pass writes of the operator's fields, judged against what the store holds (so
/// that a repair from the source alone is written too).
#[derive(Debug)]
pub(crate) struct WriteRule<'a> {
    stored: &'a OperatorFields,
    /// A source keeps the node's addresses and marks ([`crate::source::IpSource::holdings`]):
    /// only tombstones, conditions and blocked pools are the IPAMNode's to write.
    held: bool,
    /// Written whatever changed: the object does not exist yet (the operator creates it),
    /// or names another Node's UID, or an unknown one (the operator adopts it).
    must: bool,
    /// The fields planned from were repaired from the source (a reply was lost).
    repaired: bool,
}

impl<'a> WriteRule<'a> {
    /// `stored`: the IPAMNode as the store holds it; `planned`: the fields the pass planned
    /// from (repaired or not); `node_uid`: the Node's.
    pub fn new(
        stored: &'a IpamNode,
        planned: &OperatorFields,
        node_uid: NodeUid,
        held: bool,
    ) -> Self {
        WriteRule {
            stored: &stored.operator,
            held,
            must: stored.resource_version.is_none() || stored.node_uid != node_uid,
            repaired: *planned != stored.operator,
        }
    }

    /// Whether a source keeps the node's addresses and marks.
    pub fn held(&self) -> bool {
        self.held
    }

    /// Whether `fields` differ from the stored ones in what the pass writes.
    pub fn changed(&self, fields: &OperatorFields) -> bool {
        if self.held {
            fields.reclaim != self.stored.reclaim
                || fields.conditions != self.stored.conditions
                || fields.blocked_pools != self.stored.blocked_pools
        } else {
            *fields != *self.stored
        }
    }

    /// Whether the pass writes the IPAMNode.
    pub fn due(&self, fields: &OperatorFields) -> bool {
        self.must || self.changed(fields)
    }

    /// The fields to write: `fields`, or for a source that keeps addresses and marks, the
    /// stored ones of those.
    pub fn body(&self, fields: &OperatorFields) -> OperatorFields {
        if self.held {
            OperatorFields {
                addresses: self.stored.addresses.clone(),
                release: self.stored.release.clone(),
                reclaim: fields.reclaim.clone(),
                conditions: fields.conditions.clone(),
                blocked_pools: fields.blocked_pools.clone(),
            }
        } else {
            fields.clone()
        }
    }

    /// After a failed write of `fields`: whether the source may hold what the store does
    /// not show (the pass changed addresses, or repaired them), to be described next pass.
    pub fn unsure_after_failure(&self, fields: &OperatorFields) -> bool {
        self.repaired || fields.addresses != self.stored.addresses
    }

    /// The tombstones of `fields` the store does not hold yet (a failed write lost them).
    pub fn new_tombstones<'f>(
        &self,
        fields: &'f OperatorFields,
    ) -> impl Iterator<Item = (&'f IpAddr, &'f Tombstone)> {
        let stored = &self.stored.reclaim;
        fields
            .reclaim
            .iter()
            .filter(move |(a, _)| !stored.contains_key(a))
    }
}

/// The marks a source that keeps them gets: to place (marked in `after`, not in `before`)
/// and to withdraw (marked in `before`, gone from `after` without having been released).
/// Withdrawals always go (a refused or vanished mark must not keep the block from the node
/// while a claim fails, e.g. on an exhausted pool); new marks only from a pass that did not
/// fail.
pub(crate) fn marks_to_send(
    before: &AddrMap<ReleaseState>,
    after: &AddrMap<ReleaseState>,
    failed: bool,
) -> (AddrSet, AddrSet) {
    let marked = |m: &AddrMap<ReleaseState>| m.keys_where(|s| *s == ReleaseState::MarkedForRelease);
    let (was, is) = (marked(before), marked(after));
    let mut mark = AddrSet::new();
    if !failed {
        mark = is;
        mark.subtract(&was);
    }
    let mut withdraw = was;
    withdraw.subtract(&after.keys());
    (mark, withdraw)
}

/// Tombstones `entries` (the group's addresses a live lookup confirmed gone) in `fields`.
pub(crate) fn tombstone(
    fields: &mut OperatorFields,
    g: &ReclaimGroup,
    entries: Vec<(IpAddr, AllocationId)>,
) {
    for (a, allocation) in entries {
        let t = Tombstone {
            pod_uid: g.pod_uid,
            allocation,
            reason: g.reason,
        };
        fields.reclaim.insert(a, t);
    }
}

/// How the node side's answer to a tombstone is reported: counted, and an event on the pod
/// and on the IPAMNode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answered {
    /// The reclaim metric's `reason` and `outcome` labels.
    pub label: m::ReclaimReason,
    pub outcome: m::ReclaimOutcome,
    pub type_: EventType,
    pub reason: EventReason,
    pub message: String,
    /// `live`: the pod runs on the node (the operator's view of it lagged); that
    /// allocation is not tombstoned again until a live lookup finds the pod gone.
    pub refused: bool,
}

impl Answered {
    /// The report of `ack`, the answer to the tombstone on `addr` of `node` (its name
    /// `name`); none for a stale answer (an older allocation's).
    pub fn of(node: &IpamNode, name: &str, addr: &IpAddr, ack: &ReclaimAck) -> Option<Self> {
        let live = ack.outcome == ReclaimOutcome::Live;
        let (outcome, type_, reason, verb) = match ack.outcome {
            ReclaimOutcome::Reclaimed => (
                m::ReclaimOutcome::Reclaimed,
                EventType::Normal,
                EventReason::GarbageCollected,
                "reclaimed",
            ),
            ReclaimOutcome::Live => (
                m::ReclaimOutcome::Refused,
                EventType::Warning,
                EventReason::GarbageCollectionFailed,
                "did not reclaim",
            ),
            ReclaimOutcome::Stale => return None,
        };
        let tombstone = node.operator.reclaim.get(addr);
        let label = tombstone.map_or(m::ReclaimReason::PodDeleted, |t| t.reason.into());
        let pod = match node.node.used.get(addr) {
            Some(e) if live => format!("{} ({})", e.pod, ack.pod_uid),
            _ => ack.pod_uid.to_string(),
        };
        let why = if live {
            ": the node side sees the pod running with it"
        } else {
            ""
        };
        Some(Answered {
            label,
            outcome,
            type_,
            reason,
            message: format!("{verb} {addr} from pod {pod} on node {name}{why}"),
            refused: live,
        })
    }
}

#[cfg(test)]
#[path = "execution_tests.rs"]
mod tests;
