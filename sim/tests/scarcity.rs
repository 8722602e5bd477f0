//! The report's scarcity section (issue 30): the waiting-time oracle on hand-computed
//! cases, the promise's breach counter on a constructed breach, and both on whole runs.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tidepool_ipam::{Family, NodeName, PodUid, ScarcityConfig};
use tidepool_sim::run::simulate_paused;
use tidepool_sim::scarcity::PoolKey;
use tidepool_sim::scarcity::oracle::{ClaimBudget, OracleLimits, PoolOracle};
use tidepool_sim::scarcity::promise::{PoolSample, PromiseCounter};
use tidepool_sim::{PoolChoice, SimConfig, SourceChoice, WorldConfig};
use tokio::time::Instant;

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn n(name: &str) -> NodeName {
    name.into()
}

/// A pool of `capacity` units of `unit` addresses; no cap, no holds, instant moves.
/// `count` pods arriving on `node` at the start.
fn arrive_many(o: &mut PoolOracle, node: &str, count: usize) {
    for _ in 0..count {
        o.arrive(s(0), &n(node));
    }
}

fn limits(unit: u64, capacity: u64) -> OracleLimits {
    OracleLimits {
        unit,
        capacity,
        node_cap: 1000,
        move_cost: Duration::ZERO,
        reclaim_grace: Duration::ZERO,
        reclaim_min_age: Duration::ZERO,
        cooldown: Duration::ZERO,
        claims: None,
    }
}

/// Enough room: nobody has to wait, even with all pods arriving at once.
#[test]
fn room_for_everyone_means_no_wait() {
    let mut o = PoolOracle::new(limits(16, 4), s(0));
    arrive_many(&mut o, "a", 30);
    arrive_many(&mut o, "b", 32);
    // 30 pods need 2 blocks of 16, 32 need 2: 4 of 4
    assert_eq!(o.finish(s(100)).0, 0.0);
}

/// Two nodes of 17 pods need 2 blocks each (4 > 3): the cheapest block to free is the
/// one a single pod opened, so one pod waits for the whole run.
#[test]
fn one_block_short_costs_the_smallest_remainder() {
    let mut o = PoolOracle::new(limits(16, 3), s(0));
    arrive_many(&mut o, "a", 17);
    arrive_many(&mut o, "b", 20);
    // a: 17 → 2 blocks (remainder 1), b: 20 → 2 blocks (remainder 4): free a's second
    assert_eq!(o.finish(s(10)).0, 10.0);
}

/// Per-address pool of 2: three pods arrive at 0, one leaves at 5 s; the third waits 5 s.
/// With a 3 s cooldown on the freed address, it waits 8 s.
#[test]
fn a_freed_address_serves_after_its_cooldown() {
    for (cooldown, want) in [(0, 5.0), (3, 8.0)] {
        let mut o = PoolOracle::new(
            OracleLimits {
                cooldown: s(cooldown),
                ..limits(1, 2)
            },
            s(0),
        );
        for node in ["a", "a", "b"] {
            o.arrive(s(0), &n(node));
        }
        o.depart(s(5), &n("a"), Some(s(0)), false);
        assert_eq!(o.finish(s(60)).0, want, "cooldown {cooldown}");
    }
}

/// A crashed pod's address is held `grace` after the crash and `min_age` after its start at
/// least, then cools: crashed at 10 s it is free at 120 + 30; crashed at 200 s, at
/// 200 + 30 + 30. A pod of another node arriving at the crash waits until then.
#[test]
fn a_crashed_pods_address_is_held_until_reclaimable_then_cools() {
    for (crash_at, free_at) in [(10u64, 150u64), (200, 260)] {
        let mut o = PoolOracle::new(
            OracleLimits {
                reclaim_grace: s(30),
                reclaim_min_age: s(120),
                cooldown: s(30),
                ..limits(1, 1)
            },
            s(0),
        );
        o.arrive(s(0), &n("a"));
        o.started(s(0), &n("a"));
        o.depart(s(crash_at), &n("a"), Some(s(0)), true);
        o.arrive(s(crash_at), &n("b"));
        let want = (free_at - crash_at) as f64;
        assert_eq!(o.finish(s(1000)).0, want, "crash at {crash_at}");
    }
}

/// The units come no faster than the claim budget's calls: 10 pods on one node of a
/// per-address pool, one address a call, burst 2 then one call a second, wait 8 + 7 + … + 1
/// pod-seconds; 40 pods in blocks of 16, burst 1 then one block per 2 s, wait 24 pods for
/// 2 s, then 8 for 2 s; 10 pods of a cloud whose call assigns 3 addresses at most, burst 1
/// then one call a second, wait 7 + 4 + 1. Without the budget nobody waits.
#[test]
fn units_come_no_faster_than_the_claim_budget() {
    let cases = [
        (1, 10, 10, 2, 1.0, 1, 36.0),
        (16, 4, 40, 1, 0.5, 1, 64.0),
        (1, 100, 10, 1, 1.0, 3, 12.0),
    ];
    for (unit, capacity, pods, burst, qps, per_call, want) in cases {
        let budget = ClaimBudget {
            burst,
            qps,
            per_call,
        };
        for claims in [Some(budget), None] {
            let l = OracleLimits {
                claims,
                ..limits(unit, capacity)
            };
            let mut o = PoolOracle::new(l, s(0));
            arrive_many(&mut o, "a", pods);
            let want = if claims.is_some() { want } else { 0.0 };
            assert_eq!(o.finish(s(100)).0, want, "unit {unit}, {claims:?}");
        }
    }
}

/// A block node a held and gave up reaches node b only the move cost later: b's pod,
/// arriving 2 s after a's pod left, waits the remaining 8 s of a 10 s move.
#[test]
fn a_block_moving_between_nodes_costs_the_move() {
    let mut o = PoolOracle::new(
        OracleLimits {
            move_cost: s(10),
            ..limits(16, 1)
        },
        s(0),
    );
    o.arrive(s(0), &n("a"));
    o.started(s(0), &n("a"));
    o.depart(s(100), &n("a"), Some(s(0)), false);
    o.arrive(s(102), &n("b"));
    assert_eq!(o.finish(s(200)).0, 8.0);
    // the same pod on a itself: no move, no wait
    let mut o = PoolOracle::new(
        OracleLimits {
            move_cost: s(10),
            ..limits(16, 1)
        },
        s(0),
    );
    o.arrive(s(0), &n("a"));
    o.started(s(0), &n("a"));
    o.depart(s(100), &n("a"), Some(s(0)), false);
    o.arrive(s(102), &n("a"));
    assert_eq!(o.finish(s(200)).0, 0.0);
}

/// Pods beyond a node's cap wait whatever the pool holds.
#[test]
fn pods_beyond_the_node_cap_wait() {
    let mut o = PoolOracle::new(
        OracleLimits {
            node_cap: 3,
            ..limits(1, 100)
        },
        s(0),
    );
    arrive_many(&mut o, "a", 5);
    assert_eq!(o.finish(s(10)).0, 20.0);
}

/// The actual waiting is integrated beside the bound: a pod waiting 4 s of a measured
/// period that starts at 1 s counts 3 s.
#[test]
fn actual_waiting_counts_the_measured_period() {
    let mut o = PoolOracle::new(limits(1, 10), s(0));
    o.measure_from(s(1));
    o.arrive(s(0), &n("a"));
    o.started(s(4), &n("a"));
    assert_eq!(o.finish(s(10)), (0.0, 3.0));
}

fn key() -> PoolKey {
    PoolKey {
        pool: Arc::from("default"),
        family: Family::V4,
    }
}

/// The breach counter can fail: a pod waits on node b past T while node a holds an idle
/// block in a scarce pool. It is not counted before T, nor when the only idle unit is on
/// the pod's own node, nor while the pool is not scarce.
#[tokio::test(start_paused = true)]
async fn an_idle_block_elsewhere_while_a_pod_waits_past_t_is_a_breach() {
    let t0 = Instant::now();
    let sample = |holder: &str, used: u128| {
        let mut m = BTreeMap::new();
        m.insert(
            key(),
            PoolSample {
                capacity: 100,
                used,
                cooldown: 0,
                waiting: vec![(n("b"), PodUid(7), t0)],
                holders: vec![(n(holder), 1)],
            },
        );
        m
    };
    let cfg = ScarcityConfig::default();
    let mut c = PromiseCounter::new(cfg, s(12));
    for secs in 0..=20 {
        c.observe(t0 + s(secs), &sample("a", 90));
    }
    let (_, b) = c.pools().next().expect("the pool");
    assert_eq!((b.episodes, b.pods), (1, 1));
    // waited 13..=20 s past T = 12: the seconds beyond T, sampled each second
    assert_eq!(b.seconds_beyond, 8.0);

    let mut own = PromiseCounter::new(cfg, s(12));
    let mut calm = PromiseCounter::new(cfg, s(12));
    for secs in 0..=20 {
        own.observe(t0 + s(secs), &sample("b", 90));
        calm.observe(t0 + s(secs), &sample("a", 10));
    }
    assert_eq!(
        own.pools().next().unwrap().1.pods,
        0,
        "the holder is its own node"
    );
    let calm = calm.pools().next().unwrap().1;
    assert_eq!((calm.episodes, calm.pods), (0, 0), "never scarce");
}

/// A unit that turns up on a node and is gone again within T (its own node's next pod took
/// it) is not one the engine could have moved, whose release may wait the release delay:
/// holders that change every 5 s never make a breach, however long the pod waits. The same
/// holders kept past T do.
#[tokio::test(start_paused = true)]
async fn a_unit_held_for_less_than_t_is_not_a_breach() {
    let t0 = Instant::now();
    let sample = |holder: String| {
        let mut m = BTreeMap::new();
        m.insert(
            key(),
            PoolSample {
                capacity: 100,
                used: 90,
                cooldown: 0,
                waiting: vec![(n("b"), PodUid(7), t0)],
                holders: vec![(n(&holder), 1)],
            },
        );
        m
    };
    let cfg = ScarcityConfig::default();
    let mut rotating = PromiseCounter::new(cfg, s(12));
    let mut kept = PromiseCounter::new(cfg, s(12));
    for secs in 0..=60 {
        rotating.observe(t0 + s(secs), &sample(format!("a{}", secs / 5)));
        kept.observe(t0 + s(secs), &sample(format!("a{}", secs / 20)));
    }
    let rotating = rotating.pools().next().unwrap().1;
    assert_eq!((rotating.episodes, rotating.pods), (1, 0), "{rotating:?}");
    let kept = kept.pools().next().unwrap().1;
    // each holder kept 20 s: held past T = 12 at its 13th to 19th second, 7 samples of
    // each of three (the fourth begins at the last sample)
    assert_eq!(kept.pods, 1);
    assert_eq!(kept.seconds_beyond, 7.0 * 3.0, "{kept:?}");
}

/// The baseline: a /22 of /28 blocks (64) for 30 nodes × 30 pods (60 blocks
/// needed). The oracle says no wait; without scarcity handling the engine leaves pods
/// waiting while other nodes keep idle blocks, and the counter counts them; with it, every
/// pod is served, nothing is counted, and the waiting is within the target.
#[test]
fn the_baseline_breaches_while_the_oracle_says_no_wait() {
    let mut world = WorldConfig::default();
    world.engine.scarcity.enabled = false;
    let cfg = SimConfig {
        world,
        source: SourceChoice::ClusterPool(PoolChoice {
            cidrs: vec!["10.0.0.0/22".into()],
            block_size: tidepool_ipam::PerFamily { v4: 28, v6: 124 },
        }),
        nodes: 30,
        pods_per_node: 30,
        churn: 0.0,
        crash_rate: 0.0,
        node_churn: 0.0,
        duration: s(600),
        ..SimConfig::default()
    };
    let r = simulate_paused(cfg.clone()).unwrap();
    let sc = &r.scarcity;
    assert!(sc.episodes >= 1, "{sc:?}");
    assert_eq!(sc.oracle_wait_seconds, 0.0, "{sc:?}");
    assert!(r.pods.never_served > 0, "{:?}", r.pods);
    assert!(sc.idle_while_waiting.pods > 0, "{sc:?}");
    assert!(sc.wait_seconds > 0.0, "{sc:?}");
    assert_eq!(sc.pools.len(), 1);
    assert_eq!(sc.pools[0].pool, "default");

    let mut handled = cfg;
    handled.world.engine.scarcity.enabled = true;
    let r = simulate_paused(handled).unwrap();
    assert_eq!(r.pods.never_served, 0, "{:?}", r.pods);
    let sc = &r.scarcity;
    assert_eq!(sc.idle_while_waiting.pods, 0, "{sc:?}");
    // the target: the pods arrive at once, so every node's demand counts in the
    // pool's pressure before any node claims a warm pool, and no block has to move
    let target = 1.2 * sc.oracle_wait_seconds + 60.0 * sc.episodes as f64;
    assert!(sc.wait_seconds <= target, "{sc:?}");
}

/// A run that never becomes scarce reports an all-zero section.
#[test]
fn a_run_never_scarce_reports_zeros() {
    let r = simulate_paused(SimConfig {
        nodes: 5,
        duration: s(120),
        ..SimConfig::default()
    })
    .unwrap();
    assert_eq!(r.scarcity, Default::default());
}

/// A shipped scarcity scenario on a source.
fn scenario(file: &str, source: SourceChoice, seed: u64) -> SimConfig {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let sc = tidepool_sim::scenario::Scenario::parse(file, &text).unwrap();
    let mut world = WorldConfig {
        seed,
        ..WorldConfig::default()
    };
    if let SourceChoice::SimCloud(_) = source {
        world.max_pods = 240;
    }
    SimConfig {
        world,
        source,
        nodes: sc.start.nodes.unwrap(),
        pods_per_node: sc.start.pods_per_node.unwrap(),
        churn: sc.start.churn.unwrap(),
        crash_rate: sc.start.crash_rate.unwrap(),
        node_churn: sc.start.node_churn.unwrap(),
        duration: sc.duration.unwrap(),
        scenario: Some(Arc::new(sc)),
        ..SimConfig::default()
    }
}

fn pool(cidr: &str, block: u8) -> SourceChoice {
    SourceChoice::ClusterPool(PoolChoice {
        cidrs: vec![cidr.into()],
        block_size: tidepool_ipam::PerFamily { v4: block, v6: 124 },
    })
}

/// The scarcity scenarios on each source (the cases their comments give).
fn cases() -> Vec<(&'static str, SourceChoice)> {
    let cloud = SourceChoice::SimCloud(tidepool_sim::CloudChoice {
        instance_type: tidepool_sim::cloud::InstanceType::ALL[1],
        subnet_size: 22,
        rate_limit: None,
    });
    vec![
        ("scarcity.yaml", pool("10.0.0.0/22", 28)),
        ("scarcity.yaml", pool("10.0.0.0/22", 32)),
        ("scarcity.yaml", cloud),
        ("scarcity-pools.yaml", pool("10.0.0.0/16", 28)),
    ]
}

/// The oracle is a lower bound: on every scarcity scenario, source and seed, each pool
/// waited at least what its oracle says (a bound above the world's own waiting would be a
/// wrong constraint), and the scenario does make a pool scarce.
#[test]
fn the_oracle_never_exceeds_the_actual_waiting() {
    for (file, source) in cases() {
        for seed in 1..=2 {
            let r = simulate_paused(scenario(file, source.clone(), seed)).unwrap();
            assert!(
                r.invariants.ok(),
                "{file} {source:?} seed {seed}: {:?}",
                r.violations
            );
            let sc = &r.scarcity;
            assert!(sc.episodes >= 1, "{file} {source:?} seed {seed}: {sc:?}");
            for p in &sc.pools {
                assert!(
                    p.oracle_wait_seconds <= p.wait_seconds + 1e-6,
                    "{file} {source:?} seed {seed}: {p:?}"
                );
            }
        }
    }
}

/// The promise itself over seeds, on the cluster pool in /28 and /32 blocks: no pod of a
/// scarce pool waits past T while another node holds a releasable unit; without scarcity
/// handling it breaks on every seed (the test can fail). Not yet kept, and so not asserted
/// here (BENCHMARKS.md "Scarcity"): sim-cloud, whose calls queue behind the cloud's budget.
#[test]
fn the_promise_holds_over_seeds() {
    let cases = [
        ("scarcity.yaml", pool("10.0.0.0/22", 28), 5),
        ("scarcity-pools.yaml", pool("10.0.0.0/16", 28), 5),
        // every pod's block is one API write: the bring-up takes no warm pools, so no
        // idle block is held while the claims queue behind the kube budget
        ("scarcity.yaml", pool("10.0.0.0/22", 32), 2),
    ];
    for (file, source, seeds) in cases {
        for seed in 1..=seeds {
            let r = simulate_paused(scenario(file, source.clone(), seed)).unwrap();
            assert!(r.scarcity.episodes >= 1, "{file} seed {seed}: never scarce");
            let b = r.scarcity.idle_while_waiting;
            assert_eq!(b.pods, 0, "{file} {source:?} seed {seed}: {:?}", r.scarcity);
        }
    }
    let mut off = scenario("scarcity.yaml", pool("10.0.0.0/22", 28), 1);
    off.world.engine.scarcity.enabled = false;
    let r = simulate_paused(off).unwrap();
    assert!(r.scarcity.idle_while_waiting.pods > 0, "{:?}", r.scarcity);
}
