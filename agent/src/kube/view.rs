//! The node as the agent's watch last saw it: its IPAMNode, its blocks (only those
//! carrying its nodeUID) and the IPPools, projected the way `ipam`'s node rules read a node:
//! its pool is made of the blocks their pools grant. Pure state, fed by watch events;
//! [`super::NodeWatch`] drives it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tidepool_api::convert::{Allocations, NodeView};
use tidepool_ipam::node::{BlockView, project};
use tidepool_ipam::pool::choice::{Labels, PoolTerms, Selector};
use tidepool_ipam::pool::repair::{BlockIssue, block_issue};
use tidepool_ipam::pool::{PoolConfig, PoolSet, PoolSpec};
use tidepool_ipam::{AddrSet, Family, IpamBlock, IpamNode, NodeUid};

use crate::pool_choice::PoolChoice;
use crate::serve::PodNetworks;

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

    pub(crate) fn entries(&self) -> impl Iterator<Item = (&String, &T)> {
        self.live.iter()
    }
}

/// An IPPool as the agent reads it: its spec and selectors, and its place in creation order
/// (an older pool wins an overlap, [`PoolSet::new`]).
#[derive(Debug, Clone)]
pub(crate) struct PoolEntry {
    pub(crate) created: Option<Time>,
    pub(crate) config: PoolConfig,
}

/// What the watch has seen, and the projection built from it.
#[derive(Debug)]
pub(crate) struct Seen {
    pub(crate) node: Listed<NodeView>,
    pub(crate) blocks: Listed<IpamBlock>,
    pub(crate) pools: Listed<PoolEntry>,
    /// The node's Node: its labels.
    pub(crate) node_labels: Listed<Labels>,
    /// The pools as the engine holds them, rebuilt when they change ([`Self::pools_changed`]).
    pool_set: PoolSet,
    /// The pools as the pool choice reads them, rebuilt with [`Self::pool_set`].
    terms: Vec<PoolTerms>,
    /// The valid pools' CIDRs as pod networks, rebuilt with [`Self::pool_set`].
    pod_networks: Arc<PodNetworks>,
}

impl Default for Seen {
    fn default() -> Self {
        Self {
            node: Listed::default(),
            blocks: Listed::default(),
            pools: Listed::default(),
            node_labels: Listed::default(),
            pool_set: PoolSet::new(Vec::new()),
            terms: Vec::new(),
            pod_networks: Arc::default(),
        }
    }
}

/// The node as the agent serves it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Projected {
    /// The IPAMNode's nodeUID (`None` until it is read).
    pub(crate) node_uid: Option<NodeUid>,
    /// [`project`]ed: the pool is the union of the blocks, marked blocks' addresses marked.
    pub(crate) node: Option<Arc<IpamNode>>,
    /// The node's blocks (those with its nodeUID), as `answer_blocks` reads them: also
    /// those left out of its pool, whose release marks are answered all the same.
    pub(crate) blocks: Arc<[BlockView]>,
    /// The node's blocks its pool leaves out, and why: no valid pool of theirs, or not a
    /// block their pool grants (DESIGN.md "Node agent"). Nothing new is allocated from them;
    /// an allocation already in one stays.
    pub(crate) left_out: Arc<[(Arc<str>, BlockIssue)]>,
    /// The (containerID, ifname) of each allocation the IPAMNode names (its tombstones'
    /// keys, which the engine's types carry only as a hash).
    pub(crate) allocations: Arc<Allocations>,
    /// The valid IPPools' CIDRs: each address's prefix length and gateway in an ADD result.
    pub(crate) pod_networks: Arc<PodNetworks>,
    /// What the pod's pool choice reads of the pools and the node, and the addresses of the
    /// node's usable blocks per pool (`None` until the IPAMNode is read).
    pub(crate) choice: Option<Arc<PoolChoice>>,
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
    /// of an earlier Node of the same name is not this node's. Its pool is made of the
    /// blocks their pools grant ([`block_issue`]); the others are left out.
    pub(crate) fn project(&self) -> Projected {
        let Some(view) = self.node.values().next() else {
            return Projected {
                pod_networks: self.pod_networks.clone(),
                ..Projected::default()
            };
        };
        let uid = view.node.node_uid;
        let own: Vec<&IpamBlock> = self
            .blocks
            .values()
            .filter(|b| b.node_uid == uid && b.node == view.node.name)
            .collect();
        let mut usable = Vec::with_capacity(own.len());
        let mut left_out = Vec::new();
        let mut by_pool: BTreeMap<(Arc<str>, Family), AddrSet> = BTreeMap::new();
        for b in &own {
            match block_issue(&self.pool_set, &b.pool, &b.cidr) {
                None => {
                    let view = block_view(b);
                    (by_pool.entry((b.pool.clone(), Family::of(&b.cidr.network()))))
                        .or_default()
                        .union_with(&view.addrs);
                    usable.push(view);
                }
                Some(why) => left_out.push((b.name.clone(), why)),
            }
        }
        let choice = PoolChoice {
            pools: self.terms.clone(),
            node_labels: self
                .node_labels
                .values()
                .next()
                .cloned()
                .unwrap_or_default(),
            named: view.pools.clone(),
            addresses: by_pool,
        };
        Projected {
            node_uid: Some(uid),
            node: Some(Arc::new(project(&view.node, &usable))),
            blocks: own.into_iter().map(block_view).collect(),
            left_out: left_out.into(),
            allocations: Arc::new(view.allocations.clone()),
            pod_networks: self.pod_networks.clone(),
            choice: Some(Arc::new(choice)),
        }
    }

    /// What the agent acts on: [`Self::project`] once every list is done, nothing before.
    /// A partial view would judge a block whose pool is not listed yet left out ("not in
    /// my cache" is not "gone"), warn of it, and have the node's status written from it,
    /// then written again when the list came.
    pub(crate) fn project_when_ready(&self) -> Projected {
        if self.ready() {
            self.project()
        } else {
            Projected::default()
        }
    }

    /// The IPPools changed: the engine's view of them is rebuilt (creation order, then name).
    pub(crate) fn pools_changed(&mut self) {
        let mut pools: Vec<&PoolEntry> = self.pools.values().collect();
        pools.sort_by(|a, b| {
            (&a.created, &a.config.spec.name).cmp(&(&b.created, &b.config.spec.name))
        });
        let specs: Vec<PoolSpec> = pools.iter().map(|p| p.config.spec.clone()).collect();
        self.pool_set = PoolSet::new(specs.clone());
        let valid = specs
            .iter()
            .zip(self.pool_set.validity())
            .filter(|(_, (_, v))| v.is_ok());
        let cidrs = valid.flat_map(|(spec, _)| spec.cidrs.iter().copied());
        self.pod_networks = Arc::new(PodNetworks::from_pools(cidrs));
        self.terms = pools.iter().map(|p| self.terms_of(&p.config)).collect();
    }

    /// A pool as the choice reads it (as the operator's source does: an Invalid pool serves
    /// no family).
    fn terms_of(&self, p: &PoolConfig) -> PoolTerms {
        let valid = self.pool_set.get(&p.spec.name).ok();
        let serves = |f| valid.is_some_and(|v| v.family(f).is_some());
        PoolTerms {
            name: p.spec.name.clone(),
            valid: valid.is_some(),
            v4: serves(Family::V4),
            v6: serves(Family::V6),
            node_selector: Selector {
                match_labels: p.node_selector.clone(),
                match_expressions: Vec::new(),
            },
            namespace_selector: p.namespace_selector.clone(),
            pod_selector: p.pod_selector.clone(),
        }
    }

    /// All three lists are done (ADD is served only after the first IPPool list).
    pub(crate) fn ready(&self) -> bool {
        self.node.listed() && self.blocks.listed() && self.pools.listed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::net::IpAddr;
    use tidepool_api as api;
    use tidepool_api::convert::{block_from_api, node_from_api};
    use tidepool_ipam::PerFamily;

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

    /// Pool `name` over `cidrs` (/28 and /124 blocks), created at second `created`.
    fn pool(name: &str, cidrs: &[&str], created: i64) -> PoolEntry {
        let spec = PoolSpec::read(name, cidrs, PerFamily { v4: 28, v6: 124 }, &[] as &[&str]);
        let at: Result<Time, _> =
            serde_json::from_value(json!(format!("2026-01-01T00:00:{created:02}Z")));
        PoolEntry {
            created: Some(at.unwrap()),
            config: PoolConfig::new(spec.unwrap()),
        }
    }

    /// `seen` with IPAMNode n1 and `pools` listed.
    fn listed(pools: Vec<PoolEntry>) -> Seen {
        let mut seen = Seen::default();
        seen.node.init();
        seen.node.init_apply("n1".into(), node_from_api(&node()).0);
        seen.node.init_done();
        seen.pools.init();
        for p in pools {
            seen.pools.init_apply(p.config.spec.name.clone(), p);
        }
        seen.pools.init_done();
        seen.pools_changed();
        seen
    }

    #[test]
    fn only_blocks_with_the_nodes_uid_make_its_pool() {
        assert!(Seen::default().project().node.is_none());
        let mut seen = listed(vec![pool("default", &["10.0.0.0/24"], 1)]);
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

    /// ADD is served only after the first IPPool list: the node is not ready before it.
    #[test]
    fn not_ready_before_the_first_ippool_list() {
        let mut seen = Seen::default();
        seen.node.init();
        seen.node.init_done();
        seen.blocks.init();
        seen.blocks.init_done();
        assert!(!seen.ready());
        seen.pools.init();
        seen.pools.init_done();
        assert!(seen.ready());
    }

    /// Blocks listed before their pool are not judged: nothing is projected until the
    /// IPPools are listed too, and then the blocks are the node's.
    #[test]
    fn nothing_is_projected_before_every_list_is_done() {
        let mut seen = Seen::default();
        seen.node.init();
        seen.node.init_apply("n1".into(), node_from_api(&node()).0);
        seen.node.init_done();
        seen.blocks.init();
        let b = block("10.0.0.0/28", "n1", UID, false);
        seen.blocks.init_apply(b.name.to_string(), b);
        seen.blocks.init_done();
        assert_eq!(
            seen.project().left_out.len(),
            1,
            "judged unlisted, it is left out"
        );
        let early = seen.project_when_ready();
        assert!(early.node.is_none() && early.left_out.is_empty() && early.blocks.is_empty());
        seen.pools.init();
        let p = pool("default", &["10.0.0.0/24"], 1);
        seen.pools.init_apply(p.config.spec.name.clone(), p);
        seen.pools.init_done();
        seen.pools_changed();
        let p = seen.project_when_ready();
        assert!(p.left_out.is_empty());
        assert!(p.node.unwrap().operator.addresses.contains(&ip("10.0.0.1")));
    }

    /// Only the blocks their pools grant make the node's pool (issue 27, "one bad object"):
    /// a block of an unknown pool, of another size, outside its pool's CIDRs or of a pool
    /// that is invalid (its CIDR overlaps an older pool's) is left out, with why, and still
    /// answered; once its pool appears, it is used.
    #[test]
    fn blocks_their_pools_do_not_grant_are_left_out() {
        let mut seen = listed(vec![
            pool("default", &["10.0.0.0/24"], 1),
            pool("late", &["10.0.0.128/25"], 2), // overlaps the older one: Invalid
        ]);
        let named = |cidr: &str, pool: &str| {
            let mut b = block(cidr, "n1", UID, false);
            b.pool = pool.into();
            b
        };
        let blocks = [
            named("10.0.0.0/28", "default"),
            named("10.0.0.64/26", "default"),
            named("10.9.0.0/28", "default"),
            named("10.0.0.16/28", "gone"),
            named("10.0.0.32/28", "late"),
        ];
        seen.blocks.init();
        for b in blocks {
            seen.blocks.init_apply(b.name.to_string(), b);
        }
        seen.blocks.init_done();
        let p = seen.project();
        let n = p.node.unwrap();
        assert!(n.operator.addresses.contains(&ip("10.0.0.1")));
        for left in ["10.0.0.65", "10.9.0.1", "10.0.0.17", "10.0.0.33"] {
            assert!(!n.operator.addresses.contains(&ip(left)), "{left}");
        }
        assert_eq!(p.blocks.len(), 5, "every block of the node is answered");
        let why: Vec<String> = p
            .left_out
            .iter()
            .map(|(b, w)| format!("{b}: {w}"))
            .collect();
        assert_eq!(
            why,
            vec![
                "10.0.0.16/28: its pool does not exist or is invalid",
                "10.0.0.32/28: its pool does not exist or is invalid",
                "10.0.0.64/26: its pool's block size is /28",
                "10.9.0.0/28: it lies outside its pool's CIDRs",
            ]
        );
        // pool `gone` appears: its block is used
        seen.pools
            .apply("gone".into(), pool("gone", &["10.0.0.16/28"], 3));
        seen.pools_changed();
        let n = seen.project().node.unwrap();
        assert!(
            !n.operator.addresses.contains(&ip("10.0.0.17")),
            "overlaps `default`"
        );
        seen.pools.delete("default");
        seen.pools_changed();
        let p = seen.project();
        let n = p.node.unwrap();
        assert!(n.operator.addresses.contains(&ip("10.0.0.17")));
        assert!(
            !n.operator.addresses.contains(&ip("10.0.0.1")),
            "its pool is deleted"
        );
    }

    /// The pod networks are the valid pools' CIDRs, followed as the pools change: an
    /// Invalid pool's CIDR is none, and a deleted pool's goes.
    #[test]
    fn the_pod_networks_are_the_valid_pools_cidrs() {
        let mut seen = listed(vec![
            pool("default", &["10.0.0.0/16", "fd00::/64"], 1),
            pool("late", &["10.0.128.0/17"], 2), // overlaps the older one: Invalid
            pool("gpu", &["10.9.0.0/24"], 3),
        ]);
        let nets = |seen: &Seen| seen.project().pod_networks;
        let n = nets(&seen);
        assert_eq!(
            n.network_of(ip("10.0.200.1")),
            Some(&"10.0.0.0/16".parse().unwrap())
        );
        assert_eq!(
            n.network_of(ip("fd00::9")),
            Some(&"fd00::/64".parse().unwrap())
        );
        assert_eq!(
            n.network_of(ip("10.9.0.9")),
            Some(&"10.9.0.0/24".parse().unwrap())
        );
        seen.pools.delete("gpu");
        seen.pools_changed();
        assert_eq!(nets(&seen).network_of(ip("10.9.0.9")), None);
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
