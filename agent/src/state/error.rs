//! The one error type of the node state.

use std::io;
use std::path::PathBuf;

use tidepool_ipam::node::Refused;

use super::model::AllocKey;

/// What can go wrong with the node's durable state. A corrupt checkpoint is not an error
/// (it is set aside and reported in [`super::Loaded`]); a checkpoint of a format this agent
/// does not read is, because misreading it could hand out an address a pod holds.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "another tidepool-agent holds the lock on {path}{holder}: one agent per node \
         (a DaemonSet surge or an old agent still terminating?); refusing to share its checkpoint"
    )]
    Locked { path: PathBuf, holder: String },

    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "checkpoint {path} is format version {version} (readable by agents of format \
         {min_reader} and later); this agent reads formats {oldest} to {current}: refusing to \
         start rather than misread it (run an agent that reads it, or move the file aside to \
         rebuild the node's state from the server)"
    )]
    UnsupportedVersion {
        path: PathBuf,
        version: u32,
        min_reader: u32,
        oldest: u32,
        current: u32,
    },

    #[error("the boot ID in {path} is empty")]
    EmptyBootId { path: PathBuf },

    #[error("encode the checkpoint: {0}")]
    Encode(#[source] serde_json::Error),

    /// `ipam`'s node side refused an allocation (see `tidepool_ipam::node::Refused`).
    #[error("{0}")]
    Refused(String),

    #[error("{0:?} is not a pod UID (a UUID)")]
    BadPodUid(String),
}

impl StateError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| StateError::Io { op, path, source }
    }
}

impl From<Refused<AllocKey>> for StateError {
    fn from(r: Refused<AllocKey>) -> Self {
        let why = match r {
            Refused::KeyHeldByOtherPod { owner } => {
                format!("the allocation belongs to pod {owner}")
            }
            Refused::NoFreeAddress { family } => {
                format!("no free {} address in the node's pool", family.as_str())
            }
            Refused::BadAddresses => "an allocation needs one address or more, each once".into(),
            Refused::KeyRecordedTwice => "an allocation is recorded twice".into(),
            Refused::AddressInUse { addr, holder } => format!(
                "address {addr} is held by allocation ({}, {})",
                holder.container_id, holder.ifname
            ),
            Refused::AddressCooling { addr } => format!("address {addr} is cooling down"),
        };
        StateError::Refused(why)
    }
}

/// Short for this module's results.
pub type Result<T, E = StateError> = std::result::Result<T, E>;
