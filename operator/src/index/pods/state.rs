//! The pod index's state: records by UID, pods by node, change logs, the relist buffer.

use std::collections::{BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use tidepool_ipam::{NodeName, PodChanges, PodInfo, PodUid, Since};

use super::changes::{ChangeLog, changes_without_log};
use super::project::{PodRecord, PodTerms, bound_node, project, split_key};
use crate::index::LabelSelector;

/// One node's pods (any phase) and their recent changes. Dropped once it has no pod.
struct NodePods {
    pods: BTreeSet<PodUid>,
    log: ChangeLog,
}

/// A relist in progress: the pods listed so far and their nodes' names (shared).
#[derive(Default)]
struct Relist {
    pods: HashMap<PodUid, PodRecord>,
    names: HashSet<NodeName>,
}

#[derive(Default)]
pub(super) struct State {
    /// Pods bound to a node (a pod not bound yet holds no address and is not kept).
    pods: HashMap<PodUid, PodRecord>,
    nodes: HashMap<NodeName, NodePods>,
    relist: Option<Relist>,
    /// The last change sequence number handed out (one counter for all nodes).
    seq: u64,
    /// Set by the first completed relist.
    pub ready: bool,
    /// Which pods are node agents (`--agent-pod-selector`; `None`: none).
    agents: Option<LabelSelector>,
    /// The pods of `pods` that wait for an address ([`waits`]), over every node.
    pending_total: usize,
}

/// Nodes whose pods changed, as an apply reports them.
pub(super) type Touched = Vec<NodeName>;

impl State {
    /// Tells the node agents' pods by `agents` from now on (the empty selector: none).
    pub fn set_agents(&mut self, agents: LabelSelector) {
        self.agents = (!agents.is_empty()).then_some(agents);
    }

    fn project(&self, pod: &Pod, uid: PodUid, node: NodeName) -> PodRecord {
        project(pod, uid, node, self.agents.as_ref())
    }

    /// `Apply`: the pod as it is now.
    pub fn apply(&mut self, pod: &Pod, uid: PodUid, touched: &mut Touched) {
        let node = bound_node(pod);
        if node.is_empty() {
            return self.remove(uid, touched);
        }
        let name = match self.nodes.get_key_value(node) {
            Some((name, _)) => name.clone(),
            None => NodeName::from(node),
        };
        let rec = self.project(pod, uid, name);
        self.upsert(rec, touched);
    }

    /// `Delete`: the pod is gone.
    pub fn remove(&mut self, uid: PodUid, touched: &mut Touched) {
        if let Some(old) = self.pods.remove(&uid) {
            self.pending_total -= usize::from(waits(&old));
            self.unlink(&old.info.node, uid, touched);
        }
    }

    /// `Init`: a relist begins; the current view keeps answering until it is done.
    pub fn begin_relist(&mut self) {
        self.relist = Some(Relist::default());
    }

    /// `InitApply`: one pod of the relist.
    pub fn relisted(&mut self, pod: &Pod, uid: PodUid) {
        let node = bound_node(pod);
        if node.is_empty() {
            return;
        }
        let mut relist = self.relist.take().unwrap_or_default();
        let name = match (self.nodes.get_key_value(node), relist.names.get(node)) {
            (Some((name, _)), _) | (None, Some(name)) => name.clone(),
            (None, None) => {
                let name = NodeName::from(node);
                relist.names.insert(name.clone());
                name
            }
        };
        relist.pods.insert(uid, self.project(pod, uid, name));
        self.relist = Some(relist);
    }

    /// `InitDone`: the relisted pods replace the current ones, through the same steps as
    /// single events, so every pod gone or changed counts as a change of its node.
    pub fn finish_relist(&mut self, touched: &mut Touched) {
        self.ready = true;
        // an InitDone with no Init before it (kube sends none) changes nothing
        let Some(relist) = self.relist.take() else {
            return;
        };
        let gone: Vec<PodUid> = (self.pods.keys())
            .filter(|uid| !relist.pods.contains_key(uid))
            .copied()
            .collect();
        for uid in gone {
            self.remove(uid, touched);
        }
        for (_, rec) in relist.pods {
            self.upsert(rec, touched);
        }
    }

    fn upsert(&mut self, mut rec: PodRecord, touched: &mut Touched) {
        let uid = rec.info.uid;
        match self.pods.get(&uid) {
            Some(old) if *old == rec => return,
            Some(old) if old.info.node == rec.info.node => {
                rec.info.node = old.info.node.clone();
                self.touch(&rec.info.node, uid, touched);
            }
            Some(old) => {
                let old_node = old.info.node.clone();
                self.unlink(&old_node, uid, touched);
                rec.info.node = self.link(&rec.info.node, uid, touched);
            }
            None => rec.info.node = self.link(&rec.info.node, uid, touched),
        }
        self.pending_total += usize::from(waits(&rec));
        if let Some(old) = self.pods.insert(uid, rec) {
            self.pending_total -= usize::from(waits(&old));
        }
    }

    /// Adds the pod to its node's set; returns the node's shared name.
    fn link(&mut self, node: &NodeName, uid: PodUid, touched: &mut Touched) -> NodeName {
        let name = match self.nodes.get_key_value(&**node) {
            Some((name, _)) => name.clone(),
            None => {
                let log = ChangeLog::new(self.seq);
                let pods = BTreeSet::new();
                self.nodes.insert(node.clone(), NodePods { pods, log });
                node.clone()
            }
        };
        if let Some(n) = self.nodes.get_mut(&name) {
            n.pods.insert(uid);
        }
        self.touch(&name, uid, touched);
        name
    }

    /// Takes the pod off its node's set; a node left with no pod is dropped.
    fn unlink(&mut self, node: &NodeName, uid: PodUid, touched: &mut Touched) {
        self.touch(node, uid, touched);
        if let Some(n) = self.nodes.get_mut(node) {
            n.pods.remove(&uid);
            if n.pods.is_empty() {
                self.nodes.remove(node);
            }
        }
    }

    fn touch(&mut self, node: &NodeName, uid: PodUid, touched: &mut Touched) {
        if let Some(n) = self.nodes.get_mut(node) {
            self.seq += 1;
            n.log.push(self.seq, uid);
            touched.push(node.clone());
        }
    }
}

/// What the engine asks.
impl State {
    pub fn pod(&self, uid: PodUid) -> Option<&PodInfo> {
        self.pods.get(&uid).map(|r| &r.info)
    }

    /// A waiting pod's pool terms and its `namespace/name`.
    pub fn pool_terms(&self, uid: PodUid) -> Option<(&PodTerms, &str)> {
        let r = self.pods.get(&uid)?;
        Some((r.pool_terms.as_deref()?, &r.key))
    }

    /// The nodes with a pod of `namespace` waiting for its addresses.
    pub fn waiting_in(&self, namespace: &str) -> Vec<NodeName> {
        let of = |r: &&PodRecord| r.pool_terms.is_some() && split_key(&r.key).0 == namespace;
        (self.pods.values())
            .filter(of)
            .map(|r| r.info.node.clone())
            .collect()
    }

    /// `namespace/name` of a pod in the index.
    pub fn key(&self, uid: PodUid) -> Option<&str> {
        self.pods.get(&uid).map(|r| &*r.key)
    }

    pub fn changes(&self, node: &str, since: Option<Since>) -> Option<PodChanges> {
        match self.nodes.get(node) {
            Some(n) => n.log.changes(since),
            None => changes_without_log(since),
        }
    }

    /// The node's pods that are not terminal.
    fn live_on(&self, node: &str) -> impl Iterator<Item = &PodRecord> {
        let uids = self.nodes.get(node).into_iter().flat_map(|n| &n.pods);
        uids.filter_map(|uid| self.pods.get(uid))
            .filter(|r| !r.info.phase.is_terminal())
    }

    /// The addresses of every pod that is not terminal (`status.podIPs`).
    pub fn live_ips(&self) -> tidepool_ipam::AddrSet {
        let live = self.pods.values().filter(|r| !r.info.phase.is_terminal());
        live.flat_map(|r| r.info.ips.iter()).collect()
    }

    /// The node's pods that wait for an address: not terminal, no pod IP, not on the
    /// host's network (those never get one from tidepool: never demand, never waiting).
    pub fn pending(&self, node: &str) -> Vec<PodUid> {
        let uids = self.nodes.get(node).into_iter().flat_map(|n| &n.pods);
        let waiting = uids
            .filter_map(|uid| self.pods.get(uid))
            .filter(|r| waits(r));
        waiting.map(|r| r.info.uid).collect()
    }

    /// How many pods of every node wait for an address (as [`State::pending`] counts them).
    pub fn pending_total(&self) -> usize {
        self.pending_total
    }

    /// Whether the node's agent pod is Ready: `None` when no agent pod that is not
    /// terminal is bound to it, else whether one of them is (a rollout may run two).
    pub fn agent_pod_ready(&self, node: &str) -> Option<bool> {
        let agents = self.live_on(node).filter_map(|r| r.agent_ready);
        agents.reduce(|a, b| a || b)
    }

    pub fn bound(&self, node: &str) -> usize {
        self.live_on(node).count()
    }
}

/// Whether a bound pod waits for an address: not terminal, no pod IP, not on the host's
/// network (those never get one from tidepool: never demand, never waiting).
fn waits(r: &PodRecord) -> bool {
    !r.info.phase.is_terminal() && !r.host_network && r.info.ips.is_empty()
}
