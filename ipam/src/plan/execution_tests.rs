use std::sync::Arc;
use std::time::SystemTime;

use super::*;
use crate::plan::{Claim, Marks};
use crate::types::PodName;
use crate::types::{Family, PodUid, ReclaimReason, ResourceVersion, UsedEntry};

fn a(n: u8) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, n))
}

fn set(ns: &[u8]) -> AddrSet {
    ns.iter().map(|n| a(*n)).collect()
}

/// A plan with one claim and one mark, needing `needed` addresses.
fn planned(needed: u64) -> Plan<'static> {
    let mut p = Plan::default();
    p.claims.push(Claim {
        family: Family::V4,
        pool: None,
        count: 2,
        limit: u64::MAX,
    });
    p.marks.push(Marks {
        family: Family::V4,
        count: 1,
        free: set(&[1]),
    });
    p.summary.sizing.v4.needed = needed;
    p
}

/// A stored IPAMNode of Node UID 1 holding 10.0.0.1 and 10.0.0.2.
fn stored() -> IpamNode {
    let mut n = IpamNode::new("n".into(), NodeUid(1));
    n.resource_version = Some(ResourceVersion::server("7"));
    n.operator.addresses = Arc::new(set(&[1, 2]));
    n
}

fn tombstone(pod: u128) -> Tombstone {
    Tombstone {
        pod_uid: PodUid(pod),
        allocation: AllocationId(pod as u64),
        reason: ReclaimReason::PodDeleted,
    }
}

#[test]
fn invalid_watermarks_hold_back_before_a_duplicate_and_clear_claims_and_marks() {
    let mut p = planned(2);
    p.summary.blocked = Some(Blocked::Cordoned);
    p.hold_back(true, true);
    assert_eq!(p.held_back, Some(Blocked::InvalidSpec));
    assert!(p.claims.is_empty() && p.marks.is_empty());
    assert_eq!(p.summary.blocked, Some(Blocked::InvalidSpec));

    let mut p = planned(2);
    p.hold_back(false, true);
    assert_eq!(p.summary.blocked, Some(Blocked::Duplicate));
    assert!(p.claims.is_empty() && p.marks.is_empty());

    let mut p = planned(2);
    p.hold_back(false, false);
    assert_eq!((p.held_back, p.summary.blocked), (None, None));
    assert_eq!((p.claims.len(), p.marks.len()), (1, 1), "nothing held back");
}

#[test]
fn the_blocked_reason_is_held_back_then_planned_then_exhausted_and_only_while_needed() {
    const EX: Option<Blocked> = Some(Blocked::Exhausted);
    let mut p = planned(2);
    assert_eq!(p.condition_reason(None), None);
    assert_eq!(p.condition_reason(EX), Some(Blocked::Exhausted));
    let invalid = Some(Blocked::PoolInvalid);
    assert_eq!(
        p.condition_reason(invalid),
        invalid,
        "the claim's own reason"
    );
    p.summary.blocked = Some(Blocked::AtCap);
    assert_eq!(p.condition_reason(EX), Some(Blocked::AtCap));
    p.hold_back(false, true);
    assert_eq!(p.condition_reason(EX), Some(Blocked::Duplicate));
    // after the pass: its own summary (the held-back reason still first)
    let after = NodeSummary {
        blocked: Some(Blocked::Cordoned),
        ..NodeSummary::default()
    };
    assert_eq!(p.blocked(&after, EX), Some(Blocked::Duplicate));
    let p = planned(2);
    assert_eq!(p.blocked(&after, EX), Some(Blocked::Cordoned));
    assert_eq!(
        p.blocked(&NodeSummary::default(), EX),
        Some(Blocked::Exhausted)
    );
    // a node that needs nothing has no condition, whatever blocks it
    let mut p = planned(0);
    p.summary.blocked = Some(Blocked::AtCap);
    assert_eq!(p.condition_reason(EX), None);
    p.summary.counts.v4.waiting = 1;
    assert_eq!(
        p.condition_reason(None),
        Some(Blocked::AtCap),
        "a pod waits"
    );
}

#[test]
fn a_source_that_keeps_addresses_and_marks_gets_only_tombstones_and_conditions_written() {
    let stored = stored();
    let mut fields = stored.operator.clone();
    Arc::make_mut(&mut fields.addresses).insert(a(3));
    fields.release.insert(a(1), ReleaseState::MarkedForRelease);

    let held = WriteRule::new(&stored, &stored.operator, NodeUid(1), true);
    assert!(!held.changed(&fields) && !held.due(&fields));
    fields.reclaim.insert(a(2), tombstone(9));
    assert!(held.changed(&fields));
    let body = held.body(&fields);
    assert_eq!(body.addresses, stored.operator.addresses, "the stored ones");
    assert!(body.release.is_empty());
    assert_eq!(body.reclaim, fields.reclaim);

    let own = WriteRule::new(&stored, &stored.operator, NodeUid(1), false);
    assert!(own.changed(&fields));
    assert_eq!(own.body(&fields), fields);
    assert!(!own.changed(&stored.operator) && !own.due(&stored.operator));
}

#[test]
fn a_missing_or_adopted_object_is_written_unchanged() {
    let mut stored = stored();
    let f = stored.operator.clone();
    assert!(
        WriteRule::new(&stored, &f, NodeUid(2), false).due(&f),
        "another Node UID"
    );
    stored.resource_version = None;
    assert!(
        WriteRule::new(&stored, &f, NodeUid(1), true).due(&f),
        "not created yet"
    );
}

#[test]
fn after_a_failed_write_the_source_is_described_when_addresses_moved_or_were_repaired() {
    let stored = stored();
    let same = stored.operator.clone();
    let rule = WriteRule::new(&stored, &same, NodeUid(1), false);
    assert!(!rule.unsure_after_failure(&same));
    let mut grown = same.clone();
    Arc::make_mut(&mut grown.addresses).insert(a(3));
    assert!(rule.unsure_after_failure(&grown));
    let rule = WriteRule::new(&stored, &grown, NodeUid(1), false);
    assert!(rule.unsure_after_failure(&same), "planned from a repair");
}

#[test]
fn only_tombstones_the_store_lacks_are_new() {
    let mut stored = stored();
    stored.operator.reclaim.insert(a(1), tombstone(1));
    let mut fields = stored.operator.clone();
    fields.reclaim.insert(a(2), tombstone(2));
    let rule = WriteRule::new(&stored, &stored.operator, NodeUid(1), false);
    let new: Vec<_> = rule.new_tombstones(&fields).map(|(a, _)| *a).collect();
    assert_eq!(new, [a(2)]);
}

#[test]
fn a_pass_writes_when_it_calls_or_changes_anything() {
    let stored = stored();
    let rule = WriteRule::new(&stored, &stored.operator, NodeUid(1), true);
    let mut p = Plan {
        fields: std::borrow::Cow::Borrowed(&stored.operator),
        ..Plan::default()
    };
    assert!(!p.writes(&rule, &stored.operator.release));
    p.release_now = set(&[1]);
    assert!(p.writes(&rule, &stored.operator.release), "a release");
    p.release_now = AddrSet::new();
    p.fields
        .to_mut()
        .release
        .insert(a(2), ReleaseState::MarkedForRelease);
    assert!(
        p.writes(&rule, &stored.operator.release),
        "a withdrawn or placed mark of a source that keeps them"
    );
    assert!(!p.writes(&rule, &p.fields.release.clone()));
    let p = planned(2);
    let f = OperatorFields::default();
    let rule = WriteRule::new(&stored, &f, NodeUid(1), true);
    assert!(p.writes(&rule, &f.release), "a claim");
}

#[test]
fn a_failed_pass_withdraws_marks_but_places_none() {
    let mut before = AddrMap::new();
    before.insert(a(1), ReleaseState::MarkedForRelease);
    before.insert(a(2), ReleaseState::MarkedForRelease);
    before.insert(a(3), ReleaseState::MarkedForRelease);
    let mut after = AddrMap::new();
    after.insert(a(1), ReleaseState::MarkedForRelease); // kept
    after.insert(a(2), ReleaseState::Released); // released: not withdrawn
    after.insert(a(4), ReleaseState::MarkedForRelease); // new
    assert_eq!(
        marks_to_send(&before, &after, false),
        (set(&[4]), set(&[3]))
    );
    assert_eq!(
        marks_to_send(&before, &after, true),
        (AddrSet::new(), set(&[3]))
    );
}

#[test]
fn a_confirmed_group_is_tombstoned_per_allocation() {
    let g = ReclaimGroup {
        pod_uid: PodUid(5),
        reason: ReclaimReason::PodDeleted,
        addrs: vec![a(1), a(2)],
        first_observed: tokio::time::Instant::now(),
    };
    let mut fields = OperatorFields::default();
    tombstone_confirmed(&mut fields, &g);
    assert_eq!(fields.reclaim.len(), 2);
    assert_eq!(fields.reclaim[&a(2)].allocation, AllocationId(7));
    assert_eq!(fields.reclaim[&a(1)].pod_uid, PodUid(5));
}

fn tombstone_confirmed(fields: &mut OperatorFields, g: &ReclaimGroup) {
    super::tombstone(
        fields,
        g,
        vec![(a(1), AllocationId(6)), (a(2), AllocationId(7))],
    );
}

#[test]
fn answers_are_reported_by_outcome_and_a_live_one_names_the_pod_and_is_refused() {
    let mut node = stored();
    node.node.used.insert(
        a(1),
        UsedEntry {
            pod_uid: PodUid(3),
            pod: PodName::new("ns", "web"),
            allocation: AllocationId(3),
            since: SystemTime::UNIX_EPOCH.into(),
        },
    );
    let mut t = tombstone(3);
    t.reason = ReclaimReason::PodTerminal;
    node.operator.reclaim.insert(a(1), t);
    let ack = |outcome| ReclaimAck {
        pod_uid: PodUid(3),
        allocation: AllocationId(3),
        outcome,
    };
    let live = Answered::of(&node, "n", &a(1), &ack(ReclaimOutcome::Live)).expect("reported");
    assert!(live.refused);
    assert_eq!(live.type_, EventType::Warning);
    assert_eq!(live.reason, EventReason::GarbageCollectionFailed);
    assert_eq!(live.label.as_str(), ReclaimReason::PodTerminal.as_str());
    assert_eq!(live.outcome.as_str(), m::reclaim_outcome::REFUSED);
    assert!(live.message.contains("ns/web"), "{}", live.message);
    assert!(
        live.message
            .ends_with("the node side sees the pod running with it")
    );

    let done = Answered::of(&node, "n", &a(1), &ack(ReclaimOutcome::Reclaimed)).expect("reported");
    assert!(!done.refused);
    assert_eq!(
        (done.type_, done.reason, done.outcome.as_str()),
        (
            EventType::Normal,
            EventReason::GarbageCollected,
            m::reclaim_outcome::RECLAIMED
        )
    );
    assert!(!done.message.contains("ns/web"), "{}", done.message);
    assert_eq!(
        Answered::of(&node, "n", &a(9), &ack(ReclaimOutcome::Reclaimed))
            .expect("reported")
            .label
            .as_str(),
        "pod-deleted",
        "no tombstone left: the default reason"
    );
    assert_eq!(
        Answered::of(&node, "n", &a(1), &ack(ReclaimOutcome::Stale)),
        None
    );
}
