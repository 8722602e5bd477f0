//! The `--node-routes` loop: whenever the blocks or Nodes change, and every
//! [`Config::interval`], the owned routes are listed, diffed against the desired ones and
//! changed; each add and delete is counted, and the owned routes gauged.

use std::path::PathBuf;
use std::time::Duration;

use tidepool_metrics as m;
use tokio::task::JoinHandle;

use super::desired::{Diff, Skipped, desired, diff};
use super::netlink::RouteTable;
use crate::error::Result;
use crate::kube::{Cluster, ClusterWatch};
use crate::observe;

/// How `--node-routes` runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The network namespace to manage (a path such as `/run/netns/<name>`); `None`: the
    /// agent's own (production).
    pub netns: Option<PathBuf>,
    /// How often the routes are checked without a change (repairs routes someone removed).
    pub interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            netns: None,
            interval: Duration::from_secs(30),
        }
    }
}

/// The running route manager; dropping it stops it (the routes stay).
#[derive(Debug)]
pub struct NodeRoutes {
    task: JoinHandle<()>,
}

impl Drop for NodeRoutes {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NodeRoutes {
    /// Opens the routing table, starts the watch of every block and Node through `client`,
    /// and keeps node `own`'s routes to the other nodes' blocks.
    pub async fn start(client: kube::Client, own: &str, config: Config) -> Result<Self> {
        if config.interval.is_zero() {
            return Err(crate::error::Error::Config(
                "the node-routes interval must be positive".into(),
            ));
        }
        let table = RouteTable::open(config.netns.as_deref()).await?;
        let watch = ClusterWatch::start(client);
        let task = tokio::spawn(keep(table, watch, own.to_string(), config.interval));
        Ok(Self { task })
    }
}

/// The loop: one pass per change and per `interval`, once both lists are done (before, the
/// desired set is unknown: nothing is deleted on a guess).
async fn keep(table: RouteTable, watch: ClusterWatch, own: String, interval: Duration) {
    let mut changes = watch.changes();
    let mut last_skipped = Vec::new();
    loop {
        // marks this version seen: `changed` wakes only for a newer one
        let seen = changes.borrow_and_update().clone();
        if let Some(cluster) = seen {
            match pass(&table, &cluster, &own).await {
                Ok(skipped) => {
                    if skipped != last_skipped {
                        for why in &skipped {
                            tracing::warn!(%why, "a block of another node is not routed");
                        }
                        last_skipped = skipped;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "node routes: listing the routes failed"),
            }
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// One pass: the desired routes, the owned ones present, the diff applied (deletes first).
/// A failed add or delete is logged and counted; the next pass retries it.
pub async fn pass(table: &RouteTable, cluster: &Cluster, own: &str) -> Result<Vec<Skipped>> {
    let (want, skipped) = desired(&cluster.blocks, &cluster.nodes, own);
    let present = table.list().await?;
    let d = diff(&want, &present);
    let (deleted, added) = apply(table, &d).await;
    observe::node_routes(present.len() + added - deleted);
    Ok(skipped)
}

/// Applies `d`; how many routes were deleted and added (those the kernel accepted).
async fn apply(table: &RouteTable, d: &Diff) -> (usize, usize) {
    let mut deleted = 0;
    for r in &d.delete {
        let done = table.delete(*r).await;
        observe::route_op(m::RouteOp::Delete, done.is_ok());
        match done {
            Ok(()) => {
                deleted += 1;
                tracing::info!(route = %r, "node route deleted");
            }
            Err(e) => tracing::warn!(route = %r, error = %e, "deleting a node route failed"),
        }
    }
    let mut added = 0;
    for r in &d.add {
        let done = table.add(*r).await;
        observe::route_op(m::RouteOp::Add, done.is_ok());
        match done {
            Ok(()) => {
                added += 1;
                tracing::info!(route = %r, "node route added");
            }
            Err(e) => tracing::warn!(route = %r, error = %e, "adding a node route failed"),
        }
    }
    (deleted, added)
}
