//! IPPool: CIDRs carved into blocks that nodes are granted (cluster-pool).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema::{Cidr, conditions};

/// A pool of CIDRs (IPv4 and/or IPv6) granted to nodes in blocks of `blockSize`.
// clippy reads the derive's repeated `printcolumn(type_ = ...)` keys as duplicated attributes
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.tidepool.dev",
    version = "v1alpha1",
    kind = "IPPool",
    plural = "ippools",
    shortname = "tpool",
    category = "tidepool",
    status = "IPPoolStatus",
    derive = "PartialEq",
    doc = "A pool of CIDRs granted to nodes in blocks (tidepool cluster-pool).",
    printcolumn(
        name = "Valid",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Valid\")].status"
    ),
    printcolumn(name = "CIDRs", type_ = "string", json_path = ".spec.cidrs"),
    printcolumn(
        name = "V4-Free",
        type_ = "string",
        json_path = ".status.ipv4.readable.free"
    ),
    printcolumn(
        name = "V6-Free",
        type_ = "string",
        json_path = ".status.ipv6.readable.free"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "V4-Capacity",
        type_ = "string",
        json_path = ".status.ipv4.readable.capacity",
        priority = 1
    ),
    printcolumn(
        name = "V4-Allocated",
        type_ = "string",
        json_path = ".status.ipv4.readable.allocated",
        priority = 1
    ),
    printcolumn(
        name = "V6-Capacity",
        type_ = "string",
        json_path = ".status.ipv6.readable.capacity",
        priority = 1
    ),
    printcolumn(
        name = "V6-Allocated",
        type_ = "string",
        json_path = ".status.ipv6.readable.allocated",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": BLOCK_NOT_SHORTER_RULE, "message": BLOCK_NOT_SHORTER},
    {"rule": AT_MOST_2_64_BLOCKS_RULE, "message": AT_MOST_2_64_BLOCKS},
]))]
pub struct IPPoolSpec {
    /// The pool's CIDRs, IPv4 and/or IPv6. Adding one grows the pool at runtime; removing
    /// one drains its blocks (marked, released once free, never granted again).
    #[schemars(length(min = 1, max = 64))]
    pub cidrs: Vec<Cidr>,
    /// Prefix length of the block granted to a node, per family. Immutable: the API server
    /// refuses a change (a CRD validation rule; the default makes sure the old value exists).
    /// A pool whose existing blocks do not match it is Invalid.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "blockSize is immutable: create a new pool for another block size",
    }]))]
    pub block_size: BlockSize,
    /// CIDRs never granted (whole blocks overlapping them are left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub exclude: Vec<Cidr>,
    /// Nodes whose labels all match are served from this pool (the oldest valid matching
    /// pool wins; an IPAMNode's `spec.pools` overrides). Without one, the pool named
    /// `default` serves nodes no other pool selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Namespaces whose pods may take addresses from this pool: the access control of a
    /// pool chosen per namespace or pod (and, set, it chooses this pool for their pods that
    /// name none). Absent or empty: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Pods that take addresses from this pool, among the pools their namespace may use (a
    /// convenience, not access control: a pod's creator sets its labels). Absent or empty:
    /// every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// The pool's watermarks on each node it serves, over the operator's flags for a
    /// node's default pool (whose IPAMNode `spec.watermarks` override them in turn), and
    /// over no pre-allocation for the node's other pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermarks: Option<crate::node::Watermarks>,
}

/// The block size of the family of the CIDR `c` (CEL, for the rules below).
macro_rules! block_of {
    () => {
        "(cidr(c).ip().family() == 4 ? self.blockSize.ipv4 : self.blockSize.ipv6)"
    };
}

/// CRD rule: each CIDR's block size is at least its prefix length (a block inside it).
const BLOCK_NOT_SHORTER_RULE: &str = concat!(
    "self.cidrs.all(c, !isCIDR(c) || ",
    block_of!(),
    " >= cidr(c).prefixLength())"
);
/// Its message.
pub const BLOCK_NOT_SHORTER: &str =
    "blockSize must be at least the prefix length of each CIDR of its family";

/// CRD rule: no CIDR holds more than 2^64 blocks.
const AT_MOST_2_64_BLOCKS_RULE: &str = concat!(
    "self.cidrs.all(c, !isCIDR(c) || ",
    block_of!(),
    " <= cidr(c).prefixLength() + 64)"
);
/// Its message.
pub const AT_MOST_2_64_BLOCKS: &str = "blockSize must be at most 64 more than the prefix length of each CIDR of its family (at most 2^64 blocks per CIDR)";

/// Prefix length of the unit granted to a node, per family (default /28 and /124: 16
/// addresses; /32 and /128 grant single addresses).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockSize {
    #[serde(default = "default_v4")]
    #[schemars(range(min = 0, max = 32))]
    pub ipv4: u8,
    #[serde(default = "default_v6")]
    #[schemars(range(min = 0, max = 128))]
    pub ipv6: u8,
}

fn default_v4() -> u8 {
    28
}

fn default_v6() -> u8 {
    124
}

impl Default for BlockSize {
    fn default() -> Self {
        Self {
            ipv4: default_v4(),
            ipv6: default_v6(),
        }
    }
}

/// What the operator last saw of the pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPPoolStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<PoolUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<PoolUsage>,
    /// `Valid` (operator).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// Address counts of one family, as decimal strings: an IPv6 pool's capacity does not fit
/// a 64-bit integer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolUsage {
    #[schemars(regex(pattern = r"^[0-9]+$"))]
    pub capacity: String,
    #[schemars(regex(pattern = r"^[0-9]+$"))]
    pub allocated: String,
    #[schemars(regex(pattern = r"^[0-9]+$"))]
    pub free: String,
    /// The same counts for people (`kubectl get`): exact below a million, `2^k` for a power
    /// of two, else three significant digits rounded down (`1.84e19`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readable: Option<UsageReadable>,
    /// Seconds until the pool runs out at its pace of the last 6 hours (a least-squares line
    /// through what it could still grant, two significant digits); absent while it is not
    /// shrinking. The operator's `tidepool_ipam_pool_exhaustion_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runway_seconds: Option<u64>,
}

/// [`PoolUsage`]'s counts for people.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageReadable {
    #[schemars(length(max = 40))]
    pub capacity: String,
    #[schemars(length(max = 40))]
    pub allocated: String,
    #[schemars(length(max = 40))]
    pub free: String,
}
