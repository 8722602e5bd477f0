//! Priority admission through the whole engine: with the source budget at 1 call/s, a node
//! with pods waiting is served before an idle node that is far below its min-allocate; in
//! FIFO mode arrival order wins.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::time::Duration;

use tidepool_ipam::EngineConfig;
use tidepool_ipam::SchedulingMode;
use tidepool_ipam::Watermarks;
use tidepool_sim::{World, WorldConfig};

fn world(mode: SchedulingMode) -> World {
    World::start(WorldConfig {
        source_qps: 1.0,
        source_burst: 1,
        scheduling: mode,
        engine: EngineConfig {
            watermarks: Watermarks {
                pre_allocate: 0,
                ..Watermarks::default()
            },
            ..EngineConfig::default()
        },
        ..WorldConfig::default()
    })
    .expect("world")
}

fn pool(w: &World, node: &str) -> usize {
    w.node(node)
        .map_or(0, |n| n.operator.addresses.total() as usize)
}

/// Joins "blocker" (takes the one token), then the idle node (min-allocate 50, first in the
/// queue) and the busy node (5 pods waiting). Returns which of them got addresses first.
async fn first_served(w: &World) -> &'static str {
    let blocker = w.add_node("blocker");
    w.schedule_pod(&blocker);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pool(w, "blocker"), 1, "the blocker used the burst");

    let idle = w.add_node("idle");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        w.node("idle").is_some(),
        "the operator creates the IPAMNode"
    );
    w.set_watermarks(
        &idle,
        tidepool_ipam::WatermarkOverrides {
            min_allocate: Some(50),
            ..Default::default()
        },
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = w.add_node("busy");
    for _ in 0..5 {
        w.schedule_pod(&busy);
    }
    // both wait for the next token (at 1 s); exactly one is served by 1.5 s
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (i, b) = (pool(w, "idle"), pool(w, "busy"));
    assert!(
        i == 0 || b == 0,
        "only one token was due: idle {i}, busy {b}"
    );
    // the other one follows a second later
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!((pool(w, "idle"), pool(w, "busy")), (50, 5));
    assert!(w.observer.invariants().ok());
    if b > 0 { "busy" } else { "idle" }
}

#[tokio::test(start_paused = true)]
async fn pods_waiting_beat_a_larger_idle_deficit() {
    let w = world(SchedulingMode::Priority);
    assert_eq!(first_served(&w).await, "busy");
}

#[tokio::test(start_paused = true)]
async fn fifo_serves_in_arrival_order() {
    let w = world(SchedulingMode::Fifo);
    assert_eq!(first_served(&w).await, "idle");
}
