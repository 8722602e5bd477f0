//! Repair of the cluster pool at start and on every resync (DESIGN.md, "Repair at start and on
//! every resync"; Kubernetes' ClusterIP repair): a pure check of every IPAMBlock and every
//! IPAMNode `status.used` against the pools and the existing Nodes, giving a typed
//! [`RepairReport`], and a [`RepairTracker`] that proposes fixes for leak-like findings only once
//! they were seen in [`PASSES_BEFORE_FIX`] consecutive passes. No I/O: the caller lists the
//! objects, raises events and metrics, blocks nodes and carries out the fixes.
//!
//! # Inputs
//!
//! - the [`PoolSet`] after [`PoolSet::rebuild`];
//! - every IPAMBlock as a [`BlockClaim`] (name, pool, cidr, node, nodeUID);
//! - every [`IpamNode`] (name, Node UID, `status.used`: address → pod UID);
//! - the existing Nodes as [`LiveNodes`] (name → UID).
//!
//! A *holder* is a node incarnation: a node name with a node UID (a block's `spec.node` and
//! `spec.nodeUID`; an IPAMNode's name and recorded UID). A holder is **live** when a Node of that
//! name exists with that UID; it is **gone** otherwise (no such Node, or the name was reused by
//! a new Node with another UID). A node's blocks are the blocks whose holder equals the
//! IPAMNode's holder (name *and* UID).
//!
//! # Rules (one finding per fact; a fact may give findings of several kinds)
//!
//! 1. **Orphan block** (`orphan-block`): a block whose holder is gone. Leak-like when no Node
//!    has its node name; a Node re-created under the name adopts the block instead.
//! 2. **Address used outside its node's blocks**: a `used` entry whose address lies in no block
//!    of its node. If the entry's holder is live and the address lies in a block of another
//!    *live* holder, it is a [`Conflict::ForeignAddress`] (`duplicate`); otherwise it is
//!    [`RepairFinding::Leaked`] (`leaked`, leak-like) — a block of a gone holder does not
//!    count, that block is itself an orphan. Entries of a gone node that lie in its own
//!    (orphan) blocks are not reported here: whole-node reclaim (DESIGN.md, "Reclaim") owns
//!    them, unless another holder uses the same address (rule 3).
//! 3. **Duplicates between nodes** (`duplicate`): the same address in `status.used` of two
//!    holders ([`Conflict::SameAddress`]), or overlapping blocks of two holders
//!    ([`Conflict::OverlappingBlocks`]). Reported as a duplicate only when **both holders are
//!    live**, and then **never fixed automatically**: the finding names both nodes
//!    ([`RepairReport::blamed`], [`RepairReport::nodes_to_block`]) and the caller raises an
//!    event, counts the metric and blocks the nodes it is blamed on. The block's holder is the
//!    authority: an entry of node A inside live node B's block is A's anomaly alone (A is
//!    blocked and told, B goes on getting addresses); only overlapping blocks, or an address
//!    two nodes use that neither holds a block for, blame both. When one holder is gone, the gone one's claim is
//!    the orphan: its block is an orphan block (rule 1), its `used` entry is
//!    [`RepairFinding::Leaked`]; the live one keeps its claim. When both are gone, both claims
//!    are orphans in the same way. Overlapping blocks of one holder are not a duplicate between
//!    nodes (rebuild reports them as `Overlap`).
//! 4. **Out of range** (`out-of-range`): a block whose named pool is valid but does not hold it
//!    as a grantable block (family not served, outside its CIDRs, overlapping an exclusion,
//!    another block size, host bits set — the checks of [`PoolSet::rebuild`], so its
//!    `OutOfRange`, `Excluded`, `WrongBlockSize` and `Misaligned` findings carry over); and a
//!    `used` address outside the CIDRs of every valid pool ([`PoolSet::locate`]).
//! 5. **Unknown pool** (`unknown-pool`): a block naming a pool that does not exist or is Invalid
//!    (rebuild's `UnknownPool` carries over). A block of another size or with host bits inside
//!    a valid pool is stray (rule 4): reported, left out, and never a reason to invalidate
//!    its pool.
//!    Rebuild's `NameMismatch` is not a repair issue (the object exists and is indexed).
//!
//! Only orphan blocks and leaked entries are ever fixed (see [`RepairTracker`]); out-of-range
//! and unknown-pool findings are for an operator to look at (they usually mean a pool was
//! edited or deleted under live blocks).
//!
//! # Determinism
//!
//! [`check`] gives the same report for the same inputs in any order: findings are deduplicated
//! and sorted by their derived order (variant, then names, CIDRs, addresses, UIDs); pairs are
//! normalized (the smaller side first). No hash-map iteration decides anything.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::set::{BlockRecord, PoolSet};
use super::{PoolError, family_of, span};
use crate::types::{Family, IpamNode, NodeInfo, NodeName, NodeUid, PodUid};

use tidepool_metrics::RepairKind;

/// Consecutive passes a leak-like finding must be seen in before [`RepairTracker::fixes`]
/// proposes its fix.
pub const PASSES_BEFORE_FIX: u32 = 3;

/// One IPAMBlock object as repair sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockClaim {
    /// The object's name.
    pub name: Arc<str>,
    /// `spec.pool`.
    pub pool: Arc<str>,
    /// `spec.cidr`.
    pub cidr: IpNet,
    /// `spec.node`.
    pub node: NodeName,
    /// `spec.nodeUID`.
    pub node_uid: NodeUid,
}

impl BlockClaim {
    /// The record [`PoolSet::rebuild`] takes, keyed by the object's name.
    pub fn record(&self) -> BlockRecord<'_, &str> {
        BlockRecord {
            key: &self.name,
            name: &self.name,
            pool: &self.pool,
            cidr: self.cidr,
        }
    }

    fn holder(&self) -> Holder<'_> {
        (&*self.node, self.node_uid)
    }
}

/// The existing Nodes: name → UID (from the Node informer). A hash map: a repair pass
/// asks it a few times per block, and nothing iterates it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveNodes(foldhash::HashMap<NodeName, NodeUid>);

impl LiveNodes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that a Node of this name exists with this UID.
    pub fn insert(&mut self, name: NodeName, uid: NodeUid) {
        self.0.insert(name, uid);
    }

    /// The UID of the existing Node of this name, if any.
    pub fn uid(&self, name: &str) -> Option<NodeUid> {
        self.0.get(name).copied()
    }

    /// Whether the holder (`name`, `uid`) is live: a Node of that name exists with that UID.
    pub fn is_live(&self, name: &str, uid: NodeUid) -> bool {
        self.uid(name) == Some(uid)
    }

    /// From the Node informer's view.
    pub fn from_infos<'a>(infos: impl IntoIterator<Item = &'a NodeInfo>) -> Self {
        infos.into_iter().map(|n| (n.name.clone(), n.uid)).collect()
    }
}

impl FromIterator<(NodeName, NodeUid)> for LiveNodes {
    fn from_iter<T: IntoIterator<Item = (NodeName, NodeUid)>>(iter: T) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// A block named in a finding.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockRef {
    pub name: String,
    pub cidr: IpNet,
    pub pool: String,
    pub node: NodeName,
    pub node_uid: NodeUid,
}

impl BlockRef {
    fn of(b: &BlockClaim) -> Self {
        Self {
            name: b.name.to_string(),
            cidr: b.cidr,
            pool: b.pool.to_string(),
            node: b.node.clone(),
            node_uid: b.node_uid,
        }
    }
}

/// A `status.used` entry named in a finding: the IPAMNode's holder and the entry's pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UsedRef {
    pub node: NodeName,
    pub node_uid: NodeUid,
    pub pod_uid: PodUid,
}

/// A duplicate between two live holders. Never fixed automatically.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Conflict {
    /// The same address in `status.used` of two live nodes (`first` < `second`).
    SameAddress {
        address: IpAddr,
        first: UsedRef,
        second: UsedRef,
    },
    /// A live node uses an address that lies in none of its blocks but in `owner`'s block, whose
    /// node is live too.
    ForeignAddress {
        address: IpAddr,
        user: UsedRef,
        owner: BlockRef,
    },
    /// Blocks of two live nodes overlap (`first` < `second`).
    OverlappingBlocks { first: BlockRef, second: BlockRef },
}

// Written for people (the `IPAddressDuplicate` event): `check`'s wording, UIDs as the API
// server prints them.

impl fmt::Display for UsedRef {
    /// `node (node UID …, pod UID …)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (node UID {}, pod UID {})",
            self.node, self.node_uid, self.pod_uid
        )
    }
}

impl fmt::Display for BlockRef {
    /// `block CIDR (pool P) of node N (node UID …)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block {} (pool {}) of node {} (node UID {})",
            self.cidr, self.pool, self.node, self.node_uid
        )
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::SameAddress {
                address,
                first,
                second,
            } => write!(
                f,
                "{address} is in status.used of two live nodes: {first} and {second}"
            ),
            Conflict::ForeignAddress {
                address,
                user,
                owner,
            } => write!(f, "node {user} uses {address}, which lies in {owner}"),
            Conflict::OverlappingBlocks { first, second } => write!(f, "{first} overlaps {second}"),
        }
    }
}

/// Why a block or an address is out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RangeIssue {
    /// The block's pool serves no CIDR of its family.
    FamilyNotServed,
    /// The block is not inside its pool's CIDRs.
    OutsidePool,
    /// The block overlaps one of its pool's exclusions (or has no usable address).
    Excluded,
    /// The block's prefix length is not its pool's block size.
    WrongBlockSize { expected: u8 },
    /// The block's CIDR has host bits set.
    Misaligned,
    /// A `used` address outside the CIDRs of every valid pool.
    OutsideEveryPool,
}

/// What is out of range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RangeSubject {
    Block(BlockRef),
    Address { address: IpAddr, used: UsedRef },
}

/// One repair finding. Each names the objects involved; [`Self::kind`] is the metric label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RepairFinding {
    /// A block whose holder is gone (rule 1). Leak-like when no Node has its node name: its
    /// fix releases the block. A Node re-created under the name adopts it instead (the
    /// node's pass rewrites its nodeUID), so it is reported and never released.
    OrphanBlock {
        block: BlockRef,
        /// The UID of the Node of that name that exists now, if any (a recreated node).
        current_uid: Option<NodeUid>,
    },
    /// A `used` entry whose claim is not backed by a live claim (rules 2 and 3). Leak-like: its
    /// fix tombstones the entry.
    Leaked {
        address: IpAddr,
        used: UsedRef,
        /// Whether the entry's own holder is live.
        node_live: bool,
    },
    /// A duplicate between two live holders (rules 2 and 3). Never fixed.
    Duplicate(Conflict),
    /// Rule 4.
    OutOfRange {
        subject: RangeSubject,
        issue: RangeIssue,
    },
    /// Rule 5.
    UnknownPool {
        block: BlockRef,
        /// The pool exists but is Invalid (otherwise there is no pool of that name).
        invalid: bool,
    },
}

impl RepairFinding {
    /// The `kind` label of `tidepool_ipam_repair_issues_total`.
    pub fn kind(&self) -> RepairKind {
        match self {
            RepairFinding::OrphanBlock { .. } => RepairKind::OrphanBlock,
            RepairFinding::Leaked { .. } => RepairKind::Leaked,
            RepairFinding::Duplicate(_) => RepairKind::Duplicate,
            RepairFinding::OutOfRange { .. } => RepairKind::OutOfRange,
            RepairFinding::UnknownPool { .. } => RepairKind::UnknownPool,
        }
    }

    /// Whether the finding is leak-like (waits [`PASSES_BEFORE_FIX`] passes, then is fixed).
    pub fn is_leak_like(&self) -> bool {
        self.fix().is_some()
    }

    /// The fix this finding calls for once it has persisted, which is also its identity across
    /// passes; `None` for findings that are never fixed automatically.
    pub fn fix(&self) -> Option<RepairFix> {
        match self {
            // a Node re-created under the block's node name adopts the block (the node's
            // pass rewrites its nodeUID): its addresses may be live pods'
            RepairFinding::OrphanBlock {
                current_uid: Some(_),
                ..
            } => None,
            RepairFinding::OrphanBlock { block, .. } => {
                Some(RepairFix::ReleaseBlock(block.clone()))
            }
            RepairFinding::Leaked { address, used, .. } => Some(RepairFix::Tombstone {
                address: *address,
                used: used.clone(),
            }),
            _ => None,
        }
    }
}

/// A fix proposed by [`RepairTracker::fixes`]. Its fields are the finding's identity: the same
/// block (name, CIDR, pool, node, node UID), or the same entry (node, node UID, address, pod UID).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RepairFix {
    /// Release the orphan block: delete the IPAMBlock (with a resourceVersion precondition).
    ReleaseBlock(BlockRef),
    /// Take back the leaked entry: write a tombstone `spec.reclaim[address] = {pod_uid}` on the
    /// node's IPAMNode (the node side removes the entry if it still has that pod UID).
    Tombstone { address: IpAddr, used: UsedRef },
}

/// What one repair pass found, sorted and deduplicated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    pub findings: Vec<RepairFinding>,
}

impl RepairReport {
    /// Findings per `kind` label, every label present (zero included), in label order.
    pub fn counts(&self) -> BTreeMap<RepairKind, usize> {
        let mut out: BTreeMap<RepairKind, usize> =
            RepairKind::ALL.iter().map(|k| (*k, 0)).collect();
        for f in &self.findings {
            *out.entry(f.kind()).or_default() += 1;
        }
        out
    }

    /// The nodes a duplicate of this report is blamed on (the caller raises an event on each
    /// and blocks them). The block's holder is the authority: a [`Conflict::ForeignAddress`]
    /// is its user's anomaly alone; a [`Conflict::SameAddress`] one of whose sides holds the
    /// block the address lies in is that block's foreign address (reported as such, blamed
    /// on the other side), so it blames nobody itself; overlapping blocks, and the same
    /// address used by two nodes neither of which holds it, blame both.
    pub fn blamed<'a>(&self, c: &'a Conflict) -> Vec<&'a NodeName> {
        match c {
            Conflict::ForeignAddress { user, .. } => vec![&user.node],
            Conflict::SameAddress {
                address,
                first,
                second,
            } => {
                let holds = |u: &UsedRef| {
                    self.findings.iter().any(|f| {
                        matches!(f, RepairFinding::Duplicate(Conflict::ForeignAddress { address: a, owner, .. })
                            if a == address && owner.node == u.node && owner.node_uid == u.node_uid)
                    })
                };
                if holds(first) || holds(second) {
                    Vec::new()
                } else {
                    vec![&first.node, &second.node]
                }
            }
            Conflict::OverlappingBlocks { first, second } => vec![&first.node, &second.node],
        }
    }

    /// Every node a duplicate between live holders is blamed on ([`Self::blamed`]): the
    /// caller blocks them.
    pub fn nodes_to_block(&self) -> BTreeSet<NodeName> {
        self.findings
            .iter()
            .filter_map(|f| match f {
                RepairFinding::Duplicate(c) => Some(self.blamed(c)),
                _ => None,
            })
            .flatten()
            .cloned()
            .collect()
    }

    /// The findings of one kind label.
    pub fn of_kind(&self, kind: RepairKind) -> impl Iterator<Item = &RepairFinding> + '_ {
        self.findings.iter().filter(move |f| f.kind() == kind)
    }
}

type Holder<'a> = (&'a str, NodeUid);

/// A block's address span, for the sorted sweep.
#[derive(Debug, Clone, Copy)]
struct Span {
    family: Family,
    lo: u128,
    hi: u128,
    block: usize,
}

fn addr_num(a: IpAddr) -> (Family, u128) {
    match a {
        IpAddr::V4(a) => (Family::V4, u32::from(a) as u128),
        IpAddr::V6(a) => (Family::V6, u128::from(a)),
    }
}

/// Checks the pools, blocks and IPAMNodes against the existing Nodes (see the module
/// documentation for the rules). Input order does not matter.
pub fn check<N: std::borrow::Borrow<IpamNode>>(
    pools: &PoolSet,
    blocks: &[BlockClaim],
    ipam_nodes: &[N],
    nodes: &LiveNodes,
) -> RepairReport {
    let (spans, max_hi) = sorted_spans(blocks);
    let mut c = Checker {
        pools,
        blocks,
        nodes,
        spans,
        max_hi,
        in_pool: vec![true; blocks.len()],
        overlapped: vec![false; blocks.len()],
        found: BTreeSet::new(),
    };
    c.check_blocks();
    c.check_overlaps();
    let uses = c.check_used(ipam_nodes);
    c.check_shared_addresses(uses);
    RepairReport {
        findings: c.found.into_iter().collect(),
    }
}

/// An address in use by a holder, with whether that holder's Node is live.
type Use = (IpAddr, UsedRef, bool);

/// One check's inputs, what it learned of the blocks, and its findings.
struct Checker<'a> {
    pools: &'a PoolSet,
    blocks: &'a [BlockClaim],
    nodes: &'a LiveNodes,
    /// The blocks sorted by family and span ([`sorted_spans`]).
    spans: Vec<Span>,
    /// The running maximum end of `spans` per family.
    max_hi: Vec<u128>,
    /// Per block: its pool serves it (rules 4 and 5 hold).
    in_pool: Vec<bool>,
    /// Per block: it overlaps a block of another holder.
    overlapped: Vec<bool>,
    found: BTreeSet<RepairFinding>,
}

/// The blocks sorted by family and span, with the running maximum end per family, so the
/// blocks holding an address are found by a short backward walk.
fn sorted_spans(blocks: &[BlockClaim]) -> (Vec<Span>, Vec<u128>) {
    let mut spans: Vec<Span> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let (lo, hi) = span(&b.cidr);
            Span {
                family: family_of(&b.cidr),
                lo,
                hi,
                block: i,
            }
        })
        .collect();
    // a total order (the index last, as a stable sort would keep it): the unstable sort
    // gives the stable one's order, with fewer moves
    spans.sort_unstable_by(|x, y| {
        (x.family, x.lo, x.hi)
            .cmp(&(y.family, y.lo, y.hi))
            .then_with(|| blocks[x.block].cmp(&blocks[y.block]))
            .then(x.block.cmp(&y.block))
    });
    let mut max_hi: Vec<u128> = Vec::with_capacity(spans.len());
    for (i, s) in spans.iter().enumerate() {
        let m = match i.checked_sub(1) {
            Some(j) if spans[j].family == s.family => max_hi[j].max(s.hi),
            _ => s.hi,
        };
        max_hi.push(m);
    }
    (spans, max_hi)
}

impl<'a> Checker<'a> {
    fn live(&self, h: Holder<'_>) -> bool {
        self.nodes.is_live(h.0, h.1)
    }

    /// In its pool and shared with no other holder: an entry in it needs no further look.
    fn clean(&self, block: usize) -> bool {
        self.in_pool[block] && !self.overlapped[block]
    }

    /// The blocks holding an address (indices into `blocks`).
    fn holding(&self, addr: IpAddr) -> Vec<usize> {
        let (family, a) = addr_num(addr);
        let end = (self.spans).partition_point(|s| (s.family, s.lo) <= (family, a));
        let mut out: Vec<usize> = Vec::new();
        for i in (0..end).rev() {
            if self.spans[i].family != family || self.max_hi[i] < a {
                break;
            }
            if self.spans[i].hi >= a {
                out.push(self.spans[i].block);
            }
        }
        out
    }

    /// Blocks on their own: orphan (rule 1), pool checks (rules 4 and 5).
    fn check_blocks(&mut self) {
        let pool_names: BTreeSet<&str> = self.pools.validity().map(|(n, _)| n).collect();
        for (i, b) in self.blocks.iter().enumerate() {
            if !self.live(b.holder()) {
                self.found.insert(RepairFinding::OrphanBlock {
                    block: BlockRef::of(b),
                    current_uid: self.nodes.uid(&b.node),
                });
            }
            if let Some(f) = check_pool(self.pools, &pool_names, b) {
                self.found.insert(f);
                self.in_pool[i] = false;
            }
        }
    }

    /// Overlapping blocks of two holders (rule 3): a sweep over the sorted spans.
    fn check_overlaps(&mut self) {
        let mut active: Vec<usize> = Vec::new();
        for i in 0..self.spans.len() {
            let s = self.spans[i];
            active.retain(|&j| self.spans[j].family == s.family && self.spans[j].hi >= s.lo);
            let b = &self.blocks[s.block];
            for &j in &active {
                let o = &self.blocks[self.spans[j].block];
                if o.holder() != b.holder() {
                    self.overlapped[s.block] = true;
                    self.overlapped[self.spans[j].block] = true;
                }
                if o.holder() != b.holder() && self.live(o.holder()) && self.live(b.holder()) {
                    let (x, y) = if o <= b { (o, b) } else { (b, o) };
                    self.found
                        .insert(RepairFinding::Duplicate(Conflict::OverlappingBlocks {
                            first: BlockRef::of(x),
                            second: BlockRef::of(y),
                        }));
                }
                // A gone holder's block is already an orphan block (rule 1).
            }
            active.push(i);
        }
    }

    /// `used` entries: outside the node's blocks (rule 2), out of range (rule 4).
    /// An address two holders use is outside the blocks of at least one of them, unless
    /// blocks of two holders overlap: so only such entries are gathered, and each one's
    /// address is completed with the holders of the blocks holding it that use it too.
    fn check_used<N: std::borrow::Borrow<IpamNode>>(&mut self, ipam_nodes: &'a [N]) -> Vec<Use> {
        // (hash maps: asked once per node and per block, iterated never)
        let by_holder: foldhash::HashMap<Holder<'a>, &IpamNode> = ipam_nodes
            .iter()
            .map(|n| n.borrow())
            .map(|n| ((&*n.name, n.node_uid), n))
            .collect();
        let mut own_blocks: foldhash::HashMap<Holder<'_>, Vec<usize>> =
            foldhash::HashMap::default();
        for (i, b) in self.blocks.iter().enumerate() {
            own_blocks.entry(b.holder()).or_default().push(i);
        }
        let mut uses: Vec<Use> = Vec::new();
        for n in ipam_nodes.iter().map(|n| n.borrow()) {
            let mine = (own_blocks.get(&(&*n.name, n.node_uid))).map_or(&[][..], Vec::as_slice);
            self.check_node_used(n, mine, &by_holder, &mut uses);
        }
        uses
    }

    /// One IPAMNode's `used` entries ([`Checker::check_used`]); `mine` are its blocks.
    fn check_node_used(
        &mut self,
        n: &IpamNode,
        mine: &[usize],
        by_holder: &foldhash::HashMap<Holder<'_>, &IpamNode>,
        uses: &mut Vec<Use>,
    ) {
        let holder: Holder<'_> = (&*n.name, n.node_uid);
        let node_live = self.live(holder);
        let mut own = OwnBlocks::new(self.blocks, mine);
        for (address, e) in &n.node.used {
            if own.only(address).is_some_and(|i| self.clean(i)) {
                continue;
            }
            let held = self.holding(address);
            let in_own = held.iter().find(|&&i| self.blocks[i].holder() == holder);
            if in_own.is_some_and(|&i| self.clean(i)) {
                continue; // the common case: in its own block, in its pool, not shared
            }
            let used = UsedRef {
                node: n.name.clone(),
                node_uid: n.node_uid,
                pod_uid: e.pod_uid,
            };
            if in_own.is_none() {
                self.outside_own_blocks(address, &used, node_live, &held);
            }
            if self.pools.locate(address).is_none() {
                self.found.insert(RepairFinding::OutOfRange {
                    subject: RangeSubject::Address {
                        address,
                        used: used.clone(),
                    },
                    issue: RangeIssue::OutsideEveryPool,
                });
            }
            // the holders of the blocks holding it that use it too
            for &i in &held {
                let h = self.blocks[i].holder();
                if h == holder {
                    continue;
                }
                if let Some(other) = by_holder.get(&h)
                    && let Some(oe) = other.node.used.get(&address)
                {
                    let user = UsedRef {
                        node: other.name.clone(),
                        node_uid: other.node_uid,
                        pod_uid: oe.pod_uid,
                    };
                    uses.push((address, user, self.live(h)));
                }
            }
            uses.push((address, used, node_live));
        }
    }

    /// An entry outside its node's blocks (rule 2): in a live holder's block it is that
    /// block's duplicate, else it is leaked.
    fn outside_own_blocks(
        &mut self,
        address: IpAddr,
        used: &UsedRef,
        node_live: bool,
        held: &[usize],
    ) {
        let owner = held
            .iter()
            .map(|&i| &self.blocks[i])
            .filter(|b| node_live && self.live(b.holder()))
            .min();
        self.found.insert(match owner {
            Some(o) => RepairFinding::Duplicate(Conflict::ForeignAddress {
                address,
                user: used.clone(),
                owner: BlockRef::of(o),
            }),
            None => RepairFinding::Leaked {
                address,
                used: used.clone(),
                node_live,
            },
        });
    }

    /// The same address used by two holders (rule 3).
    fn check_shared_addresses(&mut self, mut uses: Vec<Use>) {
        uses.sort();
        uses.dedup();
        for group in uses.chunk_by(|x, y| x.0 == y.0) {
            for (i, x) in group.iter().enumerate() {
                for y in &group[i + 1..] {
                    self.shared_address(x, y);
                }
            }
        }
    }

    fn shared_address(&mut self, x: &Use, y: &Use) {
        if (&x.1.node, x.1.node_uid) == (&y.1.node, y.1.node_uid) {
            return;
        }
        if x.2 && y.2 {
            self.found
                .insert(RepairFinding::Duplicate(Conflict::SameAddress {
                    address: x.0,
                    first: x.1.clone(),
                    second: y.1.clone(),
                }));
            return;
        }
        // The gone holder's claim is the orphan; the live one keeps its own.
        for z in [x, y] {
            if !z.2 {
                self.found.insert(RepairFinding::Leaked {
                    address: z.0,
                    used: z.1.clone(),
                    node_live: false,
                });
            }
        }
    }
}

/// One node's blocks in address order, for the fast path of its `used` entries (in address
/// order too): when the blocks do not overlap (the normal case), the entries find their
/// block with one walk along them.
struct OwnBlocks<'a> {
    blocks: &'a [BlockClaim],
    mine: &'a [usize],
    spans: Vec<(Family, u128, u128, usize)>,
    disjoint: bool,
    at: usize,
}

impl<'a> OwnBlocks<'a> {
    fn new(blocks: &'a [BlockClaim], mine: &'a [usize]) -> Self {
        let mut spans: Vec<(Family, u128, u128, usize)> = mine
            .iter()
            .map(|&i| {
                let (lo, hi) = span(&blocks[i].cidr);
                (family_of(&blocks[i].cidr), lo, hi, i)
            })
            .collect();
        spans.sort_unstable();
        let disjoint = spans
            .windows(2)
            .all(|w| w[0].0 != w[1].0 || w[0].2 < w[1].1);
        OwnBlocks {
            blocks,
            mine,
            spans,
            disjoint,
            at: 0,
        }
    }

    /// The one block of the node's own holding `address`, if exactly one does; called with
    /// addresses in increasing order.
    fn only(&mut self, address: IpAddr) -> Option<usize> {
        if self.disjoint {
            let (family, a) = addr_num(address);
            let spans = &self.spans;
            while self.at < spans.len() && (spans[self.at].0, spans[self.at].2) < (family, a) {
                self.at += 1;
            }
            spans
                .get(self.at)
                .filter(|&&(f, lo, _, _)| f == family && lo <= a)
                .map(|&(.., i)| i)
        } else {
            let blocks = self.blocks;
            let mut own_iter = (self.mine.iter()).filter(|&&i| blocks[i].cidr.contains(&address));
            match (own_iter.next(), own_iter.next()) {
                (Some(&i), None) => Some(i),
                _ => None,
            }
        }
    }
}

/// Rules 4 and 5 for one block, with [`PoolSet::rebuild`]'s checks.
fn check_pool(
    pools: &PoolSet,
    pool_names: &BTreeSet<&str>,
    b: &BlockClaim,
) -> Option<RepairFinding> {
    Some(match block_issue(pools, &b.pool, &b.cidr)? {
        BlockIssue::UnknownPool => RepairFinding::UnknownPool {
            block: BlockRef::of(b),
            invalid: pool_names.contains(&*b.pool),
        },
        BlockIssue::OutOfRange(issue) => RepairFinding::OutOfRange {
            subject: RangeSubject::Block(BlockRef::of(b)),
            issue,
        },
    })
}

/// Why a block is not one its pool grants (rules 4 and 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockIssue {
    /// No valid pool has the block's pool name (none exists, or it is Invalid).
    UnknownPool,
    OutOfRange(RangeIssue),
}

impl fmt::Display for BlockIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockIssue::UnknownPool => f.write_str("its pool does not exist or is invalid"),
            BlockIssue::OutOfRange(RangeIssue::FamilyNotServed) => {
                f.write_str("its pool has no CIDR of its family")
            }
            BlockIssue::OutOfRange(RangeIssue::WrongBlockSize { expected }) => {
                write!(f, "its pool's block size is /{expected}")
            }
            BlockIssue::OutOfRange(RangeIssue::Misaligned) => f.write_str("it has host bits set"),
            BlockIssue::OutOfRange(RangeIssue::Excluded) => {
                f.write_str("it overlaps an exclusion of its pool")
            }
            BlockIssue::OutOfRange(_) => f.write_str("it lies outside its pool's CIDRs"),
        }
    }
}

/// Whether `cidr` is a block pool `pool` grants: the pool exists and is valid, and holds
/// the CIDR as a block of its block size, not excluded (`None`); else why not. The
/// operator's repair reports such a block and the node side allocates from none
/// (DESIGN.md "Node agent": one rule, here).
pub fn block_issue(pools: &PoolSet, pool: &str, cidr: &IpNet) -> Option<BlockIssue> {
    let Ok(p) = pools.get(pool) else {
        return Some(BlockIssue::UnknownPool);
    };
    let issue = match p.family(family_of(cidr)) {
        None => RangeIssue::FamilyNotServed,
        Some(idx) => match idx.usable_count(cidr) {
            Ok(_) => return None,
            Err(PoolError::WrongBlockSize { expected, .. }) => {
                RangeIssue::WrongBlockSize { expected }
            }
            Err(PoolError::Misaligned { .. }) => RangeIssue::Misaligned,
            Err(PoolError::BlockExcluded { .. }) => RangeIssue::Excluded,
            Err(_) => RangeIssue::OutsidePool,
        },
    };
    Some(BlockIssue::OutOfRange(issue))
}

/// Counts, per leak-like finding, the consecutive passes it was seen in, and proposes fixes.
///
/// Rules:
/// - a leak-like finding (orphan block, leaked entry) is identified by its [`RepairFix`]: the
///   same block (name, CIDR, pool, node, node UID) or the same entry (node, node UID, address,
///   pod UID). A changed pod UID or a block re-created for another node is a new finding;
/// - [`Self::observe`] counts one pass: each leak-like finding of the report gets one more
///   consecutive pass; a finding absent from the report is forgotten (its count resets to
///   zero), so only uninterrupted runs count;
/// - [`Self::fixes`] proposes the fix of every finding seen in at least [`PASSES_BEFORE_FIX`]
///   consecutive passes (the third pass in a row is the first that proposes it; it is proposed
///   again on later passes while the finding persists, e.g. after a failed fix), in the fixes'
///   order;
/// - duplicates, out-of-range and unknown-pool findings are never counted and never fixed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairTracker {
    seen: BTreeMap<RepairFix, u32>,
}

impl RepairTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one repair pass.
    pub fn observe(&mut self, report: &RepairReport) {
        let now: BTreeSet<RepairFix> = report.findings.iter().filter_map(|f| f.fix()).collect();
        let mut next = BTreeMap::new();
        for fix in now {
            let n = self.seen.get(&fix).copied().unwrap_or(0).saturating_add(1);
            next.insert(fix, n);
        }
        self.seen = next;
    }

    /// Consecutive passes this finding has been seen in (0 if it was absent from the last one).
    pub fn passes(&self, finding: &RepairFinding) -> u32 {
        finding
            .fix()
            .and_then(|f| self.seen.get(&f).copied())
            .unwrap_or(0)
    }

    /// The fixes due: findings seen in at least [`PASSES_BEFORE_FIX`] consecutive passes.
    pub fn fixes(&self) -> Vec<RepairFix> {
        self.seen
            .iter()
            .filter(|&(_, &n)| n >= PASSES_BEFORE_FIX)
            .map(|(f, _)| f.clone())
            .collect()
    }

    /// Leak-like findings being counted (seen in the last pass).
    pub fn pending(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    /// A brute force of rules 1–3 and of rule 4 for addresses, written from the module
    /// documentation and sharing no code with [`check`] (only the pool's own block checks,
    /// `check_pool`, rules 4 and 5 for blocks, tested with the pool set): every pair of blocks,
    /// every block for every address, every pair of `used` entries. Quadratic, so only for
    /// the small inputs of the tests.
    fn check_reference<N: std::borrow::Borrow<IpamNode>>(
        pools: &PoolSet,
        blocks: &[BlockClaim],
        ipam_nodes: &[N],
        nodes: &LiveNodes,
    ) -> RepairReport {
        let mut found: BTreeSet<RepairFinding> = BTreeSet::new();
        let live = |node: &str, uid: NodeUid| nodes.is_live(node, uid);
        let pool_names: BTreeSet<&str> = pools.validity().map(|(n, _)| n).collect();
        let overlap = |x: &IpNet, y: &IpNet| x.contains(&y.network()) || y.contains(&x.network());

        for b in blocks {
            // rule 1
            if !live(&b.node, b.node_uid) {
                found.insert(RepairFinding::OrphanBlock {
                    block: BlockRef::of(b),
                    current_uid: nodes.uid(&b.node),
                });
            }
            // rules 4 and 5 for blocks
            if let Some(f) = check_pool(pools, &pool_names, b) {
                found.insert(f);
            }
            // rule 3: overlapping blocks of two live holders, every pair
            for o in blocks {
                let other_holder = (&*o.node, o.node_uid) != (&*b.node, b.node_uid);
                if o < b
                    && other_holder
                    && overlap(&o.cidr, &b.cidr)
                    && live(&o.node, o.node_uid)
                    && live(&b.node, b.node_uid)
                {
                    found.insert(RepairFinding::Duplicate(Conflict::OverlappingBlocks {
                        first: BlockRef::of(o),
                        second: BlockRef::of(b),
                    }));
                }
            }
        }

        let entries: Vec<(IpAddr, UsedRef, bool)> = ipam_nodes
            .iter()
            .map(|n| n.borrow())
            .flat_map(|n| {
                n.node.used.iter().map(move |(a, e)| {
                    let used = UsedRef {
                        node: n.name.clone(),
                        node_uid: n.node_uid,
                        pod_uid: e.pod_uid,
                    };
                    (a, used, live(&n.name, n.node_uid))
                })
            })
            .collect();
        for (address, used, node_live) in &entries {
            let (address, node_live) = (*address, *node_live);
            // rule 2: in no block of its own node
            let own = blocks.iter().any(|b| {
                b.cidr.contains(&address) && (&*b.node, b.node_uid) == (&*used.node, used.node_uid)
            });
            if !own {
                let owner = blocks
                    .iter()
                    .filter(|b| b.cidr.contains(&address))
                    .filter(|b| node_live && live(&b.node, b.node_uid))
                    .min();
                found.insert(match owner {
                    Some(o) => RepairFinding::Duplicate(Conflict::ForeignAddress {
                        address,
                        user: used.clone(),
                        owner: BlockRef::of(o),
                    }),
                    None => RepairFinding::Leaked {
                        address,
                        used: used.clone(),
                        node_live,
                    },
                });
            }
            // rule 4 for addresses: in no valid pool's CIDRs
            let in_a_pool = pools
                .valid()
                .any(|p| p.spec().cidrs.iter().any(|c| c.contains(&address)));
            if !in_a_pool {
                found.insert(RepairFinding::OutOfRange {
                    subject: RangeSubject::Address {
                        address,
                        used: used.clone(),
                    },
                    issue: RangeIssue::OutsideEveryPool,
                });
            }
        }
        // rule 3: the same address in `used` of two holders, every pair
        for (i, x) in entries.iter().enumerate() {
            for y in &entries[i + 1..] {
                let same_holder = (&x.1.node, x.1.node_uid) == (&y.1.node, y.1.node_uid);
                if x.0 != y.0 || same_holder {
                    continue;
                }
                if x.2 && y.2 {
                    let (first, second) = if x.1 <= y.1 { (x, y) } else { (y, x) };
                    found.insert(RepairFinding::Duplicate(Conflict::SameAddress {
                        address: x.0,
                        first: first.1.clone(),
                        second: second.1.clone(),
                    }));
                } else {
                    for z in [x, y].into_iter().filter(|z| !z.2) {
                        found.insert(RepairFinding::Leaked {
                            address: z.0,
                            used: z.1.clone(),
                            node_live: false,
                        });
                    }
                }
            }
        }

        RepairReport {
            findings: found.into_iter().collect(),
        }
    }

    use super::*;
    use crate::pool::PoolSpec;
    use crate::types::{PerFamily, PodName, UsedEntry};
    use proptest::prelude::*;
    use std::time::SystemTime;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn pools() -> PoolSet {
        PoolSet::new(vec![
            PoolSpec::new("a", vec![net("10.0.0.0/24"), net("fd00::/120")])
                .with_exclude(vec![net("10.0.0.64/28")]),
            PoolSpec::new("b", vec![net("10.1.0.0/24")]),
            // overlaps a: Invalid
            PoolSpec::new("bad", vec![net("10.0.0.0/16")]),
        ])
    }

    fn block(pool: &str, cidr: &str, node: &str, uid: u128) -> BlockClaim {
        let cidr = net(cidr);
        BlockClaim {
            name: crate::pool::block_name(&cidr).into(),
            pool: pool.into(),
            cidr,
            node: node.into(),
            node_uid: NodeUid(uid),
        }
    }

    fn ipam_node(name: &str, uid: u128, used: &[(&str, u128)]) -> IpamNode {
        let mut n = IpamNode::new(name.into(), NodeUid(uid));
        for &(a, pod) in used {
            n.node.used.insert(
                ip(a),
                UsedEntry {
                    pod_uid: PodUid(pod),
                    pod: PodName::new("default", &format!("pod-{pod}")),
                    allocation: crate::types::AllocationId(1),
                    since: SystemTime::UNIX_EPOCH.into(),
                },
            );
        }
        n
    }

    fn live(nodes: &[(&str, u128)]) -> LiveNodes {
        nodes
            .iter()
            .map(|&(n, u)| (NodeName::from(n), NodeUid(u)))
            .collect()
    }

    fn used(node: &str, uid: u128, pod: u128) -> UsedRef {
        UsedRef {
            node: node.into(),
            node_uid: NodeUid(uid),
            pod_uid: PodUid(pod),
        }
    }

    fn bref(b: &BlockClaim) -> BlockRef {
        BlockRef::of(b)
    }

    /// Two live holders with overlapping blocks using one address inside both: both the
    /// overlap and the shared address are duplicates (the case where neither entry lies
    /// outside its own blocks).
    #[test]
    fn one_address_used_inside_two_overlapping_blocks() {
        let blocks = [
            block("a", "10.0.0.16/28", "n1", 1),
            block("a", "10.0.0.16/28", "n2", 2),
        ];
        let nodes = [
            ipam_node("n1", 1, &[("10.0.0.17", 10)]),
            ipam_node("n2", 2, &[("10.0.0.17", 20)]),
        ];
        let live = live(&[("n1", 1), ("n2", 2)]);
        let r = check(&pools(), &blocks, &nodes, &live);
        assert!(
            r.findings
                .contains(&RepairFinding::Duplicate(Conflict::SameAddress {
                    address: ip("10.0.0.17"),
                    first: used("n1", 1, 10),
                    second: used("n2", 2, 20),
                })),
            "{r:?}"
        );
        assert_eq!(r, check_reference(&pools(), &blocks, &nodes, &live));
    }

    /// A clean world gives no finding.
    #[test]
    fn clean_world_has_no_findings() {
        let blocks = [
            block("a", "10.0.0.16/28", "n1", 1),
            block("a", "fd00::10/124", "n1", 1),
            block("b", "10.1.0.0/28", "n2", 2),
        ];
        let nodes = [
            ipam_node("n1", 1, &[("10.0.0.17", 10), ("fd00::1f", 11)]),
            ipam_node("n2", 2, &[("10.1.0.1", 20)]),
        ];
        let r = check(&pools(), &blocks, &nodes, &live(&[("n1", 1), ("n2", 2)]));
        assert_eq!(r.findings, vec![]);
        assert!(r.counts().values().all(|&n| n == 0));
        assert_eq!(r.counts().len(), 5);
    }

    #[test]
    fn orphan_block_when_node_is_gone_or_recreated() {
        let blocks = [
            block("a", "10.0.0.16/28", "gone", 1),
            block("a", "10.0.0.32/28", "recreated", 2),
            block("a", "10.0.0.48/28", "ok", 3),
        ];
        let r = check::<IpamNode>(
            &pools(),
            &blocks,
            &[],
            &live(&[("recreated", 22), ("ok", 3)]),
        );
        assert_eq!(
            r.findings,
            vec![
                RepairFinding::OrphanBlock {
                    block: bref(&blocks[0]),
                    current_uid: None
                },
                RepairFinding::OrphanBlock {
                    block: bref(&blocks[1]),
                    current_uid: Some(NodeUid(22))
                },
            ]
        );
        assert!(
            r.findings
                .iter()
                .all(|f| f.kind() == RepairKind::OrphanBlock)
        );
        // the gone node's block is released; the re-created node's is adopted, never released
        assert_eq!(
            r.findings[0].fix(),
            Some(RepairFix::ReleaseBlock(bref(&blocks[0])))
        );
        assert_eq!(r.findings[1].fix(), None);
        assert!(!r.findings[1].is_leak_like());
    }

    #[test]
    fn address_outside_the_nodes_blocks_is_leaked() {
        let blocks = [block("a", "10.0.0.16/28", "n1", 1)];
        // .40 is in pool a but in no block; fd00::5 in no block either
        let nodes = [ipam_node(
            "n1",
            1,
            &[("10.0.0.17", 10), ("10.0.0.40", 11), ("fd00::5", 12)],
        )];
        let r = check(&pools(), &blocks, &nodes, &live(&[("n1", 1)]));
        assert_eq!(
            r.findings,
            vec![
                RepairFinding::Leaked {
                    address: ip("10.0.0.40"),
                    used: used("n1", 1, 11),
                    node_live: true
                },
                RepairFinding::Leaked {
                    address: ip("fd00::5"),
                    used: used("n1", 1, 12),
                    node_live: true
                },
            ]
        );
        assert!(r.findings.iter().all(|f| f.kind() == RepairKind::Leaked));
        assert_eq!(
            r.findings[0].fix(),
            Some(RepairFix::Tombstone {
                address: ip("10.0.0.40"),
                used: used("n1", 1, 11)
            })
        );
        // a block of the same name but an old UID is not the node's block
        let blocks = [block("a", "10.0.0.16/28", "n1", 0)];
        let r = check(
            &pools(),
            &blocks,
            &[ipam_node("n1", 1, &[("10.0.0.17", 10)])],
            &live(&[("n1", 1)]),
        );
        assert_eq!(r.counts()[&RepairKind::Leaked], 1);
        assert_eq!(r.counts()[&RepairKind::OrphanBlock], 1);
    }

    #[test]
    fn address_in_another_live_nodes_block_is_a_duplicate() {
        let blocks = [
            block("a", "10.0.0.16/28", "n1", 1),
            block("a", "10.0.0.32/28", "n2", 2),
        ];
        let nodes = [
            ipam_node("n1", 1, &[("10.0.0.33", 10)]),
            ipam_node("n2", 2, &[]),
        ];
        let r = check(&pools(), &blocks, &nodes, &live(&[("n1", 1), ("n2", 2)]));
        let dup = RepairFinding::Duplicate(Conflict::ForeignAddress {
            address: ip("10.0.0.33"),
            user: used("n1", 1, 10),
            owner: bref(&blocks[1]),
        });
        assert_eq!(r.findings, vec![dup.clone()]);
        assert_eq!(dup.kind(), RepairKind::Duplicate);
        assert_eq!(dup.fix(), None);
        // the block's holder is the authority: the entry is n1's anomaly, n2 goes on
        assert_eq!(
            r.nodes_to_block(),
            ["n1"].into_iter().map(NodeName::from).collect()
        );
        let RepairFinding::Duplicate(c) = &dup else {
            unreachable!()
        };
        assert_eq!(r.blamed(c), vec![&NodeName::from("n1")]);
    }

    #[test]
    fn same_address_on_two_live_nodes_is_a_duplicate_never_fixed() {
        let blocks = [block("a", "10.0.0.16/28", "n1", 1)];
        let nodes = [
            ipam_node("n2", 2, &[("10.0.0.17", 20)]),
            ipam_node("n1", 1, &[("10.0.0.17", 10)]),
        ];
        let world = live(&[("n1", 1), ("n2", 2)]);
        let r = check(&pools(), &blocks, &nodes, &world);
        assert_eq!(
            r.findings,
            vec![
                RepairFinding::Duplicate(Conflict::SameAddress {
                    address: ip("10.0.0.17"),
                    first: used("n1", 1, 10),
                    second: used("n2", 2, 20),
                }),
                RepairFinding::Duplicate(Conflict::ForeignAddress {
                    address: ip("10.0.0.17"),
                    user: used("n2", 2, 20),
                    owner: bref(&blocks[0]),
                }),
            ]
        );
        let mut t = RepairTracker::new();
        for _ in 0..10 {
            t.observe(&r);
            assert_eq!(t.fixes(), vec![]);
            assert_eq!(t.pending(), 0);
        }
        // n1 holds the block: the same address is n2's foreign entry, blamed on n2 alone
        assert_eq!(
            r.nodes_to_block(),
            ["n2"].into_iter().map(NodeName::from).collect()
        );
        let blamed: Vec<Vec<&NodeName>> = (r.findings.iter())
            .map(|f| match f {
                RepairFinding::Duplicate(c) => r.blamed(c),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(blamed, vec![vec![], vec![&NodeName::from("n2")]]);
        // neither holds a block for it: both are blamed
        let r = check(&pools(), &[], &nodes, &world);
        assert_eq!(r.nodes_to_block().len(), 2);
    }

    #[test]
    fn overlapping_blocks_of_two_live_nodes_is_a_duplicate_never_fixed() {
        let blocks = [
            block("a", "10.0.0.16/28", "n2", 2),
            block("a", "10.0.0.16/28", "n1", 1),
            // same holder overlapping itself: not between nodes
            block("b", "10.1.0.0/28", "n3", 3),
            block("b", "10.1.0.0/28", "n3", 3),
        ];
        let r = check::<IpamNode>(
            &pools(),
            &blocks,
            &[],
            &live(&[("n1", 1), ("n2", 2), ("n3", 3)]),
        );
        assert_eq!(
            r.findings,
            vec![RepairFinding::Duplicate(Conflict::OverlappingBlocks {
                first: bref(&blocks[1]),
                second: bref(&blocks[0]),
            })]
        );
        let mut t = RepairTracker::new();
        for _ in 0..5 {
            t.observe(&r);
        }
        assert_eq!(t.fixes(), vec![]);
        // an odd-sized block overlapping another node's block
        let blocks = [
            block("a", "10.0.0.16/28", "n1", 1),
            block("a", "10.0.0.0/26", "n2", 2),
        ];
        let r = check::<IpamNode>(&pools(), &blocks, &[], &live(&[("n1", 1), ("n2", 2)]));
        assert_eq!(r.counts()[&RepairKind::Duplicate], 1);
        assert_eq!(r.counts()[&RepairKind::OutOfRange], 1);
    }

    #[test]
    fn between_a_live_and_a_gone_node_the_gone_ones_claim_is_the_orphan() {
        let blocks = [
            block("a", "10.0.0.16/28", "live", 1),
            block("a", "10.0.0.16/28", "gone", 2),
        ];
        let nodes = [
            ipam_node("live", 1, &[("10.0.0.17", 10)]),
            ipam_node("gone", 2, &[("10.0.0.17", 20)]),
        ];
        let r = check(&pools(), &blocks, &nodes, &live(&[("live", 1)]));
        assert_eq!(
            r.findings,
            vec![
                RepairFinding::OrphanBlock {
                    block: bref(&blocks[1]),
                    current_uid: None
                },
                RepairFinding::Leaked {
                    address: ip("10.0.0.17"),
                    used: used("gone", 2, 20),
                    node_live: false
                },
            ]
        );
        assert!(r.nodes_to_block().is_empty());
        // a live node using an address in a gone node's block: the block is the orphan and the
        // entry, outside the live node's blocks, is leaked
        let blocks = [block("a", "10.0.0.32/28", "gone", 2)];
        let nodes = [ipam_node("live", 1, &[("10.0.0.33", 10)])];
        let r = check(&pools(), &blocks, &nodes, &live(&[("live", 1)]));
        assert_eq!(r.counts()[&RepairKind::OrphanBlock], 1);
        assert_eq!(r.counts()[&RepairKind::Leaked], 1);
        assert_eq!(r.counts()[&RepairKind::Duplicate], 0);
        // both gone: both claims are orphans
        let blocks = [
            block("a", "10.0.0.16/28", "g1", 1),
            block("a", "10.0.0.16/28", "g2", 2),
        ];
        let nodes = [
            ipam_node("g1", 1, &[("10.0.0.17", 10)]),
            ipam_node("g2", 2, &[("10.0.0.17", 20)]),
        ];
        let r = check(&pools(), &blocks, &nodes, &live(&[]));
        assert_eq!(r.counts()[&RepairKind::OrphanBlock], 2);
        assert_eq!(r.counts()[&RepairKind::Leaked], 2);
        assert_eq!(r.counts()[&RepairKind::Duplicate], 0);
    }

    #[test]
    fn out_of_range_blocks_and_addresses() {
        let blocks = [
            block("a", "10.0.2.0/28", "n1", 1),  // outside a
            block("a", "10.0.0.64/28", "n1", 1), // excluded
            block("a", "10.0.0.0/27", "n1", 1),  // wrong size
            block("b", "fd00::/124", "n1", 1),   // b serves no IPv6
            BlockClaim {
                cidr: net("10.0.0.129/28"), // host bits
                ..block("a", "10.0.0.128/28", "n1", 1)
            },
        ];
        let nodes = [ipam_node("n1", 1, &[("10.0.2.1", 10), ("192.168.0.1", 11)])];
        let r = check(&pools(), &blocks, &nodes, &live(&[("n1", 1)]));
        let issues: Vec<(&str, RangeIssue)> = r
            .findings
            .iter()
            .filter_map(|f| match f {
                RepairFinding::OutOfRange {
                    subject: RangeSubject::Block(b),
                    issue,
                } => Some((b.name.as_str(), *issue)),
                _ => None,
            })
            .collect();
        assert_eq!(
            issues,
            vec![
                (
                    "v4-10-0-0-0-27",
                    RangeIssue::WrongBlockSize { expected: 28 }
                ),
                ("v4-10-0-0-128-28", RangeIssue::Misaligned),
                ("v4-10-0-0-64-28", RangeIssue::Excluded),
                ("v4-10-0-2-0-28", RangeIssue::OutsidePool),
                (
                    "v6-fd00-0000-0000-0000-0000-0000-0000-0000-124",
                    RangeIssue::FamilyNotServed
                ),
            ]
        );
        // 10.0.2.1 is in n1's (out-of-range) block, so not leaked, but outside every pool;
        // 192.168.0.1 is both
        let addr: Vec<&RepairFinding> = r
            .findings
            .iter()
            .filter(|f| {
                matches!(
                    f,
                    RepairFinding::OutOfRange {
                        subject: RangeSubject::Address { .. },
                        ..
                    }
                )
            })
            .collect();
        assert_eq!(addr.len(), 2);
        assert_eq!(r.counts()[&RepairKind::OutOfRange], 7);
        assert_eq!(r.counts()[&RepairKind::Leaked], 1);
        assert!(r.of_kind(RepairKind::OutOfRange).all(|f| f.fix().is_none()));
    }

    #[test]
    fn unknown_pool_blocks_missing_or_invalid() {
        let blocks = [
            block("nope", "10.0.0.16/28", "n1", 1),
            block("bad", "10.0.1.0/28", "n1", 1),
        ];
        let r = check::<IpamNode>(&pools(), &blocks, &[], &live(&[("n1", 1)]));
        assert_eq!(
            r.findings,
            vec![
                RepairFinding::UnknownPool {
                    block: bref(&blocks[0]),
                    invalid: false
                },
                RepairFinding::UnknownPool {
                    block: bref(&blocks[1]),
                    invalid: true
                },
            ]
        );
        assert!(
            r.findings
                .iter()
                .all(|f| f.kind() == RepairKind::UnknownPool)
        );
        assert!(r.findings.iter().all(|f| f.fix().is_none()));
    }

    /// Rebuild's UnknownPool / OutOfRange / Excluded / WrongBlockSize / Misaligned findings show
    /// up here as unknown-pool / out-of-range findings of the same block.
    #[test]
    fn rebuild_findings_carry_over() {
        let blocks = [
            block("a", "10.0.0.16/28", "n1", 1),
            block("zz", "10.0.0.32/28", "n1", 1),
            block("a", "10.0.2.0/28", "n1", 1),
            block("a", "10.0.0.64/28", "n1", 1),
            block("a", "fd00::/124", "n1", 1),
            block("b", "fd00::10/124", "n1", 1),
        ];
        let mut set = pools();
        let rebuilt = set.rebuild(blocks.iter().map(BlockClaim::record));
        let r = check::<IpamNode>(&set, &blocks, &[], &live(&[("n1", 1)]));
        let mine: BTreeSet<(&str, &str)> = r
            .findings
            .iter()
            .filter_map(|f| match f {
                RepairFinding::UnknownPool { block, .. } => {
                    Some((block.name.as_str(), f.kind().as_str()))
                }
                RepairFinding::OutOfRange {
                    subject: RangeSubject::Block(block),
                    ..
                } => Some((block.name.as_str(), f.kind().as_str())),
                _ => None,
            })
            .collect();
        let theirs: BTreeSet<(&str, &str)> = rebuilt
            .findings
            .iter()
            .filter_map(|f| match f.kind.as_str() {
                "unknown-pool" => Some((f.key, "unknown-pool")),
                "out-of-range" | "excluded" | "wrong-block-size" | "misaligned" => {
                    Some((f.key, "out-of-range"))
                }
                _ => None,
            })
            .collect();
        assert_eq!(mine, theirs);
        assert_eq!(mine.len(), 4);
    }

    fn orphan_world(present: bool) -> RepairReport {
        let blocks = if present {
            vec![block("a", "10.0.0.16/28", "gone", 9)]
        } else {
            vec![]
        };
        let nodes = [ipam_node("n1", 1, &[("10.0.0.200", 10)])];
        check(&pools(), &blocks, &nodes, &live(&[("n1", 1)]))
    }

    #[test]
    fn fixes_only_on_the_third_consecutive_pass() {
        let mut t = RepairTracker::new();
        let r = orphan_world(true);
        assert_eq!(r.counts()[&RepairKind::OrphanBlock], 1);
        assert_eq!(r.counts()[&RepairKind::Leaked], 1);
        t.observe(&r);
        assert_eq!(t.fixes(), vec![]);
        t.observe(&r);
        assert_eq!(t.fixes(), vec![]);
        assert_eq!(t.passes(&r.findings[0]), 2);
        t.observe(&r);
        let fixes = t.fixes();
        assert_eq!(
            fixes,
            vec![
                RepairFix::ReleaseBlock(bref(&block("a", "10.0.0.16/28", "gone", 9))),
                RepairFix::Tombstone {
                    address: ip("10.0.0.200"),
                    used: used("n1", 1, 10)
                },
            ]
        );
        // still proposed while it persists (a failed fix), gone once fixed
        t.observe(&r);
        assert_eq!(t.fixes(), fixes);
        t.observe(&check::<IpamNode>(&pools(), &[], &[], &live(&[("n1", 1)])));
        assert_eq!(t.fixes(), vec![]);
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn a_finding_that_disappears_starts_over() {
        let mut t = RepairTracker::new();
        let block_fix = RepairFix::ReleaseBlock(bref(&block("a", "10.0.0.16/28", "gone", 9)));
        t.observe(&orphan_world(true));
        t.observe(&orphan_world(true));
        t.observe(&orphan_world(false)); // the orphan block vanished; the leak persists
        assert_eq!(t.fixes().len(), 1, "only the leak has three passes");
        assert!(!t.fixes().contains(&block_fix));
        t.observe(&orphan_world(true));
        t.observe(&orphan_world(true));
        assert!(!t.fixes().contains(&block_fix));
        t.observe(&orphan_world(true));
        assert!(t.fixes().contains(&block_fix));
    }

    #[test]
    fn a_changed_identity_is_a_new_finding() {
        let nodes = |pod| [ipam_node("n1", 1, &[("10.0.0.200", pod)])];
        let world = live(&[("n1", 1)]);
        let mut t = RepairTracker::new();
        t.observe(&check::<IpamNode>(&pools(), &[], &nodes(10), &world));
        t.observe(&check::<IpamNode>(&pools(), &[], &nodes(10), &world));
        // another pod took the address: its count starts at one
        t.observe(&check::<IpamNode>(&pools(), &[], &nodes(11), &world));
        assert_eq!(t.fixes(), vec![]);
        t.observe(&check::<IpamNode>(&pools(), &[], &nodes(11), &world));
        t.observe(&check::<IpamNode>(&pools(), &[], &nodes(11), &world));
        assert_eq!(
            t.fixes(),
            vec![RepairFix::Tombstone {
                address: ip("10.0.0.200"),
                used: used("n1", 1, 11)
            }]
        );
    }

    #[test]
    fn kinds_are_the_metric_labels() {
        let all: BTreeSet<&str> = tidepool_metrics::repair_kind::ALL.iter().copied().collect();
        let r = RepairReport::default();
        let kinds = r
            .counts()
            .keys()
            .map(|k| k.as_str())
            .collect::<BTreeSet<_>>();
        assert_eq!(kinds, all);
    }

    // ------------------------------------------------------------ properties

    /// A small random world: blocks in pools a/b/bad/nope (some odd), nodes n0..n3 with UIDs
    /// 0..2, used addresses near the blocks, Nodes n0..n3 with random UIDs or absent.
    fn arb_world() -> impl Strategy<Value = (Vec<BlockClaim>, Vec<IpamNode>, LiveNodes)> {
        arb_world_in(256)
    }

    /// Worlds whose `used` addresses are drawn from the first `addrs` candidates (few: many
    /// addresses used by several nodes).
    fn arb_world_in(
        addrs: u32,
    ) -> impl Strategy<Value = (Vec<BlockClaim>, Vec<IpamNode>, LiveNodes)> {
        let blocks = proptest::collection::vec(
            (
                0usize..4,
                0u32..16,
                26u8..=29,
                any::<bool>(),
                0u8..4,
                0u128..2,
            ),
            0..12,
        );
        let used = proptest::collection::vec((0u8..4, 0u128..2, 0..addrs, 0u128..4), 0..16);
        let nodes = proptest::collection::vec(proptest::option::weighted(0.9, 0u128..2), 4);
        (blocks, used, nodes).prop_map(|(blocks, used, nodes)| {
            let blocks = blocks
                .into_iter()
                .map(|(p, k, len, v6, n, uid)| {
                    let pool = ["a", "b", "bad", "nope"][p];
                    let cidr = if v6 {
                        crate::pool::make_net(
                            Family::V6,
                            (0xfd00u128 << 112) | (k as u128 * 16),
                            len + 96,
                        )
                    } else {
                        crate::pool::make_net(Family::V4, (10u128 << 24) | ((k as u128) << 6), len)
                    };
                    BlockClaim {
                        name: crate::pool::block_name(&cidr).into(),
                        pool: pool.into(),
                        cidr,
                        node: format!("n{n}").into(),
                        node_uid: NodeUid(uid),
                    }
                })
                .collect();
            let mut ipam: BTreeMap<(u8, u128), IpamNode> = BTreeMap::new();
            for (n, uid, a, pod) in used {
                let node = ipam
                    .entry((n, uid))
                    .or_insert_with(|| IpamNode::new(format!("n{n}").into(), NodeUid(uid)));
                let addr = if a % 2 == 0 {
                    IpAddr::from(std::net::Ipv4Addr::from((10u32 << 24) | (a * 4)))
                } else {
                    IpAddr::from(std::net::Ipv6Addr::from((0xfd00u128 << 112) | a as u128))
                };
                node.node.used.insert(
                    addr,
                    UsedEntry {
                        pod_uid: PodUid(pod),
                        pod: PodName::new("ns", "p"),
                        allocation: crate::types::AllocationId(0),
                        since: SystemTime::UNIX_EPOCH.into(),
                    },
                );
            }
            let live = nodes
                .into_iter()
                .enumerate()
                .filter_map(|(i, u)| u.map(|u| (NodeName::from(format!("n{i}")), NodeUid(u))))
                .collect();
            (blocks, ipam.into_values().collect(), live)
        })
    }

    fn prop_pools() -> PoolSet {
        PoolSet::new(vec![
            PoolSpec::new("a", vec![net("10.0.0.0/22"), net("fd00::/118")])
                .with_exclude(vec![net("10.0.1.0/28")]),
            PoolSpec::new("b", vec![net("10.0.8.0/24")])
                .with_block_size(PerFamily { v4: 27, v6: 124 }),
            PoolSpec::new("bad", vec![net("10.0.0.0/16")]),
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The faster check gives exactly the reports of the straightforward one, also when
        /// many addresses are used by several nodes.
        #[test]
        fn check_matches_the_reference(
            (blocks, ipam, nodes) in prop_oneof![arb_world(), arb_world_in(24)],
        ) {
            let pools = prop_pools();
            prop_assert_eq!(
                check(&pools, &blocks, &ipam, &nodes),
                check_reference(&pools, &blocks, &ipam, &nodes)
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The same inputs in any order give the same report, which is sorted and
        /// deduplicated; duplicates name two live holders; leak-like findings are exactly the
        /// orphan blocks of names no Node has and the leaked entries.
        #[test]
        fn same_inputs_in_any_order_give_the_same_report(
            (blocks, ipam, nodes) in arb_world(),
            seed in any::<u64>(),
        ) {
            let pools = prop_pools();
            let r = check(&pools, &blocks, &ipam, &nodes);
            let mut rng = seed;
            let mut shuffled_blocks = blocks.clone();
            let mut shuffled_ipam = ipam.clone();
            // Fisher–Yates with a tiny LCG: no dependency on rand's feature set
            let mut next = |n: usize| {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (rng >> 33) as usize % n
            };
            for i in (1..shuffled_blocks.len()).rev() {
                shuffled_blocks.swap(i, next(i + 1));
            }
            for i in (1..shuffled_ipam.len()).rev() {
                shuffled_ipam.swap(i, next(i + 1));
            }
            shuffled_blocks.reverse();
            let r2 = check(&pools, &shuffled_blocks, &shuffled_ipam, &nodes);
            prop_assert_eq!(&r, &r2);
            prop_assert!(r.findings.windows(2).all(|w| w[0] < w[1]));
            for f in &r.findings {
                match f {
                    RepairFinding::Duplicate(c) => {
                        let holders = match c {
                            Conflict::SameAddress { first, second, .. } => {
                                [(&first.node, first.node_uid), (&second.node, second.node_uid)]
                            }
                            Conflict::ForeignAddress { user, owner, .. } => {
                                [(&user.node, user.node_uid), (&owner.node, owner.node_uid)]
                            }
                            Conflict::OverlappingBlocks { first, second } => {
                                [(&first.node, first.node_uid), (&second.node, second.node_uid)]
                            }
                        };
                        prop_assert!(holders[0] != holders[1]);
                        prop_assert!(holders.iter().all(|(n, u)| nodes.is_live(n, *u)));
                        prop_assert!(f.fix().is_none());
                    }
                    RepairFinding::OrphanBlock { block, current_uid } => {
                        prop_assert!(!nodes.is_live(&block.node, block.node_uid));
                        // released only when no Node has the name; else adopted
                        prop_assert_eq!(f.fix().is_some(), current_uid.is_none());
                    }
                    RepairFinding::Leaked { .. } => prop_assert!(f.fix().is_some()),
                    _ => prop_assert!(f.fix().is_none()),
                }
            }
            // every block of a gone holder is an orphan
            for b in &blocks {
                let orphan = r.findings.contains(&RepairFinding::OrphanBlock {
                    block: BlockRef::of(b),
                    current_uid: nodes.uid(&b.node),
                });
                prop_assert_eq!(orphan, !nodes.is_live(&b.node, b.node_uid));
            }
        }

        /// Over any sequence of worlds, a fix is proposed exactly when its finding was in the
        /// last three reports, and never for a duplicate.
        #[test]
        fn fixes_need_three_consecutive_passes(
            worlds in proptest::collection::vec(arb_world(), 1..6),
            picks in proptest::collection::vec(0usize..6, 1..12),
        ) {
            let pools = prop_pools();
            let reports: Vec<RepairReport> = worlds
                .iter()
                .map(|(b, i, n)| check(&pools, b, i, n))
                .collect();
            let mut t = RepairTracker::new();
            let mut history: Vec<&RepairReport> = Vec::new();
            for p in picks {
                let r = &reports[p % reports.len()];
                t.observe(r);
                history.push(r);
                let expected: BTreeSet<RepairFix> = r
                    .findings
                    .iter()
                    .filter_map(RepairFinding::fix)
                    .filter(|fix| {
                        history.len() >= 3
                            && history[history.len() - 3..].iter().all(|h| {
                                h.findings.iter().any(|f| f.fix().as_ref() == Some(fix))
                            })
                    })
                    .collect();
                let got = t.fixes();
                prop_assert!(got.windows(2).all(|w| w[0] < w[1]));
                prop_assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), expected);
            }
        }

        /// Arbitrary blocks (any family, prefix, host bits) and addresses never panic.
        #[test]
        fn arbitrary_inputs_never_panic(
            blocks in proptest::collection::vec(
                (any::<u128>(), 0u8..=128, any::<bool>(), 0usize..4, 0u8..3, 0u128..3), 0..16),
            used in proptest::collection::vec((any::<u128>(), any::<bool>(), 0u8..3, 0u128..3, any::<u128>()), 0..16),
            nodes in proptest::collection::vec(proptest::option::of(0u128..3), 3),
        ) {
            let blocks: Vec<BlockClaim> = blocks
                .into_iter()
                .map(|(a, len, v6, p, n, uid)| {
                    let cidr = if v6 {
                        IpNet::V6(ipnet::Ipv6Net::new_assert(std::net::Ipv6Addr::from(a), len))
                    } else {
                        IpNet::V4(ipnet::Ipv4Net::new_assert(std::net::Ipv4Addr::from(a as u32), len.min(32)))
                    };
                    BlockClaim {
                        name: format!("x{a}").into(),
                        pool: ["a", "b", "bad", ""][p].into(),
                        cidr,
                        node: format!("n{n}").into(),
                        node_uid: NodeUid(uid),
                    }
                })
                .collect();
            let mut ipam: BTreeMap<(u8, u128), IpamNode> = BTreeMap::new();
            for (a, v6, n, uid, pod) in used {
                let addr = if v6 {
                    IpAddr::from(std::net::Ipv6Addr::from(a))
                } else {
                    IpAddr::from(std::net::Ipv4Addr::from(a as u32))
                };
                ipam.entry((n, uid))
                    .or_insert_with(|| IpamNode::new(format!("n{n}").into(), NodeUid(uid)))
                    .node
                    .used
                    .insert(addr, UsedEntry {
                        pod_uid: PodUid(pod),
                        pod: PodName::new("", ""),
                        allocation: crate::types::AllocationId(0),
                        since: SystemTime::UNIX_EPOCH.into(),
                    });
            }
            let live: LiveNodes = nodes
                .into_iter()
                .enumerate()
                .filter_map(|(i, u)| u.map(|u| (NodeName::from(format!("n{i}")), NodeUid(u))))
                .collect();
            let ipam: Vec<IpamNode> = ipam.into_values().collect();
            let mut set = prop_pools();
            let _ = set.rebuild(blocks.iter().map(BlockClaim::record));
            let r = check(&set, &blocks, &ipam, &live);
            let total: usize = r.counts().values().sum();
            prop_assert_eq!(total, r.findings.len());
            let mut t = RepairTracker::new();
            for _ in 0..3 {
                t.observe(&r);
            }
            let leak_like = r.findings.iter().filter(|f| f.is_leak_like()).count();
            prop_assert_eq!(t.fixes().len(), leak_like);
        }
    }
}
