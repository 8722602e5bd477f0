//! The agent's API-server side (DESIGN.md "Node agent", "Who writes what"): it watches only
//! its own node's objects and writes only the node side's fields.
//!
//! - [`NodeWatch`]: the node's IPAMNode (field selector `metadata.name`) and IPAMBlocks (the
//!   CRD's selectable field `spec.node`), only blocks whose `spec.nodeUID` is the IPAMNode's,
//!   projected as `ipam`'s node rules read a node; readiness, changes, and the start-up
//!   wait for the IPAMNode.
//! - [`Publisher`]: server-side apply under `tidepool-agent` of `status.used`,
//!   `status.cooldown`, `status.releaseAck`, `status.reclaimAck`, `status.inUse` and the
//!   `AgentReady` condition, and of each block's `status.releaseAck`; callers ask, one task
//!   writes the latest state, at most once per interval (batching under load), and again
//!   when the IPAMNode's UID changes.
//! - [`PodWatch`]: the pods bound to this node (field selector `spec.nodeName`), kept as
//!   [`crate::pods::LivePods`] (UID, terminal or not, `status.podIPs`) for the exclusion of
//!   live pods' addresses and for reconcile, and with the Namespaces, their labels and
//!   pools annotations for the pool choice at ADD.
//! - [`read_node`]: the IPAMNode read from the server, not the cache (the rebuild after a
//!   corrupt checkpoint).
//! - [`ClusterWatch`]: for `--node-routes` only, every IPAMBlock and every Node (UID and
//!   InternalIPs): the routes to the other nodes' blocks.
//! - [`body`]: the apply bodies, pure functions.
//!
//! The objects are read by [`tidepool_api::convert`], the same code as the operator's.

pub mod body;
mod cluster;
mod error;
mod pods;
mod publish;
mod read;
mod running;
mod view;
mod watch;

pub use body::{AgentReady, NodeSide, block_status_body, node_status_body};
pub use cluster::{Cluster, ClusterWatch};
pub use error::KubeError;
pub use pods::PodWatch;
pub use publish::{NodeSideSource, PublishConfig, Publisher};
pub use read::read_node;
pub use watch::NodeWatch;

/// The socket server reads the node as the watch projects it.
impl crate::serve::NodeSource for NodeWatch {
    fn node(&self) -> Option<std::sync::Arc<tidepool_ipam::IpamNode>> {
        self.current()
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        NodeWatch::changes(self)
    }

    fn pod_networks(&self) -> Option<std::sync::Arc<crate::serve::PodNetworks>> {
        Some(NodeWatch::pod_networks(self))
    }

    fn pool_choice(&self) -> Option<std::sync::Arc<crate::pool_choice::PoolChoice>> {
        NodeWatch::pool_choice(self)
    }
}

/// The socket server's "publish now" is the publisher's coalescing notify.
impl crate::serve::Publish for Publisher {
    fn publish(&self) {
        Publisher::publish(self);
    }
}

/// The socket server and reconcile read the node's live pods from the pod watch.
impl crate::serve::PodSource for PodWatch {
    fn live_pods(&self) -> Option<std::sync::Arc<crate::pods::LivePods>> {
        self.live()
    }

    fn subject(
        &self,
        uid: tidepool_ipam::PodUid,
        namespace: &str,
    ) -> tidepool_ipam::pool::choice::Subject {
        PodWatch::subject(self, uid, namespace)
    }
}
