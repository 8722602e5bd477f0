use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    with_local_recorder,
};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use super::*;

/// Every operator name constant, written out independently of [`OPERATOR`].
const OPERATOR_NAMES: &[&str] = &[
    IPS,
    NODES,
    POOL_IPS,
    ALLOCATION_OPS_TOTAL,
    RELEASE_OPS_TOTAL,
    IPS_ALLOCATED_TOTAL,
    IPS_RELEASED_TOTAL,
    ALLOCATION_DURATION_SECONDS,
    RECLAIM_CANDIDATES,
    RECLAIMS_TOTAL,
    RECLAIM_LATENCY_SECONDS,
    RESYNC_TOTAL,
    RESYNC_DURATION_SECONDS,
    TRIGGER_QUEUED_TOTAL,
    TRIGGER_FOLDS,
    TRIGGER_LATENCY_SECONDS,
    TRIGGER_DURATION_SECONDS,
    API_REQUESTS_TOTAL,
    API_WAIT_SECONDS,
    REPAIR_ISSUES_TOTAL,
    NODE_IPS,
    PODS_WAITING,
    POD_IP_WAIT_SECONDS,
    POOL_BLOCKS,
    POOL_VALID,
    POOL_PRESSURE,
    POOL_SCARCE,
    POOL_PRE_ALLOCATE_RATIO,
    SCARCITY_RELEASED_IPS_TOTAL,
    POOL_EXHAUSTION_SECONDS,
    LEADER,
    LEADER_TRANSITIONS_TOTAL,
    LEADER_WRITES_REFUSED_TOTAL,
];

/// Every agent name constant, written out independently of [`AGENT`].
const AGENT_NAMES: &[&str] = &[
    AGENT_CNI_REQUESTS_TOTAL,
    AGENT_CNI_DURATION_SECONDS,
    AGENT_IPS,
    AGENT_ADDS_WAITING,
    AGENT_STATUS_WRITES_TOTAL,
    AGENT_NODE_ROUTES,
    AGENT_NODE_ROUTE_OPS_TOTAL,
];

/// Every name constant of the metrics every binary exports, written out independently of
/// [`EVERY_BINARY`].
const EVERY_BINARY_NAMES: &[&str] = &[BUILD_INFO];

fn names_of(binary: Binary) -> &'static [&'static str] {
    match binary {
        Binary::Operator => OPERATOR_NAMES,
        Binary::Agent => AGENT_NAMES,
    }
}

#[test]
fn names_match_design_table() {
    assert_eq!(IPS, "tidepool_ipam_ips");
    assert_eq!(TRIGGER_FOLDS, "tidepool_ipam_trigger_folds");
    assert_eq!(LEADER, "tidepool_leader");
    // the dashboard's cluster variable reads its labels: stable
    assert_eq!(BUILD_INFO, "tidepool_build_info");
    assert_eq!(
        LEADER_TRANSITIONS_TOTAL,
        "tidepool_leader_transitions_total"
    );
    assert_eq!(
        LEADER_WRITES_REFUSED_TOTAL,
        "tidepool_leader_writes_refused_total"
    );
    assert_eq!(
        AGENT_CNI_REQUESTS_TOTAL,
        "tidepool_agent_cni_requests_total"
    );
    assert_eq!(
        AGENT_CNI_DURATION_SECONDS,
        "tidepool_agent_cni_duration_seconds"
    );
    assert_eq!(AGENT_IPS, "tidepool_agent_ips");
    assert_eq!(
        AGENT_STATUS_WRITES_TOTAL,
        "tidepool_agent_status_writes_total"
    );
    assert_eq!(AGENT_NODE_ROUTES, "tidepool_agent_node_routes");
    // the pods-waiting alert in deploy/ keys on it: stable
    assert_eq!(AGENT_ADDS_WAITING, "tidepool_agent_adds_waiting");
    // named in deploy/ and scraped by the Prometheus test: stable
    assert_eq!(PODS_WAITING, "tidepool_ipam_pods_waiting");
    assert_eq!(POD_IP_WAIT_SECONDS, "tidepool_ipam_pod_ip_wait_seconds");
    assert_eq!(POOL_BLOCKS, "tidepool_ipam_pool_blocks");
    assert_eq!(POOL_VALID, "tidepool_ipam_pool_valid");
    assert_eq!(NODE_IPS, "tidepool_ipam_node_ips");
    assert_eq!(
        AGENT_NODE_ROUTE_OPS_TOTAL,
        "tidepool_agent_node_route_ops_total"
    );
    for name in OPERATOR_NAMES {
        // IPAM's metrics are `tidepool_ipam_*`, the replica's leadership `tidepool_leader*`
        assert!(
            name.starts_with("tidepool_ipam_") || name.starts_with("tidepool_leader"),
            "{name}"
        );
    }
    for name in OPERATOR_NAMES
        .iter()
        .chain(AGENT_NAMES)
        .chain(EVERY_BINARY_NAMES)
    {
        assert!(
            name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{name}"
        );
    }
    for binary in Binary::ALL {
        let defined: Vec<&str> = binary.defs().iter().map(|d| d.name).collect();
        assert_eq!(
            defined,
            names_of(binary),
            "{binary:?}'s table must hold each of its names once, in table order"
        );
    }
    let every: Vec<&str> = EVERY_BINARY.iter().map(|d| d.name).collect();
    assert_eq!(every, EVERY_BINARY_NAMES);
    let unique: BTreeSet<&str> = all().map(|d| d.name).collect();
    assert_eq!(
        unique.len(),
        OPERATOR_NAMES.len() + AGENT_NAMES.len() + EVERY_BINARY_NAMES.len()
    );
    assert_eq!(all().count(), unique.len(), "each metric once in all()");
}

/// The split the binaries rely on: every agent metric is `tidepool_agent_*`, no operator
/// metric is, so one binary never exports the other's series.
#[test]
fn every_agent_metric_is_the_agents_and_no_operator_metric_is() {
    assert!(!AGENT.is_empty());
    for d in AGENT {
        assert!(d.name.starts_with("tidepool_agent_"), "{}", d.name);
    }
    for d in OPERATOR {
        assert!(!d.name.starts_with("tidepool_agent"), "{}", d.name);
    }
    assert_eq!(Binary::Operator.defs().len(), OPERATOR.len());
    assert_eq!(Binary::Agent.defs().len(), AGENT.len());
    assert_eq!(
        all().count(),
        EVERY_BINARY.len() + OPERATOR.len() + AGENT.len()
    );
    assert_eq!(def(AGENT_IPS).map(|d| d.kind), Some(Kind::Gauge));
}

#[test]
fn kinds_units_and_suffixes_are_consistent() {
    for d in all() {
        assert!(!d.help.is_empty(), "{} has no help", d.name);
        if d.name.ends_with("_total") {
            assert_eq!(d.kind, Kind::Counter, "{}", d.name);
        }
        if d.kind == Kind::Counter {
            assert!(
                d.name.ends_with("_total"),
                "counter {} lacks _total",
                d.name
            );
        }
        if d.name.ends_with("_seconds") {
            assert_eq!(d.unit, Some(Unit::Seconds), "{}", d.name);
            // durations are histograms; a gauge in seconds is an estimate the issue names
            // (issue 30: the time a pool has left), and only that one
            match d.name {
                POOL_EXHAUSTION_SECONDS => assert_eq!(d.kind, Kind::Gauge),
                _ => assert_eq!(d.kind, Kind::Histogram, "{}", d.name),
            }
        }
    }
    let kind = |n| def(n).unwrap().kind;
    assert_eq!(kind(IPS), Kind::Gauge);
    assert_eq!(kind(NODES), Kind::Gauge);
    assert_eq!(kind(POOL_IPS), Kind::Gauge);
    assert_eq!(kind(RECLAIM_CANDIDATES), Kind::Gauge);
    assert_eq!(kind(NODE_IPS), Kind::Gauge);
    assert_eq!(kind(PODS_WAITING), Kind::Gauge);
    assert_eq!(kind(POD_IP_WAIT_SECONDS), Kind::Histogram);
    assert_eq!(kind(POOL_BLOCKS), Kind::Gauge);
    assert_eq!(kind(POOL_VALID), Kind::Gauge);
    assert_eq!(kind(LEADER), Kind::Gauge);
    assert_eq!(kind(TRIGGER_FOLDS), Kind::Histogram);
    assert_eq!(kind(AGENT_CNI_REQUESTS_TOTAL), Kind::Counter);
    assert_eq!(kind(AGENT_CNI_DURATION_SECONDS), Kind::Histogram);
    assert_eq!(kind(AGENT_IPS), Kind::Gauge);
    assert_eq!(kind(AGENT_STATUS_WRITES_TOTAL), Kind::Counter);
    assert_eq!(kind(AGENT_NODE_ROUTES), Kind::Gauge);
    assert_eq!(kind(AGENT_ADDS_WAITING), Kind::Gauge);
    assert_eq!(kind(AGENT_NODE_ROUTE_OPS_TOTAL), Kind::Counter);
    assert!(def("tidepool_ipam_nope").is_none());
}

#[test]
fn every_histogram_has_sane_buckets() {
    let mut seen = BTreeSet::new();
    for (name, b) in buckets() {
        assert!(seen.insert(*name), "{name} listed twice");
        let d = def(name).unwrap_or_else(|| panic!("buckets for unknown metric {name}"));
        assert_eq!(d.kind, Kind::Histogram, "buckets for non-histogram {name}");
        assert!(b.len() >= 5, "{name}: too few buckets");
        assert!(b.iter().all(|x| x.is_finite() && *x > 0.0), "{name}");
        assert!(
            b.windows(2).all(|w| w[0] < w[1]),
            "{name}: buckets not increasing"
        );
    }
    for d in all().filter(|d| d.kind == Kind::Histogram) {
        assert!(d.buckets().is_some(), "histogram {} has no buckets", d.name);
    }
    // Per-metric ranges the dashboards rely on.
    let last = |n| *def(n).unwrap().buckets().unwrap().last().unwrap();
    let first = |n| def(n).unwrap().buckets().unwrap()[0];
    assert!(last(RECLAIM_LATENCY_SECONDS) >= 600.0);
    assert!(first(RECLAIM_LATENCY_SECONDS) <= 5.0);
    assert!(first(TRIGGER_LATENCY_SECONDS) <= 0.001);
    assert!(last(API_WAIT_SECONDS) >= 300.0);
    assert_eq!(first(TRIGGER_FOLDS), 1.0);
    // the agent's CNI requests: sub-millisecond answers to an ADD's 10 s plugin timeout
    assert!(first(AGENT_CNI_DURATION_SECONDS) <= 0.0005);
    assert!(last(AGENT_CNI_DURATION_SECONDS) >= 10.0);
    // pod bound → address: from 10 ms (a free address at hand) to minutes (an exhausted
    // pool waiting for a reclaim)
    assert!(first(POD_IP_WAIT_SECONDS) <= 0.01);
    assert!(last(POD_IP_WAIT_SECONDS) >= 180.0);
    assert!(def(IPS).unwrap().buckets().is_none());
}

/// A recorder that keeps what was described.
#[derive(Default, Clone)]
struct DescribeLog(Arc<Mutex<Vec<Described>>>);

/// Name, kind, unit, help.
type Described = (String, MetricKind, Option<Unit>, String);

impl DescribeLog {
    fn push(&self, k: KeyName, kind: MetricKind, unit: Option<Unit>, d: SharedString) {
        self.0
            .lock()
            .unwrap()
            .push((k.as_str().to_string(), kind, unit, d.to_string()));
    }
}

impl Recorder for DescribeLog {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.push(k, MetricKind::Counter, u, d)
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.push(k, MetricKind::Gauge, u, d)
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.push(k, MetricKind::Histogram, u, d)
    }
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[test]
fn describe_all_describes_exactly_the_binarys_metrics_with_kind_unit_and_help() {
    for binary in Binary::ALL {
        let log = DescribeLog::default();
        with_local_recorder(&log, || describe_all(binary));
        let got = log.0.lock().unwrap().clone();
        let described: Vec<&str> = got.iter().map(|(n, ..)| n.as_str()).collect();
        let want: Vec<&str> = [EVERY_BINARY_NAMES, names_of(binary)].concat();
        assert_eq!(described, want, "{binary:?}");
        for d in binary.exported() {
            let (_, kind, unit, help) = got
                .iter()
                .find(|(n, ..)| n == d.name)
                .unwrap_or_else(|| panic!("{} not described", d.name));
            let want = match d.kind {
                Kind::Counter => MetricKind::Counter,
                Kind::Gauge => MetricKind::Gauge,
                Kind::Histogram => MetricKind::Histogram,
            };
            assert_eq!(*kind, want, "{}", d.name);
            assert_eq!(*unit, d.unit, "{}", d.name);
            assert_eq!(help, d.help);
        }
    }
}

type Series = BTreeMap<String, BTreeSet<Vec<(String, String)>>>;

/// Name, labels, value.
type Value = (String, Vec<(String, String)>, DebugValue);

fn snapshot(s: &Snapshotter) -> (Series, Vec<Value>) {
    let mut by_name: Series = BTreeMap::new();
    let mut values = Vec::new();
    for (ck, _unit, _desc, value) in s.snapshot().into_vec() {
        let (_, key) = ck.into_parts();
        let labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect();
        by_name
            .entry(key.name().to_string())
            .or_default()
            .insert(labels.clone());
        values.push((key.name().to_string(), labels, value));
    }
    (by_name, values)
}

#[test]
fn register_zero_registers_every_enumerated_series() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    with_local_recorder(&rec, || register_zero(Binary::Operator));
    let (series, values) = snapshot(&snap);

    // Expected series counts, from DESIGN.md's table.
    let expected: &[(&str, usize)] = &[
        (NODES, 5),
        // three sources (memory is simulate's default) × two outcomes
        (ALLOCATION_OPS_TOTAL, 3 * 2),
        (RELEASE_OPS_TOTAL, 3 * 2),
        (IPS_ALLOCATED_TOTAL, 2),
        (IPS_RELEASED_TOTAL, 2),
        (ALLOCATION_DURATION_SECONDS, 2 * 2),
        (RECLAIM_CANDIDATES, 1),
        (RECLAIMS_TOTAL, 4 * 3),
        (RECLAIM_LATENCY_SECONDS, 1),
        (RESYNC_TOTAL, 1),
        (RESYNC_DURATION_SECONDS, 1),
        (TRIGGER_QUEUED_TOTAL, 2),
        (TRIGGER_FOLDS, 2),
        (TRIGGER_LATENCY_SECONDS, 2),
        (TRIGGER_DURATION_SECONDS, 2),
        (API_REQUESTS_TOTAL, 2 * 4 + 3 * 4),
        (API_WAIT_SECONDS, 2),
        (REPAIR_ISSUES_TOTAL, 5),
        (POD_IP_WAIT_SECONDS, 1),
        (LEADER, 1),
        (LEADER_TRANSITIONS_TOTAL, 1),
        (LEADER_WRITES_REFUSED_TOTAL, 1),
    ];
    for (name, n) in expected {
        let got = series.get(*name).map_or(0, |s| s.len());
        assert_eq!(got, *n, "{name}: series registered");
    }
    // Not enumerable (a pool or node label): left to their first recording.
    assert!(!series.contains_key(IPS));
    assert!(!series.contains_key(PODS_WAITING));
    assert!(!series.contains_key(POOL_IPS));
    assert!(!series.contains_key(NODE_IPS));
    assert!(!series.contains_key(POOL_BLOCKS));
    assert!(!series.contains_key(POOL_VALID));
    // and nothing of the agent's
    assert_eq!(series.len(), expected.len());
    assert!(series.keys().all(|n| !n.starts_with("tidepool_agent")));

    // Every enumerated value of every label appears.
    let values_of = |name: &str, key: &str| -> BTreeSet<String> {
        series[name]
            .iter()
            .flat_map(|s| s.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()))
            .collect()
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        values_of(NODES, "category"),
        set(&["total", "in-deficit", "at-capacity", "releasing", "blocked"])
    );
    assert_eq!(
        values_of(RECLAIMS_TOTAL, "reason"),
        set(&[
            "pod-deleted",
            "pod-terminal",
            "sandbox-replaced",
            "node-deleted"
        ])
    );
    assert_eq!(
        values_of(RECLAIMS_TOTAL, "outcome"),
        set(&["reclaimed", "failed", "refused"])
    );
    assert_eq!(
        values_of(REPAIR_ISSUES_TOTAL, "kind"),
        set(&[
            "duplicate",
            "out-of-range",
            "unknown-pool",
            "orphan-block",
            "leaked"
        ])
    );
    assert_eq!(
        values_of(TRIGGER_QUEUED_TOTAL, "trigger"),
        set(&["pool-maintainer", "resync"])
    );
    assert_eq!(values_of(API_WAIT_SECONDS, "api"), set(&["source", "kube"]));
    assert_eq!(
        values_of(ALLOCATION_OPS_TOTAL, "outcome"),
        set(&["success", "failure"])
    );
    assert_eq!(
        values_of(ALLOCATION_OPS_TOTAL, "source"),
        set(&["cluster-pool", "sim-cloud", "memory"])
    );
    // `op` depends on `api`: no kube "allocate", no source "apply".
    for s in &series[API_REQUESTS_TOTAL] {
        let get = |k: &str| s.iter().find(|(kk, _)| kk == k).unwrap().1.as_str();
        let ops = api::ops(get("api"));
        assert!(ops.contains(&get("op")), "{s:?}");
    }

    // All at zero, histograms without samples.
    for (name, labels, value) in values {
        match value {
            DebugValue::Counter(v) => assert_eq!(v, 0, "{name} {labels:?}"),
            DebugValue::Gauge(v) => assert_eq!(v.into_inner(), 0.0, "{name} {labels:?}"),
            DebugValue::Histogram(v) => assert!(v.is_empty(), "{name} {labels:?}"),
        }
    }
}

#[test]
fn register_zero_keeps_existing_values() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    with_local_recorder(&rec, || {
        metrics::gauge!(LEADER).set(1.0);
        metrics::counter!(RESYNC_TOTAL).increment(3);
        metrics::histogram!(RESYNC_DURATION_SECONDS).record(0.5);
        register_zero(Binary::Operator);
    });
    let (_, values) = snapshot(&snap);
    let get = |n: &str| {
        values
            .iter()
            .find(|(name, ..)| name == n)
            .map(|(.., v)| v)
            .unwrap()
    };
    assert_eq!(get(LEADER), &DebugValue::Gauge(1.0.into()));
    assert_eq!(get(RESYNC_TOTAL), &DebugValue::Counter(3));
    assert_eq!(
        get(RESYNC_DURATION_SECONDS),
        &DebugValue::Histogram(vec![0.5.into()])
    );
}

#[test]
fn register_zero_of_the_agent_registers_only_the_agents_series() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    with_local_recorder(&rec, || register_zero(Binary::Agent));
    let (series, values) = snapshot(&snap);
    let expected: &[(&str, usize)] = &[
        // add, check, gc, status: ok and error; del: ok, error, stale, unknown
        (AGENT_CNI_REQUESTS_TOTAL, 4 * 2 + 4),
        (AGENT_CNI_DURATION_SECONDS, 5),
        (AGENT_IPS, 2 * 4),
        (AGENT_ADDS_WAITING, 1),
        (AGENT_STATUS_WRITES_TOTAL, 4),
        (AGENT_NODE_ROUTES, 1),
        // add, delete: ok and error
        (AGENT_NODE_ROUTE_OPS_TOTAL, 2 * 2),
    ];
    for (name, n) in expected {
        let got = series.get(*name).map_or(0, |s| s.len());
        assert_eq!(got, *n, "{name}: series registered");
    }
    assert_eq!(series.len(), expected.len(), "{:?}", series.keys());
    let has = |name: &str, labels: &[(&str, &str)]| {
        let want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        series[name].contains(&want)
    };
    assert!(has(
        AGENT_CNI_REQUESTS_TOTAL,
        &[("verb", "del"), ("outcome", "stale")]
    ));
    assert!(has(
        AGENT_CNI_REQUESTS_TOTAL,
        &[("verb", "del"), ("outcome", "unknown")]
    ));
    assert!(has(
        AGENT_CNI_REQUESTS_TOTAL,
        &[("verb", "status"), ("outcome", "error")]
    ));
    // only a DEL is stale or unknown
    assert!(!has(
        AGENT_CNI_REQUESTS_TOTAL,
        &[("verb", "add"), ("outcome", "stale")]
    ));
    for state in ["pool", "used", "cooldown", "marked"] {
        assert!(has(AGENT_IPS, &[("family", "ipv6"), ("state", state)]));
    }
    for outcome in ["ok", "conflict", "gone", "error"] {
        assert!(has(AGENT_STATUS_WRITES_TOTAL, &[("outcome", outcome)]));
    }
    for (name, labels, value) in values {
        match value {
            DebugValue::Counter(v) => assert_eq!(v, 0, "{name} {labels:?}"),
            DebugValue::Gauge(v) => assert_eq!(v.into_inner(), 0.0, "{name} {labels:?}"),
            DebugValue::Histogram(v) => assert!(v.is_empty(), "{name} {labels:?}"),
        }
    }
}

/// A pool's states, written out independently of [`pool_state::ALL`], each one explained by
/// the help text (`idle` is what the exhaustion forecast alert adds to `free`).
#[test]
fn pool_ips_states_are_the_ones_its_help_explains() {
    let states = ["capacity", "allocated", "free", "idle"];
    assert_eq!(pool_state::ALL, states);
    let help = def(POOL_IPS).unwrap().help;
    for s in states {
        assert!(help.contains(s), "{s} is not in the help: {help}");
    }
}

#[test]
fn series_of_a_metric_without_labels_is_one_empty_set() {
    assert_eq!(def(LEADER).unwrap().series(), vec![Vec::new()]);
    assert!(def(POOL_IPS).unwrap().series().is_empty());
    let api_series = def(API_REQUESTS_TOTAL).unwrap().series();
    assert!(api_series.contains(&vec![
        ("api", "kube"),
        ("op", "apply"),
        ("outcome", "conflict")
    ]));
    assert!(
        !api_series
            .iter()
            .any(|s| s.contains(&("api", "kube")) && s.contains(&("op", "allocate")))
    );
}
