use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::pods::PodAddrs;
use crate::state::PodRef;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn alloc(uid: u128, addr: &str, netns: Option<&str>) -> Allocation {
    Allocation {
        pod: PodRef {
            uid: PodUid(uid),
            namespace: "default".into(),
            name: format!("p{uid}"),
        },
        addrs: vec![ip(addr)],
        since: at(0),
        boot_id: "boot".into(),
        netns: netns.map(String::from),
        network: None,
        pools: Default::default(),
    }
}

fn names(n: &[&str]) -> BTreeSet<String> {
    n.iter().map(|s| s.to_string()).collect()
}

/// Every piece of evidence there: the netns dir holds another sandbox's netns, the cache
/// holds another attachment's entry, no pod is live.
fn full() -> Evidence {
    Evidence {
        taken_at: at(100),
        netns: Netns::Populated(names(&["cni-other"])),
        cache: Cache::Known(names(&["pods-cother-eth0"])),
        pods: Some(Arc::new(LivePods::default())),
    }
}

fn pods(list: &[(u128, &str)]) -> Option<Arc<LivePods>> {
    let p: Vec<PodAddrs> = list
        .iter()
        .map(|(uid, a)| PodAddrs {
            uid: Some(PodUid(*uid)),
            terminal: false,
            addrs: vec![ip(a)],
        })
        .collect();
    Some(Arc::new(LivePods::new(&p)))
}

fn state(n: u128) -> BTreeMap<AllocKey, Allocation> {
    (1..=n)
        .map(|i| {
            let key = AllocKey::new(format!("c{i}"), "eth0");
            (key, alloc(i, &format!("10.0.0.{i}"), None))
        })
        .collect()
}

fn freed(d: &Decision) -> Vec<String> {
    d.free.iter().map(|f| f.key.container_id.clone()).collect()
}

/// Two cycles over the same state and evidence.
fn twice(allocs: &BTreeMap<AllocKey, Allocation>, ev: &Evidence) -> (Decision, Decision) {
    let mut m = Memory::default();
    let first = decide(allocs, ev, &mut m, 16);
    let second = decide(allocs, ev, &mut m, 16);
    (first, second)
}

#[test]
fn seen_once_frees_nothing_seen_twice_frees() {
    let allocs = state(1);
    let (first, second) = twice(&allocs, &full());
    assert_eq!((first.cycle, first.candidates), (1, 1));
    assert!(first.free.is_empty(), "one sighting is not enough");
    assert_eq!(second.cycle, 2);
    assert_eq!(freed(&second), vec!["c1"]);
    assert_eq!(second.free[0].first_seen, 1);
    assert_eq!(second.free[0].addrs, vec![ip("10.0.0.1")]);
    assert_eq!(second.free[0].uid, PodUid(1));
}

#[test]
fn any_missing_evidence_frees_nothing_however_often_seen() {
    let allocs = state(2);
    let missing = [
        Evidence {
            netns: Netns::Invisible("no such directory".into()),
            ..full()
        },
        Evidence {
            netns: Netns::Empty,
            ..full()
        },
        Evidence {
            cache: Cache::Invisible("permission denied".into()),
            ..full()
        },
        Evidence {
            cache: Cache::UnknownLayout("no entry reads as libcni's".into()),
            ..full()
        },
        Evidence {
            pods: None,
            ..full()
        },
    ];
    for ev in &missing {
        let mut m = Memory::default();
        for _ in 0..5 {
            let d = decide(&allocs, ev, &mut m, 16);
            assert!(d.blocked.is_some(), "{ev:?}");
            assert!(d.free.is_empty() && d.candidates == 0, "{ev:?}: {d:?}");
        }
    }
}

#[test]
fn a_gap_in_the_evidence_starts_the_count_over() {
    let allocs = state(1);
    let mut m = Memory::default();
    assert_eq!(decide(&allocs, &full(), &mut m, 16).candidates, 1);
    let gap = Evidence {
        netns: Netns::Empty,
        ..full()
    };
    assert_eq!(
        decide(&allocs, &gap, &mut m, 16).blocked,
        Some(Blocked::NetnsEmpty)
    );
    let after = decide(&allocs, &full(), &mut m, 16);
    assert!(after.free.is_empty(), "the sightings were not consecutive");
    let then = decide(&allocs, &full(), &mut m, 16);
    assert_eq!(freed(&then), vec!["c1"]);
    assert_eq!(then.free[0].first_seen, 3);
}

#[test]
fn signs_of_life_keep_an_allocation() {
    let mut allocs = state(4);
    // c1: a cache entry names it; c2: its netns is still there; c3: its live pod lists
    // the address; c4: nothing — the control
    allocs
        .get_mut(&AllocKey::new("c2", "eth0"))
        .expect("c2")
        .netns = Some("/var/run/netns/cni-c2".into());
    let ev = Evidence {
        netns: Netns::Populated(names(&["cni-other", "cni-c2"])),
        cache: Cache::Known(names(&["pods-c1-eth0", "pods-cother-eth0"])),
        pods: pods(&[(3, "10.0.0.3"), (4, "10.0.0.99")]),
        ..full()
    };
    let (first, second) = twice(&allocs, &ev);
    assert_eq!(first.candidates, 1);
    assert_eq!(
        freed(&second),
        vec!["c4"],
        "pod 4 lives but lists another address"
    );
}

#[test]
fn a_cache_entry_of_another_interface_or_container_is_no_sign_of_life() {
    let allocs = state(1);
    let ev = Evidence {
        // eth1 of c1, and container xc1: neither is (c1, eth0)
        cache: Cache::Known(names(&["pods-c1-eth1", "pods-xc1-eth0x", "c1-eth0"])),
        ..full()
    };
    let (_, second) = twice(&allocs, &ev);
    assert_eq!(
        freed(&second),
        vec!["c1"],
        "\"c1-eth0\" has no network name: not libcni's"
    );
    let named = Evidence {
        cache: Cache::Known(names(&["my-net-c1-eth0"])),
        ..full()
    };
    let (_, second) = twice(&allocs, &named);
    assert!(second.free.is_empty(), "a network name with dashes");
}

#[test]
fn an_allocation_newer_than_the_evidence_is_not_judged() {
    let mut allocs = state(1);
    allocs
        .get_mut(&AllocKey::new("c1", "eth0"))
        .expect("c1")
        .since = at(200);
    let (first, second) = twice(&allocs, &full());
    assert_eq!(first.candidates + second.candidates, 0);
}

#[test]
fn the_cap_frees_at_most_n_a_cycle_and_the_rest_later() {
    let allocs = state(5);
    let mut m = Memory::default();
    assert_eq!(decide(&allocs, &full(), &mut m, 2).candidates, 5);
    let second = decide(&allocs, &full(), &mut m, 2);
    assert_eq!(freed(&second), vec!["c1", "c2"]);
    assert_eq!((second.deferred, second.candidates), (3, 5));
    // the state after the frees: the deferred ones were seen twice already
    let mut left = allocs.clone();
    for f in &second.free {
        left.remove(&f.key);
    }
    let third = decide(&left, &full(), &mut m, 2);
    assert_eq!(freed(&third), vec!["c3", "c4"]);
    assert_eq!(third.free[0].first_seen, 1);
    assert_eq!(third.deferred, 1);
}

#[test]
fn a_re_added_key_is_a_new_allocation() {
    let mut allocs = state(1);
    let mut m = Memory::default();
    decide(&allocs, &full(), &mut m, 16);
    // freed by a DEL and added again (same key, same pod) between the cycles
    allocs
        .get_mut(&AllocKey::new("c1", "eth0"))
        .expect("c1")
        .since = at(50);
    let d = decide(&allocs, &full(), &mut m, 16);
    assert!(d.free.is_empty(), "seen once as the new allocation");
}
