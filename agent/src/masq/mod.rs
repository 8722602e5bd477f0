//! `--masquerade` (ip-masq-agent's rule, DESIGN.md "Datapath"): traffic from a pod to a
//! destination outside every pool CIDR and outside `--non-masquerade-cidrs` (the node
//! subnet, the service CIDR) leaves with the node's address; pod-to-pod traffic keeps its
//! source, as the Kubernetes network model requires. ptp's own `ipMasq` stays off: it would
//! NAT traffic between pods of different nodes too.
//!
//! One chain, [`CHAIN`], in the nat table of each family, replaced whole and atomically by
//! `iptables-restore --noflush` (only this chain is touched), and one jump to it from
//! `POSTROUTING`. Hand-written rather than through the `iptables` crate, which runs one
//! rule per command and cannot replace a chain atomically.
//!
//! - [`rules`]: the pure part — the restore input and the jump, from the pools' CIDRs.
//! - [`manager`]: the loop — on every change of the pools and every
//!   [`Config::interval`] (to repair a chain someone flushed).

pub mod manager;
pub mod rules;

pub use manager::{Config, Masquerade};

/// The nat chain the agent owns.
pub const CHAIN: &str = "TIDEPOOL-MASQ";
