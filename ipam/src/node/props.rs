//! Property tests of [`NodeSide`]: random ADDs (repeated ones included), DELs (stale
//! ones included), marks, tombstones (on the exact allocation or not, pods live or not),
//! reboots and time.

use proptest::prelude::*;

use super::*;
use crate::types::NodeUid;

/// One step of a CNI runtime and an operator against the node side.
#[derive(Debug, Clone)]
enum Op {
    Add {
        pod: u8,
        cid: u8,
    },
    Del {
        pod: u8,
        cid: u8,
    },
    Mark {
        addr: u8,
    },
    Tomb {
        addr: u8,
        pod: u8,
        cid: u8,
        live: bool,
    },
    Reboot {
        cid: u8,
    },
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4u8, 0..3u8).prop_map(|(pod, cid)| Op::Add { pod, cid }),
        2 => (0..4u8, 0..3u8).prop_map(|(pod, cid)| Op::Del { pod, cid }),
        1 => (0..6u8).prop_map(|addr| Op::Mark { addr }),
        2 => (0..6u8, 0..4u8, 0..3u8, any::<bool>())
            .prop_map(|(addr, pod, cid, live)| Op::Tomb { addr, pod, cid, live }),
        1 => (0..3u8).prop_map(|cid| Op::Reboot { cid }),
        1 => Just(Op::Tick),
    ]
}

const POOL: [&str; 6] = [
    "10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1", "fd00::2", "fd00::3",
];

/// The allocation key of (pod, container): each pod's sandboxes have keys of their own.
fn key(pod: u8, cid: u8) -> AllocationId {
    alloc(u64::from(pod) << 8 | u64::from(cid))
}

fn used_but(
    s: &Side,
    skip: impl Fn(&IpAddr, &Held<AllocationId>) -> bool,
) -> Vec<(IpAddr, Held<AllocationId>)> {
    s.used()
        .filter(|(a, h)| !skip(a, h))
        .map(|(a, h)| (a, h.clone()))
        .collect()
}

fn check_add(
    s: &mut Side,
    n: &IpamNode,
    pod: u8,
    cid: u8,
    now: SystemTime,
) -> Result<(), TestCaseError> {
    let (uid, k) = (PodUid(pod.into()), key(pod, cid));
    let held = s.addrs_of(&k);
    let before = s.clone();
    match s.add(n, &BOTH, &none(), k, uid, now) {
        Ok(got) if !held.is_empty() => {
            prop_assert!(got.repeated);
            prop_assert_eq!(got.addrs, held, "a repeated ADD returns what it holds");
            prop_assert_eq!(&*s, &before);
        }
        Ok(got) => {
            prop_assert_eq!(got.addrs.len(), 2);
            for a in &got.addrs {
                prop_assert!(n.operator.addresses.contains(a));
                prop_assert!(before.holder(a).is_none());
                // an ended cooldown the record still lists is over
                prop_assert!(before.cooldowns().get(a).is_none_or(|until| *until <= now));
                prop_assert!(!n.operator.release.contains_key(a));
            }
        }
        Err(_) => prop_assert_eq!(&*s, &before, "all or none"),
    }
    Ok(())
}

fn check_del(s: &mut Side, pod: u8, cid: u8, now: SystemTime) -> Result<(), TestCaseError> {
    let (uid, k) = (PodUid(pod.into()), key(pod, cid));
    let mine = s.addrs_of(&k);
    let others = used_but(s, |_, h| h.key == k);
    let freed = s.del(&k, Some(uid), now).freed().to_vec();
    prop_assert_eq!(&freed, &mine);
    for a in &freed {
        prop_assert_eq!(s.cooldowns().get(a), Some(&(now + CD)));
    }
    prop_assert_eq!(
        used_but(s, |_, _| false),
        others,
        "only its own allocation goes"
    );
    prop_assert!(s.del(&k, Some(uid), now).freed().is_empty(), "idempotent");
    // the same key named with another pod (a stale DEL) frees nothing
    let other = PodUid(u128::from(pod) + 100);
    let kept = used_but(s, |_, _| false);
    prop_assert!(s.del(&k, Some(other), now).freed().is_empty());
    prop_assert_eq!(used_but(s, |_, _| false), kept);
    Ok(())
}

fn check_tomb(
    s: &mut Side,
    n: &mut IpamNode,
    (addr, pod, cid, live): (IpAddr, u8, u8, bool),
    now: SystemTime,
) -> Result<(), TestCaseError> {
    let (uid, k) = (PodUid(pod.into()), key(pod, cid));
    let exact = s
        .holder(&addr)
        .is_some_and(|h| h.pod_uid == uid && h.key == k);
    let newer = s.holder(&addr).is_some_and(|h| {
        s.used().any(|(a, o)| {
            Family::of(&a) == Family::of(&addr)
                && o.pod_uid == uid
                && o.key != k
                && o.since > h.since
        })
    });
    let others = used_but(s, |a, _| *a == addr);
    n.operator.reclaim.clear();
    n.operator.reclaim.insert(
        addr,
        Tombstone {
            pod_uid: uid,
            allocation: k,
            reason: ReclaimReason::PodDeleted,
        },
    );
    let got = s.answer_tombstones(&n.operator.reclaim, Some, |u| live && u == uid, now);
    let want = match (exact, live && !newer) {
        (false, _) => ReclaimOutcome::Stale,
        (true, true) => ReclaimOutcome::Live,
        (true, false) => ReclaimOutcome::Reclaimed,
    };
    prop_assert_eq!(s.reclaim_acks()[&addr].outcome, want);
    prop_assert_eq!(got.is_empty(), want != ReclaimOutcome::Reclaimed);
    prop_assert_eq!(
        s.holder(&addr).is_none(),
        want == ReclaimOutcome::Reclaimed || !exact && s.holder(&addr).is_none()
    );
    prop_assert_eq!(
        used_but(s, |a, _| *a == addr),
        others,
        "nothing else is touched"
    );
    n.operator.reclaim.clear();
    s.answer_tombstones(&n.operator.reclaim, Some, |_| false, now);
    prop_assert_eq!(
        s.reclaim_acks().contains_key(&addr),
        want != ReclaimOutcome::Live,
        "a live answer goes with its tombstone, the others with the next write"
    );
    prop_assert!(s.is_dirty(), "the answer is not written yet");
    s.tidy(now);
    prop_assert!(s.reclaim_acks().is_empty());
    Ok(())
}

fn check_reboot(s: &mut Side, cid: u8, now: SystemTime) -> Result<(), TestCaseError> {
    // the allocations of containers numbered `cid` were made under a past boot
    let past = |k: &AllocationId| (0..4u8).any(|p| *k == key(p, cid));
    let dead: Vec<IpAddr> = s
        .used()
        .filter(|(_, h)| past(&h.key))
        .map(|(a, _)| a)
        .collect();
    let alive = used_but(s, |_, h| past(&h.key));
    let freed: Vec<IpAddr> = s
        .expire_boot(past, now)
        .into_iter()
        .flat_map(|(_, _, a)| a)
        .collect();
    let mut sorted = freed.clone();
    sorted.sort();
    prop_assert_eq!(sorted, dead.clone());
    for a in &dead {
        prop_assert!(s.cooldowns().get(a).is_some_and(|t| *t >= now + CD));
    }
    prop_assert_eq!(used_but(s, |_, _| false), alive);
    Ok(())
}

proptest! {
    /// An allocation holds one address per family and a repeated ADD returns it; a DEL
    /// frees exactly its own allocation's addresses (nothing when stale or repeated); a
    /// tombstone frees only its exact allocation, and never a live pod's newest; a reboot
    /// frees exactly the past boot's allocations; nothing is handed out that is outside
    /// the pool, used, cooling down or marked; the index agrees with `used`.
    #[test]
    fn the_node_side_keeps_its_promises(ops in proptest::collection::vec(op(), 1..60)) {
        let mut n = node_with(&POOL);
        let mut s = Side::new(CD);
        let mut now = T;
        for op in ops {
            match op {
                Op::Add { pod, cid } => check_add(&mut s, &n, pod, cid, now)?,
                Op::Del { pod, cid } => check_del(&mut s, pod, cid, now)?,
                Op::Mark { addr } => {
                    let a = ip(POOL[usize::from(addr)]);
                    n.operator.release.insert(a, ReleaseState::MarkedForRelease);
                    answer_all(&mut s, &n, now, gone);
                }
                Op::Tomb { addr, pod, cid, live } => {
                    let a = ip(POOL[usize::from(addr)]);
                    check_tomb(&mut s, &mut n, (a, pod, cid, live), now)?;
                }
                Op::Reboot { cid } => check_reboot(&mut s, cid, now)?,
                Op::Tick => {
                    // the record written: what ends now waits for the next change
                    s.mark_clean();
                    now += CD / 2;
                    answer_all(&mut s, &n, now, gone);
                }
            }
            // one address per family per allocation, and the index is `used` by key
            let mut seen = std::collections::BTreeSet::new();
            for (a, h) in s.used() {
                prop_assert!(seen.insert((h.pod_uid, h.key, Family::of(&a))));
                prop_assert!(s.addrs_of(&h.key).contains(&a));
            }
            let indexed: usize = s.allocations().map(|(_, a)| a.len()).sum();
            prop_assert_eq!(indexed, s.used().count());
            now += Duration::from_millis(1);
        }
    }

    /// The search (bisecting past used addresses) finds what a lookup per address finds.
    #[test]
    fn free_address_is_the_lowest_address_no_map_holds(
        // per address 0..48 of each family: in the pool, used, cooling, marked, acked, excluded
        flags in proptest::collection::vec(any::<[bool; 6]>(), 96),
    ) {
        let mut n = IpamNode::new("n".into(), NodeUid(1));
        let mut s = Side::new(CD);
        let mut pool = AddrSet::new();
        let mut exclude = AddrSet::new();
        let mut acked = IpamNode::new("n".into(), NodeUid(1));
        for (i, f) in flags.iter().enumerate() {
            let a = if i < 48 {
                IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, i as u8))
            } else {
                IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i as u16))
            };
            if f[0] { pool.insert(a); }
            if f[1] { s.adopt(alloc(i as u64), PodUid(i as u128), &[a], T).unwrap(); }
            if f[2] && !f[1] {
                // every third cooldown ended by T (not yet dropped: still in the map)
                let at = if i % 3 == 0 { T - CD } else { T };
                s.adopt(alloc(1000 + i as u64), PodUid(1), &[a], at).unwrap();
                s.del(&alloc(1000 + i as u64), None, at);
            }
            if f[3] { n.operator.release.insert(a, ReleaseState::MarkedForRelease); }
            if f[4] { acked.operator.release.insert(a, ReleaseState::MarkedForRelease); }
            if f[5] { exclude.insert(a); }
        }
        // the acked addresses: answered (busy or not) through the rule itself
        s.answer_marks(&acked, &none(), T, &mut Answers::default());
        n.operator.addresses = Arc::new(pool);
        for family in [Family::V4, Family::V6] {
            let looked_up = n.operator.addresses.iter().find(|a| {
                Family::of(a) == family
                    && s.holder(a).is_none()
                    && s.cooldowns().get(a).is_none_or(|until| *until <= T)
                    && !n.operator.release.contains_key(a)
                    && !s.release_acks().contains_key(a)
                    && !exclude.contains(a)
            });
            prop_assert_eq!(s.free_address(&n, family, &exclude, T), looked_up);
        }
    }
}
