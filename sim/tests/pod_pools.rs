//! Pools per namespace and per pod (DESIGN.md "Pools per namespace and per pod"), in the
//! engine and the simulated node side: planning per (node, pool, family). A waiting pod is
//! demand for its own pool, so a pool's first pod on a node gets a block before its ADD;
//! one exhausted pool leaves the node's others serving; a pool other than the node's
//! default keeps nothing idle.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use tidepool_ipam::pool::choice::{POOLS_ANNOTATION, Selector, Subject};
use tidepool_ipam::pool::{ClusterPoolSource, DEFAULT_BLOCK_SIZE, PoolConfig, PoolSpec};
use tidepool_ipam::{
    BlockStore, Blocked, BlockedPool, ConditionReason, ConditionType, EventReason, Family,
    IpamNode, NodeName, PodUid, WatermarkOverrides,
};
use tidepool_sim::{World, WorldConfig};

use common::{Pool, assert_no_violations};

const DEFAULT: &str = "10.0.0.0/24";
const BLUE: &str = "10.1.0.0/24";

fn spec(name: &str, cidr: &str) -> PoolSpec {
    PoolSpec::parse(name, &[cidr], DEFAULT_BLOCK_SIZE, &[] as &[&str]).unwrap()
}

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `default` over [`DEFAULT`] for every namespace, and `blue` over `blue` for the
/// namespaces labelled `team=blue`.
fn world(blue: &str) -> World<Pool> {
    world_with(WorldConfig::default(), blue)
}

/// [`world`] with `cfg`.
fn world_with(cfg: WorldConfig, blue: &str) -> World<Pool> {
    let pools = vec![
        PoolConfig::new(spec("default", DEFAULT)),
        PoolConfig {
            namespace_selector: Selector {
                match_labels: labels(&[("team", "blue")]),
                ..Selector::default()
            },
            ..PoolConfig::new(spec("blue", blue))
        },
    ];
    World::start_with(cfg, move |w, _obs, store| {
        Ok(ClusterPoolSource::new(store.clone(), pools, w.seed))
    })
    .unwrap()
}

/// A pod of a namespace labelled `team`.
fn of_team(team: &str) -> Subject {
    Subject {
        namespace_labels: labels(&[("team", team)]),
        ..Subject::default()
    }
}

fn inside(cidr: &str, a: &IpAddr) -> bool {
    cidr.parse::<IpNet>().unwrap().contains(a)
}

/// The node's blocks of `pool`.
fn blocks_of(w: &World<Pool>, node: &NodeName, pool: &str) -> usize {
    let blocks = w.store.blocks_of(node);
    blocks.iter().filter(|b| &*b.pool == pool).count()
}

/// `pool` of IPv4, blocked.
fn blocked(pool: &str) -> BlockedPool {
    BlockedPool {
        pool: pool.into(),
        family: Family::V4,
    }
}

/// The node's `Blocked` condition: its reason and message.
fn blocked_condition(node: &IpamNode) -> Option<(Blocked, String)> {
    let c = (node.operator.conditions.iter()).find(|c| c.type_ == ConditionType::Blocked)?;
    match c.reason {
        ConditionReason::Blocked(b) if c.status => Some((b, c.message.clone())),
        _ => None,
    }
}

/// The addresses of the node's `used` entries of `pods`.
fn addresses_of(w: &World<Pool>, node: &str, pods: &[PodUid]) -> Vec<IpAddr> {
    let n = w.node(node).unwrap();
    let used = n.node.used.iter();
    used.filter(|(_, e)| pods.contains(&e.pod_uid))
        .map(|(a, _)| a)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_namespace_gets_addresses_from_its_pool_and_the_others_from_the_default() {
    let w = world(BLUE);
    let n = w.add_node("n1");
    assert!(w.settle(Duration::from_secs(30)).await);
    assert_eq!(
        (blocks_of(&w, &n, "default"), blocks_of(&w, &n, "blue")),
        (1, 0),
        "an idle node holds its default pool's pre-allocation and nothing of blue"
    );
    let blue: Vec<PodUid> = (0..3)
        .map(|_| w.schedule_pod_with(&n, of_team("blue")))
        .collect();
    let red: Vec<PodUid> = (0..3)
        .map(|_| w.schedule_pod_with(&n, of_team("red")))
        .collect();
    assert!(w.settle(Duration::from_secs(30)).await);
    assert_eq!(w.waiting(), 0);
    let got = addresses_of(&w, "n1", &blue);
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|a| inside(BLUE, a)), "blue pods: {got:?}");
    let got = addresses_of(&w, "n1", &red);
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|a| inside(DEFAULT, a)), "red pods: {got:?}");
    assert_eq!(blocks_of(&w, &n, "blue"), 1);
    assert_no_violations(&w);
}

#[tokio::test(start_paused = true)]
async fn a_pod_annotated_with_a_pool_its_namespace_may_not_use_gets_no_address() {
    let w = world(BLUE);
    let n = w.add_node("n1");
    let forbidden = Subject {
        pod_pools: Some("blue".into()),
        ..of_team("red")
    };
    let uid = w.schedule_pod_with(&n, forbidden);
    let other = w.schedule_pod_with(&n, of_team("red"));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(w.waiting_on("n1"), 1, "only the forbidden pod waits");
    assert!(addresses_of(&w, "n1", &[uid]).is_empty());
    assert_eq!(addresses_of(&w, "n1", &[other]).len(), 1);
    assert_eq!(
        blocks_of(&w, &n, "blue"),
        0,
        "no block of a pool the pod may not use is claimed for it"
    );
    let node = w.node("n1").unwrap();
    assert_eq!(node.operator.blocked_pools, [blocked("blue")]);
    let (reason, message) = blocked_condition(&node).expect("a Blocked condition");
    assert_eq!(reason, Blocked::Pools);
    assert!(message.ends_with("blue (ipv4)"), "{message}");
    assert_eq!(
        w.pods.event_count(EventReason::PoolUnavailable),
        1,
        "told once, not on every pass"
    );
    let (pod, why) = w.pods.last_event(EventReason::PoolUnavailable).unwrap();
    assert_eq!(pod, uid);
    assert!(why.contains("which the pod may not use"), "{why}");
    assert_no_violations(&w);
    assert_eq!(POOLS_ANNOTATION, "ipam.tidepool.dev/pools");
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_pool_blocks_only_its_own_pods() {
    let recorder = tidepool_metrics::prometheus_builder()
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    // blue: one /28 block
    let w = world("10.1.0.0/28");
    let n = w.add_node("n1");
    let blue: Vec<PodUid> = (0..20)
        .map(|_| w.schedule_pod_with(&n, of_team("blue")))
        .collect();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let red: Vec<PodUid> = (0..20)
        .map(|_| w.schedule_pod_with(&n, of_team("red")))
        .collect();
    tokio::time::sleep(Duration::from_secs(30)).await;
    // (the pool's first and last addresses are not handed out)
    let served = addresses_of(&w, "n1", &blue);
    assert_eq!(served.len(), 14);
    assert!(served.iter().all(|a| inside("10.1.0.0/28", a)));
    assert_eq!(
        addresses_of(&w, "n1", &red).len(),
        20,
        "the default pool serves its pods while blue is exhausted"
    );
    assert_eq!(w.waiting_on("n1"), 6);
    let node = w.node("n1").unwrap();
    assert_eq!(node.operator.blocked_pools, [blocked("blue")]);
    let (reason, message) = blocked_condition(&node).expect("a Blocked condition");
    assert_eq!(
        reason,
        Blocked::Pools,
        "not the taint's Exhausted: {message}"
    );
    assert_eq!(
        w.pods.event_count(EventReason::PoolUnavailable),
        6,
        "each waiting pod of blue told once"
    );
    // the metrics count each pool apart
    let text = handle.render();
    let exported = |series: &str| {
        let line = text.lines().find(|l| l.starts_with(&format!("{series} ")));
        line.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let waiting = |pool: &str| {
        exported(&format!(
            "tidepool_ipam_pods_waiting{{family=\"ipv4\",pool=\"{pool}\"}}"
        ))
    };
    assert_eq!(
        (waiting("blue"), waiting("default")),
        (Some(6.0), Some(0.0))
    );
    let used = |pool: &str| {
        exported(&format!(
            "tidepool_ipam_ips{{family=\"ipv4\",state=\"used\",pool=\"{pool}\"}}"
        ))
    };
    assert_eq!((used("blue"), used("default")), (Some(14.0), Some(20.0)));
    assert_no_violations(&w);
}

#[tokio::test(start_paused = true)]
async fn a_pool_other_than_the_default_keeps_nothing_idle() {
    let w = world(BLUE);
    let n = w.add_node("n1");
    let blue: Vec<PodUid> = (0..3)
        .map(|_| w.schedule_pod_with(&n, of_team("blue")))
        .collect();
    assert!(w.settle(Duration::from_secs(30)).await);
    assert_eq!(blocks_of(&w, &n, "blue"), 1);
    for uid in blue {
        w.delete_pod(uid, false);
    }
    // past the release delay, the reclaim and the handshake
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(w.settle(Duration::from_secs(60)).await);
    assert_eq!(
        (blocks_of(&w, &n, "default"), blocks_of(&w, &n, "blue")),
        (1, 0),
        "blue's block went back once its pods were gone; the default keeps its pre-allocation"
    );
    assert_no_violations(&w);
}

/// Watermarks per (node, pool): an IPPool's `spec.watermarks` apply over the flags for
/// the nodes it is the default pool of, and an IPAMNode's `spec.watermarks` over both.
#[tokio::test(start_paused = true)]
async fn a_pools_watermarks_sit_between_the_flags_and_the_nodes() {
    let default = PoolConfig {
        watermarks: WatermarkOverrides {
            pre_allocate: Some(40),
            ..WatermarkOverrides::default()
        },
        ..PoolConfig::new(spec("default", DEFAULT))
    };
    let w = World::start_with(WorldConfig::default(), move |w, _obs, store| {
        Ok(ClusterPoolSource::new(store.clone(), vec![default], w.seed))
    })
    .unwrap();
    let n = w.add_node("n1");
    assert!(w.settle(Duration::from_secs(30)).await);
    // 40 free addresses in /28 blocks of 14 usable (the pool's first and last are not)
    assert_eq!(
        blocks_of(&w, &n, "default"),
        3,
        "the pool's 40, not the flags' 8"
    );
    w.set_watermarks(&n, common::overrides(8, 0, 0, 0));
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(w.settle(Duration::from_secs(60)).await);
    assert_eq!(
        blocks_of(&w, &n, "default"),
        1,
        "the node's 8 over the pool's 40: the surplus went back"
    );
    assert_no_violations(&w);
}

/// The node's allocatable pods cap its pools together, each pool rounded up to whole
/// blocks: the default pool's rounding (and pre-allocation) takes no room from another
/// pool's pods.
#[tokio::test(start_paused = true)]
async fn the_allocatable_pods_cap_counts_pods_not_each_pools_rounding() {
    let w = world_with(
        WorldConfig {
            max_pods: 20,
            ..WorldConfig::default()
        },
        BLUE,
    );
    let n = w.add_node("n1");
    let red: Vec<PodUid> = (0..12)
        .map(|_| w.schedule_pod_with(&n, of_team("red")))
        .collect();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(blocks_of(&w, &n, "default"), 2, "12 pods and 8 spare");
    let blue: Vec<PodUid> = (0..6)
        .map(|_| w.schedule_pod_with(&n, of_team("blue")))
        .collect();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(addresses_of(&w, "n1", &red).len(), 12);
    assert_eq!(
        addresses_of(&w, "n1", &blue).len(),
        6,
        "the default pool's two blocks (32 addresses for 20 pods) leave blue its pods' room"
    );
    assert_eq!(w.waiting_on("n1"), 0);
    assert_no_violations(&w);
}

#[tokio::test(start_paused = true)]
async fn a_node_short_of_another_pool_is_woken_when_the_pool_frees() {
    let mut cfg = WorldConfig::default();
    // no resync to fall back on: only the release wakes the node
    cfg.engine.resync_interval = Duration::from_secs(3600);
    cfg.engine.release.delay = Duration::from_secs(10);
    // blue: one /28 block
    let w = world_with(cfg, "10.1.0.0/28");
    let (n1, n2) = (w.add_node("n1"), w.add_node("n2"));
    let first: Vec<PodUid> = (0..3)
        .map(|_| w.schedule_pod_with(&n2, of_team("blue")))
        .collect();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(addresses_of(&w, "n2", &first).len(), 3);
    let second: Vec<PodUid> = (0..3)
        .map(|_| w.schedule_pod_with(&n1, of_team("blue")))
        .collect();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(w.waiting_on("n1"), 3, "blue's only block is n2's");
    for uid in first {
        w.delete_pod(uid, false);
    }
    // the release delay, the handshake, then n1's claim: well within a minute
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(blocks_of(&w, &n2, "blue"), 0, "n2 released blue's block");
    assert_eq!(
        addresses_of(&w, "n1", &second).len(),
        3,
        "n1 was woken by the release, not left for the resync an hour away"
    );
    assert!(w.node("n1").unwrap().operator.blocked_pools.is_empty());
    assert_no_violations(&w);
}

#[tokio::test(start_paused = true)]
async fn a_pool_deleted_while_its_addresses_are_in_use_drains_without_dropping_them() {
    let w = world(BLUE);
    let n = w.add_node("n1");
    let blue: Vec<PodUid> = (0..5)
        .map(|_| w.schedule_pod_with(&n, of_team("blue")))
        .collect();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let held = addresses_of(&w, "n1", &blue);
    assert_eq!(held.len(), 5);
    assert!(blocks_of(&w, &n, "blue") > 0);

    // blue is deleted while its five pods run: they keep their addresses, its block stays
    w.source
        .set_pools(vec![PoolConfig::new(spec("default", DEFAULT))]);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        addresses_of(&w, "n1", &blue),
        held,
        "no live pod loses its address"
    );
    assert!(
        blocks_of(&w, &n, "blue") > 0,
        "a busy block of a deleted pool stays"
    );
    assert_no_violations(&w);

    // its pods go: the block drains and nothing of blue is granted again
    for uid in blue {
        w.delete_pod(uid, false);
    }
    let later: Vec<PodUid> = (0..5)
        .map(|_| w.schedule_pod_with(&n, of_team("blue")))
        .collect();
    tokio::time::sleep(Duration::from_secs(900)).await;
    assert_eq!(
        blocks_of(&w, &n, "blue"),
        0,
        "the deleted pool's block went back"
    );
    let served = addresses_of(&w, "n1", &later);
    assert_eq!(
        served.len(),
        5,
        "blue's namespace falls to the default pool"
    );
    assert!(served.iter().all(|a| inside(DEFAULT, a)), "{served:?}");
    assert_no_violations(&w);
}

#[tokio::test(start_paused = true)]
async fn a_dual_stack_pod_takes_each_family_from_its_pool_and_gives_both_back() {
    let of = |name: &str, cidrs: &[&str]| {
        PoolSpec::parse(name, cidrs, DEFAULT_BLOCK_SIZE, &[] as &[&str]).unwrap()
    };
    let pools = vec![
        PoolConfig::new(of("default", &["10.0.0.0/24", "fd00::/116"])),
        PoolConfig::new(of("green", &["10.2.0.0/24"])),
        PoolConfig::new(of("six", &["fd00:6::/116"])),
    ];
    let cfg = WorldConfig {
        families: Family::ALL.to_vec(),
        ..WorldConfig::default()
    };
    let w = World::start_with(cfg, move |w, _obs, store| {
        Ok(ClusterPoolSource::new(store.clone(), pools, w.seed))
    })
    .unwrap();
    let n = w.add_node("n1");
    let both = Subject {
        pod_pools: Some("green,six".into()),
        ..Subject::default()
    };
    let pod = w.schedule_pod_with(&n, both);
    let other = w.schedule_pod(&n);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let mut got = addresses_of(&w, "n1", &[pod]);
    got.sort();
    assert_eq!(got.len(), 2, "one address per family: {got:?}");
    assert!(inside("10.2.0.0/24", &got[0]), "IPv4 from green: {got:?}");
    assert!(inside("fd00:6::/116", &got[1]), "IPv6 from six: {got:?}");
    let theirs = addresses_of(&w, "n1", &[other]);
    assert!(
        theirs
            .iter()
            .all(|a| inside("10.0.0.0/24", a) || inside("fd00::/116", a))
    );

    // deleted without a DEL (a crash): both addresses are reclaimed, together
    w.delete_pod(pod, true);
    tokio::time::sleep(Duration::from_secs(120)).await;
    let used = w.node("n1").unwrap().node.used.clone();
    assert!(
        got.iter().all(|a| !used.contains_key(a)),
        "both of the pod's addresses went back"
    );
    assert_no_violations(&w);
}
