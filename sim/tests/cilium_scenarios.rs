//! Cilium's NodeManager scenarios (research/cilium-operator-ipam.md §8.1 and §1.5 "Worked
//! examples") re-expressed on the simulated world with their exact pool sizes. Pool sizes are
//! read from the IPAMNode in the store, not from the engine's own summaries. Cilium's
//! pre-allocate -1 ("none") is our pre-allocate 0. "Use N" means N pods scheduled on the
//! node, one address each; going down means deleting pods cleanly (a DEL reaches the node
//! side, whose freed addresses then cool down for `reuse_cooldown` before they are free).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::time::Duration;

use common::*;
use tidepool_ipam::{ReleaseAck, WatermarkOverrides};
use tidepool_sim::World;

/// Reaching `want` addresses on `node`, then holding them for a while.
async fn expect_pool(world: &World, node: &str, want: usize, what: &str) {
    wait_until(what, secs(120), millis(100), || pool(world, node) == want).await;
    advance(secs(30)).await;
    assert_eq!(
        pool(world, node),
        want,
        "{what}: pool moved after reaching it"
    );
}

/// TestNodeManagerDefaultAllocation: pre 8 → 8 with no pods; use 7 → 15.
#[tokio::test(start_paused = true)]
async fn default_allocation() {
    let world = World::start(config(wm(8, 0, 0, 0))).unwrap();
    let n = world.add_node("node1");
    expect_pool(&world, "node1", 8, "pre-allocate 8").await;
    assert_eq!(used(&world, "node1"), 0);
    assert_eq!(source_calls(&world), 1, "one claim of 8");

    schedule(&world, &n, 7);
    expect_pool(&world, "node1", 15, "7 used + 8 free").await;
    assert_eq!(used(&world, "node1"), 7);
    assert_eq!(world.waiting(), 0);
    assert_eq!(source_calls(&world), 2, "one more claim of 7");
    let s = world.manager.summary("node1").unwrap();
    assert_eq!((s.counts.v4.allocated, s.counts.v4.used), (15, 7));
    assert_eq!((s.needed(), s.excess()), (0, 0));
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// TestNodeManagerMinAllocate20: pre none, min 10 → 10; use 8 → 10; min 20 → 20.
#[tokio::test(start_paused = true)]
async fn min_allocate_20() {
    let world = World::start(config(wm(0, 10, 0, 0))).unwrap();
    let n = world.add_node("node1");
    expect_pool(&world, "node1", 10, "min-allocate 10").await;

    schedule(&world, &n, 8);
    wait_until("8 pods running", secs(10), millis(100), || {
        used(&world, "node1") == 8
    })
    .await;
    expect_pool(&world, "node1", 10, "8 used within min 10").await;
    assert_eq!(source_calls(&world), 1);

    world.set_watermarks(
        &n,
        WatermarkOverrides {
            min_allocate: Some(20),
            ..Default::default()
        },
    );
    expect_pool(&world, "node1", 20, "min-allocate 20").await;
    assert_eq!(used(&world, "node1"), 8);
    assert_eq!(source_calls(&world), 2, "one claim of 10 more");
    // Nothing is excess at min 20 (20 ≤ min + max-above): no marks at all, even long after.
    advance(secs(600)).await;
    assert_eq!(pool(&world, "node1"), 20);
    assert!(marked(&world, "node1").is_empty());
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// TestNodeManagerMinAllocateAndPreallocate: pre 1, min 10 → 10; 9 used → 10; 10 used → 11;
/// 8 used → stays 11 (release disabled).
#[tokio::test(start_paused = true)]
async fn min_and_pre_allocate() {
    let mut cfg = config(wm(1, 10, 0, 0));
    cfg.engine.release.enabled = false;
    let world = World::start(cfg).unwrap();
    let n = world.add_node("node1");
    expect_pool(&world, "node1", 10, "min 10").await;

    schedule(&world, &n, 9);
    expect_pool(&world, "node1", 10, "9 used, 1 free = pre 1").await;
    assert_eq!(used(&world, "node1"), 9);
    assert_eq!(source_calls(&world), 1);

    schedule(&world, &n, 1);
    expect_pool(&world, "node1", 11, "10 used + pre 1").await;
    assert_eq!(used(&world, "node1"), 10);
    assert_eq!(source_calls(&world), 2);

    delete_last(&world, "node1", 2);
    // During the 30 s reuse cooldown of the two freed addresses, and long after: 11 held
    // is above min 10 and 3 are free once the cooldown ends, so nothing is claimed (and,
    // release being off, nothing given back).
    advance(secs(1)).await;
    assert_eq!(
        pool(&world, "node1"),
        11,
        "BUG (see the report): min-allocate counted against allocated − cooldown claims \
         an extra address while 2 cool down"
    );
    advance(secs(600)).await;
    assert_eq!(pool(&world, "node1"), 11);
    assert_eq!(used(&world, "node1"), 8);
    assert!(ipam_node(&world, "node1").operator.release.is_empty());
    assert_eq!(source_calls(&world), 2, "nothing released");
    let s = world.manager.summary("node1").unwrap();
    assert_eq!(
        s.excess(),
        1,
        "one excess address, kept because release is off"
    );
    assert!(s.at_target());
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// The same with release on: the one excess address goes back after the delay → 10.
#[tokio::test(start_paused = true)]
async fn min_and_pre_allocate_with_release() {
    let mut cfg = config(wm(1, 10, 0, 0));
    cfg.engine.release.delay = secs(2);
    let world = World::start(cfg).unwrap();
    let n = world.add_node("node1");
    schedule(&world, &n, 10);
    expect_pool(&world, "node1", 11, "10 used + pre 1").await;
    delete_last(&world, "node1", 2);
    // cooldown (30 s) + delay (2 s), then the handshake
    wait_until("release of the excess", secs(60), millis(100), || {
        pool(&world, "node1") == 10
    })
    .await;
    advance(secs(300)).await;
    assert_eq!(pool(&world, "node1"), 10);
    assert_eq!(used(&world, "node1"), 8);
    assert_eq!(source_calls(&world), 2, "one claim, one release");
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// TestNodeManagerReleaseAddress (release on, delay 2 s): pre 4, min 15, maxAbove 4 → 19;
/// use 11 → 19; use 19 → 27; use 10 → 19 after the handshake. The source answers after
/// 1 s, so the mark and the node side's answer are visible while the release is in flight.
#[tokio::test(start_paused = true)]
async fn release_address() {
    let mut cfg = config(wm(4, 15, 0, 4));
    cfg.engine.release.delay = secs(2);
    cfg.source_latency = secs(1);
    let world = World::start(cfg).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    expect_pool(&world, "node1", 19, "min 15 + max-above 4").await;
    assert_eq!(source_calls(&world), 1);

    schedule(&world, &n, 11);
    expect_pool(&world, "node1", 19, "11 used: 8 free ≥ pre 4").await;
    assert_eq!(source_calls(&world), 1);

    schedule(&world, &n, 8);
    expect_pool(&world, "node1", 27, "19 used: needed 4 + max-above 4").await;
    assert_eq!(used(&world, "node1"), 19);
    assert_eq!(source_calls(&world), 2);

    // use 10: 9 pods go; their addresses cool down for 30 s, then 8 are excess
    // (27 − (min 15 + max-above 4)).
    delete_last(&world, "node1", 9);
    let t_del = rec.elapsed();
    let before = source_calls(&world);
    // Nothing is marked or released during the cooldown and the 2 s delay after it.
    advance(secs(31)).await;
    assert!(
        marked(&world, "node1").is_empty(),
        "marked before the delay"
    );
    assert_eq!(pool(&world, "node1"), 27);
    assert_eq!(source_calls(&world), before);
    let s = world.manager.summary("node1").unwrap();
    assert_eq!(s.excess(), 8, "excess seen once the cooldown ended");
    advance(millis(900)).await; // 31.9 s after the deletions
    assert!(
        marked(&world, "node1").is_empty(),
        "marked before the delay"
    );
    assert_eq!(source_calls(&world), before);

    // At 32 s (30 s cooldown + 2 s delay) 8 addresses are marked and answered
    // ready-for-release; the release call is in flight for 1 s.
    advance(millis(500)).await;
    let node = ipam_node(&world, "node1");
    let marks = marked(&world, "node1");
    assert_eq!(marks.len(), 8, "marks: {:?}", node.operator.release);
    assert_eq!(node.operator.addresses.total(), 27, "not released yet");
    for a in &marks {
        assert!(!node.node.used.contains_key(a), "a used address was marked");
        let utc = tidepool_ipam::Clock::utc(&*world.clock);
        assert!(
            !node.node.cooling(utc).any(|c| c == a),
            "a cooling address was marked"
        );
        assert_eq!(
            node.node.release_ack.get(a),
            Some(&ReleaseAck::ReadyForRelease)
        );
    }
    // the marks are the 8 highest free addresses
    let mut free: Vec<_> = node
        .operator
        .addresses
        .iter()
        .filter(|a| !node.node.used.contains_key(a))
        .collect();
    free.sort();
    assert_eq!(marks, free[free.len() - 8..].to_vec());
    let rec_marks = rec.marks("node1");
    assert_eq!(rec_marks.len(), 8);
    for (t, _) in &rec_marks {
        assert_eq!(
            *t - t_del,
            secs(32),
            "marked exactly after cooldown + delay"
        );
    }

    wait_until("release to 19", secs(10), millis(100), || {
        pool(&world, "node1") == 19
    })
    .await;
    advance(secs(5)).await;
    let node = ipam_node(&world, "node1");
    assert_eq!(node.operator.addresses.total(), 19);
    assert_eq!(node.node.used.len(), 10);
    assert!(node.operator.release.is_empty(), "handshake finished");
    assert!(node.node.release_ack.is_empty());
    assert_eq!(source_calls(&world), before + 1, "one release call");
    for a in &marks {
        assert_eq!(world.source.owner(a), None, "{a} back at the source");
    }
    // every answer the node side gave was ready-for-release
    let acks = rec.release_acks("node1");
    assert_eq!(acks.len(), 8);
    assert!(
        acks.iter()
            .all(|(_, _, k)| *k == ReleaseAck::ReadyForRelease)
    );
    // and it stays at 19
    advance(secs(600)).await;
    assert_eq!(pool(&world, "node1"), 19);
    assert_eq!(source_calls(&world), before + 1);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// TestNodeManagerAbortRelease: pre 1, min 3 → 3; use 3 → 4; use 2 → one address marked
/// after the delay; use 3 again before the release is done → the mark is withdrawn, the
/// pool stays 4 and nothing is released. Passes are spaced 1 s apart so the pod can arrive
/// between the node side's answer and the pass that would act on it.
#[tokio::test(start_paused = true)]
async fn abort_release() {
    let mut cfg = config(wm(1, 3, 0, 0));
    cfg.engine.release.delay = secs(2);
    cfg.engine.min_pass_interval = secs(1);
    let world = World::start(cfg).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    expect_pool(&world, "node1", 3, "min 3").await;

    schedule(&world, &n, 3);
    expect_pool(&world, "node1", 4, "3 used + pre 1").await;
    let calls = source_calls(&world);
    assert_eq!(calls, 2);

    delete_last(&world, "node1", 1);
    let t_del = rec.elapsed();
    wait_until("one mark", secs(60), millis(100), || {
        !marked(&world, "node1").is_empty()
    })
    .await;
    let node = ipam_node(&world, "node1");
    let marks = marked(&world, "node1");
    assert_eq!(marks.len(), 1, "exactly one excess address marked");
    let m = marks[0];
    assert_eq!(
        node.node.release_ack.get(&m),
        Some(&ReleaseAck::ReadyForRelease)
    );
    let (t_mark, _) = rec.marks("node1")[0];
    assert_eq!(t_mark - t_del, secs(32), "cooldown 30 s + delay 2 s");
    assert_eq!(pool(&world, "node1"), 4);
    assert_eq!(source_calls(&world), calls, "not released yet");

    // use 3 again: the new pod takes the other free address, the mark is withdrawn
    world.schedule_pod(&n);
    advance(secs(10)).await;
    let node = ipam_node(&world, "node1");
    assert_eq!(node.node.used.len(), 3);
    assert!(
        !node.node.used.contains_key(&m),
        "the marked address was used"
    );
    assert!(
        node.operator.release.is_empty(),
        "mark withdrawn, not released"
    );
    assert!(node.node.release_ack.is_empty(), "answer dropped");
    assert_eq!(node.operator.addresses.total(), 4);
    assert!(node.operator.addresses.contains(&m));
    assert_eq!(world.source.owner(&m).as_deref(), Some("node1"));
    assert_eq!(
        source_calls(&world),
        calls,
        "nothing released, nothing claimed"
    );
    // only ever the one mark
    assert_eq!(rec.marks("node1").len(), 1);
    let s = world.manager.summary("node1").unwrap();
    assert_eq!((s.needed(), s.excess()), (0, 0));
    advance(secs(600)).await;
    assert_eq!(pool(&world, "node1"), 4);
    assert_eq!(source_calls(&world), calls);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// TestNodeManagerManyNodes: 100 nodes, pre 1, min 10: each reaches exactly 10; then the
/// aggregate stats show 100 nodes, none in deficit or at capacity, 1000 addresses.
#[tokio::test(start_paused = true)]
async fn many_nodes_each_reach_their_watermark() {
    let world = World::start(config(wm(1, 10, 0, 0))).unwrap();
    let names: Vec<_> = (0..100)
        .map(|i| world.add_node(&format!("node{i:03}")))
        .collect();
    // source budget 4/s, burst 20: 100 claims take about 20 s
    wait_until("every node at 10", secs(120), millis(500), || {
        names.iter().all(|n| pool(&world, n) == 10)
    })
    .await;
    world.manager.resync().await;
    advance(Duration::from_secs(5)).await;
    for n in &names {
        assert_eq!(pool(&world, n), 10, "{n}");
        assert_eq!(world.manager.summary(n).unwrap().needed(), 0, "{n}");
    }
    let st = world.manager.stats();
    assert_eq!(st.nodes, 100);
    assert_eq!(st.in_deficit, 0);
    assert_eq!(st.at_capacity, 0);
    assert_eq!(st.blocked, 0);
    assert_eq!(st.ips(tidepool_ipam::Family::V4).allocated, 1000);
    assert_eq!(st.ips(tidepool_ipam::Family::V4).needed, 0);
    assert_eq!(st.ips(tidepool_ipam::Family::V4).used, 0);
    assert_eq!(source_calls(&world), 100, "one claim per node");
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}
