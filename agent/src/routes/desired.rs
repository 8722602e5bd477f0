//! The pure part of `--node-routes`: which routes this node should have (one per other
//! node's block, via that node's InternalIP of the block's family), and what to add and
//! delete to get there from the owned routes present. No I/O; [`super::netlink`] lists and
//! changes the kernel's routes, [`super::manager`] drives both.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use tidepool_ipam::NodeUid;

/// One route `dst via gateway` in the main table, marked with [`super::PROTOCOL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route {
    pub dst: IpNet,
    pub via: IpAddr,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} via {}", self.dst, self.via)
    }
}

/// A block as the routes read it: its CIDR and the node it names (`spec.node`,
/// `spec.nodeUID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockOwner {
    pub cidr: IpNet,
    pub node: String,
    pub node_uid: NodeUid,
}

/// A Node as the routes read it: its UID and its InternalIPs (`status.addresses`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddrs {
    pub name: String,
    /// `None` when the Node's UID is not a UUID (then none of its blocks is routed).
    pub uid: Option<NodeUid>,
    pub internal: Vec<IpAddr>,
}

/// Why a block of another node gets no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// No Node of that name (deleted, or not yet seen).
    NoNode { block: IpNet, node: String },
    /// The Node of that name has another UID: the block is an earlier Node's (stale).
    Stale { block: IpNet, node: String },
    /// The Node has no InternalIP of the block's family.
    NoAddress { block: IpNet, node: String },
    /// Two nodes' blocks with the same CIDR: the first node by name keeps the route.
    Duplicate { block: IpNet, node: String },
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skipped::NoNode { block, node } => write!(f, "block {block}: no Node {node}"),
            Skipped::Stale { block, node } => {
                write!(f, "block {block}: its nodeUID is not Node {node}'s")
            }
            Skipped::NoAddress { block, node } => write!(
                f,
                "block {block}: Node {node} has no InternalIP of the block's family"
            ),
            Skipped::Duplicate { block, node } => {
                write!(
                    f,
                    "block {block} of {node}: another node's block has its CIDR"
                )
            }
        }
    }
}

/// The routes this node (`own`) should have, and the blocks that get none (and why).
///
/// Every block of another node whose `nodeUID` is that Node's current UID gets a route to
/// its CIDR via the Node's first InternalIP of the block's family. The node's own blocks get
/// none (its pods are on its own links). One route per destination: a CIDR two nodes' blocks
/// claim (the operator never does that) is routed to the first node by name.
pub fn desired<'a>(
    blocks: impl IntoIterator<Item = &'a BlockOwner>,
    nodes: impl IntoIterator<Item = &'a NodeAddrs>,
    own: &str,
) -> (BTreeMap<IpNet, IpAddr>, Vec<Skipped>) {
    let nodes: BTreeMap<&str, &NodeAddrs> = nodes.into_iter().map(|n| (&*n.name, n)).collect();
    let mut blocks: Vec<&BlockOwner> = blocks.into_iter().filter(|b| b.node != own).collect();
    blocks.sort_by(|a, b| (&a.node, a.cidr).cmp(&(&b.node, b.cidr)));
    let mut routes = BTreeMap::new();
    let mut skipped = Vec::new();
    for b in blocks {
        match gateway(b, nodes.get(&*b.node).copied()) {
            Ok(via) => match routes.entry(b.cidr) {
                Entry::Vacant(e) => {
                    e.insert(via);
                }
                Entry::Occupied(_) => skipped.push(Skipped::Duplicate {
                    block: b.cidr,
                    node: b.node.clone(),
                }),
            },
            Err(why) => skipped.push(why),
        }
    }
    (routes, skipped)
}

/// The gateway of one other node's block: its Node's InternalIP of the block's family.
fn gateway(b: &BlockOwner, node: Option<&NodeAddrs>) -> Result<IpAddr, Skipped> {
    let (block, name) = (b.cidr, b.node.clone());
    let Some(node) = node else {
        return Err(Skipped::NoNode { block, node: name });
    };
    if node.uid != Some(b.node_uid) {
        return Err(Skipped::Stale { block, node: name });
    }
    node.internal
        .iter()
        .copied()
        .find(|a| a.is_ipv4() == b.cidr.addr().is_ipv4())
        .ok_or(Skipped::NoAddress { block, node: name })
}

/// What to change so that the owned routes are the desired ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Owned routes present that should not be (a gone block, a changed InternalIP, a
    /// second owned route to one destination). Deleted first: a route with a new gateway
    /// can be added only once the old one is gone.
    pub delete: Vec<Route>,
    /// Desired routes not present.
    pub add: Vec<Route>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.add.is_empty()
    }
}

/// The changes from `present` (the owned routes the kernel lists: only those with
/// [`super::PROTOCOL`], so nothing else can be in a delete) to `desired`.
pub fn diff(desired: &BTreeMap<IpNet, IpAddr>, present: &[Route]) -> Diff {
    let mut kept = BTreeSet::new();
    let mut delete = Vec::new();
    for r in present {
        if desired.get(&r.dst) == Some(&r.via) && kept.insert(*r) {
            continue;
        }
        delete.push(*r);
    }
    let add = desired
        .iter()
        .map(|(&dst, &via)| Route { dst, via })
        .filter(|r| !kept.contains(r))
        .collect();
    Diff { delete, add }
}

#[cfg(test)]
#[path = "desired_tests.rs"]
mod tests;
