//! The simulated cluster: nodes with a node side and a kubelet each, a pod API with an
//! informer lag, an IP source, the real engine, and the observer. Everything runs as
//! tasks on the caller's runtime; under paused tokio time it is virtual and deterministic.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use foldhash::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::heap::{arc_str_bytes, btree_bytes};
use crate::names::NodeNames;
use crate::observer::{Grant, Observer};
use crate::scarcity::oracle::ClaimBudget;
use crate::scarcity::{OracleBook, OracleSettings, PoolKey};
use tidepool_ipam::AddrSet;
use tidepool_ipam::BlockStore;
use tidepool_ipam::IpamError;
use tidepool_ipam::addrs::Run;
use tidepool_ipam::node as node_side;
use tidepool_ipam::node::NodeSide;
use tidepool_ipam::pool::choice::Subject;
use tidepool_ipam::uid_table::{Keyed, UidTable};
use tidepool_ipam::{
    AllocationId, Family, IpamBlock, IpamNode, NodeInfo, NodeName, PerFamily, PodName, PodUid,
    WatermarkOverrides,
};
use tidepool_ipam::{Api, Budget, SchedulingMode};
use tidepool_ipam::{Clock, TokioClock};
use tidepool_ipam::{EngineConfig, EngineDeps, NodeManager};
use tidepool_ipam::{Faults, IpSource, MemorySource};
use tidepool_ipam::{MemoryNodeStore, NodeStore, NodeUid, StoreEvent};
use tidepool_ipam::{MemoryPodView, PodPhase, PodView};

/// The engine as the simulator runs it.
pub type SimManager<S = MemorySource> = NodeManager<S, MemoryNodeStore, MemoryPodView>;

/// What the simulator needs of an IP source beyond [`IpSource`].
pub trait SimSource: IpSource + Clone {
    /// What the source has granted, as runs of addresses with their node: the truth at
    /// the end of a run.
    fn grants(&self) -> Vec<Grant>;
    /// Mutating calls received, and how many were answered "throttled".
    fn calls(&self) -> (u64, u64);
    /// A machine joined (a cloud registers its instance).
    fn machine_added(&self, _node: &NodeName) {}
    /// A machine vanished (a cloud terminates its instance).
    fn vanish(&self, _node: &NodeName) {}
    /// What the call oracle needs of a node's state (a cloud: secondary addresses per
    /// interface); empty for a fresh machine.
    fn snapshot(&self, node: &NodeName) -> Vec<u64>;
    /// The fewest mutating calls that take a node from `from` (a [`SimSource::snapshot`])
    /// to `target` pod addresses per family (0 for a family the pods do not use).
    fn minimum_calls(&self, from: &[u64], target: PerFamily<u64>) -> u64;
    /// For a source whose every call gains or gives back one unit (a block): the units
    /// free now, per family. The call oracle then counts only the gains the source could
    /// give (an exhausted pool gives no more). None: not such a source.
    fn free_units(&self) -> Option<PerFamily<u64>> {
        None
    }
    /// With [`SimSource::free_units`]: the units a node gains and gives back per family to
    /// go from `from` to `target` addresses.
    fn unit_changes(&self, _from: &[u64], _target: PerFamily<u64>) -> PerFamily<(u64, u64)> {
        PerFamily::default()
    }
    /// Each mutating call's latency.
    fn call_latency(&self) -> Duration;
    /// The source's own rate limit (qps, burst), if any.
    fn rate_limit(&self) -> Option<(f64, u32)> {
        None
    }
    /// The most addresses one mutating call can claim, for the scarcity oracle's claim
    /// budget. None: no bound (the in-memory source's, or a block source's, whose calls
    /// claim one block each under the kube budget).
    fn most_per_call(&self) -> Option<u64> {
        None
    }
    /// Whether its grants are IPAMBlocks (the node side then reads its pool and the release
    /// marks from its blocks, and answers on them).
    fn grants_blocks(&self) -> bool {
        false
    }
    /// The usable addresses of a block (the node side reads them from the block's IPPool).
    fn block_addresses(&self, _block: &IpamBlock) -> AddrSet {
        AddrSet::new()
    }
    /// Counts changes of the pools' specs (a block's usable addresses change with them).
    fn pools_generation(&self) -> u64 {
        0
    }
    /// The addresses of `held` (the node's) a pod with `subject` may not take: those
    /// outside its pool of each family (DESIGN.md "Pools per namespace and per pod"; the
    /// agent's rule at ADD). None: it has no pool of some family. Sources without pools:
    /// none.
    fn outside_pod_pools(
        &self,
        _node: &NodeName,
        _held: &AddrSet,
        _subject: &Subject,
        _families: &[Family],
    ) -> Option<AddrSet> {
        Some(AddrSet::new())
    }
    /// The pool of `family` a pod with `subject` (None: no choice of its own) takes on
    /// `node`, for the scarcity measures. None: the source is one pool (the in-memory
    /// source, `--source-capacity`).
    fn scarcity_pool(
        &self,
        _node: &NodeName,
        _family: Family,
        _subject: Option<&Subject>,
    ) -> Option<Arc<str>> {
        None
    }
    /// A pool's usable addresses of `family`, and the addresses per unit it grants in.
    /// None: not a pool of the source.
    fn scarcity_capacity(&self, _pool: &str, _family: Family) -> Option<(u128, u64)> {
        None
    }
    /// Why `addr`, given to a pod with `subject` on `node`, lies outside the pool the pod
    /// resolves to (the observer's check, from the blocks and the pools, not from what the
    /// node side was told); None when it lies inside. Sources without pools: None.
    fn outside_pod_pool(
        &self,
        _node: &NodeName,
        _subject: &Subject,
        _addr: &IpAddr,
    ) -> Option<String> {
        None
    }
}

impl SimSource for MemorySource {
    fn grants(&self) -> Vec<Grant> {
        Grant::of_addresses(MemorySource::granted(self))
    }

    fn calls(&self) -> (u64, u64) {
        MemorySource::calls(self)
    }

    /// Addresses held per family (IPv4, IPv6).
    fn snapshot(&self, node: &NodeName) -> Vec<u64> {
        let h = self.held_by_family(node);
        vec![h.v4, h.v6]
    }

    /// Any number of addresses of one family in one call, up or down.
    fn minimum_calls(&self, from: &[u64], target: PerFamily<u64>) -> u64 {
        per_family(from)
            .zip(Family::ALL.map(|f| *target.get(f)))
            .map(|(have, want)| u64::from(have != want))
            .sum()
    }

    fn call_latency(&self) -> Duration {
        self.latency()
    }
}

impl SimSource for tidepool_ipam::pool::ClusterPoolSource<MemoryNodeStore> {
    /// Every address of every block (the observer tracks whole blocks).
    fn grants(&self) -> Vec<Grant> {
        (tidepool_ipam::pool::ClusterPoolSource::granted(self).iter())
            .map(|(net, node)| Grant::of_net(net, node.clone()))
            .collect()
    }

    fn calls(&self) -> (u64, u64) {
        (tidepool_ipam::pool::ClusterPoolSource::calls(self), 0)
    }

    /// Blocks held per family (IPv4, IPv6).
    fn snapshot(&self, node: &NodeName) -> Vec<u64> {
        let h = self.blocks_held_by_family(node);
        vec![h.v4, h.v6]
    }

    /// One create per block gained, one delete per block given back, in each family with
    /// that family's block size.
    fn minimum_calls(&self, from: &[u64], target: PerFamily<u64>) -> u64 {
        let c = self.unit_changes(from, target);
        c.v4.0 + c.v4.1 + c.v6.0 + c.v6.1
    }

    fn free_units(&self) -> Option<PerFamily<u64>> {
        Some(self.free_blocks())
    }

    fn unit_changes(&self, from: &[u64], target: PerFamily<u64>) -> PerFamily<(u64, u64)> {
        let mut out = PerFamily::default();
        for (have, f) in per_family(from).zip(Family::ALL) {
            let want = u128::from(*target.get(f)).div_ceil(self.grant_size(f).max(1));
            let want = tidepool_ipam::addrs::saturate(want);
            *out.get_mut(f) = (want.saturating_sub(have), have.saturating_sub(want));
        }
        out
    }

    fn call_latency(&self) -> Duration {
        self.latency()
    }

    fn grants_blocks(&self) -> bool {
        true
    }

    fn block_addresses(&self, block: &IpamBlock) -> AddrSet {
        tidepool_ipam::pool::ClusterPoolSource::block_addresses(self, block)
    }

    fn pools_generation(&self) -> u64 {
        tidepool_ipam::pool::ClusterPoolSource::pools_generation(self)
    }

    fn outside_pod_pools(
        &self,
        node: &NodeName,
        held: &AddrSet,
        subject: &Subject,
        families: &[Family],
    ) -> Option<AddrSet> {
        let mut outside = held.clone();
        for &f in families {
            let pool = self.choose(node, f, subject).ok()?;
            outside.subtract(&self.pool_addresses(node, &pool, f));
        }
        Some(outside)
    }

    /// The pool the pod resolves to (the node's, without a choice of its own).
    fn scarcity_pool(
        &self,
        node: &NodeName,
        family: Family,
        subject: Option<&Subject>,
    ) -> Option<Arc<str>> {
        let pool = match subject {
            Some(s) => self.choose(node, family, s).ok()?,
            None => self.pool_of(node, family)?,
        };
        Some(Arc::from(pool))
    }

    /// The pool's usable addresses (its IPPool status), in its blocks.
    fn scarcity_capacity(&self, pool: &str, family: Family) -> Option<(u128, u64)> {
        let usage = self.usage().into_iter().find(|u| u.name == pool)?;
        let addresses = usage.addresses.get(family).map_or(0, |c| c.capacity);
        let unit = u64::try_from(self.grant_size(family)).unwrap_or(u64::MAX);
        Some((addresses, unit))
    }

    fn outside_pod_pool(
        &self,
        node: &NodeName,
        subject: &Subject,
        addr: &IpAddr,
    ) -> Option<String> {
        let pool = match self.choose(node, Family::of(addr), subject) {
            Ok(p) => p,
            Err(e) => return Some(e.to_string()),
        };
        match self.block_holding(node, addr) {
            Some(b) if *b.pool == *pool => None,
            Some(b) => Some(format!(
                "block {} is of pool {}, the pod's is {pool}",
                b.name, b.pool
            )),
            None => Some(format!(
                "no block of {node} holds it (the pod's pool is {pool})"
            )),
        }
    }
}

/// A per-family snapshot (IPv4, IPv6) as two counts (a node never seen: none).
fn per_family(from: &[u64]) -> impl Iterator<Item = u64> + '_ {
    (0..2).map(|i| from.get(i).copied().unwrap_or(0))
}

/// Settings of a simulated world (not of its workload).
#[derive(Debug, Clone)]
pub struct WorldConfig {
    pub families: Vec<Family>,
    /// Allocatable pods of each node.
    pub max_pods: u32,
    /// Addresses per family in the source.
    pub capacity: PerFamily<u64>,
    pub source_latency: Duration,
    pub faults: Faults,
    /// How long the pod informer lags behind the API.
    pub cache_lag: Duration,
    pub reuse_cooldown: Duration,
    pub engine: EngineConfig,
    pub source_qps: f64,
    pub source_burst: u32,
    pub kube_qps: f64,
    pub kube_burst: u32,
    pub scheduling: SchedulingMode,
    pub seed: u64,
}

impl Default for WorldConfig {
    fn default() -> Self {
        Self {
            families: vec![Family::V4],
            max_pods: 250,
            capacity: PerFamily {
                v4: 1 << 24,
                v6: 1 << 24,
            },
            source_latency: Duration::ZERO,
            faults: Faults::default(),
            cache_lag: Duration::from_millis(100),
            reuse_cooldown: Duration::from_secs(30),
            engine: EngineConfig::default(),
            source_qps: 4.0,
            source_burst: 20,
            kube_qps: 50.0,
            kube_burst: 100,
            scheduling: SchedulingMode::Priority,
            seed: 1,
        }
    }
}

/// A pod as its kubelet knows it.
#[derive(Debug, Clone)]
struct SimPod {
    /// Its key in [`Inner::pods`], as the world numbers it (8 bytes where a [`PodUid`]
    /// takes 16: a record is 40 bytes, not 48).
    number: PodNumber,
    /// Its node ([`Inner::names`]).
    node: u32,
    container_id: u64,
    /// When it was scheduled, in nanoseconds since the world's start ([`Inner::base`]):
    /// half an `Instant`'s size, converted exactly.
    scheduled_ns: u64,
    /// When it got its addresses, likewise ([`NOT_STARTED`] while it waits).
    started_ns: u64,
    /// Born before the measured period (its wait is not reported).
    measured: bool,
    /// Its pools, one per family, for the scarcity oracle ([`OracleBook::keys`]).
    pools: u16,
}

impl Keyed for SimPod {
    fn uid(&self) -> PodUid {
        self.number.uid()
    }
}

// a pod table's record, with room for none (the `bool`'s spare values): 40 bytes
const _: () = assert!(size_of::<Option<SimPod>>() == 40);

/// [`SimPod::started_ns`] of a pod still waiting.
const NOT_STARTED: u64 = u64::MAX;

/// `t` as nanoseconds since `base` (exact: whole nanoseconds both ways).
fn ns_since(base: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(base).as_nanos())
        .unwrap_or(NOT_STARTED - 1)
        .min(NOT_STARTED - 1)
}

impl SimPod {
    fn scheduled_at(&self, base: Instant) -> Instant {
        base + Duration::from_nanos(self.scheduled_ns)
    }

    fn started_at(&self, base: Instant) -> Option<Instant> {
        (self.started_ns != NOT_STARTED).then(|| base + Duration::from_nanos(self.started_ns))
    }
}

/// A pod's UID as the world hands it out, a number from 1 up: 8 bytes where a
/// [`PodUid`] takes 16 (a node's list of its pods is kept in these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PodNumber(u64);

impl PodNumber {
    fn uid(self) -> PodUid {
        PodUid(u128::from(self.0))
    }
}

struct Agent {
    /// The UID of its Node object.
    uid: NodeUid,
    /// The machine runs (false once it vanished).
    alive: bool,
    /// Pods waiting for addresses (CNI ADD retried when the pool changes).
    /// (with each pod's current container ID, so a reconcile reads the queue alone)
    queue: VecDeque<(PodUid, u64)>,
    /// Its pods in scheduling order, by number ([`PodNumber`]).
    pods: Vec<PodNumber>,
    /// A wake-up queued in [`Inner::cooldowns`] for this node, no later than its earliest
    /// cooldown end when it was queued; `None`: maybe none. A later one is not queued while
    /// this one stands: the reconcile it wakes queues the next cooldown end.
    wake_at: Option<Instant>,
}

impl Agent {
    /// Its pods' UIDs, in scheduling order.
    fn pod_uids(&self) -> Vec<PodUid> {
        self.pods.iter().map(|n| n.uid()).collect()
    }
}

/// Counters the world keeps of its workload.
#[derive(Debug, Clone, Default)]
pub struct WorkloadStats {
    pub started: u64,
    pub deleted: u64,
    pub leaked_by_crash: u64,
    pub waited_for_ip: u64,
    pub wait_seconds: Vec<f64>,
    /// The waits of the pods scheduled after the measured period's first instant (those
    /// scheduled at it are its bring-up: the nodes' first pods at once).
    pub wait_seconds_after_bring_up: Vec<f64>,
    /// Pods scheduled at the measured period's first instant that got their addresses.
    pub bring_up: u64,
    /// Pods that left the queue without an address: deleted, or lost with their machine.
    pub left_unserved: u64,
    /// Crashed pods younger than reclaim_min_age at deletion.
    pub held_by_min_age: u64,
    /// Simulated events processed (pod and node events, node-side answers).
    pub events: u64,
}

struct Inner {
    /// By UID (only looked up: a compact table that churn does not grow).
    pods: UidTable<SimPod>,
    /// By node name (a hash map: looked up on every pod event, iterated only for sums).
    agents: HashMap<NodeName, Agent>,
    /// The names of the agents that are alive, in name order (kept with `agents`, so the
    /// workload can pick a live node without listing them all).
    live: Vec<NodeName>,
    /// The nodes' names by number (a pod names its node by number).
    names: NodeNames,
    /// The last pod number handed out: the world's pod UIDs are these numbers.
    next_uid: u64,
    next_container: u64,
    next_node_uid: u128,
    /// When the node sides must look again (a cooldown ends); see [`Agent::wake_at`] for
    /// what is left out.
    cooldowns: BinaryHeap<Reverse<(Instant, NodeName)>>,
    stats: WorkloadStats,
    measure_from: Instant,
    /// What the pods' times count from.
    base: Instant,
    /// The scarcity oracle of each pool, fed by the pods' events.
    book: OracleBook,
}

impl Inner {
    /// `now` as the oracle's time (since [`Inner::base`]).
    fn offset(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.base)
    }

    /// A pod of `node` left it (deleted, or lost with its machine).
    fn depart(&mut self, node: &NodeName, pod: &SimPod, crashed: bool, now: Instant) {
        let at = self.offset(now);
        let started = (pod.started_ns != NOT_STARTED).then(|| Duration::from_nanos(pod.started_ns));
        (self.book).each(pod.pools, |o| o.depart(at, node, started, crashed));
    }

    /// Has the node side of `node` look again at `at`, unless it already will by then.
    fn wake_at(&mut self, node: &NodeName, at: Instant) {
        let Some(a) = self.agents.get_mut(node) else {
            return;
        };
        if a.wake_at.is_some_and(|q| q <= at) {
            return;
        }
        a.wake_at = Some(at);
        self.cooldowns.push(Reverse((at, node.clone())));
    }
}

/// The simulated world. Cheap to clone.
#[derive(Clone)]
pub struct World<S = MemorySource> {
    pub cfg: Arc<WorldConfig>,
    pub source: S,
    pub store: MemoryNodeStore,
    pub pods: MemoryPodView,
    pub observer: Arc<Observer>,
    pub manager: SimManager<S>,
    pub clock: Arc<TokioClock>,
    pub leader: Arc<watch::Sender<bool>>,
    inner: Arc<Mutex<Inner>>,
    wake: Arc<tokio::sync::Notify>,
    /// cluster-pool: each node's pool as its blocks make it, kept between reconciles.
    projections: Arc<Mutex<HashMap<NodeName, Projection>>>,
}

/// What one write of the node side did: whether it wrote, the pods it served with their
/// addresses, and when its next cooldown ends.
#[derive(Default)]
struct Served {
    written: bool,
    started: Vec<(PodUid, Vec<IpAddr>)>,
    next_cooldown_end: Option<SystemTime>,
}

/// A node as its blocks make it (cluster-pool: [`node_side::project`]), kept so that a
/// reconcile rebuilds it only when the node's blocks or the pools changed. Its identity and
/// tombstones are refreshed from the IPAMNode before each use.
struct Projection {
    /// The store's version of the node's blocks ([`BlockStore::node_blocks_changes`]) and the
    /// source's pool generation it was built at: a block's usable addresses and marks
    /// change only with its object or its pool's spec.
    blocks_at: u64,
    pools: u64,
    /// Whether a block carried a release mark or an answer (the node side has to answer).
    marked: bool,
    view: IpamNode,
}

impl Projection {
    fn build(
        node: &IpamNode,
        blocks: &[Arc<IpamBlock>],
        views: &[node_side::BlockView],
        blocks_at: u64,
        pools: u64,
    ) -> Projection {
        Projection {
            blocks_at,
            pools,
            marked: blocks.iter().any(|b| b.release || b.ack.is_some()),
            view: project(node, views),
        }
    }

    /// Takes the node's identity and tombstones (what `project` copies from it).
    fn refresh(&mut self, node: &IpamNode) {
        let v = &mut self.view;
        v.name.clone_from(&node.name);
        v.node_uid = node.node_uid;
        v.resource_version = node.resource_version.clone();
        v.watermarks = node.watermarks;
        v.finalizer = node.finalizer;
        if v.operator.reclaim != node.operator.reclaim {
            v.operator.reclaim.clone_from(&node.operator.reclaim);
        }
    }

    /// Estimated heap bytes (see [`World::world_heap_estimate`]).
    fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let (ip, run) = (size_of::<IpAddr>(), size_of::<Run>());
        btree_bytes(self.view.operator.addresses.run_count(), run)
            + btree_bytes(self.view.operator.release.run_count(), run + 1)
            + btree_bytes(self.view.operator.reclaim.len(), ip + 32)
    }
}

impl World {
    /// Builds the world on the in-memory source and starts its engine (leading) and
    /// node-side tasks. Must be called inside a tokio runtime.
    pub fn start(cfg: WorldConfig) -> Result<World, IpamError> {
        World::start_with(cfg, |cfg, observer, _store| {
            let source = MemorySource::new(&cfg.families, cfg.capacity, cfg.seed)
                .with_latency(cfg.source_latency)
                .with_hook(observer);
            source.set_faults(cfg.faults);
            Ok(source)
        })
    }
}

impl<S: SimSource> World<S> {
    /// Builds the world on the source `make` returns (given the observer to hook in).
    pub fn start_with(
        cfg: WorldConfig,
        make: impl FnOnce(&WorldConfig, Arc<Observer>, &MemoryNodeStore) -> Result<S, IpamError>,
    ) -> Result<World<S>, IpamError> {
        let observer = Arc::new(Observer::new());
        let store = MemoryNodeStore::new().with_hook(observer.clone());
        let source = make(&cfg, observer.clone(), &store)?;
        let pods = MemoryPodView::new(cfg.cache_lag);
        let clock = Arc::new(TokioClock::anchored(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        ));
        let (leader, leader_rx) = watch::channel(true);
        let source_budget = Budget::new(
            Api::Source,
            cfg.source_qps,
            cfg.source_burst,
            cfg.scheduling,
        )?;
        let kube_budget = Budget::new(Api::Kube, cfg.kube_qps, cfg.kube_burst, cfg.scheduling)?;
        let manager = NodeManager::new(
            EngineDeps {
                source: source.clone(),
                store: store.clone(),
                pods: pods.clone(),
                clock: clock.clone() as Arc<dyn Clock>,
                source_budget,
                kube_budget,
                leader: leader_rx,
            },
            cfg.engine.clone(),
        )?;
        let events = store.subscribe();
        let settings = oracle_settings(&cfg, &source);
        let world = World {
            cfg: Arc::new(cfg),
            source,
            store,
            pods,
            observer,
            manager,
            clock,
            leader: Arc::new(leader),
            inner: Arc::new(Mutex::new(Inner {
                pods: UidTable::default(),
                agents: HashMap::default(),
                live: Vec::new(),
                names: NodeNames::default(),
                next_uid: 1,
                next_container: 1,
                next_node_uid: 1,
                cooldowns: BinaryHeap::new(),
                stats: WorkloadStats::default(),
                measure_from: Instant::now(),
                base: Instant::now(),
                book: OracleBook::new(settings),
            })),
            wake: Arc::new(tokio::sync::Notify::new()),
            projections: Arc::default(),
        };
        world.manager.spawn_resync_loop();
        tokio::spawn(world.clone().node_side_loop(events));
        Ok(world)
    }

    /// The node sides: forward every change to the engine (its informer), answer the
    /// operator's writes, and look again when a cooldown ends.
    async fn node_side_loop(self, mut events: tokio::sync::mpsc::UnboundedReceiver<StoreEvent>) {
        loop {
            let next_cooldown = self.inner.lock().cooldowns.peek().map(|Reverse((t, _))| *t);
            let sleep = async {
                match next_cooldown {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                ev = events.recv() => {
                    let Some(ev) = ev else { return };
                    self.manager.on_store_event(&ev);
                    if ev.writer == tidepool_ipam::Writer::Operator {
                        self.reconcile(&ev.name);
                    }
                }
                _ = self.wake.notified() => {}
                _ = sleep => {
                    let now = Instant::now();
                    let due: Vec<NodeName> = {
                        let mut g = self.inner.lock();
                        let mut due = Vec::new();
                        // (a mass deletion makes every node due at once)
                        let mut seen = foldhash::HashSet::default();
                        while let Some(Reverse((t, _))) = g.cooldowns.peek() {
                            if *t > now { break; }
                            let Reverse((t, n)) = g.cooldowns.pop().expect("peeked");
                            if let Some(a) = g.agents.get_mut(&n)
                                && a.wake_at == Some(t)
                            {
                                a.wake_at = None;
                            }
                            if seen.insert(n.clone()) {
                                due.push(n);
                            }
                        }
                        due
                    };
                    for n in due {
                        self.reconcile(&n);
                    }
                }
            }
        }
    }

    /// Starts a measured period: waits and latencies before now are not reported.
    pub fn start_measuring(&self) {
        self.observer.start_measuring();
        let mut g = self.inner.lock();
        g.measure_from = Instant::now();
        let at = g.offset(g.measure_from);
        g.book.measure_from(at);
        g.stats = WorkloadStats::default();
        for p in g.pods.values_mut() {
            p.measured = false;
        }
    }

    pub fn workload_stats(&self) -> WorkloadStats {
        self.inner.lock().stats.clone()
    }

    /// Adds a node (its Node object and machine) and returns its name.
    pub fn add_node(&self, name: &str) -> NodeName {
        let name: NodeName = name.into();
        self.source.machine_added(&name);
        let uid = {
            let mut g = self.inner.lock();
            g.next_node_uid += 1;
            let uid = NodeUid(g.next_node_uid);
            g.agents.insert(
                name.clone(),
                Agent {
                    uid,
                    alive: true,
                    queue: VecDeque::new(),
                    pods: Vec::new(),
                    wake_at: None,
                },
            );
            if let Err(i) = g.live.binary_search(&name) {
                g.live.insert(i, name.clone());
            }
            g.stats.events += 1;
            uid
        };
        if self.store.cached(&name).is_some() {
            // a machine under a known name: its status may hold cooldowns whose wake-ups
            // came while no machine answered
            self.inner.lock().wake_at(&name, Instant::now());
            self.wake.notify_one();
        }
        self.observer.machine_joined(&name);
        self.manager.upsert_node(NodeInfo {
            name: name.clone(),
            uid,
            allocatable_pods: self.cfg.max_pods,
            cordoned: false,
            terminating: false,
        });
        name
    }

    /// A user sets a node's watermark overrides.
    pub fn set_watermarks(&self, node: &NodeName, w: WatermarkOverrides) {
        self.store.set_watermarks(node, w);
    }

    /// Schedules a new pod to `node`; its kubelet asks for addresses at once.
    pub fn schedule_pod(&self, node: &NodeName) -> PodUid {
        self.schedule(node, None)
    }

    /// [`World::schedule_pod`] for a pod whose pools are chosen by `subject` (its labels
    /// and annotations, its namespace's).
    pub fn schedule_pod_with(&self, node: &NodeName, subject: Subject) -> PodUid {
        self.schedule(node, Some(subject))
    }

    fn schedule(&self, node: &NodeName, subject: Option<Subject>) -> PodUid {
        let keys: Vec<PoolKey> = (self.cfg.families.iter())
            .map(|&f| self.pool_key(node, f, subject.as_ref()))
            .collect();
        let uid = {
            let mut g = self.inner.lock();
            let at = g.offset(Instant::now());
            let pools = g.book.set_of(keys, |k| self.pool_size(k), at);
            g.book.each(pools, |o| o.arrive(at, node));
            g.next_uid += 1;
            g.next_container += 1;
            let number = PodNumber(g.next_uid);
            let uid = number.uid();
            let cid = g.next_container;
            let scheduled_ns = ns_since(g.base, Instant::now());
            let node_id = g.names.id(node);
            g.pods.insert(SimPod {
                number,
                node: node_id,
                container_id: cid,
                scheduled_ns,
                started_ns: NOT_STARTED,
                measured: true,
                pools,
            });
            if let Some(a) = g.agents.get_mut(node) {
                a.queue.push_back((uid, cid));
                a.pods.push(number);
            }
            g.stats.events += 1;
            uid
        };
        if let Some(subject) = subject {
            self.pods.set_pool_subject(uid, subject);
        }
        self.pods.add(uid, node.clone());
        self.manager.on_pod_event(node);
        self.reconcile(node);
        uid
    }

    /// Deletes a pod. A crash leaves its `used` entry behind (no DEL reaches the node side).
    pub fn delete_pod(&self, uid: PodUid, crash: bool) {
        let now = Instant::now();
        let Some((p, node, started_at)) = ({
            let mut guard = self.inner.lock();
            let g = &mut *guard;
            let base = g.base;
            let p = g.pods.remove(&uid);
            let node = p.as_ref().map(|p| g.names.name(p.node).clone());
            if let (Some(p), Some(node)) = (&p, &node)
                && let Some(a) = g.agents.get_mut(node)
            {
                let queued = a.queue.len();
                a.queue.retain(|(u, _)| *u != uid);
                a.pods.retain(|u| u.uid() != uid);
                let unserved = (queued - a.queue.len()) as u64;
                // a pod of a vanished machine left the oracle with it
                let alive = a.alive;
                g.stats.left_unserved += unserved;
                if alive {
                    g.depart(node, p, crash, now);
                }
            }
            p.zip(node).map(|(p, node)| {
                let started_at = p.started_at(base);
                (p, node, started_at)
            })
        }) else {
            return;
        };
        // its entry's age as the operator could know it: since the pod got its addresses
        let young = started_at
            .is_some_and(|t| now.saturating_duration_since(t) < self.cfg.engine.reclaim.min_age);
        self.pods.delete(uid);
        if started_at.is_some() {
            // reclaim latency counts pods older than the minimum age; younger ones are
            // reported as held by it
            self.observer.pod_stopped(uid, crash && !young);
            if !crash {
                let utc = self.clock.utc();
                let cd = self.cfg.reuse_cooldown;
                self.store.update_node(&node, |_, side| {
                    let mut ns = NodeSide::take_published(side, cd);
                    let key = allocation(p.container_id);
                    let freed = !ns.del(&key, Some(uid), utc).freed().is_empty();
                    publish(ns, side, utc);
                    freed
                });
                self.inner.lock().wake_at(&node, now + cd);
                self.wake.notify_one();
            }
        }
        {
            let mut g = self.inner.lock();
            g.stats.deleted += 1;
            g.stats.events += 1;
            if crash && started_at.is_some() {
                g.stats.leaked_by_crash += 1;
                if young {
                    g.stats.held_by_min_age += 1;
                }
            }
        }
        self.pod_deleted_event(&node);
        self.reconcile(&node);
    }

    /// The pod informer's events for a deletion: one now, and one when the cache shows
    /// the deletion (`cache_lag` later). A real informer updates its cache before it
    /// delivers the event; the engine relies on that (its first reclaim observation is
    /// the event itself, and nothing else looks again at a node whose last pass saw no
    /// candidate), so an event that only precedes the cache update would leak the
    /// crashed pod's addresses.
    fn pod_deleted_event(&self, node: &NodeName) {
        self.manager.on_pod_event(node);
        let lag = self.cfg.cache_lag;
        if !lag.is_zero() {
            let manager = self.manager.clone();
            let node = node.clone();
            tokio::spawn(async move {
                tokio::time::sleep(lag).await;
                manager.on_pod_event(&node);
            });
        }
    }

    /// The pod reached a terminal phase (its containers stopped without a DEL).
    pub fn finish_pod(&self, uid: PodUid, phase: PodPhase) {
        let node = {
            let g = self.inner.lock();
            g.pods.get(&uid).map(|p| g.names.name(p.node).clone())
        };
        if let Some(node) = node {
            self.observer.pod_stopped(uid, true);
            self.pods.set_terminal(uid, phase);
            self.manager.on_pod_event(&node);
        }
    }

    /// The kubelet restarts a pod's sandbox: a new ADD with a new container ID while the
    /// old entry stays (its DEL never arrived). Returns the new addresses.
    pub fn replace_sandbox(&self, uid: PodUid) -> Option<Vec<IpAddr>> {
        let (node, cid) = {
            let mut g = self.inner.lock();
            g.next_container += 1;
            let cid = g.next_container;
            let p = g.pods.get_mut(&uid)?;
            p.container_id = cid;
            let node_id = p.node;
            let node = g.names.name(node_id).clone();
            // a pod still waiting asks with its new container ID too
            if let Some(q) = g
                .agents
                .get_mut(&node)
                .and_then(|a| a.queue.iter_mut().find(|(u, _)| *u == uid))
            {
                q.1 = cid;
            }
            (node, cid)
        };
        self.observer.pod_stopped(uid, true);
        let proj = if self.source.grants_blocks() {
            let n = self.store.cached(&node)?;
            Some(self.projection(&n))
        } else {
            None
        };
        let mut got = None;
        let utc = self.clock.utc();
        let families = &self.cfg.families;
        let cd = self.cfg.reuse_cooldown;
        // read before the update, which holds the store
        let held = proj.as_ref().map(|p| p.view.operator.addresses.clone());
        let exclude = self.outside_pools(&node, held.as_deref(), uid);
        let written = self.store.update_node(&node, |stored, side| {
            let n = proj.as_ref().map_or(stored, |p| &p.view);
            let mut ns = NodeSide::take_published(side, cd);
            if let Some(exclude) = &exclude {
                got = add(&mut ns, n, families, exclude, uid, cid, utc);
            }
            publish(ns, side, utc);
            got.as_ref().is_some_and(|a| !a.is_empty())
        });
        if let Some(p) = proj {
            self.projections.lock().insert(node.clone(), p);
        }
        written?;
        let addrs = got?;
        self.observer.pod_started(&node, uid, &addrs);
        self.check_pools(&node, uid, &addrs);
        self.pods.set_running(uid, addrs.clone());
        self.manager.on_pod_event(&node);
        Some(addrs)
    }

    /// The machine vanishes with its pods: no DEL, no more answers.
    pub fn vanish_machine(&self, node: &NodeName) {
        let uids = {
            let mut g = self.inner.lock();
            g.stats.events += 1;
            let Some(a) = g.agents.get_mut(node) else {
                return;
            };
            a.alive = false;
            let unserved = a.queue.len() as u64;
            a.queue.clear();
            let uids = a.pod_uids();
            g.stats.left_unserved += unserved;
            // its pods leave as crashed ones do: their addresses are held until reclaimed
            let now = Instant::now();
            for u in &uids {
                if let Some(p) = g.pods.get(u).cloned() {
                    g.depart(node, &p, true, now);
                }
            }
            if let Ok(i) = g.live.binary_search(node) {
                g.live.remove(i);
            }
            uids
        };
        self.projections.lock().remove(node);
        for uid in uids {
            self.observer.pod_stopped(uid, false);
        }
        self.observer.machine_vanished(node);
        self.source.vanish(node);
    }

    /// The Node object is deleted; the pod garbage collector deletes its pods.
    pub fn delete_node_object(&self, node: &NodeName) {
        let uids = {
            let mut g = self.inner.lock();
            g.stats.events += 1;
            let agent = g.agents.remove(node);
            let alive = agent.as_ref().is_some_and(|a| a.alive);
            let uids = agent.as_ref().map(Agent::pod_uids).unwrap_or_default();
            if let Ok(i) = g.live.binary_search(node) {
                g.live.remove(i);
            }
            let now = Instant::now();
            for u in &uids {
                if let Some(p) = g.pods.remove(u)
                    && alive
                {
                    g.depart(node, &p, false, now);
                }
            }
            uids
        };
        self.projections.lock().remove(node);
        for uid in uids {
            self.pods.delete(uid);
        }
        self.manager.delete_node(node);
        self.pod_deleted_event(node);
    }

    /// The pool a pod of `node` with `subject` takes, for the scarcity measures.
    pub(crate) fn pool_key(
        &self,
        node: &NodeName,
        family: Family,
        subject: Option<&Subject>,
    ) -> PoolKey {
        let pool = (self.source.scarcity_pool(node, family, subject))
            .unwrap_or_else(|| Arc::from("source"));
        PoolKey { pool, family }
    }

    /// A pool's usable addresses and addresses per unit (the in-memory source: its
    /// capacity, per address).
    pub(crate) fn pool_size(&self, key: &PoolKey) -> (u128, u64) {
        (self.source.scarcity_capacity(&key.pool, key.family))
            .unwrap_or_else(|| (u128::from(*self.cfg.capacity.get(key.family)), 1))
    }

    /// The pods waiting on live machines: their node, UID, when they were scheduled, and
    /// their pools.
    pub(crate) fn waiting_pods(&self) -> Vec<(NodeName, PodUid, Instant, Vec<PoolKey>)> {
        let g = self.inner.lock();
        let mut out = Vec::new();
        for (name, a) in g.agents.iter().filter(|(_, a)| a.alive) {
            for (uid, _) in &a.queue {
                if let Some(p) = g.pods.get(uid) {
                    let keys = g.book.keys(p.pools).to_vec();
                    out.push((name.clone(), *uid, p.scheduled_at(g.base), keys));
                }
            }
        }
        out
    }

    /// A pool's usable addresses changed (a cloud subnet's, as interfaces come and go).
    pub(crate) fn pool_resized(&self, key: &PoolKey, (addresses, unit): (u128, u64)) {
        let mut g = self.inner.lock();
        let at = g.offset(Instant::now());
        g.book.set_capacity(key, at, addresses, unit);
    }

    /// The highest share of its pool any pool's pods and holds occupy now (the oracles'
    /// running count: cheap, unlike a walk of the store).
    pub(crate) fn busiest_pool_share(&self) -> f64 {
        self.inner.lock().book.busiest_share()
    }

    /// Each pool's (oracle, actual) pod-waiting seconds of the measured period, to now.
    pub fn scarcity_waits(&self) -> std::collections::BTreeMap<PoolKey, (f64, f64)> {
        let mut g = self.inner.lock();
        let at = g.offset(Instant::now());
        g.book.finish(at)
    }

    /// Pods on a node (running or waiting), in scheduling order.
    pub fn pods_on(&self, node: &str) -> Vec<PodUid> {
        self.inner
            .lock()
            .agents
            .get(node)
            .map(Agent::pod_uids)
            .unwrap_or_default()
    }

    /// The UID the world gave the Node object of `node` (while its machine is known).
    pub fn node_uid(&self, node: &str) -> Option<NodeUid> {
        self.inner.lock().agents.get(node).map(|a| a.uid)
    }

    /// Pods on `node` still waiting for an address.
    pub fn waiting_on(&self, node: &str) -> usize {
        self.inner
            .lock()
            .agents
            .get(node)
            .map_or(0, |a| a.queue.len())
    }

    /// Pods still waiting for an address.
    pub fn waiting(&self) -> usize {
        self.inner
            .lock()
            .agents
            .values()
            .map(|a| a.queue.len())
            .sum()
    }

    /// Live nodes (machines running), in name order.
    pub fn live_nodes(&self) -> Vec<NodeName> {
        self.inner.lock().live.clone()
    }

    /// How many nodes are live.
    pub fn live_count(&self) -> usize {
        self.inner.lock().live.len()
    }

    /// The `i`th live node in name order (`live_nodes()[i]` without the list).
    pub fn live_node(&self, i: usize) -> Option<NodeName> {
        self.inner.lock().live.get(i).cloned()
    }

    /// The node side answers the operator and serves waiting pods.
    fn reconcile(&self, name: &NodeName) {
        let Some(queue) = self.waiting_queue(name) else {
            return;
        };
        let utc = self.clock.utc();
        let mut answers = node_side::Answers::default();
        let proj = if self.source.grants_blocks() {
            let Some(p) = self.answer_blocks(name, utc, &mut answers) else {
                return;
            };
            Some(p)
        } else {
            None
        };
        let served = self.serve_node_side(name, proj.as_ref(), &queue, utc, &mut answers);
        if let Some(p) = proj {
            self.projections.lock().insert(name.clone(), p);
        }
        let now = Instant::now();
        if let Some(t) = served.next_cooldown_end {
            let at = now + t.duration_since(utc).unwrap_or_default();
            self.inner.lock().wake_at(name, at);
        }
        if !served.written {
            return;
        }
        self.observer.node_answers(
            name,
            &answers.ready,
            &answers.resumed,
            answers.reclaimed.len(),
        );
        if served.started.is_empty() {
            return;
        }
        self.count_started(name, &served.started, now);
        for (uid, addrs) in served.started {
            self.observer.pod_started(name, uid, &addrs);
            self.check_pools(name, uid, &addrs);
            self.pods.set_running(uid, addrs);
        }
        self.manager.on_pod_event(name);
    }

    /// The pods waiting on a live machine (pod UID, container ID), in order; None when the
    /// machine is gone or not running.
    fn waiting_queue(&self, name: &NodeName) -> Option<Vec<(PodUid, u64)>> {
        let g = self.inner.lock();
        match g.agents.get(name) {
            Some(a) if a.alive => Some(a.queue.iter().copied().collect()),
            _ => None,
        }
    }

    /// Cluster-pool: the pool is the union of the node's blocks, and the release marks and
    /// answers live on them. Answers the marked blocks and returns the node's projection;
    /// None when the IPAMNode is not in the cache.
    fn answer_blocks(
        &self,
        name: &NodeName,
        utc: SystemTime,
        answers: &mut node_side::Answers,
    ) -> Option<Projection> {
        let node = self.store.cached(name)?;
        // blocks as the kept projection saw them, none marked: nothing to answer
        let at = self.store.node_blocks_changes(name);
        let quiet = self
            .projections
            .lock()
            .get(name)
            .is_some_and(|p| p.blocks_at == at && !p.marked);
        if !quiet {
            let answering: Vec<node_side::BlockView> = self
                .store
                .blocks_of(name)
                .iter()
                .filter(|b| b.release || b.ack.is_some())
                .map(|b| self.block_view(b, true))
                .collect();
            let cd = self.cfg.reuse_cooldown;
            let mut ns = NodeSide::from_published(&node.node, cd);
            let none = AddrSet::new();
            for (block, ack) in ns.answer_blocks(&answering, &none, utc, answers) {
                self.store.ack_block(&block, ack);
            }
        }
        // read, then let go of the object: the write below changes it in place
        Some(self.projection(&node))
    }

    /// One write of the node side: answers tombstones (and, off the cluster pool, address
    /// marks), ends cooldowns, forgets what left the pool, then serves `queue` in order
    /// until the pool runs dry.
    fn serve_node_side(
        &self,
        name: &NodeName,
        proj: Option<&Projection>,
        queue: &[(PodUid, u64)],
        utc: SystemTime,
        answers: &mut node_side::Answers,
    ) -> Served {
        // the node side sees the pods bound to it (its kubelet's), not Succeeded or Failed
        let live = |uid: PodUid| {
            (self.pods.truth(uid)).is_some_and(|p| p.node == *name && !p.phase.is_terminal())
        };
        let (cd, families) = (self.cfg.reuse_cooldown, &self.cfg.families);
        let mut served = Served::default();
        // read before the update, which holds the store
        let held = proj.map(|p| p.view.operator.addresses.clone());
        let excludes: Vec<Option<AddrSet>> = (queue.iter())
            .map(|(uid, _)| self.outside_pools(name, held.as_deref(), *uid))
            .collect();
        let written = self.store.update_node(name, |stored, side| {
            // sim-cloud: the object itself (its node-side fields are in `side`)
            let node = proj.map_or(stored, |p| &p.view);
            let mut ns = NodeSide::take_published(side, cd);
            let ops = &node.operator;
            answers.reclaimed = ns.answer_tombstones(&ops.reclaim, Some, live, utc);
            if proj.is_none() {
                ns.answer_marks(node, &AddrSet::new(), utc, answers);
            }
            ns.forget_outside(&ops.addresses);
            let mut changed = ns.is_dirty();
            for ((uid, cid), exclude) in queue.iter().zip(&excludes) {
                // no pool the pod may use: it waits, the others go on
                let Some(exclude) = exclude else {
                    continue;
                };
                match add(&mut ns, node, families, exclude, *uid, *cid, utc) {
                    Some(addrs) => {
                        changed |= !addrs.is_empty();
                        served.started.push((*uid, addrs));
                    }
                    // a pod of a pool of its own waits for that pool alone
                    None if !exclude.is_empty() => continue,
                    None => break,
                }
            }
            served.next_cooldown_end = ns.next_cooldown_end(utc);
            publish(ns, side, utc);
            changed
        });
        served.written = written.is_some();
        served
    }

    /// The addresses of `held` (the node's blocks', as its node side sees them; None off
    /// the cluster pool) outside the pod's pools ([`SimSource::outside_pod_pools`]); none
    /// for a pod without a pool choice of its own.
    fn outside_pools(
        &self,
        name: &NodeName,
        held: Option<&AddrSet>,
        uid: PodUid,
    ) -> Option<AddrSet> {
        let (Some(held), Some(subject)) = (held, self.pods.pool_subject(uid)) else {
            return Some(AddrSet::new());
        };
        (self.source).outside_pod_pools(name, held, &subject, &self.cfg.families)
    }

    /// The observer's check that a pod with a pool choice of its own got its addresses from
    /// its pools.
    fn check_pools(&self, node: &NodeName, uid: PodUid, addrs: &[IpAddr]) {
        let Some(subject) = self.pods.pool_subject(uid) else {
            return;
        };
        for a in addrs {
            if let Some(why) = self.source.outside_pod_pool(node, &subject, a) {
                self.observer.outside_pod_pool(node, uid, *a, &why);
            }
        }
    }

    /// The pods just served leave the queue; their wait for an address is counted.
    fn count_started(&self, name: &NodeName, started: &[(PodUid, Vec<IpAddr>)], now: Instant) {
        let mut g = self.inner.lock();
        let (measure_from, base) = (g.measure_from, g.base);
        for (uid, _) in started {
            if let Some(a) = g.agents.get_mut(name) {
                // the pods served are the first in the queue, in order
                if a.queue.front().is_some_and(|(u, _)| u == uid) {
                    a.queue.pop_front();
                } else {
                    a.queue.retain(|(u, _)| u != uid);
                }
                if a.queue.is_empty() && a.queue.capacity() > 8 {
                    // a drained burst (the warm-up's) gives its room back
                    a.queue = VecDeque::new();
                }
            }
            let p = g.pods.get_mut(uid).expect("queued pods exist");
            p.started_ns = ns_since(base, now);
            let (at, measured, pools) = (p.scheduled_at(base), p.measured, p.pools);
            let offset = g.offset(now);
            g.book.each(pools, |o| o.started(offset, name));
            if measured && at >= measure_from {
                let wait = now.saturating_duration_since(at).as_secs_f64();
                g.stats.started += 1;
                g.stats.wait_seconds.push(wait);
                if at == measure_from {
                    g.stats.bring_up += 1;
                } else {
                    g.stats.wait_seconds_after_bring_up.push(wait);
                }
                if wait > 0.0 {
                    g.stats.waited_for_ip += 1;
                }
            }
            g.stats.events += 1;
        }
    }

    /// A node's pool as its node side sees it: its blocks' addresses (cluster-pool), or
    /// IPAMNode `spec.addresses`.
    pub fn pool_addresses(&self, node: &IpamNode) -> AddrSet {
        if self.source.grants_blocks() {
            let mut pool = AddrSet::new();
            for b in self.store.blocks_of(&node.name).iter() {
                pool.union_with(&self.source.block_addresses(b));
            }
            pool
        } else {
            (*node.operator.addresses).clone()
        }
    }

    /// A block as its node side reads it (cluster-pool). With `answering`, a block that
    /// [`node_side::answer_blocks`] answers (one with a release mark or an answer) lists
    /// every address of the block in `all` (the others never need it: empty).
    fn block_view(&self, b: &IpamBlock, answering: bool) -> node_side::BlockView {
        node_side::BlockView {
            name: b.name.clone(),
            addrs: self.source.block_addresses(b),
            all: if answering && (b.release || b.ack.is_some()) {
                AddrSet::of_net(&b.cidr)
            } else {
                AddrSet::new()
            },
            release: b.release,
            ack: b.ack,
        }
    }

    /// The node as its blocks make it ([`node_side::project`]): the kept projection when
    /// neither the blocks nor the pools changed since it was built, else a new one. The
    /// caller puts it back into `projections` when done.
    fn projection(&self, node: &IpamNode) -> Projection {
        // the version first: a block written after it makes the next call build again
        let at = self.store.node_blocks_changes(&node.name);
        let pools = self.source.pools_generation();
        let kept = self.projections.lock().remove(&node.name);
        match kept {
            Some(mut p) if p.blocks_at == at && p.pools == pools => {
                p.refresh(node);
                p
            }
            _ => {
                let blocks = self.store.blocks_of(&node.name);
                let views: Vec<node_side::BlockView> =
                    blocks.iter().map(|b| self.block_view(b, false)).collect();
                Projection::build(node, &blocks, &views, at, pools)
            }
        }
    }

    /// Every live node settled in the engine's view and no pod waiting.
    pub fn all_settled(&self) -> bool {
        // the counter first: counting the waiting pods walks every node
        self.manager.unsettled() == 0 && self.waiting() == 0
    }

    /// Advances virtual time until every node is settled (checking every `step`), at most
    /// `limit`. Returns whether it settled.
    pub async fn settle(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        let step = Duration::from_millis(250);
        loop {
            tokio::time::sleep(step).await;
            if self.all_settled() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
        }
    }

    /// Stops the engine's tasks.
    pub fn shutdown(&self) {
        self.manager.shutdown();
    }

    /// The IPAMNode of a node.
    pub fn node(&self, name: &str) -> Option<Arc<IpamNode>> {
        self.store.cached(name)
    }
}

impl<S: SimSource> World<S> {
    /// The simulated world's heap as a deterministic size estimate from its structures'
    /// element counts and `size_of` (not an allocator measurement): the API server's
    /// objects (IPAMNodes with their maps, IPAMBlocks), the pod API, the kubelets' pod
    /// records, and the observer. Everything else the process holds belongs to the engine.
    pub fn world_heap_estimate(&self) -> usize {
        use std::mem::size_of;
        let (ip, run) = (size_of::<IpAddr>(), size_of::<Run>());
        let mut bytes = 0;
        for n in self.store.list() {
            bytes += size_of::<IpamNode>() + 16 + arc_str_bytes(n.name.len());
            let side = &n.node;
            bytes += side.used.heap_bytes();
            bytes += btree_bytes(side.cooldown.len(), ip + size_of::<SystemTime>());
            bytes += btree_bytes(side.release_ack.run_count(), run + 1);
            bytes += btree_bytes(side.reclaim_ack.len(), ip + 32);
            let op = &n.operator;
            bytes += btree_bytes(op.addresses.run_count(), run);
            bytes += btree_bytes(op.release.run_count(), run + 1);
            bytes += btree_bytes(op.reclaim.len(), ip + 32);
            bytes += self.store.blocks_of(&n.name).len()
                * (btree_bytes(1, 48 + size_of::<IpamBlock>()) / 7 + 2 * arc_str_bytes(24));
        }
        bytes += self.pods.heap_estimate();
        bytes += self.observer.heap_estimate();
        {
            let p = self.projections.lock();
            bytes += tidepool_ipam::uid_table::hash_slots(p.capacity())
                * (size_of::<(NodeName, Projection)>() + 1);
            bytes += p.values().map(Projection::heap_bytes).sum::<usize>();
        }
        let g = self.inner.lock();
        bytes += g.pods.heap_bytes() + g.names.heap_bytes();
        bytes += tidepool_ipam::uid_table::hash_slots(g.agents.capacity())
            * (size_of::<(NodeName, Agent)>() + 1);
        bytes += g
            .agents
            .values()
            .map(|a| {
                a.pods.capacity() * size_of::<PodNumber>()
                    + a.queue.capacity() * size_of::<(PodUid, u64)>()
            })
            .sum::<usize>();
        bytes += g.live.capacity() * size_of::<NodeName>();
        bytes += g.cooldowns.capacity() * size_of::<(Instant, NodeName)>();
        bytes
    }
}

/// The oracle's constraints from the world's settings: a node holds at most its
/// allocatable pods' addresses; a unit moves in the scarcity release delay plus one round
/// trip (a call's latency); a crashed pod's address is held `reclaim_grace` after the
/// crash and `reclaim_min_age` after the pod started at least, every freed one cools for
/// `reuse_cooldown`; units come no faster than the calls that claim them
/// ([`claim_budget`]).
fn oracle_settings<S: SimSource>(cfg: &WorldConfig, source: &S) -> OracleSettings {
    let e = &cfg.engine;
    OracleSettings {
        claims: claim_budget(cfg, source),
        node_cap: u64::from(cfg.max_pods),
        move_cost: e.scarcity.release_delay + cfg.source_latency,
        reclaim_grace: e.reclaim.grace,
        reclaim_min_age: e.reclaim.min_age,
        cooldown: cfg.reuse_cooldown,
    }
}

/// The calls that claim units, and how many each can claim: cluster-pool claims one block
/// per IPAMBlock create, under the kube budget; a cloud one interface's addresses at most,
/// under the source budget or the cloud's own limit, whichever is slower (both together let
/// no more calls through than either alone, so either one bounds the claims).
fn claim_budget<S: SimSource>(cfg: &WorldConfig, source: &S) -> Option<ClaimBudget> {
    if source.api() == Api::Kube {
        return Some(ClaimBudget {
            burst: u64::from(cfg.kube_burst),
            qps: cfg.kube_qps,
            per_call: 1,
        });
    }
    let per_call = source.most_per_call()?;
    let (qps, burst) = match source.rate_limit() {
        Some((qps, burst)) if qps < cfg.source_qps => (qps, burst),
        _ => (cfg.source_qps, cfg.source_burst),
    };
    Some(ClaimBudget {
        burst: u64::from(burst),
        qps,
        per_call,
    })
}

/// [`node_side::project`] without copying what it drops: it keeps only the node's identity,
/// watermarks and tombstones, so it is handed a copy without the `used` map and the other
/// node-side and operator fields (same result, no deep copy of `used` per reconcile).
fn project(node: &IpamNode, blocks: &[node_side::BlockView]) -> IpamNode {
    let slim = IpamNode {
        name: node.name.clone(),
        node_uid: node.node_uid,
        resource_version: node.resource_version.clone(),
        watermarks: node.watermarks,
        operator: tidepool_ipam::OperatorFields {
            reclaim: node.operator.reclaim.clone(),
            ..Default::default()
        },
        node: tidepool_ipam::NodeSideFields::default(),
        finalizer: node.finalizer,
        deleting: node.deleting,
    };
    node_side::project(&slim, blocks)
}

/// A simulated pod's ADD on the node side: its addresses (the ones it holds, for a
/// repeated ADD), or `None` when the pool has no free address of some family.
fn add(
    ns: &mut NodeSide<AllocationId>,
    node: &IpamNode,
    families: &[Family],
    exclude: &AddrSet,
    uid: PodUid,
    container_id: u64,
    now: SystemTime,
) -> Option<Vec<IpAddr>> {
    let key = allocation(container_id);
    ns.add(node, families, exclude, key, uid, now)
        .ok()
        .map(|a| a.addrs)
}

/// Gives the node side's record back to the store's object (rewritten if it changed; then
/// what ended by `utc` goes with it: [`NodeSide::tidy`]).
fn publish(
    mut ns: NodeSide<AllocationId>,
    side: &mut tidepool_ipam::NodeSideFields,
    utc: SystemTime,
) {
    ns.tidy(utc);
    // every simulated pod lives in one namespace: its name is shared, not copied per entry;
    // the pod name is shared too (identity is the UID, nothing reads the name)
    static POD: std::sync::LazyLock<PodName> =
        std::sync::LazyLock::new(|| PodName::new("default", "sim-pod"));
    ns.return_published(|_| POD.clone(), side);
}

/// A simulated sandbox's allocation: its container ID as the runtime would spell it (64 hex
/// digits) on interface eth0.
fn allocation(container_id: u64) -> AllocationId {
    // written into a stack buffer: a String per ADD and DEL showed in the 10k-node profile
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = [b'0'; 64];
    for (i, b) in id[48..].iter_mut().enumerate() {
        *b = HEX[((container_id >> (60 - 4 * i)) & 0xf) as usize];
    }
    AllocationId::new(std::str::from_utf8(&id).expect("hex digits"), "eth0")
}
