//! IPAMBlock: one block of a pool granted to one node (cluster-pool). Creating it is the
//! claim; deleting it with a resourceVersion precondition is the release.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema::Cidr;

/// A block granted to a node; its canonical name derives from its CIDR
/// (`v4-10-0-1-16-28`; IPv6 fully expanded), so two operators cannot grant it twice.
// clippy reads the derive's repeated `printcolumn(type_ = ...)` keys as duplicated attributes
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.tidepool.dev",
    version = "v1alpha1",
    kind = "IPAMBlock",
    plural = "ipamblocks",
    shortname = "tpblock",
    category = "tidepool",
    status = "IPAMBlockStatus",
    derive = "PartialEq",
    doc = "A block of an IPPool granted to one node (tidepool cluster-pool).",
    selectable = ".spec.node",
    selectable = ".spec.nodeUID",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "CIDR", type_ = "string", json_path = ".spec.cidr"),
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.pool"),
    printcolumn(name = "Release", type_ = "string", json_path = ".spec.release"),
    printcolumn(name = "Answer", type_ = "string", json_path = ".status.releaseAck"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct IPAMBlockSpec {
    /// The IPPool the block belongs to.
    #[schemars(length(min = 1, max = 253))]
    pub pool: String,
    pub cidr: Cidr,
    /// The Node holding the block.
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    /// The UID of that Node: a Node re-created under the same name adopts the block, and the
    /// operator rewrites it to the new UID.
    #[serde(rename = "nodeUID")]
    #[schemars(length(min = 1, max = 36))]
    pub node_uid: String,
    /// Set by the operator to ask for the block back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<BlockRelease>,
}

/// The operator's release mark on a block.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BlockRelease {
    #[serde(rename = "marked-for-release")]
    MarkedForRelease,
    /// A value a later release writes, which this one does not know (`#[serde(other)]`):
    /// read as no mark. Never written, and not in the schema.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

/// The node side's answer on a block.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAMBlockStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_ack: Option<BlockAck>,
}

/// `ready-for-release`: no address of the block is used or cooling down, and none will be
/// until the mark is withdrawn; `do-not-release`: some is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BlockAck {
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
