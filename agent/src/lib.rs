//! The node side made real (DESIGN.md "Node agent"): the agent that serves a node's pods
//! their addresses from the node's pool, and `tidepool-cni`, the CNI IPAM plugin that
//! forwards each CNI request to it (issue 15; being built).
//!
//! - [`state`]: the agent's durable node state — the lock on `--state-dir`, the checkpoint
//!   (allocations by (containerID, ifname), cooldowns, acks; saved with fsync before every
//!   answer), boot-scoped allocations and the DEL spool's reader.

pub mod state;
