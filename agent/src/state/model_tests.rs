//! The agent's own part of the node state (the node side's rules are tested in `ipam`'s
//! node module): what it keeps beside `NodeSide`, the boot scope, and saving.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tidepool_ipam::PodUid;

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

fn add(s: &mut NodeState, c: &str, p: u128, a: &[&str]) -> Result<Added, Refused<AllocKey>> {
    let addrs: Vec<IpAddr> = a.iter().map(|a| ip(a)).collect();
    s.adopt_allocation(
        key(c),
        pod(p),
        &addrs,
        Some(format!("/run/netns/{c}")),
        t0(),
    )
}

/// The agent's part follows the node side's: made with the allocation, gone with it.
#[test]
fn what_the_agent_keeps_comes_and_goes_with_the_allocation() {
    let mut s = NodeState::new(BOOT, CD);
    add(&mut s, "c1", 1, &["10.0.0.1", "fd00::1"]).expect("add");
    let a = s.get(&key("c1")).expect("recorded");
    assert_eq!((a.pod, a.since, a.boot_id.as_str()), (pod(1), t0(), BOOT));
    assert_eq!(a.netns.as_deref(), Some("/run/netns/c1"));
    assert_eq!(a.addrs, vec![ip("10.0.0.1"), ip("fd00::1")]);
    let side = s.node_side();
    assert_eq!(side.used[&ip("10.0.0.1")].pod.name(), "web-1");
    assert_eq!(side.used[&ip("fd00::1")].allocation, key("c1").id());
    // a repeated ADD keeps what was kept
    assert!(add(&mut s, "c1", 1, &["10.0.0.9"]).expect("again").repeated);
    assert_eq!(s.own.len(), 1);
    assert!(
        s.del(&key("c1"), Some(PodUid(9)), t0()).freed().is_empty(),
        "stale"
    );
    assert_eq!(s.own.len(), 1);
    assert_eq!(s.del(&key("c1"), None, t0()).freed().len(), 2);
    assert!(s.own.is_empty() && s.get(&key("c1")).is_none());
}

/// A reboot killed every earlier pod: their allocations cool down at once, and are
/// returned with what the agent kept of them.
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
    assert_eq!(s.own.keys().collect::<Vec<_>>(), vec![&key("c2")]);
    assert_eq!(s.cooldowns().get(&ip("10.0.0.1")), Some(&(now + CD)));
    assert!(s.expire_boot(now).is_empty());
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
