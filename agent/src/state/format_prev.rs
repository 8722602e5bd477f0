//! The previous release's checkpoint format code (format 2, as main wrote and read it
//! before the node side moved into `ipam`), kept for the tests only: a checkpoint this
//! build writes must be read by it, and one it wrote must be read by this build
//! (`checkpoint_tests.rs`, "the previous release reads ...").
//!
//! Its reader: the header's version rule, then these types. Its writer: these types.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The format the previous release wrote and read.
pub(crate) const FORMAT_VERSION: u32 = 2;
pub(crate) const MIN_READER_VERSION: u32 = 1;

/// The previous release's version rule.
pub(crate) fn readable(version: u32, min_reader: u32, reader: u32) -> bool {
    version >= 1 && min_reader <= reader && version.saturating_add(1) >= reader
}

/// What the previous release reads from `bytes`: `None` when it refuses the format.
pub(crate) fn read(bytes: &[u8]) -> Option<CheckpointFile> {
    let header: Header = serde_json::from_slice(bytes).ok()?;
    let min_reader = header.min_reader_version.unwrap_or(header.version);
    if !readable(header.version, min_reader, FORMAT_VERSION) {
        return None;
    }
    serde_json::from_slice(bytes).ok()
}

/// What every format has: read first, so a file of a format this agent does not read is
/// refused, not reported corrupt.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Header {
    pub version: u32,
    /// Missing: only the file's own format reads it.
    pub min_reader_version: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CheckpointFile {
    pub version: u32,
    pub min_reader_version: u32,
    #[serde(default)]
    pub allocations: Vec<AllocationRecord>,
    /// Address → end of its cooldown.
    #[serde(default)]
    pub cooldown: BTreeMap<IpAddr, u64>,
    /// Answers to address release marks, as runs of consecutive addresses.
    #[serde(default)]
    pub release_ack: Vec<ReleaseAckRun>,
    /// Block name → answer to its release mark.
    #[serde(default)]
    pub block_release_ack: BTreeMap<String, Answer>,
    /// Address → answer to its tombstone.
    #[serde(default)]
    pub reclaim_ack: BTreeMap<IpAddr, ReclaimAckRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AllocationRecord {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    pub namespace: String,
    pub pod: String,
    pub addresses: Vec<IpAddr>,
    pub since: u64,
    #[serde(rename = "bootID")]
    pub boot_id: String,
    /// Format 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ReleaseAckRun {
    pub first: IpAddr,
    pub last: IpAddr,
    pub ack: Answer,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) enum Answer {
    #[serde(rename = "ready-for-release")]
    ReadyForRelease,
    #[serde(rename = "do-not-release")]
    DoNotRelease,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReclaimAckRecord {
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Outcome {
    Reclaimed,
    Stale,
}
