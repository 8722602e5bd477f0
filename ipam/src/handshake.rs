//! The release handshake's operator half (DESIGN.md "Release handshake"; Cilium §2.3), for
//! sources whose marks live in IPAMNode spec: mark → the node side answers → release or
//! withdraw. Pure functions over the operator's fields and the node side's answers.

use std::time::Duration;

use tokio::time::Instant;

use crate::addrs::{AddrMap, AddrSet, Run, run_len, saturate};
use crate::types::{Family, OperatorFields, ReleaseAck, ReleaseState};

/// Release settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseConfig {
    /// `--release-excess-ips`.
    pub enabled: bool,
    /// `--excess-ip-release-delay`: how long excess must persist before marking.
    pub delay: Duration,
}

impl Default for ReleaseConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            delay: Duration::from_secs(180),
        }
    }
}

/// Settles answered marks: a `released` entry goes once the node side dropped its answer;
/// `do-not-release` withdraws the mark. Returns the marked addresses answered
/// `ready-for-release`.
pub fn settle(fields: &mut OperatorFields, acks: &AddrMap<ReleaseAck>) -> AddrSet {
    let mut ready = AddrSet::new();
    let mut gone = AddrSet::new();
    for (f, run, state) in fields.release.runs() {
        for (piece, ack) in acks.pieces(f, run) {
            match (*state, ack) {
                (ReleaseState::Released, None)
                | (ReleaseState::MarkedForRelease, Some(ReleaseAck::DoNotRelease)) => {
                    gone.insert_run(f, piece)
                }
                (ReleaseState::MarkedForRelease, Some(ReleaseAck::ReadyForRelease)) => {
                    ready.insert_run(f, piece)
                }
                (ReleaseState::Released, Some(_)) | (ReleaseState::MarkedForRelease, None) => {}
            }
        }
    }
    fields.release.remove_set(&gone);
    ready
}

/// Withdraws marks of `family` until at most `keep` remain: unanswered marks first, then
/// the highest addresses. Returns how many were withdrawn.
pub fn withdraw_surplus(
    fields: &mut OperatorFields,
    acks: &AddrMap<ReleaseAck>,
    family: Family,
    keep: u64,
) -> u64 {
    // the marks cut into pieces each wholly answered or wholly unanswered
    let mut pieces: Vec<(bool, Run)> = Vec::new();
    for (run, state) in fields.release.runs_of(family) {
        if *state == ReleaseState::MarkedForRelease {
            pieces.extend(
                acks.pieces(family, run)
                    .into_iter()
                    .map(|(r, ack)| (ack.is_some(), r)),
            );
        }
    }
    let total = pieces
        .iter()
        .fold(0u128, |n, (_, r)| n.saturating_add(run_len(r)));
    let surplus = total.saturating_sub(keep.into());
    // unanswered first (false < true), then highest address first
    pieces.sort_by_key(|(answered, r)| (*answered, std::cmp::Reverse(*r.start())));
    let mut left = surplus;
    for (_, r) in pieces {
        if left == 0 {
            break;
        }
        let take = run_len(&r).min(left);
        fields
            .release
            .remove_run(family, r.end() - (take - 1)..=*r.end());
        left -= take;
    }
    saturate(surplus)
}

/// Completes a release at the source: the entries become `released` and the addresses
/// leave the node's pool, in the same write.
pub fn released(fields: &mut OperatorFields, addrs: &AddrSet) {
    std::sync::Arc::make_mut(&mut fields.addresses).subtract(addrs);
    fields.release.insert_set(addrs, ReleaseState::Released);
}

/// Whether excess has persisted long enough to mark: `since` is the first time excess was
/// seen (reset when it vanishes). Returns `Ok(())` when marking may start, else the time
/// it may.
pub fn excess_persisted(
    since: &mut Option<Instant>,
    excess: u64,
    now: Instant,
    delay: Duration,
) -> Result<(), Option<Instant>> {
    if excess == 0 {
        *since = None;
        return Err(None);
    }
    let start = *since.get_or_insert(now);
    if now >= start + delay {
        Ok(())
    } else {
        Err(Some(start + delay))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    /// Marked (not yet released) addresses of a family.
    fn marked(fields: &OperatorFields, family: Family) -> AddrSet {
        fields
            .release
            .keys_where(|s| *s == ReleaseState::MarkedForRelease)
            .of_family(family)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn fields(marks: &[(&str, ReleaseState)]) -> OperatorFields {
        let mut f = OperatorFields::default();
        for (a, s) in marks {
            std::sync::Arc::make_mut(&mut f.addresses).insert(ip(a));
            f.release.insert(ip(a), *s);
        }
        f
    }

    #[test]
    fn settle_follows_the_answers() {
        use ReleaseState::*;
        let mut f = fields(&[
            ("10.0.0.1", MarkedForRelease),
            ("10.0.0.2", MarkedForRelease),
            ("10.0.0.3", MarkedForRelease),
            ("10.0.0.4", Released),
            ("10.0.0.5", Released),
        ]);
        let mut acks = AddrMap::new();
        acks.insert(ip("10.0.0.1"), ReleaseAck::ReadyForRelease);
        acks.insert(ip("10.0.0.2"), ReleaseAck::DoNotRelease);
        acks.insert(ip("10.0.0.4"), ReleaseAck::ReadyForRelease);
        let ready = settle(&mut f, &acks);
        assert_eq!(ready, AddrSet::from_iter([ip("10.0.0.1")]));
        assert!(
            !f.release.contains_key(&ip("10.0.0.2")),
            "do-not-release withdraws"
        );
        assert!(f.release.contains_key(&ip("10.0.0.3")), "unanswered stays");
        assert!(
            f.release.contains_key(&ip("10.0.0.4")),
            "released waits for the ack to go"
        );
        assert!(!f.release.contains_key(&ip("10.0.0.5")));
        released(&mut f, &ready);
        assert_eq!(f.release.get(&ip("10.0.0.1")), Some(&Released));
        assert!(!f.addresses.contains(&ip("10.0.0.1")));
    }

    #[test]
    fn surplus_withdraws_unanswered_marks_first() {
        use ReleaseState::*;
        let mut f = fields(&[
            ("10.0.0.1", MarkedForRelease),
            ("10.0.0.2", MarkedForRelease),
            ("10.0.0.3", MarkedForRelease),
            ("fd00::1", MarkedForRelease),
        ]);
        let mut acks = AddrMap::new();
        acks.insert(ip("10.0.0.3"), ReleaseAck::ReadyForRelease);
        assert_eq!(withdraw_surplus(&mut f, &acks, Family::V4, 1), 2);
        assert_eq!(marked(&f, Family::V4), AddrSet::from_iter([ip("10.0.0.3")]));
        assert_eq!(
            marked(&f, Family::V6).len(Family::V6),
            1,
            "other family untouched"
        );
        assert_eq!(withdraw_surplus(&mut f, &acks, Family::V4, 5), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn excess_must_persist_for_the_delay() {
        let d = Duration::from_secs(180);
        let t0 = Instant::now();
        let mut since = None;
        assert_eq!(excess_persisted(&mut since, 4, t0, d), Err(Some(t0 + d)));
        assert_eq!(
            excess_persisted(&mut since, 2, t0 + Duration::from_secs(100), d),
            Err(Some(t0 + d))
        );
        assert_eq!(excess_persisted(&mut since, 2, t0 + d, d), Ok(()));
        // excess vanishing restarts the clock
        assert_eq!(excess_persisted(&mut since, 0, t0 + d, d), Err(None));
        let t1 = t0 + Duration::from_secs(200);
        assert_eq!(excess_persisted(&mut since, 1, t1, d), Err(Some(t1 + d)));
    }
}
