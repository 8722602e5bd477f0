//! The operator crate's one error enum.

use std::net::SocketAddr;
use std::time::Duration;

/// Errors of the operator's library half.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A label selector (`--node-selector`, `--agent-pod-selector`) could not be parsed or
    /// uses what is not supported; names the whole input and the requirement at fault.
    #[error("invalid label selector {input:?}: {reason}")]
    Selector { input: String, reason: String },
    /// A watch made no progress on its first list for the sync timeout.
    #[error(
        "{resources} did not sync: no page or event for {after:?} (is the API server reachable, are the CRDs installed, may the operator list them?)"
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
    /// The engine refused its configuration.
    #[error(transparent)]
    Engine(#[from] tidepool_ipam::IpamError),
    /// The leader-election flags do not fit together; names the flags at fault.
    #[error("{reason}")]
    LeaderConfig { reason: String },
    /// The Lease's own client could not be built from the kube configuration.
    #[error("cannot build the Lease client")]
    LeaseClient(#[source] kube::Error),
    /// One Lease request failed (a 409 is not this: it is an answer, "someone else wrote").
    #[error("{op} Lease {lease}")]
    Lease {
        op: &'static str,
        /// `namespace/name`.
        lease: String,
        /// Boxed: the enum stays small for every other caller.
        #[source]
        source: Box<kube::Error>,
    },
    /// One acquire or renew attempt (its GET and its write) took longer than the Lease
    /// client's timeout (at most the renew deadline / 2).
    #[error("a Lease attempt took longer than {after:?}")]
    LeaseTimeout { after: Duration },
    /// This replica stopped leading without being asked to: the renew deadline passed with
    /// no successful renewal, or another replica holds the Lease. The binary exits non-zero
    /// so Kubernetes restarts it as a follower.
    #[error("leader election lost: {reason}")]
    LeadershipLost { reason: String },
    /// A write path asked to send while this replica does not lead (after the step-down
    /// instant, or before it ever led).
    #[error("not the leader: writes are refused after the step-down instant")]
    NotLeading,
}
