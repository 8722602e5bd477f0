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

/// Condition types.
pub mod condition {
    /// IPAMNode (operator): the pool meets its watermarks.
    pub const POOL_READY: &str = "PoolReady";
    /// IPAMNode (operator): no new addresses for a reason (exhausted, at its cap, duplicate,
    /// invalid watermarks, cordoned, terminating).
    pub const BLOCKED: &str = "Blocked";
    /// IPAMNode (operator): the per-node watermark overrides are valid (`False` stops claims
    /// and marks until `spec.watermarks` changes).
    pub const WATERMARKS_VALID: &str = "WatermarksValid";
    /// IPAMNode (node side): the agent serves its node.
    pub const AGENT_READY: &str = "AgentReady";
    /// IPPool (operator): the pool is valid (no overlap with an older pool, block sizes
    /// fit).
    pub const VALID: &str = "Valid";
}

/// Event reasons.
pub mod reason {
    pub const GARBAGE_COLLECTED: &str = "IPAddressGarbageCollected";
    pub const GARBAGE_COLLECTION_FAILED: &str = "IPAddressGarbageCollectionFailed";
    pub const DUPLICATE: &str = "IPAddressDuplicate";
    pub const INVALID_WATERMARKS: &str = "InvalidWatermarks";
    /// On an IPAMNode (Warning): pods on its node have waited for an address longer than
    /// `--agent-ready-grace` and its agent is not `AgentReady=True` (never started, or
    /// not ready for the reason given).
    pub const AGENT_NOT_READY: &str = "AgentNotReady";
    /// On an IPAMNode or IPAMBlock (Warning): the operator's apply was refused because
    /// another field manager owns a field it writes. It is not retried until the object
    /// changes (the operator forces its applies, so this means something else is wrong).
    pub const APPLY_CONFLICT: &str = "ApplyConflict";
}
