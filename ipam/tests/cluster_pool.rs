#![cfg(feature = "sim")]
//! The cluster-pool source in the simulated world: block claims through the store, the
//! block-level release handshake, exhaustion and wake-up, and two engines on one store.

use std::sync::Arc;
use std::time::Duration;

use tidepool_ipam::pool::{ClusterPoolSource, PoolConfig, PoolSpec};
use tidepool_ipam::sim::World;
use tidepool_ipam::sim::WorldConfig;
use tidepool_ipam::store::{BlockStore, MemoryNodeStore};
use tidepool_ipam::types::{Family, PerFamily};

type Pool = ClusterPoolSource<MemoryNodeStore>;

fn spec(cidrs: &[&str]) -> PoolSpec {
    PoolSpec::parse(
        "default",
        cidrs,
        PerFamily { v4: 28, v6: 124 },
        &[] as &[&str],
    )
    .unwrap()
}

fn world(cfg: WorldConfig, cidrs: &[&str]) -> World<Pool> {
    let spec = spec(cidrs);
    World::start_with(cfg, move |w, _obs, store| {
        Ok(ClusterPoolSource::new(
            store.clone(),
            &w.families,
            vec![PoolConfig::new(spec)],
            w.seed,
        ))
    })
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn pods_get_addresses_from_claimed_blocks() {
    let w = world(WorldConfig::default(), &["10.0.0.0/24"]);
    let n = w.add_node("n1");
    for _ in 0..20 {
        w.schedule_pod(&n);
    }
    assert!(
        w.settle(Duration::from_secs(60)).await,
        "{:?}",
        w.manager.summaries()
    );
    assert_eq!(w.waiting(), 0);
    let blocks = w.store.blocks_of("n1");
    // 20 pods + pre-allocate 8 = 28 → two /28 blocks (the first holds the network address)
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert!(
        w.observer.invariants().ok(),
        "{:?}",
        w.observer.violations()
    );
    let _ = Arc::clone(&w.observer);
    let _ = Family::V4;
}

#[tokio::test(start_paused = true)]
async fn crashed_pods_are_reclaimed_and_excess_blocks_go_back() {
    let w = world(WorldConfig::default(), &["10.0.0.0/24"]);
    let n = w.add_node("n1");
    let pods: Vec<_> = (0..40).map(|_| w.schedule_pod(&n)).collect();
    assert!(w.settle(Duration::from_secs(60)).await);
    let before = w.store.blocks_of("n1").len();
    for p in &pods[..30] {
        w.delete_pod(*p, true);
    }
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        w.settle(Duration::from_secs(60)).await,
        "{:?}",
        w.manager.summaries()
    );
    assert_eq!(w.observer.reclaimed(), 30);
    let after = w.store.blocks_of("n1").len();
    assert!(after < before, "{before} → {after}");
    assert!(
        w.observer.invariants().ok(),
        "{:?}",
        w.observer.violations()
    );
}
