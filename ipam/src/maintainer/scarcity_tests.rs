//! Scarcity meeting the handshake and reclaim (issue 30's interactions), on the in-memory
//! source of per-address grants under paused time: a scarce pool's marks never take an
//! address a pod holds, and an address held only by the reclaim min-age is demand, not free.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use super::tests::{Rig, info, rig, rig_with, run_for};
use crate::store::NodeStore;
use crate::types::{NodeName, PodUid, ReleaseAck, ReleaseState};

fn marked(r: &Rig, node: &str) -> BTreeSet<IpAddr> {
    (r.node(node).operator.release)
        .keys_where(|s| *s == ReleaseState::MarkedForRelease)
        .iter()
        .collect()
}

fn used(r: &Rig, node: &str) -> BTreeSet<IpAddr> {
    r.node(node).node.used.keys().collect()
}

/// Steps `secs` seconds, asserting at every step that no marked address of `nodes` is used.
async fn run_checked(r: &Rig, nodes: &[&str], secs: u64) {
    for _ in 0..secs * 10 {
        run_for(0).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        for n in nodes {
            if r.store.cached(n).is_some() {
                let both: Vec<_> = marked(r, n).intersection(&used(r, n)).copied().collect();
                assert!(both.is_empty(), "{n}: marked while used: {both:?}");
            }
        }
    }
}

/// No address granted to two nodes, and the source agrees with what the nodes show.
fn no_double_grant(r: &Rig, nodes: &[&str]) {
    let granted = r.source.granted();
    let distinct: BTreeSet<IpAddr> = granted.iter().map(|(a, _)| *a).collect();
    assert_eq!(distinct.len(), granted.len(), "an address granted twice");
    for n in nodes {
        let shown: BTreeSet<IpAddr> = r.addresses(n).into_iter().collect();
        let held: BTreeSet<IpAddr> = (granted.iter())
            .filter(|(_, node)| node.as_ref() == *n)
            .map(|(a, _)| *a)
            .collect();
        assert_eq!(shown, held, "{n}: shown = granted");
    }
}

/// Node a holds 12 of a 20-address pool with 4 used and 6 marked (unanswered); b's 14
/// waiting pods make the pool scarce; then a's own 4 pods arrive. The marks beyond a's
/// excess are withdrawn so its pods are served from its own addresses, no used address is ever marked, and no
/// address is granted twice; what a gives back afterwards goes to b.
#[tokio::test(start_paused = true)]
async fn scarcity_with_a_mark_in_flight_serves_the_marking_nodes_own_pods_first() {
    let r = rig(20);
    r.schedule("a", 1, 10);
    r.mgr.upsert_node(info("a"));
    run_for(2).await;
    let held = r.addresses("a");
    assert_eq!(held.len(), 12, "10 waiting + pre-allocate 2");
    for (uid, addr) in (1..=4).zip(&held) {
        r.start_pod("a", uid, *addr);
    }
    for uid in 5..=10 {
        r.pods.delete(PodUid(uid));
    }
    r.mgr.on_pod_event("a");
    run_checked(&r, &["a"], 15).await;
    assert_eq!(marked(&r, "a").len(), 6, "12 held, 4 used, pre-allocate 2");
    assert!(r.mgr.scarcity().iter().all(|s| !s.scarce));

    r.schedule("b", 100, 14);
    r.mgr.upsert_node(info("b"));
    run_checked(&r, &["a", "b"], 1).await;
    let state = r.mgr.scarcity();
    assert!(state[0].scarce, "4 used + 14 waiting of 20: {state:?}");
    assert_eq!(r.addresses("b").len(), 8, "what the pool had left");

    r.schedule("a", 20, 4);
    run_checked(&r, &["a", "b"], 1).await;
    // 12 held, 8 demanded: the marks beyond the 4 of excess are withdrawn
    let offered = marked(&r, "a");
    assert_eq!(offered.len(), 4, "{offered:?}");
    let free: Vec<IpAddr> = (r.addresses("a").into_iter())
        .filter(|a| !used(&r, "a").contains(a) && !offered.contains(a))
        .collect();
    assert_eq!(free.len(), 4, "a serves its own pods first: {free:?}");
    for (uid, addr) in (20..24).zip(&free) {
        r.start_pod("a", uid, *addr);
    }
    run_checked(&r, &["a", "b"], 12).await;
    assert_eq!(
        marked(&r, "a"),
        offered,
        "what stays marked is a's excess only"
    );
    r.store.apply_node(&NodeName::from("a"), |f| {
        for a in &offered {
            f.release_ack.insert(*a, ReleaseAck::ReadyForRelease);
        }
    });
    r.mgr.on_pod_event("a");
    run_checked(&r, &["a", "b"], 3).await;
    assert_eq!(r.addresses("a").len(), 8);
    assert_eq!(r.addresses("b").len(), 12, "b got what a gave back");
    no_double_grant(&r, &["a", "b"]);
}

/// A crashed pod's address, held by the reclaim min-age, is demand: it counts in the
/// pressure, and a scarce pool never marks it.
#[tokio::test(start_paused = true)]
async fn an_address_held_by_the_reclaim_min_age_is_not_free_under_scarcity() {
    let r = rig_with(20, |cfg| cfg.reclaim.min_age = Duration::from_secs(3600));
    r.schedule("a", 1, 6);
    r.mgr.upsert_node(info("a"));
    run_for(2).await;
    let held = r.addresses("a");
    for (uid, addr) in (1..=6).zip(&held) {
        r.start_pod("a", uid, *addr);
    }
    run_for(1).await;
    // three pods crash away: their entries stay in `used` until the min-age passes
    for uid in 1..=3 {
        r.pods.delete(PodUid(uid));
    }
    r.mgr.on_pod_event("a");
    r.schedule("b", 100, 12);
    r.mgr.upsert_node(info("b"));
    run_checked(&r, &["a", "b"], 30).await;
    let state = r.mgr.scarcity();
    assert!(state[0].scarce, "{state:?}");
    assert_eq!(
        used(&r, "a").len(),
        6,
        "nothing reclaimed before the min-age"
    );
    // 6 used (3 of them leaked) + b's demand beyond what it got, of 20
    assert!(
        state[0].pressure >= 18.0 / 20.0,
        "the leaked addresses are demand: {state:?}"
    );
    assert!(
        r.addresses("a").len() >= 6,
        "a keeps every used address, leaked or not"
    );
    no_double_grant(&r, &["a", "b"]);
}

/// Pods arrive at once on three nodes of a 20-address pool, 6 each: 18 of 20 make it
/// scarce, but only once the third node has counted its pods. The nodes that planned
/// before that (with pre-allocate 2) claim nothing under the old squeeze and plan again:
/// each claims its own 6, and the third node's pods are served with the rest. Without
/// the re-plan the first two would take 8 each and leave the third 4 for 6 pods.
#[tokio::test(start_paused = true)]
async fn nodes_woken_together_count_their_pods_before_any_claims_a_warm_pool() {
    let r = rig(20);
    for (node, first) in [("a", 1), ("b", 100), ("c", 200)] {
        r.schedule(node, first, 6);
        r.mgr.upsert_node(info(node));
    }
    run_checked(&r, &["a", "b", "c"], 2).await;
    assert!(r.mgr.scarcity()[0].scarce, "{:?}", r.mgr.scarcity());
    for node in ["a", "b", "c"] {
        assert_eq!(r.addresses(node).len(), 6, "{node}: its pods, no warm pool");
    }
    no_double_grant(&r, &["a", "b", "c"]);
}
