//! The node side's rules, on [`NodeSide`] alone: the simulator and the agent call these
//! methods, so what is proved here holds for both.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::addrs::AddrSet;
use crate::types::{
    AllocationId, Family, NodeUid, PodName, ReclaimOutcome, ReclaimReason, ReleaseAck,
    ReleaseState, Tombstone,
};

type Side = NodeSide<AllocationId>;

const CD: Duration = Duration::from_secs(30);
const T: SystemTime = SystemTime::UNIX_EPOCH;
const V4: [Family; 1] = [Family::V4];
const BOTH: [Family; 2] = [Family::V4, Family::V6];

fn alloc(cid: u64) -> AllocationId {
    AllocationId::new(&format!("{cid:064x}"), "eth0")
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn set(addrs: &[&str]) -> AddrSet {
    addrs.iter().map(|a| ip(a)).collect()
}

fn node_with(addrs: &[&str]) -> IpamNode {
    let mut n = IpamNode::new("n".into(), NodeUid(1));
    n.operator.addresses = Arc::new(set(addrs));
    n
}

fn none() -> AddrSet {
    AddrSet::new()
}

/// ADD of allocation `cid` of pod `uid` at `now`: its addresses, or `None`.
fn add_at(
    s: &mut Side,
    n: &IpamNode,
    f: &[Family],
    uid: u128,
    cid: u64,
    now: SystemTime,
) -> Option<Vec<IpAddr>> {
    s.add(n, f, &none(), alloc(cid), PodUid(uid), now)
        .ok()
        .map(|a| a.addrs)
}

fn add(s: &mut Side, n: &IpamNode, f: &[Family], uid: u128, cid: u64) -> Option<Vec<IpAddr>> {
    add_at(s, n, f, uid, cid, T)
}

fn del(s: &mut Side, uid: u128, cid: u64, now: SystemTime) -> Vec<IpAddr> {
    s.del(&alloc(cid), Some(PodUid(uid)), now).freed().to_vec()
}

/// What a cloud source's node side answers in one go (the simulator's sequence).
fn answer_all(
    s: &mut Side,
    n: &IpamNode,
    now: SystemTime,
    live: impl Fn(PodUid) -> bool,
) -> Answers {
    let mut out = Answers {
        reclaimed: s.answer_tombstones(&n.operator.reclaim, Some, live, now),
        ..Answers::default()
    };
    s.answer_marks(n, &none(), now, &mut out);
    s.forget_outside(&n.operator.addresses);
    s.tidy(now);
    out
}

fn gone(_: PodUid) -> bool {
    false
}

fn tomb(uid: u128, cid: u64) -> Tombstone {
    Tombstone {
        pod_uid: PodUid(uid),
        allocation: alloc(cid),
        reason: ReclaimReason::PodDeleted,
    }
}

fn outcome(s: &Side, a: &str) -> ReclaimOutcome {
    s.reclaim_acks()[&ip(a)].outcome
}

#[test]
fn add_is_all_or_none_and_del_checks_the_container() {
    let n = node_with(&["10.0.0.1", "fd00::1"]);
    let mut s = Side::new(CD);
    let got = add(&mut s, &n, &BOTH, 1, 7).unwrap();
    assert_eq!(got, vec![ip("10.0.0.1"), ip("fd00::1")]);
    assert!(add(&mut s, &n, &V4, 2, 1).is_none());
    assert!(del(&mut s, 1, 8, T).is_empty(), "stale DEL ignored");
    assert_eq!(del(&mut s, 1, 7, T).len(), 2);
    assert!(del(&mut s, 1, 7, T).is_empty(), "DEL is idempotent");
    // cooling down: not reusable yet
    assert!(add(&mut s, &n, &V4, 2, 1).is_none());
    answer_all(&mut s, &n, T + CD, gone);
    assert!(add(&mut s, &n, &V4, 2, 1).is_some());
}

#[test]
fn a_repeated_add_returns_the_same_addresses_and_changes_nothing() {
    let n = node_with(&["10.0.0.1", "10.0.0.9", "fd00::1"]);
    let mut s = Side::new(CD);
    let first = s
        .add(&n, &BOTH, &none(), alloc(1), PodUid(1), T)
        .expect("add");
    assert_eq!((first.addrs.len(), first.repeated), (2, false));
    s.mark_clean();
    let before = s.clone();
    // the runtime retries after a lost reply
    let later = T + Duration::from_secs(5);
    let again = s
        .add(&n, &V4, &none(), alloc(1), PodUid(1), later)
        .expect("repeated add");
    assert_eq!(again.addrs, first.addrs);
    assert!(again.repeated);
    assert!(!s.is_dirty(), "a repeated ADD changes nothing");
    assert_eq!(s, before);
    assert!(s.holder(&ip("10.0.0.9")).is_none());
    let (held, addrs) = s.allocation(&alloc(1)).expect("recorded");
    assert_eq!((held.since, addrs), (T.into(), first.addrs));
}

#[test]
fn an_add_never_takes_a_held_cooling_or_excluded_address() {
    let n = node_with(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let mut s = Side::new(CD);
    // gateways and live pods' addresses are excluded, and stay untouched
    let exclude = set(&["10.0.0.1"]);
    let a = s
        .add(&n, &V4, &exclude, alloc(1), PodUid(1), T)
        .expect("add");
    assert_eq!(a.addrs, vec![ip("10.0.0.2")]);
    assert!(s.cooldowns().is_empty() && s.holder(&ip("10.0.0.1")).is_none());
    let err = s
        .adopt(alloc(2), PodUid(2), &[ip("10.0.0.2")], T)
        .expect_err("held");
    assert!(matches!(err, Refused::AddressInUse { .. }), "{err:?}");

    assert_eq!(del(&mut s, 1, 1, T).len(), 1);
    let err = s
        .adopt(alloc(2), PodUid(2), &[ip("10.0.0.2")], T)
        .expect_err("cooling");
    assert_eq!(
        err,
        Refused::AddressCooling {
            addr: ip("10.0.0.2")
        }
    );
    // all or nothing: a refused dual-address record takes neither
    let pair = [ip("10.0.0.3"), ip("10.0.0.2")];
    let err = s.adopt(alloc(2), PodUid(2), &pair, T).expect_err("cooling");
    assert!(matches!(err, Refused::AddressCooling { .. }), "{err:?}");
    assert!(s.holder(&ip("10.0.0.3")).is_none());
    // the pool has nothing free but excluded or cooling addresses
    let all = set(&["10.0.0.1", "10.0.0.3"]);
    let err = s
        .add(&n, &V4, &all, alloc(3), PodUid(3), T)
        .expect_err("none free");
    assert_eq!(err, Refused::NoFreeAddress { family: Family::V4 });

    // once the cooldown ended (expired or not), the address can be recorded again
    s.adopt(alloc(2), PodUid(2), &[ip("10.0.0.2")], T + CD)
        .expect("after the cooldown");
    assert!(!s.cooldowns().contains_key(&ip("10.0.0.2")));
}

proptest::proptest! {
    /// An ADD takes the lowest address of the node's (two runs of IPv4, one of IPv6) that
    /// is not held, cooling or excluded: what a lookup of every address in turn finds.
    #[test]
    fn an_add_takes_the_lowest_address_neither_held_cooling_nor_excluded(
        states in proptest::collection::vec(0u8..4, 22),
    ) {
        let addrs: Vec<IpAddr> = (0u8..6).chain(8..16)
            .map(|i| ip(&format!("10.0.0.{i}")))
            .chain((0u8..8).map(|i| ip(&format!("fd00::{i}"))))
            .collect();
        let strs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        let n = node_with(&strs.iter().map(String::as_str).collect::<Vec<_>>());
        let mut s = Side::new(CD);
        let mut exclude = AddrSet::new();
        for (i, (a, st)) in addrs.iter().zip(&states).enumerate() {
            let key = alloc(i as u64);
            match st {
                1 => { s.adopt(key, PodUid(i as u128), &[*a], T).unwrap(); }
                2 => {
                    s.adopt(key, PodUid(i as u128), &[*a], T).unwrap();
                    del(&mut s, i as u128, i as u64, T);
                }
                3 => { exclude.insert(*a); }
                _ => {}
            }
        }
        for family in BOTH {
            let want = addrs.iter().zip(&states)
                .find(|(a, st)| Family::of(a) == family && **st == 0)
                .map(|(a, _)| *a);
            proptest::prop_assert_eq!(s.free_address(&n, family, &exclude, T), want);
        }
    }
}

#[test]
fn an_add_of_a_key_held_by_another_pod_or_without_distinct_addresses_is_refused() {
    let n = node_with(&["10.0.0.1", "10.0.0.2"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &V4, 1, 1).expect("add");
    let err = s
        .add(&n, &V4, &none(), alloc(1), PodUid(2), T)
        .expect_err("other pod");
    assert_eq!(err, Refused::KeyHeldByOtherPod { owner: PodUid(1) });
    for bad in [&[][..], &[ip("10.0.0.3"), ip("10.0.0.3")][..]] {
        let err = s
            .adopt(alloc(3), PodUid(3), bad, T)
            .expect_err("bad addresses");
        assert_eq!(err, Refused::BadAddresses);
    }
}

#[test]
fn del_frees_into_cooldown_and_is_idempotent() {
    let n = node_with(&["10.0.0.1", "fd00::1"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &BOTH, 1, 1).expect("add");
    let now = T + Duration::from_secs(5);
    let out = s.del(&alloc(1), Some(PodUid(1)), now);
    assert_eq!(out, DelOutcome::Freed(vec![ip("10.0.0.1"), ip("fd00::1")]));
    assert_eq!(s.cooldowns().get(&ip("10.0.0.1")), Some(&(now + CD)));
    assert_eq!(s.cooldowns().get(&ip("fd00::1")), Some(&(now + CD)));
    assert!(s.holder(&ip("10.0.0.1")).is_none());
    // again, and for a key never seen: success, nothing freed
    assert_eq!(s.del(&alloc(1), Some(PodUid(1)), now), DelOutcome::Unknown);
    assert_eq!(s.del(&alloc(99), None, now), DelOutcome::Unknown);
}

/// Issue 27 (defect 9): a cooldown longer than any clock can add (the agent's flag took
/// `300000000000y`) panicked the DEL after the allocation had left `used` and before the
/// address entered cooldown. The longest cooldown is [`MAX_REUSE_COOLDOWN`]: a longer one is
/// cut to it, and the address cools down for it.
#[test]
fn a_del_with_the_longest_cooldown_frees_into_cooldown_without_panicking() {
    let now = T + Duration::from_secs(1_800_000_000);
    for cooldown in [Duration::MAX, MAX_REUSE_COOLDOWN] {
        let n = node_with(&["10.0.0.1"]);
        let mut s = Side::new(cooldown);
        add(&mut s, &n, &V4, 1, 1).expect("add");
        let out = s.del(&alloc(1), Some(PodUid(1)), now);
        assert_eq!(out, DelOutcome::Freed(vec![ip("10.0.0.1")]), "{cooldown:?}");
        assert_eq!(
            s.cooldowns().get(&ip("10.0.0.1")),
            Some(&(now + MAX_REUSE_COOLDOWN)),
            "{cooldown:?}"
        );
        assert!(
            add_at(&mut s, &n, &V4, 2, 2, now).is_none(),
            "reused at once"
        );
    }
}

/// cilium#10065: a DEL that names another pod than the recorded owner frees nothing.
#[test]
fn a_stale_del_frees_nothing() {
    let n = node_with(&["10.0.0.1"]);
    let mut s = Side::new(CD);
    let eth0 = AllocationId::new("c1", "eth0");
    s.add(&n, &V4, &none(), eth0, PodUid(1), T).expect("add");
    let out = s.del(&eth0, Some(PodUid(9)), T);
    assert_eq!(out, DelOutcome::Stale { owner: PodUid(1) });
    assert!(out.freed().is_empty());
    assert_eq!(s.holder(&ip("10.0.0.1")).map(|h| h.key), Some(eth0));
    assert!(s.cooldowns().is_empty());
    // another interface of the same sandbox is another key
    let net1 = AllocationId::new("c1", "net1");
    assert_eq!(s.del(&net1, Some(PodUid(1)), T), DelOutcome::Unknown);
    // a DEL without a UID (an old spool entry) is matched by its exact key
    assert_eq!(s.del(&eth0, None, T).freed(), &[ip("10.0.0.1")]);
}

/// A repeated ADD of one allocation returns what it holds; another ifname of the same
/// container is another allocation; a DEL frees only its own.
#[test]
fn allocations_are_keyed_by_container_and_ifname() {
    let n = node_with(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let mut s = Side::new(CD);
    let eth0 = AllocationId::new("c1", "eth0");
    let net1 = AllocationId::new("c1", "net1");
    assert_ne!(eth0, net1);
    assert_ne!(
        AllocationId::new("c1e", "th0"),
        eth0,
        "the separator keeps fields apart"
    );
    let mut add = |k| s.add(&n, &V4, &none(), k, PodUid(1), T).map(|a| a.addrs);
    let first = add(eth0).unwrap();
    assert_eq!(add(eth0).unwrap(), first, "repeated ADD");
    let second = add(net1).unwrap();
    assert_ne!(first, second);
    assert_eq!(s.used().count(), 2);
    assert_eq!(s.del(&net1, Some(PodUid(1)), T).freed(), &second[..]);
    assert_eq!(s.holder(&first[0]).map(|h| h.key), Some(eth0));
    // the same allocation of another pod UID is not this pod's
    assert!(s.del(&eth0, Some(PodUid(2)), T).freed().is_empty());
}

#[test]
fn allocation_ids_are_stable() {
    // FNV-1a 64 of "\0" and "a\0" (computed apart, in Python): the operator and the
    // agent, built apart, must compute the same value
    assert_eq!(AllocationId::new("", "").0, 0xaf63_bd4c_8601_b7df);
    assert_eq!(AllocationId::new("a", "").0, 0x089b_e207_b544_f1e4);
}

/// A cooldown is over at its end, for the node side's own ADDs too, but its end needs no
/// write of its own: it is dropped when the record is written for another change.
#[test]
fn an_ended_cooldown_is_over_at_once_and_dropped_with_the_next_write() {
    let n = node_with(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let mut s = Side::new(CD);
    let secs = Duration::from_secs;
    add(&mut s, &n, &V4, 1, 1).expect("add");
    add(&mut s, &n, &V4, 2, 2).expect("add");
    del(&mut s, 1, 1, T);
    del(&mut s, 2, 2, T + secs(10));
    assert!(!s.tidy(T + CD - Duration::from_millis(1)), "none ended");
    s.mark_clean();
    // 10.0.0.1's ends: nothing to write for it
    assert!(!s.tidy(T + CD));
    assert!(!s.is_dirty());
    assert_eq!(s.cooldowns().len(), 2, "still published as it was");
    assert_eq!(s.next_cooldown_end(T + CD), Some(T + secs(10) + CD));
    assert_eq!(s.next_cooldown_end(T + secs(10) + CD), None);
    // ... and it is over: an ADD takes it (10.0.0.2 still cools down)
    assert_eq!(
        add_at(&mut s, &n, &V4, 3, 3, T + CD),
        Some(vec![ip("10.0.0.1")])
    );
    assert!(s.is_dirty());
    assert_eq!(
        s.cooldowns().keys().collect::<Vec<_>>(),
        vec![&ip("10.0.0.2")],
        "the address taken cools down no more"
    );
    s.mark_clean();
    // 10.0.0.2's ends unwritten, then a DEL: the write carries both
    let later = T + secs(10) + CD + secs(5);
    assert!(!s.tidy(later) && s.cooldowns().len() == 1);
    del(&mut s, 3, 3, later);
    assert!(s.tidy(later));
    assert_eq!(s.cooldowns().as_slice(), [(ip("10.0.0.1"), later + CD)]);
}

#[test]
fn cooldowns_outside_the_pool_are_forgotten() {
    let n = node_with(&["10.0.0.1", "10.0.0.2"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &V4, 1, 1).expect("add");
    add(&mut s, &n, &V4, 2, 2).expect("add");
    del(&mut s, 1, 1, T);
    del(&mut s, 2, 2, T);
    s.mark_clean();
    assert!(!s.forget_outside(&n.operator.addresses));
    assert!(
        s.forget_outside(&set(&["10.0.0.1"])),
        "10.0.0.2 left the pool"
    );
    assert!(s.is_dirty(), "a change of its own");
    assert_eq!(
        s.cooldowns().keys().collect::<Vec<_>>(),
        vec![&ip("10.0.0.1")]
    );
}

/// A reboot killed every earlier pod: their allocations cool down at once.
#[test]
fn allocations_of_another_boot_go_to_cooldown() {
    let n = node_with(&["10.0.0.1", "10.0.0.2", "fd00::1"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &BOTH, 1, 1).expect("add");
    add(&mut s, &n, &V4, 2, 2).expect("add");
    let now = T + Duration::from_secs(60);
    s.mark_clean();
    let dead = s.expire_boot(|k| *k == alloc(1), now);
    assert_eq!(
        dead,
        vec![(alloc(1), PodUid(1), vec![ip("10.0.0.1"), ip("fd00::1")])]
    );
    assert!(s.is_dirty());
    assert!(s.allocation(&alloc(1)).is_none());
    assert!(s.allocation(&alloc(2)).is_some());
    assert_eq!(s.cooldowns().get(&ip("10.0.0.1")), Some(&(now + CD)));
    assert_eq!(s.cooldowns().get(&ip("fd00::1")), Some(&(now + CD)));
    assert!(s.expire_boot(|k| *k == alloc(1), now).is_empty());
}

/// Issue 27, defect 8: a CNI GC names the valid attachments of one network, so it frees
/// only that network's allocations it does not list: another network's and those whose
/// network is unknown (recorded before allocations kept it) stay; DEL still frees them.
#[test]
fn gc_frees_only_its_own_networks_unlisted_allocations() {
    let n = node_with(&["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]);
    let mut s = Side::new(CD);
    let on = |pod: u128, net: &str| Owner {
        pod: PodUid(pod),
        network: Some(Arc::from(net)),
    };
    s.add(&n, &V4, &none(), alloc(1), on(1, "a"), T)
        .expect("a1");
    s.add(&n, &V4, &none(), alloc(2), on(2, "a"), T)
        .expect("a2");
    s.add(&n, &V4, &none(), alloc(3), on(3, "b"), T).expect("b");
    s.add(&n, &V4, &none(), alloc(4), PodUid(4), T)
        .expect("unknown");
    let now = T + Duration::from_secs(60);
    let freed = s.gc("a", |k| *k == alloc(1), now);
    assert_eq!(freed, vec![(alloc(2), PodUid(2), vec![ip("10.0.0.2")])]);
    assert_eq!(s.cooldowns().get(&ip("10.0.0.2")), Some(&(now + CD)));
    assert!(
        s.gc("a", |_| false, now)
            .iter()
            .all(|(k, ..)| *k == alloc(1))
    );
    assert!(s.gc("c", |_| false, now).is_empty(), "no allocation of c");
    let held: Vec<_> = s.allocations().map(|(h, _)| h.key).collect();
    assert_eq!(held, {
        let mut v = vec![alloc(3), alloc(4)];
        v.sort();
        v
    });
    let rec = s.record();
    let nets: Vec<_> = rec.allocations.iter().map(|a| a.network.clone()).collect();
    assert!(nets.contains(&Some(Arc::from("b"))) && nets.contains(&None));
    assert_eq!(
        NodeSide::from_record(rec, CD).expect("restored").record(),
        s.record()
    );
    assert_eq!(s.del(&alloc(4), None, now).freed(), [ip("10.0.0.4")]);
}

#[test]
fn release_marks_are_answered_and_honoured() {
    let mut n = node_with(&["10.0.0.1", "10.0.0.2"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &V4, 1, 1).unwrap();
    for a in ["10.0.0.1", "10.0.0.2"] {
        n.operator
            .release
            .insert(ip(a), ReleaseState::MarkedForRelease);
    }
    let a = answer_all(&mut s, &n, T, gone);
    assert_eq!(a.ready, set(&["10.0.0.2"]));
    assert_eq!(
        s.release_acks().get(&ip("10.0.0.1")),
        Some(&ReleaseAck::DoNotRelease)
    );
    // never used again while marked
    assert!(add(&mut s, &n, &V4, 2, 2).is_none());
    // a mark on an address whose cooldown ends now: ready (the cooldown counts for
    // nothing from its end, whether or not it was expired yet)
    n.operator
        .release
        .insert(ip("10.0.0.3"), ReleaseState::MarkedForRelease);
    Arc::make_mut(&mut n.operator.addresses).insert(ip("10.0.0.3"));
    s.adopt(alloc(9), PodUid(9), &[ip("10.0.0.3")], T).unwrap();
    s.del(&alloc(9), None, T - CD);
    assert_eq!(s.cooldowns().get(&ip("10.0.0.3")), Some(&T));
    let mut out = Answers::default();
    s.answer_marks(&n, &none(), T, &mut out);
    assert_eq!(out.ready, set(&["10.0.0.3"]));
    // an address in `busy` (a live pod's, not held) is do-not-release
    let mut fresh = Side::new(CD);
    let mut out = Answers::default();
    fresh.answer_marks(&n, &set(&["10.0.0.2"]), T, &mut out);
    assert_eq!(out.ready, set(&["10.0.0.1", "10.0.0.3"]));
    assert_eq!(
        fresh.release_acks().get(&ip("10.0.0.2")),
        Some(&ReleaseAck::DoNotRelease)
    );
    n.operator.release.remove(&ip("10.0.0.3"));
    Arc::make_mut(&mut n.operator.addresses).remove(&ip("10.0.0.3"));
    answer_all(&mut s, &n, T, gone);
    assert!(!s.cooldowns().contains_key(&ip("10.0.0.3")));
    // withdrawn: usable again, and the answer goes
    n.operator.release.remove(&ip("10.0.0.2"));
    let a = answer_all(&mut s, &n, T, gone);
    assert_eq!(a.resumed, set(&["10.0.0.2"]));
    assert!(!s.release_acks().contains_key(&ip("10.0.0.2")));
    assert!(add(&mut s, &n, &V4, 2, 2).is_some());
    // released: the answer goes, the address is no longer in the pool
    n.operator
        .release
        .insert(ip("10.0.0.1"), ReleaseState::Released);
    Arc::make_mut(&mut n.operator.addresses).remove(&ip("10.0.0.1"));
    answer_all(&mut s, &n, T, gone);
    assert!(s.release_acks().is_empty());
}

/// A marked block is answered do-not-release while an address of it is used or cooling
/// down, and ready-for-release from the moment the last cooldown ends, even before
/// `tidy` dropped it (the world answers blocks before it writes the node).
#[test]
fn a_block_is_ready_once_its_cooldowns_end() {
    let block = |ack| BlockView {
        name: "b".into(),
        addrs: set(&["10.0.0.1", "10.0.0.2"]),
        all: AddrSet::of_net(&"10.0.0.0/30".parse().unwrap()),
        release: true,
        ack,
    };
    let n = node_with(&["10.0.0.2"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &V4, 1, 1).unwrap();
    del(&mut s, 1, 1, T);
    let mut out = Answers::default();
    let w = s.answer_blocks(&[block(None)], &none(), T + CD / 2, &mut out);
    assert_eq!(w, vec![("b".into(), Some(ReleaseAck::DoNotRelease))]);
    assert!(out.ready.is_empty());
    let dnr = Some(ReleaseAck::DoNotRelease);
    let w = s.answer_blocks(&[block(dnr)], &none(), T + CD, &mut out);
    assert_eq!(w, vec![("b".into(), Some(ReleaseAck::ReadyForRelease))]);
    assert_eq!(out.ready, block(None).all);
    // a used address keeps it whatever the time, and so does a live pod's
    let mut out = Answers::default();
    let busy = set(&["10.0.0.1"]);
    assert!(
        s.answer_blocks(&[block(dnr)], &busy, T + CD * 9, &mut out)
            .is_empty()
    );
    s.adopt(alloc(2), PodUid(2), &[ip("10.0.0.1")], T + CD)
        .unwrap();
    assert!(
        s.answer_blocks(&[block(dnr)], &none(), T + CD * 9, &mut out)
            .is_empty()
    );
    assert!(out.ready.is_empty());
}

/// Block answers are recorded, say whether they changed, and go with their mark or block.
#[test]
fn block_answers_are_recorded_and_go_with_their_block() {
    let b = |release, ack| BlockView {
        name: "b1".into(),
        addrs: set(&["10.0.0.1"]),
        all: set(&["10.0.0.1"]),
        release,
        ack,
    };
    let mut s = Side::new(CD);
    let mut out = Answers::default();
    s.answer_blocks(&[b(true, None)], &set(&["10.0.0.1"]), T, &mut out);
    assert_eq!(s.block_acks().get("b1"), Some(&ReleaseAck::DoNotRelease));
    assert!(s.is_dirty());
    s.mark_clean();
    // the same answer again: nothing changed
    s.answer_blocks(&[b(true, None)], &set(&["10.0.0.1"]), T, &mut out);
    assert!(!s.is_dirty());
    s.answer_blocks(&[b(true, None)], &none(), T, &mut out);
    assert_eq!(s.block_acks().get("b1"), Some(&ReleaseAck::ReadyForRelease));
    assert!(s.is_dirty());
    // withdrawn: the answer goes
    s.answer_blocks(
        &[b(false, Some(ReleaseAck::ReadyForRelease))],
        &none(),
        T,
        &mut out,
    );
    assert!(s.block_acks().is_empty());
    assert_eq!(out.resumed, set(&["10.0.0.1"]));
    // a block that went takes its answer with it
    s.answer_blocks(&[b(true, None)], &none(), T, &mut out);
    s.mark_clean();
    s.answer_blocks(&[], &none(), T, &mut out);
    assert!(s.block_acks().is_empty() && s.is_dirty());
}

/// `dirty` says exactly whether the published fields changed (the world writes only then,
/// so a missed change would be lost and a false one would bump the version).
#[test]
fn dirty_says_whether_anything_changed() {
    let mut n = node_with(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let mut s = Side::new(CD);
    let names = |_: &AllocationId| PodName::new("ns", "p");
    let check = |n: &IpamNode, s: &mut Side, now| {
        let before = s.published(names);
        s.mark_clean();
        answer_all(s, n, now, gone);
        let after = s.published(names);
        assert_eq!(s.is_dirty(), before != after, "{before:?} -> {after:?}");
    };
    check(&n, &mut s, T);
    add(&mut s, &n, &V4, 1, 1).unwrap();
    add(&mut s, &n, &V4, 2, 2).unwrap();
    check(&n, &mut s, T);
    // a tombstone: reclaimed, then acked again (nothing), then its ack goes
    n.operator.reclaim.insert(ip("10.0.0.1"), tomb(1, 1));
    check(&n, &mut s, T);
    check(&n, &mut s, T);
    // an ack for another pod replaced in place (same count)
    n.operator.reclaim.insert(ip("10.0.0.1"), tomb(5, 1));
    check(&n, &mut s, T);
    n.operator.reclaim.clear();
    check(&n, &mut s, T);
    // marks: answered, answered already, withdrawn
    n.operator
        .release
        .insert(ip("10.0.0.3"), ReleaseState::MarkedForRelease);
    check(&n, &mut s, T);
    check(&n, &mut s, T);
    n.operator.release = Default::default();
    check(&n, &mut s, T);
    // cooldowns: still running, then over
    check(&n, &mut s, T + CD / 2);
    check(&n, &mut s, T + CD);
    check(&n, &mut s, T + CD);
    let before = s.clone();
    assert!(!s.tidy(T + CD));
    assert_eq!(before, s);
}

#[test]
fn tombstones_are_reclaimed_or_stale() {
    let mut n = node_with(&["10.0.0.1", "10.0.0.2"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &V4, 1, 1).unwrap();
    add(&mut s, &n, &V4, 2, 2).unwrap();
    n.operator.reclaim.insert(ip("10.0.0.1"), tomb(1, 1));
    // the entry of 10.0.0.2 changed owner: its tombstone names pod 9
    n.operator.reclaim.insert(ip("10.0.0.2"), tomb(9, 1));
    let a = answer_all(&mut s, &n, T, gone);
    assert_eq!(a.reclaimed, vec![(PodUid(1), ip("10.0.0.1"))]);
    assert_eq!(outcome(&s, "10.0.0.1"), ReclaimOutcome::Reclaimed);
    assert_eq!(outcome(&s, "10.0.0.2"), ReclaimOutcome::Stale);
    assert_eq!(
        s.holder(&ip("10.0.0.2")).map(|h| h.pod_uid),
        Some(PodUid(2)),
        "nothing lost"
    );
    assert!(s.cooldowns().contains_key(&ip("10.0.0.1")));
    // answering the same tombstones again changes nothing
    s.mark_clean();
    answer_all(&mut s, &n, T, gone);
    assert!(!s.is_dirty());
    // once the tombstones go, their answers need no write of their own ...
    n.operator.reclaim.clear();
    answer_all(&mut s, &n, T, gone);
    assert!(!s.is_dirty());
    assert_eq!(s.reclaim_acks().len(), 2);
    // ... and go with the next one
    del(&mut s, 2, 2, T);
    assert!(s.tidy(T));
    assert!(s.reclaim_acks().is_empty());
}

/// A `live` answer goes as soon as its tombstone does: the operator waits for that before
/// it tombstones the allocation again. A settled answer whose tombstone comes back is
/// answered again, from the record as it is now.
#[test]
fn a_live_answer_goes_at_once_and_a_returning_tombstone_is_answered_again() {
    let mut n = node_with(&["10.0.0.1", "10.0.0.2"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &V4, 1, 1).unwrap();
    add(&mut s, &n, &V4, 2, 2).unwrap();
    n.operator.reclaim.insert(ip("10.0.0.1"), tomb(1, 1));
    n.operator.reclaim.insert(ip("10.0.0.2"), tomb(2, 2));
    let live_1 = |uid: PodUid| uid == PodUid(1);
    answer_all(&mut s, &n, T, live_1);
    assert_eq!(outcome(&s, "10.0.0.1"), ReclaimOutcome::Live);
    assert_eq!(outcome(&s, "10.0.0.2"), ReclaimOutcome::Reclaimed);
    s.mark_clean();
    n.operator.reclaim.clear();
    answer_all(&mut s, &n, T, live_1);
    assert!(s.is_dirty(), "the live answer's going is a change");
    assert!(s.reclaim_acks().is_empty(), "the settled one rides along");
    // a settled answer, and its tombstone back (a lagging view of the operator's)
    n.operator.reclaim.insert(ip("10.0.0.2"), tomb(2, 2));
    answer_all(&mut s, &n, T, live_1);
    s.mark_clean();
    n.operator.reclaim.clear();
    answer_all(&mut s, &n, T, live_1);
    assert!(!s.is_dirty() && s.reclaim_acks().len() == 1);
    n.operator.reclaim.insert(ip("10.0.0.2"), tomb(2, 2));
    answer_all(&mut s, &n, T, live_1);
    assert!(s.is_dirty(), "answered again");
    assert_eq!(
        outcome(&s, "10.0.0.2"),
        ReclaimOutcome::Stale,
        "nothing held now"
    );
    assert_eq!(
        s.holder(&ip("10.0.0.1")).map(|h| h.pod_uid),
        Some(PodUid(1))
    );
}

/// The exact allocation loses one address to a tombstone; its other family's stays until
/// its own tombstone, and the last address takes the allocation.
#[test]
fn a_reclaim_frees_only_the_exact_allocation() {
    let n = node_with(&["10.0.0.1", "10.0.0.2", "fd00::1"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &BOTH, 1, 1).unwrap();
    add(&mut s, &n, &V4, 2, 2).unwrap();
    let mut reclaim = BTreeMap::new();
    // a tombstone for an earlier sandbox of pod 2 that held 10.0.0.2: stale
    reclaim.insert(ip("10.0.0.2"), tomb(2, 0));
    reclaim.insert(ip("10.0.0.1"), tomb(1, 1));
    let got = s.answer_tombstones(&reclaim, Some, gone, T);
    assert_eq!(got, vec![(PodUid(1), ip("10.0.0.1"))]);
    assert_eq!(outcome(&s, "10.0.0.2"), ReclaimOutcome::Stale);
    assert!(s.holder(&ip("10.0.0.2")).is_some());
    assert_eq!(s.addrs_of(&alloc(1)), vec![ip("fd00::1")]);
    assert_eq!(s.cooldowns().get(&ip("10.0.0.1")), Some(&(T + CD)));
    reclaim.insert(ip("fd00::1"), tomb(1, 1));
    s.answer_tombstones(&reclaim, Some, gone, T);
    assert_eq!(outcome(&s, "fd00::1"), ReclaimOutcome::Reclaimed);
    assert!(
        s.allocation(&alloc(1)).is_none(),
        "the last address takes the allocation"
    );
    assert_eq!(s.reclaim_acks().len(), 3);
    // a tombstone whose key is not known yet waits
    reclaim.insert(ip("10.0.0.2"), tomb(2, 2));
    s.answer_tombstones(&reclaim, |_| None, gone, T);
    assert_eq!(
        s.reclaim_acks()[&ip("10.0.0.2")].key,
        alloc(0),
        "kept for a write"
    );
    s.tidy(T);
    assert!(
        !s.reclaim_acks().contains_key(&ip("10.0.0.2")),
        "the old answer went with it"
    );
    assert!(s.holder(&ip("10.0.0.2")).is_some());
}

/// Issue 25: a tombstone on the running sandbox of a pod the node side sees live (the
/// operator's pod watch lagged) is answered `live` and frees nothing; once the pod has
/// a newer sandbox, or is terminal or gone, the same tombstone is reclaimed.
#[test]
fn a_live_pods_newest_allocation_is_answered_live() {
    let mut n = node_with(&["10.0.0.1", "10.0.0.2", "fd00::1"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &BOTH, 1, 1).unwrap();
    n.operator.reclaim.insert(ip("10.0.0.1"), tomb(1, 1));
    let live_1 = |uid: PodUid| uid == PodUid(1);
    let a = answer_all(&mut s, &n, T, live_1);
    assert!(a.reclaimed.is_empty() && s.is_dirty());
    assert_eq!(outcome(&s, "10.0.0.1"), ReclaimOutcome::Live);
    assert_eq!(
        s.holder(&ip("10.0.0.1")).map(|h| h.key),
        Some(alloc(1)),
        "kept"
    );
    assert!(s.cooldowns().is_empty());
    let x = ip("10.0.0.1");
    // a newer sandbox of the pod in the same family: the old one is reclaimed
    let mut newer = s.clone();
    newer
        .adopt(alloc(2), PodUid(1), &[ip("10.0.0.2")], T + CD)
        .unwrap();
    let got = newer.tombstone_outcome(&x, PodUid(1), &alloc(1), live_1);
    assert_eq!(got, ReclaimOutcome::Reclaimed);
    // a newer allocation in the other family only: still live
    let mut s2 = Side::new(CD);
    s2.adopt(alloc(1), PodUid(1), &[x], T).unwrap();
    s2.adopt(alloc(3), PodUid(1), &[ip("fd00::1")], T + CD)
        .unwrap();
    let got = s2.tombstone_outcome(&x, PodUid(1), &alloc(1), live_1);
    assert_eq!(got, ReclaimOutcome::Live);
    // the pod not seen live (gone or terminal): reclaimed
    let got = s2.tombstone_outcome(&x, PodUid(1), &alloc(1), gone);
    assert_eq!(got, ReclaimOutcome::Reclaimed);
    // and the answers for several tombstones at once: live, stale (an earlier sandbox),
    // stale (nothing held), reclaimed (its pod gone)
    let mut s = Side::new(CD);
    for (uid, a) in [(1, "10.0.0.1"), (2, "10.0.0.2"), (4, "10.0.0.4")] {
        s.adopt(alloc(uid), PodUid(uid.into()), &[ip(a)], T)
            .unwrap();
    }
    let reclaim: BTreeMap<_, _> = [
        (ip("10.0.0.1"), tomb(1, 1)),
        (ip("10.0.0.2"), tomb(2, 99)),
        (ip("10.0.0.3"), tomb(3, 3)),
        (ip("10.0.0.4"), tomb(4, 4)),
    ]
    .into();
    s.answer_tombstones(&reclaim, Some, live_1, T);
    let outcomes: Vec<_> = reclaim
        .keys()
        .map(|a| s.reclaim_acks()[a].outcome)
        .collect();
    assert_eq!(
        outcomes,
        [
            ReclaimOutcome::Live,
            ReclaimOutcome::Stale,
            ReclaimOutcome::Stale,
            ReclaimOutcome::Reclaimed
        ]
    );
}

/// Issue 10's crash loop: a pod's first sandbox is tombstoned (it was replaced), its
/// late DEL frees the address, and a later sandbox of the same pod gets the same address
/// back; the tombstone, still meant for the first sandbox, must then be answered
/// `stale` and free nothing. With tombstones that named only the pod UID, the live
/// sandbox's address was freed.
#[test]
fn a_late_tombstone_never_frees_a_later_sandbox_of_the_same_pod() {
    let mut n = node_with(&["10.0.0.1"]);
    let mut s = Side::new(CD);
    assert_eq!(add(&mut s, &n, &V4, 1, 1).unwrap(), vec![ip("10.0.0.1")]);
    // the operator tombstones sandbox 1's entry, but sandbox 1's DEL arrives first, and
    // after the cooldown sandbox 3 gets the same address back
    assert_eq!(del(&mut s, 1, 1, T).len(), 1);
    answer_all(&mut s, &n, T + CD, gone);
    assert_eq!(add(&mut s, &n, &V4, 1, 3).unwrap(), vec![ip("10.0.0.1")]);
    n.operator.reclaim.insert(ip("10.0.0.1"), tomb(1, 1));
    let a = answer_all(&mut s, &n, T + CD, gone);
    assert!(a.reclaimed.is_empty(), "{a:?}");
    assert_eq!(outcome(&s, "10.0.0.1"), ReclaimOutcome::Stale);
    assert_eq!(
        s.holder(&ip("10.0.0.1")).map(|h| h.key),
        Some(alloc(3)),
        "the live sandbox keeps it"
    );
}

/// The published fields carry the record and come back to it (the simulator's path).
#[test]
fn the_record_is_published_and_read_back() {
    let mut n = node_with(&["10.0.0.1", "10.0.0.2", "fd00::1"]);
    let mut s = Side::new(CD);
    add(&mut s, &n, &BOTH, 1, 1).unwrap();
    add(&mut s, &n, &V4, 2, 2).unwrap();
    n.operator.reclaim.insert(ip("10.0.0.2"), tomb(2, 2));
    n.operator
        .release
        .insert(ip("fd00::1"), ReleaseState::MarkedForRelease);
    answer_all(&mut s, &n, T, gone);
    let names = |_: &AllocationId| PodName::new("ns", "p");
    let published = s.published(names);
    assert_eq!(published.used[&ip("10.0.0.1")].allocation, alloc(1));
    assert_eq!(published.used[&ip("10.0.0.1")].pod.name(), "p");
    assert!(published.cooldown.contains_key(&ip("10.0.0.2")));
    let mut back = Side::from_published(&published, CD);
    assert!(!back.is_dirty());
    s.mark_clean();
    assert_eq!(back, s);
    assert_eq!(
        back.addrs_of(&alloc(1)),
        vec![ip("10.0.0.1"), ip("fd00::1")]
    );
    back.del(&alloc(1), None, T);
    assert_eq!(back.published(names).used.len(), 0);
    // taken out of the fields and given back: unchanged, or rewritten with the change
    let mut fields = published.clone();
    let taken = Side::take_published(&mut fields, CD);
    assert_eq!(taken, s);
    taken.return_published(names, &mut fields);
    assert_eq!(fields, published);
    let mut taken = Side::take_published(&mut fields, CD);
    taken.del(&alloc(1), None, T);
    let want = taken.published(names);
    taken.return_published(names, &mut fields);
    assert_eq!(fields, want);
    assert!(fields.used.is_empty() && fields.cooldown.contains_key(&ip("fd00::1")));
}

#[path = "props.rs"]
mod props;
