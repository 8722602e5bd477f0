//! The node side made real (DESIGN.md "Node agent"): the agent that serves a node's pods
//! their addresses from the node's pool, and `tidepool-cni`, the CNI IPAM plugin that
//! forwards each CNI request to it (issue 15; being built).
//!
//! - [`cni`]: `tidepool-cni`, the CNI 1.1 IPAM plugin (std only: it starts once per pod), and
//!   the plugin ↔ agent socket protocol the agent serves ([`cni::proto`]).
//! - [`state`]: the agent's durable node state — the lock on `--state-dir`, the checkpoint
//!   (allocations by (containerID, ifname), cooldowns, acks; saved with fsync before every
//!   answer), boot-scoped allocations and the DEL spool's reader.
//! - [`serve`]: the agent's socket server — each CNI request answered from the node's pool,
//!   durable in the checkpoint before the reply, then published (group commit: the requests
//!   made while a save runs share the next save; the publisher reads the saved copy); the
//!   DEL spool's replay.
//! - [`kube`]: the API-server side — the watch of the node's own IPAMNode and IPAMBlocks
//!   ([`kube::NodeWatch`]) and the batched server-side apply of the node side's fields
//!   ([`kube::Publisher`]).
//! - [`pods`]: the live pods on the node (UID, `status.podIPs`): their addresses are never
//!   handed out, and reconcile frees nothing they list.
//! - [`pool_choice`]: the pod's pool per family at ADD (pod, namespace, IPPools, node), as the
//!   operator resolves it, and the node's addresses outside it.
//! - [`reconcile`]: reconcile against the container runtime — an allocation whose sandbox
//!   is gone (netns directory, libcni's result cache, live pods; seen twice) is freed.
//! - [`routes`]: `--node-routes` — a route to every other node's blocks via its InternalIP
//!   (host-gw style), marked with a protocol of its own; only its own routes are touched.
//! - [`run`]: the agent's start-up order and lifetime, and its readiness.
//! - [`observe`]: the agent's metrics (`tidepool_agent_*`), recorded by the server, the
//!   state's changes and the publisher.
//! - [`error`]: the agent's error type.
//! - [`failpoint`]: named points where the crash tests stop the agent and kill it
//!   (`TIDEPOOL_FAILPOINTS`; for tests only, inert unless set): before and after each
//!   save of an ADD, a DEL and an answer to the operator, and before each publish.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod cni;
pub mod error;
pub mod failpoint;
pub mod kube;
pub mod masq;
pub mod observe;
pub mod pods;
pub mod pool_choice;
pub mod reconcile;
pub mod routes;
pub mod run;
pub mod serve;
pub mod state;
