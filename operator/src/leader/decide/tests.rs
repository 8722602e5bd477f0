use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::*;

const LEASE: Duration = Duration::from_secs(15);
const NS: Duration = Duration::from_nanos(1);

fn rec(holder: &str, rv: &str) -> LeaseRecord {
    LeaseRecord {
        holder: holder.into(),
        lease_duration_seconds: 15,
        acquire_time: Some(ts(1_000)),
        renew_time: Some(ts(1_010)),
        transitions: 3,
        resource_version: rv.into(),
    }
}

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).unwrap()
}

fn seen(record: LeaseRecord, changed_at: Instant) -> Observed {
    Observed { record, changed_at }
}

#[test]
fn a_missing_lease_is_created_by_a_follower_and_deposes_a_leader() {
    let t = Instant::now();
    assert_eq!(decide("a", None, None, t, LEASE), Decision::Create);
    assert_eq!(
        decide("a", Some(t + LEASE), None, t, LEASE),
        Decision::StepDown(StepDown::Deleted)
    );
}

#[test]
fn a_released_lease_is_taken_at_once() {
    let t = Instant::now();
    let s = seen(rec("", "7"), t);
    assert_eq!(decide("a", None, Some(&s), t, LEASE), Decision::Acquire);
}

/// Over a grid of waits and declared durations: a follower takes over exactly when a full
/// lease duration (ours or the record's, the longer) has passed since the record last changed.
#[test]
fn a_follower_takes_over_only_after_a_full_lease_duration_without_change() {
    let t0 = Instant::now();
    for declared in [0, 1, 15, 30] {
        let mut r = rec("b", "7");
        r.lease_duration_seconds = declared;
        let s = seen(r, t0);
        let wait = LEASE.max(Duration::from_secs(declared as u64));
        for half_secs in 0..=80u64 {
            let now = t0 + Duration::from_millis(500 * half_secs);
            let d = decide("a", None, Some(&s), now, LEASE);
            if now - t0 >= wait {
                assert_eq!(d, Decision::Acquire, "declared {declared}, {half_secs}/2 s");
            } else {
                assert_eq!(
                    d,
                    Decision::Wait { until: t0 + wait },
                    "declared {declared}"
                );
            }
        }
        // the boundary to the nanosecond
        let before = decide("a", None, Some(&s), t0 + wait - NS, LEASE);
        assert!(matches!(before, Decision::Wait { .. }), "{before:?}");
        assert_eq!(
            decide("a", None, Some(&s), t0 + wait, LEASE),
            Decision::Acquire
        );
    }
}

/// The holder's renewTime is never compared with a clock: a record renewed "long ago" by
/// the holder's wall clock is still waited on, one "in the future" still expires.
#[test]
fn the_holders_renew_time_does_not_count() {
    let t0 = Instant::now();
    let mut old = rec("b", "7");
    old.renew_time = Some(ts(0));
    let s = seen(old, t0);
    assert!(matches!(
        decide("a", None, Some(&s), t0 + NS, LEASE),
        Decision::Wait { .. }
    ));
    let mut future = rec("b", "7");
    future.renew_time = Some(ts(4_000_000_000));
    let s = seen(future, t0);
    assert_eq!(
        decide("a", None, Some(&s), t0 + LEASE, LEASE),
        Decision::Acquire
    );
}

#[test]
fn any_change_of_the_record_restarts_the_wait_and_a_repeat_does_not() {
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_secs(10);
    let first = Observed::update(None, rec("b", "7"), t0);
    assert_eq!(
        first.changed_at, t0,
        "the first sighting counts as a change"
    );
    let same = Observed::update(Some(first.clone()), rec("b", "7"), t1);
    assert_eq!(same.changed_at, t0);
    let changes = [
        rec("b", "8"),
        LeaseRecord {
            renew_time: Some(ts(1_012)),
            ..rec("b", "7")
        },
        LeaseRecord {
            transitions: 4,
            ..rec("b", "7")
        },
        rec("c", "7"),
    ];
    for r in changes {
        let next = Observed::update(Some(first.clone()), r.clone(), t1);
        assert_eq!(next.changed_at, t1, "{r:?}");
        assert_eq!(next.record, r);
        assert_eq!(
            decide("a", None, Some(&next), t0 + LEASE, LEASE),
            Decision::Wait { until: t1 + LEASE }
        );
    }
}

#[test]
fn the_holder_renews_whether_or_not_it_thinks_it_leads() {
    let t = Instant::now();
    let s = seen(rec("a", "7"), t - Duration::from_secs(100));
    assert_eq!(decide("a", None, Some(&s), t, LEASE), Decision::Renew);
    let deadline = t + Duration::from_secs(10);
    assert_eq!(
        decide("a", Some(deadline), Some(&s), t, LEASE),
        Decision::Renew
    );
}

#[test]
fn a_leader_steps_down_at_its_deadline_or_when_the_lease_names_another() {
    let t = Instant::now();
    let mine = seen(rec("a", "7"), t);
    let d = t + Duration::from_secs(10);
    assert_eq!(
        decide("a", Some(d), Some(&mine), d - NS, LEASE),
        Decision::Renew
    );
    for now in [d, d + NS, d + LEASE] {
        assert_eq!(
            decide("a", Some(d), Some(&mine), now, LEASE),
            Decision::StepDown(StepDown::DeadlinePassed)
        );
    }
    let other = seen(rec("b", "8"), t);
    assert_eq!(
        decide("a", Some(d), Some(&other), t, LEASE),
        Decision::StepDown(StepDown::HeldBy("b".into()))
    );
    let released = seen(rec("", "8"), t);
    assert_eq!(
        decide("a", Some(d), Some(&released), t, LEASE),
        Decision::StepDown(StepDown::HeldBy(String::new()))
    );
}

#[test]
fn step_down_reasons_read_well() {
    let s = |r: StepDown| r.to_string();
    assert_eq!(
        s(StepDown::DeadlinePassed),
        "no renewal succeeded before the renew deadline"
    );
    assert_eq!(s(StepDown::HeldBy("b".into())), "the Lease is held by b");
    assert!(s(StepDown::HeldBy(String::new())).contains("released"));
    assert!(s(StepDown::Deleted).contains("deleted"));
}

#[test]
fn claims_count_transitions_like_client_go() {
    let t = Instant::now();
    let now = ts(2_000);
    let created = claim("a", &Decision::Create, None, now, 15).unwrap();
    assert_eq!(
        created,
        LeaseRecord {
            holder: "a".into(),
            lease_duration_seconds: 15,
            acquire_time: Some(now),
            renew_time: Some(now),
            transitions: 0,
            resource_version: String::new(),
        }
    );
    // renewal: acquireTime and transitions kept, the observed version is the precondition
    let mine = seen(rec("a", "7"), t);
    let renewed = claim("a", &Decision::Renew, Some(&mine), now, 15).unwrap();
    assert_eq!(renewed.acquire_time, Some(ts(1_000)));
    assert_eq!(renewed.renew_time, Some(now));
    assert_eq!(
        (renewed.transitions, renewed.resource_version.as_str()),
        (3, "7")
    );
    // acquisition from another holder or from a released Lease: one more transition
    for from in ["b", ""] {
        let s = seen(rec(from, "9"), t);
        let taken = claim("a", &Decision::Acquire, Some(&s), now, 15).unwrap();
        assert_eq!(taken.holder, "a");
        assert_eq!(taken.acquire_time, Some(now));
        assert_eq!(
            (taken.transitions, taken.resource_version.as_str()),
            (4, "9")
        );
    }
    // nothing to write otherwise
    let s = seen(rec("b", "9"), t);
    for d in [
        Decision::Wait { until: t },
        Decision::StepDown(StepDown::DeadlinePassed),
    ] {
        assert_eq!(claim("a", &d, Some(&s), now, 15), None, "{d:?}");
    }
    assert_eq!(claim("a", &Decision::Renew, None, now, 15), None);
}

#[test]
fn only_the_holder_releases_and_keeps_the_count() {
    let t = Instant::now();
    let now = ts(2_000);
    let mine = seen(rec("a", "7"), t);
    let r = release("a", &mine, now).unwrap();
    assert!(!r.is_held());
    assert_eq!((r.transitions, r.resource_version.as_str()), (3, "7"));
    assert_eq!(r.lease_duration_seconds, 1);
    assert_eq!(release("b", &mine, now), None);
    // a follower that sees the release takes the Lease at its next look
    let after = Observed::update(Some(mine), r, t + NS);
    assert_eq!(
        decide("b", None, Some(&after), t + NS, LEASE),
        Decision::Acquire
    );
}
