//! Set-up shared by the engine benchmarks.
#![allow(dead_code)] // each benchmark uses part of it

use std::time::Duration;

use tidepool_sim::{World, WorldConfig};

/// Budgets so large they never hold anything back.
pub fn unlimited() -> WorldConfig {
    WorldConfig {
        source_qps: 1e6,
        source_burst: 1_000_000,
        kube_qps: 1e6,
        kube_burst: 1_000_000,
        ..WorldConfig::default()
    }
}

/// 10,000 nodes with 110 running pods each, settled; then the engine stops leading and 10%
/// of the nodes get 10 more pods, so they stay in deficit for every resync measured. `pause`
/// is how long to let things happen around the lead change.
pub async fn ten_thousand_nodes(pause: Duration) -> World {
    let w = World::start(unlimited()).expect("world");
    let names: Vec<_> = (0..10_000)
        .map(|i| w.add_node(&format!("n{i:05}")))
        .collect();
    for n in &names {
        for _ in 0..110 {
            w.schedule_pod(n);
        }
    }
    assert!(
        w.settle(Duration::from_secs(600)).await,
        "setup must settle"
    );
    w.leader.send(false).expect("leader");
    tokio::time::sleep(pause).await;
    for n in names.iter().step_by(10) {
        for _ in 0..10 {
            w.schedule_pod(n);
        }
    }
    tokio::time::sleep(pause).await;
    w
}
