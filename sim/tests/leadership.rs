//! Two operators on one simulated cloud: leadership moves from A to B in the middle of a
//! release handshake. For cloud sources the unassign is unconditional, so safety rests on
//! the lease: the deposed A must not release what the node side has agreed to give back
//! (DESIGN.md "Release handshake"); the new leader B seeds from the store and completes it.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::sync::Arc;
use std::time::Duration;

use tidepool_ipam::Clock;
use tidepool_ipam::IpSource;
use tidepool_ipam::NodeStore;
use tidepool_ipam::NodeUid;
use tidepool_ipam::Watermarks;
use tidepool_ipam::{Api, Budget, SchedulingMode};
use tidepool_ipam::{EngineDeps, NodeManager};
use tidepool_ipam::{NodeInfo, ReleaseAck, ReleaseState};
use tidepool_sim::cloud::{InstanceType, SimCloud};
use tidepool_sim::{World, WorldConfig};

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_does_not_release_on_the_cloud() {
    // A (the world's engine) gets a tight source budget, so its release of the answered
    // addresses has to wait; B has no budget limit.
    let mut cfg = WorldConfig {
        max_pods: 232,
        source_qps: 0.01,
        source_burst: 1,
        ..WorldConfig::default()
    };
    cfg.engine.watermarks = Watermarks {
        pre_allocate: 2,
        ..Watermarks::default()
    };
    cfg.engine.release.delay = Duration::from_secs(5);
    let world = World::start_with(cfg.clone(), |w, observer, _store| {
        Ok(SimCloud::for_nodes(10, 16, w.seed)?
            .with_instance_type(InstanceType::by_name("m5.4xlarge")?)
            .with_hook(observer))
    })
    .unwrap();

    // B: a second engine on the same cloud, store and pods, not leading yet.
    let (b_lead, b_rx) = tokio::sync::watch::channel(false);
    let b = NodeManager::new(
        EngineDeps {
            source: world.source.clone(),
            store: world.store.clone(),
            pods: world.pods.clone(),
            clock: world.clock.clone() as Arc<dyn Clock>,
            source_budget: Budget::unlimited(Api::Source),
            kube_budget: Budget::new(Api::Kube, 50.0, 100, SchedulingMode::Priority).unwrap(),
            leader: b_rx,
        },
        cfg.engine.clone(),
    )
    .unwrap();
    let mut events = world.store.subscribe();
    let b_events = b.clone();
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            b_events.on_store_event(&ev);
        }
    });

    // One node with 10 pods: A claims 12 (one call, within its burst).
    let n = world.add_node("node-a");
    b.upsert_node(NodeInfo {
        name: n.clone(),
        uid: world.node("node-a").map_or(NodeUid(2), |x| x.node_uid),
        allocatable_pods: 232,
        cordoned: false,
        terminating: false,
    });
    let pods: Vec<_> = (0..10).map(|_| world.schedule_pod(&n)).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node = world.node("node-a").unwrap();
    assert_eq!(node.operator.addresses.total(), 12);
    assert_eq!(node.node.used.len(), 10);

    // Eight pods go: after their cooldown and the release delay, A marks the excess and the
    // node side answers ready-for-release.
    for p in &pods[..8] {
        world.delete_pod(*p, false);
    }
    let mut marked = Vec::new();
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let node = world.node("node-a").unwrap();
        marked = node
            .operator
            .release
            .iter()
            .filter(|(a, s)| {
                **s == ReleaseState::MarkedForRelease
                    && node.node.release_ack.get(a) == Some(&ReleaseAck::ReadyForRelease)
            })
            .map(|(a, _)| a)
            .collect();
        if !marked.is_empty() {
            break;
        }
    }
    assert!(
        !marked.is_empty(),
        "A marked the excess and the node agreed"
    );
    // A's release waits for its budget (one call per 100 s): the lead moves now.
    let calls_before = world.source.counters().calls;
    let held_before = world.source.describe(&n).await.unwrap();
    assert!(
        marked.iter().all(|a| held_before.contains(a)),
        "not released yet"
    );
    world.leader.send(false).unwrap();
    b_lead.send(true).unwrap();

    // B seeds from the store and completes the handshake: exactly one release call, the
    // answered addresses back at the cloud; A made none, also after its budget's next token.
    tokio::time::sleep(Duration::from_secs(150)).await;
    let held = world.source.describe(&n).await.unwrap();
    assert!(
        marked.iter().all(|a| !held.contains(a)),
        "B released the marked addresses"
    );
    assert_eq!(
        world.source.counters().calls - calls_before,
        1,
        "one release call, by B; the deposed A made none"
    );
    let node = world.store.get("node-a").await.unwrap().unwrap();
    assert!(
        node.operator
            .release
            .runs()
            .all(|(_, _, s)| *s != ReleaseState::MarkedForRelease)
    );
    assert!(
        world.observer.invariants().ok(),
        "{:?}",
        world.observer.violations()
    );
    b.shutdown();
    world.shutdown();
}
