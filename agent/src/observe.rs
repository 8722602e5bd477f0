//! The agent's metrics (DESIGN.md "Metrics", the `tidepool_agent_*` rows; names, labels and
//! buckets are tidepool-metrics'): what the socket server, the node state and the publisher
//! record, kept here so the handlers stay readable. Recording goes through the `metrics`
//! facade: with no recorder installed (the library's tests) it does nothing.
//!
//! - [`cni_request`]: each CNI request by verb and [`CniOutcome`], and its time from receipt
//!   to reply (the durable write, and an ADD's wait for an address, included);
//! - [`ips`]: the node's addresses by family and state, set after every change of the state
//!   (the answer loop's ticks included);
//! - [`status_write`]: each server-side apply of the node side's fields by what the API
//!   server answered.

use std::time::Duration;

use tidepool_ipam::{Family, IpamNode, ReleaseState};
use tidepool_metrics as m;

use crate::cni::proto::Verb;
use crate::serve::Reply;
use crate::state::{DelOutcome, NodeState};

/// How one CNI request ended, as `tidepool_agent_cni_requests_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniOutcome {
    /// Answered with success (a DEL: it freed the pod's addresses).
    Ok,
    /// Answered with a CNI error.
    Error,
    /// A DEL of a key another pod holds: success, nothing freed.
    Stale,
    /// A DEL of a key no allocation has: success, nothing freed.
    Unknown,
}

impl CniOutcome {
    /// A reply's outcome when it says nothing finer: success or error.
    pub fn of_reply(reply: &Reply) -> Self {
        if reply.status == 200 {
            CniOutcome::Ok
        } else {
            CniOutcome::Error
        }
    }

    /// What the node state did with a DEL.
    pub fn of_del(del: &DelOutcome) -> Self {
        match del {
            DelOutcome::Freed(_) => CniOutcome::Ok,
            DelOutcome::Stale { .. } => CniOutcome::Stale,
            DelOutcome::Unknown => CniOutcome::Unknown,
        }
    }

    fn label(self) -> &'static str {
        match self {
            CniOutcome::Ok => m::cni_outcome::OK,
            CniOutcome::Error => m::cni_outcome::ERROR,
            CniOutcome::Stale => m::cni_outcome::STALE,
            CniOutcome::Unknown => m::cni_outcome::UNKNOWN,
        }
    }
}

fn verb_label(verb: Verb) -> &'static str {
    match verb {
        Verb::Add => m::cni_verb::ADD,
        Verb::Del => m::cni_verb::DEL,
        Verb::Check => m::cni_verb::CHECK,
        Verb::Gc => m::cni_verb::GC,
        Verb::Status => m::cni_verb::STATUS,
    }
}

/// One answered CNI request: counted by verb and outcome; `took` from its receipt to its reply.
pub fn cni_request(verb: Verb, outcome: CniOutcome, took: Duration) {
    let verb = verb_label(verb);
    metrics::counter!(
        m::AGENT_CNI_REQUESTS_TOTAL,
        m::cni_verb::KEY => verb,
        m::cni_outcome::KEY => outcome.label(),
    )
    .increment(1);
    metrics::histogram!(m::AGENT_CNI_DURATION_SECONDS, m::cni_verb::KEY => verb)
        .record(took.as_secs_f64());
}

/// The node's addresses of one family by state (pool, used, cooldown, marked), from the
/// state and the node as the agent reads it (`None` before the IPAMNode is read: no pool).
pub fn ip_counts(
    state: &NodeState,
    node: Option<&IpamNode>,
    f: Family,
) -> [(&'static str, u64); 4] {
    let of_family = |a: &std::net::IpAddr| Family::of(a) == f;
    let used = state
        .allocations()
        .flat_map(|(_, a)| a.addrs)
        .filter(|a| of_family(a))
        .count();
    let cooling = state.cooldowns().keys().filter(|a| of_family(a)).count();
    let (pool, marked) = node.map_or((0, 0), |n| {
        let marked = n
            .operator
            .release
            .count_where(f, |r| *r == ReleaseState::MarkedForRelease);
        (n.operator.addresses.count(f), marked)
    });
    [
        (m::agent_ips_state::POOL, pool),
        (
            m::agent_ips_state::USED,
            u64::try_from(used).unwrap_or(u64::MAX),
        ),
        (
            m::agent_ips_state::COOLDOWN,
            u64::try_from(cooling).unwrap_or(u64::MAX),
        ),
        (m::agent_ips_state::MARKED, marked),
    ]
}

/// Sets `tidepool_agent_ips` from the state and the node.
pub fn ips(state: &NodeState, node: Option<&IpamNode>) {
    for f in Family::ALL {
        for (state_label, n) in ip_counts(state, node, f) {
            metrics::gauge!(
                m::AGENT_IPS,
                m::family::KEY => f.as_str(),
                m::agent_ips_state::KEY => state_label,
            )
            .set(n as f64);
        }
    }
}

/// What the API server answered one status write: ok, conflict (409), gone (404), error.
pub fn write_outcome<T>(result: &Result<T, kube::Error>) -> &'static str {
    match result {
        Ok(_) => m::status_write_outcome::OK,
        Err(kube::Error::Api(s)) if s.code == 409 => m::status_write_outcome::CONFLICT,
        Err(kube::Error::Api(s)) if s.code == 404 => m::status_write_outcome::GONE,
        Err(_) => m::status_write_outcome::ERROR,
    }
}

/// Counts one server-side apply of the node side's fields by its outcome.
pub fn status_write<T>(result: &Result<T, kube::Error>) {
    metrics::counter!(
        m::AGENT_STATUS_WRITES_TOTAL,
        m::status_write_outcome::KEY => write_outcome(result),
    )
    .increment(1);
}

/// Counts one route add or delete of `--node-routes` by whether the kernel accepted it.
pub fn route_op(op: &'static str, ok: bool) {
    let outcome = if ok {
        m::route_outcome::OK
    } else {
        m::route_outcome::ERROR
    };
    metrics::counter!(
        m::AGENT_NODE_ROUTE_OPS_TOTAL,
        m::route_op::KEY => op,
        m::route_outcome::KEY => outcome,
    )
    .increment(1);
}

/// Sets `tidepool_agent_node_routes`: the routes `--node-routes` owns now.
pub fn node_routes(owned: usize) {
    metrics::gauge!(m::AGENT_NODE_ROUTES).set(owned as f64);
}

#[cfg(test)]
#[path = "observe_tests.rs"]
mod tests;
