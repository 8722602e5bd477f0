//! Histogram buckets: explicit for every histogram, so histograms export as histograms.

use crate::names::*;

/// Trigger latency: the pool maintainer's min interval is milliseconds; a trigger that waits
/// behind a long run (budget waits) can take a minute.
const TRIGGER_LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
/// One maintenance pass or resync run: in-memory passes take microseconds to milliseconds;
/// passes that call a budgeted cloud API can take minutes.
const TRIGGER_DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
];
/// Folded trigger calls per run (a count, at least 1).
const TRIGGER_FOLDS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 250.0, 1000.0];
/// Budget waits: at --api-qps 4 a queue of thousands of nodes waits many minutes.
const API_WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
];
/// Source call latency: an API server write takes milliseconds, a cloud call up to tens of
/// seconds (and calls that time out after taking effect up to a minute).
const ALLOCATION_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Reclaim latency is bounded below by reclaim-grace (30s) and reclaim-min-age (2m): buckets
/// around those, up to ~10 minutes.
const RECLAIM_LATENCY_BUCKETS: &[f64] = &[
    1.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 150.0, 180.0, 240.0, 300.0, 450.0, 600.0,
    900.0,
];
/// A resync recalculates and triggers every node: milliseconds for hundreds of nodes, seconds
/// for tens of thousands.
const RESYNC_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The agent's CNI requests: an fsync takes ~0.5-20 ms; an ADD that finds the pool empty waits
/// up to 5 s for a block, and the plugin gives up at its 10 s request timeout.
const CNI_DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Pod bound → address: an address already in the node's pool is used within tens of
/// milliseconds of the operator's look; a block claim takes a pass and an API write (tens of
/// milliseconds to seconds); a cloud call behind a budget queue, or a pool exhausted until a
/// reclaim frees it (reclaim-grace 30s, reclaim-min-age 2m), minutes.
const POD_IP_WAIT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 300.0,
];

/// Explicit buckets of every histogram (of every binary), by full metric name.
pub fn buckets() -> &'static [(&'static str, &'static [f64])] {
    &[
        (ALLOCATION_DURATION_SECONDS, ALLOCATION_DURATION_BUCKETS),
        (RECLAIM_LATENCY_SECONDS, RECLAIM_LATENCY_BUCKETS),
        (RESYNC_DURATION_SECONDS, RESYNC_DURATION_BUCKETS),
        (TRIGGER_FOLDS, TRIGGER_FOLDS_BUCKETS),
        (TRIGGER_LATENCY_SECONDS, TRIGGER_LATENCY_BUCKETS),
        (TRIGGER_DURATION_SECONDS, TRIGGER_DURATION_BUCKETS),
        (API_WAIT_SECONDS, API_WAIT_BUCKETS),
        (POD_IP_WAIT_SECONDS, POD_IP_WAIT_BUCKETS),
        (AGENT_CNI_DURATION_SECONDS, CNI_DURATION_BUCKETS),
    ]
}
