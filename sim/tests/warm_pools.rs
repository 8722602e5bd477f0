//! Warm pools give way on a scarce pool (issue 30): the measured case — a /22 in
//! /28 blocks (64 blocks) for 30 nodes × 30 pods (60 blocks needed) — served whole with
//! scarcity handling, and not without it; a pool that never becomes scarce runs exactly as
//! before.

use std::time::Duration;

use tidepool_ipam::PerFamily;
use tidepool_sim::run::{Report, simulate_paused};
use tidepool_sim::{PoolChoice, SimConfig, SourceChoice, WorldConfig};

fn tight(cidr: &str, handling: bool, edit: impl FnOnce(&mut WorldConfig)) -> Report {
    let mut world = WorldConfig::default();
    world.engine.scarcity.enabled = handling;
    edit(&mut world);
    simulate_paused(SimConfig {
        world,
        source: SourceChoice::ClusterPool(PoolChoice {
            cidrs: vec![cidr.into()],
            block_size: PerFamily { v4: 28, v6: 124 },
        }),
        nodes: 30,
        pods_per_node: 30,
        churn: 0.0,
        crash_rate: 0.0,
        node_churn: 0.0,
        duration: Duration::from_secs(1800),
        ..SimConfig::default()
    })
    .expect("a valid run")
}

#[test]
fn a_scarce_pool_takes_idle_blocks_back_for_the_nodes_left_without() {
    let off = tight("10.0.0.0/22", false, |_| {});
    assert!(off.pods.never_served > 200, "{:?}", off.pods);
    assert!(off.ips.free > 300, "idle elsewhere: {:?}", off.ips);

    let on = tight("10.0.0.0/22", true, |_| {});
    assert_eq!(on.pods.never_served, 0, "{:?}", on.pods);
    assert!(on.converged, "{on:?}");
    assert_eq!(on.nodes.blocked, 0);
    // each pod waited at most the scarcity release delay plus a handshake and a claim
    let max = on.pods.ip_wait_seconds.max.expect("some pods waited");
    assert!(max <= 10.0 + 5.0, "max wait {max} s");
    assert_eq!(on.invariants.double_allocations, 0);
    assert_eq!(on.invariants.live_ip_reclaimed, 0);
    assert_eq!(on.invariants.lost_allocations, 0);
}

#[test]
fn min_allocate_is_ignored_on_a_scarce_pool() {
    // 48 addresses (3 blocks) per node at least: 21 nodes take the 64 blocks without handling
    let floor = |w: &mut WorldConfig| w.engine.watermarks.min_allocate = 48;
    let off = tight("10.0.0.0/22", false, floor);
    assert!(off.pods.never_served > 200, "{:?}", off.pods);
    let on = tight("10.0.0.0/22", true, floor);
    assert_eq!(on.pods.never_served, 0, "{:?}", on.pods);
}

#[test]
fn a_pool_that_never_becomes_scarce_runs_as_without_handling() {
    let a = tight("10.0.0.0/20", true, |_| {});
    let b = tight("10.0.0.0/20", false, |_| {});
    assert_eq!(a.pods.never_served, 0);
    assert_eq!(
        (&a.ips, &a.api, &a.pods, a.convergence_seconds),
        (&b.ips, &b.api, &b.pods, b.convergence_seconds)
    );
}
