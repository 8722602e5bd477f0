//! What the manager and its maintainers share: the I/O, the budgets, the leadership signal
//! and each node's handle. Apart from both so neither module depends on the other.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

mod nodes;
mod pool_step;

use nodes::NodeTable;

pub use pool_step::ScarcityState;
pub(crate) use pool_step::{PoolKey, PoolScarcity};

use crate::budget::{Api, Budget, Priority, PriorityCell};
use crate::clock::Clock;
use crate::config::EngineConfig;
use crate::plan::{LaneSummary, NodeSummary};
use crate::pods::PodView;
use crate::source::IpSource;
use crate::stats::Stats;
use crate::store::NodeStore;
use crate::trigger::{Reason, Trigger};
use crate::types::{NodeInfo, NodeName};

/// A node's place in the manager: its trigger, priority, Node state and last summary.
pub(crate) struct NodeHandle {
    pub name: NodeName,
    pub trigger: Trigger,
    pub priority: PriorityCell,
    pub state: Mutex<NodeState>,
    /// The fingerprint of the resourceVersion of the operator's own last write (its echo is
    /// not a trigger; [`crate::types::ResourceVersion::fingerprint`]).
    pub own_write: AtomicU64,
    pub removed: AtomicBool,
    /// Wakes a maintainer waiting for a budget (its place in the source or kube queue) when
    /// its node has new work.
    pub work: tokio::sync::Notify,
}

impl NodeHandle {
    /// A new node's handle: nothing known of it but `info`, nothing published.
    pub fn new(info: NodeInfo, trigger: Trigger) -> Self {
        NodeHandle {
            name: info.name.clone(),
            trigger,
            priority: PriorityCell::default(),
            state: Mutex::new(NodeState {
                info,
                deleted_at: None,
                summary: NodeSummary::default(),
                lanes: Vec::new(),
            }),
            own_write: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            work: tokio::sync::Notify::new(),
        }
    }
}

pub(crate) struct NodeState {
    pub info: NodeInfo,
    /// When the Node object was deleted.
    pub deleted_at: Option<Instant>,
    pub summary: NodeSummary,
    /// Its figures per pool and family, as last published.
    pub lanes: Vec<LaneSummary>,
}

pub(crate) struct Shared<S, N, P> {
    pub source: S,
    pub store: N,
    pub pods: P,
    pub clock: Arc<dyn Clock>,
    pub cfg: EngineConfig,
    pub source_budget: Budget,
    pub kube_budget: Budget,
    pub leader: watch::Receiver<bool>,
    /// Bumped each time the lead is gained: maintainers re-seed once per epoch.
    pub leader_epoch: AtomicU64,
    pub nodes: Mutex<NodeTable<NodeHandle>>,
    pub stats: Mutex<Stats>,
    /// The stats the aggregate gauges were last set from ([`Stats::publish`]).
    pub published: Mutex<Stats>,
    pub parked: Mutex<BTreeSet<NodeName>>,
    /// Wakes the count refresh ([`crate::NodeManager::spawn_count_refresh`]); poked by
    /// whatever may change what an IPAMNode holds: a pass, a store event, a resync that wrote.
    pub counts: tokio::sync::Notify,
    /// Each pool's scarcity ([`Shared::pool_step`]).
    pub scarcity: Mutex<PoolScarcity>,
}

impl<S: IpSource, N: NodeStore, P: PodView> Shared<S, N, P> {
    pub fn node_count(&self) -> usize {
        self.nodes.lock().len()
    }

    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// The budget the source's mutating calls draw on.
    pub fn call_budget(&self) -> &Budget {
        match self.source.api() {
            Api::Source => &self.source_budget,
            Api::Kube => &self.kube_budget,
        }
    }

    /// Replaces one node's contribution to the aggregate stats (`old` = None for a new node,
    /// `new` = None for a removed one) and sets their gauges at once: what a person watches
    /// (pods waiting, nodes in deficit, free addresses) follows each change, not only the
    /// resync.
    pub fn restat(&self, old: Option<&NodeSummary>, new: Option<&NodeSummary>) {
        let mut stats = self.stats.lock();
        stats.replace(old, new);
        let mut published = self.published.lock();
        stats.publish(Some(&published));
        published.clone_from(&stats);
    }

    /// Publishes a node's new summary, and its figures per pool, into the aggregate stats.
    pub fn publish(&self, h: &NodeHandle, summary: NodeSummary, lanes: &[LaneSummary]) {
        let mut pools = Vec::new();
        let (old, lanes_changed) = {
            let mut st = h.state.lock();
            let changed = st.lanes != lanes;
            if changed {
                let old = std::mem::replace(&mut st.lanes, lanes.to_vec());
                self.stats.lock().replace_lanes(&old, lanes);
                pools = (old.iter().chain(lanes))
                    .map(|l| (l.pool.clone(), l.family))
                    .collect();
            }
            (std::mem::replace(&mut st.summary, summary), changed)
        };
        if lanes_changed {
            pools.sort();
            pools.dedup();
            self.pool_step(Some(&pools));
        }
        if old != summary || lanes_changed {
            self.restat(Some(&old), Some(&summary));
            if self.cfg.per_node_metrics {
                crate::stats::publish_node(&h.name, &summary);
            }
        }
        h.priority.set(Priority {
            waiting_pods: summary.waiting().min(u32::MAX as u64) as u32,
            needed: summary.needed().min(u32::MAX as u64) as u32,
        });
    }

    /// What an IPAMNode holds may have changed: the count refresh looks (at most one
    /// wake-up is kept while it works).
    pub fn counts_may_change(&self) {
        self.counts.notify_one();
    }

    /// The node waits for the pool to free (no polling).
    pub fn park(&self, name: &NodeName) {
        self.parked.lock().insert(name.clone());
    }

    /// Addresses went back to the source: wake every parked node.
    pub fn pool_freed(&self) {
        let parked = std::mem::take(&mut *self.parked.lock());
        let nodes = self.nodes.lock();
        for name in parked {
            if let Some(h) = nodes.get(&name) {
                h.trigger.trigger(Reason::PoolFreed);
            }
        }
    }

    /// A maintainer whose node is gone and reclaimed removes itself, unless the Node came
    /// back under its name meanwhile ([`crate::NodeManager::upsert_node`] cleared the
    /// deletion): then it stays, and whether it was removed is the answer. Decided under
    /// the node map's lock, which an upsert holds while it looks for the maintainer.
    pub fn remove_if_deleted(&self, h: &NodeHandle) -> bool {
        let mut nodes = self.nodes.lock();
        if h.state.lock().deleted_at.is_none() {
            return false;
        }
        h.removed.store(true, Ordering::Relaxed);
        self.source.node_gone(&h.name);
        nodes.remove(&h.name);
        drop(nodes);
        self.parked.lock().remove(&h.name);
        let (summary, lanes) = {
            let mut st = h.state.lock();
            (st.summary, std::mem::take(&mut st.lanes))
        };
        self.stats.lock().replace_lanes(&lanes, &[]);
        self.restat(Some(&summary), None);
        true
    }
}
