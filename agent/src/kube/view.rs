//! The node as the agent's watch last saw it: its IPAMNode and its blocks (only those
//! carrying its nodeUID), projected the way `ipam`'s node rules read a node. Pure state,
//! fed by watch events; [`super::NodeWatch`] drives it.

use std::collections::BTreeMap;
use std::sync::Arc;

use tidepool_api::convert::{Allocations, NodeView};
use tidepool_ipam::node::{BlockView, project};
use tidepool_ipam::{AddrSet, IpamBlock, IpamNode, NodeUid};

/// One listed kind (the IPAMNode, or the blocks) as kube's reflector keeps it: `Apply` and
/// `Delete` change the view at once; a relist (`Init` … `InitDone`) is buffered and then
/// replaces it, so objects deleted while the watch was down go.
#[derive(Debug)]
pub(crate) struct Listed<T> {
    live: BTreeMap<String, T>,
    relist: Option<BTreeMap<String, T>>,
    listed: bool,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Self {
            live: BTreeMap::new(),
            relist: None,
            listed: false,
        }
    }
}

impl<T> Listed<T> {
    pub(crate) fn apply(&mut self, name: String, v: T) {
        self.live.insert(name, v);
    }

    pub(crate) fn delete(&mut self, name: &str) {
        self.live.remove(name);
    }

    pub(crate) fn init(&mut self) {
        self.relist = Some(BTreeMap::new());
    }

    pub(crate) fn init_apply(&mut self, name: String, v: T) {
        self.relist.get_or_insert_default().insert(name, v);
    }

    pub(crate) fn init_done(&mut self) {
        self.live = self.relist.take().unwrap_or_default();
        self.listed = true;
    }

    /// Whether the first list is done.
    pub(crate) fn listed(&self) -> bool {
        self.listed
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.live.values()
    }
}

/// What the watch has seen, and the projection built from it.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) node: Listed<NodeView>,
    pub(crate) blocks: Listed<IpamBlock>,
}

/// The node as the agent serves it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Projected {
    /// The IPAMNode's nodeUID (`None` until it is read).
    pub(crate) node_uid: Option<NodeUid>,
    /// [`project`]ed: the pool is the union of the blocks, marked blocks' addresses marked.
    pub(crate) node: Option<Arc<IpamNode>>,
    /// The node's blocks (those with its nodeUID), as `answer_blocks` reads them.
    pub(crate) blocks: Arc<[BlockView]>,
    /// The (containerID, ifname) of each allocation the IPAMNode names (its tombstones'
    /// keys, which the engine's types carry only as a hash).
    pub(crate) allocations: Arc<Allocations>,
}

/// A block as the node rules read it: every address of its CIDR is the node's (which of
/// them a pod may get — not a network's first or last — is the allocator's business).
pub(crate) fn block_view(b: &IpamBlock) -> BlockView {
    let all = AddrSet::of_net(&b.cidr);
    BlockView {
        name: b.name.clone(),
        addrs: all.clone(),
        all,
        release: b.release,
        ack: b.ack,
    }
}

impl Seen {
    /// The projection of what is seen now: the IPAMNode (the one named; a second object
    /// cannot match the name selector) and only the blocks carrying its nodeUID — a block
    /// of an earlier Node of the same name is not this node's.
    pub(crate) fn project(&self) -> Projected {
        let Some(view) = self.node.values().next() else {
            return Projected::default();
        };
        let uid = view.node.node_uid;
        let blocks: Arc<[BlockView]> = self
            .blocks
            .values()
            .filter(|b| b.node_uid == uid && b.node == view.node.name)
            .map(block_view)
            .collect();
        Projected {
            node_uid: Some(uid),
            node: Some(Arc::new(project(&view.node, &blocks))),
            blocks,
            allocations: Arc::new(view.allocations.clone()),
        }
    }

    /// Both lists are done.
    pub(crate) fn ready(&self) -> bool {
        self.node.listed() && self.blocks.listed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::net::IpAddr;
    use tidepool_api as api;
    use tidepool_api::convert::{block_from_api, node_from_api};

    const UID: &str = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b";
    const OTHER: &str = "99999999-4b5a-4697-8a8b-9c0d1e2f3a4b";

    fn node() -> api::IPAMNode {
        serde_json::from_value(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMNode",
            "metadata": { "name": "n1" }, "spec": { "nodeUID": UID },
        }))
        .unwrap()
    }

    fn block(cidr: &str, node: &str, uid: &str, release: bool) -> IpamBlock {
        let mut spec = json!({ "pool": "default", "cidr": cidr, "node": node, "nodeUID": uid });
        if release {
            spec["release"] = json!("marked-for-release");
        }
        let obj: api::IPAMBlock = serde_json::from_value(json!({
            "apiVersion": "ipam.tidepool.dev/v1alpha1", "kind": "IPAMBlock",
            "metadata": { "name": cidr }, "spec": spec,
        }))
        .unwrap();
        block_from_api(&obj).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_blocks_with_the_nodes_uid_make_its_pool() {
        let mut seen = Seen::default();
        assert!(seen.project().node.is_none());
        seen.node.init();
        seen.node.init_apply("n1".into(), node_from_api(&node()).0);
        seen.node.init_done();
        seen.blocks.init();
        for b in [
            block("10.0.0.0/28", "n1", UID, false),
            block("10.0.0.16/28", "n1", UID, true),
            block("10.0.0.32/28", "n1", OTHER, false),
        ] {
            seen.blocks.init_apply(b.name.to_string(), b);
        }
        assert!(!seen.ready());
        seen.blocks.init_done();
        assert!(seen.ready());
        let p = seen.project();
        assert_eq!(p.blocks.len(), 2);
        let n = p.node.unwrap();
        assert_eq!(Some(n.node_uid), p.node_uid);
        assert!(n.operator.addresses.contains(&ip("10.0.0.1")));
        assert!(n.operator.addresses.contains(&ip("10.0.0.17")));
        assert!(!n.operator.addresses.contains(&ip("10.0.0.33")));
        // the marked block's addresses count as marked
        assert!(n.operator.release.get(&ip("10.0.0.17")).is_some());
        assert!(n.operator.release.get(&ip("10.0.0.1")).is_none());
    }

    #[test]
    fn a_relist_replaces_what_was_seen() {
        let mut l = Listed::default();
        l.apply("a".to_string(), 1);
        l.apply("b".to_string(), 2);
        l.init();
        l.init_apply("b".to_string(), 3);
        // the old view answers until the relist is done
        assert_eq!(l.values().copied().collect::<Vec<_>>(), vec![1, 2]);
        l.init_done();
        assert_eq!(l.values().copied().collect::<Vec<_>>(), vec![3]);
        l.delete("b");
        assert_eq!(l.values().count(), 0);
    }
}
