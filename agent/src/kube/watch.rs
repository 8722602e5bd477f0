//! [`NodeWatch`]: the agent's watch of its own IPAMNode and Node (field selector
//! `metadata.name`; of the Node only its labels are kept, for the pool choice), its node's
//! IPAMBlocks (the CRD's selectable field `spec.node`) and the IPPools, list then watch
//! with kube's default backoff, and the node projected from them.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_objects};
use tidepool_api as api;
use tidepool_api::convert::{block_from_api, node_from_api, pool_config};
use tidepool_ipam::node::BlockView;
use tidepool_ipam::pool::repair::BlockIssue;
use tidepool_ipam::{IpamNode, NodeUid};
use tokio::sync::watch;

use super::KubeError;
use super::running::Running;
use super::view::{PoolEntry, Projected, Seen};
use crate::pool_choice::PoolChoice;
use crate::serve::PodNetworks;

/// One event of any watch (boxed: the objects are large, and they differ in size).
enum Change {
    Node(Box<Event<api::IPAMNode>>),
    /// The node's Node (its labels, for the pool choice).
    Labels(Box<Event<Node>>),
    Block(Box<Event<api::IPAMBlock>>),
    Pool(Box<Event<api::IPPool>>),
}

struct Shared {
    node: String,
    projected: watch::Sender<Projected>,
    changes: watch::Sender<u64>,
    ready: watch::Sender<bool>,
    /// The first IPPool list is done (what a start-up that waited in vain lacked).
    pools_listed: watch::Sender<bool>,
}

/// The node as the agent's watch sees it. Cheap to clone; the watch stops with the last
/// clone.
#[derive(Clone)]
pub struct NodeWatch {
    running: Arc<Running<Shared>>,
}

impl std::fmt::Debug for NodeWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeWatch")
            .field("node", &self.running.shared.node)
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl NodeWatch {
    /// Starts watching node `node`'s IPAMNode and IPAMBlocks through `client` (on the
    /// current tokio runtime).
    pub fn start(client: kube::Client, node: &str) -> Self {
        let shared = Arc::new(Shared {
            node: node.to_string(),
            projected: watch::Sender::new(Projected::default()),
            changes: watch::Sender::new(0),
            ready: watch::Sender::new(false),
            pools_listed: watch::Sender::new(false),
        });
        let nodes: Api<api::IPAMNode> = Api::all(client.clone());
        let blocks: Api<api::IPAMBlock> = Api::all(client.clone());
        let pools: Api<api::IPPool> = Api::all(client.clone());
        let nodes_k8s: Api<Node> = Api::all(client);
        let by_name = watcher::Config::default().fields(&format!("metadata.name={node}"));
        let by_node = watcher::Config::default().fields(&format!("spec.node={node}"));
        let labels = watch_objects(nodes_k8s, by_name.clone())
            .default_backoff()
            .map_ok(|e| Change::Labels(Box::new(e)));
        let events = futures::stream::select(
            futures::stream::select(
                watch_objects(nodes, by_name)
                    .default_backoff()
                    .map_ok(|e| Change::Node(Box::new(e))),
                watch_objects(blocks, by_node)
                    .default_backoff()
                    .map_ok(|e| Change::Block(Box::new(e))),
            ),
            futures::stream::select(
                watch_objects(pools, watcher::Config::default())
                    .default_backoff()
                    .map_ok(|e| Change::Pool(Box::new(e))),
                labels,
            ),
        );
        let task = tokio::spawn(drive(shared.clone(), events));
        Self {
            running: Arc::new(Running { shared, task }),
        }
    }

    fn shared(&self) -> &Shared {
        &self.running.shared
    }

    /// The node projected from its IPAMNode and blocks (`ipam::node::project`): its pool is
    /// the union of its blocks, a marked block's addresses count as marked. `None` until
    /// the IPAMNode is seen, and again once it is gone.
    pub fn current(&self) -> Option<Arc<IpamNode>> {
        self.shared().projected.borrow().node.clone()
    }

    /// The node's blocks (only those carrying its nodeUID), for `answer_blocks`.
    pub fn blocks(&self) -> Arc<[BlockView]> {
        self.shared().projected.borrow().blocks.clone()
    }

    /// The (containerID, ifname) of each allocation the IPAMNode names (its tombstones').
    pub fn allocations(&self) -> Arc<tidepool_api::convert::Allocations> {
        self.shared().projected.borrow().allocations.clone()
    }

    /// What the pod's pool choice reads of the IPPools and the node (`None` until the
    /// IPAMNode is read).
    pub fn pool_choice(&self) -> Option<Arc<PoolChoice>> {
        self.shared().projected.borrow().choice.clone()
    }

    /// The valid IPPools' CIDRs as pod networks (empty until the IPPools are listed).
    pub fn pod_networks(&self) -> Arc<PodNetworks> {
        self.shared().projected.borrow().pod_networks.clone()
    }

    /// The node's name.
    pub fn node_name(&self) -> String {
        self.shared().node.clone()
    }

    /// The IPAMNode's `spec.nodeUID`, once seen.
    pub fn node_uid(&self) -> Option<NodeUid> {
        self.shared().projected.borrow().node_uid
    }

    /// Bumped on every change of what [`Self::current`], [`Self::blocks`] or
    /// [`Self::is_ready`] give.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.shared().changes.subscribe()
    }

    /// Whether the three first lists are done.
    pub fn is_ready(&self) -> bool {
        *self.shared().ready.borrow()
    }

    /// Waits until the three first lists are done.
    pub async fn ready(&self) {
        let mut ready = self.shared().ready.subscribe();
        // the sender lives as long as `self`: `wait_for` cannot fail here
        let _ = ready.wait_for(|r| *r).await;
    }

    /// Waits, at most `timeout`, until the lists are done and the IPAMNode exists (the
    /// operator creates it: the start-up order waits for it), and gives the projected node.
    pub async fn wait_for_node(&self, timeout: Duration) -> Result<Arc<IpamNode>, KubeError> {
        let mut changes = self.changes();
        let wait = async {
            loop {
                if let (true, Some(node)) = (self.is_ready(), self.current()) {
                    return Some(node);
                }
                changes.changed().await.ok()?;
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Some(node)) => Ok(node),
            _ if !*self.shared().pools_listed.borrow() => {
                Err(KubeError::PoolsNotListed { waited: timeout })
            }
            _ => Err(KubeError::NodeMissing {
                node: self.shared().node.clone(),
                waited: timeout,
            }),
        }
    }
}

/// Feeds the events into what is seen; republishes the projection when it changed.
async fn drive(
    shared: Arc<Shared>,
    events: impl Stream<Item = Result<Change, watcher::Error>> + Send,
) {
    let mut seen = Seen::default();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(change) => {
                if take(&mut seen, change) {
                    publish(&shared, &seen);
                }
            }
            // the watcher retries with its backoff; what was seen keeps answering
            Err(e) => tracing::warn!(node = %shared.node, error = %e, "watch failed; retrying"),
        }
    }
    tracing::error!(node = %shared.node, "{}", KubeError::WatchEnded { what: "IPAMNode, IPAMBlocks, IPPools and Node" });
}

/// Takes one event in; whether the live view may have changed.
fn take(seen: &mut Seen, change: Change) -> bool {
    match change {
        Change::Node(e) => on_event(&mut seen.node, *e, |o| {
            let (view, bad) = node_from_api(o);
            for m in bad {
                tracing::warn!(%m, "malformed entry skipped");
            }
            Some(view)
        }),
        Change::Labels(e) => on_event(&mut seen.node_labels, *e, |o: &Node| {
            Some(o.metadata.labels.clone().unwrap_or_default())
        }),
        Change::Block(e) => on_event(&mut seen.blocks, *e, |o| {
            block_from_api(o)
                .map_err(|bad| {
                    for m in bad {
                        tracing::warn!(%m, "unreadable block ignored");
                    }
                })
                .ok()
        }),
        Change::Pool(e) => {
            let changed = on_event(&mut seen.pools, *e, read_pool);
            if changed {
                seen.pools_changed();
            }
            changed
        }
    }
}

/// An IPPool as the agent reads it; one that is no pool at all (a CIDR that is no CIDR) is
/// left out, so its blocks are too.
fn read_pool(o: &api::IPPool) -> Option<PoolEntry> {
    let name = o.metadata.name.as_deref().unwrap_or_default();
    match pool_config(name, &o.spec) {
        Ok(config) => Some(PoolEntry {
            created: o.metadata.creation_timestamp.clone(),
            config,
        }),
        Err(e) => {
            tracing::warn!(pool = name, error = %e, "unreadable IPPool ignored");
            None
        }
    }
}

/// Takes one watcher event into `listed` (objects keyed by `namespace/name`, or by name
/// when cluster-scoped); whether the live view may have changed (a relist changes it only
/// when done).
pub(super) fn on_event<K: kube::Resource, T>(
    listed: &mut super::view::Listed<T>,
    event: Event<K>,
    read: impl Fn(&K) -> Option<T>,
) -> bool {
    let name = |o: &K| {
        let m = o.meta();
        let name = m.name.clone().unwrap_or_default();
        match &m.namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name,
        }
    };
    match event {
        Event::Apply(o) => match read(&o) {
            Some(v) => listed.apply(name(&o), v),
            None => listed.delete(&name(&o)),
        },
        Event::Delete(o) => listed.delete(&name(&o)),
        Event::Init => {
            listed.init();
            return false;
        }
        Event::InitApply(o) => {
            if let Some(v) = read(&o) {
                listed.init_apply(name(&o), v);
            }
            return false;
        }
        Event::InitDone => listed.init_done(),
    }
    true
}

fn publish(shared: &Shared, seen: &Seen) {
    let next = seen.project_when_ready();
    let ready = seen.ready();
    let moved = shared.projected.send_if_modified(|p| {
        let same = p.node_uid == next.node_uid
            && p.node == next.node
            && p.blocks == next.blocks
            && p.pod_networks == next.pod_networks
            && p.choice == next.choice;
        if !same {
            report_left_out(&shared.node, &p.left_out, &next.left_out);
            *p = next;
        }
        !same
    });
    shared.pools_listed.send_replace(seen.pools.listed());
    let readied = shared.ready.send_if_modified(|r| {
        let changed = *r != ready;
        *r = ready;
        changed
    });
    if moved || readied {
        shared.changes.send_modify(|v| *v += 1);
    }
}

/// Each block newly left out of the node's pool, with why, as a warning (`check` and the
/// operator's repair report it too).
fn report_left_out(node: &str, before: &[(Arc<str>, BlockIssue)], now: &[(Arc<str>, BlockIssue)]) {
    for (block, why) in now.iter().filter(|b| !before.contains(b)) {
        tracing::warn!(
            node,
            block = &**block,
            "block left out of the node's pool: {why}; nothing new is allocated from it"
        );
    }
}
