//! The cluster pool changing under a running engine: a CIDR removed drains through the
//! block handshake regardless of excess and is never granted again; a CIDR added wakes the
//! nodes parked on an exhausted pool; an orphan block goes after three repair passes.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

mod common;

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use tidepool_ipam::IpamBlock;
use tidepool_ipam::pool::{ClusterPoolSource, PoolConfig};
use tidepool_ipam::{BlockStore, MemoryNodeStore, NodeUid, Ungated};
use tidepool_ipam::{Blocked, EventReason};
use tidepool_metrics::RepairKind;
use tidepool_sim::{World, WorldConfig};

use common::{Pool, pool_spec, pool_world};

fn pools(cidrs: &[&str]) -> Vec<PoolConfig> {
    vec![PoolConfig::new(pool_spec(cidrs))]
}

fn world(cidrs: &[&str]) -> World<Pool> {
    pool_world(WorldConfig::default(), cidrs, Duration::ZERO)
}

fn inside(net: &str, a: &IpAddr) -> bool {
    net.parse::<IpNet>().unwrap().contains(a)
}

#[tokio::test(start_paused = true)]
async fn a_removed_cidr_drains_and_is_never_granted_again() {
    let w = world(&["10.0.0.0/24"]);
    let nodes: Vec<_> = (0..3).map(|i| w.add_node(&format!("n{i}"))).collect();
    for n in &nodes {
        for _ in 0..20 {
            w.schedule_pod(n);
        }
    }
    assert!(w.settle(Duration::from_secs(60)).await);
    let old = "10.0.0.0/24";
    assert!(
        w.store
            .list_blocks()
            .iter()
            .all(|b| inside(old, &b.cidr.addr()))
    );

    // the pool's CIDR is replaced: its blocks drain while their pods run, the nodes are
    // topped up from the new CIDR, and nothing of the old one is granted again
    w.source.set_pools(pools(&["10.1.0.0/24"]));
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(
        w.store
            .list_blocks()
            .iter()
            .any(|b| inside(old, &b.cidr.addr()) && b.release),
        "busy old blocks stay, marked"
    );
    // replace every pod once (a normal rollout): the new ones start on new addresses
    for n in &nodes {
        for uid in w.pods_on(n) {
            w.delete_pod(uid, false);
            w.schedule_pod(n);
        }
    }
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(w.settle(Duration::from_secs(120)).await);
    let blocks = w.store.list_blocks();
    assert!(
        blocks.iter().all(|b| inside("10.1.0.0/24", &b.cidr.addr())),
        "old blocks left: {:?}",
        blocks
            .iter()
            .filter(|b| inside(old, &b.cidr.addr()))
            .map(|b| &b.name)
            .collect::<Vec<_>>()
    );
    for n in &nodes {
        let node = w.node(n).unwrap();
        assert_eq!(node.node.used.len(), 20);
        assert!(node.node.used.keys().all(|a| inside("10.1.0.0/24", &a)));
    }
    assert!(
        w.observer.invariants().ok(),
        "{:?}",
        w.observer.violations()
    );
}

#[tokio::test(start_paused = true)]
async fn an_added_cidr_wakes_the_nodes_parked_on_an_exhausted_pool() {
    // a /27: two /28 blocks of 15 usable addresses each
    let w = world(&["10.0.0.0/27"]);
    let n = w.add_node("n1");
    for _ in 0..40 {
        w.schedule_pod(&n);
    }
    // (pods still wait, so the world does not count as settled)
    tokio::time::sleep(Duration::from_secs(60)).await;
    let summary = w.manager.summary("n1").unwrap();
    assert_eq!(summary.blocked, Some(Blocked::Exhausted));
    assert_eq!(w.waiting(), 10);
    let calls = w.source.calls();
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(w.source.calls(), calls, "no call while parked");

    w.source.set_pools(pools(&["10.0.0.0/27", "10.0.1.0/24"]));
    w.manager.pools_changed();
    assert!(w.settle(Duration::from_secs(30)).await);
    assert_eq!(w.waiting(), 0);
    assert_eq!(w.manager.summary("n1").unwrap().blocked, None);
    assert!(
        w.observer.invariants().ok(),
        "{:?}",
        w.observer.violations()
    );
}

#[tokio::test(start_paused = true)]
async fn an_orphan_block_goes_after_three_repair_passes() {
    let store = MemoryNodeStore::new();
    let cidr: IpNet = "10.0.0.32/28".parse().unwrap();
    let orphan = IpamBlock {
        name: tidepool_ipam::pool::block_name(&cidr).into(),
        cidr,
        pool: "default".into(),
        node: "gone".into(),
        node_uid: NodeUid(9),
        release: false,
        ack: None,
        resource_version: None,
        deleting: false,
    };
    store
        .create_block(orphan.clone(), &mut Ungated)
        .await
        .unwrap();
    let src = ClusterPoolSource::new(store.clone(), pools(&["10.0.0.0/24"]), 1);
    use tidepool_ipam::IpSource;
    let rec = metrics_util::debugging::DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let _guard = metrics::set_default_local_recorder(&rec);
    for pass in 1..=2 {
        src.resync(
            &mut tidepool_ipam::Ungated,
            std::time::SystemTime::UNIX_EPOCH,
        )
        .await;
        assert!(store.cached_block(&orphan.name).is_some(), "pass {pass}");
        let report = src.last_repair().unwrap();
        assert_eq!(report.counts().get(&RepairKind::OrphanBlock), Some(&1));
    }
    src.resync(
        &mut tidepool_ipam::Ungated,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .await;
    assert!(
        store.cached_block(&orphan.name).is_none(),
        "fixed at pass 3"
    );
    // counted on each pass it was found, and the pool's gauges set
    let mut orphans = 0;
    let mut capacity = None;
    for (ck, _, _, v) in snap.snapshot().into_vec() {
        let (_, key) = ck.into_parts();
        let label = |k: &str| {
            key.labels()
                .find(|l| l.key() == k)
                .map(|l| l.value().to_string())
        };
        match (key.name(), v) {
            (
                tidepool_metrics::REPAIR_ISSUES_TOTAL,
                metrics_util::debugging::DebugValue::Counter(n),
            ) if label("kind").as_deref() == Some("orphan-block") => orphans = n,
            (tidepool_metrics::POOL_IPS, metrics_util::debugging::DebugValue::Gauge(g))
                if label("state").as_deref() == Some("capacity") =>
            {
                assert_eq!(label("pool").as_deref(), Some("default"));
                capacity = Some(g.into_inner());
            }
            _ => {}
        }
    }
    assert_eq!(orphans, 3);
    assert_eq!(
        capacity,
        Some(254.0),
        "a /24 less its network and broadcast addresses"
    );
    src.resync(
        &mut tidepool_ipam::Ungated,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .await;
    assert!(src.last_repair().unwrap().findings.is_empty());
    // and its block can be granted again
    assert_eq!(src.quota().v4.free, src.quota().v4.capacity);
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_between_live_nodes_is_reported_once_and_never_fixed() {
    use std::time::SystemTime;
    use tidepool_ipam::IpSource;
    use tidepool_ipam::{Family, IpamNode, NodeInfo, PodUid, UsedEntry};
    let store = MemoryNodeStore::new();
    let src = ClusterPoolSource::new(store.clone(), pools(&["10.0.0.0/24"]), 1);
    for (name, uid) in [("a", NodeUid(1)), ("b", NodeUid(2))] {
        src.node_seen(&NodeInfo {
            name: name.into(),
            uid,
            allocatable_pods: 110,
            cordoned: false,
            terminating: false,
        });
        store.create(IpamNode::new(name.into(), uid));
    }
    let a_blocks = src
        .allocate(&"a".into(), Family::V4, 1, &mut Ungated)
        .await
        .unwrap();
    src.allocate(&"b".into(), Family::V4, 1, &mut Ungated)
        .await
        .unwrap();
    // b's node side records a pod on one of a's addresses
    let foreign = a_blocks.iter().nth(3).unwrap();
    store.apply_node(&"b".into(), |side| {
        side.used.insert(
            foreign,
            UsedEntry {
                pod_uid: PodUid(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
                pod: tidepool_ipam::PodName::new("ns", "p"),
                allocation: tidepool_ipam::AllocationId::new("c1", "eth0"),
                since: SystemTime::UNIX_EPOCH.into(),
            },
        );
    });
    for _ in 0..5 {
        src.resync(
            &mut tidepool_ipam::Ungated,
            std::time::SystemTime::UNIX_EPOCH,
        )
        .await;
    }
    let report = src.last_repair().unwrap();
    assert_eq!(
        report.counts().get(&RepairKind::Duplicate),
        Some(&1),
        "{report:?}"
    );
    // the block's holder is the authority: the foreign entry is b's anomaly alone
    assert_eq!(
        store.event_count(EventReason::Duplicate),
        1,
        "once, on the node whose entry lies outside its own blocks"
    );
    assert_eq!(store.last_event(EventReason::Duplicate).unwrap().0, "b");
    // issue 27 (defect 10): check's wording, UIDs as Kubernetes prints them, no Debug dump
    let (_, message) = store.last_event(EventReason::Duplicate).unwrap();
    for says in [
        foreign.to_string().as_str(),
        "node b (node UID 00000000-0000-0000-0000-000000000002, pod UID 01234567-89ab-cdef-0123-456789abcdef)",
        "of node a (node UID 00000000-0000-0000-0000-000000000001)",
    ] {
        assert!(message.contains(says), "{says:?} not in {message:?}");
    }
    for artefact in ["PodUid(", "NodeUid(", "{", "SameAddress", "ForeignAddress"] {
        assert!(!message.contains(artefact), "{artefact:?} in {message:?}");
    }
    assert_eq!(store.blocks_of("a").len(), 1, "never fixed automatically");
    assert!(!src.node_blocked(&"a".into()) && src.node_blocked(&"b".into()));
    // resolved (the pod is gone from b's record): both nodes are free again
    store.apply_node(&"b".into(), |side| {
        side.used.remove(&foreign);
    });
    src.resync(
        &mut tidepool_ipam::Ungated,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .await;
    assert!(!src.node_blocked(&"a".into()) && !src.node_blocked(&"b".into()));
    assert_eq!(store.blocks_of("b").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_engine_gives_nothing_new_to_a_node_with_a_duplicate() {
    use std::time::SystemTime;
    use tidepool_ipam::{PodUid, UsedEntry};
    let w = world(&["10.0.0.0/24"]);
    let (n1, n2) = (w.add_node("n1"), w.add_node("n2"));
    w.schedule_pod(&n1);
    w.schedule_pod(&n2);
    assert!(w.settle(Duration::from_secs(60)).await);
    let foreign = w.node("n1").unwrap().node.used.keys().next().unwrap();
    w.store.apply_node(&n2, |side| {
        side.used.insert(
            foreign,
            UsedEntry {
                pod_uid: PodUid(u128::MAX),
                pod: tidepool_ipam::PodName::new("ns", "stray"),
                allocation: tidepool_ipam::AllocationId::new("c1", "eth0"),
                since: SystemTime::UNIX_EPOCH.into(),
            },
        );
    });
    tokio::time::sleep(Duration::from_secs(61)).await; // one resync: repair finds it
    let blocks = w.store.blocks_of("n2").len();
    for _ in 0..30 {
        w.schedule_pod(&n2);
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        w.manager.summary("n2").unwrap().blocked,
        Some(Blocked::Duplicate)
    );
    assert_eq!(w.store.blocks_of("n2").len(), blocks, "no new block");
    assert!(w.waiting_on("n2") > 0);
    // n1 holds the block the foreign entry lies in, and uses that address itself: the
    // block's holder is the authority, so n1 goes on getting addresses
    assert_eq!(w.manager.summary("n1").unwrap().blocked, None);
    let n1_blocks = w.store.blocks_of("n1").len();
    for _ in 0..30 {
        w.schedule_pod(&n1);
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(w.store.blocks_of("n1").len() > n1_blocks, "n1 is served");
    assert_eq!(w.waiting_on("n1"), 0);
}
