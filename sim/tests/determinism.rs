//! `simulate` is deterministic (DESIGN.md "simulate": with the same seed two reports are
//! equal except for the wall, CPU, memory and rate fields), and a no-churn scale-up
//! converges with no invariant broken. Each run gets its own current-thread runtime with
//! paused time, as the operator's `simulate` does. Sizes are kept small: a debug build
//! runs the default-size simulation far too slowly for a test.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::time::Duration;

use tidepool_sim::run::simulate_paused;
use tidepool_sim::{Report, SimConfig, WorldConfig};

fn run(cfg: SimConfig) -> Report {
    simulate_paused(cfg).expect("simulate runs")
}

/// 30 nodes × 10 pods, churn 2/min, 5% crashes, 6 node losses per hour, 5 minutes.
fn churning(seed: u64) -> SimConfig {
    SimConfig {
        world: WorldConfig {
            seed,
            ..WorldConfig::default()
        },
        nodes: 30,
        pods_per_node: 10,
        churn: 2.0,
        crash_rate: 0.05,
        node_churn: 6.0,
        duration: Duration::from_secs(300),
        // per-node details too: a stronger comparison
        report_nodes: true,
        ..SimConfig::default()
    }
}

#[test]
fn same_seed_gives_the_same_report() {
    let a = run(churning(7));
    let b = run(churning(7));
    assert_eq!(
        a.deterministic(),
        b.deterministic(),
        "two runs with seed 7 differ"
    );
    // the run did something worth comparing
    assert!(a.pods.deleted > 0, "churn deleted no pod: {a:?}");
    assert!(a.api.source_calls > 0, "no source call: {a:?}");
    assert!(a.invariants.ok(), "invariants broken: {:?}", a.invariants);
}

#[test]
fn a_different_seed_gives_a_different_report() {
    let a = run(churning(7));
    let c = run(churning(8));
    assert_ne!(
        a.deterministic(),
        c.deterministic(),
        "seeds 7 and 8 gave the same report"
    );
    assert!(c.invariants.ok(), "invariants broken: {:?}", c.invariants);
}

#[test]
fn deterministic_zeroes_only_the_machine_fields() {
    let a = run(churning(7));
    let d = a.deterministic();
    assert_eq!(d.wall_seconds, 0.0);
    assert_eq!(d.cpu_seconds, None);
    assert_eq!(d.peak_rss_bytes, None);
    assert_eq!(d.events_per_second, 0.0);
    let restored = Report {
        wall_seconds: a.wall_seconds,
        cpu_seconds: a.cpu_seconds,
        peak_rss_bytes: a.peak_rss_bytes,
        events_per_second: a.events_per_second,
        ..d
    };
    assert_eq!(restored, a);
}

#[test]
fn no_churn_scale_up_converges_with_no_invariant_broken() {
    let r = run(SimConfig {
        nodes: 50,
        pods_per_node: 30,
        churn: 0.0,
        crash_rate: 0.0,
        node_churn: 0.0,
        duration: Duration::from_secs(120),
        ..SimConfig::default()
    });
    assert!(r.invariants.ok(), "invariants broken: {:?}", r.invariants);
    assert!(r.converged, "did not converge: {r:?}");
    assert!(r.convergence_seconds.is_some());
    assert_eq!(r.nodes.total, 50);
    assert_eq!(r.nodes.in_deficit, 0, "{r:?}");
    assert_eq!(r.ips.used, 50 * 30, "{r:?}");
    assert_eq!(r.pods.started, 50 * 30, "{r:?}");
    assert_eq!(r.pods.deleted, 0);
}
