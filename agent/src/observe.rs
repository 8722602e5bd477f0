//! The agent's metrics (DESIGN.md "Metrics", the `tidepool_agent_*` rows; names, labels and
//! buckets are tidepool-metrics'): what the socket server, the node state and the publisher
//! record, kept here so the handlers stay readable. Recording goes through
//! `tidepool_metrics::record`, which sets the labels: with no recorder installed (the
//! library's tests) it does nothing.
//!
//! - [`cni_request`]: each CNI request by verb and [`CniOutcome`], and its time from receipt
//!   to reply (the durable write, and an ADD's wait for an address, included);
//! - [`ips`]: the node's addresses by family and state, set after every change of the state
//!   (the answer loop's ticks included);
//! - [`status_write`]: each server-side apply of the node side's fields by what the API
//!   server answered;
//! - [`AddsWaiting`]: the ADDs held now for lack of an address.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use tidepool_ipam::{Family, IpamNode, ReleaseState};
use tidepool_metrics::{self as m, record};

use crate::cni::proto::Verb;
use crate::serve::Reply;
use crate::state::{DelOutcome, NodeState};

/// The ADDs the agent holds now for lack of a free address, as
/// `tidepool_agent_adds_waiting` reports them: the pods whose sandboxes really wait for an
/// address (a pod the operator counts as waiting may only wait for its volumes).
#[derive(Debug, Default)]
pub struct AddsWaiting(AtomicUsize);

impl AddsWaiting {
    /// How many wait now.
    pub fn now(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Counts one ADD as waiting until the guard is dropped (answered or given up).
    pub fn hold(&self) -> WaitingAdd<'_> {
        let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        record::agent_adds_waiting(n as f64);
        WaitingAdd(self)
    }
}

/// One ADD counted by [`AddsWaiting::hold`] while it lives.
#[derive(Debug)]
pub struct WaitingAdd<'a>(&'a AddsWaiting);

impl Drop for WaitingAdd<'_> {
    fn drop(&mut self) {
        let n = self.0.0.fetch_sub(1, Ordering::Relaxed) - 1;
        record::agent_adds_waiting(n as f64);
    }
}

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

    fn label(self) -> m::CniOutcome {
        match self {
            CniOutcome::Ok => m::CniOutcome::Ok,
            CniOutcome::Error => m::CniOutcome::Error,
            CniOutcome::Stale => m::CniOutcome::Stale,
            CniOutcome::Unknown => m::CniOutcome::Unknown,
        }
    }
}

fn verb_label(verb: Verb) -> m::CniVerb {
    match verb {
        Verb::Add => m::CniVerb::Add,
        Verb::Del => m::CniVerb::Del,
        Verb::Check => m::CniVerb::Check,
        Verb::Gc => m::CniVerb::Gc,
        Verb::Status => m::CniVerb::Status,
    }
}

/// One answered CNI request: counted by verb and outcome; `took` from its receipt to its reply.
pub fn cni_request(verb: Verb, outcome: CniOutcome, took: Duration) {
    let verb = verb_label(verb);
    record::agent_cni_requests(verb, outcome.label());
    record::agent_cni_duration(verb, took);
}

/// The node's addresses of one family by state (pool, used, cooldown at `now`, marked),
/// from the state and the node as the agent reads it (`None` before the IPAMNode is read:
/// no pool). A cooldown that ended is over, though the state keeps it until its next save.
pub fn ip_counts(
    state: &NodeState,
    node: Option<&IpamNode>,
    f: Family,
    now: SystemTime,
) -> [(m::AgentIpsState, u64); 4] {
    let of_family = |a: &std::net::IpAddr| Family::of(a) == f;
    let used = state
        .allocations()
        .flat_map(|(_, a)| a.addrs)
        .filter(|a| of_family(a))
        .count();
    let cooling = (state.cooldowns().iter())
        .filter(|(a, until)| of_family(a) && **until > now)
        .count();
    let (pool, marked) = node.map_or((0, 0), |n| {
        let marked = n
            .operator
            .release
            .count_where(f, |r| *r == ReleaseState::MarkedForRelease);
        (n.operator.addresses.count(f), marked)
    });
    [
        (m::AgentIpsState::Pool, pool),
        (
            m::AgentIpsState::Used,
            u64::try_from(used).unwrap_or(u64::MAX),
        ),
        (
            m::AgentIpsState::Cooldown,
            u64::try_from(cooling).unwrap_or(u64::MAX),
        ),
        (m::AgentIpsState::Marked, marked),
    ]
}

/// Sets `tidepool_agent_ips` from the state and the node.
pub fn ips(state: &NodeState, node: Option<&IpamNode>) {
    for f in Family::ALL {
        for (state_label, n) in ip_counts(state, node, f, SystemTime::now()) {
            record::agent_ips(f.into(), state_label, n as f64);
        }
    }
}

/// What the API server answered one status write: ok, conflict (409), gone (404), error.
pub fn write_outcome<T>(result: &Result<T, kube::Error>) -> m::StatusWriteOutcome {
    match result {
        Ok(_) => m::StatusWriteOutcome::Ok,
        Err(kube::Error::Api(s)) if s.code == 409 => m::StatusWriteOutcome::Conflict,
        Err(kube::Error::Api(s)) if s.code == 404 => m::StatusWriteOutcome::Gone,
        Err(_) => m::StatusWriteOutcome::Error,
    }
}

/// Counts one server-side apply of the node side's fields by its outcome.
pub fn status_write<T>(result: &Result<T, kube::Error>) {
    record::agent_status_writes(write_outcome(result));
}

/// Counts one route add or delete of `--node-routes` by whether the kernel accepted it.
pub fn route_op(op: m::RouteOp, ok: bool) {
    let outcome = if ok {
        m::RouteOutcome::Ok
    } else {
        m::RouteOutcome::Error
    };
    record::agent_node_route_ops(op, outcome);
}

/// Sets `tidepool_agent_node_routes`: the routes `--node-routes` owns now.
pub fn node_routes(owned: usize) {
    record::agent_node_routes(owned as f64);
}

#[cfg(test)]
#[path = "observe_tests.rs"]
mod tests;
