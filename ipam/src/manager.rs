//! The NodeManager: one maintainer task per node, a periodic resync over all nodes with a
//! bounded worker pool, incremental aggregate stats, leadership as a signal, and parking
//! of exhausted nodes until the pool frees, and the node-lifecycle rules ([`lifecycle`]).
//! No lock is held across an await or for a whole resync.

mod lifecycle;

pub use crate::config::EngineConfig;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::budget::{Budget, Priority};
use crate::clock::Clock;
use crate::error::IpamError;
use crate::gate::{Background, Counted};
use crate::maintainer;
use crate::plan::NodeSummary;
use crate::pods::PodView;
use crate::shared::{NodeHandle, ScarcityState, Shared};
use crate::source::IpSource;
use crate::stats::Stats;
use crate::store::{NodeStore, ObjectKind, StoreEvent, Writer};
use crate::trigger::{self, Reason};
use crate::types::{NodeInfo, NodeName};
use crate::vocab::Blocked;

use tidepool_metrics::record;

/// The NodeManager. Cheap to clone.
pub struct NodeManager<S, N, P> {
    shared: Arc<Shared<S, N, P>>,
    tasks: Arc<Mutex<Tasks>>,
}

/// The manager's spawned tasks (aborted on shutdown). Finished tasks' handles are dropped
/// when the list has doubled since the last sweep: a sweep per added node made adding n
/// nodes O(n²) (issue 11); this keeps it O(n) with at most twice the live handles.
#[derive(Default)]
struct Tasks {
    handles: Vec<JoinHandle<()>>,
    swept_len: usize,
    /// Set by [`NodeManager::shutdown`]: no task is started any more.
    closed: bool,
}

impl Tasks {
    fn push(&mut self, task: JoinHandle<()>) {
        if self.closed {
            task.abort();
            return;
        }
        if self.handles.len() >= 2 * self.swept_len.max(64) {
            self.handles.retain(|t| !t.is_finished());
            self.swept_len = self.handles.len();
        }
        self.handles.push(task);
    }
}

/// What a [`NodeManager`] runs on: the I/O behind the engine's traits, its clock, a budget
/// per API, and the leadership signal.
pub struct EngineDeps<S, N, P> {
    pub source: S,
    pub store: N,
    pub pods: P,
    pub clock: Arc<dyn Clock>,
    /// Calls to the IP source (`--api-qps/--api-burst`).
    pub source_budget: Budget,
    /// API server writes (`--kube-api-qps/--kube-api-burst`).
    pub kube_budget: Budget,
    /// Whether this replica leads.
    pub leader: watch::Receiver<bool>,
}

impl<S, N, P> Clone for NodeManager<S, N, P> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            tasks: self.tasks.clone(),
        }
    }
}

impl<S: IpSource, N: NodeStore, P: PodView> NodeManager<S, N, P> {
    /// A manager over the given source, store and pod view ([`EngineDeps`]). While
    /// `deps.leader` says this replica does not lead, no mutating call is made.
    pub fn new(deps: EngineDeps<S, N, P>, cfg: EngineConfig) -> Result<Self, IpamError> {
        let EngineDeps {
            source,
            store,
            pods,
            clock,
            source_budget,
            kube_budget,
            leader,
        } = deps;
        cfg.validate()?;
        let leading = u64::from(*leader.borrow());
        let shared = Arc::new(Shared {
            source,
            store,
            pods,
            clock,
            cfg,
            source_budget,
            kube_budget,
            leader_epoch: AtomicU64::new(leading),
            leader,
            nodes: Mutex::default(),
            stats: Mutex::default(),
            published: Mutex::default(),
            parked: Mutex::default(),
            counts: tokio::sync::Notify::new(),
            scarcity: Mutex::default(),
        });
        let mgr = Self {
            shared,
            tasks: Arc::default(),
        };
        let watcher = mgr.clone();
        let mut rx = mgr.shared.leader.clone();
        mgr.tasks.lock().push(tokio::spawn(async move {
            record::leader(*rx.borrow());
            while rx.changed().await.is_ok() {
                let leading = *rx.borrow_and_update();
                record::leader(leading);
                if leading {
                    watcher.shared.leader_epoch.fetch_add(1, Ordering::Relaxed);
                }
                watcher.trigger_all(Reason::Leadership);
            }
        }));
        Ok(mgr)
    }

    /// A Node was added or changed (the Node informer).
    pub fn upsert_node(&self, info: NodeInfo) {
        if self.tasks.lock().closed {
            return; // shut down: a watch still running starts no maintainer
        }
        let mut nodes = self.shared.nodes.lock();
        // under the lock: a maintainer removing itself meanwhile ([`crate::shared::Shared::remove_if_deleted`])
        // tells the source the node is gone first, not after
        self.shared.source.node_seen(&info);
        if let Some(h) = nodes.get(&info.name) {
            let mut st = h.state.lock();
            st.info = info;
            st.deleted_at = None;
            h.trigger.trigger(Reason::Upsert);
            h.work.notify_waiters();
            return;
        }
        let (trigger, rx) = trigger::trigger(
            tidepool_metrics::Trigger::PoolMaintainer,
            self.shared.cfg.min_pass_interval,
        );
        let h = Arc::new(NodeHandle::new(info, trigger));
        self.shared.restat(None, Some(&NodeSummary::default()));
        nodes.insert(h.name.clone(), h.clone());
        drop(nodes);
        h.trigger.trigger(Reason::Upsert);
        let task = tokio::spawn(maintainer::run(self.shared.clone(), h, rx));
        self.tasks.lock().push(task);
    }

    /// The Node object was deleted: whole-node reclaim follows once no pod is bound to it
    /// and the node grace has passed.
    pub fn delete_node(&self, name: &str) {
        if let Some(h) = self.shared.nodes.lock().get(name) {
            h.state.lock().deleted_at.get_or_insert(Instant::now());
            h.trigger.trigger(Reason::Delete);
            h.work.notify_waiters();
        }
    }

    /// The IPAMNode or one of its blocks changed (their informers): the node's pass runs
    /// unless it is the echo of our own write, and the count refresh looks.
    pub fn on_store_event(&self, ev: &StoreEvent) {
        self.shared.counts_may_change();
        if let Some(h) = self.shared.nodes.lock().get(&ev.name) {
            // the echo of our own write is not news; an operator's block write is made
            // by a pass of that very node
            let own = ev.writer == Writer::Operator
                && (ev.kind == ObjectKind::IpamBlock
                    || h.own_write.load(Ordering::Relaxed) == ev.resource_version.fingerprint());
            tracing::debug!(
                node = %ev.name, kind = ?ev.kind, writer = ?ev.writer,
                version = %ev.resource_version, own, "store event"
            );
            if !own {
                h.trigger.trigger(Reason::Upsert);
                h.work.notify_waiters();
            }
        }
    }

    /// A pod bound to `node` was added, deleted or changed phase: that node's pass runs at
    /// once (its first reclaim observation is the event itself).
    pub fn on_pod_event(&self, node: &str) {
        if let Some(h) = self.shared.nodes.lock().get(node) {
            h.trigger.trigger(Reason::PodEvent);
            h.work.notify_waiters();
        }
    }

    fn trigger_all(&self, reason: Reason) {
        for h in self.shared.nodes.lock().values() {
            h.trigger.trigger(reason);
            h.work.notify_waiters();
        }
    }

    /// One resync: recalculates every node with a bounded worker pool and triggers those
    /// with work in priority order (pods waiting first, then needed).
    pub async fn resync(&self) {
        let started = std::time::Instant::now();
        if self.shared.is_leader() {
            let budget = self.shared.call_budget().clone();
            let mut gate = Counted {
                inner: Background::new(budget, self.shared.leader.clone()),
                admitted: 0,
            };
            self.shared
                .source
                .resync(&mut gate, self.shared.clock.utc())
                .await;
            if gate.admitted > 0 {
                self.shared.counts_may_change(); // a repair or drain wrote
            }
        }
        self.shared.pool_step(None);
        let nodes: Vec<Arc<NodeHandle>> = self.shared.nodes.lock().values().cloned().collect();
        let workers = self.shared.cfg.parallel_workers.max(1);
        let chunk = nodes.len().div_ceil(workers).max(1);
        let mut set = tokio::task::JoinSet::new();
        for (i, part) in nodes.chunks(chunk).enumerate() {
            let part = part.to_vec();
            let shared = self.shared.clone();
            set.spawn(async move {
                let mut out = Vec::new();
                for h in part {
                    if let Some(p) = recalc(&shared, &h) {
                        out.push((p, h));
                    }
                }
                (i, out)
            });
        }
        let mut parts = Vec::with_capacity(workers);
        while let Some(r) = set.join_next().await {
            if let Ok(p) = r {
                parts.push(p);
            }
        }
        parts.sort_by_key(|(i, _)| *i);
        let mut due: Vec<(Priority, Arc<NodeHandle>)> =
            parts.into_iter().flat_map(|(_, v)| v).collect();
        due.sort_by(|(a, ha), (b, hb)| {
            (b.waiting_pods, b.needed)
                .cmp(&(a.waiting_pods, a.needed))
                .then_with(|| ha.name.cmp(&hb.name))
        });
        for (_, h) in &due {
            h.trigger.trigger(Reason::Resync);
        }
        record::resync();
        record::resync_duration(started.elapsed());
        {
            let stats = self.shared.stats.lock();
            stats.publish(None);
            self.shared.published.lock().clone_from(&stats);
        }
        // Every operator gauge is set at each resync, so with the exporter's idle timeout
        // (`--per-node-metrics`) only the series nobody sets any more expire: a deleted
        // node's `tidepool_ipam_node_ips` (set here only for managed nodes, and only while
        // this replica leads: a follower's copies would be stale).
        record::leader(self.shared.is_leader());
        if self.shared.cfg.per_node_metrics && self.shared.is_leader() {
            for h in nodes.iter().filter(|h| !h.removed.load(Ordering::Relaxed)) {
                let summary = h.state.lock().summary;
                crate::stats::publish_node(&h.name, &summary);
            }
        }
    }

    /// Runs [`NodeManager::resync`] every `resync_interval` until the manager is dropped.
    pub fn spawn_resync_loop(&self) {
        let mgr = self.clone();
        let every = self.shared.cfg.resync_interval;
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                mgr.resync().await;
            }
        });
        self.tasks.lock().push(task);
    }

    /// Aggregate stats (kept incrementally): a copy, per-pool map included.
    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().clone()
    }

    /// Nodes neither at target nor blocked with a reason (`Stats::unsettled`), without a
    /// copy of the stats: the simulator asks on every settle check.
    pub fn unsettled(&self) -> i64 {
        self.shared.stats.lock().unsettled
    }

    /// Every pool's scarcity (DESIGN.md "The engine", Scarcity), in pool and family order.
    pub fn scarcity(&self) -> Vec<ScarcityState> {
        self.shared.scarcity_states()
    }

    /// A node's last summary.
    pub fn summary(&self, name: &str) -> Option<NodeSummary> {
        let h = self.shared.nodes.lock().get(name).cloned()?;
        let s = h.state.lock().summary;
        Some(s)
    }

    /// The pools changed (an IPPool added or edited): nodes parked on an exhausted pool
    /// look again.
    pub fn pools_changed(&self) {
        self.shared.pool_freed();
    }

    /// The families the source serves changed: every node plans again, so a family newly
    /// served is claimed like any deficit and one no longer served is no longer claimed.
    pub fn families_changed(&self) {
        for h in self.shared.nodes.lock().values() {
            h.trigger.trigger(Reason::FamiliesChanged);
        }
    }

    /// Every managed node with its last summary, in name order.
    pub fn summaries(&self) -> Vec<(NodeName, NodeSummary)> {
        let nodes: Vec<_> = self.shared.nodes.lock().values().cloned().collect();
        nodes
            .into_iter()
            .map(|h| {
                let s = h.state.lock().summary;
                (h.name.clone(), s)
            })
            .collect()
    }

    /// Names of the managed nodes.
    pub fn node_names(&self) -> Vec<NodeName> {
        self.shared.nodes.lock().keys().cloned().collect()
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<Shared<S, N, P>> {
        &self.shared
    }

    /// Stops every task of this manager; a node added later gets no maintainer.
    pub fn shutdown(&self) {
        let mut tasks = self.tasks.lock();
        tasks.closed = true;
        for t in tasks.handles.drain(..) {
            t.abort();
        }
    }
}

/// Recalculates one node for a resync: its priority if it has work to do.
fn recalc<S: IpSource, N: NodeStore, P: PodView>(
    shared: &Shared<S, N, P>,
    h: &NodeHandle,
) -> Option<Priority> {
    let (summary, deleted) = {
        let st = h.state.lock();
        (st.summary, st.deleted_at.is_some())
    };
    if matches!(
        summary.blocked,
        Some(Blocked::Exhausted) | Some(Blocked::PoolInvalid) | Some(Blocked::InvalidSpec)
    ) {
        return None; // woken by the pool freeing, the pools or the spec changing, not by polling
    }
    let waiting = shared.pods.pending_pods(&h.name).len() as u32;
    let needed = summary.needed().min(u32::MAX as u64) as u32;
    let work = deleted
        || waiting > 0
        || needed > 0
        || summary.releasing()
        || summary.reclaim_candidates > 0
        || (summary.release_enabled && summary.excess() > 0 && summary.releasable > 0);
    let prio = Priority {
        waiting_pods: waiting,
        needed,
    };
    h.priority.set(prio);
    work.then_some(prio)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finished tasks' handles are swept as the list doubles: it never holds more than
    /// twice max(the live handles, 64), and live ones stay.
    #[tokio::test(start_paused = true)]
    async fn finished_task_handles_do_not_pile_up() {
        let mut tasks = Tasks::default();
        let (tx, rx) = tokio::sync::watch::channel(());
        for i in 0..10_000u32 {
            if i % 100 == 0 {
                let mut rx = rx.clone();
                tasks.push(tokio::spawn(async move {
                    let _ = rx.changed().await;
                }));
            } else {
                tasks.push(tokio::spawn(async {}));
            }
            tokio::task::yield_now().await;
            let live = tasks.handles.iter().filter(|t| !t.is_finished()).count();
            let len = tasks.handles.len();
            assert!(len <= 2 * live.max(64) + 1, "{len} handles, {live} live");
        }
        assert_eq!(
            tasks.handles.iter().filter(|t| !t.is_finished()).count(),
            100
        );
        drop(tx);
    }
}
