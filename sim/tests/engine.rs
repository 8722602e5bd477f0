//! Engine scenarios on the simulated world: claims sized by waiting pods, leadership,
//! failure isolation and repair, and bad input. Pool sizes are read from the IPAMNode in
//! the store; every scenario ends with the observer's checks.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use parking_lot::Mutex;
use tidepool_ipam::ErrorClass;
use tidepool_ipam::IpamError;
use tidepool_ipam::MemoryPodView;
use tidepool_ipam::NodeUid;
use tidepool_ipam::{AddrSet, BackoffConfig};
use tidepool_ipam::{Api, Budget, SchedulingMode};
use tidepool_ipam::{Blocked, ConditionReason, ConditionType, EventReason};
use tidepool_ipam::{Clock, TokioClock};
use tidepool_ipam::{EngineConfig, EngineDeps, NodeManager};
use tidepool_ipam::{Family, IpamNode, NodeInfo, NodeName, PerFamily, WatermarkOverrides};
use tidepool_ipam::{Faults, Gate, IpSource, MemorySource, Quota, Ungated};
use tidepool_ipam::{MemoryNodeStore, NodeStore};
use tidepool_sim::World;
use tokio::sync::watch;

// ---------------------------------------------------------------------------------------
// Claims sized by demand (DESIGN.md: demand = used + waiting)
// ---------------------------------------------------------------------------------------

/// A fresh node with 30 pods waiting and pre-allocate 8 claims 38 addresses in one call.
#[tokio::test(start_paused = true)]
async fn fresh_node_with_30_waiting_pods_claims_38_in_one_call() {
    let world = World::start(config(wm(8, 0, 0, 0))).unwrap();
    let n = world.add_node("node1");
    // the pods are bound before the node's first pass runs
    schedule(&world, &n, 30);
    wait_until("30 pods running", secs(10), millis(10), || {
        used(&world, "node1") == 30
    })
    .await;
    assert_eq!(pool(&world, "node1"), 38);
    assert_eq!(source_calls(&world), 1, "one call for all 38");
    // and nothing more happens later
    advance(secs(600)).await;
    assert_eq!(pool(&world, "node1"), 38);
    assert_eq!(used(&world, "node1"), 30);
    assert_eq!(source_calls(&world), 1);
    assert_eq!(world.waiting(), 0);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// Pre-allocate 0 and min-allocate 0: nothing is held for an idle node, and waiting pods
/// are still served (the pool is exactly the number of pods); what they leave behind is
/// excess and goes back after the delay.
#[tokio::test(start_paused = true)]
async fn pre_allocate_zero_still_serves_waiting_pods() {
    let mut cfg = config(wm(0, 0, 0, 0));
    cfg.engine.release.delay = secs(10);
    let world = World::start(cfg).unwrap();
    let n = world.add_node("node1");
    advance(secs(30)).await;
    assert_eq!(pool(&world, "node1"), 0);
    assert_eq!(source_calls(&world), 0, "an idle node claims nothing");

    schedule(&world, &n, 5);
    wait_until("5 pods running", secs(10), millis(10), || {
        used(&world, "node1") == 5
    })
    .await;
    assert_eq!(pool(&world, "node1"), 5);
    assert_eq!(source_calls(&world), 1);

    advance(secs(5)).await;
    world.schedule_pod(&n);
    wait_until("6th pod running", secs(10), millis(10), || {
        used(&world, "node1") == 6
    })
    .await;
    assert_eq!(pool(&world, "node1"), 6);
    assert_eq!(source_calls(&world), 2);

    // two pods leave: after the 30 s cooldown and the 10 s delay their addresses go back
    delete_last(&world, "node1", 2);
    advance(secs(35)).await;
    assert_eq!(pool(&world, "node1"), 6, "not before the delay");
    wait_until("release to 4", secs(30), millis(100), || {
        pool(&world, "node1") == 4
    })
    .await;
    advance(secs(300)).await;
    assert_eq!(pool(&world, "node1"), 4);
    assert_eq!(used(&world, "node1"), 4);
    assert_eq!(source_calls(&world), 3);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

// ---------------------------------------------------------------------------------------
// Leadership
// ---------------------------------------------------------------------------------------

/// Without the lead: no source call, no operator write, whatever happens; with it: every
/// node served.
#[tokio::test(start_paused = true)]
async fn no_mutating_call_without_the_lead() {
    let world = World::start(config(wm(8, 0, 0, 0))).unwrap();
    world.leader.send(false).unwrap();
    let names: Vec<NodeName> = (0..3).map(|i| world.add_node(&format!("n{i}"))).collect();
    for (i, n) in names.iter().enumerate() {
        schedule(&world, n, i + 1);
    }
    advance(secs(300)).await; // five resyncs
    assert_eq!(source_calls(&world), 0);
    assert_eq!(world.store.operator_writes(), 0);
    assert!(world.store.list().is_empty());
    assert_eq!(world.waiting(), 6);

    world.leader.send(true).unwrap();
    wait_until("every pod served", secs(30), millis(100), || {
        world.waiting() == 0
    })
    .await;
    settle(&world, secs(60)).await;
    for (i, n) in names.iter().enumerate() {
        assert_eq!(pool(&world, n), 8 + i + 1, "{n}");
        assert_eq!(used(&world, n), i + 1, "{n}");
    }
    assert_eq!(source_calls(&world), 3);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// Losing the lead stops every mutating call at once; regaining it re-reads the store and
/// continues from what is there (the existing pools are kept, not claimed again).
#[tokio::test(start_paused = true)]
async fn lead_lost_and_regained() {
    let world = World::start(config(wm(8, 0, 0, 0))).unwrap();
    let a = world.add_node("a");
    let b = world.add_node("b");
    schedule(&world, &a, 2);
    settle(&world, secs(30)).await;
    assert_eq!((pool(&world, "a"), pool(&world, "b")), (10, 8));
    let (calls, writes) = (source_calls(&world), world.store.operator_writes());
    assert_eq!(calls, 2);

    world.leader.send(false).unwrap();
    advance(secs(1)).await;
    schedule(&world, &b, 12);
    world.add_node("c");
    advance(secs(300)).await;
    assert_eq!(source_calls(&world), calls, "no source call while deposed");
    assert_eq!(
        world.store.operator_writes(),
        writes,
        "no write while deposed"
    );
    assert_eq!(
        world.waiting(),
        4,
        "b's 8 free addresses served 8 of its 12 pods"
    );
    assert!(world.node("c").is_none());

    world.leader.send(true).unwrap();
    wait_until("every pod served", secs(30), millis(100), || {
        world.waiting() == 0
    })
    .await;
    settle(&world, secs(60)).await;
    assert_eq!(pool(&world, "a"), 10, "a kept its pool");
    assert_eq!(pool(&world, "b"), 20, "12 used + 8");
    assert_eq!(pool(&world, "c"), 8);
    assert_eq!(source_calls(&world), calls + 2, "b's top-up and c's claim");
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

// ---------------------------------------------------------------------------------------
// Failure isolation and repair
// ---------------------------------------------------------------------------------------

/// A source that fails every call for one node (and counts them) and otherwise is a
/// [`MemorySource`].
#[derive(Clone)]
struct FailFor {
    inner: MemorySource,
    bad: Arc<Mutex<BTreeSet<String>>>,
    calls: Arc<Mutex<BTreeMap<String, Vec<Duration>>>>,
    start: tokio::time::Instant,
}

impl FailFor {
    fn fails(&self, node: &NodeName) -> Option<IpamError> {
        self.calls
            .lock()
            .entry(node.to_string())
            .or_default()
            .push(self.start.elapsed());
        self.bad
            .lock()
            .contains(&**node)
            .then(|| IpamError::Source {
                op: "allocate",
                node: node.to_string(),
                class: ErrorClass::Transient,
                message: "injected".into(),
            })
    }
}

impl IpSource for FailFor {
    fn name(&self) -> tidepool_metrics::Source {
        self.inner.name()
    }
    fn families(&self) -> &[Family] {
        self.inner.families()
    }
    fn grant_size(&self, family: Family) -> u128 {
        self.inner.grant_size(family)
    }
    fn prepare_allocation(&self, node: &NodeName, family: Family, want: u64, limit: u64) -> u64 {
        self.inner.prepare_allocation(node, family, want, limit)
    }
    async fn allocate<G: Gate>(
        &self,
        node: &NodeName,
        family: Family,
        count: u64,
        gate: &mut G,
    ) -> Result<AddrSet, IpamError> {
        gate.request().await?;
        if let Some(e) = self.fails(node) {
            return Err(e);
        }
        // (its one request admitted above, the failure's too)
        self.inner.allocate(node, family, count, &mut Ungated).await
    }
    fn prepare_release(&self, node: &NodeName, free: &AddrSet, max: u64) -> AddrSet {
        self.inner.prepare_release(node, free, max)
    }
    async fn release<G: Gate>(
        &self,
        node: &NodeName,
        addrs: &AddrSet,
        gate: &mut G,
    ) -> Result<(), IpamError> {
        gate.request().await?;
        if let Some(e) = self.fails(node) {
            return Err(e);
        }
        self.inner.release(node, addrs, &mut Ungated).await
    }
    async fn describe(&self, node: &NodeName) -> Result<AddrSet, IpamError> {
        self.inner.describe(node).await
    }
    fn quota(&self) -> PerFamily<Quota> {
        self.inner.quota()
    }
}

fn node_info(name: &str, uid: u128) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        uid: NodeUid(uid),
        allocatable_pods: 250,
        cordoned: false,
        terminating: false,
    }
}

/// A manager over a source that fails every call for the nodes in `bad`; without jitter.
fn failing_manager(
    bad: &[&str],
) -> (
    NodeManager<FailFor, MemoryNodeStore, MemoryPodView>,
    FailFor,
    MemoryNodeStore,
    watch::Sender<bool>,
) {
    let source = FailFor {
        inner: MemorySource::new(&[Family::V4], PerFamily { v4: 1 << 20, v6: 0 }, 1),
        bad: Arc::new(Mutex::new(bad.iter().map(|s| s.to_string()).collect())),
        calls: Arc::default(),
        start: tokio::time::Instant::now(),
    };
    let store = MemoryNodeStore::new();
    let cfg = EngineConfig {
        backoff: BackoffConfig {
            jitter: false,
            ..BackoffConfig::default()
        },
        ..EngineConfig::default()
    };
    let (leader, leader_rx) = watch::channel(true);
    let mgr = NodeManager::new(
        EngineDeps {
            source: source.clone(),
            store: store.clone(),
            pods: MemoryPodView::new(Duration::ZERO),
            clock: Arc::new(TokioClock::new()) as Arc<dyn Clock>,
            source_budget: Budget::new(Api::Source, 4.0, 20, SchedulingMode::Priority).unwrap(),
            kube_budget: Budget::new(Api::Kube, 50.0, 100, SchedulingMode::Priority).unwrap(),
            leader: leader_rx,
        },
        cfg,
    )
    .unwrap();
    mgr.spawn_resync_loop();
    (mgr, source, store, leader)
}

/// One node whose every source call fails backs off alone: the nine others are served at
/// once and keep being served; its first retries follow the backoff (1 s, 2 s, 4 s, …
/// without jitter); once the source heals it is served too.
#[tokio::test(start_paused = true)]
async fn a_failing_node_backs_off_alone() {
    let (mgr, source, store, _leader) = failing_manager(&["bad"]);
    mgr.upsert_node(node_info("bad", 1));
    let good: Vec<String> = (0..9).map(|i| format!("good{i}")).collect();
    for (i, g) in good.iter().enumerate() {
        mgr.upsert_node(node_info(g, 10 + i as u128));
    }
    let pool_of = |n: &str| store.cached(n).map_or(0, |x| x.operator.addresses.total());
    advance(millis(500)).await;
    for g in &good {
        assert_eq!(pool_of(g), 8, "{g} served while bad fails");
    }
    assert_eq!(pool_of("bad"), 0);
    advance(secs(59)).await; // just before the first resync
    let attempts = source.calls.lock()["bad"].clone();
    let want: Vec<Duration> = [0, 1, 3, 7, 15, 31].into_iter().map(secs).collect();
    assert_eq!(attempts, want, "attempts follow the backoff");
    // a new node arriving while bad is backing off is served at once
    mgr.upsert_node(node_info("late", 99));
    advance(millis(100)).await;
    assert_eq!(pool_of("late"), 8);
    for g in &good {
        assert_eq!(source.calls.lock()[g.as_str()].len(), 1, "{g}: one claim");
    }
    let st = mgr.stats();
    assert_eq!((st.nodes, st.in_deficit), (11, 1));

    // the source heals: a later retry serves it
    source.bad.lock().clear();
    advance(secs(120)).await;
    assert_eq!(pool_of("bad"), 8);
    let st = mgr.stats();
    assert_eq!((st.nodes, st.in_deficit), (11, 0));
    mgr.shutdown();
}

/// BUG (see the report): the periodic resync triggers a node that is backing off, so a
/// persistently failing node is retried at least once a minute whatever its backoff says
/// (its backoff max of 5 m, or a throttled call's Retry-After, never take effect).
/// Expected without jitter: attempts at 0, 1, 3, 7, 15, 31, 63, 127, 255, 511 s in 10 m.
#[tokio::test(start_paused = true)]
async fn the_resync_does_not_cut_a_backoff_short() {
    let (mgr, source, _store, _leader) = failing_manager(&["bad"]);
    mgr.upsert_node(node_info("bad", 1));
    advance(secs(600)).await;
    let attempts = source.calls.lock()["bad"].clone();
    let want: Vec<Duration> = [0, 1, 3, 7, 15, 31, 63, 127, 255, 511]
        .into_iter()
        .map(secs)
        .collect();
    assert_eq!(
        attempts, want,
        "the failing node's attempts follow its backoff"
    );
    mgr.shutdown();
}

/// Every source call fails for a while (world-wide): nodes back off; a node added after the
/// source heals is served at once while the first one still waits out its backoff; then
/// everything settles and the observer sees nothing wrong.
#[tokio::test(start_paused = true)]
async fn source_errors_back_off_then_settle() {
    let mut cfg = config(wm(8, 0, 0, 0));
    cfg.engine.backoff.jitter = false;
    cfg.faults = Faults {
        error_rate: 1.0,
        ..Faults::default()
    };
    let world = World::start(cfg).unwrap();
    let a = world.add_node("a");
    schedule(&world, &a, 3);
    advance(secs(20)).await;
    // attempts at 0, 1, 3, 7, 15 s; the next at 31 s
    assert_eq!(source_calls(&world), 5);
    assert_eq!(pool(&world, "a"), 0);
    assert_eq!(world.waiting(), 3);
    assert_eq!(world.manager.summary("a").unwrap().needed(), 11);

    world.source.set_faults(Faults::default());
    let b = world.add_node("b");
    schedule(&world, &b, 2);
    advance(millis(500)).await;
    assert_eq!(pool(&world, "b"), 10, "b served at once");
    assert_eq!(pool(&world, "a"), 0, "a still backing off");
    assert_eq!(world.waiting(), 3);

    advance(secs(11)).await; // 31.5 s: a's retry
    assert_eq!(pool(&world, "a"), 11);
    assert_eq!(world.waiting(), 0);
    settle(&world, secs(60)).await;
    assert_eq!(source_calls(&world), 7, "5 failed + a's + b's");
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// Operator writes fail after the claims took effect: the addresses are not lost, the
/// next pass finds them through describe and does not claim again.
#[tokio::test(start_paused = true)]
async fn failed_writes_are_repaired_without_a_second_claim() {
    let world = World::start(config(wm(8, 0, 0, 0))).unwrap();
    world.store.fail_next_operator_writes(4);
    let names: Vec<NodeName> = (0..3).map(|i| world.add_node(&format!("n{i}"))).collect();
    schedule(&world, &names[0], 4);
    settle(&world, secs(120)).await;
    wait_until("every pod served", secs(60), millis(100), || {
        world.waiting() == 0
    })
    .await;
    assert_eq!(pool(&world, "n0"), 12);
    assert_eq!(pool(&world, "n1"), 8);
    assert_eq!(pool(&world, "n2"), 8);
    assert_eq!(
        source_calls(&world),
        3,
        "one claim per node, repaired by describe"
    );
    assert_eq!(
        world.store.operator_writes(),
        2 * 7,
        "4 failed writes + one good one per node, each a create: a POST and a status apply"
    );
    assert_pools_match_source(&world);
    let st = world.manager.stats();
    assert_eq!(
        (st.nodes, st.in_deficit, st.ips(Family::V4).allocated),
        (3, 0, 28)
    );
    assert_finish_clean(&world);
}

/// Every reply is lost (the calls take effect, the answers do not come back): claims and
/// releases are both repaired through describe, no address is lost, and with the faults
/// gone the world settles with every pool equal to what the source granted.
#[tokio::test(start_paused = true)]
async fn lost_replies_are_repaired_through_describe() {
    let mut cfg = config(wm(4, 0, 0, 0));
    cfg.engine.release.delay = secs(5);
    cfg.faults = Faults {
        lost_reply_rate: 1.0,
        ..Faults::default()
    };
    let world = World::start(cfg).unwrap();
    let names: Vec<NodeName> = (0..3).map(|i| world.add_node(&format!("n{i}"))).collect();
    for (i, n) in names.iter().enumerate() {
        schedule(&world, n, 2 * (i + 1));
    }
    wait_until("every pod served", secs(60), millis(100), || {
        world.waiting() == 0
    })
    .await;
    advance(secs(10)).await;
    for (i, n) in names.iter().enumerate() {
        assert_eq!(pool(&world, n), 4 + 2 * (i + 1), "{n}");
    }
    assert_eq!(source_calls(&world), 3, "each claim took effect once");
    assert_pools_match_source(&world);

    // n2's 6 pods go (clean): after the cooldown and the delay, 6 are excess; the release
    // takes effect, its reply is lost, describe shows it done.
    delete_last(&world, "n2", 6);
    wait_until("n2 back to 4", secs(120), millis(100), || {
        pool(&world, "n2") == 4
    })
    .await;
    assert_eq!(granted_to(&world, "n2").len(), 4);
    advance(secs(10)).await;
    assert!(ipam_node(&world, "n2").operator.release.is_empty());
    assert!(ipam_node(&world, "n2").node.release_ack.is_empty());
    assert_eq!(source_calls(&world), 4, "one release, not retried");

    // a mixed phase at 50 % lost replies, then the faults stop
    world.source.set_faults(Faults {
        lost_reply_rate: 0.5,
        ..Faults::default()
    });
    for round in 0..6 {
        for (i, n) in names.iter().enumerate() {
            if (round + i) % 2 == 0 {
                schedule(&world, n, 3);
            } else {
                delete_last(&world, n, 2);
            }
        }
        advance(secs(20)).await;
    }
    world.source.set_faults(Faults::default());
    advance(secs(120)).await;
    settle(&world, secs(300)).await;
    assert_eq!(world.waiting(), 0);
    assert_pools_match_source(&world);
    for n in &names {
        let s = world.manager.summary(n).unwrap();
        assert!(s.at_target(), "{n}: {s:?}");
        assert_eq!(
            pool(&world, n),
            used(&world, n) + 4,
            "{n}: used + pre-allocate"
        );
    }
    assert_finish_clean(&world);
}

// ---------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------

/// A node whose overrides set min-allocate above max-allocate gets a condition and one
/// event and no address; the others are served; fixing the spec serves it.
#[tokio::test(start_paused = true)]
async fn invalid_watermark_override_blocks_only_that_node() {
    let world = World::start(config(wm(8, 0, 0, 0))).unwrap();
    let good = world.add_node("good");
    // The user's IPAMNode exists before the Node is seen, with bad overrides. World gives
    // node UIDs 2, 3, … in the order nodes are added: "bad" is the second.
    let mut obj = IpamNode::new("bad".into(), NodeUid(3));
    obj.watermarks = WatermarkOverrides {
        min_allocate: Some(10),
        max_allocate: Some(4),
        ..Default::default()
    };
    world.store.create(obj);
    let bad = world.add_node("bad");
    schedule(&world, &good, 2);
    schedule(&world, &bad, 2);
    advance(secs(300)).await;

    let node = ipam_node(&world, "bad");
    assert_eq!(node.node_uid, NodeUid(3), "the test's UID guess");
    assert_eq!(
        node.operator.addresses.total(),
        0,
        "no address for a bad spec"
    );
    assert_eq!(granted_to(&world, "bad").len(), 0);
    let cond: Vec<_> = node
        .operator
        .conditions
        .iter()
        .filter(|c| c.type_ == ConditionType::WatermarksValid)
        .collect();
    assert_eq!(cond.len(), 1, "conditions: {:?}", node.operator.conditions);
    assert!(!cond[0].status);
    assert_eq!(cond[0].reason, ConditionReason::InvalidWatermarks);
    assert!(
        cond[0].message.contains("min_allocate"),
        "{}",
        cond[0].message
    );
    assert_eq!(
        world.store.event_count(EventReason::InvalidWatermarks),
        1,
        "one event, no retries"
    );
    assert_eq!(
        world.manager.summary("bad").unwrap().blocked,
        Some(Blocked::InvalidSpec)
    );
    assert_eq!(pool(&world, "good"), 10);
    assert_eq!(used(&world, "good"), 2);
    assert_eq!(world.waiting(), 2, "bad's pods wait");
    assert_eq!(source_calls(&world), 1);

    // the user fixes the spec: served, condition gone
    world.set_watermarks(
        &bad,
        WatermarkOverrides {
            min_allocate: Some(4),
            max_allocate: Some(10),
            ..Default::default()
        },
    );
    wait_until("bad served", secs(30), millis(100), || world.waiting() == 0).await;
    settle(&world, secs(60)).await;
    let node = ipam_node(&world, "bad");
    assert_eq!(
        node.operator.addresses.total(),
        10,
        "2 used + pre 8, cap 10"
    );
    assert!(
        node.operator
            .conditions
            .iter()
            .all(|c| c.type_ != ConditionType::WatermarksValid),
        "condition cleared"
    );
    assert_eq!(world.store.event_count(EventReason::InvalidWatermarks), 1);
    assert_eq!(world.manager.summary("bad").unwrap().blocked, None);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// The engine refuses bad global watermarks up front, naming the field; the world does not
/// start and nothing panics.
#[tokio::test(start_paused = true)]
async fn invalid_global_watermarks_are_refused() {
    let err = World::start(config(wm(8, 30, 20, 0)))
        .err()
        .expect("refused");
    match &err {
        IpamError::InvalidWatermarks { field, .. } => assert_eq!(*field, "min_allocate"),
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("min_allocate"));
}

/// The incremental stats match the objects in the store after a busy start, and every
/// node ends at its watermark: pre 2, min 5, max-above 1.
#[tokio::test(start_paused = true)]
async fn stats_match_the_store() {
    let mut cfg = config(wm(2, 5, 0, 1));
    cfg.engine.release.delay = secs(5);
    let world = World::start(cfg).unwrap();
    let names: Vec<NodeName> = (0..21)
        .map(|i| world.add_node(&format!("n{i:02}")))
        .collect();
    for (i, n) in names.iter().enumerate() {
        schedule(&world, n, i % 7);
    }
    wait_until("every pod served", secs(60), millis(100), || {
        world.waiting() == 0
    })
    .await;
    settle(&world, secs(300)).await;
    let st = world.manager.stats();
    let allocated: usize = names.iter().map(|n| pool(&world, n)).sum();
    let in_use: usize = names.iter().map(|n| used(&world, n)).sum();
    assert_eq!(st.ips(Family::V4).allocated, allocated as i128);
    assert_eq!(st.ips(Family::V4).used, in_use as i128);
    assert_eq!(in_use, 3 * (1 + 2 + 3 + 4 + 5 + 6));
    assert_eq!((st.nodes, st.in_deficit, st.releasing), (21, 0, 0));
    // the stable pool per pod count: max(used + pre, min + max-above) when no excess
    // remains (5 pods: 7 needed + 1 above = 8, excess 8 − 5 − 2 − 1 = 0)
    let want = [6, 6, 6, 6, 6, 8, 9];
    for (i, n) in names.iter().enumerate() {
        assert_eq!(pool(&world, n), want[i % 7], "{n} with {} pods", i % 7);
    }
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// BUG (see the report): a claim of `needed + max_above_watermark` can itself be excess by
/// Cilium's current excess formula, so the engine claims and, after the delay, releases
/// again. pre 2, min 5, max-above 1, 4 pods: needed = 2 + 4 = 6 → claim 7; then
/// excess(7, 4) = 7 − (5 + 1) = 1 (the "used + pre ≤ min + above" branch) → one address
/// goes back: two wasted source calls for one node start. The claim should stop where the
/// excess formula would start counting (6 here).
#[tokio::test(start_paused = true)]
async fn a_claim_is_never_excess_right_after() {
    let mut cfg = config(wm(2, 5, 0, 1));
    cfg.engine.release.delay = secs(5);
    let world = World::start(cfg).unwrap();
    let rec = Recorder::start(&world);
    let n = world.add_node("node1");
    schedule(&world, &n, 4);
    advance(secs(300)).await;
    assert_eq!(used(&world, "node1"), 4);
    assert_eq!(pool(&world, "node1"), 6);
    assert_eq!(
        rec.marks("node1"),
        vec![],
        "nothing claimed only to be released"
    );
    assert_eq!(source_calls(&world), 1, "one claim, no release");
    assert_finish_clean(&world);
}

// ---------------------------------------------------------------------------------------
// Caps and blocked nodes
// ---------------------------------------------------------------------------------------

/// A cordoned node gets no new addresses (its free ones still serve pods); it counts as
/// blocked, hence settled; uncordoned, it is topped up.
#[tokio::test(start_paused = true)]
async fn a_cordoned_node_gets_nothing_new() {
    let world = World::start(config(wm(8, 0, 0, 0))).unwrap();
    let n = world.add_node("node1");
    settle(&world, secs(10)).await;
    assert_eq!(pool(&world, "node1"), 8);
    let uid = ipam_node(&world, "node1").node_uid;
    let mut info = node_info("node1", uid.0);
    info.cordoned = true;
    world.manager.upsert_node(info.clone());
    schedule(&world, &n, 10);
    advance(secs(120)).await;
    assert_eq!(pool(&world, "node1"), 8);
    assert_eq!(used(&world, "node1"), 8);
    assert_eq!(world.waiting(), 2);
    assert_eq!(source_calls(&world), 1);
    let s = world.manager.summary("node1").unwrap();
    assert_eq!(s.blocked, Some(Blocked::Cordoned));
    assert!(s.settled());

    info.cordoned = false;
    world.manager.upsert_node(info);
    wait_until("served once uncordoned", secs(10), millis(100), || {
        world.waiting() == 0
    })
    .await;
    assert_eq!(pool(&world, "node1"), 18);
    assert_eq!(source_calls(&world), 2);
    assert_finish_clean(&world);
}

/// max-allocate is a hard cap: pre 8, max 20, 25 pods → 20 addresses, 5 pods wait, the
/// node is blocked at its cap and counted at capacity.
#[tokio::test(start_paused = true)]
async fn max_allocate_is_a_hard_cap() {
    let world = World::start(config(wm(8, 0, 20, 0))).unwrap();
    let n = world.add_node("node1");
    schedule(&world, &n, 25);
    advance(secs(60)).await;
    assert_eq!(pool(&world, "node1"), 20);
    assert_eq!(used(&world, "node1"), 20);
    assert_eq!(world.waiting(), 5);
    assert_eq!(source_calls(&world), 1);
    let s = world.manager.summary("node1").unwrap();
    assert_eq!(s.blocked, Some(Blocked::AtCap));
    assert_eq!(world.manager.stats().at_capacity, 1);
    advance(secs(600)).await;
    assert_eq!(pool(&world, "node1"), 20);
    assert_eq!(source_calls(&world), 1);
    assert_finish_clean(&world);
}

/// An exhausted source parks the node that cannot get enough (no polling); a release
/// elsewhere wakes it and it is topped up.
#[tokio::test(start_paused = true)]
async fn an_exhausted_node_waits_for_a_release() {
    let mut cfg = config(wm(8, 0, 0, 0));
    cfg.capacity = PerFamily { v4: 20, v6: 0 };
    cfg.engine.release.delay = secs(5);
    let world = World::start(cfg).unwrap();
    let a = world.add_node("a");
    schedule(&world, &a, 10);
    advance(secs(1)).await;
    assert_eq!(pool(&world, "a"), 18);
    world.add_node("b");
    advance(secs(5)).await;
    assert_eq!(pool(&world, "b"), 2, "what was left");
    assert_eq!(world.source.quota().v4.free, 0);
    let s = world.manager.summary("b").unwrap();
    assert_eq!(s.needed(), 6);
    assert_eq!(
        s.blocked,
        Some(Blocked::Exhausted),
        "BUG (see the report): after a partial grant the node is neither blocked nor \
         parked until the next resync looks at it again"
    );
    let calls = source_calls(&world);
    advance(secs(300)).await;
    assert_eq!(source_calls(&world), calls, "no polling while parked");
    assert_eq!(pool(&world, "b"), 2);

    // a's pods go: after the cooldown (30 s) and the delay (5 s) a gives 10 back, b wakes
    delete_last(&world, "a", 10);
    wait_until("b topped up", secs(120), millis(100), || {
        pool(&world, "b") == 8
    })
    .await;
    advance(secs(10)).await;
    assert_eq!(pool(&world, "a"), 8);
    assert_eq!(pool(&world, "b"), 8);
    assert_eq!(world.source.quota().v4.free, 4);
    assert_eq!(world.manager.summary("b").unwrap().blocked, None);
    assert_pools_match_source(&world);
    assert_finish_clean(&world);
}

/// A node deleted while its pass keeps a place in the source budget's queue (its wait was
/// cut short by the deletion) drops that place before its whole-node release waits for a
/// token: the place, polled by nobody, could hold the queue's dispatcher role, the release
/// waited behind it, and every other node's calls stalled with them.
#[tokio::test(start_paused = true)]
async fn a_node_deleted_while_it_keeps_a_queue_place_stalls_nobody() {
    let mut cfg = config(wm(2, 0, 0, 0));
    cfg.source_qps = 0.2;
    cfg.source_burst = 1;
    cfg.engine.node_reclaim_grace = Duration::ZERO;
    let world = World::start(cfg).unwrap();
    // n1 gets its first addresses (the one free token), then needs more while n2 and n3
    // queue behind it: its place is the oldest, the dispatcher
    let n1 = world.add_node("n1");
    schedule(&world, &n1, 1);
    wait_until("n1 served", secs(30), millis(100), || {
        used(&world, "n1") == 1
    })
    .await;
    schedule(&world, &n1, 10);
    advance(millis(500)).await;
    let others: Vec<_> = ["n2", "n3"].iter().map(|n| world.add_node(n)).collect();
    for n in &others {
        schedule(&world, n, 2);
    }
    advance(millis(500)).await;
    // the machine goes, then its Node object (a node loss)
    world.vanish_machine(&n1);
    world.delete_node_object(&n1);
    wait_until("n2 and n3 served", secs(300), millis(100), || {
        used(&world, "n2") == 2 && used(&world, "n3") == 2
    })
    .await;
    assert_finish_clean(&world);
}
