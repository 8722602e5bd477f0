//! Node-lifecycle rules the manager runs from what it hears, with no wake-up while
//! nothing changes: IPAMNodes whose Node is gone (orphans), taken in once the Node
//! informer has listed; and the count refresh, woken by what may change a count.

use std::sync::Arc;
use std::time::Duration;

use super::NodeManager;
use crate::gate::Background;
use crate::pods::PodView;
use crate::shared::Shared;
use crate::source::IpSource;
use crate::store::{BlockStore, NodeStore};
use crate::types::{NodeInfo, NodeName};

#[cfg(test)]
mod tests;

/// How long the count refresh waits after a change before it writes (changes coming
/// together cost one write each), and between its tries while a write fails.
const COUNT_REFRESH_DELAY: Duration = Duration::from_secs(1);

impl<S: IpSource, N: NodeStore + BlockStore, P: PodView> NodeManager<S, N, P> {
    /// The Node informer has listed, and the Node changes so far are in: IPAMNodes whose
    /// Node `has_node` does not know (deleted while no replica led, or relabelled out of the
    /// node selector) are orphans. Each is taken as a Node added and deleted at once, so
    /// its whole-node reclaim runs under DESIGN.md's rule (no pod bound, the node grace
    /// passed) instead of its blocks staying held for ever. Returns the orphans' names.
    pub fn nodes_synced(&self, has_node: impl Fn(&str) -> bool) -> Vec<NodeName> {
        let mut orphans = Vec::new();
        for n in self.shared.store.list_nodes() {
            if has_node(&n.name) {
                continue;
            }
            tracing::info!(node = %n.name, "an IPAMNode without its Node: reclaimed after the node grace");
            if self.shared.nodes.lock().get(&n.name).is_none() {
                self.upsert_node(NodeInfo {
                    name: n.name.clone(),
                    uid: n.node_uid,
                    allocatable_pods: NodeInfo::DEFAULT_ALLOCATABLE_PODS,
                    cordoned: false,
                    terminating: true,
                });
            }
            self.delete_node(&n.name);
            orphans.push(n.name.clone());
        }
        orphans
    }
}

impl<S: IpSource, N: NodeStore, P: PodView> NodeManager<S, N, P> {
    /// Keeps each IPAMNode's recorded count of held addresses ([`NodeStore::stale_counts`])
    /// right, so `kubectl get ipamnodes` shows what each node holds: a second after
    /// something that may change a count (a pass, a store event, a resync that wrote; and
    /// the start), the stale ones are rewritten, retried each second while a write fails.
    /// Each write is admitted behind the nodes, only while leading. Asleep otherwise.
    pub fn spawn_count_refresh(&self) {
        self.shared.counts_may_change(); // counts left stale before this start
        let task = tokio::spawn(refresh_counts(self.shared.clone()));
        self.tasks.lock().push(task);
    }
}

/// The count refresh task ([`NodeManager::spawn_count_refresh`]).
async fn refresh_counts<S: IpSource, N: NodeStore, P: PodView>(shared: Arc<Shared<S, N, P>>) {
    let mut gate = Background::new(shared.kube_budget.clone(), shared.leader.clone());
    loop {
        shared.counts.notified().await;
        loop {
            tokio::time::sleep(COUNT_REFRESH_DELAY).await;
            if refresh_stale(&shared.store, &mut gate).await {
                break;
            }
        }
    }
}

/// Rewrites every stale count; whether all were written.
async fn refresh_stale<N: NodeStore>(store: &N, gate: &mut Background) -> bool {
    let mut written = true;
    for name in store.stale_counts() {
        if let Err(e) = store.refresh_count(&name, gate).await {
            tracing::warn!(node = %name, error = %e, "could not write the allocated count");
            written = false;
        }
    }
    written
}
