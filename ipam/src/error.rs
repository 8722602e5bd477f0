//! The crate's one error enum and the retry classes the runtime acts on.

use crate::types::ResourceVersion;
use std::time::Duration;

/// How the runtime reacts to a failed call (DESIGN.md, "Backoff").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The API asked us to slow down: wait max(Retry-After, backoff).
    Throttled { retry_after: Option<Duration> },
    /// Try again after the node's backoff.
    Transient,
    /// The source has nothing left for this node: park until the pool frees (no polling).
    Exhausted,
    /// Bad spec: no retry until the spec or the pool changes.
    Permanent,
}

/// Errors of the engine crate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IpamError {
    /// A watermark combination that cannot be satisfied; names the offending field.
    #[error("invalid watermarks: {field} = {value}: {reason}")]
    InvalidWatermarks {
        field: &'static str,
        value: String,
        reason: String,
    },
    /// A configuration value out of range; names the setting.
    #[error("invalid setting {name} = {value}: {reason}")]
    InvalidSetting {
        name: &'static str,
        value: String,
        reason: String,
    },
    /// A call to the IP source failed.
    #[error("ip source {op} failed for node {node}: {message}")]
    Source {
        op: &'static str,
        node: String,
        class: ErrorClass,
        message: String,
    },
    /// A write or read of the node store failed.
    #[error("node store {op} failed for {name}: {message}")]
    Store {
        op: &'static str,
        name: String,
        class: ErrorClass,
        message: String,
    },
    /// A write lost an optimistic-concurrency race (HTTP 409).
    #[error("conflict writing {name}: resourceVersion {expected} is stale")]
    Conflict {
        name: String,
        expected: ResourceVersion,
    },
    /// A create found an object of that name (HTTP 409 AlreadyExists).
    #[error("{name} already exists")]
    AlreadyExists { name: String },
    /// The object is gone (HTTP 404).
    #[error("{name} not found")]
    NotFound { name: String },
    /// The pod view could not answer.
    #[error("pod lookup failed: {0}")]
    PodView(String),
    /// The engine does not hold the lead; no mutating call was made.
    #[error("not the leader")]
    NotLeader,
}

impl IpamError {
    /// The retry class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            IpamError::InvalidWatermarks { .. } | IpamError::InvalidSetting { .. } => {
                ErrorClass::Permanent
            }
            IpamError::Source { class, .. } | IpamError::Store { class, .. } => *class,
            IpamError::Conflict { .. }
            | IpamError::AlreadyExists { .. }
            | IpamError::NotFound { .. }
            | IpamError::PodView(_)
            | IpamError::NotLeader => ErrorClass::Transient,
        }
    }
}
