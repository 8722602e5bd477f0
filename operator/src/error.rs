//! The operator crate's one error enum.

use std::net::SocketAddr;
use std::time::Duration;

/// Errors of the operator's library half.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--node-selector` could not be parsed or uses what is not supported; names the
    /// whole input and the requirement at fault.
    #[error("invalid --node-selector {input:?}: {reason}")]
    NodeSelector { input: String, reason: String },
    /// A watch did not complete its first list in time.
    #[error(
        "{resources} did not sync within {after:?} (is the API server reachable, are the CRDs installed, may the operator list them?)"
    )]
    NotSynced { resources: String, after: Duration },
    /// A listener could not be bound.
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// `check` could not list a resource.
    #[error(
        "cannot list {resource} (is the API server reachable, are the CRDs installed, may this identity list them?)"
    )]
    List {
        resource: &'static str,
        #[source]
        source: kube::Error,
    },
    /// `check`'s list of a resource did not finish in time.
    #[error("listing {resource} did not finish within {after:?}")]
    ListTimedOut {
        resource: &'static str,
        after: Duration,
    },
    /// The engine refused its configuration.
    #[error(transparent)]
    Engine(#[from] tidepool_ipam::IpamError),
}
