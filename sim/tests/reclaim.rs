//! Reclaim on the simulated world (DESIGN.md "Reclaim"): crashed, terminal and replaced
//! sandboxes' addresses come back after two observations `reclaim_grace` apart, the
//! minimum age and the reuse cooldown; live pods never lose theirs; stale tombstones lose
//! nothing; a deleted Node keeps its addresses while pods are bound to it and until the
//! node grace has passed. Times are exact under paused time: defaults are grace 30 s,
//! min-age 2 m, reuse cooldown 30 s, node grace 5 m, pod cache lag 100 ms.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::time::Duration;

use common::*;
use tidepool_ipam::NodeUid;
use tidepool_ipam::PodPhase;
use tidepool_ipam::{EventReason, NodeStore, Ungated};
use tidepool_ipam::{Family, PodUid, ReclaimAck, ReclaimOutcome, ReclaimReason, Tombstone};
use tidepool_sim::{World, WorldConfig};

const LAG: Duration = Duration::from_millis(100);

/// pre 1, release off: a node's pool does not move while we watch reclaim.
fn quiet_config() -> WorldConfig {
    let mut cfg = config(wm(1, 0, 0, 0));
    cfg.engine.release.enabled = false;
    cfg
}

/// A crashed pod's address: first observed when the cache shows the deletion (100 ms),
/// tombstoned 30 s later (grace; the entry is older than 2 m), reclaimed by the node side
/// at once, cools down 30 s, then serves a new pod.
#[tokio::test(start_paused = true)]
async fn crashed_pod_address_comes_back_after_grace_and_cooldown() {
    let world = World::start(quiet_config()).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    let a = world.schedule_pod(&n);
    advance(secs(150)).await;
    let node = ipam_node(&world, "node1");
    assert_eq!(node.operator.addresses.total(), 2);
    let (x, e) = node.node.used.iter().next().unwrap();
    assert_eq!(e.pod_uid, a);
    let allocation = e.allocation;

    world.delete_pod(a, true); // no DEL: the entry stays
    let t_del = rec.elapsed();
    advance(secs(30)).await; // 30 s: the grace runs from the first observation at 100 ms
    assert!(
        rec.tombstones("node1").is_empty(),
        "tombstone before the grace"
    );
    assert_eq!(ipam_node(&world, "node1").node.used[&x].pod_uid, a);

    advance(millis(200)).await;
    let tombs = rec.tombstones("node1");
    assert_eq!(
        tombs,
        vec![(
            t_del + LAG + secs(30),
            x,
            Tombstone {
                pod_uid: a,
                allocation,
                reason: ReclaimReason::PodDeleted
            }
        )]
    );
    assert_eq!(
        rec.reclaim_acks("node1"),
        vec![(
            t_del + LAG + secs(30),
            x,
            ReclaimAck {
                pod_uid: a,
                allocation,
                outcome: ReclaimOutcome::Reclaimed
            }
        )]
    );
    let node = ipam_node(&world, "node1");
    assert!(node.node.used.is_empty());
    assert!(
        node.operator.reclaim.is_empty(),
        "tombstone deleted after the ack"
    );
    // the answer needs no write of its own once the tombstone is gone: it goes with the
    // node side's next one
    assert_eq!(
        node.node.reclaim_ack.keys().collect::<Vec<_>>(),
        vec![&x],
        "the answer kept for the next write"
    );
    assert!(node.node.cooldown.contains_key(&x), "cooling down");
    assert_eq!(world.store.event_count(EventReason::GarbageCollected), 1);
    assert_eq!(
        node.operator.addresses.total(),
        2,
        "the address stays in the pool"
    );

    // 29 s into the cooldown a new pod gets the other address; after it, x is free again
    advance(secs(29)).await;
    let b = world.schedule_pod(&n);
    advance(millis(100)).await;
    let node = ipam_node(&world, "node1");
    assert!(
        !node.node.used.contains_key(&x),
        "x reused during its cooldown"
    );
    assert!(node.node.cooldown.contains_key(&x));
    assert!(node.node.reclaim_ack.is_empty(), "went with b's start");
    advance(secs(2)).await;
    assert!(cooling(&world).is_empty(), "x's cooldown is over");
    assert_eq!(
        listed_cooldowns(&world),
        vec![x],
        "... and written with the next change"
    );
    let c = world.schedule_pod(&n);
    advance(secs(1)).await;
    let node = ipam_node(&world, "node1");
    assert_eq!(node.node.used[&x].pod_uid, c, "x serves a new pod");
    assert!(node.node.used.values().any(|e| e.pod_uid == b));
    assert_eq!(world.observer.reclaimed(), 1);
    assert_eq!(world.observer.reclaim_latencies(), vec![30.1]);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// A pod crashing young is held until its entry is `reclaim_min_age` old (operator clock):
/// started at 0, crashed at 10 s, first observed at 10.1 s, grace done at 40.1 s, tombstone
/// only when the operator has known the entry for 2 m.
#[tokio::test(start_paused = true)]
async fn a_young_crash_waits_for_the_minimum_age() {
    let world = World::start(quiet_config()).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    let a = world.schedule_pod(&n);
    advance(secs(10)).await;
    world.delete_pod(a, true);
    advance(secs(100)).await; // 110 s
    assert!(
        rec.tombstones("node1").is_empty(),
        "held by the minimum age"
    );
    assert_eq!(used(&world, "node1"), 1);
    wait_until("tombstone", secs(20), millis(10), || {
        !rec.tombstones("node1").is_empty()
    })
    .await;
    let (t, _, tomb) = rec.tombstones("node1")[0];
    // the operator first saw the entry in the pass after the pod started (10 ms: the
    // minimum pass interval after the pass that granted the pool)
    assert_eq!(
        t,
        secs(120) + millis(10),
        "tombstone 2 m after the entry was first seen"
    );
    assert_eq!(tomb.pod_uid, a);
    advance(secs(1)).await;
    assert_eq!(used(&world, "node1"), 0);
    assert_finish_clean(&world);
}

/// A pod that is merely slow to appear in the pod cache (lag 90 s) is never reclaimed: it
/// looks like a candidate at first, but the minimum age (2 m) holds it until the cache
/// shows it, and the live lookup would refuse anyway.
#[tokio::test(start_paused = true)]
async fn a_pod_slow_to_appear_in_the_cache_is_never_reclaimed() {
    let mut cfg = quiet_config();
    cfg.cache_lag = secs(90);
    let world = World::start(cfg).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    let mut pods = Vec::new();
    for _ in 0..6 {
        pods.push(world.schedule_pod(&n));
        advance(secs(20)).await;
    }
    advance(secs(600)).await;
    assert!(
        rec.tombstones("node1").is_empty(),
        "a live pod was tombstoned"
    );
    let node = ipam_node(&world, "node1");
    assert_eq!(node.node.used.len(), 6);
    for p in &pods {
        assert!(node.node.used.values().any(|e| e.pod_uid == *p));
    }
    assert_eq!(world.store.event_count(EventReason::GarbageCollected), 0);
    assert_eq!(world.observer.reclaimed(), 0);
    assert_finish_clean(&world);
}

/// A Succeeded pod's addresses are reclaimed (reason pod-terminal): the phase change is
/// seen at once, the tombstone follows the grace.
#[tokio::test(start_paused = true)]
async fn a_succeeded_pods_addresses_are_reclaimed() {
    let world = World::start(quiet_config()).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    let a = world.schedule_pod(&n);
    let b = world.schedule_pod(&n);
    advance(secs(150)).await;
    let node = ipam_node(&world, "node1");
    let (xa, ea) = node.node.used.iter().find(|(_, e)| e.pod_uid == a).unwrap();
    let allocation = ea.allocation;
    world.finish_pod(a, PodPhase::Succeeded);
    let t_fin = rec.elapsed();
    advance(secs(31)).await;
    assert_eq!(
        rec.tombstones("node1"),
        vec![(
            t_fin + secs(30),
            xa,
            Tombstone {
                pod_uid: a,
                allocation,
                reason: ReclaimReason::PodTerminal
            }
        )]
    );
    let node = ipam_node(&world, "node1");
    assert!(!node.node.used.contains_key(&xa));
    assert!(node.node.cooldown.contains_key(&xa));
    assert!(
        node.node.used.values().any(|e| e.pod_uid == b),
        "b untouched"
    );
    assert_eq!(world.store.event_count(EventReason::GarbageCollected), 1);
    // a Failed pod too
    world.finish_pod(b, PodPhase::Failed);
    advance(secs(31)).await;
    assert_eq!(used(&world, "node1"), 0);
    assert_eq!(rec.tombstones("node1").len(), 2);
    assert_eq!(
        rec.tombstones("node1")[1].2.reason,
        ReclaimReason::PodTerminal
    );
    assert_finish_clean(&world);
}

/// A replaced sandbox: the kubelet restarts the pod's sandbox, the new ADD takes a new
/// address while the old entry stays (its DEL never came). The old address is reclaimed
/// (reason sandbox-replaced); the pod keeps the new one and is never harmed.
#[tokio::test(start_paused = true)]
async fn a_replaced_sandboxs_old_address_is_reclaimed() {
    let world = World::start(quiet_config()).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    let a = world.schedule_pod(&n);
    advance(secs(150)).await;
    let (old, allocation) = {
        let node = ipam_node(&world, "node1");
        let (old, e) = node.node.used.iter().next().unwrap();
        (old, e.allocation)
    };
    let new = world
        .replace_sandbox(a)
        .expect("a free address for the new sandbox");
    assert_eq!(new.len(), 1);
    assert_ne!(new[0], old);
    let t_rep = rec.elapsed();
    advance(secs(31)).await;
    assert_eq!(
        rec.tombstones("node1"),
        vec![(
            t_rep + secs(30),
            old,
            Tombstone {
                pod_uid: a,
                allocation,
                reason: ReclaimReason::SandboxReplaced
            }
        )]
    );
    let node = ipam_node(&world, "node1");
    assert!(
        !node.node.used.contains_key(&old),
        "old sandbox's entry reclaimed"
    );
    assert_eq!(
        node.node.used[&new[0]].pod_uid, a,
        "the pod keeps its new address"
    );
    assert_eq!(node.node.used.len(), 1);
    assert!(node.node.cooldown.contains_key(&old));
    assert_eq!(
        world.pods.truth(a).unwrap().ips.iter().collect::<Vec<_>>(),
        new
    );
    // and nothing more is reclaimed later
    advance(secs(600)).await;
    assert_eq!(rec.tombstones("node1").len(), 1);
    assert_eq!(ipam_node(&world, "node1").node.used[&new[0]].pod_uid, a);
    assert_finish_clean(&world);
}

/// Dual stack: a crashed pod's IPv4 and IPv6 addresses are tombstoned in the same write
/// and reclaimed together; at no moment does one go without the other.
#[tokio::test(start_paused = true)]
async fn both_families_of_a_pod_go_together() {
    let mut cfg = quiet_config();
    cfg.families = vec![Family::V4, Family::V6];
    let world = World::start(cfg).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    let a = world.schedule_pod(&n);
    let b = world.schedule_pod(&n);
    advance(secs(150)).await;
    let node = ipam_node(&world, "node1");
    assert_eq!(
        node.operator.addresses.total(),
        6,
        "(2 used + pre 1) per family"
    );
    let mine: Vec<_> = node
        .node
        .used
        .iter()
        .filter(|(_, e)| e.pod_uid == a)
        .map(|(x, _)| x)
        .collect();
    assert_eq!(mine.len(), 2);
    assert_eq!(Family::of(&mine[0]), Family::V4);
    assert_eq!(Family::of(&mine[1]), Family::V6);

    world.delete_pod(a, true);
    let t_del = rec.elapsed();
    // watch every 10 ms: both entries or neither
    for _ in 0..4000 {
        advance(millis(10)).await;
        let u = &ipam_node(&world, "node1").node.used;
        assert_eq!(
            u.contains_key(&mine[0]),
            u.contains_key(&mine[1]),
            "one family reclaimed without the other"
        );
    }
    let tombs = rec.tombstones("node1");
    assert_eq!(tombs.len(), 2);
    for (t, x, tomb) in &tombs {
        assert_eq!(*t, t_del + LAG + secs(30));
        assert!(mine.contains(x));
        assert_eq!(tomb.pod_uid, a);
    }
    let node = ipam_node(&world, "node1");
    assert_eq!(node.node.used.len(), 2, "b's two entries remain");
    assert!(node.node.used.values().all(|e| e.pod_uid == b));
    assert_eq!(world.observer.reclaimed(), 2);
    assert_eq!(world.store.event_count(EventReason::GarbageCollected), 2);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// A tombstone for an entry that changed owner (written by a stale operator for pod A,
/// while the address now serves pod B) is answered `stale`; B keeps its entry, the engine
/// drops the tombstone, the node side its answer, and nothing is lost.
#[tokio::test(start_paused = true)]
async fn a_tombstone_for_an_entry_that_changed_owner_is_stale() {
    let world = World::start(config(wm(0, 0, 0, 0))).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    let a = world.schedule_pod(&n);
    advance(secs(1)).await;
    let node = ipam_node(&world, "node1");
    assert_eq!(node.operator.addresses.total(), 1);
    let (x, ea) = node.node.used.iter().next().unwrap();
    let allocation = ea.allocation;
    // A leaves cleanly; after the cooldown B gets the very same address (release delay
    // 180 s keeps it in the pool meanwhile)
    world.delete_pod(a, false);
    advance(secs(31)).await;
    let b = world.schedule_pod(&n);
    advance(secs(1)).await;
    let node = ipam_node(&world, "node1");
    assert_eq!(node.node.used[&x].pod_uid, b);
    let calls = source_calls(&world);

    // a stale writer tombstones x for A
    let mut fields = node.operator.clone();
    fields.reclaim.insert(
        x,
        Tombstone {
            pod_uid: a,
            allocation,
            reason: ReclaimReason::PodDeleted,
        },
    );
    world
        .store
        .apply_operator(&n, node.node_uid, fields, &mut Ungated)
        .await
        .unwrap();
    advance(secs(1)).await;
    assert_eq!(
        rec.reclaim_acks("node1")
            .into_iter()
            .map(|(_, x, k)| (x, k))
            .collect::<Vec<_>>(),
        vec![(
            x,
            ReclaimAck {
                pod_uid: a,
                allocation,
                outcome: ReclaimOutcome::Stale
            }
        )]
    );
    let node = ipam_node(&world, "node1");
    assert_eq!(node.node.used[&x].pod_uid, b, "B keeps its entry");
    assert!(!node.node.cooldown.contains_key(&x));
    assert!(
        node.operator.reclaim.is_empty(),
        "the engine dropped the tombstone"
    );
    assert_eq!(
        node.node.reclaim_ack[&x].outcome,
        ReclaimOutcome::Stale,
        "the node side's answer goes with its next write"
    );
    assert!(node.operator.addresses.contains(&x));
    assert_eq!(world.store.event_count(EventReason::GarbageCollected), 0);
    assert_eq!(world.observer.reclaimed(), 0);
    assert_eq!(source_calls(&world), calls);
    advance(secs(300)).await;
    assert_eq!(ipam_node(&world, "node1").node.used[&x].pod_uid, b);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// The node side's answer on its own (pure), for the same race: a tombstone naming a UID
/// the entry no longer has is stale and removes nothing.
#[test]
fn node_side_answers_a_changed_owner_stale() {
    use std::time::SystemTime;
    use tidepool_ipam::node::NodeSide;
    use tidepool_ipam::{AllocationId, IpamNode, NodeSideFields, UsedEntry};
    let x: std::net::IpAddr = "10.0.0.7".parse().unwrap();
    let mut node = IpamNode::new("n".into(), NodeUid(1));
    std::sync::Arc::make_mut(&mut node.operator.addresses).insert(x);
    node.operator.reclaim.insert(
        x,
        Tombstone {
            pod_uid: PodUid(1),
            allocation: AllocationId::new("c1", "eth0"),
            reason: ReclaimReason::PodDeleted,
        },
    );
    let mut side = NodeSideFields::default();
    let entry = UsedEntry {
        pod_uid: PodUid(2),
        pod: tidepool_ipam::PodName::new("ns", "b"),
        allocation: AllocationId::new("c9", "eth0"),
        since: SystemTime::UNIX_EPOCH.into(),
    };
    side.used.insert(x, entry.clone());
    let mut ns = NodeSide::from_published(&side, secs(30));
    let reclaimed = ns.answer_tombstones(
        &node.operator.reclaim,
        Some,
        |_| false,
        SystemTime::UNIX_EPOCH,
    );
    assert!(reclaimed.is_empty());
    let side = ns.published(|_| tidepool_ipam::PodName::new("ns", "b"));
    assert_eq!(side.used.get(&x), Some(&entry));
    assert!(side.cooldown.is_empty());
    assert_eq!(
        side.reclaim_ack.get(&x),
        Some(&ReclaimAck {
            pod_uid: PodUid(1),
            allocation: AllocationId::new("c1", "eth0"),
            outcome: ReclaimOutcome::Stale
        })
    );
}

/// A Node deleted while pods are still bound to it (its machine gone, the pod garbage
/// collector not yet done) keeps its addresses as long as they are bound, even far past the
/// node grace; once they are gone the source gets everything back and the IPAMNode goes.
#[tokio::test(start_paused = true)]
async fn a_deleted_node_keeps_its_addresses_while_pods_are_bound() {
    let world = World::start(config(wm(8, 0, 0, 0))).unwrap();
    let n1 = world.add_node("node1");
    let n2 = world.add_node("node2");
    let pods = schedule(&world, &n1, 3);
    schedule(&world, &n2, 2);
    settle(&world, secs(60)).await;
    assert_eq!((pool(&world, "node1"), pool(&world, "node2")), (11, 10));

    world.vanish_machine(&n1);
    world.manager.delete_node("node1"); // the Node object goes; its pods stay bound
    advance(secs(600)).await; // twice the node grace
    assert_eq!(pool(&world, "node1"), 11, "kept while pods are bound");
    assert_eq!(granted_to(&world, "node1").len(), 11);
    assert!(world.manager.summary("node1").is_some());
    assert_eq!(world.manager.stats().nodes, 2);

    for p in &pods[..2] {
        world.delete_pod(*p, true);
    }
    advance(secs(60)).await;
    assert_eq!(granted_to(&world, "node1").len(), 11, "one pod still bound");
    world.delete_pod(pods[2], true);
    advance(secs(1)).await;
    assert!(
        granted_to(&world, "node1").is_empty(),
        "all back at the source"
    );
    assert!(world.node("node1").is_none(), "IPAMNode removed");
    assert!(world.manager.summary("node1").is_none());
    assert_eq!(world.manager.stats().nodes, 1);
    assert_eq!(pool(&world, "node2"), 10, "node2 untouched");
    assert_eq!(used(&world, "node2"), 2);
    assert_finish_clean(&world);
}

/// A Node deleted with its pods (the garbage collector removed them at once) keeps its
/// addresses for `node_reclaim_grace` (5 m) after the deletion, then gives them back.
#[tokio::test(start_paused = true)]
async fn a_deleted_node_waits_for_the_node_grace() {
    let world = World::start(config(wm(8, 0, 0, 0))).unwrap();
    let n1 = world.add_node("node1");
    let n2 = world.add_node("node2");
    schedule(&world, &n1, 3);
    schedule(&world, &n2, 1);
    settle(&world, secs(60)).await;
    world.vanish_machine(&n1);
    world.delete_node_object(&n1);
    advance(secs(299)).await;
    assert_eq!(pool(&world, "node1"), 11, "kept during the node grace");
    assert_eq!(granted_to(&world, "node1").len(), 11);
    advance(secs(2)).await;
    assert!(granted_to(&world, "node1").is_empty());
    assert!(world.node("node1").is_none());
    assert!(world.manager.summary("node1").is_none());
    assert_eq!(world.store.event_count(EventReason::GarbageCollected), 1);
    assert_eq!(pool(&world, "node2"), 9);
    assert_finish_clean(&world);
}

/// The live lookup is the last guard: even with the minimum age set to 0 (which nobody
/// should do with a 90 s cache lag) a running pod the cache does not show yet is not
/// tombstoned, because the lookup right before the write finds it.
#[tokio::test(start_paused = true)]
async fn the_live_lookup_confirms_before_any_tombstone() {
    let mut cfg = quiet_config();
    cfg.cache_lag = secs(90);
    cfg.engine.reclaim.min_age = Duration::ZERO;
    let world = World::start(cfg).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    let a = world.schedule_pod(&n);
    advance(secs(45)).await;
    // past the grace, still invisible in the cache: a candidate, but not confirmed
    assert_eq!(
        world.manager.summary("node1").unwrap().reclaim_candidates,
        1
    );
    advance(secs(300)).await;
    assert!(rec.tombstones("node1").is_empty());
    assert_eq!(
        ipam_node(&world, "node1")
            .node
            .used
            .values()
            .next()
            .unwrap()
            .pod_uid,
        a
    );
    assert_eq!(
        world.manager.summary("node1").unwrap().reclaim_candidates,
        0
    );
    assert_finish_clean(&world);
}

/// The observer is a real judge: a tombstone naming the pod that still uses the address
/// (a stale writer's mistake) is counted as a live reclaim. Since issue 25 the node side
/// answers it `live` (the pod runs there): the entry stays.
#[tokio::test(start_paused = true)]
async fn the_observer_flags_a_tombstone_for_a_live_pods_address() {
    let world = World::start(quiet_config()).unwrap();
    let n = world.add_node("node1");
    let a = world.schedule_pod(&n);
    advance(secs(5)).await;
    let node = ipam_node(&world, "node1");
    let (x, e) = node.node.used.iter().next().unwrap();
    let mut fields = node.operator.clone();
    fields.reclaim.insert(
        x,
        Tombstone {
            pod_uid: a,
            allocation: e.allocation,
            reason: ReclaimReason::PodDeleted,
        },
    );
    world
        .store
        .apply_operator(&n, node.node_uid, fields, &mut Ungated)
        .await
        .unwrap();
    advance(secs(1)).await;
    assert_eq!(world.observer.invariants().live_ip_reclaimed, 1);
    let node = ipam_node(&world, "node1");
    assert!(node.node.used.contains_key(&x), "answered live: kept");
    assert!(
        node.operator.reclaim.is_empty(),
        "the answered tombstone went"
    );
}

/// A tombstone whose write fails: a warning event `IPAddressGarbageCollectionFailed`, the
/// address stays recorded, and the retry after the backoff reclaims it.
#[tokio::test(start_paused = true)]
async fn a_failed_tombstone_write_is_reported_and_retried() {
    let world = World::start(quiet_config()).unwrap();
    let n = world.add_node("node1");
    let a = world.schedule_pod(&n);
    advance(secs(150)).await;
    let x = ipam_node(&world, "node1").node.used.keys().next().unwrap();
    world.delete_pod(a, true);
    advance(secs(29)).await;
    assert_eq!(
        world
            .store
            .event_count(EventReason::GarbageCollectionFailed),
        0
    );
    world.store.fail_next_operator_writes(1);
    advance(secs(2)).await;
    assert_eq!(
        world
            .store
            .event_count(EventReason::GarbageCollectionFailed),
        1
    );
    assert_eq!(world.store.event_count(EventReason::GarbageCollected), 0);
    assert_eq!(
        ipam_node(&world, "node1").node.used[&x].pod_uid,
        a,
        "still recorded"
    );
    advance(secs(10)).await; // the backoff's retry (1 s min, jittered)
    assert_eq!(world.store.event_count(EventReason::GarbageCollected), 1);
    assert!(ipam_node(&world, "node1").node.used.is_empty());
    assert_finish_clean(&world);
}

/// The addresses cooling down on node1.
/// node1's cooldowns not over by the world's clock.
fn cooling(world: &World) -> Vec<std::net::IpAddr> {
    let utc = tidepool_ipam::Clock::utc(&*world.clock);
    let node = ipam_node(world, "node1");
    node.node.cooling(utc).copied().collect()
}

/// node1's cooldowns as its status lists them (an ended one stays until the node side's
/// next write).
fn listed_cooldowns(world: &World) -> Vec<std::net::IpAddr> {
    let node = ipam_node(world, "node1");
    node.node.cooldown.keys().copied().collect()
}

/// Every cooldown in a node's status ends on time, also when an earlier one went first
/// (dropped before its end, as when its address leaves the pool): over by the clock at its
/// end, and listed until the node side writes for another change (no write of its own).
#[tokio::test(start_paused = true)]
async fn a_later_cooldown_ends_on_time_when_the_earlier_one_went_first() {
    let world = World::start(quiet_config()).unwrap();
    let n = world.add_node("node1");
    let pods = schedule(&world, &n, 2);
    advance(secs(130)).await;
    let node = ipam_node(&world, "node1");
    let addr_of = |uid: PodUid| {
        node.node
            .used
            .iter()
            .find(|(_, e)| e.pod_uid == uid)
            .map(|(a, _)| a)
            .unwrap()
    };
    let (a, b) = (addr_of(pods[0]), addr_of(pods[1]));
    // a's cooldown ends at 30 s, b's at 40 s
    world.delete_pod(pods[0], false);
    advance(secs(10)).await;
    world.delete_pod(pods[1], false);
    assert_eq!(cooling(&world), vec![a.min(b), a.max(b)]);
    // a's cooldown goes early, with no wake-up of the node side
    world
        .store
        .update_node(&n, |_, side| side.cooldown.remove(&a).is_some())
        .unwrap();
    advance(secs(19)).await;
    assert_eq!(cooling(&world), vec![b], "29 s after a's deletion");
    advance(secs(2)).await;
    assert_eq!(cooling(&world), vec![b], "31 s: b cools down until 40 s");
    advance(secs(10)).await;
    assert!(cooling(&world).is_empty(), "41 s: b's cooldown is over");
    assert_eq!(
        listed_cooldowns(&world),
        vec![b],
        "no write for its end alone"
    );
}

/// A cooldown of a machine that vanished ends on time all the same: no machine needs to
/// answer at its end. The machine back under its name (the kubelet re-registering) leaves
/// it over.
#[tokio::test(start_paused = true)]
async fn a_returning_machine_ends_the_cooldowns_it_missed() {
    let world = World::start(quiet_config()).unwrap();
    let n = world.add_node("node1");
    let pods = schedule(&world, &n, 1);
    advance(secs(150)).await;
    world.delete_pod(pods[0], false);
    advance(secs(1)).await;
    world.vanish_machine(&n);
    advance(secs(60)).await;
    assert!(
        cooling(&world).is_empty(),
        "over at its end, machine or not"
    );
    assert_eq!(listed_cooldowns(&world).len(), 1, "no machine wrote");
    world.add_node("node1");
    advance(secs(1)).await;
    assert!(cooling(&world).is_empty());
}
