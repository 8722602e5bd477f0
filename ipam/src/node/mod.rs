//! The node side's rules (DESIGN.md "Resources", the node side's promises), run both by the
//! simulated world and by the node agent: one [`NodeSide<K>`], generic over the allocation
//! key (the simulator's 64-bit [`AllocationId`](crate::AllocationId); the agent's
//! (containerID, ifname) strings). It allocates to pods from the node's pool and answers
//! the operator's release marks and tombstones; its maps are private, so every change goes
//! through its methods. Pure: time is passed in; the caller saves and publishes.
//!
//! - [`NodeSide::add`] allocates from the pool (the node's blocks, see [`project`], or
//!   `spec.addresses` for cloud sources), never an address used, cooling down, marked,
//!   released or excluded (gateways, live pods' addresses); a repeated ADD of a key returns
//!   what it got the first time; [`NodeSide::adopt`] records given addresses with the same
//!   guards;
//! - [`NodeSide::del`] frees only the exact allocation: idempotent, and a stale DEL (the
//!   key of another pod) frees nothing (kuryr's rule; Calico #1406, Cilium #10065);
//! - [`NodeSide::answer_tombstones`] (`reclaimed` only for the exact allocation, and `live`
//!   for the running sandbox of a pod the node side sees: [`NodeSide::tombstone_outcome`]),
//!   [`NodeSide::answer_marks`] (address marks), [`NodeSide::answer_blocks`] (block marks,
//!   cluster-pool), [`NodeSide::forget_outside`] and [`NodeSide::expire_boot`] answer the
//!   operator and end what is over; [`NodeSide::tidy`] drops ended cooldowns and settled
//!   answers only when the record is written anyway (they need no write of their own);
//! - [`NodeSide::gc`] frees what a CNI GC of one network no longer lists, never an
//!   allocation of another network or an unknown one;
//! - [`NodeSide::published`] is the record as `status.used` and the acks carry it.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::addrs::AddrSet;
use crate::types::{IpamNode, NodeSideFields, PodUid, ReleaseAck, ReleaseState};

mod answers;
mod published;
mod record;
mod side;

pub use record::{Record, RecordedAllocation};
pub use side::{Added, DelOutcome, Held, Key, Network, NodeSide, Owner, ReclaimAnswer, Refused};

/// The longest reuse cooldown (1 h): the agent's and the operator's `--reuse-cooldown` take
/// at most this, and [`NodeSide::new`] cuts a longer one to it, so no cooldown's end can
/// overflow the clock.
pub const MAX_REUSE_COOLDOWN: Duration = Duration::from_secs(3600);

/// What an answer changed that the observer must know.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Answers {
    /// Addresses answered ready-for-release: the node will not use them again.
    pub ready: AddrSet,
    /// Addresses whose ready-for-release was withdrawn by the operator: usable again.
    pub resumed: AddrSet,
    /// Entries removed by a tombstone (pod UID, address).
    pub reclaimed: Vec<(PodUid, IpAddr)>,
}

/// One of the node's blocks as the node side reads it (cluster-pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockView {
    pub name: Arc<str>,
    /// The block's usable addresses.
    pub addrs: AddrSet,
    /// Every address of the block (what the observer tracks).
    pub all: AddrSet,
    pub release: bool,
    pub ack: Option<ReleaseAck>,
}

/// The node as its blocks make it (cluster-pool): its pool is the union of its blocks, and
/// a marked block's addresses count as marked — the form [`NodeSide::add`] reads.
pub fn project(node: &IpamNode, blocks: &[BlockView]) -> IpamNode {
    let mut view = IpamNode {
        operator: crate::types::OperatorFields {
            reclaim: node.operator.reclaim.clone(),
            ..Default::default()
        },
        node: NodeSideFields::default(),
        ..node.clone()
    };
    for b in blocks {
        Arc::make_mut(&mut view.operator.addresses).union_with(&b.addrs);
        if b.release || b.ack.is_some() {
            view.operator
                .release
                .insert_set(&b.addrs, ReleaseState::MarkedForRelease);
        }
    }
    view
}

#[cfg(test)]
mod tests;
