//! `run`: the engine against an API server, one replica or several under leader election.
//!
//! Watches of IPPools, IPAMNodes, IPAMBlocks, Nodes and Pods feed the indexes and the
//! kube-backed store (list, then watch, kube's default backoff). Pods and Nodes are listed
//! with `resourceVersion=0`: served whole from the API server's watch cache, as client-go's
//! informers list, so a large cluster's list is one answer and no chain of continue
//! tokens that compaction can expire (data seconds stale is safe: a reclaim confirms by
//! GET). IPPools, IPAMNodes and IPAMBlocks are consistent lists in pages of 100. Nothing is
//! granted until every watch has listed once (a synced standby is ready); start-up fails
//! when a watch not listed yet makes no progress (no page, no event) for the sync timeout. Under leader
//! election the replica then waits to lead; a new leader relists IPAMNodes and IPAMBlocks
//! from a quorum read before its first write, so it plans from what the old leader wrote,
//! never from a lagging cache (an apply built from missing marks or tombstones would remove
//! them). Then the cluster-pool source rebuilds its index from every IPAMBlock, the engine
//! starts, and `/readyz` turns ready. Every write goes through the [`Fence`]: refused after
//! the step-down instant, given up at its permit's end. Watch events reach the engine as
//! they come: Nodes as node additions and deletions, Pods as pod events of their node,
//! IPAMNodes and blocks as store events, IPPools as pool changes.

mod agent_ready;
mod pool_status;
mod pools;
mod progress;
mod taints;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use parking_lot::Mutex;
use tidepool_api as api;
use tidepool_ipam::pool::ClusterPoolSource;
use tidepool_ipam::{
    Api as BudgetApi, Background, Budget, EngineConfig, EngineDeps, Family, IpSource, NodeManager,
    NodeName, SchedulingMode, TokioClock,
};
use tokio::sync::watch;

use crate::error::Error;
use crate::index::{
    LabelSelector, NamespaceIndex, NodeChange, NodeIndex, PodIndex, WatchedPod, to_pod_event,
};
use crate::leader::{Fence, LeaderConfig, Leadership, run_elector};
use crate::store::{Applied, Events, KubeStore};
pub use pools::Pools;
use progress::Progress;
pub use tidepool_metrics::probes::Readiness;

type Source = ClusterPoolSource<KubeStore>;
type Manager = NodeManager<Source, KubeStore, PodIndex>;

/// What `run` needs besides a client.
pub struct Settings {
    pub engine: EngineConfig,
    pub scheduling: SchedulingMode,
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
    pub node_selector: LabelSelector,
    /// How long a watch that has not listed yet may go without progress (a page or an
    /// event) before start-up fails naming it.
    pub sync_timeout: Duration,
    /// Where `/healthz` and `/readyz` are served (None: not at all).
    pub health_addr: Option<SocketAddr>,
    /// Seeds the source's random block search.
    pub seed: u64,
    /// Taint Nodes that cannot get more addresses while pods wait (`--taint-exhausted-nodes`).
    pub taint_exhausted_nodes: bool,
    /// How long a node's pods may wait while its agent is not `AgentReady=True` before an
    /// `AgentNotReady` event on its IPAMNode says so (`--agent-ready-grace`).
    pub agent_ready_grace: Duration,
    /// Which pods are the node agents (`--agent-pod-selector`): a node whose agent pod is
    /// not Ready counts as not ready for `AgentNotReady`, whatever its last condition says.
    pub agent_pods: LabelSelector,
    /// Leader election (`--leader-elect`); None: this replica always leads.
    pub election: Option<Election>,
}

/// How this replica takes part in leader election.
pub struct Election {
    pub config: LeaderConfig,
    /// The Lease gets a client of its own, built from this (see [`crate::leader::lease`]).
    pub kube_config: kube::Config,
}

/// Everything the watch tasks hand events to.
#[derive(Clone)]
struct Parts {
    store: KubeStore,
    pods: PodIndex,
    namespaces: NamespaceIndex,
    nodes: NodeIndex,
    pools: Arc<Mutex<Pools>>,
    engine: Arc<Mutex<Option<Engine>>>,
    /// Node changes seen before the engine started, in order.
    backlog: Arc<Mutex<Vec<NodeChange>>>,
    /// When each watch last made progress.
    progress: Progress,
}

#[derive(Clone)]
struct Engine {
    manager: Manager,
    source: Source,
    /// [`Pools::changes`] when the source was built from the pools.
    pools_at: u64,
    /// The kube budget the engine's passes draw on; writes outside them draw on it too.
    kube_budget: Budget,
    /// Says whether the engine leads.
    leader: watch::Receiver<bool>,
}

impl Engine {
    /// Admission for a write outside a node's pass: a kube token behind the nodes, and
    /// only while leading.
    fn background(&self) -> Background {
        Background::new(self.kube_budget.clone(), self.leader.clone())
    }
}

/// The replica's side of leader election.
struct Lead {
    /// None: no election, this replica always leads.
    leadership: Option<Leadership>,
    /// The elector's task; its end while running is leadership lost.
    elector: Option<tokio::task::JoinHandle<Result<(), Error>>>,
    /// Tells the elector to step down and release the Lease.
    stop: watch::Sender<bool>,
    /// Stays true without an election (the engine's leader signal must not close).
    always: watch::Sender<bool>,
}

impl Lead {
    fn start(election: Option<&Election>) -> Self {
        let (stop, stopped) = watch::channel(false);
        let leadership = election.map(|e| Leadership::new(&e.config));
        let elector = election.zip(leadership.clone()).map(|(e, l)| {
            let mut stopped = stopped.clone();
            let shutdown = async move {
                let _ = stopped.wait_for(|v| *v).await;
            };
            tokio::spawn(run_elector(
                e.config.clone(),
                e.kube_config.clone(),
                l,
                shutdown,
            ))
        });
        Lead {
            leadership,
            elector,
            stop,
            always: watch::channel(true).0,
        }
    }

    fn fence(&self) -> Fence {
        self.leadership.clone().map(Fence::of).unwrap_or_default()
    }

    /// The engine's leader signal.
    fn signal(&self) -> watch::Receiver<bool> {
        match &self.leadership {
            Some(l) => l.subscribe(),
            None => self.always.subscribe(),
        }
    }

    /// Resolves when the elector ends while it should run: leadership lost (or never
    /// pending without an election).
    async fn lost(&mut self) -> Error {
        let Some(task) = self.elector.as_mut() else {
            return std::future::pending().await;
        };
        let r = task.await;
        self.elector = None;
        match r {
            Ok(Err(e)) => e,
            Ok(Ok(())) => Error::LeadershipLost {
                reason: "the elector stopped".into(),
            },
            Err(e) => Error::LeadershipLost {
                reason: format!("the elector failed: {e}"),
            },
        }
    }

    /// Steps down and, when leading, releases the Lease once the writes under way have
    /// settled; the second time, nothing.
    async fn release(&mut self) -> Result<(), Error> {
        let _ = self.stop.send(true);
        match self.elector.take() {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

/// A `run` that is dropped (its task aborted) takes its elector with it, which steps down:
/// nothing it guarded writes again, and a follower takes over once the Lease expires.
impl Drop for Lead {
    fn drop(&mut self) {
        if let Some(task) = &self.elector {
            task.abort();
        }
    }
}

/// The running engine and its companion tasks; dropped, they stop.
struct Running {
    engine: Engine,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.engine.manager.shutdown();
    }
}

/// Runs until `shutdown` completes (then exits Ok after stepping down and releasing the
/// Lease), or until leadership is lost (Err "leader election lost": the binary exits and
/// Kubernetes restarts it as a follower); start-up errors name what failed.
pub async fn run(
    client: Client,
    s: Settings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let ready = Readiness::default();
    if let Some(addr) = s.health_addr {
        let at = tidepool_metrics::probes::serve(addr, ready.clone())
            .await
            .map_err(|e| Error::Listen { addr, source: e })?;
        tracing::info!(%at, "serving /healthz and /readyz");
    }
    let mut lead = Lead::start(s.election.as_ref());
    let events = Events::new(
        client.clone(),
        std::num::NonZeroU32::new(10).expect("nonzero"),
        std::num::NonZeroU32::new(100).expect("nonzero"),
    )
    .with_fence(lead.fence());
    let namespaces = NamespaceIndex::default();
    let parts = Parts {
        store: KubeStore::new(client.clone(), events.clone()).with_fence(lead.fence()),
        pods: PodIndex::new(client.clone())
            .with_events(events.clone())
            .with_agent_pods(s.agent_pods.clone())
            .with_namespaces(namespaces.clone()),
        namespaces,
        nodes: NodeIndex::new(s.node_selector.clone()),
        pools: Arc::default(),
        engine: Arc::default(),
        backlog: Arc::default(),
        progress: Progress::default(),
    };
    let mut watches = Watches::spawn(&client, &parts);
    tokio::pin!(shutdown);
    let result = async {
        wait_synced(&parts, s.sync_timeout).await?;
        ready.set(true); // a synced standby is ready
        let leadership = lead.leadership.clone();
        let leading = async {
            if let Some(l) = &leadership {
                l.leading().await;
            }
        };
        tokio::select! {
            () = leading => {}
            () = &mut shutdown => return Ok(None),
            e = lead.lost() => return Err(e),
        }
        if lead.leadership.is_some() {
            ready.set(false);
            tracing::info!("leading: relisting IPAMNodes and IPAMBlocks from a quorum read");
            watches
                .relist_intents(&client, &parts, s.sync_timeout)
                .await?;
        }
        let engine = start_engine(&parts, &s, lead.signal())?;
        let tasks = engine_tasks(&client, &parts, &engine, &events, &s, lead.fence());
        let running = Running { engine, tasks };
        ready.set(true);
        let families = families_label(running.engine.source.families());
        tracing::info!(%families, "synced; the engine runs");
        let lost = tokio::select! {
            () = &mut shutdown => None,
            e = lead.lost() => Some(e),
        };
        ready.set(false);
        match lost {
            Some(e) => Err(e),
            None => {
                // SIGTERM: the fence refuses new writes at once, those under way end (or
                // reach their deadline), the Lease goes; then the engine stops
                let released = lead.release().await;
                drop(running);
                released.map(Some)
            }
        }
    }
    .await;
    drop(watches);
    let released = lead.release().await;
    result?;
    released
}

/// The default of [`Settings::agent_pods`] (`--agent-pod-selector`): the label the deploy
/// bundle's agent DaemonSet gives its pods.
pub const DEFAULT_AGENT_POD_SELECTOR: &str = "app.kubernetes.io/name=tidepool-agent";

/// [`DEFAULT_AGENT_POD_SELECTOR`], parsed.
pub fn default_agent_pods() -> LabelSelector {
    DEFAULT_AGENT_POD_SELECTOR
        .parse()
        .expect("the default selector parses")
}

/// The default of [`Settings::agent_ready_grace`] (`--agent-ready-grace`): an agent
/// DaemonSet pod normally serves within seconds of its node's registration, so a minute of
/// pods waiting with no ready agent is no start-up any more.
pub const DEFAULT_AGENT_READY_GRACE: Duration = Duration::from_secs(60);

/// The engine's companions: IPPool status, taints and the
/// `AgentNotReady` events; and the engine's own resync and count refresh, and its orphans
/// (IPAMNodes without a Node, [`NodeManager::nodes_synced`]). Started once the engine runs;
/// each writes only through the fence.
fn engine_tasks(
    client: &Client,
    parts: &Parts,
    engine: &Engine,
    events: &Events,
    s: &Settings,
    fence: Fence,
) -> Vec<tokio::task::JoinHandle<()>> {
    for n in tidepool_ipam::BlockStore::list_nodes(&parts.store) {
        parts.set_node_pools(engine, &n.name);
    }
    *parts.engine.lock() = Some(engine.clone());
    // a pool change the watch saw after the source was built, before the engine was there
    if parts.pools.lock().changes() != engine.pools_at {
        tell_pools(&parts.pools, engine);
    }
    let backlog = std::mem::take(&mut *parts.backlog.lock());
    apply_node_changes(engine, &parts.nodes, backlog);
    engine
        .manager
        .nodes_synced(|n| parts.nodes.get(n).is_some());
    engine.manager.spawn_resync_loop();
    engine.manager.spawn_count_refresh();
    vec![
        tokio::spawn(pool_status::keep_written(
            Api::all(client.clone()),
            engine.source.clone(),
            events.clone(),
            {
                let manager = engine.manager.clone();
                Arc::new(move || manager.scarcity())
            },
            Duration::from_secs(2).min(s.engine.resync_interval),
            engine.background(),
            fence.clone(),
        )),
        tokio::spawn(taints::keep(
            Api::all(client.clone()),
            parts.store.clone(),
            parts.nodes.clone(),
            s.taint_exhausted_nodes,
            engine.background(),
            fence,
        )),
        tokio::spawn(agent_ready::keep(
            parts.store.clone(),
            parts.pods.clone(),
            events.clone(),
            s.agent_ready_grace,
            s.agent_pods.clone(),
        )),
    ]
}

/// The watch tasks; the IPAMNode and IPAMBlock ones are restarted by a new leader.
struct Watches {
    ipamnodes: tokio::task::JoinHandle<()>,
    ipamblocks: tokio::task::JoinHandle<()>,
    others: Vec<tokio::task::JoinHandle<()>>,
}

impl Watches {
    /// Starts one watch per resource; each applies its events to its index and tells the
    /// engine once it runs.
    fn spawn(client: &Client, parts: &Parts) -> Self {
        Watches {
            ipamnodes: watch_ipamnodes(client, parts),
            ipamblocks: watch_ipamblocks(client, parts),
            others: watch_others(client, parts),
        }
    }

    /// Restarts the IPAMNode and IPAMBlock watches, whose first list is a quorum read
    /// (not the API server's watch cache), and waits until the cache has taken both lists
    /// in: the relist replaces what the cache held.
    async fn relist_intents(
        &mut self,
        client: &Client,
        parts: &Parts,
        timeout: Duration,
    ) -> Result<(), Error> {
        let before = parts.store.lists();
        self.ipamnodes.abort();
        self.ipamblocks.abort();
        self.ipamnodes = watch_ipamnodes(client, parts);
        self.ipamblocks = watch_ipamblocks(client, parts);
        wait_until_listed(&parts.progress, timeout, || {
            let now = parts.store.lists();
            let waiting = [
                (now.0 == before.0, "ipamnodes"),
                (now.1 == before.1, "ipamblocks"),
            ];
            waiting
                .into_iter()
                .filter(|(w, _)| *w)
                .map(|(_, what)| what)
                .collect()
        })
        .await
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        self.ipamnodes.abort();
        self.ipamblocks.abort();
        for t in &self.others {
            t.abort();
        }
    }
}

/// The IPAMNode watch; its lists are quorum reads.
fn watch_ipamnodes(client: &Client, parts: &Parts) -> tokio::task::JoinHandle<()> {
    let p = parts.clone();
    drive(
        Api::<api::IPAMNode>::all(client.clone()),
        quorum(),
        parts.progress.of("ipamnodes"),
        move |ev| {
            let applied = p.store.apply_node_event(ev);
            p.tell_store(applied);
        },
    )
}

/// The IPAMBlock watch; its lists are quorum reads.
fn watch_ipamblocks(client: &Client, parts: &Parts) -> tokio::task::JoinHandle<()> {
    let p = parts.clone();
    drive(
        Api::<api::IPAMBlock>::all(client.clone()),
        quorum(),
        parts.progress.of("ipamblocks"),
        move |ev| {
            let applied = p.store.apply_block_event(ev);
            p.tell_store(applied);
        },
    )
}

/// Lists in pages of 100, each list a quorum read (kube's default, said here because a new
/// leader's safety rests on it).
fn quorum() -> watcher::Config {
    watcher::Config::default()
        .page_size(100)
        .list_semantic(watcher::ListSemantic::MostRecent)
}

/// Lists from the API server's watch cache (`resourceVersion=0`, kube's
/// [`ListSemantic::Any`](watcher::ListSemantic::Any)): one answer, no continue token. No
/// page size: kube sends no `resourceVersion=0` with a `limit` (it would list from etcd).
fn from_cache() -> watcher::Config {
    watcher::Config {
        page_size: None,
        ..watcher::Config::default().any_semantic()
    }
}

/// The Pod, Node and IPPool watches.
fn watch_others(client: &Client, parts: &Parts) -> Vec<tokio::task::JoinHandle<()>> {
    let p = parts.clone();
    let progress = parts.progress.of("pods");
    // the fields the index reads, not whole Pods: see `WatchedPod`
    let pods = drive(
        Api::<WatchedPod>::all(client.clone()),
        from_cache(),
        progress,
        move |ev| {
            let touched = p.pods.apply(&to_pod_event(ev));
            if let Some(e) = p.engine.lock().as_ref() {
                for n in touched {
                    e.manager.on_pod_event(&n);
                }
            }
        },
    );
    let p = parts.clone();
    let progress = parts.progress.of("nodes");
    let nodes = drive(
        Api::<Node>::all(client.clone()),
        from_cache(),
        progress,
        move |ev| {
            let changes = p.nodes.apply(ev);
            match p.engine.lock().as_ref() {
                Some(e) => apply_node_changes(e, &p.nodes, changes),
                None => p.backlog.lock().extend(changes),
            }
        },
    );
    let p = parts.clone();
    let ippools = drive(
        Api::<api::IPPool>::all(client.clone()),
        quorum(),
        parts.progress.of("ippools"),
        move |ev| {
            let changed = p.pools.lock().apply(ev);
            if changed && let Some(e) = p.engine.lock().as_ref() {
                tell_pools(&p.pools, e);
            }
        },
    );
    let p = parts.clone();
    // a namespace's labels or pools annotation changed: its waiting pods' pools may have
    let namespaces = drive(
        Api::<Namespace>::all(client.clone()),
        from_cache(),
        parts.progress.of("namespaces"),
        move |ev| {
            let changed = p.namespaces.apply(ev);
            if let Some(e) = p.engine.lock().as_ref() {
                for node in changed.iter().flat_map(|ns| p.pods.waiting_in(ns)) {
                    e.manager.on_pod_event(&node);
                }
            }
        },
    );
    vec![pods, nodes, ippools, namespaces]
}

impl Parts {
    fn tell_store(&self, applied: Applied) {
        for m in &applied.malformed {
            tracing::warn!(%m, "malformed entry skipped");
        }
        if let Some(e) = self.engine.lock().as_ref() {
            for ev in &applied.events {
                if ev.kind == tidepool_ipam::ObjectKind::IpamNode && !ev.deleted {
                    self.set_node_pools(e, &ev.name);
                }
                e.manager.on_store_event(ev);
            }
        }
    }

    /// A user's `spec.pools` of an IPAMNode, told to the source before the node's pass.
    fn set_node_pools(&self, e: &Engine, node: &NodeName) {
        if let Some(p) = self.store.node_pools(node) {
            e.source.set_node_pool(node, Family::V4, p.v4);
            e.source.set_node_pool(node, Family::V6, p.v6);
        }
    }
}

/// List, then watch, with kube's default backoff on errors; `f` sees every event, and
/// each one is progress.
fn drive<K>(
    api: Api<K>,
    cfg: watcher::Config,
    progress: progress::Of,
    mut f: impl FnMut(&Event<K>) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
        while let Some(r) = stream.next().await {
            match r {
                Ok(ev) => {
                    progress.made();
                    f(&ev)
                }
                Err(e) => tracing::warn!(%kind, error = %e, "watch failed; retrying"),
            }
        }
    })
}

/// Waits until every watch has listed once, as long as each one not listed yet makes
/// progress within `timeout`.
async fn wait_synced(parts: &Parts, timeout: Duration) -> Result<(), Error> {
    wait_until_listed(&parts.progress, timeout, || {
        let (nodes_ok, blocks_ok) = parts.store.ready();
        let listed = [
            (parts.pools.lock().ready, "ippools"),
            (nodes_ok, "ipamnodes"),
            (blocks_ok, "ipamblocks"),
            (parts.nodes.ready(), "nodes"),
            (parts.pods.ready(), "pods"),
            (parts.namespaces.ready(), "namespaces"),
        ];
        listed
            .into_iter()
            .filter(|(ok, _)| !ok)
            .map(|(_, what)| what)
            .collect()
    })
    .await
}

/// Polls `laggards` (the resources not listed yet) until none is left; fails naming those
/// that made no progress for `timeout` (counted from the wait's start at the earliest).
async fn wait_until_listed(
    progress: &Progress,
    timeout: Duration,
    laggards: impl Fn() -> Vec<&'static str>,
) -> Result<(), Error> {
    let start = tokio::time::Instant::now();
    loop {
        let left = laggards();
        if left.is_empty() {
            return Ok(());
        }
        let stalled = progress.stalled(&left, start, timeout);
        if !stalled.is_empty() {
            return Err(Error::NotSynced {
                resources: stalled.join(", "),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pools changed: the source takes them, and the nodes plan again for the families
/// they serve now (a family of a new pool is claimed, one whose last pool went is not).
fn tell_pools(pools: &Mutex<Pools>, e: &Engine) {
    let (configs, bad) = pools.lock().configs();
    report_bad_pools(&bad);
    let before = e.source.families();
    e.source.set_pools(configs);
    let after = e.source.families();
    if after != before {
        let (from, to) = (families_label(before), families_label(after));
        tracing::info!(%from, %to, "the IP families the IPPools serve changed; serving them");
        e.manager.families_changed();
    }
    e.manager.pools_changed();
}

/// Families as a log shows them: `ipv4,ipv6`, or `none`.
fn families_label(families: &[Family]) -> String {
    if families.is_empty() {
        return "none".into();
    }
    let names: Vec<&str> = families.iter().map(|f| f.as_str()).collect();
    names.join(",")
}

fn report_bad_pools(bad: &[(String, String)]) {
    for (pool, why) in bad {
        tracing::warn!(%pool, reason = %why, "IPPool left out: its spec cannot be read");
    }
}

/// The source over the synced store and pools, and the engine over it.
fn start_engine(
    parts: &Parts,
    s: &Settings,
    leader: watch::Receiver<bool>,
) -> Result<Engine, Error> {
    let ((configs, bad), pools_at) = {
        let pools = parts.pools.lock();
        (pools.configs(), pools.changes())
    };
    report_bad_pools(&bad);
    let source = ClusterPoolSource::new(parts.store.clone(), configs, s.seed);
    if source.families().is_empty() {
        tracing::warn!("no IPPool: nothing is granted until one is created");
    }
    // live pods' podIPs and every `status.used` entry: no block over them is granted
    // (a cluster adopted with addresses, block objects lost with their CRD)
    let (pods, store) = (parts.pods.clone(), parts.store.clone());
    source.set_in_use(Arc::new(move || {
        let mut in_use = pods.live_ips();
        for n in tidepool_ipam::BlockStore::list_nodes(&store) {
            in_use.extend(n.node.used.keys());
        }
        in_use
    }));
    for (pool, v) in source.validity() {
        if let Err(e) = v {
            tracing::warn!(%pool, error = %e, "IPPool invalid; the other pools work");
        }
    }
    let kube_budget = Budget::new(
        BudgetApi::Kube,
        s.kube_api_qps,
        s.kube_api_burst,
        s.scheduling,
    )?;
    let deps = EngineDeps {
        source: source.clone(),
        store: parts.store.clone(),
        pods: parts.pods.clone(),
        clock: Arc::new(TokioClock::new()),
        source_budget: Budget::unlimited(BudgetApi::Source),
        kube_budget: kube_budget.clone(),
        leader: leader.clone(),
    };
    let manager = NodeManager::new(deps, s.engine.clone())?;
    Ok(Engine {
        manager,
        source,
        pools_at,
        kube_budget,
        leader,
    })
}

/// Hands Node changes to the engine. A Node re-created under its name (a new UID) is an
/// upsert like any other: the engine adopts the node's IPAMNode and blocks under the new
/// UID (DESIGN.md "Reclaim"), which also ends a whole-node reclaim still waiting.
fn apply_node_changes(e: &Engine, nodes: &NodeIndex, changes: Vec<NodeChange>) {
    for c in changes {
        match c {
            NodeChange::Added(info) | NodeChange::Changed(info) => {
                let labels = nodes.labels(&info.name).unwrap_or_default();
                e.source.set_node_labels(&info.name, labels);
                e.manager.upsert_node(info);
            }
            NodeChange::Removed(info) => e.manager.delete_node(&info.name),
        }
    }
}
