//! Every tidepool metric in one place: name, type, unit, help text, label keys and their
//! enumerated values, and the histogram buckets (DESIGN.md, "Metrics").
//!
//! The engine and the node agent record through the [`metrics`] facade with the names and
//! label values defined here; each binary installs a recorder. The table is split by the
//! binary that exports a metric ([`Binary`]: [`OPERATOR`], [`AGENT`]): each binary describes
//! and registers only its own series, so neither exports the other's at zero. With feature
//! `exporter`, [`install_exporter`] builds the Prometheus recorder with every histogram's
//! buckets (so histograms export as histograms, not summaries), serves `/metrics`, describes
//! the binary's metrics and registers their enumerated series at zero so dashboards and alerts
//! see them before the first event. With feature `probes`, [`probes`] serves `/healthz` and
//! `/readyz` (both binaries' Kubernetes probes).
//!
//! Label values live in one module per label (`family::IPV4`, `family::ALL`, `family::KEY`).
//! Labels whose values are not enumerable (`pool`, `node`) have only a `KEY`; their series are not
//! registered at zero.
#![cfg_attr(test, allow(clippy::too_many_lines))]
#![forbid(unsafe_code)]

use metrics::{Label, Unit};

#[cfg(feature = "exporter")]
mod exporter;
#[cfg(feature = "exporter")]
pub use exporter::{
    install_exporter, install_exporter_with, prometheus_builder, prometheus_builder_with,
};
#[cfg(feature = "exporter")]
pub use metrics_exporter_prometheus::PrometheusHandle;
#[cfg(feature = "probes")]
pub mod probes;

// ---------------------------------------------------------------------------------------------
// Metric names.

/// Addresses by family and state, cluster-wide (gauge; `family`, `state`).
pub const IPS: &str = "tidepool_ipam_ips";
/// Nodes by category (gauge; `category`).
pub const NODES: &str = "tidepool_ipam_nodes";
/// Addresses of one IPPool (gauge; `pool`, `family`, `state`).
pub const POOL_IPS: &str = "tidepool_ipam_pool_ips";
/// Allocation calls to the IP source (counter; `source`, `outcome`).
pub const ALLOCATION_OPS_TOTAL: &str = "tidepool_ipam_allocation_ops_total";
/// Release calls to the IP source (counter; `source`, `outcome`).
pub const RELEASE_OPS_TOTAL: &str = "tidepool_ipam_release_ops_total";
/// Addresses granted to nodes (counter; `family`).
pub const IPS_ALLOCATED_TOTAL: &str = "tidepool_ipam_ips_allocated_total";
/// Addresses taken back from nodes (counter; `family`).
pub const IPS_RELEASED_TOTAL: &str = "tidepool_ipam_ips_released_total";
/// Duration of one allocate or release call to the source (histogram; `op`, `outcome`).
pub const ALLOCATION_DURATION_SECONDS: &str = "tidepool_ipam_allocation_duration_seconds";
/// `used` entries that are reclaim candidates right now (gauge).
pub const RECLAIM_CANDIDATES: &str = "tidepool_ipam_reclaim_candidates";
/// Reclaims (counter; `reason`, `outcome`).
pub const RECLAIMS_TOTAL: &str = "tidepool_ipam_reclaims_total";
/// Pod gone → tombstone written (histogram).
pub const RECLAIM_LATENCY_SECONDS: &str = "tidepool_ipam_reclaim_latency_seconds";
/// Periodic resyncs (counter).
pub const RESYNC_TOTAL: &str = "tidepool_ipam_resync_total";
/// Duration of one resync (histogram).
pub const RESYNC_DURATION_SECONDS: &str = "tidepool_ipam_resync_duration_seconds";
/// Trigger calls (counter; `trigger`).
pub const TRIGGER_QUEUED_TOTAL: &str = "tidepool_ipam_trigger_queued_total";
/// Trigger calls folded into one run (histogram; `trigger`).
pub const TRIGGER_FOLDS: &str = "tidepool_ipam_trigger_folds";
/// First queued trigger → run start (histogram; `trigger`).
pub const TRIGGER_LATENCY_SECONDS: &str = "tidepool_ipam_trigger_latency_seconds";
/// Duration of one triggered run (histogram; `trigger`).
pub const TRIGGER_DURATION_SECONDS: &str = "tidepool_ipam_trigger_duration_seconds";
/// Budgeted mutating API calls (counter; `api`, `op`, `outcome`).
pub const API_REQUESTS_TOTAL: &str = "tidepool_ipam_api_requests_total";
/// Time waited for a budget token (histogram; `api`).
pub const API_WAIT_SECONDS: &str = "tidepool_ipam_api_wait_seconds";
/// Issues found by repair (counter; `kind`).
pub const REPAIR_ISSUES_TOTAL: &str = "tidepool_ipam_repair_issues_total";
/// Addresses of one node (gauge; `node`, `family`, `state`; only with `--per-node-metrics`).
pub const NODE_IPS: &str = "tidepool_ipam_node_ips";
/// Pods bound to a node, not terminal, with no address of a family the node serves yet
/// (gauge; `family`).
pub const PODS_WAITING: &str = "tidepool_ipam_pods_waiting";
/// The operator's first sight of a pod waiting → its UID in the node's `used` list
/// (histogram).
pub const POD_IP_WAIT_SECONDS: &str = "tidepool_ipam_pod_ip_wait_seconds";
/// Claimed blocks of one IPPool by how used they are (gauge; `pool`, `family`, `state`).
pub const POOL_BLOCKS: &str = "tidepool_ipam_pool_blocks";
/// 1 while this replica leads, else 0 (gauge).
pub const LEADER: &str = "tidepool_leader";
/// Times this replica became the leader (counter).
pub const LEADER_TRANSITIONS_TOTAL: &str = "tidepool_leader_transitions_total";
/// Writes not sent because this replica did not lead (counter).
pub const LEADER_WRITES_REFUSED_TOTAL: &str = "tidepool_leader_writes_refused_total";

/// CNI requests the node agent answered (counter; `verb`, `outcome`).
pub const AGENT_CNI_REQUESTS_TOTAL: &str = "tidepool_agent_cni_requests_total";
/// The node agent's receipt of a CNI request → its reply, durable write included (histogram;
/// `verb`).
pub const AGENT_CNI_DURATION_SECONDS: &str = "tidepool_agent_cni_duration_seconds";
/// Addresses of the agent's node (gauge; `family`, `state`).
pub const AGENT_IPS: &str = "tidepool_agent_ips";
/// The node agent's server-side applies of the node side's fields (counter; `outcome`).
pub const AGENT_STATUS_WRITES_TOTAL: &str = "tidepool_agent_status_writes_total";
/// Routes to other nodes' blocks the agent owns now (gauge; only with `--node-routes`).
pub const AGENT_NODE_ROUTES: &str = "tidepool_agent_node_routes";
/// The agent's route adds and deletes (counter; `op`, `outcome`; only with `--node-routes`).
pub const AGENT_NODE_ROUTE_OPS_TOTAL: &str = "tidepool_agent_node_route_ops_total";

// ---------------------------------------------------------------------------------------------
// Labels and their enumerated values.

/// Label `family`.
pub mod family {
    pub const KEY: &str = "family";
    pub const IPV4: &str = "ipv4";
    pub const IPV6: &str = "ipv6";
    pub const ALL: &[&str] = &[IPV4, IPV6];
}

/// Label `state` of [`crate::IPS`] and [`crate::NODE_IPS`].
pub mod ips_state {
    pub const KEY: &str = "state";
    pub const ALLOCATED: &str = "allocated";
    pub const USED: &str = "used";
    pub const FREE: &str = "free";
    pub const COOLDOWN: &str = "cooldown";
    pub const NEEDED: &str = "needed";
    pub const EXCESS: &str = "excess";
    pub const ALL: &[&str] = &[ALLOCATED, USED, FREE, COOLDOWN, NEEDED, EXCESS];
}

/// Label `category` of [`crate::NODES`].
pub mod node_category {
    pub const KEY: &str = "category";
    pub const TOTAL: &str = "total";
    pub const IN_DEFICIT: &str = "in-deficit";
    pub const AT_CAPACITY: &str = "at-capacity";
    pub const RELEASING: &str = "releasing";
    pub const BLOCKED: &str = "blocked";
    pub const ALL: &[&str] = &[TOTAL, IN_DEFICIT, AT_CAPACITY, RELEASING, BLOCKED];
}

/// Label `state` of [`crate::POOL_IPS`].
pub mod pool_state {
    pub const KEY: &str = "state";
    pub const CAPACITY: &str = "capacity";
    pub const ALLOCATED: &str = "allocated";
    pub const FREE: &str = "free";
    pub const ALL: &[&str] = &[CAPACITY, ALLOCATED, FREE];
}

/// Label `state` of [`crate::POOL_BLOCKS`]: a claimed block by how many of its usable
/// addresses have a `used` entry of the node holding it.
pub mod block_state {
    pub const KEY: &str = "state";
    /// Every usable address used.
    pub const FULL: &str = "full";
    /// Some used, some not.
    pub const PARTIAL: &str = "partial";
    /// None used (releasable once past the node's watermarks).
    pub const EMPTY: &str = "empty";
    pub const ALL: &[&str] = &[FULL, PARTIAL, EMPTY];
}

/// Label `pool` (an IPPool's name; not enumerable).
pub mod pool {
    pub const KEY: &str = "pool";
}

/// Label `node` (a node's name; not enumerable).
pub mod node {
    pub const KEY: &str = "node";
}

/// Label `source` of the allocation and release op counters: the IP source implementation.
pub mod source {
    pub const KEY: &str = "source";
    pub const CLUSTER_POOL: &str = "cluster-pool";
    pub const SIM_CLOUD: &str = "sim-cloud";
    /// `simulate`'s default source: an in-memory address range.
    pub const MEMORY: &str = "memory";
    pub const ALL: &[&str] = &[CLUSTER_POOL, SIM_CLOUD, MEMORY];
}

/// Label `outcome` of the op counters, the allocation duration and the trigger runs.
pub mod outcome {
    pub const KEY: &str = "outcome";
    pub const SUCCESS: &str = "success";
    pub const FAILURE: &str = "failure";
    pub const ALL: &[&str] = &[SUCCESS, FAILURE];
}

/// Label `op` of [`crate::ALLOCATION_DURATION_SECONDS`] and of
/// [`crate::API_REQUESTS_TOTAL`] with `api="source"`: the source's mutating
/// calls.
pub mod source_op {
    pub const KEY: &str = "op";
    pub const ALLOCATE: &str = "allocate";
    pub const RELEASE: &str = "release";
    pub const ALL: &[&str] = &[ALLOCATE, RELEASE];
}

/// Label `op` of [`crate::API_REQUESTS_TOTAL`] with `api="kube"`: API
/// server writes (cluster-pool block claims are `create`, block releases `delete`, IPAMNode
/// server-side applies `apply`).
pub mod kube_op {
    pub const KEY: &str = "op";
    pub const CREATE: &str = "create";
    pub const DELETE: &str = "delete";
    pub const APPLY: &str = "apply";
    pub const ALL: &[&str] = &[CREATE, DELETE, APPLY];
}

/// Label `outcome` of [`crate::API_REQUESTS_TOTAL`]: finer than
/// [`crate::outcome`] so conflicts (409) and throttling (429) can be alerted on.
pub mod api_outcome {
    pub const KEY: &str = "outcome";
    pub const SUCCESS: &str = "success";
    pub const CONFLICT: &str = "conflict";
    pub const THROTTLED: &str = "throttled";
    pub const FAILURE: &str = "failure";
    pub const ALL: &[&str] = &[SUCCESS, CONFLICT, THROTTLED, FAILURE];
}

/// Label `api`: the budget a call draws on.
pub mod api {
    pub const KEY: &str = "api";
    pub const SOURCE: &str = "source";
    pub const KUBE: &str = "kube";
    pub const ALL: &[&str] = &[SOURCE, KUBE];

    /// The `op` values of one API.
    pub fn ops(api: &str) -> &'static [&'static str] {
        match api {
            SOURCE => super::source_op::ALL,
            KUBE => super::kube_op::ALL,
            _ => &[],
        }
    }
}

/// Label `reason` of [`crate::RECLAIMS_TOTAL`].
pub mod reclaim_reason {
    pub const KEY: &str = "reason";
    pub const POD_DELETED: &str = "pod-deleted";
    pub const POD_TERMINAL: &str = "pod-terminal";
    pub const SANDBOX_REPLACED: &str = "sandbox-replaced";
    pub const NODE_DELETED: &str = "node-deleted";
    pub const ALL: &[&str] = &[POD_DELETED, POD_TERMINAL, SANDBOX_REPLACED, NODE_DELETED];
}

/// Label `outcome` of [`crate::RECLAIMS_TOTAL`]: `refused` when the node side answered a
/// tombstone `live` (the pod runs there with the address; nothing freed).
pub mod reclaim_outcome {
    pub const KEY: &str = "outcome";
    pub const RECLAIMED: &str = "reclaimed";
    pub const FAILED: &str = "failed";
    pub const REFUSED: &str = "refused";
    pub const ALL: &[&str] = &[RECLAIMED, FAILED, REFUSED];
}

/// Label `kind` of [`crate::REPAIR_ISSUES_TOTAL`].
pub mod repair_kind {
    pub const KEY: &str = "kind";
    pub const DUPLICATE: &str = "duplicate";
    pub const OUT_OF_RANGE: &str = "out-of-range";
    pub const UNKNOWN_POOL: &str = "unknown-pool";
    pub const ORPHAN_BLOCK: &str = "orphan-block";
    pub const LEAKED: &str = "leaked";
    pub const ALL: &[&str] = &[DUPLICATE, OUT_OF_RANGE, UNKNOWN_POOL, ORPHAN_BLOCK, LEAKED];
}

/// Label `trigger` of the trigger metrics: the trigger's name (one per kind, not per node, so
/// the cardinality stays fixed).
pub mod trigger {
    pub const KEY: &str = "trigger";
    pub const POOL_MAINTAINER: &str = "pool-maintainer";
    pub const RESYNC: &str = "resync";
    pub const ALL: &[&str] = &[POOL_MAINTAINER, RESYNC];
}

/// Label `verb` of the agent's CNI metrics: the CNI command the plugin forwarded.
pub mod cni_verb {
    pub const KEY: &str = "verb";
    pub const ADD: &str = "add";
    pub const DEL: &str = "del";
    pub const CHECK: &str = "check";
    pub const GC: &str = "gc";
    pub const STATUS: &str = "status";
    pub const ALL: &[&str] = &[ADD, DEL, CHECK, GC, STATUS];
}

/// Label `outcome` of [`crate::AGENT_CNI_REQUESTS_TOTAL`]: `ok` and `error` for every verb; a
/// DEL that succeeded without freeing is `stale` (the key is another pod's) or `unknown` (no
/// allocation has the key).
pub mod cni_outcome {
    pub const KEY: &str = "outcome";
    pub const OK: &str = "ok";
    pub const ERROR: &str = "error";
    pub const STALE: &str = "stale";
    pub const UNKNOWN: &str = "unknown";
    pub const ALL: &[&str] = &[OK, ERROR, STALE, UNKNOWN];

    /// The outcomes one verb can have (only DEL is stale or unknown).
    pub fn of_verb(verb: &str) -> &'static [&'static str] {
        match verb {
            super::cni_verb::DEL => ALL,
            _ => &[OK, ERROR],
        }
    }
}

/// Label `state` of [`crate::AGENT_IPS`].
pub mod agent_ips_state {
    pub const KEY: &str = "state";
    /// In the node's pool (its blocks' or its source's addresses).
    pub const POOL: &str = "pool";
    /// Held by a pod.
    pub const USED: &str = "used";
    /// Freed, not yet reusable.
    pub const COOLDOWN: &str = "cooldown";
    /// Marked for release by the operator.
    pub const MARKED: &str = "marked";
    pub const ALL: &[&str] = &[POOL, USED, COOLDOWN, MARKED];
}

/// Label `outcome` of [`crate::AGENT_STATUS_WRITES_TOTAL`]: what the API server answered.
pub mod status_write_outcome {
    pub const KEY: &str = "outcome";
    pub const OK: &str = "ok";
    /// 409: a conflict (the applies are forced, so only a stale object or a hand edit).
    pub const CONFLICT: &str = "conflict";
    /// 404: the object is gone (a released block, a deleted IPAMNode).
    pub const GONE: &str = "gone";
    /// Anything else: refused, throttled, unreachable.
    pub const ERROR: &str = "error";
    pub const ALL: &[&str] = &[OK, CONFLICT, GONE, ERROR];
}

/// Label `op` of [`crate::AGENT_NODE_ROUTE_OPS_TOTAL`].
pub mod route_op {
    pub const KEY: &str = "op";
    pub const ADD: &str = "add";
    pub const DELETE: &str = "delete";
    pub const ALL: &[&str] = &[ADD, DELETE];
}

/// Label `outcome` of [`crate::AGENT_NODE_ROUTE_OPS_TOTAL`]: what the kernel answered.
pub mod route_outcome {
    pub const KEY: &str = "outcome";
    pub const OK: &str = "ok";
    pub const ERROR: &str = "error";
    pub const ALL: &[&str] = &[OK, ERROR];
}

// ---------------------------------------------------------------------------------------------
// The table.

/// The type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// The values a label takes.
#[derive(Debug, Clone, Copy)]
pub enum Values {
    /// A fixed set, registered at zero.
    Enumerated(&'static [&'static str]),
    /// Values depend on the value of another label of the same metric (`op` by `api`).
    DependsOn {
        key: &'static str,
        values: fn(&str) -> &'static [&'static str],
    },
    /// Not enumerable (`pool`, `node`): the metric is not registered at zero.
    Free,
}

/// One metric's definition.
#[derive(Debug, Clone, Copy)]
pub struct Def {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    pub help: &'static str,
    /// Label keys, in order, with their values.
    pub labels: &'static [(&'static str, Values)],
}

impl Def {
    /// Every enumerated label combination of this metric (one empty set for a metric without
    /// labels); empty when a label is [`Values::Free`].
    pub fn series(&self) -> Vec<Vec<(&'static str, &'static str)>> {
        let mut out: Vec<Vec<(&'static str, &'static str)>> = vec![Vec::new()];
        for (key, values) in self.labels {
            let mut next = Vec::new();
            for partial in &out {
                let vals: &'static [&'static str] = match values {
                    Values::Enumerated(v) => v,
                    Values::DependsOn { key: on, values } => {
                        let Some((_, v)) = partial.iter().find(|(k, _)| k == on) else {
                            panic!(
                                "{}: label {key} depends on {on}, which must come first",
                                self.name
                            )
                        };
                        values(v)
                    }
                    Values::Free => return Vec::new(),
                };
                for v in vals {
                    let mut s = partial.clone();
                    s.push((*key, *v));
                    next.push(s);
                }
            }
            out = next;
        }
        out
    }

    /// The explicit buckets of a histogram (`None` for other kinds).
    pub fn buckets(&self) -> Option<&'static [f64]> {
        buckets()
            .iter()
            .find(|(name, _)| *name == self.name)
            .map(|(_, b)| *b)
    }
}

use Values::{Enumerated as E, Free};

const SOURCE_OUTCOME: &[(&str, Values)] = &[
    (source::KEY, E(source::ALL)),
    (outcome::KEY, E(outcome::ALL)),
];
const TRIGGER_LABEL: &[(&str, Values)] = &[(trigger::KEY, E(trigger::ALL))];

/// Which binary exports a metric: each describes and registers only its own table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// `tidepool-operator` (`run`, `simulate --realtime`): [`OPERATOR`].
    Operator,
    /// `tidepool-agent`: [`AGENT`].
    Agent,
}

impl Binary {
    pub const ALL: [Binary; 2] = [Binary::Operator, Binary::Agent];

    /// The metrics this binary exports.
    pub fn defs(self) -> &'static [Def] {
        match self {
            Binary::Operator => OPERATOR,
            Binary::Agent => AGENT,
        }
    }
}

/// The operator's metrics, in DESIGN.md's order.
pub const OPERATOR: &[Def] = &[
    Def {
        name: IPS,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Addresses in the cluster by family and state (allocated to nodes, used by pods, free, in cooldown, needed to reach the watermarks, excess above them).",
        labels: &[
            (family::KEY, E(family::ALL)),
            (ips_state::KEY, E(ips_state::ALL)),
        ],
    },
    Def {
        name: NODES,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Nodes by category: total, in deficit (needing addresses), at capacity (at their cap), releasing (a release handshake running), blocked (exhausted, cordoned, terminating, bad spec).",
        labels: &[(node_category::KEY, E(node_category::ALL))],
    },
    Def {
        name: POOL_IPS,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Addresses of one IPPool by family and state (capacity, allocated to nodes, free).",
        labels: &[
            (pool::KEY, Free),
            (family::KEY, E(family::ALL)),
            (pool_state::KEY, E(pool_state::ALL)),
        ],
    },
    Def {
        name: ALLOCATION_OPS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Allocation calls made to the IP source, by source and outcome.",
        labels: SOURCE_OUTCOME,
    },
    Def {
        name: RELEASE_OPS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Release calls made to the IP source, by source and outcome.",
        labels: SOURCE_OUTCOME,
    },
    Def {
        name: IPS_ALLOCATED_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Addresses granted to nodes, by family.",
        labels: &[(family::KEY, E(family::ALL))],
    },
    Def {
        name: IPS_RELEASED_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Addresses released from nodes back to their source, by family.",
        labels: &[(family::KEY, E(family::ALL))],
    },
    Def {
        name: ALLOCATION_DURATION_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Duration of one allocate or release call to the IP source, by op and outcome.",
        labels: &[
            (source_op::KEY, E(source_op::ALL)),
            (outcome::KEY, E(outcome::ALL)),
        ],
    },
    Def {
        name: RECLAIM_CANDIDATES,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Used entries that are reclaim candidates right now (pod gone, terminal, or sandbox replaced), not yet reclaimed.",
        labels: &[],
    },
    Def {
        name: RECLAIMS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Addresses reclaimed from pods that went away without releasing them, by reason and outcome.",
        labels: &[
            (reclaim_reason::KEY, E(reclaim_reason::ALL)),
            (reclaim_outcome::KEY, E(reclaim_outcome::ALL)),
        ],
    },
    Def {
        name: RECLAIM_LATENCY_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Time from a pod going away (as first observed) to its address's reclaim being written.",
        labels: &[],
    },
    Def {
        name: RESYNC_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Periodic resyncs of all nodes.",
        labels: &[],
    },
    Def {
        name: RESYNC_DURATION_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Duration of one periodic resync (recalculating and triggering all nodes).",
        labels: &[],
    },
    Def {
        name: TRIGGER_QUEUED_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Trigger calls, by trigger; calls that arrive while a run is pending fold into it.",
        labels: TRIGGER_LABEL,
    },
    Def {
        name: TRIGGER_FOLDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Count),
        help: "Trigger calls folded into one run, by trigger.",
        labels: TRIGGER_LABEL,
    },
    Def {
        name: TRIGGER_LATENCY_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Time from the first trigger call of a run to the run's start, by trigger.",
        labels: TRIGGER_LABEL,
    },
    Def {
        name: TRIGGER_DURATION_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Duration of one triggered run, by trigger.",
        labels: TRIGGER_LABEL,
    },
    Def {
        name: API_REQUESTS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Budgeted mutating API calls, by API (source, kube), op and outcome; retries included.",
        labels: &[
            (api::KEY, E(api::ALL)),
            (
                "op",
                Values::DependsOn {
                    key: api::KEY,
                    values: api::ops,
                },
            ),
            (api_outcome::KEY, E(api_outcome::ALL)),
        ],
    },
    Def {
        name: API_WAIT_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Time a call waited for its API budget (rate limiter) before being sent, by API.",
        labels: &[(api::KEY, E(api::ALL))],
    },
    Def {
        name: REPAIR_ISSUES_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Issues found by repair at start and on resync, by kind.",
        labels: &[(repair_kind::KEY, E(repair_kind::ALL))],
    },
    Def {
        name: NODE_IPS,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Addresses of one node by family and state (only with --per-node-metrics).",
        labels: &[
            (node::KEY, Free),
            (family::KEY, E(family::ALL)),
            (ips_state::KEY, E(ips_state::ALL)),
        ],
    },
    Def {
        name: PODS_WAITING,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Pods bound to a node, not terminal, that have no address yet of a family their node serves (the engine's waiting count, summed over nodes), by family.",
        labels: &[(family::KEY, E(family::ALL))],
    },
    Def {
        name: POD_IP_WAIT_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Time from the operator first seeing a pod bound and waiting for an address to seeing its UID in the node's used list (pods that never waited while the operator looked are not observed).",
        labels: &[],
    },
    Def {
        name: POOL_BLOCKS,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Claimed blocks of one IPPool by family and fill: full (every usable address has a used entry of the holding node), partial, empty (none used). Many partial or empty blocks mean addresses stranded on nodes (fragmentation).",
        labels: &[
            (pool::KEY, Free),
            (family::KEY, E(family::ALL)),
            (block_state::KEY, E(block_state::ALL)),
        ],
    },
    Def {
        name: LEADER,
        kind: Kind::Gauge,
        unit: None,
        help: "1 while this replica holds the leader lease and may write, else 0.",
        labels: &[],
    },
    Def {
        name: LEADER_TRANSITIONS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Times this replica acquired the leader lease (from another holder, a released lease, or none).",
        labels: &[],
    },
    Def {
        name: LEADER_WRITES_REFUSED_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Writes a write path did not send because this replica was past its step-down instant or not leading.",
        labels: &[],
    },
];

/// The node agent's metrics, in DESIGN.md's order.
pub const AGENT: &[Def] = &[
    Def {
        name: AGENT_CNI_REQUESTS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "CNI requests the node agent answered, by verb and outcome (a DEL that freed nothing is stale: another pod's key, or unknown: no such key).",
        labels: &[
            (cni_verb::KEY, E(cni_verb::ALL)),
            (
                cni_outcome::KEY,
                Values::DependsOn {
                    key: cni_verb::KEY,
                    values: cni_outcome::of_verb,
                },
            ),
        ],
    },
    Def {
        name: AGENT_CNI_DURATION_SECONDS,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help: "Time from the node agent's receipt of a CNI request to its reply, the durable write (fsync) and an ADD's wait for an address included, by verb.",
        labels: &[(cni_verb::KEY, E(cni_verb::ALL))],
    },
    Def {
        name: AGENT_IPS,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Addresses of the agent's node by family and state (in its pool, used by pods, cooling down after a free, marked for release by the operator).",
        labels: &[
            (family::KEY, E(family::ALL)),
            (agent_ips_state::KEY, E(agent_ips_state::ALL)),
        ],
    },
    Def {
        name: AGENT_STATUS_WRITES_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Server-side applies of the node side's fields (the IPAMNode's status, the blocks' release answers) by the node agent, by outcome (ok, conflict, gone: the object no longer exists, error).",
        labels: &[(status_write_outcome::KEY, E(status_write_outcome::ALL))],
    },
    Def {
        name: AGENT_NODE_ROUTES,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Routes to other nodes' blocks (via their InternalIP) the node agent owns now, with --node-routes (0 without).",
        labels: &[],
    },
    Def {
        name: AGENT_NODE_ROUTE_OPS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Route adds and deletes of the node agent's --node-routes, by op and outcome (what the kernel answered).",
        labels: &[
            (route_op::KEY, E(route_op::ALL)),
            (route_outcome::KEY, E(route_outcome::ALL)),
        ],
    },
];

/// Every metric of every binary.
pub fn all() -> impl Iterator<Item = &'static Def> {
    Binary::ALL.into_iter().flat_map(Binary::defs)
}

/// The definition of one metric by its full name.
pub fn def(name: &str) -> Option<&'static Def> {
    all().find(|d| d.name == name)
}

// ---------------------------------------------------------------------------------------------
// Buckets.

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

// ---------------------------------------------------------------------------------------------
// Describe and zero registration.

/// Describes every metric of `binary` (help text and unit) to the installed recorder.
pub fn describe_all(binary: Binary) {
    for d in binary.defs() {
        let (name, help) = (d.name, d.help);
        match (d.kind, d.unit) {
            (Kind::Counter, Some(u)) => metrics::describe_counter!(name, u, help),
            (Kind::Counter, None) => metrics::describe_counter!(name, help),
            (Kind::Gauge, Some(u)) => metrics::describe_gauge!(name, u, help),
            (Kind::Gauge, None) => metrics::describe_gauge!(name, help),
            (Kind::Histogram, Some(u)) => metrics::describe_histogram!(name, u, help),
            (Kind::Histogram, None) => metrics::describe_histogram!(name, help),
        }
    }
}

/// Registers every enumerated label combination of every metric of `binary` at zero, so the
/// series exist before the first event. Values are not touched: a counter or gauge that
/// already has a value keeps it, and no histogram sample is recorded. Metrics with a
/// non-enumerable label (`pool`, `node`) are left to their first recording. Both `source`
/// values are registered, whichever source runs.
pub fn register_zero(binary: Binary) {
    for d in binary.defs() {
        for series in d.series() {
            let labels: Vec<Label> = series
                .iter()
                .map(|(k, v)| Label::from_static_parts(k, v))
                .collect();
            match d.kind {
                Kind::Counter => metrics::counter!(d.name, labels).increment(0),
                Kind::Gauge => metrics::gauge!(d.name, labels).increment(0.0),
                Kind::Histogram => {
                    let _ = metrics::histogram!(d.name, labels);
                }
            }
        }
    }
}

/// The error of setting up metrics export.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The Prometheus exporter could not be built (bad buckets, address in use, ...).
    #[cfg(feature = "exporter")]
    /// (The cause is the error's source, not repeated in its text: `{:#}` prints the chain.)
    #[error("building the Prometheus exporter failed")]
    Build(#[from] metrics_exporter_prometheus::BuildError),
    /// A global metrics recorder was installed before.
    #[error("a global metrics recorder is already installed")]
    AlreadyInstalled,
    /// The exporter's own runtime (used when called outside a Tokio runtime) failed to start.
    #[error("starting the metrics exporter's runtime failed")]
    Runtime(#[source] std::io::Error),
}

#[cfg(test)]
mod tests;
