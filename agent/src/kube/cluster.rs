//! [`ClusterWatch`]: for `--node-routes` only, every IPAMBlock (its CIDR, `spec.node`,
//! `spec.nodeUID`) and every Node (its UID and InternalIPs), list then watch with kube's
//! default backoff. A Node is projected at once and dropped (DESIGN.md "Watches"): a
//! metadata-only watch would not carry `status.addresses`.

use std::net::IpAddr;
use std::sync::Arc;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher as watch_objects};
use tidepool_api as api;
use tidepool_api::convert::{block_from_api, parse_uid};
use tidepool_ipam::NodeUid;
use tokio::sync::watch;

use super::KubeError;
use super::running::Running;
use super::view::Listed;
use super::watch::on_event;
use crate::routes::{BlockOwner, NodeAddrs};

/// Objects per list page.
const PAGE_SIZE: u32 = 500;

/// Every block and every Node as the routes read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cluster {
    pub blocks: Vec<BlockOwner>,
    pub nodes: Vec<NodeAddrs>,
}

enum Change {
    Block(Box<Event<api::IPAMBlock>>),
    Node(Box<Event<Node>>),
}

/// All blocks and Nodes as the watch sees them. Cheap to clone; the watch stops with the
/// last clone.
#[derive(Clone)]
pub struct ClusterWatch {
    running: Arc<Running<watch::Sender<Option<Arc<Cluster>>>>>,
}

impl std::fmt::Debug for ClusterWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterWatch")
            .field("listed", &self.current().is_some())
            .finish()
    }
}

impl ClusterWatch {
    /// Starts watching every IPAMBlock and Node through `client` (on the current runtime).
    pub fn start(client: kube::Client) -> Self {
        let shared = Arc::new(watch::Sender::new(None));
        let blocks: Api<api::IPAMBlock> = Api::all(client.clone());
        let nodes: Api<Node> = Api::all(client);
        let config = watcher::Config::default().page_size(PAGE_SIZE);
        let events = futures::stream::select(
            watch_objects(blocks, config.clone())
                .default_backoff()
                .map_ok(|e| Change::Block(Box::new(e))),
            watch_objects(nodes, config)
                .default_backoff()
                .map_ok(|e| Change::Node(Box::new(e))),
        );
        let task = tokio::spawn(drive(shared.clone(), events));
        Self {
            running: Arc::new(Running { shared, task }),
        }
    }

    /// What is seen, once both first lists are done (`None` before: routes are not
    /// concluded from objects not listed yet).
    pub fn current(&self) -> Option<Arc<Cluster>> {
        self.running.shared.borrow().clone()
    }

    /// Changes each time [`Self::current`] does.
    pub fn changes(&self) -> watch::Receiver<Option<Arc<Cluster>>> {
        self.running.shared.subscribe()
    }
}

async fn drive(
    shared: Arc<watch::Sender<Option<Arc<Cluster>>>>,
    events: impl Stream<Item = Result<Change, watcher::Error>> + Send,
) {
    let mut blocks: Listed<BlockOwner> = Listed::default();
    let mut nodes: Listed<NodeAddrs> = Listed::default();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let moved = match event {
            Ok(Change::Block(e)) => on_event(&mut blocks, *e, block_owner),
            Ok(Change::Node(e)) => on_event(&mut nodes, *e, |n| Some(node_addrs(n))),
            Err(e) => {
                tracing::warn!(error = %e, "watch of blocks and Nodes failed; retrying");
                false
            }
        };
        if moved && blocks.listed() && nodes.listed() {
            let next = Cluster {
                blocks: blocks.values().cloned().collect(),
                nodes: nodes.values().cloned().collect(),
            };
            // Nodes change often (conditions, images): wake the routes only when what they
            // read changed
            shared.send_if_modified(|seen| {
                let same = seen.as_deref() == Some(&next);
                if !same {
                    *seen = Some(Arc::new(next));
                }
                !same
            });
        }
    }
    tracing::error!(
        "{}",
        KubeError::WatchEnded {
            what: "IPAMBlocks and Nodes"
        }
    );
}

fn block_owner(o: &api::IPAMBlock) -> Option<BlockOwner> {
    match block_from_api(o) {
        Ok(b) => Some(BlockOwner {
            cidr: b.cidr,
            node: b.node.to_string(),
            node_uid: b.node_uid,
        }),
        Err(bad) => {
            for m in bad {
                tracing::warn!(%m, "unreadable block: not routed");
            }
            None
        }
    }
}

/// A Node as the routes read it: its UID and its InternalIPs, in the order listed.
pub(crate) fn node_addrs(n: &Node) -> NodeAddrs {
    let internal = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .collect();
    NodeAddrs {
        name: n.metadata.name.clone().unwrap_or_default(),
        uid: n.metadata.uid.as_deref().and_then(parse_uid).map(NodeUid),
        internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_node_projects_to_its_uid_and_internal_ips() {
        let n: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": "n1", "uid": "0a0a0a0a-0000-4000-8000-00000000000a" },
            "status": { "addresses": [
                { "type": "Hostname", "address": "n1" },
                { "type": "InternalIP", "address": "192.168.77.1" },
                { "type": "ExternalIP", "address": "203.0.113.1" },
                { "type": "InternalIP", "address": "fd77::1" },
                { "type": "InternalIP", "address": "nonsense" },
            ]},
        }))
        .unwrap();
        let a = node_addrs(&n);
        assert_eq!(a.name, "n1");
        assert_eq!(
            a.uid.map(|u| u.to_string()).as_deref(),
            Some("0a0a0a0a-0000-4000-8000-00000000000a")
        );
        let want: Vec<IpAddr> = vec!["192.168.77.1".parse().unwrap(), "fd77::1".parse().unwrap()];
        assert_eq!(a.internal, want);
    }
}
