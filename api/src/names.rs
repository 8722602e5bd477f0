//! Names both binaries and the deploy bundle must agree on.

/// The API group of every tidepool resource.
pub const GROUP: &str = "ipam.tidepool.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";

/// Field manager of every operator replica's server-side applies (one for all replicas, so
/// a new leader can remove an old leader's entries).
pub const OPERATOR_MANAGER: &str = "tidepool-operator";
/// Field manager of the node agent's writes.
pub const AGENT_MANAGER: &str = "tidepool-agent";

/// The operator's finalizer on every IPAMBlock and IPAMNode: the object goes only once the
/// node side has let go of its addresses.
pub const FINALIZER: &str = "ipam.tidepool.dev/in-use";

/// The taint (effect `NoSchedule`) a Node gets with `--taint-exhausted-nodes` while its
/// IPAMNode is `Blocked` because it cannot get more addresses: the scheduler knows nothing
/// of IP capacity otherwise.
pub const EXHAUSTED_TAINT: &str = "ipam.tidepool.dev/exhausted";

/// Condition types, spelled by the engine's [`ConditionType`] (one source of truth: a reader
/// that matches on the enum sees a rename at once).
pub mod condition {
    use tidepool_ipam::ConditionType;

    /// IPAMNode (operator): the pool meets its watermarks.
    pub const POOL_READY: &str = ConditionType::PoolReady.as_str();
    /// IPAMNode (operator): no new addresses for a reason (exhausted, at its cap, duplicate,
    /// invalid watermarks, cordoned, terminating: [`tidepool_ipam::Blocked`]).
    pub const BLOCKED: &str = ConditionType::Blocked.as_str();
    /// IPAMNode (operator): the per-node watermark overrides are valid (`False` stops claims
    /// and marks until `spec.watermarks` changes).
    pub const WATERMARKS_VALID: &str = ConditionType::WatermarksValid.as_str();
    /// IPAMNode (operator): on its way out, it waits (the reason says for what:
    /// [`tidepool_ipam::DeletionWait`]).
    pub const DELETING: &str = ConditionType::Deleting.as_str();
    /// IPAMNode (node side): the agent serves its node.
    pub const AGENT_READY: &str = ConditionType::AgentReady.as_str();
    /// IPPool (operator): the pool is valid (no overlap with an older pool, block sizes
    /// fit).
    pub const VALID: &str = ConditionType::Valid.as_str();
    /// IPPool (operator): the pool is scarce; its nodes' warm pools give way (the reason
    /// and message say for which families, at what pressure).
    pub const SCARCE: &str = ConditionType::Scarce.as_str();
}

/// Event reasons, spelled by the engine's [`EventReason`](tidepool_ipam::EventReason).
pub mod reason {
    use tidepool_ipam::EventReason;

    pub const GARBAGE_COLLECTED: &str = EventReason::GarbageCollected.as_str();
    pub const GARBAGE_COLLECTION_FAILED: &str = EventReason::GarbageCollectionFailed.as_str();
    pub const DUPLICATE: &str = EventReason::Duplicate.as_str();
    pub const INVALID_WATERMARKS: &str = EventReason::InvalidWatermarks.as_str();
    pub const POOL_EXHAUSTED: &str = EventReason::PoolExhausted.as_str();
    /// See [`EventReason::StrayBlock`].
    pub const STRAY_BLOCK: &str = EventReason::StrayBlock.as_str();
    pub const INVALID_POOL: &str = EventReason::InvalidPool.as_str();
    /// See [`EventReason::AgentNotReady`].
    pub const AGENT_NOT_READY: &str = EventReason::AgentNotReady.as_str();
    /// See [`EventReason::ApplyConflict`].
    pub const APPLY_CONFLICT: &str = EventReason::ApplyConflict.as_str();
}
