//! The release handshake's operator half (DESIGN.md "Release handshake"; Cilium §2.3), for
//! sources whose marks live in IPAMNode spec: mark → the node side answers → release or
//! withdraw. Pure functions over the operator's fields and the node side's answers.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

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
/// `ready-for-release`, in address order.
pub fn settle(fields: &mut OperatorFields, acks: &BTreeMap<IpAddr, ReleaseAck>) -> Vec<IpAddr> {
    let mut ready = Vec::new();
    fields
        .release
        .retain(|addr, state| match (*state, acks.get(addr)) {
            (ReleaseState::Released, ack) => ack.is_some(),
            (ReleaseState::MarkedForRelease, Some(ReleaseAck::DoNotRelease)) => false,
            (ReleaseState::MarkedForRelease, Some(ReleaseAck::ReadyForRelease)) => {
                ready.push(*addr);
                true
            }
            (ReleaseState::MarkedForRelease, None) => true,
        });
    ready
}

/// Marked (not yet released) addresses of a family.
pub fn marked(fields: &OperatorFields, family: Family) -> impl Iterator<Item = IpAddr> + '_ {
    fields
        .release
        .iter()
        .filter(move |(a, s)| **s == ReleaseState::MarkedForRelease && Family::of(a) == family)
        .map(|(a, _)| *a)
}

/// Withdraws marks of `family` until at most `keep` remain: unanswered marks first, then
/// the highest addresses. Returns how many were withdrawn.
pub fn withdraw_surplus(
    fields: &mut OperatorFields,
    acks: &BTreeMap<IpAddr, ReleaseAck>,
    family: Family,
    keep: u64,
) -> u64 {
    let mut all: Vec<IpAddr> = marked(fields, family).collect();
    let surplus = (all.len() as u64).saturating_sub(keep);
    // unanswered first (key false < true), then highest address first
    all.sort_by_key(|a| (acks.contains_key(a), std::cmp::Reverse(*a)));
    for a in all.iter().take(surplus as usize) {
        fields.release.remove(a);
    }
    surplus
}

/// Completes a release at the source: the entry becomes `released` and the address leaves
/// the node's pool, in the same write.
pub fn released(fields: &mut OperatorFields, addrs: &[IpAddr]) {
    let addresses = std::sync::Arc::make_mut(&mut fields.addresses);
    for a in addrs {
        addresses.remove(a);
        fields.release.insert(*a, ReleaseState::Released);
    }
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
        let mut acks = BTreeMap::new();
        acks.insert(ip("10.0.0.1"), ReleaseAck::ReadyForRelease);
        acks.insert(ip("10.0.0.2"), ReleaseAck::DoNotRelease);
        acks.insert(ip("10.0.0.4"), ReleaseAck::ReadyForRelease);
        let ready = settle(&mut f, &acks);
        assert_eq!(ready, vec![ip("10.0.0.1")]);
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
        assert_eq!(f.release[&ip("10.0.0.1")], Released);
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
        let mut acks = BTreeMap::new();
        acks.insert(ip("10.0.0.3"), ReleaseAck::ReadyForRelease);
        assert_eq!(withdraw_surplus(&mut f, &acks, Family::V4, 1), 2);
        assert_eq!(
            marked(&f, Family::V4).collect::<Vec<_>>(),
            vec![ip("10.0.0.3")]
        );
        assert_eq!(marked(&f, Family::V6).count(), 1, "other family untouched");
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
