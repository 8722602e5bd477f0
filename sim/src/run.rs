//! `simulate`: a workload on the simulated world, the drain tail, and the report whose
//! fields DESIGN.md fixes.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use crate::cloud::{CloudFaults, InstanceType, SimCloud};
use crate::observer::Invariants;
use crate::scarcity::promise::PromiseCounter;
use crate::scarcity::{PoolKey, ScarcityReport};
use crate::scenario::{Action, DEFAULT_GROUP, Scenario, Tenant};
use crate::world::{SimSource, World, WorldConfig};
use tidepool_ipam::IpamError;
use tidepool_ipam::MemoryNodeStore;
use tidepool_ipam::Watermarks;
use tidepool_ipam::pool::{ClusterPoolSource, PoolConfig, PoolSpec};
use tidepool_ipam::{Family, NodeName, PerFamily, PodUid, WatermarkOverrides};
use tidepool_ipam::{Faults, MemorySource};

/// The most pods one simulation may hold at once (its pod tables' limit, with room for the
/// recently deleted ones the pod informer still shows).
pub const MAX_SIMULATED_PODS: u64 = 1 << 25;

/// Whether steady state is reached before the measured period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmUp {
    None,
    Steady,
}

/// Which IP source the simulated cluster draws from.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceChoice {
    /// The in-memory per-address source (any count in one call).
    Memory,
    /// The ENI-like simulated cloud.
    SimCloud(CloudChoice),
    /// The cluster pool: blocks of one IPPool named `default`, claimed as IPAMBlock objects.
    ClusterPool(PoolChoice),
}

/// The cluster pool's settings (`--pool-cidr`, `--block-size`, `--block-size-v6`).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolChoice {
    pub cidrs: Vec<String>,
    pub block_size: tidepool_ipam::PerFamily<u8>,
}

impl PoolChoice {
    /// The pools of a run: the flags' `default`, then the scenario's (oldest first, in
    /// file order); errors name the pool.
    pub fn configs(
        &self,
        families: &[Family],
        scenario: Option<&Scenario>,
    ) -> Result<Vec<PoolConfig>, IpamError> {
        let mut pools = vec![PoolConfig::new(self.spec(families)?)];
        for p in scenario.map_or(&[][..], |s| &s.pools) {
            let spec = PoolSpec::parse(&p.name, &p.cidrs, self.block_size, &[] as &[String])
                .map_err(|e| IpamError::InvalidSetting {
                    name: "scenario pools",
                    value: p.name.clone(),
                    reason: e.to_string(),
                })?;
            pools.push(PoolConfig {
                namespace_selector: p.namespace_selector.clone(),
                pod_selector: p.pod_selector.clone(),
                ..PoolConfig::new(spec)
            });
        }
        Ok(pools)
    }

    /// The pool's spec, checked; errors name the flag and the value.
    pub fn spec(&self, families: &[Family]) -> Result<tidepool_ipam::pool::PoolSpec, IpamError> {
        let spec = tidepool_ipam::pool::PoolSpec::parse(
            tidepool_ipam::pool::DEFAULT_POOL,
            &self.cidrs,
            self.block_size,
            &[] as &[String],
        )
        .map_err(|e| {
            let v6 = matches!(
                e,
                tidepool_ipam::pool::PoolError::InvalidBlockSize {
                    family: Family::V6,
                    ..
                } | tidepool_ipam::pool::PoolError::BlockSizeDoesNotFit {
                    cidr: ipnet::IpNet::V6(_),
                    ..
                }
            );
            let (name, value) = match e {
                tidepool_ipam::pool::PoolError::InvalidBlockSize { .. }
                | tidepool_ipam::pool::PoolError::BlockSizeDoesNotFit { .. } => {
                    if v6 {
                        ("block-size-v6", self.block_size.v6.to_string())
                    } else {
                        ("block-size", self.block_size.v4.to_string())
                    }
                }
                _ => ("pool-cidr", self.cidrs.join(",")),
            };
            IpamError::InvalidSetting {
                name,
                value,
                reason: e.to_string(),
            }
        })?;
        for &f in families {
            if !spec.serves(f) {
                return Err(IpamError::InvalidSetting {
                    name: "pool-cidr",
                    value: self.cidrs.join(","),
                    reason: format!(
                        "no {} CIDR, but the nodes need {} addresses",
                        f.as_str(),
                        f.as_str()
                    ),
                });
            }
        }
        Ok(spec)
    }
}

/// The simulated cloud's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CloudChoice {
    pub instance_type: InstanceType,
    /// Prefix length of each subnet (one subnet per 1,000 nodes).
    pub subnet_size: u8,
    /// The cloud's own rate limit (qps, burst); None = unlimited.
    pub rate_limit: Option<(f64, u32)>,
}

/// A simulate run: the world and its workload.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub world: WorldConfig,
    pub source: SourceChoice,
    pub nodes: u32,
    pub pods_per_node: u32,
    /// Pod replacements per node per minute.
    pub churn: f64,
    /// Share of deletions that never release their address.
    pub crash_rate: f64,
    /// Node losses per hour.
    pub node_churn: f64,
    /// The active period.
    pub duration: Duration,
    pub warm_up: WarmUp,
    pub report_nodes: bool,
    /// Timed phases (`--scenario`); their times count from the measured period's start.
    pub scenario: Option<Arc<Scenario>>,
    /// How long the run may go on past the drain tail while work is still queued (a slow
    /// budget, a retry, a lost node inside its grace) before what is missing counts as lost.
    pub drain_limit: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            world: WorldConfig::default(),
            source: SourceChoice::Memory,
            nodes: 200,
            pods_per_node: 30,
            churn: 2.0,
            crash_rate: 0.05,
            node_churn: 1.0,
            duration: Duration::from_secs(600),
            warm_up: WarmUp::None,
            report_nodes: false,
            scenario: None,
            drain_limit: Duration::from_secs(3600),
        }
    }
}

impl SimConfig {
    /// Rejects settings that cannot run, naming the flag.
    pub fn validate(&self) -> Result<(), IpamError> {
        let bad = |name: &'static str, value: String, reason: &str| {
            Err(IpamError::InvalidSetting {
                name,
                value,
                reason: reason.into(),
            })
        };
        if self.nodes == 0 {
            return bad("nodes", "0".into(), "must be at least 1");
        }
        let scenario = self.scenario.as_deref();
        match &self.source {
            SourceChoice::ClusterPool(p) => _ = p.configs(&self.world.families, scenario)?,
            _ if scenario.is_some_and(|s| !s.pools.is_empty()) => {
                return bad(
                    "scenario pools",
                    String::new(),
                    "need --source cluster-pool",
                );
            }
            _ => {}
        }
        if let SourceChoice::SimCloud(c) = &self.source {
            // the subnet layout and the cloud's rate limit are checked as the run builds them
            let cloud = SimCloud::for_nodes(self.max_nodes(), c.subnet_size, 0)?;
            if let Some((qps, burst)) = c.rate_limit {
                cloud.with_rate_limit(qps, burst)?;
            }
        }
        if let SourceChoice::SimCloud(c) = &self.source
            && u64::from(self.pods_per_node) > c.instance_type.max_pod_addresses()
        {
            return bad(
                "pods-per-node",
                self.pods_per_node.to_string(),
                &format!(
                    "{} can address at most {} pods (--instance-type)",
                    c.instance_type.name,
                    c.instance_type.max_pod_addresses()
                ),
            );
        }
        // the simulated pod tables hold at most 2^26 records (live and recently deleted)
        let pods = self
            .max_nodes()
            .saturating_mul(u64::from(self.pods_per_node.max(self.world.max_pods)));
        if pods > MAX_SIMULATED_PODS {
            return bad(
                "nodes",
                self.max_nodes().to_string(),
                &format!(
                    "{pods} pods at most (nodes × max(--pods-per-node, --max-pods)); simulate supports up to {MAX_SIMULATED_PODS}"
                ),
            );
        }
        if self.pods_per_node > self.world.max_pods {
            return bad(
                "pods-per-node",
                self.pods_per_node.to_string(),
                &format!(
                    "above the nodes' allocatable pods (--max-pods {})",
                    self.world.max_pods
                ),
            );
        }
        for (name, v) in [("churn", self.churn), ("node-churn", self.node_churn)] {
            if !v.is_finite() || v < 0.0 {
                return bad(name, v.to_string(), "must be a finite number ≥ 0");
            }
        }
        if !(0.0..=1.0).contains(&self.crash_rate) {
            return bad(
                "crash-rate",
                self.crash_rate.to_string(),
                "must be within 0..=1",
            );
        }
        if self.duration.is_zero() {
            return bad("duration", "0s".into(), "must be positive");
        }
        if self.world.families.is_empty() {
            return bad("families", "none".into(), "at least one address family");
        }
        if let Some(s) = &self.scenario
            && let Err(e) = s.check(
                self.duration,
                self.nodes,
                self.world.max_pods,
                &self.world.engine.watermarks,
            )
        {
            return bad("scenario", s.file.clone(), &e.to_string());
        }
        self.world.engine.validate()
    }

    /// The most nodes the run can have at once (the start's and every scale-up's), for
    /// sizing the simulated cloud's subnets.
    pub fn max_nodes(&self) -> u64 {
        let mut n = u64::from(self.nodes);
        if let Some(s) = &self.scenario {
            for p in &s.phases {
                if let Action::ScaleUp { nodes, .. } = p.action {
                    // saturating: an absurd scenario must fail the limit check, not wrap
                    let added = u64::from(nodes).saturating_mul(p.instants().len() as u64);
                    n = n.saturating_add(added);
                }
            }
        }
        n
    }

    /// Whether pods keep changing to the end of the active period (pod or node churn, at
    /// the start or in a phase): then no node stays settled and convergence does not apply.
    pub fn churns(&self) -> bool {
        let phase_churns = self.scenario.iter().flat_map(|s| &s.phases).any(|p| {
            matches!(p.action, Action::Churn { churn, node_churn, .. }
                if churn.unwrap_or(0.0) > 0.0 || node_churn.unwrap_or(0.0) > 0.0)
        });
        self.churn > 0.0 || self.node_churn > 0.0 || phase_churns
    }

    /// The drain tail after the active period: every leak reclaimable and every excess
    /// releasable by its end.
    pub fn drain_tail(&self) -> Duration {
        let e = &self.world.engine;
        e.reclaim.grace.max(e.reclaim.min_age)
            + self.world.reuse_cooldown
            + e.release.delay
            + e.resync_interval
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Quantiles {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl Quantiles {
    fn of(mut v: Vec<f64>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
            Some(round3(v[i]))
        };
        Self {
            p50: q(0.50),
            p99: q(0.99),
            max: q(1.0),
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct NodesReport {
    pub total: u64,
    pub in_deficit: u64,
    pub at_capacity: u64,
    pub blocked: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct IpsReport {
    /// Addresses in the nodes' pools: a /64 block per node is 2^64 of them each, so these
    /// two count past u64.
    pub allocated: u128,
    pub used: u64,
    pub free: u128,
    pub cooldown: u64,
    /// The same for each family the pods use (null for one they do not).
    pub ipv4: Option<FamilyIps>,
    pub ipv6: Option<FamilyIps>,
}

/// One family's addresses in the nodes' pools (see [`IpsReport`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FamilyIps {
    pub allocated: u128,
    pub used: u64,
    pub free: u128,
    pub cooldown: u64,
}

impl FamilyIps {
    fn add(&mut self, allocated: u128, used: u64, cooldown: u64) {
        self.allocated = self.allocated.saturating_add(allocated);
        self.used += used;
        self.cooldown += cooldown;
        let free = allocated.saturating_sub(u128::from(used + cooldown));
        self.free = self.free.saturating_add(free);
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ApiReport {
    pub source_calls: u64,
    pub source_calls_minimum: Option<u64>,
    pub kube_writes: u64,
    pub conflicts: u64,
    pub throttled: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PodsReport {
    pub started: u64,
    /// Scale-up pods no node had room for (`--max-pods`): never created, as a scheduler
    /// leaves them pending with no node and no address.
    pub unschedulable: u64,
    pub deleted: u64,
    pub leaked_by_crash: u64,
    pub waited_for_ip: u64,
    pub ip_wait_seconds: Quantiles,
    /// Pods still waiting for an address when the measured period began: scheduled during
    /// the warm-up, their waits are not in `ip_wait_seconds`. Not zero: the warm-up did not
    /// reach a steady state, and the measured period starts inside the bring-up.
    pub waiting_at_start: u64,
    /// Pods that never got an address: of the pods that waited for one at some point of
    /// the measured period, those still waiting when the run ended (after the drain tail)
    /// and those deleted, or lost with their machine, before they got one. Scale-up pods
    /// never created (`unschedulable`) are not among them.
    pub never_served: u64,
    /// Why, where the simulator knows: the pool (or subnet, or source) has nothing left,
    /// or the state of most nodes where pods still waited at the end; null when none.
    pub never_served_cause: Option<String>,
    /// Pods scheduled at the measured period's first instant (without a warm-up, the
    /// nodes' first pods, all at once) that got their addresses.
    pub bring_up: u64,
    /// `ip_wait_seconds` without the bring-up's pods.
    pub ip_wait_seconds_after_bring_up: Quantiles,
}

impl PodsReport {
    /// The bring-up's waits make the percentiles: some bring-up pods, a p99 above 1 s and
    /// more than twice the later pods' p99 (or no later pod).
    pub fn bring_up_dominates(&self) -> bool {
        let p99 = self.ip_wait_seconds.p99.unwrap_or(0.0);
        let later = self.ip_wait_seconds_after_bring_up.p99.unwrap_or(0.0);
        self.bring_up > 0 && p99 > 1.0 && p99 > 2.0 * later
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ReclaimReport {
    pub reclaimed: u64,
    pub held_by_min_age: u64,
    pub latency_seconds: Quantiles,
}

/// Heap bytes per allocated address at the end of the active period's drain tail, the
/// engine and the simulated world separately.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MemoryReport {
    /// The simulated world (API objects, pod API, kubelets, observer): a deterministic size
    /// estimate from its structures ([`World::world_heap_estimate`]), not a measurement.
    pub world_bytes_per_address: f64,
    /// The engine (maintainers, trackers, the source's index, budgets, tasks): the live heap
    /// measured by the process's counting allocator ([`LIVE_HEAP_BYTES`]) minus the world's
    /// estimate; null when no counting allocator is installed (a library caller, tests).
    pub engine_bytes_per_address: Option<f64>,
}

/// The process's live heap bytes, if its binary installs a counting global allocator (the
/// operator binary does); [`Report::memory`] reads it at the end of a run.
pub static LIVE_HEAP_BYTES: std::sync::OnceLock<fn() -> usize> = std::sync::OnceLock::new();

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeDetail {
    pub name: String,
    pub allocated: u64,
    pub used: u64,
    pub cooldown: u64,
    pub needed: u64,
    pub excess: u64,
    pub blocked: Option<&'static str>,
}

/// The simulate report (DESIGN.md "simulate"). With the same seed two reports are equal
/// except for `wall_seconds`, `cpu_seconds`, `peak_rss_bytes`, `events_per_second` and
/// `memory.engine_bytes_per_address` (an allocator measurement).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub converged: bool,
    pub convergence_seconds: Option<f64>,
    pub lower_bound_seconds: Option<f64>,
    /// The setting that makes `lower_bound_seconds`: the rate limit of the API the source
    /// calls go through (`--api-qps 4`, `--kube-api-qps 50`, `--cloud-qps 10`), or the
    /// calls' latency when one node's chain of calls takes longer (`--cloud-latency 2s`).
    pub limited_by: Option<String>,
    pub virtual_seconds: f64,
    pub wall_seconds: f64,
    pub cpu_seconds: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    pub events_per_second: f64,
    pub nodes: NodesReport,
    pub ips: IpsReport,
    pub api: ApiReport,
    pub pods: PodsReport,
    pub reclaim: ReclaimReport,
    /// The promise's breaches and the waiting-time oracle (issue 30): all zero when no
    /// pool ever became scarce. Not an invariant: it does not fail the run.
    pub scarcity: ScarcityReport,
    pub memory: MemoryReport,
    /// How long the run went on past the drain tail until queued work was done (0 when
    /// nothing was pending at the tail's end; `drain_limit` past it, the rest counts as
    /// lost).
    pub drain_extra_seconds: f64,
    pub invariants: Invariants,
    /// The first violations (at most 50), each naming the address and why it counts.
    pub violations: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_details: Option<Vec<NodeDetail>>,
}

impl Report {
    /// The report with its machine-dependent fields zeroed, for comparisons.
    pub fn deterministic(&self) -> Report {
        Report {
            wall_seconds: 0.0,
            cpu_seconds: None,
            peak_rss_bytes: None,
            events_per_second: 0.0,
            memory: MemoryReport {
                engine_bytes_per_address: None,
                ..self.memory
            },
            ..self.clone()
        }
    }
}

enum Ev {
    /// A pod replacement (stale unless its generation is the current one).
    Churn(u32),
    /// A node loss of the node churn (same).
    NodeLoss(u32),
    /// A lost machine's Node object is deleted; with `replace` a new node joins its group.
    NodeDelete {
        node: NodeName,
        replace: bool,
    },
    /// A scenario action phase acts whole.
    Act(usize),
    /// One unit of a scenario ramp (a node, or a pod on each chosen node).
    RampStep(usize),
    /// A mass-deletion ramp starts: its pods are chosen and their deletions spread.
    RampDeletions(usize),
    DeletePod(PodUid, bool),
    /// A scenario setting comes into force, or stops being.
    SettingOn(usize),
    SettingOff(usize),
}

/// Exponential inter-arrival time for a Poisson process of `per_second`.
fn next_after(rng: &mut SmallRng, per_second: f64) -> Option<Duration> {
    if per_second <= 0.0 {
        return None;
    }
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    Some(Duration::from_secs_f64(-u.ln() / per_second))
}

/// Faults set on the source at run time (scenario `brown-out` phases over `--fault-rate`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SourceFaults {
    pub faults: Faults,
    /// Every call fails until then.
    pub outage_until: Option<Instant>,
}

/// The workload's rates in force.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rates {
    churn: f64,
    crash_rate: f64,
    node_churn: f64,
}

struct Workload {
    rng: SmallRng,
    /// Due events: (time, push order, place in `evs`).
    heap: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    evs: Vec<Option<Ev>>,
    /// Places in `evs` free again (an hour of churn at 10,000 nodes pushes a million
    /// events; only those still due need a place).
    free: Vec<usize>,
    seq: u64,
    next_node: u32,
    rates: Rates,
    churn_gen: u32,
    /// Pod churn found no live node and stopped; it resumes when one joins.
    churn_stalled: bool,
    /// Scale-up pods no node had room for (allocatable pods).
    unschedulable: u64,
    loss_gen: u32,
    /// Group names (index 0: `default`), each group's pods per new node, each node's group.
    groups: Vec<String>,
    group_pods: Vec<u32>,
    group_of: BTreeMap<NodeName, usize>,
    /// Scenario settings in force, by (start, phase index): later ones win.
    settings: BTreeSet<(Duration, usize)>,
    /// Nodes whose watermark overrides wait for their IPAMNode to exist.
    pending_watermarks: BTreeSet<NodeName>,
    /// The scenario's namespaces new pods are created in.
    tenants: Vec<Tenant>,
}

impl Workload {
    fn new(cfg: &SimConfig, scenario: Option<&Scenario>) -> Workload {
        let groups = scenario.map_or_else(|| vec![DEFAULT_GROUP.to_string()], |s| s.groups());
        Workload {
            rng: SmallRng::seed_from_u64(cfg.world.seed ^ 0x5eed),
            heap: BinaryHeap::new(),
            evs: Vec::new(),
            free: Vec::new(),
            seq: 0,
            next_node: 0,
            rates: Rates {
                churn: cfg.churn,
                crash_rate: cfg.crash_rate,
                node_churn: cfg.node_churn,
            },
            churn_gen: 0,
            churn_stalled: false,
            unschedulable: 0,
            loss_gen: 0,
            group_pods: vec![cfg.pods_per_node; groups.len()],
            groups,
            group_of: BTreeMap::new(),
            settings: BTreeSet::new(),
            pending_watermarks: BTreeSet::new(),
            tenants: scenario.map(|s| s.tenants.clone()).unwrap_or_default(),
        }
    }

    /// Schedules a pod to `node`: with tenants, in one drawn by their shares (the rest in a
    /// namespace with no labels and no annotation).
    fn schedule_pod<S: SimSource>(&mut self, world: &World<S>, node: &NodeName) -> PodUid {
        if self.tenants.is_empty() {
            return world.schedule_pod(node);
        }
        let mut r: f64 = self.rng.random();
        for t in &self.tenants {
            if r < t.share {
                return world.schedule_pod_with(node, t.subject.clone());
            }
            r -= t.share;
        }
        world.schedule_pod_with(node, Default::default())
    }

    fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        let i = match self.free.pop() {
            Some(i) => {
                self.evs[i] = Some(ev);
                i
            }
            None => {
                self.evs.push(Some(ev));
                self.evs.len() - 1
            }
        };
        self.heap.push(Reverse((at, self.seq, i)));
    }

    fn group_index(&self, name: Option<&str>) -> Option<usize> {
        name.and_then(|n| self.groups.iter().position(|g| g == n))
    }

    /// Live nodes of `group` (None: all), in name order.
    fn live_in<S: SimSource>(&self, world: &World<S>, group: Option<usize>) -> Vec<NodeName> {
        let live = world.live_nodes();
        match group {
            None => live,
            Some(g) => live
                .into_iter()
                .filter(|n| self.group_of.get(n) == Some(&g))
                .collect(),
        }
    }

    /// `k` of `items`, uniformly (partial Fisher–Yates), in chosen order.
    fn choose<T>(&mut self, mut items: Vec<T>, k: usize) -> Vec<T> {
        let k = k.min(items.len());
        for i in 0..k {
            let j = self.rng.random_range(i..items.len());
            items.swap(i, j);
        }
        items.truncate(k);
        items
    }
}

/// Runs a simulation to its end and reports. `progress` is called with the virtual time
/// done and the total, about once per simulated second.
pub async fn simulate(
    cfg: SimConfig,
    progress: impl FnMut(Duration, Duration),
) -> Result<Report, IpamError> {
    cfg.validate()?;
    let wall = std::time::Instant::now();
    let cpu0 = cpu_seconds();
    match cfg.source.clone() {
        SourceChoice::ClusterPool(p) => {
            let pools = p.configs(&cfg.world.families, cfg.scenario.as_deref())?;
            let world = World::start_with(cfg.world.clone(), |w, _observer, store| {
                Ok(ClusterPoolSource::new(store.clone(), pools, w.seed)
                    .with_latency(w.source_latency))
            })?;
            // block writes are API server writes: source faults do not apply
            let set_faults = |_: &ClusterPoolSource<MemoryNodeStore>, _: &SourceFaults| {};
            drive(world, &cfg, progress, set_faults, wall, cpu0).await
        }
        SourceChoice::Memory => {
            let world = World::start(cfg.world.clone())?;
            let set_faults = |s: &MemorySource, f: &SourceFaults| {
                let mut faults = f.faults;
                if f.outage_until.is_some() {
                    // the in-memory source has no outage of its own: every call fails
                    faults.error_rate = 1.0;
                }
                s.set_faults(faults);
            };
            drive(world, &cfg, progress, set_faults, wall, cpu0).await
        }
        SourceChoice::SimCloud(c) => {
            let nodes = cfg.max_nodes();
            let world = World::start_with(cfg.world.clone(), |w, observer, _store| {
                let mut cloud = SimCloud::for_nodes(nodes, c.subnet_size, w.seed)?
                    .with_instance_type(c.instance_type)
                    .with_latency(w.source_latency)
                    .with_hook(observer);
                if let Some((qps, burst)) = c.rate_limit {
                    cloud = cloud.with_rate_limit(qps, burst)?;
                }
                cloud.set_faults(cloud_faults(&SourceFaults {
                    faults: w.faults,
                    outage_until: None,
                }));
                Ok(cloud)
            })?;
            let set_faults = |c: &SimCloud, f: &SourceFaults| c.set_faults(cloud_faults(f));
            drive(world, &cfg, progress, set_faults, wall, cpu0).await
        }
    }
}

fn cloud_faults(f: &SourceFaults) -> CloudFaults {
    CloudFaults {
        error_rate: f.faults.error_rate,
        throttle_rate: f.faults.throttle_rate,
        retry_after: f.faults.retry_after,
        lost_reply_rate: f.faults.lost_reply_rate,
        brown_out: f.outage_until.map(|until| (Instant::now(), until)),
        ..CloudFaults::default()
    }
}

/// Runs a simulation on a fresh current-thread runtime in paused (virtual) time.
pub fn simulate_paused(cfg: SimConfig) -> Result<Report, IpamError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| IpamError::InvalidSetting {
            name: "runtime",
            value: String::new(),
            reason: e.to_string(),
        })?;
    rt.block_on(simulate(cfg, |_, _| {}))
}

/// A report of one of `runs` runs in one process: the peak RSS and the engine's heap are
/// the process's, not the run's, so they are left out (null) when there are several.
fn shared_process(mut r: Report, runs: usize) -> Report {
    if runs > 1 {
        r.peak_rss_bytes = None;
        r.memory.engine_bytes_per_address = None;
    }
    r
}

/// Runs several simulations in virtual time, `jobs` at once (each on its own thread and
/// runtime, so each is as deterministic as alone). Results come in the order of `cfgs`;
/// `done` is called with the number finished and the total after each.
pub fn simulate_many(
    cfgs: Vec<SimConfig>,
    jobs: usize,
    done: &(dyn Fn(usize, usize) + Sync),
) -> Vec<Result<Report, IpamError>> {
    let total = cfgs.len();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let finished = std::sync::atomic::AtomicUsize::new(0);
    let results: parking_lot::Mutex<Vec<Option<Result<Report, IpamError>>>> =
        parking_lot::Mutex::new((0..total).map(|_| None).collect());
    let cfgs = &cfgs;
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, total.max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(cfg) = cfgs.get(i) else { break };
                    let r = simulate_paused(cfg.clone()).map(|r| shared_process(r, total));
                    results.lock()[i] = Some(r);
                    let n = finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    done(n, total);
                }
            });
        }
    });
    results
        .into_inner()
        .into_iter()
        .map(|r| r.expect("every run finished"))
        .collect()
}

/// How often the run looks again, past the drain tail, whether queued work is done.
const DRAIN_STEP: Duration = Duration::from_secs(5);

/// Runs the workload on a started world to the end of its drain tail (and on while work is
/// still queued, up to `drain_limit`) and reports.
async fn drive<S: SimSource>(
    world: World<S>,
    cfg: &SimConfig,
    mut progress: impl FnMut(Duration, Duration),
    set_faults: impl Fn(&S, &SourceFaults),
    wall: std::time::Instant,
    cpu0: Option<f64>,
) -> Result<Report, IpamError> {
    let cfg = cfg.clone();
    let scenario = cfg.scenario.clone();
    let phases = scenario.as_ref().map_or(&[][..], |s| &s.phases[..]);
    let times = Times::new(&cfg, scenario.as_deref());
    let mut wl = Workload::new(&cfg, scenario.as_deref());
    let has_watermarks = phases
        .iter()
        .any(|p| matches!(p.action, Action::WatermarkChange(_)));
    // the operator's first write creates a node's IPAMNode; overrides set on a node that
    // has none yet are applied as it appears
    let mut store_events = has_watermarks.then(|| world.store.subscribe());
    for _ in 0..cfg.nodes {
        add_node(&world, &mut wl, 0);
    }
    // past the tail the run goes on in steps while work is still queued (see `drain_limit`)
    let mut end = times.tail_end;
    let total = end - times.start;
    schedule(&world, &mut wl, phases, &times);
    let mut m = Measures::new(
        &times,
        PromiseCounter::new(cfg.world.engine.scarcity, promise_limit(&world, &cfg)),
    );
    let lost_at_end = loop {
        let now = Instant::now();
        m.tick(&world, &cfg, &times, now);
        if now.duration_since(m.last_progress) >= Duration::from_secs(1) {
            progress(now - times.start, total);
            m.last_progress = now;
        }
        if now >= end {
            let lost = (world.observer).any_lost(world.source.grants(), &world.store.list());
            if !lost || now >= times.tail_end + cfg.drain_limit {
                break lost;
            }
            end = now + DRAIN_STEP;
        }
        let wake = m.wake(
            &times,
            end,
            now,
            wl.heap.peek().map(|Reverse((t, _, _))| *t),
        );
        match store_events.as_mut() {
            Some(rx) if !wl.pending_watermarks.is_empty() => {
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(wake) => {}
                    _ = rx.recv() => {}
                }
            }
            _ => tokio::time::sleep_until(wake).await,
        }
        if let Some(rx) = store_events.as_mut() {
            while rx.try_recv().is_ok() {}
            apply_pending_watermarks(&world, phases, &mut wl);
        }
        run_due(&world, &cfg, phases, &mut wl, &mut m, &times, &set_faults);
    };
    progress(total, total);
    let oracle = (m.oracle).unwrap_or_else(|| {
        minimum_calls(&world, &cfg, m.at_t0.as_ref().unwrap_or(&AtT0::default()))
    });
    let mut report = build_report(
        &world,
        lost_at_end,
        &cfg,
        times.t0,
        m.settled_since,
        wall,
        cpu0,
        &oracle,
        &m.promise,
    );
    report.drain_extra_seconds = (Instant::now() - times.tail_end).as_secs_f64();
    report.pods.unschedulable = wl.unschedulable;
    report.pods.waiting_at_start = m.waiting_at_start;
    world.shutdown();
    Ok(report)
}

/// A run's instants: its start; `m0`, where the measured period starts (after the
/// warm-up); `t0`, the start of the last phase that changed demand (or `m0`); the ends of
/// the active period and of the drain tail.
struct Times {
    start: Instant,
    m0: Instant,
    t0: Instant,
    active_end: Instant,
    tail_end: Instant,
}

impl Times {
    fn new(cfg: &SimConfig, scenario: Option<&Scenario>) -> Times {
        let start = Instant::now();
        let warm = match cfg.warm_up {
            WarmUp::None => Duration::ZERO,
            WarmUp::Steady => cfg.drain_tail(),
        };
        let m0 = start + warm;
        let t0 = m0
            + scenario
                .and_then(|s| s.last_demand_change())
                .unwrap_or_default();
        let active_end = m0 + cfg.duration;
        Times {
            start,
            m0,
            t0,
            active_end,
            tail_end: active_end + cfg.drain_tail(),
        }
    }
}

/// What a run measures as it goes.
struct Measures {
    /// The measured period began, with this many pods waiting.
    measuring: bool,
    waiting_at_start: u64,
    /// Each node's state at t0.
    at_t0: Option<AtT0>,
    /// The call oracle at the end of the active period.
    oracle: Option<Oracle>,
    /// Since when every node is settled, sampled each second from t0.
    settled_since: Option<Instant>,
    next_sample: Instant,
    last_progress: Instant,
    /// The promise's breach counter, sampled each second of the measured period.
    promise: PromiseCounter,
    next_scarcity_sample: Instant,
    /// Each pool's size as last given to its oracle.
    pool_sizes: BTreeMap<PoolKey, (u128, u64)>,
}

impl Measures {
    fn new(times: &Times, promise: PromiseCounter) -> Measures {
        Measures {
            promise,
            next_scarcity_sample: times.m0,
            pool_sizes: BTreeMap::new(),
            measuring: times.m0 == times.start,
            waiting_at_start: 0,
            at_t0: None,
            oracle: None,
            settled_since: Some(times.t0),
            next_sample: times.t0,
            last_progress: times.start,
        }
    }

    /// One turn's bookkeeping at `now`.
    fn tick<S: SimSource>(
        &mut self,
        world: &World<S>,
        cfg: &SimConfig,
        times: &Times,
        now: Instant,
    ) {
        if !self.measuring && now >= times.m0 {
            world.start_measuring();
            self.waiting_at_start = world.waiting() as u64;
            self.measuring = true;
        }
        if self.at_t0.is_none() && now >= times.t0 {
            self.at_t0 = Some(snapshot(world));
        }
        if self.oracle.is_none() && now >= times.active_end {
            let at_t0 = self.at_t0.as_ref();
            self.oracle = Some(minimum_calls(world, cfg, at_t0.unwrap_or(&AtT0::default())));
        }
        if now >= self.next_scarcity_sample && now <= times.active_end {
            self.sample_scarcity(world, now, cfg.world.engine.scarcity.exit);
        }
        if now >= self.next_sample && now <= times.active_end {
            if world.all_settled() {
                self.settled_since.get_or_insert(now);
            } else {
                self.settled_since = None;
            }
            self.next_sample += Duration::from_secs(1);
        }
    }

    /// The pools' state for the promise's counter; a pool whose size changed (a cloud
    /// subnet's) resizes its oracle. The store is walked only while some pool is scarce or
    /// its pods and holds fill half of `--scarcity-exit` (far from entering: the walk of
    /// every node each second would cost a large run more than the run itself).
    fn sample_scarcity<S: SimSource>(&mut self, world: &World<S>, now: Instant, exit: f64) {
        self.next_scarcity_sample += crate::scarcity::promise::SAMPLE_PERIOD;
        if !self.promise.any_scarce() && world.busiest_pool_share() < exit / 2.0 {
            return;
        }
        let samples = crate::scarcity::sample::sample(world);
        let mut pools = BTreeMap::new();
        for (key, (s, unit)) in samples {
            let size = (s.capacity, unit);
            if self.pool_sizes.get(&key).is_some_and(|was| *was != size) {
                world.pool_resized(&key, size);
            }
            self.pool_sizes.insert(key.clone(), size);
            pools.insert(key, s);
        }
        self.promise.observe(now, &pools);
    }

    /// When the run must look again: at its end, at the next samples (at least 1 ms on),
    /// at m0 and t0 until they are reached, and at the next event.
    fn wake(&self, times: &Times, end: Instant, now: Instant, next_ev: Option<Instant>) -> Instant {
        let mut wake = end.min(self.next_sample.max(now + Duration::from_millis(1)));
        if self.next_scarcity_sample <= times.active_end {
            wake = wake.min(
                self.next_scarcity_sample
                    .max(now + Duration::from_millis(1)),
            );
        }
        if !self.measuring {
            wake = wake.min(times.m0);
        }
        if self.at_t0.is_none() {
            wake = wake.min(times.t0);
        }
        if let Some(t) = next_ev {
            wake = wake.min(t);
        }
        wake
    }
}

/// Queues the first pod churn and node loss, and every scenario phase's events.
fn schedule<S: SimSource>(
    world: &World<S>,
    wl: &mut Workload,
    phases: &[crate::scenario::Phase],
    times: &Times,
) {
    let (start, m0) = (times.start, times.m0);
    if let Some(d) = next_after(&mut wl.rng, churn_rate(world, &wl.rates)) {
        wl.push(start + d, Ev::Churn(0));
    }
    if let Some(d) = next_after(&mut wl.rng, wl.rates.node_churn / 3600.0) {
        wl.push(start + d, Ev::NodeLoss(0));
    }
    for (i, p) in phases.iter().enumerate() {
        let at = m0 + p.at;
        if p.action.is_setting() {
            wl.push(at, Ev::SettingOn(i));
            let off = match (p.end(), &p.action) {
                (Some(e), _) => Some(m0 + e),
                // watermarks are configuration: they stay to the end of the run
                (None, Action::WatermarkChange(_)) => None,
                (None, _) => Some(times.active_end),
            };
            if let Some(off) = off {
                wl.push(off, Ev::SettingOff(i));
            }
        } else if p.is_ramp() {
            let d = p.duration.unwrap_or_default();
            let units = match p.action {
                Action::ScaleUp { nodes, pods, .. } => {
                    if nodes > 0 {
                        nodes
                    } else {
                        pods
                    }
                }
                Action::NodeLoss { nodes, .. } => nodes,
                _ => 0,
            };
            if matches!(p.action, Action::MassDeletion { .. }) {
                wl.push(at, Ev::RampDeletions(i));
            }
            for k in 0..units {
                wl.push(
                    at + d.mul_f64(f64::from(k) / f64::from(units)),
                    Ev::RampStep(i),
                );
            }
        } else {
            for t in p.instants() {
                wl.push(m0 + t, Ev::Act(i));
            }
        }
    }
}

/// Sets the watermark overrides that waited for their node's IPAMNode (the store changed).
fn apply_pending_watermarks<S: SimSource>(
    world: &World<S>,
    phases: &[crate::scenario::Phase],
    wl: &mut Workload,
) {
    if wl.pending_watermarks.is_empty() {
        return;
    }
    let pending = std::mem::take(&mut wl.pending_watermarks);
    for n in pending {
        let g = wl.group_of.get(&n).copied().unwrap_or(0);
        let w = watermarks_for(phases, wl, g);
        if world.store.set_watermarks(&n, w).is_none() && wl.group_of.contains_key(&n) {
            wl.pending_watermarks.insert(n);
        }
    }
}

/// Runs every event due by now, in order.
fn run_due<S: SimSource>(
    world: &World<S>,
    cfg: &SimConfig,
    phases: &[crate::scenario::Phase],
    wl: &mut Workload,
    m: &mut Measures,
    times: &Times,
    set_faults: &impl Fn(&S, &SourceFaults),
) {
    while let Some(Reverse((t, _, i))) = wl.heap.peek().copied() {
        if t > Instant::now() {
            break;
        }
        if m.at_t0.is_none() && t >= times.t0 {
            m.at_t0 = Some(snapshot(world));
        }
        wl.heap.pop();
        let ev = wl.evs[i].take().expect("each event runs once");
        wl.free.push(i);
        let active = t < times.active_end;
        run_event(world, cfg, phases, wl, ev, t, times.active_end, set_faults);
        if wl.churn_stalled && active && world.live_count() > 0 {
            wl.churn_stalled = false;
            if let Some(d) = next_after(&mut wl.rng, churn_rate(world, &wl.rates)) {
                wl.push(t + d, Ev::Churn(wl.churn_gen));
            }
        }
    }
}

/// One event at `t`; the workload's events do nothing after the active period.
#[allow(clippy::too_many_arguments)]
fn run_event<S: SimSource>(
    world: &World<S>,
    cfg: &SimConfig,
    phases: &[crate::scenario::Phase],
    wl: &mut Workload,
    ev: Ev,
    t: Instant,
    active_end: Instant,
    set_faults: &impl Fn(&S, &SourceFaults),
) {
    let active = t < active_end;
    match ev {
        Ev::Churn(g) if active && g == wl.churn_gen => {
            churn(world, wl);
            match next_after(&mut wl.rng, churn_rate(world, &wl.rates)) {
                Some(d) => wl.push(t + d, Ev::Churn(g)),
                // every node lost: churn resumes when one joins (`run_due`)
                None => wl.churn_stalled = wl.rates.churn > 0.0,
            }
        }
        Ev::NodeLoss(g) if active && g == wl.loss_gen => {
            let live = world.live_count();
            if live > 1 {
                let i = wl.rng.random_range(0..live);
                let n = world.live_node(i).expect("in range");
                lose_node(world, wl, n, t, true);
            }
            if let Some(d) = next_after(&mut wl.rng, wl.rates.node_churn / 3600.0) {
                wl.push(t + d, Ev::NodeLoss(g));
            }
        }
        Ev::NodeDelete { node, replace } => {
            world.delete_node_object(&node);
            let g = wl.group_of.remove(&node).unwrap_or(0);
            wl.pending_watermarks.remove(&node);
            if active && replace {
                let n = add_node(world, wl, g);
                joined(phases, wl, n, g);
            }
        }
        Ev::Act(p) if active => act(world, phases, wl, p, t, false),
        Ev::RampStep(p) if active => act(world, phases, wl, p, t, true),
        Ev::RampDeletions(p) if active => ramp_deletions(world, phases, wl, p, t),
        Ev::DeletePod(uid, crash) if active => world.delete_pod(uid, crash),
        Ev::SettingOn(p) => {
            wl.settings.insert((phases[p].at, p));
            setting_changed(world, cfg, phases, wl, p, t, active_end, set_faults);
        }
        Ev::SettingOff(p) => {
            wl.settings.remove(&(phases[p].at, p));
            setting_changed(world, cfg, phases, wl, p, t, active_end, set_faults);
        }
        Ev::Churn(_)
        | Ev::NodeLoss(_)
        | Ev::Act(_)
        | Ev::RampStep(_)
        | Ev::RampDeletions(_)
        | Ev::DeletePod(..) => {}
    }
}

/// A mass deletion spread over its phase: the victims chosen now, deleted one by one.
fn ramp_deletions<S: SimSource>(
    world: &World<S>,
    phases: &[crate::scenario::Phase],
    wl: &mut Workload,
    p: usize,
    t: Instant,
) {
    let (group, d) = (&phases[p].group, phases[p].duration.unwrap_or_default());
    let Action::MassDeletion { share, crash_rate } = phases[p].action else {
        return;
    };
    let g = wl.group_index(group.as_deref());
    let victims = pick_deletions(world, wl, g, share, crash_rate);
    let n = victims.len().max(1) as f64;
    for (k, (uid, crash)) in victims.into_iter().enumerate() {
        wl.push(t + d.mul_f64(k as f64 / n), Ev::DeletePod(uid, crash));
    }
}

fn churn_rate<S: SimSource>(world: &World<S>, rates: &Rates) -> f64 {
    rates.churn / 60.0 * world.live_count() as f64
}

/// The machine vanishes with its pods; its Node object goes a minute later.
fn lose_node<S: SimSource>(
    world: &World<S>,
    wl: &mut Workload,
    n: NodeName,
    t: Instant,
    replace: bool,
) {
    world.vanish_machine(&n);
    wl.push(
        t + Duration::from_secs(60),
        Ev::NodeDelete { node: n, replace },
    );
}

/// A scenario action phase acts whole, or (`step`) one unit of its ramp.
fn act<S: SimSource>(
    world: &World<S>,
    phases: &[crate::scenario::Phase],
    wl: &mut Workload,
    p: usize,
    t: Instant,
    step: bool,
) {
    let phase = &phases[p];
    let g = wl.group_index(phase.group.as_deref());
    match phase.action {
        Action::ScaleUp {
            nodes,
            pods_per_node,
            pods,
            share,
        } => {
            if pods > 0 && !(step && nodes > 0) {
                let targets = wl.live_in(world, g);
                let k = (share * targets.len() as f64).ceil() as usize;
                let max_pods = world.cfg.max_pods as usize;
                for n in wl.choose(targets, k) {
                    // the scheduler places a pod only where it fits (allocatable pods); the
                    // rest stay unscheduled, need no address, and are counted
                    let want = if step { 1 } else { pods as usize };
                    let fits = max_pods.saturating_sub(world.pods_on(&n).len()).min(want);
                    for _ in 0..fits {
                        wl.schedule_pod(world, &n);
                    }
                    wl.unschedulable += (want - fits) as u64;
                }
            }
            if nodes > 0 {
                let gi = g.unwrap_or(0);
                if let Some(ppn) = pods_per_node {
                    wl.group_pods[gi] = ppn;
                }
                for _ in 0..if step { 1 } else { nodes } {
                    let n = add_node(world, wl, gi);
                    joined(phases, wl, n, gi);
                }
            }
        }
        Action::MassDeletion { share, crash_rate } => {
            for (uid, crash) in pick_deletions(world, wl, g, share, crash_rate) {
                world.delete_pod(uid, crash);
            }
        }
        Action::NodeLoss { nodes, replace } => {
            let live = wl.live_in(world, g);
            let k = if step { 1 } else { nodes as usize };
            for n in wl.choose(live, k) {
                lose_node(world, wl, n, t, replace);
            }
        }
        Action::Churn { .. } | Action::BrownOut(_) | Action::WatermarkChange(_) => {}
    }
}

/// A `share` of the pods on each live node of the group, each crashing with `crash_rate`.
fn pick_deletions<S: SimSource>(
    world: &World<S>,
    wl: &mut Workload,
    g: Option<usize>,
    share: f64,
    crash_rate: f64,
) -> Vec<(PodUid, bool)> {
    let mut out = Vec::new();
    for n in wl.live_in(world, g) {
        let pods = world.pods_on(&n);
        let k = (share * pods.len() as f64).round() as usize;
        for uid in wl.choose(pods, k) {
            let crash = wl.rng.random_bool(crash_rate);
            out.push((uid, crash));
        }
    }
    out
}

/// The overrides in force for a group: every watermark phase in force that concerns it,
/// the later-starting winning field by field.
fn watermarks_for(
    phases: &[crate::scenario::Phase],
    wl: &Workload,
    g: usize,
) -> WatermarkOverrides {
    let mut w = WatermarkOverrides::default();
    for &(_, i) in &wl.settings {
        let p = &phases[i];
        if let Action::WatermarkChange(o) = &p.action
            && p.group.as_deref().is_none_or(|name| wl.groups[g] == name)
        {
            w.pre_allocate = o.pre_allocate.or(w.pre_allocate);
            w.min_allocate = o.min_allocate.or(w.min_allocate);
            w.max_allocate = o.max_allocate.or(w.max_allocate);
            w.max_above_watermark = o.max_above_watermark.or(w.max_above_watermark);
        }
    }
    w
}

/// A node that just joined gets its group's overrides once its IPAMNode exists.
fn joined(phases: &[crate::scenario::Phase], wl: &mut Workload, n: NodeName, g: usize) {
    if phases
        .iter()
        .any(|p| matches!(p.action, Action::WatermarkChange(_)))
        && watermarks_for(phases, wl, g) != WatermarkOverrides::default()
    {
        wl.pending_watermarks.insert(n);
    }
}

/// A scenario setting started or ended: the rates, faults or watermarks in force follow.
#[allow(clippy::too_many_arguments)]
fn setting_changed<S: SimSource>(
    world: &World<S>,
    cfg: &SimConfig,
    phases: &[crate::scenario::Phase],
    wl: &mut Workload,
    p: usize,
    t: Instant,
    active_end: Instant,
    set_faults: &impl Fn(&S, &SourceFaults),
) {
    match &phases[p].action {
        Action::Churn { .. } => {
            let mut r = Rates {
                churn: cfg.churn,
                crash_rate: cfg.crash_rate,
                node_churn: cfg.node_churn,
            };
            for &(_, i) in &wl.settings {
                if let Action::Churn {
                    churn,
                    crash_rate,
                    node_churn,
                } = phases[i].action
                {
                    r.churn = churn.unwrap_or(r.churn);
                    r.crash_rate = crash_rate.unwrap_or(r.crash_rate);
                    r.node_churn = node_churn.unwrap_or(r.node_churn);
                }
            }
            let old = wl.rates;
            wl.rates = r;
            if r.churn != old.churn {
                // a Poisson process can be restarted at any instant with its new rate
                wl.churn_gen += 1;
                match next_after(&mut wl.rng, churn_rate(world, &wl.rates)) {
                    Some(d) => wl.push(t + d, Ev::Churn(wl.churn_gen)),
                    None => wl.churn_stalled = wl.rates.churn > 0.0,
                }
            }
            if r.node_churn != old.node_churn {
                wl.loss_gen += 1;
                if let Some(d) = next_after(&mut wl.rng, r.node_churn / 3600.0) {
                    wl.push(t + d, Ev::NodeLoss(wl.loss_gen));
                }
            }
        }
        Action::BrownOut(_) => {
            let base = cfg.world.faults;
            let mut f = SourceFaults {
                faults: base,
                outage_until: None,
            };
            // independent faults add up: a call escapes both with (1 − a)(1 − b)
            let add = |a: f64, b: f64| 1.0 - (1.0 - a) * (1.0 - b);
            for &(_, i) in &wl.settings {
                if let Action::BrownOut(b) = phases[i].action {
                    f.faults.error_rate = add(f.faults.error_rate, b.error_rate);
                    f.faults.lost_reply_rate = add(f.faults.lost_reply_rate, b.lost_reply_rate);
                    f.faults.throttle_rate = add(f.faults.throttle_rate, b.throttle_rate);
                    if b.throttle_rate > 0.0 {
                        f.faults.retry_after = f.faults.retry_after.max(b.retry_after);
                    }
                    if b.outage {
                        // phase times count from the measured period's start
                        let m0 = active_end - cfg.duration;
                        let until = phases[i]
                            .end()
                            .map_or(active_end, |e| active_end.min(m0 + e));
                        f.outage_until = f.outage_until.max(Some(until));
                    }
                }
            }
            set_faults(&world.source, &f);
        }
        Action::WatermarkChange(_) => {
            let nodes: Vec<(NodeName, usize)> =
                wl.group_of.iter().map(|(n, g)| (n.clone(), *g)).collect();
            for (n, g) in nodes {
                let w = watermarks_for(phases, wl, g);
                let same = world.node(&n).map(|x| x.watermarks == w);
                match same {
                    Some(true) => {}
                    Some(false) => {
                        world.store.set_watermarks(&n, w);
                    }
                    None => {
                        wl.pending_watermarks.insert(n);
                    }
                }
            }
        }
        _ => {}
    }
}

/// DESIGN.md's call oracle: the fewest source calls C that take every node from its state
/// at t0 to its target for the demand at the end of the active period, and the lower
/// bound on convergence it implies.
#[derive(Debug, Clone, Default)]
struct Oracle {
    calls: u64,
    lower_bound_seconds: f64,
    limited_by: Option<String>,
}

/// What the call oracle starts from at t0: each node's holdings, and the units the source
/// has free (for a block source).
#[derive(Default)]
struct AtT0 {
    nodes: BTreeMap<NodeName, Vec<u64>>,
    free: Option<PerFamily<u64>>,
}

fn snapshot<S: SimSource>(world: &World<S>) -> AtT0 {
    AtT0 {
        nodes: world
            .live_nodes()
            .into_iter()
            .map(|n| {
                let s = world.source.snapshot(&n);
                (n, s)
            })
            .collect(),
        free: world.source.free_units(),
    }
}

/// The pool a node's demand calls for: the smallest with nothing needed, within its cap.
fn target_pool(w: &Watermarks, demand: u64, cap: u64) -> u64 {
    let mut t = (demand + u64::from(w.pre_allocate)).max(u64::from(w.min_allocate));
    if w.max_allocate > 0 {
        t = t.min(u64::from(w.max_allocate));
    }
    t.min(cap)
}

fn minimum_calls<S: SimSource>(world: &World<S>, cfg: &SimConfig, at_t0: &AtT0) -> Oracle {
    let w = &cfg.world.engine.watermarks;
    let cap = u64::from(cfg.world.max_pods);
    let mut calls = 0;
    let mut chain = 0;
    // a block source's gains and give-backs per family, summed over the nodes
    let mut units = PerFamily::<(u64, u64)>::default();
    for node in world.live_nodes() {
        let stored = world.node(&node);
        // the node's own overrides (scenario watermark changes) count
        let w = &stored
            .as_ref()
            .and_then(|n| w.with_overrides(&n.watermarks).ok())
            .unwrap_or(*w);
        // per family: each pod holds (or waits for) one address of each family in use
        let waiting = world.waiting_on(&node) as u64;
        let mut target = PerFamily::<u64>::default();
        for &f in &cfg.world.families {
            let used = stored.as_ref().map_or(0, |n| {
                n.node.used.keys().filter(|a| Family::of(a) == f).count() as u64
            });
            *target.get_mut(f) = target_pool(w, used + waiting, cap);
        }
        let from = at_t0.nodes.get(&node).map(Vec::as_slice).unwrap_or(&[]);
        let c = world.source.minimum_calls(from, target);
        calls += c;
        chain = chain.max(c);
        let u = world.source.unit_changes(from, target);
        for f in Family::ALL {
            let (gain, give) = units.get_mut(f);
            (*gain, *give) = (*gain + u.get(f).0, *give + u.get(f).1);
        }
    }
    // an exhausted pool gives no more than it had free at t0 and got back since
    if let Some(free) = at_t0.free {
        calls = Family::ALL
            .into_iter()
            .map(|f| {
                let (gain, give) = *units.get(f);
                gain.min(free.get(f).saturating_add(give)) + give
            })
            .sum();
    }
    let (mut flag, mut qps, mut burst) = match world.source.api() {
        tidepool_ipam::Api::Source => (
            "--api-qps",
            cfg.world.source_qps,
            u64::from(cfg.world.source_burst),
        ),
        tidepool_ipam::Api::Kube => (
            "--kube-api-qps",
            cfg.world.kube_qps,
            u64::from(cfg.world.kube_burst),
        ),
    };
    if let Some((q, b)) = world.source.rate_limit() {
        if q < qps {
            flag = "--cloud-qps";
        }
        qps = qps.min(q);
        burst = burst.min(u64::from(b));
    }
    let latency = world.source.call_latency();
    let by_rate = (calls.saturating_sub(burst) as f64 / qps).max(0.0) + latency.as_secs_f64();
    let by_chain = chain as f64 * latency.as_secs_f64();
    Oracle {
        calls,
        lower_bound_seconds: by_rate.max(by_chain),
        limited_by: Some(if by_chain > by_rate {
            format!("--cloud-latency {}", humantime::format_duration(latency))
        } else {
            format!("{flag} {qps}")
        }),
    }
}

/// The promise's T (docs/simulate.md "Scarcity"): the scarcity release delay, plus one
/// handshake (a pass that marks, one kube write; the node side answers at once; a pass that
/// releases, one source call), plus one claim (a pass and one source call). A write or a
/// call takes its API's budget interval (1 / qps, the cloud's own limit if lower); a source
/// call adds its latency.
fn promise_limit<S: SimSource>(world: &World<S>, cfg: &SimConfig) -> Duration {
    let (w, e) = (&cfg.world, &cfg.world.engine);
    let per = |qps: f64| Duration::from_secs_f64(1.0 / qps.max(f64::MIN_POSITIVE));
    let mut qps = match world.source.api() {
        tidepool_ipam::Api::Source => w.source_qps,
        tidepool_ipam::Api::Kube => w.kube_qps,
    };
    if let Some((q, _)) = world.source.rate_limit() {
        qps = qps.min(q);
    }
    let call = per(qps) + world.source.call_latency();
    let pass = e.min_pass_interval;
    let handshake = pass + per(w.kube_qps) + pass + call;
    let claim = pass + call;
    e.scarcity.release_delay + handshake + claim
}

fn add_node<S: SimSource>(world: &World<S>, wl: &mut Workload, group: usize) -> NodeName {
    let name = world.add_node(&format!("node-{:05}", wl.next_node));
    wl.next_node += 1;
    wl.group_of.insert(name.clone(), group);
    for _ in 0..wl.group_pods[group] {
        wl.schedule_pod(world, &name);
    }
    name
}

/// A uniformly chosen pod of a uniformly chosen live node is deleted (crashing with
/// the crash rate in force) and a new one scheduled there at the same instant.
fn churn<S: SimSource>(world: &World<S>, wl: &mut Workload) {
    let live = world.live_count();
    if live == 0 {
        return;
    }
    let node = world
        .live_node(wl.rng.random_range(0..live))
        .expect("in range");
    let pods = world.pods_on(&node);
    if !pods.is_empty() {
        let uid = pods[wl.rng.random_range(0..pods.len())];
        let crash = wl.rng.random_bool(wl.rates.crash_rate);
        world.delete_pod(uid, crash);
    }
    wl.schedule_pod(world, &node);
}

#[allow(clippy::too_many_arguments)]
fn build_report<S: SimSource>(
    world: &World<S>,
    lost_at_end: bool,
    cfg: &SimConfig,
    t0: Instant,
    settled_since: Option<Instant>,
    wall: std::time::Instant,
    cpu0: Option<f64>,
    oracle: &Oracle,
    promise: &PromiseCounter,
) -> Report {
    // the drain loop's last look found nothing lost: the end-of-run walk would find nothing
    // either (both at this instant), so it is skipped (a second walk of every address)
    let invariants = if lost_at_end {
        world
            .observer
            .finish_with(world.source.grants(), &world.store.list())
    } else {
        world.observer.invariants()
    };
    let stats = world.workload_stats();
    let summaries = world.manager.summaries();
    let mut nodes = NodesReport::default();
    for (_, s) in &summaries {
        nodes.total += 1;
        nodes.in_deficit += u64::from(s.needed() > 0 || s.waiting() > 0);
        nodes.at_capacity += u64::from(
            s.blocked
                .is_some_and(tidepool_ipam::Blocked::out_of_addresses),
        );
        nodes.blocked += u64::from(s.blocked.is_some());
    }
    // Addresses from the store (the truth the node sides see), not from engine counters.
    let ips = addresses(world, &cfg.world.families);
    let (source_calls, throttled) = world.source.calls();
    let never_served = stats.left_unserved + world.waiting() as u64;
    let memory = {
        let world_bytes = world.world_heap_estimate() as f64;
        let per = |b: f64| round3(b / (ips.allocated.max(1) as f64));
        MemoryReport {
            world_bytes_per_address: per(world_bytes),
            engine_bytes_per_address: LIVE_HEAP_BYTES
                .get()
                .map(|live| per((live() as f64 - world_bytes).max(0.0))),
        }
    };
    let wall_seconds = wall.elapsed().as_secs_f64();
    let node_details = cfg.report_nodes.then(|| {
        summaries
            .iter()
            .map(|(name, s)| NodeDetail {
                name: name.to_string(),
                allocated: Family::ALL.iter().map(|f| s.counts.get(*f).allocated).sum(),
                used: Family::ALL.iter().map(|f| s.counts.get(*f).used).sum(),
                cooldown: Family::ALL.iter().map(|f| s.counts.get(*f).cooldown).sum(),
                needed: s.needed(),
                excess: s.excess(),
                blocked: s.blocked.map(|b| b.as_str()),
            })
            .collect()
    });
    let convergence = settled_since.map(|t| round3(t.saturating_duration_since(t0).as_secs_f64()));
    Report {
        converged: convergence.is_some(),
        convergence_seconds: convergence,
        lower_bound_seconds: Some(round3(oracle.lower_bound_seconds)),
        limited_by: oracle.limited_by.clone(),
        virtual_seconds: round3(Instant::now().saturating_duration_since(t0).as_secs_f64()),
        wall_seconds,
        cpu_seconds: cpu_seconds().zip(cpu0).map(|(b, a)| b - a),
        peak_rss_bytes: peak_rss_bytes(),
        events_per_second: if wall_seconds > 0.0 {
            stats.events as f64 / wall_seconds
        } else {
            0.0
        },
        nodes,
        ips,
        api: ApiReport {
            source_calls,
            source_calls_minimum: Some(oracle.calls),
            kube_writes: world.store.operator_writes(),
            conflicts: 0,
            throttled,
        },
        pods: PodsReport {
            unschedulable: 0,
            started: stats.started,
            deleted: stats.deleted,
            leaked_by_crash: stats.leaked_by_crash,
            waited_for_ip: stats.waited_for_ip,
            ip_wait_seconds: Quantiles::of(stats.wait_seconds),
            waiting_at_start: 0,
            never_served,
            never_served_cause: (never_served > 0).then(|| never_served_cause(world, cfg)),
            bring_up: stats.bring_up,
            ip_wait_seconds_after_bring_up: Quantiles::of(stats.wait_seconds_after_bring_up),
        },
        reclaim: ReclaimReport {
            reclaimed: world.observer.reclaimed(),
            held_by_min_age: stats.held_by_min_age,
            latency_seconds: Quantiles::of(world.observer.reclaim_latencies()),
        },
        scarcity: ScarcityReport::build(promise, &world.scarcity_waits()),
        memory,
        drain_extra_seconds: 0.0,
        invariants,
        violations: world.observer.violations(),
        node_details,
    }
}

/// The addresses in the nodes' pools, from the store (the truth the node sides see), not
/// from engine counters: in all and per family in `families` (a cooldown ended but not yet
/// dropped counts as over).
fn addresses<S: SimSource>(world: &World<S>, families: &[Family]) -> IpsReport {
    let (mut per, mut all) = (PerFamily::<FamilyIps>::default(), FamilyIps::default());
    let utc = tidepool_ipam::Clock::utc(&*world.clock);
    for n in world.store.list() {
        let pool = world.pool_addresses(&n);
        let mut node = FamilyIps::default();
        for f in Family::ALL {
            let used = n.node.used.keys().filter(|a| Family::of(a) == f).count() as u64;
            let cooldown = (n.node.cooling(utc))
                .filter(|a| Family::of(a) == f && pool.contains(a))
                .count() as u64;
            per.get_mut(f).add(pool.len(f), used, cooldown);
            (node.allocated, node.used) = (node.allocated + pool.len(f), node.used + used);
            node.cooldown += cooldown;
        }
        // the node's free addresses over both families, as before the per-family figures
        all.add(node.allocated, node.used, node.cooldown);
    }
    let used_by = |f: Family| families.contains(&f).then(|| *per.get(f));
    IpsReport {
        allocated: all.allocated,
        used: all.used,
        free: all.free,
        cooldown: all.cooldown,
        ipv4: used_by(Family::V4),
        ipv6: used_by(Family::V6),
    }
}

/// Why pods never got an address (see [`PodsReport::never_served_cause`]): the source has
/// nothing left for a family the pods use, else the state of most nodes where pods still
/// waited at the end, else they were deleted or lost first, or still waited at the end.
fn never_served_cause<S: SimSource>(world: &World<S>, cfg: &SimConfig) -> String {
    let empty = world
        .source
        .free_units()
        .is_some_and(|free| (cfg.world.families.iter()).any(|&f| *free.get(f) == 0));
    let mut by_state = BTreeMap::<&'static str, u64>::new();
    for (node, s) in world.manager.summaries() {
        if world.waiting_on(&node) > 0 {
            *by_state
                .entry(s.blocked.map_or("", |b| b.as_str()))
                .or_default() += 1;
        }
    }
    let most = by_state
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(state, _)| state);
    match (empty, most) {
        (true, _) | (_, Some("exhausted")) => match cfg.source {
            SourceChoice::ClusterPool(_) => "the pool is exhausted".into(),
            SourceChoice::SimCloud(_) => "the subnet is exhausted".into(),
            SourceChoice::Memory => "the source is exhausted (--source-capacity)".into(),
        },
        (_, Some("at-capacity")) => {
            "their nodes are at their address cap (--max-pods or the instance type)".into()
        }
        (_, Some("")) => "they still waited for an address when the run ended".into(),
        (_, Some(state)) => format!("their nodes are blocked ({state})"),
        (_, None) => "they were deleted, or lost with their node, before they got one".into(),
    }
}

/// User + system CPU time of this thread (Linux /proc), in seconds: a run lives on one
/// thread (a current-thread runtime), so this is the run's own even while other runs share
/// the process (`--seeds --jobs`).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // fields after the ")" of the command name: utime is the 12th, stime the 13th
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Peak resident set size of this process (Linux /proc VmHWM), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
