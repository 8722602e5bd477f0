//! `tidepool-operator check`: a read-only report of the cluster's IPAM state, in the spirit
//! of `calicoctl ipam check`. Pure: [`Inputs`] takes the typed objects (IPPools, IPAMBlocks,
//! IPAMNodes, Nodes, Pods) and [`check`] judges them with the engine's own rules; [`io`]
//! lists them from a server (reads only), [`table`] and [`Report::to_json`] render the result.
//!
//! What it reports, and where each rule comes from:
//! - **reclaim candidates**: `status.used` entries whose pod (by UID) no longer exists, is
//!   terminal, or was replaced by a later sandbox — the engine's own
//!   [`candidate_reason`](tidepool_ipam::candidate_reason). Informational: the operator
//!   reclaims them itself after its grace; they never make the check fail;
//! - **problems**, each needing a person (the check then exits 1):
//!   - `duplicate`, `leaked`, `orphan-block`, `out-of-range`, `unknown-pool`: the findings of
//!     the engine's repair ([`repair::check`](tidepool_ipam::pool::repair::check)) over the
//!     pools after [`PoolSet::rebuild`] from every block, the blocks, the IPAMNodes and the
//!     Nodes. An address a node's `spec.addresses` holds (cloud sources) is that node's too:
//!     it is neither leaked nor out of range for it. Rebuild's findings repair does not
//!     cover are added: overlapping blocks of one node (`duplicate`) and a block whose name
//!     is not its CIDR's canonical name (`malformed`: the name is the claim's lock);
//!   - `no-pool`, `outside-pool`: a `status.used` entry in its node's block of a pool that
//!     does not exist or is invalid, or of another pool than the one the entry names (the
//!     pod's, fixed at its ADD) ([`entry_pools`]);
//!   - `node-uid`: an IPAMNode whose `spec.nodeUID` is not its existing Node's UID (someone
//!     else changed it; the node side then drops every block);
//!   - `invalid-pool`: an IPPool the engine will not use (overlapping an older pool, a bad
//!     block size, blocks of another size: [`PoolSet`]'s validity);
//!   - `malformed`: what the operator cannot read and skips ([`crate::convert`]'s reports, an
//!     IPPool whose spec cannot be read, a Node whose UID is not one). An IPAMNode whose
//!     `spec.nodeUID` cannot be read is reported and left out of the repair rules (the
//!     engine would see it as a gone node and call all its entries leaked);
//! - **per-pool usage**: capacity, allocated and free addresses (and blocks) per pool and
//!   family, from the rebuilt index, and the `status.used` entries each pool holds.
//!
//! The objects are listed one resource after another, not at one instant: a change between
//! two lists (a pod created and recorded in between, a block granted) can show as a finding
//! that is gone on the next run. The lists come in the order that keeps such false findings
//! rare: IPPools, IPAMNodes, IPAMBlocks, Nodes, Pods.

mod entry_pools;
mod findings;
pub mod io;
mod reclaim;
mod report;
mod table;
mod usage;

#[cfg(test)]
mod tests;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::Event;
use tidepool_api as api;
use tidepool_ipam::pool::PoolSet;
use tidepool_ipam::pool::repair::{self, BlockClaim, LiveNodes};
use tidepool_ipam::{IpamBlock, NodeName, NodeUid};

use crate::convert::{Malformed, NodeView, block_from_api, node_from_api};
use crate::index::{PodGetter, PodIndex, parse_uid};
use crate::runtime::Pools;

pub use report::{
    Counts, PoolState, PoolUsage, Problem, ProblemKind, ReclaimCandidate, Report, Summary,
};
pub use table::table;

/// An IPAMNode as the check keeps it.
struct IpamNodeIn {
    view: NodeView,
    /// `spec.nodeUID` could be read.
    uid_ok: bool,
}

/// The objects a check judges, taken one at a time (each Pod is cut down to the engine's
/// projection as it is taken, so the index never holds whole Pods).
pub struct Inputs {
    pools: Vec<api::IPPool>,
    blocks: Vec<IpamBlock>,
    /// Blocks seen, readable or not.
    block_objects: usize,
    ipam_nodes: Vec<IpamNodeIn>,
    nodes: LiveNodes,
    node_objects: usize,
    pods: PodIndex,
    pod_objects: usize,
    malformed: Vec<Malformed>,
}

/// The pod index's live lookup, which a check never makes (it reads the listed pods only).
struct NoLiveLookups;

impl PodGetter for NoLiveLookups {
    fn get(&self, _: &str, _: &str) -> BoxFuture<'static, Result<Option<Pod>, kube::Error>> {
        Box::pin(async { Ok(None) })
    }
}

impl Default for Inputs {
    fn default() -> Self {
        Self::new()
    }
}

impl Inputs {
    pub fn new() -> Self {
        Self {
            pools: Vec::new(),
            blocks: Vec::new(),
            block_objects: 0,
            ipam_nodes: Vec::new(),
            nodes: LiveNodes::new(),
            node_objects: 0,
            pods: PodIndex::new(NoLiveLookups),
            pod_objects: 0,
            malformed: Vec::new(),
        }
    }

    /// From whole lists (tests, small clusters).
    pub fn from_objects(
        pools: impl IntoIterator<Item = api::IPPool>,
        blocks: impl IntoIterator<Item = api::IPAMBlock>,
        ipam_nodes: impl IntoIterator<Item = api::IPAMNode>,
        nodes: impl IntoIterator<Item = Node>,
        pods: impl IntoIterator<Item = Pod>,
    ) -> Self {
        let mut i = Self::new();
        pools.into_iter().for_each(|p| i.add_pool(p));
        blocks.into_iter().for_each(|b| i.add_block(&b));
        ipam_nodes.into_iter().for_each(|n| i.add_ipam_node(&n));
        nodes.into_iter().for_each(|n| i.add_node(&n));
        pods.into_iter().for_each(|p| i.add_pod(p));
        i
    }

    pub fn add_pool(&mut self, pool: api::IPPool) {
        self.pools.push(pool);
    }

    /// A block the operator cannot read (its CIDR or node UID) is reported as malformed.
    pub fn add_block(&mut self, block: &api::IPAMBlock) {
        self.block_objects += 1;
        match block_from_api(block) {
            Ok(b) => self.blocks.push(b),
            Err(bad) => self.malformed.extend(bad),
        }
    }

    /// Entries the operator cannot read are reported as malformed and skipped.
    pub fn add_ipam_node(&mut self, node: &api::IPAMNode) {
        let (view, bad) = node_from_api(node);
        self.malformed.extend(bad);
        let uid_ok = parse_uid(&node.spec.node_uid).is_some();
        self.ipam_nodes.push(IpamNodeIn { view, uid_ok });
    }

    /// A Node whose UID is not a UUID is reported as malformed (the operator skips it too).
    pub fn add_node(&mut self, node: &Node) {
        self.node_objects += 1;
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let raw = node.metadata.uid.as_deref().unwrap_or_default();
        match parse_uid(raw) {
            Some(uid) => self.nodes.insert(NodeName::from(name), NodeUid(uid)),
            None => self.malformed.push(Malformed {
                object: format!("node/{name}"),
                field: "metadata.uid".into(),
                reason: format!("{raw:?} is not a UID"),
            }),
        }
    }

    /// Kept as the operator's pod index keeps it (UID, node, phase, podIPs).
    pub fn add_pod(&mut self, pod: Pod) {
        self.pod_objects += 1;
        self.pods.apply(&Event::Apply(pod));
    }
}

/// Judges the objects (see the module documentation). Deterministic: the same objects in
/// any order give the same report.
pub fn check(inputs: &Inputs) -> Report {
    let mut problems = Vec::new();

    // IPPools in creation order, as the operator takes them
    let mut pools = Pools::default();
    pools.apply(&Event::Init);
    for p in &inputs.pools {
        pools.apply(&Event::InitApply(p.clone()));
    }
    pools.apply(&Event::InitDone);
    let (configs, unreadable) = pools.configs();
    for (name, why) in unreadable {
        problems.push(Problem {
            kind: ProblemKind::Malformed,
            objects: vec![format!("ippool/{name}")],
            address: None,
            cidr: None,
            pool: Some(name),
            detail: format!("spec: {why}"),
        });
    }

    // the index rebuilt from every block, by name (as the operator does)
    let mut claims: Vec<BlockClaim> = inputs
        .blocks
        .iter()
        .map(|b| BlockClaim {
            name: b.name.clone(),
            pool: b.pool.clone(),
            cidr: b.cidr,
            node: b.node.clone(),
            node_uid: b.node_uid,
        })
        .collect();
    claims.sort();
    let mut set = PoolSet::new(configs.iter().map(|c| c.spec.clone()).collect());
    let rebuilt = set.rebuild(claims.iter().map(BlockClaim::record));
    for (name, validity) in set.validity() {
        if let Err(e) = validity {
            problems.push(Problem {
                kind: ProblemKind::InvalidPool,
                objects: vec![format!("ippool/{name}")],
                address: None,
                cidr: None,
                pool: Some(name.to_string()),
                detail: e.to_string(),
            });
        }
    }
    findings::from_rebuild(&rebuilt, &claims, &mut problems);

    // the engine's repair rules
    let readable: Vec<&tidepool_ipam::IpamNode> = inputs
        .ipam_nodes
        .iter()
        .filter(|n| n.uid_ok)
        .map(|n| &*n.view.node)
        .collect();
    let repaired = repair::check(&set, &claims, &readable, &inputs.nodes);
    let by_holder: findings::Holders<'_> = readable
        .iter()
        .map(|n| ((&*n.name, n.node_uid), *n))
        .collect();
    findings::from_repair(&repaired, &by_holder, &mut problems);
    findings::node_uids(&readable, &inputs.nodes, &mut problems);
    let named: Vec<entry_pools::NamedPools<'_>> = (inputs.ipam_nodes.iter())
        .filter(|n| n.uid_ok)
        .map(|n| (&*n.view.node, &n.view.used_pools))
        .collect();
    entry_pools::check(&set, &claims, &named, &mut problems);

    for m in &inputs.malformed {
        problems.push(Problem {
            kind: ProblemKind::Malformed,
            objects: vec![m.object.clone()],
            address: None,
            cidr: None,
            pool: None,
            detail: format!("{}: {}", m.field, m.reason),
        });
    }
    problems.sort();
    problems.dedup();

    let views: Vec<&tidepool_ipam::IpamNode> =
        inputs.ipam_nodes.iter().map(|n| &*n.view.node).collect();
    let reclaim_candidates = reclaim::candidates(&views, &inputs.pods);
    let pools = usage::usage(&configs, &set, &views, &inputs.pools);
    let summary = Summary::new(
        [
            inputs.pools.len(),
            inputs.block_objects,
            inputs.ipam_nodes.len(),
            inputs.node_objects,
            inputs.pod_objects,
        ],
        views.iter().map(|n| n.node.used.len()).sum(),
        reclaim_candidates.len(),
        &problems,
    );
    Report {
        summary,
        pools,
        reclaim_candidates,
        problems,
    }
}
