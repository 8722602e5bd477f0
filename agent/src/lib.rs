//! The node side made real (DESIGN.md "Node agent"): the agent that serves a node's pods
//! their addresses from the node's pool, and `tidepool-cni`, the CNI IPAM plugin that
//! forwards each CNI request to it (issue 15; being built).
//!
//! - [`cni`]: `tidepool-cni`, the CNI 1.1 IPAM plugin (std only: it starts once per pod), and
//!   the plugin ↔ agent socket protocol the agent serves ([`cni::proto`]).

pub mod cni;
