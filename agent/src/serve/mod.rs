//! The agent's socket server (DESIGN.md "Node agent"): the plugin's requests
//! ([`crate::cni::proto`]) answered from the node's pool, each change durable in the
//! checkpoint before the answer, then published.
//!
//! - [`NodeSource`] and [`Publish`]: what the server needs from the API-server side (the
//!   kube layer implements them; [`MemoryNodeSource`] and [`CountingPublish`] for tests);
//! - [`Agent`]: the handlers over the shared [`crate::state::NodeState`] ([`SharedState`]) —
//!   one mutation at a time (a tokio mutex), answered once a save holding it is durable,
//!   then [`Publish::publish`]; the mutations made while a save runs share the next one
//!   (group commit, `commit.rs`; fsyncs on the blocking pool, one saver at a time), and the
//!   publisher reads the durable copy;
//! - [`Server`]: HTTP/1.1 over the unix socket (mode 0600, stale socket replaced);
//! - [`replay_spool`]: the DELs the plugin spooled while the agent was down;
//! - [`Agent::reconcile`]: reconcile against the runtime ([`crate::reconcile`]), its frees
//!   through DEL's path; its report at `GET /v1/reconcile`.
//!
//! # ADD
//! Repeated ADD of a (containerID, ifname) by the same pod returns what it got. Otherwise
//! one address per family the node's pool has (dual-stack: one of each, all or none), the
//! lowest free one by `ipam`'s `NodeSide::add` — never a gateway, nor an address a live pod
//! on the node lists ([`PodSource`]), whether or not the state holds it (both are its
//! `exclude` set), nor one outside the pod's pool of its family ([`crate::pool_choice`]:
//! chosen at ADD from the pod, its namespace, the IPPools and the node, or the pool of the
//! address the pod already holds; a pod that may use no pool gets code 11 naming the pool
//! and why, and the pool of each address is recorded for `status.used`). With
//! `--pod-network`, an address of a pool whose CIDR lies in no configured network fails the
//! ADD (code 7, naming it) and goes back, as before. An empty pool (or no IPAMNode read yet)
//! waits up to [`Config::empty_pool_wait`] for [`NodeSource::changes`] to bring an address,
//! then answers code 11. An ADD without a pod UID (a UUID) is refused: the UID is the
//! allocation's identity.
//!
//! # Gateway
//! The result has the shape that Debian's `ptp` 1.1.1 accepts ([`crate::cni::proto`]):
//! the pod address with its pod network's prefix length, that network's first host address
//! as the gateway (the same on every node: each host puts it on every pod's host-side veth),
//! and a default route. The pod networks (the pool CIDRs) are configuration
//! ([`PodNetworks`]). Each network's own address, gateway and (IPv4) broadcast address are
//! never handed to a pod by any agent, whichever node's block holds them: three addresses
//! per pool CIDR, not per block. The alternative — the first address of each block as its
//! gateway, with the block's prefix length — costs an address per block (1/16 of a /28),
//! and more: ptp's pod-side prefix then makes the block's last address a broadcast
//! address and its first one a network address, so those could not be given out either.
//! The price of the choice: every agent must be configured with the same pod networks, and
//! the gateway must also be unused outside tidepool (exclude it in the pool, too).

mod agent;
mod answer;
mod commit;
mod http;
mod reconcile;
mod request;
mod shape;
mod source;
mod spool;

pub use agent::{Agent, Config, DEFAULT_EMPTY_POOL_WAIT};
pub use answer::answer;
pub use commit::SharedState;
pub use http::{MAX_BODY_BYTES, Server};
pub use request::{CniRequest, Reply, UidArg};
pub use shape::{PodNetworks, gateway};
pub use source::{
    CountingPublish, MemoryNodeSource, MemoryPods, NoPods, NodeSource, PodSource, Publish,
};
pub use spool::{Replayed, replay_spool};
