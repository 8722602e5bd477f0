use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tidepool_ipam::node::{answer_tombstones, free_address};
use tidepool_ipam::{
    AddrMap, AddrSet, Family, IpamNode, NodeUid, PodUid, ReclaimOutcome, ReclaimReason, ReleaseAck,
    Tombstone,
};

use super::*;
use crate::state::RecordingFs;

const CD: Duration = Duration::from_secs(30);
const BOOT: &str = "boot-1";

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn key(c: &str) -> AllocKey {
    AllocKey::new(c, "eth0")
}

fn pod(n: u128) -> PodRef {
    PodRef {
        uid: PodUid(n),
        namespace: "default".into(),
        name: format!("web-{n}"),
    }
}

fn add(s: &mut NodeState, c: &str, p: u128, a: &[&str]) -> Result<Added> {
    let addrs: Vec<IpAddr> = a.iter().map(|a| ip(a)).collect();
    s.add(key(c), pod(p), &addrs, None, t0())
}

#[test]
fn a_repeated_add_returns_the_same_addresses_and_changes_nothing() {
    let mut s = NodeState::new(BOOT, CD);
    let first = add(&mut s, "c1", 1, &["10.0.0.1", "fd00::1"]).expect("add");
    assert_eq!((first.addrs.len(), first.repeated), (2, false));
    s.dirty = false;
    // the runtime retries after a lost reply; the caller offers other addresses
    let again = add(&mut s, "c1", 1, &["10.0.0.9"]).expect("repeated add");
    assert_eq!(again.addrs, first.addrs);
    assert!(again.repeated);
    assert!(!s.is_dirty(), "a repeated ADD changes nothing");
    assert!(s.owner(&ip("10.0.0.9")).is_none());
    let a = s.get(&key("c1")).expect("recorded");
    assert_eq!((a.since, a.boot_id.as_str()), (t0(), BOOT));
}

#[test]
fn an_add_never_takes_a_held_or_cooling_address() {
    let mut s = NodeState::new(BOOT, CD);
    add(&mut s, "c1", 1, &["10.0.0.1"]).expect("add");
    let err = add(&mut s, "c2", 2, &["10.0.0.1"]).expect_err("held");
    assert!(matches!(err, StateError::AddressInUse { .. }), "{err:?}");

    assert_eq!(s.del(&key("c1"), Some(PodUid(1)), t0()).freed().len(), 1);
    let err = add(&mut s, "c2", 2, &["10.0.0.1"]).expect_err("cooling");
    assert!(matches!(err, StateError::AddressCooling { .. }), "{err:?}");
    // all or nothing: a refused dual-stack ADD takes neither address
    let err = add(&mut s, "c2", 2, &["10.0.0.2", "10.0.0.1"]).expect_err("cooling");
    assert!(matches!(err, StateError::AddressCooling { .. }), "{err:?}");
    assert!(s.owner(&ip("10.0.0.2")).is_none());

    // once the cooldown ended (expired or not), the address is free again
    let later = t0() + CD;
    s.add(key("c2"), pod(2), &[ip("10.0.0.1")], None, later)
        .expect("after the cooldown");
    assert!(!s.cooldowns().contains_key(&ip("10.0.0.1")));
}

#[test]
fn an_add_of_a_key_held_by_another_pod_or_without_distinct_addresses_is_refused() {
    let mut s = NodeState::new(BOOT, CD);
    add(&mut s, "c1", 1, &["10.0.0.1"]).expect("add");
    let err = add(&mut s, "c1", 2, &["10.0.0.2"]).expect_err("other pod");
    assert!(
        matches!(err, StateError::KeyHeldByOtherPod { .. }),
        "{err:?}"
    );
    for bad in [&[][..], &["10.0.0.3", "10.0.0.3"][..]] {
        let err = add(&mut s, "c3", 3, bad).expect_err("bad addresses");
        assert!(matches!(err, StateError::BadAddresses), "{err:?}");
    }
}

#[test]
fn del_frees_into_cooldown_and_is_idempotent() {
    let mut s = NodeState::new(BOOT, CD);
    add(&mut s, "c1", 1, &["10.0.0.1", "fd00::1"]).expect("add");
    let now = t0() + Duration::from_secs(5);
    let out = s.del(&key("c1"), Some(PodUid(1)), now);
    assert_eq!(out, DelOutcome::Freed(vec![ip("10.0.0.1"), ip("fd00::1")]));
    assert_eq!(s.cooldowns().get(&ip("10.0.0.1")), Some(&(now + CD)));
    assert_eq!(s.cooldowns().get(&ip("fd00::1")), Some(&(now + CD)));
    assert!(s.owner(&ip("10.0.0.1")).is_none());
    // again, and for a key never seen: success, nothing freed
    assert_eq!(s.del(&key("c1"), Some(PodUid(1)), now), DelOutcome::Unknown);
    assert_eq!(s.del(&key("never"), None, now), DelOutcome::Unknown);
}

/// cilium#10065: a DEL that names another pod than the recorded owner frees nothing.
#[test]
fn a_stale_del_frees_nothing() {
    let mut s = NodeState::new(BOOT, CD);
    add(&mut s, "c1", 1, &["10.0.0.1"]).expect("add");
    let out = s.del(&key("c1"), Some(PodUid(9)), t0());
    assert_eq!(out, DelOutcome::Stale { owner: PodUid(1) });
    assert!(out.freed().is_empty());
    assert_eq!(s.owner(&ip("10.0.0.1")).map(|(k, _)| k), Some(&key("c1")));
    assert!(s.cooldowns().is_empty());
    // another interface of the same sandbox is another key
    assert_eq!(
        s.del(&AllocKey::new("c1", "net1"), Some(PodUid(1)), t0()),
        DelOutcome::Unknown
    );
    // a DEL without a UID (an old spool entry) is matched by its exact key
    assert_eq!(s.del(&key("c1"), None, t0()).freed(), &[ip("10.0.0.1")]);
}

#[test]
fn a_reclaim_frees_only_the_exact_allocation_and_its_answer_is_kept() {
    let mut s = NodeState::new(BOOT, CD);
    add(&mut s, "c1", 1, &["10.0.0.1", "fd00::1"]).expect("add");
    add(&mut s, "c2", 2, &["10.0.0.2"]).expect("add");

    // a tombstone for an earlier sandbox of pod 2 that held 10.0.0.2: stale
    let out = s.ack_reclaim(ip("10.0.0.2"), PodUid(2), &key("c0"), |_| false, t0());
    assert_eq!(out, ReclaimOutcome::Stale);
    assert!(s.owner(&ip("10.0.0.2")).is_some());

    // the exact allocation: the address goes, the other family's stays until its own
    let out = s.ack_reclaim(ip("10.0.0.1"), PodUid(1), &key("c1"), |_| false, t0());
    assert_eq!(out, ReclaimOutcome::Reclaimed);
    assert_eq!(
        s.get(&key("c1")).map(|a| a.addrs.clone()),
        Some(vec![ip("fd00::1")])
    );
    assert_eq!(s.cooldowns().get(&ip("10.0.0.1")), Some(&(t0() + CD)));

    // answering the same tombstone again changes nothing
    s.dirty = false;
    let again = s.ack_reclaim(ip("10.0.0.1"), PodUid(1), &key("c1"), |_| false, t0());
    assert_eq!(again, ReclaimOutcome::Reclaimed);
    assert!(!s.is_dirty());

    let out = s.ack_reclaim(ip("fd00::1"), PodUid(1), &key("c1"), |_| false, t0());
    assert_eq!(out, ReclaimOutcome::Reclaimed);
    assert!(
        s.get(&key("c1")).is_none(),
        "the last address takes the allocation"
    );
    assert_eq!(s.reclaim_acks().len(), 3);

    // the answer goes once the operator dropped its tombstone
    assert!(s.forget_reclaim_ack(&ip("10.0.0.1")));
    assert!(!s.forget_reclaim_ack(&ip("10.0.0.1")));
}

/// `ack_reclaim` on the full key gives the answers `ipam`'s rule gives on the hash.
#[test]
fn reclaim_answers_agree_with_ipams_rule() {
    let mut s = NodeState::new(BOOT, CD);
    add(&mut s, "c1", 1, &["10.0.0.1"]).expect("add");
    add(&mut s, "c2", 2, &["10.0.0.2"]).expect("add");
    add(&mut s, "c4", 4, &["10.0.0.4"]).expect("add");
    let tombs = [
        (ip("10.0.0.1"), PodUid(1), key("c1")),
        (ip("10.0.0.2"), PodUid(2), key("c-old")),
        (ip("10.0.0.3"), PodUid(3), key("c3")),
        (ip("10.0.0.4"), PodUid(4), key("c4")),
    ];
    // pod 1 runs on the node (live), pod 4 is gone (reclaimed)
    let live = |u: PodUid| u == PodUid(1);
    let mut node = IpamNode::new(Arc::from("n1"), NodeUid(7));
    for (a, uid, k) in &tombs {
        let t = Tombstone {
            pod_uid: *uid,
            allocation: k.id(),
            reason: ReclaimReason::PodDeleted,
        };
        node.operator.reclaim.insert(*a, t);
    }
    let mut side = s.node_side();
    answer_tombstones(&node, &mut side, t0(), CD, &live);
    for (a, uid, k) in &tombs {
        s.ack_reclaim(*a, *uid, k, live, t0());
    }
    assert_eq!(s.node_side(), side);
    let outcomes: Vec<_> = tombs
        .iter()
        .map(|t| s.reclaim_acks()[&t.0].outcome)
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

#[test]
fn release_and_block_acks_say_whether_they_changed() {
    let mut s = NodeState::new(BOOT, CD);
    let mut acks = AddrMap::new();
    acks.insert(ip("10.0.0.5"), ReleaseAck::ReadyForRelease);
    assert!(s.ack_release(acks.clone()));
    s.dirty = false;
    assert!(!s.ack_release(acks));
    assert!(!s.is_dirty());

    assert!(s.ack_block("b1", Some(ReleaseAck::DoNotRelease)));
    assert!(!s.ack_block("b1", Some(ReleaseAck::DoNotRelease)));
    assert!(s.ack_block("b1", Some(ReleaseAck::ReadyForRelease)));
    assert!(s.ack_block("b1", None));
    assert!(!s.ack_block("b1", None));
    assert!(s.block_release_acks().is_empty());
}

#[test]
fn cooldowns_expire_at_their_end() {
    let mut s = NodeState::new(BOOT, CD);
    add(&mut s, "c1", 1, &["10.0.0.1"]).expect("add");
    add(&mut s, "c2", 2, &["10.0.0.2"]).expect("add");
    s.del(&key("c1"), None, t0());
    s.del(&key("c2"), None, t0() + Duration::from_secs(10));
    assert!(!s.expire_cooldowns(t0() + CD - Duration::from_millis(1)));
    assert!(s.expire_cooldowns(t0() + CD));
    assert_eq!(
        s.cooldowns().keys().collect::<Vec<_>>(),
        vec![&ip("10.0.0.2")]
    );
}

/// A reboot killed every earlier pod: their allocations cool down at once.
#[test]
fn allocations_of_another_boot_go_to_cooldown() {
    let mut old = NodeState::new("boot-0", CD);
    add(&mut old, "c1", 1, &["10.0.0.1"]).expect("add");
    let mut s = NodeState {
        boot_id: BOOT.into(),
        ..old
    };
    add(&mut s, "c2", 2, &["10.0.0.2"]).expect("add");
    let now = t0() + Duration::from_secs(60);
    let dead = s.expire_boot(now);
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (&dead[0].0, dead[0].1.boot_id.as_str()),
        (&key("c1"), "boot-0")
    );
    assert!(s.get(&key("c1")).is_none());
    assert!(s.get(&key("c2")).is_some());
    assert_eq!(s.cooldowns().get(&ip("10.0.0.1")), Some(&(now + CD)));
    assert!(s.expire_boot(now).is_empty());
}

/// `node_side` is what `ipam`'s node rules read: a free address is neither held nor cooling.
#[test]
fn ipam_picks_free_addresses_from_node_side() {
    let mut node = IpamNode::new(Arc::from("n1"), NodeUid(7));
    let mut pool = AddrSet::new();
    for a in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
        pool.insert(ip(a));
    }
    node.operator.addresses = Arc::new(pool);
    let mut s = NodeState::new(BOOT, CD);
    add(&mut s, "c1", 1, &["10.0.0.1"]).expect("add");
    add(&mut s, "c2", 2, &["10.0.0.2"]).expect("add");
    s.del(&key("c2"), None, t0());
    let side = s.node_side();
    assert_eq!(side.used[&ip("10.0.0.1")].allocation, key("c1").id());
    assert_eq!(side.used[&ip("10.0.0.1")].pod_uid, PodUid(1));
    assert_eq!(free_address(&node, &side, Family::V4), Some(ip("10.0.0.3")));
}

#[test]
fn every_change_marks_the_state_dirty_and_a_save_cleans_it() {
    let fs = RecordingFs::new();
    let dir = Path::new("/state");
    let mut s = NodeState::new(BOOT, CD);
    assert!(!s.is_dirty());
    add(&mut s, "c1", 1, &["10.0.0.1"]).expect("add");
    assert!(s.is_dirty());
    fs.fail_next(crate::state::OpKind::SyncFile);
    s.save(&fs, dir).expect_err("injected");
    assert!(s.is_dirty(), "a failed save leaves the change to be saved");
    s.save(&fs, dir).expect("save");
    assert!(!s.is_dirty());
    // a DEL retried after a failed save finds nothing to free, but the state stays dirty
    s.del(&key("c1"), None, t0());
    fs.fail_next(crate::state::OpKind::Rename);
    s.save(&fs, dir).expect_err("injected");
    assert_eq!(s.del(&key("c1"), None, t0()), DelOutcome::Unknown);
    assert!(s.is_dirty());
}

#[test]
fn pod_uids_parse_as_the_engine_prints_them() {
    let s = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
    let uid = parse_pod_uid(s).expect("a UUID");
    assert_eq!(uid.to_string(), s);
    assert_eq!(parse_pod_uid(&s.to_uppercase()).expect("upper"), uid);
    for bad in [
        "",
        "0000-1",
        "0f1e2d3c4b5a46978a8b9c0d1e2f3a4b",
        &format!("{s}-"),
    ] {
        assert!(parse_pod_uid(bad).is_err(), "{bad:?}");
    }
}
