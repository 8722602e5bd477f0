//! IPAMNode: one per Node (same name), carrying the Node's UID; the operator's intents in
//! `spec`, the node side's records and answers in `status` (DESIGN.md "Who writes what").

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema::{conditions, granular_map, pool_usage};

/// A node's address pool: what it may use, what it uses, and the release and reclaim
/// handshakes between the operator and the node side.
// clippy reads the derive's repeated `printcolumn(type_ = ...)` keys as duplicated attributes
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.tidepool.dev",
    version = "v1alpha1",
    kind = "IPAMNode",
    plural = "ipamnodes",
    shortname = "tpnode",
    category = "tidepool",
    status = "IPAMNodeStatus",
    derive = "PartialEq",
    doc = "A node's pod address pool (tidepool).",
    printcolumn(
        name = "V4-Allocated",
        type_ = "string",
        json_path = ".status.ipv4.allocated"
    ),
    printcolumn(name = "V4-Used", type_ = "string", json_path = ".status.ipv4.used"),
    printcolumn(
        name = "V6-Allocated",
        type_ = "string",
        json_path = ".status.ipv6.allocated"
    ),
    printcolumn(name = "V6-Used", type_ = "string", json_path = ".status.ipv6.used"),
    printcolumn(
        name = "Agent",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"AgentReady\")].status"
    ),
    printcolumn(
        name = "Blocked",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Blocked\")].reason"
    ),
    printcolumn(name = "Pool", type_ = "string", json_path = ".status.pools"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct IPAMNodeSpec {
    /// The UID of the Node this object belongs to (operator).
    #[serde(rename = "nodeUID")]
    #[schemars(length(min = 1, max = 36))]
    pub node_uid: String,
    /// The pool per family (users); overrides node selectors and `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<NodePools>,
    /// Per-node overrides of the operator's watermark flags (users).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermarks: Option<Watermarks>,
    /// Cloud sources: the node's addresses as the source reports them (operator).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 65536))]
    pub addresses: Vec<String>,
    /// Cloud sources: release marks per address (operator).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "granular_map::<AddressRelease>")]
    pub release: BTreeMap<String, AddressRelease>,
    /// Tombstones per address (operator): take back exactly this allocation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "granular_map::<TombstoneSpec>")]
    pub reclaim: BTreeMap<String, TombstoneSpec>,
}

/// The pool per family.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePools {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<String>,
}

/// Watermark overrides, per family; unset fields fall back to the operator's flags.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.minAllocate) || !has(self.maxAllocate) || self.maxAllocate == 0 || self.minAllocate <= self.maxAllocate",
    "message": MIN_ABOVE_MAX,
}]))]
pub struct Watermarks {
    /// Free addresses to keep (0 = none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub pre_allocate: Option<i64>,
    /// Minimum pool size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub min_allocate: Option<i64>,
    /// Hard cap (0 = none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub max_allocate: Option<i64>,
    /// Extra addresses claimed on top of the need in one pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub max_above_watermark: Option<i64>,
}

/// The message of the CRD rule refusing `minAllocate` above a set `maxAllocate`.
pub const MIN_ABOVE_MAX: &str = "minAllocate must not exceed maxAllocate (0: no cap)";

/// The operator's release mark on an address (cloud sources).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AddressRelease {
    #[serde(rename = "marked-for-release")]
    MarkedForRelease,
    /// The source has taken the address back; the entry goes once the node side dropped
    /// its answer.
    #[serde(rename = "released")]
    Released,
    /// A value a later release writes, which this one does not know (`#[serde(other)]`):
    /// read as no mark. Never written, and not in the schema.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// A tombstone: the exact allocation to take back.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TombstoneSpec {
    #[serde(rename = "podUID")]
    #[schemars(length(min = 1, max = 36))]
    pub pod_uid: String,
    #[serde(rename = "containerID")]
    #[schemars(length(min = 1, max = 256))]
    pub container_id: String,
    #[schemars(length(min = 1, max = 15))]
    pub ifname: String,
    pub reason: ReclaimReason,
}

/// Why an address is reclaimed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReclaimReason {
    PodDeleted,
    PodTerminal,
    SandboxReplaced,
    NodeDeleted,
    /// A value a later release writes, which this one does not know (`#[serde(other)]`):
    /// the tombstone is
    /// left unanswered. Never written, and not in the schema.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// The node side's records and answers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAMNodeStatus {
    /// Addresses in use, by address (node side).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "granular_map::<UsedEntry>")]
    pub used: BTreeMap<String, UsedEntry>,
    /// Addresses cooling down before reuse, by address: until when (node side).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "granular_map::<Time>")]
    pub cooldown: BTreeMap<String, Time>,
    /// Answers to address release marks (node side).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "granular_map::<ReleaseAnswer>")]
    pub release_ack: BTreeMap<String, ReleaseAnswer>,
    /// Answers to tombstones (node side).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "granular_map::<ReclaimAnswer>")]
    pub reclaim_ack: BTreeMap<String, ReclaimAnswer>,
    /// Addresses the node holds (operator; for `kubectl get`), clamped to the int64 maximum:
    /// `ipv4` and `ipv6` hold the exact figures. Kept until v1beta1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub allocated: Option<i64>,
    /// Addresses in use (node side; for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub in_use: Option<i64>,
    /// The pools the node's addresses come from, sorted (operator; for `kubectl get`): its
    /// blocks' `spec.pool`. Empty for cloud sources' addresses, which have no pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
    /// The node's addresses per pool and family, and whether its pods wait for a pool that
    /// gives them none (operator; `status.pools` above is the list of names, kept for
    /// `kubectl get`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "pool_usage")]
    pub pool_usage: Vec<NodePoolUsage>,
    /// IPv4 addresses held and in use (`allocated`: operator; `used`: node side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<NodeUsage>,
    /// IPv6 addresses held and in use (`allocated`: operator; `used`: node side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<NodeUsage>,
    /// `PoolReady`, `Blocked`, `WatermarksValid`, `Deleting` (operator), `AgentReady` (node
    /// side).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions")]
    pub conditions: Vec<Condition>,
}

/// Address counts of one family, as decimal strings (an IPv6 block of /64 or shorter holds
/// more than an int64), each with its own writer: `allocated` the operator's (the addresses
/// of the node's blocks and `spec.addresses`), `used` the node side's (its `used` entries).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+$"))]
    pub allocated: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+$"))]
    pub used: Option<String>,
}

/// The node's addresses of one pool and family (an item of `status.poolUsage`, keyed by
/// `name` and `family`), written by the operator from the node's blocks and `used` entries.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolUsage {
    /// The IPPool.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// `ipv4` or `ipv6`.
    #[schemars(regex(pattern = r"^ipv[46]$"))]
    pub family: String,
    /// Addresses of the node's blocks of the pool (a decimal string: a /64 holds more than
    /// an int64).
    #[schemars(regex(pattern = r"^[0-9]+$"))]
    pub allocated: String,
    /// Of those, addresses in `used`.
    #[schemars(regex(pattern = r"^[0-9]+$"))]
    pub used: String,
    /// Pods of the node wait for the pool and get no address of it: it has none left for
    /// the node, or their annotation names it and they may not use it (the `Blocked`
    /// condition says which).
    #[serde(default)]
    pub blocked: bool,
}

/// Which allocation holds an address.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsedEntry {
    #[serde(rename = "podUID")]
    #[schemars(length(min = 1, max = 36))]
    pub pod_uid: String,
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub pod: String,
    /// The full container ID the runtime gave (the engine keeps a hash of it and `ifname`).
    #[serde(rename = "containerID")]
    #[schemars(length(min = 1, max = 256))]
    pub container_id: String,
    #[schemars(length(min = 1, max = 15))]
    pub ifname: String,
    pub since: Time,
    /// The pool the address was allocated from, as the pod's pool was chosen at its ADD
    /// (written by the node side; never re-evaluated). Absent in entries written before it:
    /// such an entry belongs to the pool whose block holds its address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pool: Option<String>,
}

/// The node side's answer to a release mark.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ReleaseAnswer {
    #[serde(rename = "ready-for-release")]
    ReadyForRelease,
    #[serde(rename = "do-not-release")]
    DoNotRelease,
    /// A value a later release writes, which this one does not know (`#[serde(other)]`):
    /// read as no answer yet. Never written, and not in the schema.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// The node side's answer to a tombstone, naming the allocation it answers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimAnswer {
    #[serde(rename = "podUID")]
    #[schemars(length(min = 1, max = 36))]
    pub pod_uid: String,
    #[serde(rename = "containerID")]
    #[schemars(length(min = 1, max = 256))]
    pub container_id: String,
    #[schemars(length(min = 1, max = 15))]
    pub ifname: String,
    pub outcome: ReclaimOutcome,
}

/// `reclaimed`: the entry was that exact allocation and is gone (cooldown started);
/// `stale`: it was not, nothing was removed; `live`: it was, but its pod runs on the node
/// and this is its newest allocation in the family, nothing was removed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReclaimOutcome {
    Reclaimed,
    Stale,
    Live,
    /// A value a later release writes, which this one does not know (`#[serde(other)]`):
    /// read as no answer yet. Never written, and not in the schema.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}
