//! tidepool's IPAM engine.
//!
//! Pure planning ([`plan`], and inside the crate the watermarks, reclaim and handshake rules)
//! is kept apart from the runtime that executes plans (the [`NodeManager`] and its per-node
//! maintainers) through the traits [`IpSource`], [`NodeStore`], [`BlockStore`], [`PodView`]
//! and [`Clock`]. The node side's rules are in [`node`], the cluster-pool source in [`pool`].
//! No Kubernetes types and no HTTP here.
//!
//! The public surface is what the crate re-exports here plus the modules `addrs`, `node`,
//! `plan`, `pool` and `uid_table`; everything else is private.
#![cfg_attr(test, allow(clippy::too_many_lines))]
#![forbid(unsafe_code)]

pub mod addrs;
mod backoff;
mod budget;
mod clock;
mod config;
mod error;
mod gate;
mod handshake;
mod ip_wait;
mod maintainer;
mod manager;
pub mod node;
pub mod plan;
mod pods;
pub mod pool;
mod reclaim;
mod scarcity;
mod shared;
mod source;
mod stats;
mod store;
mod trigger;
mod types;
pub mod uid_table;
mod used;
mod vocab;
mod watermarks;

pub use addrs::{AddrMap, AddrSet};
pub use backoff::BackoffConfig;
pub use budget::{
    Admitted, Api, Budget, Pass, Priority, PriorityCell, SchedulingMode, TokioGovernorClock,
    TokioInstant,
};
pub use clock::{Clock, TokioClock};
pub use config::EngineConfig;
pub use error::{ErrorClass, IpamError};
pub use gate::{Background, Gate, Ungated};
pub use handshake::ReleaseConfig;
pub use manager::{EngineDeps, NodeManager};
pub use pods::{
    FnPods, MemoryPodView, PodCache, PodChanges, PodInfo, PodIps, PodPhase, PodView, Since,
};
/// The reclaim-candidate rule (DESIGN.md "Reclaim"), for read-only reports
/// (`tidepool-operator check`) that must judge `status.used` entries as the engine does.
pub use reclaim::{ReclaimConfig, candidate_reason};
pub use scarcity::{ScarcityConfig, Squeeze, Squeezes};
pub use shared::ScarcityState;
pub use source::{Faults, Holdings, IpSource, MemorySource, Quota, SourceHook};
pub use stats::{FamilyTotals, Stats};
pub use store::{
    BlockStore, EventType, MemoryNodeStore, NodeStore, ObjectKind, ReleaseMark, StoreEvent,
    StoreHook, Writer,
};
pub use types::{
    AllocationId, BlockedPool, Condition, Family, FewByAddr, IpamBlock, IpamNode, NodeInfo,
    NodeName, NodeSideFields, NodeUid, OperatorFields, PerFamily, PodName, PodUid, ReclaimAck,
    ReclaimOutcome, ReclaimReason, ReleaseAck, ReleaseState, ResourceVersion, Tombstone, UnixNanos,
    UsedEntry, UsedMap, WatermarkOverrides,
};
pub use vocab::{Blocked, ConditionReason, ConditionType, DeletionWait, EventReason};
pub use watermarks::Watermarks;
