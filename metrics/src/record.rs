//! Recording: one function per metric, named after it (without `_total` or `_seconds`), so
//! that no caller spells a label. Each takes its labels' values typed ([`Family`],
//! [`IpsState`], ...; a free string only for `pool` and `node`) and sets them under the same
//! keys, in the same order, as the table that [`crate::register_zero`] registers at zero, so
//! a recording lands on the series the exporter exported from the start.
//!
//! Counters take how much they grow, gauges their value, histograms of seconds a
//! [`Duration`]. Recording goes through the [`metrics`] facade: with no recorder installed it
//! does nothing.
//!
//! The metrics recorded on every pod event, pass or run (the triggers', the waits', the node
//! counts) take keys built once ([`static_key!`], [`enum_key!`]). `metrics`' macros build a
//! key on each call when its name or a label value is not a literal: a `Vec` for the labels
//! and the key's hash, ~370 instructions a call.

use std::sync::LazyLock;
use std::time::Duration;

use metrics::{Key, Label, Level, Metadata};

use crate::BuildInfo;
use crate::labels::*;
use crate::names::*;

/// The metadata `metrics`' macros give a recording from this module.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The key of the metric named `$name` (a `&'static str` constant) without labels, hashed at
/// compile time.
macro_rules! static_key {
    ($name:expr) => {{
        static KEY: Key = Key::from_static_name($name);
        &KEY
    }};
}

/// The key of the metric named `$name` whose one label is the enumerated label `$module`
/// (`$module::KEY`, values `$Enum::ALL`), under the value `$value`: all of them built on the
/// first use. A label's enum lists its values in `ALL` in the order of their declaration, so
/// a value's discriminant is its place there.
macro_rules! enum_key {
    ($name:expr, $module:ident, $Enum:ty, $value:expr) => {{
        static KEYS: LazyLock<Box<[Key]>> = LazyLock::new(|| {
            (<$Enum>::ALL.iter())
                .map(|v| {
                    let label = Label::from_static_parts($module::KEY, v.as_str());
                    Key::from_parts($name, vec![label])
                })
                .collect()
        });
        &KEYS[$value as usize]
    }};
}

// ---------------------------------------------------------------------------------------------
// Every binary's.

/// Sets [`BUILD_INFO`] to 1 under the binary's version and commit.
pub fn build_info(build: BuildInfo) {
    metrics::gauge!(
        BUILD_INFO,
        version::KEY => build.version,
        commit::KEY => build.commit,
    )
    .set(1.0);
}

// ---------------------------------------------------------------------------------------------
// The operator's.

/// Sets [`IPS`]: the cluster's addresses of `family` in `state` of the pool named `pool`
/// ("" for a source without pools).
pub fn ips(family: Family, state: IpsState, pool: &str, value: f64) {
    metrics::gauge!(
        IPS,
        family::KEY => family.as_str(),
        ips_state::KEY => state.as_str(),
        pool::KEY => pool.to_owned(),
    )
    .set(value);
}

/// Sets [`NODES`]: the nodes in `category`.
pub fn nodes(category: NodeCategory, value: f64) {
    let key = enum_key!(NODES, node_category, NodeCategory, category);
    metrics::with_recorder(|r| r.register_gauge(key, &METADATA)).set(value);
}

/// Sets [`POOL_IPS`]: the addresses of `family` in `state` of the IPPool named `pool`.
pub fn pool_ips(pool: &str, family: Family, state: PoolState, value: f64) {
    metrics::gauge!(
        POOL_IPS,
        pool::KEY => pool.to_owned(),
        family::KEY => family.as_str(),
        pool_state::KEY => state.as_str(),
    )
    .set(value);
}

/// Counts one allocation call to the IP source ([`ALLOCATION_OPS_TOTAL`]).
pub fn allocation_ops(source: Source, outcome: Outcome) {
    metrics::counter!(
        ALLOCATION_OPS_TOTAL,
        source::KEY => source.as_str(),
        outcome::KEY => outcome.as_str(),
    )
    .increment(1);
}

/// Counts one release call to the IP source ([`RELEASE_OPS_TOTAL`]).
pub fn release_ops(source: Source, outcome: Outcome) {
    metrics::counter!(
        RELEASE_OPS_TOTAL,
        source::KEY => source.as_str(),
        outcome::KEY => outcome.as_str(),
    )
    .increment(1);
}

/// Adds `n` addresses of `family` granted to nodes ([`IPS_ALLOCATED_TOTAL`]).
pub fn ips_allocated(family: Family, n: u64) {
    metrics::counter!(IPS_ALLOCATED_TOTAL, family::KEY => family.as_str()).increment(n);
}

/// Adds `n` addresses of `family` released back to their source ([`IPS_RELEASED_TOTAL`]).
pub fn ips_released(family: Family, n: u64) {
    metrics::counter!(IPS_RELEASED_TOTAL, family::KEY => family.as_str()).increment(n);
}

/// Records how long one source call took ([`ALLOCATION_DURATION_SECONDS`]).
pub fn allocation_duration(op: SourceOp, outcome: Outcome, took: Duration) {
    metrics::histogram!(
        ALLOCATION_DURATION_SECONDS,
        source_op::KEY => op.as_str(),
        outcome::KEY => outcome.as_str(),
    )
    .record(took);
}

/// Sets [`RECLAIM_CANDIDATES`].
pub fn reclaim_candidates(value: f64) {
    metrics::with_recorder(|r| r.register_gauge(static_key!(RECLAIM_CANDIDATES), &METADATA))
        .set(value);
}

/// Adds `n` reclaims for `reason` that ended in `outcome` ([`RECLAIMS_TOTAL`]).
pub fn reclaims(reason: ReclaimReason, outcome: ReclaimOutcome, n: u64) {
    metrics::counter!(
        RECLAIMS_TOTAL,
        reclaim_reason::KEY => reason.as_str(),
        reclaim_outcome::KEY => outcome.as_str(),
    )
    .increment(n);
}

/// Records one pod's time from gone to its tombstone written ([`RECLAIM_LATENCY_SECONDS`]).
pub fn reclaim_latency(latency: Duration) {
    let key = static_key!(RECLAIM_LATENCY_SECONDS);
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA)).record(latency);
}

/// Counts one periodic resync ([`RESYNC_TOTAL`]).
pub fn resync() {
    metrics::with_recorder(|r| r.register_counter(static_key!(RESYNC_TOTAL), &METADATA))
        .increment(1);
}

/// Records how long one resync took ([`RESYNC_DURATION_SECONDS`]).
pub fn resync_duration(took: Duration) {
    let key = static_key!(RESYNC_DURATION_SECONDS);
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA)).record(took);
}

/// Counts one call of `trigger` ([`TRIGGER_QUEUED_TOTAL`]).
pub fn trigger_queued(trigger: Trigger) {
    let key = enum_key!(TRIGGER_QUEUED_TOTAL, trigger, Trigger, trigger);
    metrics::with_recorder(|r| r.register_counter(key, &METADATA)).increment(1);
}

/// Records how many calls of `trigger` one run folded ([`TRIGGER_FOLDS`]).
pub fn trigger_folds(trigger: Trigger, folds: u32) {
    let key = enum_key!(TRIGGER_FOLDS, trigger, Trigger, trigger);
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA)).record(f64::from(folds));
}

/// Records one run's wait from its first call to its start ([`TRIGGER_LATENCY_SECONDS`]).
pub fn trigger_latency(trigger: Trigger, latency: Duration) {
    let key = enum_key!(TRIGGER_LATENCY_SECONDS, trigger, Trigger, trigger);
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA)).record(latency);
}

/// Records how long one run of `trigger` took ([`TRIGGER_DURATION_SECONDS`]).
pub fn trigger_duration(trigger: Trigger, took: Duration) {
    let key = enum_key!(TRIGGER_DURATION_SECONDS, trigger, Trigger, trigger);
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA)).record(took);
}

/// Counts one budgeted mutating API call ([`API_REQUESTS_TOTAL`]).
pub fn api_requests(op: ApiOp, outcome: ApiOutcome) {
    metrics::counter!(
        API_REQUESTS_TOTAL,
        api::KEY => op.api().as_str(),
        api::OP_KEY => op.as_str(),
        api_outcome::KEY => outcome.as_str(),
    )
    .increment(1);
}

/// Records one call's wait for a token of the `api` budget ([`API_WAIT_SECONDS`]).
pub fn api_wait(api: Api, wait: Duration) {
    let key = enum_key!(API_WAIT_SECONDS, api, Api, api);
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA)).record(wait);
}

/// Adds `n` issues of `kind` found by repair ([`REPAIR_ISSUES_TOTAL`]).
pub fn repair_issues(kind: RepairKind, n: u64) {
    metrics::counter!(REPAIR_ISSUES_TOTAL, repair_kind::KEY => kind.as_str()).increment(n);
}

/// Sets [`NODE_IPS`]: the addresses of `family` in `state` of the node named `node`.
pub fn node_ips(node: &str, family: Family, state: IpsState, value: f64) {
    metrics::gauge!(
        NODE_IPS,
        node::KEY => node.to_owned(),
        family::KEY => family.as_str(),
        ips_state::KEY => state.as_str(),
    )
    .set(value);
}

/// Sets [`PODS_WAITING`]: the pods waiting for an address of `family` from the pool named
/// `pool` ("" for a source without pools; a pod refused its pool counts under that pool).
pub fn pods_waiting(family: Family, pool: &str, value: f64) {
    metrics::gauge!(
        PODS_WAITING,
        family::KEY => family.as_str(),
        pool::KEY => pool.to_owned(),
    )
    .set(value);
}

/// Records one pod's wait from bound to its address in use ([`POD_IP_WAIT_SECONDS`]).
pub fn pod_ip_wait(wait: Duration) {
    let key = static_key!(POD_IP_WAIT_SECONDS);
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA)).record(wait);
}

/// Sets [`POOL_BLOCKS`]: the claimed blocks of `family` in `state` of the IPPool named `pool`.
pub fn pool_blocks(pool: &str, family: Family, state: BlockState, value: f64) {
    metrics::gauge!(
        POOL_BLOCKS,
        pool::KEY => pool.to_owned(),
        family::KEY => family.as_str(),
        block_state::KEY => state.as_str(),
    )
    .set(value);
}

/// Sets [`POOL_VALID`]: 1 while the IPPool named `pool` is valid, else 0.
pub fn pool_valid(pool: &str, valid: bool) {
    metrics::gauge!(POOL_VALID, pool::KEY => pool.to_owned()).set(f64::from(u8::from(valid)));
}

/// Sets [`POOL_PRESSURE`], [`POOL_SCARCE`] and [`POOL_PRE_ALLOCATE_RATIO`] of the pool named
/// `pool` ("" for a source without pools).
pub fn pool_scarcity(pool: &str, family: Family, pressure: f64, scarce: bool, kept: f64) {
    for (name, value) in [
        (POOL_PRESSURE, pressure),
        (POOL_SCARCE, f64::from(u8::from(scarce))),
        (POOL_PRE_ALLOCATE_RATIO, kept),
    ] {
        metrics::gauge!(
            name,
            pool::KEY => pool.to_owned(),
            family::KEY => family.as_str(),
        )
        .set(value);
    }
}

/// Sets [`POOL_EXHAUSTION_SECONDS`] of the pool named `pool` (+Inf: not shrinking).
pub fn pool_exhaustion(pool: &str, family: Family, seconds: f64) {
    metrics::gauge!(
        POOL_EXHAUSTION_SECONDS,
        pool::KEY => pool.to_owned(),
        family::KEY => family.as_str(),
    )
    .set(seconds);
}

/// Counts addresses given back while their pool was scarce ([`SCARCITY_RELEASED_IPS_TOTAL`]).
pub fn scarcity_released_ips(pool: &str, family: Family, count: u64) {
    metrics::counter!(
        SCARCITY_RELEASED_IPS_TOTAL,
        pool::KEY => pool.to_owned(),
        family::KEY => family.as_str(),
    )
    .increment(count);
}

/// Sets [`LEADER`]: 1 while `leading`, else 0.
pub fn leader(leading: bool) {
    metrics::gauge!(LEADER).set(f64::from(u8::from(leading)));
}

/// Counts one acquisition of the leader lease ([`LEADER_TRANSITIONS_TOTAL`]).
pub fn leader_transitions() {
    metrics::counter!(LEADER_TRANSITIONS_TOTAL).increment(1);
}

/// Counts one write not sent for want of the lead ([`LEADER_WRITES_REFUSED_TOTAL`]).
pub fn leader_writes_refused() {
    metrics::counter!(LEADER_WRITES_REFUSED_TOTAL).increment(1);
}

// ---------------------------------------------------------------------------------------------
// The node agent's.

/// Counts one answered CNI request ([`AGENT_CNI_REQUESTS_TOTAL`]).
pub fn agent_cni_requests(verb: CniVerb, outcome: CniOutcome) {
    metrics::counter!(
        AGENT_CNI_REQUESTS_TOTAL,
        cni_verb::KEY => verb.as_str(),
        cni_outcome::KEY => outcome.as_str(),
    )
    .increment(1);
}

/// Records one CNI request's time from receipt to reply ([`AGENT_CNI_DURATION_SECONDS`]).
pub fn agent_cni_duration(verb: CniVerb, took: Duration) {
    metrics::histogram!(AGENT_CNI_DURATION_SECONDS, cni_verb::KEY => verb.as_str()).record(took);
}

/// Sets [`AGENT_IPS`]: the node's addresses of `family` in `state`.
pub fn agent_ips(family: Family, state: AgentIpsState, value: f64) {
    metrics::gauge!(
        AGENT_IPS,
        family::KEY => family.as_str(),
        agent_ips_state::KEY => state.as_str(),
    )
    .set(value);
}

/// Sets [`AGENT_ADDS_WAITING`]: the ADDs held now for lack of an address.
pub fn agent_adds_waiting(value: f64) {
    metrics::gauge!(AGENT_ADDS_WAITING).set(value);
}

/// Counts one server-side apply of the node side's fields ([`AGENT_STATUS_WRITES_TOTAL`]).
pub fn agent_status_writes(outcome: StatusWriteOutcome) {
    metrics::counter!(
        AGENT_STATUS_WRITES_TOTAL,
        status_write_outcome::KEY => outcome.as_str(),
    )
    .increment(1);
}

/// Sets [`AGENT_NODE_ROUTES`]: the routes `--node-routes` owns now.
pub fn agent_node_routes(value: f64) {
    metrics::gauge!(AGENT_NODE_ROUTES).set(value);
}

/// Counts one route add or delete ([`AGENT_NODE_ROUTE_OPS_TOTAL`]).
pub fn agent_node_route_ops(op: RouteOp, outcome: RouteOutcome) {
    metrics::counter!(
        AGENT_NODE_ROUTE_OPS_TOTAL,
        route_op::KEY => op.as_str(),
        route_outcome::KEY => outcome.as_str(),
    )
    .increment(1);
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
