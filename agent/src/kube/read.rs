//! Direct reads from the server (not the watch's cache), for decisions that must not rest
//! on a cache: the rebuild after a corrupt checkpoint reads what the agent last published.

use kube::Api;
use tidepool_api as api;
use tidepool_api::convert::{NodeView, node_from_api};

use super::KubeError;

/// The IPAMNode `node` as the server has it now, read as the engine reads it (malformed
/// entries logged and skipped).
pub async fn read_node(client: &kube::Client, node: &str) -> Result<NodeView, KubeError> {
    let obj = Api::<api::IPAMNode>::all(client.clone())
        .get(node)
        .await
        .map_err(|source| KubeError::Get {
            object: format!("ipamnode/{node}"),
            source,
        })?;
    let (view, bad) = node_from_api(&obj);
    for m in bad {
        tracing::warn!(%m, "malformed entry skipped");
    }
    Ok(view)
}
