//! The words the engine writes into objects and events: condition types, condition reasons
//! (the `Blocked` ones among them) and event reasons. `tidepool_api::names` spells its
//! strings from these, and readers (the taint keeper) match on them, so a rename reaches
//! every reader at once.

use std::fmt;

/// Why a node gets no new addresses (the `Blocked` condition's reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// The source has nothing left for it (woken when the pool frees).
    Exhausted,
    /// Its pool is Invalid (the IPPool's `Valid` condition says why; woken when the pools
    /// change).
    PoolInvalid,
    /// Its cap (max_allocate or allocatable pods) leaves no room.
    AtCap,
    Cordoned,
    Terminating,
    /// Its watermarks are invalid (no retry until the spec changes).
    InvalidSpec,
    /// Repair found one of its addresses held by another live node too (never fixed
    /// automatically; blocked until an operator resolves it).
    Duplicate,
    /// Only pools other than the node's default ones are blocked (`status.poolUsage`
    /// names them): their pods wait, the node's others do not, so no taint.
    Pools,
}

impl Blocked {
    pub const ALL: [Blocked; 8] = [
        Blocked::Exhausted,
        Blocked::PoolInvalid,
        Blocked::AtCap,
        Blocked::Cordoned,
        Blocked::Terminating,
        Blocked::InvalidSpec,
        Blocked::Duplicate,
        Blocked::Pools,
    ];

    /// The short word for reports and messages (`exhausted`, `at-capacity`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Blocked::Exhausted => "exhausted",
            Blocked::PoolInvalid => "pool-invalid",
            Blocked::AtCap => "at-capacity",
            Blocked::Cordoned => "cordoned",
            Blocked::Terminating => "terminating",
            Blocked::InvalidSpec => "invalid-spec",
            Blocked::Duplicate => "duplicate",
            Blocked::Pools => "pools-blocked",
        }
    }

    /// The `Blocked` condition's reason (`Exhausted`, `AtCapacity`, …).
    pub fn reason(self) -> &'static str {
        match self {
            Blocked::Exhausted => "Exhausted",
            Blocked::PoolInvalid => "PoolInvalid",
            Blocked::AtCap => "AtCapacity",
            Blocked::Cordoned => "Cordoned",
            Blocked::Terminating => "Terminating",
            Blocked::InvalidSpec => "InvalidSpec",
            Blocked::Duplicate => "Duplicate",
            Blocked::Pools => "PoolsBlocked",
        }
    }

    /// The node cannot get more addresses however long it waits for a pod to go: its pool
    /// is exhausted or it is at its cap (what the exhaustion taint stands for).
    pub fn out_of_addresses(self) -> bool {
        matches!(self, Blocked::Exhausted | Blocked::AtCap)
    }
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an IPAMNode on its way out waits for (the `Deleting` condition's reason):
/// DESIGN.md "Reclaim", whole-node reclaim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletionWait {
    /// The IPAMNode was deleted while its Node exists: the finalizer holds it until the
    /// Node goes and its addresses are reclaimed.
    NodeExists,
    /// Its Node is gone, but pods that are not terminal are still bound to the node name.
    PodsStillBound,
    /// Its Node is gone: `node_reclaim_grace` has not passed since its deletion (and the
    /// source does not say the machine is gone).
    ReclaimGrace,
}

impl DeletionWait {
    pub const ALL: [DeletionWait; 3] = [
        DeletionWait::NodeExists,
        DeletionWait::PodsStillBound,
        DeletionWait::ReclaimGrace,
    ];

    /// The `Deleting` condition's reason.
    pub fn reason(self) -> &'static str {
        match self {
            DeletionWait::NodeExists => "NodeExists",
            DeletionWait::PodsStillBound => "PodsStillBound",
            DeletionWait::ReclaimGrace => "WaitingForReclaimGrace",
        }
    }
}

/// Condition types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionType {
    /// IPAMNode (operator): the pool meets its watermarks.
    PoolReady,
    /// IPAMNode (operator): no new addresses for a reason ([`Blocked`]).
    Blocked,
    /// IPAMNode (operator): the per-node watermark overrides are valid (`False` stops claims
    /// and marks until `spec.watermarks` changes).
    WatermarksValid,
    /// IPAMNode (operator): on its way out (deleted, or its Node is), it waits for
    /// [`DeletionWait`].
    Deleting,
    /// IPAMNode (node side): the agent serves its node.
    AgentReady,
    /// IPPool (operator): the pool is valid (no overlap with an older pool, block sizes fit).
    Valid,
    /// IPPool (operator): the pool is scarce (its pressure reached `--scarcity-enter`); its
    /// nodes' warm pools give way.
    Scarce,
}

impl ConditionType {
    /// The condition types the operator writes on an IPAMNode (the others are not its own).
    pub const OPERATOR: [ConditionType; 4] = [
        ConditionType::PoolReady,
        ConditionType::Blocked,
        ConditionType::WatermarksValid,
        ConditionType::Deleting,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ConditionType::PoolReady => "PoolReady",
            ConditionType::Blocked => "Blocked",
            ConditionType::WatermarksValid => "WatermarksValid",
            ConditionType::Deleting => "Deleting",
            ConditionType::AgentReady => "AgentReady",
            ConditionType::Valid => "Valid",
            ConditionType::Scarce => "Scarce",
        }
    }
}

impl fmt::Display for ConditionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reason of a condition the operator writes on an IPAMNode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionReason {
    /// `Blocked`: why the node gets no new addresses.
    Blocked(Blocked),
    /// `WatermarksValid=False`.
    InvalidWatermarks,
    /// `Deleting=True`: what the IPAMNode's deletion waits for.
    Deleting(DeletionWait),
    /// `PoolReady=True`.
    AtTarget,
    /// A reason read back that this build does not write (an older operator's); the next
    /// write replaces it.
    Unknown,
}

impl ConditionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionReason::Blocked(b) => b.reason(),
            ConditionReason::InvalidWatermarks => "InvalidWatermarks",
            ConditionReason::Deleting(w) => w.reason(),
            ConditionReason::AtTarget => "AtTarget",
            ConditionReason::Unknown => "Unknown",
        }
    }

    /// The reason a condition read back names (`Unknown` for one this build does not write).
    pub fn parse(s: &str) -> ConditionReason {
        let mut known = Blocked::ALL
            .into_iter()
            .map(ConditionReason::Blocked)
            .chain(DeletionWait::ALL.into_iter().map(ConditionReason::Deleting))
            .chain([
                ConditionReason::InvalidWatermarks,
                ConditionReason::AtTarget,
            ]);
        known
            .find(|r| r.as_str() == s)
            .unwrap_or(ConditionReason::Unknown)
    }
}

impl fmt::Display for ConditionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Kubernetes event reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventReason {
    /// A reclaimed address (on the pod and its IPAMNode), or a deleted node's addresses.
    GarbageCollected,
    /// A reclaim the node side refused, or a tombstone that could not be written.
    GarbageCollectionFailed,
    /// An address held by two live nodes (repair never fixes it).
    Duplicate,
    /// A node's watermark overrides are invalid.
    InvalidWatermarks,
    /// A node needs addresses and its pool has none left.
    PoolExhausted,
    /// On an IPAMNode (Warning): a block addressed to its node that its pool cannot use as
    /// one of its blocks (another size, host bits: made by hand) is left out.
    StrayBlock,
    /// On an IPPool (Warning): it became invalid (an overlap, a block size that does not fit).
    InvalidPool,
    /// On an IPAMNode (Warning): pods on its node have waited for an address longer than
    /// `--agent-ready-grace` and its agent is not `AgentReady=True` (never started, or
    /// not ready for the reason given).
    AgentNotReady,
    /// On an IPAMNode or IPAMBlock (Warning): the operator's apply was refused because
    /// another field manager owns a field it writes. It is not retried until the object
    /// changes (the operator forces its applies, so this means something else is wrong).
    ApplyConflict,
    /// On a pod (Warning): it waits for a pool it gets no address of: its annotation names
    /// a pool it may not use, or the pool has none left for its node.
    PoolUnavailable,
    /// On an IPPool (Warning): it became scarce; its nodes' warm pools give way.
    PoolScarce,
    /// On an IPPool (Normal): it is no longer scarce; the watermarks are back.
    PoolScarcityEnded,
}

impl EventReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            EventReason::GarbageCollected => "IPAddressGarbageCollected",
            EventReason::GarbageCollectionFailed => "IPAddressGarbageCollectionFailed",
            EventReason::Duplicate => "IPAddressDuplicate",
            EventReason::InvalidWatermarks => "InvalidWatermarks",
            EventReason::PoolExhausted => "PoolExhausted",
            EventReason::StrayBlock => "StrayBlock",
            EventReason::InvalidPool => "InvalidPool",
            EventReason::AgentNotReady => "AgentNotReady",
            EventReason::ApplyConflict => "ApplyConflict",
            EventReason::PoolUnavailable => "PoolUnavailable",
            EventReason::PoolScarce => "PoolScarce",
            EventReason::PoolScarcityEnded => "PoolScarcityEnded",
        }
    }
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_written_reason_reads_back_as_itself() {
        for b in Blocked::ALL {
            let r = ConditionReason::Blocked(b);
            assert_eq!(ConditionReason::parse(r.as_str()), r);
            assert_eq!(r.to_string(), b.reason());
        }
        for r in [
            ConditionReason::InvalidWatermarks,
            ConditionReason::AtTarget,
        ] {
            assert_eq!(ConditionReason::parse(&r.to_string()), r);
        }
        for w in DeletionWait::ALL {
            let r = ConditionReason::Deleting(w);
            assert_eq!(ConditionReason::parse(r.as_str()), r);
        }
        assert_eq!(ConditionReason::parse("Gone"), ConditionReason::Unknown);
        assert_eq!(
            ConditionReason::parse("exhausted"),
            ConditionReason::Unknown,
            "the report's word is not the condition's reason"
        );
    }

    #[test]
    fn only_exhausted_and_at_cap_are_out_of_addresses() {
        let out: Vec<Blocked> = Blocked::ALL
            .into_iter()
            .filter(|b| b.out_of_addresses())
            .collect();
        assert_eq!(out, [Blocked::Exhausted, Blocked::AtCap]);
    }
}
