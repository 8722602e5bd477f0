//! What the server needs from the API-server side, as small traits, and in-memory
//! implementations for tests (and for running the server without a cluster).
//!
//! The kube layer implements them: [`NodeSource`] from its watch of the node's IPAMNode and
//! blocks (the node projected with `ipam::node::project`), [`Publish`] by writing the node
//! side's fields from the shared state when told (batched; it reads the state itself),
//! [`PodSource`] from its watch of the node's pods.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tidepool_ipam::pool::choice::Subject;
use tidepool_ipam::{AddrSet, IpamNode, NodeName, NodeUid, PodUid};
use tokio::sync::watch;

use crate::pods::LivePods;
use crate::pool_choice::PoolChoice;

/// The node as the server allocates from it.
pub trait NodeSource: Send + Sync + 'static {
    /// The projected node (its pool is its blocks' addresses, marked blocks' addresses
    /// marked); `None` until the IPAMNode has been read.
    fn node(&self) -> Option<Arc<IpamNode>>;
    /// Bumped whenever [`NodeSource::node`] may have changed (an ADD waiting on an empty
    /// pool wakes on it).
    fn changes(&self) -> watch::Receiver<u64>;
    /// The pod networks the IPPools make (`None`: this source knows no IPPools, and only
    /// the configured ones count).
    fn pod_networks(&self) -> Option<Arc<super::PodNetworks>> {
        None
    }
    /// What the pod's pool choice reads of the IPPools and the node (`None`: this source
    /// knows no pools, and an ADD takes any of the node's addresses).
    fn pool_choice(&self) -> Option<Arc<PoolChoice>> {
        None
    }
}

/// The live pods on the node (the kube layer's pod watch): their addresses are never
/// handed to another allocation, and reconcile frees nothing they list.
pub trait PodSource: Send + Sync + 'static {
    /// `None` until the pods have been listed.
    fn live_pods(&self) -> Option<Arc<LivePods>>;
    /// What the pool choice reads of pod `uid` and of `namespace` (unknown: nothing).
    fn subject(&self, _uid: PodUid, _namespace: &str) -> Subject {
        Subject::default()
    }
}

/// No pod view (an agent run without a cluster): nothing excluded, and reconcile, which
/// needs the pods, frees nothing.
#[derive(Debug, Default)]
pub struct NoPods;

impl PodSource for NoPods {
    fn live_pods(&self) -> Option<Arc<LivePods>> {
        None
    }
}

/// A [`PodSource`] held in memory (tests).
#[derive(Debug, Default)]
pub struct MemoryPods(std::sync::Mutex<Option<Arc<LivePods>>>);

impl MemoryPods {
    /// Replaces the live pods (`None`: not listed yet).
    pub fn set(&self, live: Option<LivePods>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = live.map(Arc::new);
    }
}

impl PodSource for MemoryPods {
    fn live_pods(&self) -> Option<Arc<LivePods>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl<T: PodSource> PodSource for Arc<T> {
    fn live_pods(&self) -> Option<Arc<LivePods>> {
        (**self).live_pods()
    }

    fn subject(&self, uid: PodUid, namespace: &str) -> Subject {
        (**self).subject(uid, namespace)
    }
}

/// Told after every durable change of the node state: the kube layer publishes the node
/// side's fields (`status.used`, `status.cooldown`, the acks). Must not block.
pub trait Publish: Send + Sync + 'static {
    fn publish(&self);
}

/// A [`NodeSource`] held in memory: set the node, and every waiting ADD wakes.
#[derive(Debug)]
pub struct MemoryNodeSource {
    node: std::sync::Mutex<Option<Arc<IpamNode>>>,
    choice: std::sync::Mutex<Option<Arc<PoolChoice>>>,
    version: watch::Sender<u64>,
}

impl Default for MemoryNodeSource {
    fn default() -> Self {
        MemoryNodeSource {
            node: std::sync::Mutex::new(None),
            choice: std::sync::Mutex::new(None),
            version: watch::channel(0).0,
        }
    }
}

impl MemoryNodeSource {
    /// A source with no node yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A source whose node `name` has `pool` as its addresses (a projected node).
    pub fn with_pool(name: &str, pool: AddrSet) -> Self {
        let s = Self::new();
        s.set_pool(name, pool);
        s
    }

    /// Replaces the node and bumps [`NodeSource::changes`].
    pub fn set(&self, node: Option<IpamNode>) {
        let mut held = self.node.lock().unwrap_or_else(|e| e.into_inner());
        *held = node.map(Arc::new);
        drop(held);
        self.version.send_modify(|v| *v += 1);
    }

    /// Replaces the pool choice's view and bumps [`NodeSource::changes`].
    pub fn set_choice(&self, choice: Option<PoolChoice>) {
        *self.choice.lock().unwrap_or_else(|e| e.into_inner()) = choice.map(Arc::new);
        self.version.send_modify(|v| *v += 1);
    }

    /// Sets node `name` with `pool` as its addresses.
    pub fn set_pool(&self, name: &str, pool: AddrSet) {
        let mut node = IpamNode::new(NodeName::from(name), NodeUid(1));
        node.operator.addresses = Arc::new(pool);
        self.set(Some(node));
    }
}

impl NodeSource for MemoryNodeSource {
    fn node(&self) -> Option<Arc<IpamNode>> {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn pool_choice(&self) -> Option<Arc<PoolChoice>> {
        self.choice
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A [`Publish`] that counts the calls.
#[derive(Debug, Default)]
pub struct CountingPublish(AtomicU64);

impl CountingPublish {
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl Publish for CountingPublish {
    fn publish(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl<T: Publish> Publish for Arc<T> {
    fn publish(&self) {
        (**self).publish();
    }
}

impl<T: NodeSource> NodeSource for Arc<T> {
    fn node(&self) -> Option<Arc<IpamNode>> {
        (**self).node()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        (**self).changes()
    }

    fn pool_choice(&self) -> Option<Arc<PoolChoice>> {
        (**self).pool_choice()
    }
}
