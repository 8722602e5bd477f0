//! The agent's error type (the node state keeps its own, [`crate::state::StateError`],
//! wrapped here).

use std::io;
use std::path::PathBuf;

use crate::kube::KubeError;
use crate::state::StateError;

/// What can go wrong in the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    State(#[from] StateError),

    /// A group commit's save failed: every mutation it held gets this.
    #[error(transparent)]
    Save(#[from] std::sync::Arc<StateError>),

    #[error(transparent)]
    Kube(#[from] KubeError),

    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A route change or listing of `--node-routes` the kernel refused.
    #[error("netlink: {what}: {source}")]
    Netlink {
        what: String,
        #[source]
        source: rtnetlink::Error,
    },

    #[error("invalid agent configuration: {0}")]
    Config(String),

    #[error("a blocking task of the agent failed: {0}")]
    Task(String),
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Error::Io { op, path, source }
    }
}

/// Short for the agent's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
