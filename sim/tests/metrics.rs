//! The engine's capacity and waiting metrics on the simulated world, checked against the
//! world's own bookkeeping: `tidepool_ipam_pods_waiting`, `tidepool_ipam_pod_ip_wait_seconds`,
//! `tidepool_ipam_node_ips` (`--per-node-metrics`, a deleted node's series leaving a real
//! exporter), `tidepool_ipam_pool_blocks` and the pools' idle addresses. Each test records
//! into a recorder of its own (the tests' runtimes are single-threaded, so the thread's
//! default recorder sees every task).
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tidepool_ipam::{BlockStore, NodeName, PerFamily};
use tidepool_metrics as m;
use tidepool_sim::World;

/// Every series of the snapshot: (name, sorted labels) → value.
type Series = BTreeMap<(String, Vec<(String, String)>), DebugValue>;

fn series(snap: &Snapshotter) -> Series {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .map(|(ck, _, _, v)| {
            let (_, key) = ck.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            ((key.name().to_string(), labels), v)
        })
        .collect()
}

/// The gauge `name` with exactly these labels.
fn gauge(s: &Series, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    want.sort();
    match s.get(&(name.to_string(), want))? {
        DebugValue::Gauge(g) => Some(g.into_inner()),
        other => panic!("{name} is not a gauge: {other:?}"),
    }
}

/// The samples of the histogram `name` (no labels) recorded since the last snapshot.
fn samples(s: &Series, name: &str) -> Vec<f64> {
    match s.get(&(name.to_string(), Vec::new())) {
        Some(DebugValue::Histogram(v)) => v.iter().map(|x| x.into_inner()).collect(),
        Some(other) => panic!("{name} is not a histogram: {other:?}"),
        None => Vec::new(),
    }
}

/// Asserts that each of the operator's samples is within its observation lag of the wait
/// the world measured (from the bind to the node side's ADD), pod for pod in order of size.
fn assert_waits_match(ours: &[f64], theirs: &[f64]) {
    let (mut ours, mut theirs) = (ours.to_vec(), theirs.to_vec());
    ours.sort_by(f64::total_cmp);
    theirs.sort_by(f64::total_cmp);
    assert_eq!(
        ours.len(),
        theirs.len(),
        "operator {ours:?} vs world {theirs:?}"
    );
    for (o, t) in ours.iter().zip(&theirs) {
        // the operator starts at its first look (after the bind) and ends when it sees the
        // used entry (after the ADD): within a second of the world's measure
        assert!(
            (o - t).abs() <= 1.0,
            "operator {ours:?} vs world {theirs:?}"
        );
    }
}

/// A source of 4 IPv4 addresses with 2 s per call, pre-allocate 0, and 10 pods on one node:
/// 4 get an address after waiting for the claim, 6 wait. The gauge counts the 6 (and no
/// IPv6 waits on an IPv4-only node, though every pod lacks an IPv6 address); the histogram
/// holds one sample per served pod, each matching the wait the world measured. Then the 4
/// running pods are deleted: 4 waiting pods get their addresses after the cooldown, 2 wait.
#[tokio::test(start_paused = true)]
async fn pods_waiting_and_their_wait_match_the_worlds_count() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let _guard = metrics::set_default_local_recorder(&rec);
    let mut cfg = config(wm(0, 0, 0, 0));
    cfg.capacity = PerFamily { v4: 4, v6: 4 };
    cfg.source_latency = secs(2);
    let world = World::start(cfg).unwrap();
    world.start_measuring();
    let n = world.add_node("node1");
    schedule(&world, &n, 10);
    wait_until("4 pods running", secs(30), millis(10), || {
        used(&world, "node1") == 4
    })
    .await;
    // the gauge is published at each resync (every minute)
    advance(secs(65)).await;
    assert_eq!(world.waiting(), 6, "the world's own count");
    let s = series(&snap);
    // a source without pools: the `pool` label is empty
    let no_pool = |family| [("family", family), ("pool", "")];
    assert_eq!(gauge(&s, m::PODS_WAITING, &no_pool("ipv4")), Some(6.0));
    assert_eq!(
        gauge(&s, m::PODS_WAITING, &no_pool("ipv6")),
        None,
        "the node serves no IPv6: no series of it"
    );
    let mut ours = samples(&s, m::POD_IP_WAIT_SECONDS);
    let theirs = world.workload_stats().wait_seconds;
    assert_eq!(theirs.len(), 4, "only started pods have a wait: {theirs:?}");
    assert!(
        theirs.iter().all(|t| *t >= 2.0),
        "the claim takes 2 s: {theirs:?}"
    );
    assert_waits_match(&ours, &theirs);

    // the running pods go: after the cooldown their addresses serve 4 of the waiting pods
    let running: Vec<_> = ipam_node(&world, "node1")
        .node
        .used
        .values()
        .map(|e| e.pod_uid)
        .collect();
    for uid in running {
        world.delete_pod(uid, false);
    }
    wait_until("4 more pods running", secs(120), millis(100), || {
        world.waiting() == 2 && used(&world, "node1") == 4
    })
    .await;
    advance(secs(65)).await;
    let s = series(&snap);
    assert_eq!(gauge(&s, m::PODS_WAITING, &no_pool("ipv4")), Some(2.0));
    ours.extend(samples(&s, m::POD_IP_WAIT_SECONDS));
    let theirs = world.workload_stats().wait_seconds;
    assert_eq!(theirs.len(), 8);
    assert!(
        theirs.iter().filter(|t| **t >= 30.0).count() == 4,
        "4 waited for the cooldown: {theirs:?}"
    );
    assert_waits_match(&ours, &theirs);
    world.shutdown();
}

/// The per-node gauges of one node at each state, family IPv4.
fn node_ips(s: &Series, node: &str) -> BTreeMap<&'static str, f64> {
    m::ips_state::ALL
        .iter()
        .filter_map(|state| {
            gauge(
                s,
                m::NODE_IPS,
                &[("node", node), ("family", "ipv4"), ("state", state)],
            )
            .map(|v| (*state, v))
        })
        .collect()
}

/// Without --per-node-metrics no node series exists; with it, each node's series show its
/// IPAMNode's pool and used counts and its free, needed and excess addresses.
#[tokio::test(start_paused = true)]
async fn node_ips_follow_each_node_only_with_per_node_metrics() {
    for on in [false, true] {
        let rec = DebuggingRecorder::new();
        let snap = rec.snapshotter();
        let _guard = metrics::set_default_local_recorder(&rec);
        let mut cfg = config(wm(8, 0, 0, 0));
        cfg.engine.per_node_metrics = on;
        let world = World::start(cfg).unwrap();
        let a = world.add_node("node-a");
        world.add_node("node-b");
        schedule(&world, &a, 5);
        wait_until("5 pods running", secs(30), millis(10), || {
            used(&world, "node-a") == 5
        })
        .await;
        advance(secs(65)).await;
        let s = series(&snap);
        if !on {
            assert!(
                s.keys().all(|(name, _)| name != m::NODE_IPS),
                "no per-node series without the flag"
            );
            world.shutdown();
            continue;
        }
        for (node, pods) in [("node-a", 5.0), ("node-b", 0.0)] {
            let got = node_ips(&s, node);
            let pool = pool(&world, node) as f64;
            assert_eq!(got["allocated"], pool, "{node}: {got:?}");
            assert_eq!(got["used"], pods, "{node}: {got:?}");
            assert_eq!(got["free"], pool - pods, "{node}: {got:?}");
            assert_eq!(got["free"], 8.0, "pre-allocate 8 kept free: {got:?}");
            assert_eq!((got["needed"], got["excess"]), (0.0, 0.0), "{got:?}");
            assert_eq!(got["cooldown"], 0.0, "{got:?}");
        }
        world.shutdown();
    }
}

/// A deleted node's series leave a real exporter (gauge idle timeout, 1 s here), while the
/// live node's, set again at each resync, stay: the mechanism behind --per-node-metrics.
#[tokio::test(start_paused = true)]
async fn a_deleted_nodes_series_leave_the_export() {
    let recorder = m::prometheus_builder_with(Some(Duration::from_secs(1)))
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let mut cfg = config(wm(8, 0, 0, 0));
    cfg.engine.per_node_metrics = true;
    cfg.engine.node_reclaim_grace = secs(10);
    let world = World::start(cfg).unwrap();
    world.add_node("live");
    let gone = world.add_node("gone");
    advance(secs(65)).await;
    let text = handle.render();
    for node in ["live", "gone"] {
        assert!(
            text.contains(&format!("node=\"{node}\"")),
            "{node}:\n{text}"
        );
    }
    world.vanish_machine(&gone);
    world.delete_node_object(&gone);
    // resync after resync (virtual minutes, real milliseconds), until the deleted node's
    // series expired in real time, bounded
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        advance(secs(60)).await;
        let text = handle.render();
        if !text.contains("node=\"gone\"") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still exported:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(world.node("gone").is_none(), "its IPAMNode is gone too");
    assert!(text.contains("node=\"live\""), "{text}");
    world.shutdown();
}

/// Schedules `n` pods on `node` (which runs none yet) and waits until they all run.
async fn run_pods(world: &World<Pool>, node: &NodeName, n: usize) {
    for _ in 0..n {
        world.schedule_pod(node);
    }
    wait_until("the pods running", secs(30), millis(10), || {
        world.node(node).is_some_and(|i| i.node.used.len() == n)
    })
    .await;
}

/// Claimed blocks by fill, per pool: computed by the repair pass of each resync; checked
/// against the blocks the world's store holds and the pods whose address lies in each.
#[tokio::test(start_paused = true)]
async fn pool_blocks_count_full_partial_and_empty_blocks() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let _guard = metrics::set_default_local_recorder(&rec);
    // pre-allocate 16 on /28 blocks: 20 pods fill one block, part of a second, and the
    // rest of the 36 addresses makes blocks that are partly used or empty
    let world = pool_world(config(wm(16, 0, 0, 0)), &["10.0.0.0/24"], Duration::ZERO);
    let a = world.add_node("node-a");
    world.add_node("node-b");
    run_pods(&world, &a, 20).await;
    advance(secs(65)).await;
    let mut want = BTreeMap::from([("full", 0.0), ("partial", 0.0), ("empty", 0.0)]);
    let mut blocks = 0;
    for node in ["node-a", "node-b"] {
        for b in world.store.blocks_of(node) {
            blocks += 1;
            let usable = world.source.block_addresses(&b).total();
            let pods = pods_in(&world, node, &b.cidr).len() as u128;
            let state = match pods {
                0 => "empty",
                p if p == usable => "full",
                _ => "partial",
            };
            *want.get_mut(state).unwrap() += 1.0;
        }
    }
    assert!(
        blocks >= 4,
        "node-a needs 36 addresses, node-b 16: {blocks} blocks"
    );
    assert!(want["empty"] >= 1.0, "node-b's block is empty: {want:?}");
    let s = series(&snap);
    for (state, n) in &want {
        assert_eq!(
            gauge(
                &s,
                m::POOL_BLOCKS,
                &[("pool", "default"), ("family", "ipv4"), ("state", state)]
            ),
            Some(*n),
            "{state}: want {want:?}"
        );
    }
    world.shutdown();
}

/// The pool's idle addresses (`tidepool_ipam_pool_ips{state="idle"}`, what the exhaustion
/// forecast adds to the free ones) are those of the empty blocks none of whose addresses
/// cools down: a block whose pods all went (with a DEL) counts as empty at once, as idle only
/// once its cooldown ended. Checked against the world's blocks, pods and cooldowns; the
/// watermarks (pre-allocate 48, up to 256 above it: the node claims the whole /24) keep
/// every block on the node, none of them excess once the pods are gone.
#[tokio::test(start_paused = true)]
async fn idle_addresses_wait_for_the_cooldown_of_empty_blocks() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let _guard = metrics::set_default_local_recorder(&rec);
    let mut cfg = config(wm(48, 0, 0, 256));
    cfg.reuse_cooldown = secs(300);
    let world = pool_world(cfg, &["10.0.0.0/24"], Duration::ZERO);
    let a = world.add_node("node-a");
    run_pods(&world, &a, 20).await;
    // as the world has them: the blocks' usable addresses, the empty blocks and the
    // addresses of those with nothing cooling
    let counted = || {
        let node = world.node("node-a").expect("node-a's IPAMNode");
        let (mut usable, mut empty, mut idle) = (0.0, 0.0, 0.0);
        for b in world.store.blocks_of("node-a") {
            let n = world.source.block_addresses(&b).total() as f64;
            usable += n;
            if pods_in(&world, "node-a", &b.cidr).is_empty() {
                empty += 1.0;
                // an ended cooldown is over, whether or not the node side dropped it yet
                let utc = tidepool_ipam::Clock::utc(&*world.clock);
                if !node.node.cooling(utc).any(|c| b.cidr.contains(c)) {
                    idle += n;
                }
            }
        }
        (usable, empty, idle)
    };
    // as exported: the empty blocks and the idle addresses
    let exported = || {
        let s = series(&snap);
        let of = |name, state| {
            let labels = [("pool", "default"), ("family", "ipv4"), ("state", state)];
            gauge(&s, name, &labels)
        };
        (of(m::POOL_BLOCKS, "empty"), of(m::POOL_IPS, "idle"))
    };
    advance(secs(65)).await;
    let (usable, empty, idle) = counted();
    assert_eq!(usable, 254.0, "the whole pool: {usable}");
    assert!(idle > 0.0, "the pods leave some block empty: {idle}");
    assert_eq!(exported(), (Some(empty), Some(idle)));
    // every pod goes: every block is empty, those that held pods cool down
    for uid in world.pods_on("node-a") {
        world.delete_pod(uid, false);
    }
    advance(secs(65)).await;
    let (now_usable, all_empty, cooling) = counted();
    assert_eq!(now_usable, usable, "every block kept");
    assert!(
        cooling < usable,
        "some block cools down: {cooling} of {usable}"
    );
    assert_eq!(exported(), (Some(all_empty), Some(cooling)));
    // once the cooldowns end, every address is idle
    advance(secs(330)).await;
    assert_eq!(counted(), (usable, all_empty, usable));
    assert_eq!(exported(), (Some(all_empty), Some(usable)));
    world.shutdown();
}

/// The gauges a person watches follow each change, not only the resync: with an hour
/// between resyncs, pods waiting, nodes in deficit and the pool's free addresses are right
/// as soon as the engine acted (a /28 pool, one block of 14 usable addresses: 14 pods run, 6
/// wait), and again once pods go and the waiting ones get their addresses. Read from a real
/// exporter's recorder (the debugging recorder's snapshot zeroes the gauges it reads).
#[tokio::test(start_paused = true)]
async fn watched_gauges_follow_each_change_before_the_resync() {
    let recorder = m::prometheus_builder().unwrap().build_recorder();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let mut cfg = config(wm(0, 0, 0, 0));
    cfg.engine.resync_interval = secs(3600);
    let world = pool_world(cfg, &["10.0.0.0/28"], Duration::ZERO);
    let n = world.add_node("node1");
    let pods: Vec<_> = (0..20).map(|_| world.schedule_pod(&n)).collect();
    let used = || world.node("node1").map_or(0, |n| n.node.used.len());
    let exported = |series: &str| {
        let text = handle.render();
        text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
    };
    let waiting = || exported("tidepool_ipam_pods_waiting{family=\"ipv4\",pool=\"default\"}");
    let in_deficit = || exported("tidepool_ipam_nodes{category=\"in-deficit\"}");
    let pool_free =
        || exported("tidepool_ipam_pool_ips{pool=\"default\",family=\"ipv4\",state=\"free\"}");
    // each wait is bounded far below the resync interval: no resync runs in this test
    wait_until("14 pods running, 6 waiting", secs(60), millis(100), || {
        used() == 14 && world.waiting() == 6
    })
    .await;
    assert_eq!(waiting(), Some(6.0), "{}", handle.render());
    assert_eq!(in_deficit(), Some(1.0));
    assert_eq!(pool_free(), Some(0.0), "the pool's one block is claimed");
    // pods go: the waiting ones get their addresses after the cooldown, and the gauges
    // follow
    for uid in pods.iter().take(8) {
        world.delete_pod(*uid, false);
    }
    wait_until("nobody waits", secs(600), millis(100), || {
        world.waiting() == 0
    })
    .await;
    wait_until("the gauges follow", secs(60), millis(100), || {
        waiting() == Some(0.0) && in_deficit() == Some(0.0)
    })
    .await;
    world.shutdown();
}

/// `tidepool_ipam_pool_exhaustion_seconds`: +Inf while the pool does not shrink; once pods
/// take 16 of its addresses a minute, about what is left over that pace (its line through
/// the samples of each resync: unit tests in `ipam::pool::forecast`).
#[tokio::test(start_paused = true)]
async fn the_exhaustion_estimate_follows_the_pools_pace() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let _guard = metrics::set_default_local_recorder(&rec);
    let world = pool_world(config(wm(0, 0, 0, 0)), &["10.0.0.0/24"], Duration::ZERO);
    let a = world.add_node("node-a");
    let runway = || {
        let labels = [("pool", "default"), ("family", "ipv4")];
        gauge(&series(&snap), m::POOL_EXHAUSTION_SECONDS, &labels)
    };
    advance(secs(130)).await;
    assert_eq!(runway(), Some(f64::INFINITY), "nothing used: not shrinking");
    for _ in 0..4 {
        for _ in 0..16 {
            world.schedule_pod(&a);
        }
        advance(secs(60)).await;
    }
    let left = world.source.usage()[0].addresses.v4.unwrap().free as f64;
    let s = runway().expect("the gauge");
    // at 16 addresses a minute, `left` lasts left / 16 minutes (give or take a sample)
    let pace = left / 16.0 * 60.0;
    assert!(
        s.is_finite() && (s - pace).abs() < 120.0,
        "{s} s, {left} left ({pace} s)"
    );
    world.shutdown();
}
