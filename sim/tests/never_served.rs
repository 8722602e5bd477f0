//! `pods.never_served` (issue 28: an exhausted pool reported "0 waited for an address" while
//! most pods never got one): every pod that waited in the measured period and never got an
//! address, still waiting at the end or deleted first, with the cause.

use std::time::Duration;

use tidepool_ipam::PerFamily;
use tidepool_sim::run::simulate_paused;
use tidepool_sim::{PoolChoice, SimConfig, SourceChoice, WorldConfig};

fn pool(cidr: &str, churn: f64) -> SimConfig {
    SimConfig {
        world: WorldConfig::default(),
        source: SourceChoice::ClusterPool(PoolChoice {
            cidrs: vec![cidr.into()],
            block_size: PerFamily { v4: 28, v6: 124 },
        }),
        nodes: 8,
        pods_per_node: 30,
        churn,
        crash_rate: 0.0,
        node_churn: 0.0,
        duration: Duration::from_secs(120),
        ..SimConfig::default()
    }
}

#[test]
fn an_exhausted_pool_counts_its_unserved_pods_and_names_the_cause() {
    // no churn: each of the 240 pods got an address or never did
    let r = simulate_paused(pool("10.0.0.0/26", 0.0)).unwrap();
    assert_eq!(r.pods.started + r.pods.never_served, 240, "{:?}", r.pods);
    assert!(r.pods.never_served >= 240 - 62, "{:?}", r.pods);
    assert_eq!(
        r.pods.never_served_cause.as_deref(),
        Some("the pool is exhausted")
    );
    // churn deletes pods still waiting: they count too, above those waiting at the end
    let churned = simulate_paused(pool("10.0.0.0/26", 6.0)).unwrap();
    assert!(
        churned.pods.never_served > r.pods.never_served,
        "{:?}",
        churned.pods
    );
    // a pool with room: none, and no cause
    let roomy = simulate_paused(pool("10.0.0.0/16", 6.0)).unwrap();
    assert_eq!(roomy.pods.never_served, 0, "{:?}", roomy.pods);
    assert_eq!(roomy.pods.never_served_cause, None);
}
