//! What a check reports: the types of [`Report`] and its JSON form.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

/// What kind of problem a [`Problem`] is. Every kind needs a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProblemKind {
    /// The same address in `status.used` of two live nodes, an address used in another live
    /// node's block, or overlapping blocks. Never fixed automatically.
    Duplicate,
    /// A `status.used` entry outside its node's blocks (and `spec.addresses`).
    Leaked,
    /// A block whose Node no longer exists, or exists with another UID.
    OrphanBlock,
    /// A block its pool does not hold as a grantable block, or a used address outside every
    /// valid pool.
    OutOfRange,
    /// A block naming a pool that does not exist or is invalid.
    UnknownPool,
    /// A `status.used` entry whose address lies in its node's block of a pool that does not
    /// exist or is invalid (and that names no other pool): the address is in no pool.
    NoPool,
    /// A `status.used` entry naming a pool (the pod's, fixed at its ADD) whose address lies
    /// in its node's block of another pool.
    OutsidePool,
    /// An IPPool the operator will not use.
    InvalidPool,
    /// Something the operator cannot read and skips.
    Malformed,
    /// An IPAMNode whose `spec.nodeUID` is not the UID of its Node (someone changed it):
    /// the node side drops every block that does not carry its IPAMNode's nodeUID.
    NodeUid,
}

impl ProblemKind {
    pub const ALL: [ProblemKind; 10] = [
        ProblemKind::Duplicate,
        ProblemKind::Leaked,
        ProblemKind::OrphanBlock,
        ProblemKind::OutOfRange,
        ProblemKind::UnknownPool,
        ProblemKind::NoPool,
        ProblemKind::OutsidePool,
        ProblemKind::InvalidPool,
        ProblemKind::Malformed,
        ProblemKind::NodeUid,
    ];

    /// The label of the kind (as in the JSON form).
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Duplicate => "duplicate",
            ProblemKind::Leaked => "leaked",
            ProblemKind::OrphanBlock => "orphan-block",
            ProblemKind::OutOfRange => "out-of-range",
            ProblemKind::UnknownPool => "unknown-pool",
            ProblemKind::NoPool => "no-pool",
            ProblemKind::OutsidePool => "outside-pool",
            ProblemKind::InvalidPool => "invalid-pool",
            ProblemKind::Malformed => "malformed",
            ProblemKind::NodeUid => "node-uid",
        }
    }

    /// How the table's summary names `n` of them.
    pub fn describe(self, n: usize) -> String {
        let (one, many) = match self {
            ProblemKind::Duplicate => ("duplicate", "duplicates"),
            ProblemKind::Leaked => (
                "leaked entry (an address used outside its node's blocks)",
                "leaked entries (addresses used outside their node's blocks)",
            ),
            ProblemKind::OrphanBlock => (
                "orphan block (its Node is gone or has another UID)",
                "orphan blocks (their Node is gone or has another UID)",
            ),
            ProblemKind::OutOfRange => (
                "out-of-range block or address",
                "out-of-range blocks or addresses",
            ),
            ProblemKind::UnknownPool => (
                "block of an unknown or invalid pool",
                "blocks of unknown or invalid pools",
            ),
            ProblemKind::NoPool => (
                "address in no pool (its block's pool is missing or invalid)",
                "addresses in no pool (their block's pool is missing or invalid)",
            ),
            ProblemKind::OutsidePool => (
                "address outside its pod's pool (the pool its entry names)",
                "addresses outside their pod's pool (the pool their entry names)",
            ),
            ProblemKind::InvalidPool => ("invalid IP pool", "invalid IP pools"),
            ProblemKind::Malformed => ("malformed entry", "malformed entries"),
            ProblemKind::NodeUid => (
                "IPAMNode whose nodeUID is not its Node's UID",
                "IPAMNodes whose nodeUID is not their Node's UID",
            ),
        };
        format!("{n} {}", if n == 1 { one } else { many })
    }
}

/// One thing that needs a person.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Problem {
    pub kind: ProblemKind,
    /// The objects involved, as `kind/name` (`ipamnode/n1`, `ipamblock/v4-10-0-0-0-28`,
    /// `ippool/default`, `node/n1`); two for a duplicate.
    pub objects: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cidr: Option<IpNet>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// What is wrong, in a sentence.
    pub detail: String,
}

/// A `status.used` entry the operator will reclaim (informational).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReclaimCandidate {
    /// The IPAMNode holding the entry.
    pub node: String,
    pub address: IpAddr,
    pub pod_uid: String,
    pub namespace: String,
    pub pod: String,
    /// `pod-deleted`, `pod-terminal` or `sandbox-replaced`.
    pub reason: &'static str,
    /// The operator has written its tombstone already (the node side has yet to answer).
    pub tombstoned: bool,
}

/// Whether the operator uses a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolState {
    Valid,
    Invalid,
}

/// Capacity, allocated and free, as decimal strings (an IPv6 pool's counts exceed what a
/// JSON number holds exactly; the IPPool status writes them the same way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub capacity: String,
    pub allocated: String,
    pub free: String,
}

impl Counts {
    pub fn new(capacity: u128, allocated: u128, free: u128) -> Self {
        Self {
            capacity: capacity.to_string(),
            allocated: allocated.to_string(),
            free: free.to_string(),
        }
    }
}

/// One pool and family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolUsage {
    pub pool: String,
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    pub cidrs: Vec<IpNet>,
    /// The prefix length of a block.
    pub block_size: u8,
    pub state: PoolState,
    /// Why the pool is invalid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Usable addresses (a valid pool only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Counts>,
    /// Blocks (a valid pool only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Counts>,
    /// `status.used` entries inside the pool.
    pub in_use: u64,
    /// Seconds until the pool runs out at its pace of the last 6 hours, as the operator
    /// wrote it in the IPPool's status (`runwaySeconds`); absent while it is not shrinking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runway_seconds: Option<u64>,
}

/// Counts of the whole check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub ippools: usize,
    pub ipamblocks: usize,
    pub ipamnodes: usize,
    pub nodes: usize,
    pub pods: usize,
    /// `status.used` entries of every IPAMNode.
    pub addresses_in_use: usize,
    pub reclaim_candidates: usize,
    /// Problems per kind, every kind present.
    pub problems: BTreeMap<&'static str, usize>,
    /// Whether any problem needs a person (the exit status is then 1).
    pub needs_attention: bool,
}

impl Summary {
    /// `objects`: IPPools, IPAMBlocks, IPAMNodes, Nodes, Pods.
    pub(super) fn new(
        objects: [usize; 5],
        addresses_in_use: usize,
        reclaim_candidates: usize,
        problems: &[Problem],
    ) -> Self {
        let [ippools, ipamblocks, ipamnodes, nodes, pods] = objects;
        let mut by_kind: BTreeMap<&'static str, usize> =
            ProblemKind::ALL.iter().map(|k| (k.as_str(), 0)).collect();
        for p in problems {
            *by_kind.entry(p.kind.as_str()).or_default() += 1;
        }
        Self {
            ippools,
            ipamblocks,
            ipamnodes,
            nodes,
            pods,
            addresses_in_use,
            reclaim_candidates,
            problems: by_kind,
            needs_attention: !problems.is_empty(),
        }
    }
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub summary: Summary,
    pub pools: Vec<PoolUsage>,
    /// Informational: the operator reclaims these itself.
    pub reclaim_candidates: Vec<ReclaimCandidate>,
    /// Sorted by kind, then objects.
    pub problems: Vec<Problem>,
}

impl Report {
    /// Whether something needs a person: any problem. Reclaim candidates alone do not.
    pub fn needs_attention(&self) -> bool {
        !self.problems.is_empty()
    }

    /// The exit status of `check` for this report: 0 when nothing needs a person, 1 when
    /// something does (2, for errors, is the caller's).
    pub fn exit_code(&self) -> u8 {
        u8::from(self.needs_attention())
    }

    /// The problems of one kind.
    pub fn of_kind(&self, kind: ProblemKind) -> impl Iterator<Item = &Problem> + '_ {
        self.problems.iter().filter(move |p| p.kind == kind)
    }

    /// The JSON form (`--output json`), pretty-printed.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes")
    }
}
