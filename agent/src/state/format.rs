//! The checkpoint file's format (JSON) and its version rule.
//!
//! Version rule: an agent of format N reads files of formats N and N−1, and an agent of
//! format N−1 reads files of format N — so a rollout and its rollback both keep the node's
//! state. That is why a new format only adds fields with defaults (old readers ignore
//! them), and why each file carries `minReaderVersion`, the oldest format that may read it:
//! a format that older agents must not read says so, and they refuse it rather than
//! misread it. Format 1: the allocations, cooldowns and acks. Format 2 adds an
//! allocation's `netns`, and later its `network` (the CNI network it attaches) and its
//! `pools` (address → the pool it came from). Neither needs a new format: a reader that
//! ignores them misreads nothing — an entry without `network` has an unknown network, which
//! no GC frees (the safe side), and an address without a pool belongs to the pool whose
//! block holds it — so the previous release and format-1 agents read these files as they
//! are, and this agent reads theirs.
//!
//! Times are Unix milliseconds; pod UIDs are the API server's strings.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tidepool_ipam::addrs::{address, number};
use tidepool_ipam::node::{NodeSide, Record, RecordedAllocation, Refused};
use tidepool_ipam::{AddrMap, ReclaimOutcome, ReleaseAck};

use super::model::{AllocKey, NodeState, Own, ReclaimAnswer, parse_pod_uid};

/// The format this agent writes.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format that reads what this agent writes (format 2 only added a field with a
/// default).
pub const MIN_READER_VERSION: u32 = 1;

/// Whether an agent of format `reader` reads a file of format `version` that says
/// `min_reader` may read it: its own format and the one before, and any newer one that
/// allows it.
pub(crate) fn readable(version: u32, min_reader: u32, reader: u32) -> bool {
    version >= 1 && min_reader <= reader && version.saturating_add(1) >= reader
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

#[derive(Debug, Serialize, Deserialize)]
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

#[derive(Debug, Serialize, Deserialize)]
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
    /// Format 2, later: absent in files written before it (the network is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Address → the pool it was allocated from. Like `network`, no new format: a reader
    /// that ignores it derives each address's pool from the block holding it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pools: BTreeMap<IpAddr, String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReleaseAckRun {
    pub first: IpAddr,
    pub last: IpAddr,
    pub ack: Answer,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum Answer {
    #[serde(rename = "ready-for-release")]
    ReadyForRelease,
    #[serde(rename = "do-not-release")]
    DoNotRelease,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReclaimAckRecord {
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Outcome {
    Reclaimed,
    Stale,
}

/// A time as Unix milliseconds, rounded up (a cooldown may end a little late, never early).
pub(crate) fn to_ms(t: SystemTime) -> u64 {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

pub(crate) fn from_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

impl From<ReleaseAck> for Answer {
    fn from(a: ReleaseAck) -> Self {
        match a {
            ReleaseAck::ReadyForRelease => Answer::ReadyForRelease,
            ReleaseAck::DoNotRelease => Answer::DoNotRelease,
        }
    }
}

impl From<Answer> for ReleaseAck {
    fn from(a: Answer) -> Self {
        match a {
            Answer::ReadyForRelease => ReleaseAck::ReadyForRelease,
            Answer::DoNotRelease => ReleaseAck::DoNotRelease,
        }
    }
}

/// The outcome as the checkpoint keeps it. A `live` answer is not kept: the previous
/// release's reader (the format is read by N and N−1) has no such outcome, and a `live`
/// answer freed nothing, so after a restart the tombstone is simply answered again.
fn stored(o: ReclaimOutcome) -> Option<Outcome> {
    match o {
        ReclaimOutcome::Reclaimed => Some(Outcome::Reclaimed),
        ReclaimOutcome::Stale => Some(Outcome::Stale),
        ReclaimOutcome::Live => None,
    }
}

impl From<Outcome> for ReclaimOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Reclaimed => ReclaimOutcome::Reclaimed,
            Outcome::Stale => ReclaimOutcome::Stale,
        }
    }
}

/// The file for `state`, in the current format.
pub(crate) fn encode(state: &NodeState) -> CheckpointFile {
    let allocations = state
        .allocations()
        .map(|(k, a)| AllocationRecord {
            container_id: k.container_id.clone(),
            ifname: k.ifname.clone(),
            pod_uid: a.pod.uid.to_string(),
            namespace: a.pod.namespace,
            pod: a.pod.name,
            addresses: a.addrs,
            since: to_ms(a.since),
            boot_id: a.boot_id,
            netns: a.netns,
            network: a.network.as_deref().map(String::from),
            pools: (a.pools.iter()).map(|(a, p)| (*a, p.to_string())).collect(),
        })
        .collect();
    let release_ack = state
        .release_acks()
        .runs()
        .map(|(f, run, ack)| ReleaseAckRun {
            first: address(f, *run.start()),
            last: address(f, *run.end()),
            ack: (*ack).into(),
        })
        .collect();
    let reclaim_ack = state
        .reclaim_acks()
        .iter()
        .filter_map(|(addr, r)| {
            let rec = ReclaimAckRecord {
                pod_uid: r.pod_uid.to_string(),
                container_id: r.key.container_id.clone(),
                ifname: r.key.ifname.clone(),
                outcome: stored(r.outcome)?,
            };
            Some((*addr, rec))
        })
        .collect();
    CheckpointFile {
        version: FORMAT_VERSION,
        min_reader_version: MIN_READER_VERSION,
        allocations,
        cooldown: state
            .cooldowns()
            .iter()
            .map(|(a, t)| (*a, to_ms(*t)))
            .collect(),
        release_ack,
        block_release_ack: state
            .block_release_acks()
            .iter()
            .map(|(b, a)| (b.clone(), (*a).into()))
            .collect(),
        reclaim_ack,
    }
}

/// The state a file describes, for this boot; `Err` says why the file cannot be trusted
/// (an address held twice, a UID that is not one, ...): such a file is corrupt.
pub(crate) fn decode(
    file: CheckpointFile,
    boot_id: &str,
    reuse_cooldown: Duration,
) -> Result<NodeState, String> {
    let mut own = BTreeMap::new();
    let mut allocations = Vec::with_capacity(file.allocations.len());
    for r in file.allocations {
        let key = AllocKey::new(r.container_id, r.ifname);
        let pod_uid = parse_pod_uid(&r.pod_uid).map_err(|e| e.to_string())?;
        let mut addrs = r.addresses;
        if addrs.is_empty() {
            return Err(format!("allocation {key:?}: no addresses"));
        }
        addrs.sort();
        let o = Own {
            namespace: r.namespace,
            name: r.pod,
            boot_id: r.boot_id,
            netns: r.netns,
            pools: (r.pools.into_iter())
                .map(|(a, p)| (a, Arc::from(p)))
                .collect(),
        };
        own.insert(key.clone(), o);
        allocations.push(RecordedAllocation {
            key,
            pod_uid,
            addrs,
            since: from_ms(r.since),
            network: r.network.map(Arc::from),
        });
    }
    let mut reclaim_ack = BTreeMap::new();
    for (addr, r) in file.reclaim_ack {
        let answer = ReclaimAnswer {
            pod_uid: parse_pod_uid(&r.pod_uid).map_err(|e| e.to_string())?,
            key: AllocKey::new(r.container_id, r.ifname),
            outcome: r.outcome.into(),
        };
        reclaim_ack.insert(addr, answer);
    }
    let record = Record {
        allocations,
        cooldown: file
            .cooldown
            .into_iter()
            .map(|(a, ms)| (a, from_ms(ms)))
            .collect(),
        release_ack: release_acks(&file.release_ack)?,
        reclaim_ack,
        block_ack: file
            .block_release_ack
            .into_iter()
            .map(|(b, a)| (b, a.into()))
            .collect(),
    };
    let side = NodeSide::from_record(record, reuse_cooldown).map_err(|e| match e {
        Refused::AddressInUse { addr, holder } => {
            format!("{addr} held by both {holder:?} and a later allocation")
        }
        e => super::error::StateError::from(e).to_string(),
    })?;
    Ok(NodeState {
        boot_id: boot_id.to_owned(),
        side,
        own,
    })
}

fn release_acks(runs: &[ReleaseAckRun]) -> Result<AddrMap<ReleaseAck>, String> {
    let mut m = AddrMap::new();
    for r in runs {
        let (f, first) = number(&r.first);
        let (g, last) = number(&r.last);
        if f != g || first > last {
            return Err(format!("release ack run {} to {}", r.first, r.last));
        }
        m.insert_run(f, first..=last, r.ack.into());
    }
    Ok(m)
}
