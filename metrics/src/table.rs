//! The table: every metric's definition (type, unit, help text, labels), per binary.

use metrics::Unit;

use crate::buckets;
use crate::labels::*;
use crate::names::*;

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
const POOL_FAMILY: &[(&str, Values)] = &[(pool::KEY, Free), (family::KEY, E(family::ALL))];
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

    /// The metrics of this binary alone (not [`EVERY_BINARY`]'s).
    pub fn defs(self) -> &'static [Def] {
        match self {
            Binary::Operator => OPERATOR,
            Binary::Agent => AGENT,
        }
    }

    /// Every metric this binary exports from the table: [`EVERY_BINARY`]'s, then its own.
    pub fn exported(self) -> impl Iterator<Item = &'static Def> {
        EVERY_BINARY.iter().chain(self.defs())
    }
}

/// The metrics every binary exports (besides the standard `process_*`, which are not in the
/// table: metrics-process defines them).
pub const EVERY_BINARY: &[Def] = &[Def {
    name: BUILD_INFO,
    kind: Kind::Gauge,
    unit: None,
    help: "1, labelled with the binary's version and the commit it was built from (unknown when built outside a git checkout).",
    labels: &[(version::KEY, Free), (commit::KEY, Free)],
}];

/// The operator's metrics, in DESIGN.md's order.
pub const OPERATOR: &[Def] = &[
    Def {
        name: IPS,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "Addresses in the cluster by family, state (allocated to nodes, used by pods, free, in cooldown, needed to reach the watermarks, excess above them) and pool (empty for a source without pools).",
        labels: &[
            (family::KEY, E(family::ALL)),
            (ips_state::KEY, E(ips_state::ALL)),
            (pool::KEY, Free),
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
        help: "Addresses of one IPPool by family and state: capacity, allocated (in blocks claimed by nodes), free (in no block), idle (allocated, in blocks with no used and no cooling address: whole free blocks a release gives back). free + idle is what the pool could still grant; the exhaustion forecast alert follows it.",
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
                api::OP_KEY,
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
        help: "Pods bound to a node, not terminal, that have no address yet of a family their node serves (the engine's waiting count, summed over nodes), by family and by the pool they wait for (empty for a source without pools).",
        labels: &[(family::KEY, E(family::ALL)), (pool::KEY, Free)],
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
        help: "Claimed blocks of one IPPool by family and fill: full (every usable address has a used entry of the holding node), partial, empty (none used; some of their addresses may still cool down). Many partial or empty blocks mean addresses stranded on nodes (fragmentation).",
        labels: &[
            (pool::KEY, Free),
            (family::KEY, E(family::ALL)),
            (block_state::KEY, E(block_state::ALL)),
        ],
    },
    Def {
        name: POOL_VALID,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "1 while an IPPool is valid, 0 while it is Invalid (its CIDRs overlap an older pool's, or its spec cannot be used: the IPPool's Valid condition says why). Nodes served only by an Invalid pool get no addresses.",
        labels: &[(pool::KEY, Free)],
    },
    Def {
        name: POOL_PRESSURE,
        kind: Kind::Gauge,
        unit: None,
        help: "A pool's scarcity pressure by family: (addresses used + pods waiting + addresses in cooldown) / the pool's capacity. Measured on demand, not on free addresses (the warm pools are free addresses). Pool empty for a source without pools.",
        labels: POOL_FAMILY,
    },
    Def {
        name: POOL_SCARCE,
        kind: Kind::Gauge,
        unit: None,
        help: "1 while a pool is scarce (its pressure reached --scarcity-enter and has not yet stayed below --scarcity-exit past --scarcity-min-duration), else 0.",
        labels: POOL_FAMILY,
    },
    Def {
        name: POOL_PRE_ALLOCATE_RATIO,
        kind: Kind::Gauge,
        unit: None,
        help: "The share of each node's pre-allocation a pool keeps: 1 unless scarce; while scarce it falls with pressure, and is 0 while pods of the pool wait for addresses their node lacks (with --scarcity-handling=false always 1).",
        labels: POOL_FAMILY,
    },
    Def {
        name: SCARCITY_RELEASED_IPS_TOTAL,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help: "Addresses nodes gave back through the release handshake while their pool was scarce (the warm pools giving way).",
        labels: POOL_FAMILY,
    },
    Def {
        name: POOL_EXHAUSTION_SECONDS,
        kind: Kind::Gauge,
        unit: Some(Unit::Seconds),
        help: "Seconds until a pool runs out, from the operator's own samples at each resync: a least-squares line through the last 6 hours of what the pool could still grant (free + idle of tidepool_ipam_pool_ips), read where it crosses 0, as the exhaustion forecast alert's predict_linear. +Inf while the pool is not shrinking.",
        labels: POOL_FAMILY,
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
        name: AGENT_ADDS_WAITING,
        kind: Kind::Gauge,
        unit: Some(Unit::Count),
        help: "CNI ADDs the node agent holds now because its node has no free address for them (each waits a few seconds for a block, then answers try again later): pods whose sandboxes wait for an address.",
        labels: &[],
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

/// Every metric of every binary, each once.
pub fn all() -> impl Iterator<Item = &'static Def> {
    EVERY_BINARY
        .iter()
        .chain(Binary::ALL.into_iter().flat_map(Binary::defs))
}

/// The definition of one metric by its full name.
pub fn def(name: &str) -> Option<&'static Def> {
    all().find(|d| d.name == name)
}
