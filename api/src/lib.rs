//! tidepool's custom resources, group `ipam.tidepool.dev`, version `v1alpha1`, all
//! cluster-scoped (DESIGN.md "Resources"): [`IPPool`], [`IPAMBlock`] and [`IPAMNode`] with
//! their schemas generated from the types, and the names the operator and the agent share
//! ([`names`]), how both read the objects as the engine's types ([`convert`]), and what both
//! check of a cluster before they start ([`preflight`]), and the bounds of their flags
//! ([`flags`]). No I/O here but the preflight checks' requests (feature `client`).
//!
//! The schemas do the validation a schema can express (CIDR formats, prefix lengths in
//! range, watermarks ≥ 0, enums for marks, answers and outcomes); the status subresource,
//! granular address-keyed maps and conditions as a list-map keyed by `type` are declared so
//! server-side apply merges them per entry. `deploy/crds/` holds [`crds_yaml`]'s output; a
//! test fails when the two drift.
#![cfg_attr(test, allow(clippy::too_many_lines))]
#![forbid(unsafe_code)]

mod block;
pub mod client;
pub mod convert;
pub mod flags;
pub mod names;
mod node;
mod pool;
pub mod preflight;
mod schema;

pub use block::{BlockAck, BlockRelease, IPAMBlock, IPAMBlockSpec, IPAMBlockStatus};
pub use node::{
    AddressRelease, IPAMNode, IPAMNodeSpec, IPAMNodeStatus, NodePoolUsage, NodePools, NodeUsage,
    ReclaimAnswer, ReclaimOutcome, ReclaimReason, ReleaseAnswer, TombstoneSpec, UsedEntry,
    Watermarks,
};
pub use pool::{BlockSize, IPPool, IPPoolSpec, IPPoolStatus, PoolUsage, UsageReadable};
pub use schema::Cidr;

/// The messages of the CRDs' CEL rules (`x-kubernetes-validations`), as the API server's
/// refusals carry them.
pub mod rule_messages {
    pub use crate::node::MIN_ABOVE_MAX;
    pub use crate::pool::{AT_MOST_2_64_BLOCKS, BLOCK_NOT_SHORTER};
    pub use crate::schema::CIDR_HOST_BITS;
}

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The three CRDs, in a stable order (IPPool, IPAMBlock, IPAMNode).
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![IPPool::crd(), IPAMBlock::crd(), IPAMNode::crd()]
}

/// The file name of each CRD under `deploy/crds/`, in [`crds`] order.
pub const CRD_FILES: [&str; 3] = ["ippools.yaml", "ipamblocks.yaml", "ipamnodes.yaml"];

/// One CRD as YAML, as `deploy/crds/` holds it.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> String {
    serde_saphyr::to_string(crd).expect("a CRD serializes")
}

/// All CRDs as one YAML stream (`---`-separated), as `tidepool-operator crds` prints them.
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|c| format!("---\n{}", crd_yaml(c)))
        .collect()
}
