//! Pod bound → address, as the operator sees it: the time from a maintainer's first look
//! that finds a pod waiting on its node (bound, not terminal, no pod IPs and no `used`
//! entry of its UID) to the first look that finds its UID in the node's `used` list
//! (`tidepool_ipam_pod_ip_wait_seconds`). The same quantity as `simulate`'s
//! `pods.ip_wait_seconds`, seen from the operator: it starts at the operator's first look,
//! not at the bind, and pods served before any look never count.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use foldhash::fast::RandomState;

use tokio::time::Instant;

use crate::types::{PodUid, UsedMap};

/// One node's pods seen waiting, with when each was first seen so.
#[derive(Debug, Default)]
pub(crate) struct IpWaits {
    since: HashMap<PodUid, Instant, RandomState>,
}

impl IpWaits {
    /// One look at the node at `now`: `pending` are its bound, non-terminal pods without
    /// pod IPs, `used` its `used` list, and `alive(uid)` whether a pod still exists and is
    /// not terminal. Returns the waits that ended at this look. A pod that went away
    /// without an address is forgotten; one whose pod IPs showed before its `used` entry
    /// reached the operator's cache is kept until the entry shows.
    pub fn look(
        &mut self,
        now: Instant,
        pending: &[PodUid],
        used: &UsedMap,
        alive: impl Fn(PodUid) -> bool,
    ) -> Vec<Duration> {
        if self.since.is_empty() && pending.is_empty() {
            return Vec::new();
        }
        // at every pass of every node with pods waiting: foldhash, not SipHash
        let with_address: HashSet<PodUid, RandomState> = used.values().map(|e| e.pod_uid).collect();
        let pending_set: HashSet<PodUid, RandomState> = pending.iter().copied().collect();
        let mut ended = Vec::new();
        self.since.retain(|uid, first| {
            if with_address.contains(uid) {
                ended.push(now.saturating_duration_since(*first));
                false
            } else {
                pending_set.contains(uid) || alive(*uid)
            }
        });
        for uid in pending {
            if !with_address.contains(uid) {
                self.since.entry(*uid).or_insert(now);
            }
        }
        if self.since.is_empty() {
            // a map keeps its capacity: after a bring-up each of 10,000 nodes would hold
            // room for its ~110 pods for ever (~8 % of simulate's peak at that scale)
            self.since = HashMap::default();
        }
        ended
    }

    /// Forgets every pod (this replica stopped leading: its next look starts afresh).
    pub fn clear(&mut self) {
        self.since.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.since.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AllocationId, PodName, UsedEntry};
    use std::time::SystemTime;

    fn used_by(uids: &[u128]) -> UsedMap {
        let mut m = UsedMap::new();
        for (i, u) in uids.iter().enumerate() {
            m.insert(
                std::net::IpAddr::from([10, 0, 0, i as u8 + 1]),
                UsedEntry {
                    pod_uid: PodUid(*u),
                    pod: PodName::new("ns", "p"),
                    allocation: AllocationId(1),
                    since: SystemTime::UNIX_EPOCH.into(),
                },
            );
        }
        m
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_wait_runs_from_the_first_look_to_the_used_entry() {
        let t0 = Instant::now();
        let mut w = IpWaits::default();
        let (a, b) = (PodUid(1), PodUid(2));
        assert!(w.look(t0, &[a], &used_by(&[]), |_| true).is_empty());
        // a second look while it still waits does not restart its clock; b starts
        assert!(
            w.look(t0 + 2 * S, &[a, b], &used_by(&[]), |_| true)
                .is_empty()
        );
        // a got its address (pod IPs not reported yet: still pending)
        assert_eq!(
            w.look(t0 + 5 * S, &[a, b], &used_by(&[1]), |_| true),
            vec![5 * S]
        );
        // b's pod IPs showed before its used entry reached us: kept, then observed
        assert!(w.look(t0 + 6 * S, &[], &used_by(&[1]), |_| true).is_empty());
        assert_eq!(
            w.look(t0 + 7 * S, &[], &used_by(&[1, 2]), |_| true),
            vec![5 * S]
        );
        assert_eq!(w.len(), 0);
        assert_eq!(
            w.since.capacity(),
            0,
            "no pod waits: the map's memory is given back"
        );
    }

    #[test]
    fn pods_served_before_any_look_or_gone_without_an_address_are_not_observed() {
        let t0 = Instant::now();
        let mut w = IpWaits::default();
        let (a, b) = (PodUid(1), PodUid(2));
        // a already has its entry at the first look: it never waited in our eyes
        assert!(w.look(t0, &[a, b], &used_by(&[1]), |_| true).is_empty());
        assert_eq!(w.len(), 1);
        // b is deleted before it got an address: forgotten, nothing observed
        assert!(w.look(t0 + S, &[], &used_by(&[1]), |u| u != b).is_empty());
        assert_eq!(w.len(), 0);
        // and a later entry of its UID is not a wait either
        assert!(
            w.look(t0 + 2 * S, &[], &used_by(&[1, 2]), |_| true)
                .is_empty()
        );
    }

    #[test]
    fn clear_restarts_the_clocks() {
        let t0 = Instant::now();
        let mut w = IpWaits::default();
        w.look(t0, &[PodUid(1)], &used_by(&[]), |_| true);
        w.clear();
        w.look(t0 + 10 * S, &[PodUid(1)], &used_by(&[]), |_| true);
        assert_eq!(
            w.look(t0 + 11 * S, &[PodUid(1)], &used_by(&[1]), |_| true),
            vec![S]
        );
    }
}
