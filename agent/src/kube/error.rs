//! The one error type of the API-server side (wrapped by the agent's own error type, as the
//! node state's is).

use std::time::Duration;

/// What can go wrong talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "IPAMNode {node} did not appear within {waited:?} (the operator creates it: is the \
         operator running, and does its --node-selector select this node?)"
    )]
    NodeMissing { node: String, waited: Duration },

    #[error(
        "the IPPools were not listed within {waited:?} (the agent allocates only from blocks \
         their pools grant: may it list and watch ippools? deploy/agent/rbac.yaml grants it)"
    )]
    PoolsNotListed { waited: Duration },

    #[error(
        "the pods on node {node} or the namespaces were not listed within {waited:?} (may \
         the agent list and watch pods and namespaces? deploy/agent/rbac.yaml grants it)"
    )]
    PodsNotListed { node: String, waited: Duration },

    #[error("the watch of {what} ended")]
    WatchEnded { what: &'static str },

    #[error("reading {object}: {source}")]
    Get {
        object: String,
        #[source]
        source: kube::Error,
    },

    #[error("server-side apply of {object}: {source}")]
    Apply {
        object: String,
        #[source]
        source: kube::Error,
    },
}
