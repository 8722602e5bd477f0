use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use metrics::with_local_recorder;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use super::*;
use crate::table::{Binary, Values, all, def};

/// A series: the metric's name and its labels, in the order recorded.
type Series = (String, Vec<(String, String)>);

fn snapshot(s: &Snapshotter) -> BTreeMap<Series, DebugValue> {
    s.snapshot()
        .into_vec()
        .into_iter()
        .map(|(ck, _, _, value)| {
            let (_, key) = ck.into_parts();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            ((key.name().to_owned(), labels), value)
        })
        .collect()
}

fn recorded(v: &DebugValue) -> bool {
    match v {
        DebugValue::Counter(n) => *n > 0,
        DebugValue::Gauge(g) => g.into_inner() != 0.0,
        DebugValue::Histogram(h) => !h.is_empty(),
    }
}

/// Every recording function with every value of its enumerated labels (the CNI outcomes
/// only with the verbs that have them: a DEL is stale or unknown, no other verb is).
fn record_every_value() {
    let d = Duration::from_millis(5);
    for &f in Family::ALL {
        for &s in IpsState::ALL {
            ips(f, s, "default", 1.0);
            node_ips("node-1", f, s, 1.0);
        }
        for &s in PoolState::ALL {
            pool_ips("default", f, s, 1.0);
        }
        for &s in BlockState::ALL {
            pool_blocks("default", f, s, 1.0);
        }
        pool_valid("default", true);
        pool_scarcity("default", f, 0.9, true, 0.5);
        scarcity_released_ips("default", f, 16);
        pool_exhaustion("default", f, 3600.0);
        for &s in AgentIpsState::ALL {
            agent_ips(f, s, 1.0);
        }
        ips_allocated(f, 1);
        ips_released(f, 1);
        pods_waiting(f, "default", 1.0);
    }
    for &c in NodeCategory::ALL {
        nodes(c, 1.0);
    }
    for &o in Outcome::ALL {
        for &s in Source::ALL {
            allocation_ops(s, o);
            release_ops(s, o);
        }
        for &op in SourceOp::ALL {
            allocation_duration(op, o, d);
        }
    }
    reclaim_candidates(1.0);
    for &r in ReclaimReason::ALL {
        for &o in ReclaimOutcome::ALL {
            reclaims(r, o, 1);
        }
    }
    reclaim_latency(d);
    resync();
    resync_duration(d);
    for &t in Trigger::ALL {
        trigger_queued(t);
        trigger_folds(t, 1);
        trigger_latency(t, d);
        trigger_duration(t, d);
    }
    let source_ops = SourceOp::ALL.iter().map(|&op| ApiOp::Source(op));
    for op in source_ops.chain(KubeOp::ALL.iter().map(|&op| ApiOp::Kube(op))) {
        for &o in ApiOutcome::ALL {
            api_requests(op, o);
        }
    }
    for &a in Api::ALL {
        api_wait(a, d);
    }
    for &k in RepairKind::ALL {
        repair_issues(k, 1);
    }
    pod_ip_wait(d);
    leader(true);
    leader_transitions();
    leader_writes_refused();
    for &v in CniVerb::ALL {
        let outcomes: &[CniOutcome] = match v {
            CniVerb::Del => CniOutcome::ALL,
            _ => &[CniOutcome::Ok, CniOutcome::Error],
        };
        for &o in outcomes {
            agent_cni_requests(v, o);
        }
        agent_cni_duration(v, d);
    }
    for &o in StatusWriteOutcome::ALL {
        agent_status_writes(o);
    }
    agent_node_routes(1.0);
    build_info(crate::BuildInfo {
        version: "1.2.3",
        commit: "0abc123",
    });
    agent_adds_waiting(1.0);
    for &op in RouteOp::ALL {
        for &o in RouteOutcome::ALL {
            agent_node_route_ops(op, o);
        }
    }
}

/// What the recording functions record is what the exporter registered at zero: every
/// registered series is reachable by them, and they record no series it did not register
/// but those with a free label (`pool`, `node`), under the table's keys in its order.
#[test]
fn every_recording_lands_on_a_series_registered_at_zero() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    with_local_recorder(&rec, || {
        Binary::ALL.into_iter().for_each(crate::register_zero)
    });
    let zeroed: BTreeSet<Series> = snapshot(&snap).into_keys().collect();
    with_local_recorder(&rec, record_every_value);
    let after = snapshot(&snap);

    for series in &zeroed {
        let value = &after[series];
        assert!(
            recorded(value),
            "{series:?} registered but never recorded: {value:?}"
        );
    }
    for ((name, labels), value) in after.iter().filter(|(s, _)| !zeroed.contains(*s)) {
        let d = def(name).unwrap_or_else(|| panic!("{name}: not in the table"));
        assert!(
            d.labels.iter().any(|(_, v)| matches!(v, Values::Free)),
            "{name} {labels:?}: recorded, not registered at zero, yet enumerable"
        );
        let keys: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
        let want: Vec<&str> = d.labels.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, want, "{name}: the table's label keys, in its order");
        assert!(recorded(value), "{name} {labels:?}");
    }
    for d in all() {
        assert!(
            after.keys().any(|(name, _)| name == d.name),
            "{}: no recording function records it",
            d.name
        );
    }
}

#[test]
fn counters_add_gauges_set_and_histograms_take_seconds() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    with_local_recorder(&rec, || {
        reclaims(ReclaimReason::NodeDeleted, ReclaimOutcome::Reclaimed, 7);
        reclaims(ReclaimReason::NodeDeleted, ReclaimOutcome::Reclaimed, 2);
        node_ips("n-1", Family::Ipv6, IpsState::Needed, 3.0);
        node_ips("n-1", Family::Ipv6, IpsState::Needed, 4.0);
        api_wait(Api::Kube, Duration::from_millis(1500));
        leader(true);
        leader(false);
    });
    let got = snapshot(&snap);
    let get = |name: &str, labels: &[(&str, &str)]| {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        got.get(&(name.to_owned(), labels))
    };
    let reclaimed = [("reason", "node-deleted"), ("outcome", "reclaimed")];
    assert_eq!(
        get(RECLAIMS_TOTAL, &reclaimed),
        Some(&DebugValue::Counter(9))
    );
    let needed = [("node", "n-1"), ("family", "ipv6"), ("state", "needed")];
    assert_eq!(get(NODE_IPS, &needed), Some(&DebugValue::Gauge(4.0.into())));
    assert_eq!(
        get(API_WAIT_SECONDS, &[("api", "kube")]),
        Some(&DebugValue::Histogram(vec![1.5.into()]))
    );
    assert_eq!(get(LEADER, &[]), Some(&DebugValue::Gauge(0.0.into())));
    assert_eq!(got.len(), 4, "{got:?}");
}

#[test]
fn an_api_op_is_one_of_its_apis_ops_and_an_outcome_follows_its_result() {
    let ops = [
        ApiOp::Source(SourceOp::Allocate),
        ApiOp::Source(SourceOp::Release),
        ApiOp::Kube(KubeOp::Create),
        ApiOp::Kube(KubeOp::Delete),
        ApiOp::Kube(KubeOp::Apply),
    ];
    for op in ops {
        assert!(api::ops(op.api().as_str()).contains(&op.as_str()), "{op:?}");
    }
    assert_eq!(ApiOp::Kube(KubeOp::Apply).api(), Api::Kube);
    assert_eq!(ApiOp::Source(SourceOp::Release).as_str(), "release");
    assert_eq!(Outcome::of(&Ok::<(), ()>(())), Outcome::Success);
    assert_eq!(Outcome::of(&Err::<(), ()>(())), Outcome::Failure);
    assert_eq!(ApiOutcome::from(Outcome::Success), ApiOutcome::Success);
    assert_eq!(ApiOutcome::from(Outcome::Failure), ApiOutcome::Failure);
}
