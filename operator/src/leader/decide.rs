//! The election's rules as pure functions of plain values: no clock is read, no request
//! sent, so every case is a unit test.
//!
//! client-go's model: a follower never compares the holder's `renewTime` with its own wall
//! clock (clocks differ between machines). It notes on its *monotonic* clock when it last saw
//! the record change, and takes over only after a full lease duration without a change.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// What a Lease says (coordination.k8s.io/v1 `spec`, plus its resourceVersion).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Empty: nobody holds it (released, or never held).
    pub holder: String,
    pub lease_duration_seconds: i32,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub transitions: i32,
    /// The write precondition; any change of the object changes it.
    pub resource_version: String,
}

impl LeaseRecord {
    /// Whether anyone holds the Lease.
    pub fn is_held(&self) -> bool {
        !self.holder.is_empty()
    }
}

/// The last record seen and when it was last seen to change, on the local monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub record: LeaseRecord,
    pub changed_at: Instant,
}

impl Observed {
    /// Notes a freshly read record: `changed_at` moves to `now` only if it differs from the
    /// one seen before (any field, the resourceVersion included). The first sighting counts
    /// as a change, so a replica that just started waits a full lease duration.
    pub fn update(prev: Option<Observed>, record: LeaseRecord, now: Instant) -> Observed {
        match prev {
            Some(p) if p.record == record => p,
            _ => Observed {
                record,
                changed_at: now,
            },
        }
    }

    /// When a follower may take over if nothing changes: `changed_at` + the longer of our
    /// lease duration and the record's (the holder promised to renew within its own, we
    /// within ours; taking the longer never cuts either short).
    pub fn expires_at(&self, lease_duration: Duration) -> Instant {
        let declared = u64::try_from(self.record.lease_duration_seconds).unwrap_or(0);
        self.changed_at + lease_duration.max(Duration::from_secs(declared))
    }
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease exists: create it, holding it.
    Create,
    /// Take the Lease from a holder that let it expire, or that released it.
    Acquire,
    /// This replica holds it: write a fresh renewTime.
    Renew,
    /// Someone else holds a live Lease: look again by `until` (its expiry if nothing changes).
    Wait { until: Instant },
    /// This replica must stop leading now.
    StepDown(StepDown),
}

/// Why a leader steps down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepDown {
    /// The renew deadline passed without a successful renewal.
    DeadlinePassed,
    /// The Lease names another holder, or none (someone else released it).
    HeldBy(String),
    /// The Lease was deleted.
    Deleted,
}

impl std::fmt::Display for StepDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepDown::DeadlinePassed => {
                f.write_str("no renewal succeeded before the renew deadline")
            }
            StepDown::HeldBy(h) if h.is_empty() => {
                f.write_str("the Lease was released by someone else")
            }
            StepDown::HeldBy(h) => write!(f, "the Lease is held by {h}"),
            StepDown::Deleted => f.write_str("the Lease was deleted"),
        }
    }
}

/// The decision of replica `me` at `now`.
///
/// `step_down_at` is this replica's step-down instant while it leads (None while it follows);
/// `seen` the last observation of the Lease (None: it does not exist).
pub fn decide(
    me: &str,
    step_down_at: Option<Instant>,
    seen: Option<&Observed>,
    now: Instant,
    lease_duration: Duration,
) -> Decision {
    let leading = step_down_at.is_some();
    if step_down_at.is_some_and(|d| now >= d) {
        return Decision::StepDown(StepDown::DeadlinePassed);
    }
    // A leader whose Lease vanished or names someone else (or no one) has been deposed: a
    // follower may act on such a record at once, so the leader must not write on.
    let Some(seen) = seen else {
        return if leading {
            Decision::StepDown(StepDown::Deleted)
        } else {
            Decision::Create
        };
    };
    let rec = &seen.record;
    if rec.holder == me {
        return Decision::Renew;
    }
    if leading {
        return Decision::StepDown(StepDown::HeldBy(rec.holder.clone()));
    }
    if !rec.is_held() {
        return Decision::Acquire;
    }
    let until = seen.expires_at(lease_duration);
    if now >= until {
        Decision::Acquire
    } else {
        Decision::Wait { until }
    }
}

/// The record to write for `decision` (Create, Acquire or Renew; None for the others), as
/// client-go builds it: a renewal keeps acquireTime and leaseTransitions, an acquisition
/// sets acquireTime and counts one transition, a new Lease starts at zero. The
/// resourceVersion is the observed one: the write's precondition.
pub fn claim(
    me: &str,
    decision: &Decision,
    seen: Option<&Observed>,
    wall_now: Timestamp,
    lease_duration_seconds: i32,
) -> Option<LeaseRecord> {
    let base = LeaseRecord {
        holder: me.to_string(),
        lease_duration_seconds,
        acquire_time: Some(wall_now),
        renew_time: Some(wall_now),
        transitions: 0,
        resource_version: String::new(),
    };
    let prev = seen.map(|s| &s.record);
    match (decision, prev) {
        (Decision::Create, _) => Some(base),
        (Decision::Renew, Some(p)) => Some(LeaseRecord {
            acquire_time: p.acquire_time.or(Some(wall_now)),
            transitions: p.transitions,
            resource_version: p.resource_version.clone(),
            ..base
        }),
        (Decision::Acquire, Some(p)) => Some(LeaseRecord {
            transitions: p.transitions.saturating_add(1),
            resource_version: p.resource_version.clone(),
            ..base
        }),
        _ => None,
    }
}

/// The record that gives the Lease up (client-go's ReleaseOnCancel): no holder, so a
/// follower takes it at its next look instead of after a lease duration. Only for a
/// record this replica holds; the observed resourceVersion keeps it from clearing a
/// successor's claim.
pub fn release(me: &str, seen: &Observed, wall_now: Timestamp) -> Option<LeaseRecord> {
    let rec = &seen.record;
    (rec.holder == me).then(|| LeaseRecord {
        holder: String::new(),
        lease_duration_seconds: 1,
        acquire_time: Some(wall_now),
        renew_time: Some(wall_now),
        transitions: rec.transitions,
        resource_version: rec.resource_version.clone(),
    })
}

#[cfg(test)]
mod tests;
