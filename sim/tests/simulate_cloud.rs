//! `simulate` on the ENI-like simulated cloud: the scale-up target of issue 4 (in virtual
//! time, so the figures are exact and repeatable), and a churny run's invariants.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::time::Duration;

use tidepool_ipam::EngineConfig;
use tidepool_ipam::Watermarks;
use tidepool_sim::cloud::InstanceType;
use tidepool_sim::{CloudChoice, SimConfig, SimSource, SourceChoice, WorldConfig, simulate};

fn cloud(itype: &str, rate_limit: Option<(f64, u32)>) -> SourceChoice {
    SourceChoice::SimCloud(CloudChoice {
        instance_type: InstanceType::by_name(itype).unwrap(),
        subnet_size: 16,
        rate_limit,
    })
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// 1,000 m5.4xlarge nodes × 30 pods from nothing, operator budget 20 qps / 40 burst, cloud
/// 100 qps, 50 ms per call: every node needs two calls (29 + 9 addresses), so C = 2,000 and
/// the lower bound is (2000 − 40) / 20 + 0.05 = 98.05 s. Convergence within 10% of it, and
/// no more than 5% calls above C.
#[test]
fn scale_up_converges_near_the_lower_bound() {
    let cfg = SimConfig {
        world: WorldConfig {
            max_pods: 232,
            source_latency: Duration::from_millis(50),
            source_qps: 20.0,
            source_burst: 40,
            seed: 11,
            engine: EngineConfig {
                watermarks: Watermarks {
                    pre_allocate: 8,
                    ..Watermarks::default()
                },
                ..EngineConfig::default()
            },
            ..WorldConfig::default()
        },
        source: cloud("m5.4xlarge", Some((100.0, 100))),
        nodes: 1000,
        pods_per_node: 30,
        churn: 0.0,
        crash_rate: 0.0,
        node_churn: 0.0,
        duration: Duration::from_secs(1800),
        ..SimConfig::default()
    };
    let r = rt().block_on(simulate(cfg, |_, _| {})).unwrap();
    assert!(r.invariants.ok(), "{:?}", r.invariants);
    assert_eq!(r.api.source_calls_minimum, Some(2000));
    assert_eq!(r.lower_bound_seconds, Some(98.05));
    let conv = r.convergence_seconds.expect("converged");
    assert!(conv <= 1.10 * 98.05, "convergence {conv} s");
    assert!(conv >= 98.05 - 1.0, "faster than the lower bound: {conv} s");
    assert!(
        r.api.source_calls as f64 <= 1.05 * 2000.0,
        "{} calls",
        r.api.source_calls
    );
    assert_eq!(r.ips.allocated, 38_000);
}

/// The default workload (churn, crashes, node losses) with faults and a rate-limited cloud:
/// every invariant holds (no lost address: every crash leak was reclaimed, by tombstone or
/// with its node).
#[test]
fn churn_and_faults_on_the_cloud_keep_the_invariants() {
    let mut world = WorldConfig {
        max_pods: 232,
        source_latency: Duration::from_millis(100),
        seed: 3,
        ..WorldConfig::default()
    };
    world.faults.error_rate = 0.05;
    world.faults.lost_reply_rate = 0.02;
    let cfg = SimConfig {
        world,
        source: cloud("m5.4xlarge", Some((10.0, 10))),
        nodes: 40,
        node_churn: 6.0,
        duration: Duration::from_secs(600),
        ..SimConfig::default()
    };
    let r = rt().block_on(simulate(cfg, |_, _| {})).unwrap();
    assert!(r.invariants.ok(), "{:?}", r.invariants);
    assert!(r.pods.leaked_by_crash > 0, "the run must crash pods");
    assert!(r.reclaim.reclaimed > 0 && r.reclaim.reclaimed <= r.pods.leaked_by_crash);
    assert!(r.api.source_calls > r.api.source_calls_minimum.unwrap());
}

/// An instance type that cannot address the pods asked for is refused before anything runs.
#[test]
fn too_many_pods_for_the_instance_type_is_refused() {
    let cfg = SimConfig {
        source: cloud("m5.large", None),
        pods_per_node: 30,
        ..SimConfig::default()
    };
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("pods-per-node") && err.contains("27"), "{err}");
}

/// A machine the cloud no longer has: once its Node is deleted and no pod is bound to it,
/// whole-node reclaim does not wait for the node grace (DESIGN: "either the source says the
/// machine is gone or node_reclaim_grace has passed"); the memory source cannot tell, so
/// there the grace applies.
#[tokio::test(start_paused = true)]
async fn the_cloud_saying_the_machine_is_gone_skips_the_node_grace() {
    use tidepool_ipam::NodeStore;
    use tidepool_sim::World;

    let cfg = WorldConfig {
        max_pods: 232,
        ..WorldConfig::default()
    };
    let cloud = World::start_with(cfg.clone(), |w, observer, _store| {
        Ok(tidepool_sim::cloud::SimCloud::for_nodes(10, 16, w.seed)?.with_hook(observer))
    })
    .unwrap();
    let memory = World::start(cfg).unwrap();
    let n1 = cloud.add_node("n1");
    let n2 = memory.add_node("n1");
    for _ in 0..5 {
        cloud.schedule_pod(&n1);
        memory.schedule_pod(&n2);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(cloud.node("n1").is_some() && memory.node("n1").is_some());
    cloud.vanish_machine(&n1);
    memory.vanish_machine(&n2);
    cloud.delete_node_object(&n1);
    memory.delete_node_object(&n2);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        cloud.store.get("n1").await.unwrap().is_none(),
        "reclaimed at once"
    );
    assert!(
        memory.store.get("n1").await.unwrap().is_some(),
        "waits for the grace"
    );
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(
        memory.store.get("n1").await.unwrap().is_none(),
        "reclaimed after the grace"
    );
    // nothing granted is lost (the cloud took the vanished instance's addresses back)
    let inv = cloud
        .observer
        .finish(&cloud.source.grants(), &cloud.store.list());
    assert!(inv.ok(), "{inv:?}");
    let inv = memory
        .observer
        .finish(&memory.source.grants(), &memory.store.list());
    assert!(inv.ok(), "{inv:?}");
}
