//! `--node-routes` (DESIGN.md "Datapath"; host-gw style, for nodes on one L2 segment): for
//! every other node's IPAMBlock, a route `<block CIDR> via <that node's InternalIP>` in the
//! agent's network namespace, removed when the block goes or the node's InternalIP changes.
//! Off by default: when the network already routes the blocks (cloud routes, BGP) it is not
//! needed.
//!
//! It touches only routes it owns: those marked with [`PROTOCOL`] in the main table. At
//! start (and every cycle) owned routes that should not exist are deleted, so a restart
//! converges; stopping the agent leaves the routes in place (pods keep reaching each other
//! while it restarts).
//!
//! - [`desired`]: the pure part — the routes wanted from the blocks and Nodes, and the diff
//!   against the owned routes present.
//! - [`netlink`]: the kernel's routes (rtnetlink), in the agent's namespace or a given one.
//! - [`manager`]: the loop — on every change of the blocks and Nodes
//!   ([`crate::kube::ClusterWatch`]) and every [`Config::interval`] (to repair routes
//!   someone removed): list, diff, delete, add; counted in `tidepool_agent_node_route*`.

pub mod desired;
pub mod manager;
pub mod netlink;

pub use desired::{BlockOwner, Diff, NodeAddrs, Route, Skipped, desired, diff};
pub use manager::{Config, NodeRoutes};
pub use netlink::RouteTable;

/// The route protocol that marks the agent's routes (`proto 0x7d`, 125). Free in iproute2's
/// `/etc/iproute2/rt_protos` (which names 0–4, 8–16, 18, 42, 99, 186–192) and in the
/// kernel's `RTPROT_*` list (which adds 17, mrouted), and not used by the usual peers
/// (BIRD 12, Calico's Felix 80, kube-router 17 as zebra/bird): `ip route show proto 0x7d`
/// lists them.
pub const PROTOCOL: u8 = 0x7d;
